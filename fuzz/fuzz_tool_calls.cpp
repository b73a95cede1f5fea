// libFuzzer target for the tool-call parsers (server/openai/tool_calls.h): they read whatever a model
// generates. The first byte picks the format and the delta size of the streamed pass; the rest is the reply.
// Invariants: no exception escapes; a call always has a name and a call id (its arguments are passed through
// as the model wrote them: an object's dump, or its string); streaming the reply in
// pieces gives the same calls as parsing it whole, and loses no text when there are none.
// Seeds: fuzz/seeds/tool_calls/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/openai/tool_calls.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace inferx::server;
  if (size < 1) return 0;
  const ToolCallFormat format = static_cast<ToolCallFormat>(1 + data[0] % 3);
  const size_t cut = 1 + (data[0] >> 2);
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const ParsedReply whole = parse_tool_calls(format, text);
  for (const ToolCall& c : whole.calls) require(!c.name.empty() && c.id.rfind("call_", 0) == 0);
  if (whole.calls.empty()) require(whole.content == text);

  ToolCallStream stream(format);
  std::string streamed;
  for (size_t at = 0; at < text.size(); at += cut) streamed += stream.feed(text.substr(at, cut));
  const ParsedReply end = stream.finish();
  require(end.calls.size() <= whole.calls.size());
  if (end.calls.empty()) require(streamed + end.content == text);
  for (size_t i = 0; i < end.calls.size(); ++i) require(end.calls[i].name == whole.calls[i].name);
  return 0;
}
