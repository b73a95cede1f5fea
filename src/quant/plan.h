#pragma once
// Quantization plans: which format each linear layer of a model gets (`--quantize PLAN`).
//
//   none      every layer as stored
//   fp8       every linear layer FP8 E4M3 (W8A8, per-output-channel scales unless ":tensor")
//   int4      every linear layer INT4 weight-only, group 128, symmetric (":g32", ":g64", ":asym")
//   fp8-int4  attention projections (q, k, v, o) FP8, MLP (gate, up, down) INT4
//   auto      per layer FP8 or INT4 from measured sensitivity under a size budget (model/calibration.h
//             measures; choose_auto_plan decides)
// Options follow the name after colons, e.g. "int4:g64:asym", "fp8:tensor", "auto:bits=5.5".
// The vocabulary projection (lm_head) and embeddings stay as stored unless the plan says ":lm_head"
// (e.g. "fp8:lm_head"): then lm_head is FP8 under fp8, fp8-int4 and auto, INT4 under int4 (as vLLM,
// which leaves it unquantized by default; llama.cpp's 4-bit types keep it at 6 bits). A tied lm_head
// becomes a quantized copy of the embedding, which stays as stored for the lookup.
// A layer INT4 cannot take (in_features not a multiple of the group) falls back to a smaller group
// that divides it, else to FP8; the printed plan says so.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quant/fp8.h"

namespace inferx {

enum class WeightFormat : uint8_t { Keep, Fp8, Int4 };

struct LayerQuant {
  WeightFormat format = WeightFormat::Keep;
  Fp8Granularity fp8 = Fp8Granularity::PerChannel;
  int64_t group = 128;    // INT4
  bool symmetric = true;  // INT4
  std::string note;       // why the layer deviates from the plan's rule (printed)
  bool operator==(const LayerQuant& o) const {
    return format == o.format && fp8 == o.fp8 && group == o.group && symmetric == o.symmetric;
  }
};

enum class LinearRole : uint8_t { Q, K, V, O, Gate, Up, Down, LmHead };

// One linear layer of the model, named by its Hugging Face module path ("model.layers.3.mlp.up_proj").
struct LinearDesc {
  std::string name;
  LinearRole role;
  int64_t layer = 0;
  int64_t out_features = 0, in_features = 0;
};

enum class PlanKind : uint8_t { None, Fp8, Int4, Fp8Int4, Auto };

struct QuantOptions {
  PlanKind kind = PlanKind::None;
  Fp8Granularity fp8 = Fp8Granularity::PerChannel;
  int64_t group = 128;
  bool symmetric = true;
  double auto_bits = 6.0;  // auto: average bits per quantized weight (scales included) to stay under
  bool lm_head = false;    // ":lm_head": quantize the vocabulary projection too (add_lm_head)
  std::string text;        // the plan as given, for messages
};

// Parses "fp8", "int4:g64:asym", "auto:bits=5"...; throws inferx::Error listing the choices.
QuantOptions parse_quant_options(const std::string& text);
const char* plan_kind_name(PlanKind k);
const char* weight_format_name(WeightFormat f);

struct QuantPlan {
  std::string kind = "none";  // the rule it came from ("fp8-int4", "auto:bits=6", "checkpoint")
  std::vector<std::pair<std::string, LayerQuant>> layers;  // by LinearDesc::name, model order

  bool empty() const;  // every layer Keep
  const LayerQuant* find(const std::string& name) const;
  // Stored in checkpoint metadata ("inferx.quantization_plan") and printed: one JSON object.
  std::string to_json() const;
  static QuantPlan from_json(const std::string& text, const std::string& source);
  // Human summary: counts per format and the deviations, one line each.
  std::string summary() const;
};

// Bytes a layer takes in a format (weights + scales/zero points).
int64_t quantized_bytes(const LinearDesc& d, const LayerQuant& q);

// The plan of a fixed rule (none, fp8, int4, fp8-int4). Auto needs measurements: use choose_auto_plan.
QuantPlan make_plan(const QuantOptions& options, const std::vector<LinearDesc>& layers);

// With options.lm_head, appends the vocabulary projection's entry ("lm_head": FP8, or INT4 under the int4
// rule) unless the plan has one; otherwise does nothing.
void add_lm_head(QuantPlan& plan, const QuantOptions& options, const LinearDesc& lm_head);

// Per layer, the relative output error (||X Wq^T - X W^T||^2 / ||X W^T||^2 on calibration inputs X) of
// each candidate format.
struct LayerSensitivity {
  double fp8 = 0;
  double int4 = 0;
};

// Auto: starts from FP8 everywhere and moves to INT4 the layers with the smallest error increase per
// byte saved until the average bits per weight is at most options.auto_bits (or every layer is INT4).
QuantPlan choose_auto_plan(const QuantOptions& options, const std::vector<LinearDesc>& layers,
                           const std::vector<LayerSensitivity>& sensitivity);

}  // namespace inferx
