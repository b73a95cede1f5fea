#pragma once
// Syntax tree of a parsed template: one node type with a kind tag, shaped after jinja2/nodes.py.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace inferx::jinja {

enum class NodeKind : uint8_t {
  // expressions
  Const,     // value
  Name,      // name
  NSRef,     // name.attr as an assignment target (namespace attribute)
  ListLit,   // args
  TupleLit,  // args
  DictLit,   // args: key, value, key, value, ...
  Getattr,   // args[0].name
  Getitem,   // args[0][args[1]]
  Slice,     // args: start, stop, step (null entries when absent)
  Call,      // args[0](args[1:], kwargs)
  Filter,    // args[0] | name(args[1:], kwargs); args[0] null inside {% filter %}
  Test,      // args[0] is name(args[1:], kwargs)
  Not,       // not args[0]
  Neg,       // -args[0]
  Pos,       // +args[0]
  BinOp,     // args[0] <name> args[1]: + - * / // % **
  Concat,    // args joined by ~
  Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...
  And,
  Or,
  CondExpr,  // args: then, cond, else (else may be null)
  // statements
  Data,         // name holds literal text
  Output,       // {{ args[0] }}
  If,           // args[0] cond; body; else_body
  For,          // target in args[0] [if test]; body; else_body; flag = recursive
  Set,          // target = args[0]
  SetBlock,     // target; body; args[0] optional filter chain (Filter with null input)
  Macro,        // name(ops = parameter names; args = defaults, null when none); body
  CallBlock,    // args[0] call expression; ops = caller parameter names, args[1:] defaults; body
  FilterBlock,  // args[0] filter chain with null innermost input; body
  With,         // ops = names; args = values; body
  Break,
  Continue,
  Scope,  // body only ({% generation %} of transformers' AssistantTracker, and the template root)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  int line = 0, col = 0;
  std::string name;
  Value value;
  std::vector<NodePtr> args;
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::string> ops;
  NodePtr target, test;
  std::vector<NodePtr> body, else_body;
  bool flag = false;
};

}  // namespace inferx::jinja
