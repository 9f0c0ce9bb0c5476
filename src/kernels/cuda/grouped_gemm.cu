// The fused grouped GEMM of kernels/gemm.h matmul_grouped_quant: the routed experts of an MoE layer,
// rows of a sorted by expert, with each expert's weight as stored (BF16, block FP8 or INT4 groups).
//
// One CTA (8 warps) computes a tile of BM (64 or 128) rows of one group by 128 columns of c over k tiles
// of 64, bf16 operands, fp32 accumulation:
//   - a's tile and W's stored tile go global -> shared with cp.async, STAGES deep;
//   - a quantized W tile is then dequantized, shared -> shared, into a bf16 [128][64] tile (two of them,
//     alternating), with the formulas of kernels/quant.h: INT4 q * scale as one bf16 FMA
//     ((q + 136) - 136 is exact, then q * s rounded once: what the fp32 product rounded to bf16 gives,
//     since that product is exact), FP8 fp8 * scale_inv in fp32 rounded once to bf16;
//   - the tensor cores multiply: wgmma (sm_90a, the default; two warpgroups reading both operands from
//     the swizzled shared tiles, one wgmma group in flight while the next tile is dequantized) or
//     mma.sync m16n8k16 with ldmatrix (AERIE_GROUPED_GEMM_KERNEL=mma); BF16 weights whose parts are
//     multiples of 256 rows take variant 3 below (warp-specialized, 256 columns) instead, and on sm_90a
//     the quantized formats take variant 4 (the weight dequantized into registers as wgmma's A operand,
//     the tokens as its B, up to 256 rows per weight tile: the default for FP8 and INT4 experts);
//   - the fp32 accumulators are rounded once to bf16 into c.
// So the dequantized W equals dequant_batch's bit for bit and c differs from dequant_batch +
// matmul_grouped only by the order of the fp32 sums. W stays compressed in device memory.
// Tiles list (group, first row) per CTA row (grid y) and the n tile in grid x, so the CTAs that share a
// tile of a (and of W across neighbouring row tiles) run together and hit L2.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"
#include "core/settings.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/wgmma_rs.cuh"

namespace aerie::cuda {
namespace {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::ldsm_x4;
using attn::mma16816;
using attn::pack_bf16;

constexpr int kBN = 128, kBK = 64, kThreads = 256, kMaxParts = 4;
#ifdef AERIE_NO_WGMMA
constexpr bool kWgmmaBuilt = false;  // wgmma.cuh: this compilation has no sm_90a code
#else
constexpr bool kWgmmaBuilt = true;
#endif
constexpr int kDense = 0, kFp8 = 1, kInt4 = 2;  // GroupedWeightFormat's order

/// One group: its rows of a and c, and its weight's parts (row ends cumulative within W).
struct GroupDesc {
  const void* w[kMaxParts];
  const void* s[kMaxParts];
  int32_t part_end[kMaxParts];
  int32_t row0, rows;
};
/// One row tile: group index (into the GroupDesc array) and first row within the group.
/// bt: variant 4's token tile (a multiple of 16 >= its rows; the other variants ignore it).
struct TileDesc {
  int32_t group, m0, bt;
};

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][64] bf16 tile (128-byte rows).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

/// d = a * b + c on two bf16 in one register, each rounded once (round to nearest even).
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

/// Eight INT4 values of one pack-quantized word (k 8c .. 8c + 7, lowest nibble first, stored as q + 8)
/// times their bf16 scale, as 8 bf16 in k order. 0x4300 | u is bf16 128 + u; minus 136 gives q exactly;
/// q * s + (-0) is the exact product rounded once (the fp32 product q * s is exact, so this equals
/// dequant_int4_packed's rounding of it; -0 keeps the sign of a zero product).
__device__ __forceinline__ uint4 int4_word_to_bf16x8(uint32_t w, uint16_t s) {
  const uint32_t s2 = static_cast<uint32_t>(s) * 0x10001u, one = 0x3F803F80u, m136 = 0xC308C308u,
                 negzero = 0x80008000u, magic = 0x43004300u;
  uint32_t p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t r = ((w >> (4 * i)) & 0x000F000Fu) | magic;  // (k i, k i+4)
    p[i] = fma_bf16x2(fma_bf16x2(r, one, m136), s2, negzero);
  }
  uint4 o;
  o.x = prmt(p[0], p[1], 0x5410);  // k0, k1
  o.y = prmt(p[2], p[3], 0x5410);  // k2, k3
  o.z = prmt(p[0], p[1], 0x7632);  // k4, k5
  o.w = prmt(p[2], p[3], 0x7632);  // k6, k7
  return o;
}

/// Eight FP8 e4m3fn bytes (k order) times their fp32 scale_inv, each fp32 product rounded once to bf16.
__device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 b, float sc) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? b.x : b.y;
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((word >> (16 * (i & 1))) & 0xFFFFu);
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);  // exact; x = the lower byte
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[i] = pack_bf16(f.x * sc, f.y * sc);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

template <int F>
constexpr int raw_bytes() {  // one stage's stored W tile [128 rows][64 k] (quantized formats)
  return F == kFp8 ? kBN * kBK : kBN * kBK / 2 + kBN * (kBK / 32) * 2;
}

/// Shared memory, from a 1024-byte aligned base (the wgmma 128-byte swizzle repeats every 1024 bytes):
/// STAGES tiles of a [BM][64] bf16, then STAGES bf16 W tiles [128][64] (Dense) or the two dequantized
/// W tiles and STAGES stored W tiles (quantized). bf16 tiles are swizzled (swz).
template <int F, int BM, int STAGES>
struct Layout {
  static constexpr int kA = BM * kBK * 2, kB = kBN * kBK * 2;
  static constexpr int a(int s) { return s * kA; }
  static constexpr int b(int s) { return STAGES * kA + s * kB; }   // Dense: stage s; quantized: buffer s
  static constexpr int raw(int s) { return STAGES * kA + 2 * kB + s * raw_bytes<F>(); }
  static constexpr int bytes = F == kDense ? STAGES * (kA + kB) : STAGES * kA + 2 * kB + STAGES * raw_bytes<F>();
};

/// The part of group g that holds output column n0 (parts' row ends cumulative), and in pstart that
/// part's first column.
__device__ __forceinline__ int part_of(const GroupDesc& g, int n0, int& pstart) {
  int part = 0;
  pstart = 0;
#pragma unroll
  for (int p = 0; p < kMaxParts - 1; ++p)
    if (n0 >= g.part_end[part]) {
      pstart = g.part_end[part];
      ++part;
    }
  return part;
}

/// What a CTA needs of its tile: the rows of a this thread copies (row r = (tid + j kThreads) / 8 of the
/// tile; past the group: the tile's first row, read as zeros), the weight part and scale, the tile's
/// first row in the part.
template <int BM>
struct Tile {
  static constexpr int kRows = BM * 8 / kThreads;
  const __nv_bfloat16* arow[kRows];
  const void* w;
  const void* s;
  int nl, rows, n0, row0;
};

template <int BM>
__device__ __forceinline__ Tile<BM> tile_of(const __nv_bfloat16* a, const int32_t* a_rows, int row_div,
                                            const GroupDesc* groups, const TileDesc* tiles, int K) {
  const TileDesc t = tiles[blockIdx.y];
  const GroupDesc& g = groups[t.group];
  Tile<BM> r;
  r.n0 = blockIdx.x * kBN;
  int pstart = 0;
  const int part = part_of(g, r.n0, pstart);
  r.nl = r.n0 - pstart;
  r.w = g.w[part];
  r.s = g.s[part];
  r.rows = min(BM, g.rows - t.m0);
  r.row0 = g.row0 + t.m0;
#pragma unroll
  for (int j = 0; j < Tile<BM>::kRows; ++j) {
    const int row = (threadIdx.x + j * kThreads) >> 3;
    const int src = row < r.rows ? r.row0 + row : r.row0;
    r.arow[j] = a + static_cast<int64_t>(a_rows ? a_rows[src] / row_div : src) * K;
  }
  return r;
}

/// cp.async of k tile kt into `stage`: a's BM rows (rows past the group read as zeros) and W's stored tile.
template <int F, int BM, int STAGES>
__device__ __forceinline__ void load_stage(const Tile<BM>& t, uint32_t base, int stage, int kt, int K, int tid) {
  using L = Layout<F, BM, STAGES>;
  const uint32_t sa = base + L::a(stage);
  const int k0 = kt * kBK;
#pragma unroll
  for (int j = 0; j < Tile<BM>::kRows; ++j) {
    const int i = tid + j * kThreads, r = i >> 3, ch = i & 7;
    cp_async16(sa + swz(r, ch), t.arow[j] + k0 + ch * 8, r < t.rows);
  }
  if constexpr (F == kDense) {
    const uint32_t sb = base + L::b(stage);
    const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(t.w) + static_cast<int64_t>(t.nl) * K + k0;
#pragma unroll
    for (int i = tid; i < kBN * 8; i += kThreads) {
      const int r = i >> 3, ch = i & 7;
      cp_async16(sb + swz(r, ch), w + static_cast<int64_t>(r) * K + ch * 8, true);
    }
  } else if constexpr (F == kFp8) {
    const uint32_t sb = base + L::raw(stage);
    const uint8_t* w = static_cast<const uint8_t*>(t.w) + static_cast<int64_t>(t.nl) * K + k0;
#pragma unroll
    for (int i = tid; i < kBN * 4; i += kThreads) {  // [128][64 bytes], plain
      const int r = i >> 2, ch = i & 3;
      cp_async16(sb + r * 64 + ch * 16, w + static_cast<int64_t>(r) * K + ch * 16, true);
    }
  } else {
    const uint32_t sb = base + L::raw(stage);
    const int words = K / 8, groups32 = K / 32;
    const int32_t* w = static_cast<const int32_t*>(t.w) + static_cast<int64_t>(t.nl) * words + k0 / 8;
#pragma unroll
    for (int i = tid; i < kBN * 2; i += kThreads) {  // [128][8 words], plain
      const int r = i >> 1, ch = i & 1;
      cp_async16(sb + r * 32 + ch * 16, w + static_cast<int64_t>(r) * words + ch * 4, true);
    }
    const uint16_t* sc = static_cast<const uint16_t*>(t.s) + static_cast<int64_t>(t.nl) * groups32 + k0 / 32;
    if (tid < kBN) cp_async4(sb + kBN * 32 + tid * 4, sc + static_cast<int64_t>(tid) * groups32);
  }
}

/// The stored W tile of `stage` (k tile kt) into dequantized bf16 tile `buf` (quantized formats).
/// `mem` is the generic address of `base`.
template <int F, int BM, int STAGES>
__device__ __forceinline__ void dequant_stage(const Tile<BM>& t, const uint8_t* mem, uint32_t base, int stage, int buf,
                                              int kt, int K, int tid) {
  using L = Layout<F, BM, STAGES>;
  const uint8_t* raw = mem + L::raw(stage);
  const uint32_t dst = base + L::b(buf);
  if constexpr (F == kInt4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(raw + kBN * 32);
#pragma unroll
    for (int i = tid; i < kBN * 8; i += kThreads) {
      const int r = i >> 3, ch = i & 7;  // word ch of row r: k 8 ch .. 8 ch + 7, group ch / 4
      const uint4 v = int4_word_to_bf16x8(words[i], scales[r * 2 + (ch >> 2)]);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(r, ch)), "r"(v.x), "r"(v.y),
                   "r"(v.z), "r"(v.w));
    }
  } else if constexpr (F == kFp8) {
    // One scale_inv per 128 x 128 block: the tile's rows lie in one block row (nl % 128 == 0), its 64
    // columns in one block column.
    const int scols = (K + 127) / 128;
    const float sc = __ldg(static_cast<const float*>(t.s) + static_cast<int64_t>(t.nl / 128) * scols + (kt * kBK) / 128);
#pragma unroll
    for (int i = tid; i < kBN * 4; i += kThreads) {
      const int r = i >> 2, q = i & 3;  // 16 bytes: k 16 q .. 16 q + 15 = chunks 2 q, 2 q + 1
      const uint4 b = *reinterpret_cast<const uint4*>(raw + i * 16);
      const uint4 lo = fp8x8_to_bf16x8(make_uint2(b.x, b.y), sc), hi = fp8x8_to_bf16x8(make_uint2(b.z, b.w), sc);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(r, 2 * q)), "r"(lo.x), "r"(lo.y),
                   "r"(lo.z), "r"(lo.w));
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(r, 2 * q + 1)), "r"(hi.x),
                   "r"(hi.y), "r"(hi.z), "r"(hi.w));
    }
  }
}


/// The fp32 accumulator pair (row r, columns col, col + 1 of the CTA tile) rounded to bf16 into c.
template <int BM>
__device__ __forceinline__ void store_pair(__nv_bfloat16* c, const Tile<BM>& t, int N, int r, int col, float x, float y) {
  if (r < t.rows)
    *reinterpret_cast<uint32_t*>(c + static_cast<int64_t>(t.row0 + r) * N + t.n0 + col) = pack_bf16(x, y);
}

// ---- Variant 1: mma.sync m16n8k16 (8 warps as 2 x 4, warp tile BM/2 x 32), ldmatrix operands ----

template <int F, int BM, int STAGES>
__global__ void __launch_bounds__(kThreads, 2)
    grouped_gemm_kernel(const __nv_bfloat16* __restrict__ a, const int32_t* __restrict__ a_rows, int row_div,
                        __nv_bfloat16* __restrict__ c, const GroupDesc* __restrict__ groups,
                        const TileDesc* __restrict__ tiles, int K, int N) {
  extern __shared__ __align__(1024) uint8_t smem[];
  using L = Layout<F, BM, STAGES>;
  constexpr int MI = BM / 32;  // m16 tiles per warp
  const Tile<BM> t = tile_of<BM>(a, a_rows, row_div, groups, tiles, K);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(smem, mem);
  const int KT = K / kBK;

  float acc[MI][4][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage<F, BM, STAGES>(t, base, s, s, K, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 and dequantized tile kt - 2 are free
    {
      const int nk = kt + STAGES - 1;
      if (nk < KT) load_stage<F, BM, STAGES>(t, base, nk % STAGES, nk, K, tid);
      cp_async_commit();
    }
    const int st = kt % STAGES;
    const uint32_t sa = base + L::a(st);
    uint32_t sb = base + L::b(st);
    if constexpr (F != kDense) {
      dequant_stage<F, BM, STAGES>(t, mem, base, st, kt & 1, kt, K, tid);
      __syncthreads();
      sb = base + L::b(kt & 1);
    }
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[MI][4], bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
        ldsm_x4(sa + swz(wm * (BM / 2) + mi * 16 + (lane & 15), ks * 2 + (lane >> 4)), af[mi][0], af[mi][1],
                af[mi][2], af[mi][3]);
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        const int m = lane >> 3;  // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        const int n = wn * 32 + nj * 16 + ((m >> 1) << 3) + (lane & 7);
        ldsm_x4(sb + swz(n, ks * 2 + (m & 1)), bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0],
                bfr[2 * nj + 1][1]);
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
      const int r = wm * (BM / 2) + mi * 16 + (lane >> 2), col = wn * 32 + ni * 8 + (lane & 3) * 2;
      store_pair(c, t, N, r, col, acc[mi][ni][0], acc[mi][ni][1]);
      store_pair(c, t, N, r + 8, col, acc[mi][ni][2], acc[mi][ni][3]);
    }
}

// ---- Variant 2: wgmma (sm_90a), 2 warpgroups, operands read by the tensor cores from shared memory ----
// BM 128: warpgroup g computes rows 64 g .. + 63 by all 128 columns (m64n128k16); BM 64: all 64 rows by
// columns 64 g .. + 63 (m64n64k16). Both operands K-major with the 128-byte swizzle, which is swz's
// layout on 1024-byte aligned tiles; one k16 step advances the descriptors' start address by 32 bytes.

// wgmma exists on sm_90a only: built for another architecture (AERIE_CUDA_ARCH, e.g. 120 for an RTX PRO
// 6000) the wgmma kernel's body is empty and matmul_grouped_quant runs the mma.sync kernel.

template <int F, int BM, int STAGES>
__global__ void __launch_bounds__(kThreads, BM == 64 || STAGES == 3 ? 2 : 1)
    grouped_gemm_wgmma_kernel(const __nv_bfloat16* __restrict__ a, const int32_t* __restrict__ a_rows, int row_div,
                              __nv_bfloat16* __restrict__ c, const GroupDesc* __restrict__ groups,
                              const TileDesc* __restrict__ tiles, int K, int N) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync kernel off sm_90
#else
  extern __shared__ __align__(1024) uint8_t smem[];
  using L = Layout<F, BM, STAGES>;
  constexpr int WN = BM == 128 ? 128 : 64;  // a warpgroup's columns
  constexpr int R = WN / 2;                 // accumulators per thread
  const Tile<BM> t = tile_of<BM>(a, a_rows, row_div, groups, tiles, K);
  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w4 = (tid >> 5) & 3;
  const int row_off = BM == 128 ? wg * 64 : 0, col_off = BM == 128 ? 0 : wg * 64;
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(smem, mem);
  const int KT = K / kBK;

  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;

  // Pipeline: the wgmma of k tile kt runs while the threads wait for tile kt + 1's copies, refill the
  // stage tile kt - 1 used (STAGES - 1 tiles ahead) and dequantize tile kt + 1 into the other bf16 W
  // tile; one wgmma group stays in flight across the barrier.
  static_assert(STAGES >= 3, "the wgmma pipeline keeps two stages busy");
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage<F, BM, STAGES>(t, base, s, s, K, tid);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();  // tile 0
  fence_proxy_async();
  __syncthreads();
  if constexpr (F != kDense) {
    dequant_stage<F, BM, STAGES>(t, mem, base, 0, 0, 0, K, tid);
    fence_proxy_async();
    __syncthreads();
  }
  for (int kt = 0; kt < KT; ++kt) {
    const int st = kt % STAGES;
    const uint32_t sb = base + (F == kDense ? L::b(st) : L::b(kt & 1));
    const uint64_t da = wgmma_desc(base + L::a(st) + row_off * 128), db = wgmma_desc(sb + col_off * 128);
    wgmma_fence();
    fence_regs(acc);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      if constexpr (BM == 128)
        wgmma_n128(acc, da + 2 * ks, db + 2 * ks);
      else
        wgmma_n64(acc, da + 2 * ks, db + 2 * ks);
    }
    wgmma_commit();
    wgmma_wait<1>();              // tile kt - 1's wgmma (this warpgroup) is done
    fence_regs(acc);
    cp_async_wait<STAGES - 3>();  // tile kt + 1 landed (this thread's copies)
    fence_proxy_async();
    __syncthreads();  // every warpgroup is past tile kt - 1; tile kt + 1 is visible to all
    {
      const int nk = kt + STAGES - 1;  // into tile kt - 1's stage
      if (nk < KT) load_stage<F, BM, STAGES>(t, base, nk % STAGES, nk, K, tid);
      cp_async_commit();
    }
    if constexpr (F != kDense) {
      if (kt + 1 < KT) {  // into the bf16 W tile that tile kt - 1 used
        dequant_stage<F, BM, STAGES>(t, mem, base, (kt + 1) % STAGES, (kt + 1) & 1, kt + 1, K, tid);
        fence_proxy_async();
      }
      __syncthreads();
    }
  }
  wgmma_wait<0>();
  fence_regs(acc);
  cp_async_wait<0>();
  // Accumulator layout of m64nNk16 (f32): warp w4 of the warpgroup holds rows 16 w4 + lane / 4 (+ 8);
  // per n8 block i: acc[4 i], acc[4 i + 1] at columns 8 i + 2 (lane % 4) (+ 1), acc[4 i + 2, 3] 8 rows down.
  const int r = row_off + w4 * 16 + (lane >> 2);
#pragma unroll
  for (int i = 0; i < WN / 8; ++i) {
    const int col = col_off + i * 8 + (lane & 3) * 2;
    store_pair(c, t, N, r, col, acc[4 * i], acc[4 * i + 1]);
    store_pair(c, t, N, r + 8, col, acc[4 * i + 2], acc[4 * i + 3]);
  }
#endif
}

// ---- Variant 3: warp-specialized wgmma (sm_90a, where N and every part are multiples of 256; the
// default for BF16 weights, AERIE_GROUPED_GEMM_KERNEL=ws for every format). Two hangs found on the H200:
// consumers asking setmaxnreg for more registers than the CTA had (80 + 2 x 216 > 3 x 168, now 208) and a
// BF16 producer that stopped one k tile early (its loop ran to KT + D with D = -1). ----
// 384 threads: warpgroup 0 produces, warpgroups 1 and 2 multiply; tiles of BM (128 or 64) rows by 256
// columns. The producer (80 registers after setmaxnreg) copies a's rows and W's stored tile with
// cp.async into a ring of S stages and, for a quantized W, dequantizes the stored tile (ring of R) into
// the stage's bf16 W tile D k tiles behind the copies; mbarriers hand a stage to the consumers (full)
// and back (empty), so no warpgroup waits for the others at a CTA barrier. A consumer (208 registers;
// setmaxnreg moves registers within the CTA's launch allocation, 168 x 384, and an increase beyond it waits forever)
// keeps one wgmma group in flight and releases the stage before it: BM 128: warpgroup c computes rows
// 64 c .. + 63 by 256 columns (m64n256k16, 128 accumulators per thread); BM 64: all 64 rows by
// columns 128 c .. + 127 (m64n128k16). The same products and fp32 order per k tile as variant 2.
constexpr int kWsBN = 256, kWsThreads = 384;

template <int F>
constexpr int ws_raw_bytes() {  // one stored W tile [256 rows][64 k]
  return F == kFp8 ? kWsBN * kBK : kWsBN * kBK / 2 + kWsBN * (kBK / 32) * 2;
}

/// Shared memory of variant 3 from a 1024-byte aligned base: S stages of a [BM][64] and W [256][64]
/// bf16 tiles (swizzled), R stored W tiles (quantized formats), then the mbarriers full[S], empty[S],
/// raw_full[R]. D: how many k tiles the dequantization runs behind the copies (D <= S - 2: the
/// producer waits for a stage the consumers release only after they have the next one).
template <int F, int BM>
struct WsLayout {
  static constexpr int S = F == kFp8 && BM == 128 ? 3 : 4;
  static constexpr int R = F == kDense ? 0 : S - 1;
  static constexpr int D = R - 1;
  static_assert(F == kDense || (D >= 1 && D <= S - 2), "dequantization lag");
  static constexpr int kA = BM * kBK * 2, kB = kWsBN * kBK * 2;
  static constexpr int a(int s) { return s * kA; }
  static constexpr int b(int s) { return S * kA + s * kB; }
  static constexpr int raw(int r) { return S * (kA + kB) + r * ws_raw_bytes<F>(); }
  static constexpr int bar = S * (kA + kB) + R * ws_raw_bytes<F>();
  static constexpr int full(int s) { return bar + 8 * s; }
  static constexpr int empty(int s) { return bar + 8 * (S + s); }
  static constexpr int raw_full(int r) { return bar + 8 * (2 * S + r); }
  static constexpr int bytes = bar + 8 * (2 * S + R);
};


/// The row tile, the n tile's part (pointer, scale, first row in the part) and, for the producer, the
/// rows of a this thread copies (row (tid / 8) + 16 j of the tile; past the group: the tile's first row,
/// read as zeros).
template <int BM>
struct WsTile {
  static constexpr int kRows = BM / 16;
  const __nv_bfloat16* arow[kRows];
  const void* w;
  const void* s;
  int nl, rows, n0, row0;
};

template <int BM>
__device__ __forceinline__ WsTile<BM> ws_tile_of(const __nv_bfloat16* a, const int32_t* a_rows, int row_div,
                                                 const GroupDesc* groups, const TileDesc* tiles, int K, int tid,
                                                 bool producer) {
  const TileDesc t = tiles[blockIdx.y];
  const GroupDesc& g = groups[t.group];
  WsTile<BM> r;
  r.n0 = blockIdx.x * kWsBN;
  int pstart = 0;
  const int part = part_of(g, r.n0, pstart);
  r.nl = r.n0 - pstart;
  r.w = g.w[part];
  r.s = g.s[part];
  r.rows = min(BM, g.rows - t.m0);
  r.row0 = g.row0 + t.m0;
  if (producer) {
#pragma unroll
    for (int j = 0; j < WsTile<BM>::kRows; ++j) {
      const int row = (tid >> 3) + 16 * j;
      const int src = row < r.rows ? r.row0 + row : r.row0;
      r.arow[j] = a + static_cast<int64_t>(a_rows ? a_rows[src] / row_div : src) * K;
    }
  }
  return r;
}

/// The producer's cp.async of k tile kt (128 threads): a's BM rows into stage s, W's tile into stage s
/// (Dense, swizzled) or stored tile r (quantized, plain).
template <int F, int BM>
__device__ __forceinline__ void ws_load(const WsTile<BM>& t, uint32_t base, int s, int r, int kt, int K, int tid) {
  using L = WsLayout<F, BM>;
  const int k0 = kt * kBK, ch = tid & 7, row = tid >> 3;
  const uint32_t sa = base + L::a(s);
#pragma unroll
  for (int j = 0; j < WsTile<BM>::kRows; ++j)
    cp_async16(sa + swz(row + 16 * j, ch), t.arow[j] + k0 + ch * 8, row + 16 * j < t.rows);
  if constexpr (F == kDense) {
    const uint32_t sb = base + L::b(s);
    const __nv_bfloat16* w = static_cast<const __nv_bfloat16*>(t.w) + static_cast<int64_t>(t.nl + row) * K + k0 + ch * 8;
#pragma unroll
    for (int j = 0; j < kWsBN / 16; ++j) cp_async16(sb + swz(row + 16 * j, ch), w + static_cast<int64_t>(16 * j) * K, true);
  } else if constexpr (F == kFp8) {
    const uint32_t sb = base + L::raw(r);
    const uint8_t* w = static_cast<const uint8_t*>(t.w) + static_cast<int64_t>(t.nl) * K + k0;
#pragma unroll
    for (int j = 0; j < kWsBN * 4 / 128; ++j) {  // [256][64 bytes], plain
      const int i = tid + 128 * j, rr = i >> 2, c4 = i & 3;
      cp_async16(sb + rr * 64 + c4 * 16, w + static_cast<int64_t>(rr) * K + c4 * 16, true);
    }
  } else {
    const uint32_t sb = base + L::raw(r);
    const int words = K / 8, groups32 = K / 32;
    const int32_t* w = static_cast<const int32_t*>(t.w) + static_cast<int64_t>(t.nl) * words + k0 / 8;
#pragma unroll
    for (int j = 0; j < kWsBN * 2 / 128; ++j) {  // [256][8 words], plain
      const int i = tid + 128 * j, rr = i >> 1, c2 = i & 1;
      cp_async16(sb + rr * 32 + c2 * 16, w + static_cast<int64_t>(rr) * words + c2 * 4, true);
    }
    const uint16_t* sc = static_cast<const uint16_t*>(t.s) + static_cast<int64_t>(t.nl) * groups32 + k0 / 32;
#pragma unroll
    for (int j = 0; j < kWsBN / 128; ++j) {  // [256][2 scales]
      const int rr = tid + 128 * j;
      cp_async4(sb + kWsBN * 32 + rr * 4, sc + static_cast<int64_t>(rr) * groups32);
    }
  }
}

/// The producer's dequantization of stored tile r (k tile kt) into stage s's bf16 W tile (128 threads).
template <int F, int BM>
__device__ __forceinline__ void ws_dequant(const WsTile<BM>& t, const uint8_t* mem, uint32_t base, int r, int s, int kt,
                                           int K, int tid) {
  using L = WsLayout<F, BM>;
  const uint8_t* raw = mem + L::raw(r);
  const uint32_t dst = base + L::b(s);
  if constexpr (F == kInt4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(raw + kWsBN * 32);
#pragma unroll 4
    for (int j = 0; j < kWsBN * 8 / 128; ++j) {
      const int i = tid + 128 * j, rr = i >> 3, ch = i & 7;  // word ch of row rr: k 8 ch .. + 7, group ch / 4
      const uint4 v = int4_word_to_bf16x8(words[i], scales[rr * 2 + (ch >> 2)]);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(rr, ch)), "r"(v.x), "r"(v.y),
                   "r"(v.z), "r"(v.w));
    }
  } else if constexpr (F == kFp8) {
    // One scale_inv per 128 x 128 block: rows 0-127 and 128-255 of the tile lie in block rows nl / 128
    // and nl / 128 + 1 (nl % 256 == 0), the tile's 64 columns in one block column.
    const int scols = (K + 127) / 128;
    const float* sp = static_cast<const float*>(t.s) + static_cast<int64_t>(t.nl / 128) * scols + (kt * kBK) / 128;
    const float s0 = __ldg(sp), s1 = __ldg(sp + scols);
#pragma unroll 2
    for (int j = 0; j < kWsBN * 4 / 128; ++j) {
      const int i = tid + 128 * j, rr = i >> 2, q = i & 3;  // 16 bytes: k 16 q .. + 15 = chunks 2 q, 2 q + 1
      const float sc = rr < 128 ? s0 : s1;
      const uint4 b = *reinterpret_cast<const uint4*>(raw + i * 16);
      const uint4 lo = fp8x8_to_bf16x8(make_uint2(b.x, b.y), sc), hi = fp8x8_to_bf16x8(make_uint2(b.z, b.w), sc);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(rr, 2 * q)), "r"(lo.x), "r"(lo.y),
                   "r"(lo.z), "r"(lo.w));
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(rr, 2 * q + 1)), "r"(hi.x),
                   "r"(hi.y), "r"(hi.z), "r"(hi.w));
    }
  }
}

template <int F, int BM>
__global__ void __launch_bounds__(kWsThreads, 1)
    grouped_gemm_ws_kernel(const __nv_bfloat16* __restrict__ a, const int32_t* __restrict__ a_rows, int row_div,
                           __nv_bfloat16* __restrict__ c, const GroupDesc* __restrict__ groups,
                           const TileDesc* __restrict__ tiles, int K, int N) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync kernel off sm_90
#else
  extern __shared__ __align__(1024) uint8_t smem[];
  using L = WsLayout<F, BM>;
  constexpr int S = L::S, R = L::R, D = L::D;
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(smem, mem);
  const int KT = K / kBK;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(base + L::full(s), 128);  // the producer's 128 threads
      mbar_init(base + L::empty(s), 8);   // lane 0 of each consumer warp
    }
    for (int r = 0; r < R; ++r) mbar_init(base + L::raw_full(r), 128);
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 80;\n");  // 80 + 2 x 208 <= 3 x 168: the CTA's registers at launch
    const WsTile<BM> t = ws_tile_of<BM>(a, a_rows, row_div, groups, tiles, K, tid, true);
    // Dense: KT copies; quantized: KT copies and KT dequantizations D behind (R = 0 and D = -1 for Dense:
    // the bound KT + D once left the last k tile uncopied and its consumers waiting forever).
    constexpr int lag = F == kDense ? 0 : D;
    for (int j = 0; j < KT + lag; ++j) {
      if (j < KT) {
        const int s = j % S;
        if (j >= S) mbar_wait(base + L::empty(s), ((j / S) - 1) & 1);
        ws_load<F, BM>(t, base, s, F == kDense ? 0 : j % R, j, K, tid);
        mbar_arrive_cp_async(base + (F == kDense ? L::full(s) : L::raw_full(j % R)));
      }
      if constexpr (F != kDense) {
        const int jj = j - D;
        if (jj >= 0) {  // jj < KT
          mbar_wait(base + L::raw_full(jj % R), (jj / R) & 1);
          ws_dequant<F, BM>(t, mem, base, jj % R, jj % S, jj, K, tid);
          fence_proxy_async();  // the bf16 tile's st.shared, visible to the consumers' wgmma
          mbar_arrive(base + L::full(jj % S));
          asm volatile("bar.sync 1, 128;\n" ::: "memory");  // stored tile jj % R is free for tile jj + R
        }
      }
    }
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 208;\n");
  constexpr int WN = BM == 128 ? kWsBN : kWsBN / 2;  // a warpgroup's columns
  constexpr int RA = WN / 2;                          // accumulators per thread
  const int cg = wg - 1, w4 = (tid >> 5) & 3;
  const int row_off = BM == 128 ? cg * 64 : 0, col_off = BM == 128 ? 0 : cg * WN;
  const WsTile<BM> t = ws_tile_of<BM>(a, a_rows, row_div, groups, tiles, K, tid, false);
  float acc[RA];
#pragma unroll
  for (int i = 0; i < RA; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % S;
    mbar_wait(base + L::full(s), (kt / S) & 1);
    fence_proxy_async();  // the cp.async writes of stage s (generic proxy), before the wgmma reads them
    const uint64_t da = wgmma_desc(base + L::a(s) + row_off * 128), db = wgmma_desc(base + L::b(s) + col_off * 128);
    wgmma_fence();
    fence_regs(acc);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      if constexpr (BM == 128)
        wgmma_n256(acc, da + 2 * ks, db + 2 * ks);
      else
        wgmma_n128(acc, da + 2 * ks, db + 2 * ks);
    }
    wgmma_commit();
    wgmma_wait<1>();  // k tile kt - 1's wgmma is done: its stage goes back to the producer
    fence_regs(acc);
    if (kt > 0 && lane == 0) mbar_arrive(base + L::empty((kt - 1) % S));
  }
  wgmma_wait<0>();
  fence_regs(acc);
  const int r = row_off + w4 * 16 + (lane >> 2);
#pragma unroll
  for (int i = 0; i < WN / 8; ++i) {
    const int col = col_off + i * 8 + (lane & 3) * 2;
    if (r < t.rows)
      *reinterpret_cast<uint32_t*>(c + static_cast<int64_t>(t.row0 + r) * N + t.n0 + col) = pack_bf16(acc[4 * i], acc[4 * i + 1]);
    if (r + 8 < t.rows)
      *reinterpret_cast<uint32_t*>(c + static_cast<int64_t>(t.row0 + r + 8) * N + t.n0 + col) =
          pack_bf16(acc[4 * i + 2], acc[4 * i + 3]);
  }
#endif
}

/// Lets `kernel` (a __global__ function) take `bytes` of dynamic shared memory on the current device,
/// once per kernel and device (cudaFuncSetAttribute); under emulation also the emulated SM's size (plan_occupancy).
void allow_smem(const void* kernel, int bytes) {
  check_smem("matmul_grouped_quant", static_cast<size_t>(bytes));
  plan_occupancy(kernel);
  static thread_local std::vector<std::pair<const void*, int>> configured;
  const int dev = current_device();
  for (const auto& [k, d] : configured)
    if (k == kernel && d == dev) return;
  AERIE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                   "matmul_grouped_quant: cudaFuncSetAttribute (" << bytes << " bytes of shared memory)");
  configured.emplace_back(kernel, dev);
}

template <int F, int BM>
void launch_ws(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c, const GroupDesc* groups,
               const TileDesc* tiles, int tiles_n, int K, int N) {
  constexpr int bytes = WsLayout<F, BM>::bytes + 1024;  // + the alignment to 1024 bytes
  auto* kernel = grouped_gemm_ws_kernel<F, BM>;
  allow_smem(reinterpret_cast<const void*>(kernel), bytes);
  kernel<<<dim3(N / kWsBN, tiles_n), kWsThreads, bytes, stream()>>>(a, a_rows, row_div, c, groups, tiles, K, N);
  AERIE_CUDA_LAUNCHED("grouped_gemm_ws_kernel");
}

// ---- Variant 4: register-sourced wgmma with the operands swapped (sm_90a; the quantized formats,
// AERIE_GROUPED_GEMM_KERNEL=rs). c^T = W a^T: the weight is wgmma's A operand, dequantized straight from
// its stored bytes in shared memory into each thread's A fragment (no bf16 tile of W in shared memory, no
// barrier between the dequantization and the tensor cores), and a's rows are the B operand with N = the
// tile's token rows, a multiple of 16 up to 128 (BTMAX 128: two CTAs per SM) or 256 (one), so one CTA
// dequantizes each weight tile once for up to 256 rows of its expert (Kimi-K2.5's 43 rows per expert
// at T 2048, 171 at T 8192), and pads 16 rows at most. 256 threads: warpgroup g computes W rows
// 64 g .. + 63 of the CTA's 128 columns of c by all of its token rows (m64nBTk16). W is copied in blocks
// of 128 bytes per row (INT4: 4 k tiles, FP8: 2), not 32 or 64 as variants 1-3 do (at T 2048 their
// block times mean ~0.65 TB/s of INT4 weights against ~3.5 TB/s of bf16 ones, 128 bytes per row and k
// tile: inferred, not profiled). Pipeline: S stages of a's k tiles, two W blocks,
// one wgmma group in flight while the next k tile's fragments are dequantized, two fragment sets
// alternating. The dequantized values are quant.h's (int4_word_to_bf16x8 / fp8x8_to_bf16x8's formulas). ----

template <int F>
constexpr int rs_kpb() {  // k tiles per W block: 128 bytes of each row
  return F == kInt4 ? 4 : 2;
}

/// Shared memory of variant 4 from a 1024-byte aligned base: S stages of a's [BTMAX][64] bf16 tile
/// (swizzled, swz), then two W blocks: [128 rows][8 chunks of 16 bytes] with chunk c of row r at
/// r * 128 + ((c ^ (r % 8)) * 16), and for INT4 the block's [128][8] bf16 scales after it.
template <int F, int BTMAX, int S>
struct RsLayout {
  static constexpr int kA = BTMAX * kBK * 2, kW = kBN * 128 + (F == kInt4 ? kBN * 16 : 0);
  static constexpr int a(int s) { return s * kA; }
  static constexpr int w(int slot) { return S * kA + slot * kW; }
  static constexpr int bytes = S * kA + 2 * kW;
};

/// cp.async of W block b (k tiles KPB b .. KPB b + KPB - 1, fewer at the end of K) of rows nl .. nl + 127
/// of the part into `dst` (RsLayout's W block; 256 threads).
template <int F>
__device__ __forceinline__ void rs_load_w(uint32_t dst, const void* wp, const void* sp, int nl, int b, int K, int tid) {
  constexpr int KPB = rs_kpb<F>(), kRowBytesPerTile = F == kInt4 ? 32 : 64;
  const int KT = K / kBK, nkt = min(KPB, KT - b * KPB), chunks = nkt * kRowBytesPerTile / 16;
  const int64_t row_bytes = F == kInt4 ? K / 2 : K;
  const uint8_t* w = static_cast<const uint8_t*>(wp) + static_cast<int64_t>(nl) * row_bytes +
                     static_cast<int64_t>(b) * KPB * kRowBytesPerTile;
#pragma unroll
  for (int i = tid; i < kBN * 8; i += kThreads) {
    const int r = i >> 3, cc = i & 7;
    if (cc < chunks) cp_async16(dst + r * 128 + ((cc ^ (r & 7)) << 4), w + r * row_bytes + cc * 16, true);
  }
  if constexpr (F == kInt4) {
    const int groups32 = K / 32;
    if (tid < kBN) {
      const uint16_t* sc = static_cast<const uint16_t*>(sp) + static_cast<int64_t>(nl + tid) * groups32 + b * KPB * 2;
      const uint32_t sd = dst + kBN * 128 + tid * 16;
      if (nkt == KPB && groups32 % 8 == 0 && (reinterpret_cast<uintptr_t>(sc) & 15) == 0)  // 16-byte aligned
        cp_async16(sd, sc, true);
      else
        for (int j = 0; j < nkt; ++j) cp_async4(sd + j * 4, sc + 2 * j);
    }
  }
}

/// This thread's A fragments of k16 steps 2 k2 and 2 k2 + 1 (k2 0 or 1) of k tile j of a W block (2 k16 steps x
/// 4 registers, the m16n8k16 A layout: register h = W row wr + 8 h at k 2 (lane % 4) .. + 1, register 2 + h the
/// same 8 columns on) from the block at `blk` (RsLayout's). FP8: `scale` is the tile's scale_inv.
template <int F>
__device__ __forceinline__ void rs_fragments_half(const uint8_t* blk, int j, int k2, float scale, int wr, int lane,
                                                  uint32_t (&af)[2][4]) {
  const uint32_t c = lane & 3;
  if constexpr (F == kInt4) {
    // Chunk 2 j + k2 of a row holds the tile's words 4 k2 .. 4 k2 + 3; words 2 ks and 2 ks + 1 of it are k16 step
    // 2 k2 + ks (k 16 ks .. + 7 and + 8 .. + 15), byte c of each this thread's k 2c, 2c + 1 (low nibble first).
    // y = (byte c of the first, -, byte c of the second, -); its low and high nibbles per 16-bit lane, converted
    // as int4_word_to_bf16x8 does. The chunk's scales: group k2 of the tile's two (32 k each).
    const uint32_t sel = c | (c << 4) | ((c + 4) << 8) | ((c + 4) << 12);
    const uint32_t one = 0x3F803F80u, m136 = 0xC308C308u, negzero = 0x80008000u, magic = 0x43004300u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = wr + 8 * h;
      const uint4 q = *reinterpret_cast<const uint4*>(blk + rr * 128 + (((2 * j + k2) ^ (rr & 7)) << 4));
      const uint32_t s2 = *reinterpret_cast<const uint16_t*>(blk + kBN * 128 + rr * 16 + j * 4 + k2 * 2) * 0x10001u;
      const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t y = prmt(wd[2 * ks], wd[2 * ks + 1], sel);
        const uint32_t qlo = (y & 0x000F000Fu) | magic, qhi = ((y >> 4) & 0x000F000Fu) | magic;
        const uint32_t plo = fma_bf16x2(fma_bf16x2(qlo, one, m136), s2, negzero);  // k 2c | k 8 + 2c
        const uint32_t phi = fma_bf16x2(fma_bf16x2(qhi, one, m136), s2, negzero);  // k 2c + 1 | k 9 + 2c
        af[ks][h] = prmt(plo, phi, 0x5410);
        af[ks][2 + h] = prmt(plo, phi, 0x7632);
      }
    }
  } else {
    // Bytes 16 ks + 2c, + 1 and 16 ks + 8 + 2c, + 1 of the tile's 64 in a row (ks = 2 k2, 2 k2 + 1), each fp32
    // product rounded once (fp8x8_to_bf16x8).
    const uint32_t sel = (2 * c) | ((2 * c + 1) << 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = wr + 8 * h;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint4 b = *reinterpret_cast<const uint4*>(blk + rr * 128 + (((4 * j + 2 * k2 + ks) ^ (rr & 7)) << 4));
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const uint32_t pair = q == 0 ? prmt(b.x, b.y, sel) : prmt(b.z, b.w, sel);
          const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
          af[ks][2 * q + h] = pack_bf16(f.x * scale, f.y * scale);
        }
      }
    }
  }
}

/// This thread's A fragments of the 4 k16 steps of k tile j of a W block (rs_fragments_half's, both halves).
template <int F>
__device__ __forceinline__ void rs_fragments(const uint8_t* blk, int j, float scale, int wr, int lane,
                                             uint32_t (&af)[4][4]) {
  rs_fragments_half<F>(blk, j, 0, scale, wr, lane, *reinterpret_cast<uint32_t(*)[2][4]>(&af[0]));
  rs_fragments_half<F>(blk, j, 1, scale, wr, lane, *reinterpret_cast<uint32_t(*)[2][4]>(&af[2]));
}

/// W row (of the CTA's 128) of this thread's A fragments and accumulators: warpgroup, warp, lane / 4.
__device__ __forceinline__ int wr_of(int tid) { return (tid >> 7) * 64 + ((tid >> 5) & 3) * 16 + ((tid & 31) >> 2); }


/// The token rows that variants 4 and 5 copy for one tile: a's rows row0 .. row0 + rows - 1 (through a_rows as
/// tile_of reads them; the tile's rows past `rows` read as zeros). 256 threads: this one copies chunk tid % 8 of
/// tile rows (tid / 8) + 32 j.
template <int BT>
struct RsRows {
  static constexpr int kRows = (BT * 8 + kThreads - 1) / kThreads;
  int32_t src[kRows];  // a's row of each copied tile row; -1: past the group (zeros)

  __device__ __forceinline__ RsRows(const int32_t* a_rows, int row_div, int rows, int row0) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int row = (threadIdx.x >> 3) + 32 * j;
      src[j] = row < rows ? (a_rows ? a_rows[row0 + row] / row_div : row0 + row) : -1;
    }
  }
};

/// cp.async of a's k tile kt (rows `r`) into RsLayout<F, BT, S>'s stage s at `base`, and of W's block (rows
/// nl .. nl + 127 of the part wp / sp, rs_load_w) when kt starts one.
template <int F, int BT, int S>
__device__ __forceinline__ void rs_load(const RsRows<BT>& r, const __nv_bfloat16* a, const void* wp, const void* sp,
                                        int nl, int K, uint32_t base, int s, int kt, int tid) {
  using L = RsLayout<F, BT, S>;
  constexpr int KPB = rs_kpb<F>();
  const int k0 = kt * kBK, ch = tid & 7;
  const uint32_t sa = base + L::a(s);
#pragma unroll
  for (int j = 0; j < RsRows<BT>::kRows; ++j) {
    const int row = (tid >> 3) + 32 * j;
    if (row < BT)
      cp_async16(sa + swz(row, ch), a + static_cast<int64_t>(r.src[j] < 0 ? 0 : r.src[j]) * K + k0 + ch * 8,
                 r.src[j] >= 0);
  }
  if (kt % KPB == 0) rs_load_w<F>(base + L::w((kt / KPB) & 1), wp, sp, nl, kt / KPB, K, tid);
}

/// Variants 4 and 5's store of one accumulator pair: v0, v1 = c's column `col` at token rows tok and tok + 1
/// (c^T's layout), as this lane holds them; lanes 4 apart hold neighbouring columns (lane / 4 even: col even),
/// so the even lane stores (token tok, columns col, col + 1) and the odd one (tok + 1, columns col - 1, col),
/// one 4-byte store each, token rows of the tile past `rows` not at all.
__device__ __forceinline__ void rs_store_pair(__nv_bfloat16* c, int N, int n0, int row0, int rows, int tok, int col,
                                              float v0, float v1, int lane) {
  const bool odd = (lane >> 2) & 1;
  const float got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
  const int t = tok + (odd ? 1 : 0), cc = col - (odd ? 1 : 0);
  if (t < rows)
    *reinterpret_cast<uint32_t*>(c + static_cast<int64_t>(row0 + t) * N + n0 + cc) =
        odd ? pack_bf16(got, v1) : pack_bf16(v0, got);
}

/// One tile of variant 4: token rows row0 .. row0 + rows - 1 of c (rows <= BT, a multiple of 16; a's rows
/// through a_rows as tile_of reads them) by columns n0 .. n0 + 127 (rows nl .. of the part wp / sp).
template <int F, int BT, int S>
__device__ __forceinline__ void rs_tile(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c,
                                        const void* wp, const void* sp, int nl, int n0, int rows, int row0, int K,
                                        int N) {
  constexpr int KPB = rs_kpb<F>();
  // W block b is copied with a's k tile KPB b (S - 1 tiles ahead) into slot b % 2, whose previous block
  // (b - 2) was last read KPB + S - 2 iterations before: after a barrier.
  static_assert(F != kDense && S >= 3 && S - 1 <= KPB + 1 && BT % 16 == 0 && BT <= 256,
                "variant 4's formats, stages and tiles");
  extern __shared__ __align__(1024) uint8_t smem[];
  using L = RsLayout<F, BT, S>;
  constexpr int R = BT / 2;  // accumulators per thread
  const int tid = threadIdx.x, lane = tid & 31, wr = wr_of(tid);
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(smem, mem);
  const RsRows<BT> rws(a_rows, row_div, rows, row0);
  const int KT = K / kBK, scols = (K + 127) / 128;
  auto load = [&](int s, int kt) { rs_load<F, BT, S>(rws, a, wp, sp, nl, K, base, s, kt, tid); };
  auto frags = [&](int kt, uint32_t(&f)[4][4]) {
    float scale = 0.0f;  // FP8: one scale_inv per 128 x 128 block (nl % 128 == 0)
    if constexpr (F == kFp8)
      scale = __ldg(static_cast<const float*>(sp) + static_cast<int64_t>(nl / 128) * scols + (kt * kBK) / 128);
    rs_fragments<F>(mem + L::w((kt / KPB) & 1), kt % KPB, scale, wr, lane, f);
  };

  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  uint32_t f0[4][4], f1[4][4];

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  cp_async_wait<S - 2>();  // tile 0
  fence_proxy_async();
  __syncthreads();
  frags(0, f0);
  // One k tile: its wgmma group on `cur`, then (tile kt - 1's group done, every thread past it, tile kt + 1
  // landed) the refill of tile kt - 1's stage and tile kt + 1's fragments into `nxt`.
  auto step = [&](int kt, uint32_t(&cur)[4][4], uint32_t(&nxt)[4][4]) {
    const uint64_t db = wgmma_desc(base + L::a(kt % S));
    fence_regs(acc);
    fence_frags(cur);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) wgmma_rs::mma<BT>(acc, cur[ks], db + 2 * ks);
    wgmma_commit();
    wgmma_wait<1>();
    fence_regs(acc);
    fence_frags(nxt);
    cp_async_wait<S - 3>();
    fence_proxy_async();
    __syncthreads();
    const int nk = kt + S - 1;
    if (nk < KT) load(nk % S, nk);
    cp_async_commit();
    if (kt + 1 < KT) frags(kt + 1, nxt);
  };
  for (int kt = 0; kt < KT; kt += 2) {
    step(kt, f0, f1);
    if (kt + 1 < KT) step(kt + 1, f1, f0);
  }
  wgmma_wait<0>();
  fence_regs(acc);
  cp_async_wait<0>();
  // acc[4 i + 2 h], acc[4 i + 2 h + 1]: W row (= column of c) wr + 8 h, token rows 8 i + 2 (lane % 4) and + 1.
#pragma unroll
  for (int i = 0; i < BT / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      rs_store_pair(c, N, n0, row0, rows, 8 * i + 2 * (lane & 3), wr + 8 * h, acc[4 * i + 2 * h],
                    acc[4 * i + 2 * h + 1], lane);
}

template <int F, int BT, int S>
__device__ __forceinline__ void rsm_tile(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c,
                                         const void* wp, const void* sp, int nl, int n0, int rows, int row0, int K,
                                         int N);  // variant 5, below

/// rs_tile (MMA false: variant 4) or rsm_tile (true: variant 5) for the tile's BT = 16 n16, n16 in
/// [N16, BTMAX / 16].
template <bool MMA, int F, int BTMAX, int S, int N16 = 1>
__device__ __forceinline__ void rs_dispatch(int n16, const __nv_bfloat16* a, const int32_t* a_rows, int row_div,
                                            __nv_bfloat16* c, const void* wp, const void* sp, int nl, int n0,
                                            int rows, int row0, int K, int N) {
  if constexpr (16 * N16 <= BTMAX) {
    if (n16 != N16)
      rs_dispatch<MMA, F, BTMAX, S, N16 + 1>(n16, a, a_rows, row_div, c, wp, sp, nl, n0, rows, row0, K, N);
    else if constexpr (MMA)
      rsm_tile<F, 16 * N16, S>(a, a_rows, row_div, c, wp, sp, nl, n0, rows, row0, K, N);
    else
      rs_tile<F, 16 * N16, S>(a, a_rows, row_div, c, wp, sp, nl, n0, rows, row0, K, N);
  }
}

/// Variant 4 (MMA false; built for sm_90a only) or 5 (true) over tiles of up to BTMAX token rows, S stages of
/// a's k tiles, MINB CTAs per SM.
template <bool MMA, int F, int BTMAX, int S, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    grouped_gemm_rs_kernel(const __nv_bfloat16* __restrict__ a, const int32_t* __restrict__ a_rows, int row_div,
                           __nv_bfloat16* __restrict__ c, const GroupDesc* __restrict__ groups,
                           const TileDesc* __restrict__ tiles, int K, int N) {
  if constexpr (!MMA && !kWgmmaBuilt) {
    __trap();  // not launched: the host takes the mma.sync kernels off sm_90
  } else {
    const TileDesc td = tiles[blockIdx.y];
    const GroupDesc& g = groups[td.group];
    const int n0 = blockIdx.x * kBN;
    int pstart = 0;
    const int part = part_of(g, n0, pstart);
    rs_dispatch<MMA, F, BTMAX, S>(td.bt >> 4, a, a_rows, row_div, c, g.w[part], g.s[part], n0 - pstart, n0,
                                  min(td.bt, g.rows - td.m0), g.row0 + td.m0, K, N);
  }
}

/// grouped_gemm_rs_kernel over `tiles_n` tiles. Variant 4: S 4. Variant 5: BTMAX 128 with 3 stages (INT4: 85
/// KiB of shared memory, within sm_120's 99 KiB a block), 64 with 4 (INT4: 69 KiB; FP8, whose W blocks span 2 k
/// tiles: 3).
template <bool MMA, int F, int BTMAX, int S, int MINB>
void launch_rs(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c, const GroupDesc* groups,
               const TileDesc* tiles, int tiles_n, int K, int N) {
  constexpr int bytes = RsLayout<F, BTMAX, S>::bytes + 1024;  // + the alignment to 1024 bytes
  auto* kernel = grouped_gemm_rs_kernel<MMA, F, BTMAX, S, MINB>;
  allow_smem(reinterpret_cast<const void*>(kernel), bytes);
  kernel<<<dim3(N / kBN, tiles_n), kThreads, bytes, stream()>>>(a, a_rows, row_div, c, groups, tiles, K, N);
  AERIE_CUDA_LAUNCHED("grouped_gemm_rs_kernel");
}

// ---- Variant 5: register-sourced mma.sync (any sm_80 or later; the default for INT4 weights off sm_90a,
// AERIE_GROUPED_GEMM_KERNEL=rsm for FP8 too). Variant 4's operands and data path without wgmma: c^T = W a^T,
// the weight dequantized from its stored bytes in shared memory straight into mma.sync m16n8k16's A
// fragments (rs_fragments: the register layout of wgmma's A is mma.sync's, one m16 per warp), so no
// bf16 copy of W goes through shared memory (variant 1 writes one and reads it back, and its two
// dequantized tiles leave one CTA of ~93 KiB per SM of 100 KiB on an sm_120); a's token rows are the B
// operand, read with ldmatrix from the swizzled stages (one x4 gives one n8 tile for two k16 steps).
// 256 threads: warp w computes W rows 32 (w % 4) .. + 31 (two m16 tiles) of the CTA's 128 columns of c, and
// each a fragment serves both m16 tiles. Token tiles of up to kRsmKSplitMaxRows rows: warp w takes k16 steps
// 2 (w / 4), + 1 of each k tile by all the tile's rows (BT / 8 n8 tiles), so the two warps of a row block
// dequantize half of its values each, and the second's sums meet the first's in shared memory at the end;
// taller tiles: warp w takes every k16 step by token rows (w / 4) BT / 2 .. + BT / 2 - 1 (BT / 16 n8 tiles),
// both warps dequantizing all of the rows' values (the k split's accumulators would not fit the registers).
// Token tiles as variant 4 builds them (a multiple of 16, at most BTMAX: 128 by default, 64 with
// AERIE_GROUPED_GEMM_BM=64); S stages of a's k tiles and variant 4's two W blocks; the same dequantized
// values and, per k16 step, the same fp32 products, so c equals variant 4's up to the fp32 order of the
// sums. ----

/// Token tiles of variant 5 up to this many rows split each k tile's k16 steps between the two warps of a row block
/// (each dequantizes half of the W rows' values, over every token row); taller ones split the token rows (each
/// dequantizes all of them, over half the token rows), whose accumulators, twice as many, would not fit the
/// registers of the k split.
constexpr int kRsmKSplitMaxRows = 96;

/// One tile of variant 5 (the arguments as rs_tile's; rows <= BT).
template <int F, int BT, int S>
__device__ __forceinline__ void rsm_tile(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c,
                                         const void* wp, const void* sp, int nl, int n0, int rows, int row0, int K,
                                         int N) {
  constexpr int KPB = rs_kpb<F>();
  // W block b goes into slot b % 2 at iteration KPB b - (S - 1), after its barrier and before that
  // iteration's fragments: block b - 2's last reader, k tile KPB b - KPB - 1, must be an earlier iteration.
  static_assert(F != kDense && S >= 3 && S <= KPB + 1 && BT % 16 == 0 && BT <= 128,
                "variant 5's formats, stages and tiles");
  extern __shared__ __align__(1024) uint8_t smem[];
  using L = RsLayout<F, BT, S>;
  constexpr bool KSPLIT = BT <= kRsmKSplitMaxRows;
  constexpr int NT = KSPLIT ? BT / 8 : BT / 16;  // n8 token tiles per warp
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, half = warp >> 2;
  const int wr = (warp & 3) * 32 + (lane >> 2), tok0 = KSPLIT ? 0 : half * (BT / 2);
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(smem, mem);
  const RsRows<BT> rws(a_rows, row_div, rows, row0);
  const int KT = K / kBK, scols = (K + 127) / 128;
  auto load = [&](int s, int kt) { rs_load<F, BT, S>(rws, a, wp, sp, nl, K, base, s, kt, tid); };

  float acc[2][NT][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][nt][e] = 0.0f;
  // The k16 steps 2 k2, 2 k2 + 1 of fragments fa (this thread's two m16 tiles) by the n8 token tiles.
  auto mma_half = [&](uint32_t sa, int k2, const uint32_t(&fa)[2][2][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b0, b1, b2, b3;  // chunks 4 k2 .. 4 k2 + 3 of the n8 tile's rows
      ldsm_x4(sa + swz(tok0 + nt * 8 + (lane & 7), 4 * k2 + (lane >> 3)), b0, b1, b2, b3);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma16816(acc[mi][nt], fa[mi][0], b0, b1);
        mma16816(acc[mi][nt], fa[mi][1], b2, b3);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<S - 2>();
    __syncthreads();  // tile kt (and its W block) landed for every thread; stage kt - 1 is free
    {
      const int nk = kt + S - 1;
      if (nk < KT) load(nk % S, nk);
      cp_async_commit();
    }
    float scale = 0.0f;  // FP8: one scale_inv per 128 x 128 block (nl % 128 == 0)
    if constexpr (F == kFp8)
      scale = __ldg(static_cast<const float*>(sp) + static_cast<int64_t>(nl / 128) * scols + (kt * kBK) / 128);
    const uint8_t* blk = mem + L::w((kt / KPB) & 1);
    const uint32_t sa = base + L::a(kt % S);
    uint32_t fa[2][2][4];
    if constexpr (KSPLIT) {  // this warp's half of the k16 steps
      rs_fragments_half<F>(blk, kt % KPB, half, scale, wr, lane, fa[0]);
      rs_fragments_half<F>(blk, kt % KPB, half, scale, wr + 16, lane, fa[1]);
      mma_half(sa, half, fa);
    } else {
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        rs_fragments_half<F>(blk, kt % KPB, k2, scale, wr, lane, fa[0]);
        rs_fragments_half<F>(blk, kt % KPB, k2, scale, wr + 16, lane, fa[1]);
        mma_half(sa, k2, fa);
      }
    }
  }
  cp_async_wait<0>();
  if constexpr (KSPLIT) {
    // The second half's partial sums through shared memory (the stages and W blocks, free now: BT x 512 bytes
    // within S BT 128 + 2 kW) into the first half's, which stores the tile.
    __syncthreads();
    float* red = reinterpret_cast<float*>(mem);
    const int t = tid & 127;
    if (half == 1)
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[((mi * NT + nt) * 4 + e) * 128 + t] = acc[mi][nt][e];
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][nt][e] += red[((mi * NT + nt) * 4 + e) * 128 + t];
  }
  // acc[mi][nt][2 h], [2 h + 1]: W row (= column of c) wr + 16 mi + 8 h, token rows tok0 + 8 nt + 2 (lane % 4)
  // and + 1.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        rs_store_pair(c, N, n0, row0, rows, tok0 + 8 * nt + 2 * (lane & 3), wr + 16 * mi + 8 * h, acc[mi][nt][2 * h],
                      acc[mi][nt][2 * h + 1], lane);
}

template <int F, int BM, bool WG, int STAGES>
void launch(const __nv_bfloat16* a, const int32_t* a_rows, int row_div, __nv_bfloat16* c, const GroupDesc* groups,
            const TileDesc* tiles, int tiles_n, int K, int N) {
  constexpr int bytes = Layout<F, BM, STAGES>::bytes + 1024;  // + the alignment to 1024 bytes
  auto* kernel = [] {
    if constexpr (WG)
      return grouped_gemm_wgmma_kernel<F, BM, STAGES>;
    else
      return grouped_gemm_kernel<F, BM, STAGES>;
  }();
  allow_smem(reinterpret_cast<const void*>(kernel), bytes);
  kernel<<<dim3(N / kBN, tiles_n), kThreads, bytes, stream()>>>(a, a_rows, row_div, c, groups, tiles, K, N);
  AERIE_CUDA_LAUNCHED("grouped_gemm_kernel");
}



}  // namespace

bool wgmma_device() {
#ifndef AERIE_CUDA_SM90A
  return false;
#else
  return gpu_limits().wgmma;
#endif
}

void matmul_grouped_quant(const Tensor& a, int format, const std::vector<GroupedWeight>& w,
                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& groups, Tensor& c,
                          const int32_t* a_rows, int row_div) {
  const int K = static_cast<int>(a.dim(1)), N = static_cast<int>(c.dim(1));
  // Row tiles. "mixed" (the default): 128-row tiles, and a group's last rows, when 64 or fewer, in a
  // 64-row tile of a second launch. "64" / "128" (AERIE_GROUPED_GEMM_BM, for benchmarks): one height.
  const Settings& env = settings();
  std::string mode = env.grouped_gemm_bm;
  std::vector<GroupDesc> gd;
  std::vector<TileDesc> t128, t64;
  const std::string& kname = env.grouped_gemm_kernel;
  const bool wg = kname != "mma" && wgmma_device();
  // Variant 4 (register-sourced, swapped operands) for quantized weights: the default ("auto", measured on
  // the H200 at 1.49x / 1.59x variant 2 for Kimi-K2.5's INT4 experts and 1.39x / 1.31x for DeepSeek-V3's
  // FP8 ones at T 2048 / 8192, docs/performance.md), or AERIE_GROUPED_GEMM_KERNEL=rs. Token tiles of up
  // to 256 rows ("mixed"), 128 or 64 (AERIE_GROUPED_GEMM_BM), a group's rows split into equal tiles, each
  // a multiple of 16 rows; tiles of up to 128 rows in one launch, the larger ones in another.
  // Its tiles of up to 128 rows: a kernel for those with two CTAs per SM (AERIE_GROUPED_GEMM_RS_SMALL=2,
  // the default; 128 registers, a few spilled), one CTA (1), or the 256-row kernel (0).
  const bool rs = wg && (kname == "rs" || kname == "auto") && format != kDense;
  // Variant 5 (register-sourced mma.sync) for FP8 and INT4 weights where wgmma is not (an sm_120, an sm_100
  // until tcgen05 kernels exist, sm_80/89, AERIE_CUDA_EMULATE; measured on an H100 as sm_120 at 1.56x / 1.34x
  // variant 1 for Kimi-K2.5's INT4 MoE block and 1.55x / 1.42x for DeepSeek-V3's block-FP8 one at T 2048 / 8192,
  // docs/performance.md), or with AERIE_GROUPED_GEMM_KERNEL=rsm on any GPU: variant 4's token tiles of up to 128
  // rows (64 with AERIE_GROUPED_GEMM_BM=64), one launch.
  const bool rsm = !rs && format != kDense && (kname == "rsm" || (kname == "auto" && !wg));
  const int rs_small = env.grouped_gemm_rs_small;
  // The warp-specialized kernel (variant 3, 256-column tiles) where c's columns and every part's rows
  // are multiples of 256: by default ("auto") for BF16 weights only, where it measured 1.12-1.19x
  // variant 2 on the H200 (DeepSeek-V3's experts, docs/performance.md); its producer's dequantization
  // made INT4 10% slower and FP8 level, so those take variant 4 (or variant 3 with
  // AERIE_GROUPED_GEMM_KERNEL=ws).
  // Its 64-row tiles may be replaced by variant 2's (AERIE_GROUPED_GEMM_TAIL=wgmma).
  bool ws = wg && (kname == "ws" || (kname == "auto" && format == kDense)) && N % kWsBN == 0;
  for (size_t i = 0; ws && i < groups.size(); ++i)
    for (const auto& part : w[groups[i]]) ws = ws && part.weight.dim(0) % kWsBN == 0;
  const bool ws64 = ws && !env.grouped_gemm_tail_wgmma;
  const bool four = env.grouped_gemm_four_stages;
  // 128-row tiles need more shared memory than 64-row ones (the mma.sync FP8 kernel: 105 KiB, above the
  // 99 KiB per block of sm_86/89/120): where the GPU has less, every tile has 64 rows.
  if (rsm && mode != "64" &&
      !smem_fits((format == kInt4 ? RsLayout<kInt4, 128, 3>::bytes : RsLayout<kFp8, 128, 3>::bytes) + 1024))
    mode = "64";
  if (mode != "64" && !rsm) {
    const int need = format == kFp8    ? Layout<kFp8, 128, 3>::bytes
                     : format == kInt4 ? Layout<kInt4, 128, 3>::bytes
                                       : Layout<kDense, 128, 3>::bytes;
    if (!smem_fits(need + 1024)) mode = "64";
  }
  gd.reserve(groups.size());
  for (int64_t g : groups) {
    GroupDesc d{};
    int32_t end = 0;
    for (size_t p = 0; p < kMaxParts; ++p) {
      if (p < w[g].size()) {
        d.w[p] = w[g][p].weight.raw();
        d.s[p] = w[g][p].scale.defined() ? w[g][p].scale.raw() : nullptr;
        end += static_cast<int32_t>(w[g][p].weight.dim(0));
      }
      d.part_end[p] = p < w[g].size() ? end : INT32_MAX;
    }
    d.row0 = static_cast<int32_t>(offsets[g]);
    d.rows = static_cast<int32_t>(offsets[g + 1] - offsets[g]);
    const int32_t gi = static_cast<int32_t>(gd.size());
    if (rs || rsm) {
      const int32_t most = mode == "64" ? 64 : mode == "128" || rsm ? 128 : 256;
      const int32_t nt = (d.rows + most - 1) / most, per = nt > 0 ? (d.rows + nt - 1) / nt : 0;
      const int32_t bt = (per + 15) / 16 * 16;
      for (int32_t m0 = 0; m0 < d.rows; m0 += per) (bt <= 128 ? t64 : t128).push_back({gi, m0, bt});
    } else if (mode == "64") {
      for (int32_t m0 = 0; m0 < d.rows; m0 += 64) t64.push_back({gi, m0});
    } else {
      int32_t m0 = 0;
      for (; d.rows - m0 > (mode == "128" ? 0 : 64); m0 += 128) t128.push_back({gi, m0});
      if (m0 < d.rows) t64.push_back({gi, m0});
    }
    gd.push_back(d);
  }
  AERIE_CHECK(t128.size() <= 65535 && t64.size() <= 65535,
              "matmul_grouped_quant: " << t128.size() + t64.size() << " row tiles exceed the grid's 65535");
  const size_t gbytes = gd.size() * sizeof(GroupDesc), b128 = t128.size() * sizeof(TileDesc);
  const size_t bytes = gbytes + b128 + t64.size() * sizeof(TileDesc);
  std::vector<uint8_t> host(bytes);
  std::memcpy(host.data(), gd.data(), gbytes);
  std::memcpy(host.data() + gbytes, t128.data(), b128);
  std::memcpy(host.data() + gbytes + b128, t64.data(), t64.size() * sizeof(TileDesc));
  const cudaStream_t s = stream();
  void* dev = alloc(bytes, current_stream());
  AERIE_CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), bytes, cudaMemcpyHostToDevice, s),
                   "matmul_grouped_quant: cudaMemcpyAsync of " << groups.size() << " group descriptors");
  const auto* gdev = static_cast<const GroupDesc*>(dev);
  const auto* d128 = reinterpret_cast<const TileDesc*>(static_cast<const uint8_t*>(dev) + gbytes);
  const auto* d64 = reinterpret_cast<const TileDesc*>(static_cast<const uint8_t*>(dev) + gbytes + b128);
  const auto* ap = static_cast<const __nv_bfloat16*>(a.raw());
  auto* cp = static_cast<__nv_bfloat16*>(c.raw());
  const int n128 = static_cast<int>(t128.size()), n64 = static_cast<int>(t64.size());
  // The kernel: ws (variant 3, above), wgmma (variant 2) or mma.sync (AERIE_GROUPED_GEMM_KERNEL=mma); the wgmma kernel's stages
  // at 128 rows: 3 (two CTAs per SM, the default) or 4 (one; AERIE_GROUPED_GEMM_STAGES=4).
  auto run = [&](auto fmt) {
    constexpr int F = decltype(fmt)::value;
    if (rs) {  // t64: tiles of up to 128 rows, t128: the larger ones
      if constexpr (F != kDense) {
        if (n64 > 0) {
          if (rs_small == 2)
            launch_rs<false, F, 128, 4, 2>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
          else if (rs_small == 1)
            launch_rs<false, F, 128, 4, 1>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
          else
            launch_rs<false, F, 256, 4, 1>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
        }
        if (n128 > 0) launch_rs<false, F, 256, 4, 1>(ap, a_rows, row_div, cp, gdev, d128, n128, K, N);
      }
      return;
    }
    if (rsm) {  // t64: every tile (up to 128 rows)
      if constexpr (F != kDense) {
        if (n64 > 0 && mode == "64")
          launch_rs<true, F, 64, std::min(4, rs_kpb<F>() + 1), 1>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
        else if (n64 > 0)
          launch_rs<true, F, 128, 3, 1>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
      }
      return;
    }
    if (n128 > 0) {
      if (ws)
        launch_ws<F, 128>(ap, a_rows, row_div, cp, gdev, d128, n128, K, N);
      else if (!wg)
        launch<F, 128, false, 3>(ap, a_rows, row_div, cp, gdev, d128, n128, K, N);
      else if (four)
        launch<F, 128, true, 4>(ap, a_rows, row_div, cp, gdev, d128, n128, K, N);
      else
        launch<F, 128, true, 3>(ap, a_rows, row_div, cp, gdev, d128, n128, K, N);
    }
    if (n64 > 0) {
      if (ws64)
        launch_ws<F, 64>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
      else if (wg)
        launch<F, 64, true, 4>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
      else
        launch<F, 64, false, 4>(ap, a_rows, row_div, cp, gdev, d64, n64, K, N);
    }
  };
  if (format == kDense)
    run(std::integral_constant<int, kDense>{});
  else if (format == kFp8)
    run(std::integral_constant<int, kFp8>{});
  else
    run(std::integral_constant<int, kInt4>{});
  free(dev, current_stream());
}

}  // namespace aerie::cuda
