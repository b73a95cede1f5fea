// libFuzzer target: parse and render arbitrary template text against a fixed conversation (system, user,
// assistant with a tool call, tool result; tools; bos/eos). Any input must either render or throw
// inferx::Error: no crash, no other exception, and no hang or memory blow-up (the engine's step, output,
// string-size, bytes-built, time, recursion and nesting limits bound every template: jinja::Limits). Seeds:
// fuzz/seeds/jinja/ (small templates of our own); the real model templates in
// $INFERX_TESTDATA_DIR/chat_templates make good extra seeds:
//   build/jinja-fuzz/fuzz/fuzz_jinja -max_total_time=60 fuzz/seeds/jinja ../shared/testdata/chat_templates
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "text/chat_template.h"

namespace {

const inferx::ChatTemplateInputs& inputs() {
  static const inferx::ChatTemplateInputs in = [] {
    inferx::ChatTemplateInputs i;
    i.messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Paris? \u00e9\u65e5 \ud83d\ude80"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "x": [1.5, null, true]}}}]},
      {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21}"},
      {"role": "assistant", "content": "<think>hm</think>Sunny."}
    ])");
    i.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": ["integer", "null"]}}, "required": ["city"]}}}])");
    i.bos_token = "<s>";
    i.eos_token = "</s>";
    i.add_generation_prompt = true;
    i.now_unix = 1721952000;
    i.extra = {{"enable_thinking", false}};
    return i;
  }();
  return in;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    inferx::ChatTemplate tmpl(source, "fuzz");
    std::string out = tmpl.render(inputs());
    if (out.size() > (size_t{64} << 20)) std::abort();  // the output limit must hold
  } catch (const inferx::Error&) {
    // rejected cleanly
  }
  return 0;
}
