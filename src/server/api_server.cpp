#include "server/api_server.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "server/auth.h"
#include "server/openai/api_error.h"
#include "server/openai/response.h"

#ifndef INFERX_VERSION
#define INFERX_VERSION "0.1.0"
#endif

namespace inferx::server {

using nlohmann::json;

namespace {

// "%2F" -> "/", "+" kept (a path, not a form); a malformed escape stays as written.
std::string url_decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The route label of inferx_http_responses_total: the served routes by name, anything else as "other", so
// clients probing arbitrary paths cannot grow the metric's label set without bound.
std::string route_label(const std::string& path) {
  for (const char* r : {"/health", "/ready", "/version", "/metrics", "/v1/models", "/v1/completions",
                        "/v1/chat/completions", "/tokenize", "/detokenize"})
    if (path == r) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{model}";
  return "other";
}

}  // namespace

ApiServer::ApiServer(ApiServerOptions options)
    : options_(std::move(options)),
      metrics_(options_.model_version.empty() ? options_.served_model_name : options_.model_version) {
  created_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
}

ApiServer::~ApiServer() = default;

void ApiServer::set_model(const ServedModel& model) {
  model_ = model;
  ready_ = true;
}

void ApiServer::abort_all() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(ids_mu_);
    ids.assign(live_ids_.begin(), live_ids_.end());
  }
  for (const auto& id : ids) model_.engine->abort(id);
}

void ApiServer::reply_json(const std::shared_ptr<ResponseSink>& sink, const std::string& route, int status,
                           const std::string& body, HttpHeaders headers) {
  metrics_.http_response(route, status);
  sink->send(status, "application/json", body, std::move(headers));
}

json ApiServer::model_json() const {
  json m = {{"id", options_.served_model_name},
            {"object", "model"},
            {"created", created_},
            {"owned_by", "inferx"},
            {"root", options_.served_model_name},
            {"parent", nullptr}};
  // Extensions (vLLM also reports max_model_len): what `inferx bench serve` needs to make prompts.
  if (ready_) {
    m["max_model_len"] = model_.engine->max_model_len();
    m["vocab_size"] = model_.vocab_size;
  }
  return m;
}

void ApiServer::require_served_model(const std::string& name) const {
  if (name != options_.served_model_name)
    throw ApiError(404,
                   fmt::format("The model `{}` does not exist (this server serves `{}`)", name,
                               options_.served_model_name),
                   "model", "model_not_found");
}

void ApiServer::handle_models(const std::shared_ptr<ResponseSink>& sink) {
  reply_json(sink, "/v1/models", 200, dump_json({{"object", "list"}, {"data", json::array({model_json()})}}));
}

void ApiServer::handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
  const std::string& path = req.path;
  const bool get = req.method == "GET" || req.method == "HEAD";
  const bool post = req.method == "POST";
  try {
    if (path == "/health") {
      if (!get) throw ApiError(405, "use GET /health");
      return reply_json(sink, path, 200, R"({"status":"ok"})");
    }
    if (path == "/ready") {
      if (!get) throw ApiError(405, "use GET /ready");
      if (ready_ && !draining_) return reply_json(sink, path, 200, R"({"status":"ready"})");
      return reply_json(sink, path, 503,
                        fmt::format(R"({{"status":"{}"}})", draining_ ? "draining" : "loading"));
    }
    if (path == "/version") {
      if (!get) throw ApiError(405, "use GET /version");
      return reply_json(sink, path, 200, dump_json({{"version", INFERX_VERSION}}));
    }
    if (path == "/metrics") {
      if (!get) throw ApiError(405, "use GET /metrics");
      if (ready_) metrics_.update_engine(model_.engine->stats());
      metrics_.http_response(path, 200);
      return sink->send(200, "text/plain; version=0.0.4; charset=utf-8", metrics_.render());
    }
    const bool tokenizer_route = path == "/tokenize" || path == "/detokenize";
    const bool v1 = path.rfind("/v1/", 0) == 0;
    if ((v1 || tokenizer_route) && !is_authorized(req, options_.api_key))
      throw ApiError(401, "Incorrect API key provided (send it as 'Authorization: Bearer <key>')", "",
                     "invalid_api_key");
    if (path == "/v1/models") {
      if (!get) throw ApiError(405, "use GET /v1/models");
      return handle_models(sink);
    }
    // GET /v1/models/{model} (OpenAI "Retrieve model"); served names may hold '/' ("org/name").
    if (path.rfind("/v1/models/", 0) == 0) {
      if (!get) throw ApiError(405, "use GET /v1/models/{model}");
      require_served_model(url_decode(path.substr(std::string("/v1/models/").size())));
      return reply_json(sink, "/v1/models/{model}", 200, dump_json(model_json()));
    }
    if (tokenizer_route || path == "/v1/completions" || path == "/v1/chat/completions") {
      if (!post) throw ApiError(405, fmt::format("use POST {}", path));
      if (!ready_)
        throw ApiError(503, "the model is still loading; retry when GET /ready answers 200", "", "",
                       "unavailable");
      if (tokenizer_route) return handle_tokenize(std::move(req), sink, path == "/detokenize");
      if (draining_) throw ApiError(503, "the server is shutting down", "", "", "unavailable");
      return handle_generate(std::move(req), sink, path == "/v1/chat/completions");
    }
    throw ApiError(404, fmt::format("no route {} {}", req.method, path), "", "not_found");
  } catch (const ApiError& e) {
    HttpHeaders headers;
    if (e.status == 429) headers.emplace_back("Retry-After", std::to_string(options_.retry_after_seconds));
    if (e.status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
    reply_json(sink, route_label(path), e.status, dump_json(e.body()), std::move(headers));
  } catch (const std::exception& e) {
    reply_json(sink, route_label(path), 500,
               dump_json(ApiError(500, e.what(), "", "", "internal_error").body()));
  }
}

}  // namespace inferx::server
