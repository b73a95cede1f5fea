#include "server/openai/response.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "server/sse.h"
#include "text/tokenizer.h"

namespace inferx::server {

using nlohmann::json;

std::string make_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:012x}{:012x}", prefix, rng() & 0xffffffffffffULL, rng() & 0xffffffffffffULL);
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

void UsageCounts::add(const RequestOutput& final_output) {
  prompt_tokens += final_output.prompt_tokens;
  completion_tokens += final_output.completion_tokens;
  cached_prompt_tokens += final_output.cached_prompt_tokens;
}

namespace {

json finish_json(FinishReason r) {
  if (r == FinishReason::None) return nullptr;
  return finish_reason_name(r);
}

std::string token_text(const ResponseContext& ctx, int32_t id) {
  if (!ctx.tokenizer || id < 0 || id >= ctx.tokenizer->vocab_size()) return fmt::format("token_{}", id);
  return ctx.tokenizer->token_bytes(id);
}

// JSON has no -inf: a token the sampler could not pick gets the most negative float-ish value vLLM uses.
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
json chat_logprobs(const ResponseContext& ctx, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const auto& lp : lps) {
    const std::string t = token_text(ctx, lp.token);
    json top = json::array();
    for (const auto& [id, v] : lp.top) {
      const std::string tt = token_text(ctx, id);
      top.push_back({{"token", tt}, {"logprob", finite_logprob(v)}, {"bytes", bytes_json(tt)}});
    }
    content.push_back({{"token", t},
                       {"logprob", finite_logprob(lp.logprob)},
                       {"bytes", bytes_json(t)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
json completion_logprobs(const ResponseContext& ctx, const std::vector<TokenLogprob>& lps, int64_t& offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    const std::string t = token_text(ctx, lp.token);
    tokens.push_back(t);
    token_lps.push_back(finite_logprob(lp.logprob));
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[token_text(ctx, id)] = finite_logprob(v);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.size());
  }
  return {
      {"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// The OpenAI tool_calls array of a message (or, with stream indices, of a delta).
json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = static_cast<int>(i);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

StreamEncoder::StreamEncoder(ResponseContext ctx) : ctx_(std::move(ctx)), text_offset_(ctx_.n, 0) {
  if (ctx_.chat && ctx_.tool_format != ToolCallFormat::None)
    tool_calls_.assign(static_cast<size_t>(ctx_.n), ToolCallStream(ctx_.tool_format));
}

json StreamEncoder::chunk(json choices) const {
  json c = {{"id", ctx_.id},
            {"object", ctx_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", ctx_.created},
            {"model", ctx_.model},
            {"system_fingerprint", nullptr},
            {"choices", std::move(choices)}};
  if (ctx_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string StreamEncoder::begin() {
  std::string out;
  if (!ctx_.chat) {
    for (size_t i = 0; i < ctx_.echo.size(); ++i) {
      if (ctx_.echo[i].empty()) continue;
      json choice = {{"index", static_cast<int>(i)},
                     {"text", ctx_.echo[i]},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
      out += sse_event(dump_json(chunk(json::array({choice}))));
    }
    return out;
  }
  for (int32_t i = 0; i < ctx_.n; ++i) {
    json choice = {{"index", i},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    out += sse_event(dump_json(chunk(json::array({choice}))));
  }
  return out;
}

std::string StreamEncoder::on_output(const RequestOutput& out) {
  std::string s;
  for (const auto& d : out.deltas) {
    const bool has_lp = ctx_.logprobs >= 0 && !d.logprobs.empty();
    ToolCallStream* calls = tool_calls_.empty() ? nullptr : &tool_calls_.at(static_cast<size_t>(d.index));
    // With a tool-call format, text that may be a call is held back until the reply ends.
    const std::string text = calls ? calls->feed(d.text) : d.text;
    std::vector<ToolCall> found;
    if (calls && d.finish_reason != FinishReason::None) {
      ParsedReply reply = calls->finish();
      found = std::move(reply.calls);
      if (!ctx_.parallel_tool_calls && found.size() > 1) found.resize(1);
      if (!reply.content.empty())
        s += sse_event(dump_json(chunk(json::array({{{"index", d.index},
                                                     {"delta", {{"content", reply.content}}},
                                                     {"logprobs", nullptr},
                                                     {"finish_reason", nullptr}}}))));
    }
    if (!text.empty() || has_lp) {
      json choice = {{"index", d.index}};
      json lp = nullptr;
      if (has_lp) {
        lp = ctx_.chat ? chat_logprobs(ctx_, d.logprobs)
                       : completion_logprobs(ctx_, d.logprobs, text_offset_.at(static_cast<size_t>(d.index)));
      }
      if (ctx_.chat)
        choice["delta"] = {{"content", text}};
      else
        choice["text"] = text;
      choice["logprobs"] = lp;
      choice["finish_reason"] = nullptr;
      s += sse_event(dump_json(chunk(json::array({choice}))));
    }
    if (!found.empty())
      s += sse_event(dump_json(chunk(json::array({{{"index", d.index},
                                                   {"delta", {{"tool_calls", tool_calls_json(found, true)}}},
                                                   {"logprobs", nullptr},
                                                   {"finish_reason", nullptr}}}))));
    if (d.finish_reason != FinishReason::None) {
      json choice = {{"index", d.index}};
      if (ctx_.chat)
        choice["delta"] = json::object();
      else
        choice["text"] = "";
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = found.empty() ? finish_json(d.finish_reason) : json("tool_calls");
      if (!d.stop_reason.empty()) choice["stop_reason"] = d.stop_reason;  // vLLM extension
      s += sse_event(dump_json(chunk(json::array({choice}))));
    }
  }
  return s;
}

std::string StreamEncoder::end(const UsageCounts& usage) {
  std::string s;
  if (ctx_.include_usage) {
    json c = chunk(json::array());
    c["usage"] = usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens);
    s += sse_event(dump_json(c));
  }
  s += sse_done();
  return s;
}

ResponseAccumulator::ResponseAccumulator(ResponseContext ctx)
    : ctx_(std::move(ctx)), choices_(static_cast<size_t>(ctx_.n)) {
  for (size_t i = 0; i < ctx_.echo.size() && i < choices_.size(); ++i) choices_[i].text = ctx_.echo[i];
}

void ResponseAccumulator::on_output(const RequestOutput& out) {
  for (const auto& d : out.deltas) {
    if (d.index < 0 || d.index >= ctx_.n) continue;
    auto& c = choices_[static_cast<size_t>(d.index)];
    c.text += d.text;
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.finish_reason != FinishReason::None) c.finish = d.finish_reason;
  }
}

json ResponseAccumulator::finish(const UsageCounts& usage) const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const auto& c = choices_[i];
    json choice = {{"index", static_cast<int>(i)}};
    json lp = nullptr;
    if (ctx_.logprobs >= 0) {
      int64_t offset = 0;
      lp = ctx_.chat ? chat_logprobs(ctx_, c.logprobs) : completion_logprobs(ctx_, c.logprobs, offset);
    }
    json finish = finish_json(c.finish == FinishReason::None ? FinishReason::Abort : c.finish);
    if (ctx_.chat) {
      ParsedReply reply = ctx_.tool_format == ToolCallFormat::None
                              ? ParsedReply{c.text, {}}
                              : parse_tool_calls(ctx_.tool_format, c.text);
      if (!ctx_.parallel_tool_calls && reply.calls.size() > 1) reply.calls.resize(1);
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
      if (!reply.calls.empty()) {  // OpenAI: content null when the reply is only calls
        choice["message"]["content"] = reply.content.empty() ? json(nullptr) : json(reply.content);
        choice["message"]["tool_calls"] = tool_calls_json(reply.calls, false);
        finish = "tool_calls";
      }
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = lp;
    choice["finish_reason"] = finish;
    choices.push_back(std::move(choice));
  }
  return {{"id", ctx_.id},
          {"object", ctx_.chat ? "chat.completion" : "text_completion"},
          {"created", ctx_.created},
          {"model", ctx_.model},
          {"system_fingerprint", nullptr},
          {"choices", choices},
          {"usage", usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens)}};
}

}  // namespace inferx::server
