// Attention: checks and device dispatch (see attention.h).
#include "kernels/attention.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

namespace {
/// Validates q [Tq, nh, d], k, v [Tk, nkv, d] (F32) and returns the dimensions.
cpu::AttentionDims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             float scale) {
  AERIE_CHECK(q.ndim() == 3, op << ": q must be [Tq, n_heads, d], got " << shape_str(q.shape()));
  AERIE_CHECK(k.ndim() == 3, op << ": k must be [Tk, n_kv, d], got " << shape_str(k.shape()));
  cpu::AttentionDims a{q.dim(0), k.dim(0), q.dim(1), k.dim(1), q.dim(2), q_offset, scale};
  k.check_shape({a.tk, a.nkv, a.d}, what(op, "k"));
  v.check_shape({a.tk, a.nkv, a.d}, what(op, "v"));
  AERIE_CHECK(a.nkv > 0 && a.nh % a.nkv == 0,
              op << ": n_heads " << a.nh << " (q) is not a multiple of n_kv " << a.nkv << " (k)");
  q.check_dtype(DType::F32, what(op, "q"));
  k.check_dtype(DType::F32, what(op, "k"));
  v.check_dtype(DType::F32, what(op, "v"));
  return a;
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse) {
  constexpr const char* op = "attention_forward";
  const cpu::AttentionDims a = check_qkv(op, q, k, v, q_offset, scale);
  out.check_shape(q.shape(), what(op, "out"));
  out.check_dtype(DType::F32, what(op, "out"));
  if (lse) {
    lse->check_shape({a.tq, a.nh}, what(op, "lse"));
    lse->check_dtype(DType::F32, what(op, "lse"));
  }
  const Device dev = kernels::common_device(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
  if (lse) kernels::common_device(op, {{"q", &q}, {"lse", lse}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::attention_forward(q.data<float>(), k.data<float>(), v.data<float>(), a, out.data<float>(),
                         lse ? lse->data<float>() : nullptr);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, int64_t q_offset, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  constexpr const char* op = "attention_backward";
  const cpu::AttentionDims a = check_qkv(op, q, k, v, q_offset, scale);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"out", &out}, {"dq", &dq}}) {
    t->check_shape(q.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  lse.check_shape({a.tq, a.nh}, what(op, "lse"));
  lse.check_dtype(DType::F32, what(op, "lse"));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dk", &dk}, {"dv", &dv}}) {
    t->check_shape(k.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  const Device dev = kernels::common_device(op, {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out},
                                                 {"lse", &lse}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::attention_backward(dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(),
                          out.data<float>(), lse.data<float>(), a, dq.data<float>(), dk.data<float>(),
                          dv.data<float>());
}

}  // namespace aerie
