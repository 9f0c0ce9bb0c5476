// RoPE: checks and device dispatch (see rope.h).
#include "kernels/rope.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim) {
  AERIE_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_inv_freq: head_dim must be even and positive, got "
                                                     << head_dim);
  AERIE_CHECK(p.theta > 0.0, "rope_inv_freq: rope_theta must be positive, got " << p.theta);
  if (p.type == "llama3")
    AERIE_CHECK(p.factor > 0.0 && p.low_freq_factor > 0.0 && p.high_freq_factor > p.low_freq_factor &&
                    p.original_max_position_embeddings > 0,
                "rope_inv_freq: bad llama3 rope_scaling (factor " << p.factor << ", low_freq_factor "
                    << p.low_freq_factor << ", high_freq_factor " << p.high_freq_factor
                    << ", original_max_position_embeddings " << p.original_max_position_embeddings << ")");
  return cpu::rope_inv_freq(p, head_dim);  // host-side table on every device
}

void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse) {
  constexpr const char* op = "rope_apply";
  AERIE_CHECK(x.ndim() == 3, op << ": x must be [T, n_heads, head_dim], got " << shape_str(x.shape()));
  const int64_t t = x.dim(0), nh = x.dim(1), d = x.dim(2);
  x.check_dtype(DType::F32, what(op, "x"));
  positions.check_shape({t}, what(op, "positions"));
  positions.check_dtype(DType::I32, what(op, "positions"));
  AERIE_CHECK(static_cast<int64_t>(inv_freq.size()) * 2 == d,
              op << ": inv_freq has " << inv_freq.size() << " entries, head_dim " << d << " needs " << d / 2);
  const Device dev = kernels::common_device(op, {{"x", &x}, {"positions", &positions}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::rope_apply(x.data<float>(), positions.data<int32_t>(), inv_freq.data(), t, nh, d, inverse);
}

}  // namespace aerie
