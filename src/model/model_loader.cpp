// Model::load: detect the file kind, read the config, resolve every weight through the architecture's
// name table, check shapes, and place tensors in the backend's memory (zero-copy from the memory map on
// the CPU backend when the kernels read the stored type directly).
#include <sys/stat.h>

#include <cmath>
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
#include "model/model.h"
#include "quant/gguf_blocks.h"

namespace inferx {

class WeightLoader {
 public:
  WeightLoader(Model& model, WeightNaming naming) : m_(model), names_(tensor_names(naming)) {}

  void load_all() {
    const ModelConfig& c = m_.config_;
    const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
    const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
    ModelWeights& w = m_.weights_;
    w.token_embedding = matrix(names_.token_embedding, {c.vocab_size, D});
    w.final_norm = vector_f32(names_.final_norm, D);
    if (m_.source_->find(names_.lm_head) != nullptr) {
      w.lm_head.weight = matrix(names_.lm_head, {c.vocab_size, D});
    } else {
      INFERX_CHECK(c.tie_word_embeddings, "{}: tensor '{}' is missing and the config does not tie embeddings",
                   m_.source_->describe(), names_.lm_head);
      w.lm_head.weight = w.token_embedding;
    }
    w.layers.resize(static_cast<size_t>(c.num_layers));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights& l = w.layers[static_cast<size_t>(i)];
      auto N = [&](const std::string& p) { return layer_tensor_name(p, i); };
      l.attn_norm = vector_f32(N(names_.attn_norm), D);
      l.ffn_norm = vector_f32(N(names_.ffn_norm), D);
      l.q.weight = matrix(N(names_.q), {qd, D});
      l.k.weight = matrix(N(names_.k), {kvd, D});
      l.v.weight = matrix(N(names_.v), {kvd, D});
      l.o.weight = matrix(N(names_.o), {D, qd});
      if (c.attention_bias) {
        l.q.bias = vector_f32(N(names_.q_bias), qd);
        l.k.bias = vector_f32(N(names_.k_bias), kvd);
        l.v.bias = vector_f32(N(names_.v_bias), kvd);
      }
      if (c.qk_norm) {
        l.q_norm = vector_f32(N(names_.q_norm), hd);
        l.k_norm = vector_f32(N(names_.k_norm), hd);
      }
      l.gate.weight = matrix(N(names_.gate), {F, D});
      l.up.weight = matrix(N(names_.up), {F, D});
      l.down.weight = matrix(N(names_.down), {D, F});
    }
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
    INFERX_CHECK(!is_quantized(e.dtype) || n % dtype_info(e.dtype).block_elems == 0, "{}: tensor '{}' bad",
                 e.file, name);
    std::vector<float> host(static_cast<size_t>(n));
    dequantize_row(e.dtype, e.data, host.data(), n);
    return place(DType::F32, {n}, host.data(), static_cast<size_t>(n) * 4);
  }

  // Matrices keep their stored type when the backend's kernels read it; otherwise convert to BF16.
  Tensor matrix(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorEntry& e = entry(name, shape);
    const bool native = m_.backend_.device() == Device::CPU || e.dtype == DType::F32 ||
                        e.dtype == DType::F16 || e.dtype == DType::BF16;
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

std::unique_ptr<Model> Model::load(const std::string& spec, Backend& backend, const LoadOptions& options) {
  std::unique_ptr<Model> model;
  WeightNaming naming = WeightNaming::HuggingFace;
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
    auto source = make_dummy_source(name, config, dtype, options.dummy_seed);
    std::string desc = fmt::format("{} in {} — RANDOM WEIGHTS, outputs are meaningless", source->describe(),
                                   dtype_name(dtype));
    model = std::make_unique<Model>(backend, std::move(config), std::move(source), desc);
  } else if (is_directory(spec)) {
    ModelConfig config = read_hf_config(spec);
    apply_arch_spec(config, WeightNaming::HuggingFace);
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
  model->config_.validate(model->source_->describe());
  WeightLoader(*model, naming).load_all();
  return model;
}

}  // namespace inferx
