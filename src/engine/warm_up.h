#pragma once
// The engine's startup warm-up of step sizes (EngineConfig::warm_up): one eager forward per token count a
// prefill or mixed step will have, before the first request, so that the first served step of each size
// does not pay for the GEMM algorithm timing its row count triggers (gemm_cublaslt.h: the first row count
// seen in a power-of-two row bucket is timed and decides for the bucket) or for growing the workspace.
// vLLM's profile run at startup plays the same part. Decode sizes are DecodeGraphs::warm_up's.
#include <cstdint>
#include <vector>

#include "engine/batch_builder.h"
#include "model/model.h"

namespace inferx {

// The token counts warmed up: max_tokens, then each power of two below it while above `floor` (the
// largest padded decode batch, whose sizes DecodeGraphs::warm_up covers), largest first (the first
// forward sizes the workspace once, and each bucket is decided at its top). Empty when max_tokens <= floor.
std::vector<int32_t> warm_up_token_counts(int32_t max_tokens, int32_t floor);

// Runs one eager forward per count, shaped like a mixed step and built by `builder` as the engine builds
// its steps (which also sizes the builder's buffers): min(decode_rows, count / 2) one-token rows first (the
// decode attention), the rest as prefill chunks of up to one block each (the prefill attention), every
// sequence in `scratch_block` (like DecodeGraphs' padding rows: the KV writes land in a block the pool never
// hands out), the last token wanting logits. Queues the work (the caller synchronizes once after the whole
// warm-up). Returns the counts run.
int32_t warm_up_step_sizes(Model& model, KvCache& kv, BatchBuilder& builder, int32_t scratch_block,
                           const std::vector<int32_t>& counts, int32_t decode_rows);

}  // namespace inferx
