// --tensor-parallel-size on the CPU backend (in-process communicator): TP=2 and TP=4 against TP=1 for
// every golden fixture (tests/golden/fixtures: Llama 2 GQA, Llama 3 with RoPE scaling / rope_freqs,
// Mistral's sliding window, Qwen2's qkv bias, Qwen3's q/k norm, and the GGUF exports), prefill and decode;
// a two-sequence step; Q8_0 weights; pre-quantized AWQ / GPTQ / FP8 checkpoints; the shapes each rank
// holds; the vocabulary replicated when it does not split; and the errors for shapes that do not split.
//
// Tolerance: the ranks' o/down partial sums are added by the all-reduce instead of inside one dot
// product, so results differ from TP=1 by float32 rounding only:
//   max_v |tp[v] - ref[v]| <= kTol * max(max_v |ref[v]|, 1) per logits row, kTol = 1e-5 (about 80 float32
// ulps of the row's largest logit), and the argmax of every row agrees.
#include "model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "model/arch_registry.h"
#include "model/dummy_models.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace fs = std::filesystem;

namespace inferx {
namespace {

constexpr double kTol = 1e-5;
const std::string kFixtures = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One backend thread per rank keeps the test light on small CI machines.
struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
Loaded load(const std::string& spec, int tp, LoadOptions options = {}) {
  Loaded l;
  l.backend = make_cpu_backend({1});
  options.tensor_parallel_size = tp;
  if (!options.make_rank_backend) options.make_rank_backend = [](int) { return make_cpu_backend({1}); };
  l.model = Model::load(spec, *l.backend, options);
  return l;
}

std::vector<int32_t> fixture_ids(const std::string& dir) {
  std::ifstream f(kFixtures + dir + "/expected.json");
  EXPECT_TRUE(f.good()) << dir;
  return nlohmann::json::parse(f).at("input_ids").get<std::vector<int32_t>>();
}

// Worst relative difference over rows of [rows, vocab]; fails on a non-finite value or an argmax flip.
double compare(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab,
               const std::string& what) {
  EXPECT_EQ(ref.size(), got.size()) << what;
  if (ref.size() != got.size() || vocab <= 0) return INFINITY;
  double worst = 0;
  for (size_t row = 0; row < ref.size() / static_cast<size_t>(vocab); ++row) {
    const float* a = ref.data() + row * static_cast<size_t>(vocab);
    const float* b = got.data() + row * static_cast<size_t>(vocab);
    double max_ref = 1.0, max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      EXPECT_TRUE(std::isfinite(b[v])) << what << " row " << row;
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(a[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(b[v]) - a[v]));
    }
    worst = std::max(worst, max_diff / max_ref);
    EXPECT_EQ(std::max_element(a, a + vocab) - a, std::max_element(b, b + vocab) - b)
        << what << " row " << row;
  }
  return worst;
}

// Prefill of the first half of `ids` (every row's logits), then one decode step per remaining id.
void expect_same_as_single_rank(const std::string& spec, const std::vector<int32_t>& ids, int tp,
                                const LoadOptions& options = {}) {
  Loaded one = load(spec, 1, options), many = load(spec, tp, options);
  ASSERT_NE(many.model->tensor_parallel(), nullptr);
  const int64_t vocab = one.model->config().vocab_size;
  ASSERT_EQ(many.model->config().vocab_size, vocab);
  SequenceRunner r1(*one.model, static_cast<int64_t>(ids.size())),
      rn(*many.model, static_cast<int64_t>(ids.size()));
  const size_t half = ids.size() / 2;
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(half));
  const std::string what = spec + " tp=" + std::to_string(tp);
  double worst = compare(r1.step_all_logits(prompt), rn.step_all_logits(prompt), vocab, what + " prefill");
  for (size_t i = half; i < ids.size(); ++i) {
    const std::vector<float> a = r1.step({ids[i]}), b = rn.step({ids[i]});
    worst = std::max(worst, compare(a, b, vocab, what + " decode " + std::to_string(i)));
  }
  std::printf("%-28s tp=%d  worst relative difference %.3g\n", spec.substr(spec.rfind('/') + 1).c_str(), tp,
              worst);
  EXPECT_LE(worst, kTol) << what;
}

struct FixtureCase {
  std::string file;    // folder or .gguf under tests/golden/fixtures
  std::string folder;  // whose expected.json holds the input ids
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.file; }

class TensorParallelFixture : public ::testing::TestWithParam<std::tuple<FixtureCase, int>> {};

TEST_P(TensorParallelFixture, LogitsMatchSingleRank) {
  const auto& [c, tp] = GetParam();
  expect_same_as_single_rank(kFixtures + c.file, fixture_ids(c.folder), tp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelFixture,
                         ::testing::Combine(::testing::Values(FixtureCase{"llama-tiny", "llama-tiny"},
                                                              FixtureCase{"llama3-tiny", "llama3-tiny"},
                                                              FixtureCase{"mistral-tiny", "mistral-tiny"},
                                                              FixtureCase{"qwen2-tiny", "qwen2-tiny"},
                                                              FixtureCase{"qwen3-tiny", "qwen3-tiny"},
                                                              FixtureCase{"llama-tiny.gguf", "llama-tiny"},
                                                              FixtureCase{"qwen2-tiny.gguf", "qwen2-tiny"},
                                                              FixtureCase{"llama3-tiny.gguf", "llama3-tiny"}),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string name =
                               std::get<0>(info.param).file + "_tp" + std::to_string(std::get<1>(info.param));
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(TensorParallel, LlamaThreeSplitsEightWays) {
  // 8 heads, 2 KV heads (each on 4 ranks), MLP 96 = 8 x 12, vocabulary 128 = 8 x 16.
  expect_same_as_single_rank(kFixtures + "llama3-tiny", fixture_ids("llama3-tiny"), 8);
}

TEST(TensorParallel, QuantizedWeightsSplitOnBlockBoundaries) {
  // dummy:tiny: 4 heads of 64, MLP 512; Q8_0 blocks of 32 columns.
  const std::vector<int32_t> ids = {1, 17, 300, 42, 511, 7, 99, 256, 3, 128};
  expect_same_as_single_rank("dummy:tiny:q8_0", ids, 2);
  expect_same_as_single_rank("dummy:tiny:q4_0", ids, 4);
}

TEST(TensorParallel, QuantizedLmHeadSplitsByVocabularyRows) {
  // The ranks quantize their vocabulary rows of the float lm_head (own tensor, and tied to the embedding):
  // per-row scales make that the same bytes as slicing the quantized whole. (The logits of a whole INT4
  // plan differ with the rank count: o/down's slices of K take other groups.)
  LoadOptions o;
  o.quantize = parse_quant_options("int4:lm_head");
  for (const char* name : {"llama-tiny", "llama3-tiny"}) {
    Loaded one = load(kFixtures + name, 1, o), two = load(kFixtures + name, 2, o);
    const Linear& whole = one.model->weights().lm_head;
    ASSERT_EQ(whole.weight.dtype, DType::INT4) << name;
    const int64_t rows = whole.out_features() / 2, row_bytes = whole.in_features() / 2,
                  groups = whole.scale.dim(1);
    for (int r = 0; r < 2; ++r) {
      const Linear& part = two.model->tensor_parallel()->rank_model(r).weights().lm_head;
      ASSERT_EQ(part.weight.dtype, DType::INT4) << name;
      ASSERT_EQ(part.out_features(), rows) << name;
      ASSERT_EQ(part.scale.dim(1), groups) << name;
      EXPECT_EQ(std::memcmp(part.weight.data, whole.weight.ptr<uint8_t>() + r * rows * row_bytes,
                            static_cast<size_t>(rows * row_bytes)),
                0)
          << name << " rank " << r;
      EXPECT_EQ(std::memcmp(part.scale.data, whole.scale.ptr<uint16_t>() + r * rows * groups,
                            static_cast<size_t>(rows * groups * 2)),
                0)
          << name << " rank " << r;
    }
  }
}

// Pre-quantized Hugging Face checkpoints (tests/unit/model/fixtures, tools/make_quantized_fixtures.py): the
// ranks slice the packed tensors, their scales and zero points. AWQ and GPTQ (weight-only INT4: the CPU
// backend's activations are quantized in blocks of 32, which the split keeps) match TP=1 to float32
// rounding; the "-tp" fixtures have an MLP of 128 so that down's 64 input columns per rank are whole groups.
const std::string kQuantFixtures = std::string(INFERX_SOURCE_DIR) + "/tests/unit/model/fixtures/";
const std::vector<int32_t> kQuantIds = {1, 17, 200, 42, 255, 7, 99, 128, 3, 64};

TEST(TensorParallel, PrequantizedInt4CheckpointsSplit) {
  for (const char* name : {"awq-tp-tiny", "gptq-tp-tiny"}) {
    SCOPED_TRACE(name);
    expect_same_as_single_rank(kQuantFixtures + name, kQuantIds, 2);
  }
}

// FP8 (compressed-tensors): every rank holds exactly its slice of the checkpoint's codes and scales (per
// output channel: o / down keep all their scales). Logits are not compared to float32 rounding: W8A8
// quantizes each rank's slice of the o / down input with its own per-token scale (as vLLM's tensor
// parallelism does), which changes activation codes: on these random tiny models TP=2 differs from TP=1 by
// up to 4.8% of a row's largest logit, with one argmax flip in 30 rows (measured 2026-12-04). A per-token
// all-reduce of the row maximum before each row-parallel product would make them equal, at two small
// collectives per layer on every decode step.
TEST(TensorParallel, PrequantizedFp8CheckpointSlicesAreExact) {
  for (const char* name : {"fp8-channel-tiny", "fp8-tensor-tiny", "fp8-channel-tp-tiny"}) {
    SCOPED_TRACE(name);
    Loaded one = load(kQuantFixtures + name, 1), two = load(kQuantFixtures + name, 2);
    const LayerWeights& whole = one.model->weights().layers[0];
    for (int r = 0; r < 2; ++r) {
      const LayerWeights& part = two.model->tensor_parallel()->rank_model(r).weights().layers[0];
      // Column-parallel q (rows) and row-parallel down (columns).
      const Linear* cases[][2] = {{&whole.q, &part.q}, {&whole.down, &part.down}};
      for (const auto& [w, p] : cases) {
        ASSERT_EQ(p->weight.dtype, DType::F8_E4M3);
        const bool rows = p->in_features() == w->in_features();
        const int64_t n = p->out_features(), k = p->in_features();
        for (int64_t i = 0; i < n; ++i) {
          const int64_t src_row = rows ? r * n + i : i, src_col = rows ? 0 : r * k;
          ASSERT_EQ(std::memcmp(p->weight.ptr<uint8_t>() + i * k,
                                w->weight.ptr<uint8_t>() + src_row * w->in_features() + src_col,
                                static_cast<size_t>(k)),
                    0)
              << "rank " << r << " row " << i;
          const int64_t si = w->scale.numel() == 1 ? 0 : src_row, pi = p->scale.numel() == 1 ? 0 : i;
          ASSERT_EQ(p->scale.ptr<float>()[pi], w->scale.ptr<float>()[si]) << "rank " << r << " row " << i;
        }
      }
    }
    SequenceRunner runner(*two.model, 8);
    for (float v : runner.step({1, 5, 9})) ASSERT_TRUE(std::isfinite(v));
  }
}

// A weights file in memory, for the rank views' byte-level checks.
class MemorySource final : public TensorSource {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, size_t bytes) {
    Item& it = items_[name];
    it.bytes.resize(bytes);
    for (size_t i = 0; i < bytes; ++i) it.bytes[i] = static_cast<uint8_t>((i * 7 + name.size()) % 251);
    it.entry = {name, dtype, std::move(shape), it.bytes.data(), bytes, "memory"};
  }
  const TensorEntry* find(std::string_view name) const override {
    auto it = items_.find(std::string(name));
    return it == items_.end() ? nullptr : &it->second.entry;
  }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> v;
    for (const auto& [name, item] : items_) v.push_back(name);
    return v;
  }
  std::string describe() const override { return "memory"; }

 private:
  struct Item {
    TensorEntry entry;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Item> items_;
};

// The InferX checkpoint layout (docs/quantized-checkpoint.md): FP8 rows with per-channel scales, and INT4
// weights (U8 [n, k/2], runs of 32 columns) whose input columns, F16 group scales and zero points a
// row-parallel split cuts on group boundaries - byte for byte what each rank's view holds.
TEST(TensorParallel, RankViewsSliceTheInferXQuantizedLayout) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.vocab_size = 256;
  MemorySource base;
  const std::string L = "model.layers.0.";
  base.add(L + "self_attn.q_proj.weight", DType::F8_E4M3, {64, 64}, 64 * 64);
  base.add(L + "self_attn.q_proj.weight_scale", DType::F32, {64}, 64 * 4);
  base.add(L + "self_attn.o_proj.weight", DType::U8, {64, 32}, 64 * 32);  // k = 64, two columns a byte
  base.add(L + "self_attn.o_proj.weight_scale", DType::F16, {64, 2}, 64 * 2 * 2);  // groups of 32
  base.add(L + "self_attn.o_proj.weight_zero_point", DType::U8, {64, 2}, 64 * 2);
  base.add(L + "mlp.down_proj.weight", DType::U8, {64, 64}, 64 * 64);  // k = 128
  base.add(L + "mlp.down_proj.weight_scale", DType::F16, {64, 4}, 64 * 4 * 2);
  const TensorParallelPlan plan = plan_tensor_parallel(c, 2);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    auto view = make_rank_source(base, c, WeightNaming::HuggingFace, plan, r);
    // A [rows, cols] slice of `name` (element size `es`) starting at (row0, col0) of the whole.
    auto expect_slice = [&](const std::string& name, std::vector<int64_t> shape, int64_t row0, int64_t col0,
                            int64_t es) {
      const TensorEntry* whole = base.find(name);
      const TensorEntry* part = view->find(name);
      ASSERT_TRUE(whole && part) << name;
      ASSERT_EQ(part->shape, shape) << name;
      const int64_t rows = shape.size() == 2 ? shape[0] : 1, cols = shape.back();
      const int64_t whole_cols = whole->shape.back();
      ASSERT_EQ(part->nbytes, static_cast<uint64_t>(rows * cols * es)) << name;
      for (int64_t i = 0; i < rows; ++i)
        ASSERT_EQ(std::memcmp(part->data + i * cols * es, whole->data + ((row0 + i) * whole_cols + col0) * es,
                              static_cast<size_t>(cols * es)),
                  0)
            << name << " row " << i;
    };
    expect_slice(L + "self_attn.q_proj.weight", {32, 64}, 32 * r, 0, 1);
    expect_slice(L + "self_attn.q_proj.weight_scale", {32}, 0, 32 * r, 4);
    expect_slice(L + "self_attn.o_proj.weight", {64, 16}, 0, 16 * r, 1);
    expect_slice(L + "self_attn.o_proj.weight_scale", {64, 1}, 0, r, 2);
    expect_slice(L + "self_attn.o_proj.weight_zero_point", {64, 1}, 0, r, 1);
    expect_slice(L + "mlp.down_proj.weight", {64, 32}, 0, 32 * r, 1);
    expect_slice(L + "mlp.down_proj.weight_scale", {64, 2}, 0, 2 * r, 2);
  }
}

TEST(TensorParallel, PrequantizedSplitsThatCutAGroupAreRefused) {
  // awq-tiny: down's 96 input columns are 48 per rank of 2, groups of 32.
  std::string msg = error_of([] { load(kQuantFixtures + "awq-tiny", 2); });
  EXPECT_NE(msg.find("groups of 32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tensor-parallel-size 2"), std::string::npos) << msg;
  // awq-tp-tiny over 4 ranks: o's 64 input columns are 16 per rank.
  msg = error_of([] { load(kQuantFixtures + "awq-tp-tiny", 4); });
  EXPECT_NE(msg.find("groups of 32"), std::string::npos) << msg;
  // GPTQ act-order: the groups span the whole input.
  msg = error_of([] { load(kQuantFixtures + "gptq-actorder-tiny", 2); });
  EXPECT_NE(msg.find("desc_act"), std::string::npos) << msg;
}

TEST(TensorParallel, BlockFormatThatWouldBeCutIsRefused) {
  // Q4_K blocks hold 256 columns; o's 256 input columns over 2 ranks are 128 each.
  const std::string msg = error_of([] { load("dummy:tiny:q4_k", 2); });
  EXPECT_NE(msg.find("blocks of 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tensor-parallel-size 2"), std::string::npos) << msg;
}

// A step's metadata in host memory (the CPU backend's), one block table row per sequence, laid out as
// one BatchLayout block as every builder does (TensorParallel::forward broadcasts that block).
struct HostBatch {
  std::vector<int32_t> ids, pos, qs, lens, tables, rows;
  int32_t max_blocks = 4;
  int32_t decode_prefix = 0;             // BatchView::num_decode_prefix (the engine's mixed steps: > 0)
  mutable std::vector<int32_t> block{};  // view()'s storage
  BatchView view() const {
    const BatchLayout layout(static_cast<int32_t>(ids.size()), static_cast<int32_t>(lens.size()), max_blocks,
                             static_cast<int32_t>(rows.size()));
    block.clear();
    for (const std::vector<int32_t>* part : {&ids, &pos, &qs, &lens, &tables, &rows})
      block.insert(block.end(), part->begin(), part->end());
    EXPECT_EQ(block.size(), layout.total());
    BatchView b = layout.view(block.data());
    b.max_query_len = 0;
    for (size_t s = 0; s + 1 < qs.size(); ++s) b.max_query_len = std::max(b.max_query_len, qs[s + 1] - qs[s]);
    b.max_seq_len = *std::max_element(lens.begin(), lens.end());
    b.num_decode_prefix = decode_prefix;
    return b;
  }
};

std::vector<float> run_step(Model& m, KvCache& cache, const HostBatch& hb) {
  Tensor t = m.forward(hb.view(), cache);
  return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
}

// Model::set_last_layer_logit_rows_only (the default): a step whose rows do not all need logits finishes
// the last layer (o projection, MLP, final norm) on the gathered logits rows only. Same logits as running
// every row, for a prefill with 2 of 3 rows and a mixed step (a 5-token chunk with logits on rows 2 and 4
// beside a decode), on architectures with and without q/k/v biases and q/k norms; the cache it leaves is the
// same too (the next step's logits match).
TEST(ModelForward, LastLayerOnTheLogitsRowsMatchesEveryRow) {
  for (const char* fixture : {"llama-tiny", "qwen2-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(fixture);
    Loaded narrow = load(kFixtures + fixture, 1), every = load(kFixtures + fixture, 1);
    narrow.model->set_last_layer_logit_rows_only(true);
    every.model->set_last_layer_logit_rows_only(false);
    const int64_t vocab = narrow.model->config().vocab_size;
    KvCache cn(*narrow.model, 8, 4), ce(*every.model, 8, 4);
    const HostBatch first{{9, 8, 7}, {0, 1, 2}, {0, 3}, {3}, {4, 5, 6, 7}, {2, 0}};
    EXPECT_LE(
        compare(run_step(*every.model, ce, first), run_step(*narrow.model, cn, first), vocab, "prefill"),
        kTol);
    const HostBatch mixed{{5, 6, 7, 8, 9, 33},      {0, 1, 2, 3, 4, 3}, {0, 5, 6}, {5, 4},
                          {0, 1, 2, 3, 4, 5, 6, 7}, {2, 4, 5}};
    const std::vector<float> a = run_step(*every.model, ce, mixed), b = run_step(*narrow.model, cn, mixed);
    ASSERT_EQ(b.size(), static_cast<size_t>(3 * vocab));
    EXPECT_LE(compare(a, b, vocab, "mixed step"), kTol);
    const HostBatch next{{40, 41}, {5, 4}, {0, 1, 2}, {6, 5}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1}};
    EXPECT_LE(compare(run_step(*every.model, ce, next), run_step(*narrow.model, cn, next), vocab, "next"),
              kTol);
  }
}

// A backend that counts the gathers of the narrowed last layer (Model::forward) and sets the two properties
// the narrowing asks of a backend: its product row tile and whether it narrows steps with decode rows.
struct NarrowingProbe : ForwardingBackend {
  using ForwardingBackend::ForwardingBackend;
  int64_t tile = 1;
  bool mixed = true;
  int gathers = 0;
  int64_t product_row_tile() const override { return tile; }
  bool narrows_mixed_steps() const override { return mixed; }
  void gather_rows(const Tensor& x, const int32_t* rows, int64_t n, Tensor& out) override {
    ++gathers;
    ForwardingBackend::gather_rows(x, rows, n, out);
  }
};

// The narrowing engages only when it leaves out at least Backend::product_row_tile() rows: a backend that
// multiplies in tiles of 4 rows gathers once (the logits rows after the final norm) for a step that would
// leave out 3 rows, twice (the attention output and the residual before the o projection) for one that
// leaves out 4; the CPU (tile 1) narrows both. Same logits either way.
TEST(ModelForward, LastLayerNarrowsOnlyWhenItSavesARowTile) {
  auto cpu = make_cpu_backend({1});
  for (int64_t tile : {1, 4}) {
    NarrowingProbe be(*cpu);
    be.tile = tile;
    auto model = Model::load(kFixtures + "llama-tiny", be);
    model->set_last_layer_logit_rows_only(true);
    const int64_t vocab = model->config().vocab_size;
    for (int32_t n : {4, 5}) {  // leaves out 3, then 4 rows
      SCOPED_TRACE(::testing::Message() << "tile " << tile << " rows " << n);
      KvCache cache(*model, 8, 4);
      HostBatch b;
      for (int32_t i = 0; i < n; ++i) b.ids.push_back(7 + i), b.pos.push_back(i);
      b.qs = {0, n};
      b.lens = {n};
      b.tables = {0, 1, 2, 3};
      b.rows = {n - 1};
      be.gathers = 0;
      const std::vector<float> got = run_step(*model, cache, b);
      EXPECT_EQ(be.gathers, n - 1 >= tile ? 2 : 1);
      model->set_last_layer_logit_rows_only(false);
      KvCache every(*model, 8, 4);
      EXPECT_LE(compare(run_step(*model, every, b), got, vocab, "narrowed or not"), kTol);
      model->set_last_layer_logit_rows_only(true);
    }
  }
}

// Steps with decode rows (BatchView::num_decode_prefix > 0, the engine's mixed steps) narrow only where the
// backend says so (Backend::narrows_mixed_steps: the CPU yes; CUDA no - narrowing them made the served
// 1000 x 1000/1000 run 2.3% slower on an H100, 2026-12-05). A pure prefill narrows either way (two
// gathers); a step with a decode first narrows only when mixed steps may (else one gather, after the final
// norm). Same logits either way.
TEST(ModelForward, LastLayerNarrowsStepsWithDecodeRowsOnlyWhereTheBackendSaysSo) {
  auto cpu = make_cpu_backend({1});
  EXPECT_TRUE(cpu->narrows_mixed_steps());
  NarrowingProbe be(*cpu);
  auto model = Model::load(kFixtures + "llama-tiny", be);
  const int64_t vocab = model->config().vocab_size;
  // Sequence 0: a 3-token prompt first (pure prefill), then one decode token beside sequence 1's 5-token
  // chunk, the decode first as the engine orders them.
  const HostBatch prompt{{9, 8, 7}, {0, 1, 2}, {0, 3}, {3}, {0, 1, 2, 3}, {2}};
  HostBatch mixed{
      {33, 5, 6, 7, 8, 9}, {3, 0, 1, 2, 3, 4}, {0, 1, 6}, {4, 5}, {0, 1, 2, 3, 4, 5, 6, 7}, {0, 5}};
  mixed.decode_prefix = 1;
  const auto run = [&](bool narrow, bool mixed_ok, int expect_prefill, int expect_mixed) {
    SCOPED_TRACE(::testing::Message() << "narrowed " << narrow << ", mixed steps " << mixed_ok);
    model->set_last_layer_logit_rows_only(narrow);
    be.mixed = mixed_ok;
    KvCache cache(*model, 8, 4);
    be.gathers = 0;
    (void)run_step(*model, cache, prompt);
    EXPECT_EQ(be.gathers, expect_prefill);
    be.gathers = 0;
    std::vector<float> logits = run_step(*model, cache, mixed);
    EXPECT_EQ(be.gathers, expect_mixed);
    return logits;
  };
  const std::vector<float> every = run(false, true, 1, 1);
  ASSERT_EQ(every.size(), static_cast<size_t>(2 * vocab));
  EXPECT_LE(compare(every, run(true, true, 2, 2), vocab, "mixed steps narrowed"), kTol);
  EXPECT_LE(compare(every, run(true, false, 2, 1), vocab, "pure prefill narrowed only"), kTol);
}

// LoadOptions::tensor_parallel_path: one rank through the tensor-parallel model (what one GPU uses to run
// the multi-GPU code: collectives of one rank, the metadata broadcast, the vocabulary-shard embedding).
TEST(TensorParallel, OneRankPathEqualsThePlainModel) {
  LoadOptions path;
  path.tensor_parallel_path = true;
  Loaded plain = load(kFixtures + "qwen3-tiny", 1), one = load(kFixtures + "qwen3-tiny", 1, path);
  ASSERT_EQ(plain.model->tensor_parallel(), nullptr);
  ASSERT_NE(one.model->tensor_parallel(), nullptr);
  const std::vector<int32_t> ids = fixture_ids("qwen3-tiny");
  const int64_t vocab = plain.model->config().vocab_size;
  SequenceRunner a(*plain.model, static_cast<int64_t>(ids.size())),
      b(*one.model, static_cast<int64_t>(ids.size()));
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(ids.size() / 2));
  double worst = compare(a.step_all_logits(prompt), b.step_all_logits(prompt), vocab, "prefill");
  for (size_t i = ids.size() / 2; i < ids.size(); ++i)
    worst = std::max(worst, compare(a.step({ids[i]}), b.step({ids[i]}), vocab, "decode"));
  EXPECT_LE(worst, kTol);
}

// Dummy weights without host bytes (a GPU's): each rank's slice is generated as its block of the whole
// tensor's values (RandomFill regions), so TP = N on GPUs loads what TP = 1 loads, without host copies.
TEST(TensorParallel, DummySlicesAreBlocksOfTheWholeTensorsFill) {
  const ModelConfig c = dummy_model_config("tiny");
  auto base = make_dummy_source("tiny", c, DType::BF16, 3, /*host_data=*/false);
  const TensorParallelPlan plan = plan_tensor_parallel(c, 2);
  auto rank1 = make_rank_source(*base, c, WeightNaming::HuggingFace, plan, 1);
  const TensorNames& n = tensor_names(WeightNaming::HuggingFace);
  const int64_t D = c.hidden_size, qd = c.num_heads * c.head_dim, F = c.intermediate_size;
  struct Expect {
    std::string name;
    int64_t full_cols, row0, col0;
  };
  const std::vector<Expect> cases = {
      {layer_tensor_name(n.q, 0), D, qd / 2, 0},
      {layer_tensor_name(n.k, 1), D, c.num_kv_heads * c.head_dim / 2, 0},
      {layer_tensor_name(n.gate, 0), D, F / 2, 0},
      {layer_tensor_name(n.o, 0), qd, 0, qd / 2},
      {layer_tensor_name(n.down, 1), F, 0, F / 2},
      {n.token_embedding, D, c.vocab_size / 2, 0},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.name);
    const TensorEntry* t = rank1->find(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->data, nullptr);
    const RandomFill* whole = base->random_fill(e.name);
    const RandomFill* f = rank1->random_fill(e.name);
    ASSERT_NE(whole, nullptr);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->seed, whole->seed);
    EXPECT_EQ(f->amplitude, whole->amplitude);
    EXPECT_EQ(f->full_cols, e.full_cols);
    EXPECT_EQ(f->row0, e.row0);
    EXPECT_EQ(f->col0, e.col0);
  }
  // Replicated tensors keep the whole tensor's fill.
  const std::string norm = layer_tensor_name(n.attn_norm, 0);
  ASSERT_NE(rank1->random_fill(norm), nullptr);
  EXPECT_EQ(rank1->random_fill(norm)->full_cols, 0);
}

// Every rank keeps the same KV cache type (the CLI makes GPU ranks with rank 0's --kv-cache-dtype; a rank
// backend in another type is refused at load, naming both).
TEST(TensorParallel, RanksMustKeepOneKvCacheType) {
  struct OwnsCpu {
    std::unique_ptr<Backend> cpu = make_cpu_backend({1});
  };
  class Bf16KvBackend final : private OwnsCpu, public ForwardingBackend {
   public:
    Bf16KvBackend() : ForwardingBackend(*cpu) {}
    DType kv_cache_dtype() const override { return DType::BF16; }
  };
  LoadOptions o;
  o.make_rank_backend = [](int) { return std::make_unique<Bf16KvBackend>(); };
  const std::string msg = error_of([&] { load(kFixtures + "llama-tiny", 2, o); });
  EXPECT_NE(msg.find("rank 1's backend keeps a BF16 KV cache, rank 0's a F32 one"), std::string::npos) << msg;
}

// A rank backend over the CPU that pretends to record CUDA graphs (it keeps the keys it ends with) and fails
// one op on request: what the failure path of a tensor-parallel step must handle on the GPU.
struct CpuHolder {
  std::unique_ptr<Backend> cpu = make_cpu_backend({1});
};
class RecordingRank final : private CpuHolder, public ForwardingBackend {
 public:
  RecordingRank() : ForwardingBackend(*cpu) {}
  bool begin_graph_capture() override { return capturing = true; }
  void end_graph_capture(uint64_t key, bool keep) override {
    if (!capturing) return;
    capturing = false;
    if (keep) graphs.insert(key);
  }
  bool has_graph(uint64_t key) const override { return graphs.count(key) > 0; }
  void drop_graph(uint64_t key) override { graphs.erase(key); }
  void clear_graphs() override { graphs.clear(); }
  void embedding(const Tensor& table, const int32_t* ids, int64_t n, Tensor& out) override {
    if (fail_embedding) throw Error("injected: embedding failed");
    ForwardingBackend::embedding(table, ids, n, out);
  }
  void embedding_shard(const Tensor& table, const int32_t* ids, int64_t n, int64_t first_id,
                       Tensor& out) override {
    if (fail_embedding) throw Error("injected: embedding failed");
    ForwardingBackend::embedding_shard(table, ids, n, first_id, out);
  }
  void interleave_row_blocks(const Tensor& x, int64_t blocks, Tensor& out) override {
    if (fail_interleave) throw Error("injected: interleave failed");
    ForwardingBackend::interleave_row_blocks(x, blocks, out);
  }
  bool capturing = false, fail_embedding = false, fail_interleave = false;
  std::set<uint64_t> graphs;
};

// The CPU group, reporting NCCL's abort semantics when `waits` (abort_waits_for_graphs): then an abort made
// while a rank still holds a recording is counted as a violation (NCCL would wait for it forever).
class WatchedComm final : public Communicator {
 public:
  WatchedComm(std::unique_ptr<Communicator> inner, std::vector<RecordingRank*> ranks, bool waits,
              std::atomic<int>& aborts, std::atomic<int>& violations)
      : inner_(std::move(inner)),
        ranks_(std::move(ranks)),
        waits_(waits),
        aborts_(aborts),
        violations_(violations) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  void all_reduce_sum(Tensor& x) override { inner_->all_reduce_sum(x); }
  void all_gather(const Tensor& in, Tensor& out) override { inner_->all_gather(in, out); }
  void broadcast(Tensor& x, int root) override { inner_->broadcast(x, root); }
  void barrier() override { inner_->barrier(); }
  bool abort_waits_for_graphs() const override { return waits_; }
  void abort() override {
    if (waits_)
      for (const RecordingRank* r : ranks_)
        if (r->capturing || !r->graphs.empty()) ++violations_;
    ++aborts_;
    inner_->abort();
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::vector<RecordingRank*> ranks_;
  bool waits_;
  std::atomic<int>&aborts_, &violations_;
};

// A step that fails after graphs were recorded: with NCCL's semantics every rank's recordings are dropped
// (a capture in progress discarded) before any communicator is aborted - an abort first would wait for
// them forever - and the group refuses further steps. With the CPU group's, the failing rank aborts at
// once, so that peers blocked in a host-side collective wake (no hang).
TEST(TensorParallel, AFailedStepDropsTheRecordingsBeforeAborting) {
  for (bool nccl_like : {true, false}) {
    SCOPED_TRACE(nccl_like ? "NCCL-like abort" : "CPU group");
    auto rank0 = std::make_unique<RecordingRank>();
    std::vector<RecordingRank*> ranks = {rank0.get()};
    std::atomic<int> aborts{0}, violations{0};
    LoadOptions o;
    o.tensor_parallel_size = 2;
    o.make_rank_backend = [&](int) {
      auto b = std::make_unique<RecordingRank>();
      ranks.push_back(b.get());
      return b;
    };
    o.make_communicators = [&](const std::vector<Backend*>&) {
      std::vector<std::unique_ptr<Communicator>> out;
      for (auto& c : make_cpu_communicators(2))
        out.push_back(std::make_unique<WatchedComm>(std::move(c), ranks, nccl_like, aborts, violations));
      return out;
    };
    auto model = Model::load(kFixtures + "llama-tiny", *rank0, o);
    SequenceRunner runner(*model, 16);
    Backend& group = model->backend();  // the tensor-parallel backend: capture on every rank
    ASSERT_TRUE(group.begin_graph_capture());
    runner.step_all_logits({1, 5, 9});
    group.end_graph_capture(42);
    for (const RecordingRank* r : ranks) ASSERT_TRUE(r->has_graph(42));
    // NCCL-like: rank 0 fails after the step's last collective (no peer waits on the host); CPU group:
    // rank 1 fails before its first all-reduce, which rank 0 is already blocked in.
    ASSERT_TRUE(group.begin_graph_capture());  // and a capture in progress when it fails
    (nccl_like ? ranks[0]->fail_interleave : ranks[1]->fail_embedding) = true;
    const std::string msg = error_of([&] { runner.step_all_logits({7, 3}); });
    EXPECT_NE(msg.find("injected"), std::string::npos) << msg;
    EXPECT_EQ(violations.load(), 0) << "a communicator was aborted while a rank still held a recording";
    EXPECT_GE(aborts.load(), 2);
    for (const RecordingRank* r : ranks) EXPECT_TRUE(!r->capturing && r->graphs.empty());
    ranks[0]->fail_interleave = ranks[1]->fail_embedding = false;
    const std::string next = error_of([&] { runner.step({4}); });
    EXPECT_NE(next.find("no further steps after a failed one"), std::string::npos) << next;
    group.end_graph_capture(0, false);  // what the engine does after a failed capture: nothing left to end
  }
}

// The load checks the group with one all-reduce and one broadcast: a group whose collectives do not
// combine the ranks fails the load with the numbers (on GPUs: NCCL or peer access broken), not the first
// request.
TEST(TensorParallel, AGroupThatCannotCommunicateFailsTheLoad) {
  class NoSum final : public Communicator {
   public:
    explicit NoSum(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    Device device() const override { return inner_->device(); }
    void all_reduce_sum(Tensor&) override {}  // a broken link: every rank keeps its own value
    void all_gather(const Tensor& in, Tensor& out) override { inner_->all_gather(in, out); }
    void broadcast(Tensor& x, int root) override { inner_->broadcast(x, root); }
    void barrier() override { inner_->barrier(); }
    void abort() override { inner_->abort(); }

   private:
    std::unique_ptr<Communicator> inner_;
  };
  LoadOptions o;
  o.make_communicators = [](const std::vector<Backend*>&) {
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& c : make_cpu_communicators(2)) out.push_back(std::make_unique<NoSum>(std::move(c)));
    return out;
  };
  const std::string msg = error_of([&] { load(kFixtures + "llama-tiny", 2, o); });
  EXPECT_NE(msg.find("the ranks cannot communicate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all-reduce gave 1 (expected 3)"), std::string::npos) << msg;
}

TEST(TensorParallel, MetadataOutsideOneBatchLayoutBlockIsRefused) {
  Loaded two = load(kFixtures + "llama-tiny", 2);
  KvCache cache(*two.model, 4, 4);
  const HostBatch hb{{9, 8, 7}, {0, 1, 2}, {0, 3}, {3}, {0, 1, 2, 3}, {2}};
  BatchView v = hb.view();
  const std::vector<int32_t> positions(v.positions, v.positions + 3);  // the same values elsewhere
  v.positions = positions.data();
  const std::string msg = error_of([&] { two.model->forward(v, cache); });
  EXPECT_NE(msg.find("not one BatchLayout block"), std::string::npos) << msg;
}

TEST(TensorParallel, TwoSequencesInOneStep) {
  // Sequence 1 prefills 3 tokens into blocks 4..7; then one step prefills sequence 0 (5 tokens, blocks
  // 0..3, logits of 2 of them) next to sequence 1's decode of its 4th token: 3 logits rows gathered
  // from the ranks in order.
  Loaded one = load(kFixtures + "llama-tiny", 1), two = load(kFixtures + "llama-tiny", 2);
  const int64_t vocab = one.model->config().vocab_size;
  KvCache c1(*one.model, 8, 4), c2(*two.model, 8, 4);
  const HostBatch first{{9, 8, 7}, {0, 1, 2}, {0, 3}, {3}, {4, 5, 6, 7}, {2}};
  double worst = compare(run_step(*one.model, c1, first), run_step(*two.model, c2, first), vocab, "prefill");
  const HostBatch mixed{{5, 6, 7, 8, 9, 33},      {0, 1, 2, 3, 4, 3}, {0, 5, 6}, {5, 4},
                        {0, 1, 2, 3, 4, 5, 6, 7}, {2, 4, 5}};
  const std::vector<float> a = run_step(*one.model, c1, mixed), b = run_step(*two.model, c2, mixed);
  ASSERT_EQ(a.size(), static_cast<size_t>(3 * vocab));
  worst = std::max(worst, compare(a, b, vocab, "mixed step"));
  EXPECT_LE(worst, kTol);
}

TEST(TensorParallel, ChunkWithoutLogitsThenRest) {
  // Chunked prefill: the first chunk samples nothing (num_logits 0), the second gives every row.
  Loaded one = load(kFixtures + "qwen2-tiny", 1), two = load(kFixtures + "qwen2-tiny", 4);
  const int64_t vocab = one.model->config().vocab_size;
  KvCache c1(*one.model, 4, 4), c2(*two.model, 4, 4);
  const HostBatch chunk{{11, 12, 13, 14, 15}, {0, 1, 2, 3, 4}, {0, 5}, {5}, {0, 1, 2, 3}, {}};
  EXPECT_EQ(run_step(*two.model, c2, chunk).size(), 0u);
  run_step(*one.model, c1, chunk);
  const HostBatch rest{{16, 17, 18}, {5, 6, 7}, {0, 3}, {8}, {0, 1, 2, 3}, {0, 1, 2}};
  EXPECT_LE(compare(run_step(*one.model, c1, rest), run_step(*two.model, c2, rest), vocab, "rest"), kTol);
}

TEST(TensorParallel, RanksHoldTheirSlices) {
  // llama-tiny: hidden 64, 4 heads x 16, 2 KV heads, MLP 96, vocabulary 256.
  for (int tp : {2, 4}) {
    Loaded l = load(kFixtures + "llama-tiny", tp);
    const TensorParallel& p = *l.model->tensor_parallel();
    ASSERT_EQ(p.size(), tp);
    EXPECT_EQ(p.plan().kv_replicated, tp == 4);
    KvCache cache(*l.model, 2, 16);
    ASSERT_EQ(cache.num_shards(), tp);
    for (int r = 0; r < tp; ++r) {
      const ModelWeights& w = p.rank_model(r).weights();
      const LayerWeights& l0 = w.layers[0];
      EXPECT_EQ(l0.q.weight.dim(0), 64 / tp);
      EXPECT_EQ(l0.k.weight.dim(0), tp == 4 ? 16 : 16);  // 1 KV head each: split (tp 2) or shared (tp 4)
      EXPECT_EQ(l0.o.weight.dim(1), 64 / tp);
      EXPECT_EQ(l0.gate.weight.dim(0), 96 / tp);
      EXPECT_EQ(l0.down.weight.dim(1), 96 / tp);
      EXPECT_EQ(w.token_embedding.dim(0), 256 / tp);
      EXPECT_EQ(cache.shard(r).layer(0).k.dim(2), 1);  // this rank's KV heads only
      EXPECT_EQ(p.plan().first_kv_head(r), tp == 4 ? r / 2 : r);
    }
  }
}

// The engine sizes its block pool with KvCache::bytes_per_block(model, ...): on the CPU the ranks' caches
// share one memory, so it is their sum, which counts replicated KV heads (TP=4 over 2 KV heads holds 4).
TEST(TensorParallel, KvBytesPerBlockCountsWhatTheRanksHold) {
  Loaded one = load(kFixtures + "llama-tiny", 1);
  const int64_t full = KvCache::bytes_per_block(one.model->config(), 16);
  EXPECT_EQ(KvCache::bytes_per_block(*one.model, 16), full);
  for (int tp : {2, 4}) {
    Loaded l = load(kFixtures + "llama-tiny", tp);
    const int64_t got = KvCache::bytes_per_block(*l.model, 16);
    EXPECT_EQ(got, tp == 2 ? full : 2 * full) << "tp " << tp;
    KvCache cache(*l.model, 3, 16);
    int64_t held = 0;
    for (int r = 0; r < tp; ++r)
      for (int64_t i = 0; i < one.model->config().num_layers; ++i)
        held += cache.shard(r).layer(i).k.nbytes() + cache.shard(r).layer(i).v.nbytes();
    EXPECT_EQ(held, 3 * got) << "tp " << tp;
  }
}

TEST(TensorParallel, SlidingWindowReachesEveryRank) {
  LoadOptions o;
  Loaded one = load(kFixtures + "llama-tiny", 1, o), two = load(kFixtures + "llama-tiny", 2, o);
  one.model->set_sliding_window(4);
  two.model->set_sliding_window(4);
  EXPECT_EQ(two.model->tensor_parallel()->rank_model(1).config().sliding_window, 4);
  const std::vector<int32_t> ids = fixture_ids("llama-tiny");
  SequenceRunner r1(*one.model, 16), r2(*two.model, 16);
  EXPECT_LE(compare(r1.step_all_logits(ids), r2.step_all_logits(ids), 256, "window 4"), kTol);
}

TEST(TensorParallel, KvCacheMustComeFromTheModel) {
  Loaded l = load(kFixtures + "llama-tiny", 2);
  KvCache wrong(l.model->backend(), l.model->config(), 2, 16);
  const HostBatch hb{{1}, {0}, {0, 1}, {1}, {0, 1}, {0}, 2};
  const std::string msg = error_of([&] { l.model->forward(hb.view(), wrong); });
  EXPECT_NE(msg.find("KvCache(model"), std::string::npos) << msg;
}

TEST(TensorParallel, ShapesThatDoNotSplitAreNamed) {
  std::string msg = error_of([] { load(kFixtures + "llama-tiny", 3); });
  EXPECT_NE(msg.find("4 attention heads"), std::string::npos) << msg;
  ModelConfig c;
  c.num_heads = 12;
  c.num_kv_heads = 3;
  c.intermediate_size = 96;
  c.vocab_size = 100;
  msg = error_of([&] { plan_tensor_parallel(c, 2); });  // 3 KV heads over 2 ranks
  EXPECT_NE(msg.find("3 KV heads"), std::string::npos) << msg;
  c.num_kv_heads = 4;
  c.intermediate_size = 90;
  msg = error_of([&] { plan_tensor_parallel(c, 4); });
  EXPECT_NE(msg.find("intermediate (MLP) size 90"), std::string::npos) << msg;
  c.intermediate_size = 96;
  c.vocab_size = 101;
  const TensorParallelPlan p = plan_tensor_parallel(c, 4);  // an odd vocabulary is replicated, not refused
  EXPECT_FALSE(p.vocab_parallel);
  EXPECT_EQ(p.vocab_per_rank, 101);
  EXPECT_EQ(p.kv_heads_per_rank, 1);
  msg = error_of([&] { plan_tensor_parallel(c, 0); });
  EXPECT_NE(msg.find("[1, 64]"), std::string::npos) << msg;
}

// llama-tiny with its vocabulary cut to 255 rows: does not split over 2 ranks, so the embedding and the
// lm_head are replicated (and the logits still match).
TEST(TensorParallel, OddVocabularyIsReplicated) {
  const fs::path dir = fs::temp_directory_path() / ("inferx_tp_vocab_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    SafetensorsModel src(kFixtures + "llama-tiny");
    SafetensorsWriter w;
    for (const std::string& name : src.tensor_names()) {
      const TensorEntry& e = *src.find(name);
      std::vector<int64_t> shape = e.shape;
      uint64_t bytes = e.nbytes;
      if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
        bytes = bytes / static_cast<uint64_t>(shape[0]) * 255;
        shape[0] = 255;
      }
      w.add_tensor(name, e.dtype, shape, e.data, bytes);
    }
    w.write((dir / "model.safetensors").string());
    std::ifstream in(kFixtures + "llama-tiny/config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["vocab_size"] = 255;
    std::ofstream(dir / "config.json") << config.dump();
  }
  Loaded l = load(dir.string(), 2);
  EXPECT_FALSE(l.model->tensor_parallel()->plan().vocab_parallel);
  EXPECT_EQ(l.model->tensor_parallel()->rank_model(1).weights().token_embedding.dim(0), 255);
  std::vector<int32_t> ids = fixture_ids("llama-tiny");
  for (int32_t& id : ids) id = std::min(id, 254);
  expect_same_as_single_rank(dir.string(), ids, 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace inferx
