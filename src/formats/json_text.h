// JSON model files (config.json, tokenizer.json, tokenizer_config.json, a checkpoint's quantization
// metadata) parsed with a bound on nesting. nlohmann's parser does not recurse, but copying a value and our
// readers' walks do: a tokenizer.json whose normalizer was a Sequence nested 100k levels deep crashed the
// loader (stack overflow). Real files nest under ten levels.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace inferx {

inline constexpr int kMaxModelJsonDepth = 64;

// Throws inferx::Error "SOURCE: not valid JSON: ..." or "SOURCE: JSON nested deeper than N levels".
nlohmann::json parse_json_text(std::string_view text, const std::string& source,
                               int max_depth = kMaxModelJsonDepth);
nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source,
                                               int max_depth = kMaxModelJsonDepth);

// An integer field: a JSON integer in [lo, hi], else "SOURCE: WHAT must be an integer in [lo, hi], got V".
// nlohmann's get<int>() converts a float with a cast, undefined behaviour past the type's range (found by
// fuzz_hf_tokenizer_json: 9.6e115 as a Strip decoder's count), and narrows wider integers silently.
int64_t json_integer(const nlohmann::json& v, std::string_view what, const std::string& source, int64_t lo,
                     int64_t hi);
int64_t json_integer(const nlohmann::ordered_json& v, std::string_view what, const std::string& source,
                     int64_t lo, int64_t hi);

}  // namespace inferx
