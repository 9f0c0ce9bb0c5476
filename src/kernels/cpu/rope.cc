// CPU rotary position embedding (Hugging Face rotate_half layout) and the inv_freq of transformers'
// modeling_rope_utils ("default", "linear" and "llama3").
//
// Precision choice: transformers computes inv_freq on fp32 tensors with Python-float (double) scalars,
// and PyTorch casts such a scalar to fp32 before the elementwise op. We reproduce that op by op in fp32:
//   default: inv_freq = reciprocal(float(theta) ** (float(2i) / float(d)))       (Tensor.__rtruediv__ is
//            reciprocal(x) * scalar)
//   linear:  inv_freq = default / float(factor)
//   llama3:  wavelen = reciprocal(inv_freq) * float(2 pi); the thresholds old_ctx / low_ff and old_ctx /
//            high_ff are computed in double (Python) and compared in fp32; smooth = (reciprocal(wavelen) *
//            float(old_ctx) - float(low_ff)) / float(high_ff - low_ff); smoothed = (1 - smooth) * inv / factor
//            + smooth * inv.
// The one op that can differ from PyTorch by an ulp is pow (PyTorch may use a vectorised Sleef powf).
// Angles are position * inv_freq in fp32, then cos/sin in fp32, as LlamaRotaryEmbedding does.
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float base = static_cast<float>(p.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = (1.0f / std::pow(base, e)) * 1.0f;
  }
  if (p.type == "default") return inv;
  if (p.type == "linear") {  // _compute_linear_scaling_rope_parameters: inv_freq /= factor
    const float factor = static_cast<float>(p.factor);
    for (auto& f : inv) f = f / factor;
    return inv;
  }
  AERIE_CHECK(p.type == "llama3", "rope_inv_freq: unknown rope type '" << p.type << "' (default, linear, llama3)");
  const float factor = static_cast<float>(p.factor);
  const float low_ff = static_cast<float>(p.low_freq_factor);
  const float high_minus_low = static_cast<float>(p.high_freq_factor - p.low_freq_factor);
  const float old_ctx = static_cast<float>(p.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(p.original_max_position_embeddings / p.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(p.original_max_position_embeddings / p.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (auto& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    float llama = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old_ctx - low_ff) / high_minus_low;
    const float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv;
}

// Forward, for i < d/2 with c = cos(pos inv_freq[i]), s = sin(...):
//   y_i = x_i c - x_{i+d/2} s,   y_{i+d/2} = x_{i+d/2} c + x_i s   (x cos + rotate_half(x) sin).
// inverse rotates by -angle (s -> -s).
void rope_apply(float* x, const int32_t* positions, const float* inv_freq, int64_t t, int64_t nh, int64_t d,
                bool inverse) {
  const int64_t half = d / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < t; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * inv_freq[i];
      cs[i] = std::cos(ang);
      sn[i] = inverse ? -std::sin(ang) : std::sin(ang);
    }
    for (int64_t h = 0; h < nh; ++h) {
      float* xr = x + (r * nh + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float a = xr[i], b = xr[i + half];
        xr[i] = a * cs[i] - b * sn[i];
        xr[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

}  // namespace aerie::cpu
