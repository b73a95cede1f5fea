#pragma once
// Request bodies are parsed by formats/json_text.h's parse_ordered_json_dom (linear in the keys, nesting
// bounded): a 200k-key logit_bias outlasted a 30 s client timeout with nlohmann's ordered_json parser, and a
// body nested 100k levels deep crashed the server in the chat template's JSON conversion.
#include <string_view>

#include "formats/json_text.h"

namespace inferx::server {

using inferx::JsonTooDeep;

inline nlohmann::ordered_json parse_json_body(std::string_view text, int max_depth) {
  return parse_ordered_json_dom(text, max_depth);
}

}  // namespace inferx::server
