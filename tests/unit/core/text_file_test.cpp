// core/text_file.h: whole files read with errors that name the path and the file's role.
#include "core/text_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace inferx {
namespace {

std::string error_of(const std::string& path) {
  try {
    return "read " + std::to_string(read_text_file(path, "the template").size()) + " bytes";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(TextFile, ReadsBytesAndRefusesDirectoriesAndMissingFiles) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("inferx_text_file_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "t.jinja").string();
  const std::string bytes("a\0b\r\n\xff", 6);
  std::ofstream(file, std::ios::binary) << bytes;
  EXPECT_EQ(read_text_file(file, "the template"), bytes);
  std::ofstream(file, std::ios::binary | std::ios::trunc).close();
  EXPECT_EQ(error_of(file), "read 0 bytes");  // an empty file is a file
  // A directory opens as an empty stream: it read as empty text before.
  EXPECT_EQ(error_of(dir.string()), dir.string() + ": the template is a directory");
  EXPECT_EQ(error_of((dir / "missing").string()), (dir / "missing").string() + ": cannot open the template");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace inferx
