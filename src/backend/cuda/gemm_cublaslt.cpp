#include "backend/cuda/gemm_cublaslt.h"

#include <climits>
#include <cstdio>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace inferx::cuda {
namespace {

// 32 MiB: what NVIDIA recommends for cuBLASLt on Hopper (cuBLAS docs, cublasSetWorkspace).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Prefill sees many distinct token counts; past this many plans the cache starts over.
constexpr size_t kMaxPlans = 4096;
// Shapes with at most this many rows (decode batches: the same shapes every step) get their algorithm
// timed; the candidates requested from the heuristic, and timed runs per candidate.
constexpr int64_t kTimedMaxRows = 256;
constexpr int kCandidates = 8;
constexpr int kTimedRuns = 3;

int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && address % static_cast<uintptr_t>(alignment * 2) == 0) alignment *= 2;
  return alignment;
}

// Destructors cannot throw: a failing release is reported and otherwise ignored.
void report_release_failure(bool failed, const char* what) {
  if (failed) std::fprintf(stderr, "inferx cuda: releasing %s failed\n", what);
}

}  // namespace

// Row-major out[T, N] = x[T, K] W[N, K]^T is, in cuBLAS's column-major terms, D (N x T, ld N) =
// op(A) B with A = W seen as K x N (ld K) transposed and B = x seen as K x T (ld K): the "TN" layout.
struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
  bool bias_epilogue = false;  // false with a bias: the heuristic offered nothing fused, add it after

  ~Plan() {
    if (c) report_release_failure(cublasLtMatrixLayoutDestroy(c) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (b) report_release_failure(cublasLtMatrixLayoutDestroy(b) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (a) report_release_failure(cublasLtMatrixLayoutDestroy(a) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (desc)
      report_release_failure(cublasLtMatmulDescDestroy(desc) != CUBLAS_STATUS_SUCCESS, "a matmul desc");
  }
};

CublasLtGemm::CublasLtGemm(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUBLAS_CHECK(cublasCreate(&blas_));
  CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
  CUBLAS_CHECK(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  report_release_failure(cudaStreamSynchronize(stream_) != cudaSuccess, "the gemm stream");
  if (converted_) report_release_failure(cudaFree(converted_) != cudaSuccess, "the activation buffer");
  if (workspace_) report_release_failure(cudaFree(workspace_) != cudaSuccess, "the cuBLASLt workspace");
  if (blas_) report_release_failure(cublasDestroy(blas_) != CUBLAS_STATUS_SUCCESS, "the cuBLAS handle");
  if (lt_) report_release_failure(cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS, "the cuBLASLt handle");
}

const CublasLtGemm::Plan& CublasLtGemm::plan_for(const PlanKey& key, cudaDataType_t w_type, const void* w,
                                                 const void* x, float* out, const float* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  if (plans_.size() >= kMaxPlans) plans_.clear();
  const auto [dtype, n, t, k, has_bias, align_w, align_x, align_out] = key;
  // B (the activations) has the weight's type: 16-bit weights get converted activations.
  const cudaDataType_t x_type = w_type;

  auto plan = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, w_type, u(k), u(n), k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, x_type, u(k), u(t), k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_32F, u(n), u(t), n));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() {
      report_release_failure(cublasLtMatmulPreferenceDestroy(p) != CUBLAS_STATUS_SUCCESS,
                             "a matmul preference");
    }
  } guard{pref};
  const uint64_t ws = workspace_bytes_;
  CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The default assumes 256-byte aligned pointers; row views and packed weights may be less aligned.
  const uint32_t aw = static_cast<uint32_t>(align_w), ax = static_cast<uint32_t>(align_x),
                 ao = static_cast<uint32_t>(align_out);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw,
                                                    sizeof(aw)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax,
                                                    sizeof(ax)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ao,
                                                    sizeof(ao)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ao,
                                                    sizeof(ao)));

  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const auto query = [&] {
    found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->a, plan->b, plan->c,
                                                                 plan->c, pref, kCandidates, results, &found);
    if (status != CUBLAS_STATUS_SUCCESS) found = 0;
  };
  if (has_bias) {
    // Bias in the epilogue: F32 bias with the F32 output (cuBLASLt docs,
    // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof(epilogue)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof(bias_type)));
    query();
    plan->bias_epilogue = found > 0;
    if (found == 0) {  // nothing fused for this shape: plain GEMM, bias added by a kernel afterwards
      const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &none, sizeof(none)));
      query();
    }
  } else {
    query();
  }
  int valid = 0;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) results[valid++] = results[i];
  if (valid > 0) {
    plan->algo = results[0].algo;
    plan->has_algo = true;
  }
  // Decode shapes repeat every step: time the candidates once on the real operands (outputs are
  // overwritten by the caller's own run right after). Never while a graph is captured.
  if (valid > 1 && t <= kTimedMaxRows && !capturing_) {
    cudaEvent_t start = nullptr, stop = nullptr;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    float best = -1.0f;
    for (int i = 0; i < valid; ++i) {
      run(*plan, &results[i].algo, w, x, out, bias);  // warm-up (and checks the candidate runs)
      CUDA_CHECK(cudaEventRecord(start, stream_));
      for (int r = 0; r < kTimedRuns; ++r) run(*plan, &results[i].algo, w, x, out, bias);
      CUDA_CHECK(cudaEventRecord(stop, stream_));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (best < 0.0f || ms < best) {
        best = ms;
        plan->algo = results[i].algo;
      }
    }
    report_release_failure(cudaEventDestroy(start) != cudaSuccess, "a timing event");
    report_release_failure(cudaEventDestroy(stop) != cudaSuccess, "a timing event");
  }
  (void)dtype;
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void CublasLtGemm::run(const Plan& plan, const cublasLtMatmulAlgo_t* algo, const void* w, const void* x,
                       float* out, const float* bias) {
  if (plan.bias_epilogue)  // the pointer is part of the descriptor; set per call (host-side only)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, out, plan.c, out, plan.c,
                              algo, workspace_, workspace_bytes_, stream_));
}

const void* CublasLtGemm::activations_as(const float* x, int64_t count, DType to) {
  const size_t bytes = static_cast<size_t>(count) * 2;
  if (bytes > converted_bytes_) {
    INFERX_CHECK(
        !capturing_,
        "cuda backend: the activation buffer must grow ({} bytes) while a CUDA graph is captured; run "
        "the same step once without capture first",
        bytes);
    ++generation_;
    // Stream-ordered free and allocation: no device-wide synchronisation on growth.
    if (converted_) CUDA_CHECK(cudaFreeAsync(converted_, stream_));
    converted_ = nullptr;
    converted_bytes_ = 0;
    CUDA_CHECK(cudaMallocAsync(&converted_, bytes, stream_));
    converted_bytes_ = bytes;
  }
  CUDA_CHECK(launch_convert_f32(x, count, to, converted_, stream_));
  return converted_;
}

void CublasLtGemm::matmul(const void* x, DType x_dtype, int64_t t, int64_t k, DType w_dtype, const void* w,
                          int64_t n, const float* bias, float* out) {
  if (t == 0 || n == 0) return;
  cudaDataType_t w_type = CUDA_R_32F;
  switch (w_dtype) {
    case DType::F32:
      w_type = CUDA_R_32F;
      break;
    case DType::F16:
      w_type = CUDA_R_16F;
      break;
    case DType::BF16:
      w_type = CUDA_R_16BF;
      break;
    default:
      fail(
          "cuda backend: matmul weights of type {} are not supported on CUDA yet: dequantize at load (to "
          "BF16)",
          dtype_name(w_dtype));
  }
  INFERX_CHECK(x_dtype == DType::F32 || x_dtype == w_dtype,
               "cuda backend: matmul of {} activations with {} weights", dtype_name(x_dtype),
               dtype_name(w_dtype));
  const void* b = x_dtype == w_dtype ? x : activations_as(static_cast<const float*>(x), t * k, w_dtype);
  const PlanKey key{
      static_cast<int>(w_dtype), n, t, k, bias != nullptr, pointer_alignment(w), pointer_alignment(b),
      pointer_alignment(out)};
  const Plan& plan = plan_for(key, w_type, w, b, out, bias);
  if (plan.has_algo) {
    run(plan, &plan.algo, w, b, out, bias);
    if (bias && !plan.bias_epilogue) CUDA_CHECK(launch_add_bias(out, bias, t, n, stream_));
    return;
  }
  INFERX_CHECK(n <= INT_MAX && t <= INT_MAX && k <= INT_MAX,
               "cuda backend: matmul [{}, {}] x [{}, {}]^T is too large for the cuBLAS fallback", t, k, n, k);
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t),
                            static_cast<int>(k), &alpha, w, w_type, static_cast<int>(k), b, w_type,
                            static_cast<int>(k), &beta, out, CUDA_R_32F, static_cast<int>(n),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias) CUDA_CHECK(launch_add_bias(out, bias, t, n, stream_));
}

}  // namespace inferx::cuda
