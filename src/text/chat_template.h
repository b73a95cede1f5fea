#pragma once
// Chat templates: a Jinja2 subset engine (ours; no C++ Jinja library is packaged) rendering the
// templates models ship (tokenizer_config.json "chat_template", GGUF tokenizer.chat_template) exactly
// as transformers renders them with Python jinja2 (trim_blocks, lstrip_blocks).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace inferx {

struct ChatTemplateInputs {
  // ordered_json: templates see object keys in their given order (tojson of a tool schema, dict
  // iteration), as Python dicts from json.loads do. A plain nlohmann::json converts implicitly, but has
  // already sorted its keys: parse requests with ordered_json to keep the caller's order.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role": ..., "content": ...,
                                                                      //   "tool_calls": [...]}, ...]
  nlohmann::ordered_json tools;                                       // null or array of tool definitions
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // other variables (e.g. enable_thinking)
  // Clock of strftime_now() (Llama 3.x, Mistral, Granite, gpt-oss print today's date): seconds since the
  // epoch, rendered as UTC, for reproducible prompts and tests; -1 = the system clock in local time
  // (transformers' datetime.now()).
  int64_t now_unix = -1;
};

class ChatTemplate {
 public:
  // Parses the template; throws inferx::Error "NAME:LINE:COL: message" on syntax errors.
  ChatTemplate(const std::string& source, const std::string& name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  // Renders; throws inferx::Error (with template line/column) on runtime errors and raise_exception().
  std::string render(const ChatTemplateInputs& inputs) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferx
