// GgufWriter round trips through GgufFile, plus byte-level checks of the layout against the spec, and the
// GgufValue/GgufArray accessors and the GGML type-id table.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "formats/gguf.h"

namespace inferx {
namespace {

GgufValue u(GgufType t, uint64_t v) { return GgufValue::of_uint(t, v); }
GgufValue i(GgufType t, int64_t v) { return GgufValue::of_int(t, v); }

GgufArray array_of(GgufType t, std::vector<GgufValue> items) { return GgufArray{t, std::move(items)}; }

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = static_cast<uint8_t>(seed + k * 7);
  return v;
}

GgufWriter every_value_type() {
  GgufWriter w;
  w.set("u8", u(GgufType::UINT8, 255));
  w.set("i8", i(GgufType::INT8, -128));
  w.set("u16", u(GgufType::UINT16, 65535));
  w.set("i16", i(GgufType::INT16, -32768));
  w.set("u32", u(GgufType::UINT32, 4000000000u));
  w.set("i32", i(GgufType::INT32, -2000000000));
  w.set("f32", GgufValue::of_float(GgufType::FLOAT32, 0.1));
  w.set("bool", GgufValue::of_bool(true));
  w.set("str", GgufValue::of_string("héllo\nworld"));
  w.set("empty_str", GgufValue::of_string(""));
  w.set("u64", u(GgufType::UINT64, std::numeric_limits<uint64_t>::max()));
  w.set("i64", i(GgufType::INT64, std::numeric_limits<int64_t>::min()));
  w.set("f64", GgufValue::of_float(GgufType::FLOAT64, 0.1));
  w.set("strs",
        GgufValue::of_array(array_of(GgufType::STRING, {GgufValue::of_string("a"), GgufValue::of_string(""),
                                                        GgufValue::of_string("ccc")})));
  w.set("floats",
        GgufValue::of_array(array_of(GgufType::FLOAT32, {GgufValue::of_float(GgufType::FLOAT32, -1.5),
                                                         GgufValue::of_float(GgufType::FLOAT32, 2.25)})));
  w.set("ints",
        GgufValue::of_array(array_of(GgufType::INT32, {i(GgufType::INT32, -3), i(GgufType::INT32, 7)})));
  w.set("empty", GgufValue::of_array(array_of(GgufType::UINT8, {})));
  GgufArray inner1 = array_of(GgufType::UINT16, {u(GgufType::UINT16, 1), u(GgufType::UINT16, 2)});
  GgufArray inner2 = array_of(GgufType::UINT16, {u(GgufType::UINT16, 3)});
  w.set("nested", GgufValue::of_array(
                      array_of(GgufType::ARRAY, {GgufValue::of_array(inner1), GgufValue::of_array(inner2)})));
  return w;
}

TEST(GgufWriter, EveryValueTypeRoundTrips) {
  GgufWriter w = every_value_type();
  std::vector<uint8_t> bytes = w.to_bytes();
  GgufFile g(bytes.data(), bytes.size(), "rt.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 18u);
  EXPECT_EQ(g.find_metadata("u8")->type, GgufType::UINT8);
  EXPECT_EQ(g.get_int("u8"), 255);
  EXPECT_EQ(g.get_int("i8"), -128);
  EXPECT_EQ(g.get_int("u16"), 65535);
  EXPECT_EQ(g.get_int("i16"), -32768);
  EXPECT_EQ(g.find_metadata("u32")->as_uint(), 4000000000u);
  EXPECT_EQ(g.get_int("i32"), -2000000000);
  EXPECT_EQ(g.find_metadata("f32")->type, GgufType::FLOAT32);
  EXPECT_EQ(g.get_float("f32"), static_cast<double>(0.1f));
  EXPECT_TRUE(g.get_bool("bool", false));
  EXPECT_EQ(g.get_string("str"), "héllo\nworld");
  EXPECT_EQ(g.get_string("empty_str"), "");
  EXPECT_EQ(g.find_metadata("u64")->as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_THROW(g.find_metadata("u64")->as_int(), Error);
  EXPECT_EQ(g.get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(g.get_float("f64"), 0.1);
  EXPECT_EQ(g.find_metadata("strs")->as_array().strings(), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(g.find_metadata("floats")->as_array().floats(), (std::vector<float>{-1.5f, 2.25f}));
  EXPECT_EQ(g.find_metadata("ints")->as_array().ints(), (std::vector<int64_t>{-3, 7}));
  EXPECT_TRUE(g.find_metadata("empty")->as_array().items.empty());
  EXPECT_EQ(g.find_metadata("empty")->as_array().element_type, GgufType::UINT8);
  const GgufArray& nested = g.find_metadata("nested")->as_array();
  ASSERT_EQ(nested.element_type, GgufType::ARRAY);
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0].as_array().ints(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested.items[1].as_array().ints(), (std::vector<int64_t>{3}));
  EXPECT_EQ(nested.items[1].as_array().element_type, GgufType::UINT16);
}

// Cutting a file with every value type anywhere before the end of its last tensor's data must throw.
TEST(GgufWriter, EveryTruncationOfAWrittenFileThrows) {
  GgufWriter w = every_value_type();
  std::vector<uint8_t> f = pattern(34 * 2, 5);
  w.add_tensor("q", DType::Q8_0, {2, 32}, f.data(), f.size());
  std::vector<uint8_t> bytes = w.to_bytes();
  size_t end = 0;
  {
    GgufFile g(bytes.data(), bytes.size(), "full.gguf");
    end = static_cast<size_t>(g.find("q")->data - bytes.data()) + g.find("q")->nbytes;
  }
  for (size_t cut = 0; cut < end; ++cut) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(GgufFile(part.data(), part.size(), "cut.gguf"), Error) << "cut at " << cut;
  }
  // The writer's trailing padding is not needed to read the file.
  EXPECT_NO_THROW(GgufFile(bytes.data(), end, "exact.gguf"));
}

TEST(GgufWriter, LayoutMatchesSpec) {
  GgufWriter w;
  w.set("k", u(GgufType::UINT32, 7));
  w.set("a", GgufValue::of_string("xy"));
  std::vector<uint8_t> f = pattern(12, 1);
  w.add_tensor("t", DType::F32, {3}, f.data(), f.size());
  std::vector<uint8_t> b = w.to_bytes();
  // Expected bytes written out by hand from docs/gguf.md.
  std::vector<uint8_t> expect = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 0, 0, 0,
                                 0,   0,   0,   0,   2, 0, 0, 0, 0, 0, 0, 0};
  auto put64 = [&](uint64_t v) {
    for (int k = 0; k < 8; ++k) expect.push_back(static_cast<uint8_t>(v >> (8 * k)));
  };
  auto put32 = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) expect.push_back(static_cast<uint8_t>(v >> (8 * k)));
  };
  put64(1), expect.push_back('k'), put32(4), put32(7);
  put64(1), expect.push_back('a'), put32(8), put64(2), expect.push_back('x'), expect.push_back('y');
  put64(1), expect.push_back('t'), put32(1), put64(3), put32(0), put64(0);
  expect.resize((expect.size() + 31) / 32 * 32, 0);
  expect.insert(expect.end(), f.begin(), f.end());
  expect.resize((expect.size() + 31) / 32 * 32, 0);
  EXPECT_EQ(b, expect);
}

TEST(GgufWriter, TensorsOfSeveralDtypesRoundTrip) {
  struct Case {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
  };
  std::vector<Case> cases = {
      {"f32", DType::F32, {3, 5}, 60},
      {"f16", DType::F16, {7}, 14},
      {"bf16", DType::BF16, {2, 3, 4}, 48},
      {"q8_0", DType::Q8_0, {2, 64}, 2 * 2 * 34},
      {"q4_0", DType::Q4_0, {1, 1, 1, 32}, 18},
      {"q4_k", DType::Q4_K, {3, 256}, 3 * 144},
      {"q6_k", DType::Q6_K, {512}, 2 * 210},
      {"i32", DType::I32, {5}, 20},
      {"i8", DType::I8, {9, 1}, 9},
  };
  GgufWriter w;
  w.set("general.architecture", GgufValue::of_string("llama"));
  std::vector<std::vector<uint8_t>> data;
  for (size_t k = 0; k < cases.size(); ++k) {
    data.push_back(pattern(cases[k].nbytes, static_cast<uint8_t>(k)));
    w.add_tensor(cases[k].name, cases[k].dtype, cases[k].shape, data.back().data(), cases[k].nbytes);
  }
  for (uint32_t align : {32u, 1u, 64u}) {
    SCOPED_TRACE(align);
    w.set_alignment(align);
    std::vector<uint8_t> bytes = w.to_bytes();
    GgufFile g(bytes.data(), bytes.size(), "dtypes.gguf");
    EXPECT_EQ(g.alignment(), align);
    ASSERT_EQ(g.tensors().size(), cases.size());
    for (size_t k = 0; k < cases.size(); ++k) {
      const TensorEntry& t = g.tensors()[k];
      EXPECT_EQ(t.name, cases[k].name);
      EXPECT_EQ(t.dtype, cases[k].dtype);
      EXPECT_EQ(t.shape, cases[k].shape);
      ASSERT_EQ(t.nbytes, cases[k].nbytes);
      EXPECT_EQ(std::memcmp(t.data, data[k].data(), t.nbytes), 0) << t.name;
      EXPECT_EQ((t.data - g.tensors()[0].data) % align, 0);
    }
  }
}

TEST(GgufWriter, WritesFileAndReportsIoErrors) {
  auto path =
      std::filesystem::temp_directory_path() / ("inferx_gguf_writer_" + std::to_string(::getpid()) + ".gguf");
  GgufWriter w = every_value_type();
  std::vector<uint8_t> f = pattern(64 * 4, 3);
  w.add_tensor("w", DType::F32, {4, 16}, f.data(), f.size());
  w.write(path.string());
  {
    GgufFile g(path.string());
    EXPECT_EQ(g.find("w")->shape, (std::vector<int64_t>{4, 16}));
    EXPECT_EQ(std::memcmp(g.find("w")->data, f.data(), f.size()), 0);
    EXPECT_EQ(std::filesystem::file_size(path), w.to_bytes().size());
  }
  std::filesystem::remove(path);
  try {
    w.write("/nonexistent/dir/out.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/out.gguf"), std::string::npos);
  }
}

TEST(GgufWriter, KeysKeepInsertionOrderAndSetReplaces) {
  GgufWriter w;
  w.set("zeta", u(GgufType::UINT8, 1));
  w.set("alpha", u(GgufType::UINT8, 2));
  w.set("zeta", u(GgufType::UINT8, 3));
  std::vector<uint8_t> b = w.to_bytes();
  std::string s(b.begin(), b.end());
  EXPECT_LT(s.find("zeta"), s.find("alpha"));
  GgufFile g(b.data(), b.size(), "order.gguf");
  EXPECT_EQ(g.get_int("zeta"), 3);
  EXPECT_EQ(g.metadata().size(), 2u);
}

TEST(GgufWriter, RejectsBadTensors) {
  GgufWriter w;
  std::vector<uint8_t> d(1024);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, d.data(), 15), Error);
  EXPECT_THROW(w.add_tensor("x", DType::Q8_0, {16}, d.data(), 17), Error);  // half a block
  EXPECT_THROW(w.add_tensor("x", DType::F32, {}, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {1, 1, 1, 1, 1}, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {0}, d.data(), 0), Error);
  w.add_tensor("x", DType::F32, {4}, d.data(), 16);
  EXPECT_THROW(w.add_tensor("x", DType::F32, {4}, d.data(), 16), Error);  // duplicate
  EXPECT_THROW(w.set_alignment(24), Error);
  EXPECT_THROW(w.set_alignment(0), Error);
}

TEST(GgufValue, Accessors) {
  EXPECT_THROW(GgufValue::of_uint(GgufType::UINT8, 256), Error);
  EXPECT_THROW(GgufValue::of_int(GgufType::INT8, 128), Error);
  EXPECT_THROW(GgufValue::of_int(GgufType::UINT32, 1), Error);
  EXPECT_THROW(GgufValue::of_float(GgufType::INT32, 1), Error);
  EXPECT_THROW(GgufValue::of_array(array_of(GgufType::INT32, {u(GgufType::UINT8, 1)})), Error);
  EXPECT_EQ(i(GgufType::INT16, 5).as_uint(), 5u);
  EXPECT_THROW(i(GgufType::INT16, -5).as_uint(), Error);
  EXPECT_EQ(u(GgufType::UINT8, 5).as_float(), 5.0);
  EXPECT_THROW(GgufValue::of_float(GgufType::FLOAT32, 1.5).as_int(), Error);
  EXPECT_THROW(GgufValue::of_bool(true).as_int(), Error);
  EXPECT_THROW(GgufValue::of_string("1").as_int(), Error);
  EXPECT_THROW(u(GgufType::UINT8, 1).as_string(), Error);
  EXPECT_THROW(u(GgufType::UINT8, 1).as_bool(), Error);
  EXPECT_THROW(u(GgufType::UINT8, 1).as_array(), Error);
  GgufArray strs = array_of(GgufType::STRING, {GgufValue::of_string("a")});
  EXPECT_THROW(strs.ints(), Error);
  EXPECT_THROW(strs.floats(), Error);
  GgufArray ints = array_of(GgufType::INT64, {i(GgufType::INT64, -2)});
  EXPECT_THROW(ints.strings(), Error);
  EXPECT_EQ(ints.floats(), (std::vector<float>{-2.0f}));
}

TEST(GgufDtype, GgmlIdsFromSpec) {
  // ggml.h enum ggml_type values.
  const std::vector<std::pair<uint32_t, DType>> known = {
      {0, DType::F32},   {1, DType::F16}, {2, DType::Q4_0}, {8, DType::Q8_0},  {12, DType::Q4_K},
      {14, DType::Q6_K}, {24, DType::I8}, {26, DType::I32}, {30, DType::BF16},
  };
  for (auto [id, dt] : known) {
    EXPECT_EQ(dtype_from_ggml(id), dt) << id;
    EXPECT_EQ(dtype_to_ggml(dt), id) << id;
  }
  for (uint32_t id : {3u, 6u, 7u, 10u, 11u, 13u, 15u, 28u, 39u, 1000u})
    EXPECT_FALSE(dtype_from_ggml(id)) << id;
}

}  // namespace
}  // namespace inferx
