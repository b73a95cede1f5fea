#pragma once
// Turns engine RequestOutputs into OpenAI response bodies and stream chunks, field for field as the
// OpenAI API sends them (API reference: "The completion object", "The chat completion object", "The chat
// completion chunk object"):
//  - completions: id "cmpl-...", object "text_completion", choices [{index, text, logprobs, finish_reason}];
//  - chat: id "chatcmpl-...", object "chat.completion" / "chat.completion.chunk", choices with message or
//    delta (role chunk first, content deltas, then a chunk with an empty delta and the finish_reason);
//  - usage {prompt_tokens, completion_tokens, total_tokens} on every non-stream response, and with
//    stream_options.include_usage as a last chunk with empty choices (every other chunk has usage null).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "inferx/engine.h"
#include "server/openai/tool_calls.h"

namespace inferx {
class Tokenizer;
}

namespace inferx::server {

struct ResponseContext {
  bool chat = false;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  int32_t n = 1;  // choices in the response (completions: prompts x n)
  // Completions with echo: each choice's prompt text, written before its completion (empty: no echo).
  std::vector<std::string> echo;
  bool include_usage = false;
  int32_t logprobs = -1;  // completions: -1 none, k: top-k; chat: -1 unless logprobs=true (then top_logprobs)
  const Tokenizer* tokenizer = nullptr;  // token strings in logprobs (null: "token_ID")
  // Chat with tools and a --tool-call-parser: replies are parsed into tool_calls (finish_reason
  // "tool_calls" when one is found).
  ToolCallFormat tool_format = ToolCallFormat::None;
  bool parallel_tool_calls = true;  // false: only a reply's first call is kept
};

// Random id with the OpenAI prefix: prefix + 24 hex digits.
std::string make_response_id(const std::string& prefix);
// JSON text, invalid UTF-8 replaced (token pieces may hold partial characters).
std::string dump_json(const nlohmann::json& j);

nlohmann::json usage_json(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens);

// A response's usage: the sum over its engine requests (one per prompt) of their final outputs' counts.
struct UsageCounts {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  void add(const RequestOutput& final_output);
};

// stream: true. Chunks in order; call begin() once, then on_output() for each engine output, then
// end() after the final output.
class StreamEncoder {
 public:
  explicit StreamEncoder(ResponseContext ctx);
  std::string begin();  // chat: one role chunk per choice; completions: each choice's echoed prompt
  std::string on_output(const RequestOutput& out);
  std::string end(const UsageCounts& usage);  // usage chunk (when asked) + "data: [DONE]"

 private:
  nlohmann::json chunk(nlohmann::json choices) const;
  ResponseContext ctx_;
  std::vector<int64_t> text_offset_;        // completions logprobs text_offset, per choice
  std::vector<ToolCallStream> tool_calls_;  // chat with a tool-call format: per choice
};

// stream: false. Accumulates every output and renders the one response object at the end.
class ResponseAccumulator {
 public:
  explicit ResponseAccumulator(ResponseContext ctx);
  void on_output(const RequestOutput& out);
  nlohmann::json finish(const UsageCounts& usage) const;

 private:
  struct Choice {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    FinishReason finish = FinishReason::None;
  };
  ResponseContext ctx_;
  std::vector<Choice> choices_;
};

}  // namespace inferx::server
