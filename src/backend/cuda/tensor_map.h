#pragma once
// Tensor maps (Hopper's tensor-memory-accelerator descriptors) encoded through the runtime's driver entry
// point, so nothing links against the driver library: the decode attention v3's FP8 tiles and the persistent
// decode kernel's key/value blocks.
#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>

namespace inferx::cuda {

// cuTensorMapEncodeTiled; null if the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A 2-D map over `rows` rows of `row_elems` elements each, `row_bytes` apart, from `base`; a copy brings a
// box of box_rows rows x box_elems elements. False if the driver has no encoder or refuses the map.
bool encode_rows_map(CUtensorMap& map, const void* base, CUtensorMapDataType type, uint64_t row_elems,
                     uint64_t rows, uint64_t row_bytes, uint32_t box_elems, uint32_t box_rows,
                     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion);

}  // namespace inferx::cuda
