// CPU rotary position embedding (Hugging Face rotate_half layout, and DeepSeek's interleaved pairs) and
// the inv_freq of transformers' modeling_rope_utils ("default", "linear", "llama3" and "yarn").
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
#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

namespace {

/// transformers' _compute_yarn_parameters, op by op: pos_freqs = float(theta) ** (float(2i) / d);
/// extrapolation = 1 / pos_freqs (the default table `inv`); interpolation = 1 / (float(factor) * pos_freqs);
/// low, high = the correction range of beta_fast, beta_slow in double (Python floats), floored/ceiled
/// when truncate, clamped to [0, d - 1]; ramp_i = clamp((float(i) - low) / (high - low), 0, 1) in fp32;
/// e_i = 1 - ramp_i; inv_freq_i = interpolation_i (1 - e_i) + extrapolation_i e_i.
std::vector<float> yarn_inv_freq(const RopeParams& p, int64_t head_dim, std::vector<float> inv) {
  const int64_t half = head_dim / 2;
  const double base = p.theta, dim = static_cast<double>(head_dim);
  const double orig = static_cast<double>(p.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(base));
  };
  double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // linear_ramp_factor's guard against a singular ramp
  const float fbase = static_cast<float>(p.theta), factor = static_cast<float>(p.factor);
  const float flow = static_cast<float>(low), span = static_cast<float>(high - low);
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(fbase, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    const float extra = inv[i], interp = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - flow) / span, 0.0f, 1.0f);
    const float e = 1.0f - ramp;
    inv[i] = interp * (1.0f - e) + extra * e;
  }
  return inv;
}

}  // namespace

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
  if (p.type == "yarn") return yarn_inv_freq(p, head_dim, inv);
  AERIE_CHECK(p.type == "llama3", "rope_inv_freq: unknown rope type '" << p.type << "' (default, linear, llama3, yarn)");
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

// Interleaved: pair i is (2i, 2i+1); y_2i = (x_2i c - x_2i+1 s) scale, y_2i+1 = (x_2i+1 c + x_2i s) scale.
void rope_apply_interleaved(float* x, const int32_t* positions, const float* inv_freq, int64_t t, int64_t nh,
                            int64_t d, float scale) {
  const int64_t half = d / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < t; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * inv_freq[i];
      cs[i] = std::cos(ang);
      sn[i] = std::sin(ang);
    }
    for (int64_t h = 0; h < nh; ++h) {
      float* xr = x + (r * nh + h) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float a = xr[2 * i], b = xr[2 * i + 1];
        xr[2 * i] = (a * cs[i] - b * sn[i]) * scale;
        xr[2 * i + 1] = (b * cs[i] + a * sn[i]) * scale;
      }
    }
  }
}

}  // namespace aerie::cpu
