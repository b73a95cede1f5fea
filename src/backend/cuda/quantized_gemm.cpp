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

// 32 MiB: NVIDIA's recommended cuBLASLt workspace on Hopper (cuBLAS docs, cublasSetWorkspace).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
constexpr size_t kMaxPlans = 4096;  // prefill sees many row counts; past this the cache starts over

int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && address % static_cast<uintptr_t>(alignment * 2) == 0) alignment *= 2;
  return alignment;
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

void report_release_failure(bool failed, const char* what) {
  if (failed) std::fprintf(stderr, "inferx cuda: releasing %s failed\n", what);
}

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

struct QuantizedGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
  ~Plan() {
    if (d) report_release_failure(cublasLtMatrixLayoutDestroy(d) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (b) report_release_failure(cublasLtMatrixLayoutDestroy(b) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (a) report_release_failure(cublasLtMatrixLayoutDestroy(a) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (desc)
      report_release_failure(cublasLtMatmulDescDestroy(desc) != CUBLAS_STATUS_SUCCESS, "a matmul desc");
  }
};

QuantizedGemm::QuantizedGemm(cudaStream_t stream) : stream_(stream) {
  if (const char* v = std::getenv("INFERX_CUDA_FP8_OUTER_SCALE")) outer_scale_ = std::strcmp(v, "0") != 0;
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDA_CHECK(cudaMalloc(&lt_workspace_, kLtWorkspaceBytes));
  lt_workspace_bytes_ = kLtWorkspaceBytes;
}

QuantizedGemm::~QuantizedGemm() {
  plans_.clear();
  report_release_failure(cudaStreamSynchronize(stream_) != cudaSuccess, "the quantized gemm stream");
  if (lt_workspace_) report_release_failure(cudaFree(lt_workspace_) != cudaSuccess, "the cuBLASLt workspace");
  if (lt_) report_release_failure(cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS, "the cuBLASLt handle");
}

bool QuantizedGemm::supports(const Linear& w) {
  const Tensor& t = w.weight;
  if (t.ndim != 2 || t.device != Device::CUDA || t.data == nullptr) return false;
  const int64_t n = w.out_features(), k = w.in_features();
  if (n <= 0 || k <= 0) return false;
  switch (t.dtype) {
    case DType::F8_E4M3:
      // cuBLASLt FP8: leading dimensions a multiple of 16 bytes (K here, one byte per element).
      return k % 16 == 0 && w.scale.dtype == DType::F32 && w.scale.data != nullptr &&
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

QuantizedGemm::Plan& QuantizedGemm::plan_for(int kind, int64_t n, int64_t t, int64_t k, int64_t ldd,
                                             const void* a, const float* d) {
  const PlanKey key{kind, n, t, k, ldd, pointer_alignment(a), pointer_alignment(d)};
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  const cudaDataType_t ab_type = kind == 1 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
  auto plan = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // TN: the only layout cuBLASLt's FP8 kernels take (cuBLAS docs, cublasLtMatmul FP8 requirements).
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (kind >= 2) {  // scales applied inside the GEMM (cublasLt.h, cublasLtMatmulMatrixScale_t)
    const int32_t a_mode =
        kind == 2 ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                                sizeof(a_mode)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                sizeof(b_mode)));
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, ab_type, u(k), u(n), k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, ab_type, u(k), u(t), k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, u(n), u(t), ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() {
      report_release_failure(cublasLtMatmulPreferenceDestroy(p) != CUBLAS_STATUS_SUCCESS,
                             "a matmul preference");
    }
  } guard{pref};
  const uint64_t ws = lt_workspace_bytes_;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // B is our own 256-byte aligned scratch; A (a weight row view) and D (an output column tile) may not be.
  const uint32_t aa = static_cast<uint32_t>(std::get<5>(key)), ab = 256,
                 ad = static_cast<uint32_t>(std::get<6>(key));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                                    sizeof(aa)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                                    sizeof(ab)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad,
                                                    sizeof(ad)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad,
                                                    sizeof(ad)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->d,
                                                               plan->d, pref, 1, &result, &found);
  if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->has_algo = true;
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void QuantizedGemm::run(const Plan& plan, const void* a, const void* b, float* d) {
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d,
                              &plan.algo, lt_workspace_, lt_workspace_bytes_, stream_));
}

bool QuantizedGemm::try_run(Plan& plan, const void* a, const void* b, float* d) {
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(lt_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d, plan.d, &plan.algo,
                     lt_workspace_, lt_workspace_bytes_, stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    std::fprintf(stderr,
                 "inferx cuda: cuBLASLt refused an FP8 GEMM its heuristic offered (%s); falling back\n",
                 cublasLtGetStatusString(status));
    plan.has_algo = false;
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
  if (plans_.size() >= kMaxPlans) plans_.clear();
  if (w.weight.dtype == DType::F8_E4M3 && !force_dequant_) {
    fp8_matmul(x, t, w, out, workspace);
    return;
  }
  dequant_matmul(x, t, w, out, workspace);
}

void QuantizedGemm::fp8_matmul(const float* x, int64_t t, const Linear& w, float* out,
                               const std::function<void*(size_t)>& workspace) {
  const int64_t n = w.out_features(), k = w.in_features();
  // cuBLASLt's FP8 kernels want M (our output features) and K multiples of 16 and 16-byte aligned
  // operands (as PyTorch's _scaled_mm checks); otherwise, or when the heuristic offers no FP8 kernel for
  // the shape, the same W8A8 values run in BF16.
  const bool fp8_shape = n % 16 == 0 && k % 16 == 0 && reinterpret_cast<uintptr_t>(w.weight.data) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const bool per_channel = w.scale.numel() > 1;
  Plan* scaled =
      fp8_shape && outer_scale_ ? &plan_for(per_channel ? 2 : 3, n, t, k, n, w.weight.data, out) : nullptr;
  if (scaled != nullptr && !scaled->has_algo) scaled = nullptr;
  Plan* plain = fp8_shape ? &plan_for(0, n, t, k, n, w.weight.data, out) : nullptr;
  if (plain != nullptr && !plain->has_algo) plain = nullptr;
  if (scaled == nullptr && plain == nullptr) {
    dequant_matmul(x, t, w, out, workspace);
    return;
  }
  const size_t q_bytes = round_up(static_cast<size_t>(t * k));
  auto* ws = static_cast<char*>(workspace(q_bytes + round_up(static_cast<size_t>(t) * 4)));
  auto* xq = reinterpret_cast<uint8_t*>(ws);
  auto* xs = reinterpret_cast<float*>(ws + q_bytes);
  CUDA_CHECK(launch_quantize_fp8_rows(x, t, k, xq, xs, nullptr, stream_));
  if (scaled != nullptr) {
    // The scale pointers live in the descriptor: set per call (host-side only, as a bias pointer).
    const void* a_scale = w.scale.data;
    const void* b_scale = xs;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(scaled->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                sizeof(a_scale)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(scaled->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                sizeof(b_scale)));
    if (try_run(*scaled, w.weight.data, xq, out)) {
      if (!w.bias.empty()) CUDA_CHECK(launch_add_bias(out, w.bias.ptr<float>(), t, n, stream_));
      last_path_ = Path::Fp8OuterScale;
      return;
    }
  }
  if (plain != nullptr && try_run(*plain, w.weight.data, xq, out)) {
    CUDA_CHECK(launch_fp8_scale_epilogue(out, t, n, xs, static_cast<const float*>(w.scale.data), per_channel,
                                         w.bias.empty() ? nullptr : w.bias.ptr<float>(), out, stream_));
    last_path_ = Path::Fp8;
    return;
  }
  dequant_matmul(x, t, w, out, workspace);
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
    const Plan& plan = plan_for(1, rows, t, k, n, wt, out + n0);
    INFERX_CHECK(plan.has_algo, "cuda backend: cuBLASLt offers no BF16 algorithm for [{}, {}] x [{}, {}]^T",
                 t, k, rows, k);
    run(plan, wt, xb, out + n0);
  }
  if (!w.bias.empty()) CUDA_CHECK(launch_add_bias(out, w.bias.ptr<float>(), t, n, stream_));
  last_path_ = fp8 ? Path::Fp8ViaBf16 : Path::Dequant;
}

}  // namespace inferx::cuda
