// wgmma (sm_90a) kernels of the causal GQA attention, bf16 q/k/v (and dout): the forward of attention_tc.cu
// (head dims 64, 128, MLA's 192 / 128 and the MLA draft's padded 192 / 192) and, at head dims 64, 128 and 192,
// the two backward passes of attention_backward_tc.cu (dq per tile of packed query rows; dk/dv per tile of
// keys, no atomics; at 192 the dk/dv pass runs as a dV launch and a dK launch) with warpgroup MMAs instead of mma.sync, the
// same contracts, row packing (R = i * group + head in group), masks, key splits / varlen (forward)
// and treatment of rows without keys. The math is FlashAttention-2's (Dao 2023): the forward's online
// softmax (Algorithm 1); the backward's P = exp(scale q.k - lse) recomputed from the saved lse,
// dP = dout v^T, dS = P (dP - D), dq = scale dS K, dk += scale dS^T Q, dv += P^T dout (Algorithm 2).
// P and dS are rounded to bf16 as the A operands of the second products, everything else is fp32.
// The layout follows FlashAttention-3 (Shah et al. 2024) where it pays on Hopper: the products read
// their shared-memory operands through wgmma descriptors; P / dS go from the accumulators of one wgmma
// straight into the A registers of the next; each kernel is warp-specialized (a producer warpgroup
// copies with cp.async into mbarrier slots, two consumer warpgroups multiply).
//
// Forward: a block holds 128 packed query rows (64 per consumer warpgroup, Q resident); 64-key tiles of
// K and V stream; per tile S = Q K^T, the online softmax, O += P V (V read MN-major). dk/dv pass: a
// block holds 128 keys of one kv head (64 per consumer warpgroup, K and V resident); 64-row tiles of
// packed query rows (Q, dout, their lse and D) stream; per tile S^T = K Q^T and dP^T = V dout^T (both
// operands K-major), dV += P^T dout and dK += dS^T Q (Q and dout read MN-major: the same tiles,
// transposed). dq pass: 128 packed query rows (Q, dout resident), 64-key tiles of K and V; per tile
// S = Q K^T, dP = dout V^T, dQ += dS K (K MN-major). Shared tiles: wgmma's 128-byte swizzle, D / 64
// 64-column halves per [rows][D] tile (wgmma.cuh). Measured: docs/performance.md, "Attention kernels
// on wgmma".
#include <cstdlib>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/wgmma_rs.cuh"

namespace aerie::cuda::attn {
namespace {

constexpr int kWgs = 2;              // warpgroups per block
constexpr int kM = 64;               // rows (dq) or keys (dk/dv) per warpgroup
constexpr int kN = 64;               // keys (dq) or packed rows (dk/dv) per streamed tile
constexpr int kBlock = kWgs * kM;    // rows (dq) or keys (dk/dv) per block
constexpr int kSlots = 3;            // shared-memory slots of the streamed tiles

/// Bytes of an [R][D] bf16 tile (D / 64 column halves of [R][128 bytes]).
template <int R, int D>
constexpr uint32_t wtile() {
  return R * D * 2;
}

/// Byte offset of 16-byte chunk c (0 .. D / 8 - 1: columns 8c .. 8c + 7) of row r in an [R][D] tile.
template <int R>
__device__ __forceinline__ uint32_t wswz(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

#ifndef AERIE_NO_WGMMA
/// cp.async of 4 bytes (zeros when !valid), through L1 (.ca: the only cache option for 4 bytes).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

/// The producer's copy (its 128 threads) of R rows of two [.., 192] bf16 tensors into [R][192] tiles: row r of
/// both from element offset off(r) when ok(r), else zeros. 24 chunks per row: thread tid copies chunks
/// tid % 8 + {0, 8, 16} of every 16th row.
template <int R, typename Row>
__device__ __forceinline__ void copy_pairs_192(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                               int tid, const Row& row) {
  const int c8 = tid & 7;
#pragma unroll 2
  for (int r = tid >> 3; r < R; r += 16) {
    bool ok;
    const int64_t off = row(r, ok);
#pragma unroll
    for (int x = 0; x < 3; ++x) {
      const int c = x * 8 + c8;
      cp_async16(dst_a + wswz<R>(r, c), a + off + (ok ? c * 8 : 0), ok);
      cp_async16(dst_b + wswz<R>(r, c), b + off + (ok ? c * 8 : 0), ok);
    }
  }
}

/// The producer's copy (its 128 threads, tid 0 .. 127) of packed query rows R0 .. R0 + R - 1 (row R =
/// i * group + head in group of kv head g) of two [tq, nh, D] tensors (Q and dout) into [R][D] tiles;
/// rows past tq are zeros. Row arithmetic in 32 bits (the launch checks that tq * group fits).
template <int R, int D>
__device__ __forceinline__ void load_rows_w(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                            const BwdParams& p, int g, int R0, int tid) {
  if constexpr (D == 192) {
    copy_pairs_192<R>(dst_a, a, dst_b, b, tid, [&](int r, bool& ok) -> int64_t {
      const int row = R0 + r, i = row / p.group;
      const int h = g * p.group + (row - i * p.group);
      ok = i < p.tq;
      return ok ? (static_cast<int64_t>(i) * p.nh + h) * D : 0;
    });
    return;
  } else {
  constexpr int C = D / 8, kLogC = D == 64 ? 3 : 4;  // 16-byte chunks per row: thread tid copies chunk tid % C
  static_assert(C == 1 << kLogC);                     // of every (128 / C)-th row
  const int c = tid & (C - 1);
#pragma unroll 4
  for (int r = tid >> kLogC; r < R; r += 128 / C) {
    const int row = R0 + r, i = row / p.group;
    const int h = g * p.group + (row - i * p.group);
    const bool ok = i < p.tq;
    const int64_t off = ok ? (static_cast<int64_t>(i) * p.nh + h) * D + c * 8 : 0;
    cp_async16(dst_a + wswz<R>(r, c), a + off, ok);
    cp_async16(dst_b + wswz<R>(r, c), b + off, ok);
  }
  }
}

/// The dk/dv pass's copy of one tile: packed query rows R0 .. R0 + 63 of Q and dout into [64][D] tiles
/// and their raw lse and D into lse_s / D_s (4-byte copies; zeros past tq). Thread tid copies row tid / 2,
/// chunks 2k + tid % 2 (two threads fill a 32-byte sector): one row division per thread and tile, where
/// load_rows_w makes D / 16 (the producer warpgroup was the pass's bottleneck, Nsight Compute: the
/// consumers waited on `full` 18% of their time while the producer issued).
template <int D>
__device__ __forceinline__ void load_tile_pairs(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                                uint32_t lse_s, uint32_t D_s, const BwdParams& p, int g, int R0,
                                                int tid) {
  const int r = tid >> 1, half = tid & 1;
  const int R = R0 + r, i = R / p.group;
  const bool ok = i < p.tq;
  const int64_t row = ok ? static_cast<int64_t>(i) * p.nh + g * p.group + (R - i * p.group) : 0;
  if (half == 0) {
    cp_async4(lse_s + 4 * r, p.lse + row, ok);
    cp_async4(D_s + 4 * r, p.D + row, ok);
  }
  const int64_t off = row * D + half * 8;
  const uint32_t sw = static_cast<uint32_t>(r * 128 + ((half ^ (r & 7)) << 4));  // chunk `half` of row r
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    // chunk 2k + half: column half (2k) / 8 of the tile, swizzled position ((2k + half) ^ r) & 7
    const uint32_t o = static_cast<uint32_t>((k >> 2) * (kN * 128)) + (sw ^ static_cast<uint32_t>((2 * k & 7) << 4));
    cp_async16(dst_a + o, a + off + 16 * k, ok);
    cp_async16(dst_b + o, b + off + 16 * k, ok);
  }
}

/// The producer's copy of keys j0 .. j0 + R - 1 of kv head g of two [tk, nkv, D] tensors (K and V);
/// keys past tk are zeros.
template <int R, int D>
__device__ __forceinline__ void load_keys_w(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                            const BwdParams& p, int g, int64_t j0, int tid) {
  if constexpr (D == 192) {
    copy_pairs_192<R>(dst_a, a, dst_b, b, tid, [&](int jj, bool& ok) -> int64_t {
      const int64_t j = j0 + jj;
      ok = j < p.tk;
      return ok ? (j * p.nkv + g) * D : 0;
    });
    return;
  } else {
  constexpr int C = D / 8, kLogC = D == 64 ? 3 : 4;  // as load_rows_w
  static_assert(C == 1 << kLogC);
  const int c = tid & (C - 1);
#pragma unroll 4
  for (int jj = tid >> kLogC; jj < R; jj += 128 / C) {
    const int64_t j = j0 + jj;
    const bool ok = j < p.tk;
    const int64_t off = ok ? (j * p.nkv + g) * D + c * 8 : 0;
    cp_async16(dst_a + wswz<R>(jj, c), a + off, ok);
    cp_async16(dst_b + wswz<R>(jj, c), b + off, ok);
  }
  }
}

template <int H>
__device__ __forceinline__ void fence_acc(float (&d)[H][32]) {
#pragma unroll
  for (int h = 0; h < H; ++h) fence_regs(d[h]);
}

/// Issues acc (64 x 64) = A B^T over a head dim of D: A = rows a_row0 .. + 63 of the [RA][D] tile at a, B =
/// the [64][D] tile at b, both K-major (D / 64 halves). Not committed.
template <int RA, int D>
__device__ __forceinline__ void issue_dot(float (&acc)[32], uint32_t a, int a_row0, uint32_t b) {
  wgmma_fence();
  fence_regs(acc);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint32_t half = ks >> 2, kb = (ks & 3) * 32;
    const uint64_t da = wgmma_desc(a + half * (RA * 128) + a_row0 * 128 + kb), db = wgmma_desc(b + half * (64 * 128) + kb);
    if (ks == 0)
      wgmma_n64<true>(acc, da, db);  // overwrites acc: no zeroing (which would serialize the wgmma in flight)
    else
      wgmma_n64(acc, da, db);
  }
}

/// Issues acc (64 x 64 H, H 64-column halves) += F B: F the 64 x 64 bf16 A fragments (k = the 64 rows of
/// the tile), B the [64][64 H] tile at b read MN-major (k along its rows). Not committed.
template <int H>
__device__ __forceinline__ void issue_frags_times_tile(float (&acc)[H][32], uint32_t (&f)[kN / 16][4], uint32_t b) {
  wgmma_fence();
  fence_acc(acc);
  fence_frags(f);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
#pragma unroll
    for (int h = 0; h < H; ++h)
      wgmma_rs::mma<64, 1>(acc[h], f[kk], wgmma_desc_mn(b + h * (64 * 128) + kk * 2048, 64 * 128));
}

/// The accumulator pair (nb, e) of a 64 x 64 product as a k16 A fragment: the C of n8 blocks 2kk, 2kk + 1
/// is the A of k step kk (attention_mma.cuh).
__device__ __forceinline__ void to_frag(uint32_t (&f)[kN / 16][4], int nb, const float* x) {
  f[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(x[0], x[1]);
  f[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(x[2], x[3]);
}

/// Thread 0 initializes layout L's barriers: the resident tiles' (L::bar: the producer's 128 cp.async
/// arrivals), each slot's `full` (full_count arrivals) and `empty` (one per consumer warp); then the
/// block synchronizes.
template <typename L>
__device__ __forceinline__ void init_barriers(uint32_t base, int full_count) {
  if (threadIdx.x == 0) {
    mbar_init(base + L::bar, 128);
    for (int s = 0; s < L::slots; ++s) {
      mbar_init(base + L::full0 + 8 * s, full_count);
      mbar_init(base + L::empty0 + 8 * s, 4 * kWgs);
    }
  }
  __syncthreads();
}

/// Row e (0: quad, 1: quad + 8) of this thread's 64 x 64 H accumulators times `scale`, rounded to bf16, into
/// the 64 H values at `row` (its columns 2 tq4, + 1 of each 8).
template <int H>
__device__ __forceinline__ void store_row_bf16(bf16_t* row, const float (&acc)[H][32], int e, int tq4, float scale) {
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
      *reinterpret_cast<uint32_t*>(row + h * 64 + nb * 8 + 2 * tq4) =
          pack_bf16(acc[h][nb * 4 + 2 * e] * scale, acc[h][nb * 4 + 2 * e + 1] * scale);
}
#endif  // AERIE_NO_WGMMA

/// Two adjacent values of a gradient tensor of element type G as one access, and old + (x0, x1).
template <typename G>
struct Pair;
template <>
struct Pair<float> {
  using type = float2;
  __device__ static float2 add(float2 o, float x0, float x1) { return make_float2(o.x + x0, o.y + x1); }
};
template <>
struct Pair<bf16_t> {
  using type = uint32_t;
  __device__ static uint32_t add(uint32_t o, float x0, float x1) {
    const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&o);
    return pack_bf16(__bfloat162float(b.x) + x0, __bfloat162float(b.y) + x1);
  }
};

/// Shared memory of the dk/dv pass at head dim D from a 1024-byte aligned base: K and V [128][D], kSlots
/// slots of (Q, dout) [64][D] tiles, the slots' per-row lse and D (as copied: raw), the mbarriers.
template <int D>
struct DkdvLayout {
  static constexpr int slots = D > 128 ? 2 : kSlots;  // at 192: 193 KB with two slots
  static constexpr uint32_t k = 0, v = wtile<kBlock, D>(), q0 = 2 * wtile<kBlock, D>();
  static constexpr uint32_t q(int s) { return q0 + 2 * s * wtile<kN, D>(); }
  static constexpr uint32_t meta = q0 + 2 * slots * wtile<kN, D>();  // float lse[slots][64], D[slots][64]
  static constexpr uint32_t bar = meta + slots * kN * 8;
  static constexpr uint32_t kv_full = bar, full0 = bar + 8, empty0 = bar + 8 + 8 * slots;
  static constexpr uint32_t bytes = bar + 8 + 16 * slots;
};

/// Shared memory of the dq pass at head dim D: Q and dout [128][D], kSlots slots of (K, V) [64][D] tiles,
/// mbarriers.
template <int D>
struct DqLayout {
  static constexpr int slots = D > 128 ? 2 : kSlots;  // at 192: 192 KB with two slots
  static constexpr uint32_t q = 0, o = wtile<kBlock, D>(), k0 = 2 * wtile<kBlock, D>();
  static constexpr uint32_t k(int s) { return k0 + 2 * s * wtile<kN, D>(); }
  static constexpr uint32_t bar = k0 + 2 * slots * wtile<kN, D>();
  static constexpr uint32_t qo_full = bar, full0 = bar + 8, empty0 = bar + 8 + 8 * slots;
  static constexpr uint32_t bytes = bar + 8 + 16 * slots;
};

// Both passes are warp-specialized (as FlashAttention-3): warpgroup 0 copies (cp.async; 24 registers in
// the dk/dv pass, 40 in the dq pass), warpgroups 1 and 2 multiply (240 / 232 registers: the dk/dv
// pass's consumers need 240, below which ptxas serializes their wgmma, C7512; its producer spills a few
// bytes outside its loop). Slot s's `full` barrier completes when the producer's copies into it have
// landed (128 cp.async arrivals: the dk/dv pass copies its rows' lse and D with cp.async too, so its
// producer never waits for a load); its `empty` barrier when the 8 consumer warps' last wgmma reading it
// is done. No block-wide barrier
// after the start, so the two consumer warpgroups drift apart and one's exponentials overlap the
// other's products.
constexpr int kWsThreads = 128 * (1 + kWgs);

/// What one launch of the dk/dv pass accumulates: both (head dims 64 and 128), or at 192 dV alone (S^T,
/// dV: 96 accumulator registers) and then dK alone (S^T, dP^T, dK): both at once would need 192 accumulator
/// registers beside S and dP, more than a consumer's 240.
enum class Dkdv { kBoth, kDv, kDk };

template <int D, typename G, Dkdv M>
__global__ void __launch_bounds__(kWsThreads, 1) attn_bwd_dkdv_wgmma_kernel(BwdParams p) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync passes off sm_90
#else
  static_assert((D == 64 || D == 128) == (M == Dkdv::kBoth) && D <= 192);
  constexpr bool kWantDv = M != Dkdv::kDk, kWantDk = M != Dkdv::kDv;
  constexpr int H = D / 64;  // 64-column halves of dK and dV
  using L = DkdvLayout<D>;
  constexpr int kS = L::slots;
  extern __shared__ __align__(1024) uint8_t bwd_smem[];
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(bwd_smem, mem);
  const float* lses = reinterpret_cast<const float*>(mem + L::meta);  // [slots][64]
  const float* Ds = lses + kS * kN;                                // [slots][64]
  const int tid = threadIdx.x, wgi = tid >> 7;
  const int g = blockIdx.x;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kBlock;
  // Query row i attends key j iff j <= i + q_offset: the first row that sees any key of the block.
  const int rows = static_cast<int>(p.tq * p.group);
  const int R0 = static_cast<int>(min(max(int64_t{0}, j0 - p.q_offset) * p.group, static_cast<int64_t>(rows)));
  // ... and under a window the rows end where the block's last key leaves it.
  const int R_end = static_cast<int>(rows_end(min(p.tk - 1, j0 + kBlock - 1), p.q_offset, p.window, p.tq) * p.group);
  const int ntiles = R_end > R0 ? (R_end - R0 + kN - 1) / kN : 0;
  init_barriers<L>(base, 128);

  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    // (the dV-only launch reads V too: it has the room, and the copy is once per block)
    load_keys_w<kBlock, D>(base + L::k, static_cast<const bf16_t*>(p.k), base + L::v, static_cast<const bf16_t*>(p.v),
                           p, g, j0, tid);
    mbar_arrive_cp_async(base + L::kv_full);
    const bf16_t* q = static_cast<const bf16_t*>(p.q);
    const bf16_t* dout = static_cast<const bf16_t*>(p.dout);
    for (int t = 0; t < ntiles; ++t) {
      const int s = t % kS, Rt = R0 + t * kN;
      if (t >= kS) mbar_wait(base + L::empty0 + 8 * s, ((t / kS) - 1) & 1);
      load_tile_pairs<D>(base + L::q(s), q, base + L::q(s) + wtile<kN, D>(), dout, base + L::meta + 4 * s * kN,
                         base + L::meta + 4 * (kS + s) * kN, p, g, Rt, tid);
      mbar_arrive_cp_async(base + L::full0 + 8 * s);
    }
    cp_async_wait<0>();
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const int wg = wgi - 1, warp = (tid >> 5) & 3, lane = tid & 31, quad = lane >> 2, tq4 = lane & 3;
  const float sl2 = p.scale * kLog2e;
  int jk[2];  // this thread's two keys (32 bits: the launch checks tk)
#pragma unroll
  for (int e = 0; e < 2; ++e) jk[e] = static_cast<int>(j0) + wg * kM + warp * 16 + quad + 8 * e;
  const int jw_last = static_cast<int>(j0) + wg * kM + kM - 1;  // the warpgroup's last key
  const int tk = static_cast<int>(p.tk);
  // The accumulators a launch does not need have no register: [1] of them stays unused.
  float dk[kWantDk ? H : 1][32], dv[kWantDv ? H : 1][32];
#pragma unroll
  for (int h = 0; h < (kWantDk ? H : 1); ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[h][i] = 0.0f;
#pragma unroll
  for (int h = 0; h < (kWantDv ? H : 1); ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) dv[h][i] = 0.0f;
  fence_acc(dk);  // the zeros defined before the first wgmma is issued
  fence_acc(dv);
  float s[32], dp[kWantDk ? 32 : 1];
  uint32_t f[kN / 16][4];
  mbar_wait(base + L::kv_full, 0);

  // Per tile: S^T and dP^T issued together; P computed while dP^T runs, dS^T while dV runs; dK left in
  // flight until the next tile's S^T is done, when the previous slot goes back to the producer.
  for (int t = 0; t < ntiles; ++t) {
    const int sl = t % kS;
    mbar_wait(base + L::full0 + 8 * sl, (t / kS) & 1);
    fence_proxy_async();  // the cp.async writes (generic proxy), before the wgmma reads them
    const uint32_t qb = base + L::q(sl), ob = qb + wtile<kN, D>();
    const float* lt = lses + sl * kN;
    const float* dt = Ds + sl * kN;
    const int Rt = R0 + t * kN;
    // Every (key, row) pair of the tile attended: no masks.
    // (under a window also: the tile's last row still attends the warpgroup's first key).
    const bool full = (Rt + kN - 1) / p.group < p.tq && jw_last < tk && Rt / p.group + p.q_offset >= jw_last &&
                      (p.window <= 0 || (Rt + kN - 1) / p.group + p.q_offset < jw_last - kM + 1 + p.window);

    issue_dot<kBlock, D>(s, base + L::k, wg * kM, qb);  // S^T = K Q^T
    wgmma_commit();
    if constexpr (kWantDk) {
      issue_dot<kBlock, D>(dp, base + L::v, wg * kM, ob);  // dP^T = V dout^T
      wgmma_commit();
      wgmma_wait<1>();  // dK of tile t - 1 and S^T
    } else {
      wgmma_wait<0>();  // dV of tile t - 1 and S^T
    }
    fence_regs(s);
    fence_acc(dk);
    if constexpr (!kWantDk) fence_acc(dv);
    fence_frags(f);
    if (t > 0 && lane == 0) mbar_arrive(base + L::empty0 + 8 * ((t - 1) % kS));
    // P^T; the two loops hoisted by hand (a per-element branch made ptxas emit one per element). lt holds
    // the raw lse: a row without keys (-inf) or past tq (a zero-filled copy) only occurs in a tile that is
    // not full, where its limit -1 masks it (and its zero dout row and D keep dV and dS at zero anyway).
    if (full) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = ex2(s[i] * sl2 - lt[(i >> 2) * 8 + 2 * tq4 + (i & 1)] * kLog2e);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int c = (i >> 2) * 8 + 2 * tq4 + (i & 1), j = jk[(i >> 1) & 1];
        const int r = (Rt + c) / p.group;
        const float lse = lt[c];
        const int ilim = r < p.tq && lse != -INFINITY ? r + static_cast<int>(p.q_offset) : -1;
        const float pr = ex2(s[i] * sl2 - lse * kLog2e);
        s[i] = j < tk && attends(j, ilim, p.window) ? pr : 0.0f;
      }
    }
    if constexpr (kWantDv) {
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb) to_frag(f, nb, &s[nb * 4]);
      issue_frags_times_tile(dv, f, ob);  // dV += P^T dout
      wgmma_commit();
    }
    if constexpr (kWantDk) {
      if constexpr (kWantDv)
        wgmma_wait<1>();  // dP^T
      else
        wgmma_wait<0>();
      fence_regs(dp);
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nb * 4 + e] = s[nb * 4 + e] * (dp[nb * 4 + e] - dt[nb * 8 + 2 * tq4 + (e & 1)]);
      if constexpr (kWantDv) {
        wgmma_wait<0>();  // dV: the fragments are free
        fence_acc(dv);
        fence_frags(f);
      }
#pragma unroll
      for (int nb = 0; nb < kN / 8; ++nb) to_frag(f, nb, &dp[nb * 4]);
      issue_frags_times_tile(dk, f, qb);  // dK += dS^T Q
      wgmma_commit();
    }
  }
  wgmma_wait<0>();
  fence_acc(dk);
  if constexpr (M == Dkdv::kDv) fence_acc(dv);  // (with dK, the loop's last wait for dV fenced it)
  fence_frags(f);

  G* gk = static_cast<G*>(p.dk);
  G* gv = static_cast<G*>(p.dv);
  // dk += scale dK, dv += dV, one key row at a time with all of its old pairs loaded before any store: gk
  // and gv may alias for the compiler, which otherwise keeps every load behind the previous store (one
  // round trip each, 256 per thread at the end of every block: a tenth of the pass at T 8192).
  using P2 = typename Pair<G>::type;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t j = jk[e];
    if (j >= tk) continue;
    const int64_t off0 = (j * p.nkv + g) * D + 2 * tq4;
    if constexpr (M == Dkdv::kBoth) {
      P2 ok2[H][8], ov2[H][8];
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          ok2[h][nb] = *reinterpret_cast<const P2*>(gk + off0 + h * 64 + nb * 8);
          ov2[h][nb] = *reinterpret_cast<const P2*>(gv + off0 + h * 64 + nb * 8);
        }
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          const int a = nb * 4 + 2 * e;
          *reinterpret_cast<P2*>(gk + off0 + h * 64 + nb * 8) =
              Pair<G>::add(ok2[h][nb], p.scale * dk[h][a], p.scale * dk[h][a + 1]);
          *reinterpret_cast<P2*>(gv + off0 + h * 64 + nb * 8) = Pair<G>::add(ov2[h][nb], dv[h][a], dv[h][a + 1]);
        }
    } else {  // one of them: dk += scale dK or dv += dV
      auto add_rows = [&](G* gx, const auto& x, float sc) {
        P2 o2[H][8];
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) o2[h][nb] = *reinterpret_cast<const P2*>(gx + off0 + h * 64 + nb * 8);
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
            const int a = nb * 4 + 2 * e;
            *reinterpret_cast<P2*>(gx + off0 + h * 64 + nb * 8) =
                Pair<G>::add(o2[h][nb], sc * x[h][a], sc * x[h][a + 1]);
          }
      };
      if constexpr (kWantDk)
        add_rows(gk, dk, p.scale);
      else
        add_rows(gv, dv, 1.0f);
    }
  }
#endif
}

template <int D>
__global__ void __launch_bounds__(kWsThreads, 1) attn_bwd_dq_wgmma_kernel(BwdParams p) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync passes off sm_90
#else
  static_assert(D == 64 || D == 128 || D == 192);
  constexpr int H = D / 64;  // 64-column halves of dQ
  using L = DqLayout<D>;
  constexpr int kS = L::slots;
  extern __shared__ __align__(1024) uint8_t bwd_smem[];
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(bwd_smem, mem);
  const int tid = threadIdx.x, wgi = tid >> 7;
  const int g = blockIdx.x;
  const int r0 = static_cast<int>(gridDim.y - 1 - blockIdx.y) * kBlock;  // longest rows first
  const int64_t i_last = min(p.tq - 1, static_cast<int64_t>((r0 + kBlock - 1) / p.group));
  const int kend = static_cast<int>(max(int64_t{0}, min(p.tk, i_last + p.q_offset + 1)));
  // Key tiles t0 .. : under a window, from the tile of the block's first row's first key.
  const int t0 = static_cast<int>(first_key(r0 / p.group + p.q_offset, p.window) / kN);
  const int ntiles = max(0, (kend + kN - 1) / kN - t0);
  init_barriers<L>(base, 128);

  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    load_rows_w<kBlock, D>(base + L::q, static_cast<const bf16_t*>(p.q), base + L::o, static_cast<const bf16_t*>(p.dout),
                        p, g, r0, tid);
    mbar_arrive_cp_async(base + L::qo_full);
    const bf16_t* k = static_cast<const bf16_t*>(p.k);
    const bf16_t* v = static_cast<const bf16_t*>(p.v);
    for (int t = 0; t < ntiles; ++t) {
      const int s = t % kS;
      if (t >= kS) mbar_wait(base + L::empty0 + 8 * s, ((t / kS) - 1) & 1);
      load_keys_w<kN, D>(base + L::k(s), k, base + L::k(s) + wtile<kN, D>(), v, p, g,
                         static_cast<int64_t>(t0 + t) * kN, tid);
      mbar_arrive_cp_async(base + L::full0 + 8 * s);
    }
    cp_async_wait<0>();
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int wg = wgi - 1, warp = (tid >> 5) & 3, lane = tid & 31, quad = lane >> 2, tq4 = lane & 3;
  int klim[2];  // key j is attended iff j <= klim (and j < kend); 32 bits: the launch checks tk
  float lse2[2], Dr[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int R = r0 + wg * kM + warp * 16 + quad + 8 * e, i = R / p.group;
    const int h = g * p.group + (R - i * p.group);
    const float lse = i < p.tq ? p.lse[static_cast<int64_t>(i) * p.nh + h] : -INFINITY;
    klim[e] = i < p.tq && lse != -INFINITY ? static_cast<int>(i + p.q_offset) : -1;  // a row without keys: no gradient
    lse2[e] = klim[e] >= 0 ? lse * kLog2e : 0.0f;
    Dr[e] = klim[e] >= 0 ? p.D[static_cast<int64_t>(i) * p.nh + h] : 0.0f;
  }
  const int klim_min = min(klim[0], klim[1]);
  // Under a window: the larger first key of the two rows (a padding row's -1 is never full anyway).
  const int kfirst_max = static_cast<int>(first_key(max(klim[0], klim[1]), p.window));
  const float sl2 = p.scale * kLog2e;
  float acc[H][32];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[h][i] = 0.0f;
  fence_acc(acc);  // the zeros defined before the first wgmma is issued
  float s[32], dp[32];
  uint32_t f[kN / 16][4];
  mbar_wait(base + L::qo_full, 0);

  // Per tile: S and dP issued together, P computed while dP runs, dQ left in flight until the next
  // tile's S is done, when the previous slot goes back to the producer.
  for (int t = 0; t < ntiles; ++t) {
    const int sl = t % kS;
    mbar_wait(base + L::full0 + 8 * sl, (t / kS) & 1);
    fence_proxy_async();
    const uint32_t kb = base + L::k(sl), vb = kb + wtile<kN, D>();
    const int j0 = (t0 + t) * kN;
    // Every key of the tile attended by both rows.
    const bool full = j0 + kN <= kend && j0 + kN - 1 <= klim_min && j0 >= kfirst_max;
    issue_dot<kBlock, D>(s, base + L::q, wg * kM, kb);   // S = Q K^T
    wgmma_commit();
    issue_dot<kBlock, D>(dp, base + L::o, wg * kM, vb);  // dP = dout V^T
    wgmma_commit();
    wgmma_wait<1>();  // dQ of tile t - 1 and S
    fence_regs(s);
    fence_acc(acc);
    fence_frags(f);
    if (t > 0 && lane == 0) mbar_arrive(base + L::empty0 + 8 * ((t - 1) % kS));
    // P; the two loops hoisted by hand (a per-element branch made ptxas emit one per element).
    if (full) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = ex2(s[i] * sl2 - lse2[(i >> 1) & 1]);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int j = j0 + (i >> 2) * 8 + 2 * tq4 + (i & 1), r = (i >> 1) & 1;
        const float pr = ex2(s[i] * sl2 - lse2[r]);
        s[i] = j < kend && attends(j, klim[r], p.window) ? pr : 0.0f;
      }
    }
    wgmma_wait<0>();  // dP
    fence_regs(dp);
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[e] = s[nb * 4 + e] * (dp[nb * 4 + e] - Dr[e >> 1]);
      to_frag(f, nb, ds);
    }
    issue_frags_times_tile(acc, f, kb);  // dQ += dS K
    wgmma_commit();
  }
  wgmma_wait<0>();
  fence_acc(acc);
  fence_frags(f);

  bf16_t* dq = static_cast<bf16_t*>(p.dq);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int R = r0 + wg * kM + warp * 16 + quad + 8 * e, i = R / p.group;
    if (i >= p.tq) continue;
    const int h = g * p.group + (R - i * p.group);
    store_row_bf16(dq + (static_cast<int64_t>(i) * p.nh + h) * D, acc, e, tq4, p.scale);
  }
#endif
}

/// Shared memory of the forward for query/key head D and value head DV: Q [128][D], kSlots slots of K
/// [64][D] and V [64][DV] tiles (each 64-column half a [rows][128 bytes] block, wswz), mbarriers.
template <int D, int DV>
struct FwdLayout {
  static constexpr int slots = kSlots;
  static constexpr uint32_t q = 0, k0 = kBlock * D * 2, kbytes = kN * D * 2, vbytes = kN * DV * 2;
  static constexpr uint32_t k(int s) { return k0 + s * (kbytes + vbytes); }
  static constexpr uint32_t v(int s) { return k(s) + kbytes; }
  static constexpr uint32_t bar = k0 + kSlots * (kbytes + vbytes);
  static constexpr uint32_t qo_full = bar, full0 = bar + 8, empty0 = bar + 8 + 8 * kSlots;
  static constexpr uint32_t bytes = bar + 8 + 16 * kSlots;
};

#ifndef AERIE_NO_WGMMA
/// The producer's copy (its 128 threads) of R rows of C 16-byte chunks each into the wswz tile at dst: row
/// r from base + off(r), zeros where off(r) < 0 (base itself is then the address given, and nothing is read).
template <int R, int C, typename Off>
__device__ __forceinline__ void copy_rows(uint32_t dst, const bf16_t* base, int tid, const Off& off) {
#pragma unroll 4
  for (int idx = tid; idx < R * C; idx += 128) {
    const int r = idx / C, c = idx % C;
    const int64_t o = off(r);
    cp_async16(dst + wswz<R>(r, c), base + (o >= 0 ? o + c * 8 : 0), o >= 0);
  }
}
#endif  // AERIE_NO_WGMMA

/// The forward (FlashAttention-2's Algorithm 1 with the online softmax of attention_tc.cu, whose
/// contract, row packing, key splits and outputs it keeps) on wgmma, warp-specialized as the dq pass:
/// a block of 2 consumer warpgroups x 64 packed query rows (Q resident), 64-key tiles of K and V
/// streamed by the producer warpgroup. Per tile and warpgroup: S = Q K^T (SS, D / 16 k steps), the online
/// softmax in registers, O += P V (P from the accumulators as A registers, V read MN-major, DV / 64
/// halves), left in flight until the next tile's S is done. Query/key head D (64, 128 or 192), value head
/// DV (64 or 128; MLA: 192 / 128). Grid: kv heads x tiles x splits (x first: the longest tiles start first
/// across heads).
template <int D, int DV>
__global__ void __launch_bounds__(kWsThreads, 1) attn_fwd_wgmma_kernel(FwdParams p) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync kernel off sm_90
#else
  static_assert(D % 64 == 0 && DV % 64 == 0 && D <= 192 && DV <= 192);
  constexpr int H = DV / 64;
  using L = FwdLayout<D, DV>;
  Seq sq;
  if (!find_seq<kBlock>(p, sq, blockIdx.y)) return;  // the whole block
  if (p.cu == nullptr) sq.tile = gridDim.y - 1 - blockIdx.y;  // one sequence: the last tiles have the most keys
  extern __shared__ __align__(1024) uint8_t fwd_smem[];
  uint8_t* mem = nullptr;
  const uint32_t base = aligned_base(fwd_smem, mem);
  const int tid = threadIdx.x, wgi = tid >> 7;
  const int g = blockIdx.x, split = blockIdx.z;
  const int r0 = static_cast<int>(sq.tile) * kBlock;  // first packed row of the block
  const int64_t i_last = min(sq.tq - 1, static_cast<int64_t>((r0 + kBlock - 1) / p.group));
  const int64_t kend_block = max(int64_t{0}, min(sq.tk, i_last + sq.q_offset + 1));
  const int64_t kbeg64 = split * p.split_len;
  // The split's keys, from the first key of the block's first row (the window's lower bound).
  const int kbeg = static_cast<int>(max(kbeg64, first_key(r0 / p.group + sq.q_offset, p.window)));
  const int kend = static_cast<int>(min(kend_block, kbeg64 + p.split_len));
  const int ntiles = kend > kbeg ? (kend - kbeg + kN - 1) / kN : 0;
  init_barriers<L>(base, 128);

  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const bf16_t* q = static_cast<const bf16_t*>(p.q);
    copy_rows<kBlock, D / 8>(base + L::q, q, tid, [&](int r) -> int64_t {  // Q rows past the sequence: zeros
      const int row = r0 + r, i = row / p.group;
      const int h = g * p.group + (row - i * p.group);
      return i < sq.tq ? ((sq.row0 + i) * p.nh + h) * D : -1;
    });
    mbar_arrive_cp_async(base + L::qo_full);
    const bf16_t* k = static_cast<const bf16_t*>(p.k);
    const bf16_t* v = static_cast<const bf16_t*>(p.v);
    for (int t = 0; t < ntiles; ++t) {
      const int s = t % kSlots, j0 = kbeg + t * kN;
      if (t >= kSlots) mbar_wait(base + L::empty0 + 8 * s, ((t / kSlots) - 1) & 1);
      if constexpr (D == DV) {  // K and V rows of one key together (one bounds check per row)
#pragma unroll 4
        for (int idx = tid; idx < kN * (D / 8); idx += 128) {  // keys past kend are zeros
          const int jj = idx / (D / 8), c = idx % (D / 8), j = j0 + jj;
          const bool ok = j < kend;
          const int64_t off = ok ? ((sq.row0 + j) * p.nkv + g) * D + c * 8 : 0;
          cp_async16(base + L::k(s) + wswz<kN>(jj, c), k + off, ok);
          cp_async16(base + L::v(s) + wswz<kN>(jj, c), v + off, ok);
        }
      } else {
        copy_rows<kN, D / 8>(base + L::k(s), k, tid, [&](int jj) -> int64_t {  // keys past kend are zeros
          const int j = j0 + jj;
          return j < kend ? ((sq.row0 + j) * p.nkv + g) * D : -1;
        });
        copy_rows<kN, DV / 8>(base + L::v(s), v, tid, [&](int jj) -> int64_t {
          const int j = j0 + jj;
          return j < kend ? ((sq.row0 + j) * p.nkv + g) * DV : -1;
        });
      }
      mbar_arrive_cp_async(base + L::full0 + 8 * s);
    }
    cp_async_wait<0>();
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int wg = wgi - 1, warp = (tid >> 5) & 3, lane = tid & 31, quad = lane >> 2, tq4 = lane & 3;
  int klim[2];  // this thread's two rows attend keys <= klim (-1: a row past the sequence)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int i = (r0 + wg * kM + warp * 16 + quad + 8 * e) / p.group;
    klim[e] = i < sq.tq ? static_cast<int>(i + sq.q_offset) : -1;
  }
  const int klim_min = static_cast<int>((r0 + wg * kM) / p.group + sq.q_offset);  // every row of the warpgroup
  // ... and, under a window, keys >= kfirst_max (the first key of the warpgroup's last row).
  const int kfirst_max = static_cast<int>(
      first_key(min(sq.tq - 1, static_cast<int64_t>((r0 + wg * kM + kM - 1) / p.group)) + sq.q_offset, p.window));
  const float sl2 = p.scale * kLog2e;  // scores in base-2 units
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[H][32];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[h][i] = 0.0f;
  fence_acc(o);  // the zeros defined before the first wgmma is issued
  float s[32];
  uint32_t f[kN / 16][4];
  mbar_wait(base + L::qo_full, 0);

  for (int t = 0; t < ntiles; ++t) {
    const int sl = t % kSlots, j0 = kbeg + t * kN;
    mbar_wait(base + L::full0 + 8 * sl, (t / kSlots) & 1);
    fence_proxy_async();
    issue_dot<kBlock, D>(s, base + L::q, wg * kM, base + L::k(sl));  // S = Q K^T
    wgmma_commit();
    wgmma_wait<0>();  // S, and O += P V of tile t - 1
    fence_regs(s);
    fence_acc(o);
    fence_frags(f);
    if (t > 0 && lane == 0) mbar_arrive(base + L::empty0 + 8 * ((t - 1) % kSlots));
    // Online softmax. Element i: row quad + 8 ((i >> 1) & 1), key j0 + (i >> 2) * 8 + 2 tq4 + (i & 1).
    const bool masked = j0 + kN > kend || j0 + kN - 1 > klim_min || j0 < kfirst_max;
    float mx[2] = {m[0], m[1]};
    if (masked) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int j = j0 + (i >> 2) * 8 + 2 * tq4 + (i & 1), r = (i >> 1) & 1;
        s[i] = j < kend && attends(j, klim[r], p.window) ? s[i] * sl2 : -INFINITY;
        mx[r] = fmaxf(mx[r], s[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        s[i] *= sl2;
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      }
    }
    float base2[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      corr[r] = m[r] == -INFINITY ? 0.0f : ex2(m[r] - mx[r]);  // O and l are 0 while m is -inf
      m[r] = mx[r];
      base2[r] = mx[r] == -INFINITY ? 0.0f : mx[r];  // a row without keys yet: every p is 2^-inf = 0
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = ex2(s[i] - base2[(i >> 1) & 1]);
      rs[(i >> 1) & 1] += s[i];
    }
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb) to_frag(f, nb, &s[nb * 4]);
    l[0] = l[0] * corr[0] + rs[0];
    l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[h][i] *= corr[(i >> 1) & 1];
    issue_frags_times_tile(o, f, base + L::v(sl));  // O += P V
    wgmma_commit();
  }
  wgmma_wait<0>();
  fence_acc(o);
  fence_frags(f);

  bf16_t* out = static_cast<bf16_t*>(p.out);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float lsum = quad_sum(l[e]);
    const int R = r0 + wg * kM + warp * 16 + quad + 8 * e, i = R / p.group;
    if (i >= sq.tq) continue;
    const int h = g * p.group + (R - i * p.group);
    const int64_t row = (sq.row0 + i) * p.nh + h;
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const float lse = lsum > 0.0f ? (m[e] + log2f(lsum)) * 0.6931471805599453f : -INFINITY;
    if (p.part_out) {
      const int64_t prow = split * p.tq * p.nh + row;
#pragma unroll
      for (int hh = 0; hh < H; ++hh)
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
          *reinterpret_cast<float2*>(p.part_out + prow * DV + hh * 64 + nb * 8 + 2 * tq4) =
              make_float2(o[hh][nb * 4 + 2 * e] * inv, o[hh][nb * 4 + 2 * e + 1] * inv);
      if (tq4 == 0) p.part_lse[prow] = lse;
    } else {
#pragma unroll
      for (int hh = 0; hh < H; ++hh)
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
          *reinterpret_cast<uint32_t*>(out + row * DV + hh * 64 + nb * 8 + 2 * tq4) =
              pack_bf16(o[hh][nb * 4 + 2 * e] * inv, o[hh][nb * 4 + 2 * e + 1] * inv);
      if (tq4 == 0 && p.lse) p.lse[row] = lse;
    }
  }
#endif
}

}  // namespace

template <int D, int DV>
void launch_fwd_wgmma(const FwdParams& p, int64_t tiles, int64_t splits) {
  constexpr size_t kAlign = 1024;
  AERIE_CHECK(p.tq * p.group + kBlock < (int64_t{1} << 31) && p.tk + p.tq + std::abs(p.q_offset) + kBlock < (int64_t{1} << 31),
              "attention_forward (CUDA): " << p.tq << " rows x " << p.group << " heads per kv head, " << p.tk
                                           << " keys: beyond the 32-bit index range of the wgmma kernel");
  const size_t smem = FwdLayout<D, DV>::bytes + kAlign;
  auto kernel = attn_fwd_wgmma_kernel<D, DV>;
  allow_smem(kernel, smem);
  check_grid("attention_forward (CUDA)", p.nkv, tiles, splits);
  kernel<<<dim3(p.nkv, static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), kWsThreads, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_fwd_wgmma_kernel");
}

template void launch_fwd_wgmma<64, 64>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_wgmma<128, 128>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_wgmma<192, 128>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_wgmma<192, 192>(const FwdParams& p, int64_t tiles, int64_t splits);

template <int D, typename G>
void launch_bwd_wgmma(const BwdParams& p) {
  constexpr size_t kAlign = 1024;  // aligned_base rounds the dynamic shared memory up to 1024 bytes
  // The kernels do the packed-row arithmetic in 32 bits.
  AERIE_CHECK(p.tq * p.group + kBlock < (int64_t{1} << 31) && p.tk + p.tq + std::abs(p.q_offset) + kBlock < (int64_t{1} << 31),
              "attention_backward (CUDA): " << p.tq << " rows x " << p.group << " heads per kv head, " << p.tk
                                            << " keys: beyond the 32-bit index range of the wgmma passes");
  if (p.tk > 0) {
    const size_t smem = DkdvLayout<D>::bytes + kAlign;
    const int64_t blocks = (p.tk + kBlock - 1) / kBlock;
    // kv heads in x, so that the blocks start in the order of their work (key block 0, the longest,
    // for every head first), not head by head: the tail of the causal triangle was 19% of the time.
    check_grid("attention_backward (CUDA) dk/dv", p.nkv, blocks, 1);
    auto launch = [&](auto kernel) {
      allow_smem(kernel, smem);
      kernel<<<dim3(p.nkv, static_cast<unsigned>(blocks)), kWsThreads, smem, stream()>>>(p);
      AERIE_CUDA_LAUNCHED("attn_bwd_dkdv_wgmma_kernel");
    };
    if constexpr (D == 192) {  // dV, then dK (the registers of both do not fit: Dkdv)
      launch(attn_bwd_dkdv_wgmma_kernel<D, G, Dkdv::kDv>);
      launch(attn_bwd_dkdv_wgmma_kernel<D, G, Dkdv::kDk>);
    } else {
      launch(attn_bwd_dkdv_wgmma_kernel<D, G, Dkdv::kBoth>);
    }
  }
  const size_t smem = DqLayout<D>::bytes + kAlign;
  auto kernel = attn_bwd_dq_wgmma_kernel<D>;
  allow_smem(kernel, smem);
  const int64_t blocks = (p.tq * p.group + kBlock - 1) / kBlock;
  check_grid("attention_backward (CUDA) dq", p.nkv, blocks, 1);
  kernel<<<dim3(p.nkv, static_cast<unsigned>(blocks)), kWsThreads, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_bwd_dq_wgmma_kernel");
}

template void launch_bwd_wgmma<64, float>(const BwdParams& p);
template void launch_bwd_wgmma<64, bf16_t>(const BwdParams& p);
template void launch_bwd_wgmma<128, float>(const BwdParams& p);
template void launch_bwd_wgmma<128, bf16_t>(const BwdParams& p);
template void launch_bwd_wgmma<192, float>(const BwdParams& p);
template void launch_bwd_wgmma<192, bf16_t>(const BwdParams& p);

}  // namespace aerie::cuda::attn
