// CUDA fused forward ops, the math of cpu/fused.cc in fp32 (contract in kernels/fused.h):
//  - qkv_rope: x = a head vector of the packed q/k/v row; optional RMSNorm over the head (warp sum of
//    squares), then y_i = x_i c - x_{i+d/2} s, y_{i+d/2} = x_{i+d/2} c + x_i s (q and k heads), v copied.
//    sincosf is the accurate version (no fast math; the same results as cosf/sinf in cuda/rope.cu).
//  - swiglu_packed: out = (g sigmoid(g)) u with g, u the two halves of a packed row (accurate expf).
//  - add_rmsnorm: r += x, y = w (r rs), rs = 1 / sqrt(mean(r^2) + eps), as cuda/norm.cu.
// Each op has a general kernel (any dtypes and sizes) and a 16-byte-vector kernel for the common case
// (BF16 activations, sizes a multiple of 4 or 8, aligned buffers), chosen at launch; both compute the same
// fp32 values and round once at the store.
#include <algorithm>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/fused.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 512;  // 2 KiB of kernel arguments, as cuda/rope.cu

struct InvFreq {
  float v[kMaxHalf];
};

// grid (ceil(n (nq + 2 nkv) / 8)), block (256): warp w of the block = one (row t, head h) item, lane l =
// the pairs (i, i + half) for i = l, l + 32, ... (at most kMaxHalf / 32 = 16 pairs per lane, held in
// registers). The inverse frequencies are copied from the kernel arguments to shared memory first:
// lanes reading 32 different argument addresses would be serialised by the constant cache. kPairsPerLane
// (1, 2, 4, 8 or 16) is the smallest that covers half.
constexpr int kWarpsPerBlock = kThreads / 32;

template <int kPairsPerLane>
__global__ void __launch_bounds__(kThreads) qkv_rope_kernel(CFloats qkv, const int32_t* positions,
                                                            const __grid_constant__ InvFreq inv, CFloats q_norm,
                                                            CFloats k_norm, bool norm, float eps, int64_t nq,
                                                            int64_t nkv, int64_t half, int64_t items, Floats q,
                                                            Floats k, Floats v) {
  __shared__ float s_inv[kMaxHalf];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) s_inv[i] = inv.v[i];
  __syncthreads();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= items) return;  // the whole warp
  const int lane = threadIdx.x & 31;
  const int64_t heads = nq + 2 * nkv, d = 2 * half;
  const int64_t t = item / heads, h = item - t * heads;
  const int64_t src = item * d;
  float a[kPairsPerLane], b[kPairsPerLane];
#pragma unroll
  for (int j = 0; j < kPairsPerLane; ++j) {
    const int64_t i = lane + 32 * j;
    a[j] = i < half ? qkv[src + i] : 0.0f;
    b[j] = i < half ? qkv[src + i + half] : 0.0f;
  }
  if (h >= nq + nkv) {  // a v head: copied
    const int64_t dst = (t * nkv + (h - nq - nkv)) * d;
#pragma unroll
    for (int j = 0; j < kPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < half) {
        v.set(dst + i, a[j]);
        v.set(dst + i + half, b[j]);
      }
    }
    return;
  }
  const bool is_q = h < nq;
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairsPerLane; ++j) ss += a[j] * a[j] + b[j] * b[j];
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    const CFloats w = is_q ? q_norm : k_norm;
#pragma unroll
    for (int j = 0; j < kPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < half) {
        a[j] = w[i] * (a[j] * rs);
        b[j] = w[i + half] * (b[j] * rs);
      }
    }
  }
  const float p = static_cast<float>(positions[t]);
  const Floats out = is_q ? q : k;
  const int64_t dst = is_q ? (t * nq + h) * d : (t * nkv + (h - nq)) * d;
#pragma unroll
  for (int j = 0; j < kPairsPerLane; ++j) {
    const int64_t i = lane + 32 * j;
    if (i < half) {
      float s, c;
      sincosf(p * s_inv[i], &s, &c);
      out.set(dst + i, a[j] * c - b[j] * s);
      out.set(dst + i + half, b[j] * c + a[j] * s);
    }
  }
}

// BF16 q/k/v rows without q/k norms, half a multiple of 8, 16-byte aligned buffers: one block per row
// t. Every rotated head of the row has the same angles, so cos/sin of the half frequencies are computed
// once per row into shared memory (sincosf, as above: the same bits as the warp kernel), then each
// thread moves 8 + 8 elements (x_i..x_{i+7} and x_{i+half}..x_{i+half+7} of one head) with 16-byte
// loads and stores.
__global__ void __launch_bounds__(kThreads) qkv_rope_bf16_row_kernel(const __nv_bfloat16* qkv,
                                                                     const int32_t* positions,
                                                                     const __grid_constant__ InvFreq inv, int nq,
                                                                     int nkv, int half, __nv_bfloat16* q,
                                                                     __nv_bfloat16* k, __nv_bfloat16* v) {
  __shared__ float s_cos[kMaxHalf], s_sin[kMaxHalf];
  const int64_t t = blockIdx.x;
  const float p = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) sincosf(p * inv.v[i], &s_sin[i], &s_cos[i]);
  __syncthreads();
  const int heads = nq + 2 * nkv, groups = half / 8, d = 2 * half;
  const __nv_bfloat16* row = qkv + t * heads * d;
  for (int c = threadIdx.x; c < heads * groups; c += blockDim.x) {
    const int h = c / groups, i0 = (c - h * groups) * 8;
    const uint4 a4 = *reinterpret_cast<const uint4*>(row + h * d + i0);
    const uint4 b4 = *reinterpret_cast<const uint4*>(row + h * d + half + i0);
    __nv_bfloat16* dst = h < nq        ? q + (t * nq + h) * d
                         : h < nq + nkv ? k + (t * nkv + (h - nq)) * d
                                        : v + (t * nkv + (h - nq - nkv)) * d;
    if (h >= nq + nkv) {  // a v head: copied
      *reinterpret_cast<uint4*>(dst + i0) = a4;
      *reinterpret_cast<uint4*>(dst + half + i0) = b4;
      continue;
    }
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a4);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b4);
    uint4 y4, z4;
    __nv_bfloat162* y2 = reinterpret_cast<__nv_bfloat162*>(&y4);
    __nv_bfloat162* z2 = reinterpret_cast<__nv_bfloat162*>(&z4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __bfloat1622float2(a2[e]), b = __bfloat1622float2(b2[e]);
      const int i = i0 + 2 * e;
      const float c0 = s_cos[i], s0 = s_sin[i], c1 = s_cos[i + 1], s1 = s_sin[i + 1];
      y2[e] = __floats2bfloat162_rn(a.x * c0 - b.x * s0, a.y * c1 - b.y * s1);
      z2[e] = __floats2bfloat162_rn(b.x * c0 + a.x * s0, b.y * c1 + a.y * s1);
    }
    *reinterpret_cast<uint4*>(dst + i0) = y4;
    *reinterpret_cast<uint4*>(dst + half + i0) = z4;
  }
}

// Any dtypes and sizes: one thread per output element.
__global__ void swiglu_packed_kernel(CFloats gu, int64_t inter, int64_t total, Floats out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx / inter, j = idx % inter;
  const float g = gu[t * 2 * inter + j], u = gu[t * 2 * inter + inter + j];
  out.set(idx, g * (1.0f / (1.0f + expf(-g))) * u);
}

// BF16 in and out, I a multiple of 8, 16-byte aligned buffers: one thread per 8 outputs (16-byte loads
// and stores); chunk c of the output = row c / cpr, 8-column group c % cpr (cpr = I / 8).
template <typename Index>
__global__ void swiglu_packed_bf16x8_kernel(const uint4* gu, Index cpr, Index chunks, uint4* out) {
  const Index c = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const Index t = c / cpr, j = c - t * cpr;
  const uint4 g4 = gu[t * 2 * cpr + j], u4 = gu[t * 2 * cpr + cpr + j];
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g4);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u4);
  uint4 o4;
  __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o4);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 g = __bfloat1622float2(g2[e]), u = __bfloat1622float2(u2[e]);
    o2[e] = __floats2bfloat162_rn(g.x * (1.0f / (1.0f + expf(-g.x))) * u.x, g.y * (1.0f / (1.0f + expf(-g.y))) * u.y);
  }
  out[c] = o4;
}

// grid (n), block (kThreads): one row. Each thread reads back only the r elements it wrote itself.
__global__ void add_rmsnorm_kernel(float* r, CFloats x, CFloats w, float eps, int64_t h, Floats y) {
  __shared__ float scratch[32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float s = r[off + j] + x[off + j];
    r[off + j] = s;
    ss += s * s;
  }
  ss = block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) y.set(off + j, w[j] * (r[off + j] * rs));
}

// H a multiple of 4 and at most IT * 4 * kThreads, r 16-byte and x, y 8-byte (BF16) or 16-byte (F32)
// aligned: the same math with 4 consecutive columns per thread and pass, the sums r + x kept in
// registers between the two passes (r is read once and written once).
template <int IT>
__global__ void __launch_bounds__(kThreads) add_rmsnorm_vec4_kernel(float* r, CFloats x, CFloats w, float eps,
                                                                    int64_t h, Floats y) {
  __shared__ float scratch[32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * h;
  float4 s[IT];
  float ss = 0.0f;
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int64_t col = (static_cast<int64_t>(it) * kThreads + threadIdx.x) * 4;
    if (col < h) {
      float4 rv = *reinterpret_cast<const float4*>(r + off + col);
      float4 xv;
      if (x.bf16) {
        const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(x.p) + off + col);
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
        xv = make_float4(lo.x, lo.y, hi.x, hi.y);
      } else {
        xv = *reinterpret_cast<const float4*>(static_cast<const float*>(x.p) + off + col);
      }
      rv = make_float4(rv.x + xv.x, rv.y + xv.y, rv.z + xv.z, rv.w + xv.w);
      *reinterpret_cast<float4*>(r + off + col) = rv;
      ss += rv.x * rv.x + rv.y * rv.y + rv.z * rv.z + rv.w * rv.w;
      s[it] = rv;
    }
  }
  ss = block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
#pragma unroll
  for (int it = 0; it < IT; ++it) {
    const int64_t col = (static_cast<int64_t>(it) * kThreads + threadIdx.x) * 4;
    if (col < h) {
      const float4 o = make_float4(w[col] * (s[it].x * rs), w[col + 1] * (s[it].y * rs),
                                   w[col + 2] * (s[it].z * rs), w[col + 3] * (s[it].w * rs));
      if (y.bf16) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
        uint2 raw;
        raw.x = *reinterpret_cast<const uint32_t*>(&lo);
        raw.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(y.p) + off + col) = raw;
      } else {
        *reinterpret_cast<float4*>(static_cast<float*>(y.p) + off + col) = o;
      }
    }
  }
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void qkv_rope_forward(const Tensor& qkv, const Tensor& positions, const std::vector<float>& inv_freq,
                      const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t n = q.dim(0), nq = q.dim(1), nkv = k.dim(1), half = q.dim(2) / 2;
  AERIE_CHECK(half <= kMaxHalf, "qkv_rope_forward: head_dim " << 2 * half << " exceeds the CUDA kernel's limit of "
                                                              << 2 * kMaxHalf);
  if (n == 0) return;
  InvFreq inv{};
  std::copy(inv_freq.begin(), inv_freq.end(), inv.v);
  const bool norm = q_norm.defined();
  const CFloats none{nullptr, false};
  const bool all_bf16 = qkv.dtype() == DType::BF16 && q.dtype() == DType::BF16 && k.dtype() == DType::BF16 &&
                        v.dtype() == DType::BF16;
  if (!norm && all_bf16 && half % 8 == 0 && aligned_to(qkv.raw(), 16) && aligned_to(q.raw(), 16) &&
      aligned_to(k.raw(), 16) && aligned_to(v.raw(), 16)) {
    qkv_rope_bf16_row_kernel<<<grid_x(n, "qkv_rope_forward"), kThreads, 0, stream()>>>(
        static_cast<const __nv_bfloat16*>(qkv.raw()), positions.data<int32_t>(), inv, static_cast<int>(nq),
        static_cast<int>(nkv), static_cast<int>(half), static_cast<__nv_bfloat16*>(q.raw()),
        static_cast<__nv_bfloat16*>(k.raw()), static_cast<__nv_bfloat16*>(v.raw()));
    AERIE_CUDA_LAUNCHED("qkv_rope_bf16_row_kernel");
    return;
  }
  const int64_t items = n * (nq + 2 * nkv);
  const unsigned blocks = grid_x((items + kWarpsPerBlock - 1) / kWarpsPerBlock, "qkv_rope_forward");
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kThreads, 0, stream()>>>(cfloats(qkv), positions.data<int32_t>(), inv,
                                              norm ? cfloats(q_norm) : none, norm ? cfloats(k_norm) : none, norm,
                                              eps, nq, nkv, half, items, floats(q), floats(k), floats(v));
  };
  if (half <= 32)
    launch(qkv_rope_kernel<1>);
  else if (half <= 64)
    launch(qkv_rope_kernel<2>);
  else if (half <= 128)
    launch(qkv_rope_kernel<4>);
  else if (half <= 256)
    launch(qkv_rope_kernel<8>);
  else
    launch(qkv_rope_kernel<16>);
  AERIE_CUDA_LAUNCHED("qkv_rope_kernel");
}

void swiglu_packed_forward(const Tensor& gu, Tensor& out) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t inter = out.dim(1);
  if (gu.dtype() == DType::BF16 && out.dtype() == DType::BF16 && inter % 8 == 0 && aligned_to(gu.raw(), 16) &&
      aligned_to(out.raw(), 16)) {
    const int64_t chunks = total / 8;
    const auto* src = static_cast<const uint4*>(gu.raw());
    auto* dst = static_cast<uint4*>(out.raw());
    const unsigned blocks = grid_x(blocks_for(chunks, kThreads), "swiglu_packed_forward");
    if (2 * chunks < (int64_t{1} << 32))
      swiglu_packed_bf16x8_kernel<uint32_t><<<blocks, kThreads, 0, stream()>>>(
          src, static_cast<uint32_t>(inter / 8), static_cast<uint32_t>(chunks), dst);
    else
      swiglu_packed_bf16x8_kernel<uint64_t><<<blocks, kThreads, 0, stream()>>>(
          src, static_cast<uint64_t>(inter / 8), static_cast<uint64_t>(chunks), dst);
    AERIE_CUDA_LAUNCHED("swiglu_packed_bf16x8_kernel");
    return;
  }
  swiglu_packed_kernel<<<grid_x(blocks_for(total, kThreads), "swiglu_packed_forward"), kThreads, 0, stream()>>>(
      cfloats(gu), inter, total, floats(out));
  AERIE_CUDA_LAUNCHED("swiglu_packed_kernel");
}

void add_rmsnorm_forward(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  const int64_t n = r.dim(0), h = r.dim(1);
  if (n == 0 || h == 0) return;
  const unsigned blocks = grid_x(n, "add_rmsnorm_forward");
  const uintptr_t xa = x.dtype() == DType::BF16 ? 8 : 16, ya = y.dtype() == DType::BF16 ? 8 : 16;
  const int64_t per_pass = 4 * kThreads;
  if (h % 4 == 0 && h <= 8 * per_pass && aligned_to(r.raw(), 16) && aligned_to(x.raw(), xa) &&
      aligned_to(y.raw(), ya)) {
    const int passes = static_cast<int>((h + per_pass - 1) / per_pass);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream()>>>(r.data<float>(), cfloats(x), cfloats(w), eps, h, floats(y));
    };
    if (passes == 1)
      launch(add_rmsnorm_vec4_kernel<1>);
    else if (passes == 2)
      launch(add_rmsnorm_vec4_kernel<2>);
    else if (passes <= 4)
      launch(add_rmsnorm_vec4_kernel<4>);
    else
      launch(add_rmsnorm_vec4_kernel<8>);
    AERIE_CUDA_LAUNCHED("add_rmsnorm_vec4_kernel");
    return;
  }
  add_rmsnorm_kernel<<<blocks, kThreads, 0, stream()>>>(r.data<float>(), cfloats(x), cfloats(w), eps, h, floats(y));
  AERIE_CUDA_LAUNCHED("add_rmsnorm_kernel");
}

}  // namespace aerie::cuda
