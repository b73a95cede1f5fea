// The persistent batch-1 decode kernel (Backend::decode_stack, kernels_decode_stack.h) against the
// per-op kernels on the same model, cache layout and tokens: a prompt, then decode steps fed with the
// per-op path's greedy tokens, the logits of every decode step compared. Shapes cover head dims 64 and
// 128, 1 to 8 query heads per KV head, q/k/v biases (Qwen2), a sliding window shorter than the context,
// FP8 weights (per channel, and the vocabulary projection), INT4 weights (groups of 32 and 128, symmetric
// and with zero points) and an FP8 KV cache, the cached keys and values copied a block at a time (tensor
// maps, the default) or per key, the producer's in-flight stage limit (0 = the ring's depth, 1
// by default, 2, 3), contexts whose splits take several ring stages of keys, and the kernel's generic
// instance as well as those for one weight format (mixed formats, e.g. FP8 layers with a BF16 vocabulary
// projection, run the generic one). Decode steps run through SequenceRunner, so they are recorded into a
// CUDA graph and replayed, as in serving.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/model.h"
#include "quant/plan.h"

namespace inferx {
namespace {

struct Case {
  const char* model;
  const char* quantize;  // "" for BF16 weights
  DType kv = DType::BF16;
  int64_t window = 0;  // Model::set_sliding_window when > 0
  int prompt = 300;    // tokens before the decode steps (crosses 16-token blocks and attention splits)
  int steps = 12;
  int inflight = 1;        // the producer's in-flight stage limit (CudaBackendOptions::decode_stack_inflight,
                           // 1 by default; 0: the ring's depth)
  bool generic = false;    // the kernel's generic instance instead of the one for the model's weight format
  bool mlp_split = false;  // CudaBackendOptions::decode_stack_mlp_split (taken where every down is BF16)
  bool kv_tiles = true;    // CudaBackendOptions::decode_stack_kv_tiles (false: one bulk copy per key)
};

struct Trace {
  std::vector<int32_t> tokens;             // the decode inputs (from the per-op run)
  std::vector<std::vector<float>> logits;  // one vector per decode step
};

std::vector<int32_t> prompt_tokens(int n, int32_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return p;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Runs prompt + steps; feeds `forced` tokens when given, else the greedy token of each step.
Trace run(Model& model, const Case& c, bool stack, const std::vector<int32_t>& forced) {
  auto& cuda = static_cast<CudaBackend&>(model.backend());
  cuda.set_decode_stack(stack, c.inflight, c.generic);  // off by default (cuda_backend.h)
  cuda.set_decode_stack_mlp_split(stack && c.mlp_split);
  cuda.set_decode_stack_kv_tiles(c.kv_tiles);
  cuda.set_decode_stack_max_context(1 << 30);  // every context here (the default stops at 2048 tokens)
  Trace t;
  SequenceRunner runner(model, c.prompt + c.steps + 1);
  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  std::vector<float> logits = runner.step(prompt_tokens(c.prompt, vocab));
  for (int s = 0; s < c.steps; ++s) {
    const int32_t next = forced.empty() ? argmax(logits) : forced[static_cast<size_t>(s)];
    t.tokens.push_back(next);
    logits = runner.step({next});
    t.logits.push_back(logits);
  }
  cuda.set_decode_stack(false);
  return t;
}

// sqrt(sum (b - a)^2 / sum a^2) over one step's logits.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(b[i]) - a[i];
    num += d * d;
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class CudaDecodeStack : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { INFERX_SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaDecodeStack, EqualsThePerOpKernels) {
  const Case& c = GetParam();
  CudaBackendOptions opts;
  opts.kv_cache_dtype = c.kv;
  auto backend = make_cuda_backend(0, opts);
  LoadOptions lo;
  if (*c.quantize) lo.quantize = parse_quant_options(c.quantize);
  auto model = Model::load(std::string("dummy:") + c.model, *backend, lo);
  if (c.window > 0) model->set_sliding_window(c.window);

  auto& cuda = static_cast<CudaBackend&>(*backend);
  const Trace ref = run(*model, c, false, {});
  ASSERT_EQ(cuda.decode_stack_launches(), 0);
  const Trace got = run(*model, c, true, ref.tokens);
  ASSERT_GT(cuda.decode_stack_launches(), 0) << "the persistent kernel did not take " << c.model;
  // The MLP split runs where it is asked for and every down matrix is BF16 ("fp8:lm_head": FP8 ones).
  const bool bf16_down = std::string(c.quantize).empty();
  EXPECT_EQ(cuda.decode_stack_split_launches() > 0, c.mlp_split && bf16_down) << c.model;
  // The instance for the model's one weight format and head size; the generic one when asked for, or when
  // the formats mix ("fp8" keeps the vocabulary projection in BF16).
  const std::string quant = c.quantize;
  const bool mixed = !quant.empty() && quant.find("lm_head") == std::string::npos;  // BF16 vocabulary
  const std::string format = quant.empty() ? "bf16" : quant.substr(0, quant.find(':'));
  const std::string expected =
      c.generic || mixed ? "generic" : format + "_hd" + std::to_string(model->config().head_dim);
  EXPECT_EQ(std::string(cuda.decode_stack_instance()), expected);
  ASSERT_EQ(got.logits.size(), ref.logits.size());
  int argmax_checked = 0;
  for (size_t s = 0; s < ref.logits.size(); ++s) {
    const std::vector<float>& a = ref.logits[s];
    const std::vector<float>& b = got.logits[s];
    double max_abs = 0;
    bool finite = true;
    for (size_t i = 0; i < a.size(); ++i) {
      finite = finite && std::isfinite(b[i]);
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(b[i]) - a[i]));
    }
    ASSERT_TRUE(finite) << "step " << s;
    const double rel = relative_error(a, b);
    // Both paths round x to BF16 before each product and accumulate in fp32; they differ in summation
    // order (and the 8B down projection, cuBLASLt's BF16 GEMM on the per-op path).
    EXPECT_LT(rel, 2e-2) << c.model << " step " << s << " max |diff| " << max_abs;
    // The greedy token must agree wherever the per-op logits' top two are further apart than the error.
    std::vector<float> sorted = a;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 2 * max_abs) {
      EXPECT_EQ(argmax(b), argmax(a)) << c.model << " step " << s;
      ++argmax_checked;
    }
  }
  EXPECT_GT(argmax_checked, 0) << "no step had a clear greedy token";
}

// With DecodeStackMode::Bf16 (INFERX_DECODE_STACK=bf16) the kernel takes BF16 models'
// batch-1 steps, and leaves FP8 and INT4 ones to the per-op kernels (faster there, cuda_backend.h).
TEST(CudaDecodeStackBf16, TakesBf16WeightsOnly) {
  INFERX_SKIP_WITHOUT_GPU();
  CudaBackendOptions opts;
  opts.decode_stack = DecodeStackMode::Bf16;
  for (const char* quant : {"", "fp8:lm_head", "int4:lm_head"}) {
    auto backend = make_cuda_backend(0, opts);
    auto& cuda = static_cast<CudaBackend&>(*backend);
    LoadOptions lo;
    if (*quant) lo.quantize = parse_quant_options(quant);
    auto model = Model::load("dummy:tiny", *backend, lo);
    SequenceRunner runner(*model, 64);
    std::vector<float> logits = runner.step(prompt_tokens(20, 256));
    for (int s = 0; s < 3; ++s) logits = runner.step({argmax(logits)});
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    if (*quant)
      EXPECT_EQ(cuda.decode_stack_launches(), 0) << quant;
    else
      EXPECT_GT(cuda.decode_stack_launches(), 0);
  }
}

// The MLP split's sums are exact (each CTA's partial cut into two parts on fixed grids,
// kernels_decode_stack.cu), so runs of the same steps give the same bits however the CTAs' atomics arrive.
// (The first version's plain float atomics failed CudaEngine.GraphReplayEqualsEagerAtBatchOne; this test
// was written after it and has not been run against it.) Every CTA adds into every output column here
// (llama-3.2-1b: 8192 activations over the SMs, 2048 columns).
TEST(CudaDecodeStackMlpSplit, IsBitReproducible) {
  INFERX_SKIP_WITHOUT_GPU();
  auto backend = make_cuda_backend(0, CudaBackendOptions{});
  auto& cuda = static_cast<CudaBackend&>(*backend);
  auto model = Model::load("dummy:llama-3.2-1b", *backend);
  Case c{"llama-3.2-1b", ""};
  c.mlp_split = true;
  const Trace first = run(*model, c, true, {});
  ASSERT_GT(cuda.decode_stack_split_launches(), 0);
  for (int rep = 0; rep < 3; ++rep) {
    const Trace again = run(*model, c, true, first.tokens);
    ASSERT_EQ(again.logits.size(), first.logits.size());
    for (size_t s = 0; s < first.logits.size(); ++s) {
      ASSERT_EQ(
          std::memcmp(again.logits[s].data(), first.logits[s].data(), first.logits[s].size() * sizeof(float)),
          0)
          << "run " << rep + 1 << " step " << s;
    }
  }
}

// On, the kernel takes only sequences whose block tables hold at most 2048 tokens by default
// (CudaBackendOptions::decode_stack_max_context): the same model decodes per-op in a longer runner.
TEST(CudaDecodeStackBf16, LeavesLongContextsToThePerOpKernels) {
  INFERX_SKIP_WITHOUT_GPU();
  CudaBackendOptions opts;
  opts.decode_stack = DecodeStackMode::Bf16;
  for (const int capacity : {64, 2048, 2049, 4000}) {
    auto backend = make_cuda_backend(0, opts);
    auto& cuda = static_cast<CudaBackend&>(*backend);
    auto model = Model::load("dummy:tiny", *backend);
    SequenceRunner runner(*model, capacity);
    std::vector<float> logits = runner.step(prompt_tokens(20, 256));
    for (int s = 0; s < 3; ++s) logits = runner.step({argmax(logits)});
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    if (capacity <= 2048)
      EXPECT_GT(cuda.decode_stack_launches(), 0) << capacity;
    else
      EXPECT_EQ(cuda.decode_stack_launches(), 0) << capacity;
  }
}

// INFERX_DECODE_STACK_MAX_CONTEXT sets that bound. (Reads the environment only: runs without a GPU.)
TEST(CudaDecodeStackOptions, EnvironmentSetsTheContextBound) {
  EXPECT_EQ(CudaBackendOptions{}.decode_stack_max_context, 2048);
  setenv("INFERX_DECODE_STACK_MAX_CONTEXT", "8192", 1);
  EXPECT_EQ(cuda_options_from_environment().decode_stack_max_context, 8192);
  unsetenv("INFERX_DECODE_STACK_MAX_CONTEXT");
  EXPECT_EQ(cuda_options_from_environment().decode_stack_max_context, 2048);
}

// INFERX_DECODE_STACK: 0 off, 1 every weight format, bf16 BF16 weights only; unset: the options' defaults.
// (Reads the environment only: runs without a GPU.)
TEST(CudaDecodeStackOptions, EnvironmentSelectsTheFormats) {
  struct Want {
    const char* value;
    DecodeStackMode mode;
  };
  const CudaBackendOptions defaults;
  for (const Want& w : {Want{nullptr, defaults.decode_stack}, Want{"0", DecodeStackMode::Off},
                        Want{"1", DecodeStackMode::All}, Want{"bf16", DecodeStackMode::Bf16}}) {
    if (w.value)
      setenv("INFERX_DECODE_STACK", w.value, 1);
    else
      unsetenv("INFERX_DECODE_STACK");
    const CudaBackendOptions o = cuda_options_from_environment();
    EXPECT_EQ(o.decode_stack, w.mode) << (w.value ? w.value : "unset");
  }
  unsetenv("INFERX_DECODE_STACK");
}

// Shapes the kernel does not take (Qwen3's q/k norm) decode through the per-op kernels with the stack on.
TEST(CudaDecodeStackFallback, UnsupportedShapesRunThePerOpKernels) {
  INFERX_SKIP_WITHOUT_GPU();
  CudaBackendOptions opts;
  opts.decode_stack = DecodeStackMode::All;
  auto backend = make_cuda_backend(0, opts);
  auto& cuda = static_cast<CudaBackend&>(*backend);
  auto model = Model::load("dummy:qwen3-0.6b", *backend);
  SequenceRunner runner(*model, 64);
  std::vector<float> logits = runner.step(prompt_tokens(20, 1000));
  for (int s = 0; s < 4; ++s) logits = runner.step({argmax(logits)});
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(cuda.decode_stack_launches(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaDecodeStack,
    ::testing::Values(
        Case{"tiny", ""},                                   // hd 64, 2 q heads per kv head
        Case{"tiny", "", DType::F8_E4M3},                   // FP8 KV cache
        Case{"tiny", "", DType::BF16, 40, 120},             // window shorter than the context
        Case{"llama-3.2-1b", ""},                           // hd 64, 4 per kv head, tied
        Case{"llama-3-8b", "", DType::BF16, 0, 1000, 8},    // hd 128, 4 per kv head, 14336
        Case{"llama-3-8b", "fp8:lm_head", DType::F8_E4M3},  // FP8 weights and cache
        Case{"qwen2.5-7b", "", DType::BF16, 0, 200, 8},     // q/k/v biases, 7 per kv head
        Case{"mistral-7b", "fp8", DType::BF16, 100, 300, 8}, Case{"tiny", "", DType::BF16, 0, 300, 12, 2},
        Case{"llama-3-8b", "fp8:lm_head", DType::F8_E4M3, 0, 300, 12, 2},
        Case{"qwen2.5-7b", "", DType::BF16, 0, 200, 8, 3},
        Case{"tiny", "fp8:lm_head"},  // the FP8, head size 64 instance
        // INT4: groups of 32 (head size 64), 128 with an FP8 cache, zero points in the generic
        // instance (BF16 vocabulary) with a window
        Case{"tiny", "int4:g32:lm_head"}, Case{"llama-3-8b", "int4:lm_head", DType::F8_E4M3, 0, 300, 8, 1},
        Case{"mistral-7b", "int4:asym", DType::BF16, 100, 300, 8},
        Case{"llama-3-8b", "", DType::BF16, 0, 1000, 8, 0, true},
        Case{"llama-3-8b", "fp8:lm_head", DType::F8_E4M3, 0, 300, 12, 0, true},
        // the producer as deep as the ring (no in-flight limit)
        Case{"llama-3-8b", "", DType::BF16, 0, 300, 8, 0}, Case{"tiny", "", DType::BF16, 0, 300, 12, 0},
        // long contexts: a split's keys over several ring stages (16 splits per KV head on 132 SMs; 64
        // BF16 keys of head size 128 per 32 KB stage, 128 of head size 64 or FP8: ~3 and ~2 stages)
        Case{"llama-3-8b", "", DType::BF16, 0, 3000, 4}, Case{"llama-3-8b", "", DType::F8_E4M3, 0, 3000, 4},
        Case{"llama-3.2-1b", "", DType::BF16, 0, 4100, 4}, Case{"mistral-7b", "", DType::BF16, 2500, 4000, 4},
        // the MLP as one phase (mlp_split): hd 64 and 128, biases elsewhere, tied, long contexts, a window,
        // the generic instance, and an FP8 model, which keeps its two MLP phases
        Case{"tiny", "", DType::BF16, 0, 300, 12, 1, false, true},
        Case{"llama-3-8b", "", DType::BF16, 0, 1000, 8, 1, false, true},
        Case{"qwen2.5-7b", "", DType::BF16, 0, 200, 8, 1, false, true},
        Case{"llama-3.2-1b", "", DType::F8_E4M3, 0, 4100, 4, 1, false, true},
        Case{"mistral-7b", "", DType::BF16, 2500, 4000, 4, 1, false, true},
        Case{"llama-3-8b", "", DType::BF16, 0, 300, 8, 1, true, true},
        Case{"llama-3-8b", "fp8:lm_head", DType::F8_E4M3, 0, 300, 8, 1, false, true},
        // the cached keys and values copied per key instead of a block at a time (kv_tiles off): hd 64 and
        // 128, an FP8 cache, a window, a long context
        Case{"tiny", "", DType::BF16, 40, 120, 12, 1, false, false, false},
        Case{"llama-3-8b", "", DType::BF16, 0, 1000, 8, 1, false, false, false},
        Case{"llama-3-8b", "fp8:lm_head", DType::F8_E4M3, 0, 300, 8, 1, false, false, false},
        Case{"mistral-7b", "", DType::BF16, 2500, 4000, 4, 1, false, false, false}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = std::string(info.param.model) + "_" +
                      (*info.param.quantize ? info.param.quantize : "bf16") +
                      (info.param.kv == DType::F8_E4M3 ? "_kvfp8" : "") +
                      (info.param.window ? "_window" + std::to_string(info.param.window) : "") +
                      (info.param.prompt > 1000 ? "_ctx" + std::to_string(info.param.prompt) : "") +
                      (info.param.inflight != 1 ? "_inflight" + std::to_string(info.param.inflight) : "") +
                      (info.param.generic ? "_generic" : "") + (info.param.mlp_split ? "_mlpsplit" : "") +
                      (info.param.kv_tiles ? "" : "_perkey");
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

}  // namespace
}  // namespace inferx
