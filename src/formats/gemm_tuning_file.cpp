#include "formats/gemm_tuning_file.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace inferx {
namespace {

constexpr std::string_view kMagic = "IXGEMMTUNE1\n";
constexpr size_t kRecordBytes = 12 * 8 + 8 * 8 + 1;
constexpr size_t kMaxContext = 4096;
constexpr size_t kMaxRecords = 1 << 20;

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

// Reads a u32 at `at` (advanced) when 4 bytes remain.
bool get_u32(std::string_view bytes, size_t& at, uint32_t& v) {
  if (bytes.size() - at < 4) return false;
  std::memcpy(&v, bytes.data() + at, 4);
  at += 4;
  return true;
}

}  // namespace

std::string serialize_gemm_tuning(std::string_view context, const std::vector<GemmTuningRecord>& records) {
  std::string out(kMagic);
  put_u32(out, static_cast<uint32_t>(context.size()));
  out.append(context);
  put_u32(out, static_cast<uint32_t>(records.size()));
  for (const GemmTuningRecord& r : records) {
    out.append(reinterpret_cast<const char*>(r.key.data()), sizeof r.key);
    out.append(reinterpret_cast<const char*>(r.algo.data()), sizeof r.algo);
    out.push_back(static_cast<char>(r.flags));
  }
  return out;
}

std::vector<GemmTuningRecord> parse_gemm_tuning(std::string_view bytes, std::string_view context,
                                                std::string& why) {
  why.clear();
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    why = "not a GEMM tuning file (bad magic)";
    return {};
  }
  size_t at = kMagic.size();
  uint32_t context_len = 0, count = 0;
  if (!get_u32(bytes, at, context_len) || context_len > kMaxContext || bytes.size() - at < context_len) {
    why = "truncated or oversized context";
    return {};
  }
  const std::string_view file_context = bytes.substr(at, context_len);
  at += context_len;
  if (!get_u32(bytes, at, count) || count > kMaxRecords) {
    why = "missing or implausible record count";
    return {};
  }
  if (bytes.size() - at != static_cast<size_t>(count) * kRecordBytes) {
    why = "size does not match " + std::to_string(count) + " records";
    return {};
  }
  if (file_context != context) {
    why = "tuned for another context: " + std::string(file_context);
    return {};
  }
  std::vector<GemmTuningRecord> records(count);
  for (GemmTuningRecord& r : records) {
    std::memcpy(r.key.data(), bytes.data() + at, sizeof r.key);
    at += sizeof r.key;
    std::memcpy(r.algo.data(), bytes.data() + at, sizeof r.algo);
    at += sizeof r.algo;
    r.flags = static_cast<uint8_t>(bytes[at++]);
  }
  return records;
}

std::vector<GemmTuningRecord> read_gemm_tuning_file(const std::string& path, std::string_view context,
                                                    std::string& why) {
  why.clear();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  if (in) buf << in.rdbuf();
  if (!in) {
    why = path + ": cannot be read";
    return {};
  }
  std::vector<GemmTuningRecord> records = parse_gemm_tuning(buf.str(), context, why);
  if (!why.empty()) why = path + ": " + why;
  return records;
}

bool write_gemm_tuning_file(const std::string& path, std::string_view context,
                            const std::vector<GemmTuningRecord>& records, std::string& error) {
  error.clear();
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  if (ec) {
    error = path + ": cannot create its folder: " + ec.message();
    return false;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    const std::string bytes = serialize_gemm_tuning(context, records);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      error = path + ": cannot be written";
      return false;
    }
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    error = path + ": cannot be replaced";
    return false;
  }
  return true;
}

}  // namespace inferx
