// CUDA TTT diagonal merge (eagle3.md section 4; contracts in kernels/attention.h): elementwise per
// (row, head), one warp each, lanes over the head dim (d <= 256: MLA's query/key head of 192 too); up to 8
// diagonal keys per launch.
#include <algorithm>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"

namespace aerie::cuda {
namespace {

using namespace attn;

constexpr int kMaxDiag = 8;  // diagonal keys per merge launch (more: several launches)
constexpr int kMaxNc = 8;    // head-dim columns per lane (d <= 256)

struct DiagPtrs {
  const void* k[kMaxDiag];
  const void* v[kMaxDiag];
  void* gk[kMaxDiag];
  void* gv[kMaxDiag];
  int J;
};

/// One warp per (row i, head h): merges the J diagonal scores into out/lse in place.
template <typename T>
__global__ void __launch_bounds__(kThreads) merge_fwd_kernel(const T* q, DiagPtrs dg, int64_t n, int nh, int nkv,
                                                              int d, float scale, T* out, float* lse) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // i * nh + h
  const int lane = threadIdx.x & 31;
  if (idx >= n * nh) return;
  const int64_t i = idx / nh;
  const int h = static_cast<int>(idx % nh), kh = h / (nh / nkv);
  const int64_t qo = idx * d, ko = (i * nkv + kh) * d;
  float qr[kMaxNc];
#pragma unroll
  for (int t = 0; t < kMaxNc; ++t) {
    const int c = lane + 32 * t;
    qr[t] = c < d ? to_f32(q[qo + c]) : 0.0f;
  }
  const float lc = lse[idx];
  float s[kMaxDiag], mx = lc;
#pragma unroll
  for (int j = 0; j < kMaxDiag; ++j) {
    s[j] = -INFINITY;
    if (j >= dg.J) continue;
    const T* kj = static_cast<const T*>(dg.k[j]) + ko;
    float part = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxNc; ++t) {
      const int c = lane + 32 * t;
      if (c < d) part += qr[t] * to_f32(kj[c]);
    }
    s[j] = scale * warp_sum(part);
    mx = fmaxf(mx, s[j]);
  }
  float z = lc == -INFINITY ? 0.0f : expf(lc - mx);
#pragma unroll
  for (int j = 0; j < kMaxDiag; ++j)
    if (j < dg.J) z += expf(s[j] - mx);
  const float l = mx + logf(z);
  const float wc = lc == -INFINITY ? 0.0f : expf(lc - l);
  float o[kMaxNc];
#pragma unroll
  for (int t = 0; t < kMaxNc; ++t) {
    const int c = lane + 32 * t;
    o[t] = c < d ? wc * to_f32(out[qo + c]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMaxDiag; ++j) {
    if (j >= dg.J) continue;
    const float pj = expf(s[j] - l);
    const T* vj = static_cast<const T*>(dg.v[j]) + ko;
#pragma unroll
    for (int t = 0; t < kMaxNc; ++t) {
      const int c = lane + 32 * t;
      if (c < d) o[t] += pj * to_f32(vj[c]);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxNc; ++t) {
    const int c = lane + 32 * t;
    if (c < d) out[qo + c] = from_f32<T>(o[t]);
  }
  if (lane == 0) lse[idx] = l;
}

/// One warp per (row i, kv head kh), looping over the heads of the group (the one writer of row i of
/// every diagonal gradient): dq += scale dS_j kd_j, ddiag_k[j] += scale dS_j q, ddiag_v[j] += P_j dout.
template <typename T, typename G>
__global__ void __launch_bounds__(kThreads) merge_bwd_kernel(const T* dout, const T* q, DiagPtrs dg, const T* out,
                                                              const float* lse, int64_t n, int nh, int nkv, int d,
                                                              float scale, T* dq) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // i * nkv + kh
  const int lane = threadIdx.x & 31;
  if (idx >= n * nkv) return;
  const int64_t i = idx / nkv;
  const int kh = static_cast<int>(idx % nkv), group = nh / nkv;
  const int64_t ko = idx * d;
  for (int hg = 0; hg < group; ++hg) {
    const int64_t row = i * nh + kh * group + hg, qo = row * d;
    float qr[kMaxNc], dor[kMaxNc], dqa[kMaxNc], dd = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxNc; ++t) {
      const int c = lane + 32 * t;
      qr[t] = c < d ? to_f32(q[qo + c]) : 0.0f;
      dor[t] = c < d ? to_f32(dout[qo + c]) : 0.0f;
      dd += c < d ? dor[t] * to_f32(out[qo + c]) : 0.0f;
      dqa[t] = 0.0f;
    }
    const float D = warp_sum(dd), lr = lse[row];
#pragma unroll
    for (int j = 0; j < kMaxDiag; ++j) {
      if (j >= dg.J) continue;
      const T* kj = static_cast<const T*>(dg.k[j]) + ko;
      const T* vj = static_cast<const T*>(dg.v[j]) + ko;
      float kr[kMaxNc], sp = 0.0f, dpv = 0.0f;
#pragma unroll
      for (int t = 0; t < kMaxNc; ++t) {
        const int c = lane + 32 * t;
        kr[t] = c < d ? to_f32(kj[c]) : 0.0f;
        sp += qr[t] * kr[t];
        dpv += c < d ? dor[t] * to_f32(vj[c]) : 0.0f;
      }
      const float p = expf(scale * warp_sum(sp) - lr);
      const float ds = p * (warp_sum(dpv) - D);
      G* gk = static_cast<G*>(dg.gk[j]) + ko;
      G* gv = static_cast<G*>(dg.gv[j]) + ko;
#pragma unroll
      for (int t = 0; t < kMaxNc; ++t) {
        const int c = lane + 32 * t;
        if (c >= d) continue;
        dqa[t] += scale * ds * kr[t];
        gk[c] = from_f32<G>(to_f32(gk[c]) + scale * ds * qr[t]);
        gv[c] = from_f32<G>(to_f32(gv[c]) + p * dor[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxNc; ++t) {
      const int c = lane + 32 * t;
      if (c < d) dq[qo + c] = from_f32<T>(to_f32(dq[qo + c]) + dqa[t]);
    }
  }
}

DiagPtrs diag_chunk(const std::vector<const Tensor*>& dk, const std::vector<const Tensor*>& dv,
                    const std::vector<Tensor*>* gk, const std::vector<Tensor*>* gv, size_t j0) {
  DiagPtrs dg{};
  dg.J = static_cast<int>(std::min<size_t>(kMaxDiag, dk.size() - j0));
  for (int j = 0; j < dg.J; ++j) {
    dg.k[j] = dk[j0 + j]->raw();
    dg.v[j] = dv[j0 + j]->raw();
    if (gk) dg.gk[j] = (*gk)[j0 + j]->raw();
    if (gv) dg.gv[j] = (*gv)[j0 + j]->raw();
  }
  return dg;
}

}  // namespace

void attention_merge_diagonal_forward(const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                      const std::vector<const Tensor*>& diag_v, float scale, Tensor& out,
                                      Tensor& lse) {
  constexpr const char* op = "attention_merge_diagonal_forward (CUDA)";
  const int64_t n = q.dim(0);
  const int nh = static_cast<int>(q.dim(1)), d = static_cast<int>(q.dim(2));
  AERIE_CHECK(d <= 32 * kMaxNc, op << ": head dim " << d << " is not supported (at most " << 32 * kMaxNc << ")");
  if (n == 0 || nh == 0 || diag_k.empty()) return;
  const int nkv = static_cast<int>(diag_k[0]->dim(1));
  for (size_t j0 = 0; j0 < diag_k.size(); j0 += kMaxDiag) {  // merging chunk by chunk is the same merge
    const DiagPtrs dg = diag_chunk(diag_k, diag_v, nullptr, nullptr, j0);
    const unsigned blocks = blocks_for(n * nh, kWarps);
    if (q.dtype() == DType::BF16)
      merge_fwd_kernel<bf16_t><<<blocks, kThreads, 0, stream()>>>(static_cast<const bf16_t*>(q.raw()), dg, n, nh,
                                                                  nkv, d, scale, static_cast<bf16_t*>(out.raw()),
                                                                  lse.data<float>());
    else
      merge_fwd_kernel<float><<<blocks, kThreads, 0, stream()>>>(q.data<float>(), dg, n, nh, nkv, d, scale,
                                                                 out.data<float>(), lse.data<float>());
    AERIE_CUDA_LAUNCHED("merge_fwd_kernel");
  }
}

void attention_merge_diagonal_backward(const Tensor& dout, const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                       const std::vector<const Tensor*>& diag_v, const Tensor& out,
                                       const Tensor& lse, float scale, Tensor& dq,
                                       const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v) {
  constexpr const char* op = "attention_merge_diagonal_backward (CUDA)";
  const int64_t n = q.dim(0);
  const int nh = static_cast<int>(q.dim(1)), d = static_cast<int>(q.dim(2));
  AERIE_CHECK(d <= 32 * kMaxNc, op << ": head dim " << d << " is not supported (at most " << 32 * kMaxNc << ")");
  if (n == 0 || nh == 0 || diag_k.empty()) return;
  const int nkv = static_cast<int>(diag_k[0]->dim(1));
  const DType gt = ddiag_k[0]->dtype();
  for (size_t j0 = 0; j0 < diag_k.size(); j0 += kMaxDiag) {  // the diagonal terms are independent
    const DiagPtrs dg = diag_chunk(diag_k, diag_v, &ddiag_k, &ddiag_v, j0);
    const unsigned blocks = blocks_for(n * nkv, kWarps);
    if (q.dtype() == DType::F32) {
      merge_bwd_kernel<float, float><<<blocks, kThreads, 0, stream()>>>(
          dout.data<float>(), q.data<float>(), dg, out.data<float>(), lse.data<float>(), n, nh, nkv, d, scale,
          dq.data<float>());
    } else {
      const auto* dob = static_cast<const bf16_t*>(dout.raw());
      const auto* qb = static_cast<const bf16_t*>(q.raw());
      const auto* ob = static_cast<const bf16_t*>(out.raw());
      auto* dqb = static_cast<bf16_t*>(dq.raw());
      if (gt == DType::F32)
        merge_bwd_kernel<bf16_t, float><<<blocks, kThreads, 0, stream()>>>(dob, qb, dg, ob, lse.data<float>(), n, nh,
                                                                           nkv, d, scale, dqb);
      else
        merge_bwd_kernel<bf16_t, bf16_t><<<blocks, kThreads, 0, stream()>>>(dob, qb, dg, ob, lse.data<float>(), n,
                                                                            nh, nkv, d, scale, dqb);
    }
    AERIE_CUDA_LAUNCHED("merge_bwd_kernel");
  }
}

}  // namespace aerie::cuda
