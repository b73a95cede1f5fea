// JSON model files (config.json, tokenizer.json, tokenizer_config.json, a checkpoint's quantization
// metadata) parsed with a bound on nesting. nlohmann's parser does not recurse, but copying a value and our
// readers' walks do: a tokenizer.json whose normalizer was a Sequence nested 100k levels deep crashed the
// loader (stack overflow). Real files nest under ten levels.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace inferx {

inline constexpr int kMaxModelJsonDepth = 64;

// Nesting past a parse's bound.
struct JsonTooDeep : std::runtime_error {
  explicit JsonTooDeep(int max)
      : std::runtime_error("JSON nested deeper than " + std::to_string(max) + " levels"), max_depth(max) {}
  int max_depth;
};

// An ordered_json DOM (key order kept: chat templates print tool schemas as written) built by our own SAX
// handler, not nlohmann's ordered_json parser, which searches an object's keys linearly per insert (an object
// of 200k keys outlasted a 30 s client timeout; 16k keys took 0.23 s, growing with the square). Keys are
// indexed while an object is built (a repeated key keeps its first place and its last value, as nlohmann's
// parser does). Throws nlohmann::json::exception for what nlohmann refuses (syntax, UTF-8, numbers past
// double's range) and JsonTooDeep past max_depth: for callers that map those themselves (the server's 400s).
nlohmann::ordered_json parse_ordered_json_dom(std::string_view text, int max_depth);

// Throws inferx::Error "SOURCE: not valid JSON: ..." or "SOURCE: JSON nested deeper than N levels". The
// ordered form is parse_ordered_json_dom's.
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
