#pragma once
// Names of GGUF metadata value types and GGML tensor type ids, for error messages (internal to formats/).
#include <cstdint>
#include <string_view>

#include "formats/gguf.h"

namespace inferx {

// "UINT32", "STRING", ...; "unknown" for ids outside the spec's table.
std::string_view gguf_type_name(GgufType t);
// "F32", "Q5_K", ...; "unknown" for ids ggml never assigned.
std::string_view ggml_type_name(uint32_t ggml_type);
// Bytes of one scalar value of type t on disk; 0 for STRING, ARRAY and unknown ids.
uint64_t gguf_scalar_size(GgufType t);

}  // namespace inferx
