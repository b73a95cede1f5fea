#pragma once
// --quantize PLAN / --calibration FILE, shared by generate, serve, bench, perplexity and quantize:
// turns them into LoadOptions (auto: calibrates first and prints the measured choice).
#include <CLI/CLI.hpp>
#include <string>

#include "model/model.h"

namespace inferx::cli {

// The help text of --quantize.
extern const char* const kQuantizeHelp;

void add_quantize_options(CLI::App& sub, std::string& plan, std::string& calibration);

// Fills lo.quantize (and lo.plan for auto, after calibrating `model_spec` on the CPU with the text of
// `calibration_file`, or a built-in paragraph when empty). Throws on an unknown plan.
void apply_quantize(const std::string& plan, const std::string& calibration_file,
                    const std::string& model_spec, int threads, LoadOptions& lo);

// Prints the plan a model was loaded with to stderr (nothing when no layer is quantized).
void print_quant_plan(const Model& model);

// Tokenizes `text` with the model's tokenizer (GGUF metadata or the Hugging Face folder), BOS first when
// the tokenizer adds one. Throws when the model has no tokenizer.
std::vector<int32_t> tokenize_for_model(const std::string& model_spec, const TensorSource* source,
                                        const std::string& text);

}  // namespace inferx::cli
