#pragma once
// Request bodies parsed into nlohmann::ordered_json (key order kept: chat templates print tool schemas as the
// client sent them) without nlohmann's own ordered_json parser, which costs a linear search per key (an
// object of 200k keys outlasted a 30 s client timeout; 16k keys took 0.23 s, growing with the square) and
// recurses without bound when the DOM is walked later (a body nested 100k levels deep crashed the server in
// the chat template's JSON conversion). Here keys are indexed while an object is built (a repeated key
// replaces the earlier value, as nlohmann's parser does), and nesting deeper than `max_depth` is refused.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace inferx::server {

// Throws nlohmann::json::exception for what nlohmann's parser refuses (syntax, UTF-8, numbers past double's
// range) and JsonTooDeep for nesting past max_depth.
nlohmann::ordered_json parse_json_body(std::string_view text, int max_depth);

struct JsonTooDeep : std::runtime_error {
  explicit JsonTooDeep(int max)
      : std::runtime_error("JSON nested deeper than " + std::to_string(max) + " levels"), max_depth(max) {}
  int max_depth;
};

}  // namespace inferx::server
