// Plan rules, option parsing, JSON round trip and the auto planner's budget.
#include "quant/plan.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace inferx {
namespace {

std::vector<LinearDesc> two_layers(int64_t d = 256, int64_t f = 512) {
  std::vector<LinearDesc> v;
  for (int64_t i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    v.push_back({p + "self_attn.q_proj", LinearRole::Q, i, d, d});
    v.push_back({p + "self_attn.o_proj", LinearRole::O, i, d, d});
    v.push_back({p + "mlp.up_proj", LinearRole::Up, i, f, d});
    v.push_back({p + "mlp.down_proj", LinearRole::Down, i, d, f});
  }
  return v;
}

TEST(PlanTest, ParseOptions) {
  EXPECT_EQ(parse_quant_options("none").kind, PlanKind::None);
  const QuantOptions o = parse_quant_options("int4:g64:asym");
  EXPECT_EQ(o.kind, PlanKind::Int4);
  EXPECT_EQ(o.group, 64);
  EXPECT_FALSE(o.symmetric);
  EXPECT_EQ(parse_quant_options("fp8:tensor").fp8, Fp8Granularity::PerTensor);
  EXPECT_DOUBLE_EQ(parse_quant_options("auto:bits=5.5").auto_bits, 5.5);
  EXPECT_THROW(parse_quant_options("int3"), Error);
  EXPECT_THROW(parse_quant_options("int4:g16"), Error);
  EXPECT_THROW(parse_quant_options("auto:bits=2"), Error);
  EXPECT_FALSE(parse_quant_options("fp8").lm_head);
  EXPECT_TRUE(parse_quant_options("int4:g64:lm_head").lm_head);
  EXPECT_THROW(parse_quant_options("none:lm_head"), Error);
}

TEST(PlanTest, LmHeadEntryOnlyWhenAsked) {
  const LinearDesc head{"lm_head", LinearRole::LmHead, -1, 1000, 96};  // 96 columns: INT4 group 32
  QuantPlan p = make_plan(parse_quant_options("fp8"), two_layers());
  add_lm_head(p, parse_quant_options("fp8"), head);
  EXPECT_EQ(p.find("lm_head"), nullptr);
  for (const char* rule : {"fp8:lm_head", "fp8-int4:lm_head", "auto:lm_head"}) {
    QuantPlan q = make_plan(parse_quant_options("fp8"), two_layers());
    add_lm_head(q, parse_quant_options(rule), head);
    ASSERT_NE(q.find("lm_head"), nullptr) << rule;
    EXPECT_EQ(q.find("lm_head")->format, WeightFormat::Fp8) << rule;
    add_lm_head(q, parse_quant_options(rule), head);  // once only
    EXPECT_EQ(q.layers.size(), two_layers().size() + 1) << rule;
  }
  const QuantOptions o = parse_quant_options("int4:lm_head");
  QuantPlan q = make_plan(o, two_layers());
  add_lm_head(q, o, head);
  ASSERT_NE(q.find("lm_head"), nullptr);
  EXPECT_EQ(q.find("lm_head")->format, WeightFormat::Int4);
  EXPECT_EQ(q.find("lm_head")->group, 32);
  const QuantPlan back = QuantPlan::from_json(q.to_json(), "test");
  ASSERT_NE(back.find("lm_head"), nullptr);
  EXPECT_TRUE(*back.find("lm_head") == *q.find("lm_head"));
}

TEST(PlanTest, FixedRules) {
  const auto layers = two_layers();
  const QuantPlan mixed = make_plan(parse_quant_options("fp8-int4"), layers);
  ASSERT_EQ(mixed.layers.size(), layers.size());
  EXPECT_EQ(mixed.find("model.layers.1.self_attn.q_proj")->format, WeightFormat::Fp8);
  EXPECT_EQ(mixed.find("model.layers.1.self_attn.o_proj")->format, WeightFormat::Fp8);
  EXPECT_EQ(mixed.find("model.layers.0.mlp.up_proj")->format, WeightFormat::Int4);
  EXPECT_EQ(mixed.find("model.layers.0.mlp.down_proj")->group, 128);
  EXPECT_TRUE(make_plan(parse_quant_options("none"), layers).empty());
  EXPECT_THROW(make_plan(parse_quant_options("auto"), layers), Error);
}

TEST(PlanTest, Int4FallsBackWhenGroupDoesNotFit) {
  std::vector<LinearDesc> l = {{"a", LinearRole::Up, 0, 172, 64}, {"b", LinearRole::Down, 0, 64, 172}};
  const QuantPlan p = make_plan(parse_quant_options("int4"), l);
  EXPECT_EQ(p.layers[0].second.format, WeightFormat::Int4);
  EXPECT_EQ(p.layers[0].second.group, 64);
  EXPECT_EQ(p.layers[1].second.format, WeightFormat::Fp8);
  EXPECT_NE(p.summary().find("in_features 172 is not a multiple of 32"), std::string::npos);
}

TEST(PlanTest, JsonRoundTrip) {
  const QuantPlan p = make_plan(parse_quant_options("fp8-int4:g32:asym:tensor"), two_layers());
  const QuantPlan q = QuantPlan::from_json(p.to_json(), "test");
  EXPECT_EQ(q.kind, p.kind);
  ASSERT_EQ(q.layers.size(), p.layers.size());
  for (size_t i = 0; i < p.layers.size(); ++i) {
    EXPECT_EQ(q.layers[i].first, p.layers[i].first);
    EXPECT_TRUE(q.layers[i].second == p.layers[i].second);
  }
  EXPECT_THROW(QuantPlan::from_json("{\"version\":1}", "t"), Error);
  EXPECT_THROW(QuantPlan::from_json("not json", "t"), Error);
}

TEST(PlanTest, AutoMovesTheLeastSensitiveLayersToInt4UnderTheBudget) {
  const auto layers = two_layers();
  std::vector<LayerSensitivity> s(layers.size(), {1e-4, 1e-2});
  s[2].int4 = 1e-3;  // layer 0 up_proj barely cares
  s[7].int4 = 2e-3;  // layer 1 down_proj is the next best
  s[1].int4 = 0.5;   // layer 0 o_proj must stay fp8
  QuantOptions o = parse_quant_options("auto:bits=6.5");
  const QuantPlan p = choose_auto_plan(o, layers, s);
  EXPECT_EQ(p.layers[2].second.format, WeightFormat::Int4);
  EXPECT_EQ(p.layers[7].second.format, WeightFormat::Int4);
  EXPECT_EQ(p.layers[1].second.format, WeightFormat::Fp8);
  int64_t bytes = 0, weights = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    bytes += quantized_bytes(layers[i], p.layers[i].second);
    weights += layers[i].out_features * layers[i].in_features;
  }
  EXPECT_LE(8.0 * static_cast<double>(bytes) / static_cast<double>(weights), 6.5);
  // A budget of 4 bits cannot be met: everything goes INT4.
  const QuantPlan all = choose_auto_plan(parse_quant_options("auto:bits=4"), layers, s);
  for (const auto& [n, q] : all.layers) EXPECT_EQ(q.format, WeightFormat::Int4) << n;
  EXPECT_THROW(choose_auto_plan(o, layers, {}), Error);
}

}  // namespace
}  // namespace inferx
