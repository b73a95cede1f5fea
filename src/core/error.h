#pragma once
// One error style for the whole project: modules throw inferx::Error with a message a user can act on
// (name the file, the field, the value and what was expected). Callers at the edges (CLI, HTTP) catch it.
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace inferx {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace inferx

// INFERX_CHECK(cond, "format {}", args...): throws inferx::Error when cond is false.
#define INFERX_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::inferx::fail(__VA_ARGS__); \
  } while (0)
