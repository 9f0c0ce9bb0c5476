// Rotary position embedding in the Hugging Face layout (rotate_half: dimension i pairs with
// i + d/2) and in the interleaved layout of DeepSeek-V3 (dimension 2i pairs with 2i+1), with the
// "default", "linear", "llama3" and "yarn" rope types of transformers' modeling_rope_utils.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// RoPE parameters as in a Hugging Face config.json: rope_theta and rope_scaling.
struct RopeParams {
  double theta = 10000.0;
  std::string type = "default";  // "default", "linear", "llama3" or "yarn"
  // rope_scaling fields: factor for "linear", "llama3" and "yarn"; low/high_freq_factor for "llama3";
  // original_max_position_embeddings for "llama3" and "yarn":
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // "yarn" only (transformers' _compute_yarn_parameters; DeepSeek-V3 / Kimi): the correction range's
  // rotation counts, mscale / mscale_all_dim (0 = absent), attention_factor (< 0 = absent: derived),
  // truncate (floor/ceil the correction range).
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 0.0, mscale_all_dim = 0.0, attention_factor = -1.0;
  bool truncate = true;
};

/// inv_freq[i], i < head_dim/2, as transformers computes it (fp32): "default" base^(-2i/d); "linear"
/// divided by factor; "llama3" smoothed by wavelength; "yarn" blended between base^(-2i/d) and it
/// divided by factor by the linear ramp over the correction range [low, high] (deepseek-v3.md section
/// 4). Throws on odd head_dim, an unknown type or bad scaling fields.
std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim);

/// YaRN's mscale(f, m) = 1 if f <= 1 else 0.1 m ln f + 1 (transformers' get_mscale / yarn_get_mscale).
double yarn_mscale(double factor, double m = 1.0);
/// The factor cos/sin are multiplied by ("attention_scaling" in transformers): 1 except for "yarn", where
/// it is attention_factor when given, else mscale(f, mscale) / mscale(f, mscale_all_dim) when both are
/// set and nonzero, else mscale(f) (1.0 for DeepSeek-V3 and the Kimi models, whose mscale = mscale_all_dim).
double rope_attention_factor(const RopeParams& p);
/// MLA's softmax scale (transformers' DeepseekV3Attention.scaling, vLLM's DeepseekV2MLAAttention):
/// qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 for a scaled rope whose mscale_all_dim is set.
double mla_softmax_scale(const RopeParams& p, int64_t qk_head_dim);

/// Interleaved (GPT-J) RoPE in place on x: [T, n_heads, d] F32 or BF16: pair i is dims (2i, 2i+1),
/// rotated by angle positions[t] * inv_freq[i] and multiplied by `scale` (rope_attention_factor):
///   y_2i = (x_2i c - x_2i+1 s) scale,  y_2i+1 = (x_2i+1 c + x_2i s) scale,  c, s = cos, sin of the angle
/// (DeepSeek-V3's apply_rotary_emb on view_as_complex pairs; transformers' rope_interleave gives the
/// same scores). Rotated in fp32, rounded back to x's dtype. inv_freq: d/2 entries (at most 512 on
/// CUDA). positions: I32 [T] on x's device. Throws aerie::Error on a shape, dtype or device mismatch.
void rope_apply_interleaved(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, float scale);

/// In place on x: [T, n_heads, head_dim] F32 or BF16 (rotated in fp32, rounded back to the dtype),
/// position of row t = positions[t] (I32 [T], on x's device). inverse = false rotates by +angle
/// (forward); inverse = true by -angle, which is the backward (the rotation is orthogonal, so
/// dL/dx = R^T dL/dy). inv_freq (host, head_dim/2 entries, at most 512 on CUDA) is passed to the
/// CUDA kernel by value: no copy, no synchronisation. Angles pos * inv_freq and their cos/sin in fp32.
void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse = false);

}  // namespace aerie
