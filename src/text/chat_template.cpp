// ChatTemplate: parses once, renders per request with the variables transformers' apply_chat_template
// passes (transformers/utils/chat_template_utils.py render_jinja_template: messages, tools, documents,
// add_generation_prompt, the special tokens and any extra keyword arguments).
#include "text/chat_template.h"

#include "core/error.h"
#include "text/jinja/builtins.h"
#include "text/jinja/evaluator.h"
#include "text/jinja/parser.h"

namespace inferx {

namespace {

// jinja2 rejects unknown filters and tests when compiling, except inside {% if %} blocks where the
// check is deferred to run time (so templates can probe with `is filter`).
void check_names(const jinja::Node& n, const std::string& name, bool in_if) {
  using jinja::NodeKind;
  if (!in_if && n.kind == NodeKind::Filter && !jinja::has_filter(n.name))
    fail("{}:{}:{}: No filter named '{}'.", name, n.line, n.col, n.name);
  if (!in_if && n.kind == NodeKind::Test && !jinja::has_test(n.name))
    fail("{}:{}:{}: No test named '{}'.", name, n.line, n.col, n.name);
  bool child_in_if = in_if || n.kind == NodeKind::If;
  for (const auto& a : n.args)
    if (a) check_names(*a, name, in_if);
  for (const auto& [k, v] : n.kwargs)
    if (v) check_names(*v, name, in_if);
  if (n.target) check_names(*n.target, name, in_if);
  if (n.test) check_names(*n.test, name, in_if);
  for (const auto& b : n.body) check_names(*b, name, child_in_if);
  for (const auto& b : n.else_body) check_names(*b, name, child_in_if);
}

}  // namespace

struct ChatTemplate::Impl {
  std::string name;
  jinja::NodePtr root;
};

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = name;
  impl_->root = jinja::parse_template(source, name);
  check_names(*impl_->root, name, false);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const ChatTemplateInputs& in) const {
  using jinja::Value;
  INFERX_CHECK(in.messages.is_array(), "{}: messages must be a JSON array", impl_->name);
  INFERX_CHECK(in.extra.is_object() || in.extra.is_null(),
               "{}: extra template variables must be a JSON object", impl_->name);
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", Value::from_json(in.messages));
  vars.emplace_back("tools", Value::from_json(in.tools));
  vars.emplace_back("documents", Value::none());
  vars.emplace_back("add_generation_prompt", Value(in.add_generation_prompt));
  vars.emplace_back("bos_token", Value(in.bos_token));
  vars.emplace_back("eos_token", Value(in.eos_token));
  // Extra variables replace the fixed ones above of the same name; their own keys are unique (one JSON
  // object), so each is compared with the fixed names only (not with every extra before it: quadratic in a
  // caller's thousands of variables).
  const size_t fixed = vars.size();
  if (in.extra.is_object())
    for (auto it = in.extra.begin(); it != in.extra.end(); ++it) {
      Value v = Value::from_json(it.value());
      bool replaced = false;
      for (size_t i = 0; i < fixed; ++i)
        if (vars[i].first == it.key()) {
          vars[i].second = v;
          replaced = true;
        }
      if (!replaced) vars.emplace_back(it.key(), std::move(v));
    }
  jinja::RenderOptions opt;
  opt.now_unix = in.now_unix;
  jinja::Evaluator ev(*impl_->root, impl_->name, opt);
  return ev.render(vars);
}

}  // namespace inferx
