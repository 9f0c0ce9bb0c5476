// Attention: checks and device dispatch (see attention.h). The CPU path widens BF16 tensors to fp32
// copies, runs the fp32 reference of cpu/attention.cc and rounds the results back.
#include "kernels/attention.h"

#include <algorithm>
#include <utility>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/attention.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_ops.h"

namespace aerie {

using kernels::what;

namespace {

using Named = std::pair<const char*, const Tensor*>;

/// Validates q [Tq, nh, d], k [Tk, nkv, d], v [Tk, nkv, dv] (all F32 or all BF16; dv = d unless
/// `any_dv`, the forwards, which take 1 <= dv <= d) and returns the dimensions.
cpu::AttentionDims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             float scale, int64_t window, bool any_dv = false) {
  AERIE_CHECK(window >= 0, op << ": sliding window " << window << " must be >= 0 (0: none)");
  AERIE_CHECK(q.ndim() == 3, op << ": q must be [Tq, n_heads, d], got " << shape_str(q.shape()));
  AERIE_CHECK(k.ndim() == 3, op << ": k must be [Tk, n_kv, d], got " << shape_str(k.shape()));
  cpu::AttentionDims a{q.dim(0), k.dim(0), q.dim(1), k.dim(1), q.dim(2), q_offset, scale};
  k.check_shape({a.tk, a.nkv, a.d}, what(op, "k"));
  const int64_t dv = any_dv && v.ndim() == 3 && v.dim(2) >= 1 && v.dim(2) <= a.d ? v.dim(2) : a.d;
  v.check_shape({a.tk, a.nkv, dv}, what(op, any_dv ? "v (head dim 1 .. q's)" : "v"));
  a.dv = dv;
  a.window = window;
  AERIE_CHECK(a.nkv > 0 && a.nh % a.nkv == 0,
              op << ": n_heads " << a.nh << " (q) is not a multiple of n_kv " << a.nkv << " (k)");
  AERIE_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::BF16,
              op << ": q must be F32 or BF16, got " << dtype_name(q.dtype()));
  k.check_dtype(q.dtype(), what(op, "k (q's dtype)"));
  v.check_dtype(q.dtype(), what(op, "v (q's dtype)"));
  return a;
}

/// A key/value gradient: F32, or the inputs' dtype.
void check_grad_dtype(const char* op, const char* name, const Tensor& g, DType input) {
  AERIE_CHECK(g.dtype() == DType::F32 || g.dtype() == input,
              op << ": " << name << " must be F32 or " << dtype_name(input) << ", got " << dtype_name(g.dtype()));
}

/// The diagonal lists: same length J, each [>= n, nkv, d] in q's dtype, value shape = key shape.
void check_diag(const char* op, const Tensor& q, const std::vector<const Tensor*>& dk,
                const std::vector<const Tensor*>& dv, int64_t nkv) {
  AERIE_CHECK(dk.size() == dv.size(), op << ": " << dk.size() << " diagonal keys, " << dv.size() << " values");
  const int64_t n = q.dim(0), d = q.dim(2);
  for (size_t j = 0; j < dk.size(); ++j) {
    AERIE_CHECK(dk[j]->ndim() == 3 && dk[j]->dim(0) >= n && dk[j]->dim(1) == nkv && dk[j]->dim(2) == d,
                op << ": diagonal key " << j << " has shape " << shape_str(dk[j]->shape()) << " for q "
                   << shape_str(q.shape()) << " (want [>= " << n << ", " << nkv << ", " << d << "])");
    AERIE_CHECK(dv[j]->shape() == dk[j]->shape(),
                op << ": diagonal value " << j << " has shape " << shape_str(dv[j]->shape()) << ", its key "
                   << shape_str(dk[j]->shape()));
    dk[j]->check_dtype(q.dtype(), what(op, "diagonal key (q's dtype)"));
    dv[j]->check_dtype(q.dtype(), what(op, "diagonal value (q's dtype)"));
    AERIE_CHECK(dk[j]->device() == q.device() && dv[j]->device() == q.device(),
                op << ": diagonal key/value " << j << " is not on q's device " << device_name(q.device()));
  }
}

/// CPU input as fp32: the tensor itself, or a widened copy.
Tensor f32_in(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }

/// CPU output computed in fp32: the tensor itself when F32, else an fp32 buffer (loaded with the current
/// values when `load`, for outputs that are added to or updated) written back rounded by commit().
class F32Out {
 public:
  F32Out(Tensor& dst, bool load)
      : dst_(dst),
        buf_(dst.dtype() == DType::F32 ? dst : load ? dst.to(DType::F32) : Tensor::empty(dst.shape(), DType::F32)) {}
  float* data() { return buf_.data<float>(); }
  void commit() {
    if (dst_.dtype() != DType::F32) dst_.copy_from(buf_.to(dst_.dtype()));
  }

 private:
  Tensor& dst_;
  Tensor buf_;
};

/// out: [Tq, n_heads, dv] in q's dtype; lse (optional): [Tq, n_heads] F32 on q's device.
void check_out_lse(const char* op, const Tensor& q, const Tensor& out, const Tensor* lse, const cpu::AttentionDims& a) {
  out.check_shape({a.tq, a.nh, a.vd()}, what(op, "out"));
  out.check_dtype(q.dtype(), what(op, "out (q's dtype)"));
  if (!lse) return;
  lse->check_shape({a.tq, a.nh}, what(op, "lse"));
  lse->check_dtype(DType::F32, what(op, "lse"));
  kernels::common_device(op, {{"q", &q}, {"lse", lse}});
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse, int64_t window) {
  constexpr const char* op = "attention_forward";
  const cpu::AttentionDims a = check_qkv(op, q, k, v, q_offset, scale, window, true);
  check_out_lse(op, q, out, lse, a);
  const Device dev = kernels::common_device(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::attention_forward(q, k, v, q_offset, scale, out, lse, window));
  const Tensor qf = f32_in(q), kf = f32_in(k), vf = f32_in(v);
  F32Out o(out, false);
  cpu::attention_forward(qf.data<float>(), kf.data<float>(), vf.data<float>(), a, o.data(),
                         lse ? lse->data<float>() : nullptr);
  o.commit();
}

void attention_decode_batch(const Tensor& q, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& k,
                            const std::vector<const Tensor*>& v, const std::vector<int64_t>& lengths, float scale,
                            Tensor& out, int64_t window) {
  constexpr const char* op = "attention_decode_batch";
  const size_t B = rows.size();
  AERIE_CHECK(k.size() == B && v.size() == B && lengths.size() == B,
              op << ": " << B << " rows, " << k.size() << " key caches, " << v.size() << " value caches and "
                 << lengths.size() << " lengths (one each per sequence)");
  AERIE_CHECK(window >= 0, op << ": sliding window " << window << " must be >= 0 (0: none)");
  AERIE_CHECK(q.ndim() == 3, op << ": q must be [N, n_heads, d], got " << shape_str(q.shape()));
  AERIE_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::BF16,
              op << ": q must be F32 or BF16, got " << dtype_name(q.dtype()));
  AERIE_CHECK(out.ndim() == 3 && out.dim(0) == q.dim(0) && out.dim(1) == q.dim(1) && out.dim(2) >= 1 &&
                  out.dim(2) <= q.dim(2),
              op << ": out must be [" << q.dim(0) << ", " << q.dim(1) << ", dv] with 1 <= dv <= " << q.dim(2)
                 << ", got " << shape_str(out.shape()));
  out.check_dtype(q.dtype(), what(op, "out (q's dtype)"));
  const int64_t N = q.dim(0), nh = q.dim(1), d = q.dim(2), dv = out.dim(2);
  std::vector<Named> devs{{"q", &q}, {"out", &out}};
  std::vector<int64_t> seen(rows);
  std::sort(seen.begin(), seen.end());
  AERIE_CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end(), op << ": a query row is given twice");
  for (size_t i = 0; i < B; ++i) {
    AERIE_CHECK(k[i] && v[i], op << ": sequence " << i << " has no key or value cache");
    AERIE_CHECK(rows[i] >= 0 && rows[i] < N, op << ": sequence " << i << "'s row " << rows[i] << " outside q's " << N
                                                << " rows");
    const Tensor& ki = *k[i];
    const Tensor& vi = *v[i];
    AERIE_CHECK(ki.ndim() == 3 && ki.dim(2) == d && ki.dim(1) >= 1 && nh % ki.dim(1) == 0,
                op << ": sequence " << i << "'s keys must be [L, n_kv, " << d << "] with n_kv dividing n_heads "
                   << nh << ", got " << shape_str(ki.shape()));
    AERIE_CHECK(vi.ndim() == 3 && vi.dim(0) == ki.dim(0) && vi.dim(1) == ki.dim(1) && vi.dim(2) >= dv,
                op << ": sequence " << i << "'s values must be [" << ki.dim(0) << ", " << ki.dim(1) << ", >= " << dv
                   << "], got " << shape_str(vi.shape()));
    AERIE_CHECK(ki.dim(1) == k[0]->dim(1) && vi.dim(2) == v[0]->dim(2),
                op << ": sequence " << i << "'s caches " << shape_str(ki.shape()) << " / " << shape_str(vi.shape())
                   << " differ in heads or value width from sequence 0's");
    AERIE_CHECK(lengths[i] >= 1 && lengths[i] <= ki.dim(0), op << ": sequence " << i << "'s length " << lengths[i]
                                                                << " outside [1, " << ki.dim(0) << "] (its cache rows)");
    ki.check_dtype(q.dtype(), what(op, "k (q's dtype)"));
    vi.check_dtype(q.dtype(), what(op, "v (q's dtype)"));
    devs.push_back({"k", k[i]});
    devs.push_back({"v", v[i]});
  }
  const Device dev = kernels::common_device(op, devs);
  if (B == 0) return;
  AERIE_CUDA_DISPATCH(op, dev, cuda::attention_decode_batch(q, rows, k, v, lengths, scale, out, window));
  for (size_t i = 0; i < B; ++i) {
    const int64_t L = lengths[i], r = rows[i];
    Tensor vals = v[i]->slice(0, L);
    if (vals.dim(2) > dv) {  // the first dv values of each head (MLA: the latent's kv_lora columns)
      Tensor c = Tensor::empty({L * vals.dim(1), dv}, vals.dtype(), Device::CPU);
      copy_columns(vals.reshape({L * vals.dim(1), vals.dim(2)}), 0, c, 0, dv);
      vals = c.reshape({L, vals.dim(1), dv});
    }
    Tensor o = out.slice(r, r + 1);
    attention_forward(q.slice(r, r + 1), k[i]->slice(0, L), vals, L - 1, scale, o, nullptr, window);
  }
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, int64_t q_offset, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv, int64_t window) {
  constexpr const char* op = "attention_backward";
  const cpu::AttentionDims a = check_qkv(op, q, k, v, q_offset, scale, window);
  for (auto [name, t] : {Named{"dout", &dout}, {"out", &out}, {"dq", &dq}}) {
    t->check_shape(q.shape(), what(op, name));
    t->check_dtype(q.dtype(), what(op, name));
  }
  lse.check_shape({a.tq, a.nh}, what(op, "lse"));
  lse.check_dtype(DType::F32, what(op, "lse"));
  for (auto [name, t] : {Named{"dk", &dk}, {"dv", &dv}}) {
    t->check_shape(k.shape(), what(op, name));
    check_grad_dtype(op, name, *t, q.dtype());
  }
  dv.check_dtype(dk.dtype(), what(op, "dv (dk's dtype)"));
  const Device dev = kernels::common_device(op, {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out},
                                                 {"lse", &lse}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::attention_backward(dout, q, k, v, out, lse, q_offset, scale, dq, dk, dv, window));
  const Tensor dof = f32_in(dout), qf = f32_in(q), kf = f32_in(k), vf = f32_in(v), of = f32_in(out);
  F32Out gq(dq, false), gk(dk, true), gv(dv, true);
  cpu::attention_backward(dof.data<float>(), qf.data<float>(), kf.data<float>(), vf.data<float>(), of.data<float>(),
                          lse.data<float>(), a, gq.data(), gk.data(), gv.data());
  gq.commit();
  gk.commit();
  gv.commit();
}

void attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                              float scale, Tensor& out, Tensor* lse) {
  constexpr const char* op = "attention_forward_varlen";
  const cpu::AttentionDims a = check_qkv(op, q, k, v, 0, scale, 0, true);
  AERIE_CHECK(a.tk == a.tq, op << ": q has " << a.tq << " rows, k " << a.tk << " (packed samples: the same rows)");
  AERIE_CHECK(cu_seqlens.ndim() == 1 && cu_seqlens.dim(0) >= 1,
              op << ": cu_seqlens must be [B+1], got " << shape_str(cu_seqlens.shape()));
  cu_seqlens.check_dtype(DType::I32, what(op, "cu_seqlens"));
  check_out_lse(op, q, out, lse, a);
  const Device dev = kernels::common_device(
      op, {{"q", &q}, {"k", &k}, {"v", &v}, {"cu_seqlens", &cu_seqlens}, {"out", &out}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::attention_forward_varlen(q, k, v, cu_seqlens, scale, out, lse));
  const int32_t* cu = cu_seqlens.data<int32_t>();
  const int64_t nseq = cu_seqlens.dim(0) - 1;
  AERIE_CHECK(cu[0] == 0 && cu[nseq] == a.tq,
              op << ": cu_seqlens must run from 0 to " << a.tq << " (the rows of q), got " << cu[0] << " .. "
                 << cu[nseq]);
  for (int64_t b = 0; b < nseq; ++b)
    AERIE_CHECK(cu[b] <= cu[b + 1], op << ": cu_seqlens decreases at sample " << b << " (" << cu[b] << " > "
                                       << cu[b + 1] << ")");
  for (int64_t b = 0; b < nseq; ++b) {
    if (cu[b] == cu[b + 1]) continue;  // an empty sample
    Tensor qs = q.slice(cu[b], cu[b + 1]), ks = k.slice(cu[b], cu[b + 1]), vs = v.slice(cu[b], cu[b + 1]);
    Tensor os = out.slice(cu[b], cu[b + 1]), ls = lse ? lse->slice(cu[b], cu[b + 1]) : Tensor();
    attention_forward(qs, ks, vs, 0, scale, os, lse ? &ls : nullptr);
  }
}

void attention_merge_diagonal_forward(const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                      const std::vector<const Tensor*>& diag_v, float scale, Tensor& out,
                                      Tensor& lse) {
  constexpr const char* op = "attention_merge_diagonal_forward";
  AERIE_CHECK(q.ndim() == 3, op << ": q must be [n, n_heads, d], got " << shape_str(q.shape()));
  AERIE_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::BF16,
              op << ": q must be F32 or BF16, got " << dtype_name(q.dtype()));
  const int64_t nkv = diag_k.empty() ? q.dim(1) : diag_k[0]->dim(1);
  AERIE_CHECK(nkv > 0 && q.dim(1) % nkv == 0,
              op << ": n_heads " << q.dim(1) << " (q) is not a multiple of n_kv " << nkv << " (diagonal keys)");
  check_diag(op, q, diag_k, diag_v, nkv);
  out.check_shape(q.shape(), what(op, "out"));
  out.check_dtype(q.dtype(), what(op, "out (q's dtype)"));
  lse.check_shape({q.dim(0), q.dim(1)}, what(op, "lse"));
  lse.check_dtype(DType::F32, what(op, "lse"));
  const Device dev = kernels::common_device(op, {{"q", &q}, {"out", &out}, {"lse", &lse}});
  if (diag_k.empty()) return;
  AERIE_CUDA_DISPATCH(op, dev, cuda::attention_merge_diagonal_forward(q, diag_k, diag_v, scale, out, lse));
  const cpu::AttentionDims a{q.dim(0), q.dim(0), q.dim(1), nkv, q.dim(2), 0, scale};
  const Tensor qf = f32_in(q);
  std::vector<Tensor> keep;  // widened diagonal copies (BF16 inputs)
  std::vector<const float*> pk, pv;
  for (size_t j = 0; j < diag_k.size(); ++j) {
    keep.push_back(f32_in(*diag_k[j]));
    pk.push_back(keep.back().data<float>());
    keep.push_back(f32_in(*diag_v[j]));
    pv.push_back(keep.back().data<float>());
  }
  F32Out o(out, true);
  cpu::attention_merge_diagonal_forward(qf.data<float>(), pk, pv, a, o.data(), lse.data<float>());
  o.commit();
}

void attention_merge_diagonal_backward(const Tensor& dout, const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                       const std::vector<const Tensor*>& diag_v, const Tensor& out,
                                       const Tensor& lse, float scale, Tensor& dq,
                                       const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v) {
  constexpr const char* op = "attention_merge_diagonal_backward";
  AERIE_CHECK(q.ndim() == 3, op << ": q must be [n, n_heads, d], got " << shape_str(q.shape()));
  AERIE_CHECK(q.dtype() == DType::F32 || q.dtype() == DType::BF16,
              op << ": q must be F32 or BF16, got " << dtype_name(q.dtype()));
  const int64_t nkv = diag_k.empty() ? q.dim(1) : diag_k[0]->dim(1);
  AERIE_CHECK(nkv > 0 && q.dim(1) % nkv == 0,
              op << ": n_heads " << q.dim(1) << " (q) is not a multiple of n_kv " << nkv << " (diagonal keys)");
  check_diag(op, q, diag_k, diag_v, nkv);
  AERIE_CHECK(ddiag_k.size() == diag_k.size() && ddiag_v.size() == diag_v.size(),
              op << ": " << ddiag_k.size() << " / " << ddiag_v.size() << " diagonal gradients for " << diag_k.size()
                 << " diagonal keys");
  for (auto [name, t] : {Named{"dout", &dout}, {"out", &out}, {"dq", &dq}}) {
    t->check_shape(q.shape(), what(op, name));
    t->check_dtype(q.dtype(), what(op, name));
  }
  lse.check_shape({q.dim(0), q.dim(1)}, what(op, "lse"));
  lse.check_dtype(DType::F32, what(op, "lse"));
  for (size_t j = 0; j < ddiag_k.size(); ++j) {
    ddiag_k[j]->check_shape(diag_k[j]->shape(), what(op, "ddiag_k (its diagonal key's shape)"));
    ddiag_v[j]->check_shape(diag_v[j]->shape(), what(op, "ddiag_v (its diagonal value's shape)"));
    check_grad_dtype(op, "ddiag_k", *ddiag_k[j], q.dtype());
    ddiag_k[j]->check_dtype(ddiag_k[0]->dtype(), what(op, "ddiag_k (the first one's dtype)"));
    ddiag_v[j]->check_dtype(ddiag_k[0]->dtype(), what(op, "ddiag_v (ddiag_k's dtype)"));
    AERIE_CHECK(ddiag_k[j]->device() == q.device() && ddiag_v[j]->device() == q.device(),
                op << ": diagonal gradient " << j << " is not on q's device " << device_name(q.device()));
  }
  const Device dev = kernels::common_device(
      op, {{"dout", &dout}, {"q", &q}, {"out", &out}, {"lse", &lse}, {"dq", &dq}});
  if (diag_k.empty()) return;
  AERIE_CUDA_DISPATCH(
      op, dev, cuda::attention_merge_diagonal_backward(dout, q, diag_k, diag_v, out, lse, scale, dq, ddiag_k, ddiag_v));
  const cpu::AttentionDims a{q.dim(0), q.dim(0), q.dim(1), nkv, q.dim(2), 0, scale};
  const Tensor dof = f32_in(dout), qf = f32_in(q), of = f32_in(out);
  std::vector<Tensor> keep;
  std::vector<const float*> pk, pv;
  for (size_t j = 0; j < diag_k.size(); ++j) {
    keep.push_back(f32_in(*diag_k[j]));
    pk.push_back(keep.back().data<float>());
    keep.push_back(f32_in(*diag_v[j]));
    pv.push_back(keep.back().data<float>());
  }
  std::vector<F32Out> gk, gv;
  std::vector<float*> pgk, pgv;
  gk.reserve(ddiag_k.size());
  gv.reserve(ddiag_v.size());
  for (size_t j = 0; j < ddiag_k.size(); ++j) {
    pgk.push_back(gk.emplace_back(*ddiag_k[j], true).data());
    pgv.push_back(gv.emplace_back(*ddiag_v[j], true).data());
  }
  F32Out gq(dq, true);
  cpu::attention_merge_diagonal_backward(dof.data<float>(), qf.data<float>(), pk, pv, of.data<float>(),
                                         lse.data<float>(), a, gq.data(), pgk, pgv);
  gq.commit();
  for (auto& g : gk) g.commit();
  for (auto& g : gv) g.commit();
}

}  // namespace aerie
