// Rotary position embedding in the Hugging Face layout (rotate_half: dimension i pairs with
// i + d/2), with the "default", "linear" and "llama3" rope types of transformers' modeling_rope_utils.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// RoPE parameters as in a Hugging Face config.json: rope_theta and rope_scaling.
struct RopeParams {
  double theta = 10000.0;
  std::string type = "default";  // "default", "linear" or "llama3"
  // rope_scaling fields: factor for "linear" and "llama3", the others for "llama3" only:
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

/// inv_freq[i], i < head_dim/2, as transformers computes it (fp32). Throws on odd head_dim or an
/// unknown type.
std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim);

/// In place on x: [T, n_heads, head_dim] F32 or BF16 (rotated in fp32, rounded back to the dtype),
/// position of row t = positions[t] (I32 [T], on x's device). inverse = false rotates by +angle
/// (forward); inverse = true by -angle, which is the backward (the rotation is orthogonal, so
/// dL/dx = R^T dL/dy). inv_freq (host, head_dim/2 entries, at most 512 on CUDA) is passed to the
/// CUDA kernel by value: no copy, no synchronisation. Angles pos * inv_freq and their cos/sin in fp32.
void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse = false);

}  // namespace aerie
