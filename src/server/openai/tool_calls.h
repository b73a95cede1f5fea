#pragma once
// Tool calls in a chat model's generated text -> the OpenAI `tool_calls` of a chat completion (vLLM's
// `--tool-call-parser`). The chat template shows the model the request's tools; the model answers with a
// call written in its family's format, which is parsed here after sampling (nothing constrains it):
//  - hermes (Qwen2.5 / Qwen3, Hermes 2 Pro): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any
//    number of them, text around them is content;
//  - llama3_json (Llama 3.1 / 3.2 / 3.3 with JSON tools): the whole reply is `{"name": ..., "parameters":
//    {...}}` (optionally after `<|python_tag|>`), several separated by ';';
//  - mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`; text before it is
//  content.
// A reply that looks like a call but does not parse is returned as plain content, as vLLM does.
// tool_choice "required" / a named function constrains the reply to one call in the hermes or llama3_json
// format (generate_handler.cpp, forced_tool_call), so these parsers find it unless max_tokens cut it short.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace inferx::server {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral };

// "hermes", "llama3_json", "mistral"; nullopt for anything else.
std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name);
const char* tool_call_format_names();  // for help and error messages

struct ToolCall {
  std::string id;  // "call_" + 24 hex digits
  std::string name;
  std::string arguments;  // JSON text (an object's compact dump, or the string the model wrote)
};

struct ParsedReply {
  std::string content;          // the text that is not a call (may be empty)
  std::vector<ToolCall> calls;  // empty: the reply is plain content
};

// The whole reply (a non-streamed response, or the held-back end of a stream).
ParsedReply parse_tool_calls(ToolCallFormat format, const std::string& text);

// Streaming: text deltas in, the content that is safe to send now out. Text that may begin a call (a
// partial marker, or for llama3_json a reply that starts with '{') is held back until it is decided; the
// end of the reply (finish) parses what was held.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  std::string feed(const std::string& delta);
  ParsedReply finish();

 private:
  ToolCallFormat format_;
  std::string held_;
  bool in_call_ = false;  // a call's start was seen: everything from it on is held
  bool decided_ = false;  // llama3_json: the reply's first non-space character was seen
};

}  // namespace inferx::server
