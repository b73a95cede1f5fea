#pragma once
// The flattened step the model runs: every scheduled token of every sequence, unpadded.
// Built by the engine (or `inferx generate` for one sequence); the model never sees requests.
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
  int32_t max_seq_len = 0;
};

}  // namespace inferx
