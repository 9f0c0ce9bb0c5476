// matmul_fp8_block (kernels/gemm.h) on mma.sync e4m3 (PTX `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`,
// sm_89 and later): the W8A8 block-FP8 GEMM where cuBLASLt has no block-scaled FP8 kernel (its VEC128 /
// BLK128x128 scale modes exist for Hopper and data-center Blackwell; an RTX PRO 6000 is sm_120), and where wgmma's
// FP8 does not exist. The math is the CPU reference's (kernels/cpu/quant.cc): per 128-wide block b of K the
// products of the e4m3 codes summed in fp32, times xs[b, m] ws[n / 128, b], summed over the blocks.
//
// Tiles: a CTA computes 64 x 64 of y with 4 warps of 32 x 32 (2 x 4 tiles of m16n8); K advances a whole scale
// block (128) per stage, both operands k-contiguous in shared memory (x's rows, w's rows: the "row.col" layout
// mma wants), double-buffered by cp.async: 2 x (64 + 64) x 144 bytes = 36 KiB (rows padded by 16 bytes, so the
// fragments' 32-bit loads of 8 rows x 4 words hit 32 banks). Each block's partial sums are scaled into the fp32
// accumulators once per block.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace aerie::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 128, kPad = 16, kRow = kBK + kPad, kThreads = 128;
constexpr int kStageBytes = (kBM + kBN) * kRow;

using attn::cp_async16;  // the attention kernels' cp.async wrappers (attention_mma.cuh)
using attn::cp_async_commit;
using attn::cp_async_wait;

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the host never launches it below sm_89 (fp8_mma_ok)
#endif
}

// One stage: x rows [m0, m0 + BM) and w rows [n0, n0 + BN), K columns [k0, k0 + 128), into shared memory at
// `stage` (x first) by THREADS threads; rows padded to kRow bytes, or (SWZ) of 128 bytes with their 16-byte chunks
// XOR-swizzled (attention_mma.cuh swz<64>). Rows past M / N and columns past K read as zero (K is a multiple of 16:
// whole chunks). Commits nothing.
template <int BM, int BN, int THREADS, bool SWZ>
__device__ __forceinline__ void load_stage(uint32_t stage, const uint8_t* x, const uint8_t* w, int64_t m, int64_t n,
                                           int64_t k, int64_t m0, int64_t n0, int64_t k0) {
  constexpr int kChunks = kBK / 16;  // 8 chunks of 16 bytes per row
  for (int i = threadIdx.x; i < (BM + BN) * kChunks; i += THREADS) {
    const int row = i / kChunks, chunk = i % kChunks;
    const int64_t col = k0 + chunk * 16;
    const bool is_x = row < BM;
    const int64_t r = is_x ? m0 + row : n0 + (row - BM);
    const bool valid = (is_x ? r < m : r < n) && col < k;
    const uint8_t* src = is_x ? x : w;
    if (valid) src += r * k + col;
    cp_async16(stage + (SWZ ? attn::swz<64>(row, chunk) : static_cast<uint32_t>(row * kRow + chunk * 16)), src, valid);
  }
}

// acc += part scaled by this K block's scales: xs[b, row] for each of the thread's 2 MI rows (row0 + i * 16 + group
// and + 8, i < MI), ws_b (the tile's weight scale of block b).
template <int MI>
__device__ __forceinline__ void scale_block(float (&acc)[MI][4][4], const float (&part)[MI][4][4], const float* xs,
                                            int64_t m, int64_t b, int64_t row0, int group, float ws_b) {
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int64_t r0 = row0 + i * 16 + group, r8 = r0 + 8;
    const float s0 = r0 < m ? xs[b * m + r0] * ws_b : 0.0f, s8 = r8 < m ? xs[b * m + r8] * ws_b : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[i][j][0] += part[i][j][0] * s0;
      acc[i][j][1] += part[i][j][1] * s0;
      acc[i][j][2] += part[i][j][2] * s8;
      acc[i][j][3] += part[i][j][3] * s8;
    }
  }
}

// y[r, c] = acc (+ beta y) for the thread's accumulators: c0, c1 at row row0 + i * 16 + group, columns col0 + j * 8 +
// 2 tig + {0, 1}; c2, c3 at row + 8. Rows past m and columns past n are skipped.
template <int MI, typename TY>
__device__ __forceinline__ void store_tile(const float (&acc)[MI][4][4], int64_t m, int64_t n, int64_t row0,
                                           int64_t col0, int group, int tig, TY* y, int64_t ldy, float beta) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + i * 16 + group + h * 8;
        if (r >= m) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t c = col0 + j * 8 + tig * 2 + e;
          if (c >= n) continue;
          TY* p = y + r * ldy + c;
          const float v = acc[i][j][h * 2 + e];
          *p = from_f32<TY>(beta != 0.0f ? v + beta * to_f32(*p) : v);
        }
      }
}

template <typename TY>
__global__ void __launch_bounds__(kThreads) fp8_block_mma_kernel(const uint8_t* __restrict__ x, const float* __restrict__ xs,
                                                                  const uint8_t* __restrict__ w, const float* __restrict__ ws,
                                                                  int64_t m, int64_t n, int64_t k, int64_t ws_ld, TY* y,
                                                                  int64_t ldy, float beta) {
  __shared__ __align__(16) uint8_t smem[2 * kStageBytes];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, tig = lane % 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // the warp's 32 x 32 within the tile
  const int64_t blocks = (k + kBK - 1) / kBK;
  const float* ws_row = ws + (n0 / 128) * ws_ld;  // one weight scale per K block for the whole tile (64 | 128)
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float acc[2][4][4] = {};
  load_stage<kBM, kBN, kThreads, false>(base, x, w, m, n, k, m0, n0, 0);
  cp_async_commit();
  for (int64_t b = 0; b < blocks; ++b) {
    if (b + 1 < blocks) {
      load_stage<kBM, kBN, kThreads, false>(base + static_cast<uint32_t>(((b + 1) & 1) * kStageBytes), x, w, m, n, k,
                                            m0, n0, (b + 1) * kBK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* sx = smem + (b & 1) * kStageBytes;
    const uint8_t* sw = sx + kBM * kRow;
    float part[2][4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      uint32_t a[2][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint8_t* r0 = sx + (wm + i * 16 + group) * kRow + kk + tig * 4;
        const uint8_t* r8 = r0 + 8 * kRow;
        a[i][0] = *reinterpret_cast<const uint32_t*>(r0);
        a[i][1] = *reinterpret_cast<const uint32_t*>(r8);
        a[i][2] = *reinterpret_cast<const uint32_t*>(r0 + 16);
        a[i][3] = *reinterpret_cast<const uint32_t*>(r8 + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t* c = sw + (wn + j * 8 + group) * kRow + kk + tig * 4;
        bf[j][0] = *reinterpret_cast<const uint32_t*>(c);
        bf[j][1] = *reinterpret_cast<const uint32_t*>(c + 16);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_e4m3(part[i][j], a[i], bf[j][0], bf[j][1]);
    }
    // This block's sums, scaled by xs[b, row] and ws[n0 / 128, b].
    scale_block(acc, part, xs, m, b, m0 + wm, group, ws_row[b]);
    __syncthreads();  // the next iteration's load overwrites this stage
  }
  store_tile(acc, m, n, m0 + wm, n0 + wn, group, tig, y, ldy, beta);
}

// ---- The 128 x 128 kernel (AERIE_FP8_GEMM_KERNEL=mma128; not yet the default: docs/performance.md) ----
// A CTA computes 128 x 128 of y with 8 warps of 64 x 32 (2 x 4 warps; 4 x 4 tiles of m16n8 each), K advancing a
// whole scale block (128 bytes of each row) per stage through a 3-stage cp.async pipeline: 3 x (128 + 128) x 128
// bytes = 96 KiB (one CTA per SM of an sm_120's 100 KiB). Rows of 128 bytes are XOR-swizzled in 16-byte chunks
// (attention_mma.cuh swz<64>: chunk ^ row % 8), so that the fragments come by ldmatrix.x4 without bank conflicts:
// an e4m3 m16n8k32 fragment register holds 4 consecutive k bytes of one row, as a b16 ldmatrix register holds 2
// consecutive b16 values (A: rows 0-7 / 8-15 x k bytes 0-15 / 16-31 of the k32 step; B: w's rows n 0-7 x k bytes
// 0-15 and 16-31 for one n8 tile, n 8-15 for the next). Against the 64 x 64 kernel: each fragment read from shared
// memory feeds 4 mma instead of 2, and three stages in flight instead of two.
constexpr int kWBM = 128, kWBN = 128, kWThreads = 256, kWStages = 3;
constexpr int kWStageBytes = (kWBM + kWBN) * kBK;
constexpr size_t kWSmem = static_cast<size_t>(kWStages) * kWStageBytes;

template <typename TY>
__global__ void __launch_bounds__(kWThreads, 1)
    fp8_block_mma_wide_kernel(const uint8_t* __restrict__ x, const float* __restrict__ xs, const uint8_t* __restrict__ w,
                              const float* __restrict__ ws, int64_t m, int64_t n, int64_t k, int64_t ws_ld, TY* y,
                              int64_t ldy, float beta) {
  extern __shared__ __align__(128) uint8_t wide_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, tig = lane % 4, mi = lane >> 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kWBM, n0 = static_cast<int64_t>(blockIdx.x) * kWBN;
  const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;  // the warp's 64 x 32 within the tile
  const int64_t blocks = (k + kBK - 1) / kBK;
  const float* ws_row = ws + (n0 / 128) * ws_ld;  // one weight scale per K block for the whole tile
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(wide_smem));
  float acc[4][4][4] = {};
#pragma unroll
  for (int s = 0; s < kWStages - 1; ++s) {
    if (s < blocks) load_stage<kWBM, kWBN, kWThreads, true>(base + s * kWStageBytes, x, w, m, n, k, m0, n0, s * kBK);
    cp_async_commit();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    cp_async_wait<kWStages - 2>();  // block b has landed
    __syncthreads();                // ... for every thread, and every warp is done with block b - 1's stage
    {
      const int64_t nb = b + kWStages - 1;
      if (nb < blocks)
        load_stage<kWBM, kWBN, kWThreads, true>(base + (nb % kWStages) * kWStageBytes, x, w, m, n, k, m0, n0, nb * kBK);
      cp_async_commit();
    }
    const uint32_t sx = base + static_cast<uint32_t>((b % kWStages) * kWStageBytes), sw = sx + kWBM * kBK;
    float part[4][4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) {
      uint32_t a[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        attn::ldsm_x4(sx + attn::swz<64>(wm + i * 16 + (lane & 15), kk * 2 + (lane >> 4)), a[i][0], a[i][1], a[i][2],
                      a[i][3]);
#pragma unroll
      for (int j = 0; j < 4; j += 2)
        attn::ldsm_x4(sw + attn::swz<64>(wn + j * 8 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1)), bf[j][0],
                      bf[j][1], bf[j + 1][0], bf[j + 1][1]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_e4m3(part[i][j], a[i], bf[j][0], bf[j][1]);
    }
    // This block's sums, scaled by xs[b, row] and ws[n0 / 128, b].
    scale_block(acc, part, xs, m, b, m0 + wm, group, ws_row[b]);
  }
  cp_async_wait<0>();
  store_tile(acc, m, n, m0 + wm, n0 + wn, group, tig, y, ldy, beta);
}

template <typename TY>
void launch_wide(const uint8_t* x8, const float* xs, const uint8_t* w8, const float* ws, int64_t m, int64_t n,
                 int64_t k, int64_t ws_ld, TY* y, int64_t ldy, float beta) {
  auto kernel = fp8_block_mma_wide_kernel<TY>;
  check_smem("matmul_fp8_block (mma.sync e4m3, 128 x 128)", kWSmem);
  plan_occupancy(kernel);
  AERIE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWSmem)),
                   "matmul_fp8_block (mma.sync e4m3): cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " << kWSmem << ")");
  const dim3 grid(static_cast<unsigned>((n + kWBN - 1) / kWBN), static_cast<unsigned>((m + kWBM - 1) / kWBM));
  kernel<<<grid, kWThreads, kWSmem, stream()>>>(x8, xs, w8, ws, m, n, k, ws_ld, y, ldy, beta);
}

}  // namespace

bool fp8_mma_ok(const void* xq, const void* wq, int64_t k) {
  const GpuLimits l = gpu_limits();
  return l.major * 10 + l.minor >= 89 && k % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(wq) % 16 == 0;
}

void matmul_fp8_block_mma(const void* xq, const float* xs, const void* wq, const float* ws, int64_t m, int64_t n,
                          int64_t k, void* y, DType y_dtype, int64_t ldy, float beta, bool wide) {
  AERIE_CHECK(fp8_mma_ok(xq, wq, k), "matmul_fp8_block (mma.sync e4m3): needs sm_89 or later, K a multiple of 16 "
                                     "and 16-byte aligned operands (K " << k << ")");
  if (m == 0 || n == 0) return;
  const int64_t ws_ld = ((k + 127) / 128 + 3) / 4 * 4;  // fp8_weight_scale_ld
  const dim3 grid(static_cast<unsigned>((n + kBN - 1) / kBN), static_cast<unsigned>((m + kBM - 1) / kBM));
  const auto* x8 = static_cast<const uint8_t*>(xq);
  const auto* w8 = static_cast<const uint8_t*>(wq);
  if (wide) {
    AERIE_CHECK(y_dtype == DType::F32 || y_dtype == DType::BF16, "matmul_fp8_block (mma.sync e4m3): y must be F32 or BF16");
    if (y_dtype == DType::F32)
      launch_wide(x8, xs, w8, ws, m, n, k, ws_ld, static_cast<float*>(y), ldy, beta);
    else
      launch_wide(x8, xs, w8, ws, m, n, k, ws_ld, static_cast<__nv_bfloat16*>(y), ldy, beta);
    AERIE_CUDA_LAUNCHED("fp8_block_mma_wide_kernel");
    return;
  }
  if (y_dtype == DType::F32) {
    plan_occupancy(fp8_block_mma_kernel<float>);
    fp8_block_mma_kernel<float><<<grid, kThreads, 0, stream()>>>(x8, xs, w8, ws, m, n, k, ws_ld,
                                                                  static_cast<float*>(y), ldy, beta);
  } else {
    AERIE_CHECK(y_dtype == DType::BF16, "matmul_fp8_block (mma.sync e4m3): y must be F32 or BF16");
    plan_occupancy(fp8_block_mma_kernel<__nv_bfloat16>);
    fp8_block_mma_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream()>>>(x8, xs, w8, ws, m, n, k, ws_ld,
                                                                          static_cast<__nv_bfloat16*>(y), ldy, beta);
  }
  AERIE_CUDA_LAUNCHED("fp8_block_mma_kernel");
}

}  // namespace aerie::cuda
