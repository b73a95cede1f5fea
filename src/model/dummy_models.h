#pragma once
// dummy:NAME — random weights of a real model's shape, for benchmarks and smoke tests where the real
// weights are not available. Clearly reported as random: the outputs mean nothing.
#include <memory>
#include <string>
#include <vector>

#include "formats/model_config.h"
#include "formats/tensor_source.h"

namespace inferx {

// The named shapes: llama-3-8b, llama-3.2-1b, llama-3-70b, qwen2.5-7b, mistral-7b, qwen3-0.6b, tiny.
std::vector<std::string> dummy_model_names();
// Throws inferx::Error listing the known names.
ModelConfig dummy_model_config(const std::string& name);

// Generates every tensor of `config` (Hugging Face names) in host memory: linear weights and the
// embedding in `dtype` (random values of a sane scale; quantized blocks are random bytes with small
// valid scales), norms = 1, biases small. Parallel and deterministic for a seed.
std::unique_ptr<TensorSource> make_dummy_source(const std::string& name, const ModelConfig& config,
                                                DType dtype, uint64_t seed, bool host_data = true);

// host_data = false (a GPU backend): F32/F16/BF16 tensors get no host bytes (data == nullptr); the loader
// asks for their generator parameters (TensorSource::random_fill) and fills device memory with
// Backend::fill_random instead, so an 8B model needs no 16 GB host buffer, and a tensor-parallel rank
// generates its slice (make_rank_source slices the fills). The values differ from the host generator's
// (both are random).

}  // namespace inferx
