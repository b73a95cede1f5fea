#pragma once
// Perplexity as llama.cpp's `perplexity` tool computes it: the token stream is cut into non-overlapping
// chunks of ctx tokens, each chunk is evaluated from scratch (its first token replaced by BOS when the
// model has one), and only the second half of each chunk is scored (tokens ctx/2 + 1 .. ctx - 1, each
// predicted from all the tokens before it in the chunk), so every scored token sees at least ctx/2 of
// context. Plus what the KL-divergence comparison of a quantized model against its base needs: the
// base's top-k log-probabilities per scored token, saved to a file and compared later.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace inferx {

struct PerplexityResult {
  double nll_sum = 0;  // sum of -log p(target)
  int64_t scored = 0;  // scored tokens
  int64_t chunks = 0;
  double perplexity() const;
};

// Called per scored token with its log-probabilities (vocab entries) and the actual next token.
using ScoredTokenFn = std::function<void(const float* logprobs, int64_t vocab, int32_t target)>;

// How a chunk runs. Prefill: all ctx tokens in one step, every row's logits (llama.cpp's way; the prefill
// attention). DecodeSteps: the first half in one step, then each scored position in a one-token step of its
// own over the cache, as generated tokens are served (the decode attention kernel, a replayed CUDA graph):
// the same positions and targets, so a KL base written in one mode compares with the other, and the
// accuracy of the decode path (e.g. an FP8 KV cache read by the decode kernel) becomes measurable.
enum class PerplexityMode { Prefill, DecodeSteps };

// Throws when the text has fewer than ctx tokens or ctx < 4.
PerplexityResult compute_perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                                    const ScoredTokenFn& on_token = {},
                                    PerplexityMode mode = PerplexityMode::Prefill);

// The base model's distribution per scored token: its top_k log-probabilities (the rest of the vocabulary
// is treated as one bucket in the KL sum; with top_k = vocab the KL is exact).
struct KlBase {
  int64_t vocab = 0, ctx = 0, top_k = 0;
  uint64_t tokens_hash = 0;  // of the evaluated token ids, so a base made from other text is refused
  double base_perplexity = 0;
  std::vector<int32_t> ids;     // [positions, top_k], most probable first
  std::vector<float> logprobs;  // [positions, top_k]
  int64_t positions() const { return top_k ? static_cast<int64_t>(ids.size()) / top_k : 0; }
  // An empty base for `tokens` scored in `ctx`-token chunks, keeping top_k log-probabilities per position
  // (0: the whole vocabulary, which makes the KL exact; larger values are capped at it).
  static KlBase for_text(int64_t vocab, const std::vector<int32_t>& tokens, int64_t ctx, int64_t top_k = 0);
  void add(const float* logprobs, int64_t vocab);
  void write(const std::string& path) const;
  static KlBase read(const std::string& path);
};

uint64_t hash_tokens(const std::vector<int32_t>& tokens, int64_t ctx);

struct KlStats {
  double mean_kl = 0, max_kl = 0;
  double top1_agreement = 0;  // fraction of scored tokens whose argmax matches the base's
  int64_t positions = 0;
};

// Accumulates KL(base || model) per scored token, in the order compute_perplexity visits them.
class KlAccumulator {
 public:
  explicit KlAccumulator(const KlBase& base) : base_(base) {}
  void add(const float* logprobs, int64_t vocab);
  KlStats stats() const;

 private:
  const KlBase& base_;
  int64_t next_ = 0, agree_ = 0;
  double sum_ = 0, max_ = 0;
};

}  // namespace inferx
