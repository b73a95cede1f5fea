// safetensors reader (format: huggingface/safetensors README, "Format" section): an 8-byte little-endian
// header length N, N bytes of a UTF-8 JSON object, then the byte buffer that every tensor's
// "data_offsets" [begin, end) index into. Everything in the header is untrusted: each field is type
// checked, each size is computed with overflow checks and each range is checked against the buffer.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "formats/safetensors.h"

namespace inferx {

namespace {

using json = nlohmann::json;

// The Rust library rejects headers over 100 MB (MAX_HEADER_SIZE); real headers are a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The header schema is 3 levels deep ({name: {"shape": [..]}}); anything deeper is not safetensors.
constexpr size_t kMaxJsonDepth = 8;
// Rank beyond what any weight needs; TensorEntry::view() further limits use to kMaxDims.
constexpr size_t kMaxRank = 8;

// dtypes of the safetensors spec that InferX does not load (named so the error says "unsupported",
// not "unknown").
constexpr const char* kUnsupportedDtypes[] = {"BOOL",    "U16",     "U32", "U64",     "I16",     "I64", "F64",
                                              "F8_E5M2", "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};

std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I32") return DType::I32;
  if (s == "I8") return DType::I8;
  if (s == "U8") return DType::U8;            // packed quantized payloads (quant/ checkpoints)
  if (s == "F8_E4M3") return DType::F8_E4M3;  // FP8 weights (compressed-tensors, our checkpoints)
  return std::nullopt;
}

// Parses the header, rejecting duplicate keys (nlohmann keeps the last one silently, which would let
// two tensors claim one name) and nesting deeper than the schema allows.
json parse_header(const char* begin, const char* end, const std::string& file) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        INFERX_CHECK(static_cast<size_t>(depth) < kMaxJsonDepth,
                     "{}: header JSON is nested deeper than {} levels", file, kMaxJsonDepth);
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string()) {
          const auto& k = parsed.get_ref<const std::string&>();
          INFERX_CHECK(keys.back().insert(k).second, "{}: duplicate key '{}' in header", file, k);
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
}

// Reads a non-negative JSON integer (signed or unsigned storage) as uint64.
bool as_u64(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

std::string type_of(const json& v) {
  if (v.is_number_float()) return "float";
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0) return "negative integer";
  return v.type_name();
}

struct Range {
  uint64_t begin, end;
  size_t tensor;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path), name_(path) {
  parse(file_.data(), file_.size());
}

SafetensorsFile::SafetensorsFile(const uint8_t* bytes, size_t size, std::string name)
    : name_(std::move(name)) {
  parse(bytes, size);
}

void SafetensorsFile::parse(const uint8_t* data, size_t size) {
  const std::string& f = name_;
  INFERX_CHECK(size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length", f, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian regardless of host
  INFERX_CHECK(n <= kMaxHeaderBytes, "{}: header length {} exceeds the {} byte limit", f, n, kMaxHeaderBytes);
  INFERX_CHECK(n <= size - 8, "{}: header length {} runs past the end of the {}-byte file", f, n, size);
  INFERX_CHECK(n >= 2, "{}: header length {} is too short for a JSON object", f, n);
  const char* hbegin = reinterpret_cast<const char*>(data + 8);
  json header = parse_header(hbegin, hbegin + n, f);
  INFERX_CHECK(header.is_object(), "{}: header must be a JSON object, got {}", f, header.type_name());

  const uint8_t* buffer = data + 8 + n;
  const uint64_t buffer_size = size - 8 - n;
  std::vector<Range> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      INFERX_CHECK(info.is_object(), "{}: __metadata__ must be an object of strings, got {}", f,
                   info.type_name());
      for (const auto& [k, v] : info.items()) {
        INFERX_CHECK(v.is_string(), "{}: __metadata__ value '{}' must be a string, got {}", f, k,
                     v.type_name());
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    INFERX_CHECK(info.is_object(), "{}: tensor '{}': entry must be an object, got {}", f, name,
                 info.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      INFERX_CHECK(info.contains(field), "{}: tensor '{}': missing field '{}'", f, name, field);

    const json& jd = info["dtype"];
    INFERX_CHECK(jd.is_string(), "{}: tensor '{}': field 'dtype' must be a string, got {}", f, name,
                 jd.type_name());
    const auto& dname = jd.get_ref<const std::string&>();
    std::optional<DType> dtype = parse_dtype(dname);
    if (!dtype) {
      bool known = std::any_of(std::begin(kUnsupportedDtypes), std::end(kUnsupportedDtypes),
                               [&](const char* d) { return dname == d; });
      fail("{}: tensor '{}': {} dtype '{}' (supported: F32, F16, BF16, I32, I8)", f, name,
           known ? "unsupported" : "unknown", dname);
    }

    const json& js = info["shape"];
    INFERX_CHECK(js.is_array(), "{}: tensor '{}': field 'shape' must be an array, got {}", f, name,
                 js.type_name());
    INFERX_CHECK(js.size() <= kMaxRank, "{}: tensor '{}': rank {} exceeds the maximum {}", f, name, js.size(),
                 kMaxRank);
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const json& d : js) {
      uint64_t dim = 0;
      INFERX_CHECK(as_u64(d, dim), "{}: tensor '{}': shape entries must be non-negative integers, got {}", f,
                   name, type_of(d));
      // A dimension cannot exceed the buffer's byte count unless another one is 0, and the data size
      // check below catches that; the bound here only keeps the int64 conversion exact.
      INFERX_CHECK(dim <= (uint64_t{1} << 62), "{}: tensor '{}': shape dimension {} is absurdly large", f,
                   name, dim);
      INFERX_CHECK(!__builtin_mul_overflow(numel, dim, &numel),
                   "{}: tensor '{}': element count of shape {} overflows", f, name, js.dump());
      shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    const auto elem = static_cast<uint64_t>(dtype_info(*dtype).block_bytes);
    INFERX_CHECK(!__builtin_mul_overflow(numel, elem, &nbytes),
                 "{}: tensor '{}': byte size of shape {} overflows", f, name, js.dump());

    const json& jo = info["data_offsets"];
    INFERX_CHECK(jo.is_array() && jo.size() == 2,
                 "{}: tensor '{}': field 'data_offsets' must be an array [begin, end]", f, name);
    uint64_t begin = 0, end = 0;
    INFERX_CHECK(as_u64(jo[0], begin) && as_u64(jo[1], end),
                 "{}: tensor '{}': data_offsets must be non-negative integers", f, name);
    INFERX_CHECK(begin <= end, "{}: tensor '{}': data_offsets begin {} is after end {}", f, name, begin, end);
    INFERX_CHECK(end <= buffer_size, "{}: tensor '{}': data_offsets end {} is past the {}-byte buffer", f,
                 name, end, buffer_size);
    INFERX_CHECK(end - begin == nbytes,
                 "{}: tensor '{}': data_offsets span {} bytes but {} x {} needs {} bytes", f, name,
                 end - begin, dname, js.dump(), nbytes);

    ranges.push_back({begin, end, tensors_.size()});
    TensorEntry e;
    e.name = name;
    e.dtype = *dtype;
    e.shape = std::move(shape);
    e.data = buffer + begin;
    e.nbytes = nbytes;
    e.file = name_;
    index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(e));
  }

  // Tensors must not share bytes (the Rust library goes further and requires them to tile the buffer
  // exactly; gaps are harmless to us, so they are allowed). Empty tensors overlap nothing.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev != nullptr)
      INFERX_CHECK(r.begin >= prev->end, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", f,
                   tensors_[prev->tensor].name, prev->begin, prev->end, tensors_[r.tensor].name, r.begin,
                   r.end);
    prev = &r;
  }
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> SafetensorsFile::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const TensorEntry& t : tensors_) names.push_back(t.name);
  return names;
}

// --- SafetensorsModel --------------------------------------------------------------------------------

namespace {

std::string join_path(const std::string& folder, const std::string& file) {
  return (std::filesystem::path(folder) / file).string();
}

}  // namespace

SafetensorsModel::SafetensorsModel(const std::string& folder) : folder_(folder) {
  namespace fs = std::filesystem;
  const std::string index_path = join_path(folder, "model.safetensors.index.json");
  const std::string single_path = join_path(folder, "model.safetensors");
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    INFERX_CHECK(fs::exists(single_path, ec), "{}: no model.safetensors or model.safetensors.index.json",
                 folder);
    shards_.push_back(std::make_unique<SafetensorsFile>(single_path));
    for (const TensorEntry& t : shards_[0]->tensors()) index_.emplace(t.name, &t);
    return;
  }

  // The index (written by transformers' save_pretrained): {"metadata": {...}, "weight_map":
  // {tensor name: shard file name}}. The shard names come from the file, so they are confined to
  // the folder.
  json index;
  {
    MappedFile f(index_path);
    const char* p = reinterpret_cast<const char*>(f.data());
    try {
      index = json::parse(p, p + f.size());
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", index_path, e.what());
    }
  }
  INFERX_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               "{}: missing object 'weight_map'", index_path);
  std::map<std::string, size_t> shard_of_file;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    INFERX_CHECK(shard.is_string(), "{}: weight_map['{}'] must be a file name string, got {}", index_path,
                 tensor, shard.type_name());
    const auto& file = shard.get_ref<const std::string&>();
    INFERX_CHECK(
        !file.empty() && file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
            file.find("..") == std::string::npos && file.find('\0') == std::string::npos,
        "{}: weight_map['{}'] = '{}' is not a plain file name in the folder", index_path, tensor, file);
    auto [it, inserted] = shard_of_file.emplace(file, shards_.size());
    if (inserted) shards_.push_back(std::make_unique<SafetensorsFile>(join_path(folder, file)));
    const TensorEntry* entry = shards_[it->second]->find(tensor);
    INFERX_CHECK(entry != nullptr, "{}: tensor '{}' is listed in {} but missing from shard {}", folder,
                 tensor, index_path, shards_[it->second]->describe());
    index_.emplace(tensor, entry);
  }
}

const TensorEntry* SafetensorsModel::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsModel::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, entry] : index_) names.push_back(name);
  return names;
}

std::string SafetensorsModel::describe() const {
  return fmt::format("{} ({} shard{})", folder_, shards_.size(), shards_.size() == 1 ? "" : "s");
}

}  // namespace inferx
