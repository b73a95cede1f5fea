#include "model/dummy_models.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "core/buffer.h"
#include "core/error.h"
#include "core/half.h"
#include "model/arch_registry.h"

namespace inferx {

namespace {

ModelConfig llama_like(std::string arch, int64_t vocab, int64_t hidden, int64_t ffn, int64_t layers,
                       int64_t heads, int64_t kv_heads, int64_t head_dim, float theta, int64_t max_pos,
                       bool tied) {
  ModelConfig c;
  c.architecture = std::move(arch);
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Shapes from the published config.json of each model.
std::map<std::string, ModelConfig> make_table() {
  std::map<std::string, ModelConfig> t;
  t["llama-3-8b"] = llama_like("llama", 128256, 4096, 14336, 32, 32, 8, 128, 500000, 8192, false);
  t["llama-3-70b"] = llama_like("llama", 128256, 8192, 28672, 80, 64, 8, 128, 500000, 8192, false);
  ModelConfig l1 = llama_like("llama", 128256, 2048, 8192, 16, 32, 8, 64, 500000, 131072, true);
  l1.rope_scaling = {RopeScaling::Kind::Llama3, 32.0f, 1.0f, 4.0f, 8192};
  t["llama-3.2-1b"] = l1;
  ModelConfig m = llama_like("mistral", 32000, 4096, 14336, 32, 32, 8, 128, 10000, 32768, false);
  m.sliding_window = 4096;
  t["mistral-7b"] = m;
  ModelConfig q = llama_like("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 1000000, 32768, false);
  q.rms_norm_eps = 1e-6f;
  t["qwen2.5-7b"] = q;
  ModelConfig q3 = llama_like("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, 1000000, 40960, true);
  q3.rms_norm_eps = 1e-6f;
  t["qwen3-0.6b"] = q3;
  // Small enough for unit tests and CI smoke runs; every dimension a multiple of 256 so that all
  // weight types (K-quants have 256-element super-blocks) can be generated.
  t["tiny"] = llama_like("llama", 512, 256, 512, 2, 4, 2, 64, 10000, 2048, false);
  return t;
}

const std::map<std::string, ModelConfig>& table() {
  static const std::map<std::string, ModelConfig> t = make_table();
  return t;
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-amp, amp].
float uniform(uint64_t& s, float amp) {
  return (static_cast<float>(splitmix64(s) >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f) * amp;
}

class DummySource final : public TensorSource {
 public:
  DummySource(std::string name, bool host_data) : name_(std::move(name)), host_data_(host_data) {}
  const RandomFill* random_fill(std::string_view n) const override {
    auto it = device_fill_.find(n);
    return it == device_fill_.end() ? nullptr : &it->second;
  }
  const TensorEntry* find(std::string_view n) const override {
    auto it = index_.find(std::string(n));
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
  }
  std::string describe() const override { return "dummy:" + name_ + " (random weights)"; }

  void add(const std::string& tname, DType dtype, std::vector<int64_t> shape, float amp, float offset,
           uint64_t seed) {
    TensorEntry e;
    e.name = tname;
    e.dtype = dtype;
    e.shape = shape;
    e.file = describe();
    const int64_t cols = shape.back();
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    const int64_t rb = row_bytes(dtype, cols);
    if (!host_data_ && (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16)) {
      device_fill_[tname] = RandomFill{amp, offset, seed};  // generated in device memory by the loader
      e.data = nullptr;
      e.nbytes = static_cast<uint64_t>(rows * rb);
      index_[tname] = entries_.size();
      entries_.push_back(std::move(e));
      return;
    }
    buffers_.emplace_back(static_cast<size_t>(rows * rb));
    uint8_t* data = buffers_.back().as<uint8_t>();
    fill(dtype, data, rows, cols, rb, amp, offset, seed);
    e.data = data;
    e.nbytes = static_cast<uint64_t>(rows * rb);
    index_[tname] = entries_.size();
    entries_.push_back(std::move(e));
  }

 private:
  static void fill(DType dtype, uint8_t* data, int64_t rows, int64_t cols, int64_t rb, float amp,
                   float offset, uint64_t seed) {
    const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < n_threads; ++t) {
      threads.emplace_back([=] {
        for (int64_t r = rows * t / n_threads; r < rows * (t + 1) / n_threads; ++r) {
          uint64_t s = seed ^ (static_cast<uint64_t>(r) * 0x2545f4914f6cdd1dull);
          uint8_t* row = data + r * rb;
          fill_row(dtype, row, cols, rb, amp, offset, s);
        }
      });
    }
    for (auto& th : threads) th.join();
  }

  static void fill_row(DType dtype, uint8_t* row, int64_t cols, int64_t rb, float amp, float offset,
                       uint64_t& s) {
    switch (dtype) {
      case DType::F32:
        for (int64_t i = 0; i < cols; ++i) reinterpret_cast<float*>(row)[i] = offset + uniform(s, amp);
        return;
      case DType::F16:
        for (int64_t i = 0; i < cols; ++i)
          reinterpret_cast<uint16_t*>(row)[i] = f32_to_f16(offset + uniform(s, amp));
        return;
      case DType::BF16:
        for (int64_t i = 0; i < cols; ++i)
          reinterpret_cast<uint16_t*>(row)[i] = f32_to_bf16(offset + uniform(s, amp));
        return;
      default:
        break;
    }
    // Quantized: random payload bytes, then valid small scales so dequantized values are ~amp.
    for (int64_t i = 0; i + 8 <= rb; i += 8) {
      uint64_t v = splitmix64(s);
      std::memcpy(row + i, &v, 8);
    }
    for (int64_t i = rb / 8 * 8; i < rb; ++i) row[i] = static_cast<uint8_t>(splitmix64(s));
    const DTypeInfo& info = dtype_info(dtype);
    const int64_t blocks = cols / info.block_elems;
    auto put_f16 = [](uint8_t* p, float v) {
      uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
    };
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = row + b * info.block_bytes;
      switch (dtype) {
        case DType::Q8_0:
          put_f16(blk, amp / 127);
          break;
        case DType::Q4_0:
          put_f16(blk, amp / 8);
          break;
        case DType::Q4_K:
          put_f16(blk, amp / (15 * 63));
          put_f16(blk + 2, amp / (2 * 63));
          break;
        case DType::Q6_K:
          put_f16(blk + 208, amp / (32 * 127));
          break;
        default:
          fail("dummy weights: cannot generate dtype {}", dtype_name(dtype));
      }
    }
  }

  std::string name_;
  std::vector<TensorEntry> entries_;
  std::vector<HostBuffer> buffers_;
  std::map<std::string, size_t> index_;
  bool host_data_ = true;
  std::map<std::string, RandomFill, std::less<>> device_fill_;
};

}  // namespace

std::vector<std::string> dummy_model_names() {
  std::vector<std::string> out;
  for (const auto& [k, v] : table()) out.push_back(k);
  return out;
}

ModelConfig dummy_model_config(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end())
    fail("dummy:{}: unknown shape (known: {})", name, fmt::join(dummy_model_names(), ", "));
  ModelConfig c = it->second;
  apply_arch_spec(c, WeightNaming::HuggingFace);
  return c;
}

std::unique_ptr<TensorSource> make_dummy_source(const std::string& name, const ModelConfig& c, DType dtype,
                                                uint64_t seed, bool host_data) {
  auto src = std::make_unique<DummySource>(name, host_data);
  const TensorNames& n = tensor_names(WeightNaming::HuggingFace);
  const int64_t D = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
  uint64_t s = seed * 1000003 + 17;
  auto next_seed = [&] { return splitmix64(s); };
  // Uniform amplitude ~ sqrt(3)/sqrt(fan_in) keeps activations O(1) through the layers.
  auto amp = [](int64_t fan_in) { return 1.7f / std::sqrt(static_cast<float>(fan_in)); };
  src->add(n.token_embedding, dtype, {c.vocab_size, D}, 1.0f, 0, next_seed());
  src->add(n.final_norm, DType::F32, {D}, 0.0f, 1.0f, 0);
  if (!c.tie_word_embeddings) src->add(n.lm_head, dtype, {c.vocab_size, D}, amp(D), 0, next_seed());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto L = [&](const std::string& p) { return layer_tensor_name(p, i); };
    src->add(L(n.attn_norm), DType::F32, {D}, 0.0f, 1.0f, 0);
    src->add(L(n.ffn_norm), DType::F32, {D}, 0.0f, 1.0f, 0);
    src->add(L(n.q), dtype, {qd, D}, amp(D), 0, next_seed());
    src->add(L(n.k), dtype, {kvd, D}, amp(D), 0, next_seed());
    src->add(L(n.v), dtype, {kvd, D}, amp(D), 0, next_seed());
    src->add(L(n.o), dtype, {D, qd}, amp(qd), 0, next_seed());
    if (c.attention_bias) {
      src->add(L(n.q_bias), DType::F32, {qd}, 0.02f, 0, next_seed());
      src->add(L(n.k_bias), DType::F32, {kvd}, 0.02f, 0, next_seed());
      src->add(L(n.v_bias), DType::F32, {kvd}, 0.02f, 0, next_seed());
    }
    if (c.qk_norm) {
      src->add(L(n.q_norm), DType::F32, {hd}, 0.0f, 1.0f, 0);
      src->add(L(n.k_norm), DType::F32, {hd}, 0.0f, 1.0f, 0);
    }
    src->add(L(n.gate), dtype, {F, D}, amp(D), 0, next_seed());
    src->add(L(n.up), dtype, {F, D}, amp(D), 0, next_seed());
    src->add(L(n.down), dtype, {D, F}, amp(F), 0, next_seed());
  }
  return src;
}

}  // namespace inferx
