// Decoders (see decoder.h); each step follows the decode_chain of the same-named tokenizers decoder.
#include "text/decoder.h"

#include "core/error.h"
#include "formats/json_text.h"
#include "text/pre_tokenizer.h"
#include "text/unicode.h"

namespace inferx {
namespace {

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

// "<0x0A>" -> 0x0A, else -1 (tokenizers' ByteFallback: length 6, "<0x" prefix, ">" suffix, hex).
int byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    v *= 16;
    if (c >= '0' && c <= '9') {
      v += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return v;
}

std::string first_char(const std::string& s) {
  if (s.empty()) return s;
  const size_t n = std::max<size_t>(1, unicode::sequence_length(s, 0));
  return s.substr(0, n);
}

}  // namespace

Decoder Decoder::byte_level() {
  Decoder d;
  d.steps_.push_back({Step::Kind::ByteLevel, {}, {}, 0, 0, true});
  return d;
}

Decoder Decoder::from_json(const nlohmann::json& j, const std::string& source) {
  Decoder d;
  if (j.is_null()) return d;
  const auto add = [&](const nlohmann::json& node, auto&& self) -> void {
    INFERX_CHECK(node.is_object() && node.contains("type"), "{}: decoder entry must be an object with a type",
                 source);
    const std::string type = node["type"].get<std::string>();
    Step s{Step::Kind::ByteLevel, {}, {}, 0, 0, true};
    if (type == "Sequence") {
      for (const auto& child : node.value("decoders", nlohmann::json::array())) self(child, self);
      return;
    } else if (type == "ByteLevel") {
      s.kind = Step::Kind::ByteLevel;
    } else if (type == "Replace") {
      s.kind = Step::Kind::Replace;
      const auto& pattern = node.value("pattern", nlohmann::json());
      INFERX_CHECK(pattern.contains("String"), "{}: decoder Replace supports only a String pattern", source);
      s.pattern = pattern["String"].get<std::string>();
      s.content = node.value("content", std::string());
    } else if (type == "ByteFallback") {
      s.kind = Step::Kind::ByteFallback;
    } else if (type == "Fuse") {
      s.kind = Step::Kind::Fuse;
    } else if (type == "Strip") {
      s.kind = Step::Kind::Strip;
      s.content = first_char(node.value("content", std::string(" ")));
      const auto count = [&](const char* key) -> size_t {
        return node.contains(key) ? static_cast<size_t>(json_integer(
                                        node[key], std::string("decoder Strip ") + key, source, 0, INT32_MAX))
                                  : 0;
      };
      s.start = count("start");
      s.stop = count("stop");
    } else if (type == "Metaspace") {
      s.kind = Step::Kind::Metaspace;
      s.pattern = first_char(node.value("replacement", std::string("\xE2\x96\x81")));
      std::string scheme = node.value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = node.value("add_prefix_space", true) ? "always" : "never";
      s.strip_first = scheme != "never";
    } else {
      fail(
          "{}: decoder type '{}' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, "
          "Fuse, "
          "Strip, Metaspace)",
          source, type);
    }
    d.steps_.push_back(std::move(s));
  };
  add(j, add);
  return d;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {  // no decoder: tokenizers joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::ByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string b;
          bytes += byte_level_decode(t, b) ? b : t;
        }
        tokens.assign(1, unicode::to_valid_utf8(bytes));
        break;
      }
      case Step::Kind::Replace:
        for (std::string& t : tokens) t = replace_all(t, step.pattern, step.content);
        break;
      case Step::Kind::ByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        const auto flush = [&] {
          if (pending.empty()) return;
          if (unicode::is_valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
          }
          pending.clear();
        };
        for (std::string& t : tokens) {
          const int b = byte_token(t);
          if (b >= 0) {
            pending.push_back(static_cast<char>(b));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(out);
        break;
      }
      case Step::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::Kind::Strip:
        for (std::string& t : tokens) {
          size_t b = 0, e = t.size();
          const size_t w = step.content.size();
          for (size_t k = 0; k < step.start && e - b >= w && t.compare(b, w, step.content) == 0; ++k) b += w;
          for (size_t k = 0; k < step.stop && e - b >= w && t.compare(e - w, w, step.content) == 0; ++k)
            e -= w;
          t = t.substr(b, e - b);
        }
        break;
      case Step::Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // tokenizers drops the replacement chars of the first token instead of turning them into spaces
          // when a prefix was prepended.
          tokens[i] = replace_all(tokens[i], step.pattern, i == 0 && step.strip_first ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Decoder::token_bytes(std::string_view token) const {
  std::string t(token);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::ByteLevel: {
        std::string b;
        if (byte_level_decode(t, b)) t.swap(b);
        break;
      }
      case Step::Kind::Replace:
        t = replace_all(t, step.pattern, step.content);
        break;
      case Step::Kind::ByteFallback:
        if (const int b = byte_token(t); b >= 0) t.assign(1, static_cast<char>(b));
        break;
      case Step::Kind::Metaspace:
        t = replace_all(t, step.pattern, " ");
        break;
      case Step::Kind::Fuse:
      case Step::Kind::Strip:
        break;  // sequence-level: the stream keeps every byte (the detokenizer strips the first space)
    }
  }
  return t;
}

}  // namespace inferx
