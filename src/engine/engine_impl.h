#pragma once
// Engine::Impl, the engine thread's state and steps (engine.cpp: the loop, requests, tokens, output;
// overlapped_steps.cpp: decode steps launched before the previous step's tokens reach the host). Private to
// src/engine.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/thread_pool.h"
#include "engine/batch_builder.h"
#include "engine/batch_sampler.h"
#include "engine/block_pool.h"
#include "engine/decode_graphs.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/step_profile.h"
#include "engine/step_sampler.h"
#include "inferx/engine.h"
#include "model/model.h"

namespace inferx {

struct Engine::Impl {
  Impl(Model& m, const Tokenizer* tok, const EngineConfig& c);

  // Engine-thread state ------------------------------------------------------------------------------
  Model& model;
  const Tokenizer* tokenizer;
  EngineConfig config;
  int64_t vocab = 0;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<BatchBuilder> builder;
  std::unique_ptr<ThreadPool> sampler_pool;     // host-side sampling of large batches (null: one thread)
  std::unique_ptr<StepSampler> step_sampler;    // device sampling where the backend and request allow
  std::unique_ptr<DecodeGraphs> decode_graphs;  // null: every step eager
  double warm_up_seconds = 0;                   // EngineConfig::warm_up's run at construction
  bool defer_emit = false;  // GPU: emit a step's outputs while the next step runs on the device
  std::vector<SampledToken> sampled;
  // Overlapped decode steps (EngineConfig::async_decode): the step launched but not collected yet.
  struct InFlight {
    InFlight(const SchedulerOutput& plan, int sampling_slot)
        : out(plan),
          rows(plan.seqs.size()),
          num_rows(static_cast<int64_t>(plan.seqs.size())),
          slot(sampling_slot) {
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
    }
    SchedulerOutput out;        // its sequences (a copy of the scheduler's plan), every row a sampled decode
    std::vector<int32_t> rows;  // out.seqs[i]'s row among the step's sampled ids
    int64_t num_rows = 0;       // ids the step samples (rows whose sequence ended since are dropped)
    int slot = 0;               // the backend's sampling slot holding them
  };
  std::optional<InFlight> in_flight;
  bool async_decode = false;
  std::vector<int32_t> async_ids, prev_rows, retired_ids;
  std::vector<char> ends;
  int64_t overlapped_steps = 0;
  std::vector<int32_t> eos_ids;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests;
  std::vector<RequestState*> touched;  // requests with output to emit this step
  uint64_t next_arrival = 0;
  std::mt19937_64 seed_source{std::random_device{}()};
  int64_t prompt_tokens = 0, generation_tokens = 0, steps = 0, graph_steps = 0;
  StepProfile profile{[] {
    const char* e = std::getenv("INFERX_STEP_PROFILE");
    return e && std::strcmp(e, "1") == 0;
  }()};

  // Shared with other threads, under mu ---------------------------------------------------------------
  struct Submitted {
    EngineRequest req;
    double arrival;
  };
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Submitted> inbox;
  std::vector<std::string> aborts;
  std::unordered_set<std::string> live_ids;
  EngineStats snapshot;
  bool stop_flag = false;
  std::thread thread;
  std::mutex step_mu;  // step() from a test thread and the loop never overlap

  // Local copies of the inbox, swapped in under the lock (capacity reused).
  std::vector<Submitted> new_requests;
  std::vector<std::string> new_aborts;

  void submit(EngineRequest&& r);
  bool step();
  void loop();
  std::unique_ptr<Sequence> make_sequence(RequestState& r, int32_t index);
  void accept(Submitted&& s);
  void handle_token(SampledToken& t, double now);
  bool overlappable(const SchedulerOutput& out) const;
  // Whether `seq`, with `pending` more tokens, reaches max_tokens or max_model_len (handle_token's limits).
  bool at_length_limit(const Sequence& seq, int32_t pending) const {
    return seq.num_generated() + pending >= seq.request->req.params.max_tokens ||
           static_cast<int64_t>(seq.tokens.size()) + pending >= config.max_model_len;
  }
  static void drop_finished(InFlight& f);
  bool retire(InFlight& f);
  bool step_overlapped();
  void finish(Sequence& seq, FinishReason reason, double now);
  // EngineConfig::warm_up: the step sizes (engine/warm_up.h), then every decode graph bucket.
  void warm_up(int32_t scratch_block);
  void abort_request(RequestState& r, const std::string& error);
  void fail_step(std::initializer_list<const SchedulerOutput*> outs, const std::exception& e);
  void touch(RequestState& r);
  void emit();
  void publish_stats();
  bool is_eos(int32_t t) const { return std::find(eos_ids.begin(), eos_ids.end(), t) != eos_ids.end(); }
};

}  // namespace inferx
