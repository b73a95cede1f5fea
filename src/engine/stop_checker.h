#pragma once
// Stop strings matched on the detokenized text across token boundaries (OpenAI `stop`). Text is only
// released once it can no longer be part of a stop string: a tail that is a prefix of some stop string
// is held back until the next token decides it (vLLM's output processor holds stop_buffer_length chars
// for the same reason). Text from a matched stop string on is never released.
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

class StopChecker {
 public:
  StopChecker() = default;
  explicit StopChecker(std::vector<std::string> stops);

  // Appends newly decoded text and returns what may be streamed now. After a match, returns the text
  // before the stop string and matched() is true; later calls return nothing.
  std::string push(std::string_view text);
  // The sequence ended for another reason: the held-back tail is ordinary text after all.
  std::string flush();
  bool matched() const { return matched_ >= 0; }
  const std::string& matched_stop() const;

 private:
  std::vector<std::string> stops_;
  std::string held_;
  int matched_ = -1;
};

}  // namespace inferx
