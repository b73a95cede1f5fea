#pragma once
// GGUF v2/v3 model files (spec: ggml docs/gguf.md): header, typed metadata key/values, tensor infos,
// aligned tensor data. GgufFile maps the file and validates everything before handing out pointers;
// GgufWriter produces files that llama.cpp and GgufFile read.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "formats/tensor_source.h"

namespace inferx {

// Metadata value types, numbered as in the spec.
enum class GgufType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

struct GgufArray;

// One metadata value. Arrays hold homogeneous elements (nested arrays allowed by the spec).
struct GgufValue {
  GgufType type = GgufType::UINT8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> value;

  // Typed accessors; throw inferx::Error when the stored type does not convert without loss
  // (any integer type to int64/uint64 in range, FLOAT32/64 to double, BOOL, STRING).
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_float() const;  // also accepts integers
  bool as_bool() const;
  const std::string& as_string() const;
  const GgufArray& as_array() const;

  static GgufValue of_uint(GgufType t, uint64_t v);
  static GgufValue of_int(GgufType t, int64_t v);
  static GgufValue of_float(GgufType t, double v);
  static GgufValue of_bool(bool v);
  static GgufValue of_string(std::string v);
  static GgufValue of_array(GgufArray a);
};

struct GgufArray {
  GgufType element_type = GgufType::UINT8;
  std::vector<GgufValue> items;

  std::vector<std::string> strings() const;  // throws unless element_type == STRING
  std::vector<float> floats() const;         // FLOAT32/FLOAT64/integers
  std::vector<int64_t> ints() const;         // integer types
};

// GGML tensor type ids (ggml.h enum ggml_type) <-> our DType. Unsupported ids give nullopt.
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);
uint32_t dtype_to_ggml(DType t);  // throws for I8/I32 kinds GGUF cannot carry as weights

class GgufFile final : public TensorSource {
 public:
  // Maps and validates the whole file; throws inferx::Error naming the path and the problem
  // (bad magic, unsupported version, truncated, absurd counts/dims, offsets past the end, overflow,
  // misaligned data, unknown tensor type, duplicate names).
  explicit GgufFile(const std::string& path);
  // Parses from memory (used by the fuzzer and tests); `name` appears in errors. Keeps no reference
  // to `bytes` beyond what the caller guarantees stays alive.
  GgufFile(const uint8_t* bytes, size_t size, std::string name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return name_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find_metadata(std::string_view key) const;  // nullptr when absent
  // Convenience getters: throw naming the key when absent or of the wrong type, unless a default is given.
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;

  const std::vector<TensorEntry>& tensors() const { return tensors_; }

  // TensorSource
  const TensorEntry* find(std::string_view name) const override;
  std::vector<std::string> tensor_names() const override;
  std::string describe() const override;

 private:
  void parse(const uint8_t* data, size_t size);
  MappedFile file_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Writes GGUF v3. Tensors are given in PyTorch order (shape) and written with ggml's reversed ne[].
class GgufWriter {
 public:
  void set(std::string key, GgufValue value);
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                  uint64_t nbytes);  // copies the data; checks nbytes against dtype/shape
  void set_alignment(uint32_t a);    // also written as general.alignment
  // Writes the file; throws inferx::Error naming the path on I/O failure.
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace inferx
