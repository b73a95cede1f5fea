// GGUF metadata values (spec: ggml docs/gguf.md, "gguf_metadata_value_type") and the mapping between
// GGML tensor type ids (ggml.h enum ggml_type) and our DType.
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_names.h"

namespace inferx {

namespace {

bool is_unsigned(GgufType t) {
  return t == GgufType::UINT8 || t == GgufType::UINT16 || t == GgufType::UINT32 || t == GgufType::UINT64;
}
bool is_signed(GgufType t) {
  return t == GgufType::INT8 || t == GgufType::INT16 || t == GgufType::INT32 || t == GgufType::INT64;
}
bool is_float(GgufType t) { return t == GgufType::FLOAT32 || t == GgufType::FLOAT64; }

// Largest value an integer type holds (its minimum for signed types is -max - 1).
uint64_t int_max(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
      return std::numeric_limits<uint8_t>::max();
    case GgufType::UINT16:
      return std::numeric_limits<uint16_t>::max();
    case GgufType::UINT32:
      return std::numeric_limits<uint32_t>::max();
    case GgufType::UINT64:
      return std::numeric_limits<uint64_t>::max();
    case GgufType::INT8:
      return std::numeric_limits<int8_t>::max();
    case GgufType::INT16:
      return std::numeric_limits<int16_t>::max();
    case GgufType::INT32:
      return std::numeric_limits<int32_t>::max();
    case GgufType::INT64:
      return std::numeric_limits<int64_t>::max();
    default:
      return 0;
  }
}

// ggml.h enum ggml_type, by id. Ids 4, 5 and 31..33, 36..38 were assigned and later removed.
constexpr std::array<std::string_view, 40> kGgmlNames = {
    "F32",      "F16",      "Q4_0",    "Q4_1",  "Q4_2",       "Q4_3",       "Q5_0",       "Q5_1",
    "Q8_0",     "Q8_1",     "Q2_K",    "Q3_K",  "Q4_K",       "Q5_K",       "Q6_K",       "Q8_K",
    "IQ2_XXS",  "IQ2_XS",   "IQ3_XXS", "IQ1_S", "IQ4_NL",     "IQ3_S",      "IQ2_S",      "IQ4_XS",
    "I8",       "I16",      "I32",     "I64",   "F64",        "IQ1_M",      "BF16",       "Q4_0_4_4",
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
};

// DTypes with no GGML counterpart (InferX's own quantized formats).
constexpr uint32_t kNoGgmlType = 0xFFFFFFFFu;

// The GGML ids of the types we read, in DType order.
constexpr std::array<uint32_t, static_cast<size_t>(DType::kCount)> kGgmlIds = {
    0,            // F32
    1,            // F16
    30,           // BF16
    8,            // Q8_0
    2,            // Q4_0
    12,           // Q4_K
    14,           // Q6_K
    26,           // I32
    24,           // I8
    kNoGgmlType,  // F8_E4M3
    kNoGgmlType,  // U8
    kNoGgmlType,  // INT4
};

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::array<std::string_view, 13> kNames = {
      "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
      "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  auto i = static_cast<uint32_t>(t);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

std::string_view ggml_type_name(uint32_t ggml_type) {
  return ggml_type < kGgmlNames.size() ? kGgmlNames[ggml_type] : std::string_view("unknown");
}

uint64_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::BOOL:
      return 1;
    case GgufType::UINT16:
    case GgufType::INT16:
      return 2;
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::FLOAT32:
      return 4;
    case GgufType::UINT64:
    case GgufType::INT64:
    case GgufType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

std::optional<DType> dtype_from_ggml(uint32_t ggml_type) {
  for (size_t i = 0; i < kGgmlIds.size(); ++i)
    if (kGgmlIds[i] == ggml_type) return static_cast<DType>(i);
  return std::nullopt;
}

uint32_t dtype_to_ggml(DType t) {
  auto i = static_cast<size_t>(t);
  INFERX_CHECK(i < kGgmlIds.size() && kGgmlIds[i] != kNoGgmlType, "dtype {} has no GGML type", dtype_name(t));
  return kGgmlIds[i];
}

// ---- GgufValue ------------------------------------------------------------------------------------

int64_t GgufValue::as_int() const {
  if (is_signed(type)) return std::get<int64_t>(value);
  if (is_unsigned(type)) {
    uint64_t v = std::get<uint64_t>(value);
    INFERX_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "GGUF value {} ({}) does not fit in int64", v, gguf_type_name(type));
    return static_cast<int64_t>(v);
  }
  fail("GGUF value of type {} is not an integer", gguf_type_name(type));
}

uint64_t GgufValue::as_uint() const {
  if (is_unsigned(type)) return std::get<uint64_t>(value);
  if (is_signed(type)) {
    int64_t v = std::get<int64_t>(value);
    INFERX_CHECK(v >= 0, "GGUF value {} ({}) is negative where an unsigned integer is expected", v,
                 gguf_type_name(type));
    return static_cast<uint64_t>(v);
  }
  fail("GGUF value of type {} is not an integer", gguf_type_name(type));
}

double GgufValue::as_float() const {
  if (is_float(type)) return std::get<double>(value);
  if (is_signed(type)) return static_cast<double>(std::get<int64_t>(value));
  if (is_unsigned(type)) return static_cast<double>(std::get<uint64_t>(value));
  fail("GGUF value of type {} is not a number", gguf_type_name(type));
}

bool GgufValue::as_bool() const {
  INFERX_CHECK(type == GgufType::BOOL, "GGUF value of type {} is not a BOOL", gguf_type_name(type));
  return std::get<bool>(value);
}

const std::string& GgufValue::as_string() const {
  INFERX_CHECK(type == GgufType::STRING, "GGUF value of type {} is not a STRING", gguf_type_name(type));
  return std::get<std::string>(value);
}

const GgufArray& GgufValue::as_array() const {
  INFERX_CHECK(type == GgufType::ARRAY, "GGUF value of type {} is not an ARRAY", gguf_type_name(type));
  const auto& p = std::get<std::shared_ptr<GgufArray>>(value);
  INFERX_CHECK(p != nullptr, "GGUF ARRAY value holds no array");
  return *p;
}

GgufValue GgufValue::of_uint(GgufType t, uint64_t v) {
  INFERX_CHECK(is_unsigned(t), "GgufValue::of_uint: {} is not an unsigned integer type", gguf_type_name(t));
  INFERX_CHECK(v <= int_max(t), "GgufValue::of_uint: {} does not fit in {}", v, gguf_type_name(t));
  return GgufValue{t, v};
}

GgufValue GgufValue::of_int(GgufType t, int64_t v) {
  INFERX_CHECK(is_signed(t), "GgufValue::of_int: {} is not a signed integer type", gguf_type_name(t));
  auto max = static_cast<int64_t>(int_max(t));
  INFERX_CHECK(v <= max && v >= -max - 1, "GgufValue::of_int: {} does not fit in {}", v, gguf_type_name(t));
  return GgufValue{t, v};
}

GgufValue GgufValue::of_float(GgufType t, double v) {
  INFERX_CHECK(is_float(t), "GgufValue::of_float: {} is not a float type", gguf_type_name(t));
  // FLOAT32 values are kept as the float they will be written as, so a round trip compares equal.
  if (t == GgufType::FLOAT32) v = static_cast<double>(static_cast<float>(v));
  return GgufValue{t, v};
}

GgufValue GgufValue::of_bool(bool v) { return GgufValue{GgufType::BOOL, v}; }

GgufValue GgufValue::of_string(std::string v) { return GgufValue{GgufType::STRING, std::move(v)}; }

GgufValue GgufValue::of_array(GgufArray a) {
  for (const GgufValue& item : a.items)
    INFERX_CHECK(item.type == a.element_type, "GgufValue::of_array: a {} item in an array of {}",
                 gguf_type_name(item.type), gguf_type_name(a.element_type));
  return GgufValue{GgufType::ARRAY, std::make_shared<GgufArray>(std::move(a))};
}

// ---- GgufArray ------------------------------------------------------------------------------------

std::vector<std::string> GgufArray::strings() const {
  INFERX_CHECK(element_type == GgufType::STRING, "GGUF array of {} is not an array of STRING",
               gguf_type_name(element_type));
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const GgufValue& v : items) out.push_back(v.as_string());
  return out;
}

std::vector<float> GgufArray::floats() const {
  INFERX_CHECK(is_float(element_type) || is_signed(element_type) || is_unsigned(element_type),
               "GGUF array of {} is not an array of numbers", gguf_type_name(element_type));
  std::vector<float> out;
  out.reserve(items.size());
  for (const GgufValue& v : items) out.push_back(static_cast<float>(v.as_float()));
  return out;
}

std::vector<int64_t> GgufArray::ints() const {
  INFERX_CHECK(is_signed(element_type) || is_unsigned(element_type),
               "GGUF array of {} is not an array of integers", gguf_type_name(element_type));
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (const GgufValue& v : items) out.push_back(v.as_int());
  return out;
}

}  // namespace inferx
