// Pre-quantized checkpoint layouts and plan-driven quantization of linear layers at load.
//
// Layouts recognised by tensor names next to the layer prefix P:
//   InferX (docs/quantized-checkpoint.md): P.weight F8_E4M3 [n, k] + P.weight_scale F32 [1] | [n]
//                                          P.weight U8 [n, k/2] + P.weight_scale F16 [n, k/g]
//                                          (+ P.weight_zero_point U8 [n, k/g])
//   compressed-tensors float-quantized:    P.weight F8_E4M3 [n, k] + P.weight_scale (F32/BF16/F16)
//                                          [] | [1] (strategy "tensor") or [n, 1] (strategy "channel")
//   AWQ GEMM:  P.qweight I32 [k, n/8], P.qzeros I32 [k/g, n/8], P.scales F16 [k/g, n]
//   GPTQ:      P.qweight I32 [k/8, n], P.qzeros I32 [k/g, n/8], P.scales F16 [k/g, n] (+ P.g_idx I32 [k])
#include "model/quantized_linear.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/half.h"
#include "formats/json_text.h"
#include "quant/awq_gptq.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"

namespace inferx {

namespace {

using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

const TensorEntry& need(const TensorSource& src, const std::string& name, DType dtype,
                        const std::vector<int64_t>& shape) {
  const TensorEntry* e = src.find(name);
  INFERX_CHECK(e != nullptr, "{}: tensor '{}' is missing", src.describe(), name);
  INFERX_CHECK(e->dtype == dtype && e->shape == shape, "{}: tensor '{}' is {} {}, expected {} {}", e->file,
               name, dtype_name(e->dtype), shape_str(e->shape), dtype_name(dtype), shape_str(shape));
  return *e;
}

// Any float entry of `count` elements as f32.
std::vector<float> floats(const TensorEntry& e, int64_t count) {
  int64_t numel = 1;
  for (int64_t d : e.shape) numel *= d;
  INFERX_CHECK(numel == count && (e.dtype == DType::F32 || e.dtype == DType::F16 || e.dtype == DType::BF16),
               "{}: tensor '{}' is {} {}, expected {} float values", e.file, e.name, dtype_name(e.dtype),
               shape_str(e.shape), count);
  std::vector<float> v(static_cast<size_t>(count));
  dequantize_row(e.dtype, e.data, v.data(), count);
  return v;
}

// The float weight of a layer, whatever it is stored as.
std::vector<float> float_weight(const TensorEntry& e, int64_t n, int64_t k) {
  INFERX_CHECK(e.shape == std::vector<int64_t>({n, k}), "{}: tensor '{}' has shape {}, expected [{}, {}]",
               e.file, e.name, shape_str(e.shape), n, k);
  std::vector<float> w(static_cast<size_t>(n * k));
  const int64_t rb = row_bytes(e.dtype, k);
  for (int64_t r = 0; r < n; ++r) dequantize_row(e.dtype, e.data + r * rb, w.data() + r * k, k);
  return w;
}

struct Placer {
  const PlaceFn& place;
  Tensor operator()(DType t, std::vector<int64_t> shape, const void* p, size_t bytes) const {
    return place(t, shape, p, bytes);
  }
};

Linear fp8_linear(const Placer& place, int64_t n, int64_t k, const uint8_t* codes,
                  const std::vector<float>& scale, Device device) {
  Linear l;
  if (device != Device::CPU) {  // no FP8 kernels on this device yet: the same values in BF16
    std::vector<uint16_t> h(static_cast<size_t>(n * k));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      dequantize_fp8_row(codes + r * k, scale[scale.size() == 1 ? 0 : static_cast<size_t>(r)], row.data(), k);
      for (int64_t c = 0; c < k; ++c)
        h[static_cast<size_t>(r * k + c)] = f32_to_bf16(row[static_cast<size_t>(c)]);
    }
    l.weight = place(DType::BF16, {n, k}, h.data(), h.size() * 2);
    return l;
  }
  l.weight = place(DType::F8_E4M3, {n, k}, codes, static_cast<size_t>(n * k));
  l.scale = place(DType::F32, {static_cast<int64_t>(scale.size())}, scale.data(), scale.size() * 4);
  return l;
}

Linear int4_linear(const Placer& place, const Int4Weight& q, const std::vector<int32_t>& perm,
                   Device device) {
  const int64_t n = q.n, k = q.k, groups = k / q.group;
  Linear l;
  if (device != Device::CPU) {
    std::vector<uint16_t> h(static_cast<size_t>(n * k));
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      dequantize_int4_row(q.codes.data() + r * k / 2, q.scale.data() + r * groups,
                          q.symmetric() ? nullptr : q.zero.data() + r * groups, q.group, row.data(), k);
      // Undo the act-order permutation: column perm[i] of the original layer is our column i.
      for (int64_t c = 0; c < k; ++c) {
        const int64_t dst = perm.empty() ? c : perm[static_cast<size_t>(c)];
        h[static_cast<size_t>(r * k + dst)] = f32_to_bf16(row[static_cast<size_t>(c)]);
      }
    }
    l.weight = place(DType::BF16, {n, k}, h.data(), h.size() * 2);
    return l;
  }
  l.weight = place(DType::INT4, {n, k}, q.codes.data(), q.codes.size());
  l.scale = place(DType::F16, {n, groups}, q.scale.data(), q.scale.size() * 2);
  if (!q.symmetric()) l.zero = place(DType::U8, {n, groups}, q.zero.data(), q.zero.size());
  l.group_size = q.group;
  if (!perm.empty()) l.input_perm = place(DType::I32, {k}, perm.data(), perm.size() * 4);
  return l;
}

}  // namespace

namespace {
HfQuantConfig read_quant_config(const json& q, const std::string& where);
}  // namespace

HfQuantConfig read_hf_quant_config(const std::string& folder) {
  HfQuantConfig c;
  const std::string path = folder + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return c;  // read_hf_config reports a missing config.json
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  const json j = parse_json_text(text, path);
  if (!j.is_object() || !j.contains("quantization_config")) return c;
  const std::string where = path + ": quantization_config";
  try {
    return read_quant_config(j["quantization_config"], where);
  } catch (const json::exception& e) {  // a field of another JSON type than the one read ("bits": "4")
    fail("{}: unexpected JSON structure: {}", where, e.what());
  }
}

namespace {

HfQuantConfig read_quant_config(const json& q, const std::string& where) {
  HfQuantConfig c;
  INFERX_CHECK(q.is_object() && q.contains("quant_method") && q["quant_method"].is_string(),
               "{} needs a string 'quant_method'", where);
  const std::string method = q["quant_method"].get<std::string>();
  auto get_int = [&](const char* key, int64_t def) {
    if (!q.contains(key)) return def;
    INFERX_CHECK(q[key].is_number_integer(), "{}.{} must be an integer", where, key);
    return q[key].get<int64_t>();
  };
  if (method == "inferx") {
    c.method = HfQuantConfig::Method::InferX;
    INFERX_CHECK(q.contains("plan"), "{}.plan is missing", where);
    c.plan_json = q["plan"].dump();
  } else if (method == "awq") {
    c.method = HfQuantConfig::Method::Awq;
    c.group_size = get_int("group_size", get_int("q_group_size", 128));
    INFERX_CHECK(get_int("bits", get_int("w_bit", 4)) == 4, "{}: only 4-bit AWQ is supported", where);
    const std::string version = q.value("version", std::string("gemm"));
    INFERX_CHECK(version == "gemm" || version == "GEMM",
                 "{}.version '{}': only the GEMM packing is supported (GEMV/marlin/exllama are not)", where,
                 version);
  } else if (method == "gptq") {
    c.method = HfQuantConfig::Method::Gptq;
    c.group_size = get_int("group_size", 128);
    INFERX_CHECK(get_int("bits", 4) == 4, "{}: only 4-bit GPTQ is supported", where);
    const std::string fmt_name = q.value("checkpoint_format", std::string("gptq"));
    INFERX_CHECK(fmt_name == "gptq" || fmt_name == "gptq_v2", "{}.checkpoint_format '{}' is not gptq/gptq_v2",
                 where, fmt_name);
    c.zero_plus_one = fmt_name == "gptq";
  } else if (method == "compressed-tensors") {
    c.method = HfQuantConfig::Method::CompressedTensors;
    const std::string format = q.value("format", std::string());
    INFERX_CHECK(format == "float-quantized" || format == "naive-quantized",
                 "{}.format '{}': only float-quantized (FP8) compressed-tensors checkpoints are supported",
                 where, format);
    if (q.contains("config_groups") && q["config_groups"].is_object())
      for (const auto& [name, g] : q["config_groups"].items()) {
        if (!g.contains("weights") || !g["weights"].is_object()) continue;
        const json& w = g["weights"];
        const int64_t bits =
            w.contains("num_bits") ? json_integer(w["num_bits"], "num_bits", where, 1, 64) : 8;
        INFERX_CHECK(w.value("type", std::string("float")) == "float" && bits == 8,
                     "{}.config_groups.{}.weights: only 8-bit float weights are supported", where, name);
        const std::string strategy = w.value("strategy", std::string("tensor"));
        INFERX_CHECK(
            strategy == "tensor" || strategy == "channel",
            "{}.config_groups.{}.weights.strategy '{}': only tensor and channel scales are supported", where,
            name, strategy);
      }
  } else {
    fail("{}: quant_method '{}' is not supported (inferx, compressed-tensors, awq, gptq)", where, method);
  }
  INFERX_CHECK(c.group_size == 32 || c.group_size == 64 || c.group_size == 128 ||
                   c.method == HfQuantConfig::Method::InferX ||
                   c.method == HfQuantConfig::Method::CompressedTensors,
               "{}.group_size {}: InferX INT4 supports 32, 64 and 128", where, c.group_size);
  return c;
}

}  // namespace

std::vector<LinearDesc> linear_layers(const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  std::vector<LinearDesc> v;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    v.push_back({p + "self_attn.q_proj", LinearRole::Q, i, qd, D});
    v.push_back({p + "self_attn.k_proj", LinearRole::K, i, kvd, D});
    v.push_back({p + "self_attn.v_proj", LinearRole::V, i, kvd, D});
    v.push_back({p + "self_attn.o_proj", LinearRole::O, i, D, qd});
    v.push_back({p + "mlp.gate_proj", LinearRole::Gate, i, F, D});
    v.push_back({p + "mlp.up_proj", LinearRole::Up, i, F, D});
    v.push_back({p + "mlp.down_proj", LinearRole::Down, i, D, F});
  }
  return v;
}

LinearDesc lm_head_desc(const ModelConfig& c) {
  return {"lm_head", LinearRole::LmHead, -1, c.vocab_size, c.hidden_size};
}

std::string linear_prefix(const std::string& weight_name) {
  const std::string suffix = ".weight";
  INFERX_CHECK(weight_name.size() > suffix.size() &&
                   weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0,
               "linear weight name '{}' does not end in .weight", weight_name);
  return weight_name.substr(0, weight_name.size() - suffix.size());
}

bool is_prequantized(const TensorSource& src, const std::string& weight_name) {
  const std::string prefix = linear_prefix(weight_name);
  if (src.find(prefix + ".qweight") != nullptr) return true;
  const TensorEntry* w = src.find(prefix + ".weight");
  return w != nullptr && (w->dtype == DType::F8_E4M3 || w->dtype == DType::U8);
}

Linear resolve_quantized_linear(const TensorSource& src, const std::string& weight_name, int64_t n, int64_t k,
                                const HfQuantConfig& hf, const LayerQuant& plan, Device device,
                                const PlaceFn& place_fn) {
  const std::string prefix = linear_prefix(weight_name);
  const Placer place{place_fn};
  const std::string where = src.describe() + ": " + prefix;
  if (const TensorEntry* qw = src.find(prefix + ".qweight")) {
    const int64_t g = hf.group_size;
    INFERX_CHECK(hf.method == HfQuantConfig::Method::Awq || hf.method == HfQuantConfig::Method::Gptq,
                 "{}.qweight: config.json has no awq/gptq quantization_config", where);
    INFERX_CHECK(k % g == 0 && n % 8 == 0, "{}: [{}, {}] does not fit group size {} and 8-wide packing",
                 where, n, k, g);
    const auto& scales = need(src, prefix + ".scales", DType::F16, {k / g, n});
    const auto& qzeros = need(src, prefix + ".qzeros", DType::I32, {k / g, n / 8});
    const auto* s = reinterpret_cast<const uint16_t*>(scales.data);
    const auto* z = reinterpret_cast<const int32_t*>(qzeros.data);
    Int4Conversion conv;
    if (hf.method == HfQuantConfig::Method::Awq) {
      need(src, qw->name, DType::I32, {k, n / 8});
      conv = convert_awq_gemm(reinterpret_cast<const int32_t*>(qw->data), z, s, k, n, g);
    } else {
      need(src, qw->name, DType::I32, {k / 8, n});
      const int32_t* g_idx = nullptr;
      if (src.find(prefix + ".g_idx") != nullptr)
        g_idx = reinterpret_cast<const int32_t*>(need(src, prefix + ".g_idx", DType::I32, {k}).data);
      conv = convert_gptq(reinterpret_cast<const int32_t*>(qw->data), z, s, g_idx, k, n, g, hf.zero_plus_one);
    }
    return int4_linear(place, conv.weight, conv.input_perm, device);
  }
  const TensorEntry* w = src.find(prefix + ".weight");
  INFERX_CHECK(w != nullptr, "{}: tensor '{}.weight' is missing", src.describe(), prefix);
  if (w->dtype == DType::F8_E4M3) {
    need(src, w->name, DType::F8_E4M3, {n, k});
    const TensorEntry* se = src.find(prefix + ".weight_scale");
    INFERX_CHECK(se != nullptr, "{}: FP8 weight without '{}.weight_scale'", where, prefix);
    int64_t count = 1;
    for (int64_t d : se->shape) count *= d;
    INFERX_CHECK(count == 1 || count == n,
                 "{}.weight_scale {} is neither per tensor nor per output channel ({})", where,
                 shape_str(se->shape), n);
    return fp8_linear(place, n, k, w->data, floats(*se, count), device);
  }
  if (w->dtype == DType::U8) {  // InferX INT4
    need(src, w->name, DType::U8, {n, k / 2});
    const TensorEntry* se = src.find(prefix + ".weight_scale");
    INFERX_CHECK(se != nullptr && se->dtype == DType::F16 && se->shape.size() == 2 && se->shape[0] == n &&
                     se->shape[1] > 0 && k % se->shape[1] == 0,
                 "{}.weight_scale must be F16 [{}, in/group] for an INT4 weight", where, n);
    const int64_t groups = se->shape[1], g = k / groups;
    Int4Weight q;
    q.n = n;
    q.k = k;
    q.group = g;
    INFERX_CHECK(int4_group_fits(k, g), "{}: group size {} is not 32, 64 or 128", where, g);
    q.codes.assign(w->data, w->data + n * k / 2);
    const auto* sp = reinterpret_cast<const uint16_t*>(se->data);
    q.scale.assign(sp, sp + n * groups);
    if (src.find(prefix + ".weight_zero_point") != nullptr) {
      const auto& ze = need(src, prefix + ".weight_zero_point", DType::U8, {n, groups});
      q.zero.assign(ze.data, ze.data + n * groups);
      for (uint8_t zp : q.zero) INFERX_CHECK(zp <= 15, "{}.weight_zero_point holds {} (> 15)", where, zp);
    }
    return int4_linear(place, q, {}, device);
  }
  // A float (or GGUF-quantized) weight quantized per the plan.
  const std::vector<float> wf = float_weight(*w, n, k);
  if (plan.format == WeightFormat::Fp8) {
    const Fp8Weight q = quantize_fp8_weight(wf.data(), n, k, plan.fp8);
    return fp8_linear(place, n, k, q.codes.data(), q.scale, device);
  }
  INFERX_CHECK(plan.format == WeightFormat::Int4, "{}: nothing to quantize", where);
  return int4_linear(place, quantize_int4_weight(wf.data(), n, k, plan.group, plan.symmetric), {}, device);
}

}  // namespace inferx
