#pragma once
// Parsing and validation of POST /v1/completions and /v1/chat/completions bodies (OpenAI API reference,
// "Completions" and "Chat"), plus the extensions vLLM clients send (top_k, min_p, repetition_penalty,
// ignore_eos). Every problem throws ApiError 400 naming the field.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "inferx/engine.h"

namespace inferx::server {

// One prompt of a completions request: text (tokenized by the server) or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;  // when text is empty
};

// response_format's type: free text, one JSON object (JSON mode), or a value of json_schema's schema.
enum class ResponseFormat : uint8_t { Text, JsonObject, JsonSchema };

struct ParsedRequest {
  bool chat = false;
  std::string model;
  // Completions: one or more prompts ("prompt" as a string, token ids, or an array of either, as the OpenAI
  // reference allows); each runs as its own engine request with n choices, choice index = prompt * n + j.
  std::vector<PromptInput> prompts;
  bool echo = false;  // completions: each choice's text starts with its prompt
  ResponseFormat response_format = ResponseFormat::Text;  // JSON ones: the reply is constrained
  nlohmann::ordered_json json_schema;                     // ResponseFormat::JsonSchema's "schema"
  // Chat: the messages, normalised to {"role", "content": string, ...other keys kept}.
  nlohmann::ordered_json messages;   // key order kept: templates print tool schemas as given
  nlohmann::ordered_json tools;      // null or array, passed to the chat template
  std::string tool_choice = "auto";  // "auto", "none", "required", or "function" (tool_choice_name's)
  std::string tool_choice_name;      // tool_choice {"type": "function", "function": {"name"}}
  bool parallel_tool_calls = true;   // false: at most one call per reply
  GenerationParams params;
  bool max_tokens_given = false;  // else the default (completions 16, chat: the rest of the context)
  bool stream = false;
  bool include_usage = false;
  // Completions: logprobs = k (params.logprobs). Chat: logprobs bool + top_logprobs.
  bool chat_logprobs = false;
  int32_t top_logprobs = 0;
  int32_t priority = 0;
  std::string user;
};

// Upper bounds the server enforces (a request asking for more is rejected, not clamped).
inline constexpr int32_t kMaxN = 128;
inline constexpr size_t kMaxPrompts = 1024;
inline constexpr int64_t kMaxChoices = 4096;  // prompts x n
inline constexpr int32_t kMaxLogprobs = 20;
inline constexpr size_t kMaxStopStrings = 16;
// JSON nesting of a body (tool schemas nest a few levels; the chat template's conversion recurses per level).
inline constexpr int kMaxJsonDepth = 128;

// The body's JSON (key order kept; json_body.h). Anything nlohmann refuses - bad syntax or UTF-8, a number
// past double's range ("1e999": out_of_range, not parse_error) - and nesting past kMaxJsonDepth throw
// ApiError 400 invalid_json.
nlohmann::ordered_json parse_request_body(const std::string& text);

// A boolean member (absent or null: `def`); anything but a boolean throws ApiError 400 naming it.
bool get_bool(const nlohmann::ordered_json& body, const char* name, bool def);

ParsedRequest parse_completion_request(const nlohmann::ordered_json& body);
ParsedRequest parse_chat_request(const nlohmann::ordered_json& body);

}  // namespace inferx::server
