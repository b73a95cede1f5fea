#include "server/openai/request.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "server/openai/api_error.h"
#include "server/openai/json_body.h"

namespace inferx::server {

namespace {

// ordered_json: the chat template must see messages and tool schemas in the order the client sent them.
using json = nlohmann::ordered_json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// Present and not null: OpenAI treats "field": null as "not given".
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double get_number(const json& body, const char* name, double lo, double hi, double def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number())
    bad_request(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)), "invalid_type");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad_request(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  return x;
}

int64_t get_int(const json& body, const char* name, int64_t lo, int64_t hi, int64_t def) {
  const json* v = field(body, name);
  if (!v) return def;
  // 2.0 is accepted as 2 (JSON has one number type; Python clients may send floats).
  if (!v->is_number_integer() && !(v->is_number_float() && v->get<double>() == std::floor(v->get<double>())))
    bad_request(name, fmt::format("'{}' must be an integer, got {}", name, type_name(*v)), "invalid_type");
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad_request(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, v->dump()));
  return v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
}

std::string get_string(const json& body, const char* name, const std::string& def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_string())
    bad_request(name, fmt::format("'{}' must be a string, got {}", name, type_name(*v)), "invalid_type");
  return v->get<std::string>();
}

std::vector<int32_t> token_ids(const json& arr, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& t : arr) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad_request(param,
                  fmt::format("'{}' token ids must be non-negative integers, got {}", param, t.dump()));
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const json& body, ParsedRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) bad_request("prompt", "'prompt' is required", "missing_required_parameter");
  if (p->is_string()) {
    r.prompts.push_back({p->get<std::string>(), {}});
    return;
  }
  if (!p->is_array())
    bad_request("prompt",
                fmt::format("'prompt' must be a string, an array of strings, an array of token ids or an "
                            "array of token-id arrays, got {}",
                            type_name(*p)),
                "invalid_type");
  if (p->empty()) bad_request("prompt", "'prompt' must not be empty");
  if (p->front().is_number()) {
    r.prompts.push_back({std::nullopt, token_ids(*p, "prompt")});
    return;
  }
  // A batch of prompts: all strings or all token-id arrays (the OpenAI reference's two list forms).
  if (p->size() > kMaxPrompts)
    bad_request("prompt",
                fmt::format("'prompt' holds {} prompts; at most {} are allowed", p->size(), kMaxPrompts));
  const bool texts = p->front().is_string();
  for (size_t i = 0; i < p->size(); ++i) {
    const json& x = (*p)[i];
    const std::string param = fmt::format("prompt[{}]", i);
    if (texts && x.is_string()) {
      r.prompts.push_back({x.get<std::string>(), {}});
    } else if (!texts && x.is_array()) {
      if (x.empty()) bad_request(param, fmt::format("'{}' must not be empty", param));
      r.prompts.push_back({std::nullopt, token_ids(x, param)});
    } else {
      bad_request(param,
                  "'prompt' as an array must hold only strings, or only arrays of token ids, or be one "
                  "array of token ids",
                  "invalid_type");
    }
  }
}

void parse_stop(const json& body, ParsedRequest& r) {
  const json* s = field(body, "stop");
  if (!s) return;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) r.params.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array())
    bad_request("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(*s)),
                "invalid_type");
  if (s->size() > kMaxStopStrings)
    bad_request("stop",
                fmt::format("'stop' holds {} strings; at most {} are allowed", s->size(), kMaxStopStrings));
  for (const auto& x : *s) {
    if (!x.is_string()) bad_request("stop", "'stop' must hold only strings", "invalid_type");
    if (x.get<std::string>().empty()) bad_request("stop", "'stop' strings must not be empty");
    r.params.stop.push_back(x.get<std::string>());
  }
}

void parse_logit_bias(const json& body, ParsedRequest& r) {
  const json* b = field(body, "logit_bias");
  if (!b) return;
  if (!b->is_object())
    bad_request("logit_bias", "'logit_bias' must be an object mapping token ids to biases", "invalid_type");
  for (const auto& [key, value] : b->items()) {
    int64_t id = -1;
    try {
      size_t used = 0;
      id = std::stoll(key, &used);
      if (used != key.size()) id = -1;
    } catch (const std::exception&) {
      id = -1;
    }
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      bad_request("logit_bias", fmt::format("'logit_bias' key '{}' is not a token id", key));
    if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100)
      bad_request("logit_bias",
                  fmt::format("'logit_bias' value for token {} must be a number in [-100, 100]", key));
    r.params.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
}

// The sampling fields shared by both endpoints.
void parse_common(const json& body, ParsedRequest& r) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object", "invalid_type");
  const json* m = field(body, "model");
  if (!m) bad_request("model", "'model' is required", "missing_required_parameter");
  r.model = get_string(body, "model", "");

  auto& p = r.params;
  p.temperature = static_cast<float>(get_number(body, "temperature", 0.0, 2.0, 1.0));
  p.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0, 1.0));
  if (field(body, "top_p") && p.top_p <= 0.0f) bad_request("top_p", "'top_p' must be greater than 0");
  // vLLM convention: -1 (or 0) disables top-k.
  p.top_k = static_cast<int32_t>(get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max(), 0));
  if (p.top_k < 0) p.top_k = 0;
  p.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 1.0, 0.0));
  p.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", -2.0, 2.0, 0.0));
  p.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", -2.0, 2.0, 0.0));
  p.repetition_penalty = static_cast<float>(get_number(body, "repetition_penalty", 0.01, 10.0, 1.0));
  p.n = static_cast<int32_t>(get_int(body, "n", 1, kMaxN, 1));
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer())
      bad_request("seed", fmt::format("'seed' must be an integer, got {}", type_name(*s)), "invalid_type");
    p.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  p.ignore_eos = get_bool(body, "ignore_eos", false);
  p.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  parse_stop(body, r);
  parse_logit_bias(body, r);
  if (const json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array())
      bad_request("stop_token_ids", "'stop_token_ids' must be an array of token ids", "invalid_type");
    p.stop_token_ids = token_ids(*ids, "stop_token_ids");
  }

  r.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!r.stream) bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object", "invalid_type");
    r.include_usage = get_bool(*so, "include_usage", false);
  }
  r.user = get_string(body, "user", "");
  r.priority = static_cast<int32_t>(get_int(body, "priority", -1000000, 1000000, 0));

  // Fields we do not implement: refuse them rather than silently ignore what the client asked for.
  // Structured output: JSON mode is enforced by a token constraint (text/json_constraint.h); a schema is
  // not, so it is refused rather than answered with JSON that may not follow it.
  if (const json* f = field(body, "response_format")) {
    const json* type = f->is_object() ? field(*f, "type") : nullptr;
    if (!type || !type->is_string())
      bad_request("response_format", "'response_format' must be an object with a string 'type'",
                  "invalid_type");
    if (*type == "json_object") {
      r.response_format = ResponseFormat::JsonObject;
    } else if (*type == "json_schema") {
      // {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: compiled by the handler
      // (text/json_schema_constraint.h), which refuses what it cannot enforce.
      const json* js = field(*f, "json_schema");
      const json* schema = js && js->is_object() ? field(*js, "schema") : nullptr;
      if (!schema)
        bad_request("response_format", "'response_format.json_schema.schema' is required",
                    "missing_required_parameter");
      r.response_format = ResponseFormat::JsonSchema;
      r.json_schema = *schema;
    } else if (*type != "text") {
      bad_request("response_format",
                  fmt::format("'response_format' type '{}' is not supported; 'text', 'json_object' and "
                              "'json_schema' are",
                              type->get<std::string>()));
    }
  }

  if (r.response_format != ResponseFormat::Text && p.ignore_eos && p.stop_token_ids.empty())
    bad_request("ignore_eos",
                "'ignore_eos' with a JSON response_format leaves nothing to end the reply once the "
                "object is complete (give 'stop_token_ids')");

  if (get_int(body, "best_of", 1, kMaxN, p.n) != p.n)
    bad_request("best_of", "'best_of' other than n is not supported");
}

int32_t parse_max_tokens(const json& body, ParsedRequest& r, const char* name) {
  const json* v = field(body, name);
  if (!v) return -1;
  r.max_tokens_given = true;
  return static_cast<int32_t>(get_int(body, name, 1, std::numeric_limits<int32_t>::max(), 16));
}

std::string message_content(const json& content, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // content parts: only text is supported (no vision input)
    std::string text;
    for (const auto& part : content) {
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string())
        bad_request(param,
                    fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": ...}}; other content "
                                "types are not supported",
                                param));
      text += part["text"].get<std::string>();
    }
    return text;
  }
  bad_request(param, fmt::format("'{}' must be a string or an array of text parts", param), "invalid_type");
}

}  // namespace

bool get_bool(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean())
    bad_request(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)), "invalid_type");
  return v->get<bool>();
}

json parse_request_body(const std::string& text) {
  try {
    return parse_json_body(text, kMaxJsonDepth);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for overflowing numbers
    throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()), "", "invalid_json");
  } catch (const JsonTooDeep& e) {
    throw ApiError(400, fmt::format("the request body's JSON nests deeper than {} levels", e.max_depth), "",
                   "invalid_json");
  }
}

ParsedRequest parse_completion_request(const json& body) {
  ParsedRequest r;
  parse_common(body, r);
  parse_prompt(body, r);
  const int32_t mt = parse_max_tokens(body, r, "max_tokens");
  r.params.max_tokens = mt > 0 ? mt : 16;  // OpenAI's default for completions
  r.params.logprobs = static_cast<int32_t>(get_int(body, "logprobs", 0, kMaxLogprobs, -1));
  if (static_cast<int64_t>(r.prompts.size()) * r.params.n > kMaxChoices)
    bad_request(
        "n", fmt::format("{} prompts x n = {} asks for {} choices; at most {} are allowed", r.prompts.size(),
                         r.params.n, static_cast<int64_t>(r.prompts.size()) * r.params.n, kMaxChoices));
  r.echo = get_bool(body, "echo", false);
  // The prompt's own logprobs are not computed (only sampled positions produce logits), so echo cannot
  // come with logprobs: refuse rather than answer with logprobs that leave the prompt out.
  if (r.echo && r.params.logprobs >= 0)
    bad_request("echo",
                "'echo' together with 'logprobs' is not supported (prompt logprobs are not computed)");
  if (field(body, "suffix")) bad_request("suffix", "'suffix' is not supported");
  return r;
}

ParsedRequest parse_chat_request(const json& body) {
  ParsedRequest r;
  r.chat = true;
  parse_common(body, r);
  const json* msgs = field(body, "messages");
  if (!msgs) bad_request("messages", "'messages' is required", "missing_required_parameter");
  if (!msgs->is_array() || msgs->empty())
    bad_request("messages", "'messages' must be a non-empty array of messages", "invalid_type");
  r.messages = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(param, fmt::format("'{}' must be an object", param), "invalid_type");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      bad_request(param + ".role", fmt::format("'{}.role' must be a string", param), "invalid_type");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool" && rs != "developer")
      bad_request(param + ".role",
                  fmt::format("'{}.role' must be one of system, developer, user, assistant, tool; "
                              "got '{}'",
                              param, rs));
    json out = m;
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (rs != "assistant" || !m.contains("tool_calls"))
        bad_request(param + ".content", fmt::format("'{}.content' is required", param),
                    "missing_required_parameter");
      out["content"] = nullptr;
    } else {
      out["content"] = message_content(*content, i);
    }
    r.messages.push_back(std::move(out));
  }
  if (const json* t = field(body, "tools")) {
    if (!t->is_array()) bad_request("tools", "'tools' must be an array", "invalid_type");
    r.tools = *t;
  }
  // The tools reach the chat template and the reply is parsed for calls (--tool-call-parser); "required" or
  // a named function constrains the reply to such a call (the handler, with the tools' parameter schemas).
  // A string member of an object, or "" (tools and tool_choice come in many shapes; none may throw here).
  auto name_of = [](const json& holder, const char* key) -> std::string {
    if (!holder.is_object()) return "";
    auto f = holder.find(key);
    if (f == holder.end() || !f->is_object()) return "";
    auto n = f->find("name");
    return n != f->end() && n->is_string() ? n->get<std::string>() : "";
  };
  if (const json* c = field(body, "tool_choice")) {
    if (c->is_string() && (*c == "auto" || *c == "none" || *c == "required")) {
      r.tool_choice = c->get<std::string>();
    } else if (c->is_object() && c->contains("type") && (*c)["type"] == "function" &&
               !name_of(*c, "function").empty()) {
      r.tool_choice = "function";
      r.tool_choice_name = name_of(*c, "function");
    } else {
      bad_request("tool_choice",
                  "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}",
                  "invalid_type");
    }
    if (r.tool_choice == "required" || r.tool_choice == "function") {
      if (!r.tools.is_array() || r.tools.empty())
        bad_request("tool_choice", "'tool_choice' asks for a call but 'tools' is empty");
      bool found = r.tool_choice == "required";
      for (const auto& t : r.tools) found = found || name_of(t, "function") == r.tool_choice_name;
      if (!found)
        bad_request("tool_choice",
                    fmt::format("'tool_choice' names '{}', which is not in 'tools'", r.tool_choice_name));
    }
  }
  for (const char* legacy : {"functions", "function_call"})
    if (field(body, legacy))
      bad_request(legacy, fmt::format("'{}' (deprecated) is not supported; send 'tools'", legacy));
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls", true);
  // Outputs this server cannot produce: audio, and web search's grounded answers.
  if (const json* m = field(body, "modalities")) {
    if (!m->is_array()) bad_request("modalities", "'modalities' must be an array", "invalid_type");
    for (const auto& x : *m)
      if (x != "text")
        bad_request("modalities", fmt::format("only the text modality is served, not {}", x.dump()));
  }
  for (const char* unsupported : {"audio", "web_search_options"})
    if (field(body, unsupported))
      bad_request(unsupported, fmt::format("'{}' is not supported by this server", unsupported));
  // max_completion_tokens replaces the deprecated max_tokens (OpenAI chat reference); it wins when both.
  const int32_t mct = parse_max_tokens(body, r, "max_completion_tokens");
  const int32_t mt = mct > 0 ? mct : parse_max_tokens(body, r, "max_tokens");
  r.params.max_tokens = mt > 0 ? mt : 0;  // 0: filled in once the prompt length is known
  r.chat_logprobs = get_bool(body, "logprobs", false);
  r.top_logprobs = static_cast<int32_t>(get_int(body, "top_logprobs", 0, kMaxLogprobs, 0));
  if (field(body, "top_logprobs") && !r.chat_logprobs)
    bad_request("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
  r.params.logprobs = r.chat_logprobs ? r.top_logprobs : -1;
  return r;
}

}  // namespace inferx::server
