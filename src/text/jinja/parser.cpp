// Jinja2 parser: statements (if/elif/else, for/else with loop filters, set and set blocks, macro, call,
// filter blocks, with, break/continue from jinja2.ext.loopcontrols, transformers' {% generation %}) and
// expressions, with the precedence and tuple rules of jinja2/parser.py.
#include "text/jinja/parser.h"

#include <fmt/format.h>

#include <initializer_list>

#include "core/error.h"
#include "text/jinja/parser_impl.h"

namespace inferx::jinja {

std::vector<NodePtr> Parser::subparse(std::initializer_list<const char*> ends) {
  DepthGuard guard(*this);
  std::vector<NodePtr> out;
  while (true) {
    const Token& t = cur();
    if (t.type == Tok::Eof) {
      if (ends.size() > 0) {
        std::string names;
        for (const char* e : ends) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
        error(t, fmt::format("unexpected end of template, expected {}", names));
      }
      return out;
    }
    if (t.type == Tok::Data) {
      auto d = node(NodeKind::Data, t);
      d->name = t.text;
      out.push_back(std::move(d));
      next();
    } else if (t.type == Tok::VarBegin) {
      next();
      auto o = node(NodeKind::Output, t);
      o->args.push_back(parse_tuple(false, true, {}));
      if (cur().type != Tok::VarEnd)
        error(cur(), fmt::format("expected end of print statement, got {}", describe(cur())));
      next();
      out.push_back(std::move(o));
    } else if (t.type == Tok::BlockBegin) {
      next();
      if (cur().type == Tok::Name)
        for (const char* e : ends)
          if (cur().text == e) return out;
      out.push_back(parse_statement());
    } else {
      error(t, "unexpected " + describe(t));
    }
  }
}

NodePtr Parser::parse_statement() {
  const Token& t = cur();
  if (t.type != Tok::Name) error(t, "tag name expected");
  const std::string& kw = t.text;
  if (kw == "if") return parse_if();
  if (kw == "for") return parse_for();
  if (kw == "set") return parse_set();
  if (kw == "macro") return parse_macro();
  if (kw == "call") return parse_call_block();
  if (kw == "filter") return parse_filter_block();
  if (kw == "with") return parse_with();
  if (kw == "generation") {
    next();
    expect_block_end();
    auto n = node(NodeKind::Scope, t);
    n->body = subparse({"endgeneration"});
    next();
    expect_block_end();
    return n;
  }
  if (kw == "break" || kw == "continue") {
    if (loop_depth_ == 0) error(t, fmt::format("'{}' outside of a loop", kw));
    auto n = node(kw == "break" ? NodeKind::Break : NodeKind::Continue, t);
    next();
    expect_block_end();
    return n;
  }
  static const char* const kUnsupported[] = {"include", "import", "from",      "extends",
                                             "block",   "do",     "autoescape"};
  for (const char* u : kUnsupported)
    if (kw == u) error(t, fmt::format("the '{}' tag is not supported by chat templates", kw));
  error(t, fmt::format("Encountered unknown tag '{}'.", kw));
}

NodePtr Parser::parse_if() {
  auto n = node(NodeKind::If, cur());
  next();
  n->args.push_back(parse_tuple(false, true, {}));
  expect_block_end();
  n->body = subparse({"elif", "else", "endif"});
  if (skip_name("elif")) {
    auto elif = node(NodeKind::If, cur());
    // Re-enter as a nested if: the elif chain shares the single endif.
    elif->args.push_back(parse_tuple(false, true, {}));
    expect_block_end();
    elif->body = subparse({"elif", "else", "endif"});
    Node* tail = elif.get();
    n->else_body.push_back(std::move(elif));
    while (skip_name("elif")) {
      auto e2 = node(NodeKind::If, cur());
      e2->args.push_back(parse_tuple(false, true, {}));
      expect_block_end();
      e2->body = subparse({"elif", "else", "endif"});
      Node* t2 = e2.get();
      tail->else_body.push_back(std::move(e2));
      tail = t2;
    }
    if (skip_name("else")) {
      expect_block_end();
      tail->else_body = subparse({"endif"});
    }
  } else if (skip_name("else")) {
    expect_block_end();
    n->else_body = subparse({"endif"});
  }
  if (!skip_name("endif")) error(cur(), "expected 'endif'");
  expect_block_end();
  return n;
}

NodePtr Parser::parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
  const Token& t = cur();
  if (with_namespace && t.type == Tok::Name && look().type == Tok::Op && look().text == ".") {
    auto n = node(NodeKind::NSRef, t);
    n->name = t.text;
    next();
    next();
    n->ops.push_back(expect_name());
    return n;
  }
  auto target = parse_tuple(true, false, extra_end);
  auto check = [&](const Node& x) {
    if (x.kind != NodeKind::Name) error(t, "can't assign to this expression");
  };
  if (target->kind == NodeKind::TupleLit)
    for (const auto& a : target->args) check(*a);
  else
    check(*target);
  return target;
}

NodePtr Parser::parse_for() {
  auto n = node(NodeKind::For, cur());
  next();
  n->target = parse_assign_target(false, {"in"});
  if (!skip_name("in")) error(cur(), "expected 'in'");
  n->args.push_back(parse_tuple(false, false, {"recursive"}));
  if (skip_name("if")) n->test = parse_expression(true);
  if (skip_name("recursive")) n->flag = true;
  expect_block_end();
  ++loop_depth_;
  n->body = subparse({"endfor", "else"});
  --loop_depth_;
  if (skip_name("else")) {
    expect_block_end();
    n->else_body = subparse({"endfor"});
  }
  next();  // endfor
  expect_block_end();
  return n;
}

NodePtr Parser::parse_set() {
  const Token& t = cur();
  next();
  auto target = parse_assign_target(true, {});
  if (skip_op("=")) {
    auto n = node(NodeKind::Set, t);
    n->target = std::move(target);
    n->args.push_back(parse_tuple(false, true, {}));
    expect_block_end();
    return n;
  }
  auto n = node(NodeKind::SetBlock, t);
  n->target = std::move(target);
  if (is_op("|")) n->args.push_back(parse_filter_chain(nullptr));
  expect_block_end();
  n->body = subparse({"endset"});
  next();
  expect_block_end();
  return n;
}

void Parser::parse_signature(Node& n) {
  expect_op("(");
  while (!is_op(")")) {
    if (!n.ops.empty()) expect_op(",");
    if (is_op(")")) break;
    n.ops.push_back(expect_name());
    n.args.push_back(skip_op("=") ? parse_expression(true) : nullptr);
  }
  expect_op(")");
}

NodePtr Parser::parse_macro() {
  auto n = node(NodeKind::Macro, cur());
  next();
  n->name = expect_name();
  parse_signature(*n);
  expect_block_end();
  int saved = loop_depth_;
  loop_depth_ = 0;
  n->body = subparse({"endmacro"});
  loop_depth_ = saved;
  next();
  if (cur().type == Tok::Name) next();  // {% endmacro name %}
  expect_block_end();
  return n;
}

NodePtr Parser::parse_call_block() {
  auto n = node(NodeKind::CallBlock, cur());
  next();
  Node sig;
  if (is_op("(")) parse_signature(sig);
  auto call = parse_expression(true);
  if (call->kind != NodeKind::Call) error(cur(), "expected call");
  n->args.push_back(std::move(call));
  n->ops = std::move(sig.ops);
  for (auto& d : sig.args) n->args.push_back(std::move(d));
  expect_block_end();
  n->body = subparse({"endcall"});
  next();
  expect_block_end();
  return n;
}

NodePtr Parser::parse_filter_block() {
  auto n = node(NodeKind::FilterBlock, cur());
  next();
  n->args.push_back(parse_filter_chain(nullptr, true));
  expect_block_end();
  n->body = subparse({"endfilter"});
  next();
  expect_block_end();
  return n;
}

NodePtr Parser::parse_with() {
  auto n = node(NodeKind::With, cur());
  next();
  while (cur().type != Tok::BlockEnd) {
    if (!n->ops.empty()) expect_op(",");
    n->ops.push_back(expect_name());
    expect_op("=");
    n->args.push_back(parse_expression(true));
  }
  expect_block_end();
  n->body = subparse({"endwith"});
  next();
  expect_block_end();
  return n;
}

NodePtr parse_template(const std::string& source, const std::string& name, int max_depth) {
  return Parser(tokenize(source, name), name, max_depth).parse_root();
}

}  // namespace inferx::jinja
