// libFuzzer target for the OpenAI request parsers (server/openai/request.h), the server's most exposed
// input: any bytes a client POSTs must either give a request whose fields lie in the ranges the engine
// relies on, or end in ApiError 4xx (the JSON parse included: parse_request_body, as the handler does).
// Any other exception (an nlohmann type_error, std::out_of_range, ...) would reach the client as a 500,
// so it escapes to libFuzzer and fails the run. Seeds: fuzz/seeds/openai_request/.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai/api_error.h"
#include "server/openai/request.h"

namespace {

volatile uint64_t g_sink = 0;

void require(bool ok) {
  if (!ok) std::abort();  // a parsed request outside the ranges request.cpp promises
}

// The ranges parse_common / parse_*_request check; the engine indexes and sizes buffers by them.
void check(const inferx::server::ParsedRequest& r) {
  const inferx::GenerationParams& p = r.params;
  require(std::isfinite(p.temperature) && p.temperature >= 0.0f && p.temperature <= 2.0f);
  require(p.top_p > 0.0f && p.top_p <= 1.0f);
  require(p.top_k >= 0);
  require(p.min_p >= 0.0f && p.min_p <= 1.0f);
  require(p.repetition_penalty >= 0.01f && p.repetition_penalty <= 10.0f);
  require(std::fabs(p.presence_penalty) <= 2.0f && std::fabs(p.frequency_penalty) <= 2.0f);
  require(p.n >= 1 && p.n <= inferx::server::kMaxN);
  require(p.max_tokens >= 0 && (r.chat || p.max_tokens >= 1));
  require(p.logprobs >= -1 && p.logprobs <= inferx::server::kMaxLogprobs);
  require(p.stop.size() <= inferx::server::kMaxStopStrings);
  for (const std::string& s : p.stop) require(!s.empty());
  for (const auto& [id, bias] : p.logit_bias) require(id >= 0 && std::fabs(bias) <= 100.0f);
  for (int32_t id : p.stop_token_ids) require(id >= 0);
  require(r.prompts.size() <= inferx::server::kMaxPrompts);
  require(static_cast<int64_t>(r.prompts.size()) * p.n <= inferx::server::kMaxChoices);
  for (const auto& prompt : r.prompts) {
    for (int32_t id : prompt.ids) require(id >= 0);
    require(prompt.text.has_value() != !prompt.ids.empty());
  }
  require(r.priority >= -1000000 && r.priority <= 1000000);
  require(r.response_format == inferx::server::ResponseFormat::Text || !p.ignore_eos ||
          !p.stop_token_ids.empty());  // something can end a JSON reply
  require(r.tool_choice == "auto" || r.tool_choice == "none" || r.tool_choice == "required" ||
          (r.tool_choice == "function" && !r.tool_choice_name.empty()));
  if (r.chat) {
    require(r.messages.is_array() && !r.messages.empty());
    for (const auto& m : r.messages) require(m.is_object() && m.contains("role") && m["role"].is_string());
    require(r.top_logprobs >= 0 && r.top_logprobs <= inferx::server::kMaxLogprobs);
  } else {
    require(!r.prompts.empty());
    require(!r.echo || p.logprobs < 0);
  }
  g_sink = g_sink + r.model.size() + p.stop.size() + r.messages.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json body;
  try {
    body = inferx::server::parse_request_body(text);  // what the handler does first
  } catch (const inferx::server::ApiError& e) {
    require(e.status == 400);
    return 0;
  }
  for (bool chat : {false, true}) {
    try {
      check(chat ? inferx::server::parse_chat_request(body) : inferx::server::parse_completion_request(body));
    } catch (const inferx::server::ApiError& e) {
      require(e.status >= 400 && e.status < 500);
      g_sink = g_sink + e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
    }
  }
  return 0;
}
