// Jinja2 parser: statements (if/elif/else, for/else with loop filters, set and set blocks, macro, call,
// filter blocks, with, break/continue from jinja2.ext.loopcontrols, transformers' {% generation %}) and
// expressions, with the precedence and tuple rules of jinja2/parser.py.
#include "text/jinja/parser.h"

#include <fmt/format.h>

#include <initializer_list>

#include "core/error.h"

namespace inferx::jinja {

namespace {

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
  std::vector<NodePtr> subparse(std::initializer_list<const char*> ends) {
    DepthGuard guard(*this);
    std::vector<NodePtr> out;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (ends.size() > 0)
          error(t, fmt::format("unexpected end of template, expected '{}'", *ends.begin()));
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

  NodePtr parse_statement() {
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

  NodePtr parse_if() {
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

  NodePtr parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
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

  NodePtr parse_for() {
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

  NodePtr parse_set() {
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

  void parse_signature(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.ops.empty()) expect_op(",");
      if (is_op(")")) break;
      n.ops.push_back(expect_name());
      n.args.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
  }

  NodePtr parse_macro() {
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

  NodePtr parse_call_block() {
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

  NodePtr parse_filter_block() {
    auto n = node(NodeKind::FilterBlock, cur());
    next();
    n->args.push_back(parse_filter_chain(nullptr, true));
    expect_block_end();
    n->body = subparse({"endfilter"});
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_with() {
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

  // --- expressions -----------------------------------------------------------------------------------
  bool is_tuple_end(std::initializer_list<const char*> extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")"))
      return true;
    for (const char* e : extra)
      if (is_name(e)) return true;
    return false;
  }

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

  NodePtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  NodePtr parse_condexpr() {
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

  NodePtr binary(NodeKind k, const Token& at, NodePtr l, NodePtr r, std::string op = {}) {
    auto n = node(k, at);
    n->name = std::move(op);
    n->args.push_back(std::move(l));
    n->args.push_back(std::move(r));
    return n;
  }

  NodePtr parse_or() {
    auto left = parse_and();
    while (is_name("or")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::Or, t, std::move(left), parse_and());
    }
    return left;
  }

  NodePtr parse_and() {
    auto left = parse_not();
    while (is_name("and")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::And, t, std::move(left), parse_not());
    }
    return left;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto n = node(NodeKind::Not, cur());
      next();
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
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

  NodePtr parse_math1() {
    auto left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::BinOp, t, std::move(left), parse_concat(), t.text);
    }
    return left;
  }

  NodePtr parse_concat() {
    const Token& start = cur();
    auto first = parse_math2();
    if (!is_op("~")) return first;
    auto n = node(NodeKind::Concat, start);
    n->args.push_back(std::move(first));
    while (skip_op("~")) n->args.push_back(parse_math2());
    return n;
  }

  NodePtr parse_math2() {
    auto left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::BinOp, t, std::move(left), parse_pow(), t.text);
    }
    return left;
  }

  NodePtr parse_pow() {
    auto left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = cur();
      next();
      left = binary(NodeKind::BinOp, t, std::move(left), parse_unary(true), "**");
    }
    return left;
  }

  NodePtr parse_unary(bool with_filter) {
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

  NodePtr parse_primary() {
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

  NodePtr parse_postfix(NodePtr n) {
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

  NodePtr parse_filter_expr(NodePtr n) {
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

  NodePtr parse_subscript(NodePtr base) {
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

  NodePtr parse_subscribed() {
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

  void parse_call_args(Node& n) {
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

  NodePtr parse_call(NodePtr callee) {
    auto n = node(NodeKind::Call, cur());
    n->args.push_back(std::move(callee));
    parse_call_args(*n);
    return n;
  }

  // `| name(args) | name ...`; `start_inline` for {% filter name %} where no pipe precedes the first.
  NodePtr parse_filter_chain(NodePtr n, bool start_inline = false) {
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

  NodePtr parse_test(NodePtr n) {
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

  std::vector<Token> toks_;
  size_t pos_ = 0;
  const std::string& name_;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

NodePtr parse_template(const std::string& source, const std::string& name, int max_depth) {
  return Parser(tokenize(source, name), name, max_depth).parse_root();
}

}  // namespace inferx::jinja
