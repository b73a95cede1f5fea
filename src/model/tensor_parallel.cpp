// Tensor parallelism at run time: loading the N replicas, the threads that run them in lock step, the
// vocabulary-parallel embedding and the logits gather (see tensor_parallel.h for the partitioning).
#include "model/tensor_parallel.h"

#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "model/tensor_parallel_backend.h"

namespace inferx {
namespace {

// Persistent threads for ranks 1..N-1; rank 0 runs on the caller's thread.
class RankThreads {
 public:
  RankThreads() = default;
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void start(int size) {
    for (int r = 1; r < size; ++r) threads_.emplace_back(&RankThreads::loop, this, r);
  }
  // job(rank) on every rank at once; returns when all have returned. job must not throw.
  void run(const std::function<void(int)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
  std::vector<std::thread> threads_;
};

// A buffer of at least `bytes`, grown (never shrunk) in the backend's memory.
void* grown(Backend& be, std::unique_ptr<DeviceBuffer>& buf, size_t bytes) {
  if (!buf || buf->size() < bytes) buf = be.allocate(std::max<size_t>(bytes, 64));
  return buf->data();
}

}  // namespace

// TensorParallelRank ----------------------------------------------------------------------------------

TensorParallelRank::TensorParallelRank(Backend& backend, Communicator& comm, const TensorParallelPlan& plan)
    : backend_(backend), comm_(comm), plan_(plan), rank_(comm.rank()) {}

TensorParallelRank::~TensorParallelRank() = default;

void TensorParallelRank::all_reduce_sum(Tensor& x) {
  backend_.flush();  // x complete on the stream, and changed outside the backend below
  comm_.all_reduce_sum(x);
}

void TensorParallelRank::embedding(const Tensor& table, const BatchView& batch, Tensor& x) {
  if (!plan_.vocab_parallel) {  // replicated table
    backend_.embedding(table, batch.token_ids, batch.num_tokens, x);
    return;
  }
  // Our rows for our tokens, zeros for the others'; the all-reduce adds exact zeros from the ranks that do
  // not hold a token's row.
  backend_.embedding_shard(table, batch.token_ids, batch.num_tokens, plan_.first_vocab_row(rank_), x);
  all_reduce_sum(x);
}

// TensorParallel --------------------------------------------------------------------------------------

struct TensorParallel::State {
  // Declaration order is teardown order reversed: threads stop first, backends go last.
  std::vector<std::unique_ptr<Backend>> owned_backends;  // ranks 1..N-1
  std::vector<Backend*> backends;                        // rank r's
  std::unique_ptr<Backend> primary;                      // what the top model runs on
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<TensorParallelRank>> ranks;
  std::vector<std::unique_ptr<Model>> replicas;
  // Per-step buffers: ranks 1..N-1's copies of the step's metadata block (meta[0] unused: rank 0 reads the
  // caller's), the all-gathered logits of every rank and rank 0's [num_logits, vocab] result.
  std::vector<std::unique_ptr<DeviceBuffer>> meta;
  std::vector<int32_t*> rank_meta;  // this step's metadata block of each rank (rank 0: the caller's)
  std::vector<BatchView> views;
  std::vector<std::unique_ptr<DeviceBuffer>> gathered;
  std::unique_ptr<DeviceBuffer> logits;
  TensorParallelBackend* capture = nullptr;  // primary, as the backend that records the ranks' graphs
  std::mutex error_mu;
  std::exception_ptr error;
  std::string failure;  // set once a step failed: the ranks may be out of step, no more steps run
  RankThreads threads;

  // Every rank's recordings dropped (a capture in progress ended and discarded). NCCL counts a reference
  // on a communicator for every collective a graph recorded and releases it only when the graph is
  // destroyed: ncclCommAbort and ncclCommDestroy wait for those references, so the graphs go first. A
  // graph still running is freed by CUDA when it ends (which an abort makes happen). Called on the thread
  // that began the captures (thread-local capture mode), never throws.
  void drop_recordings() {
    for (Backend* b : backends) {
      try {
        b->end_graph_capture(0, false);
        b->clear_graphs();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "warning: tensor parallel: dropping a rank's graphs: %s\n", e.what());
      }
    }
  }
  // One all-reduce and one broadcast over the whole group at load, every rank's result checked: a group that
  // cannot communicate (NCCL setup, peer access, a wrong device) fails the load - `inferx serve` at startup,
  // with the numbers - instead of the first request; and NCCL makes its first-use connections here, before
  // any step could fail half-way through one (a rank blocked in that setup is not woken by an abort).
  void check_group(int n) {
    std::vector<std::string> errors(static_cast<size_t>(n));
    threads.run([&](int r) {
      const size_t ri = static_cast<size_t>(r);
      try {
        Backend& be = *backends[ri];
        auto buf = be.allocate(2 * sizeof(float));
        float* p = static_cast<float*>(buf->data());
        const float mine[2] = {static_cast<float>(r + 1), r == 0 ? 42.0f : -1.0f};
        be.copy_to_device(p, mine, sizeof mine);
        Tensor sum(DType::F32, {1}, p, be.device()), root(DType::F32, {1}, p + 1, be.device());
        be.flush();
        comms[ri]->all_reduce_sum(sum);
        comms[ri]->broadcast(root, 0);
        float got[2] = {};
        be.copy_to_host(got, p, sizeof got);  // ordered after the collectives on the rank's stream
        const float want = static_cast<float>(n * (n + 1) / 2);
        INFERX_CHECK(
            got[0] == want && got[1] == 42.0f,
            "rank {}: the load-time check's all-reduce gave {} (expected {}) and broadcast {} (expected 42)",
            r, got[0], want, got[1]);
      } catch (const std::exception& e) {
        errors[ri] = e.what();
        comms[ri]->abort();  // no graph exists yet: wakes peers blocked in the group
      }
    });
    for (int r = 0; r < n; ++r)
      INFERX_CHECK(errors[static_cast<size_t>(r)].empty(),
                   "--tensor-parallel-size {}: the ranks cannot communicate: {}", n,
                   errors[static_cast<size_t>(r)]);
  }
  // After a failed step or a partial replay: no further steps. The recordings go, then every
  // communicator is aborted, which ends what any rank's stream still waits for in a collective that a
  // failed rank never joined.
  void fail_group(const std::string& why) {
    drop_recordings();
    for (auto& c : comms) c->abort();
    if (failure.empty()) failure = why;
  }
};

TensorParallel::TensorParallel() : s_(std::make_unique<State>()) {}

TensorParallel::~TensorParallel() {
  // The communicators are destroyed before the backends (State's order), and destroying one waits for
  // the graphs that recorded its collectives: rank 0's backend, which outlives us, and the others' drop
  // theirs here first.
  for (Backend* b : s_->backends) {
    try {
      b->synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: tensor parallel teardown: %s\n", e.what());
    }
  }
  s_->drop_recordings();
}

Backend& TensorParallel::rank_backend(int rank) const { return *s_->backends.at(static_cast<size_t>(rank)); }
Model& TensorParallel::rank_model(int rank) const { return *s_->replicas.at(static_cast<size_t>(rank)); }

int64_t TensorParallel::weight_bytes_per_token() const {
  int64_t total = 0;
  for (const auto& m : s_->replicas) total += m->weight_bytes_per_token();
  return total;
}

void TensorParallel::set_sliding_window(int64_t window) {
  for (const auto& m : s_->replicas) m->set_sliding_window(window);
}

std::unique_ptr<Model> TensorParallel::load(const std::string& spec, Backend& backend,
                                            const LoadOptions& options) {
  const int n = options.tensor_parallel_size;
  std::unique_ptr<TensorParallel> tp(new TensorParallel());
  State& s = *tp->s_;
  s.backends.push_back(&backend);
  for (int r = 1; r < n; ++r) {
    std::unique_ptr<Backend> b;
    if (options.make_rank_backend) {
      b = options.make_rank_backend(r);
    } else {
      INFERX_CHECK(backend.device() == Device::CPU,
                   "--tensor-parallel-size {}: no backend for rank {} on {} (LoadOptions::make_rank_backend)",
                   n, r, backend.name());
      b = make_cpu_backend({});
    }
    INFERX_CHECK(
        b != nullptr && b->device() == backend.device(),
        "--tensor-parallel-size {}: rank {}'s backend is not on the same kind of device as rank 0 ({})", n, r,
        backend.name());
    // One KV cache type on every rank: the pool is sized by the largest rank's bytes per block, and a rank
    // in another type would hold its heads at another precision.
    INFERX_CHECK(b->kv_cache_dtype() == backend.kv_cache_dtype(),
                 "--tensor-parallel-size {}: rank {}'s backend keeps a {} KV cache, rank 0's a {} one", n, r,
                 dtype_name(b->kv_cache_dtype()), dtype_name(backend.kv_cache_dtype()));
    s.backends.push_back(b.get());
    s.owned_backends.push_back(std::move(b));
  }
  auto primary = std::make_unique<TensorParallelBackend>(s.backends);
  s.capture = primary.get();
  // A replay that launched some ranks' graphs but not all leaves them waiting in a collective for good.
  s.capture->set_on_partial_replay([&s](const std::string& why) { s.fail_group(why); });
  s.primary = std::move(primary);

  OpenedModel opened = open_model(spec, *s.primary, options);
  Model& top = *opened.model;
  const ModelConfig& c = top.config();
  tp->plan_ = plan_tensor_parallel(c, n);
  const TensorParallelPlan& plan = tp->plan_;
  if (!plan.vocab_parallel)
    std::fprintf(
        stderr,
        "note: the vocabulary of %lld tokens does not split over %d ranks: the embedding and lm_head are "
        "replicated on every rank\n",
        static_cast<long long>(c.vocab_size), n);

  if (options.make_communicators) {
    s.comms = options.make_communicators(s.backends);
  } else {
    INFERX_CHECK(backend.device() == Device::CPU,
                 "--tensor-parallel-size {}: no communicator for {} (LoadOptions::make_communicators)", n,
                 backend.name());
    s.comms = make_cpu_communicators(n);
  }
  INFERX_CHECK(static_cast<int>(s.comms.size()) == n, "tensor parallel: {} communicators for {} ranks",
               s.comms.size(), n);
  for (int r = 0; r < n; ++r) {
    const Communicator& comm = *s.comms[static_cast<size_t>(r)];
    INFERX_CHECK(comm.rank() == r && comm.size() == n && comm.device() == backend.device(),
                 "tensor parallel: communicator {} is rank {} of {} on another device kind", r, comm.rank(),
                 comm.size());
  }

  LoadOptions rank_options = options;
  rank_options.tensor_parallel_size = 1;
  for (int r = 0; r < n; ++r) {
    Backend& be = *s.backends[static_cast<size_t>(r)];
    auto source = make_rank_source(*top.source(), c, opened.naming, plan, r);
    auto replica = std::make_unique<Model>(be, plan.rank_config(c), std::move(source),
                                           fmt::format("{} [rank {} of {}]", top.description(), r, n));
    load_weights(*replica, opened.naming, rank_options, opened.hf_quant);
    s.ranks.push_back(std::make_unique<TensorParallelRank>(be, *s.comms[static_cast<size_t>(r)], plan));
    replica->rank_ = s.ranks.back().get();
    s.replicas.push_back(std::move(replica));
  }
  s.meta.resize(static_cast<size_t>(n));
  s.views.resize(static_cast<size_t>(n));
  s.gathered.resize(static_cast<size_t>(n));
  s.threads.start(n);
  s.check_group(n);

  top.quant_plan_ = s.replicas[0]->quant_plan();
  top.description_ +=
      fmt::format(", tensor parallel over {} ranks ({} heads, {} KV heads{}, {} MLP columns{} each)", n,
                  plan.heads_per_rank, plan.kv_heads_per_rank, plan.kv_replicated ? " replicated" : "",
                  plan.intermediate_per_rank,
                  plan.vocab_parallel ? fmt::format(", {} vocabulary rows", plan.vocab_per_rank)
                                      : std::string(", replicated vocabulary"));
  top.tp_ = std::move(tp);
  return std::move(opened.model);
}

Tensor TensorParallel::forward(const BatchView& batch, KvCache& cache) {
  State& s = *s_;
  const int n = size();
  INFERX_CHECK(s.failure.empty(), "tensor parallel: no further steps after a failed one ({})", s.failure);
  INFERX_CHECK(
      cache.num_shards() == n,
      "tensor parallel: the KV cache holds {} rank caches for {} ranks (build it with KvCache(model, "
      "num_blocks, block_size))",
      cache.num_shards(), n);
  const int32_t T = batch.num_tokens, L = batch.num_logits;
  INFERX_CHECK(T > 0, "forward: empty batch");  // L may be 0: a prefill chunk that samples nothing
  Backend& be0 = *s.backends[0];
  const Device device = be0.device();

  // Every rank reads the step's metadata from its own memory: rank 0's block (BatchLayout: every builder
  // lays a step out as one block), broadcast into each rank's copy as the first collective of the step, on
  // the streams (no host copy; recorded in graphs, and an overlapped step's token ids, gathered into rank
  // 0's block on its stream, travel with it).
  const BatchLayout layout(T, batch.num_seqs, batch.max_blocks_per_seq, L);
  const size_t meta_bytes = layout.total() * sizeof(int32_t);
  const BatchView laid = layout.view(batch.token_ids);
  INFERX_CHECK(laid.positions == batch.positions && laid.query_start == batch.query_start &&
                   laid.seq_lens == batch.seq_lens && laid.block_tables == batch.block_tables &&
                   (L == 0 || laid.logits_rows == batch.logits_rows),
               "tensor parallel: the step's metadata is not one BatchLayout block (backend/batch.h)");
  std::vector<int32_t*>& rank_meta = s.rank_meta;
  rank_meta.assign(static_cast<size_t>(n), const_cast<int32_t*>(batch.token_ids));  // the root's: only read
  for (int r = 1; r < n; ++r) {
    // Grown with room to spare: a buffer that moves voids the rank's recorded graphs.
    std::unique_ptr<DeviceBuffer>& m = s.meta[static_cast<size_t>(r)];
    if (!m || m->size() < meta_bytes) m = s.backends[static_cast<size_t>(r)]->allocate(2 * meta_bytes + 256);
    rank_meta[static_cast<size_t>(r)] = static_cast<int32_t*>(m->data());
  }
  for (int r = 0; r < n; ++r) {
    BatchView v = layout.view(rank_meta[static_cast<size_t>(r)]);
    v.max_query_len = batch.max_query_len;
    v.max_seq_len = batch.max_seq_len;
    v.num_decode_prefix = batch.num_decode_prefix;
    s.views[static_cast<size_t>(r)] = v;
  }

  // The logits: each rank's [L, V/N] all-gathered into [N * L, V/N] (rank-major), then interleaved into
  // [L, V] (row l is rows r * L + l of every rank r, side by side).
  const int64_t Vr = plan_.vocab_per_rank, V = Vr * n;
  const bool gather = plan_.vocab_parallel;
  if (gather) {
    for (int r = 0; r < n; ++r)
      grown(*s.backends[static_cast<size_t>(r)], s.gathered[static_cast<size_t>(r)],
            static_cast<size_t>(n * L * Vr) * sizeof(float));
    if (L > 1) grown(be0, s.logits, static_cast<size_t>(L * V) * sizeof(float));
  }

  Tensor result;
  s.error = nullptr;
  s.threads.run([&](int r) {
    const size_t ri = static_cast<size_t>(r);
    try {
      Tensor meta(DType::I32, {static_cast<int64_t>(layout.total())}, rank_meta[ri], device);
      s.comms[ri]->broadcast(meta, 0);
      Tensor local = s.replicas[ri]->forward(s.views[ri], cache.shard(r));
      if (!gather || L == 0) {
        // Replicated lm_head: every rank computed the full logits. No logits rows: nothing to gather.
        if (r == 0) result = L == 0 ? Tensor(DType::F32, {0, gather ? V : Vr}, local.data, device) : local;
        return;
      }
      Backend& be = *s.backends[ri];
      Tensor all(DType::F32, {n * L, Vr}, s.gathered[ri]->data(), device);
      be.flush();
      s.comms[ri]->all_gather(local, all);
      if (r != 0) return;
      if (L == 1) {
        result = all.reshaped({1, V});
      } else {
        result = Tensor(DType::F32, {L, V}, s.logits->data(), device);
        be.interleave_row_blocks(all, n, result);
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(s.error_mu);
        if (!s.error) s.error = std::current_exception();  // the first failure, not the aborts it causes
      }
      // Now, so that peers blocked in a host-side collective (the CPU group; NCCL's first-use connection
      // setup) return - unless graphs may hold references to the communicator: then its abort would wait
      // for them, and only the thread that began the captures may drop them (below).
      if (!s.capture->ever_captured() || !s.comms[ri]->abort_waits_for_graphs()) s.comms[ri]->abort();
    }
  });
  if (s.error) {
    std::string why = "a rank failed";
    try {
      std::rethrow_exception(s.error);
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
    }
    // A peer's stream may wait in a collective the failed rank never joined (NCCL enqueues without
    // waiting): the group's abort ends that wait, after the recordings that would block it are gone.
    s.fail_group(why);
    std::rethrow_exception(s.error);
  }
  return result;
}

// Model members whose tensor-parallel part lives here.
void Model::set_sliding_window(int64_t window) {
  config_.sliding_window = window;
  if (tp_) tp_->set_sliding_window(window);
}

}  // namespace inferx
