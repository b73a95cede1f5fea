#include "formats/model_config.h"

#include "core/error.h"

namespace inferx {

void ModelConfig::validate(const std::string& source) const {
  // Bounds far above any real model but low enough that products of them cannot overflow int64.
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  auto positive = [&](const char* name, int64_t v, int64_t max) {
    INFERX_CHECK(v > 0 && v <= max, "{}: {} = {} is out of range (1..{})", source, name, v, max);
  };
  INFERX_CHECK(!architecture.empty(), "{}: architecture is not set", source);
  positive("vocab_size", vocab_size, int64_t{1} << 24);
  positive("hidden_size", hidden_size, kMaxDim);
  positive("intermediate_size", intermediate_size, kMaxDim * 4);
  positive("num_layers", num_layers, 4096);
  positive("num_heads", num_heads, 4096);
  positive("num_kv_heads", num_kv_heads, 4096);
  positive("head_dim", head_dim, 4096);
  positive("max_position_embeddings", max_position_embeddings, int64_t{1} << 26);
  INFERX_CHECK(num_heads % num_kv_heads == 0, "{}: num_heads {} is not a multiple of num_kv_heads {}", source,
               num_heads, num_kv_heads);
  INFERX_CHECK(head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", source, head_dim);
  INFERX_CHECK(rms_norm_eps > 0 && rms_norm_eps < 1, "{}: rms_norm_eps {} is out of range", source,
               rms_norm_eps);
  INFERX_CHECK(rope_theta > 0, "{}: rope_theta {} must be positive", source, rope_theta);
  INFERX_CHECK(sliding_window >= 0, "{}: sliding_window {} must not be negative", source, sliding_window);
  if (rope_scaling.kind != RopeScaling::Kind::None)
    INFERX_CHECK(rope_scaling.factor >= 1, "{}: rope_scaling factor {} must be >= 1", source,
                 rope_scaling.factor);
}

}  // namespace inferx
