// Overlapped decode steps (EngineConfig::async_decode; docs/architecture.md "Overlapped decode steps"): a
// padded decode step whose rows all sample on the device is left in flight, and the next Engine::Impl::step
// plans and launches the step after it (Scheduler::schedule_after) before collecting it.
#include "core/error.h"
#include "engine/engine_impl.h"

namespace inferx {

bool Engine::Impl::overlappable(const SchedulerOutput& out) const {
  if (!async_decode || !step_sampler->can_sample_async(out)) return false;
  for (const ScheduledSequence& s : out.seqs) {
    // A request's first token forks its n - 1 other sequences (handle_token): that step is collected first.
    if (!s.seq->request->forked) return false;
  }
  return true;
}

// A step in flight that nothing wants any more (every sequence ended or was aborted) still runs on the
// device, and its upload may not yet have read its host metadata copy, which the step after next rewrites
// without a wait (the two copies alternate on the assumption that a step is waited for before its copy is
// reused): wait for it before letting it go. False when that wait failed (the failure is handled).
bool Engine::Impl::retire(InFlight& f) {
  try {
    step_sampler->collect_async(f.slot, f.num_rows, retired_ids);
  } catch (const std::exception& e) {
    fail_step({&f.out}, e);
    return false;
  }
  return true;
}

void Engine::Impl::drop_finished(InFlight& f) {
  size_t kept = 0;
  for (size_t i = 0; i < f.out.seqs.size(); ++i) {
    if (f.out.seqs[i].seq->finished()) continue;
    f.out.seqs[kept] = f.out.seqs[i];
    f.rows[kept] = f.rows[i];
    ++kept;
  }
  f.out.seqs.resize(kept);
  f.rows.resize(kept);
  f.out.num_tokens = static_cast<int32_t>(kept);
}

// Step N is in flight (launched, its sampling queued). Plans and launches step N + 1 from N's plan, its
// input ids gathered on the device from N's sampling slot, and only then waits for N's ids and handles
// them; N + 1 stays in flight. Where N + 1 cannot be planned without N's tokens (Scheduler::schedule_after),
// N is collected alone and the next step() schedules as usual.
bool Engine::Impl::step_overlapped() {
  InFlight prev = std::move(*in_flight);
  in_flight.reset();
  std::optional<InFlight> next;
  bool next_sampling = false;  // next's sampling was queued (a failure must wait for it too)
  try {
    ends.assign(prev.out.seqs.size(), 0);
    // A sequence the token on its way brings to its length limit is left out of the next step.
    for (size_t i = 0; i < ends.size(); ++i) ends[i] = at_length_limit(*prev.out.seqs[i].seq, 1);
    const SchedulerOutput* plan = scheduler->schedule_after(prev.out, ends);
    profile.mark(StepProfile::kSchedule);
    if (plan) {
      INFERX_CHECK(decode_graphs->accepts(*plan), "engine: an overlapped step the decode graphs refuse");
      prev_rows.clear();
      for (size_t i = 0; i < ends.size(); ++i) {
        if (!ends[i]) prev_rows.push_back(prev.rows[i]);
      }
      next.emplace(*plan, prev.slot ^ 1);  // prev's ids stay in prev's slot until the gather reads them
      const SampledTokenSource src{prev.slot, &prev_rows};
      const Tensor logits = decode_graphs->run(*plan, &src);
      ++graph_steps;
      step_sampler->sample_async(*plan, logits, next->slot, /*pending=*/1);
      next_sampling = true;
      ++steps;
      ++overlapped_steps;
    }
    profile.mark(StepProfile::kLaunch);
    if (defer_emit) emit();
    profile.mark(StepProfile::kEmitOverlapped);
    step_sampler->collect_async(prev.slot, prev.num_rows, async_ids);
    profile.mark(StepProfile::kSample);
  } catch (const std::exception& e) {
    // Neither step is wanted now, but both may still run on the device: wait for them before their slots
    // are used again (retire's reason), ignoring what the wait reports - the step has failed already.
    for (InFlight* f : {&prev, next_sampling ? &*next : nullptr}) {
      try {
        if (f) step_sampler->collect_async(f->slot, f->num_rows, retired_ids);
      } catch (const std::exception&) {
      }
    }
    fail_step({&prev.out, next ? &next->out : nullptr}, e);
    return true;
  }
  const double done = engine_now();
  sampled.resize(prev.out.seqs.size());
  for (size_t i = 0; i < prev.out.seqs.size(); ++i) {
    sampled[i] = SampledToken{};
    sampled[i].seq = prev.out.seqs[i].seq;
    sampled[i].token = async_ids[static_cast<size_t>(prev.rows[i])];
  }
  for (SampledToken& t : sampled) handle_token(t, done);
  if (next) {
    // Rows whose sequence ended on N's token were computed once more: their ids are never read (nor
    // counted as sampled).
    const size_t planned = next->out.seqs.size();
    drop_finished(*next);
    step_sampler->uncount_device_rows(static_cast<int64_t>(planned - next->out.seqs.size()));
    // N's tokens are appended now, so the blocks N + 1 filled hash the right tokens.
    scheduler->on_step_computed(next->out);
    if (!next->out.seqs.empty()) {
      in_flight = std::move(next);
    } else if (!retire(*next)) {
      return true;
    }
  }
  profile.mark(StepProfile::kHandle);
  if (!defer_emit || (scheduler->num_running() == 0 && scheduler->num_waiting() == 0)) emit();
  profile.mark(StepProfile::kEmitTail);
  publish_stats();
  profile.mark(StepProfile::kPublish);
  profile.end_step(StepProfile::kGraphDecode, static_cast<int64_t>(prev.out.seqs.size()));
  return true;
}

}  // namespace inferx
