// Jinja2 expression grammar (jinja2/parser.py parse_expression and below): conditional expressions,
// or/and/not, comparison chains with in / not in, + - ~ * / // % **, unary signs, primaries and literals,
// postfix attribute/item/slice/call, filters and tests.
#include "text/jinja/parser_impl.h"

namespace inferx::jinja {

bool Parser::is_tuple_end(std::initializer_list<const char*> extra) const {
  if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")"))
    return true;
  for (const char* e : extra)
    if (is_name(e)) return true;
  return false;
}

NodePtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

NodePtr Parser::parse_condexpr() {
  auto expr1 = parse_or();
  while (is_name("if")) {
    auto n = node(NodeKind::CondExpr, cur());
    next();
    auto cond = parse_or();
    NodePtr else_expr;
    if (skip_name("else")) else_expr = parse_condexpr();
    n->args.push_back(std::move(expr1));
    n->args.push_back(std::move(cond));
    n->args.push_back(std::move(else_expr));
    expr1 = std::move(n);
  }
  return expr1;
}

NodePtr Parser::binary(NodeKind k, const Token& at, NodePtr l, NodePtr r, std::string op) {
  auto n = node(k, at);
  n->name = std::move(op);
  n->args.push_back(std::move(l));
  n->args.push_back(std::move(r));
  return n;
}

NodePtr Parser::parse_or() {
  auto left = parse_and();
  while (is_name("or")) {
    const Token& t = cur();
    next();
    left = binary(NodeKind::Or, t, std::move(left), parse_and());
  }
  return left;
}

NodePtr Parser::parse_and() {
  auto left = parse_not();
  while (is_name("and")) {
    const Token& t = cur();
    next();
    left = binary(NodeKind::And, t, std::move(left), parse_not());
  }
  return left;
}

NodePtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    auto n = node(NodeKind::Not, cur());
    next();
    n->args.push_back(parse_not());
    return n;
  }
  return parse_compare();
}

NodePtr Parser::parse_compare() {
  const Token& start = cur();
  auto expr = parse_math1();
  std::vector<NodePtr> operands;
  std::vector<std::string> ops;
  while (true) {
    if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
      ops.push_back(cur().text);
      next();
    } else if (is_name("in")) {
      ops.push_back("in");
      next();
    } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
      ops.push_back("notin");
      next();
      next();
    } else {
      break;
    }
    operands.push_back(parse_math1());
  }
  if (ops.empty()) return expr;
  auto n = node(NodeKind::Compare, start);
  n->args.push_back(std::move(expr));
  for (auto& o : operands) n->args.push_back(std::move(o));
  n->ops = std::move(ops);
  return n;
}

NodePtr Parser::parse_concat() {
  const Token& start = cur();
  auto first = parse_math2();
  if (!is_op("~")) return first;
  auto n = node(NodeKind::Concat, start);
  n->args.push_back(std::move(first));
  while (skip_op("~")) n->args.push_back(parse_math2());
  return n;
}

NodePtr Parser::parse_pow() {
  auto left = parse_unary(true);
  while (is_op("**")) {
    const Token& t = cur();
    next();
    left = binary(NodeKind::BinOp, t, std::move(left), parse_unary(true), "**");
  }
  return left;
}

NodePtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  NodePtr n;
  if (is_op("-") || is_op("+")) {
    n = node(is_op("-") ? NodeKind::Neg : NodeKind::Pos, cur());
    next();
    n->args.push_back(parse_unary(false));
  } else {
    n = parse_primary();
  }
  n = parse_postfix(std::move(n));
  if (with_filter) n = parse_filter_expr(std::move(n));
  return n;
}

NodePtr Parser::parse_primary() {
  const Token& t = cur();
  if (t.type == Tok::Name) {
    next();
    auto n = node(NodeKind::Const, t);
    if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
      n->value = Value(t.text == "true" || t.text == "True");
    } else if (t.text == "none" || t.text == "None") {
      n->value = Value::none();
    } else {
      n->kind = NodeKind::Name;
      n->name = t.text;
    }
    return n;
  }
  if (t.type == Tok::String) {
    auto n = node(NodeKind::Const, t);
    std::string s;
    while (cur().type == Tok::String) {
      s += cur().text;
      next();
    }
    n->value = Value(std::move(s));
    return n;
  }
  if (t.type == Tok::Integer || t.type == Tok::Float) {
    auto n = node(NodeKind::Const, t);
    n->value = t.type == Tok::Integer ? Value(t.int_value) : Value(t.float_value);
    next();
    return n;
  }
  if (is_op("(")) {
    next();
    auto n = parse_tuple(false, true, {}, true);
    expect_op(")");
    return n;
  }
  if (is_op("[")) {
    auto n = node(NodeKind::ListLit, t);
    next();
    while (!is_op("]")) {
      if (!n->args.empty()) expect_op(",");
      if (is_op("]")) break;
      n->args.push_back(parse_expression(true));
    }
    expect_op("]");
    return n;
  }
  if (is_op("{")) {
    auto n = node(NodeKind::DictLit, t);
    next();
    while (!is_op("}")) {
      if (!n->args.empty()) expect_op(",");
      if (is_op("}")) break;
      n->args.push_back(parse_expression(true));
      expect_op(":");
      n->args.push_back(parse_expression(true));
    }
    expect_op("}");
    return n;
  }
  error(t, "unexpected " + describe(t));
}

NodePtr Parser::parse_postfix(NodePtr n) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      n = parse_subscript(std::move(n));
    } else if (is_op("(")) {
      n = parse_call(std::move(n));
    } else {
      return n;
    }
  }
}

NodePtr Parser::parse_filter_expr(NodePtr n) {
  while (true) {
    if (is_op("|")) {
      n = parse_filter_chain(std::move(n));
    } else if (is_name("is")) {
      n = parse_test(std::move(n));
    } else if (is_op("(")) {
      n = parse_call(std::move(n));
    } else {
      return n;
    }
  }
}

NodePtr Parser::parse_subscript(NodePtr base) {
  const Token& t = cur();
  if (skip_op(".")) {
    const Token& a = cur();
    if (a.type == Tok::Name) {
      auto n = node(NodeKind::Getattr, t);
      n->name = a.text;
      n->args.push_back(std::move(base));
      next();
      return n;
    }
    if (a.type != Tok::Integer) error(a, "expected name or number");
    auto n = node(NodeKind::Getitem, t);
    n->args.push_back(std::move(base));
    auto k = node(NodeKind::Const, a);
    k->value = Value(a.int_value);
    n->args.push_back(std::move(k));
    next();
    return n;
  }
  expect_op("[");
  std::vector<NodePtr> subs;
  while (!is_op("]")) {
    if (!subs.empty()) expect_op(",");
    subs.push_back(parse_subscribed());
  }
  expect_op("]");
  if (subs.empty()) error(t, "expected subscript expression");
  auto n = node(NodeKind::Getitem, t);
  n->args.push_back(std::move(base));
  if (subs.size() == 1) {
    n->args.push_back(std::move(subs[0]));
  } else {
    auto tup = node(NodeKind::TupleLit, t);
    tup->args = std::move(subs);
    n->args.push_back(std::move(tup));
  }
  return n;
}

NodePtr Parser::parse_subscribed() {
  const Token& t = cur();
  NodePtr first;
  if (!is_op(":")) {
    first = parse_expression(true);
    if (!is_op(":")) return first;
  }
  next();  // ':'
  auto n = node(NodeKind::Slice, t);
  n->args.push_back(std::move(first));
  n->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression(true));
  if (skip_op(":"))
    n->args.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression(true));
  else
    n->args.push_back(nullptr);
  return n;
}

void Parser::parse_call_args(Node& n) {
  expect_op("(");
  bool need_comma = false;
  while (!is_op(")")) {
    if (need_comma) {
      expect_op(",");
      if (is_op(")")) break;
    }
    if (is_op("*") || is_op("**")) error(cur(), "*args and **kwargs in calls are not supported");
    if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
      std::string key = cur().text;
      next();
      next();
      n.kwargs.emplace_back(key, parse_expression(true));
    } else {
      if (!n.kwargs.empty()) error(cur(), "invalid syntax for function call expression");
      n.args.push_back(parse_expression(true));
    }
    need_comma = true;
  }
  expect_op(")");
}

NodePtr Parser::parse_call(NodePtr callee) {
  auto n = node(NodeKind::Call, cur());
  n->line = callee->line;  // errors raised by the call (raise_exception) point at the callee
  n->col = callee->col;
  n->args.push_back(std::move(callee));
  parse_call_args(*n);
  return n;
}

NodePtr Parser::parse_filter_chain(NodePtr n, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    start_inline = false;
    auto f = node(NodeKind::Filter, cur());
    f->name = expect_name();
    while (skip_op(".")) {
      f->name += '.';
      f->name += expect_name();
    }
    f->args.push_back(std::move(n));
    if (is_op("(")) parse_call_args(*f);
    n = std::move(f);
  }
  return n;
}

NodePtr Parser::parse_test(NodePtr n) {
  const Token& t = cur();
  next();  // is
  bool negated = skip_name("not");
  auto test = node(NodeKind::Test, t);
  test->name = expect_name();
  while (skip_op(".")) {
    test->name += '.';
    test->name += expect_name();
  }
  test->args.push_back(std::move(n));
  const Token& c = cur();
  if (is_op("(")) {
    parse_call_args(*test);
  } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Integer ||
              c.type == Tok::Float || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) error(c, "You cannot chain multiple tests with is");
    test->args.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return test;
  auto nn = node(NodeKind::Not, t);
  nn->args.push_back(std::move(test));
  return nn;
}

}  // namespace inferx::jinja
