#pragma once
// Element types of tensors, including the GGUF block-quantized types. A quantized type packs
// `block_elems` consecutive elements of a row into `block_bytes` bytes (layouts: src/quant/gguf_blocks.h).
#include <cstdint>
#include <optional>
#include <string_view>

namespace inferx {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8_0,  // 32 elems: f16 scale + 32 x int8                                    (34 bytes)
  Q4_0,  // 32 elems: f16 scale + 16 bytes of 4-bit values (offset 8)         (18 bytes)
  Q4_K,  // 256 elems: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 B  (144 bytes)
  Q6_K,  // 256 elems: 128 B low 4 bits, 64 B high 2 bits, 16 x int8 scales, f16 d (210 bytes)
  I32,
  I8,
  // Appended by the quantization engine (existing ids unchanged; formats described in src/quant/):
  F8_E4M3,  // 1 byte: OCP FP8 E4M3 (bias 7, no infinities, max 448); scales live in Linear::scale
  U8,       // 1 byte unsigned (packed payloads and zero points in checkpoints)
  INT4,     // 32 elems: 16 bytes of 4-bit codes (quant/int4.h layout); group scales in Linear::scale
  kCount
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_elems;  // 1 for plain types
  int64_t block_bytes;  // bytes per block (= element size for plain types)
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
inline std::string_view dtype_name(DType t) { return dtype_info(t).name; }
inline bool is_quantized(DType t) { return dtype_info(t).quantized; }

// Bytes of a row of `n` elements; throws inferx::Error when n is not a multiple of the block size.
int64_t row_bytes(DType t, int64_t n);

// Parses "f32", "F16", "bf16", "q8_0", "Q4_K" ... (case-insensitive).
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace inferx
