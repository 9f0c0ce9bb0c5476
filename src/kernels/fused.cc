// Fused forward ops: checks and device dispatch (see fused.h). The CPU reference is fp32 only: BF16
// tensors are widened here first and BF16 outputs rounded from an fp32 result.
#include "kernels/fused.h"

#include "kernels/cpu/fused.h"
#include "kernels/cuda/fused.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;
using kernels::check_float;
using kernels::as_f32;
using kernels::f32_out;
using kernels::store_f32;

void qkv_rope_forward(const Tensor& qkv, const Tensor& positions, const std::vector<float>& inv_freq,
                      const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
  constexpr const char* op = "qkv_rope_forward";
  AERIE_CHECK(q.ndim() == 3 && k.ndim() == 3, op << ": q and k must be [n, heads, d], got " << shape_str(q.shape())
                                                 << " and " << shape_str(k.shape()));
  const int64_t n = q.dim(0), nq = q.dim(1), nkv = k.dim(1), d = q.dim(2);
  AERIE_CHECK(d > 0 && d % 2 == 0, op << ": head_dim must be even and positive, got " << d);
  AERIE_CHECK(nkv > 0 && nq % nkv == 0, op << ": " << nq << " q heads are not a multiple of " << nkv << " kv heads");
  qkv.check_shape({n, (nq + 2 * nkv) * d}, what(op, "qkv"));
  k.check_shape({n, nkv, d}, what(op, "k"));
  v.check_shape({n, nkv, d}, what(op, "v"));
  positions.check_shape({n}, what(op, "positions"));
  positions.check_dtype(DType::I32, what(op, "positions"));
  AERIE_CHECK(static_cast<int64_t>(inv_freq.size()) * 2 == d,
              op << ": inv_freq has " << inv_freq.size() << " entries, head_dim " << d << " needs " << d / 2);
  AERIE_CHECK(q_norm.defined() == k_norm.defined(), op << ": q_norm and k_norm must both be given or both not");
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"qkv", &qkv}, {"q", &q}, {"k", &k}, {"v", &v}})
    check_float(*t, op, name);
  if (q_norm.defined()) {
    q_norm.check_shape({d}, what(op, "q_norm"));
    k_norm.check_shape({d}, what(op, "k_norm"));
    check_float(q_norm, op, "q_norm");
    check_float(k_norm, op, "k_norm");
    kernels::common_device(op, {{"qkv", &qkv}, {"q_norm", &q_norm}, {"k_norm", &k_norm}});
  }
  const Device dev =
      kernels::common_device(op, {{"qkv", &qkv}, {"positions", &positions}, {"q", &q}, {"k", &k}, {"v", &v}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::qkv_rope_forward(qkv, positions, inv_freq, q_norm, k_norm, eps, q, k, v));
  const Tensor xf = as_f32(qkv);
  Tensor qn, kn;
  if (q_norm.defined()) qn = as_f32(q_norm), kn = as_f32(k_norm);
  Tensor qf = f32_out(q), kf = f32_out(k), vf = f32_out(v);
  cpu::qkv_rope_forward(xf.data<float>(), positions.data<int32_t>(), inv_freq.data(),
                        qn.defined() ? qn.data<float>() : nullptr, kn.defined() ? kn.data<float>() : nullptr, eps, n,
                        nq, nkv, d, qf.data<float>(), kf.data<float>(), vf.data<float>());
  store_f32(q, qf);
  store_f32(k, kf);
  store_f32(v, vf);
}

void swiglu_packed_forward(const Tensor& gu, Tensor& out) {
  constexpr const char* op = "swiglu_packed_forward";
  AERIE_CHECK(out.ndim() == 2, op << ": out must be [n, I], got " << shape_str(out.shape()));
  gu.check_shape({out.dim(0), 2 * out.dim(1)}, what(op, "gu"));
  check_float(gu, op, "gu");
  check_float(out, op, "out");
  const Device dev = kernels::common_device(op, {{"gu", &gu}, {"out", &out}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::swiglu_packed_forward(gu, out));
  const Tensor gf = as_f32(gu);
  Tensor of = f32_out(out);
  cpu::swiglu_packed_forward(gf.data<float>(), out.dim(0), out.dim(1), of.data<float>());
  store_f32(out, of);
}

void add_rmsnorm_forward(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  constexpr const char* op = "add_rmsnorm_forward";
  AERIE_CHECK(r.ndim() == 2, op << ": r must be [n, H], got " << shape_str(r.shape()));
  r.check_dtype(DType::F32, what(op, "r"));
  x.check_shape(r.shape(), what(op, "x"));
  y.check_shape(r.shape(), what(op, "y"));
  w.check_shape({r.dim(1)}, what(op, "w"));
  check_float(x, op, "x");
  check_float(w, op, "w");
  check_float(y, op, "y");
  AERIE_CHECK(r.numel() == 0 || (y.raw() != r.raw() && y.raw() != x.raw()), op << ": y must not alias r or x");
  const Device dev = kernels::common_device(op, {{"r", &r}, {"x", &x}, {"w", &w}, {"y", &y}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::add_rmsnorm_forward(r, x, w, eps, y));
  const Tensor xf = as_f32(x), wf = as_f32(w);
  Tensor yf = f32_out(y);
  cpu::add_rmsnorm_forward(r.data<float>(), xf.data<float>(), wf.data<float>(), eps, r.dim(0), r.dim(1),
                           yf.data<float>());
  store_f32(y, yf);
}

}  // namespace aerie
