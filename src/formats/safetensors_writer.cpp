// safetensors writer, laid out like the reference implementation (huggingface/safetensors
// safetensors/src/tensor.rs, `prepare` and `serialize`): tensors ordered by element size (largest first)
// then by name, so every tensor sits at a multiple of its element size with no gaps; the JSON header
// padded with spaces to a multiple of 8 bytes so the data buffer starts 8-byte aligned.
// Sharded sets follow transformers' save_pretrained: model-0000i-of-0000K.safetensors plus
// model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {tensor: file}}.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"

namespace inferx {

namespace {

using json = nlohmann::json;

// A tensor to serialize, borrowed from the writer.
struct Item {
  const std::string* name;
  DType dtype;
  const std::vector<int64_t>* shape;
  const std::vector<uint8_t>* bytes;
};

int64_t elem_size(DType t) { return dtype_info(t).block_bytes; }

void sort_for_layout(std::vector<Item>& items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (elem_size(a.dtype) != elem_size(b.dtype)) return elem_size(a.dtype) > elem_size(b.dtype);
    return *a.name < *b.name;
  });
}

// The header bytes (JSON + space padding) for `items` in their given order.
std::string make_header(const std::vector<Item>& items, const std::map<std::string, std::string>& meta) {
  json header = json::object();  // std::map-backed: keys come out sorted
  if (!meta.empty()) header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const Item& it : items) {
    const uint64_t end = offset + it.bytes->size();
    header[*it.name] = {
        {"dtype", std::string(dtype_name(it.dtype))}, {"shape", *it.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

void append_u64_le(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> serialize(std::vector<Item> items, const std::map<std::string, std::string>& meta) {
  sort_for_layout(items);
  const std::string header = make_header(items, meta);
  size_t total = 8 + header.size();
  for (const Item& it : items) total += it.bytes->size();
  std::vector<uint8_t> out;
  out.reserve(total);
  append_u64_le(out, header.size());
  out.insert(out.end(), header.begin(), header.end());
  for (const Item& it : items) out.insert(out.end(), it.bytes->begin(), it.bytes->end());
  return out;
}

// Writes the serialized items to `path`, streaming the tensor data instead of building one buffer.
void write_file(const std::string& path, std::vector<Item> items,
                const std::map<std::string, std::string>& meta) {
  sort_for_layout(items);
  const std::string header = make_header(items, meta);
  std::vector<uint8_t> prefix;
  append_u64_le(prefix, header.size());
  prefix.insert(prefix.end(), header.begin(), header.end());

  std::FILE* fp = std::fopen(path.c_str(), "wb");
  INFERX_CHECK(fp != nullptr, "{}: cannot create: {}", path, std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, fp) != n) {
      int err = errno;
      std::fclose(fp);
      fail("{}: write failed: {}", path, std::strerror(err));
    }
  };
  put(prefix.data(), prefix.size());
  for (const Item& it : items) put(it.bytes->data(), it.bytes->size());
  INFERX_CHECK(std::fclose(fp) == 0, "{}: write failed on close: {}", path, std::strerror(errno));
}

}  // namespace

void SafetensorsWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                   const void* data, uint64_t nbytes) {
  INFERX_CHECK(name != "__metadata__", "safetensors writer: '__metadata__' is reserved, not a tensor name");
  INFERX_CHECK(!is_quantized(dtype), "safetensors writer: tensor '{}': dtype {} has no safetensors name",
               name, dtype_name(dtype));
  for (const Pending& p : tensors_)
    INFERX_CHECK(p.name != name, "safetensors writer: duplicate tensor '{}'", name);
  uint64_t numel = 1;
  for (int64_t d : shape) {
    INFERX_CHECK(d >= 0, "safetensors writer: tensor '{}': negative dimension {}", name, d);
    INFERX_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel),
                 "safetensors writer: tensor '{}': element count overflows", name);
  }
  uint64_t expected = 0;
  INFERX_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size(dtype)), &expected) &&
                   expected == nbytes,
               "safetensors writer: tensor '{}': {} bytes given, {} of {} elements need {}", name, nbytes,
               dtype_name(dtype), numel, expected);
  INFERX_CHECK(data != nullptr || nbytes == 0, "safetensors writer: tensor '{}': null data", name);
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back({std::move(name), dtype, std::move(shape),
                      nbytes == 0 ? std::vector<uint8_t>{} : std::vector<uint8_t>(p, p + nbytes)});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::vector<uint8_t> SafetensorsWriter::to_bytes() const {
  std::vector<Item> items;
  for (const Pending& p : tensors_) items.push_back({&p.name, p.dtype, &p.shape, &p.bytes});
  return serialize(std::move(items), metadata_);
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<Item> items;
  for (const Pending& p : tensors_) items.push_back({&p.name, p.dtype, &p.shape, &p.bytes});
  write_file(path, std::move(items), metadata_);
}

void write_sharded_safetensors(const std::string& folder, const SafetensorsWriter& all,
                               uint64_t max_shard_bytes) {
  INFERX_CHECK(max_shard_bytes > 0, "{}: max_shard_bytes must be positive", folder);
  std::vector<Item> items;
  for (const auto& p : all.tensors_) items.push_back({&p.name, p.dtype, &p.shape, &p.bytes});
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return *a.name < *b.name; });

  // Greedy packing in name order, as huggingface_hub's split_torch_state_dict_into_shards does: start
  // a new shard when the next tensor would overflow the current one; a tensor larger than the limit
  // gets a shard of its own.
  std::vector<std::vector<Item>> shards;
  uint64_t current = 0, total = 0;
  for (const Item& it : items) {
    const uint64_t n = it.bytes->size();
    if (shards.empty() || (current + n > max_shard_bytes && !shards.back().empty())) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(it);
    current += n;
    total += n;
  }
  if (shards.empty()) shards.emplace_back();  // no tensors: still a valid (empty) set

  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  INFERX_CHECK(!ec, "{}: cannot create folder: {}", folder, ec.message());

  json weight_map = json::object();
  const size_t k = shards.size();
  for (size_t i = 0; i < k; ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, k);
    for (const Item& it : shards[i]) weight_map[*it.name] = file;
    write_file((std::filesystem::path(folder) / file).string(), shards[i], all.metadata_);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string index_path = (std::filesystem::path(folder) / "model.safetensors.index.json").string();
  const std::string text = index.dump(2) + "\n";
  std::FILE* fp = std::fopen(index_path.c_str(), "wb");
  INFERX_CHECK(fp != nullptr, "{}: cannot create: {}", index_path, std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), fp) == text.size();
  const int err = errno;
  INFERX_CHECK(std::fclose(fp) == 0 && ok, "{}: write failed: {}", index_path, std::strerror(err));
}

}  // namespace inferx
