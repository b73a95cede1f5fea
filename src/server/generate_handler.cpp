// POST /v1/completions and /v1/chat/completions: parse -> tokenize (chat template) -> admit -> submit to
// the engine -> stream or accumulate the outputs -> respond. Engine callbacks run on the engine thread and
// only record metrics and hand the output to the connection's strand, where the JSON is built.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api_server.h"
#include "server/openai/api_error.h"
#include "server/openai/request.h"
#include "server/openai/response.h"
#include "server/sse.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace inferx::server {

using nlohmann::json;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// The state of one admitted request. Engine-thread fields and strand fields are disjoint.
struct ApiServer::Live {
  std::string id;
  std::shared_ptr<ResponseSink> sink;
  bool stream = false;
  std::optional<StreamEncoder> encoder;            // strand
  std::optional<ResponseAccumulator> accumulator;  // strand
  // Engine thread:
  double arrival = 0, last_output = -1;
  bool counted_queued = true;
  FinishReason reason = FinishReason::None;
};

std::vector<int32_t> ApiServer::tokenize_chat(const ParsedRequest& r) const {
  if (!model_.chat_template)
    bad_request("messages",
                fmt::format("model '{}' has no chat template; start the server with "
                            "--chat-template FILE, or use /v1/completions",
                            options_.served_model_name),
                "chat_template_missing");
  if (!model_.tokenizer)
    bad_request("messages", "this model has no tokenizer; use /v1/completions with token ids");
  const Tokenizer& tok = *model_.tokenizer;
  ChatTemplateInputs in;
  in.messages = r.messages;
  if (r.tools.is_array()) in.tools = r.tools;
  in.add_generation_prompt = true;
  if (tok.bos_id() >= 0) in.bos_token = tok.piece(tok.bos_id());
  if (tok.eos_id() >= 0) in.eos_token = tok.piece(tok.eos_id());
  std::string text;
  try {
    text = model_.chat_template->render(in);
  } catch (const Error& e) {
    bad_request("messages", fmt::format("the chat template failed on these messages: {}", e.what()));
  }
  // Templates that write the BOS token as text get the real BOS id instead (the tokenizer does not
  // parse special-token text); templates without it get none, as transformers' apply_chat_template.
  bool add_bos = false;
  if (!in.bos_token.empty() && text.rfind(in.bos_token, 0) == 0) {
    text.erase(0, in.bos_token.size());
    add_bos = true;
  }
  return tok.encode(text, add_bos);
}

void ApiServer::handle_generate(HttpRequest&& req, std::shared_ptr<ResponseSink> sink, bool chat) {
  const std::string route = chat ? "/v1/chat/completions" : "/v1/completions";
  const nlohmann::ordered_json body = parse_request_body(req.body);
  ParsedRequest r = chat ? parse_chat_request(body) : parse_completion_request(body);
  if (r.model != options_.served_model_name)
    throw ApiError(404,
                   fmt::format("The model `{}` does not exist (this server serves `{}`)", r.model,
                               options_.served_model_name),
                   "model", "model_not_found");

  // Prompt tokens.
  std::vector<int32_t> prompt;
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    prompt = tokenize_chat(r);
  } else if (r.prompt_text) {
    if (!model_.tokenizer)
      bad_request("prompt", "this model has no tokenizer: send the prompt as an array of token ids");
    prompt = model_.tokenizer->encode(*r.prompt_text, model_.add_bos);
  } else {
    prompt = r.prompt_ids;
  }
  if (prompt.empty()) bad_request(prompt_param, fmt::format("'{}' is empty", prompt_param));
  for (int32_t t : prompt)
    if (t < 0 || t >= model_.vocab_size)
      bad_request(prompt_param,
                  fmt::format("token id {} is outside the vocabulary (size {})", t, model_.vocab_size));
  for (const auto& [t, b] : r.params.logit_bias)
    if (t >= model_.vocab_size)
      bad_request("logit_bias",
                  fmt::format("token id {} is outside the vocabulary (size {})", t, model_.vocab_size));

  // Context length (the OpenAI error is a 400 with code context_length_exceeded).
  const int64_t max_len = model_.engine->max_model_len();
  const int64_t room = max_len - static_cast<int64_t>(prompt.size());
  if (room < 1)
    bad_request(
        prompt_param,
        fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens.",
                    max_len, prompt.size()),
        "context_length_exceeded");
  if (r.max_tokens_given && r.params.max_tokens > room)
    bad_request(
        "max_tokens",
        fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                    "({} in the prompt, {} for the completion).",
                    max_len, static_cast<int64_t>(prompt.size()) + r.params.max_tokens, prompt.size(),
                    r.params.max_tokens),
        "context_length_exceeded");
  if (!r.max_tokens_given)  // completions default 16, chat: the rest of the context
    r.params.max_tokens = static_cast<int32_t>(chat ? room : std::min<int64_t>(r.params.max_tokens, room));

  // Admission: bounded queue (429), counted before submit so concurrent handlers cannot overshoot.
  if (options_.max_queue > 0) {
    if (queued_.fetch_add(1) >= options_.max_queue) {
      queued_ -= 1;
      throw ApiError(
          429,
          fmt::format("the server's queue is full ({} requests waiting); retry later", options_.max_queue),
          "", "queue_full", "rate_limit_error");
    }
  } else {
    queued_ += 1;
  }

  auto live = std::make_shared<Live>();
  live->id = make_response_id(chat ? "chatcmpl-" : "cmpl-");
  live->sink = sink;
  live->stream = r.stream;
  live->arrival = now_s();
  ResponseContext ctx;
  ctx.chat = chat;
  ctx.id = live->id;
  ctx.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ctx.model = options_.served_model_name;
  ctx.n = r.params.n;
  ctx.include_usage = r.include_usage;
  ctx.logprobs = r.params.logprobs;
  ctx.tokenizer = model_.tokenizer;
  if (r.stream)
    live->encoder.emplace(ctx);
  else
    live->accumulator.emplace(ctx);

  EngineRequest er;
  er.id = live->id;
  er.prompt = std::move(prompt);
  er.params = r.params;
  er.priority = r.priority;
  er.tenant = r.user;
  const bool ids_as_text = model_.tokenizer == nullptr;
  er.on_output = [this, live, ids_as_text](RequestOutput&& out) {
    // Engine thread: metrics, then hand over to the connection's strand.
    const double t = now_s();
    bool has_tokens = false;
    for (auto& d : out.deltas) {
      has_tokens = has_tokens || !d.token_ids.empty();
      if (d.finish_reason != FinishReason::None) live->reason = d.finish_reason;
      if (ids_as_text)  // no tokenizer: the text is the token ids, so clients still see what came out
        for (int32_t id : d.token_ids) d.text += fmt::format(" {}", id);
    }
    if (live->counted_queued && (has_tokens || out.finished)) {
      live->counted_queued = false;
      queued_ -= 1;
    }
    if (has_tokens) {
      if (live->last_output < 0)
        metrics_.first_token(t - live->arrival);
      else
        metrics_.inter_token(t - live->last_output);
      live->last_output = t;
    }
    if (out.finished) {
      FinishReason reason = out.error.empty() ? live->reason : FinishReason::Abort;
      if (reason == FinishReason::None) reason = FinishReason::Abort;
      const double queue_s =
          out.times.scheduled > 0 && out.times.arrival > 0 ? out.times.scheduled - out.times.arrival : -1.0;
      metrics_.request_finished(reason, out.prompt_tokens, out.completion_tokens, t - live->arrival, queue_s);
      {
        std::lock_guard lock(ids_mu_);
        live_ids_.erase(live->id);
      }
      live_ -= 1;
    }
    auto shared = std::make_shared<RequestOutput>(std::move(out));
    live->sink->post([live, shared] {
      const RequestOutput& o = *shared;
      if (live->stream) {
        if (!o.error.empty()) {
          ApiError e(500, o.error, "", "", "internal_error");
          live->sink->write(sse_event(dump_json(e.body())));
        } else {
          live->sink->write(live->encoder->on_output(o));
        }
        if (o.finished) {
          live->sink->write(live->encoder->end(o));
          live->sink->end();
        }
        return;
      }
      live->accumulator->on_output(o);
      if (!o.finished) return;
      if (!o.error.empty()) {
        ApiError e(500, o.error, "", "", "internal_error");
        live->sink->send(500, "application/json", dump_json(e.body()));
        return;
      }
      live->sink->send(200, "application/json", dump_json(live->accumulator->finish(o)));
    });
  };

  live_ += 1;
  {
    std::lock_guard lock(ids_mu_);
    live_ids_.insert(live->id);
  }
  try {
    model_.engine->submit(std::move(er));
  } catch (const Error& e) {
    {
      std::lock_guard lock(ids_mu_);
      live_ids_.erase(live->id);
    }
    live_ -= 1;
    queued_ -= 1;
    throw ApiError(400, e.what(), "", "invalid_request");
  }
  metrics_.http_response(route, 200);
  // Ordering: the engine may already have posted outputs to the strand, but each of those posts its
  // writes again, so they land after the stream start posted below (the strand is FIFO).
  // A client that goes away aborts its request: the engine frees its blocks and sends a final output.
  Engine* engine = model_.engine;
  sink->on_disconnect([engine, id = live->id] { engine->abort(id); });
  if (r.stream) {
    sink->start_stream(200, "text/event-stream; charset=utf-8");
    std::string role = live->encoder->begin();
    if (!role.empty()) sink->write(std::move(role));
  }
}

}  // namespace inferx::server
