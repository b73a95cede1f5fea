// Quantization through the model loader: pre-quantized Hugging Face layouts (fixtures made by
// tools/make_quantized_fixtures.py) dequantize to the weights the script says they hold; plans applied
// at load; `inferx quantize` checkpoints reload to the same weights; auto plans are deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "model/calibration.h"
#include "model/model.h"
#include "model/quantized_checkpoint.h"
#include "model/quantized_linear.h"
#include "quant/fp8.h"
#include "quant/gguf_blocks.h"
#include "quant/int4.h"

namespace fs = std::filesystem;

namespace inferx {
namespace {

const std::string kFixtures = std::string(INFERX_SOURCE_DIR) + "/tests/unit/model/fixtures";
const std::string kLlamaTiny = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/llama-tiny";

std::vector<const Linear*> linears(const Model& m) {
  std::vector<const Linear*> v;
  for (const LayerWeights& l : m.weights().layers)
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) v.push_back(p);
  return v;
}

// The [out, in] float weight a Linear represents, in the original input-column order.
std::vector<float> dequantize(const Linear& l) {
  const int64_t n = l.out_features(), k = l.in_features();
  std::vector<float> w(static_cast<size_t>(n * k)), row(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    const auto* base = static_cast<const uint8_t*>(l.weight.data);
    if (l.weight.dtype == DType::F8_E4M3) {
      dequantize_fp8_row(base + r * k, l.scale.ptr<float>()[l.scale.numel() == 1 ? 0 : r], row.data(), k);
    } else if (l.weight.dtype == DType::INT4) {
      const int64_t g = k / l.group_size;
      dequantize_int4_row(base + r * k / 2, l.scale.ptr<uint16_t>() + r * g,
                          l.zero.empty() ? nullptr : l.zero.ptr<uint8_t>() + r * g, l.group_size, row.data(),
                          k);
    } else {
      dequantize_row(l.weight.dtype, base + r * l.weight.row_bytes(), row.data(), k);
    }
    for (int64_t c = 0; c < k; ++c) {
      const int64_t dst = l.input_perm.empty() ? c : l.input_perm.ptr<int32_t>()[c];
      w[static_cast<size_t>(r * k + dst)] = row[static_cast<size_t>(c)];
    }
  }
  return w;
}

class PrequantizedLayout : public ::testing::TestWithParam<const char*> {};

TEST_P(PrequantizedLayout, DequantizesToTheWeightsItWasMadeFrom) {
  const std::string dir = kFixtures + "/" + GetParam() + "-tiny";
  auto backend = make_cpu_backend({1});
  auto model = Model::load(dir, *backend);
  SafetensorsFile ref(dir + "/dequant_reference.safetensors");
  SafetensorsFile orig(kLlamaTiny + "/model.safetensors");
  const auto descs = linear_layers(model->config());
  const auto lins = linears(*model);
  ASSERT_EQ(lins.size(), 7u);
  const bool fp8 = std::string(GetParam()).rfind("fp8", 0) == 0;
  for (size_t i = 0; i < lins.size(); ++i) {
    SCOPED_TRACE(descs[i].name);
    EXPECT_EQ(lins[i]->weight.dtype, fp8 ? DType::F8_E4M3 : DType::INT4);
    EXPECT_EQ(model->quant_plan().layers[i].second.format, fp8 ? WeightFormat::Fp8 : WeightFormat::Int4);
    const std::vector<float> got = dequantize(*lins[i]);
    const TensorEntry* r = ref.find(descs[i].name + ".weight");
    const TensorEntry* o = orig.find(descs[i].name + ".weight");
    ASSERT_TRUE(r && o);
    const auto* want = reinterpret_cast<const float*>(r->data);
    const auto* src = reinterpret_cast<const float*>(o->data);
    double err2 = 0, ref2 = 0;
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_NEAR(got[j], want[j], 1e-6f * std::fabs(want[j]) + 1e-9f) << j;
      err2 += std::pow(got[j] - src[j], 2);
      ref2 += static_cast<double>(src[j]) * src[j];
    }
    EXPECT_LT(err2 / ref2, fp8 ? 1e-3 : 2e-2);  // and close to the float weights they came from
  }
  SequenceRunner runner(*model, 8);
  for (float v : runner.step({1, 5, 9})) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrequantizedLayout,
                         ::testing::Values("fp8-tensor", "fp8-channel", "awq", "gptq", "gptq-actorder"));

TEST(PrequantizedLayout, ActOrderKeepsItsPermutationAndScalesAreChecked) {
  auto backend = make_cpu_backend({1});
  auto model = Model::load(kFixtures + "/gptq-actorder-tiny", *backend);
  EXPECT_FALSE(model->weights().layers[0].q.input_perm.empty());
  auto plain = Model::load(kFixtures + "/gptq-tiny", *backend);
  EXPECT_TRUE(plain->weights().layers[0].q.input_perm.empty());
  EXPECT_EQ(plain->weights().layers[0].q.group_size, 32);
  EXPECT_TRUE(plain->weights().layers[0].q.zero.ptr<uint8_t>()[0] == 8);  // sym: 7 stored, +1
}

TEST(QuantizeAtLoad, PlanSetsEachLayerFormat) {
  auto backend = make_cpu_backend({1});
  LoadOptions lo;
  lo.quantize = parse_quant_options("fp8-int4:asym");
  auto model = Model::load(kLlamaTiny, *backend, lo);
  const LayerWeights& l = model->weights().layers[0];
  EXPECT_EQ(l.q.weight.dtype, DType::F8_E4M3);
  EXPECT_EQ(l.o.weight.dtype, DType::F8_E4M3);
  EXPECT_EQ(l.up.weight.dtype, DType::INT4);
  EXPECT_EQ(l.up.group_size, 64);    // 64 input columns
  EXPECT_EQ(l.down.group_size, 32);  // 96 input columns
  EXPECT_FALSE(l.down.zero.empty());
  EXPECT_EQ(model->weights().lm_head.weight.dtype, DType::F32);  // lm_head stays as stored
  EXPECT_NE(model->quant_plan().summary().find("fp8-int4"), std::string::npos);
}

// ":lm_head" quantizes the vocabulary projection: its own tensor (llama-tiny) or, tied (llama3-tiny), a
// quantized copy while the embedding stays as stored; the logits stay close to the plan without it.
TEST(QuantizeAtLoad, LmHeadOptionQuantizesTheVocabularyProjection) {
  auto backend = make_cpu_backend({1});
  for (const char* name : {"llama-tiny", "llama3-tiny"}) {
    const std::string dir = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
    LoadOptions plain, head;
    plain.quantize = parse_quant_options("fp8");
    head.quantize = parse_quant_options("fp8:lm_head");
    auto a = Model::load(dir, *backend, plain), b = Model::load(dir, *backend, head);
    EXPECT_EQ(a->weights().lm_head.weight.dtype, DType::F32) << name;
    EXPECT_EQ(b->weights().lm_head.weight.dtype, DType::F8_E4M3) << name;
    EXPECT_EQ(b->weights().lm_head.scale.numel(), b->config().vocab_size) << name;
    EXPECT_EQ(b->weights().token_embedding.dtype, DType::F32) << name;
    ASSERT_NE(b->quant_plan().find("lm_head"), nullptr) << name;
    EXPECT_EQ(a->quant_plan().find("lm_head"), nullptr) << name;
    SequenceRunner ra(*a, 8), rb(*b, 8);
    const std::vector<float> la = ra.step({1, 7, 42, 3}), lb = rb.step({1, 7, 42, 3});
    ASSERT_EQ(la.size(), lb.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      num += (la[i] - lb[i]) * (la[i] - lb[i]);
      den += la[i] * la[i];
    }
    EXPECT_GT(num, 0) << name << ": lm_head not quantized";
    EXPECT_LT(std::sqrt(num / den), 0.05) << name;
  }
}

// A quantized lm_head is written as lm_head.weight + scales (also for a tied source) and reloads to the
// same bytes and logits.
TEST(QuantizeCheckpoint, QuantizedLmHeadRoundTrips) {
  auto backend = make_cpu_backend({1});
  for (const char* name : {"llama-tiny", "llama3-tiny"}) {
    const std::string dir = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
    const fs::path out =
        fs::temp_directory_path() / ("inferx-quant-head-" + std::string(name) + std::to_string(::getpid()));
    fs::remove_all(out);
    LoadOptions lo;
    lo.quantize = parse_quant_options("int4:lm_head");
    auto quantized = Model::load(dir, *backend, lo);
    ASSERT_EQ(quantized->weights().lm_head.weight.dtype, DType::INT4) << name;
    write_quantized_checkpoint(dir, *quantized, out.string());
    SafetensorsFile st((out / "model.safetensors").string());
    ASSERT_NE(st.find("lm_head.weight"), nullptr) << name;
    EXPECT_EQ(st.find("lm_head.weight")->dtype, DType::U8) << name;
    EXPECT_NE(st.find("lm_head.weight_scale"), nullptr) << name;
    auto reloaded = Model::load(out.string(), *backend);
    const Linear &x = quantized->weights().lm_head, &y = reloaded->weights().lm_head;
    ASSERT_EQ(y.weight.dtype, DType::INT4) << name;
    ASSERT_EQ(x.weight.nbytes(), y.weight.nbytes());
    EXPECT_EQ(std::memcmp(x.weight.data, y.weight.data, static_cast<size_t>(x.weight.nbytes())), 0) << name;
    EXPECT_EQ(std::memcmp(x.scale.data, y.scale.data, static_cast<size_t>(x.scale.nbytes())), 0) << name;
    SequenceRunner ra(*quantized, 8), rb(*reloaded, 8);
    EXPECT_EQ(ra.step({1, 7, 42, 3}), rb.step({1, 7, 42, 3})) << name;
    fs::remove_all(out);
  }
}

TEST(QuantizeCheckpoint, ReloadGivesTheSameWeightsAndLogits) {
  const fs::path out = fs::temp_directory_path() / ("inferx-quant-test-" + std::to_string(::getpid()));
  fs::remove_all(out);
  auto backend = make_cpu_backend({1});
  LoadOptions lo;
  lo.quantize = parse_quant_options("fp8-int4:asym");
  auto quantized = Model::load(kLlamaTiny, *backend, lo);
  write_quantized_checkpoint(kLlamaTiny, *quantized, out.string());
  auto reloaded = Model::load(out.string(), *backend);
  const auto a = linears(*quantized), b = linears(*reloaded);
  ASSERT_EQ(a.size(), b.size());
  auto same = [](const Tensor& x, const Tensor& y) {
    return x.dtype == y.dtype && x.nbytes() == y.nbytes() &&
           (x.empty() || std::memcmp(x.data, y.data, static_cast<size_t>(x.nbytes())) == 0);
  };
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same(a[i]->weight, b[i]->weight)) << i;
    EXPECT_TRUE(same(a[i]->scale, b[i]->scale)) << i;
    EXPECT_TRUE(same(a[i]->zero, b[i]->zero)) << i;
    EXPECT_EQ(a[i]->group_size, b[i]->group_size);
    EXPECT_TRUE(quantized->quant_plan().layers[i].second == reloaded->quant_plan().layers[i].second) << i;
  }
  SequenceRunner ra(*quantized, 8), rb(*reloaded, 8);
  EXPECT_EQ(ra.step({1, 7, 42, 3}), rb.step({1, 7, 42, 3}));
  SafetensorsFile st((out / "model.safetensors").string());
  EXPECT_EQ(QuantPlan::from_json(st.metadata().at("inferx.quantization_plan"), "test").kind, "fp8-int4:asym");
  EXPECT_THROW(write_quantized_checkpoint(kLlamaTiny, *quantized, kLlamaTiny), Error);
  // Writing again over our own output replaces it; a folder holding another checkpoint's index or shards
  // (which the loader would read instead) and a path that is not a folder are refused by name.
  EXPECT_NO_THROW(write_quantized_checkpoint(kLlamaTiny, *quantized, out.string()));
  const auto error_of = [&](const fs::path& dir) -> std::string {
    try {
      write_quantized_checkpoint(kLlamaTiny, *quantized, dir.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  for (const char* stale : {"model.safetensors.index.json", "model-00001-of-00002.safetensors"}) {
    std::ofstream(out / stale) << "{}";
    EXPECT_NE(error_of(out).find(fmt::format("already holds another checkpoint ({})", stale)),
              std::string::npos)
        << error_of(out);
    fs::remove(out / stale);
  }
  EXPECT_NE(error_of(out / "config.json").find("exists and is not a folder"), std::string::npos);
  EXPECT_NE(error_of(out / "config.json" / "sub").find("cannot create --out"), std::string::npos)
      << error_of(out / "config.json" / "sub");
  fs::remove_all(out);
}

TEST(QuantizeAtLoad, BadLayoutsAreClearErrors) {
  const fs::path dir = fs::temp_directory_path() / ("inferx-quant-bad-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kFixtures + "/awq-tiny/model.safetensors", dir / "model.safetensors");
  // AWQ tensors without a quantization_config that says so.
  fs::copy_file(kLlamaTiny + "/config.json", dir / "config.json");
  auto backend = make_cpu_backend({1});
  try {
    (void)Model::load(dir.string(), *backend);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no awq/gptq quantization_config"), std::string::npos) << e.what();
  }
  LoadOptions lo;
  lo.quantize = parse_quant_options("auto");
  EXPECT_THROW(Model::load(kLlamaTiny, *backend, lo), Error);  // auto needs a calibrated plan
  // A quantization_config field of another JSON type than expected: an error naming the file, not
  // nlohmann's type_error.
  const std::string structure = "config.json: quantization_config: unexpected JSON structure";
  for (const auto& [q, want] : std::vector<std::pair<const char*, std::string>>{
           {R"({"quant_method": "awq", "version": 3})", structure},
           {R"({"quant_method": "gptq", "checkpoint_format": []})", structure},
           {R"({"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"g": {"weights": {"num_bits": "8"}}}})",
            "config.json: quantization_config: num_bits must be an integer in [1, 64], got \"8\""},
           {R"({"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 1e300}}}})",
            "config.json: quantization_config: num_bits must be an integer in [1, 64], got 1e+300"}}) {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kFixtures + "/awq-tiny/config.json"));
    cfg["quantization_config"] = nlohmann::json::parse(q);
    std::ofstream(dir / "config.json") << cfg.dump();
    try {
      (void)Model::load(dir.string(), *backend);
      ADD_FAILURE() << "loaded with " << q;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
    }
  }
  fs::remove_all(dir);
}

TEST(AutoPlan, DeterministicAndWithinBudget) {
  std::vector<int32_t> tokens(96);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  const QuantOptions o = parse_quant_options("auto:bits=6");
  const CalibrationResult a = calibrate_auto_plan(kLlamaTiny, tokens, o, 1);
  const CalibrationResult b = calibrate_auto_plan(kLlamaTiny, tokens, o, 1);
  EXPECT_EQ(a.plan.to_json(), b.plan.to_json());
  ASSERT_EQ(a.sensitivity.size(), 14u);
  int64_t bytes = 0, weights = 0, int4 = 0;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_GT(a.sensitivity[i].int4, a.sensitivity[i].fp8) << a.layers[i].name;  // 4 bits lose more than 8
    EXPECT_LT(a.sensitivity[i].fp8, 1e-2) << a.layers[i].name;
    bytes += quantized_bytes(a.layers[i], a.plan.layers[i].second);
    weights += a.layers[i].out_features * a.layers[i].in_features;
    int4 += a.plan.layers[i].second.format == WeightFormat::Int4;
  }
  EXPECT_LE(8.0 * static_cast<double>(bytes) / static_cast<double>(weights), 6.0);
  EXPECT_GT(int4, 0);
  EXPECT_LT(int4, 14);
  LoadOptions lo;
  lo.plan = std::make_shared<const QuantPlan>(a.plan);
  auto backend = make_cpu_backend({1});
  auto model = Model::load(kLlamaTiny, *backend, lo);
  EXPECT_EQ(model->quant_plan().to_json(), a.plan.to_json());
}

}  // namespace
}  // namespace inferx
