// CPU causal grouped-query attention. Each (query row, head) computes its scores over the attended keys
// into an O(Tk) scratch buffer (two-pass softmax: max, then exp and sum), so no Tq x Tk matrix is ever
// stored. Backward: FlashAttention (Dao et al. 2022) Algorithm 2 recomputation from the saved lse.
// The TTT diagonal merge (eagle3.md section 4) is elementwise per (row, head), in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

namespace {
inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
/// The keys query row i attends, [first, end): j <= i + q_offset and, with a window, j > i + q_offset -
/// window; clipped to [0, tk] (first >= end: none).
struct KeyRange {
  int64_t first, end;
};
inline KeyRange attended(const AttentionDims& a, int64_t i) {
  const int64_t end = std::clamp<int64_t>(i + a.q_offset + 1, 0, a.tk);
  const int64_t first = a.window > 0 ? std::clamp<int64_t>(i + a.q_offset - a.window + 1, 0, end) : 0;
  return {first, end};
}
}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const AttentionDims& a, float* out,
                       float* lse) {
  const int64_t d = a.d, dv = a.vd(), group = a.nh / a.nkv;
  std::vector<float> s(static_cast<size_t>(a.tk));
  for (int64_t i = 0; i < a.tq; ++i) {
    const auto [j_first, j_end] = attended(a, i);
    for (int64_t h = 0; h < a.nh; ++h) {
      const float* qi = q + (i * a.nh + h) * d;
      float* oi = out + (i * a.nh + h) * dv;
      const int64_t kvh = h / group;
      std::fill(oi, oi + dv, 0.0f);
      if (j_first >= j_end) {  // nothing attended: output 0, lse -inf (the empty sum)
        if (lse) lse[i * a.nh + h] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = j_first; j < j_end; ++j) {
        s[j] = a.scale * dot(qi, k + (j * a.nkv + kvh) * d, d);
        mx = std::max(mx, s[j]);
      }
      float sum = 0.0f;
      for (int64_t j = j_first; j < j_end; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
        const float* vj = v + (j * a.nkv + kvh) * dv;
        for (int64_t c = 0; c < dv; ++c) oi[c] += s[j] * vj[c];
      }
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < dv; ++c) oi[c] *= inv;
      if (lse) lse[i * a.nh + h] = mx + std::log(sum);
    }
  }
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const AttentionDims& a, float* dq, float* dk, float* dv) {
  const int64_t d = a.d, group = a.nh / a.nkv;
  for (int64_t i = 0; i < a.tq; ++i) {
    const auto [j_first, j_end] = attended(a, i);
    for (int64_t h = 0; h < a.nh; ++h) {
      const int64_t row = i * a.nh + h, kvh = h / group;
      const float* qi = q + row * d;
      const float* doi = dout + row * d;
      float* dqi = dq + row * d;
      std::fill(dqi, dqi + d, 0.0f);
      if (j_first >= j_end) continue;
      const float l = lse[row];
      const float di = dot(doi, out + row * d, d);  // D_i = dout_i . out_i
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t kv = (j * a.nkv + kvh) * d;
        const float p = std::exp(a.scale * dot(qi, k + kv, d) - l);
        const float ds = p * (dot(doi, v + kv, d) - di);
        const float sds = a.scale * ds;
        for (int64_t c = 0; c < d; ++c) {
          dqi[c] += ds * k[kv + c];
          dk[kv + c] += sds * qi[c];
          dv[kv + c] += p * doi[c];
        }
      }
      for (int64_t c = 0; c < d; ++c) dqi[c] *= a.scale;
    }
  }
}

namespace {
double dot_double(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}
}  // namespace

void attention_merge_diagonal_forward(const float* q, const std::vector<const float*>& diag_k,
                                      const std::vector<const float*>& diag_v, const AttentionDims& a, float* out,
                                      float* lse) {
  const int64_t n = a.tq, nh = a.nh, nkv = a.nkv, d = a.d, group = nh / nkv;
  const size_t J = diag_k.size();
  if (J == 0) return;
  const double scale = a.scale;
  std::vector<double> s(J), acc(static_cast<size_t>(d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / group;
      const float* qi = q + (i * nh + h) * d;
      const double lc = lse[i * nh + h];
      double m = lc;
      for (size_t j = 0; j < J; ++j) {
        s[j] = scale * dot_double(qi, diag_k[j] + (i * nkv + kh) * d, d);
        m = std::max(m, s[j]);
      }
      double z = std::exp(lc - m);
      for (size_t j = 0; j < J; ++j) z += std::exp(s[j] - m);
      const double l = m + std::log(z);
      float* oi = out + (i * nh + h) * d;
      const double wc = std::exp(lc - l);
      for (int64_t x = 0; x < d; ++x) acc[x] = wc * oi[x];
      for (size_t j = 0; j < J; ++j) {
        const double p = std::exp(s[j] - l);
        const float* vj = diag_v[j] + (i * nkv + kh) * d;
        for (int64_t x = 0; x < d; ++x) acc[x] += p * vj[x];
      }
      for (int64_t x = 0; x < d; ++x) oi[x] = static_cast<float>(acc[x]);
      lse[i * nh + h] = static_cast<float>(l);
    }
}

void attention_merge_diagonal_backward(const float* dout, const float* q, const std::vector<const float*>& diag_k,
                                       const std::vector<const float*>& diag_v, const float* out, const float* lse,
                                       const AttentionDims& a, float* dq, const std::vector<float*>& ddiag_k,
                                       const std::vector<float*>& ddiag_v) {
  const int64_t n = a.tq, nh = a.nh, nkv = a.nkv, d = a.d, group = nh / nkv;
  const double scale = a.scale;
  for (size_t j = 0; j < diag_k.size(); ++j)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / group;
        const int64_t qo = (i * nh + h) * d, ko = (i * nkv + kh) * d;
        const float* qi = q + qo;
        const float* doi = dout + qo;
        const float* kj = diag_k[j] + ko;
        const float* vj = diag_v[j] + ko;
        const double D = dot_double(doi, out + qo, d);
        const double p = std::exp(scale * dot_double(qi, kj, d) - static_cast<double>(lse[i * nh + h]));
        const double ds = p * (dot_double(doi, vj, d) - D);
        float* dqi = dq + qo;
        float* dkj = ddiag_k[j] + ko;
        float* dvj = ddiag_v[j] + ko;
        for (int64_t x = 0; x < d; ++x) {
          dqi[x] += static_cast<float>(scale * ds * kj[x]);
          dkj[x] += static_cast<float>(scale * ds * qi[x]);
          dvj[x] += static_cast<float>(p * doi[x]);
        }
      }
}

}  // namespace aerie::cpu
