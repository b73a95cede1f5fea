#pragma once
// The OpenAI-compatible API on top of HttpServer and an Engine: routing, auth, admission (queue limit,
// drain), and the completions / chat completions flow (parse -> tokenize -> submit -> stream back).
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/{model}], GET /health (process
// alive), GET /ready (model loaded and not draining), GET /metrics (Prometheus text), GET /version, and
// vLLM's POST /tokenize and /detokenize (tokenize_handler.cpp).
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>

#include "inferx/engine.h"
#include "server/http_server.h"
#include "server/openai/tool_calls.h"
#include "server/server_metrics.h"

namespace inferx {
class ChatTemplate;
class Tokenizer;
class TokenTrie;
}  // namespace inferx

namespace inferx::server {

struct ApiServerOptions {
  std::string served_model_name;  // the "model" clients must send (404 otherwise)
  std::string model_version;      // label of inferx_inference_latency_seconds
  std::string api_key;            // empty: no auth
  int64_t max_queue = 0;          // requests admitted but not yet generating; 0: unlimited. Over: 429
  int retry_after_seconds = 1;
  // --tool-call-parser: chat replies to requests with tools are parsed into tool_calls in this format.
  ToolCallFormat tool_call_format = ToolCallFormat::None;
};

// What the server needs of a loaded model (set once it is ready).
struct ServedModel {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;         // null: prompts must be token ids; text is "id id ..."
  const ChatTemplate* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  bool add_bos = true;
  int64_t vocab_size = 0;
};

class ApiServer {
 public:
  explicit ApiServer(ApiServerOptions options);
  ~ApiServer();

  // The HttpHandler.
  void handle(HttpRequest&& request, std::shared_ptr<ResponseSink> sink);

  // Makes the model available (until then /ready and /v1/* answer 503).
  void set_model(const ServedModel& model);
  // Refuses new generation requests (503) and reports not ready; in-flight ones continue.
  void start_draining() { draining_ = true; }
  // Generation requests admitted and not yet finished.
  int64_t live_requests() const { return live_.load(); }
  ServerMetrics& metrics() { return metrics_; }
  // Aborts every live generation request (drain timeout): each gets a final output with reason abort.
  void abort_all();

 private:
  struct Live;
  struct Response;
  void handle_generate(HttpRequest&& request, std::shared_ptr<ResponseSink> sink, bool chat);
  void handle_models(const std::shared_ptr<ResponseSink>& sink);
  nlohmann::json model_json() const;
  // ApiError 404 model_not_found unless `name` is the served model's name.
  void require_served_model(
      const std::string& name) const;  // the model object of GET /v1/models and /v1/models/{model}
  void reply_json(const std::shared_ptr<ResponseSink>& sink, const std::string& route, int status,
                  const std::string& body, HttpHeaders headers = {});
  void handle_tokenize(HttpRequest&& request, const std::shared_ptr<ResponseSink>& sink, bool detokenize);
  std::vector<int32_t> tokenize_chat(const struct ParsedRequest& r, bool add_generation_prompt = true) const;
  // The tokenizer's vocabulary as a byte trie for structured output, built on first use and kept, and JSON
  // mode's constraint over it: one prototype for every request, so they share its cache of masks.
  std::shared_ptr<const TokenTrie> token_trie();
  std::shared_ptr<const TokenConstraint> json_mode();
  std::shared_ptr<const TokenConstraint> forced_tool_call(const struct ParsedRequest& r);

  ApiServerOptions options_;
  ServerMetrics metrics_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  ServedModel model_;
  std::atomic<int64_t> live_{0};
  std::mutex ids_mu_;
  std::unordered_set<std::string> live_ids_;
  std::atomic<int64_t> queued_{0};  // admitted, no output yet (the --max-queue count)
  std::mutex trie_mu_;
  std::shared_ptr<const TokenTrie> trie_;
  std::shared_ptr<const TokenConstraint> json_mode_;
  int64_t created_ = 0;
};

}  // namespace inferx::server
