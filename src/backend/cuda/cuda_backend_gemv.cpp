// CudaBackend's GEMV path (kernels_gemv.h): BF16 products of one activation row (decode at batch 1), and
// any product whose weight format cuBLASLt cannot take (FP8 with our scales, INT4, Q8_0, Q4_K: these go
// through the GEMV in chunks of kGemvMaxRows rows unless the quantized GEMM of matmul's earlier branch
// takes them), and the fused projections (one launch for q/k/v, one for silu(gate) * up); products the
// GEMV does not take run the fused weights as row slices (Backend's defaults). Also the fused residual
// add + RMSNorm (matmul_add_rmsnorm) and the pending tensor it leaves (cuda_backend.h).
#include <algorithm>
#include <utility>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_gemv.h"
#include "backend/cuda/quantized_gemm.h"
#include "core/error.h"

namespace inferx {

namespace {

bool gemv_format(const Linear& w) {
  const Tensor& t = w.weight;
  switch (t.dtype) {
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_K:
      return w.scale.empty();
    case DType::F8_E4M3:
      return w.scale.dtype == DType::F32 && (w.scale.numel() == 1 || w.scale.numel() == w.out_features());
    case DType::INT4:
      return w.scale.dtype == DType::F16 && w.scale.numel() * w.group_size == t.numel() &&
             (w.zero.empty() || (w.zero.dtype == DType::U8 && w.zero.numel() == w.scale.numel()));
    default:
      return false;
  }
}

cuda::GemvWeight gemv_weight(const Linear& w) {
  cuda::GemvWeight g;
  g.dtype = w.weight.dtype;
  g.data = w.weight.data;
  g.scale = w.scale.empty() ? nullptr : w.scale.data;
  g.per_channel = w.weight.dtype == DType::F8_E4M3 && w.scale.numel() > 1;
  g.zero = w.zero.empty() ? nullptr : static_cast<const uint8_t*>(w.zero.data);
  g.group = w.group_size;
  return g;
}

void check_out(const Tensor& x, const Tensor& out, const char* what) {
  INFERX_CHECK(out.device == Device::CUDA && out.dtype == DType::F32 && out.rows() == x.rows(),
               "cuda backend: {} output {} {} must be F32 with {} rows", what, dtype_name(out.dtype),
               out.shape_string(), x.rows());
}

}  // namespace

bool CudaBackend::gemv_takes(const Tensor& x, const Linear& w) const {
  // BF16: one row only. Measured on the H200 (bench_cuda_kernels, graph-launched, 4096x4096): GEMV 12.6
  // us at M=1 against cuBLASLt's 14.3, but 31.5 us at M=4 and 73 us at M=16 against 13.6 / 14.4 (each
  // weight load is matched by M loads of x from L1, which then bounds it). Other float types: cuBLASLt.
  const DType t = w.weight.dtype;
  const bool cublas_takes = t == DType::F32 || t == DType::F16 || t == DType::BF16;
  if (cublas_takes && (!options_.gemv || t != DType::BF16 || x.rows() > 1)) return false;
  if (t == DType::BF16 && w.in_features() > 8192 && !options_.gemv_long_rows) return false;  // see the option
  // Prefill-sized products of quantized weights (fused parts too) go to the quantized GEMM.
  if (!cublas_takes && cuda::QuantizedGemm::supports(w) && cuda::QuantizedGemm::prefers_fused(w, x.rows()))
    return false;
  return gemv_format(w) && cuda::gemv_supports(w.weight.dtype, w.in_features(), w.group_size) &&
         cuda::gemv_aligned(w.weight.dtype, w.weight.data) &&
         (w.input_perm.empty() || (w.input_perm.dtype == DType::I32 && w.input_perm.numel() == x.cols()));
}

const void* CudaBackend::gemv_input(const Tensor& x, const Linear& w, cuda::GemvNorm& norm) {
  if (pending_norm_is(x)) {  // the lazily normalised input: its BF16 values, the row scale in the product
    norm.in_sumsq = pending_norm_.sumsq;
    norm.in_eps = pending_norm_.eps;
    if (w.input_perm.empty()) return pending_norm_.x;
    void* buf = scratch(gemv_x_, static_cast<size_t>(x.numel()) * 2);
    CUDA_CHECK(cuda::launch_gemv_prepare_x(pending_norm_.x, true, w.input_perm.ptr<int32_t>(), x.rows(),
                                           x.cols(), buf, stream_));
    return buf;
  }
  settle_norm({&x});
  const bool from_copy = has_bf16_copy(x);
  if (from_copy && w.input_perm.empty()) return shadow_.data;
  INFERX_CHECK(from_copy || x.dtype == DType::F32, "cuda backend: matmul input must be F32, got {}",
               dtype_name(x.dtype));
  void* buf = scratch(gemv_x_, static_cast<size_t>(x.numel()) * 2);
  CUDA_CHECK(cuda::launch_gemv_prepare_x(from_copy ? shadow_.data : x.data, from_copy,
                                         w.input_perm.empty() ? nullptr : w.input_perm.ptr<int32_t>(),
                                         x.rows(), x.cols(), buf, stream_));
  return buf;
}

void CudaBackend::run_gemv(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) {
  INFERX_CHECK(!outs.empty() && outs.size() <= static_cast<size_t>(cuda::kGemvMaxOutputs),
               "cuda backend: a split matmul has 1 to {} outputs, got {}", cuda::kGemvMaxOutputs,
               outs.size());
  cuda::GemvOutput o[cuda::kGemvMaxOutputs];
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    check_out(x, *outs[i], "matmul");
    o[i] = {outs[i]->ptr<float>(), outs[i]->cols(), outs[i]->cols()};
    total += outs[i]->cols();
  }
  INFERX_CHECK(total == w.out_features(), "cuda backend: split matmul outputs of {} columns for W {}", total,
               w.weight.shape_string());
  cuda::GemvNorm norm;
  const void* xb = gemv_input(x, w, norm);
  CUDA_CHECK(cuda::launch_gemv(gemv_weight(w), xb, x.rows(), x.cols(),
                               w.bias.empty() ? nullptr : w.bias.ptr<float>(), o,
                               static_cast<int>(outs.size()), stream_, &norm));
  last_matmul_bf16_ = true;  // the norms / SiLU then write the BF16 copies this path reads
  for (Tensor* out : outs) {
    drop_bf16_copy_if_overlaps(*out);
    settle_norm({}, {out});
  }
}

void CudaBackend::matmul_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) {
  INFERX_CHECK(
      x.device == Device::CUDA && x.dtype == DType::F32 && w.weight.ndim == 2 && x.cols() == w.in_features(),
      "cuda backend: split matmul of x {} {} with W {}", dtype_name(x.dtype), x.shape_string(),
      w.weight.shape_string());
  if (w.weight.device != Device::CUDA || outs.size() > static_cast<size_t>(cuda::kGemvMaxOutputs) ||
      !gemv_takes(x, w)) {
    settle_norm({&x});  // the outputs: settled by the ops below
    if (!fused_quantized_split(x, w, outs)) Backend::matmul_split(x, w, outs);
    return;
  }
  if (!w.bias.empty())
    INFERX_CHECK(w.bias.dtype == DType::F32 && w.bias.numel() == w.out_features(),
                 "cuda backend: matmul bias {} for {} outputs", w.bias.shape_string(), w.out_features());
  use_device();
  run_gemv(x, w, outs);
}

void CudaBackend::matmul_silu_mul(const Tensor& x, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) {
  INFERX_CHECK(x.device == Device::CUDA && x.dtype == DType::F32 && w.weight.ndim == 2 &&
                   x.cols() == w.in_features() && w.out_features() % 2 == 0,
               "cuda backend: gate/up matmul of x {} {} with W {}", dtype_name(x.dtype), x.shape_string(),
               w.weight.shape_string());
  const int64_t f = w.out_features() / 2;
  if (w.weight.device != Device::CUDA || !gemv_takes(x, w)) {
    settle_norm({&x}, {&gate, &up, &out});
    if (!fused_quantized_silu_mul(x, w, out) && !stacked_silu_mul(x, w, out))
      Backend::matmul_silu_mul(x, w, gate, up, out);
    return;
  }
  check_out(x, out, "gate/up");
  INFERX_CHECK(out.cols() == f && out.numel() == x.rows() * f, "cuda backend: gate/up output {} for W {}",
               out.shape_string(), w.weight.shape_string());
  if (!w.bias.empty())
    INFERX_CHECK(w.bias.dtype == DType::F32 && w.bias.numel() == w.out_features(),
                 "cuda backend: matmul bias {} for {} outputs", w.bias.shape_string(), w.out_features());
  use_device();
  cuda::GemvNorm norm;
  const void* xb = gemv_input(x, w, norm);  // may be shadow_: the product's own copy goes to gemv_out_
  settle_norm({}, {&out});
  void* ob = options_.bf16_activations ? scratch(gemv_out_, static_cast<size_t>(out.numel()) * 2) : nullptr;
  CUDA_CHECK(cuda::launch_gemv_silu_mul(gemv_weight(w), xb, x.rows(), x.cols(), f,
                                        w.bias.empty() ? nullptr : w.bias.ptr<float>(), out.ptr<float>(), ob,
                                        stream_, &norm));
  last_matmul_bf16_ = true;
  if (ob) {
    adopt_bf16_copy(out);
  } else {
    drop_bf16_copy();
  }
}

// FP8 weights at prefill sizes (QuantizedGemm::prefers_fused): the fused projection as one FP8 GEMM over the
// stacked weight + one epilogue (quantized_gemm.h); false when that path does not take it.
bool CudaBackend::fused_quantized_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) {
  if (w.weight.device != Device::CUDA || outs.empty() || outs.size() > 3 ||
      !cuda::QuantizedGemm::supports(w) || !cuda::QuantizedGemm::prefers_fused(w, x.rows()))
    return false;
  float* ptrs[3];
  int64_t cols[3];
  for (size_t j = 0; j < outs.size(); ++j) {
    check_out(x, *outs[j], "split matmul");
    ptrs[j] = outs[j]->ptr<float>();
    cols[j] = outs[j]->cols();
  }
  use_device();
  if (!qgemm_->matmul_split(x.ptr<float>(), x.rows(), w, ptrs, cols, static_cast<int>(outs.size()),
                            [this](size_t bytes) { return scratch(qgemm_ws_, bytes); }))
    return false;
  last_matmul_bf16_ = false;  // it reads F32 activations
  for (Tensor* out : outs) drop_bf16_copy_if_overlaps(*out);
  return true;
}

bool CudaBackend::fused_quantized_silu_mul(const Tensor& x, const Linear& w, Tensor& out) {
  if (w.weight.device != Device::CUDA || !cuda::QuantizedGemm::supports(w) ||
      !cuda::QuantizedGemm::prefers_fused(w, x.rows()))
    return false;
  check_out(x, out, "gate/up");
  INFERX_CHECK(out.cols() * 2 == w.out_features() && out.numel() == x.rows() * out.cols(),
               "cuda backend: gate/up output {} for W {}", out.shape_string(), w.weight.shape_string());
  use_device();
  if (!qgemm_->matmul_silu_mul(x.ptr<float>(), x.rows(), w, out.ptr<float>(),
                               [this](size_t bytes) { return scratch(qgemm_ws_, bytes); }))
    return false;
  last_matmul_bf16_ = false;
  drop_bf16_copy_if_overlaps(out);
  return true;
}

// Prefill-sized MLP products with BF16 weights: one GEMM over the stacked [gate; up] weight writes BF16
// (half the bytes of the two F32 products it replaces, which the SiLU kernel then read back), and the SiLU
// kernel reads that and writes out plus the BF16 copy the down projection reads. On the 8B shape at 8192
// rows that is ~1.4 GB less memory traffic per layer (computed from the shapes, not measured alone).
// Bias-free weights only (cuBLASLt's bias epilogue with a BF16 output is not relied on); others take the
// default (two F32 products, then silu_mul).
bool CudaBackend::stacked_silu_mul(const Tensor& x, const Linear& w, Tensor& out) {
  const int64_t t = x.rows(), f = w.out_features() / 2;
  if (!options_.bf16_activations || w.weight.dtype != DType::BF16 || !w.bias.empty() ||
      !w.input_perm.empty() || t < 2)
    return false;
  check_out(x, out, "gate/up");
  INFERX_CHECK(out.cols() == f && out.numel() == t * f, "cuda backend: gate/up output {} for W {}",
               out.shape_string(), w.weight.shape_string());
  use_device();
  const bool from_copy = has_bf16_copy(x);
  void* gu = scratch(gate_up_bf16_, static_cast<size_t>(t * 2 * f) * 2);
  gemm_->matmul(from_copy ? shadow_.data : x.data, from_copy ? DType::BF16 : DType::F32, t, x.cols(),
                DType::BF16, w.weight.data, 2 * f, nullptr, gu, DType::BF16);
  void* ob = scratch(gemv_out_, static_cast<size_t>(t * f) * 2);
  CUDA_CHECK(cuda::launch_silu_mul_stacked_bf16(gu, t, f, out.ptr<float>(), ob, stream_));
  last_matmul_bf16_ = true;
  adopt_bf16_copy(out);
  return true;
}

void CudaBackend::copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  use_device();
  drop_bf16_copy();
  settle_norm_range(src, bytes, true);
  settle_norm_range(dst, bytes, false);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

// Fused residual add + RMSNorm (cuda_backend.h) -------------------------------------------------------

namespace {

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
bool overlaps(const Tensor& a, const Tensor& b) { return overlaps(a.data, a.nbytes(), b.data, b.nbytes()); }

bool is_cuda_f32(const Tensor& t) { return t.device == Device::CUDA && t.dtype == DType::F32; }

// Partial-sum sets of up to kGemvMaxRows rows in norm_sums_: 512 sets (1 MiB) cover 256 layers per pass.
constexpr int kNormSets = 512;
constexpr size_t kNormSetFloats = static_cast<size_t>(cuda::kGemvMaxRows) * cuda::kGemvNormSlots;

}  // namespace

void CudaBackend::matmul_add_rmsnorm(const Tensor& a, const Linear& w, Tensor& residual, const Tensor& weight,
                                     float eps, Tensor& proj, Tensor& out) {
  const int64_t t = a.rows(), d = w.out_features();
  const bool shapes = is_cuda_f32(a) && is_cuda_f32(residual) && is_cuda_f32(out) && is_cuda_f32(weight) &&
                      w.weight.device == Device::CUDA && w.weight.ndim == 2 && a.cols() == w.in_features() &&
                      t >= 1 && residual.rows() == t && residual.cols() == d && residual.numel() == t * d &&
                      out.rows() == t && out.cols() == d && out.numel() == t * d && proj.rows() == t &&
                      proj.cols() == d && weight.numel() == d &&
                      (w.bias.empty() || (w.bias.dtype == DType::F32 && w.bias.numel() == d));
  // The fused form needs the GEMV (decode sizes) and distinct tensors; everything else composes.
  if (!shapes || !options_.gemv || !options_.fused_norm || !options_.bf16_activations ||
      options_.timing_skip != 0 || t > cuda::kGemvMaxRows || !gemv_takes(a, w) || overlaps(out, residual) ||
      overlaps(out, a) || overlaps(residual, a)) {
    Backend::matmul_add_rmsnorm(a, w, residual, weight, eps, proj, out);
    return;
  }
  use_device();
  cuda::GemvNorm norm;
  const void* xb = gemv_input(a, w, norm);  // a pending `a` is this product's input (its own norm_x_)
  settle_norm({&residual, &weight}, {&out});
  // A pending tensor other than `out` (`a` itself, or one a caller still holds) stays readable: made real
  // before its buffer can be reused. The transformer's pending tensor is always `out` (dropped above).
  if (pending_norm_.data != nullptr) resolve_pending_norm();
  void* next_x = scratch(norm_x_[norm_x_next_], static_cast<size_t>(t * d) * 2);
  float* sums = next_norm_sums(t);
  norm.residual = residual.ptr<float>();
  norm.residual_ld = d;
  norm.weight = weight.ptr<float>();
  norm.next_x = next_x;
  norm.out_sumsq = sums;
  const cuda::GemvOutput o{proj.ptr<float>(), d, d};  // not stored: the residual takes the values
  CUDA_CHECK(cuda::launch_gemv(gemv_weight(w), xb, t, a.cols(),
                               w.bias.empty() ? nullptr : w.bias.ptr<float>(), &o, 1, stream_, &norm));
  last_matmul_bf16_ = true;
  drop_bf16_copy_if_overlaps(residual);
  drop_bf16_copy_if_overlaps(out);
  pending_norm_ = {out.data, t, d, next_x, sums, eps};
  norm_x_next_ ^= 1;
}

void CudaBackend::settle_norm(std::initializer_list<const Tensor*> reads,
                              std::initializer_list<const Tensor*> writes) {
  if (pending_norm_.data == nullptr) return;
  const size_t bytes = static_cast<size_t>(pending_norm_.rows * pending_norm_.cols) * 4;
  for (const Tensor* r : reads)
    if (overlaps(r->data, r->nbytes(), pending_norm_.data, bytes)) return resolve_pending_norm();
  for (const Tensor* w : writes)
    if (overlaps(w->data, w->nbytes(), pending_norm_.data, bytes)) pending_norm_ = {};
}

void CudaBackend::settle_norm_range(const void* p, size_t bytes, bool read) {
  if (pending_norm_.data == nullptr ||
      !overlaps(p, bytes, pending_norm_.data,
                static_cast<size_t>(pending_norm_.rows * pending_norm_.cols) * 4))
    return;
  if (read) {
    resolve_pending_norm();
  } else {
    pending_norm_ = {};
  }
}

void CudaBackend::resolve_pending_norm() {
  const PendingNorm p = pending_norm_;
  pending_norm_ = {};
  if (p.data == nullptr) return;
  use_device();
  CUDA_CHECK(cuda::launch_gemv_norm_apply(p.x, p.sumsq, p.eps, p.rows, p.cols,
                                          static_cast<float*>(const_cast<void*>(p.data)), stream_));
}

void CudaBackend::clear_norm_sums() {
  CUDA_CHECK(cudaMemsetAsync(norm_sums_.data, 0, norm_sums_.bytes, stream_));
  norm_sets_used_ = 0;
  norm_sums_clear_ = true;
}

float* CudaBackend::next_norm_sums(int64_t rows) {
  INFERX_CHECK(rows >= 1 && rows <= cuda::kGemvMaxRows, "cuda backend: {} rows for a fused norm", rows);
  if (norm_sums_.data == nullptr) scratch(norm_sums_, kNormSets * kNormSetFloats * sizeof(float));
  if (!norm_sums_clear_ || norm_sets_used_ >= kNormSets) clear_norm_sums();
  return static_cast<float*>(norm_sums_.data) + static_cast<size_t>(norm_sets_used_++) * kNormSetFloats;
}

}  // namespace inferx
