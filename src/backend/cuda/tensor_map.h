#pragma once
// Tensor maps (Hopper's tensor-memory-accelerator descriptors) encoded through the runtime's driver entry
// point, so nothing links against the driver library: the decode attention v3's FP8 tiles and the persistent
// decode kernel's key/value blocks.
#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>

namespace inferx::cuda {

// cuTensorMapEncodeTiled; null if the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

}  // namespace inferx::cuda
