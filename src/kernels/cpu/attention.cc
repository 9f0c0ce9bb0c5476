// CPU causal grouped-query attention. Each (query row, head) computes its scores over the attended keys
// into an O(Tk) scratch buffer (two-pass softmax: max, then exp and sum), so no Tq x Tk matrix is ever
// stored. Backward: FlashAttention (Dao et al. 2022) Algorithm 2 recomputation from the saved lse.
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
/// Number of keys query row i attends: j <= i + q_offset, clipped to [0, tk].
inline int64_t n_attended(const AttentionDims& a, int64_t i) {
  return std::clamp<int64_t>(i + a.q_offset + 1, 0, a.tk);
}
}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const AttentionDims& a, float* out,
                       float* lse) {
  const int64_t d = a.d, group = a.nh / a.nkv;
  std::vector<float> s(static_cast<size_t>(a.tk));
  for (int64_t i = 0; i < a.tq; ++i) {
    const int64_t n = n_attended(a, i);
    for (int64_t h = 0; h < a.nh; ++h) {
      const float* qi = q + (i * a.nh + h) * d;
      float* oi = out + (i * a.nh + h) * d;
      const int64_t kvh = h / group;
      std::fill(oi, oi + d, 0.0f);
      if (n == 0) {  // nothing attended: output 0, lse -inf (the empty sum)
        if (lse) lse[i * a.nh + h] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        s[j] = a.scale * dot(qi, k + (j * a.nkv + kvh) * d, d);
        mx = std::max(mx, s[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
        const float* vj = v + (j * a.nkv + kvh) * d;
        for (int64_t c = 0; c < d; ++c) oi[c] += s[j] * vj[c];
      }
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < d; ++c) oi[c] *= inv;
      if (lse) lse[i * a.nh + h] = mx + std::log(sum);
    }
  }
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const AttentionDims& a, float* dq, float* dk, float* dv) {
  const int64_t d = a.d, group = a.nh / a.nkv;
  for (int64_t i = 0; i < a.tq; ++i) {
    const int64_t n = n_attended(a, i);
    for (int64_t h = 0; h < a.nh; ++h) {
      const int64_t row = i * a.nh + h, kvh = h / group;
      const float* qi = q + row * d;
      const float* doi = dout + row * d;
      float* dqi = dq + row * d;
      std::fill(dqi, dqi + d, 0.0f);
      if (n == 0) continue;
      const float l = lse[row];
      const float di = dot(doi, out + row * d, d);  // D_i = dout_i . out_i
      for (int64_t j = 0; j < n; ++j) {
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

}  // namespace aerie::cpu
