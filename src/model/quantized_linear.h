#pragma once
// Resolving a linear layer's weight when quantization is involved (a contained part of Model::load):
// a pre-quantized checkpoint layout (ours, compressed-tensors FP8, AWQ, GPTQ) is converted to the
// formats of quant/, and a float weight is quantized per the layer's plan entry.
#include <functional>
#include <string>
#include <vector>

#include "backend/linear.h"
#include "formats/model_config.h"
#include "formats/tensor_source.h"
#include "quant/plan.h"

namespace inferx {

// config.json "quantization_config" of a Hugging Face folder, as far as the loaders need it.
struct HfQuantConfig {
  enum class Method : uint8_t { None, InferX, CompressedTensors, Awq, Gptq };
  Method method = Method::None;
  int64_t group_size = 128;   // awq / gptq
  bool zero_plus_one = true;  // gptq: checkpoint_format "gptq" (true) or "gptq_v2" (false)
  std::string plan_json;      // inferx: the plan the checkpoint was written with
};
// Throws naming the file and field for a method or variant we cannot load (e.g. AWQ GEMV packing,
// compressed-tensors int-quantized, FP8 with a block strategy).
HfQuantConfig read_hf_quant_config(const std::string& folder);

// The model's linear layers in load order, named by their Hugging Face module path.
std::vector<LinearDesc> linear_layers(const ModelConfig& config);
// The vocabulary projection's plan entry ("lm_head", [vocab, hidden]); not among linear_layers.
LinearDesc lm_head_desc(const ModelConfig& config);

// Puts host bytes on the backend and returns the tensor (the loader's owned-buffer allocator).
using PlaceFn = std::function<Tensor(DType, const std::vector<int64_t>&, const void*, size_t)>;

// A linear layer's tensor-name prefix: its weight's name minus ".weight" (the pre-quantized layouts keep
// their companions beside it: prefix.weight_scale, prefix.qweight, ...). Throws for another name.
std::string linear_prefix(const std::string& weight_name);

// True when the layer whose weight is named `weight_name` ("model.layers.0.mlp.up_proj.weight",
// "blk.0.ffn_up.weight") is stored pre-quantized in `source` (its prefix is the name minus ".weight").
bool is_prequantized(const TensorSource& source, const std::string& weight_name);

// Resolves the linear layer of `weight_name` (weight [n, k]): a pre-quantized layout converted to ours, or
// the plain weight entry quantized per `plan`. `device`: on devices without FP8/INT4 kernels (CUDA today) the
// quantized weight is dequantized to BF16 (same values, no memory saving). Bias: not handled here.
Linear resolve_quantized_linear(const TensorSource& source, const std::string& weight_name, int64_t n,
                                int64_t k, const HfQuantConfig& hf, const LayerQuant& plan, Device device,
                                const PlaceFn& place);

}  // namespace inferx
