// safetensors reader/writer: round trips, sharded sets, a file written by the reference Python library
// (tools/make_safetensors_fixture.py), and one malformed-input test per check the reader makes.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "core/half.h"

namespace inferx {
namespace {

namespace fs = std::filesystem;

// A fresh, empty temporary folder removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("inferx_st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Raw file bytes: 8-byte little-endian length, the header text as given, then `data`.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <class T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
std::vector<T> values(const TensorEntry& e) {
  std::vector<T> v(e.nbytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.data, e.nbytes);
  return v;
}

// Parses `bytes` as "bad.safetensors" and returns the error message ("" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    // A copy of exactly the right size so AddressSanitizer builds catch any read past the end.
    std::vector<uint8_t> exact(bytes);
    SafetensorsFile f(exact.data(), exact.size(), "bad.safetensors");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

std::string header_error(const std::string& header, const std::vector<uint8_t>& data = {}) {
  return parse_error(raw_file(header, data));
}

// The message names the file first, then contains `needle`.
::testing::AssertionResult is_error(const std::string& message, const std::string& needle) {
  if (message.rfind("bad.safetensors: ", 0) == 0 && message.find(needle) != std::string::npos)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "error \"" << message << "\" does not start with the file name "
                                       << "and contain \"" << needle << "\"";
}

// --- writer + reader round trip -------------------------------------------------------------------

struct Sample {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Sample> samples() {
  std::vector<float> f32(24);
  std::iota(f32.begin(), f32.end(), -3.0f);
  std::vector<uint16_t> f16, bf16;
  for (int i = 0; i < 6; ++i) f16.push_back(f32_to_f16(0.25f * static_cast<float>(i) - 1.0f));
  for (int i = 0; i < 4; ++i) bf16.push_back(f32_to_bf16(static_cast<float>(i * i) - 2.5f));
  std::vector<int32_t> i32 = {7, -1, 1 << 30, -(1 << 30), 0};
  std::vector<int8_t> i8 = {-128, -1, 0, 1, 127, 42, 3};
  std::vector<float> scalar = {3.5f};
  std::vector<uint8_t> first12 = as_bytes(f32);
  first12.resize(48);
  return {
      {"model.layers.0.w", DType::F32, {2, 3, 4}, as_bytes(f32)},
      {"b.f16", DType::F16, {2, 3}, as_bytes(f16)},
      {"c.bf16", DType::BF16, {4}, as_bytes(bf16)},
      {"d.i32", DType::I32, {5}, as_bytes(i32)},
      {"e.i8", DType::I8, {7}, as_bytes(i8)},
      {"f.scalar", DType::F32, {}, as_bytes(scalar)},
      {"g.empty", DType::F32, {0, 3}, {}},
      {"h.4d", DType::F32, {1, 2, 3, 2}, first12},
      {"Upper.first", DType::I8, {1}, {9}},
  };
}

SafetensorsWriter writer_of(const std::vector<Sample>& ss) {
  SafetensorsWriter w;
  for (const Sample& s : ss)
    w.add_tensor(s.name, s.dtype, s.shape, s.bytes.empty() ? nullptr : s.bytes.data(), s.bytes.size());
  return w;
}

void expect_same(const TensorSource& src, const std::vector<Sample>& ss) {
  for (const Sample& s : ss) {
    const TensorEntry* e = src.find(s.name);
    ASSERT_NE(e, nullptr) << s.name;
    EXPECT_EQ(e->name, s.name);
    EXPECT_EQ(e->dtype, s.dtype) << s.name;
    EXPECT_EQ(e->shape, s.shape) << s.name;
    ASSERT_EQ(e->nbytes, s.bytes.size()) << s.name;
    EXPECT_TRUE(s.bytes.empty() || std::memcmp(e->data, s.bytes.data(), s.bytes.size()) == 0) << s.name;
  }
  EXPECT_EQ(src.tensor_names().size(), ss.size());
  EXPECT_EQ(src.find("not.there"), nullptr);
}

TEST(SafetensorsTest, RoundTripInMemory) {
  auto ss = samples();
  SafetensorsWriter w = writer_of(ss);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "round trip");
  std::vector<uint8_t> bytes = w.to_bytes();
  SafetensorsFile f(bytes.data(), bytes.size(), "mem");
  expect_same(f, ss);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "round trip");
  EXPECT_EQ(f.find("h.4d")->view().ndim, 4);
  EXPECT_EQ(f.find("f.scalar")->view().ndim, 0);
}

TEST(SafetensorsTest, WriterLayoutMatchesReferenceLibrary) {
  std::vector<uint8_t> bytes = writer_of(samples()).to_bytes();
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  std::string header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1) << "padding must be spaces";
  // Keys appear in sorted order in the text.
  auto top = nlohmann::json::parse(header);
  size_t last = 0;
  for (const auto& [k, v] : top.items()) {
    size_t pos = header.find("\"" + k + "\":");
    ASSERT_NE(pos, std::string::npos);
    EXPECT_GE(pos, last) << k;
    last = pos;
  }
  // Every tensor aligned to its element size; tensors tile the buffer with no gaps (the Rust reader
  // rejects gaps), larger elements first.
  SafetensorsFile f(bytes.data(), bytes.size(), "mem");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const uint8_t* base = bytes.data() + 8 + n;
  for (const TensorEntry& e : f.tensors()) {
    auto off = static_cast<uint64_t>(e.data - base);
    EXPECT_EQ(off % dtype_info(e.dtype).block_bytes, 0u) << e.name;
    ranges.push_back({off, off + e.nbytes});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(end, bytes.size() - 8 - n);
}

TEST(SafetensorsTest, RoundTripThroughFile) {
  TempDir dir;
  auto ss = samples();
  const std::string path = (dir.path / "t.safetensors").string();
  writer_of(ss).write(path);
  SafetensorsFile f(path);
  expect_same(f, ss);
  EXPECT_EQ(f.describe(), path);
  EXPECT_EQ(f.find("d.i32")->file, path);
}

TEST(SafetensorsTest, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  float x[4] = {};
  EXPECT_THROW(w.add_tensor("a", DType::F32, {3}, x, 16), Error);  // 3 floats are 12 bytes
  EXPECT_THROW(w.add_tensor("a", DType::F32, {-1}, x, 16), Error);
  EXPECT_THROW(w.add_tensor("a", DType::Q8_0, {32}, x, 34), Error);
  EXPECT_THROW(w.add_tensor("__metadata__", DType::F32, {4}, x, 16), Error);
  w.add_tensor("a", DType::F32, {4}, x, 16);
  EXPECT_THROW(w.add_tensor("a", DType::F32, {4}, x, 16), Error);
  try {
    w.write("/nonexistent-dir/x.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.safetensors"), std::string::npos);
  }
}

// --- a file written by the reference Python library -----------------------------------------------

TEST(SafetensorsTest, ReadsPythonWrittenFile) {
  const std::string path =
      std::string(INFERX_SOURCE_DIR) + "/tests/unit/formats/fixtures/py_written.safetensors";
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("source"), "make_safetensors_fixture.py");
  EXPECT_EQ(f.tensors().size(), 5u);

  const TensorEntry* a = f.find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  auto av = values<float>(*a);
  ASSERT_EQ(av.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(av[i], 0.5f * static_cast<float>(i));

  const TensorEntry* b = f.find("b.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::F16);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{4}));
  auto bv = values<uint16_t>(*b);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f16_to_f32(bv[i]), static_cast<float>(i) - 1.5f);

  const TensorEntry* c = f.find("c.i32");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(values<int32_t>(*c), (std::vector<int32_t>{0, -7, -14}));

  const TensorEntry* d = f.find("d.i8");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(values<int8_t>(*d), (std::vector<int8_t>{-2, -1, 0, 1, 2}));

  const TensorEntry* e = f.find("e.bf16");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::BF16);
  auto ev = values<uint16_t>(*e);
  std::vector<float> expect = {1.0f, -2.0f, 0.5f, 3.0f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_f32(ev[i]), expect[i]);

  // Our writer lays the same tensors out exactly where the reference library put them.
  SafetensorsWriter w;
  for (const TensorEntry& t : f.tensors()) w.add_tensor(t.name, t.dtype, t.shape, t.data, t.nbytes);
  std::vector<uint8_t> ours = w.to_bytes();
  SafetensorsFile g(ours.data(), ours.size(), "ours");
  uint64_t n_ref = 0, n_ours = 0;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> ref((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::memcpy(&n_ref, ref.data(), 8);
  std::memcpy(&n_ours, ours.data(), 8);
  EXPECT_EQ(std::vector<uint8_t>(ref.begin() + 8 + static_cast<int64_t>(n_ref), ref.end()),
            std::vector<uint8_t>(ours.begin() + 8 + static_cast<int64_t>(n_ours), ours.end()));
}

// --- sharded sets ---------------------------------------------------------------------------------

TEST(SafetensorsTest, ShardedWriteThenModelRead) {
  TempDir dir;
  auto ss = samples();
  SafetensorsWriter w = writer_of(ss);
  w.set_metadata("format", "pt");
  write_sharded_safetensors(dir.path.string(), w, 40);  // forces several shards

  std::ifstream in(dir.path / "model.safetensors.index.json");
  auto index = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const Sample& s : ss) total += s.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), ss.size());
  std::set<std::string> files;
  for (const auto& [k, v] : index["weight_map"].items()) files.insert(v.get<std::string>());
  const size_t k = files.size();
  ASSERT_GT(k, 2u);
  for (size_t i = 1; i <= k; ++i) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i, k);
    EXPECT_TRUE(files.count(name)) << name;
    EXPECT_TRUE(fs::exists(dir.path / name)) << name;
    // Every shard except one holding a single oversized tensor stays within the limit.
    SafetensorsFile shard((dir.path / name).string());
    uint64_t bytes = 0;
    for (const TensorEntry& t : shard.tensors()) bytes += t.nbytes;
    EXPECT_TRUE(bytes <= 40 || shard.tensors().size() == 1) << name;
    EXPECT_EQ(shard.metadata().at("format"), "pt");
  }

  SafetensorsModel m(dir.path.string());
  expect_same(m, ss);
  EXPECT_EQ(m.describe(), fmt::format("{} ({} shards)", dir.path.string(), k));
}

TEST(SafetensorsTest, ModelSingleFile) {
  TempDir dir;
  auto ss = samples();
  writer_of(ss).write((dir.path / "model.safetensors").string());
  SafetensorsModel m(dir.path.string());
  expect_same(m, ss);
  EXPECT_EQ(m.describe(), dir.path.string() + " (1 shard)");
}

TEST(SafetensorsTest, ModelFolderWithoutWeights) {
  TempDir dir;
  try {
    SafetensorsModel m(dir.path.string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir.path.string() + ": no model.safetensors or model.safetensors.index.json");
  }
}

std::string model_error(const fs::path& dir, const std::string& index_json) {
  std::ofstream(dir / "model.safetensors.index.json") << index_json;
  try {
    SafetensorsModel m(dir.string());
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(SafetensorsTest, ModelIndexErrors) {
  TempDir dir;
  float x[2] = {1, 2};
  SafetensorsWriter w;
  w.add_tensor("a", DType::F32, {2}, x, 8);
  w.write((dir.path / "s1.safetensors").string());

  EXPECT_EQ(model_error(dir.path, R"({"weight_map": {"a": "s1.safetensors"}})"), "");
  std::string e = model_error(dir.path, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("s1.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;

  for (const char* evil : {"../s1.safetensors", "sub/s1.safetensors", "..", "", "/etc/passwd"}) {
    e = model_error(dir.path, fmt::format(R"({{"weight_map": {{"a": "{}"}}}})", evil));
    EXPECT_NE(e.find("not a plain file name"), std::string::npos) << evil << ": " << e;
  }
  e = model_error(dir.path, R"({"weight_map": {"a": "missing.safetensors"}})");
  EXPECT_NE(e.find("missing.safetensors"), std::string::npos) << e;
  e = model_error(dir.path, R"({"weight_map": {"a": 3}})");
  EXPECT_NE(e.find("weight_map['a']"), std::string::npos) << e;
  EXPECT_NE(model_error(dir.path, R"({"metadata": {}})").find("weight_map"), std::string::npos);
  EXPECT_NE(model_error(dir.path, "{not json").find("not valid JSON"), std::string::npos);
}

// --- malformed files: one test per check ------------------------------------------------------------

constexpr const char* kGood = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsMalformedTest, ValidBaselineParses) {
  EXPECT_EQ(header_error(kGood, std::vector<uint8_t>(8)), "");
}

TEST(SafetensorsMalformedTest, ShorterThanLengthField) {
  EXPECT_TRUE(is_error(parse_error({1, 0, 0}), "shorter than the 8-byte header length"));
  EXPECT_TRUE(is_error(parse_error({}), "shorter"));
}

TEST(SafetensorsMalformedTest, HeaderLengthPastEnd) {
  auto bytes = raw_file(kGood, std::vector<uint8_t>(8));
  bytes[0] = 200;
  EXPECT_TRUE(is_error(parse_error(bytes), "runs past the end"));
}

TEST(SafetensorsMalformedTest, HeaderLengthAbsurd) {
  auto bytes = raw_file(kGood, std::vector<uint8_t>(8));
  bytes[7] = 0x80;  // ~9.2e18
  EXPECT_TRUE(is_error(parse_error(bytes), "exceeds the 100000000 byte limit"));
  bytes[7] = 0;
  bytes[3] = 0x10;  // 268 MB
  EXPECT_TRUE(is_error(parse_error(bytes), "exceeds"));
}

TEST(SafetensorsMalformedTest, NotJson) {
  EXPECT_TRUE(is_error(header_error(R"({"t": )"), "not valid JSON"));
  EXPECT_TRUE(is_error(header_error("{\"\xff\xfe\":1}"), "not valid JSON"));  // bad UTF-8
  EXPECT_TRUE(is_error(header_error(R"({"a": 1e999})"), "not valid JSON"));   // overflow
}

TEST(SafetensorsMalformedTest, NotAnObject) {
  EXPECT_TRUE(is_error(header_error("[1, 2, 3]"), "must be a JSON object, got array"));
  EXPECT_TRUE(is_error(header_error(R"({"t": 5})"), "tensor 't': entry must be an object"));
}

TEST(SafetensorsMalformedTest, MissingFields) {
  EXPECT_TRUE(is_error(header_error(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
                       "tensor 't': missing field 'dtype'"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
                       "tensor 't': missing field 'shape'"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":[2]}})", std::vector<uint8_t>(8)),
                       "tensor 't': missing field 'data_offsets'"));
}

TEST(SafetensorsMalformedTest, IllTypedFields) {
  std::vector<uint8_t> d(8);
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", d),
                       "field 'dtype' must be a string"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", d),
                       "field 'shape' must be an array"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", d),
                       "shape entries must be non-negative integers, got string"));
  EXPECT_TRUE(
      is_error(header_error(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d), "got float"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", d),
                       "'data_offsets' must be an array [begin, end]"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d),
                       "data_offsets must be non-negative integers"));
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":"0,8"}})", d),
                       "'data_offsets' must be an array"));
  EXPECT_TRUE(is_error(
      header_error(R"({"__metadata__":{"k":1},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d),
      "__metadata__ value 'k' must be a string"));
  EXPECT_TRUE(is_error(header_error(R"({"__metadata__":[]})"), "__metadata__ must be an object"));
}

TEST(SafetensorsMalformedTest, UnknownDtype) {
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
      "tensor 't': unknown dtype 'Q9'"));
  // Lower case is not the spec's spelling.
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
      "unknown dtype 'f32'"));
}

TEST(SafetensorsMalformedTest, UnsupportedDtype) {
  for (const char* d : {"F64", "I64", "U16", "BOOL", "F8_E5M2"}) {
    std::string h = fmt::format(R"({{"t":{{"dtype":"{}","shape":[1],"data_offsets":[0,8]}}}})", d);
    EXPECT_TRUE(is_error(header_error(h, std::vector<uint8_t>(8)), fmt::format("unsupported dtype '{}'", d)));
  }
}

TEST(SafetensorsMalformedTest, NegativeDimension) {
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
      "got negative integer"));
}

TEST(SafetensorsMalformedTest, HugeDimension) {
  EXPECT_TRUE(
      is_error(header_error(R"({"t":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})"),
               "absurdly large"));
  EXPECT_TRUE(
      is_error(header_error(R"({"t":{"dtype":"F32","shape":[184467440737095516150],"data_offsets":[0,8]}})"),
               "got float"));  // beyond uint64: nlohmann stores a double
}

TEST(SafetensorsMalformedTest, ShapeProductOverflow) {
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}})"),
      "element count of shape [4294967296,4294967296,2] overflows"));
  // Element count fits, byte count does not.
  EXPECT_TRUE(
      is_error(header_error(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})"),
               "byte size of shape"));
}

TEST(SafetensorsMalformedTest, SizeMismatch) {
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::vector<uint8_t>(8)),
      "tensor 't': data_offsets span 8 bytes but F32 x [3] needs 12 bytes"));
  // A zero dimension makes the tensor empty whatever the others say.
  EXPECT_TRUE(is_error(header_error(R"({"t":{"dtype":"F32","shape":[0,4294967296],"data_offsets":[0,8]}})",
                                    std::vector<uint8_t>(8)),
                       "needs 0 bytes"));
}

TEST(SafetensorsMalformedTest, BeginAfterEnd) {
  EXPECT_TRUE(is_error(
      header_error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::vector<uint8_t>(8)),
      "begin 8 is after end 0"));
}

TEST(SafetensorsMalformedTest, EndPastBuffer) {
  EXPECT_TRUE(is_error(header_error(kGood, std::vector<uint8_t>(7)),
                       "tensor 't': data_offsets end 8 is past the 7-byte buffer"));
  EXPECT_TRUE(is_error(
      header_error(
          R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})"),
      "past the"));
}

TEST(SafetensorsMalformedTest, OverlappingTensors) {
  std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"I8","shape":[4],"data_offsets":[6,10]}})";
  EXPECT_TRUE(
      is_error(header_error(h, std::vector<uint8_t>(16)), "tensors 'a' [0, 8) and 'b' [6, 10) overlap"));
  // Identical ranges overlap too; empty tensors never do.
  h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_TRUE(is_error(header_error(h, std::vector<uint8_t>(8)), "overlap"));
  h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[0],"data_offsets":[4,4]}})";
  EXPECT_EQ(header_error(h, std::vector<uint8_t>(8)), "");
}

TEST(SafetensorsMalformedTest, DuplicateNames) {
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_TRUE(is_error(header_error(h, std::vector<uint8_t>(8)), "duplicate key 'a'"));
  h = R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_TRUE(is_error(header_error(h, std::vector<uint8_t>(4)), "duplicate key 'dtype'"));
  // The same key in different objects is fine.
  h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_EQ(header_error(h, std::vector<uint8_t>(8)), "");
}

TEST(SafetensorsMalformedTest, Rank) {
  // Rank 5 is valid safetensors and reads, but cannot become a Tensor view.
  std::string h = R"({"t":{"dtype":"I8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})";
  auto bytes = raw_file(h, {1, 2});
  SafetensorsFile f(bytes.data(), bytes.size(), "r5.safetensors");
  EXPECT_EQ(f.find("t")->shape.size(), 5u);
  EXPECT_THROW(f.find("t")->view(), Error);
  EXPECT_TRUE(
      is_error(header_error(R"({"t":{"dtype":"I8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", {0}),
               "rank 9 exceeds the maximum 8"));
}

TEST(SafetensorsMalformedTest, DeepNesting) {
  std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_TRUE(is_error(header_error(deep), "nested deeper"));
}

// Every prefix of a valid file is invalid (the last tensor ends at the end of the file) and must be
// reported, not crash; so must every single-byte corruption of the header (which may stay valid).
TEST(SafetensorsMalformedTest, TruncatedAtEveryByte) {
  std::vector<uint8_t> good = writer_of(samples()).to_bytes();
  ASSERT_EQ(parse_error(good), "");
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<int64_t>(n));
    EXPECT_NE(parse_error(cut), "") << "prefix of " << n << " bytes parsed";
  }
}

TEST(SafetensorsMalformedTest, CorruptedHeaderBytesNeverCrash) {
  std::vector<uint8_t> good = writer_of(samples()).to_bytes();
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  for (size_t i = 0; i < 8 + n; ++i) {
    for (uint8_t v : {uint8_t{0}, uint8_t{'9'}, uint8_t{'"'}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = good;
      bad[i] = v;
      parse_error(bad);  // either parses or throws inferx::Error
    }
  }
}

}  // namespace
}  // namespace inferx
