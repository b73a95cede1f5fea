// Prints single-thread SentencePiece encode and decode speed (MB/s of UTF-8 text).
// Usage: bench_tokenizer [vocab.gguf] [text files...]
// Defaults: the Llama 2 vocabulary (ggml-vocab-llama-spm.gguf) and English text built by repeating
// testdata/SOURCES.md to about 512 KB. Text is encoded line by line (as a server sees prompts) and also
// as one string (the worst case for the merge queue).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "text/tokenizer.h"

namespace {

#ifndef INFERX_TESTDATA_DIR
#define INFERX_TESTDATA_DIR "../shared/testdata"
#endif

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = INFERX_TESTDATA_DIR;
  const std::string vocab = argc > 1 ? argv[1] : data + "/ggml-vocab/ggml-vocab-llama-spm.gguf";
  std::string text;
  for (int i = 2; i < argc; ++i) text += read_file(argv[i]);
  if (text.empty()) {
    const std::string sources = read_file(data + "/SOURCES.md");
    while (!sources.empty() && text.size() < 512 * 1024) text += sources;
  }
  try {
    inferx::GgufFile gguf(vocab);
    const auto tok = inferx::load_gguf_tokenizer(gguf);

    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);

    const double mb = static_cast<double>(text.size()) / 1e6;
    // A literal U+2581 in the text is SentencePiece's space marker and decodes as a space.
    std::string expected;
    for (size_t pos = 0; pos < text.size();) {
      if (text.compare(pos, 3, "\xE2\x96\x81") == 0) {
        expected += ' ';
        pos += 3;
      } else {
        expected += text[pos++];
      }
    }
    size_t n_tokens = 0;
    double best_lines = 1e30, best_whole = 1e30, best_decode = 1e30;
    std::vector<int32_t> all_ids;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      n_tokens = 0;
      for (const auto& line : lines) n_tokens += tok->encode(line, false).size();
      best_lines = std::min(best_lines, seconds_since(t0));

      t0 = std::chrono::steady_clock::now();
      all_ids = tok->encode(text, false);
      best_whole = std::min(best_whole, seconds_since(t0));

      t0 = std::chrono::steady_clock::now();
      const std::string back = tok->decode(all_ids);
      best_decode = std::min(best_decode, seconds_since(t0));
      if (rep == 0 && back != expected) std::printf("warning: decode(encode(text)) differs from the text\n");
    }
    std::printf("vocab %s (%d tokens), text %.0f KB, %zu lines\n", vocab.c_str(), tok->vocab_size(),
                static_cast<double>(text.size()) / 1024, lines.size());
    std::printf("encode by line: %.2f MB/s (%zu tokens, %.2f bytes/token)\n", mb / best_lines, n_tokens,
                static_cast<double>(text.size()) / static_cast<double>(n_tokens));
    std::printf("encode whole:   %.2f MB/s (%zu tokens)\n", mb / best_whole, all_ids.size());
    std::printf("decode:         %.2f MB/s\n", mb / best_decode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
