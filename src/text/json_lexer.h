#pragma once
// The byte-level pieces of JSON that both structured-output automata share (JsonCursor in json_constraint
// and the schema automaton in json_schema_constraint): whitespace between tokens, a string's body, a
// number. Each is a small state byte stepped one input byte at a time.
#include <cstdint>

namespace inferx::json_lexer {

inline constexpr int kMaxIndent = 20;

inline bool is_space(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
inline bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Whitespace between JSON tokens as llama.cpp's JSON grammar allows it: nothing, one space (or tab), or a
// newline and up to kMaxIndent spaces or tabs - enough for pretty-printed JSON, and a model cannot run on in
// blank lines. `run`: 0 none yet, 1 after a space, 2 + n after a newline and n indentation bytes; reset it
// to 0 at the next token. False: `c` may not come here.
inline bool step_space(uint8_t& run, uint8_t c) {
  if (run == 0) {
    run = c == '\n' ? 2 : 1;
    return c == ' ' || c == '\t' || c == '\n';
  }
  if (run == 1 || c == '\n' || c == '\r' || run >= 2 + kMaxIndent) return false;
  ++run;
  return true;
}

// A string's body after its opening quote. `state`: 0 plain, 1 after '\', 2..5 the \u escape's hex digits
// still to come + 1. Any byte but '"', '\' and control characters is content (tokens may split UTF-8).
enum class StringStep : uint8_t { More, Closed, Invalid };
inline StringStep step_string(uint8_t& state, uint8_t c) {
  if (state == 0) {
    if (c == '"') return StringStep::Closed;
    if (c == '\\') state = 1;
    return c < 0x20 ? StringStep::Invalid : StringStep::More;
  }
  if (state == 1) {
    if (c == 'u') {
      state = 5;
      return StringStep::More;
    }
    state = 0;
    const bool simple =
        c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    return simple ? StringStep::More : StringStep::Invalid;
  }
  if (!is_hex(c)) return StringStep::Invalid;
  state = state == 2 ? 0 : state - 1;
  return StringStep::More;
}

// A number, from its first byte (start_number) on. Ended: `c` is not part of it and the number is complete,
// so `c` belongs to what follows. `integer`: no fraction or exponent.
enum NumberState : uint8_t { Minus = 1, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits };
enum class NumberStep : uint8_t { More, Ended, Invalid };
inline bool number_complete(uint8_t state) {
  return state == Zero || state == Int || state == Frac || state == ExpDigits;
}
inline bool start_number(uint8_t& state, uint8_t c) {
  if (c == '-')
    state = Minus;
  else if (c == '0')
    state = Zero;
  else if (is_digit(c))
    state = Int;
  else
    return false;
  return true;
}
inline NumberStep step_number(uint8_t& state, uint8_t c, bool integer = false) {
  auto to = [&](uint8_t s) {
    state = s;
    return NumberStep::More;
  };
  switch (state) {
    case Minus:
      return c == '0' ? to(Zero) : is_digit(c) ? to(Int) : NumberStep::Invalid;
    case Zero:
    case Int:
      if (state == Int && is_digit(c)) return NumberStep::More;
      if (!integer && c == '.') return to(Dot);
      if (!integer && (c == 'e' || c == 'E')) return to(Exp);
      break;
    case Dot:
      return is_digit(c) ? to(Frac) : NumberStep::Invalid;
    case Frac:
      if (is_digit(c)) return NumberStep::More;
      if (c == 'e' || c == 'E') return to(Exp);
      break;
    case Exp:
      return (c == '+' || c == '-') ? to(ExpSign) : is_digit(c) ? to(ExpDigits) : NumberStep::Invalid;
    case ExpSign:
      return is_digit(c) ? to(ExpDigits) : NumberStep::Invalid;
    case ExpDigits:
      if (is_digit(c)) return NumberStep::More;
      break;
    default:
      return NumberStep::Invalid;
  }
  return number_complete(state) ? NumberStep::Ended : NumberStep::Invalid;
}

}  // namespace inferx::json_lexer
