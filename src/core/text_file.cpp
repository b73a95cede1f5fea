#include "core/text_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace inferx {

std::string read_text_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  INFERX_CHECK(!std::filesystem::is_directory(path, ec), "{}: {} is a directory", path, what);
  std::ifstream in(path, std::ios::binary);
  INFERX_CHECK(in.good(), "{}: cannot open {}", path, what);
  std::ostringstream ss;
  ss << in.rdbuf();
  INFERX_CHECK(!in.bad(), "{}: read failed", path);
  return ss.str();
}

}  // namespace inferx
