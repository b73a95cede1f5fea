// GgufFile against real files (llama.cpp-written stories260K and vocab-only GGUFs, cross-checked with the
// llama2.c checkpoint of the same model) and against hand-built malformed files, one per problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "core/error.h"
#include "formats/gguf.h"

namespace inferx {
namespace {

const std::string kTestdata = INFERX_TESTDATA_DIR;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

TEST(GgufReader, Stories260K) {
  const std::string path = kTestdata + "/stories260K.gguf";
  GgufFile g(path);
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.path(), path);
  ASSERT_EQ(g.tensors().size(), 48u);
  for (const TensorEntry& t : g.tensors()) {
    EXPECT_EQ(t.dtype, DType::F32) << t.name;
    EXPECT_EQ(t.file, path);
  }
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(g.get_int("llama.block_count"), 5);
  EXPECT_EQ(g.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(g.get_int("llama.feed_forward_length"), 172);
  EXPECT_FLOAT_EQ(static_cast<float>(g.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(g.get_int("no.such.key", -7), -7);
  EXPECT_THROW(g.get_int("no.such.key"), Error);
  EXPECT_THROW(g.get_int("general.architecture"), Error);  // a string, not an integer

  const TensorEntry* emb = g.find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));  // ggml ne = [64, 512], reversed
  EXPECT_EQ(emb->nbytes, 512u * 64u * 4u);
  EXPECT_EQ(g.find("no.such.tensor"), nullptr);
  const TensorEntry* wq = g.find("blk.0.attn_q.weight");
  ASSERT_NE(wq, nullptr);
  EXPECT_EQ(wq->shape, (std::vector<int64_t>{64, 64}));
  const TensorEntry* wk = g.find("blk.4.attn_k.weight");
  ASSERT_NE(wk, nullptr);
  EXPECT_EQ(wk->shape, (std::vector<int64_t>{32, 64}));  // 4 kv heads x head_dim 8

  // Independent reference: the llama2.c checkpoint of the same model stores the embedding table right
  // after its 7 x int32 header.
  std::vector<uint8_t> bin = read_all(kTestdata + "/stories260K.bin");
  ASSERT_GE(bin.size(), 28u + emb->nbytes);
  EXPECT_EQ(std::memcmp(emb->data, bin.data() + 28, emb->nbytes), 0);

  const GgufArray& tokens = g.find_metadata("tokenizer.ggml.tokens")->as_array();
  EXPECT_EQ(tokens.element_type, GgufType::STRING);
  std::vector<std::string> s = tokens.strings();
  ASSERT_EQ(s.size(), 512u);
  EXPECT_EQ(s[0], "<unk>");
  EXPECT_EQ(s[1], "<s>");
  EXPECT_EQ(s[2], "</s>");
  EXPECT_EQ(g.find_metadata("tokenizer.ggml.scores")->as_array().floats().size(), 512u);
  EXPECT_EQ(g.find_metadata("tokenizer.ggml.token_type")->as_array().ints().size(), 512u);

  std::vector<std::string> names = g.tensor_names();
  EXPECT_EQ(names.size(), 48u);
  EXPECT_NE(g.describe().find("stories260K.gguf"), std::string::npos);
}

TEST(GgufReader, InMemoryMatchesMapped) {
  std::vector<uint8_t> bytes = read_all(kTestdata + "/stories260K.gguf");
  GgufFile g(bytes.data(), bytes.size(), "mem.gguf");
  EXPECT_EQ(g.tensors().size(), 48u);
  const TensorEntry* out = g.find("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->file, "mem.gguf");
  EXPECT_GE(out->data, bytes.data());
  EXPECT_LE(out->data + out->nbytes, bytes.data() + bytes.size());
}

TEST(GgufReader, EveryVocabFile) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kTestdata + "/ggml-vocab")) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().string());
    GgufFile g(e.path().string());
    EXPECT_EQ(g.metadata().at("tokenizer.ggml.model").type, GgufType::STRING);
    EXPECT_FALSE(g.get_string("tokenizer.ggml.model").empty());
    EXPECT_GT(g.find_metadata("tokenizer.ggml.tokens")->as_array().items.size(), 100u);
    ++n;
  }
  EXPECT_EQ(n, 10);
}

TEST(GgufReader, MissingFileNamesThePath) {
  try {
    GgufFile g("/nonexistent/dir/x.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.gguf"), std::string::npos);
  }
}

// ---- hand-built files -------------------------------------------------------------------------------

// Little-endian byte builder, independent of GgufWriter, so malformed files can be made on purpose.
struct Raw {
  std::vector<uint8_t> b;
  Raw& u8(uint8_t v) { return put(&v, 1); }
  Raw& u32(uint32_t v) { return put(&v, 4); }
  Raw& u64(uint64_t v) { return put(&v, 8); }
  Raw& str(std::string_view s) {
    u64(s.size());
    return put(s.data(), s.size());
  }
  Raw& put(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Raw& pad_to(size_t a) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
};

struct Info {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Spec {
  uint32_t version = 3;
  std::function<void(Raw&)> kvs = [](Raw& r) { r.str("general.architecture").u32(8).str("llama"); };
  uint64_t kv_count = 1;
  std::vector<Info> tensors = {{"a", {4, 2}, 0, 0}, {"b", {8}, 0, 32}};
  uint64_t alignment = 32;
  uint64_t data_bytes = 64;
};

std::vector<uint8_t> build(const Spec& s) {
  Raw r;
  r.put("GGUF", 4).u32(s.version).u64(s.tensors.size()).u64(s.kv_count);
  s.kvs(r);
  for (const Info& t : s.tensors) {
    r.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) r.u64(d);
    r.u32(t.type).u64(t.offset);
  }
  r.pad_to(s.alignment);
  r.b.resize(r.b.size() + s.data_bytes, 0);
  return r.b;
}

// Expects parsing to throw an inferx::Error whose message starts with the name and contains `needle`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    GgufFile g(bytes.data(), bytes.size(), "bad.gguf");
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(GgufMalformed, BaselineIsValid) {
  std::vector<uint8_t> bytes = build(Spec{});
  GgufFile g(bytes.data(), bytes.size(), "good.gguf");
  ASSERT_EQ(g.tensors().size(), 2u);
  EXPECT_EQ(g.find("a")->shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(g.find("b")->data - g.find("a")->data, 32);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
  std::vector<uint8_t> bytes = build(Spec{});
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(GgufFile(part.data(), part.size(), "cut.gguf"), Error) << "cut at " << cut;
  }
}

TEST(GgufMalformed, BadMagic) {
  std::vector<uint8_t> bytes = build(Spec{});
  bytes[0] = 'X';
  expect_error(bytes, "magic");
  expect_error({}, "magic");
}

TEST(GgufMalformed, Version1) {
  Spec s;
  s.version = 1;
  expect_error(build(s), "version 1 is not supported");
}

TEST(GgufMalformed, Version99) {
  Spec s;
  s.version = 99;
  expect_error(build(s), "unsupported GGUF version 99");
}

TEST(GgufMalformed, BigEndian) {
  Spec s;
  s.version = 0x03000000;  // what a big-endian v3 file's version reads as on a little-endian host
  expect_error(build(s), "big-endian");
}

TEST(GgufMalformed, AbsurdKvCount) {
  Spec s;
  s.kv_count = uint64_t{1} << 60;
  expect_error(build(s), "absurd metadata key/value count");
}

TEST(GgufMalformed, AbsurdTensorCount) {
  std::vector<uint8_t> bytes = build(Spec{});
  uint64_t n = uint64_t{1} << 58;
  std::memcpy(bytes.data() + 8, &n, 8);
  expect_error(bytes, "absurd tensor count");
}

TEST(GgufMalformed, AbsurdStringLength) {
  Spec s;
  s.kvs = [](Raw& r) { r.str("general.architecture").u32(8).u64(uint64_t{1} << 62); };
  expect_error(build(s), "has length 4611686018427387904");
}

TEST(GgufMalformed, AbsurdArrayLength) {
  Spec s;
  s.kvs = [](Raw& r) { r.str("tokens").u32(9).u32(8).u64(uint64_t{1} << 40); };
  expect_error(build(s), "is an array of 1099511627776 STRING values");
}

TEST(GgufMalformed, UnknownValueType) {
  Spec s;
  s.kvs = [](Raw& r) { r.str("k").u32(13).u64(0); };
  expect_error(build(s), "unknown value type 13");
}

TEST(GgufMalformed, BadBool) {
  Spec s;
  s.kvs = [](Raw& r) { r.str("k").u32(7).u8(2); };
  expect_error(build(s), "BOOL byte 2");
}

TEST(GgufMalformed, DeeplyNestedArrays) {
  Spec s;
  s.kvs = [](Raw& r) {
    r.str("k");
    r.u32(9);
    for (int i = 0; i < 20; ++i) r.u32(9).u64(1);
    r.u32(0).u64(0);
  };
  expect_error(build(s), "nests arrays");
}

TEST(GgufMalformed, NDims5) {
  Spec s;
  s.tensors[0].ne = {1, 1, 1, 1, 1};
  expect_error(build(s), "tensor 'a' has 5 dimensions");
}

TEST(GgufMalformed, NDims0) {
  Spec s;
  s.tensors[0].ne = {};
  expect_error(build(s), "tensor 'a' has 0 dimensions");
}

TEST(GgufMalformed, NeZero) {
  Spec s;
  s.tensors[0].ne = {4, 0};
  expect_error(build(s), "tensor 'a' has invalid dimensions ne=[4, 0]");
}

TEST(GgufMalformed, NeNegative) {
  Spec s;
  s.tensors[0].ne = {4, ~uint64_t{0}};  // -1 as int64
  expect_error(build(s), "tensor 'a' has invalid dimensions");
}

TEST(GgufMalformed, NeOverflow) {
  Spec s;
  s.tensors[0].ne = {uint64_t{1} << 32, uint64_t{1} << 32};
  expect_error(build(s), "overflows int64");
}

TEST(GgufMalformed, ByteSizeOverflow) {
  Spec s;
  s.tensors[0].ne = {uint64_t{1} << 31, uint64_t{1} << 31};  // 2^62 elements fit, 2^64 bytes do not
  expect_error(build(s), "byte size overflows");
}

TEST(GgufMalformed, OffsetPastEnd) {
  Spec s;
  s.tensors[1].offset = 4096;
  expect_error(build(s), "tensor 'b' data [");
  expect_error(build(s), "runs past the end of the file");
}

TEST(GgufMalformed, OffsetOverflow) {
  Spec s;
  s.tensors[1].offset = ~uint64_t{31};  // aligned, but data_start + offset wraps
  expect_error(build(s), "overflows");
}

TEST(GgufMalformed, OffsetMisaligned) {
  Spec s;
  s.tensors[1].offset = 33;
  expect_error(build(s), "tensor 'b' data offset 33 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, UnsupportedType) {
  Spec s;
  s.tensors[0].type = 13;
  s.tensors[0].ne = {256, 1};
  expect_error(build(s), "tensor 'a' has unsupported type Q5_K (id 13)");
  s.tensors[0].type = 1000;
  expect_error(build(s), "unsupported type unknown (id 1000)");
}

TEST(GgufMalformed, PartialBlock) {
  Spec s;
  s.tensors[0].type = 8;  // Q8_0: rows must be multiples of 32 elements
  s.tensors[0].ne = {16, 2};
  expect_error(build(s), "not a whole number of Q8_0 blocks");
}

TEST(GgufMalformed, DuplicateTensorName) {
  Spec s;
  s.tensors[1].name = "a";
  expect_error(build(s), "duplicate tensor name 'a'");
}

TEST(GgufMalformed, DuplicateKey) {
  Spec s;
  s.kv_count = 2;
  s.kvs = [](Raw& r) {
    r.str("general.architecture").u32(8).str("llama");
    r.str("general.architecture").u32(8).str("qwen2");
  };
  expect_error(build(s), "duplicate metadata key 'general.architecture'");
}

TEST(GgufMalformed, NonPowerOfTwoAlignment) {
  Spec s;
  s.kv_count = 1;
  s.kvs = [](Raw& r) { r.str("general.alignment").u32(4).u32(48); };
  s.alignment = 48;
  expect_error(build(s), "general.alignment = 48 must be a power of two");
  s.kvs = [](Raw& r) { r.str("general.alignment").u32(4).u32(0); };
  expect_error(build(s), "general.alignment = 0");
  s.kvs = [](Raw& r) { r.str("general.alignment").u32(8).str("32"); };
  expect_error(build(s), "general.alignment");
}

TEST(GgufMalformed, CustomAlignment) {
  Spec s;
  s.kvs = [](Raw& r) { r.str("general.alignment").u32(4).u32(64); };
  s.tensors[1].offset = 64;
  s.alignment = 64;
  s.data_bytes = 96;
  std::vector<uint8_t> bytes = build(s);
  GgufFile g(bytes.data(), bytes.size(), "align.gguf");
  EXPECT_EQ(g.alignment(), 64u);
  EXPECT_EQ(g.find("b")->data - g.find("a")->data, 64);
  s.tensors[1].offset = 32;  // fine for 32, misaligned for 64
  expect_error(build(s), "not a multiple of the alignment 64");
}

TEST(GgufMalformed, OverlappingTensors) {
  Spec s;
  s.tensors[1].offset = 0;
  expect_error(build(s), "overlap");
  s.tensors[0].ne = {16, 1};  // 64 bytes at offset 0, b at 32
  s.tensors[1].offset = 32;
  expect_error(build(s), "tensors 'a' (data offset 0, 64 bytes) and 'b' (data offset 32) overlap");
}

TEST(GgufMalformed, ZeroTensorsNeedNoDataSection) {
  Spec s;
  s.tensors.clear();
  s.alignment = 1;
  s.data_bytes = 0;
  std::vector<uint8_t> bytes = build(s);
  GgufFile g(bytes.data(), bytes.size(), "vocab.gguf");
  EXPECT_TRUE(g.tensors().empty());
}

}  // namespace
}  // namespace inferx
