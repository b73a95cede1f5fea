// The GEMM tuning cache file (formats/gemm_tuning_file.h): records survive a round trip, a file of another
// context or any damaged file yields nothing with a reason, and the file is written whole through a rename.
#include "formats/gemm_tuning_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace inferx {
namespace {

namespace fs = std::filesystem;

std::vector<GemmTuningRecord> sample_records() {
  std::vector<GemmTuningRecord> records(3);
  for (size_t i = 0; i < records.size(); ++i) {
    for (size_t j = 0; j < 12; ++j) records[i].key[j] = static_cast<int64_t>(i * 100 + j) - 7;
    for (size_t j = 0; j < 8; ++j) records[i].algo[j] = 0x0123456789abcdefull * (i + 1) + j;
    records[i].flags = static_cast<uint8_t>(i % 2);
  }
  records[2].key[3] = -1;  // negative and extreme values survive too
  records[2].algo[7] = ~0ull;
  return records;
}

constexpr const char* kContext = "device=NVIDIA H200;sms=132;cublasLt=130000;fast_accum=1";

TEST(GemmTuningFile, RecordsSurviveARoundTrip) {
  const std::vector<GemmTuningRecord> records = sample_records();
  std::string why;
  EXPECT_EQ(parse_gemm_tuning(serialize_gemm_tuning(kContext, records), kContext, why), records);
  EXPECT_EQ(why, "");
  EXPECT_TRUE(parse_gemm_tuning(serialize_gemm_tuning(kContext, {}), kContext, why).empty());
  EXPECT_EQ(why, "");
}

TEST(GemmTuningFile, AnotherContextYieldsNothing) {
  std::string why;
  const std::string bytes = serialize_gemm_tuning(kContext, sample_records());
  EXPECT_TRUE(parse_gemm_tuning(bytes, "device=NVIDIA H100 80GB HBM3;sms=132", why).empty());
  EXPECT_NE(why.find("another context"), std::string::npos) << why;
}

TEST(GemmTuningFile, EveryTruncationAndAnExtraByteYieldNothing) {
  const std::string bytes = serialize_gemm_tuning(kContext, sample_records());
  std::string why;
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_TRUE(parse_gemm_tuning(bytes.substr(0, n), kContext, why).empty()) << n;
    EXPECT_FALSE(why.empty()) << n;
  }
  EXPECT_TRUE(parse_gemm_tuning(bytes + "x", kContext, why).empty());
  EXPECT_NE(why.find("does not match"), std::string::npos) << why;
}

TEST(GemmTuningFile, ImplausibleCountsAreRefusedBeforeAllocating) {
  std::string bytes = serialize_gemm_tuning(kContext, {});
  const uint32_t huge = 0xffffffffu;
  bytes.replace(bytes.size() - 4, 4, reinterpret_cast<const char*>(&huge), 4);  // the record count
  std::string why;
  EXPECT_TRUE(parse_gemm_tuning(bytes, kContext, why).empty());
  EXPECT_NE(why.find("record count"), std::string::npos) << why;
  EXPECT_TRUE(parse_gemm_tuning("IXGEMMTUNE1\n\xff\xff\xff\xff", kContext, why).empty());
  EXPECT_NE(why.find("context"), std::string::npos) << why;
  EXPECT_TRUE(parse_gemm_tuning("GGUF", kContext, why).empty());
  EXPECT_NE(why.find("magic"), std::string::npos) << why;
}

TEST(GemmTuningFile, WrittenThroughARenameIntoANewFolderAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("inferx-gemm-tuning-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "nested" / "gemm-tuning.bin").string();
  std::string why, error;
  EXPECT_TRUE(read_gemm_tuning_file(path, kContext, why).empty());
  EXPECT_EQ(why, "") << "a missing file is not an error";
  ASSERT_TRUE(write_gemm_tuning_file(path, kContext, sample_records(), error)) << error;
  EXPECT_EQ(read_gemm_tuning_file(path, kContext, why), sample_records());
  EXPECT_EQ(why, "");
  // Replaced whole; no temporary file left beside it.
  ASSERT_TRUE(write_gemm_tuning_file(path, kContext, {sample_records()[1]}, error)) << error;
  EXPECT_EQ(read_gemm_tuning_file(path, kContext, why), std::vector<GemmTuningRecord>{sample_records()[1]});
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "nested")) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);
  // A damaged file is reported with its name and yields nothing.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "IXGEMMTUNE1\nbroken";
  EXPECT_TRUE(read_gemm_tuning_file(path, kContext, why).empty());
  EXPECT_NE(why.find(path), std::string::npos) << why;
  fs::remove_all(dir);
}

TEST(GemmTuningFile, AnUnwritablePlaceIsAnErrorNamingTheFile) {
  std::string error;
  const std::string path = "/proc/inferx-no-such-folder/gemm-tuning.bin";
  EXPECT_FALSE(write_gemm_tuning_file(path, kContext, sample_records(), error));
  EXPECT_NE(error.find(path), std::string::npos) << error;
}

}  // namespace
}  // namespace inferx
