// Single-thread encode speed (MB/s of UTF-8 text) of any tokenizer InferX reads: a .gguf, a Hugging Face
// folder or a tokenizer.json. bench/bench_tokenizer_bpe.py runs it next to Hugging Face tokenizers on the
// same text and prints both.
// Usage: bench_tokenizer_bpe MODEL TEXT_FILE [REPEATS] [whole|lines]; prints one JSON line. "lines"
// encodes every line on its own (as a server sees prompts); "whole" the text as one string.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "text/tokenizer_loader.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string model = argv[1];
    const inferx::ModelText mt = inferx::load_model_text(model);
    INFERX_CHECK(mt.tokenizer != nullptr, "{}: no tokenizer", model);
    std::ifstream in(argv[2], std::ios::binary);
    INFERX_CHECK(in.good(), "{}: cannot open", argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
    const bool by_line = argc > 4 && std::string(argv[4]) == "lines";
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      lines.push_back(std::string_view(text).substr(pos, end - pos));
      pos = end + 1;
    }
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (by_line) {
        tokens = 0;
        for (std::string_view line : lines) tokens += mt.tokenizer->encode(line, false).size();
      } else {
        tokens = mt.tokenizer->encode(text, false).size();
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.6f, \"mb_per_s\": %.3f}\n", text.size(),
                tokens, best, static_cast<double>(text.size()) / 1e6 / best);
  } catch (const inferx::Error& e) {
    std::fprintf(stderr, "bench_tokenizer_bpe: %s\n", e.what());
    return 1;
  }
  return 0;
}
