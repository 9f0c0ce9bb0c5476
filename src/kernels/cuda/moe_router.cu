// CUDA MoE routers (noaux_tc; softmax top-k; fp32) and expert sort (kernels/moe_router.h). The router: one warp per token,
// scores and choices in shared memory; group scores and the group selection done serially in the order of
// cpu/moe_router.cc; each of the top_k picks a warp argmax under the same rule (larger value, then lower
// index). The weights are summed by lane 0 in slot order, as the CPU. The expert sort: CUB's stable radix
// sort of the pairs by expert, then each expert's offset by binary search.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/moe_router.h"

namespace aerie::cuda {
namespace {

struct Pick {
  float v;
  int idx;  // -1: none yet
};
// The better of two candidates: any over none, then the larger value, then the lower index.
__device__ __forceinline__ Pick better(Pick a, Pick b) {
  if (a.idx < 0) return b;
  if (b.idx < 0) return a;
  return (b.v > a.v || (b.v == a.v && b.idx < a.idx)) ? b : a;
}

// grid (T), block (32); shared: score, choice (E floats each), taken (E bytes), gscore (n_group floats), kept.
__global__ void router_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int e, int n_group,
                              int topk_group, int k, bool norm, float scaling, int32_t* __restrict__ indices,
                              float* __restrict__ weights) {
  extern __shared__ float smem[];
  float* score = smem;
  float* choice = score + e;
  float* gscore = choice + e;
  char* taken = reinterpret_cast<char*>(gscore + n_group);
  char* kept = taken + e;
  const int lane = threadIdx.x, gsize = e / n_group;
  const int64_t r = blockIdx.x;
  for (int j = lane; j < e; j += 32) {
    const float s = 1.0f / (1.0f + expf(-logits[r * e + j]));
    score[j] = s;
    choice[j] = s + bias[j];
  }
  __syncwarp();
  for (int g = lane; g < n_group; g += 32) {
    float m1 = -INFINITY, m2 = -INFINITY;
    for (int j = g * gsize; j < (g + 1) * gsize; ++j) {
      const float c = choice[j];
      if (c > m1) {
        m2 = m1;
        m1 = c;
      } else if (c > m2) {
        m2 = c;
      }
    }
    gscore[g] = m1 + m2;
    kept[g] = 0;
  }
  __syncwarp();
  if (lane == 0) {
    for (int i = 0; i < topk_group; ++i) {
      int best = -1;
      for (int g = 0; g < n_group; ++g)
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      kept[best] = 1;
    }
  }
  __syncwarp();
  for (int j = lane; j < e; j += 32) taken[j] = !kept[j / gsize];
  __syncwarp();
  for (int i = 0; i < k; ++i) {
    Pick p{0.0f, -1};
    for (int j = lane; j < e; j += 32)
      if (!taken[j]) p = better(p, Pick{choice[j], j});
    for (int o = 16; o > 0; o >>= 1) {
      Pick q{__shfl_xor_sync(0xffffffffu, p.v, o), __shfl_xor_sync(0xffffffffu, p.idx, o)};
      p = better(p, q);
    }
    if (lane == 0) {
      taken[p.idx] = 1;
      indices[r * k + i] = p.idx;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += score[indices[r * k + i]];
    const float den = sum + 1e-20f;
    for (int i = 0; i < k; ++i) {
      float w = score[indices[r * k + i]];
      if (norm) w /= den;
      weights[r * k + i] = w * scaling;
    }
  }
}

// grid (T), block (32); shared: p (E floats), taken (E bytes). The softmax top-k router of cpu/moe_router.cc:
// the max by warp reduction (order-free), the exponentials per lane, their sum and the weights by lane 0 in
// expert / slot order as the CPU, each pick a warp argmax under the same rule.
__global__ void softmax_router_kernel(const float* __restrict__ logits, int e, int k, bool norm, float scaling,
                                      int32_t* __restrict__ indices, float* __restrict__ weights) {
  extern __shared__ float smem[];
  float* p = smem;
  char* taken = reinterpret_cast<char*>(p + e);
  __shared__ float total;
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
  const float* l = logits + r * e;
  float mx = -INFINITY;
  for (int j = lane; j < e; j += 32) mx = fmaxf(mx, l[j]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  for (int j = lane; j < e; j += 32) {
    p[j] = expf(l[j] - mx);
    taken[j] = 0;
  }
  __syncwarp();
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < e; ++j) sum += p[j];
    total = sum;
  }
  __syncwarp();
  const float sum = total;
  for (int j = lane; j < e; j += 32) p[j] /= sum;
  __syncwarp();
  for (int i = 0; i < k; ++i) {
    Pick q{0.0f, -1};
    for (int j = lane; j < e; j += 32)
      if (!taken[j]) q = better(q, Pick{p[j], j});
    for (int o = 16; o > 0; o >>= 1) {
      Pick x{__shfl_xor_sync(0xffffffffu, q.v, o), __shfl_xor_sync(0xffffffffu, q.idx, o)};
      q = better(q, x);
    }
    if (lane == 0) {
      taken[q.idx] = 1;
      indices[r * k + i] = q.idx;
    }
    __syncwarp();
  }
  if (lane == 0) {
    float picked = 0.0f;
    for (int i = 0; i < k; ++i) picked += p[indices[r * k + i]];
    for (int i = 0; i < k; ++i) {
      float w = p[indices[r * k + i]];
      if (norm) w /= picked;
      weights[r * k + i] = w * scaling;
    }
  }
}

__global__ void fill_tail_kernel(const int32_t* __restrict__ offsets, int e, int64_t pairs, int32_t* __restrict__ perm) {
  for (int64_t p = offsets[e] + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs;
       p += int64_t{gridDim.x} * blockDim.x)
    perm[p] = -1;
}

}  // namespace

void moe_router_noaux_tc(const float* logits, const float* bias, int64_t t, int64_t e, const MoeRouterConfig& cfg,
                         int32_t* indices, float* weights) {
  const size_t smem = static_cast<size_t>(2 * e + cfg.n_group) * sizeof(float) + static_cast<size_t>(e + cfg.n_group);
  AERIE_CHECK(smem <= 48 * 1024, "moe_router_noaux_tc: " << e << " experts need " << smem
                                                         << " bytes of shared memory, more than 48 KiB");
  AERIE_CHECK(t <= INT32_MAX, "moe_router_noaux_tc: " << t << " tokens exceed the grid");
  router_kernel<<<static_cast<unsigned>(t), 32, smem, stream()>>>(
      logits, bias, static_cast<int>(e), static_cast<int>(cfg.n_group), static_cast<int>(cfg.topk_group),
      static_cast<int>(cfg.top_k), cfg.norm_topk_prob, cfg.routed_scaling_factor, indices, weights);
  AERIE_CUDA_LAUNCHED("moe_router_kernel");
}

void moe_router_softmax_topk(const float* logits, int64_t t, int64_t e, const MoeRouterConfig& cfg, int32_t* indices,
                             float* weights) {
  const size_t smem = static_cast<size_t>(e) * (sizeof(float) + 1);
  AERIE_CHECK(smem <= 40 * 1024, "moe_router_softmax_topk: " << e << " experts need " << smem
                                                             << " bytes of shared memory, more than 40 KiB");
  AERIE_CHECK(t <= INT32_MAX, "moe_router_softmax_topk: " << t << " tokens exceed the grid");
  softmax_router_kernel<<<static_cast<unsigned>(t), 32, smem, stream()>>>(
      logits, static_cast<int>(e), static_cast<int>(cfg.top_k), cfg.norm_topk_prob, cfg.routed_scaling_factor,
      indices, weights);
  AERIE_CUDA_LAUNCHED("softmax_router_kernel");
}

namespace {

// The radix sort's keys and values: key = the pair's expert (e for an index outside [0, e): sorted last,
// dropped), value = the pair id.
__global__ void sort_keys_kernel(const int32_t* __restrict__ indices, int64_t pairs, int32_t e, int32_t* __restrict__ keys,
                                 int32_t* __restrict__ ids) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs; p += int64_t{gridDim.x} * blockDim.x) {
    const int32_t x = indices[p];
    keys[p] = x >= 0 && x < e ? x : e;
    ids[p] = static_cast<int32_t>(p);
  }
}

// offsets[j] = the first sorted position whose key is >= j (j = 0 .. e), counts[j] = offsets[j + 1] - offsets[j].
__global__ void sorted_offsets_kernel(const int32_t* __restrict__ keys, int64_t pairs, int32_t e,
                                      int32_t* __restrict__ counts, int32_t* __restrict__ offsets) {
  const int32_t j = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j > e) return;
  auto lower = [&](int32_t v) {
    int64_t lo = 0, hi = pairs;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (keys[mid] < v) lo = mid + 1; else hi = mid;
    }
    return static_cast<int32_t>(lo);
  };
  const int32_t a = lower(j);
  offsets[j] = a;
  if (j < e) counts[j] = lower(j + 1) - a;
}

}  // namespace

void moe_sort_by_expert(const int32_t* indices, int64_t pairs, int64_t e, int32_t* counts, int32_t* offsets,
                        int32_t* perm) {
  // A stable LSD radix sort of the pairs by expert (CUB, ceil(log2(e + 1)) key bits): pair ids ascending
  // within each expert, as the CPU's counting sort; then each expert's first position by binary search.
  AERIE_CHECK(pairs <= INT32_MAX && e < INT32_MAX, "moe_sort_by_expert: " << pairs << " pairs exceed 32 bits");
  const int32_t ne = static_cast<int32_t>(e), n = static_cast<int32_t>(pairs);
  int bits = 1;
  while ((int64_t{1} << bits) <= e) ++bits;
  const cudaStream_t s = stream();
  size_t temp = 0;
  AERIE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, bits, s),
                   "moe_sort_by_expert: cub::DeviceRadixSort (size query)");
  const size_t lists = (3 * static_cast<size_t>(pairs) + 1) * sizeof(int32_t);
  auto* buf = static_cast<char*>(alloc(lists + temp + 256, current_stream()));
  auto* keys_in = reinterpret_cast<int32_t*>(buf);
  int32_t* keys_out = keys_in + pairs;
  int32_t* ids = keys_out + pairs;
  void* tmp = buf + (lists + 255) / 256 * 256;
  if (pairs > 0) {
    sort_keys_kernel<<<std::min(blocks_for(pairs, 256), 4096u), 256, 0, s>>>(indices, pairs, ne, keys_in, ids);
    AERIE_CUDA_LAUNCHED("moe_sort_keys_kernel");
    AERIE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, temp, keys_in, keys_out, ids, perm, n, 0, bits, s),
                     "moe_sort_by_expert: cub::DeviceRadixSort over " << pairs << " pairs");
  }
  sorted_offsets_kernel<<<blocks_for(e + 1, 256), 256, 0, s>>>(keys_out, pairs, ne, counts, offsets);
  AERIE_CUDA_LAUNCHED("moe_sorted_offsets_kernel");
  if (pairs > 0) {
    fill_tail_kernel<<<std::min(blocks_for(pairs, 256), 1024u), 256, 0, s>>>(offsets, ne, pairs, perm);
    AERIE_CUDA_LAUNCHED("moe_fill_tail_kernel");
  }
  free(buf, current_stream());
}

namespace {
__global__ void combine_kernel(const float* y, const float* w, int64_t k, int64_t h, int64_t total, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx / h, j = idx % h;
  float acc = 0.0f;
  for (int64_t s = 0; s < k; ++s) acc += w[t * k + s] * y[(t * k + s) * h + j];
  out[idx] = acc;
}
}  // namespace

void moe_combine(const float* y, const float* weights, int64_t t, int64_t k, int64_t h, float* out) {
  const int64_t total = t * h;
  combine_kernel<<<grid_x(blocks_for(total, 256), "moe_combine"), 256, 0, stream()>>>(y, weights, k, h, total, out);
  AERIE_CUDA_LAUNCHED("moe_combine_kernel");
}

namespace {

// One thread per 16-byte chunk of a row of xs (8 bf16 or 4 f32; H a multiple of it), else per element.
// row_of only (the fused grouped GEMM reads the tokens' rows itself).
__global__ void pair_rows_kernel(const int32_t* __restrict__ perm, int64_t pairs, int32_t* __restrict__ row_of) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < pairs; r += int64_t{gridDim.x} * blockDim.x)
    if (perm[r] >= 0) row_of[perm[r]] = static_cast<int32_t>(r);
}

template <typename T, typename V>
__global__ void gather_pairs_kernel(const T* __restrict__ h, const int32_t* __restrict__ perm, int64_t pairs,
                                    int64_t k, int64_t hd, T* __restrict__ xs, int32_t* __restrict__ row_of) {
  constexpr int64_t kPer = sizeof(V) / sizeof(T);
  const int64_t per_row = hd / kPer, total = pairs * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / per_row, c = i % per_row;
    const int32_t p = perm[r];
    if (p < 0) {  // a pair the sort dropped (an index out of range): a zero row, no output
      V z;
      for (size_t b = 0; b < sizeof(V); ++b) reinterpret_cast<unsigned char*>(&z)[b] = 0;
      reinterpret_cast<V*>(xs + r * hd)[c] = z;
      continue;
    }
    if (c == 0) row_of[p] = static_cast<int32_t>(r);
    reinterpret_cast<V*>(xs + r * hd)[c] = reinterpret_cast<const V*>(h + (p / k) * hd)[c];
  }
}

template <typename T>
__global__ void combine_rows_kernel(const T* __restrict__ ys, const int32_t* __restrict__ row_of,
                                    const float* __restrict__ w, int64_t k, int64_t hd, int64_t total,
                                    float* __restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx / hd, j = idx % hd;
  float acc = 0.0f;
  for (int64_t s = 0; s < k; ++s) {
    const int32_t r = row_of[t * k + s];
    if (r >= 0) acc += w[t * k + s] * to_f32(ys[static_cast<int64_t>(r) * hd + j]);
  }
  out[idx] = acc;
}

template <typename T>
void gather_pairs_as(const T* h, const int32_t* perm, int64_t pairs, int64_t k, int64_t hd, T* xs, int32_t* row_of) {
  const bool vec = hd % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(xs) % 16 == 0;
  const int64_t chunks = pairs * (vec ? hd / (16 / sizeof(T)) : hd);
  const unsigned blocks = std::min(blocks_for(chunks, 256), 65535u * 8u);
  if (vec)
    gather_pairs_kernel<T, uint4><<<blocks, 256, 0, stream()>>>(h, perm, pairs, k, hd, xs, row_of);
  else
    gather_pairs_kernel<T, T><<<blocks, 256, 0, stream()>>>(h, perm, pairs, k, hd, xs, row_of);
  AERIE_CUDA_LAUNCHED("moe_gather_pairs_kernel");
}

}  // namespace

void moe_gather_pairs(const void* h, DType dt, const int32_t* perm, int64_t pairs, int64_t k, int64_t hd, void* xs,
                      int32_t* row_of) {
  // A pair the sort dropped (perm holds -1 for it) keeps row_of -1: moe_combine_rows leaves it out.
  AERIE_CUDA_CHECK(cudaMemsetAsync(row_of, 0xFF, static_cast<size_t>(pairs) * sizeof(int32_t), stream()),
                   "moe_gather_pairs: cudaMemsetAsync of row_of");
  if (xs == nullptr) {
    pair_rows_kernel<<<std::min(blocks_for(pairs, 256), 4096u), 256, 0, stream()>>>(perm, pairs, row_of);
    AERIE_CUDA_LAUNCHED("moe_pair_rows_kernel");
    return;
  }
  if (dt == DType::F32)
    gather_pairs_as(static_cast<const float*>(h), perm, pairs, k, hd, static_cast<float*>(xs), row_of);
  else
    gather_pairs_as(static_cast<const __nv_bfloat16*>(h), perm, pairs, k, hd, static_cast<__nv_bfloat16*>(xs), row_of);
}

void moe_combine_rows(const void* ys, DType dt, const int32_t* row_of, const float* weights, int64_t t, int64_t k,
                      int64_t hd, float* out) {
  const int64_t total = t * hd;
  const unsigned blocks = grid_x(blocks_for(total, 256), "moe_combine_rows");
  if (dt == DType::F32)
    combine_rows_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const float*>(ys), row_of, weights, k, hd, total, out);
  else
    combine_rows_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const __nv_bfloat16*>(ys), row_of, weights, k, hd,
                                                      total, out);
  AERIE_CUDA_LAUNCHED("moe_combine_rows_kernel");
}

namespace {
__global__ void local_rows_kernel(int32_t* __restrict__ row_of, int64_t pairs, int64_t r0, int64_t r1) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int32_t r = row_of[p];
  row_of[p] = r >= r0 && r < r1 ? static_cast<int32_t>(r - r0) : -1;
}
}  // namespace

void moe_local_rows(int32_t* row_of, int64_t pairs, int64_t r0, int64_t r1) {
  local_rows_kernel<<<grid_x(blocks_for(pairs, 256), "moe_local_rows"), 256, 0, stream()>>>(row_of, pairs, r0, r1);
  AERIE_CUDA_LAUNCHED("moe_local_rows_kernel");
}

}  // namespace aerie::cuda
