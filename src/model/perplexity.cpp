// Chunked perplexity and KL divergence against a saved base (perplexity.h).
#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/error.h"

namespace inferx {

namespace {

constexpr char kMagic[8] = {'I', 'X', 'K', 'L', 'B', 'A', 'S', '1'};

void log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  out.resize(static_cast<size_t>(n));
  const float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<float>(logits[i] - lse);
}

template <class T>
void put(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
void get(std::ifstream& f, T& v, const std::string& path) {
  INFERX_CHECK(f.read(reinterpret_cast<char*>(&v), sizeof(T)), "{}: truncated KL base file", path);
}

}  // namespace

double PerplexityResult::perplexity() const {
  return scored ? std::exp(nll_sum / static_cast<double>(scored)) : 0;
}

uint64_t hash_tokens(const std::vector<int32_t>& tokens, int64_t ctx) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(ctx);  // FNV-1a over the ids
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

PerplexityResult compute_perplexity(Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                                    const ScoredTokenFn& on_token, PerplexityMode mode) {
  INFERX_CHECK(ctx >= 4, "perplexity: --ctx {} is too small (at least 4)", ctx);
  const int64_t n_chunks = static_cast<int64_t>(tokens.size()) / ctx;
  INFERX_CHECK(n_chunks >= 1, "perplexity: the text has {} tokens, fewer than one chunk of --ctx {}",
               tokens.size(), ctx);
  const int64_t vocab = model.config().vocab_size;
  const int32_t bos = model.config().bos_token_id;
  PerplexityResult r;
  r.chunks = n_chunks;
  std::vector<float> lp;
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (bos >= 0) chunk[0] = bos;
    SequenceRunner runner(model, ctx);
    // Prefill: every position's logits at once. DecodeSteps: positions 0 .. ctx/2 - 1 in one step (their
    // logits unused), then position j alone when it is scored.
    std::vector<float> logits;
    if (mode == PerplexityMode::Prefill)
      logits = runner.step_all_logits(chunk);
    else
      runner.step(std::vector<int32_t>(chunk.begin(), chunk.begin() + ctx / 2));
    for (int64_t j = ctx / 2; j + 1 < ctx; ++j) {
      const float* row = mode == PerplexityMode::Prefill
                             ? logits.data() + j * vocab
                             : runner.step({chunk[static_cast<size_t>(j)]}).data();
      log_softmax(row, vocab, lp);
      const int32_t target = chunk[static_cast<size_t>(j + 1)];
      INFERX_CHECK(target >= 0 && target < vocab, "perplexity: token id {} is outside the vocabulary",
                   target);
      r.nll_sum -= lp[static_cast<size_t>(target)];
      ++r.scored;
      if (on_token) on_token(lp.data(), vocab, target);
    }
  }
  return r;
}

KlBase KlBase::for_text(int64_t vocab, const std::vector<int32_t>& tokens, int64_t ctx, int64_t top_k) {
  KlBase b;
  b.vocab = vocab;
  b.ctx = ctx;
  b.top_k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  b.tokens_hash = hash_tokens(tokens, ctx);
  return b;
}

void KlBase::add(const float* lp, int64_t v) {
  INFERX_CHECK(v == vocab && top_k > 0 && top_k <= vocab, "KL base: vocabulary {} / top-k {} mismatch", v,
               top_k);
  std::vector<int32_t> idx(static_cast<size_t>(v));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                    [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  for (int64_t i = 0; i < top_k; ++i) {
    ids.push_back(idx[static_cast<size_t>(i)]);
    logprobs.push_back(lp[idx[static_cast<size_t>(i)]]);
  }
}

void KlBase::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  INFERX_CHECK(f.good(), "{}: cannot open for writing", path);
  f.write(kMagic, 8);
  put(f, vocab);
  put(f, ctx);
  put(f, top_k);
  put(f, tokens_hash);
  put(f, base_perplexity);
  const int64_t n = positions();
  put(f, n);
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  f.write(reinterpret_cast<const char*>(logprobs.data()), static_cast<std::streamsize>(logprobs.size() * 4));
  INFERX_CHECK(f.good(), "{}: write failed", path);
}

KlBase KlBase::read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  INFERX_CHECK(f.good(), "{}: cannot open the KL base file", path);
  char magic[8];
  INFERX_CHECK(
      f.read(magic, 8) && std::memcmp(magic, kMagic, 8) == 0,
      "{}: not an InferX KL base file (write one with --kl-divergence-base FILE, without --kl-divergence)",
      path);
  KlBase b;
  int64_t n = 0;
  get(f, b.vocab, path);
  get(f, b.ctx, path);
  get(f, b.top_k, path);
  get(f, b.tokens_hash, path);
  get(f, b.base_perplexity, path);
  get(f, n, path);
  INFERX_CHECK(b.vocab > 0 && b.top_k > 0 && b.top_k <= b.vocab && n >= 0 && n < (int64_t{1} << 40) / b.top_k,
               "{}: corrupt header", path);
  // The header's counts must match what the file holds before anything is allocated from them.
  const std::streamoff header = f.tellg();
  f.seekg(0, std::ios::end);
  const std::streamoff body = f.tellg() - header;
  f.seekg(header);
  INFERX_CHECK(body == static_cast<std::streamoff>(n * b.top_k * 8),
               "{}: the header announces {} positions x {} log-probabilities ({} bytes) but {} bytes follow",
               path, n, b.top_k, n * b.top_k * 8, static_cast<int64_t>(body));
  b.ids.resize(static_cast<size_t>(n * b.top_k));
  b.logprobs.resize(b.ids.size());
  INFERX_CHECK(
      f.read(reinterpret_cast<char*>(b.ids.data()), static_cast<std::streamsize>(b.ids.size() * 4)) &&
          f.read(reinterpret_cast<char*>(b.logprobs.data()),
                 static_cast<std::streamsize>(b.logprobs.size() * 4)),
      "{}: truncated KL base file", path);
  for (int32_t id : b.ids) INFERX_CHECK(id >= 0 && id < b.vocab, "{}: token id {} out of range", path, id);
  // Log-probabilities: finite and at most 0 (a little above for rounding); a NaN would poison every KL.
  for (float lp : b.logprobs)
    INFERX_CHECK(std::isfinite(lp) && lp <= 1e-3f, "{}: log-probability {} is not a valid one", path, lp);
  return b;
}

void KlAccumulator::add(const float* lp, int64_t vocab) {
  INFERX_CHECK(vocab == base_.vocab, "KL: the model's vocabulary {} differs from the base's {}", vocab,
               base_.vocab);
  INFERX_CHECK(next_ < base_.positions(), "KL: more scored tokens than the base file holds ({})",
               base_.positions());
  const int32_t* ids = base_.ids.data() + next_ * base_.top_k;
  const float* bp = base_.logprobs.data() + next_ * base_.top_k;
  double kl = 0, p_in = 0, q_in = 0;
  for (int64_t i = 0; i < base_.top_k; ++i) {
    const double p = std::exp(static_cast<double>(bp[i]));
    kl += p * (static_cast<double>(bp[i]) - lp[ids[i]]);
    p_in += p;
    q_in += std::exp(static_cast<double>(lp[ids[i]]));
  }
  // The rest of the vocabulary as one bucket (a lower bound of its share). None when the base holds the whole
  // vocabulary: 1 - p_in is then rounding alone (float log-probabilities, ~1e-7), and with q_in rounded to 1
  // or past it the bucket's term was ~1e-7 * ln(1e-7 / 1e-30) = 5e-6 of nothing (an AVX2 machine, 12-07).
  // Below that rounding level a bucket means nothing either way: a share under kRounding is dropped and a
  // model's share is taken as at least kRounding (so the term stays a lower bound).
  constexpr double kRounding = 1e-6;
  const double p_out = 1.0 - p_in, q_out = std::max(kRounding, 1.0 - q_in);
  if (base_.top_k < vocab && p_out > kRounding) kl += p_out * (std::log(p_out) - std::log(q_out));
  kl = std::max(0.0, kl);
  sum_ += kl;
  max_ = std::max(max_, kl);
  const int32_t argmax = static_cast<int32_t>(std::max_element(lp, lp + vocab) - lp);
  agree_ += argmax == ids[0];
  ++next_;
}

KlStats KlAccumulator::stats() const {
  KlStats s;
  s.positions = next_;
  if (next_ == 0) return s;
  s.mean_kl = sum_ / static_cast<double>(next_);
  s.max_kl = max_;
  s.top1_agreement = static_cast<double>(agree_) / static_cast<double>(next_);
  return s;
}

}  // namespace inferx
