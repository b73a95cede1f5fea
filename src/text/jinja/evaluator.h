#pragma once
// Renders a parsed template. Scoping follows jinja2: {% if %} shares its enclosing scope, every
// iteration of a {% for %} gets a fresh scope over the enclosing one (so `set` inside a loop never leaks
// out, use namespace() for that), macros run in their own scope over the template's top level, looked
// up at call time.
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace inferx::jinja {

// Bounds that keep hostile templates from hanging or exhausting memory. Exceeding one is an error.
struct Limits {
  size_t max_output = size_t{64} << 20;  // bytes of rendered text (also caps any one string value)
  uint64_t max_steps = 5'000'000;        // statements + expressions + loop iterations
  int max_call_depth = 256;              // nested macro calls
  size_t max_items = size_t{1} << 22;    // elements of one list built by the template
  // Bytes of string values built in one render (StringBudget): bounds what loops of big-string operations
  // can allocate within max_steps.
  uint64_t max_string_built = uint64_t{1} << 30;
  // Wall-clock bound of one render, checked every 1024 steps: a step may scan a 64 MB string (length,
  // `in`, comparisons), so the step count alone does not bound the time. Real templates take milliseconds.
  double max_seconds = 10.0;
};

struct RenderOptions {
  Limits limits;
  int64_t now_unix = -1;  // strftime_now() clock: seconds since the epoch (rendered as UTC); -1: system
                          // clock in local time, as transformers' datetime.now()
};

class Evaluator {
 public:
  Evaluator(const Node& root, std::string name, RenderOptions options);
  // Renders with the given top-level variables (plus the builtin globals) and returns the text.
  // Throws inferx::Error "NAME:LINE:COL: message" on runtime errors and raise_exception().
  std::string render(const std::vector<std::pair<std::string, Value>>& variables);

  // Used by filters and builtins.
  Value call(const Value& callee, CallArgs& args);
  void step(uint64_t n = 1);
  const RenderOptions& options() const { return options_; }
  void check_size(size_t bytes) const;

 private:
  // A frame's variables in the order they were set. Frames are small (a loop's `loop`, a macro's arguments),
  // so names are searched linearly, until a frame holds kIndexFrom of them (a root scope given thousands of
  // variables by a caller, e.g. `inferx chat-template --extra`): then through `index` as well, so that
  // setting n variables is not quadratic. Add variables with set() only.
  struct Scope {
    static constexpr size_t kIndexFrom = 32;
    std::vector<std::pair<std::string, Value>> vars;
    Scope* parent = nullptr;
    std::unordered_map<std::string, size_t> index = {};  // name -> position in vars (empty below kIndexFrom)
    const Value* find(const std::string& name) const;
    void set(const std::string& name, Value v);
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const std::vector<NodePtr>& body, Scope& scope);
  Flow exec(const Node& n, Scope& scope);
  void exec_for(const Node& n, Scope& scope);
  void assign(const Node& target, const Value& v, Scope& scope);
  std::string capture(const std::vector<NodePtr>& body, Scope& scope);
  Value eval(const Node& n, Scope& scope);
  Value eval_inner(const Node& n, Scope& scope);
  Value eval_call(const Node& n, Scope& scope);
  Value eval_compare(const Node& n, Scope& scope);
  Value eval_subscript(const Node& n, Scope& scope);
  Value apply_filter_node(const Node& f, Value input, Scope& scope);
  CallArgs eval_args(const Node& n, size_t first, Scope& scope);
  Value make_macro(const Node& n, Scope& scope, const std::string& name);
  void emit(std::string_view s);
  [[noreturn]] void located_fail(const Node& n, const std::string& msg) const;

  const Node& root_;
  std::string name_;
  RenderOptions options_;
  std::string* out_ = nullptr;
  Scope* globals_ = nullptr;
  uint64_t steps_ = 0;
  std::chrono::steady_clock::time_point started_;
  int call_depth_ = 0;
};

// A syntax error inside an already located message is not wrapped twice.
class LocatedError : public Error {
 public:
  using Error::Error;
};

}  // namespace inferx::jinja
