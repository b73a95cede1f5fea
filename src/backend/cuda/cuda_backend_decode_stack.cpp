// CudaBackend::decode_stack: checks that a batch-1 decode step fits the persistent kernel
// (kernels_decode_stack.h) and launches it after the embedding; anything it does not take returns false
// before a launch, and Model::forward runs the per-op kernels instead.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_decode_stack.h"
#include "backend/cuda/tensor_map.h"
#include "core/error.h"

namespace inferx {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool f32_vector(const Tensor* t, int64_t n) {
  return t != nullptr && t->device == Device::CUDA && t->dtype == DType::F32 && t->numel() == n &&
         aligned16(t->data);
}

// The format fields of l's StackMatrix (what stage_geometry and the products read): F8_E4M3's scale,
// INT4's group, scales and zero points. The checks are stack_matrix's.
void format_of(const Linear& l, cuda::StackMatrix& m) {
  m.fp8 = l.weight.dtype == DType::F8_E4M3 ? 1 : 0;
  m.int4 = l.weight.dtype == DType::INT4 ? 1 : 0;
  m.per_channel = m.fp8 && l.scale.numel() > 1 ? 1 : 0;
  m.group_shift = static_cast<uint8_t>(l.group_size == 64 ? 1 : l.group_size == 128 ? 2 : 0);
  m.scale = m.fp8 || m.int4 ? l.scale.data : nullptr;
  m.zero = m.int4 && !l.zero.empty() ? static_cast<const uint8_t*>(l.zero.data) : nullptr;
}

// The kernel's view of a linear layer with `rows` outputs (x2 stacked when paired) over k inputs; false for
// formats and shapes it does not read.
bool stack_matrix(const Linear* l, int64_t rows, int64_t k, bool paired, int32_t stage_bytes,
                  cuda::StackMatrix& m) {
  if (l == nullptr) return false;
  const Tensor& w = l->weight;
  const int64_t stored = rows * (paired ? 2 : 1);
  if (w.device != Device::CUDA || w.ndim != 2 || w.dim(0) != stored || w.dim(1) != k ||
      !l->input_perm.empty() || rows > INT32_MAX || k > INT32_MAX)
    return false;
  if (!l->bias.empty() && (l->bias.dtype != DType::F32 || l->bias.numel() != stored)) return false;
  m = {};
  m.data = w.data;
  m.bias = l->bias.empty() ? nullptr : l->bias.ptr<float>();
  m.rows = static_cast<int32_t>(rows);
  m.k = static_cast<int32_t>(k);
  format_of(*l, m);
  if (w.dtype == DType::BF16) {
    if (!l->scale.empty() || !l->zero.empty()) return false;
  } else if (w.dtype == DType::F8_E4M3) {
    if (l->scale.dtype != DType::F32 || (l->scale.numel() != 1 && l->scale.numel() != stored) ||
        !l->zero.empty())
      return false;
  } else if (w.dtype == DType::INT4) {
    const int64_t g = l->group_size;
    if ((g != 32 && g != 64 && g != 128) || k % g != 0 || l->scale.dtype != DType::F16 ||
        l->scale.numel() != stored * (k / g) ||
        (!l->zero.empty() && (l->zero.dtype != DType::U8 || l->zero.numel() != l->scale.numel())))
      return false;
  } else {
    return false;
  }
  return cuda::decode_stack_matrix_fits(m, paired, stage_bytes);
}

// Whether every matrix of the stack holds BF16 weights (DecodeStackMode::Bf16).
bool all_bf16(const DecodeStack& s) {
  auto bf16 = [](const Linear* l) { return l != nullptr && l->weight.dtype == DType::BF16; };
  for (const DecodeStackLayer& l : s.layers)
    if (!bf16(l.qkv) || !bf16(l.o) || !bf16(l.gate_up) || !bf16(l.down)) return false;
  return bf16(s.lm_head);
}

// Mean over CTAs and layers of each interval between phase boundaries, and how far the CTAs' arrivals at
// each barrier spread (the slowest minus the fastest finisher of the phase before it), in microseconds.
void print_decode_stack_profile(const std::vector<uint64_t>& t, int grid, int32_t layers) {
  const int64_t events = cuda::decode_stack_profile_events(layers);
  static const char* const kNames[cuda::kStackLayerEvents - 1] = {
      "norm+qkv", "barrier", "rope",    "landed",       "keys",    "publish", "merge",
      "barrier",  "o",       "barrier", "norm+gate/up", "barrier", "down",    "barrier"};
  double mean[cuda::kStackLayerEvents - 1] = {}, spread[cuda::kStackLayerEvents - 1] = {};
  for (int32_t l = 0; l < layers; ++l) {
    for (int i = 0; i + 1 < cuda::kStackLayerEvents; ++i) {
      uint64_t lo = UINT64_MAX, hi = 0;
      for (int c = 0; c < grid; ++c) {
        const uint64_t* row =
            t.data() + static_cast<int64_t>(c) * events + static_cast<int64_t>(l) * cuda::kStackLayerEvents;
        mean[i] += static_cast<double>(row[i + 1] - row[i]);
        lo = std::min(lo, row[i + 1]);
        hi = std::max(hi, row[i + 1]);
      }
      spread[i] += static_cast<double>(hi - lo);
    }
  }
  double lm = 0;
  for (int c = 0; c < grid; ++c)
    lm += static_cast<double>(t[static_cast<size_t>(c * events + events - 1)] -
                              t[static_cast<size_t>(c * events + events - 2)]);
  const double per = 1e3 * grid * layers;  // ns -> us, averaged
  std::string line = "inferx cuda: decode stack profile, per layer (us, mean over CTAs; spread of arrivals):";
  double total = 0;
  for (int i = 0; i + 1 < cuda::kStackLayerEvents; ++i) {
    total += mean[i] / per;
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.2f (%.2f)", kNames[i], mean[i] / per, spread[i] / (1e3 * layers));
    line += buf;
  }
  char tail[128];
  std::snprintf(tail, sizeof tail, "; layer %.2f us x %d, lm_head %.2f us", total, layers, lm / (1e3 * grid));
  std::fprintf(stderr, "%s%s\n", line.c_str(), tail);
}

}  // namespace

bool CudaBackend::prepare_mlp_split(const DecodeStack& s, cuda::DecodeStackParams& p, int64_t inter,
                                    int grid) {
  if (decode_stack_down_t_failed_ || !cuda::decode_stack_mlp_split_fits(p, static_cast<int32_t>(inter), grid))
    return false;
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const cuda::StackMatrix& down = p.layers[i].down;
    if (down.fp8 || down.int4) return false;  // BF16 only
  }
  if (decode_stack_down_t_.empty()) {
    // The copies come out of what the KV cache left (the engine sized it before this first batch-1 step):
    // take them only if a margin (5% of the device, at least 1 GiB) stays free for later workspaces.
    const size_t copies =
        static_cast<size_t>(p.num_layers) * static_cast<size_t>(p.hidden) * static_cast<size_t>(inter) * 2;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t margin = std::max<size_t>(size_t{1} << 30, total_bytes / 20);
    if (free_bytes < copies + margin) {
      std::fprintf(
          stderr,
          "inferx cuda: the MLP split's transposed down matrices (%zu MiB) would leave less than %zu "
          "MiB free (%zu MiB now); batch-1 steps keep the two MLP phases\n",
          copies >> 20, margin >> 20, free_bytes >> 20);
      decode_stack_down_t_failed_ = true;
      return false;
    }
  }
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const Tensor& w = s.layers[static_cast<size_t>(i)].down->weight;  // [hidden, inter]
    auto found = decode_stack_down_t_.find(w.data);
    if (found == decode_stack_down_t_.end()) {
      if (capturing_) return false;  // the copies are made by an eager step (the first one)
      std::unique_ptr<DeviceBuffer> copy;
      try {
        copy = allocate(static_cast<size_t>(w.numel()) * 2);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "inferx cuda: the MLP split's transposed down matrices do not fit (%s); off\n",
                     e.what());
        decode_stack_down_t_failed_ = true;
        decode_stack_down_t_.clear();
        return false;
      }
      CUDA_CHECK(cuda::transpose_bf16(w.data, copy->data(), w.dim(0), w.dim(1), stream_));
      found = decode_stack_down_t_.emplace(w.data, std::move(copy)).first;
    }
    p.layers[i].down_t = found->second->data();
    if (!cuda::decode_stack_matrix_fits(cuda::down_transposed(p.layers[i]), false, p.stage_bytes))
      return false;
  }
  return true;
}

const void* CudaBackend::decode_stack_kv_maps(const cuda::DecodeStackParams& p) {
  const std::array<int64_t, 6> layout = {p.num_blocks, p.block_size, p.hkv, p.hd, p.kv_fp8, p.stage_bytes};
  KvMaps& entry = decode_stack_kv_maps_[p.layers[0].k_cache];
  bool same = entry.layout == layout && entry.caches.size() == 2 * static_cast<size_t>(p.num_layers);
  for (int32_t l = 0; same && l < p.num_layers; ++l)
    same = entry.caches[2 * static_cast<size_t>(l)] == p.layers[l].k_cache &&
           entry.caches[2 * static_cast<size_t>(l) + 1] == p.layers[l].v_cache;
  if (same) return entry.device ? entry.device->data() : nullptr;
  if (capturing_) return nullptr;  // encoded by an eager step; this recording copies per key
  // New caches, or another layout at a known address (a cache freed and another made there): the old maps'
  // buffer goes with the entry (freeing it retires the recordings that read it).
  entry.layout = layout;
  entry.caches.clear();
  for (int32_t l = 0; l < p.num_layers; ++l) {
    entry.caches.push_back(p.layers[l].k_cache);
    entry.caches.push_back(p.layers[l].v_cache);
  }
  entry.device.reset();
  std::vector<CUtensorMap> maps(2 * static_cast<size_t>(p.num_layers));  // 64-byte aligned elements
  if (!cuda::decode_stack_encode_kv_maps(p, maps.data())) return nullptr;
  entry.device = allocate(maps.size() * sizeof(CUtensorMap));
  copy_to_device(entry.device->data(), maps.data(), maps.size() * sizeof(CUtensorMap));
  return entry.device->data();
}

bool CudaBackend::decode_stack(const DecodeStack& s, const BatchView& batch, const RopeParams& rope,
                               const AttentionParams& ap, Tensor& x, Tensor& logits) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  if (options_.decode_stack == DecodeStackMode::Off || options_.timing_skip != 0) return false;
  if (batch.num_tokens != 1 || batch.num_seqs != 1 || batch.num_logits != 1 || batch.max_blocks_per_seq < 1)
    return false;
  if (s.layers.empty() || s.layers.size() > static_cast<size_t>(cuda::kMaxStackLayers) || !s.lm_head ||
      !s.token_embedding || !s.final_norm)
    return false;
  const DType kv = options_.kv_cache_dtype;
  if (kv != DType::BF16 && kv != DType::F8_E4M3) return false;
  const int64_t hidden = x.cols(), hq = ap.num_heads, hkv = ap.num_kv_heads, hd = ap.head_dim;
  const Linear* gu0 = s.layers[0].gate_up;
  if (gu0 == nullptr || gu0->weight.ndim != 2) return false;
  const int64_t inter = gu0->weight.dim(0) / 2;
  if (x.dtype != DType::F32 || x.device != Device::CUDA || logits.dtype != DType::F32 || !aligned16(x.data) ||
      !aligned16(logits.data) || rope.head_dim != hd || hd / 2 > 64 ||
      !cuda::decode_stack_supported(static_cast<int32_t>(hidden), static_cast<int32_t>(inter),
                                    static_cast<int32_t>(hq), static_cast<int32_t>(hkv),
                                    static_cast<int32_t>(hd)))
    return false;
  // The cheap refusals first: with the kernel on for BF16 (DecodeStackMode::Bf16), every eager batch-1 step
  // of a longer-context or quantized model comes through here and leaves.
  const KvCacheLayer* first = s.layers[0].cache;
  if (first == nullptr || first->k.ndim != 4) return false;
  const int64_t num_blocks = first->k.dim(0), block_size = first->k.dim(1);
  // Longer contexts run faster per-op (options_.decode_stack_max_context). The bound is the step's hint when
  // it has one (a decode graph's short-context recording), else the block tables' capacity: a recording is
  // replayed at every later length its hint allows.
  const int64_t capacity = static_cast<int64_t>(batch.max_blocks_per_seq) * block_size;
  const int64_t bound = batch.max_seq_len > 0 ? std::min<int64_t>(batch.max_seq_len, capacity) : capacity;
  if (bound > options_.decode_stack_max_context) return false;
  if (options_.decode_stack == DecodeStackMode::Bf16 && !all_bf16(s)) return false;

  if (!decode_stack_params_) decode_stack_params_ = std::make_unique<cuda::DecodeStackParams>();
  cuda::DecodeStackParams& p = *decode_stack_params_;
  p = cuda::DecodeStackParams{};
  // Ring stage size: options_.decode_stack_stage_kb (32 KB by default), larger for a row (the gate and up
  // rows together) that would not fit one (Qwen2.5-7B's 18944-column down projection in BF16).
  int64_t longest = 0;
  auto row_bytes = [](const Linear* l, bool paired) {  // a row (gate + up: both) as stage_geometry counts it
    if (l == nullptr || l->weight.ndim != 2) return int64_t{0};
    cuda::StackMatrix m;
    format_of(*l, m);
    m.k = static_cast<int32_t>(l->weight.dim(1));
    const cuda::stack::Geom g = cuda::stack::stage_geometry(m, paired, 1);
    return int64_t{g.row_bytes} * g.srcs;
  };
  for (const DecodeStackLayer& l : s.layers)
    longest = std::max({longest, row_bytes(l.qkv, false), row_bytes(l.o, false), row_bytes(l.gate_up, true),
                        row_bytes(l.down, false)});
  longest = std::max(longest, row_bytes(s.lm_head, false));
  p.stage_bytes = static_cast<int32_t>(
      std::max<int64_t>(options_.decode_stack_stage_kb * 1024, (longest + 1023) / 1024 * 1024));
  if (p.stage_bytes > 64 * 1024) return false;
  p.skip = options_.decode_stack_skip;
  p.inflight = options_.decode_stack_inflight;
  p.backoff_ns = static_cast<uint32_t>(options_.decode_stack_backoff_ns);
  const int32_t stage = p.stage_bytes;
  const int64_t qkv_rows = (hq + 2 * hkv) * hd;
  int64_t fp8_matrices = 0, int4_matrices = 0;  // the kernel instance: every matrix one format, or mixed
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const DecodeStackLayer& l = s.layers[i];
    cuda::StackLayer& d = p.layers[i];
    if (!stack_matrix(l.qkv, qkv_rows, hidden, false, stage, d.qkv) ||
        !stack_matrix(l.o, hidden, hq * hd, false, stage, d.o) ||
        !stack_matrix(l.gate_up, inter, hidden, true, stage, d.gate_up) ||
        !stack_matrix(l.down, hidden, inter, false, stage, d.down) || !f32_vector(l.attn_norm, hidden) ||
        !f32_vector(l.ffn_norm, hidden) || l.cache == nullptr)
      return false;
    const Tensor& kc = l.cache->k;
    const Tensor& vc = l.cache->v;
    if (kc.dtype != kv || vc.dtype != kv || kc.ndim != 4 || vc.ndim != 4 || kc.dim(0) != num_blocks ||
        kc.dim(1) != block_size || kc.dim(2) != hkv || kc.dim(3) != hd || vc.numel() != kc.numel())
      return false;
    fp8_matrices += d.qkv.fp8 + d.o.fp8 + d.gate_up.fp8 + d.down.fp8;
    int4_matrices += d.qkv.int4 + d.o.int4 + d.gate_up.int4 + d.down.int4;
    d.attn_norm = l.attn_norm->ptr<float>();
    d.ffn_norm = l.ffn_norm->ptr<float>();
    d.k_cache = kc.data;
    d.v_cache = vc.data;
  }
  const int64_t vocab = logits.cols();
  if (!stack_matrix(s.lm_head, vocab, hidden, false, stage, p.lm_head) || !f32_vector(s.final_norm, hidden) ||
      block_size > INT32_MAX)
    return false;

  p.num_layers = static_cast<int32_t>(s.layers.size());
  // The instance for the stack's one weight format, unless it mixes formats (or the generic one is asked
  // for, options_.decode_stack_generic).
  fp8_matrices += p.lm_head.fp8;
  int4_matrices += p.lm_head.int4;
  const int64_t matrices = 4 * static_cast<int64_t>(s.layers.size()) + 1;
  p.format = options_.decode_stack_generic             ? cuda::kStackAnyFormat
             : fp8_matrices == 0 && int4_matrices == 0 ? cuda::kStackBf16
             : fp8_matrices == matrices                ? cuda::kStackFp8
             : int4_matrices == matrices               ? cuda::kStackInt4
                                                       : cuda::kStackAnyFormat;
  p.final_norm = s.final_norm->ptr<float>();
  p.hidden = static_cast<int32_t>(hidden);
  p.hq = static_cast<int32_t>(hq);
  p.hkv = static_cast<int32_t>(hkv);
  p.hd = static_cast<int32_t>(hd);
  p.eps = s.rms_norm_eps;
  p.attn_scale = ap.scale;
  p.window = static_cast<int32_t>(std::min<int64_t>(ap.sliding_window, INT32_MAX));
  p.interleaved = rope.layout == RopeLayout::Interleaved ? 1 : 0;
  copy_inverse_frequencies(rope, p.inv_freq, std::size(p.inv_freq));
  p.kv_fp8 = kv == DType::F8_E4M3 ? 1 : 0;
  p.k_scale = options_.kv_k_scale;
  p.v_scale = options_.kv_v_scale;
  p.num_blocks = num_blocks;
  p.block_size = static_cast<int32_t>(block_size);
  p.batch = {batch.num_tokens, batch.num_seqs,     batch.positions,         batch.query_start,
             batch.seq_lens,   batch.block_tables, batch.max_blocks_per_seq};

  if (options_.decode_stack_kv_tiles) p.kv_maps = decode_stack_kv_maps(p);

  const int64_t max_k = std::max({hidden, hq * hd, inter});
  const size_t smem = cuda::decode_stack_prepare(p, static_cast<int32_t>(max_k));
  if (smem == 0) return false;
  use_device();
  if (smem != decode_stack_smem_) {
    if (capturing_) return false;  // the attribute and occupancy are set up by an eager step
    decode_stack_ctas_ = cuda::decode_stack_ctas_per_sm(smem);
    decode_stack_smem_ = smem;
    if (decode_stack_ctas_ < 1)
      std::fprintf(stderr,
                   "inferx cuda: the persistent decode kernel does not fit an SM (%zu bytes of shared "
                   "memory); batch-1 decode runs the per-op kernels\n",
                   smem);
  }
  if (decode_stack_ctas_ < 1) return false;
  const int grid = sm_count_;
  p.splits = std::clamp(grid / static_cast<int>(hkv), 1, cuda::kMaxStackSplits);
  if (options_.decode_stack_mlp_split) p.mlp_split = prepare_mlp_split(s, p, inter, grid) ? 1 : 0;
  const size_t bytes = cuda::decode_stack_scratch(p, static_cast<int32_t>(inter), nullptr);
  if (capturing_ && bytes > decode_stack_scratch_.bytes) return false;
  cuda::decode_stack_scratch(p, static_cast<int32_t>(inter), scratch(decode_stack_scratch_, bytes));
  p.x = x.ptr<float>();
  p.logits = logits.ptr<float>();

  // options_.decode_stack_profiles: the first that many eager steps print where their time went (stderr).
  std::vector<uint64_t> stamps;
  if (decode_stack_profiles_left_ > 0 && !capturing_) {
    stamps.assign(static_cast<size_t>(grid * cuda::decode_stack_profile_events(p.num_layers)), 0);
    p.profile = static_cast<uint64_t*>(scratch(decode_stack_profile_, stamps.size() * sizeof(uint64_t)));
  }
  embedding(*s.token_embedding, batch.token_ids, 1, x);
  CUDA_CHECK(cuda::launch_decode_stack(p, grid, smem, stream_));
  drop_bf16_copy();
  ++decode_stack_launches_;
  if (p.mlp_split && decode_stack_split_launches_++ == 0)
    std::fprintf(stderr, "inferx cuda: decode stack with the MLP as one phase (mlp_split)\n");
  decode_stack_instance_ = cuda::decode_stack_instance_name(p);
  if (p.profile != nullptr) {
    --decode_stack_profiles_left_;
    CUDA_CHECK(cudaMemcpyAsync(stamps.data(), p.profile, stamps.size() * sizeof(uint64_t),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    print_decode_stack_profile(stamps, grid, p.num_layers);
  }
  return true;
}

}  // namespace inferx
