#pragma once
// Fused projections for backends that ask for them (Backend::prefers_fused_projections): each layer's
// q/k/v weights are stacked into one weight (LayerWeights::qkv, run by Backend::matmul_split) and gate
// over up into LayerWeights::gate_up (Backend::matmul_silu_mul). Built after everything else the loader
// does (quantization, tensor-parallel slicing: per rank), on the backend, one layer at a time: the parts'
// own buffers are released and q/k/v/gate/up become row views of the fused weights, so the weights are
// held once and every other reader of LayerWeights sees them unchanged.
// Layers whose parts cannot be stacked (different formats, group sizes, input permutations) stay unfused.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace inferx {

// Returns the number of fused projections built. `owned` holds the loader's weight buffers.
int fuse_projections(Backend& backend, std::vector<std::unique_ptr<DeviceBuffer>>& owned,
                     std::vector<LayerWeights>& layers);

}  // namespace inferx
