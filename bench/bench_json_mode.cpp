// What JSON mode (text/json_constraint.h) costs per generated token on the host: the trie's build, then the
// mask of each step while a constrained reply writes a given JSON document token by token (each step takes
// the longest allowed token that continues the document, as a model copying it would). Prints one JSON line.
// Usage: bench_json_mode MODEL [JSON_FILE [SCHEMA_FILE]]   (MODEL: a .gguf, a Hugging Face folder or a
// tokenizer.json). With a schema (or "default": bench/json_mode_schema.json's for the default document) the
// constraint is the schema's (text/json_schema_constraint.h), else JSON mode's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/json_constraint.h"
#include "text/json_schema_constraint.h"
#include "text/tokenizer_loader.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A pretty-printed reply of the kind JSON mode is asked for: keys, strings with spaces and escapes, numbers.
const char* kDefaultDocument = R"({
  "name": "Ada Lovelace",
  "born": 1815,
  "fields": ["mathematics", "computing"],
  "notes": "First to publish an algorithm for a machine: \"the Analytical Engine\".",
  "score": -12.5e-3,
  "active": false,
  "links": {"wiki": "https://en.wikipedia.org/wiki/Ada_Lovelace", "other": null}
})";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [JSON_FILE]\n", argv[0]);
    return 2;
  }
  try {
    const std::string model = argv[1];
    const inferx::ModelText mt = inferx::load_model_text(model);
    INFERX_CHECK(mt.tokenizer != nullptr, "{}: no tokenizer", model);
    std::string doc = kDefaultDocument;
    auto read = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      INFERX_CHECK(in.good(), "{}: cannot open", path);
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    if (argc > 2 && std::string(argv[2]) != "default") doc = read(argv[2]);
    std::shared_ptr<inferx::CompiledSchema> schema;
    if (argc > 3)
      schema = std::make_shared<inferx::CompiledSchema>(
          inferx::CompiledSchema::compile(nlohmann::ordered_json::parse(
              read(std::string(argv[3]) == "default"
                       ? std::string(INFERX_SOURCE_DIR) + "/bench/json_mode_schema.json"
                       : std::string(argv[3])))));
    const auto t0 = std::chrono::steady_clock::now();
    auto trie = std::make_shared<inferx::TokenTrie>(*mt.tokenizer);
    const double build_s = seconds_since(t0);
    const int64_t vocab = trie->vocab_size();
    const int32_t end = mt.tokenizer->eos_id();
    auto c = (schema ? inferx::make_json_schema_constraint(trie, schema)
                     : inferx::make_json_object_constraint(trie))
                 ->start({end});
    std::vector<float> row(static_cast<size_t>(vocab));
    std::vector<double> mask_us;
    size_t at = 0;
    while (at < doc.size()) {
      std::fill(row.begin(), row.end(), 0.0f);
      const auto t = std::chrono::steady_clock::now();
      c->mask(row.data(), vocab);
      mask_us.push_back(seconds_since(t) * 1e6);
      int32_t best = -1;
      size_t best_len = 0;
      for (int32_t id = 0; id < vocab; ++id) {
        const std::string& b = trie->bytes(id);
        if (!std::isfinite(row[static_cast<size_t>(id)]) || b.size() <= best_len) continue;
        if (doc.compare(at, b.size(), b) == 0) {
          best = id;
          best_len = b.size();
        }
      }
      INFERX_CHECK(best >= 0, "no allowed token continues the document at byte {}", at);
      c->accept(best);
      at += best_len;
    }
    std::fill(row.begin(), row.end(), 0.0f);
    c->mask(row.data(), vocab);
    INFERX_CHECK(end >= 0 && std::isfinite(row[static_cast<size_t>(end)]),
                 "the end token is not allowed at the end");
    std::vector<double> sorted = mask_us;
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    for (double x : mask_us) sum += x;
    std::printf(
        "{\"constraint\": \"%s\", \"vocab\": %lld, \"trie_nodes\": %u, \"trie_build_ms\": %.1f, \"tokens\": "
        "%zu, \"mask_us_mean\": "
        "%.1f, "
        "\"mask_us_p50\": %.1f, \"mask_us_p90\": %.1f, \"mask_us_max\": %.1f}\n",
        schema ? "json_schema" : "json_object", static_cast<long long>(vocab), trie->num_nodes(),
        build_s * 1e3, mask_us.size(), sum / mask_us.size(), sorted[sorted.size() / 2],
        sorted[sorted.size() * 9 / 10], sorted.back());
  } catch (const inferx::Error& e) {
    std::fprintf(stderr, "bench_json_mode: %s\n", e.what());
    return 1;
  }
  return 0;
}
