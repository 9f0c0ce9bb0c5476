// CUDA soft cross-entropy, softmax, argmax over rows and the chunk kernel of target_distribution
// (see kernels/cuda/loss.h). One block per row; each thread walks the row with stride blockDim.x in
// ascending order, then a fixed warp/block tree combines the threads, so every result is deterministic.
#include <cmath>

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

// Grid: one block per row. row_loss[r] = w_r CE_r (double); dlogits row = w (softmax(z) - q). dlogits may
// alias logits (each thread overwrites only the elements it reads, after its last read of them).
template <typename T>
__global__ void soft_ce_kernel(const T* logits, const float* __restrict__ target,
                               const float* __restrict__ weight, int64_t k, T* dlogits,
                               double* __restrict__ row_loss) {
  __shared__ CeStats scratch[32];
  const int64_t r = blockIdx.x;
  const T* z = logits + r * k;
  const float* q = target + r * k;
  T* dz = dlogits ? dlogits + r * k : nullptr;
  const float w = weight[r];
  if (w == 0.0f) {  // the whole block takes this branch
    if (dz)
      for (int64_t i = threadIdx.x; i < k; i += blockDim.x) dz[i] = from_f32<T>(0.0f);
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  CeStats st = CeMerge::identity();
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    const float zi = to_f32(z[i]), qi = q[i];
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
  const double lse = static_cast<double>(st.m) + log(st.s);
  if (threadIdx.x == 0) row_loss[r] = static_cast<double>(w) * (st.sq * lse - st.qz);  // -sum q (z - lse)
  if (dz)
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      const float p = expf(static_cast<float>(static_cast<double>(to_f32(z[i])) - lse));
      dz[i] = from_f32<T>(w * (p - q[i]));
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

// One block per row of the chunk: argmax over the V logits, then the softmax of the K selected ones.
__global__ void target_rows_kernel(const float* __restrict__ logits, int64_t v, const int64_t* __restrict__ sel,
                                   int64_t k, float* __restrict__ probs, int64_t* __restrict__ argmax,
                                   int* __restrict__ bad_ids) {
  __shared__ ArgMax am_scratch[32];
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* l = logits + r * v;
  ArgMax a = thread_argmax(l, v);
  a = block_reduce<ArgMaxMerge>(a, am_scratch);
  if (threadIdx.x == 0) argmax[r] = a.i;
  auto gathered = [&](int64_t j) {
    const int64_t s = sel[j];
    return (s >= 0 && s < v) ? l[s] : NAN;
  };
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const int64_t s = sel[j];
    if (s < 0 || s >= v) atomicExch(bad_ids, 1);
    m = fmaxf(m, gathered(j));
  }
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) sum += expf(gathered(j) - m);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  float* p = probs + r * k;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) p[j] = expf(gathered(j) - m) * inv;
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

double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits) {
  const int64_t n = logits.dim(0), k = logits.dim(1);
  if (n == 0 || k == 0) return 0.0;  // no term (dlogits is empty)
  // Row losses [n] and their sum [1], as doubles in the bytes of an I64 tensor (there is no F64 dtype).
  Tensor buf = Tensor::empty({n + 1}, DType::I64, Device::CUDA);
  double* row_loss = static_cast<double*>(buf.raw());
  const int threads = row_threads(k);
  const auto grid = static_cast<unsigned>(n);
  if (logits.dtype() == DType::F32) {
    soft_ce_kernel<float><<<grid, threads, 0, stream()>>>(ptr<float>(logits), ptr<float>(target),
                                                          ptr<float>(weight), k,
                                                          dlogits ? ptr<float>(*dlogits) : nullptr, row_loss);
  } else {
    soft_ce_kernel<__nv_bfloat16><<<grid, threads, 0, stream()>>>(
        ptr<__nv_bfloat16>(logits), ptr<float>(target), ptr<float>(weight), k,
        dlogits ? ptr<__nv_bfloat16>(*dlogits) : nullptr, row_loss);
  }
  AERIE_CUDA_LAUNCHED("soft_ce_kernel");
  sum_kernel<<<1, 1024, 0, stream()>>>(row_loss, n, row_loss + n);
  AERIE_CUDA_LAUNCHED("sum_kernel");
  double total = 0.0;
  aerie::cuda::memcpy(&total, row_loss + n, sizeof(double));  // waits for the stream (host destination)
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

void target_rows(const Tensor& logits, const Tensor& selected, Tensor& probs, Tensor& argmax, Tensor& bad_ids) {
  const int64_t n = logits.dim(0), v = logits.dim(1), k = selected.dim(0);
  if (n == 0) return;
  target_rows_kernel<<<static_cast<unsigned>(n), row_threads(v), 0, stream()>>>(
      ptr<float>(logits), v, ptr<int64_t>(selected), k, ptr<float>(probs), ptr<int64_t>(argmax),
      static_cast<int*>(bad_ids.raw()));
  AERIE_CUDA_LAUNCHED("target_rows_kernel");
}

}  // namespace aerie::cuda
