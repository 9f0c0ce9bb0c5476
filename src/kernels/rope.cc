// RoPE: checks and device dispatch (see rope.h).
#include "kernels/rope.h"

#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/rope.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim) {
  AERIE_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim must be even and positive, got "
                                                     << head_dim);
  AERIE_CHECK(p.theta > 0.0, "rope_inv_freq: rope_theta must be positive, got " << p.theta);
  if (p.type == "linear" || p.type == "llama3")
    AERIE_CHECK(p.factor > 0.0, "rope_inv_freq: rope_scaling factor must be positive, got " << p.factor);
  if (p.type == "llama3")
    AERIE_CHECK(p.factor > 0.0 && p.low_freq_factor > 0.0 && p.high_freq_factor > p.low_freq_factor &&
                    p.original_max_position_embeddings > 0,
                "rope_inv_freq: bad llama3 rope_scaling (factor " << p.factor << ", low_freq_factor "
                    << p.low_freq_factor << ", high_freq_factor " << p.high_freq_factor
                    << ", original_max_position_embeddings " << p.original_max_position_embeddings << ")");
  if (p.type == "yarn")
    AERIE_CHECK(p.factor > 0.0 && p.original_max_position_embeddings > 0 && p.beta_fast > 0.0 && p.beta_slow > 0.0,
                "rope_inv_freq: bad yarn rope_scaling (factor " << p.factor << ", original_max_position_embeddings "
                    << p.original_max_position_embeddings << ", beta_fast " << p.beta_fast << ", beta_slow "
                    << p.beta_slow << ")");
  return cpu::rope_inv_freq(p, head_dim);  // host-side table on every device
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double mla_softmax_scale(const RopeParams& p, int64_t qk_head_dim) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  if (p.type != "default" && p.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(p.factor, p.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double rope_attention_factor(const RopeParams& p) {
  if (p.type != "yarn") return 1.0;
  if (p.attention_factor >= 0.0) return p.attention_factor;
  if (p.mscale != 0.0 && p.mscale_all_dim != 0.0)
    return yarn_mscale(p.factor, p.mscale) / yarn_mscale(p.factor, p.mscale_all_dim);
  return yarn_mscale(p.factor);
}

namespace {

/// The checks shared by the two rotations of x [T, n_heads, head_dim] (F32 or BF16) at positions [T] (I32) with
/// inv_freq [head_dim / 2]; the device of x and positions. Throws aerie::Error naming op.
Device check_rotation(const char* op, const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq) {
  AERIE_CHECK(x.ndim() == 3, op << ": x must be [T, n_heads, head_dim], got " << shape_str(x.shape()));
  const int64_t t = x.dim(0), d = x.dim(2);
  AERIE_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
              op << ": x must be F32 or BF16, got " << dtype_name(x.dtype()));
  positions.check_shape({t}, what(op, "positions"));
  positions.check_dtype(DType::I32, what(op, "positions"));
  AERIE_CHECK(static_cast<int64_t>(inv_freq.size()) * 2 == d,
              op << ": inv_freq has " << inv_freq.size() << " entries, head_dim " << d << " needs " << d / 2);
  return kernels::common_device(op, {{"x", &x}, {"positions", &positions}});
}

/// The CPU rotation: cpu_fn(float* x, t, nh, d) on x, or on an fp32 copy of a BF16 x that is rounded back.
template <typename Cpu>
void rotate_on_cpu(Tensor& x, Cpu&& cpu_fn) {
  const int64_t t = x.dim(0), nh = x.dim(1), d = x.dim(2);
  if (x.dtype() == DType::F32) {
    cpu_fn(x.data<float>(), t, nh, d);
    return;
  }
  Tensor xf = x.to(DType::F32);  // BF16: rotate an fp32 copy, round back
  cpu_fn(xf.data<float>(), t, nh, d);
  x.copy_from(xf.to(x.dtype()));
}

}  // namespace

void rope_apply_interleaved(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, float scale) {
  constexpr const char* op = "rope_apply_interleaved";
  const Device dev = check_rotation(op, x, positions, inv_freq);
  AERIE_CUDA_DISPATCH(op, dev, cuda::rope_apply_interleaved(x, positions, inv_freq, scale));
  rotate_on_cpu(x, [&](float* xs, int64_t t, int64_t nh, int64_t d) {
    cpu::rope_apply_interleaved(xs, positions.data<int32_t>(), inv_freq.data(), t, nh, d, scale);
  });
}

void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse) {
  constexpr const char* op = "rope_apply";
  const Device dev = check_rotation(op, x, positions, inv_freq);
  AERIE_CUDA_DISPATCH(op, dev, cuda::rope_apply(x, positions, inv_freq, inverse));
  rotate_on_cpu(x, [&](float* xs, int64_t t, int64_t nh, int64_t d) {
    cpu::rope_apply(xs, positions.data<int32_t>(), inv_freq.data(), t, nh, d, inverse);
  });
}

}  // namespace aerie
