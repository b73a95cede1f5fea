#pragma once
// Tokenizer for Jinja2 template source, with the whitespace rules of jinja2's lexer (jinja2/lexer.py,
// documented under "Whitespace Control" in the Jinja template designer docs) as transformers configures
// it: trim_blocks (drop the first newline after a block or comment tag), lstrip_blocks (drop spaces and
// tabs before a block or comment tag that starts a line), `-`/`+` markers, newlines normalized to "\n"
// and one trailing newline removed (keep_trailing_newline=False).
#include <cstdint>
#include <string>
#include <vector>

namespace inferx::jinja {

enum class Tok : uint8_t {
  Data,        // template text to output verbatim
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,  // value already unescaped
  Integer,
  Float,
  Op,  // operator or punctuation; text holds it
  Eof,
};

struct Token {
  Tok type;
  std::string text;
  int line = 1, col = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws inferx::Error "NAME:LINE:COL: message" on unterminated tags, strings, comments or raw blocks.
std::vector<Token> tokenize(const std::string& source, const std::string& name, const LexOptions& opt = {});

}  // namespace inferx::jinja
