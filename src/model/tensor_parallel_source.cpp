// How a model splits over tensor-parallel ranks (the plan) and each rank's view of the weight file (a
// TensorSource of slices under the original names), see tensor_parallel.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

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
  // A dummy tensor's slice is generated as the block of the whole tensor's values (core/random_fill.h).
  const RandomFill* random_fill(std::string_view name) const override {
    if (auto it = sliced_.find(name); it != sliced_.end())
      return it->second.fill ? &*it->second.fill : nullptr;
    return base_.random_fill(name);
  }

  // Rows [begin, begin + count) of a matrix [rows, cols] (column-parallel weights, vocabulary rows): a
  // view into the file, every format stores rows whole.
  void rows(const std::string& name, int64_t begin, int64_t count) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;                                         // the loader reports what is missing
    if (e->shape.size() != 2 || begin + count > e->shape[0]) return;  // the loader reports the shape
    const int64_t rb = row_bytes(e->dtype, e->shape[1]);
    TensorEntry& s = add(*e, {count, e->shape[1]});
    s.data = e->data ? e->data + begin * rb : nullptr;
    s.nbytes = static_cast<uint64_t>(count * rb);
    slice_fill(*e, e->shape[1], begin, 0);
  }

  // Elements [begin, begin + count) of a vector [n] (or [1, n]): column-parallel biases.
  void elements(const std::string& name, int64_t begin, int64_t count) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;
    const int64_t n = e->shape.empty() ? 0 : e->shape.back();
    if (e->shape.size() > 2 || (e->shape.size() == 2 && e->shape[0] != 1) || begin + count > n) return;
    check_blocks(*e, begin, count);
    TensorEntry& s = add(*e, {count});
    s.data = e->data ? e->data + row_bytes(e->dtype, begin) : nullptr;
    s.nbytes = static_cast<uint64_t>(row_bytes(e->dtype, count));
    slice_fill(*e, n, 0, begin);
  }

  // GPTQ's g_idx [k] of a row-parallel weight, rows [begin, begin + count) of its input: only the plain
  // order (g_idx[i] = i / group, desc_act false) splits, rebased to the rank's groups; act-order (a
  // permutation of the rows over the groups) would need every group's scales on every rank.
  void group_index(const std::string& name, int64_t begin, int64_t count, int64_t group) {
    const TensorEntry* e = source_entry(name);
    if (e == nullptr) return;
    if (e->dtype != DType::I32 || e->shape.size() != 1 || begin + count > e->shape[0]) return;
    const auto* g = reinterpret_cast<const int32_t*>(e->data);
    for (int64_t i = 0; i < e->shape[0]; ++i)
      INFERX_CHECK(g[i] == i / group,
                   "{}: '{}' orders the input rows by activation (GPTQ desc_act): its groups span the whole "
                   "input, so the row-parallel split of --tensor-parallel-size {} cannot keep them (use a "
                   "checkpoint without desc_act, or --tensor-parallel-size 1)",
                   e->file, e->name, size_);
    Slice& slice = sliced_[e->name];
    slice.owned.resize(static_cast<size_t>(count) * 4);
    auto* out = reinterpret_cast<int32_t*>(slice.owned.data());
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(i / group);
    TensorEntry& s = add(*e, {count});
    s.data = slice.owned.data();
    s.nbytes = slice.owned.size();
  }

  const TensorEntry* entry(const std::string& name) const { return base_.find(name); }

  // Requires begin and count to be multiples of `unit` (a quantization group or packing unit of `what`).
  void require_units(const std::string& name, int64_t begin, int64_t count, int64_t unit,
                     const char* what) const {
    INFERX_CHECK(
        begin % unit == 0 && count % unit == 0,
        "{}: '{}' is quantized in {} of {} input columns; --tensor-parallel-size {} gives each rank {} "
        "of them, which cuts one (use a size whose per-rank share is a multiple of {})",
        base_.describe(), name, what, unit, size_, count, unit);
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
    if (e->data == nullptr) {  // generated on the device: nothing to copy
      TensorEntry& s = add(*e, {rows, count});
      s.nbytes = static_cast<uint64_t>(rows * rb);
      slice_fill(*e, e->shape[1], 0, begin);
      return;
    }
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
    std::vector<uint8_t> owned;      // column slices only
    std::optional<RandomFill> fill;  // a dummy tensor's slice: its block of the whole tensor's values
  };

  const TensorEntry* source_entry(const std::string& name) const {
    const TensorEntry* e = base_.find(name);
    if (e != nullptr)
      INFERX_CHECK(e->data != nullptr || base_.random_fill(name) != nullptr,
                   "{}: tensor '{}' has no host data to split over tensor-parallel ranks", base_.describe(),
                   name);
    return e;
  }

  // The slice at (r0, c0) of a tensor of `cols` columns, when the tensor is generated on the device.
  void slice_fill(const TensorEntry& e, int64_t cols, int64_t r0, int64_t c0) {
    if (const RandomFill* f = base_.random_fill(e.name)) sliced_[e.name].fill = f->block(cols, r0, c0);
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

// A column-parallel linear [n, k] (q / k / v / gate / up, the vocabulary-parallel lm_head): output rows
// [begin, begin + count) of the weight and of whatever a pre-quantized checkpoint stores beside it
// (quantized_linear.cpp reads the same names): FP8 / InferX INT4 per-row scales and zero points; AWQ
// (qweight [k, n/8], qzeros [k/g, n/8], scales [k/g, n]) and GPTQ (qweight [k/8, n], same qzeros and
// scales, g_idx [k] unchanged) by their output columns.
void split_output(RankSource& src, const std::string& weight_name, int64_t n, int64_t begin, int64_t count) {
  const std::string p = linear_prefix(weight_name);
  src.rows(weight_name, begin, count);
  if (const TensorEntry* s = src.entry(p + ".weight_scale"); s != nullptr && s->view().numel() > 1) {
    if (s->shape.size() == 1) {
      src.elements(p + ".weight_scale", begin, count);  // FP8 per channel [n]
    } else {
      src.rows(p + ".weight_scale", begin, count);  // FP8 [n, 1], InferX INT4 [n, groups]
    }
  }
  src.rows(p + ".weight_zero_point", begin, count);
  if (const TensorEntry* q = src.entry(p + ".qweight")) {
    src.require_units(p + ".qweight", begin, count, 8, "words of 8 output columns");
    const bool awq = q->shape.size() == 2 && q->shape[1] * 8 == n;
    if (awq) {
      src.cols(p + ".qweight", begin / 8, count / 8);
    } else {
      src.cols(p + ".qweight", begin, count);
    }
    src.cols(p + ".qzeros", begin / 8, count / 8);
    src.cols(p + ".scales", begin, count);
  }
}

// A row-parallel linear [n, k] (o / down): input columns [begin, begin + count) of the weight and of its
// pre-quantized companions, on their group boundaries: FP8 per-output-channel or per-tensor scales stay
// whole; InferX INT4 (U8 [n, k/2], two columns a byte in runs of 32) and its [n, k/g] scales and zero
// points by columns; AWQ / GPTQ by their input rows (GPTQ's g_idx rebased, act-order refused).
void split_input(RankSource& src, const std::string& weight_name, int64_t k, int64_t begin, int64_t count) {
  const std::string p = linear_prefix(weight_name);
  const TensorEntry* w = src.entry(weight_name);
  if (w != nullptr && w->dtype == DType::U8 && w->shape.size() == 2 && w->shape[1] * 2 == k) {
    src.require_units(weight_name, begin, count, 32, "runs");
    src.cols(weight_name, begin / 2, count / 2);
    if (const TensorEntry* s = src.entry(p + ".weight_scale"); s != nullptr && s->shape.size() == 2) {
      const int64_t group = k / std::max<int64_t>(1, s->shape[1]);
      src.require_units(weight_name, begin, count, group, "groups");
      src.cols(p + ".weight_scale", begin / group, count / group);
      src.cols(p + ".weight_zero_point", begin / group, count / group);
    }
    return;
  }
  src.cols(weight_name, begin, count);
  const TensorEntry* q = src.entry(p + ".qweight");
  if (q == nullptr) return;
  const TensorEntry* scales = src.entry(p + ".scales");
  const int64_t groups = scales != nullptr && scales->shape.size() == 2 ? scales->shape[0] : 0;
  INFERX_CHECK(groups > 0 && k % groups == 0, "{}: '{}.scales' must be [in / group, out]", src.describe(), p);
  const int64_t group = k / groups;
  src.require_units(p + ".qweight", begin, count, group, "groups");
  const bool awq = q->shape.size() == 2 && q->shape[0] == k;
  if (awq) {
    src.rows(p + ".qweight", begin, count);
  } else {
    src.require_units(p + ".qweight", begin, count, 8, "words of 8 input rows");
    src.rows(p + ".qweight", begin / 8, count / 8);
    src.group_index(p + ".g_idx", begin, count, group);
  }
  src.rows(p + ".qzeros", begin / group, count / group);
  src.rows(p + ".scales", begin / group, count / group);
}

}  // namespace

std::unique_ptr<TensorSource> make_rank_source(const TensorSource& base, const ModelConfig& c,
                                               WeightNaming naming, const TensorParallelPlan& p, int rank) {
  auto src = std::make_unique<RankSource>(base, rank, p.size);
  const TensorNames& names = tensor_names(naming);
  const int64_t hd = c.head_dim;
  const int64_t q0 = p.first_head(rank) * hd, qn = p.heads_per_rank * hd;
  const int64_t kv0 = p.first_kv_head(rank) * hd, kvn = p.kv_heads_per_rank * hd;
  const int64_t f0 = rank * p.intermediate_per_rank, fn = p.intermediate_per_rank;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd, F = c.intermediate_size;
  if (p.vocab_parallel) {
    const int64_t v0 = p.first_vocab_row(rank), vn = p.vocab_per_rank;
    src->rows(names.token_embedding, v0, vn);
    if (!names.lm_head.empty()) split_output(*src, names.lm_head, c.vocab_size, v0, vn);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto N = [&](const std::string& pattern) { return layer_tensor_name(pattern, i); };
    split_output(*src, N(names.q), qd, q0, qn);
    split_output(*src, N(names.k), kvd, kv0, kvn);
    split_output(*src, N(names.v), kvd, kv0, kvn);
    split_input(*src, N(names.o), qd, q0, qn);
    if (c.attention_bias) {
      src->elements(N(names.q_bias), q0, qn);
      src->elements(N(names.k_bias), kv0, kvn);
      src->elements(N(names.v_bias), kv0, kvn);
    }
    split_output(*src, N(names.gate), F, f0, fn);
    split_output(*src, N(names.up), F, f0, fn);
    split_input(*src, N(names.down), F, f0, fn);
  }
  return src;
}

}  // namespace inferx
