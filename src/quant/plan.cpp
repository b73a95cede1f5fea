// Quantization plans (rules in plan.h).
#include "quant/plan.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/json_text.h"
#include "quant/int4.h"

namespace inferx {

namespace {

constexpr const char* kChoices =
    "none, fp8[:tensor], int4[:g32|g64|g128][:asym], fp8-int4[...], auto[:bits=B]; any of them [:lm_head]";

bool is_attention(LinearRole r) {
  return r == LinearRole::Q || r == LinearRole::K || r == LinearRole::V || r == LinearRole::O;
}

LayerQuant fp8_layer(const QuantOptions& o) {
  LayerQuant q;
  q.format = WeightFormat::Fp8;
  q.fp8 = o.fp8;
  return q;
}

// INT4 with the plan's group when it divides in_features, else the largest smaller group that does,
// else FP8 (in_features not a multiple of 32).
LayerQuant int4_layer(const QuantOptions& o, const LinearDesc& d) {
  LayerQuant q;
  q.format = WeightFormat::Int4;
  q.symmetric = o.symmetric;
  for (int64_t g = o.group; g >= 32; g /= 2) {
    if (int4_group_fits(d.in_features, g)) {
      q.group = g;
      if (g != o.group)
        q.note = fmt::format("group {} (in_features {} is not a multiple of {})", g, d.in_features, o.group);
      return q;
    }
  }
  LayerQuant f = fp8_layer(o);
  f.note = fmt::format("fp8 instead of int4: in_features {} is not a multiple of 32", d.in_features);
  return f;
}

}  // namespace

const char* plan_kind_name(PlanKind k) {
  switch (k) {
    case PlanKind::None:
      return "none";
    case PlanKind::Fp8:
      return "fp8";
    case PlanKind::Int4:
      return "int4";
    case PlanKind::Fp8Int4:
      return "fp8-int4";
    case PlanKind::Auto:
      return "auto";
  }
  return "?";
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Keep:
      return "keep";
    case WeightFormat::Fp8:
      return "fp8";
    case WeightFormat::Int4:
      return "int4";
  }
  return "?";
}

QuantOptions parse_quant_options(const std::string& text) {
  QuantOptions o;
  o.text = text.empty() ? "none" : text;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = o.text.find(':', start);
    parts.push_back(o.text.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const std::string& name = parts[0];
  if (name == "none")
    o.kind = PlanKind::None;
  else if (name == "fp8")
    o.kind = PlanKind::Fp8;
  else if (name == "int4")
    o.kind = PlanKind::Int4;
  else if (name == "fp8-int4")
    o.kind = PlanKind::Fp8Int4;
  else if (name == "auto")
    o.kind = PlanKind::Auto;
  else
    fail("--quantize {}: unknown plan '{}' (choices: {})", o.text, name, kChoices);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "g32" || p == "g64" || p == "g128")
      o.group = std::stoll(p.substr(1));
    else if (p == "asym")
      o.symmetric = false;
    else if (p == "sym")
      o.symmetric = true;
    else if (p == "tensor")
      o.fp8 = Fp8Granularity::PerTensor;
    else if (p == "channel")
      o.fp8 = Fp8Granularity::PerChannel;
    else if (p == "lm_head")
      o.lm_head = true;
    else if (p.rfind("bits=", 0) == 0) {
      try {
        o.auto_bits = std::stod(p.substr(5));
      } catch (const std::exception&) {
        fail("--quantize {}: '{}' is not bits=NUMBER", o.text, p);
      }
      INFERX_CHECK(o.auto_bits >= 4 && o.auto_bits <= 16, "--quantize {}: bits={} must be within 4..16",
                   o.text, o.auto_bits);
    } else {
      fail("--quantize {}: unknown option '{}' (choices: {})", o.text, p, kChoices);
    }
  }
  INFERX_CHECK(!(o.lm_head && o.kind == PlanKind::None),
               "--quantize {}: lm_head needs a plan (e.g. fp8:lm_head)", o.text);
  return o;
}

bool QuantPlan::empty() const {
  return std::all_of(layers.begin(), layers.end(),
                     [](const auto& l) { return l.second.format == WeightFormat::Keep; });
}

const LayerQuant* QuantPlan::find(const std::string& name) const {
  for (const auto& [n, q] : layers)
    if (n == name) return &q;
  return nullptr;
}

std::string QuantPlan::to_json() const {
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["kind"] = kind;
  nlohmann::ordered_json ls = nlohmann::ordered_json::object();
  for (const auto& [name, q] : layers) {
    nlohmann::ordered_json e;
    e["format"] = weight_format_name(q.format);
    if (q.format == WeightFormat::Fp8) e["scale"] = q.fp8 == Fp8Granularity::PerTensor ? "tensor" : "channel";
    if (q.format == WeightFormat::Int4) {
      e["group_size"] = q.group;
      e["symmetric"] = q.symmetric;
    }
    ls[name] = e;
  }
  j["layers"] = ls;
  return j.dump();
}

QuantPlan QuantPlan::from_json(const std::string& text, const std::string& source) {
  QuantPlan p;
  try {
    const auto j = parse_ordered_json_text(text, source);  // ordered: keeps the layers in model order
    const int64_t version =
        j.contains("version") ? json_integer(j["version"], "plan version", source, 0, 1000) : 0;
    INFERX_CHECK(version == 1, "{}: quantization plan version {} is not 1", source, version);
    p.kind = j.at("kind").get<std::string>();
    for (const auto& [name, e] : j.at("layers").items()) {
      LayerQuant q;
      const auto f = e.at("format").get<std::string>();
      if (f == "keep") {
        q.format = WeightFormat::Keep;
      } else if (f == "fp8") {
        q.format = WeightFormat::Fp8;
        const auto s = e.at("scale").get<std::string>();
        INFERX_CHECK(s == "tensor" || s == "channel", "{}: layer '{}': fp8 scale '{}' is not tensor/channel",
                     source, name, s);
        q.fp8 = s == "tensor" ? Fp8Granularity::PerTensor : Fp8Granularity::PerChannel;
      } else if (f == "int4") {
        q.format = WeightFormat::Int4;
        q.group = json_integer(e.at("group_size"), fmt::format("layer '{}': group_size", name), source, 1,
                               INT32_MAX);
        q.symmetric = e.at("symmetric").get<bool>();
      } else {
        fail("{}: layer '{}': unknown format '{}'", source, name, f);
      }
      p.layers.emplace_back(name, q);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: quantization plan is not valid: {}", source, e.what());
  }
  return p;
}

std::string QuantPlan::summary() const {
  std::map<std::string, int> counts;
  for (const auto& [name, q] : layers) {
    std::string key = weight_format_name(q.format);
    if (q.format == WeightFormat::Fp8)
      key += q.fp8 == Fp8Granularity::PerTensor ? " (per tensor)" : " (per channel)";
    if (q.format == WeightFormat::Int4)
      key += fmt::format(" (g{}, {})", q.group, q.symmetric ? "sym" : "asym");
    ++counts[key];
  }
  std::string s = fmt::format("quantization plan '{}':", kind);
  for (const auto& [k, c] : counts) s += fmt::format(" {} x {};", c, k);
  // Notes grouped by text (one line per distinct note, with how many layers share it).
  std::vector<std::pair<std::string, std::vector<std::string>>> notes;
  for (const auto& [name, q] : layers) {
    // A named copy: clang before 16 cannot capture a structured binding in a lambda.
    const std::string& note = q.note;
    if (note.empty()) continue;
    auto it = std::find_if(notes.begin(), notes.end(), [&](const auto& n) { return n.first == note; });
    if (it == notes.end())
      notes.push_back({note, {name}});
    else
      it->second.push_back(name);
  }
  for (const auto& [note, names] : notes)
    s += names.size() == 1 ? fmt::format("\n  {}: {}", names[0], note)
                           : fmt::format("\n  {} and {} more: {}", names[0], names.size() - 1, note);
  return s;
}

int64_t quantized_bytes(const LinearDesc& d, const LayerQuant& q) {
  const int64_t n = d.out_features, k = d.in_features;
  switch (q.format) {
    case WeightFormat::Keep:
      return n * k * 2;  // as bf16, the reference size
    case WeightFormat::Fp8:
      return n * k + (q.fp8 == Fp8Granularity::PerTensor ? 4 : 4 * n);
    case WeightFormat::Int4:
      return n * k / 2 + (n * k / q.group) * (q.symmetric ? 2 : 3);
  }
  return 0;
}

QuantPlan make_plan(const QuantOptions& o, const std::vector<LinearDesc>& layers) {
  INFERX_CHECK(o.kind != PlanKind::Auto,
               "--quantize {}: auto plans are chosen from calibration (choose_auto_plan)", o.text);
  QuantPlan p;
  p.kind = o.text;
  for (const LinearDesc& d : layers) {
    LayerQuant q;
    switch (o.kind) {
      case PlanKind::None:
      case PlanKind::Auto:
        break;
      case PlanKind::Fp8:
        q = fp8_layer(o);
        break;
      case PlanKind::Int4:
        q = int4_layer(o, d);
        break;
      case PlanKind::Fp8Int4:
        q = is_attention(d.role) ? fp8_layer(o) : int4_layer(o, d);
        break;
    }
    p.layers.emplace_back(d.name, q);
  }
  return p;
}

void add_lm_head(QuantPlan& plan, const QuantOptions& o, const LinearDesc& d) {
  if (!o.lm_head || o.kind == PlanKind::None || plan.find(d.name) != nullptr) return;
  plan.layers.emplace_back(d.name, o.kind == PlanKind::Int4 ? int4_layer(o, d) : fp8_layer(o));
}

QuantPlan choose_auto_plan(const QuantOptions& o, const std::vector<LinearDesc>& layers,
                           const std::vector<LayerSensitivity>& sens) {
  INFERX_CHECK(sens.size() == layers.size(), "auto plan: {} sensitivities for {} layers", sens.size(),
               layers.size());
  QuantPlan p;
  p.kind = o.text;
  int64_t weights = 0, bytes = 0;
  std::vector<LayerQuant> fp8(layers.size()), int4(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    fp8[i] = fp8_layer(o);
    int4[i] = int4_layer(o, layers[i]);
    weights += layers[i].out_features * layers[i].in_features;
    bytes += quantized_bytes(layers[i], fp8[i]);
  }
  // Candidates by error increase per byte saved (ties: model order, so the choice is deterministic).
  std::vector<size_t> order;
  for (size_t i = 0; i < layers.size(); ++i)
    if (int4[i].format == WeightFormat::Int4) order.push_back(i);
  auto cost = [&](size_t i) {
    const double saved =
        static_cast<double>(quantized_bytes(layers[i], fp8[i]) - quantized_bytes(layers[i], int4[i]));
    return std::max(0.0, sens[i].int4 - sens[i].fp8) / saved;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost(a) < cost(b); });
  const double budget = o.auto_bits / 8.0 * static_cast<double>(weights);
  std::vector<LayerQuant> chosen = fp8;
  for (size_t i : order) {
    if (static_cast<double>(bytes) <= budget) break;
    bytes += quantized_bytes(layers[i], int4[i]) - quantized_bytes(layers[i], fp8[i]);
    chosen[i] = int4[i];
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    chosen[i].note = fmt::format("{}{}: error fp8 {:.3g}, int4 {:.3g}",
                                 chosen[i].note.empty() ? "" : chosen[i].note + "; ",
                                 weight_format_name(chosen[i].format), sens[i].fp8, sens[i].int4);
    p.layers.emplace_back(layers[i].name, chosen[i]);
  }
  return p;
}

}  // namespace inferx
