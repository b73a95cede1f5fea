#include "server/openai/tool_calls.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <random>

namespace inferx::server {

using nlohmann::json;

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:012x}{:012x}", rng() & 0xffffffffffffULL, rng() & 0xffffffffffffULL);
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// One call object: {"name": string, "arguments" | "parameters": object or string}. Nothing on mismatch.
std::optional<ToolCall> call_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall c{call_id(), name->get<std::string>(), "{}"};
  if (args != j.end()) {
    if (args->is_string())
      c.arguments = args->get<std::string>();
    else if (args->is_object())
      c.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    else
      return std::nullopt;
  }
  return c;
}

std::optional<json> parse_json(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

ParsedReply plain(const std::string& text) { return {text, {}}; }

ParsedReply parse_hermes(const std::string& text) {
  ParsedReply out;
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kHermesOpen, at);
    if (open == std::string::npos) {
      out.content += text.substr(at);
      break;
    }
    out.content += text.substr(at, open - at);
    const size_t body = open + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    // An unclosed last call (the reply hit max_tokens or a stop string inside it) still parses if its JSON
    // is complete, a cut-off closing tag ("...}\n</tool_") left out.
    std::string_view body_text =
        std::string_view(text).substr(body, close == std::string::npos ? close : close - body);
    if (close == std::string::npos) {
      const size_t lt = body_text.rfind('<');
      if (lt != std::string_view::npos &&
          kHermesClose.substr(0, body_text.size() - lt) == body_text.substr(lt))
        body_text = body_text.substr(0, lt);
    }
    const std::optional<json> j = parse_json(body_text);
    std::optional<ToolCall> call = j ? call_from_json(*j) : std::nullopt;
    if (!call) return plain(text);
    out.calls.push_back(std::move(*call));
    if (close == std::string::npos) break;
    at = close + kHermesClose.size();
  }
  if (out.calls.empty()) return plain(text);
  out.content = trim(out.content);
  return out;
}

ParsedReply parse_llama3_json(const std::string& text) {
  std::string body = trim(text);
  if (body.rfind(kPythonTag, 0) == 0) body = trim(std::string_view(body).substr(kPythonTag.size()));
  if (body.empty() || body.front() != '{') return plain(text);
  ParsedReply out;
  // Calls separated by ';' (Llama 3.1's multiple JSON calls); a ';' inside a string does not split because
  // each candidate is only accepted when the JSON parses.
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i < body.size() && body[i] != ';') continue;
    const std::string part = trim(std::string_view(body).substr(start, i - start));
    if (part.empty()) {
      start = i + 1;
      continue;
    }
    const std::optional<json> j = parse_json(part);
    if (!j) {
      if (i == body.size()) return plain(text);
      continue;  // the ';' was inside the JSON: extend the candidate
    }
    std::optional<ToolCall> call = call_from_json(*j);
    if (!call) return plain(text);
    out.calls.push_back(std::move(*call));
    start = i + 1;
  }
  if (out.calls.empty()) return plain(text);
  return out;
}

ParsedReply parse_mistral(const std::string& text) {
  const size_t marker = text.find(kMistralMarker);
  if (marker == std::string::npos) return plain(text);
  const std::optional<json> j =
      parse_json(trim(std::string_view(text).substr(marker + kMistralMarker.size())));
  if (!j) return plain(text);
  ParsedReply out;
  const json calls = j->is_array() ? *j : json::array({*j});
  for (const json& c : calls) {
    std::optional<ToolCall> call = call_from_json(c);
    if (!call) return plain(text);
    out.calls.push_back(std::move(*call));
  }
  if (out.calls.empty()) return plain(text);
  out.content = trim(std::string_view(text).substr(0, marker));
  return out;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker` (what may still become
// the marker once more text arrives).
size_t partial_marker(const std::string& text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (std::string_view(text).substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::Hermes;
  if (name == "llama3_json") return ToolCallFormat::Llama3Json;
  if (name == "mistral") return ToolCallFormat::Mistral;
  return std::nullopt;
}

const char* tool_call_format_names() { return "hermes, llama3_json, mistral"; }

ParsedReply parse_tool_calls(ToolCallFormat format, const std::string& text) {
  switch (format) {
    case ToolCallFormat::Hermes:
      return parse_hermes(text);
    case ToolCallFormat::Llama3Json:
      return parse_llama3_json(text);
    case ToolCallFormat::Mistral:
      return parse_mistral(text);
    case ToolCallFormat::None:
      break;
  }
  return plain(text);
}

std::string ToolCallStream::feed(const std::string& delta) {
  if (format_ == ToolCallFormat::None) return delta;
  held_ += delta;
  if (in_call_) return {};
  if (format_ == ToolCallFormat::Llama3Json) {
    // The reply is a call only if it starts with '{' or the python tag: decide at its first non-space.
    if (!decided_) {
      const size_t b = held_.find_first_not_of(" \t\r\n");
      if (b == std::string::npos) return {};
      const std::string_view t = std::string_view(held_).substr(b);
      if (t.front() == '{' || t.rfind(kPythonTag, 0) == 0) {
        in_call_ = true;
        return {};
      }
      if (t.size() < kPythonTag.size() && kPythonTag.rfind(t, 0) == 0) return {};  // may become the tag
      decided_ = true;
    }
    std::string out;
    out.swap(held_);
    return out;
  }
  const std::string_view marker = format_ == ToolCallFormat::Hermes ? kHermesOpen : kMistralMarker;
  const size_t found = held_.find(marker);
  std::string out;
  if (found != std::string::npos) {
    out = held_.substr(0, found);
    held_.erase(0, found);
    in_call_ = true;
    return out;
  }
  const size_t keep = partial_marker(held_, marker);
  out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ParsedReply ToolCallStream::finish() {
  std::string rest;
  rest.swap(held_);
  if (!in_call_) return plain(rest);
  return parse_tool_calls(format_, rest);
}

}  // namespace inferx::server
