// GGUF v2/v3 reader (spec: ggml docs/gguf.md, "File Structure"). Layout, all little-endian:
//   magic "GGUF" | uint32 version | uint64 tensor_count | uint64 metadata_kv_count
//   kv pairs:     gguf_string key | uint32 value_type | value
//   tensor infos: gguf_string name | uint32 n_dims | uint64 ne[n_dims] | uint32 ggml_type | uint64 offset
//   padding to general.alignment (default 32), then the data section; offsets are relative to it.
// Every read is bounds-checked and every count is checked against the bytes left before anything is
// allocated, so a hostile or truncated file produces an inferx::Error, never a crash or a huge allocation.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_names.h"

namespace inferx {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

// Smallest encodings, used to reject counts that the remaining bytes cannot possibly hold.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one ne, type, offset
constexpr uint64_t kMinArrayBytes = 4 + 8;                   // element type + count
constexpr uint64_t kMinStringBytes = 8;                      // length
constexpr uint32_t kMaxDimsGguf = 4;                         // GGML_MAX_DIMS
// Arrays of arrays are legal; real files nest at most once. The cap keeps recursion shallow.
constexpr int kMaxArrayDepth = 8;

// A bounds-checked little-endian cursor over the file bytes; every failure names the file.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : data_(data), size_(size), name_(name) {}

  template <class... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}", name_, fmt::format(format, std::forward<Args>(args)...));
  }

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  const uint8_t* take(uint64_t n, std::string_view what) {
    if (n > left())
      error("truncated: {} needs {} bytes at offset {} but the file has {} bytes", what, n, pos_, size_);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  template <class T>
  T read(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string read_string(std::string_view what) {
    auto len = read<uint64_t>(what);
    if (len > left())
      error("{} has length {} but only {} bytes are left in the file (offset {})", what, len, left(), pos_);
    const uint8_t* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

uint64_t min_value_bytes(GgufType t) {
  if (t == GgufType::STRING) return kMinStringBytes;
  if (t == GgufType::ARRAY) return kMinArrayBytes;
  return gguf_scalar_size(t);
}

// `key` names the value in errors; `what` ("the value of metadata key 'k'") describes truncation.
GgufValue read_value(Cursor& in, GgufType type, const std::string& key, const std::string& what, int depth) {
  switch (type) {
    case GgufType::UINT8:
      return GgufValue{type, uint64_t{in.read<uint8_t>(what)}};
    case GgufType::UINT16:
      return GgufValue{type, uint64_t{in.read<uint16_t>(what)}};
    case GgufType::UINT32:
      return GgufValue{type, uint64_t{in.read<uint32_t>(what)}};
    case GgufType::UINT64:
      return GgufValue{type, in.read<uint64_t>(what)};
    case GgufType::INT8:
      return GgufValue{type, int64_t{in.read<int8_t>(what)}};
    case GgufType::INT16:
      return GgufValue{type, int64_t{in.read<int16_t>(what)}};
    case GgufType::INT32:
      return GgufValue{type, int64_t{in.read<int32_t>(what)}};
    case GgufType::INT64:
      return GgufValue{type, in.read<int64_t>(what)};
    case GgufType::FLOAT32:
      return GgufValue{type, double{in.read<float>(what)}};
    case GgufType::FLOAT64:
      return GgufValue{type, in.read<double>(what)};
    case GgufType::BOOL: {
      // Spec: "1-byte value where 0 is false and 1 is true. Anything else is invalid".
      auto b = in.read<uint8_t>(what);
      if (b > 1) in.error("metadata key '{}' has BOOL byte {} (must be 0 or 1)", key, b);
      return GgufValue{type, b == 1};
    }
    case GgufType::STRING:
      return GgufValue{type, in.read_string(what)};
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        in.error("metadata key '{}' nests arrays more than {} deep", key, kMaxArrayDepth);
      auto elem = in.read<uint32_t>(what);
      if (!known_value_type(elem))
        in.error("metadata key '{}' is an array of unknown value type {}", key, elem);
      auto elem_type = static_cast<GgufType>(elem);
      auto count = in.read<uint64_t>(what);
      uint64_t min_bytes = min_value_bytes(elem_type);
      if (count > in.left() / min_bytes)
        in.error("metadata key '{}' is an array of {} {} values, but only {} bytes are left in the file", key,
                 count, gguf_type_name(elem_type), in.left());
      auto arr = std::make_shared<GgufArray>();
      arr->element_type = elem_type;
      arr->items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i)
        arr->items.push_back(read_value(in, elem_type, key, what, depth + 1));
      return GgufValue{type, std::move(arr)};
    }
  }
  in.error("metadata key '{}' has unknown value type {}", key, static_cast<uint32_t>(type));
}

// a * b, or nullopt when it overflows int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::string ne_string(const std::vector<uint64_t>& ne) { return fmt::format("[{}]", fmt::join(ne, ", ")); }

}  // namespace

GgufFile::GgufFile(const std::string& path) : file_(path), name_(path) { parse(file_.data(), file_.size()); }

GgufFile::GgufFile(const uint8_t* bytes, size_t size, std::string name) : name_(std::move(name)) {
  parse(bytes, size);
}

void GgufFile::parse(const uint8_t* data, size_t size) {
  Cursor in(data, size, name_);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
    in.error("not a GGUF file (the first 4 bytes are not the magic \"GGUF\")");
  in.take(4, "magic");

  // Header. Versions 2 and 3 share this layout (v3 only allowed big-endian files); v1 used 32-bit counts.
  version_ = in.read<uint32_t>("the version");
  if (version_ == 1)
    in.error(
        "GGUF version 1 is not supported (it used 32-bit counts); supported versions are 2 and 3, "
        "re-convert the model with a current converter");
  if (version_ != 2 && version_ != 3) {
    // A big-endian file's version 3 reads as 0x03000000 here.
    if ((version_ & 0xFFFFu) == 0 && __builtin_bswap32(version_) >= 1 && __builtin_bswap32(version_) <= 3)
      in.error(
          "version field is 0x{:08x}: the version bytes are swapped, so this looks like a big-endian "
          "GGUF file; only little-endian GGUF files are supported",
          version_);
    in.error("unsupported GGUF version {} (supported: 2 and 3)", version_);
  }
  auto tensor_count = in.read<uint64_t>("the tensor count");
  auto kv_count = in.read<uint64_t>("the metadata key/value count");
  if (kv_count > in.left() / kMinKvBytes)
    in.error(
        "absurd metadata key/value count {} (or a truncated file): the {} bytes left can hold at most {}",
        kv_count, in.left(), in.left() / kMinKvBytes);
  if (tensor_count > in.left() / kMinTensorInfoBytes)
    in.error(
        "absurd tensor count {} (or a truncated file): the {} bytes left can hold at most {} tensor infos",
        tensor_count, in.left(), in.left() / kMinTensorInfoBytes);

  // Metadata.
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = in.read_string(fmt::format("metadata key #{}", i));
    auto type = in.read<uint32_t>(fmt::format("the value type of metadata key '{}'", key));
    if (!known_value_type(type)) in.error("metadata key '{}' has unknown value type {}", key, type);
    GgufValue value = read_value(in, static_cast<GgufType>(type), key,
                                 fmt::format("the value of metadata key '{}'", key), 0);
    if (metadata_.count(key) != 0) in.error("duplicate metadata key '{}'", key);
    metadata_.emplace(std::move(key), std::move(value));
  }

  // general.alignment: spec says UINT32, a power of two; absent means 32.
  if (const GgufValue* a = find_metadata("general.alignment")) {
    uint64_t align = 0;
    try {
      align = a->as_uint();
    } catch (const Error& e) {
      in.error("general.alignment: {}", e.what());
    }
    if (align == 0 || !std::has_single_bit(align) || align > std::numeric_limits<uint32_t>::max())
      in.error("general.alignment = {} must be a power of two between 1 and 2^31", align);
    alignment_ = align;
  }

  // Tensor infos.
  if (tensor_count > in.left() / kMinTensorInfoBytes)
    in.error(
        "absurd tensor count {} (or a truncated file): the {} bytes left after the metadata can hold at most "
        "{} tensor infos",
        tensor_count, in.left(), in.left() / kMinTensorInfoBytes);
  std::vector<uint64_t> offsets;
  tensors_.reserve(static_cast<size_t>(tensor_count));
  offsets.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorEntry t;
    t.file = name_;
    t.name = in.read_string(fmt::format("the name of tensor #{}", i));
    std::string what = fmt::format("tensor '{}' info", t.name);
    auto n_dims = in.read<uint32_t>(what);
    if (n_dims == 0 || n_dims > kMaxDimsGguf)
      in.error("tensor '{}' has {} dimensions (must be 1..{})", t.name, n_dims, kMaxDimsGguf);
    std::vector<uint64_t> ne(n_dims);
    for (uint64_t& d : ne) d = in.read<uint64_t>(what);
    auto ggml_type = in.read<uint32_t>(what);
    uint64_t offset = in.read<uint64_t>(what);

    int64_t numel = 1;
    for (uint64_t d : ne) {
      if (d == 0 || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        in.error("tensor '{}' has invalid dimensions ne={} (each must be between 1 and 2^63-1)", t.name,
                 ne_string(ne));
      auto m = checked_mul(numel, static_cast<int64_t>(d));
      if (!m) in.error("tensor '{}' has too many elements: ne={} overflows int64", t.name, ne_string(ne));
      numel = *m;
    }
    std::optional<DType> dtype = dtype_from_ggml(ggml_type);
    if (!dtype)
      in.error("tensor '{}' has unsupported type {} (id {})", t.name, ggml_type_name(ggml_type), ggml_type);
    t.dtype = *dtype;
    const DTypeInfo& info = dtype_info(t.dtype);
    // Quantized blocks run along ne[0], the innermost dimension (PyTorch's last).
    if (static_cast<int64_t>(ne[0]) % info.block_elems != 0)
      in.error("tensor '{}' has rows of {} elements, not a whole number of {} blocks ({} elements each)",
               t.name, ne[0], info.name, info.block_elems);
    auto nbytes = checked_mul(numel / info.block_elems, info.block_bytes);
    if (!nbytes)
      in.error("tensor '{}' byte size overflows int64 (ne={}, {})", t.name, ne_string(ne), info.name);
    t.nbytes = static_cast<uint64_t>(*nbytes);
    t.shape.assign(ne.rbegin(), ne.rend());  // ggml ne[0] is innermost: PyTorch order is reversed
    if (index_.count(t.name) != 0) in.error("duplicate tensor name '{}'", t.name);
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
    offsets.push_back(offset);
  }

  // Data section: starts at the next multiple of the alignment after the infos.
  uint64_t data_start = (in.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorEntry& t = tensors_[i];
    uint64_t offset = offsets[i];
    if (offset % alignment_ != 0)
      in.error("tensor '{}' data offset {} is not a multiple of the alignment {}", t.name, offset,
               alignment_);
    uint64_t begin = 0;
    uint64_t end = 0;
    if (__builtin_add_overflow(data_start, offset, &begin) || __builtin_add_overflow(begin, t.nbytes, &end))
      in.error("tensor '{}' data offset {} + size {} overflows", t.name, offset, t.nbytes);
    if (end > size)
      in.error("tensor '{}' data [{}, {}) runs past the end of the file ({} bytes)", t.name, begin, end,
               size);
    t.data = data + begin;
  }

  // No two tensors may share bytes (ggml writes them back to back, each padded to the alignment).
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorEntry& a = tensors_[order[k - 1]];
    const TensorEntry& b = tensors_[order[k]];
    if (offsets[order[k - 1]] + a.nbytes > offsets[order[k]])
      in.error("tensors '{}' (data offset {}, {} bytes) and '{}' (data offset {}) overlap", a.name,
               offsets[order[k - 1]], a.nbytes, b.name, offsets[order[k]]);
  }
}

const GgufValue* GgufFile::find_metadata(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
// Runs an accessor, re-throwing its type error with the file and key named.
template <class F>
auto with_key(const std::string& file, std::string_view key, F&& get) -> decltype(get()) {
  try {
    return get();
  } catch (const Error& e) {
    fail("{}: metadata key '{}': {}", file, key, e.what());
  }
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find_metadata(key);
  INFERX_CHECK(v != nullptr, "{}: required metadata key '{}' is missing", name_, key);
  return with_key(name_, key, [&] { return v->as_string(); });
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find_metadata(key);
  INFERX_CHECK(v != nullptr, "{}: required metadata key '{}' is missing", name_, key);
  return with_key(name_, key, [&] { return v->as_int(); });
}

int64_t GgufFile::get_int(std::string_view key, int64_t fallback) const {
  const GgufValue* v = find_metadata(key);
  return v == nullptr ? fallback : with_key(name_, key, [&] { return v->as_int(); });
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find_metadata(key);
  INFERX_CHECK(v != nullptr, "{}: required metadata key '{}' is missing", name_, key);
  return with_key(name_, key, [&] { return v->as_float(); });
}

double GgufFile::get_float(std::string_view key, double fallback) const {
  const GgufValue* v = find_metadata(key);
  return v == nullptr ? fallback : with_key(name_, key, [&] { return v->as_float(); });
}

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  const GgufValue* v = find_metadata(key);
  return v == nullptr ? fallback : with_key(name_, key, [&] { return v->as_bool(); });
}

const TensorEntry* GgufFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> GgufFile::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorEntry& t : tensors_) names.push_back(t.name);
  return names;
}

std::string GgufFile::describe() const {
  return fmt::format("{} (GGUF v{}, {} tensors)", name_, version_, tensors_.size());
}

}  // namespace inferx
