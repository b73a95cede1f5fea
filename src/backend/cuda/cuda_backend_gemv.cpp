// CudaBackend's GEMV path (kernels_gemv.h): BF16 products of one activation row (decode at batch 1), and
// any product whose weight format cuBLASLt cannot take (FP8 with our scales, INT4, Q8_0, Q4_K: these go
// through the GEMV in chunks of kGemvMaxRows rows unless the quantized GEMM of matmul's earlier branch
// takes them), and the fused projections (one launch for q/k/v, one for silu(gate) * up); products the
// GEMV does not take run the fused weights as row slices (Backend's defaults).
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

const void* CudaBackend::gemv_input(const Tensor& x, const Linear& w) {
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
  const void* xb = gemv_input(x, w);
  CUDA_CHECK(cuda::launch_gemv(gemv_weight(w), xb, x.rows(), x.cols(),
                               w.bias.empty() ? nullptr : w.bias.ptr<float>(), o,
                               static_cast<int>(outs.size()), stream_));
  last_matmul_bf16_ = true;  // the norms / SiLU then write the BF16 copies this path reads
  for (Tensor* out : outs) drop_bf16_copy_if_overlaps(*out);
}

void CudaBackend::matmul_split(const Tensor& x, const Linear& w, std::span<Tensor* const> outs) {
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  INFERX_CHECK(
      x.device == Device::CUDA && x.dtype == DType::F32 && w.weight.ndim == 2 && x.cols() == w.in_features(),
      "cuda backend: split matmul of x {} {} with W {}", dtype_name(x.dtype), x.shape_string(),
      w.weight.shape_string());
  if (w.weight.device != Device::CUDA || outs.size() > static_cast<size_t>(cuda::kGemvMaxOutputs) ||
      !gemv_takes(x, w)) {
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
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  INFERX_CHECK(x.device == Device::CUDA && x.dtype == DType::F32 && w.weight.ndim == 2 &&
                   x.cols() == w.in_features() && w.out_features() % 2 == 0,
               "cuda backend: gate/up matmul of x {} {} with W {}", dtype_name(x.dtype), x.shape_string(),
               w.weight.shape_string());
  const int64_t f = w.out_features() / 2;
  if (w.weight.device != Device::CUDA || !gemv_takes(x, w)) {
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
  const void* xb = gemv_input(x, w);  // may be shadow_: the product's own copy goes to gemv_out_
  void* ob = options_.bf16_activations ? scratch(gemv_out_, static_cast<size_t>(out.numel()) * 2) : nullptr;
  CUDA_CHECK(cuda::launch_gemv_silu_mul(gemv_weight(w), xb, x.rows(), x.cols(), f,
                                        w.bias.empty() ? nullptr : w.bias.ptr<float>(), out.ptr<float>(), ob,
                                        stream_));
  last_matmul_bf16_ = true;
  if (ob) {
    adopt_bf16_copy(out);
  } else {
    drop_bf16_copy();
  }
}

// The norm between one-row products (decode at batch 1) -----------------------------------------------
// kernels_gemv.h's norm fusion: o / down add into the residual stream and prepare the next norm in their
// epilogue; qkv / gate-up / lm_head read the prepared row. No norm kernel, no kernel boundary for it, no
// round trip of o / down's output. Products the v4 GEMV does not take run unfused; a norm that was
// prepared for a product that then runs unfused becomes a plain rmsnorm of the (already added) residual.

bool CudaBackend::gemv_norm_takes(const Tensor& x, const Linear& w) const {
  return x.rows() == 1 && w.weight.device == Device::CUDA && w.input_perm.empty() &&
         !(options_.timing_skip & kTimingSkipNorm) && gemv_format(w) &&
         cuda::gemv_norm_fuses(w.weight.dtype, w.in_features()) && gemv_takes(x, w) &&
         (w.bias.empty() || (w.bias.dtype == DType::F32 && w.bias.numel() == w.out_features()));
}

bool CudaBackend::take_pending_norm(const Tensor& residual, const Tensor* add, const Tensor& norm,
                                    float eps) {
  if (pending_norm_.residual == nullptr) return false;
  const PendingNorm p = pending_norm_;
  pending_norm_ = {};
  INFERX_CHECK(p.residual == residual.data && add != nullptr && p.add == add->data && p.norm == norm.data &&
                   p.eps == eps,
               "cuda backend: the norm after matmul_before_norm must be the one it named (residual, add, "
               "norm weight and eps)");
  return true;
}

void CudaBackend::pre_norm(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h) {
  finish_deferred();  // this norm reads add as written
  if (take_pending_norm(residual, add, norm, eps)) {
    rmsnorm(residual, norm, eps, h);  // the add is done
    return;
  }
  Backend::pre_norm(residual, add, norm, eps, h);
}

void CudaBackend::matmul_before_norm(const Tensor& x, const Linear& w, Tensor& out, Tensor& residual,
                                     const Tensor& next_norm, float eps) {
  finish_deferred();  // none is pending in the model's order of calls
  const int64_t n = w.out_features();
  const auto f32_row = [n](const Tensor& t) {
    return t.device == Device::CUDA && t.dtype == DType::F32 && t.numel() == n;
  };
  if (!(x.device == Device::CUDA && x.dtype == DType::F32 && x.cols() == w.in_features() &&
        f32_row(residual) && f32_row(next_norm) && out.numel() == n && gemv_norm_takes(x, w) &&
        cuda::gemv_norm_fuses(w.weight.dtype, n))) {  // the next product reads n columns
    if (!defer_product(x, w, out, residual, next_norm, eps)) matmul(x, w, out);
    return;
  }
  use_device();
  const void* xb = gemv_input(x, w);
  cuda::GemvResidual r;
  r.residual = residual.ptr<float>();
  r.norm_weight = next_norm.ptr<float>();
  r.normed = scratch(norm_row_, static_cast<size_t>(n) * 2);
  r.partials = static_cast<float*>(scratch(norm_partials_, sizeof(float) * cuda::kGemvMaxPartials));
  const cuda::GemvOutput o{nullptr, n, n};
  CUDA_CHECK(cuda::launch_gemv(gemv_weight(w), xb, 1, x.cols(),
                               w.bias.empty() ? nullptr : w.bias.ptr<float>(), &o, 1, stream_, &r));
  last_matmul_bf16_ = true;
  drop_bf16_copy_if_overlaps(residual);
  pending_norm_ = {residual.data, out.data, next_norm.data, r.ctas, eps};
}

void CudaBackend::norm_matmul_split(Tensor& residual, const Tensor* add, const Tensor& norm, float eps,
                                    Tensor& h, const Linear& w, std::span<Tensor* const> outs) {
  const bool ready = pending_norm_.residual != nullptr;
  const PendingNorm p = pending_norm_;
  bool h_only = false;
  if (!ready && fused_quantized_norm(residual, add, norm, eps, h, w, outs, nullptr, nullptr, h_only)) {
    if (!h_only) return;
    if (outs.size() == 1) {  // the norm ran into h, the fused GEMM was refused
      matmul(h, w, *outs[0]);
    } else {
      matmul_split(h, w, outs);
    }
    return;
  }
  if (!ready || outs.empty() || outs.size() > static_cast<size_t>(cuda::kGemvMaxOutputs) ||
      !gemv_norm_takes(h, w) || w.in_features() != residual.cols()) {
    Backend::norm_matmul_split(residual, add, norm, eps, h, w, outs);  // pre_norm takes a prepared norm
    return;
  }
  take_pending_norm(residual, add, norm, eps);
  use_device();
  drop_bf16_copy();  // h is not written
  cuda::GemvOutput o[cuda::kGemvMaxOutputs];
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    check_out(h, *outs[i], "matmul");
    o[i] = {outs[i]->ptr<float>(), outs[i]->cols(), outs[i]->cols()};
    total += outs[i]->cols();
  }
  INFERX_CHECK(total == w.out_features(), "cuda backend: split matmul outputs of {} columns for W {}", total,
               w.weight.shape_string());
  const cuda::GemvPrenorm pre{static_cast<const float*>(norm_partials_.data), p.ctas, eps};
  CUDA_CHECK(cuda::launch_gemv(gemv_weight(w), norm_row_.data, 1, w.in_features(),
                               w.bias.empty() ? nullptr : w.bias.ptr<float>(), o,
                               static_cast<int>(outs.size()), stream_, nullptr, &pre));
  last_matmul_bf16_ = true;
}

void CudaBackend::norm_matmul_silu_mul(Tensor& residual, const Tensor* add, const Tensor& norm, float eps,
                                       Tensor& h, const Linear& w, Tensor& gate, Tensor& up, Tensor& out) {
  const int64_t f = w.out_features() / 2;
  finish_deferred();  // the norm below reads add as written
  const bool ready = pending_norm_.residual != nullptr;
  const PendingNorm p = pending_norm_;
  if (!ready || w.out_features() % 2 != 0 || !gemv_norm_takes(h, w) || w.in_features() != residual.cols()) {
    Backend::norm_matmul_silu_mul(residual, add, norm, eps, h, w, gate, up, out);
    return;
  }
  take_pending_norm(residual, add, norm, eps);
  check_out(h, out, "gate/up");
  INFERX_CHECK(out.cols() == f && out.numel() == f, "cuda backend: gate/up output {} for W {}",
               out.shape_string(), w.weight.shape_string());
  use_device();
  drop_bf16_copy();
  void* ob = options_.bf16_activations ? scratch(gemv_out_, static_cast<size_t>(out.numel()) * 2) : nullptr;
  const cuda::GemvPrenorm pre{static_cast<const float*>(norm_partials_.data), p.ctas, eps};
  CUDA_CHECK(cuda::launch_gemv_silu_mul(gemv_weight(w), norm_row_.data, 1, w.in_features(), f,
                                        w.bias.empty() ? nullptr : w.bias.ptr<float>(), out.ptr<float>(), ob,
                                        stream_, &pre));
  last_matmul_bf16_ = true;
  if (ob) adopt_bf16_copy(out);
}

void CudaBackend::norm_mlp(Tensor& residual, const Tensor* add, const Tensor& norm, float eps, Tensor& h,
                           const Linear& gate_up, Tensor& gate, Tensor& up, Tensor& act, const Linear& down,
                           Tensor& out, const Tensor* next_norm) {
  Tensor* outs[] = {&out};
  bool h_only = false;
  if (pending_norm_.residual == nullptr &&
      fused_quantized_norm(residual, add, norm, eps, h, gate_up, outs, &down, &act, h_only, next_norm)) {
    if (!h_only) return;
    matmul_silu_mul(h, gate_up, gate, up, act);  // the norm ran into h, the fused GEMM was refused
    if (next_norm) {
      matmul_before_norm(act, down, out, residual, *next_norm, eps);
    } else {
      matmul(act, down, out);
    }
    return;
  }
  Backend::norm_mlp(residual, add, norm, eps, h, gate_up, gate, up, act, down, out, next_norm);
}

// Prefill-sized steps with FP8 weights: the norm before the products writes their FP8 codes directly
// (QuantizedGemm::norm_matmul_split / norm_mlp). down != null: the MLP, outs[0] the down projection's output
// and act its input's workspace; else a (split) projection. False: nothing ran. True with h_only: the norm
// ran into h (residual updated) and cuBLASLt then refused the GEMM: the caller runs the products on h.
bool CudaBackend::fused_quantized_norm(Tensor& residual, const Tensor* add, const Tensor& norm, float eps,
                                       Tensor& h, const Linear& w, std::span<Tensor* const> outs,
                                       const Linear* down, Tensor* act, bool& h_only,
                                       const Tensor* next_norm) {
  // A deferred product is this norm's add when it was deferred for it; on every path that does not take it
  // (false below) its epilogue runs first, so the caller's unfused ops read add as written.
  const bool product = deferred_for(residual, add, norm, eps);
  if (!product) finish_deferred();  // one deferred for another norm (none in the model's order)
  struct FinishUnlessTaken {
    CudaBackend* self;
    bool armed;
    ~FinishUnlessTaken() {
      if (armed) self->finish_deferred();
    }
  } finish{this, product};
  const int64_t t = residual.rows(), k = residual.cols();
  if (!cuda::QuantizedGemm::prefers_fused(w, t)) return false;  // decode sizes: the GEMV's
  const auto f32_like = [&](const Tensor& x) {
    return x.device == Device::CUDA && x.dtype == DType::F32 && x.rows() == t && x.cols() == k;
  };
  if (outs.empty() || outs.size() > 3 || w.weight.device != Device::CUDA || w.in_features() != k ||
      !f32_like(residual) || !f32_like(h) || (add && !f32_like(*add)) || norm.dtype != DType::F32 ||
      norm.numel() != k || !cuda::QuantizedGemm::supports(w))
    return false;
  if (down && (down->weight.device != Device::CUDA || !cuda::QuantizedGemm::supports(*down) ||
               act->device != Device::CUDA || act->dtype != DType::F32 || act->rows() != t ||
               act->cols() * 2 != w.out_features()))
    return false;
  for (Tensor* o : outs) check_out(residual, *o, down ? "down" : "split matmul");
  cuda::QuantizedGemm::NormInput in;
  in.residual = residual.ptr<float>();
  in.add = add && !product ? add->ptr<float>() : nullptr;
  in.add_pending = product;
  in.norm = norm.ptr<float>();
  in.eps = eps;
  in.h = h.ptr<float>();
  use_device();
  const auto ws = [this](size_t bytes) { return scratch(qgemm_ws_, bytes); };
  cuda::QuantizedGemm::Fused r;
  if (down) {
    // The down product is deferred to the next norm when there is one (and the hold is not the one the
    // norm here reads: next_hold alternates).
    const int64_t n_down = down->out_features();
    const bool defer = next_norm && qgemm_->defers() && next_norm->dtype == DType::F32 &&
                       next_norm->numel() == n_down && outs[0]->cols() == n_down;
    const cuda::QuantizedGemm::Hold hold =
        defer ? cuda::QuantizedGemm::hold_at(next_hold(cuda::QuantizedGemm::hold_bytes(t, n_down)), t, n_down)
              : cuda::QuantizedGemm::Hold{};
    r = qgemm_->norm_mlp(in, t, w, *down, act->ptr<float>(), outs[0]->ptr<float>(), ws,
                         defer ? &hold : nullptr);
    if (r != cuda::QuantizedGemm::Fused::No) {
      finish.armed = false;  // the norm took the product (if any) as its add
      if (qgemm_->pending()) note_deferred(residual, *next_norm, eps);
    }
  } else {
    float* ptrs[3];
    int64_t cols[3];
    for (size_t j = 0; j < outs.size(); ++j) {
      ptrs[j] = outs[j]->ptr<float>();
      cols[j] = outs[j]->cols();
    }
    // q / k / v of prefill-sized steps: their split epilogue is left to RoPE + KV write, which reads the BF16
    // sums itself (rope_and_write_kv; any other next call launches it); options_.defer_split_rows says why
    // not at decode sizes.
    const bool defer_split = outs.size() == 3 && qgemm_->defers() && t >= options_.defer_split_rows;
    r = qgemm_->norm_matmul_split(in, t, w, ptrs, cols, static_cast<int>(outs.size()), ws, defer_split);
    // A pending split is RoPE's: rope_and_write_kv matches it by its outputs (deferred_ is for one-output
    // products only: deferred_for checks that).
    if (r != cuda::QuantizedGemm::Fused::No) finish.armed = false;  // the norm took the product (if any)
  }
  if (r == cuda::QuantizedGemm::Fused::No) return false;
  // The residual, h, act and the outputs changed (or stay unwritten): no BF16 copy of any is current.
  drop_bf16_copy();
  last_matmul_bf16_ = false;
  h_only = r == cuda::QuantizedGemm::Fused::InputOnly;
  return true;
}

bool CudaBackend::deferred_for(const Tensor& residual, const Tensor* add, const Tensor& norm,
                               float eps) const {
  const cuda::Fp8Epilogue* e = qgemm_->pending();
  return e != nullptr && e->num_outs == 1 && add != nullptr && add->data == e->out[0] &&
         residual.data == deferred_.residual && norm.data == deferred_.norm && eps == deferred_.eps &&
         residual.rows() == e->t && add->rows() == e->t && add->cols() == e->n;
}

void CudaBackend::finish_deferred() {
  if (qgemm_->pending() == nullptr) return;
  use_device();
  qgemm_->finish_pending();
}

bool CudaBackend::defer_product(const Tensor& x, const Linear& w, Tensor& out, const Tensor& residual,
                                const Tensor& next_norm, float eps) {
  const int64_t t = x.rows(), n = w.out_features();
  if (!qgemm_->defers() || !cuda::QuantizedGemm::prefers_fused(w, t) || w.weight.device != Device::CUDA ||
      x.device != Device::CUDA || x.dtype != DType::F32 || x.cols() != w.in_features() ||
      out.device != Device::CUDA || out.dtype != DType::F32 || out.rows() != t || out.cols() != n ||
      residual.dtype != DType::F32 || residual.rows() != t || residual.cols() != n ||
      next_norm.dtype != DType::F32 || next_norm.numel() != n ||
      !cuda::fp8_norm_quantize_takes(residual.ptr<float>(), nullptr, next_norm.ptr<float>(), n))
    return false;
  use_device();
  const auto hold = cuda::QuantizedGemm::hold_at(next_hold(cuda::QuantizedGemm::hold_bytes(t, n)), t, n);
  if (!qgemm_->matmul_deferred(x.ptr<float>(), t, w, out.ptr<float>(), hold,
                               [this](size_t bytes) { return scratch(qgemm_ws_, bytes); }))
    return false;
  note_deferred(residual, next_norm, eps);
  last_matmul_bf16_ = false;
  drop_bf16_copy_if_overlaps(out);
  return true;
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
  finish_deferred();  // a deferred product is read only by the call it was deferred for
  if (bytes == 0) return;
  use_device();
  drop_bf16_copy();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace inferx
