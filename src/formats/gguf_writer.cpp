// GGUF v3 writer (spec: ggml docs/gguf.md). Keys are written in insertion order, tensors in the order
// added, each tensor's data padded to the alignment, and the data section starts at the first multiple of
// the alignment after the tensor infos, as the spec requires.
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_names.h"

namespace inferx {

namespace {

constexpr uint32_t kVersion = 3;

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

class ByteSink {
 public:
  std::vector<uint8_t> bytes;

  template <class T>
  void put(T v) {
    put_raw(&v, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    put_raw(s.data(), s.size());
  }
  void put_raw(const void* p, size_t n) {
    if (n == 0) return;
    size_t at = bytes.size();
    bytes.resize(at + n);
    std::memcpy(bytes.data() + at, p, n);
  }
};

// Range-checked narrowing: a GgufValue built by hand (not through of_uint/of_int) may hold a value its
// declared type cannot carry.
template <class T, class V>
T narrow(V v, const std::string& key) {
  if (!std::in_range<T>(v)) fail("GgufWriter: key '{}': value {} does not fit its declared type", key, v);
  return static_cast<T>(v);
}

void put_value(ByteSink& out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::UINT8:
      return out.put(narrow<uint8_t>(v.as_uint(), key));
    case GgufType::UINT16:
      return out.put(narrow<uint16_t>(v.as_uint(), key));
    case GgufType::UINT32:
      return out.put(narrow<uint32_t>(v.as_uint(), key));
    case GgufType::UINT64:
      return out.put(v.as_uint());
    case GgufType::INT8:
      return out.put(narrow<int8_t>(v.as_int(), key));
    case GgufType::INT16:
      return out.put(narrow<int16_t>(v.as_int(), key));
    case GgufType::INT32:
      return out.put(narrow<int32_t>(v.as_int(), key));
    case GgufType::INT64:
      return out.put(v.as_int());
    case GgufType::FLOAT32:
      return out.put(static_cast<float>(v.as_float()));
    case GgufType::FLOAT64:
      return out.put(v.as_float());
    case GgufType::BOOL:
      return out.put<uint8_t>(v.as_bool() ? 1 : 0);
    case GgufType::STRING:
      return out.put_string(v.as_string());
    case GgufType::ARRAY: {
      const GgufArray& a = v.as_array();
      out.put(static_cast<uint32_t>(a.element_type));
      out.put<uint64_t>(a.items.size());
      for (const GgufValue& item : a.items) {
        INFERX_CHECK(item.type == a.element_type, "GgufWriter: key '{}': a {} item in an array of {}", key,
                     gguf_type_name(item.type), gguf_type_name(a.element_type));
        put_value(out, item, key);
      }
      return;
    }
  }
  fail("GgufWriter: key '{}' has unknown value type {}", key, static_cast<uint32_t>(v.type));
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  if (key == "general.alignment") {
    uint64_t a = value.as_uint();
    INFERX_CHECK(a > 0 && std::has_single_bit(a) && a <= (uint64_t{1} << 31),
                 "GgufWriter: general.alignment = {} must be a power of two", a);
    alignment_ = static_cast<uint32_t>(a);
  }
  // Setting a key twice replaces the value in place: GGUF forbids duplicate keys.
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::set_alignment(uint32_t a) {
  set("general.alignment", GgufValue::of_uint(GgufType::UINT32, a));
}

void GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                            uint64_t nbytes) {
  INFERX_CHECK(!shape.empty() && shape.size() <= 4, "GgufWriter: tensor '{}' has rank {} (must be 1..4)",
               name, shape.size());
  for (const Pending& t : tensors_)
    INFERX_CHECK(t.name != name, "GgufWriter: duplicate tensor name '{}'", name);
  int64_t rows = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    INFERX_CHECK(shape[i] > 0, "GgufWriter: tensor '{}' has dimension {} = {}", name, i, shape[i]);
    if (i + 1 < shape.size())
      INFERX_CHECK(!__builtin_mul_overflow(rows, shape[i], &rows), "GgufWriter: tensor '{}' is too large",
                   name);
  }
  int64_t expected = 0;
  INFERX_CHECK(!__builtin_mul_overflow(rows, row_bytes(dtype, shape.back()), &expected),
               "GgufWriter: tensor '{}' is too large", name);
  INFERX_CHECK(nbytes == static_cast<uint64_t>(expected),
               "GgufWriter: tensor '{}' ({} {}) needs {} bytes, got {}", name, dtype_name(dtype),
               fmt::join(shape, "x"), expected, nbytes);
  INFERX_CHECK(data != nullptr || nbytes == 0, "GgufWriter: tensor '{}' has no data", name);
  dtype_to_ggml(dtype);  // throws for a dtype GGUF cannot carry
  const auto* p = static_cast<const uint8_t*>(data);
  tensors_.push_back(Pending{std::move(name), dtype, std::move(shape), std::vector<uint8_t>(p, p + nbytes)});
}

namespace {

// Everything before the data section: header, metadata, tensor infos and the padding after them.
std::vector<uint8_t> header_bytes(const std::vector<std::pair<std::string, GgufValue>>& kv,
                                  const auto& tensors, uint64_t alignment) {
  ByteSink out;
  out.put_raw("GGUF", 4);
  out.put(kVersion);
  out.put<uint64_t>(tensors.size());
  out.put<uint64_t>(kv.size());
  for (const auto& [key, value] : kv) {
    out.put_string(key);
    out.put(static_cast<uint32_t>(value.type));
    put_value(out, value, key);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    out.put_string(t.name);
    out.put(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) out.put(static_cast<uint64_t>(*it));
    out.put(dtype_to_ggml(t.dtype));
    out.put(offset);
    offset = align_up(offset + t.bytes.size(), alignment);
  }
  out.bytes.resize(align_up(out.bytes.size(), alignment), 0);
  return std::move(out.bytes);
}

}  // namespace

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out = header_bytes(kv_, tensors_, alignment_);
  for (const Pending& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    out.resize(align_up(out.size(), alignment_), 0);
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  // Streams the tensors after the header rather than building the whole file in memory.
  std::vector<uint8_t> head = header_bytes(kv_, tensors_, alignment_);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  INFERX_CHECK(f != nullptr, "{}: cannot open for writing: {}", path, std::strerror(errno));
  auto put = [&](const uint8_t* p, size_t n) {
    if (n != 0 && std::fwrite(p, 1, n, f.get()) != n)
      fail("{}: write failed: {}", path, std::strerror(errno));
  };
  put(head.data(), head.size());
  static const uint8_t kZeros[4096] = {};
  for (const Pending& t : tensors_) {
    put(t.bytes.data(), t.bytes.size());
    size_t pad = align_up(t.bytes.size(), alignment_) - t.bytes.size();
    while (pad > 0) {
      size_t n = std::min(pad, sizeof(kZeros));
      put(kZeros, n);
      pad -= n;
    }
  }
  FILE* raw = f.release();
  INFERX_CHECK(std::fclose(raw) == 0, "{}: write failed on close: {}", path, std::strerror(errno));
}

}  // namespace inferx
