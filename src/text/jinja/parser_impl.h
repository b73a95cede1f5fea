#pragma once
// Internal to the parser: the Parser class, whose statement rules live in parser.cpp and expression
// rules in parser_expr.cpp (jinja2/parser.py's split).
#include <fmt/format.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace inferx::jinja {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name, int max_depth)
      : toks_(std::move(toks)), name_(name), max_depth_(max_depth) {}

  NodePtr parse_root() {
    auto root = node(NodeKind::Scope, cur());
    root->body = subparse({});
    if (cur().type != Tok::Eof) error(cur(), "unexpected tag");
    return root;
  }

 private:
  // --- token helpers ---------------------------------------------------------------------------------
  const Token& cur() const { return toks_[pos_]; }
  const Token& look(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof:
        return "end of template";
      case Tok::BlockEnd:
        return "end of statement block";
      case Tok::VarEnd:
        return "end of print statement";
      case Tok::Data:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }

  [[noreturn]] void error(const Token& t, const std::string& msg) const {
    fail("{}:{}:{}: {}", name_, t.line, t.col, msg);
  }

  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur(), fmt::format("expected name, got {}", describe(cur())));
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd)
      error(cur(), fmt::format("expected end of statement block, got {}", describe(cur())));
    next();
  }

  NodePtr node(NodeKind k, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_depth_) p.error(p.cur(), "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // --- statements ------------------------------------------------------------------------------------
  // Parses until a block tag whose first name is in `ends` (left unconsumed, pointing at that name).
  std::vector<NodePtr> subparse(std::initializer_list<const char*> ends);
  NodePtr parse_statement();
  NodePtr parse_if();
  NodePtr parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end);
  NodePtr parse_for();
  NodePtr parse_set();
  void parse_signature(Node& n);
  NodePtr parse_macro();
  NodePtr parse_call_block();
  NodePtr parse_filter_block();
  NodePtr parse_with();
  // --- expressions -----------------------------------------------------------------------------------
  bool is_tuple_end(std::initializer_list<const char*> extra) const;
  NodePtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra,
                      bool explicit_parens = false) {
    const Token& start = cur();
    std::vector<NodePtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra)) break;
      if (simplified)
        items.push_back(parse_primary());
      else
        items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) error(cur(), fmt::format("Expected an expression, got {}", describe(cur())));
    }
    auto n = node(NodeKind::TupleLit, start);
    n->args = std::move(items);
    return n;
  }
  NodePtr parse_expression(bool with_condexpr);
  NodePtr parse_condexpr();
  NodePtr binary(NodeKind k, const Token& at, NodePtr l, NodePtr r, std::string op = {});
  NodePtr parse_or();
  NodePtr parse_and();
  NodePtr parse_not();
  NodePtr parse_compare();
  NodePtr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::BinOp, t, std::move(left), parse_concat(), t.text);
    }
    return left;
  }
  NodePtr parse_concat();
  NodePtr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::BinOp, t, std::move(left), parse_pow(), t.text);
    }
    return left;
  }
  NodePtr parse_pow();
  NodePtr parse_unary(bool with_filter);
  NodePtr parse_primary();
  NodePtr parse_postfix(NodePtr n);
  NodePtr parse_filter_expr(NodePtr n);
  NodePtr parse_subscript(NodePtr base);
  NodePtr parse_subscribed();
  void parse_call_args(Node& n);
  NodePtr parse_call(NodePtr callee);
  // `| name(args) | name ...`; `start_inline` for {% filter name %} where no pipe precedes the first.
  NodePtr parse_filter_chain(NodePtr n, bool start_inline = false);
  NodePtr parse_test(NodePtr n);
  std::vector<Token> toks_;
  size_t pos_ = 0;
  const std::string& name_;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace inferx::jinja
