// How a model splits over tensor-parallel ranks (the plan) and each rank's view of the weight file (a
// TensorSource of slices under the original names), see tensor_parallel.h.
#include <cstring>
#include <map>

#include "core/error.h"
#include "model/tensor_parallel.h"

namespace inferx {

int64_t TensorParallelPlan::first_kv_head(int rank) const {
  return kv_replicated ? rank / ranks_per_kv_head : rank * kv_heads_per_rank;
}

ModelConfig TensorParallelPlan::rank_config(const ModelConfig& full) const {
  ModelConfig c = full;
  c.num_heads = heads_per_rank;
  c.num_kv_heads = kv_heads_per_rank;
  c.intermediate_size = intermediate_per_rank;
  c.vocab_size = vocab_per_rank;
  return c;
}

TensorParallelPlan plan_tensor_parallel(const ModelConfig& c, int size) {
  INFERX_CHECK(size >= 1 && size <= 64, "--tensor-parallel-size must be in [1, 64], got {}", size);
  TensorParallelPlan p;
  p.size = size;
  INFERX_CHECK(c.num_heads % size == 0,
               "--tensor-parallel-size {}: the model's {} attention heads do not split evenly over {} ranks "
               "(use a size that divides {})",
               size, c.num_heads, size, c.num_heads);
  p.heads_per_rank = c.num_heads / size;
  if (c.num_kv_heads % size == 0) {
    p.kv_heads_per_rank = c.num_kv_heads / size;
  } else {
    // More ranks than KV heads: each KV head is replicated on size / num_kv_heads consecutive ranks, whose
    // query heads all belong to its group (size divides num_heads, num_kv_heads divides both).
    INFERX_CHECK(
        size % c.num_kv_heads == 0,
        "--tensor-parallel-size {}: the model's {} KV heads neither split over {} ranks nor replicate "
        "evenly (the size must divide or be a multiple of {})",
        size, c.num_kv_heads, size, c.num_kv_heads);
    p.kv_heads_per_rank = 1;
    p.kv_replicated = true;
    p.ranks_per_kv_head = size / c.num_kv_heads;
  }
  INFERX_CHECK(
      c.intermediate_size % size == 0,
      "--tensor-parallel-size {}: the intermediate (MLP) size {} does not split evenly over {} ranks", size,
      c.intermediate_size, size);
  p.intermediate_per_rank = c.intermediate_size / size;
  p.vocab_parallel = c.vocab_size % size == 0;
  p.vocab_per_rank = p.vocab_parallel ? c.vocab_size / size : c.vocab_size;
  return p;
}

namespace {

class RankSource final : public TensorSource {
 public:
  RankSource(const TensorSource& base, int rank, int size)
      : base_(base), suffix_(fmt::format(" (tensor-parallel rank {} of {})", rank, size)), size_(size) {}

  const TensorEntry* find(std::string_view name) const override {
    if (auto it = sliced_.find(name); it != sliced_.end()) return &it->second.entry;
    return base_.find(name);
  }
  std::vector<std::string> tensor_names() const override { return base_.tensor_names(); }
  std::string describe() const override { return base_.describe() + suffix_; }

  // Rows [begin, begin + count) of a matrix [rows, cols] (column-parallel weights, vocabulary rows): a
  // view into the file, every format stores rows whole.
  void rows(const std::string& name, int64_t begin, int64_t count) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;                                         // the loader reports what is missing
    if (e->shape.size() != 2 || begin + count > e->shape[0]) return;  // the loader reports the shape
    const int64_t rb = row_bytes(e->dtype, e->shape[1]);
    TensorEntry& s = add(*e, {count, e->shape[1]});
    s.data = e->data + begin * rb;
    s.nbytes = static_cast<uint64_t>(count * rb);
  }

  // Elements [begin, begin + count) of a vector [n] (or [1, n]): column-parallel biases.
  void elements(const std::string& name, int64_t begin, int64_t count) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;
    const int64_t n = e->shape.empty() ? 0 : e->shape.back();
    if (e->shape.size() > 2 || (e->shape.size() == 2 && e->shape[0] != 1) || begin + count > n) return;
    check_blocks(*e, begin, count);
    TensorEntry& s = add(*e, {count});
    s.data = e->data + row_bytes(e->dtype, begin);
    s.nbytes = static_cast<uint64_t>(row_bytes(e->dtype, count));
  }

  // Columns [begin, begin + count) of a matrix [rows, cols] (row-parallel o/down): copied, on block
  // boundaries of a block-quantized format.
  void cols(const std::string& name, int64_t begin, int64_t count) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;
    if (e->shape.size() != 2 || begin + count > e->shape[1]) return;
    check_blocks(*e, begin, count);
    const int64_t rows = e->shape[0], src_rb = row_bytes(e->dtype, e->shape[1]);
    const int64_t offset = row_bytes(e->dtype, begin), rb = row_bytes(e->dtype, count);
    Slice& slice = sliced_[e->name];
    slice.owned.resize(static_cast<size_t>(rows * rb));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(slice.owned.data() + r * rb, e->data + r * src_rb + offset, static_cast<size_t>(rb));
    TensorEntry& s = add(*e, {rows, count});
    s.data = slice.owned.data();
    s.nbytes = slice.owned.size();
  }

 private:
  struct Slice {
    TensorEntry entry;
    std::vector<uint8_t> owned;  // column slices only
  };

  const TensorEntry* source_entry(const std::string& name) const {
    const TensorEntry* e = base_.find(name);
    if (e != nullptr)
      INFERX_CHECK(e->data != nullptr, "{}: tensor '{}' has no host data to split over tensor-parallel ranks",
                   base_.describe(), name);
    return e;
  }

  void check_blocks(const TensorEntry& e, int64_t begin, int64_t count) const {
    const int64_t block = dtype_info(e.dtype).block_elems;
    INFERX_CHECK(
        begin % block == 0 && count % block == 0,
        "{}: tensor '{}' is {}, stored in blocks of {} columns; --tensor-parallel-size {} gives each "
        "rank {} of its input columns, which cuts a block (use a size whose per-rank share is a "
        "multiple of {}, or a format with smaller blocks)",
        e.file, e.name, dtype_name(e.dtype), block, size_, count, block);
  }

  TensorEntry& add(const TensorEntry& e, std::vector<int64_t> shape) {
    TensorEntry& s = sliced_[e.name].entry;
    s.name = e.name;
    s.dtype = e.dtype;
    s.shape = std::move(shape);
    s.file = e.file + suffix_;
    return s;
  }

  const TensorSource& base_;
  std::string suffix_;
  int size_;
  std::map<std::string, Slice, std::less<>> sliced_;
};

}  // namespace

std::unique_ptr<TensorSource> make_rank_source(const TensorSource& base, const ModelConfig& c,
                                               WeightNaming naming, const TensorParallelPlan& p, int rank) {
  auto src = std::make_unique<RankSource>(base, rank, p.size);
  const TensorNames& names = tensor_names(naming);
  const int64_t hd = c.head_dim;
  const int64_t q0 = p.first_head(rank) * hd, qn = p.heads_per_rank * hd;
  const int64_t kv0 = p.first_kv_head(rank) * hd, kvn = p.kv_heads_per_rank * hd;
  const int64_t f0 = rank * p.intermediate_per_rank, fn = p.intermediate_per_rank;
  if (p.vocab_parallel) {
    const int64_t v0 = p.first_vocab_row(rank), vn = p.vocab_per_rank;
    src->rows(names.token_embedding, v0, vn);
    if (!names.lm_head.empty()) src->rows(names.lm_head, v0, vn);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto N = [&](const std::string& pattern) { return layer_tensor_name(pattern, i); };
    src->rows(N(names.q), q0, qn);
    src->rows(N(names.k), kv0, kvn);
    src->rows(N(names.v), kv0, kvn);
    src->cols(N(names.o), q0, qn);
    if (c.attention_bias) {
      src->elements(N(names.q_bias), q0, qn);
      src->elements(N(names.k_bias), kv0, kvn);
      src->elements(N(names.v_bias), kv0, kvn);
    }
    src->rows(N(names.gate), f0, fn);
    src->rows(N(names.up), f0, fn);
    src->cols(N(names.down), f0, fn);
  }
  return src;
}

}  // namespace inferx
