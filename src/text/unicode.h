#pragma once
// UTF-8 and Unicode character properties shared by the tokenizer pipeline (normalizers, pre-tokenizers,
// added tokens). Properties come from utf8proc's tables (Unicode 15), the closest packaged match to the
// Rust `char` methods Hugging Face tokenizers calls (is_whitespace, is_alphanumeric, is_numeric, ...).
#include <cstdint>
#include <string>
#include <string_view>

namespace inferx::unicode {

// Length of the well-formed UTF-8 sequence at s[pos] (Unicode 15 table 3-7), 0 when ill-formed.
size_t sequence_length(std::string_view s, size_t pos);
// Decodes the code point at s[pos] (which must be well formed) and advances pos.
char32_t next_code_point(std::string_view s, size_t& pos);
void append_utf8(char32_t cp, std::string& out);

// True when every sequence is well formed.
bool is_valid_utf8(std::string_view s);
// Replaces every ill-formed subsequence by U+FFFD, one per "maximal subpart" (Unicode 15 section 3.9;
// the same as Python's bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy).
std::string to_valid_utf8(std::string_view s);

// Rust char::is_whitespace: the White_Space property.
bool is_whitespace(char32_t c);
// Rust char::is_alphanumeric (Alphabetic or Numeric), approximated by the general categories L* and N*
// (Alphabetic also holds some marks and symbols; they do not occur next to added tokens in practice).
bool is_alphanumeric(char32_t c);
// Rust char::is_numeric: general categories Nd, Nl, No.
bool is_numeric(char32_t c);
// tokenizers' is_punctuation: ASCII punctuation or a Unicode P* category.
bool is_punctuation(char32_t c);

}  // namespace inferx::unicode
