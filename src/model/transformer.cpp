// The forward pass of every supported architecture, top to bottom (llama2.c's run.c is the model for
// readability). Fusion and device details live in the backend; the architecture differences are the
// config switches (qkv bias, q/k norm, RoPE layout and scaling, sliding window).
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace inferx {

// Per-step activations, sized for the largest batch seen so far (no allocation on the steady path).
struct Model::Workspace {
  int64_t tokens = 0, logits = 0;
  std::unique_ptr<DeviceBuffer> memory;
  Tensor x, h, q, k, v, attn, proj, gate, up, act, last, out;
  std::vector<DecodeStackLayer> stack_layers;  // Backend::decode_stack's view of the layers
};

Model::Model(Backend& backend, ModelConfig config, std::unique_ptr<TensorSource> source,
             std::string description)
    : backend_(backend),
      config_(std::move(config)),
      source_(std::move(source)),
      description_(std::move(description)) {
  const char* all_rows = std::getenv("INFERX_LAST_LAYER_ALL_ROWS");
  last_layer_logit_rows_only_ = all_rows == nullptr || std::strcmp(all_rows, "1") != 0;
}

Model::~Model() = default;

int64_t Model::weight_bytes_per_token() const {
  if (tp_) return tp_->weight_bytes_per_token();  // every rank's share
  // Quantized layers count their stored bytes (codes, scales, zero points), as the kernels read them.
  auto bytes = [](const Tensor& t) { return t.empty() ? int64_t{0} : t.nbytes(); };
  auto lin = [&](const Linear& l) {
    return bytes(l.weight) + bytes(l.bias) + bytes(l.scale) + bytes(l.zero);
  };
  int64_t total = lin(weights_.lm_head) + weights_.final_norm.nbytes();
  for (const LayerWeights& l : weights_.layers) {
    total += lin(l.q) + lin(l.k) + lin(l.v) + lin(l.o) + lin(l.gate) + lin(l.up) + lin(l.down);
    total += l.attn_norm.nbytes() + l.ffn_norm.nbytes();
  }
  return total;
}

void Model::ensure_workspace(int64_t num_tokens, int64_t num_logits) {
  if (workspace_ && workspace_->tokens >= num_tokens && workspace_->logits >= num_logits) return;
  auto ws = std::make_unique<Workspace>();
  ws->tokens = std::max<int64_t>(num_tokens, workspace_ ? workspace_->tokens : 0);
  ws->logits = std::max<int64_t>(num_logits, workspace_ ? workspace_->logits : 0);
  const ModelConfig& c = config_;
  const int64_t T = ws->tokens, D = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  struct Slot {
    Tensor* t;
    int64_t rows, cols;
  };
  const Slot slots[] = {{&ws->x, T, D},
                        {&ws->h, T, D},
                        {&ws->q, T, qd},
                        {&ws->k, T, kvd},
                        {&ws->v, T, kvd},
                        {&ws->attn, T, qd},
                        {&ws->proj, T, D},
                        {&ws->gate, T, F},
                        {&ws->up, T, F},
                        {&ws->act, T, F},
                        {&ws->last, ws->logits, D},
                        {&ws->out, ws->logits, c.vocab_size}};
  size_t total = 0;
  for (const Slot& s : slots) total += static_cast<size_t>(s.rows * s.cols) * 4 + 64;
  ws->memory = backend_.allocate(total);
  char* p = static_cast<char*>(ws->memory->data());
  for (const Slot& s : slots) {
    *s.t = Tensor(DType::F32, {s.rows, s.cols}, p, backend_.device());
    p += (static_cast<size_t>(s.rows * s.cols) * 4 + 63) / 64 * 64;
  }
  workspace_ = std::move(ws);
}

Tensor Model::forward(const BatchView& batch, KvCache& cache) {
  if (tp_) return tp_->forward(batch, cache);  // runs each rank's replica of this function
  const ModelConfig& c = config_;
  const int64_t T = batch.num_tokens;
  INFERX_CHECK(T > 0, "forward: empty batch");
  ensure_workspace(T, batch.num_logits);
  Workspace& w = *workspace_;
  // Views of exactly T rows.
  Tensor x = w.x.rows_view(0, T), h = w.h.rows_view(0, T), q = w.q.rows_view(0, T), k = w.k.rows_view(0, T),
         v = w.v.rows_view(0, T), attn = w.attn.rows_view(0, T), proj = w.proj.rows_view(0, T),
         gate = w.gate.rows_view(0, T), up = w.up.rows_view(0, T), act = w.act.rows_view(0, T);

  const RopeParams rope{c.head_dim, c.rope_theta, c.rope_layout, c.rope_scaling};
  const AttentionParams ap{c.num_heads, c.num_kv_heads, c.head_dim,
                           1.0f / std::sqrt(static_cast<float>(c.head_dim)), c.sliding_window};

  if (T == 1 && batch.num_logits == 1 && !rank_ && !c.qk_norm) {
    // One token of one sequence: the whole step as one fused program where the backend has one.
    Tensor out = w.out.rows_view(0, 1);
    if (decode_stack(batch, cache, rope, ap, x, out)) return out;
  }
  if (rank_) {
    rank_->embedding(weights_.token_embedding, batch, x);  // tensor parallel: this rank's vocabulary rows
  } else {
    backend_.embedding(weights_.token_embedding, batch.token_ids, T, x);
  }
  // One row that is also the row that needs logits: the final norm runs with the vocabulary projection
  // (no gather).
  const bool final_with_logits = T == 1 && batch.num_logits == 1;
  // The last layer's o projection and MLP matter only for the rows whose logits are asked for (a prefill
  // chunk's last token): once its attention has run (every row's keys and values are in the cache), those
  // rows of the attention output and of the residual stream are gathered and the layer finishes on them (for
  // a 32-layer model about 2% of a prefill step's products, from the shapes; measured: an 8192-token FP8
  // prefill 1.6% shorter on an H100). Only when that leaves out at least a product tile of rows: otherwise
  // the gathers cost launches and save nothing (500 decodes and a 2-token chunk). Steps with decode rows
  // narrow only where Backend::narrows_mixed_steps (the CPU, and CUDA since its startup warm-up: before it
  // the narrowed rows decided a GEMM row bucket's algorithm that the decode steps then ran slower with -
  // docs/benchmarks.md 2026-12-05).
  const int64_t n_logits = batch.num_logits;
  const bool narrow_last = last_layer_logit_rows_only_ && !rank_ && n_logits > 0 &&
                           (batch.num_decode_prefix == 0 || backend_.narrows_mixed_steps()) &&
                           T - n_logits >= std::max<int64_t>(1, backend_.product_row_tile());
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const LayerWeights& l = weights_.layers[i];
    // Attention block: x += o(attention(rope(q), rope(k), v)) over the pre-normed input.
    const Tensor* mlp_out = i == 0 ? nullptr : &proj;  // the previous MLP output joins the residual here
    if (!l.qkv.weight.empty()) {
      Tensor* qkv[] = {&q, &k, &v};
      backend_.norm_matmul_split(x, mlp_out, l.attn_norm, c.rms_norm_eps, h, l.qkv, qkv);
    } else {
      backend_.pre_norm(x, mlp_out, l.attn_norm, c.rms_norm_eps, h);
      backend_.matmul(h, l.q, q);
      backend_.matmul(h, l.k, k);
      backend_.matmul(h, l.v, v);
    }
    if (c.qk_norm) {
      backend_.head_rmsnorm(q, c.head_dim, l.q_norm, c.rms_norm_eps);
      backend_.head_rmsnorm(k, c.head_dim, l.k_norm, c.rms_norm_eps);
    }
    KvCacheLayer& layer_cache = cache.layer(static_cast<int64_t>(i));
    backend_.rope_attention(q, k, v, batch, rope, layer_cache, ap, attn);
    if (narrow_last && i + 1 == weights_.layers.size()) {
      // q is free once the attention has read it; `last` becomes the residual stream's rows.
      Tensor attn_rows = q.rows_view(0, n_logits), x_rows = w.last.rows_view(0, n_logits);
      backend_.gather_rows(attn, batch.logits_rows, n_logits, attn_rows);
      backend_.gather_rows(x, batch.logits_rows, n_logits, x_rows);
      attn = attn_rows;
      x = x_rows;
      h = h.rows_view(0, n_logits);
      proj = proj.rows_view(0, n_logits);
      gate = gate.rows_view(0, n_logits);
      up = up.rows_view(0, n_logits);
      act = act.rows_view(0, n_logits);
    }
    if (rank_) {
      backend_.matmul(attn, l.o, proj);
      rank_->all_reduce_sum(proj);  // tensor parallel: o is row-parallel (summed before the residual add)
    } else {
      backend_.matmul_before_norm(attn, l.o, proj, x, l.ffn_norm, c.rms_norm_eps);
    }
    // MLP block: x += down(silu(gate(h)) * up(h)).
    // The next norm: the next layer's, or the final one when it runs with the vocabulary projection.
    const bool last = i + 1 == weights_.layers.size();
    const Tensor* next_norm = !last               ? &weights_.layers[i + 1].attn_norm
                              : final_with_logits ? &weights_.final_norm
                                                  : nullptr;
    if (!l.gate_up.weight.empty() && !rank_) {
      backend_.norm_mlp(x, &proj, l.ffn_norm, c.rms_norm_eps, h, l.gate_up, gate, up, act, l.down, proj,
                        next_norm);
      continue;
    }
    if (!l.gate_up.weight.empty()) {
      backend_.norm_matmul_silu_mul(x, &proj, l.ffn_norm, c.rms_norm_eps, h, l.gate_up, gate, up, act);
    } else {
      backend_.pre_norm(x, &proj, l.ffn_norm, c.rms_norm_eps, h);
      backend_.matmul(h, l.gate, gate);
      backend_.matmul(h, l.up, up);
      backend_.silu_mul(gate, up, act);
    }
    if (rank_) {
      backend_.matmul(act, l.down, proj);
      rank_->all_reduce_sum(proj);  // tensor parallel: down is row-parallel
    } else if (next_norm) {
      backend_.matmul_before_norm(act, l.down, proj, x, *next_norm, c.rms_norm_eps);
    } else {
      backend_.matmul(act, l.down, proj);
    }
  }
  // Only the rows that need logits go through the final norm and the vocabulary projection.
  Tensor last = w.last.rows_view(0, batch.num_logits), out = w.out.rows_view(0, batch.num_logits);
  if (final_with_logits) {
    Tensor* logits[] = {&out};
    backend_.norm_matmul_split(x, &proj, weights_.final_norm, c.rms_norm_eps, h, weights_.lm_head, logits);
    return out;
  }
  backend_.add_rmsnorm(x, proj, weights_.final_norm, c.rms_norm_eps, h);
  // Narrowed, h holds the logits rows already, in order.
  if (!narrow_last) backend_.gather_rows(h, batch.logits_rows, batch.num_logits, last);
  backend_.matmul(narrow_last ? h : last, weights_.lm_head, out);
  return out;
}

bool Model::decode_stack(const BatchView& batch, KvCache& cache, const RopeParams& rope,
                         const AttentionParams& ap, Tensor& x, Tensor& logits) {
  std::vector<DecodeStackLayer>& layers = workspace_->stack_layers;
  layers.resize(weights_.layers.size());
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const LayerWeights& l = weights_.layers[i];
    if (l.qkv.weight.empty() || l.gate_up.weight.empty()) return false;  // not fused at load
    layers[i] = {
        &l.attn_norm, &l.ffn_norm, &l.qkv, &l.o, &l.gate_up, &l.down, &cache.layer(static_cast<int64_t>(i))};
  }
  DecodeStack stack;
  stack.token_embedding = &weights_.token_embedding;
  stack.layers = layers;
  stack.final_norm = &weights_.final_norm;
  stack.lm_head = &weights_.lm_head;
  stack.rms_norm_eps = config_.rms_norm_eps;
  return backend_.decode_stack(stack, batch, rope, ap, x, logits);
}

}  // namespace inferx
