// POST /v1/completions and /v1/chat/completions: parse -> tokenize (chat template) -> admit -> submit to
// the engine -> stream or accumulate the outputs -> respond. Engine callbacks run on the engine thread and
// only record metrics and hand the output to the connection's strand, where the JSON is built.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api_server.h"
#include "server/openai/api_error.h"
#include "server/openai/request.h"
#include "server/openai/response.h"
#include "server/sse.h"
#include "text/chat_template.h"
#include "text/json_constraint.h"
#include "text/json_schema_constraint.h"
#include "text/tokenizer.h"

namespace inferx::server {

using nlohmann::json;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// What one HTTP request answers with, on the connection's strand: a completions request with several prompts
// runs one engine request per prompt, and their outputs meet here (choice index = prompt * n + j).
struct ApiServer::Response {
  std::shared_ptr<ResponseSink> sink;
  std::atomic<bool> refused{false};  // an engine request was refused at submission: the client got a 400
  bool stream = false;
  std::optional<StreamEncoder> encoder;
  std::optional<ResponseAccumulator> accumulator;
  size_t unfinished = 0;  // engine requests without their final output yet
  UsageCounts usage;      // summed over the finished ones
  std::string error;      // the first engine request's error
  void on_output(const RequestOutput& o);
};

// The engine-thread state of one engine request (one prompt).
struct ApiServer::Live {
  std::string id;
  int32_t index_offset = 0;            // its choices' first index in the response
  std::shared_ptr<Response> response;  // touched on the strand only (through sink->post)
  std::shared_ptr<ResponseSink> sink;
  double arrival = 0, last_output = -1;
  bool counted_queued = true;
  FinishReason reason = FinishReason::None;
};

std::shared_ptr<const TokenTrie> ApiServer::token_trie() {
  std::lock_guard lock(trie_mu_);
  if (!trie_) trie_ = std::make_shared<const TokenTrie>(*model_.tokenizer);
  return trie_;
}

std::shared_ptr<const TokenConstraint> ApiServer::json_mode() {
  std::shared_ptr<const TokenTrie> trie = token_trie();
  std::lock_guard lock(trie_mu_);
  if (!json_mode_) json_mode_ = make_json_object_constraint(std::move(trie));
  return json_mode_;
}

// tool_choice "required" or a named function: the reply is constrained to one call in the parser's format,
// {"name": one of the tools, "arguments" (llama3_json: "parameters"): that tool's parameter schema}, between
// hermes' markers. The tools' $defs are hoisted to the call schema's root, where their $refs point.
std::shared_ptr<const TokenConstraint> ApiServer::forced_tool_call(const ParsedRequest& r) {
  const ToolCallFormat format = options_.tool_call_format;
  if (format != ToolCallFormat::Hermes && format != ToolCallFormat::Llama3Json)
    bad_request("tool_choice",
                "forcing a tool call needs the server started with --tool-call-parser hermes or llama3_json");
  if (r.response_format != ResponseFormat::Text)
    bad_request("tool_choice", "a forced tool call and 'response_format' cannot both constrain the reply");
  if (!model_.tokenizer) bad_request("tool_choice", "forcing a tool call needs the model's tokenizer");
  const char* args_key = format == ToolCallFormat::Hermes ? "arguments" : "parameters";
  nlohmann::ordered_json calls = nlohmann::ordered_json::array(), defs = nlohmann::ordered_json::object();
  for (const auto& tool : r.tools) {
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) continue;
    const std::string name = (*fn)["name"].get<std::string>();
    if (r.tool_choice == "function" && name != r.tool_choice_name) continue;
    nlohmann::ordered_json params =
        fn->contains("parameters") ? (*fn)["parameters"] : nlohmann::ordered_json::object();
    if (params.is_object())
      for (const char* container : {"$defs", "definitions"}) {
        auto d = params.find(container);
        if (d == params.end() || !d->is_object()) continue;
        for (const auto& [k, v] : d->items()) {
          if (defs.contains(k) && defs[k] != v)
            bad_request(
                "tools",
                fmt::format("two tools define '{}' differently; a forced call cannot tell them apart", k));
          defs[k] = v;
        }
        params.erase(container);
      }
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", name}}}, {args_key, params}}},
                     {"required", {"name", args_key}}});
  }
  nlohmann::ordered_json schema = {{"anyOf", calls}};
  // Refs to "#/definitions/X" and "#/$defs/X" both resolve against the hoisted table.
  if (!defs.empty()) {
    schema["$defs"] = defs;
    schema["definitions"] = defs;
  }
  std::shared_ptr<CompiledSchema> compiled;
  try {
    CompiledSchema c = CompiledSchema::compile(schema);
    if (format == ToolCallFormat::Hermes)
      c = CompiledSchema::wrap(std::move(c), "<tool_call>\n", "\n</tool_call>");
    compiled = std::make_shared<CompiledSchema>(std::move(c));
  } catch (const SchemaError& e) {
    bad_request("tools",
                fmt::format("a tool's parameters cannot be enforced for a forced call: {}", e.what()));
  }
  return make_json_schema_constraint(token_trie(), std::move(compiled));
}

std::vector<int32_t> ApiServer::tokenize_chat(const ParsedRequest& r, bool add_generation_prompt) const {
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
  in.add_generation_prompt = add_generation_prompt;
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
  require_served_model(r.model);

  // Structured output, checked before any tokenizing so that what cannot be enforced is refused first.
  if (r.response_format != ResponseFormat::Text) {
    if (!model_.tokenizer)
      bad_request(
          "response_format",
          "a json_object or json_schema response_format needs the model's tokenizer; this model has none");
    if (r.response_format == ResponseFormat::JsonObject) {
      r.params.constraint = json_mode();
    } else {
      std::shared_ptr<CompiledSchema> schema;
      try {
        schema = std::make_shared<CompiledSchema>(CompiledSchema::compile(r.json_schema));
      } catch (const SchemaError& e) {
        bad_request("response_format", fmt::format("the JSON schema cannot be enforced: {}", e.what()));
      }
      r.params.constraint = make_json_schema_constraint(token_trie(), std::move(schema));
    }
  }
  if (chat && (r.tool_choice == "required" || r.tool_choice == "function"))
    r.params.constraint = forced_tool_call(r);
  // Prompt tokens, one list per engine request (chat: one; completions: one per prompt).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> echo_texts;  // completions with echo: each prompt's text
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    prompts.push_back(tokenize_chat(r));
  } else {
    for (const PromptInput& p : r.prompts) {
      if (p.text) {
        if (!model_.tokenizer)
          bad_request("prompt", "this model has no tokenizer: send the prompt as an array of token ids");
        prompts.push_back(model_.tokenizer->encode(*p.text, model_.add_bos));
      } else {
        prompts.push_back(p.ids);
      }
      if (r.echo) {
        if (p.text)
          echo_texts.push_back(*p.text);
        else if (model_.tokenizer)
          echo_texts.push_back(model_.tokenizer->decode(p.ids));
        else
          echo_texts.push_back(fmt::format("{}", fmt::join(p.ids, " ")));
      }
    }
  }
  const int64_t max_len = model_.engine->max_model_len();
  for (const auto& prompt : prompts) {
    if (prompt.empty()) bad_request(prompt_param, fmt::format("'{}' is empty", prompt_param));
    for (int32_t t : prompt)
      if (t < 0 || t >= model_.vocab_size)
        bad_request(prompt_param,
                    fmt::format("token id {} is outside the vocabulary (size {})", t, model_.vocab_size));
    // Context length (the OpenAI error is a 400 with code context_length_exceeded).
    const int64_t room = max_len - static_cast<int64_t>(prompt.size());
    if (room < 1)
      bad_request(prompt_param,
                  fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} "
                              "tokens.",
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
  }
  for (const auto& [t, b] : r.params.logit_bias)
    if (t >= model_.vocab_size)
      bad_request("logit_bias",
                  fmt::format("token id {} is outside the vocabulary (size {})", t, model_.vocab_size));
  // Without max_tokens: completions 16 (fewer where a prompt leaves less room), chat the rest of the context.
  std::vector<int32_t> max_tokens(prompts.size(), r.params.max_tokens);
  if (!r.max_tokens_given)
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t room = max_len - static_cast<int64_t>(prompts[i].size());
      max_tokens[i] = static_cast<int32_t>(chat ? room : std::min<int64_t>(r.params.max_tokens, room));
    }

  // Admission: bounded queue (429), counted before submit so concurrent handlers cannot overshoot; a
  // request's prompts are admitted together or not at all.
  const auto count = static_cast<int64_t>(prompts.size());
  if (options_.max_queue > 0 && count > options_.max_queue)  // could never be admitted: not a retryable 429
    bad_request("prompt", fmt::format("'prompt' holds {} prompts, more than this server ever queues at once "
                                      "(--max-queue {}); send fewer per request",
                                      count, options_.max_queue));
  if (options_.max_queue > 0) {
    if (queued_.fetch_add(count) + count > options_.max_queue) {
      queued_ -= count;
      throw ApiError(
          429,
          fmt::format("the server's queue is full ({} requests waiting); retry later", options_.max_queue),
          "", "queue_full", "rate_limit_error");
    }
  } else {
    queued_ += count;
  }

  auto response = std::make_shared<Response>();
  response->sink = sink;
  response->stream = r.stream;
  response->unfinished = prompts.size();
  ResponseContext ctx;
  ctx.chat = chat;
  ctx.id = make_response_id(chat ? "chatcmpl-" : "cmpl-");
  ctx.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ctx.model = options_.served_model_name;
  ctx.n = static_cast<int32_t>(count) * r.params.n;
  for (const std::string& text : echo_texts)
    for (int32_t j = 0; j < r.params.n; ++j) ctx.echo.push_back(text);
  if (chat && options_.tool_call_format != ToolCallFormat::None && r.tools.is_array() && !r.tools.empty() &&
      r.tool_choice != "none")
    ctx.tool_format = options_.tool_call_format;
  // Mistral's [TOOL_CALLS] is a control token: decoding must keep it for the parser to see the call.
  if (ctx.tool_format == ToolCallFormat::Mistral) r.params.skip_special_tokens = false;
  ctx.parallel_tool_calls = r.parallel_tool_calls;
  ctx.include_usage = r.include_usage;
  ctx.logprobs = r.params.logprobs;
  ctx.tokenizer = model_.tokenizer;
  const std::string response_id = ctx.id;
  if (r.stream)
    response->encoder.emplace(std::move(ctx));
  else
    response->accumulator.emplace(std::move(ctx));

  std::vector<EngineRequest> requests;
  const bool ids_as_text = model_.tokenizer == nullptr;
  for (size_t p = 0; p < prompts.size(); ++p) {
    auto live = std::make_shared<Live>();
    // Engine ids are unique among live requests: one prompt keeps the response id, several get a suffix.
    live->id = count == 1 ? response_id : fmt::format("{}-{}", response_id, p);
    live->index_offset = static_cast<int32_t>(p) * r.params.n;
    live->response = response;
    live->sink = sink;
    live->arrival = now_s();
    EngineRequest er;
    er.id = live->id;
    er.prompt = std::move(prompts[p]);
    er.params = r.params;
    er.params.max_tokens = max_tokens[p];
    er.priority = r.priority;
    er.tenant = r.user;
    er.on_output = [this, live, ids_as_text](RequestOutput&& out) {
      // Engine thread: metrics, then hand over to the connection's strand.
      const double t = now_s();
      bool has_tokens = false;
      for (auto& d : out.deltas) {
        has_tokens = has_tokens || !d.token_ids.empty();
        if (d.finish_reason != FinishReason::None) live->reason = d.finish_reason;
        if (ids_as_text)  // no tokenizer: the text is the token ids, so clients still see what came out
          for (int32_t id : d.token_ids) d.text += fmt::format(" {}", id);
        d.index += live->index_offset;
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
        metrics_.request_finished(reason, out.prompt_tokens, out.completion_tokens, t - live->arrival,
                                  queue_s);
        {
          std::lock_guard lock(ids_mu_);
          live_ids_.erase(live->id);
        }
        live_ -= 1;
      }
      auto shared = std::make_shared<RequestOutput>(std::move(out));
      live->sink->post([resp = live->response, shared] { resp->on_output(*shared); });
    };
    requests.push_back(std::move(er));
  }

  std::vector<std::string> ids;
  for (const EngineRequest& er : requests) ids.push_back(er.id);
  live_ += count;
  {
    std::lock_guard lock(ids_mu_);
    live_ids_.insert(ids.begin(), ids.end());
  }
  // A request is submitted whole or refused whole: a prompt the engine refuses aborts the ones before it,
  // and those never reach the client (the 400 below is its answer).
  size_t submitted = 0;
  try {
    for (EngineRequest& er : requests) {
      model_.engine->submit(std::move(er));
      ++submitted;
    }
  } catch (const Error& e) {
    response->refused = true;  // the aborted prompts' final outputs must not answer the client
    for (size_t i = 0; i < submitted; ++i) model_.engine->abort(ids[i]);
    {
      std::lock_guard lock(ids_mu_);
      for (size_t i = submitted; i < ids.size(); ++i) live_ids_.erase(ids[i]);
    }
    live_ -= count - static_cast<int64_t>(submitted);
    queued_ -= count - static_cast<int64_t>(submitted);
    throw ApiError(400, e.what(), "", "invalid_request");
  }
  metrics_.http_response(route, 200);
  // Ordering: the engine may already have posted outputs to the strand, but each of those posts its
  // writes again, so they land after the stream start posted below (the strand is FIFO).
  // A client that goes away aborts its requests: the engine frees their blocks and sends final outputs.
  Engine* engine = model_.engine;
  sink->on_disconnect([engine, ids] {
    for (const auto& id : ids) engine->abort(id);
  });
  if (r.stream) {
    sink->start_stream(200, "text/event-stream; charset=utf-8");
    std::string first = response->encoder->begin();
    if (!first.empty()) sink->write(std::move(first));
  }
}

// Strand: one engine request's output (its choice indices already offset into the response's).
void ApiServer::Response::on_output(const RequestOutput& o) {
  if (refused) return;
  if (!o.error.empty() && error.empty()) error = o.error;
  if (stream) {
    if (!o.error.empty()) {
      ApiError e(500, o.error, "", "", "internal_error");
      sink->write(sse_event(dump_json(e.body())));
    } else {
      sink->write(encoder->on_output(o));
    }
  } else {
    accumulator->on_output(o);
  }
  if (!o.finished) return;
  usage.add(o);
  if (--unfinished > 0) return;
  if (stream) {
    sink->write(encoder->end(usage));
    sink->end();
  } else if (!error.empty()) {
    ApiError e(500, error, "", "", "internal_error");
    sink->send(500, "application/json", dump_json(e.body()));
  } else {
    sink->send(200, "application/json", dump_json(accumulator->finish(usage)));
  }
}

}  // namespace inferx::server
