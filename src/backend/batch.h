#pragma once
// The flattened step the model runs: every scheduled token of every sequence, unpadded.
// Built by the engine (or `inferx generate` for one sequence); the model never sees requests.
#include <cstddef>
#include <cstdint>

namespace inferx {

// Pointers are in the backend's memory (host for CPU, device for CUDA).
struct BatchView {
  int32_t num_tokens = 0;  // total new tokens this step
  int32_t num_seqs = 0;
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens] absolute position of each token
  const int32_t* query_start = nullptr;   // [num_seqs + 1] token offsets; seq s owns [qs[s], qs[s+1])
  const int32_t* seq_lens = nullptr;      // [num_seqs] KV length of seq s after this step
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] physical KV block ids
  int32_t max_blocks_per_seq = 0;
  const int32_t* logits_rows = nullptr;  // [num_logits] token rows whose logits are wanted
  int32_t num_logits = 0;
  int32_t max_query_len = 0;  // host-side hints for kernel launch shapes
  // Host hint: no sequence's KV length exceeds this, in this step nor in any replay of a recording of it
  // (decode graphs set the bound their recording was made for, not the step's own length). 0: unknown, the
  // block tables' capacity (max_blocks_per_seq x block size) bounds it.
  int32_t max_seq_len = 0;
  // Host hint: the first num_decode_prefix sequences have one query token each (tokens [0, n)); the
  // scheduler puts decodes first, so a GPU backend can run them through its decode kernel and the rest
  // through its prefill kernel. 0: unknown (no split).
  int32_t num_decode_prefix = 0;
};

// The one host/device int32 block a BatchView points into, laid out as
//   token_ids[T] positions[T] query_start[S+1] seq_lens[S] block_tables[S*M] logits_rows[L]
// so that a step's metadata travels in one copy. Every builder (engine batches, padded decode graphs,
// SequenceRunner) fills the same offsets and takes its view from here.
struct BatchLayout {
  BatchLayout(int32_t tokens, int32_t seqs, int32_t max_blocks, int32_t logits)
      : num_tokens(tokens), num_seqs(seqs), max_blocks_per_seq(max_blocks), num_logits(logits) {}
  int32_t num_tokens, num_seqs, max_blocks_per_seq, num_logits;
  size_t positions() const { return static_cast<size_t>(num_tokens); }
  size_t query_start() const { return 2 * static_cast<size_t>(num_tokens); }
  size_t seq_lens() const { return query_start() + static_cast<size_t>(num_seqs) + 1; }
  size_t block_tables() const { return seq_lens() + static_cast<size_t>(num_seqs); }
  size_t logits_rows() const {
    return block_tables() + static_cast<size_t>(num_seqs) * static_cast<size_t>(max_blocks_per_seq);
  }
  size_t total() const { return logits_rows() + static_cast<size_t>(num_logits); }
  // The view of a block laid out like this at `base`; the caller sets the two launch hints.
  BatchView view(const int32_t* base) const {
    BatchView v;
    v.num_tokens = num_tokens;
    v.num_seqs = num_seqs;
    v.token_ids = base;
    v.positions = base + positions();
    v.query_start = base + query_start();
    v.seq_lens = base + seq_lens();
    v.block_tables = base + block_tables();
    v.max_blocks_per_seq = max_blocks_per_seq;
    v.logits_rows = base + logits_rows();
    v.num_logits = num_logits;
    return v;
  }
};

}  // namespace inferx
