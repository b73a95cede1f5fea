// Hugging Face config.json -> ModelConfig. Field names and defaults follow transformers'
// LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config (configuration_*.py); rope_scaling follows
// transformers' modeling_rope_utils (rope types "default", "linear", "llama3"). What is fixed per
// architecture (RoPE layout, q/k norm, Qwen2's q/k/v bias) is left to the architecture registry.
#include "formats/hf_config.h"

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "core/text_file.h"
#include "formats/json_text.h"

namespace inferx {

namespace {

using json = nlohmann::json;

// config.json is at most a few levels deep; the cap keeps hostile input from building huge nests.
constexpr int kMaxConfigDepth = 32;

struct ArchName {
  const char* hf_class;
  const char* model_type;
  const char* key;
};
constexpr ArchName kArchitectures[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"MistralForCausalLM", "mistral", "mistral"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
};

std::string supported_list() {
  std::string s;
  for (const ArchName& a : kArchitectures)
    s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", a.hf_class, a.model_type);
  return s;
}

json parse_json(const std::string& text, const std::string& source) {
  return parse_json_text(text, source, kMaxConfigDepth);
}

std::string type_of(const json& v) {
  if (v.is_number_float()) return "float";
  if (v.is_number()) return "integer";
  return v.type_name();
}

// Typed field access: absent and null both mean "not given" (transformers writes null for unset
// optional fields such as head_dim or sliding_window).
class Fields {
 public:
  Fields(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  const json* get(const char* name) const {
    auto it = obj_.find(name);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const json& v, const std::string& name) const {
    if (v.is_number_unsigned()) {
      INFERX_CHECK(v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   "{}: field '{}' = {} is out of range", source_, name, v.get<uint64_t>());
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    INFERX_CHECK(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", source_, name,
                 type_of(v));
    return v.get<int64_t>();
  }
  int64_t integer(const char* name) const {
    const json* v = get(name);
    INFERX_CHECK(v != nullptr, "{}: missing field '{}'", source_, name);
    return integer(*v, name);
  }
  std::optional<int64_t> optional_integer(const char* name) const {
    const json* v = get(name);
    return v == nullptr ? std::nullopt : std::optional<int64_t>(integer(*v, name));
  }

  // A float field; range-checked because converting an out-of-range double to float is undefined.
  float number(const char* name, float fallback) const {
    const json* v = get(name);
    if (v == nullptr) return fallback;
    INFERX_CHECK(v->is_number(), "{}: field '{}' must be a number, got {}", source_, name, type_of(*v));
    const auto d = v->get<double>();
    INFERX_CHECK(d >= -std::numeric_limits<float>::max() && d <= std::numeric_limits<float>::max(),
                 "{}: field '{}' = {} is out of range", source_, name, d);
    return static_cast<float>(d);
  }
  float number(const char* name) const {
    INFERX_CHECK(get(name) != nullptr, "{}: missing field '{}'", source_, name);
    return number(name, 0.0f);
  }

  std::optional<bool> boolean(const char* name) const {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    INFERX_CHECK(v->is_boolean(), "{}: field '{}' must be a boolean, got {}", source_, name, type_of(*v));
    return v->get<bool>();
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  std::string source_;  // a copy: callers pass temporaries such as "config.json rope_scaling"
};

int32_t token_id(const Fields& f, const json& v, const std::string& name) {
  int64_t id = f.integer(v, name);
  INFERX_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(), "{}: field '{}' = {} is not a token id",
               f.source(), name, id);
  return static_cast<int32_t>(id);
}

// eos_token_id is an int or a list of ints (Llama 3.1: [128001, 128008, 128009]).
std::optional<std::vector<int32_t>> eos_ids(const Fields& f) {
  const json* v = f.get("eos_token_id");
  if (v == nullptr) return std::nullopt;
  std::vector<int32_t> ids;
  if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i)
      ids.push_back(token_id(f, (*v)[i], fmt::format("eos_token_id[{}]", i)));
  } else {
    ids.push_back(token_id(f, *v, "eos_token_id"));
  }
  return ids;
}

std::optional<int32_t> bos_id(const Fields& f) {
  const json* v = f.get("bos_token_id");
  return v == nullptr ? std::nullopt : std::optional<int32_t>(token_id(f, *v, "bos_token_id"));
}

RopeScaling parse_rope_scaling(const json& rs, const std::string& source) {
  RopeScaling out;
  INFERX_CHECK(rs.is_object(), "{}: field 'rope_scaling' must be an object or null, got {}", source,
               type_of(rs));
  Fields f(rs, source + " rope_scaling");
  // transformers renamed "type" to "rope_type"; configs in the wild carry either (or both).
  const json* type = f.get("rope_type");
  if (type == nullptr) type = f.get("type");
  INFERX_CHECK(type != nullptr, "{}: rope_scaling has no 'rope_type'", source);
  INFERX_CHECK(type->is_string(), "{}: field 'rope_scaling.rope_type' must be a string, got {}", source,
               type_of(*type));
  const auto& kind = type->get_ref<const std::string&>();
  if (kind == "default") return out;
  if (kind == "linear") {
    out.kind = RopeScaling::Kind::Linear;
    out.factor = f.number("factor");
    return out;
  }
  if (kind == "llama3") {
    out.kind = RopeScaling::Kind::Llama3;
    out.factor = f.number("factor");
    out.low_freq_factor = f.number("low_freq_factor");
    out.high_freq_factor = f.number("high_freq_factor");
    out.original_max_position = f.integer("original_max_position_embeddings");
    // _compute_llama3_parameters divides by both factors and by their difference.
    INFERX_CHECK(out.low_freq_factor > 0 && out.high_freq_factor > out.low_freq_factor,
                 "{}: rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}", source,
                 out.low_freq_factor, out.high_freq_factor);
    INFERX_CHECK(out.original_max_position > 0,
                 "{}: rope_scaling original_max_position_embeddings {} "
                 "must be positive",
                 source, out.original_max_position);
    return out;
  }
  fail("{}: rope_scaling type '{}' is not supported (supported: default, linear, llama3)", source, kind);
}

std::string architecture_key(const json& cfg, const std::string& source) {
  std::string name;
  auto arch = cfg.find("architectures");
  if (arch != cfg.end() && !arch->is_null()) {
    INFERX_CHECK(arch->is_array() && !arch->empty() && (*arch)[0].is_string(),
                 "{}: field 'architectures' must be a non-empty list of strings", source);
    name = (*arch)[0].get<std::string>();
    for (const ArchName& a : kArchitectures)
      if (name == a.hf_class) return a.key;
  } else {
    auto type = cfg.find("model_type");
    INFERX_CHECK(type != cfg.end() && !type->is_null(), "{}: neither 'architectures' nor 'model_type' is set",
                 source);
    INFERX_CHECK(type->is_string(), "{}: field 'model_type' must be a string, got {}", source,
                 type_of(*type));
    name = type->get<std::string>();
    for (const ArchName& a : kArchitectures)
      if (name == a.model_type) return a.key;
  }
  fail("{}: architecture '{}' is not supported (supported: {})", source, name, supported_list());
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& source) {
  const json cfg = parse_json(json_text, source);
  INFERX_CHECK(cfg.is_object(), "{}: must be a JSON object, got {}", source, type_of(cfg));
  Fields f(cfg, source);

  ModelConfig c;
  c.architecture = architecture_key(cfg, source);
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_layers = f.integer("num_hidden_layers");
  c.num_heads = f.integer("num_attention_heads");
  INFERX_CHECK(c.num_heads > 0, "{}: num_attention_heads = {} must be positive", source, c.num_heads);
  c.num_kv_heads = f.optional_integer("num_key_value_heads").value_or(c.num_heads);
  if (auto hd = f.optional_integer("head_dim")) {
    c.head_dim = *hd;
  } else {
    INFERX_CHECK(c.hidden_size % c.num_heads == 0,
                 "{}: hidden_size {} is not a multiple of num_attention_heads {} and head_dim is not set",
                 source, c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  // transformers' default for all four config classes.
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6f);
  c.rope_theta = f.number("rope_theta", 10000.0f);
  c.max_position_embeddings = f.integer("max_position_embeddings");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings").value_or(false);
  if (auto bias = f.boolean("attention_bias")) c.attention_bias = *bias;

  // Qwen2/Qwen3 configs carry a sliding_window value that is only used when use_sliding_window is true.
  const bool use_window = f.boolean("use_sliding_window").value_or(true);
  if (auto w = f.optional_integer("sliding_window"); w && use_window) c.sliding_window = *w;

  if (const json* rs = f.get("rope_scaling")) c.rope_scaling = parse_rope_scaling(*rs, source);

  if (auto b = bos_id(f)) c.bos_token_id = *b;
  if (auto e = eos_ids(f)) c.eos_token_ids = std::move(*e);

  c.validate(source);
  return c;
}

namespace {

std::string read_text(const std::string& path) { return read_text_file(path, "the file"); }

}  // namespace

ModelConfig read_hf_config(const std::string& folder) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(folder) / "config.json").string();
  std::error_code ec;
  INFERX_CHECK(fs::is_regular_file(path, ec), "{}: no config.json", folder);
  ModelConfig c = parse_hf_config(read_text(path), path);

  // generation_config.json holds the ids generation actually stops on (Llama 3 Instruct lists three
  // eos ids there); it wins over config.json where it gives them.
  const std::string gen_path = (fs::path(folder) / "generation_config.json").string();
  if (fs::is_regular_file(gen_path, ec)) {
    const json gen = parse_json(read_text(gen_path), gen_path);
    INFERX_CHECK(gen.is_object(), "{}: must be a JSON object, got {}", gen_path, type_of(gen));
    Fields f(gen, gen_path);
    if (auto b = bos_id(f)) c.bos_token_id = *b;
    if (auto e = eos_ids(f)) c.eos_token_ids = std::move(*e);
  }
  return c;
}

}  // namespace inferx
