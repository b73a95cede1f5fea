// Model::weight_bytes_per_token (the decode roofline's numerator) counts what the kernels read: quantized
// codes plus their scales and zero points, recomputed here from the config and the plan's rules.
#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "model/model.h"
#include "quant/plan.h"

namespace inferx {
namespace {

const std::string kLlamaTiny = std::string(INFERX_SOURCE_DIR) + "/tests/golden/fixtures/llama-tiny";

struct Shape {
  int64_t n, k;
  bool attention;
};

std::vector<Shape> linear_shapes(const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, qd = c.num_heads * c.head_dim,
                kvd = c.num_kv_heads * c.head_dim;
  return {{qd, D, true}, {kvd, D, true}, {kvd, D, true}, {D, qd, true},
          {F, D, false}, {F, D, false},  {D, F, false}};
}

// Bytes outside the linear layers: lm_head (F32 in llama-tiny, untied), the final norm and two norms
// per layer (F32).
int64_t other_bytes(const ModelConfig& c) {
  return c.vocab_size * c.hidden_size * 4 + c.hidden_size * 4 + c.num_layers * 2 * c.hidden_size * 4;
}

TEST(WeightBytesPerToken, CountsFloatWeights) {
  auto backend = make_cpu_backend({1});
  auto m = Model::load(kLlamaTiny, *backend);
  const ModelConfig& c = m->config();
  int64_t want = other_bytes(c);
  for (const Shape& s : linear_shapes(c)) want += c.num_layers * s.n * s.k * 4;
  EXPECT_EQ(m->weight_bytes_per_token(), want);
}

TEST(WeightBytesPerToken, CountsFp8CodesAndPerChannelScales) {
  auto backend = make_cpu_backend({1});
  LoadOptions lo;
  lo.quantize = parse_quant_options("fp8");
  auto m = Model::load(kLlamaTiny, *backend, lo);
  const ModelConfig& c = m->config();
  int64_t want = other_bytes(c);
  for (const Shape& s : linear_shapes(c)) want += c.num_layers * (s.n * s.k + s.n * 4);  // E4M3 + F32 [n]
  EXPECT_EQ(m->weight_bytes_per_token(), want);
}

TEST(WeightBytesPerToken, CountsInt4CodesScalesAndZeroPoints) {
  auto backend = make_cpu_backend({1});
  LoadOptions lo;
  lo.quantize = parse_quant_options("fp8-int4:asym");
  auto m = Model::load(kLlamaTiny, *backend, lo);
  const ModelConfig& c = m->config();
  int64_t want = other_bytes(c);
  for (const Shape& s : linear_shapes(c)) {
    if (s.attention) {
      want += c.num_layers * (s.n * s.k + s.n * 4);
      continue;
    }
    // llama-tiny: 64 input columns take groups of 64, 96 take groups of 32 (the plan's largest fit);
    // F16 scales and U8 zero points per group.
    const int64_t group = s.k % 64 == 0 ? 64 : 32, groups = s.n * (s.k / group);
    want += c.num_layers * (s.n * s.k / 2 + groups * 2 + groups);
  }
  EXPECT_EQ(m->weight_bytes_per_token(), want);
}

}  // namespace
}  // namespace inferx
