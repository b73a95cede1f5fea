#pragma once
// The GEMM tuning cache file: what the CUDA backend's cuBLASLt autotuning chose per product shape and row
// bucket (backend/cuda/gemm_cublaslt.h), kept across runs so that a restart skips the candidate timing that
// the engine's warm-up otherwise spends most of its 2-4 s on. cuBLASLt documents its algorithm descriptor
// (cublasLtMatmulAlgo_t, 8 x u64) as "trivially serialized and later restored for use with the same version
// of cuBLAS"; the backend still checks each restored algorithm against its shape (cublasLtMatmulAlgoCheck)
// before using it.
//
// A file belongs to one context: a line of text naming the device, the cuBLASLt version and every setting
// that steers the choice. A file of another context is ignored (and replaced by the next write). Layout, in
// the host's byte order (little-endian on every machine the CUDA backend runs on):
//   "IXGEMMTUNE1\n"  u32 context length, the context bytes,  u32 record count, then per record:
//   12 x i64 key (the plan key: types, shape, row bucket, alignments),  8 x u64 algorithm,  u8 flags.
// Reading trusts nothing: a short, long, or malformed file yields no records and says why.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace inferx {

struct GemmTuningRecord {
  std::array<int64_t, 12> key{};
  std::array<uint64_t, 8> algo{};
  uint8_t flags = 0;  // bit 0: the bias is fused into the GEMM's epilogue
  bool operator==(const GemmTuningRecord&) const = default;
};

// The records of `bytes` when they are a well-formed tuning file of `context`; otherwise none, and `why`
// says what was wrong (another context, a bad header, a size that does not match the record count).
std::vector<GemmTuningRecord> parse_gemm_tuning(std::string_view bytes, std::string_view context,
                                                std::string& why);
std::string serialize_gemm_tuning(std::string_view context, const std::vector<GemmTuningRecord>& records);

// The records of the file at `path` (none and an empty `why` when there is no such file; none and a reason
// naming the file when it cannot be read or parsed).
std::vector<GemmTuningRecord> read_gemm_tuning_file(const std::string& path, std::string_view context,
                                                    std::string& why);
// Writes the file through a temporary file in the same folder and a rename, creating the folder first, so
// that a reader never sees a torn file and concurrent writers leave one whole file (the last one's). False,
// with `error` naming the file, when that fails.
bool write_gemm_tuning_file(const std::string& path, std::string_view context,
                            const std::vector<GemmTuningRecord>& records, std::string& error);

}  // namespace inferx
