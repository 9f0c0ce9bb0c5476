// TTT attention (eagle3.md section 4): the causal attention of a step's queries over the step-0
// keys/values (kernels/attention.h, flash-style, returns the row log-sum-exp), merged by log-sum-exp
// with the "diagonal" keys (row i's own keys of steps 1..k). No T x T matrix anywhere.
//   lse = log(exp(lse_c) + sum_j exp(s_j)),  s_j = scale q_i . kd_j,i
//   out = exp(lse_c - lse) out_c + sum_j exp(s_j - lse) vd_j,i
// Backward with P_j = exp(s_j - lse), D = dout . out: dS_j = P_j (dout . vd_j - D);
//   dq += scale dS_j kd_j, dkd_j += scale dS_j q, dvd_j += P_j dout; the causal part is
//   attention_backward fed the merged out and lse (the same D and P, see attention.h).
#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "model/draft_layer.h"

namespace aerie::draft_detail {

namespace {

void check_diag(const Tensor& q, const std::vector<const Tensor*>& dk, const std::vector<const Tensor*>& dv,
                int64_t nkv) {
  AERIE_CHECK(dk.size() == dv.size(), "ttt attention: " << dk.size() << " diagonal keys, " << dv.size() << " values");
  const int64_t n = q.dim(0), d = q.dim(2);
  for (size_t j = 0; j < dk.size(); ++j) {
    AERIE_CHECK(dk[j]->ndim() == 3 && dk[j]->dim(0) >= n && dk[j]->dim(1) == nkv && dk[j]->dim(2) == d,
                "ttt attention: diagonal key " << j << " has shape " << shape_str(dk[j]->shape()) << " for q "
                                               << shape_str(q.shape()));
    AERIE_CHECK(dv[j]->shape() == dk[j]->shape(), "ttt attention: diagonal value " << j << " shape differs from its key");
  }
}

double dot(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

void ttt_attention_forward(const Tensor& q, const Tensor& k0, const Tensor& v0, const std::vector<const Tensor*>& diag_k,
                           const std::vector<const Tensor*>& diag_v, int64_t q_offset, float scale, Tensor& out,
                           Tensor& lse) {
  const int64_t n = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = k0.dim(1), group = nh / nkv;
  check_diag(q, diag_k, diag_v, nkv);
  attention_forward(q, k0, v0, q_offset, scale, out, &lse);
  if (diag_k.empty()) return;
  const size_t J = diag_k.size();
  std::vector<double> s(J);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / group;
      const float* qi = q.data<float>() + (i * nh + h) * d;
      const double lc = lse.data<float>()[i * nh + h];
      double m = lc;
      for (size_t j = 0; j < J; ++j) {
        s[j] = scale * dot(qi, diag_k[j]->data<float>() + (i * nkv + kh) * d, d);
        m = std::max(m, s[j]);
      }
      double z = std::exp(lc - m);
      for (size_t j = 0; j < J; ++j) z += std::exp(s[j] - m);
      const double l = m + std::log(z);
      float* oi = out.data<float>() + (i * nh + h) * d;
      const double wc = std::exp(lc - l);
      std::vector<double> acc(d);
      for (int64_t x = 0; x < d; ++x) acc[x] = wc * oi[x];
      for (size_t j = 0; j < J; ++j) {
        const double p = std::exp(s[j] - l);
        const float* vj = diag_v[j]->data<float>() + (i * nkv + kh) * d;
        for (int64_t x = 0; x < d; ++x) acc[x] += p * vj[x];
      }
      for (int64_t x = 0; x < d; ++x) oi[x] = static_cast<float>(acc[x]);
      lse.data<float>()[i * nh + h] = static_cast<float>(l);
    }
}

void ttt_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k0, const Tensor& v0,
                            const std::vector<const Tensor*>& diag_k, const std::vector<const Tensor*>& diag_v,
                            const Tensor& out, const Tensor& lse, float scale, Tensor& dq, Tensor& dk0, Tensor& dv0,
                            const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v) {
  const int64_t n = q.dim(0), nh = q.dim(1), d = q.dim(2), nkv = k0.dim(1), group = nh / nkv;
  check_diag(q, diag_k, diag_v, nkv);
  AERIE_CHECK(ddiag_k.size() == diag_k.size() && ddiag_v.size() == diag_v.size(),
              "ttt attention backward: gradient lists differ in length from the diagonal");
  attention_backward(dout, q, k0, v0, out, lse, 0, scale, dq, dk0, dv0);
  for (size_t j = 0; j < diag_k.size(); ++j)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / group;
        const int64_t qo = (i * nh + h) * d, ko = (i * nkv + kh) * d;
        const float* qi = q.data<float>() + qo;
        const float* doi = dout.data<float>() + qo;
        const float* kj = diag_k[j]->data<float>() + ko;
        const float* vj = diag_v[j]->data<float>() + ko;
        const double D = dot(doi, out.data<float>() + qo, d);
        const double p = std::exp(scale * dot(qi, kj, d) - static_cast<double>(lse.data<float>()[i * nh + h]));
        const double ds = p * (dot(doi, vj, d) - D);
        float* dqi = dq.data<float>() + qo;
        float* dkj = ddiag_k[j]->data<float>() + ko;
        float* dvj = ddiag_v[j]->data<float>() + ko;
        for (int64_t x = 0; x < d; ++x) {
          dqi[x] += static_cast<float>(scale * ds * kj[x]);
          dkj[x] += static_cast<float>(scale * ds * qi[x]);
          dvj[x] += static_cast<float>(p * doi[x]);
        }
      }
}

}  // namespace aerie::draft_detail
