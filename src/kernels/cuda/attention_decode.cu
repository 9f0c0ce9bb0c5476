// Batched decoding attention (kernels/attention.h attention_decode_batch): many sequences with one new
// query row each, each against its own KV cache, in one launch per 64 sequences; the caches' pointers and
// lengths travel as kernel parameters, so nothing is copied to the device first. One block of four warps per
// (sequence, query head): each warp takes every fourth key of the row's range, computes q.k with a warp sum
// (lane c holds elements c, c + 32, ...), and keeps an online softmax (Milakov and Gimelshein 2018) of its
// keys in fp32; the four partial results merge by log-sum-exp in shared memory. Decoding is bound by reading
// the caches, which this reads once per query head (the heads of a kv group re-read it from L2).
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

namespace aerie::cuda {

namespace {

constexpr int kDecodeMax = 64;  // sequences per launch (kernel parameters: 1.5 KiB of pointers and ints)
constexpr int kDecodeWarps = 4;

struct DecodeSeqs {
  const void* k[kDecodeMax];
  const void* v[kDecodeMax];
  int32_t len[kDecodeMax];
  int32_t row[kDecodeMax];
};

struct DecodeParams {
  const void* q;
  void* out;
  int nh, group, d, dv, dvv;  // query heads, heads per kv head, key/query head dim, output and value-row head dims
  int64_t k_row, v_row;       // elements per cache row: n_kv d, n_kv dvv
  float scale;
  int window;                 // 0: none
};

// P: elements per lane, at least ceil(d / 32) (dv <= d).
template <typename T, int P>
__global__ void __launch_bounds__(kDecodeWarps * 32) decode_kernel(DecodeParams p, DecodeSeqs s) {
  extern __shared__ float sacc[];  // [kDecodeWarps, dv]
  __shared__ float sm[kDecodeWarps], sl[kDecodeWarps];
  const int h = blockIdx.x, b = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int L = s.len[b], kvh = h / p.group;
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(s.row[b]) * p.nh + h) * p.d;
  const T* K = static_cast<const T*>(s.k[b]) + static_cast<int64_t>(kvh) * p.d;
  const T* V = static_cast<const T*>(s.v[b]) + static_cast<int64_t>(kvh) * p.dvv;
  float qr[P], acc[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int c = lane + 32 * i;
    qr[i] = c < p.d ? to_f32(q[c]) : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int j0 = p.window > 0 ? max(0, L - p.window) : 0;
  for (int j = j0 + warp; j < L; j += kDecodeWarps) {
    const T* kr = K + static_cast<int64_t>(j) * p.k_row;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int c = lane + 32 * i;
      if (c < p.d) dot += qr[i] * to_f32(kr[c]);
    }
    const float sc = warp_sum(dot) * p.scale;
    const float mn = fmaxf(m, sc);
    const float corr = expf(m - mn), pj = expf(sc - mn);
    l = l * corr + pj;
    const T* vr = V + static_cast<int64_t>(j) * p.v_row;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int c = lane + 32 * i;
      if (c < p.dv) acc[i] = acc[i] * corr + pj * to_f32(vr[c]);
    }
    m = mn;
  }
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int c = lane + 32 * i;
    if (c < p.dv) sacc[warp * p.dv + c] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, sm[w]);
  float wgt[kDecodeWarps], total = 0.0f;
  for (int w = 0; w < kDecodeWarps; ++w) {
    wgt[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);  // a warp that saw no key adds nothing
    total += sl[w] * wgt[w];
  }
  T* o = static_cast<T*>(p.out) + (static_cast<int64_t>(s.row[b]) * p.nh + h) * p.dv;
  for (int c = threadIdx.x; c < p.dv; c += blockDim.x) {
    float x = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) x += sacc[w * p.dv + c] * wgt[w];
    o[c] = from_f32<T>(total > 0.0f ? x / total : 0.0f);  // no key: 0, as attention_forward
  }
}

template <typename T>
void launch_decode(const DecodeParams& p, const DecodeSeqs& s, int nb) {
  const dim3 grid(static_cast<unsigned>(p.nh), static_cast<unsigned>(nb));
  const size_t smem = sizeof(float) * kDecodeWarps * static_cast<size_t>(p.dv);
  const int threads = kDecodeWarps * 32;
  if (p.d <= 64)
    decode_kernel<T, 2><<<grid, threads, smem, stream()>>>(p, s);
  else if (p.d <= 128)
    decode_kernel<T, 4><<<grid, threads, smem, stream()>>>(p, s);
  else if (p.d <= 256)
    decode_kernel<T, 8><<<grid, threads, smem, stream()>>>(p, s);
  else
    decode_kernel<T, 18><<<grid, threads, smem, stream()>>>(p, s);
  AERIE_CUDA_LAUNCHED("attention decode_kernel");
}

}  // namespace

void attention_decode_batch(const Tensor& q, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& k,
                            const std::vector<const Tensor*>& v, const std::vector<int64_t>& lengths, float scale,
                            Tensor& out, int64_t window) {
  constexpr const char* op = "attention_decode_batch (CUDA)";
  DecodeParams p{};
  p.q = q.raw();
  p.out = out.raw();
  p.nh = static_cast<int>(q.dim(1));
  p.d = static_cast<int>(q.dim(2));
  p.dv = static_cast<int>(out.dim(2));
  const int64_t nkv = k[0]->dim(1);
  p.group = static_cast<int>(q.dim(1) / nkv);
  p.dvv = static_cast<int>(v[0]->dim(2));
  p.k_row = nkv * p.d;
  p.v_row = nkv * p.dvv;
  p.scale = scale;
  AERIE_CHECK(p.d <= 576, op << ": head dim " << p.d << " above 576 (MLA's latent) is not implemented");
  p.window = static_cast<int>(std::min<int64_t>(window, INT_MAX));
  if (p.nh == 0 || p.dv == 0) return;
  for (size_t b0 = 0; b0 < rows.size(); b0 += kDecodeMax) {
    const int nb = static_cast<int>(std::min<size_t>(kDecodeMax, rows.size() - b0));
    DecodeSeqs s{};
    for (int i = 0; i < nb; ++i) {
      AERIE_CHECK(lengths[b0 + i] <= INT_MAX && rows[b0 + i] <= INT_MAX,
                  op << ": sequence " << b0 + i << "'s length or row exceeds 2^31");
      s.k[i] = k[b0 + i]->raw();
      s.v[i] = v[b0 + i]->raw();
      s.len[i] = static_cast<int32_t>(lengths[b0 + i]);
      s.row[i] = static_cast<int32_t>(rows[b0 + i]);
    }
    if (q.dtype() == DType::BF16)
      launch_decode<__nv_bfloat16>(p, s, nb);
    else
      launch_decode<float>(p, s, nb);
  }
}

}  // namespace aerie::cuda
