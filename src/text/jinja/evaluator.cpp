// Tree-walking renderer. Semantics follow what jinja2's compiler generates (jinja2/compiler.py,
// runtime.py): LoopContext fields, macro argument binding, `caller`, namespace attribute assignment,
// Undefined for missing names/attributes (printing as "" and failing on attribute access).
#include "text/jinja/evaluator.h"

#include <fmt/format.h>

#include "text/jinja/builtins.h"

namespace inferx::jinja {

const Value* Evaluator::Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent) {
    if (!s->index.empty()) {
      const auto it = s->index.find(name);
      if (it != s->index.end()) return &s->vars[it->second].second;
      continue;
    }
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  }
  return nullptr;
}

void Evaluator::Scope::set(const std::string& name, Value v) {
  if (!index.empty()) {
    const auto [it, added] = index.try_emplace(name, vars.size());
    if (!added) {
      vars[it->second].second = std::move(v);
      return;
    }
    vars.emplace_back(name, std::move(v));
    return;
  }
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
  if (vars.size() >= kIndexFrom) {
    index.reserve(vars.size() * 2);
    for (size_t i = 0; i < vars.size(); ++i) index.emplace(vars[i].first, i);
  }
}

Evaluator::Evaluator(const Node& root, std::string name, RenderOptions options)
    : root_(root), name_(std::move(name)), options_(options) {}

void Evaluator::step(uint64_t n) {
  const uint64_t before = steps_;
  steps_ += n;
  if (steps_ > options_.limits.max_steps)
    fail("template exceeded {} evaluation steps (an endless or huge loop?)", options_.limits.max_steps);
  if ((before >> 10) != (steps_ >> 10) &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() >
          options_.limits.max_seconds)
    fail("template rendering exceeded {} seconds", options_.limits.max_seconds);
}

void Evaluator::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output)
    fail("template output exceeds {} bytes", options_.limits.max_output);
}

void Evaluator::emit(std::string_view s) {
  check_size(out_->size() + s.size());
  out_->append(s);
}

void Evaluator::located_fail(const Node& n, const std::string& msg) const {
  throw LocatedError(fmt::format("{}:{}:{}: {}", name_, n.line, n.col, msg));
}

std::string Evaluator::render(const std::vector<std::pair<std::string, Value>>& variables) {
  Scope root;
  // Declared after the root scope, so destroyed before it: the arena empties every list, dict and callable
  // the render made while the scope still holds them, which frees what templates tie into cycles and makes
  // the scope's own destruction flat. The other order destroyed a list nested a million levels deep (a loop
  // of `set ns.x = [ns.x]`) recursively, from the scope, and overflowed the stack.
  RenderArena arena;
  StringBudget budget(options_.limits.max_output, options_.limits.max_string_built);
  started_ = std::chrono::steady_clock::now();
  for (auto& g : global_functions(*this)) root.set(g.first, g.second);
  for (const auto& [k, v] : variables) root.set(k, v);
  globals_ = &root;
  std::string out;
  out_ = &out;
  steps_ = 0;
  exec_body(root_.body, root);
  out_ = nullptr;
  globals_ = nullptr;
  return out;
}

std::string Evaluator::capture(const std::vector<NodePtr>& body, Scope& scope) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_body(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Evaluator::Flow Evaluator::exec_body(const std::vector<NodePtr>& body, Scope& scope) {
  for (const auto& n : body) {
    Flow f = exec(*n, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec(const Node& n, Scope& scope) {
  step();
  try {
    switch (n.kind) {
      case NodeKind::Data:
        emit(n.name);
        return Flow::Normal;
      case NodeKind::Output: {
        Value v = eval(*n.args[0], scope);
        if (v.is_string())
          emit(v.str());
        else
          emit(v.to_string());
        return Flow::Normal;
      }
      case NodeKind::If:
        if (eval(*n.args[0], scope).truthy()) return exec_body(n.body, scope);
        return exec_body(n.else_body, scope);
      case NodeKind::For:
        exec_for(n, scope);
        return Flow::Normal;
      case NodeKind::Set:
        assign(*n.target, eval(*n.args[0], scope), scope);
        return Flow::Normal;
      case NodeKind::SetBlock: {
        Scope inner{{}, &scope};
        Value v(capture(n.body, inner));
        if (!n.args.empty()) v = apply_filter_node(*n.args[0], v, scope);
        assign(*n.target, v, scope);
        return Flow::Normal;
      }
      case NodeKind::Macro:
        scope.set(n.name, make_macro(n, scope, n.name));
        return Flow::Normal;
      case NodeKind::CallBlock: {
        Value caller = make_macro(n, scope, "caller");
        const Node& call = *n.args[0];
        Value callee = eval(*call.args[0], scope);
        CallArgs args = eval_args(call, 1, scope);
        args.kwargs.emplace_back("caller", caller);
        Value r = this->call(callee, args);
        emit(r.to_string());
        return Flow::Normal;
      }
      case NodeKind::FilterBlock: {
        Scope inner{{}, &scope};
        Value v(capture(n.body, inner));
        emit(apply_filter_node(*n.args[0], v, scope).to_string());
        return Flow::Normal;
      }
      case NodeKind::With: {
        Scope inner{{}, &scope};
        for (size_t i = 0; i < n.ops.size(); ++i) inner.set(n.ops[i], eval(*n.args[i], scope));
        return exec_body(n.body, inner);
      }
      case NodeKind::Break:
        return Flow::Break;
      case NodeKind::Continue:
        return Flow::Continue;
      case NodeKind::Scope:
        return exec_body(n.body, scope);
      default:
        located_fail(n, "internal error: expression used as a statement");
    }
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    located_fail(n, e.what());
  }
}

void Evaluator::exec_for(const Node& n, Scope& scope) {
  if (n.flag) located_fail(n, "recursive for loops are not supported");
  Value iterable = eval(*n.args[0], scope);
  std::vector<Value> items = iterable.iterate();
  if (n.test) {  // `for x in xs if cond`: the condition sees the target but not `loop`
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      Scope s{{}, &scope};
      assign(*n.target, item, s);
      if (eval(*n.test, s).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t len = static_cast<int64_t>(items.size());
  // One loop object per loop, updated in place each iteration (jinja2's LoopContext is one object too).
  Value loop = Value::dict();
  auto& entries = loop.dict_data().entries;
  auto index = std::make_shared<int64_t>(0);
  for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                        "depth0", "previtem", "nextitem"})
    entries.emplace_back(Value(k), Value());
  entries.emplace_back(Value("cycle"), Value::callable("loop.cycle", [index](CallArgs& a) -> Value {
                         INFERX_CHECK(!a.args.empty(), "no items for cycling given");
                         return a.args[static_cast<size_t>(*index) % a.args.size()];
                       }));
  for (int64_t i = 0; i < len; ++i) {
    step();
    *index = i;
    entries[0].second = Value(i + 1);
    entries[1].second = Value(i);
    entries[2].second = Value(len - i);
    entries[3].second = Value(len - i - 1);
    entries[4].second = Value(i == 0);
    entries[5].second = Value(i == len - 1);
    entries[6].second = Value(len);
    entries[7].second = Value(int64_t{1});
    entries[8].second = Value(int64_t{0});
    entries[9].second =
        i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
    entries[10].second =
        i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
    Scope s{{}, &scope};
    s.vars.reserve(2);
    s.vars.emplace_back("loop", loop);
    assign(*n.target, items[static_cast<size_t>(i)], s);
    if (exec_body(n.body, s) == Flow::Break) break;
  }
  if (len == 0) {
    Scope s{{}, &scope};
    exec_body(n.else_body, s);
  }
}

void Evaluator::assign(const Node& target, const Value& v, Scope& scope) {
  switch (target.kind) {
    case NodeKind::Name:
      scope.set(target.name, v);
      return;
    case NodeKind::TupleLit: {
      if (!v.is_sequence() && !v.is_string() && !v.is_mapping() && !v.is_undefined())
        fail("cannot unpack non-iterable {} object", v.type_name());
      std::vector<Value> parts = v.iterate();
      if (parts.size() != target.args.size())
        fail("{} values to unpack (expected {}, got {})",
             parts.size() > target.args.size() ? "too many" : "not enough", target.args.size(), parts.size());
      for (size_t i = 0; i < parts.size(); ++i) assign(*target.args[i], parts[i], scope);
      return;
    }
    case NodeKind::NSRef: {
      const Value* ns = scope.find(target.name);
      if (ns == nullptr || ns->kind() != Kind::Namespace)
        fail("cannot assign attribute on non-namespace object");
      ns->dict_data().set(Value(target.ops[0]), v);
      return;
    }
    default:
      fail("can't assign to this expression");
  }
}

Value Evaluator::make_macro(const Node& n, Scope& scope, const std::string& name) {
  // A macro sees the template's top level; a caller() sees the scope of its {% call %}.
  Scope* parent = name == "caller" ? &scope : globals_;
  const Node* def = &n;
  size_t first_default = n.kind == NodeKind::CallBlock ? 1 : 0;
  return Value::callable(name, [this, def, parent, first_default, name](CallArgs& a) -> Value {
    if (++call_depth_ > options_.limits.max_call_depth) {
      --call_depth_;
      fail("maximum macro recursion depth ({}) exceeded", options_.limits.max_call_depth);
    }
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{call_depth_};
    Scope s{{}, parent};
    const auto& params = def->ops;
    std::vector<bool> bound(params.size(), false);
    std::vector<Value> extra;
    for (size_t i = 0; i < a.args.size(); ++i) {
      if (i < params.size()) {
        s.set(params[i], a.args[i]);
        bound[i] = true;
      } else {
        extra.push_back(a.args[i]);
      }
    }
    Value kwargs = Value::dict();
    for (auto& [k, v] : a.kwargs) {
      bool is_param = false;
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i] == k) {
          if (bound[i]) fail("macro '{}' got multiple values for argument '{}'", name, k);
          bound[i] = is_param = true;
        }
      if (is_param || k == "caller")
        s.set(k, v);
      else
        kwargs.dict_data().set(Value(k), v);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      const Node* dflt = def->args[first_default + i].get();
      s.set(params[i], dflt != nullptr
                           ? eval(*dflt, s)
                           : Value::undefined(fmt::format("parameter '{}' was not provided", params[i])));
    }
    s.set("varargs", Value::tuple(std::move(extra)));
    s.set("kwargs", kwargs);
    return Value(capture(def->body, s));
  });
}

Value Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.kind() != Kind::Callable) {
    if (callee.is_undefined())
      fail("{}", callee.str().empty() ? "'undefined' is not callable" : callee.str());
    fail("'{}' object is not callable", callee.type_name());
  }
  return callee.function()(args);
}

CallArgs Evaluator::eval_args(const Node& n, size_t first, Scope& scope) {
  CallArgs a;
  for (size_t i = first; i < n.args.size(); ++i) a.args.push_back(eval(*n.args[i], scope));
  for (const auto& [k, v] : n.kwargs) a.kwargs.emplace_back(k, eval(*v, scope));
  return a;
}

Value Evaluator::apply_filter_node(const Node& f, Value input, Scope& scope) {
  // The innermost input of a chain is either an expression or (in {% filter %} / {% set %} blocks) null,
  // standing for the rendered block text passed in as `input`.
  if (f.args[0])
    input = f.args[0]->kind == NodeKind::Filter ? apply_filter_node(*f.args[0], std::move(input), scope)
                                                : eval(*f.args[0], scope);
  CallArgs a = eval_args(f, 1, scope);
  return apply_filter(*this, f.name, input, a);
}

Value Evaluator::eval(const Node& n, Scope& scope) {
  step();
  try {
    return eval_inner(n, scope);
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    located_fail(n, e.what());
  }
}

Value Evaluator::eval_inner(const Node& n, Scope& scope) {
  switch (n.kind) {
    case NodeKind::Const:
      return n.value;
    case NodeKind::Name: {
      const Value* v = scope.find(n.name);
      return v != nullptr ? *v : Value::undefined(fmt::format("'{}' is undefined", n.name));
    }
    case NodeKind::ListLit:
    case NodeKind::TupleLit: {
      std::vector<Value> items;
      for (const auto& a : n.args) items.push_back(eval(*a, scope));
      return n.kind == NodeKind::ListLit ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case NodeKind::DictLit: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < n.args.size(); i += 2) {
        Value k = eval(*n.args[i], scope);
        if (k.is_sequence() && k.kind() == Kind::List) fail("unhashable type: 'list'");
        if (k.is_mapping()) fail("unhashable type: 'dict'");
        d.dict_data().set(k, eval(*n.args[i + 1], scope));
      }
      return d;
    }
    case NodeKind::Getattr:
      return eval(*n.args[0], scope).getattr(n.name);
    case NodeKind::Getitem:
      return eval_subscript(n, scope);
    case NodeKind::Call:
      return eval_call(n, scope);
    case NodeKind::Filter:
      return apply_filter_node(n, Value(), scope);
    case NodeKind::Test: {
      Value v = eval(*n.args[0], scope);
      CallArgs a = eval_args(n, 1, scope);
      return Value(apply_test(*this, n.name, v, a));
    }
    case NodeKind::Not:
      return Value(!eval(*n.args[0], scope).truthy());
    case NodeKind::Neg:
    case NodeKind::Pos: {
      Value v = eval(*n.args[0], scope);
      if (!v.is_number())
        fail("bad operand type for unary {}: '{}'", n.kind == NodeKind::Neg ? '-' : '+', v.type_name());
      if (n.kind == NodeKind::Pos) return v.kind() == Kind::Bool ? Value(v.as_int()) : v;
      if (v.kind() == Kind::Float) return Value(-v.as_float());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value(-v.as_int());
    }
    case NodeKind::BinOp: {
      Value a = eval(*n.args[0], scope);
      Value b = eval(*n.args[1], scope);
      return binary_op(n.name, a, b, options_.limits.max_output);
    }
    case NodeKind::Concat: {
      std::string s;
      for (const auto& a : n.args) {
        const Value v = eval(*a, scope);
        if (v.is_string())
          s += v.str();  // no copy through to_string()
        else
          s += v.to_string();
        StringBudget::check_size(s.size(), "~");
      }
      return Value(std::move(s));
    }
    case NodeKind::Compare:
      return eval_compare(n, scope);
    case NodeKind::And: {
      Value a = eval(*n.args[0], scope);
      return a.truthy() ? eval(*n.args[1], scope) : a;
    }
    case NodeKind::Or: {
      Value a = eval(*n.args[0], scope);
      return a.truthy() ? a : eval(*n.args[1], scope);
    }
    case NodeKind::CondExpr:
      if (eval(*n.args[1], scope).truthy()) return eval(*n.args[0], scope);
      if (n.args[2]) return eval(*n.args[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    default:
      fail("this expression cannot be evaluated here");
  }
}

Value Evaluator::eval_subscript(const Node& n, Scope& scope) {
  Value base = eval(*n.args[0], scope);
  const Node& key = *n.args[1];
  if (key.kind == NodeKind::Slice) {
    Value parts[3];
    const Value* ptrs[3] = {nullptr, nullptr, nullptr};
    for (int i = 0; i < 3; ++i)
      if (key.args[static_cast<size_t>(i)]) {
        parts[i] = eval(*key.args[static_cast<size_t>(i)], scope);
        ptrs[i] = &parts[i];
      }
    if (base.is_undefined()) fail("{}", base.str().empty() ? "value is undefined" : base.str());
    return python_slice(base, ptrs[0], ptrs[1], ptrs[2]);
  }
  return base.getitem(eval(key, scope));
}

Value Evaluator::eval_call(const Node& n, Scope& scope) {
  Value callee = eval(*n.args[0], scope);
  CallArgs a = eval_args(n, 1, scope);
  return call(callee, a);
}

Value Evaluator::eval_compare(const Node& n, Scope& scope) {
  Value left = eval(*n.args[0], scope);
  for (size_t i = 0; i < n.ops.size(); ++i) {
    Value right = eval(*n.args[i + 1], scope);
    const std::string& op = n.ops[i];
    bool ok;
    if (op == "==")
      ok = values_equal(left, right);
    else if (op == "!=")
      ok = !values_equal(left, right);
    else if (op == "in")
      ok = right.contains(left);
    else if (op == "notin")
      ok = !right.contains(left);
    else {
      int c = compare_values(left, right);
      ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

}  // namespace inferx::jinja
