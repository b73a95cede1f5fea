#pragma once
// Request and sequence state. A request owns n sequences (OpenAI `n`); each sequence moves through
//   Waiting -> Running -> Finished            (Stop / Length / Abort, see FinishReason)
//   Running -> Preempted (KV dropped, back in the waiting queue, recomputed on resumption) -> Running
// (vLLM v1 request.py RequestStatus). The scheduler reasons only in tokens: a sequence wants its
// tokens.size() - num_computed uncomputed tokens fed through the model.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/logits_processors.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "inferx/engine.h"
#include "text/tokenizer.h"

namespace inferx {

enum class SequenceStatus : uint8_t { Waiting, Running, Preempted, Finished };
const char* sequence_status_name(SequenceStatus s);

struct RequestState;

struct Sequence {
  RequestState* request = nullptr;
  int32_t index = 0;  // within the request
  SequenceStatus status = SequenceStatus::Waiting;
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;

  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int32_t num_prompt = 0;
  int32_t num_computed = 0;  // leading tokens whose KV is in the cache

  // KV: blocks[j] holds positions [j * block_size, (j + 1) * block_size); -1 once a sliding window
  // dropped it. block_hashes are the chained hashes of the full blocks of `tokens` (prefix caching).
  std::vector<int32_t> blocks;
  int32_t num_released_blocks = 0;  // leading blocks dropped by the sliding window
  int32_t num_cached_blocks = 0;    // leading blocks already offered to the prefix cache
  std::vector<uint64_t> block_hashes;

  // Sampling and output. `seed` keys the device sampler's draws (engine/step_sampler.h): the draw of the
  // k-th generated token depends only on (seed, k), never on the batch or on preemption.
  std::optional<Sampler> sampler;
  uint64_t seed = 0;
  PenaltyState penalties;
  std::unique_ptr<TokenConstraint> constraint;  // structured output (params.constraint's state): host-sampled
  std::optional<IncrementalDetokenizer> detokenizer;
  StopChecker stop;
  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt; }
  bool finished() const { return status == SequenceStatus::Finished; }

  // Output not yet delivered to the request's callback.
  SequenceDelta pending;
  bool has_pending = false;
};

struct RequestState {
  EngineRequest req;
  uint64_t arrival_order = 0;                   // FCFS within a priority
  std::vector<std::unique_ptr<Sequence>> seqs;  // seqs[0] first; the n - 1 others fork off its prompt
  bool forked = false;
  int32_t num_finished = 0;
  int32_t cached_prompt_tokens = 0;
  RequestTimes times;
  std::string error;     // non-empty: the request failed
  bool touched = false;  // in the engine's list of requests with output to emit this step
};

// Seconds on the steady clock (RequestTimes).
inline double engine_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The generator seed of sequence `index` of a request: the request's seed for sequence 0 (so n = 1
// matches Sampler(seed)), a splitmix64-derived one for the others, so the n samples differ but each is
// reproducible.
uint64_t derive_sequence_seed(uint64_t seed, int32_t index);

}  // namespace inferx
