#include "backend/cuda/gemm_cublaslt.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "formats/gemm_tuning_file.h"

namespace inferx::cuda {
namespace {

// 32 MiB: what NVIDIA recommends for cuBLASLt on Hopper (cuBLAS docs, cublasSetWorkspace).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Prefill sees many distinct token counts; past this many plans the cache starts over.
constexpr size_t kMaxPlans = 4096;
// Tuning. The candidates are timed in interleaved rounds (each candidate once per round, the order rotated
// every round) so that clock and power drift over the tuning (a few hundred ms of full load for the large
// prefill GEMMs) hits every candidate alike; a sample is `batch` back-to-back launches covering about
// kSampleSeconds (tiny GEMMs are not timed at launch granularity), a round's samples are enqueued
// back-to-back and read after one synchronisation, and a candidate's time is its median sample. Another
// candidate replaces the heuristic's first choice only when faster by kMargin: one sequential pass of
// 3 runs each picked slower algorithms (H200: 2048x14336x4096 98.6% -> 86.8% of the ceiling).
constexpr double kAssumedFlops = 600e12;  // to estimate one launch's time
constexpr double kSampleSeconds = 50e-6;
constexpr double kTuneSeconds = 40e-3;  // timed GPU time per tuning, spread over the rounds
constexpr int kMinRounds = 3;
constexpr int kMaxRounds = 9;
constexpr int kMaxBatch = 16;
constexpr double kMargin = 0.03;

// Destructors cannot throw: a failing release is reported and otherwise ignored.
void report_release_failure(bool failed, const char* what) {
  if (failed) std::fprintf(stderr, "inferx cuda: releasing %s failed\n", what);
}

// Rows are tuned per power-of-two bucket: 1, 2, 3-4, 5-8, ...
int64_t row_bucket(int64_t t) {
  int64_t b = 1;
  while (b < t) b *= 2;
  return b;
}

// INFERX_GEMM_CANDIDATES: how many algorithms the heuristic is asked for (LtMatmul::set_candidates).
int env_candidates() {
  const char* v = std::getenv("INFERX_GEMM_CANDIDATES");
  return v == nullptr ? LtMatmul::kDefaultCandidates : std::atoi(v);
}

// INFERX_GEMM_SM_TARGET: the SMs cuBLASLt is told to plan for (LtMatmul::set_sm_target).
int env_sm_target() {
  const char* v = std::getenv("INFERX_GEMM_SM_TARGET");
  return v == nullptr ? 0 : std::atoi(v);
}

// The tuning cache files of the process (formats/gemm_tuning_file.h): each file's records are read once and
// kept here, so that every LtMatmul of the process (the BF16 and the FP8 one of each backend, each GPU's
// backend) sees the others' tunings and each write holds them all.
class TuningFiles {
 public:
  static TuningFiles& instance() {
    static TuningFiles files;
    return files;
  }
  std::vector<GemmTuningRecord> load(const std::string& path, const std::string& context) {
    std::lock_guard<std::mutex> lock(mutex_);
    return entry(path, context).records;
  }
  // Adds (or replaces) the record of its key and rewrites the file.
  void add(const std::string& path, const std::string& context, const GemmTuningRecord& record) {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& e = entry(path, context);
    bool replaced = false;
    for (GemmTuningRecord& r : e.records) {
      if (r.key == record.key) {
        r = record;
        replaced = true;
      }
    }
    if (!replaced) e.records.push_back(record);
    std::string error;
    if (!write_gemm_tuning_file(path, context, e.records, error) && !e.warned) {
      std::fprintf(stderr, "inferx cuda: GEMM tuning cache not saved: %s\n", error.c_str());
      e.warned = true;
    }
  }

 private:
  struct Entry {
    std::vector<GemmTuningRecord> records;
    bool warned = false;
  };
  Entry& entry(const std::string& path, const std::string& context) {
    auto it = files_.find(path);
    if (it == files_.end()) {
      std::string why;
      Entry e{read_gemm_tuning_file(path, context, why)};
      if (!why.empty()) std::fprintf(stderr, "inferx cuda: GEMM tuning cache ignored: %s\n", why.c_str());
      it = files_.emplace(path, std::move(e)).first;
    }
    return it->second;
  }
  std::mutex mutex_;
  std::map<std::string, Entry> files_;
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool env_tuning() {
  const char* v = std::getenv("INFERX_GEMM_TUNE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// FP8 products with Hopper's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): the tensor cores'
// reduced-precision accumulator is not promoted to F32 every few k-steps inside the GEMM, which costs
// instructions beside the MMAs; the anchors run FP8 this way (vLLM's CUTLASS FP8 kernels use the FastAccum
// schedules). On by default since the H200 run of 2026-12-05 (docs/benchmarks.md): 1000 x 1000/1000 FP8
// +3.6% (16,568 vs 15,998 output tok/s), 8192-token FP8 prefill +5.3%, torch's 8192^3 FP8 GEMM 1333 vs
// 1306 TFLOP/s with relative error 2.6e-3 vs 1.6e-3 (E4M3's own rounding is ~6e-2 per value); every FP8
// GPU test passes with it. INFERX_FP8_FAST_ACCUM=0 turns it off.
bool fp8_fast_accum() {
  static const bool on = [] {
    const char* v = std::getenv("INFERX_FP8_FAST_ACCUM");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// INFERX_GEMM_TUNE_LOG=1: one stderr line per tuned bucket: the shape, and per candidate its median time per
// launch, its workspace bytes and which one won (*).
bool tune_log() {
  static const bool on = [] {
    const char* v = std::getenv("INFERX_GEMM_TUNE_LOG");
    return v != nullptr && std::strcmp(v, "0") != 0;
  }();
  return on;
}

int32_t scale_mode(LtScale s) {
  return s == LtScale::OuterVector ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                   : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() {
    report_release_failure(cublasLtMatmulPreferenceDestroy(p) != CUBLAS_STATUS_SUCCESS,
                           "a matmul preference");
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

}  // namespace

int pointer_alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  int alignment = 1;
  while (alignment < 256 && address % static_cast<uintptr_t>(alignment * 2) == 0) alignment *= 2;
  return alignment;
}

LtShape lt_shape(cudaDataType_t ab, int64_t n, int64_t t, int64_t k, int64_t ldd, const LtOperands& ops,
                 cudaDataType_t d_type) {
  LtShape s;
  s.ab_type = ab;
  s.d_type = d_type;
  s.n = n;
  s.t = t;
  s.k = k;
  s.ldd = ldd;
  s.bias = ops.bias != nullptr;
  s.align_a = pointer_alignment(ops.a);
  s.align_b = pointer_alignment(ops.b);
  s.align_d = pointer_alignment(ops.d);
  return s;
}

// LtMatmul ----------------------------------------------------------------------------------------------

struct LtMatmul::EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    report_release_failure(cudaEventDestroy(start) != cudaSuccess, "a timing event");
    report_release_failure(cudaEventDestroy(stop) != cudaSuccess, "a timing event");
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first; dropped once tuned
  bool has_algo = false;
  bool fused_bias = false;  // false with a bias: the heuristic offered nothing fused, the caller adds it
  bool tuned = false;       // the algorithm is settled (timed, or taken from the bucket)
  bool a_scaled = false, b_scaled = false;
  // The dedicated workspace (LtMatmul::set_dedicated_workspaces) and the algorithm it was sized for.
  void* slot = nullptr;
  cublasLtMatmulAlgo_t slot_algo{};
  bool slot_known = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {d, b, a})
      if (l)
        report_release_failure(cublasLtMatrixLayoutDestroy(l) != CUBLAS_STATUS_SUCCESS, "a matrix layout");
    if (desc)
      report_release_failure(cublasLtMatmulDescDestroy(desc) != CUBLAS_STATUS_SUCCESS, "a matmul desc");
  }
};

LtMatmul::LtMatmul(cudaStream_t stream) : stream_(stream), tuning_(env_tuning()) {
  set_candidates(env_candidates());
  sm_target_ = std::max(0, env_sm_target());
  CUBLAS_CHECK(cublasLtCreate(&lt_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  report_release_failure(cudaStreamSynchronize(stream_) != cudaSuccess, "the gemm stream");
  if (workspace_) report_release_failure(cudaFree(workspace_) != cudaSuccess, "the cuBLASLt workspace");
  if (slots_) report_release_failure(cudaFree(slots_) != cudaSuccess, "the dedicated cuBLASLt workspaces");
  if (lt_) report_release_failure(cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS, "the cuBLASLt handle");
}

bool LtMatmul::fused_bias(const Plan& plan) { return plan.fused_bias; }
void LtMatmul::disable(Plan& plan) { plan.has_algo = false; }

void LtMatmul::evict_if_full() {
  if (plans_.size() >= kMaxPlans) plans_.clear();
  if (tuned_.size() >= kMaxPlans) tuned_.clear();
}

LtMatmul::Key LtMatmul::key_of(const LtShape& s, int64_t t) {
  return Key{static_cast<int>(s.ab_type),
             s.n,
             t,
             s.k,
             s.ldd,
             s.bias,
             static_cast<int>(s.a_scale),
             static_cast<int>(s.b_scale),
             s.align_a,
             s.align_b,
             s.align_d,
             static_cast<int>(s.d_type)};
}

// The plan key as the tuning file's 12 integers and back, field by field in the Key's own order.
std::array<int64_t, 12> LtMatmul::key_record(const Key& k) {
  return std::apply([](auto... v) { return std::array<int64_t, 12>{static_cast<int64_t>(v)...}; }, k);
}

LtMatmul::Key LtMatmul::record_key(const std::array<int64_t, 12>& a) {
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return Key{static_cast<std::tuple_element_t<I, Key>>(a[I])...};
  }
  (std::make_index_sequence<std::tuple_size_v<Key>>{});
}

std::unique_ptr<LtMatmul::Plan> LtMatmul::build(const LtShape& s, const Tuned* bucket) {
  auto plan = std::make_unique<Plan>();
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  plan->a_scaled = s.a_scale != LtScale::None;
  plan->b_scaled = s.b_scale != LtScale::None;
  // Scales applied inside the GEMM (cublasLt.h, cublasLtMatmulMatrixScale_t); pointers set per call.
  if (plan->a_scaled) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(s.a_scale));
  if (plan->b_scaled) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(s.b_scale));
  if (s.ab_type == CUDA_R_8F_E4M3 && fp8_fast_accum())
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(1));
  if (sm_target_ > 0)
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, static_cast<int32_t>(sm_target_));
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, s.ab_type, u(s.k), u(s.n), s.k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, s.ab_type, u(s.k), u(s.t), s.k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, s.d_type, u(s.n), u(s.t), s.ldd));

  // A new row count in a tuned bucket: the bucket's algorithm, when cuBLASLt takes it for this exact shape,
  // without a heuristic query (settle would replace the heuristic's choice by it anyway, and a serving
  // step's row count - decodes plus a chunk - is often new: the query on every such step costs the host).
  if (bucket) {
    if (s.bias && bucket->fused_bias) {
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F);
    }
    if (fits(*plan, bucket->algo)) {
      plan->algo = bucket->algo;
      plan->has_algo = true;
      plan->fused_bias = s.bias && bucket->fused_bias;
      plan->tuned = true;
      ++stats_.plans;
      ++stats_.reused;
      return plan;
    }
    // Not for this shape: the heuristic below sets the epilogue again.
    if (s.bias) set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  }

  Preference pref;
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes_));
  // The default assumes 256-byte aligned pointers; row views and packed weights may be less aligned.
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(s.align_a));
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(s.align_b));
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(s.align_d));
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(s.align_d));

  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(candidates_));
  const auto query = [&] {
    int found = 0;
    ++stats_.queries;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref.p, candidates_, results.data(), &found);
    plan->candidates.clear();
    if (status != CUBLAS_STATUS_SUCCESS) return;
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i].algo);
  };
  if (s.bias) {
    // Bias in the epilogue: F32 bias with the F32 output (cuBLASLt docs,
    // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F);
    query();
    plan->fused_bias = !plan->candidates.empty();
    if (!plan->fused_bias) {  // nothing fused for this shape: plain GEMM, bias added by the caller
      set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
      query();
    }
  } else {
    query();
  }
  if (!plan->candidates.empty()) {
    plan->algo = plan->candidates.front();
    plan->has_algo = true;
  }
  ++stats_.plans;
  return plan;
}

bool LtMatmul::may_time() const {
  if (capturing_) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // An error here (the legacy stream while another stream captures) also means: do not synchronize.
  if (cudaStreamIsCapturing(stream_, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusNone;
}

LtMatmul::Plan* LtMatmul::plan(const LtShape& shape, const LtOperands& ops) {
  const Key key = key_of(shape, shape.t);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    const Tuned* bucket = nullptr;
    if (tuning_) {
      const auto b = tuned_.find(key_of(shape, row_bucket(shape.t)));
      if (b != tuned_.end()) bucket = &b->second;
    }
    it = plans_.emplace(key, build(shape, bucket)).first;
    stats_.build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Plan& plan = *it->second;
  if (!plan.has_algo) return nullptr;
  if (!plan.tuned && tuning_) settle(plan, shape, ops);
  return &plan;
}

std::optional<size_t> LtMatmul::checked_workspace(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t result{};
  const cublasStatus_t status =
      cublasLtMatmulAlgoCheck(lt_, plan.desc, plan.a, plan.b, plan.d, plan.d, &algo, &result);
  if (status != CUBLAS_STATUS_SUCCESS || result.state != CUBLAS_STATUS_SUCCESS) return std::nullopt;
  return result.workspaceSize;
}

bool LtMatmul::fits(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const {
  const std::optional<size_t> ws = checked_workspace(plan, algo);
  return ws && *ws <= workspace_bytes_;
}

// Takes the bucket's algorithm when there is one and it runs this exact shape (host-side checks only, so
// also during capture); otherwise, outside capture, times the candidates (the first row count seen in a
// bucket decides for the bucket). A plan first used during capture keeps the heuristic's choice until its
// next uncaptured call.
void LtMatmul::settle(Plan& plan, const LtShape& shape, const LtOperands& ops) {
  const Key bucket = key_of(shape, row_bucket(shape.t));
  auto it = tuned_.find(bucket);
  const bool fits_bucket =
      it != tuned_.end() && it->second.fused_bias == plan.fused_bias && fits(plan, it->second.algo);
  // An algorithm restored from the tuning cache that this shape does not take is forgotten, and the bucket
  // tuned again (and written back).
  if (it != tuned_.end() && !fits_bucket && restored_.erase(bucket) > 0) {
    tuned_.erase(it);
    it = tuned_.end();
  }
  if (it != tuned_.end()) {
    if (fits_bucket) {
      plan.algo = it->second.algo;
      restored_.erase(bucket);
      ++stats_.reused;
    }
  } else {
    if (!may_time()) return;
    if (plan.candidates.size() > 1) {
      const auto t0 = std::chrono::steady_clock::now();
      const int best = fastest(plan, shape, ops);
      if (best >= 0) plan.algo = plan.candidates[static_cast<size_t>(best)];
      stats_.tune_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ++stats_.tunings;
    tuned_.emplace(bucket, Tuned{plan.algo, plan.fused_bias});
    if (!cache_path_.empty()) {  // once per bucket, after a timing that took far longer than the write
      GemmTuningRecord r;
      r.key = key_record(bucket);
      static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof r.algo, "cuBLASLt's algorithm is 8 x u64");
      std::memcpy(r.algo.data(), &plan.algo, sizeof r.algo);
      r.flags = plan.fused_bias ? 1 : 0;
      TuningFiles::instance().add(cache_path_, cache_context_, r);
    }
  }
  plan.tuned = true;
  plan.candidates.clear();
  plan.candidates.shrink_to_fit();
}

void LtMatmul::use_tuning_cache(const std::string& dir) {
  if (dir.empty()) return;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // Everything that steers which algorithm wins; the tuner's own method is version 1.
  cache_context_ = std::string("inferx gemm tuning 1; device ") + prop.name + "; sm_" +
                   std::to_string(prop.major) + std::to_string(prop.minor) + "; sms " +
                   std::to_string(prop.multiProcessorCount) + "; cuBLASLt " +
                   std::to_string(cublasLtGetVersion()) + "; fast_accum " + (fp8_fast_accum() ? "1" : "0") +
                   "; sm_target " + std::to_string(sm_target_) + "; candidates " +
                   std::to_string(candidates_) + "; workspace " + std::to_string(workspace_bytes_);
  char name[40];
  std::snprintf(name, sizeof name, "/gemm-tuning-%016llx.bin",
                static_cast<unsigned long long>(fnv1a(cache_context_)));
  cache_path_ = dir + name;
  for (const GemmTuningRecord& r : TuningFiles::instance().load(cache_path_, cache_context_)) {
    const Key k = record_key(r.key);
    Tuned t{};
    std::memcpy(&t.algo, r.algo.data(), sizeof t.algo);
    t.fused_bias = (r.flags & 1) != 0;
    if (tuned_.emplace(k, t).second) {
      restored_.insert(k);
      ++stats_.loaded;
    }
  }
  if (stats_.loaded > 0)
    std::fprintf(stderr, "inferx cuda: GEMM tuning cache %s: %llu bucket algorithms restored\n",
                 cache_path_.c_str(), static_cast<unsigned long long>(stats_.loaded));
}

int LtMatmul::fastest(const Plan& plan, const LtShape& shape, const LtOperands& ops) {
  const size_t count = plan.candidates.size();
  const double launch_s =
      std::max(2.0 * double(shape.n) * double(shape.t) * double(shape.k) / kAssumedFlops, 1e-7);
  const int batch =
      static_cast<int>(std::clamp(std::ceil(kSampleSeconds / launch_s), 1.0, double(kMaxBatch)));
  const int rounds = static_cast<int>(std::clamp(
      std::floor(kTuneSeconds / (double(count) * batch * launch_s)), double(kMinRounds), double(kMaxRounds)));
  // Warm-up: each candidate once, which also tells whether cuBLASLt takes it at all.
  std::vector<bool> usable(count);
  for (size_t i = 0; i < count; ++i)
    usable[i] = launch(plan, plan.candidates[i], ops) == CUBLAS_STATUS_SUCCESS;
  std::vector<EventPair> events(count);
  std::vector<std::vector<float>> samples(count);
  for (int r = 0; r < rounds; ++r) {
    std::vector<bool> queued(count, false);
    for (size_t j = 0; j < count; ++j) {
      const size_t i = (j + static_cast<size_t>(r)) % count;
      if (usable[i]) queued[i] = usable[i] = enqueue_sample(plan, plan.candidates[i], ops, batch, events[i]);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < count; ++i) {
      if (!queued[i]) continue;
      float ms = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, events[i].start, events[i].stop));
      samples[i].push_back(ms);
    }
  }
  const int best = pick(samples, usable);
  if (tune_log()) {  // pick left each sample list's median at its middle
    std::string line;
    for (size_t i = 0; i < count; ++i) {
      const std::vector<float>& v = samples[i];
      char item[64];
      std::snprintf(item, sizeof item, " %s%zu:%.2fus/ws%zu", static_cast<int>(i) == best ? "*" : "", i,
                    v.empty() ? -1.0 : 1e3 * v[v.size() / 2] / batch,
                    checked_workspace(plan, plan.candidates[i]).value_or(0));
      line += item;
    }
    std::fprintf(stderr, "inferx gemm tune: n %lld t %lld k %lld ab %d d %d:%s\n",
                 static_cast<long long>(shape.n), static_cast<long long>(shape.t),
                 static_cast<long long>(shape.k), static_cast<int>(shape.ab_type),
                 static_cast<int>(shape.d_type), line.c_str());
  }
  return best;
}

bool LtMatmul::enqueue_sample(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const LtOperands& ops,
                              int batch, const EventPair& events) {
  CUDA_CHECK(cudaEventRecord(events.start, stream_));
  bool ran = true;
  for (int b = 0; b < batch && ran; ++b) ran = launch(plan, algo, ops) == CUBLAS_STATUS_SUCCESS;
  CUDA_CHECK(cudaEventRecord(events.stop, stream_));
  return ran;
}

// The candidate with the smallest median sample, unless the heuristic's first choice (index 0) is within
// kMargin of it; -1 when none ran.
int LtMatmul::pick(std::vector<std::vector<float>>& samples, const std::vector<bool>& usable) {
  std::vector<float> median(samples.size(), 0.0f);
  int best = -1;
  for (size_t i = 0; i < samples.size(); ++i) {
    std::vector<float>& v = samples[i];
    if (!usable[i] || v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    median[i] = v[v.size() / 2];
    if (best < 0 || median[i] < median[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  const bool first_ran = usable[0] && !samples[0].empty();
  if (best > 0 && first_ran && median[static_cast<size_t>(best)] > median[0] * (1.0 - kMargin)) best = 0;
  if (best > 0) ++stats_.changed;
  return best;
}

void LtMatmul::set_dedicated_workspaces(bool on) {
  if (on && slots_ == nullptr) CUDA_CHECK(cudaMalloc(&slots_, kSlotArenaBytes));
  dedicated_ = on;
}

bool LtMatmul::in_dedicated_workspace(const void* p) const {
  const auto* b = static_cast<const char*>(slots_);
  const auto* q = static_cast<const char*>(p);
  return b != nullptr && q >= b && q < b + kSlotArenaBytes;
}

void* LtMatmul::dedicated_workspace(Plan& plan) {
  if (!dedicated_) return nullptr;
  if (plan.slot_known && std::memcmp(&plan.slot_algo, &plan.algo, sizeof plan.algo) == 0) return plan.slot;
  // Eager launches stay on the shared workspace until a capture records the plan: only recorded products
  // need a slot, and the arena is small. The capture flag, not may_time(): that asks the driver, and eager
  // launches (a serving step's mixed batches) would ask it once per product.
  if (!capturing_ && plan.slot == nullptr) return nullptr;
  plan.slot_known = true;
  plan.slot_algo = plan.algo;
  const std::optional<size_t> need = checked_workspace(plan, plan.algo);
  if (!need || *need == 0 || *need > kSlotBytes) {
    plan.slot = nullptr;  // a slot it had stays unused: the arena is not reused
    return nullptr;
  }
  if (plan.slot == nullptr && slots_used_ + kSlotBytes <= kSlotArenaBytes) {
    plan.slot = static_cast<char*>(slots_) + slots_used_;
    slots_used_ += kSlotBytes;
  }
  return plan.slot;
}

cublasStatus_t LtMatmul::launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const LtOperands& ops,
                                void* ws, size_t ws_bytes) {
  // Pointers held by the descriptor are set per call (host-side only, so this is capture-safe).
  if (plan.fused_bias) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ops.bias);
  if (plan.a_scaled) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ops.a_scale);
  if (plan.b_scaled) set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, ops.b_scale);
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(lt_, plan.desc, &alpha, ops.a, plan.a, ops.b, plan.b, &beta, ops.d, plan.d, ops.d,
                        plan.d, &algo, ws ? ws : workspace_, ws ? ws_bytes : workspace_bytes_, stream_);
}

cublasStatus_t LtMatmul::run(Plan& plan, const LtOperands& ops) {
  void* slot = dedicated_workspace(plan);
  return slot ? launch(plan, plan.algo, ops, slot, kSlotBytes) : launch(plan, plan.algo, ops);
}

// CublasLtGemm ------------------------------------------------------------------------------------------

CublasLtGemm::CublasLtGemm(cudaStream_t stream) : stream_(stream), lt_(stream) {
  CUBLAS_CHECK(cublasCreate(&blas_));
  CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  CUBLAS_CHECK(cublasSetWorkspace(blas_, lt_.workspace(), lt_.workspace_bytes()));
}

CublasLtGemm::~CublasLtGemm() {
  report_release_failure(cudaStreamSynchronize(stream_) != cudaSuccess, "the gemm stream");
  if (converted_) report_release_failure(cudaFree(converted_) != cudaSuccess, "the activation buffer");
  if (blas_) report_release_failure(cublasDestroy(blas_) != CUBLAS_STATUS_SUCCESS, "the cuBLAS handle");
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
                          int64_t n, const float* bias, void* out, DType out_dtype) {
  if (t == 0 || n == 0) return;
  INFERX_CHECK(out_dtype == DType::F32 || (out_dtype == DType::BF16 && w_dtype == DType::BF16),
               "cuda backend: a matmul of {} weights cannot write {} output", dtype_name(w_dtype),
               dtype_name(out_dtype));
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
  // B (the activations) has the weight's type: 16-bit weights get converted activations.
  const void* b = x_dtype == w_dtype ? x : activations_as(static_cast<const float*>(x), t * k, w_dtype);
  lt_.evict_if_full();
  const LtOperands ops{w, b, out, bias, nullptr, nullptr};
  const LtShape shape =
      lt_shape(w_type, n, t, k, n, ops, out_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F);
  if (LtMatmul::Plan* plan = lt_.plan(shape, ops)) {
    CUBLAS_CHECK(lt_.run(*plan, ops));
    if (bias && !LtMatmul::fused_bias(*plan)) {
      INFERX_CHECK(out_dtype == DType::F32,
                   "cuda backend: no cuBLASLt bias epilogue for a BF16-output matmul [{}, {}] x [{}, {}]^T",
                   t, k, n, k);
      CUDA_CHECK(launch_add_bias(static_cast<float*>(out), bias, t, n, stream_));
    }
    return;
  }
  INFERX_CHECK(n <= INT_MAX && t <= INT_MAX && k <= INT_MAX,
               "cuda backend: matmul [{}, {}] x [{}, {}]^T is too large for the cuBLAS fallback", t, k, n, k);
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t),
                            static_cast<int>(k), &alpha, w, w_type, static_cast<int>(k), b, w_type,
                            static_cast<int>(k), &beta, out, shape.d_type, static_cast<int>(n),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (bias) {
    INFERX_CHECK(out_dtype == DType::F32, "cuda backend: a BF16-output matmul cannot add a bias");
    CUDA_CHECK(launch_add_bias(static_cast<float*>(out), bias, t, n, stream_));
  }
}

}  // namespace inferx::cuda
