#include "formats/json_text.h"

#include "core/error.h"

namespace inferx {

namespace {

template <typename Json>
Json parse_bounded(std::string_view text, const std::string& source, int max_depth) {
  // The callback sees each object / array start at the depth of its parent (the root's at 0).
  auto depth_cap = [&](int depth, typename Json::parse_event_t event, Json&) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start)
      INFERX_CHECK(depth < max_depth, "{}: JSON nested deeper than {} levels", source, max_depth);
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), depth_cap);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
}

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& source, int max_depth) {
  return parse_bounded<nlohmann::json>(text, source, max_depth);
}

nlohmann::ordered_json parse_ordered_json_text(std::string_view text, const std::string& source,
                                               int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, source, max_depth);
}

}  // namespace inferx
