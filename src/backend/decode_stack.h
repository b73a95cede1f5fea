#pragma once
// A whole decode step for one token of one sequence, described for backends that run it as one fused
// program (Backend::decode_stack; the CUDA backend's persistent kernel, kernels_decode_stack.h). The
// model fills it from its weights; the layers' order of operations is exactly Model::forward's.
#include <span>

#include "backend/linear.h"
#include "core/tensor.h"

namespace inferx {

struct KvCacheLayer;

struct DecodeStackLayer {
  const Tensor* attn_norm = nullptr;
  const Tensor* ffn_norm = nullptr;
  const Linear* qkv = nullptr;  // q, k, v stacked (model/fused_projections.h)
  const Linear* o = nullptr;
  const Linear* gate_up = nullptr;  // gate over up
  const Linear* down = nullptr;
  const KvCacheLayer* cache = nullptr;
};

struct DecodeStack {
  const Tensor* token_embedding = nullptr;
  std::span<const DecodeStackLayer> layers;
  const Tensor* final_norm = nullptr;
  const Linear* lm_head = nullptr;
  float rms_norm_eps = 1e-5f;
};

}  // namespace inferx
