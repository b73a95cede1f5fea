#pragma once
// safetensors (huggingface/safetensors: 8-byte little-endian header length, JSON header of
// {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the raw data).
// SafetensorsModel opens one file or a sharded set through model.safetensors.index.json.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "formats/tensor_source.h"

namespace inferx {

class SafetensorsFile final : public TensorSource {
 public:
  // Throws inferx::Error naming the path and the problem (short file, header length past the end,
  // bad JSON, unknown dtype, offsets out of range / overlapping / not matching dtype x shape, overflow).
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(const uint8_t* bytes, size_t size, std::string name);  // for fuzzing and tests

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }

  const TensorEntry* find(std::string_view name) const override;
  std::vector<std::string> tensor_names() const override;
  std::string describe() const override { return name_; }

 private:
  void parse(const uint8_t* data, size_t size);
  MappedFile file_;
  std::string name_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// All the safetensors of a Hugging Face model folder: model.safetensors, or the shards listed by
// model.safetensors.index.json (every listed tensor must be found in the shard the index names).
class SafetensorsModel final : public TensorSource {
 public:
  explicit SafetensorsModel(const std::string& folder);

  const TensorEntry* find(std::string_view name) const override;
  std::vector<std::string> tensor_names() const override;
  std::string describe() const override;

 private:
  std::string folder_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorEntry*, std::less<>> index_;
};

// Writes one safetensors file as the Rust/Python library does: header keys sorted, header padded with
// spaces so the data starts 8-byte aligned, data ordered by element size (largest first) then name so
// every tensor is aligned to its element size with no gaps between tensors.
class SafetensorsWriter {
 public:
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                  uint64_t nbytes);  // F32/F16/BF16/I32/I8 (+ our quantized types stored as U8 bytes
                                     // are the quantization issue's business, not this writer's)
  void set_metadata(std::string key, std::string value);
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  friend void write_sharded_safetensors(const std::string& folder, const SafetensorsWriter& all,
                                        uint64_t max_shard_bytes);
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes a sharded set: shards of at most max_shard_bytes plus model.safetensors.index.json.
void write_sharded_safetensors(const std::string& folder, const SafetensorsWriter& all,
                               uint64_t max_shard_bytes);

}  // namespace inferx
