// inferx serve: the OpenAI-compatible HTTP server (server/) over the scheduling engine (engine/).
//
// Start-up order: block SIGINT/SIGTERM in every thread (the main thread takes them with sigwait), listen
// (so /health answers while the model loads), load model + tokenizer + chat template, start the engine,
// report ready. On SIGTERM/SIGINT: drain (stop accepting, let in-flight requests finish up to
// --drain-timeout, abort the rest), then exit 0. A second signal while draining skips the wait.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "backend/backend.h"
#include "cli/backend_choice.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "core/error.h"
#include "core/text_file.h"
#include "inferx/engine.h"
#include "model/model.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "text/chat_template.h"
#include "text/tokenizer_loader.h"

namespace inferx::cli {

namespace {

struct ServeArgs {
  EngineArgs engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int64_t max_queue = 1024;
  double drain_timeout = 30.0;
  std::string served_model_name;
  std::string chat_template;
  std::string tool_call_parser;
  bool enable_auto_tool_choice = false;
  int io_threads = 2;
};

std::string read_file(const std::string& path) { return read_text_file(path, "the --chat-template file"); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void run_serve(ServeArgs a) {
  // Signals go to sigwait() below only: block them before any thread (I/O, engine, kernel pool) starts,
  // since threads inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  check_quantize(a.engine.quantize);
  (void)engine_config(a.engine);  // flag errors before anything listens (the device's default comes later)
  if (a.engine.model.empty()) a.engine.model = default_model();
  if (a.served_model_name.empty()) a.served_model_name = default_served_name(a.engine.model);
  if (a.api_key.empty())
    if (const char* k = std::getenv("INFERX_API_KEY")) a.api_key = k;

  server::ApiServerOptions api_opts;
  api_opts.served_model_name = a.served_model_name;
  api_opts.model_version = a.served_model_name;
  api_opts.api_key = a.api_key;
  api_opts.max_queue = a.max_queue;
  if (!a.tool_call_parser.empty()) {
    const auto format = server::tool_call_format_from_name(a.tool_call_parser);
    if (!format)
      fail("--tool-call-parser '{}' is not one of {}", a.tool_call_parser, server::tool_call_format_names());
    api_opts.tool_call_format = *format;
  } else if (a.enable_auto_tool_choice) {
    fail("--enable-auto-tool-choice needs --tool-call-parser ({})", server::tool_call_format_names());
  }
  server::ApiServer api(api_opts);

  server::HttpServerOptions http_opts;
  http_opts.host = a.host;
  http_opts.port = a.port;
  http_opts.io_threads = a.io_threads;
  server::HttpServer http(http_opts,
                          [&api](server::HttpRequest&& r, std::shared_ptr<server::ResponseSink> s) {
                            api.handle(std::move(r), std::move(s));
                          });
  http.listen();
  http.start();
  std::fprintf(stderr, "inferx serve: listening on http://%s:%d (loading %s)\n", a.host.c_str(), http.port(),
               a.engine.model.c_str());

  const auto t_load = std::chrono::steady_clock::now();
  LoadedEngine loaded = load_engine(a.engine);
  std::unique_ptr<ChatTemplate> tmpl;
  if (!a.chat_template.empty()) {
    tmpl = std::make_unique<ChatTemplate>(read_file(a.chat_template), a.chat_template);
  } else if (loaded.text.chat_template) {
    try {
      tmpl = std::make_unique<ChatTemplate>(*loaded.text.chat_template, a.engine.model + " chat template");
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "inferx serve: warning: the model's chat template does not parse (%s); "
                   "/v1/chat/completions is off unless --chat-template is given\n",
                   e.what());
    }
  }
  server::ServedModel served;
  served.engine = loaded.engine.get();
  served.tokenizer = loaded.text.tokenizer.get();
  served.chat_template = tmpl.get();
  served.add_bos = loaded.text.add_bos;
  served.vocab_size = loaded.model->config().vocab_size;
  loaded.engine->start();
  api.set_model(served);
  std::fprintf(stderr,
               "inferx serve: ready in %.1f s: model '%s' (%s) on %s, max_model_len %d, %s, chat %s\n"
               "  try: curl http://%s:%d/v1/completions -H 'Content-Type: application/json' "
               "-d '{\"model\": \"%s\", \"prompt\": \"Once upon a time\", \"max_tokens\": 32}'\n",
               seconds_since(t_load), a.served_model_name.c_str(), loaded.model->description().c_str(),
               loaded.backend->name().c_str(), loaded.engine->max_model_len(),
               served.tokenizer ? "tokenizer loaded" : "no tokenizer (token-id prompts only)",
               tmpl ? "on" : "off (no chat template)", a.host.c_str(), http.port(),
               a.served_model_name.c_str());

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "inferx serve: %s: draining (up to %.0f s for %lld in-flight requests)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", a.drain_timeout,
               static_cast<long long>(api.live_requests()));
  api.start_draining();
  http.stop_accepting();
  const auto t_drain = std::chrono::steady_clock::now();
  bool forced = false;
  auto busy = [&] { return api.live_requests() > 0 || http.requests_in_flight() > 0; };
  while (busy() && seconds_since(t_drain) < a.drain_timeout) {
    timespec tick{0, 20 * 1000 * 1000};
    if (sigtimedwait(&signals, nullptr, &tick) > 0) {  // a second signal: stop waiting
      forced = true;
      break;
    }
  }
  if (busy()) {
    std::fprintf(stderr, "inferx serve: %s: aborting %lld requests\n",
                 forced ? "second signal" : "drain timeout", static_cast<long long>(api.live_requests()));
    api.abort_all();
    const auto t_abort = std::chrono::steady_clock::now();
    while (busy() && seconds_since(t_abort) < 2.0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http.stop();
  loaded.engine->stop();
  std::fprintf(stderr, "inferx serve: stopped after draining for %.2f s\n", seconds_since(t_drain));
}

}  // namespace

void register_serve(CLI::App& app, std::vector<std::pair<CLI::App*, Action>>& out) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_engine_options(*sub, args->engine);
  sub->add_option("--host", args->host, "Address to listen on (0.0.0.0: every interface)");
  sub->add_option("--port", args->port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535));
  sub->add_option("--api-key", args->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* (or env INFERX_API_KEY)");
  sub->add_option("--max-queue", args->max_queue,
                  "Requests admitted but not yet generating before 429 (0: no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--drain-timeout", args->drain_timeout, "Seconds SIGTERM waits for in-flight requests")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--served-model-name", args->served_model_name,
                  "The model name clients send (default: the model file's name without extension)");
  sub->add_option("--chat-template", args->chat_template, "Jinja chat template file (overrides the model's)");
  sub->add_option("--tool-call-parser", args->tool_call_parser,
                  "Parse chat replies to requests with tools into tool_calls: hermes (Qwen2.5/3, Hermes), "
                  "llama3_json (Llama 3.1+), mistral");
  sub->add_flag("--enable-auto-tool-choice", args->enable_auto_tool_choice,
                "Accepted for vLLM compatibility (tool calls are parsed whenever --tool-call-parser is set)");
  sub->add_option("--io-threads", args->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  out.emplace_back(sub, [args] { run_serve(*args); });
}

}  // namespace inferx::cli
