#include "backend/cuda/quantized_gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_quant.h"
#include "core/error.h"

namespace inferx::cuda {
namespace {

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

DequantWeight dequant_weight(const Linear& w) {
  DequantWeight d;
  d.dtype = w.weight.dtype;
  d.data = w.weight.data;
  d.k = w.in_features();
  if (d.dtype == DType::F8_E4M3) {
    d.fp8_scale = static_cast<const float*>(w.scale.data);
    d.per_channel = w.scale.numel() > 1;
  } else if (d.dtype == DType::INT4) {
    d.int4_scale = static_cast<const uint16_t*>(w.scale.data);
    d.int4_zero = w.zero.empty() ? nullptr : static_cast<const uint8_t*>(w.zero.data);
    d.group = w.group_size;
  }
  return d;
}

}  // namespace

QuantizedGemm::QuantizedGemm(cudaStream_t stream) : stream_(stream), lt_(stream) {
  if (const char* v = std::getenv("INFERX_CUDA_FP8_OUTER_SCALE")) outer_scale_ = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("INFERX_CUDA_FP8_ACC")) bf16_acc_ = std::strcmp(v, "f32") != 0;
  if (const char* v = std::getenv("INFERX_CUDA_FP8_FUSE")) fused_passes_ = std::strcmp(v, "0") != 0;
  if (const char* v = std::getenv("INFERX_CUDA_FP8_DEFER")) deferred_ = std::strcmp(v, "0") != 0;
}

QuantizedGemm::~QuantizedGemm() = default;

bool QuantizedGemm::supports(const Linear& w) {
  const Tensor& t = w.weight;
  if (t.ndim != 2 || t.device != Device::CUDA || t.data == nullptr) return false;
  const int64_t n = w.out_features(), k = w.in_features();
  if (n <= 0 || k <= 0) return false;
  switch (t.dtype) {
    case DType::F8_E4M3:
      // Any K: cuBLASLt FP8 needs K a multiple of 16 (fp8_gemm_shape), other shapes (stories260K's
      // down_proj, K = 172) run their W8A8 values through BF16 (dequant_matmul).
      return w.scale.dtype == DType::F32 && w.scale.data != nullptr &&
             (w.scale.numel() == 1 || w.scale.numel() == n) && w.input_perm.empty();
    case DType::INT4: {
      const int64_t g = w.group_size;
      if (!(g == 32 || g == 64 || g == 128) || k % g != 0) return false;
      const int64_t groups = k / g;
      if (w.scale.dtype != DType::F16 || w.scale.data == nullptr || w.scale.numel() != n * groups)
        return false;
      if (!w.zero.empty() && (w.zero.dtype != DType::U8 || w.zero.numel() != n * groups)) return false;
      return w.input_perm.empty() || (w.input_perm.dtype == DType::I32 && w.input_perm.numel() == k);
    }
    case DType::Q8_0:
      return k % 32 == 0 && w.scale.empty() && w.input_perm.empty();
    case DType::Q4_K:
      return k % 256 == 0 && w.scale.empty() && w.input_perm.empty();
    default:
      return false;
  }
}

bool QuantizedGemm::try_run(LtMatmul::Plan& plan, const LtOperands& ops) {
  const cublasStatus_t status = lt_.run(plan, ops);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    std::fprintf(stderr,
                 "inferx cuda: cuBLASLt refused an FP8 GEMM its heuristic offered (%s); falling back\n",
                 cublasLtGetStatusString(status));
    LtMatmul::disable(plan);
    return false;
  }
  CUBLAS_CHECK(status);
  return true;
}

void QuantizedGemm::matmul(const float* x, int64_t t, const Linear& w, float* out,
                           const std::function<void*(size_t)>& workspace) {
  INFERX_CHECK(supports(w), "cuda backend: the quantized GEMM does not take a {} weight {} (scale {} {})",
               dtype_name(w.weight.dtype), w.weight.shape_string(), dtype_name(w.scale.dtype),
               w.scale.shape_string());
  if (t <= 0) return;
  // Evicted here, between calls: a call holds pointers to the (at most a few) plans it looks up.
  lt_.evict_if_full();
  if (w.weight.dtype == DType::F8_E4M3 && !force_dequant_) {
    fp8_matmul(x, t, w, out, workspace);
    return;
  }
  dequant_matmul(x, t, w, out, workspace);
}

namespace {

// cuBLASLt's FP8 kernels want M (our output features) and K multiples of 16 and 16-byte aligned operands
// (as PyTorch's _scaled_mm checks); d null: an output in scratch (256-byte aligned).
bool fp8_gemm_shape(const Linear& w, const void* d) {
  return w.out_features() % 16 == 0 && w.in_features() % 16 == 0 && pointer_alignment(w.weight.data) >= 16 &&
         pointer_alignment(d) >= 16;
}

}  // namespace

QuantizedGemm::Fp8Input QuantizedGemm::reserve_input(int64_t t, int64_t k, size_t extra_bytes,
                                                     const std::function<void*(size_t)>& workspace) {
  const size_t q_bytes = round_up(static_cast<size_t>(t * k)), s_bytes = round_up(static_cast<size_t>(t) * 4);
  auto* ws = static_cast<char*>(workspace(q_bytes + s_bytes + extra_bytes));
  return Fp8Input{reinterpret_cast<uint8_t*>(ws), reinterpret_cast<float*>(ws + q_bytes),
                  ws + q_bytes + s_bytes};
}

QuantizedGemm::Fp8Input QuantizedGemm::quantize_input(const float* x, int64_t t, int64_t k,
                                                      size_t extra_bytes,
                                                      const std::function<void*(size_t)>& workspace) {
  const Fp8Input in = reserve_input(t, k, extra_bytes, workspace);
  CUDA_CHECK(launch_quantize_fp8_rows(x, t, k, in.codes, in.scales, nullptr, stream_));
  return in;
}

LtMatmul::Plan* QuantizedGemm::fp8_plan(const Linear& w, const Fp8Input& in, int64_t t, void* d, bool d_bf16,
                                        LtOperands& ops) {
  const int64_t n = w.out_features();
  ops = LtOperands{w.weight.data, in.codes, d, nullptr, nullptr, nullptr};
  return lt_.plan(lt_shape(CUDA_R_8F_E4M3, n, t, w.in_features(), n, ops, d_bf16 ? CUDA_R_16BF : CUDA_R_32F),
                  ops);
}

bool QuantizedGemm::plain_fp8_gemm(const Linear& w, const Fp8Input& in, int64_t t, void* d, bool d_bf16) {
  LtOperands ops;
  LtMatmul::Plan* plan = fp8_plan(w, in, t, d, d_bf16, ops);
  return plan != nullptr && try_run(*plan, ops);
}

namespace {

Fp8Epilogue epilogue_for(Fp8Epilogue e, const void* acc, bool acc_bf16, int64_t t, const Linear& w,
                         const float* x_scales) {
  e.acc = acc;
  e.acc_bf16 = acc_bf16;
  e.t = t;
  e.n = w.out_features();
  e.x_scale = x_scales;
  e.w_scale = static_cast<const float*>(w.scale.data);
  e.per_channel = w.scale.numel() > 1;
  e.bias = w.bias.empty() ? nullptr : w.bias.ptr<float>();
  return e;
}

}  // namespace

void QuantizedGemm::scale_epilogue(Fp8Epilogue e, const void* acc, bool acc_bf16, int64_t t, const Linear& w,
                                   const float* x_scales) {
  CUDA_CHECK(launch_fp8_epilogue(epilogue_for(e, acc, acc_bf16, t, w, x_scales), stream_));
}

void QuantizedGemm::fp8_matmul(const float* x, int64_t t, const Linear& w, float* out,
                               const std::function<void*(size_t)>& workspace) {
  const int64_t n = w.out_features(), k = w.in_features();
  // Shapes the FP8 kernels do not take, or no FP8 kernel offered: the same W8A8 values run in BF16.
  if (!fp8_gemm_shape(w, out)) {
    dequant_matmul(x, t, w, out, workspace);
    return;
  }
  // Quantized before the plans are looked up: a new plan's algorithm is timed on the real operands.
  // With the BF16 accumulator the GEMM writes scratch (half the bytes of out) and the epilogue writes out.
  const Fp8Input in = quantize_input(x, t, k, bf16_acc_ ? static_cast<size_t>(t * n) * 2 : 0, workspace);
  // With the BF16 accumulator every FP8 product rounds its unscaled sum (the CPU backend's reference rounds
  // the same sums): the scales are applied after, not inside the GEMM.
  if (outer_scale_ && !bf16_acc_) {
    // Per-row activation scale x per-channel (or per-tensor) weight scale, applied inside the GEMM.
    const LtOperands ops{w.weight.data, in.codes, out, nullptr, w.scale.data, in.scales};
    LtShape scaled_shape = lt_shape(CUDA_R_8F_E4M3, n, t, k, n, ops);
    scaled_shape.a_scale = w.scale.numel() > 1 ? LtScale::OuterVector : LtScale::Scalar;
    scaled_shape.b_scale = LtScale::OuterVector;
    LtMatmul::Plan* scaled = lt_.plan(scaled_shape, ops);
    if (scaled != nullptr && try_run(*scaled, ops)) {
      if (!w.bias.empty()) CUDA_CHECK(launch_add_bias(out, w.bias.ptr<float>(), t, n, stream_));
      last_path_ = Path::Fp8OuterScale;
      return;
    }
  }
  void* acc = bf16_acc_ ? in.extra : out;  // F32: in place
  if (plain_fp8_gemm(w, in, t, acc, bf16_acc_)) {
    Fp8Epilogue e;
    e.out[0] = out;
    e.cols[0] = n;
    scale_epilogue(e, acc, bf16_acc_, t, w, in.scales);
    last_path_ = Path::Fp8;
    return;
  }
  dequant_matmul(x, t, w, out, workspace);
}

bool QuantizedGemm::matmul_deferred(const float* x, int64_t t, const Linear& w, float* out, const Hold& hold,
                                    const std::function<void*(size_t)>& workspace) {
  if (t <= 0 || !defers() || pending_.acc || !fp8_takes(w) || !fp8_gemm_shape(w, hold.acc)) return false;
  lt_.evict_if_full();
  const int64_t n = w.out_features(), k = w.in_features();
  Fp8Input in = reserve_input(t, k, 0, workspace);
  in.scales = hold.scales;  // read by the consumer's norm, after the next call reused the workspace
  // Quantized first, as fp8_matmul: a new plan's algorithm is timed on the real operands. Refused: only
  // scratch and the hold were written.
  CUDA_CHECK(launch_quantize_fp8_rows(x, t, k, in.codes, in.scales, nullptr, stream_));
  if (!plain_fp8_gemm(w, in, t, hold.acc, true)) return false;
  Fp8Epilogue d;
  d.out[0] = out;
  d.cols[0] = n;
  pending_ = epilogue_for(d, hold.acc, true, t, w, in.scales);
  last_path_ = Path::Fp8;
  return true;
}

void QuantizedGemm::finish_pending() {
  if (pending_.acc == nullptr) return;
  const Fp8Epilogue e = pending_;
  pending_ = {};
  CUDA_CHECK(launch_fp8_epilogue(e, stream_));
}

bool QuantizedGemm::fp8_takes(const Linear& w) const {
  return w.weight.dtype == DType::F8_E4M3 && !force_dequant_ && supports(w) && fp8_gemm_shape(w, nullptr);
}

QuantizedGemm::Fused QuantizedGemm::fp8_first_gemm(const Fp8Source& src, int64_t t, const Linear& w,
                                                   size_t after_acc,
                                                   const std::function<void*(size_t)>& workspace,
                                                   Fp8Input& in, size_t& acc_bytes) {
  const int64_t k = w.in_features();
  const NormInput* norm = src.norm;
  const Fp8Epilogue* product = norm && norm->add_pending ? pending() : nullptr;
  if (t <= 0 || !fp8_takes(w) || (norm && norm->add_pending && (!product || norm->add || product->t != t)) ||
      (norm &&
       (!fused_passes_ || !fp8_norm_quantize_takes(norm->residual, norm->add, norm->norm, k, product))))
    return Fused::No;
  lt_.evict_if_full();
  acc_bytes = round_up(static_cast<size_t>(t * w.out_features()) * (bf16_acc_ ? 2 : 4));
  in = reserve_input(t, k, acc_bytes + after_acc, workspace);
  // The plan first (timing a new one runs the GEMM on these operands: scratch only).
  LtOperands ops;
  LtMatmul::Plan* plan = fp8_plan(w, in, t, in.extra, bf16_acc_, ops);
  if (plan == nullptr) return Fused::No;
  if (norm) {
    CUDA_CHECK(launch_norm_quantize_fp8_rows(norm->residual, norm->add, norm->norm, norm->eps, t, k, in.codes,
                                             in.scales, stream_, product));
    pending_ = {};  // the norm took it (launched with a copy of it)
  } else {
    CUDA_CHECK(launch_quantize_fp8_rows(src.x, t, k, in.codes, in.scales, nullptr, stream_));
  }
  if (try_run(*plan, ops)) return Fused::Done;
  if (!norm) return Fused::No;
  // The residual is updated; the caller runs the products on h (the add is done).
  CUDA_CHECK(launch_rmsnorm(norm->residual, norm->norm, norm->eps, t, k, norm->h, nullptr, stream_));
  return Fused::InputOnly;
}

QuantizedGemm::Fused QuantizedGemm::fp8_fused(const Fp8Source& src, int64_t t, const Linear& w, Fp8Epilogue e,
                                              const std::function<void*(size_t)>& workspace, bool defer) {
  Fp8Input in{};
  size_t acc_bytes = 0;
  const Fused r = fp8_first_gemm(src, t, w, 0, workspace, in, acc_bytes);
  if (r != Fused::Done) return r;
  if (defer && defers() && !pending_.acc) {
    pending_ = epilogue_for(e, in.extra, true, t, w, in.scales);
  } else {
    scale_epilogue(e, in.extra, bf16_acc_, t, w, in.scales);
  }
  last_path_ = src.norm ? Path::Fp8NormFused : Path::Fp8Fused;
  return Fused::Done;
}

bool QuantizedGemm::split_epilogue(const Linear& w, float* const* outs, const int64_t* cols, int num_outs,
                                   Fp8Epilogue& e) {
  if (num_outs < 1 || num_outs > 3) return false;
  e.num_outs = num_outs;
  int64_t total = 0;
  for (int j = 0; j < num_outs; ++j) {
    e.out[j] = outs[j];
    e.cols[j] = cols[j];
    total += cols[j];
  }
  INFERX_CHECK(total == w.out_features(), "cuda backend: split FP8 matmul outputs of {} columns for W {}",
               total, w.weight.shape_string());
  return true;
}

bool QuantizedGemm::matmul_split(const float* x, int64_t t, const Linear& w, float* const* outs,
                                 const int64_t* cols, int num_outs,
                                 const std::function<void*(size_t)>& workspace) {
  Fp8Epilogue e;
  return split_epilogue(w, outs, cols, num_outs, e) &&
         fp8_fused({x, nullptr}, t, w, e, workspace) == Fused::Done;
}

bool QuantizedGemm::matmul_silu_mul(const float* x, int64_t t, const Linear& w, float* out,
                                    const std::function<void*(size_t)>& workspace) {
  if (w.out_features() % 2 != 0) return false;
  Fp8Epilogue e;
  e.silu = true;
  e.out[0] = out;
  return fp8_fused({x, nullptr}, t, w, e, workspace) == Fused::Done;
}

QuantizedGemm::Fused QuantizedGemm::norm_matmul_split(const NormInput& in, int64_t t, const Linear& w,
                                                      float* const* outs, const int64_t* cols, int num_outs,
                                                      const std::function<void*(size_t)>& workspace,
                                                      bool defer_split) {
  Fp8Epilogue e;
  if (!split_epilogue(w, outs, cols, num_outs, e)) return Fused::No;
  return fp8_fused({nullptr, &in}, t, w, e, workspace, defer_split);
}

QuantizedGemm::Fused QuantizedGemm::norm_mlp(const NormInput& in, int64_t t, const Linear& gate_up,
                                             const Linear& down, float* act, float* out,
                                             const std::function<void*(size_t)>& workspace,
                                             const Hold* defer_down) {
  const int64_t n2 = gate_up.out_features(), f = n2 / 2;
  Fp8Epilogue silu;
  silu.silu = true;
  silu.n = n2;
  if (n2 % 2 != 0 || down.in_features() != f || !fp8_takes(down) || !fp8_gemm_shape(down, out) ||
      !fp8_silu_quantize_takes(silu))
    return Fused::No;
  // After the gate/up product: act's codes and scales, then (BF16 accumulator) the down product's sums.
  const size_t act_codes_bytes = round_up(static_cast<size_t>(t * f)),
               act_scales_bytes = round_up(static_cast<size_t>(t) * 4),
               down_acc_bytes = bf16_acc_ ? round_up(static_cast<size_t>(t * down.out_features()) * 2) : 0;
  Fp8Input x{};
  size_t acc_bytes = 0;
  const Fused r =
      fp8_first_gemm({nullptr, &in}, t, gate_up, act_codes_bytes + act_scales_bytes + down_acc_bytes,
                     workspace, x, acc_bytes);
  if (r != Fused::Done) return r;
  auto* act_codes = static_cast<uint8_t*>(x.extra) + acc_bytes;
  // Deferred: the down product's sums and its input's row scales go to the hold (read by the next norm).
  const bool defer = defer_down && defers() && !pending_.acc && pointer_alignment(defer_down->acc) >= 16;
  const Fp8Input a{
      act_codes, defer ? defer_down->scales : reinterpret_cast<float*>(act_codes + act_codes_bytes), nullptr};
  CUDA_CHECK(launch_fp8_silu_quantize(epilogue_for(silu, x.extra, bf16_acc_, t, gate_up, x.scales), a.codes,
                                      a.scales, stream_));
  // The down plan only now: timing a new plan writes its output, which may be the norm's `add`. With the
  // BF16 accumulator the sums go to scratch and round as fp8_matmul's do.
  void* down_acc = defer       ? defer_down->acc
                   : bf16_acc_ ? static_cast<void*>(act_codes + act_codes_bytes + act_scales_bytes)
                               : out;
  LtOperands down_ops;
  LtMatmul::Plan* down_plan = fp8_plan(down, a, t, down_acc, bf16_acc_, down_ops);
  if (down_plan == nullptr || !try_run(*down_plan, down_ops)) {
    // act's W8A8 values (they quantize back to the same codes), then the unfused product.
    CUDA_CHECK(launch_dequantize_fp8_rows(a.codes, a.scales, t, f, act, stream_));
    matmul(act, t, down, out, workspace);
    return Fused::Done;
  }
  Fp8Epilogue e;
  e.out[0] = out;
  e.cols[0] = down.out_features();
  if (defer) {
    pending_ = epilogue_for(e, down_acc, true, t, down, a.scales);
  } else {
    scale_epilogue(e, down_acc, bf16_acc_, t, down, a.scales);
  }
  last_path_ = Path::Fp8NormFused;
  return Fused::Done;
}

void QuantizedGemm::dequant_matmul(const float* x, int64_t t, const Linear& w, float* out,
                                   const std::function<void*(size_t)>& workspace) {
  const int64_t n = w.out_features(), k = w.in_features();
  const bool fp8 = w.weight.dtype == DType::F8_E4M3;
  int64_t tile = std::max<int64_t>(1, static_cast<int64_t>(tile_bytes_ / static_cast<size_t>(k * 2)));
  if (tile >= 128) tile = tile / 128 * 128;  // whole output tiles of the GEMM
  tile = std::min(tile, n);
  const size_t x_bytes = round_up(static_cast<size_t>(t * k) * 2);
  const size_t s_bytes = fp8 ? round_up(static_cast<size_t>(t) * 4) : 0;
  auto* ws = static_cast<char*>(workspace(x_bytes + s_bytes + static_cast<size_t>(tile * k) * 2));
  void* xb = ws;
  void* wt = ws + x_bytes + s_bytes;
  if (fp8) {  // W8A8 semantics: the activations rounded to E4M3 per row, then to BF16
    CUDA_CHECK(
        launch_quantize_fp8_rows(x, t, k, nullptr, reinterpret_cast<float*>(ws + x_bytes), xb, stream_));
  } else {
    CUDA_CHECK(launch_activations_bf16(
        x, w.input_perm.empty() ? nullptr : static_cast<const int32_t*>(w.input_perm.data), t, k, xb,
        stream_));
  }
  const DequantWeight dw = dequant_weight(w);
  for (int64_t n0 = 0; n0 < n; n0 += tile) {
    const int64_t rows = std::min(tile, n - n0);
    CUDA_CHECK(launch_dequantize_rows_bf16(dw, n0, rows, wt, stream_));
    const LtOperands ops{wt, xb, out + n0, nullptr, nullptr, nullptr};
    LtMatmul::Plan* plan = lt_.plan(lt_shape(CUDA_R_16BF, rows, t, k, n, ops), ops);
    INFERX_CHECK(plan != nullptr, "cuda backend: cuBLASLt offers no BF16 algorithm for [{}, {}] x [{}, {}]^T",
                 t, k, rows, k);
    CUBLAS_CHECK(lt_.run(*plan, ops));
  }
  if (!w.bias.empty()) CUDA_CHECK(launch_add_bias(out, w.bias.ptr<float>(), t, n, stream_));
  last_path_ = fp8 ? Path::Fp8ViaBf16 : Path::Dequant;
}

}  // namespace inferx::cuda
