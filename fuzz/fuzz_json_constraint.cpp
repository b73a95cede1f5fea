// libFuzzer target for JSON mode's byte automaton (text/json_constraint.h: JsonCursor), which decides
// every token a constrained reply may hold. Soundness: bytes it accepts to the end of a complete object
// parse as a JSON object with nlohmann's parser (for well-formed UTF-8 and no UTF-16 surrogate escape:
// RFC 8259's grammar allows a lone one, nlohmann refuses it) and numbers within double's range. Seeds:
// fuzz/seeds/json_constraint/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_utf8.h"
#include "text/json_constraint.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  inferx::JsonCursor cursor;
  size_t accepted = 0;
  for (unsigned char c : text) {
    if (!cursor.step(c)) break;
    ++accepted;
  }
  if (accepted == text.size() && cursor.complete() && fuzz::json_text_is_unicode(text)) {
    try {
      require(nlohmann::json::parse(text).is_object());
    } catch (const nlohmann::json::out_of_range&) {
      // A number past double's range ("1e999"): JSON's grammar has no bound, nlohmann's doubles do.
    } catch (const nlohmann::json::exception&) {
      require(false);
    }
  }
  return 0;
}
