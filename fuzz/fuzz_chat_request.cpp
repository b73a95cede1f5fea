// libFuzzer target for what a client's chat request reaches: POST /v1/chat/completions bytes through the
// request parser (server/openai/request.h) and then real models' chat templates (text/chat_template.h),
// with the messages and tools the client wrote. The handler answers 400 for ApiError and for inferx::Error
// from the template (generate_handler.cpp, tokenize_chat); anything else escaping - an nlohmann
// type_error from an odd "tool_calls", a std::out_of_range - would be a 500 or worse, so it fails here.
// Templates: $INFERX_TESTDATA_DIR/chat_templates (default ../shared/testdata), a few families with
// different habits (tool calls, system prompts, raise_exception, strftime_now). Seeds:
// fuzz/seeds/chat_request/.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "server/openai/api_error.h"
#include "server/openai/request.h"
#include "text/chat_template.h"

namespace {

volatile uint64_t g_sink = 0;

const std::vector<std::unique_ptr<inferx::ChatTemplate>>& templates() {
  static const std::vector<std::unique_ptr<inferx::ChatTemplate>> all = [] {
    const char* dir = std::getenv("INFERX_TESTDATA_DIR");
    const std::string root = std::string(dir != nullptr ? dir : "../shared/testdata") + "/chat_templates/";
    std::vector<std::unique_ptr<inferx::ChatTemplate>> t;
    for (const char* name :
         {"meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja",
          "Mistral-Small-3.2-24B-Instruct-2506.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
          "google-gemma-2-2b-it.jinja", "openai-gpt-oss-120b.jinja"}) {
      std::ifstream f(root + name);
      if (!f) {
        std::fprintf(stderr, "fuzz_chat_request: cannot read %s%s (set INFERX_TESTDATA_DIR)\n", root.c_str(),
                     name);
        std::abort();
      }
      std::stringstream ss;
      ss << f.rdbuf();
      t.push_back(std::make_unique<inferx::ChatTemplate>(ss.str(), name));
    }
    return t;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& all = templates();
  inferx::server::ParsedRequest r;
  try {
    r = inferx::server::parse_chat_request(
        inferx::server::parse_request_body(std::string(reinterpret_cast<const char*>(data), size)));
  } catch (const inferx::server::ApiError&) {
    return 0;
  }
  inferx::ChatTemplateInputs in;
  in.messages = r.messages;
  if (r.tools.is_array()) in.tools = r.tools;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now_unix = 1764892800;  // a fixed clock: reproducible runs
  for (const auto& t : all) {
    try {
      g_sink = g_sink + t->render(in).size();
    } catch (const inferx::Error&) {  // the handler's 400 "the chat template failed on these messages"
    }
  }
  return 0;
}
