// CPU matmul driver: out[M, N] = x[M, K] @ W[N, K]^T + bias for every weight type.
//
// 1. Quantized weights: each activation row is quantized once per call into a thread-local workspace
//    (grown on first use, never freed: no allocation on the per-token hot path after warm-up).
// 2. The N output columns (= rows of W) are split into one contiguous range per pool thread, so each
//    thread streams its part of W exactly once for decode (M = 1).
// 3. Within a range, W is walked in tiles sized to stay in L2; for each tile, activation rows are taken
//    kMaxRows at a time and each weight row of the tile is read once per group (prefill reuses the tile
//    from cache instead of memory).
#include "backend/cpu/matmul_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend/cpu/dot_kernels.h"
#include "core/error.h"
#include "quant/gguf_blocks.h"

namespace inferx {

namespace {

enum class ActKind { F32, Q8_0, Q8_K, F8 };

struct TypeKernel {
  cpu::RowKernel kernel;
  ActKind act;
};

TypeKernel kernel_for(DType t) {
  switch (t) {
    case DType::F32:
      return {cpu::dot_f32_rows, ActKind::F32};
    case DType::F16:
      return {cpu::dot_f16_rows, ActKind::F32};
    case DType::BF16:
      return {cpu::dot_bf16_rows, ActKind::F32};
    case DType::Q8_0:
      return {cpu::dot_q8_0_rows, ActKind::Q8_0};
    case DType::Q4_0:
      return {cpu::dot_q4_0_rows, ActKind::Q8_0};
    case DType::Q4_K:
      return {cpu::dot_q4_k_rows, ActKind::Q8_K};
    case DType::Q6_K:
      return {cpu::dot_q6_k_rows, ActKind::Q8_K};
    case DType::F8_E4M3:
      return {cpu::dot_f8_rows, ActKind::F8};
    case DType::INT4:  // the row kernel takes the group scales too: run_range calls dot_int4_rows
      return {nullptr, ActKind::Q8_0};
    default:
      fail("matmul_cpu: weight type {} has no CPU kernel", dtype_name(t));
  }
}

// Quantized activations of the current call. Thread-local to the calling thread: matmul_cpu is called
// by one thread at a time per pool, and the pool's workers only read it during the call.
struct ActivationWorkspace {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
  size_t capacity = 0;

  uint8_t* reserve(size_t bytes) {
    if (bytes > capacity) {
      const size_t rounded = (bytes + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(64, rounded);
      INFERX_CHECK(p != nullptr, "matmul_cpu: out of memory for a {} byte activation workspace", rounded);
      data.reset(static_cast<uint8_t*>(p));
      capacity = rounded;
    }
    return data.get();
  }
};

thread_local ActivationWorkspace t_workspace;

// Everything a worker needs, behind one pointer so the std::function the pool takes stays within its
// small-object buffer (no heap allocation per call).
struct MatmulJob {
  const uint8_t* w;
  int64_t w_row_bytes;
  const void* act;
  int64_t act_stride;
  int64_t m, n, k;
  const float* bias;
  float* out;
  cpu::RowKernel kernel;
  int64_t tile_rows;
  const float* x;
  uint8_t* act_rows;
  ActKind act_kind;
  // F8_E4M3: the weight scale of output column j is col_scale[col_scale_step * j].
  const float* col_scale;
  int64_t col_scale_step;
  // INT4: per-row group scales / zero points (groups_per_row entries per row).
  const uint16_t* group_scale;
  const uint8_t* group_zero;
  int64_t group_size, groups_per_row;
};

void run_range(const MatmulJob& job, int64_t begin, int64_t end) {
  float res[cpu::kMaxRows];
  for (int64_t n0 = begin; n0 < end; n0 += job.tile_rows) {
    const int64_t n1 = std::min(end, n0 + job.tile_rows);
    for (int64_t m0 = 0; m0 < job.m; m0 += cpu::kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(cpu::kMaxRows, job.m - m0));
      const void* act = static_cast<const uint8_t*>(job.act) + m0 * job.act_stride;
      for (int64_t j = n0; j < n1; ++j) {
        if (job.kernel != nullptr) {
          job.kernel(job.w + j * job.w_row_bytes, act, job.act_stride, rows, job.k, res);
        } else {
          const cpu::Int4Row w{job.w + j * job.w_row_bytes, job.group_scale + j * job.groups_per_row,
                               job.group_zero ? job.group_zero + j * job.groups_per_row : nullptr,
                               job.group_size};
          cpu::dot_int4_rows(w, act, job.act_stride, rows, job.k, res);
        }
        const float b = job.bias ? job.bias[j] : 0.0f;
        const float ws = job.col_scale ? job.col_scale[j * job.col_scale_step] : 1.0f;
        for (int r = 0; r < rows; ++r) job.out[(m0 + r) * job.n + j] = res[r] * ws + b;
      }
    }
  }
}

void quantize_rows(const MatmulJob& job, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    void* row = job.act_rows + i * job.act_stride;
    if (job.act_kind == ActKind::Q8_0)
      cpu::quantize_act_q8_0(job.x + i * job.k, job.k, row);
    else if (job.act_kind == ActKind::F8)
      cpu::quantize_act_f8(job.x + i * job.k, job.k, row);
    else
      cpu::quantize_act_q8_k(job.x + i * job.k, job.k, row);
  }
}

thread_local std::vector<float> t_permuted;

// Checks the scale / zero-point tensors of F8_E4M3 and INT4 weights and points the job at them.
void bind_quant_params(const Linear& w, int64_t n, int64_t k, MatmulJob& job) {
  const DType t = w.weight.dtype;
  if (t == DType::F8_E4M3) {
    INFERX_CHECK(w.scale.dtype == DType::F32 && w.scale.data != nullptr &&
                     (w.scale.numel() == 1 || w.scale.numel() == n),
                 "matmul_cpu: F8_E4M3 weight needs an F32 scale of 1 or {} elements, got {} {}", n,
                 dtype_name(w.scale.dtype), w.scale.shape_string());
    job.col_scale = w.scale.ptr<float>();
    job.col_scale_step = w.scale.numel() == 1 ? 0 : 1;
  } else if (t == DType::INT4) {
    const int64_t g = w.group_size;
    INFERX_CHECK((g == 32 || g == 64 || g == 128) && k % g == 0,
                 "matmul_cpu: INT4 group size {} does not divide {} input columns", g, k);
    INFERX_CHECK(w.scale.dtype == DType::F16 && w.scale.data != nullptr && w.scale.numel() == n * (k / g),
                 "matmul_cpu: INT4 weight needs an F16 scale [{}, {}], got {} {}", n, k / g,
                 dtype_name(w.scale.dtype), w.scale.shape_string());
    INFERX_CHECK(w.zero.empty() || (w.zero.dtype == DType::U8 && w.zero.numel() == n * (k / g)),
                 "matmul_cpu: INT4 zero points must be U8 [{}, {}], got {} {}", n, k / g,
                 dtype_name(w.zero.dtype), w.zero.shape_string());
    job.group_scale = w.scale.ptr<uint16_t>();
    job.group_zero = w.zero.empty() ? nullptr : w.zero.ptr<uint8_t>();
    job.group_size = g;
    job.groups_per_row = k / g;
  }
}

// GPTQ act-order: the layer reads x[:, perm[i]] as its column i.
const float* permute_columns(const float* x, int64_t m, int64_t k, const Tensor& perm) {
  INFERX_CHECK(perm.dtype == DType::I32 && perm.numel() == k,
               "matmul_cpu: input_perm must be I32 [{}], got {} {}", k, dtype_name(perm.dtype),
               perm.shape_string());
  t_permuted.resize(static_cast<size_t>(m * k));
  const int32_t* p = perm.ptr<int32_t>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) {
      INFERX_CHECK(p[i] >= 0 && p[i] < k, "matmul_cpu: input_perm[{}] = {} is out of range", i, p[i]);
      t_permuted[static_cast<size_t>(r * k + i)] = x[r * k + p[i]];
    }
  return t_permuted.data();
}

}  // namespace

void matmul_cpu(const float* x, int64_t m, const Linear& w, float* out, ThreadPool& pool) {
  const Tensor& wt = w.weight;
  INFERX_CHECK(wt.ndim == 2 && wt.data != nullptr,
               "matmul_cpu: weight must be a 2-D tensor with data, got {}", wt.shape_string());
  INFERX_CHECK(wt.device == Device::CPU, "matmul_cpu: weight is not in host memory");
  INFERX_CHECK(m >= 0, "matmul_cpu: negative row count {}", m);
  const int64_t n = wt.dim(0), k = wt.dim(1);
  const TypeKernel tk = kernel_for(wt.dtype);
  const int64_t w_row_bytes = row_bytes(wt.dtype, k);  // throws if k is not a whole number of blocks
  const float* bias = nullptr;
  if (!w.bias.empty()) {
    INFERX_CHECK(w.bias.dtype == DType::F32 && w.bias.numel() == n,
                 "matmul_cpu: bias must be F32 with {} elements, got {} {}", n, dtype_name(w.bias.dtype),
                 w.bias.shape_string());
    bias = w.bias.ptr<float>();
  }
  if (m == 0 || n == 0) return;
  INFERX_CHECK(x != nullptr && out != nullptr, "matmul_cpu: null activation or output pointer");

  MatmulJob job{};
  job.w = static_cast<const uint8_t*>(wt.data);
  job.w_row_bytes = w_row_bytes;
  job.m = m;
  job.n = n;
  job.k = k;
  job.bias = bias;
  job.out = out;
  job.kernel = tk.kernel;
  bind_quant_params(w, n, k, job);
  if (!w.input_perm.empty()) x = permute_columns(x, m, k, w.input_perm);
  job.x = x;
  job.act_kind = tk.act;
  // ~256 KB of weights per tile: a quarter of this machine's per-core L2, leaving room for activations.
  job.tile_rows = std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(w_row_bytes, 1));

  const MatmulJob* jp = &job;
  if (tk.act == ActKind::F32) {
    job.act = x;
    job.act_stride = k * static_cast<int64_t>(sizeof(float));
  } else {
    job.act_stride = tk.act == ActKind::Q8_0 ? cpu::act_q8_0_row_bytes(k)
                     : tk.act == ActKind::F8 ? cpu::act_f8_row_bytes(k)
                                             : cpu::act_q8_k_row_bytes(k);
    job.act_rows = t_workspace.reserve(static_cast<size_t>(m * job.act_stride));
    job.act = job.act_rows;
    if (m >= 8)
      pool.parallel_for(
          m, [jp](int64_t b, int64_t e, int) { quantize_rows(*jp, b, e); }, 4);
    else
      quantize_rows(job, 0, m);
  }
  // One contiguous range of output columns per thread; small matmuls stay on the calling thread.
  const int64_t min_rows_per_thread =
      std::max<int64_t>(1, (int64_t{16} << 10) / std::max<int64_t>(w_row_bytes * m, 1));
  pool.parallel_for(
      n, [jp](int64_t b, int64_t e, int) { run_range(*jp, b, e); }, min_rows_per_thread);
}

double dot_reference(DType t, const void* weight_row, const float* x, int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  dequantize_row(t, weight_row, w.data(), n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(w[static_cast<size_t>(i)]) * x[i];
  return s;
}

}  // namespace inferx
