#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "model/model.h"

namespace inferx {

namespace {
int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }
}  // namespace

SequenceRunner::SequenceRunner(Model& model, int64_t max_tokens, int64_t block_size)
    : model_(model), cache_(model, blocks_for(max_tokens, block_size), block_size), max_tokens_(max_tokens) {
  block_table_.resize(static_cast<size_t>(cache_.num_blocks()));
  std::iota(block_table_.begin(), block_table_.end(), 0);
  // INFERX_GRAPHS=0 runs every step eagerly (for comparisons and debugging).
  if (const char* g = std::getenv("INFERX_GRAPHS")) use_graphs_ = std::strcmp(g, "0") != 0;
}

SequenceRunner::~SequenceRunner() {
  if (decode_graph_) model_.backend().drop_graph(graph_key());
}

const std::vector<float>& SequenceRunner::step(const std::vector<int32_t>& tokens) {
  last_logits_ = run(tokens, false);
  return last_logits_;
}

std::vector<float> SequenceRunner::step_all_logits(const std::vector<int32_t>& tokens) {
  return run(tokens, true);
}

std::vector<float> SequenceRunner::run(const std::vector<int32_t>& tokens, bool all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  INFERX_CHECK(n > 0, "no tokens to run");
  INFERX_CHECK(length_ + n <= max_tokens_, "sequence of {} tokens exceeds the runner's limit of {}",
               length_ + n, max_tokens_);
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t id : tokens)
    INFERX_CHECK(id >= 0 && id < vocab, "token id {} is out of range (vocabulary of {})", id, vocab);
  // Host-side metadata, laid out in one block and copied to the backend in one transfer.
  const int32_t num_logits = all_logits ? static_cast<int32_t>(n) : 1;
  std::vector<int32_t>& meta = meta_host_;
  meta.clear();
  meta.insert(meta.end(), tokens.begin(), tokens.end());                              // token_ids
  for (int64_t i = 0; i < n; ++i) meta.push_back(static_cast<int32_t>(length_ + i));  // positions
  meta.push_back(0);                                                                  // query_start
  meta.push_back(static_cast<int32_t>(n));
  meta.push_back(static_cast<int32_t>(length_ + n));                  // seq_lens
  meta.insert(meta.end(), block_table_.begin(), block_table_.end());  // block_tables
  for (int32_t i = 0; i < num_logits; ++i) meta.push_back(all_logits ? i : static_cast<int32_t>(n - 1));
  Backend& be = model_.backend();
  if (!meta_device_ || meta_device_->size() < meta.size() * sizeof(int32_t))
    meta_device_ = be.allocate(meta.size() * sizeof(int32_t) * 2);
  be.copy_to_device(meta_device_->data(), meta.data(), meta.size() * sizeof(int32_t));
  const int32_t* d = static_cast<const int32_t*>(meta_device_->data());
  const BatchLayout layout(static_cast<int32_t>(n), 1, static_cast<int32_t>(block_table_.size()), num_logits);
  INFERX_CHECK(layout.total() == meta.size(), "sequence runner: metadata of {} ints, layout wants {}",
               meta.size(), layout.total());
  BatchView b = layout.view(d);
  b.max_query_len = static_cast<int32_t>(n);
  const bool decode = n == 1 && !all_logits;
  // A decode step may be recorded and replayed at every later length (forward below): its hint is the
  // runner's capacity, not this step's length.
  b.max_seq_len = static_cast<int32_t>(decode && use_graphs_ ? max_tokens_ : length_ + n);
  Tensor logits = forward(b, decode);
  std::vector<float> host(static_cast<size_t>(num_logits * vocab));
  be.copy_to_host(host.data(), logits.data, host.size() * sizeof(float));
  length_ += n;
  return host;
}

// Decode steps (one token, one logits row) have the same shapes and, since the metadata buffer keeps its
// address and layout, the same pointers every time: the first is run eagerly (which also sizes every
// workspace and picks the GEMM algorithms) and then recorded once; later ones rewrite the metadata in
// place (copy_to_device above, before the replay on the same stream) and replay the recording. Any other
// step may move the workspaces, so it drops the recording; the backend itself refuses a replay after any
// allocation (another runner growing the shared workspace), and the step then runs eagerly again.
Tensor SequenceRunner::forward(const BatchView& b, bool decode) {
  Backend& be = model_.backend();
  const uint64_t kDecodeKey = graph_key();  // runners sharing a backend keep their own recordings
  if (!decode || !use_graphs_) {
    if (decode_graph_) {
      be.drop_graph(kDecodeKey);
      decode_graph_ = false;
    }
    return model_.forward(b, cache_);
  }
  if (decode_graph_ && be.replay_graph(kDecodeKey)) return graph_logits_;
  Tensor logits = model_.forward(b, cache_);
  decode_graph_ = false;
  if (be.begin_graph_capture()) {
    try {
      // Recorded, not run: the eager step above already wrote this token's KV and logits.
      graph_logits_ = model_.forward(b, cache_);
      be.end_graph_capture(kDecodeKey);
      decode_graph_ = graph_logits_.data == logits.data;
    } catch (const Error&) {
      be.end_graph_capture(kDecodeKey, false);
      use_graphs_ = false;  // e.g. a workspace that could not be recorded: stay eager
    }
  }
  return logits;
}

}  // namespace inferx
