#include "cli/quantize_options.h"

#include <cstdio>
#include <memory>

#include "core/error.h"
#include "core/text_file.h"
#include "formats/gguf.h"
#include "model/calibration.h"
#include "text/tokenizer_loader.h"

namespace inferx::cli {

const char* const kQuantizeHelp =
    "Weight quantization at load: none, fp8[:tensor], int4[:g32|g64|g128][:asym], fp8-int4 (attention FP8, "
    "MLP INT4), auto[:bits=B] (per layer from calibration, --calibration FILE); add :lm_head to quantize the "
    "vocabulary projection too (FP8, INT4 under int4)";

namespace {

// Used when --quantize auto has no --calibration file: plain narrative English of the kind small
// models are trained on (written for InferX).
constexpr const char* kDefaultCalibration =
    "Once upon a time, in a small town by the sea, there lived a girl named Mia. Every morning she walked "
    "to the harbor with her dog, Sam, to watch the fishing boats come in. One day a big storm came, and "
    "the boats did not return. Mia was worried. She took her lantern and climbed the hill above the town. "
    "She waved the light back and forth so the sailors could find their way home. After a long night, "
    "the first boat came around the rocks, then another, and another. The sailors thanked Mia and gave "
    "her a shiny shell. From that day on, the town called her the little lighthouse. The next summer, "
    "the children built a real lighthouse on the hill, and Mia helped them paint it red and white.";

std::string read_text(const std::string& path) { return read_text_file(path, "the calibration text"); }

}  // namespace

void add_quantize_options(CLI::App& sub, std::string& plan, std::string& calibration) {
  sub.add_option("--quantize", plan, kQuantizeHelp);
  sub.add_option("--calibration", calibration,
                 "Text file for --quantize auto (default: a built-in paragraph)");
}

std::vector<int32_t> tokenize_for_model(const std::string& spec, const TensorSource* source,
                                        const std::string& text) {
  std::unique_ptr<GgufFile> gguf;
  if (source == nullptr && spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".gguf") == 0) {
    gguf = std::make_unique<GgufFile>(spec);
    source = gguf.get();
  }
  ModelText mt = load_model_text(spec, source);
  INFERX_CHECK(mt.tokenizer != nullptr, "{} has no tokenizer InferX can read: cannot tokenize text for it",
               spec);
  return mt.tokenizer->encode(text, mt.add_bos);
}

void apply_quantize(const std::string& plan, const std::string& calibration_file, const std::string& spec,
                    int threads, LoadOptions& lo) {
  lo.quantize = parse_quant_options(plan);
  if (lo.quantize.kind != PlanKind::Auto) return;
  const std::string text = calibration_file.empty() ? kDefaultCalibration : read_text(calibration_file);
  const std::vector<int32_t> tokens = tokenize_for_model(spec, nullptr, text);
  std::fprintf(stderr, "calibrating --quantize %s on %zu tokens of %s\n", lo.quantize.text.c_str(),
               tokens.size(), calibration_file.empty() ? "built-in text" : calibration_file.c_str());
  CalibrationResult r = calibrate_auto_plan(spec, tokens, lo.quantize, threads);
  lo.plan = std::make_shared<const QuantPlan>(std::move(r.plan));
}

void print_quant_plan(const Model& model) {
  const QuantPlan& p = model.quant_plan();
  if (p.empty()) return;
  std::fprintf(stderr, "%s\n", p.summary().c_str());
}

}  // namespace inferx::cli
