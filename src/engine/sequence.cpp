#include "engine/sequence.h"

namespace inferx {

const char* sequence_status_name(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::Waiting:
      return "waiting";
    case SequenceStatus::Running:
      return "running";
    case SequenceStatus::Preempted:
      return "preempted";
    case SequenceStatus::Finished:
      return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::None:
      break;
  }
  return "";
}

uint64_t derive_sequence_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace inferx
