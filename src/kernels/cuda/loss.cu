// CUDA soft cross-entropy, softmax, argmax over rows and the chunk kernel of target_distribution
// (see kernels/cuda/loss.h). One block per row; each thread walks the row with stride blockDim.x in
// ascending order, then a fixed warp/block tree combines the threads, so every result is deterministic.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/loss.h"

namespace aerie::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

/// Threads per row block: enough to cover a row of k in a few strides.
int row_threads(int64_t k) { return k >= 8192 ? 512 : k >= 1024 ? 256 : 128; }

/// __shfl_xor_sync of a trivially copyable struct, one 32-bit word at a time.
template <typename S>
__device__ __forceinline__ S shfl_xor(const S& v, int lane_mask) {
  static_assert(sizeof(S) % 4 == 0, "shuffled structs are made of 32-bit words");
  S r;
  const int* src = reinterpret_cast<const int*>(&v);
  int* dst = reinterpret_cast<int*>(&r);
#pragma unroll
  for (int w = 0; w < static_cast<int>(sizeof(S) / 4); ++w) dst[w] = __shfl_xor_sync(kFull, src[w], lane_mask);
  return r;
}

/// Combines the values of all threads of the block with Op::merge (associative; `Op::identity()` for
/// the idle lanes); every thread gets the result. blockDim.x a multiple of 32; scratch: __shared__ S[32].
/// Starts with __syncthreads, so scratch may be reused by consecutive calls.
template <typename Op, typename S>
__device__ S block_reduce(S v, S* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = Op::merge(v, shfl_xor(v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : Op::identity();
  for (int o = 16; o > 0; o >>= 1) v = Op::merge(v, shfl_xor(v, o));
  return v;
}

/// Online-softmax statistics of a part of a row: m = max z, s = sum exp(z - m) (0 while m = -inf),
/// qz = sum q z and sq = sum q over the entries with q != 0.
struct CeStats {
  float m;
  float pad;
  double s, qz, sq;
};
struct CeMerge {
  __device__ static CeStats identity() { return {-INFINITY, 0.0f, 0.0, 0.0, 0.0}; }
  __device__ static CeStats merge(const CeStats& a, const CeStats& b) {
    CeStats r{fmaxf(a.m, b.m), 0.0f, 0.0, a.qz + b.qz, a.sq + b.sq};
    if (r.m == -INFINITY) return r;
    // Rescales in double (a handful per row): only the per-element expf errors remain.
    if (a.m != -INFINITY) r.s += a.s * exp(static_cast<double>(a.m) - static_cast<double>(r.m));
    if (b.m != -INFINITY) r.s += b.s * exp(static_cast<double>(b.m) - static_cast<double>(r.m));
    return r;
  }
};

/// A row maximum and its index (i = -1: none seen). Ties: the smaller index.
struct ArgMax {
  float v;
  int32_t pad;
  int64_t i;
};
struct ArgMaxMerge {
  __device__ static ArgMax identity() { return {-INFINITY, 0, -1}; }
  __device__ static ArgMax merge(const ArgMax& a, const ArgMax& b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

struct SumD {
  __device__ static double identity() { return 0.0; }
  __device__ static double merge(double a, double b) { return a + b; }
};

/// Per thread: the first element it sees, then strictly greater ones (ascending i: the smaller index wins).
template <typename T>
__device__ ArgMax thread_argmax(const T* x, int64_t k) {
  ArgMax a = ArgMaxMerge::identity();
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = to_f32(x[i]);
    if (a.i < 0 || v > a.v) a = {v, 0, i};
  }
  return a;
}

// Grid: one block per row. row_loss[r] = w_r CE_r (double); dlogits row = from_f32<TD>((w (softmax(z) - q))
// * grad_scale) in its own dtype TD; argmax[r] (when non-null) = the row's argmax of z (ties: the smaller
// index), also for rows of weight 0. dlogits may alias logits when TD = T (each thread overwrites only the
// elements it reads, after its last read of them).
template <typename T, typename TD>
__global__ void soft_ce_kernel(const T* logits, const float* __restrict__ target,
                               const float* __restrict__ weight, int64_t k, float grad_scale, TD* dlogits,
                               double* __restrict__ row_loss, int64_t* __restrict__ argmax) {
  __shared__ CeStats scratch[32];
  __shared__ ArgMax am_scratch[32];
  const int64_t r = blockIdx.x;
  const T* z = logits + r * k;
  const float* q = target + r * k;
  TD* dz = dlogits ? dlogits + r * k : nullptr;
  const float w = weight[r];
  if (w == 0.0f) {  // the whole block takes this branch
    if (argmax) {
      const ArgMax a = block_reduce<ArgMaxMerge>(thread_argmax(z, k), am_scratch);
      if (threadIdx.x == 0) argmax[r] = a.i;
      __syncthreads();  // every thread has read z before a dz that aliases it is zeroed
    }
    if (dz)
      for (int64_t i = threadIdx.x; i < k; i += blockDim.x) dz[i] = from_f32<TD>(0.0f);
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  CeStats st = CeMerge::identity();
  ArgMax a = ArgMaxMerge::identity();
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const float zi = to_f32(z[i]), qi = q[i];
    if (a.i < 0 || zi > a.v) a = {zi, 0, i};
    if (zi > st.m) {
      st.s = (st.m == -INFINITY ? 0.0 : st.s * exp(static_cast<double>(st.m) - static_cast<double>(zi))) + 1.0;
      st.m = zi;
    } else if (zi != -INFINITY) {
      st.s += static_cast<double>(expf(zi - st.m));
    }
    if (qi != 0.0f) {
      st.qz += static_cast<double>(qi) * static_cast<double>(zi);
      st.sq += static_cast<double>(qi);
    }
  }
  st = block_reduce<CeMerge>(st, scratch);
  if (argmax) {
    a = block_reduce<ArgMaxMerge>(a, am_scratch);
    if (threadIdx.x == 0) argmax[r] = a.i;
  }
  const double lse = static_cast<double>(st.m) + log(st.s);
  if (threadIdx.x == 0) row_loss[r] = static_cast<double>(w) * (st.sq * lse - st.qz);  // -sum q (z - lse)
  if (dz)
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      const float p = expf(static_cast<float>(static_cast<double>(to_f32(z[i])) - lse));
      const float g = w * (p - q[i]);
      dz[i] = from_f32<TD>(grad_scale == 1.0f ? g : g * grad_scale);
    }
}

// One block: *out = sum of x[0..n) in a fixed order.
__global__ void sum_kernel(const double* __restrict__ x, int64_t n, double* __restrict__ out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_reduce<SumD>(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t k) {  // x may alias y: no __restrict__
  __shared__ float scratch[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * k;
  T* yr = y + static_cast<int64_t>(blockIdx.x) * k;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, to_f32(xr[i]));
  m = block_max(m, scratch);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) s += expf(to_f32(xr[i]) - m);
  s = block_sum(s, scratch);
  const float inv = 1.0f / s;
  // Each thread rewrites only the elements it read: safe in place.
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) yr[i] = from_f32<T>(expf(to_f32(xr[i]) - m) * inv);
}

template <typename T>
__global__ void argmax_kernel(const T* __restrict__ x, int64_t k, int64_t* __restrict__ out) {
  __shared__ ArgMax scratch[32];
  ArgMax a = thread_argmax(x + static_cast<int64_t>(blockIdx.x) * k, k);
  a = block_reduce<ArgMaxMerge>(a, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = a.i;
}

// The inverse of the draft vocabulary for target_rows_kernel: dindex[v] = j where selected[j] = v, else
// -1 (dindex filled with -1 before). A selected id outside [0, v) sets *bad_ids to 1, one not above its
// predecessor to 2 (the CPU's "ascending" rule).
__global__ void draft_index_kernel(const int64_t* __restrict__ sel, int64_t k, int64_t v, int32_t* __restrict__ dindex,
                                   int* __restrict__ bad_ids) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < k; j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = sel[j];
    if (s < 0 || s >= v) {
      atomicExch(bad_ids, 1);
    } else {
      if (j > 0 && s <= sel[j - 1]) atomicExch(bad_ids, 2);
      dindex[s] = static_cast<int32_t>(j);
    }
  }
}

// One block per row of the chunk, one pass over the V logits: their argmax, and each selected logit
// copied to its place in the row's probs (through dindex) with the running maximum of those; then the
// softmax of the row's K copied logits in place (they are in L2, 4 K bytes a row). The sum and the
// outputs walk j with stride blockDim.x as the gathering version did, so the values are the same.
// 16-byte loads where V % 4 == 0 (the row then starts 16-byte aligned: the logits buffer is 256-byte aligned).
__global__ void target_rows_kernel(const float* __restrict__ logits, int64_t v, const int64_t* __restrict__ sel,
                                   const int32_t* __restrict__ dindex, int64_t k, float* __restrict__ probs,
                                   int64_t* __restrict__ argmax) {
  __shared__ ArgMax am_scratch[32];
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * v;
  float* p = probs + r * k;
  ArgMax a = ArgMaxMerge::identity();
  float m = -INFINITY;
  auto visit = [&](float x, int64_t i, int32_t j) {
    if (a.i < 0 || x > a.v) a = {x, 0, i};
    if (j >= 0) {
      p[j] = x;
      m = fmaxf(m, x);
    }
  };
  if (v % 4 == 0) {
    const auto* l4 = reinterpret_cast<const float4*>(l);
    const auto* d4 = reinterpret_cast<const int4*>(dindex);
    // Four 16-byte loads of logits (and of dindex) in flight per thread before any of them is used.
    constexpr int kU = 4;
    const int64_t nq = v / 4, step = blockDim.x;
    int64_t q = threadIdx.x;
    for (; q + (kU - 1) * step < nq; q += kU * step) {
      float4 x[kU];
      int4 d[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        x[u] = l4[q + u * step];
        d[u] = d4[q + u * step];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = 4 * (q + u * step);
        visit(x[u].x, i, d[u].x);
        visit(x[u].y, i + 1, d[u].y);
        visit(x[u].z, i + 2, d[u].z);
        visit(x[u].w, i + 3, d[u].w);
      }
    }
    for (; q < nq; q += step) {
      const float4 x = l4[q];
      const int4 d = d4[q];
      visit(x.x, 4 * q, d.x);
      visit(x.y, 4 * q + 1, d.y);
      visit(x.z, 4 * q + 2, d.z);
      visit(x.w, 4 * q + 3, d.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) visit(l[i], i, dindex[i]);
  }
  a = block_reduce<ArgMaxMerge>(a, am_scratch);
  if (threadIdx.x == 0) argmax[r] = a.i;
  m = block_max(m, scratch);  // starts with __syncthreads: every p[j] of the row is written
  auto value = [&](int64_t j) {
    const int64_t s = sel[j];
    return (s >= 0 && s < v) ? p[j] : NAN;
  };
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) sum += expf(value(j) - m);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) p[j] = expf(value(j) - m) * inv;
}

template <typename T>
const T* ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}
template <typename T>
T* ptr(Tensor& t) {
  return static_cast<T*>(t.raw());
}

}  // namespace

namespace {

template <typename T, typename TD>
void launch_soft_ce(const Tensor& logits, const Tensor& target, const Tensor& weight, float grad_scale,
                    Tensor* dlogits, double* row_loss, int64_t* argmax) {
  const int64_t n = logits.dim(0), k = logits.dim(1);
  soft_ce_kernel<T, TD><<<static_cast<unsigned>(n), row_threads(k), 0, stream()>>>(
      ptr<T>(logits), ptr<float>(target), ptr<float>(weight), k, grad_scale, dlogits ? ptr<TD>(*dlogits) : nullptr,
      row_loss, argmax);
  AERIE_CUDA_LAUNCHED("soft_ce_kernel");
}

}  // namespace

double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits,
                          float grad_scale, int64_t* argmax_host) {
  const int64_t n = logits.dim(0), k = logits.dim(1);
  if (n == 0) return 0.0;  // no row (dlogits and argmax are empty)
  if (k == 0) {
    AERIE_CHECK(!argmax_host, "soft_cross_entropy: an argmax of rows without entries");
    return 0.0;  // no term (dlogits is empty)
  }
  // Row losses [n], their sum [1] (doubles in the bytes of I64 elements: there is no F64 dtype) and the
  // argmaxes [n]: one buffer, so that one copy brings the loss and the argmaxes to the host.
  Tensor buf = Tensor::empty({2 * n + 1}, DType::I64, Device::CUDA);
  double* row_loss = static_cast<double*>(buf.raw());
  int64_t* am = argmax_host ? static_cast<int64_t*>(buf.raw()) + n + 1 : nullptr;
  const bool z32 = logits.dtype() == DType::F32, d32 = !dlogits || dlogits->dtype() == DType::F32;
  if (z32 && d32) launch_soft_ce<float, float>(logits, target, weight, grad_scale, dlogits, row_loss, am);
  if (z32 && !d32) launch_soft_ce<float, __nv_bfloat16>(logits, target, weight, grad_scale, dlogits, row_loss, am);
  if (!z32 && d32) launch_soft_ce<__nv_bfloat16, float>(logits, target, weight, grad_scale, dlogits, row_loss, am);
  if (!z32 && !d32)
    launch_soft_ce<__nv_bfloat16, __nv_bfloat16>(logits, target, weight, grad_scale, dlogits, row_loss, am);
  sum_kernel<<<1, 1024, 0, stream()>>>(row_loss, n, row_loss + n);
  AERIE_CUDA_LAUNCHED("sum_kernel");
  std::vector<int64_t> host(static_cast<size_t>(argmax_host ? n + 1 : 1));
  aerie::cuda::memcpy(host.data(), row_loss + n, host.size() * sizeof(int64_t));  // waits (host destination)
  if (argmax_host) std::copy(host.begin() + 1, host.end(), argmax_host);
  double total = 0.0;
  std::memcpy(&total, host.data(), sizeof total);
  return total;
}

void softmax_rows(const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), k = x.dim(1);
  if (n == 0 || k == 0) return;
  const int threads = row_threads(k);
  const auto grid = static_cast<unsigned>(n);
  if (x.dtype() == DType::F32)
    softmax_kernel<float><<<grid, threads, 0, stream()>>>(ptr<float>(x), ptr<float>(y), k);
  else
    softmax_kernel<__nv_bfloat16><<<grid, threads, 0, stream()>>>(ptr<__nv_bfloat16>(x), ptr<__nv_bfloat16>(y), k);
  AERIE_CUDA_LAUNCHED("softmax_kernel");
}

void argmax_rows(const Tensor& x, int64_t* out_host) {
  const int64_t n = x.dim(0), k = x.dim(1);
  if (n == 0) return;
  Tensor out = Tensor::empty({n}, DType::I64, Device::CUDA);
  const int threads = row_threads(k);
  const auto grid = static_cast<unsigned>(n);
  if (x.dtype() == DType::F32)
    argmax_kernel<float><<<grid, threads, 0, stream()>>>(ptr<float>(x), k, ptr<int64_t>(out));
  else
    argmax_kernel<__nv_bfloat16><<<grid, threads, 0, stream()>>>(ptr<__nv_bfloat16>(x), k, ptr<int64_t>(out));
  AERIE_CUDA_LAUNCHED("argmax_kernel");
  aerie::cuda::memcpy(out_host, out.raw(), static_cast<size_t>(n) * sizeof(int64_t));  // waits (host destination)
}

void draft_index(const Tensor& selected, Tensor& dindex, Tensor& bad_ids) {
  const int64_t k = selected.dim(0), v = dindex.dim(0);
  AERIE_CUDA_CHECK(cudaMemsetAsync(dindex.raw(), 0xff, static_cast<size_t>(v) * sizeof(int32_t), stream()),
                   "target_distribution: cudaMemsetAsync of the draft index");
  if (k == 0) return;
  constexpr int threads = 256;
  draft_index_kernel<<<std::min(blocks_for(k, threads), 1024u), threads, 0, stream()>>>(
      ptr<int64_t>(selected), k, v, ptr<int32_t>(dindex), static_cast<int*>(bad_ids.raw()));
  AERIE_CUDA_LAUNCHED("draft_index_kernel");
}

void target_rows(const Tensor& logits, const Tensor& selected, const Tensor& dindex, Tensor& probs, Tensor& argmax) {
  const int64_t n = logits.dim(0), v = logits.dim(1), k = selected.dim(0);
  if (n == 0) return;
  target_rows_kernel<<<static_cast<unsigned>(n), row_threads(v), 0, stream()>>>(
      ptr<float>(logits), v, ptr<int64_t>(selected), ptr<int32_t>(dindex), k, ptr<float>(probs), ptr<int64_t>(argmax));
  AERIE_CUDA_LAUNCHED("target_rows_kernel");
}

}  // namespace aerie::cuda
