#include "engine/step_sampler.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace inferx {

bool samples_on_device(const Sequence& seq) {
  return seq.request->req.params.logprobs < 0 && !seq.constraint;
}

bool needs_logit_edits(const Sequence& seq) {
  return !seq.request->req.params.logit_bias.empty() || seq.penalties.active();
}

float device_uniform(uint64_t seed, int64_t token_index) {
  // splitmix64 (Steele et al. 2014) over the seed advanced by the token index.
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(token_index) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // top 24 bits / 2^24
}

TokenSampleParams device_sample_params(const Sequence& seq, int32_t pending) {
  const GenerationParams& p = seq.request->req.params;
  TokenSampleParams t;
  t.temperature = p.temperature;
  t.top_k = p.top_k;
  t.top_p = p.top_p;
  t.min_p = p.min_p;
  t.uniform = p.temperature > 0.0f ? device_uniform(seq.seed, seq.num_generated() + pending) : 0.0f;
  return t;
}

namespace {

// A row the host samples: computed greedily on the device and ignored.
constexpr TokenSampleParams kHostRow{0.0f, 0, 1.0f, 0.0f, 0.0f};

// Every row greedy: the backend then runs its argmax (no parameters uploaded).
bool all_greedy(const std::vector<TokenSampleParams>& params) {
  return std::none_of(params.begin(), params.end(),
                      [](const TokenSampleParams& p) { return p.temperature > 0.0f; });
}

}  // namespace

StepSampler::StepSampler(Backend& backend, bool allow_device, ThreadPool* pool)
    : backend_(backend), device_ok_(allow_device), host_(pool) {}

void StepSampler::sample_on_host(const Tensor& logits, std::vector<SampledToken>& result) {
  const int64_t vocab = logits.cols();
  logits_host_.resize(seqs_.size() * static_cast<size_t>(vocab));
  if (!logits_host_.empty())
    backend_.copy_to_host(logits_host_.data(), logits.data, logits_host_.size() * sizeof(float));
  host_.sample_rows(seqs_, logits_host_.data(), vocab, result);
  host_rows_ += static_cast<int64_t>(seqs_.size());
}

void StepSampler::sample(const SchedulerOutput& out, const Tensor& logits,
                         std::vector<SampledToken>& result) {
  seqs_.clear();
  for (const ScheduledSequence& s : out.seqs) {
    if (s.sample) seqs_.push_back(s.seq);
  }
  result.clear();
  if (seqs_.empty()) return;
  const auto rows = static_cast<int64_t>(seqs_.size());
  INFERX_CHECK(logits.dtype == DType::F32 && logits.rows() == rows,
               "step sampler: {} sampled sequences but logits {} {}", rows, dtype_name(logits.dtype),
               logits.shape_string());
  if (!device_ok_) return sample_on_host(logits, result);

  params_.resize(seqs_.size());
  host_index_.clear();
  edits_.clear();
  edit_rows_.clear();
  const int64_t vocab = logits.cols();
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Sequence& seq = *seqs_[i];
    // logit_bias and penalties become edits of the row on the device (Backend::edit_logits); a bias edits
    // cannot express (a token twice) keeps the row on the host.
    bool device = samples_on_device(seq);
    if (device && needs_logit_edits(seq)) {
      device = seq.penalties.append_edits(static_cast<int32_t>(i), seq.request->req.params.logit_bias, vocab,
                                          edits_);
      if (device) edit_rows_.push_back(static_cast<int32_t>(i));
    }
    params_[i] = device ? device_sample_params(seq) : kHostRow;
    if (!device) host_index_.push_back(static_cast<int32_t>(i));
  }
  bool edited_on_device = false;
  if (!edits_.empty()) {
    Tensor edited = logits;  // the same rows, edited in place in backend memory
    edited_on_device = backend_.edit_logits(edited, edits_.data(), static_cast<int64_t>(edits_.size()));
    if (!edited_on_device) {
      // The backend cannot edit: those rows go to the host, unedited logits and all.
      for (int32_t r : edit_rows_) params_[static_cast<size_t>(r)] = kHostRow;
      host_index_.insert(host_index_.end(), edit_rows_.begin(), edit_rows_.end());
      std::sort(host_index_.begin(), host_index_.end());
    }
  }
  if (host_index_.size() == seqs_.size()) return sample_on_host(logits, result);
  ids_.resize(seqs_.size());
  if (!backend_.sample_tokens(logits, all_greedy(params_) ? nullptr : params_.data(), ids_.data())) {
    // The host path applies bias and penalties itself: after the device has edited the rows in place it
    // would apply them twice. A backend that edits must sample (backend.h).
    INFERX_CHECK(!edited_on_device,
                 "step sampler: backend {} edited the logits on the device but refused to "
                 "sample them",
                 backend_.name());
    device_ok_ = false;
    return sample_on_host(logits, result);
  }
  result.resize(seqs_.size());
  for (size_t i = 0; i < seqs_.size(); ++i) {
    result[i].seq = seqs_[i];
    result[i].token = ids_[i];
  }
  device_rows_ += rows - static_cast<int64_t>(host_index_.size());
  if (host_index_.empty()) return;

  // Rows that need the host: one copy each (rare: logprobs, or edits the backend cannot make).
  const size_t row_bytes = static_cast<size_t>(vocab) * sizeof(float);
  logits_host_.resize(host_index_.size() * static_cast<size_t>(vocab));
  host_seqs_.clear();
  for (size_t k = 0; k < host_index_.size(); ++k) {
    const auto i = static_cast<size_t>(host_index_[k]);
    backend_.copy_to_host(logits_host_.data() + k * static_cast<size_t>(vocab),
                          static_cast<const char*>(logits.data) + i * row_bytes, row_bytes);
    host_seqs_.push_back(seqs_[i]);
  }
  host_.sample_rows(host_seqs_, logits_host_.data(), vocab, host_result_);
  for (size_t k = 0; k < host_index_.size(); ++k)
    result[static_cast<size_t>(host_index_[k])] = std::move(host_result_[k]);
  host_rows_ += static_cast<int64_t>(host_index_.size());
}

void StepSampler::uncount_device_rows(int64_t rows) { device_rows_ -= rows; }

bool StepSampler::can_sample_async(const SchedulerOutput& out) const {
  if (!device_ok_ || !backend_.async_sampling()) return false;
  for (const ScheduledSequence& s : out.seqs) {
    // Penalties would miss the token still on its way: rows with edits are sampled in order.
    if (!s.sample || !samples_on_device(*s.seq) || needs_logit_edits(*s.seq)) return false;
  }
  return !out.seqs.empty();
}

void StepSampler::sample_async(const SchedulerOutput& out, const Tensor& logits, int slot, int32_t pending) {
  INFERX_CHECK(logits.dtype == DType::F32 && logits.rows() == static_cast<int64_t>(out.seqs.size()),
               "step sampler: {} sampled sequences but logits {} {}", out.seqs.size(),
               dtype_name(logits.dtype), logits.shape_string());
  params_.resize(out.seqs.size());
  for (size_t i = 0; i < out.seqs.size(); ++i) params_[i] = device_sample_params(*out.seqs[i].seq, pending);
  backend_.sample_tokens_async(logits, all_greedy(params_) ? nullptr : params_.data(), slot);
  device_rows_ += static_cast<int64_t>(out.seqs.size());
}

void StepSampler::collect_async(int slot, int64_t rows, std::vector<int32_t>& ids) {
  ids.resize(static_cast<size_t>(rows));
  backend_.wait_sampled_tokens(slot, ids.data(), rows);
}

}  // namespace inferx
