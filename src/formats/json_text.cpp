#include "formats/json_text.h"

#include "core/error.h"

namespace inferx {

namespace {

template <typename Json>
int64_t integer_in(const Json& v, std::string_view what, const std::string& source, int64_t lo, int64_t hi) {
  bool ok = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {  // past INT64_MAX only when unsigned storage was needed
    const uint64_t u = v.template get<uint64_t>();
    ok = hi >= 0 && u <= static_cast<uint64_t>(hi);
    x = ok ? static_cast<int64_t>(u) : 0;
  } else if (v.is_number_integer()) {
    x = v.template get<int64_t>();
    ok = true;
  }
  if (!ok || x < lo || x > hi) {
    std::string shown = v.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    fail("{}: {} must be an integer in [{}, {}], got {}", source, what, lo, hi, shown);
  }
  return x;
}

}  // namespace

int64_t json_integer(const nlohmann::json& v, std::string_view what, const std::string& source, int64_t lo,
                     int64_t hi) {
  return integer_in(v, what, source, lo, hi);
}

int64_t json_integer(const nlohmann::ordered_json& v, std::string_view what, const std::string& source,
                     int64_t lo, int64_t hi) {
  return integer_in(v, what, source, lo, hi);
}

nlohmann::json parse_json_text(std::string_view text, const std::string& source, int max_depth) {
  // nlohmann::json's objects are maps (no linear key search), so its own parser serves, bounded by a callback
  // that sees each object / array start at the depth of its parent (the root's at 0).
  using json = nlohmann::json;
  auto depth_cap = [&](int depth, json::parse_event_t event, json&) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)
      INFERX_CHECK(depth < max_depth, "{}: JSON nested deeper than {} levels", source, max_depth);
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_cap);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source,
                                               int max_depth) {
  try {
    return parse_ordered_json_dom(text, max_depth);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  } catch (const JsonTooDeep& e) {
    fail("{}: {}", source, e.what());
  }
}

}  // namespace inferx
