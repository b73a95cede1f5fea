// Model::load: detect the file kind, read the config, resolve every weight through the architecture's
// name table, check shapes, and place tensors in the backend's memory (zero-copy from the memory map on
// the CPU backend when the kernels read the stored type directly).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/half.h"
#include "formats/gguf.h"
#include "formats/gguf_config.h"
#include "formats/hf_config.h"
#include "formats/safetensors.h"
#include "model/arch_registry.h"
#include "model/dummy_models.h"
#include "model/fused_projections.h"
#include "model/model.h"
#include "model/quantized_linear.h"
#include "model/tensor_parallel.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"

namespace inferx {

class WeightLoader {
 public:
  WeightLoader(Model& model, WeightNaming naming, const LoadOptions& options, HfQuantConfig hf = {})
      : m_(model), names_(tensor_names(naming)), options_(options), hf_(std::move(hf)) {}

  void load_all() {
    const ModelConfig& c = m_.config_;
    const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
    const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
    ModelWeights& w = m_.weights_;
    prepare_plan();
    w.token_embedding = matrix(names_.token_embedding, {c.vocab_size, D});
    w.final_norm = vector_f32(names_.final_norm, D);
    w.layers.resize(static_cast<size_t>(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights& l = w.layers[static_cast<size_t>(i)];
      auto N = [&](const std::string& p) { return layer_tensor_name(p, i); };
      l.attn_norm = vector_f32(N(names_.attn_norm), D);
      l.ffn_norm = vector_f32(N(names_.ffn_norm), D);
      l.q = linear(N(names_.q), {qd, D});
      l.k = linear(N(names_.k), {kvd, D});
      l.v = linear(N(names_.v), {kvd, D});
      l.o = linear(N(names_.o), {D, qd});
      if (c.attention_bias) {
        l.q.bias = vector_f32(N(names_.q_bias), qd);
        l.k.bias = vector_f32(N(names_.k_bias), kvd);
        l.v.bias = vector_f32(N(names_.v_bias), kvd);
      }
      if (c.qk_norm) {
        l.q_norm = vector_f32(N(names_.q_norm), hd);
        l.k_norm = vector_f32(N(names_.k_norm), hd);
      }
      l.gate = linear(N(names_.gate), {F, D});
      l.up = linear(N(names_.up), {F, D});
      l.down = linear(N(names_.down), {D, F});
    }
    load_lm_head();
    // Stacked q/k/v and gate/up for backends that run them as one product (after quantization and any
    // tensor-parallel slicing: the parts are this rank's final weights).
    if (m_.backend_.prefers_fused_projections()) fuse_projections(m_.backend_, m_.owned_, w.layers);
    m_.quant_plan_ = std::move(applied_);
    if (!m_.quant_plan_.empty() && quant_device() != Device::CPU)
      std::fprintf(stderr,
                   "note: %s has no FP8/INT4 kernels yet: quantized layers are dequantized to BF16 at load "
                   "(quantized values, unquantized memory and speed)\n",
                   m_.backend_.name().c_str());
  }

 private:
  const TensorEntry& entry(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorEntry* e = m_.source_->find(name);
    INFERX_CHECK(e != nullptr, "{}: tensor '{}' is missing", m_.source_->describe(), name);
    bool same = e->shape == shape;
    // A 1-D weight may be stored as [1, n] by some exporters.
    if (!same && shape.size() == 1 && e->shape.size() == 2 && e->shape[0] == 1)
      same = e->shape[1] == shape[0];
    if (!same) {
      auto s = [](const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); };
      fail("{}: tensor '{}' has shape {}, expected {} for this config", e->file, name, s(e->shape), s(shape));
    }
    return *e;
  }

  // Norm weights and biases: always F32 on every backend (they are tiny).
  Tensor vector_f32(const std::string& name, int64_t n) {
    const TensorEntry& e = entry(name, {n});
    if (e.data == nullptr) return device_random(name, DType::F32, {n});
    INFERX_CHECK(!is_quantized(e.dtype) || n % dtype_info(e.dtype).block_elems == 0, "{}: tensor '{}' bad",
                 e.file, name);
    std::vector<float> host(static_cast<size_t>(n));
    dequantize_row(e.dtype, e.data, host.data(), n);
    return place(DType::F32, {n}, host.data(), static_cast<size_t>(n) * 4);
  }

  // The device resolve_quantized_linear dequantizes FP8/INT4 for (CPU: kept quantized). CUDA reads FP8,
  // INT4 (and GGUF Q8_0 / Q4_K linear weights) natively through its GEMV (backend/cuda/kernels_gemv.h).
  Device quant_device() const {
    return m_.backend_.device() == Device::CUDA ? Device::CPU : m_.backend_.device();
  }

  // Matrices keep their stored type when the backend's kernels read it; otherwise convert to BF16.
  // `linear`: a matmul weight (not the embedding table, which CUDA reads only as F32/F16/BF16).
  Tensor matrix(const std::string& name, const std::vector<int64_t>& shape, bool linear = false) {
    const TensorEntry& e = entry(name, shape);
    if (e.data == nullptr) return device_random(name, e.dtype, shape);
    const bool native = m_.backend_.device() == Device::CPU || e.dtype == DType::F32 ||
                        e.dtype == DType::F16 || e.dtype == DType::BF16 ||
                        (linear && m_.backend_.device() == Device::CUDA &&
                         (e.dtype == DType::Q8_0 || e.dtype == DType::Q4_K));
    if (native) {
      if (m_.backend_.device() == Device::CPU) {  // zero-copy view into the mapped file
        Tensor t = e.view();
        return t;
      }
      return place(e.dtype, shape, e.data, e.nbytes);
    }
    // Quantized weights on a backend without native kernels yet: dequantize to BF16 at load.
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<uint16_t> host(static_cast<size_t>(rows * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    const int64_t rb = row_bytes(e.dtype, cols);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(e.dtype, e.data + r * rb, row.data(), cols);
      for (int64_t c = 0; c < cols; ++c)
        host[static_cast<size_t>(r * cols + c)] = f32_to_bf16(row[static_cast<size_t>(c)]);
    }
    return place(DType::BF16, shape, host.data(), host.size() * 2);
  }

  // The plan for this model's layers: given, or built from the rule; checkpoint plans are replaced by
  // what the checkpoint stores (resolved per layer below).
  void prepare_plan() {
    descs_ = linear_layers(m_.config_);
    if (options_.plan) {
      plan_ = *options_.plan;
    } else if (options_.quantize.kind != PlanKind::None) {
      plan_ = make_plan(options_.quantize, descs_);
    } else {
      plan_ = make_plan(QuantOptions{}, descs_);
    }
    add_lm_head(plan_, options_.quantize, lm_head_desc(m_.config_));
    applied_.kind = plan_.kind;
    if (hf_.method != HfQuantConfig::Method::None) applied_.kind = "checkpoint";
    if (hf_.method != HfQuantConfig::Method::None && options_.quantize.kind != PlanKind::None)
      std::fprintf(stderr,
                   "note: %s is pre-quantized: its quantized layers keep their format (--quantize %s "
                   "applies to the others)\n",
                   m_.source_->describe().c_str(), options_.quantize.text.c_str());
    next_ = 0;
  }

  // The vocabulary projection: its own tensor (as stored, pre-quantized, or quantized per the plan's
  // "lm_head" entry), else the embedding's memory (tied), or with a quantized plan entry a quantized copy
  // of the embedding (which the lookup keeps reading as stored).
  void load_lm_head() {
    const ModelConfig& c = m_.config_;
    ModelWeights& w = m_.weights_;
    const std::vector<int64_t> shape{c.vocab_size, c.hidden_size};
    const std::string plan_name = lm_head_desc(c).name;
    const LayerQuant* q = plan_.find(plan_name);
    const bool quantize = q != nullptr && q->format != WeightFormat::Keep;
    if (m_.source_->find(names_.lm_head) != nullptr) {
      if (quantize || is_prequantized(*m_.source_, names_.lm_head))
        w.lm_head = planned_linear(plan_name, names_.lm_head, shape);
      else
        w.lm_head.weight = matrix(names_.lm_head, shape, true);
      return;
    }
    INFERX_CHECK(c.tie_word_embeddings, "{}: tensor '{}' is missing and the config does not tie embeddings",
                 m_.source_->describe(), names_.lm_head);
    if (quantize)
      w.lm_head = planned_linear(plan_name, names_.token_embedding, shape);
    else
      w.lm_head.weight = w.token_embedding;
  }

  // The next linear layer in linear_layers() order.
  Linear linear(const std::string& name, const std::vector<int64_t>& shape) {
    INFERX_CHECK(next_ < descs_.size(), "internal: more linear layers than the config describes");
    return planned_linear(descs_[next_++].name, name, shape);
  }

  // Tensor `name` as the plan's layer `plan_name`: pre-quantized in the checkpoint, quantized per the
  // plan, or as stored.
  Linear planned_linear(const std::string& plan_name, const std::string& name,
                        const std::vector<int64_t>& shape) {
    const LayerQuant* q = plan_.find(plan_name);
    LayerQuant want = q ? *q : LayerQuant{};
    const bool stored_quantized = m_.source_->find(name) == nullptr || is_prequantized(*m_.source_, name);
    if (stored_quantized) {
      Linear l = resolve_quantized_linear(*m_.source_, name, shape[0], shape[1], hf_, want, quant_device(),
                                          [this](DType t, const std::vector<int64_t>& s, const void* p,
                                                 size_t b) { return place(t, s, p, b); });
      LayerQuant got;
      got.format =
          l.weight.dtype == DType::INT4 || !l.input_perm.empty() ? WeightFormat::Int4 : WeightFormat::Fp8;
      if (l.weight.dtype == DType::BF16) got.format = want.format;  // dequantized on a GPU
      got.group = l.group_size ? l.group_size : 128;
      got.symmetric = l.zero.empty();
      got.fp8 = l.scale.numel() == 1 ? Fp8Granularity::PerTensor : Fp8Granularity::PerChannel;
      got.note = "stored pre-quantized";
      applied_.layers.emplace_back(plan_name, got);
      return l;
    }
    applied_.layers.emplace_back(plan_name, want);
    if (want.format == WeightFormat::Keep) {
      Linear l;
      l.weight = matrix(name, shape, true);
      return l;
    }
    if (entry(name, shape).data == nullptr) return random_quantized_linear(name, shape, want);  // dummy, GPU
    return resolve_quantized_linear(*m_.source_, name, shape[0], shape[1], hf_, want, quant_device(),
                                    [this](DType t, const std::vector<int64_t>& s, const void* p, size_t b) {
                                      return place(t, s, p, b);
                                    });
  }

  // dummy:NAME on a GPU with --quantize: random codes and scales generated in device memory (no host
  // values, no host quantization: a 70B model loads in seconds). FP8: codes of uniform(-448, 448), scale
  // amplitude / 448; INT4: uniform codes, scale amplitude / 7.5 (symmetric) or / 15 with zero point 8.
  Linear random_quantized_linear(const std::string& name, const std::vector<int64_t>& shape,
                                 const LayerQuant& q) {
    const RandomFill* f = m_.source_->random_fill(name);
    INFERX_CHECK(f != nullptr, "{}: tensor '{}' has no data", m_.source_->describe(), name);
    const int64_t n = shape[0], k = shape[1];
    // Codes of the tensor's own block (a tensor-parallel rank's slice of the whole: f's region); scales
    // and zero points are constants (amplitude 0), the same on every rank.
    auto filled = [&](DType t, const std::vector<int64_t>& s, uint64_t seed, float amp, float offset) {
      RandomFill fill = *f;
      fill.seed = seed;
      fill.amplitude = amp;
      fill.offset = offset;
      return device_random_with(name, t, s, fill);
    };
    auto constant = [&](DType t, const std::vector<int64_t>& s, float value) {
      return device_random_with(name, t, s, RandomFill{0.0f, value, 0});
    };
    Linear l;
    if (q.format == WeightFormat::Fp8) {
      l.weight = filled(DType::F8_E4M3, {n, k}, f->seed, kFp8E4M3Max, 0.0f);
      const int64_t scales = q.fp8 == Fp8Granularity::PerTensor ? 1 : n;
      l.scale = constant(DType::F32, {scales}, f->amplitude / kFp8E4M3Max);
      return l;
    }
    INFERX_CHECK(q.format == WeightFormat::Int4 && int4_group_fits(k, q.group),
                 "{}: cannot generate {} input columns in INT4 groups of {}", m_.source_->describe(), k,
                 q.group);
    l.weight = filled(DType::INT4, {n, k}, f->seed, 0.0f, 0.0f);
    l.scale = constant(DType::F16, {n, k / q.group}, f->amplitude / (q.symmetric ? 7.5f : 15.0f));
    if (!q.symmetric) l.zero = constant(DType::U8, {n, k / q.group}, 8.0f);
    l.group_size = q.group;
    return l;
  }

  // dummy:NAME on a GPU: the source holds no host bytes, the backend generates the values in place.
  Tensor device_random(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
    const RandomFill* f = m_.source_->random_fill(name);
    INFERX_CHECK(f != nullptr, "{}: tensor '{}' has no data", m_.source_->describe(), name);
    return device_random_with(name, dtype, shape, *f);
  }
  Tensor device_random_with(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const RandomFill& fill) {
    Tensor t;
    t.dtype = dtype;
    t.ndim = static_cast<int>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
    auto buf = m_.backend_.allocate(static_cast<size_t>(t.nbytes()));
    t.data = buf->data();
    t.device = m_.backend_.device();
    INFERX_CHECK(m_.backend_.fill_random(t, fill), "{}: backend {} cannot generate random weights",
                 m_.source_->describe(), m_.backend_.name());
    m_.owned_.push_back(std::move(buf));
    return t;
  }

  Tensor place(DType dtype, const std::vector<int64_t>& shape, const void* host, size_t bytes) {
    auto buf = m_.backend_.allocate(bytes);
    m_.backend_.copy_to_device(buf->data(), host, bytes);
    Tensor t;
    t.dtype = dtype;
    t.ndim = static_cast<int>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
    t.data = buf->data();
    t.device = m_.backend_.device();
    m_.owned_.push_back(std::move(buf));
    return t;
  }

  Model& m_;
  const TensorNames& names_;
  const LoadOptions& options_;
  HfQuantConfig hf_;
  std::vector<LinearDesc> descs_;
  QuantPlan plan_, applied_;
  size_t next_ = 0;
};

namespace {

bool is_directory(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool has_gguf_magic(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string dtype_list() { return "f32, f16, bf16, q8_0, q4_0, q4_k, q6_k"; }

}  // namespace

OpenedModel open_model(const std::string& spec, Backend& backend, const LoadOptions& options) {
  OpenedModel opened;
  std::unique_ptr<Model>& model = opened.model;
  WeightNaming& naming = opened.naming;
  HfQuantConfig& hf_quant = opened.hf_quant;
  if (spec.rfind("dummy:", 0) == 0) {
    // dummy:NAME or dummy:NAME:DTYPE
    std::string name = spec.substr(6);
    DType dtype = options.dummy_dtype;
    if (auto colon = name.find(':'); colon != std::string::npos) {
      auto parsed = dtype_from_name(name.substr(colon + 1));
      INFERX_CHECK(parsed.has_value(), "{}: unknown weight type '{}' (known: {})", spec,
                   name.substr(colon + 1), dtype_list());
      dtype = *parsed;
      name = name.substr(0, colon);
    }
    ModelConfig config = dummy_model_config(name);
    // On a GPU, plain-typed dummy weights are generated in device memory (no host copy of an 8B model),
    // unless a quantization plan needs the host values.
    const bool on_device =
        backend.device() != Device::CPU && !is_quantized(dtype) &&
        !options.plan &&  // fixed rules need no host values (random codes on the device)
        (options.quantize.kind == PlanKind::None || options.quantize.kind == PlanKind::Fp8 ||
         options.quantize.kind == PlanKind::Int4 || options.quantize.kind == PlanKind::Fp8Int4);
    // (tensor-parallel ranks generate their slices of the same values: make_rank_source slices the fills)
    auto source = make_dummy_source(name, config, dtype, options.dummy_seed, !on_device);
    std::string desc = fmt::format("{} in {} — RANDOM WEIGHTS, outputs are meaningless", source->describe(),
                                   dtype_name(dtype));
    model = std::make_unique<Model>(backend, std::move(config), std::move(source), desc);
  } else if (is_directory(spec)) {
    ModelConfig config = read_hf_config(spec);
    apply_arch_spec(config, WeightNaming::HuggingFace);
    hf_quant = read_hf_quant_config(spec);
    auto source = std::make_unique<SafetensorsModel>(spec);
    std::string desc = fmt::format("{} ({}, Hugging Face safetensors)", spec, config.architecture);
    model = std::make_unique<Model>(backend, std::move(config), std::move(source), desc);
  } else {
    struct stat st {};
    INFERX_CHECK(::stat(spec.c_str(), &st) == 0, "{}: no such file or directory", spec);
    INFERX_CHECK(has_gguf_magic(spec),
                 "{}: not a GGUF file (no 'GGUF' magic) and not a Hugging Face model folder (config.json + "
                 "*.safetensors)",
                 spec);
    auto gguf = std::make_unique<GgufFile>(spec);
    ModelConfig config = read_gguf_config(*gguf);
    if (const TensorEntry* f = gguf->find("rope_freqs.weight")) {
      // Llama 3.1+ GGUFs: the llama3 RoPE scaling as per-frequency divisors (read_gguf_config leaves the
      // scaling kind None so that it is not applied twice).
      INFERX_CHECK(f->shape.size() == 1 && f->shape[0] * 2 == config.head_dim && f->dtype == DType::F32,
                   "{}: tensor 'rope_freqs.weight' must be F32 [{}], got {} {}", spec, config.head_dim / 2,
                   dtype_name(f->dtype), fmt::join(f->shape, "x"));
      const float* v = reinterpret_cast<const float*>(f->data);
      config.rope_scaling.freq_factors.assign(v, v + f->shape[0]);
      for (float x : config.rope_scaling.freq_factors)
        INFERX_CHECK(std::isfinite(x) && x > 0, "{}: rope_freqs.weight holds a non-positive factor {}", spec,
                     x);
    }
    apply_arch_spec(config, WeightNaming::Gguf);
    naming = WeightNaming::Gguf;
    std::string desc = fmt::format("{} ({}, GGUF v{})", spec, config.architecture, gguf->version());
    model = std::make_unique<Model>(backend, std::move(config), std::move(gguf), desc);
  }
  model->config().validate(model->source()->describe());
  return opened;
}

void load_weights(Model& model, WeightNaming naming, const LoadOptions& options, HfQuantConfig hf_quant) {
  WeightLoader(model, naming, options, std::move(hf_quant)).load_all();
}

std::unique_ptr<Model> Model::load(const std::string& spec, Backend& backend, const LoadOptions& options) {
  if (options.tensor_parallel_size > 1 || options.tensor_parallel_path)
    return TensorParallel::load(spec, backend, options);
  OpenedModel opened = open_model(spec, backend, options);
  load_weights(*opened.model, opened.naming, options, std::move(opened.hf_quant));
  return std::move(opened.model);
}

}  // namespace inferx
