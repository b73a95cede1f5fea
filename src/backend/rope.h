#pragma once
// RoPE inverse frequencies, shared by every backend so that all of them rotate by the same angles.
#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/model_config.h"

namespace inferx {

// inv_freq[i] for pair i of a head of `head_dim`: theta^(-2i/d) (RoFormer, eq. 15), then the
// scaling of the model: Linear divides positions by factor (folded into inv_freq here); Llama3
// follows transformers' _compute_llama3_parameters (Llama 3.1 report, section 3.3).
// freq_factors (when given, head_dim / 2 of them) divide the result.
inline std::vector<float> rope_inverse_frequencies(int64_t head_dim, float theta, const RopeScaling& s) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  constexpr double kPi = 3.14159265358979323846;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f =
        std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (s.kind == RopeScaling::Kind::Linear) {
      f /= s.factor;
    } else if (s.kind == RopeScaling::Kind::Llama3) {
      const double old_len = static_cast<double>(s.original_max_position);
      const double low_wavelen = old_len / s.low_freq_factor;
      const double high_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * kPi / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    if (!s.freq_factors.empty()) f /= s.freq_factors[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace inferx
