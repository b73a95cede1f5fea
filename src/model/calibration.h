#pragma once
// `--quantize auto`: measures how much each linear layer's output changes when its weight is stored in
// FP8 or INT4, on the inputs that layer actually sees for some calibration text, and hands the
// measurements to the planner (quant/plan.h choose_auto_plan).
#include <string>
#include <vector>

#include "quant/plan.h"

namespace inferx {

struct CalibrationResult {
  std::vector<LinearDesc> layers;
  std::vector<LayerSensitivity> sensitivity;  // per layer: relative output error (see plan.h)
  QuantPlan plan;
};

// Loads `model_spec` unquantized on a CPU backend of `threads` threads, runs `tokens` through it while
// recording every linear layer's input rows (at most `max_rows` per layer, evenly spaced), and compares
// each layer's outputs with FP8 and INT4 weights (through the real CPU kernels) against the stored
// weights. Deterministic for a given model and text.
CalibrationResult calibrate_auto_plan(const std::string& model_spec, const std::vector<int32_t>& tokens,
                                      const QuantOptions& options, int threads = 0, int64_t max_rows = 64);

}  // namespace inferx
