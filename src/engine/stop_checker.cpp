#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

namespace inferx {

StopChecker::StopChecker(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });  // "" would match everywhere
}

std::string StopChecker::push(std::string_view text) {
  if (matched()) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest occurrence wins (on a tie the longer stop string, so the reported reason is complete).
  // held_ never contains a whole stop string before this call, so searching it all finds every match
  // that the new text completes.
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = held_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    if (best == std::string::npos || pos < best ||
        (pos == best && stops_[i].size() > stops_[static_cast<size_t>(matched_)].size())) {
      best = pos;
      matched_ = static_cast<int>(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of some stop string. Text and stop strings are both
  // valid UTF-8, so such a tail always starts on a character boundary.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopChecker::flush() {
  if (matched()) return {};
  return std::exchange(held_, {});
}

const std::string& StopChecker::matched_stop() const {
  static const std::string kNone;
  return matched() ? stops_[static_cast<size_t>(matched_)] : kNone;
}

}  // namespace inferx
