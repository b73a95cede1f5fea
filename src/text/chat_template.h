#pragma once
// Chat templates: a Jinja2 subset engine (ours; no C++ Jinja library is packaged) rendering the
// templates models ship (tokenizer_config.json "chat_template", GGUF tokenizer.chat_template) exactly
// as transformers renders them with Python jinja2 (trim_blocks, lstrip_blocks).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace inferx {

struct ChatTemplateInputs {
  nlohmann::json messages = nlohmann::json::array();  // [{"role": ..., "content": ...,
                                                      //   "tool_calls": [...]}, ...]
  nlohmann::json tools;                               // null or array of tool definitions
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  nlohmann::json extra = nlohmann::json::object();  // other variables (e.g. enable_thinking)
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
