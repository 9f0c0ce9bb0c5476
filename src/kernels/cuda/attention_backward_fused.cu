// BF16 tensor-core backward of the causal GQA attention in ONE pass (head dims exactly 64 or 128), for the GPUs
// without wgmma (sm_80 .. sm_89, sm_100 until tcgen05 kernels exist, sm_120), with FlashAttention-2's structure
// (Dao 2023, Algorithm 2, and its CUDA implementation's sm8x shapes) where attention_backward_tc.cu runs two passes.
// The mma.sync default at these head dims (AERIE_ATTENTION_BACKWARD_KERNEL=mma2 keeps the two passes; docs/
// performance.md has its speed).
//   a block of 8 warps holds BC = 128 keys (64 where the GPU's shared memory does not hold that: head dim 128 on
//   a GPU of 99 KiB per block) of one kv head (K, V resident in shared memory) and streams BR = 64-row tiles of
//   the packed query rows that attend them (Q double-buffered; dout double-buffered, except single at head dim 128
//   with 64 keys: the next tile's loads while dK and dQ are computed); per tile
//     S = Q K^T and dP = dout V^T        (warps 2 x 4 over rows x keys: 32 x BC/4 each),
//     P = exp(scale S - lse), dS = P (dP - D)  (fp32, rounded to bf16 into shared memory),
//     dV += P^T dout and dK += dS^T Q     (warps BC/32 x 256/BC over keys x head dim: 32 keys each, fp32 registers),
//     dQ_acc += dS K                      (warps 2 x 4 over rows x head dim, fp32 atomic adds to global memory);
//   then dq = bf16(scale dQ_acc) for every row. Five products per tile where the two passes take seven, and each
//   warp's 32-row (or 32-key) tiles read every shared-memory fragment for two mma row tiles. 128 keys per block
//   halve the atomics of dQ (tq x nh x DP per 128 keys of the causal triangle) and the barriers per product.
// The same contract as the two passes (kernels/attention.h): dq overwritten, dk / dv added to (G = float or bf16),
// rows without keys get zero gradients, the sliding window and q_offset as there. Shared memory (Fused::bytes):
// 100,352 bytes at head dim 64 / 128 keys and 128 / 64 (one block of an sm_120's 100 KiB SM), 165,888 at 128 / 128.
// The fp32 accumulator of dq takes tq x nh x DP x 4 bytes.
// Fragment layouts and swizzle: attention_mma.cuh.
#include "core/tensor.h"
#include "kernels/cuda/attention_mma.cuh"

namespace aerie::cuda::attn {
namespace {

constexpr int kBr = 64, kFusedWarps = 8, kFusedThreads = 32 * kFusedWarps;

/// The block's shape: BC keys (64 or 128) and NBO dout buffers (1 or 2); the warps' split of each product.
template <int DP, int BC, int NBO>
struct Fused {
  static_assert((DP == 64 || DP == 128) && (BC == 64 || BC == 128) && (NBO == 1 || NBO == 2));
  /// S / dP: warps 2 x 4 over rows x keys, KW keys and NB n8 blocks each.
  static constexpr int KW = BC / 4, NB = KW / 8;
  /// dV / dK: warps KG x DG over keys x head dim (32 keys each), DNK n8 blocks of the head dim each.
  static constexpr int KG = BC / 32, DG = kFusedWarps / KG, DNK = DP / DG / 8;
  /// dQ: warps 2 x 4 over rows x head dim, DNQ n8 blocks each.
  static constexpr int DNQ = DP / 32;
  // Shared memory: K, V [BC][DP], Q [2][BR][DP], dout [NBO][BR][DP], P and dS [BR][BC] (bf16, swizzled), and per
  // streamed row (two buffers) its lse, D, last attended key and row of [tq * nh] (RowSlot).
  static constexpr size_t kv_tile = sizeof(bf16_t) * BC * DP, row_tile = sizeof(bf16_t) * kBr * DP;
  static constexpr size_t k = 0, v = k + kv_tile, q = v + kv_tile, dout = q + 2 * row_tile;
  static constexpr size_t p = dout + NBO * row_tile, ds = p + sizeof(bf16_t) * kBr * BC;
  static constexpr size_t lse = ds + sizeof(bf16_t) * kBr * BC, dd = lse + 2 * kBr * sizeof(float);
  static constexpr size_t ilim = dd + 2 * kBr * sizeof(float), rix = ilim + 2 * kBr * sizeof(int);
  static constexpr size_t bytes = rix + 2 * kBr * sizeof(int);
};

/// The rows' values in shared memory (two buffers of kBr): lse (nats, as the forward wrote it), D, the last key
/// each attends (-1: past tq) and its row i * nh + head of the [tq, nh] tensors (-1: past tq).
struct RowSlot {
  float* lse;
  float* D;
  int* ilim;
  int* rix;
};

/// Packed row R (0 <= R < 2^31) of kv head g: its token i (out) and its row i * nh + head of the [tq, nh, ...]
/// tensors, or -1 past tq.
__device__ __forceinline__ int packed_row(const BwdParams& p, int g, int64_t R, int& i) {
  int hg;
  p.group_div.divmod(static_cast<int>(R), i, hg);
  return i < p.tq ? i * p.nh + g * p.group + hg : -1;
}

/// Issues this thread's chunks (threadIdx.x % 4 + 4k) of row r of the swizzled [kBr][DP] tile at dst, from row
/// `row` (-1: zeros) of the [tq * nh, DP] tensor src. Four threads read one row's 16-byte chunks side by side.
template <int DP>
__device__ __forceinline__ void load_row(uint32_t dst, const bf16_t* src, int row, int r) {
  constexpr int TPR = kFusedThreads / kBr, NC = DP / 8;
  static_assert(NC % TPR == 0);
  const bool ok = row >= 0;
  const bf16_t* at = ok ? src + static_cast<int64_t>(row) * DP : src;
#pragma unroll
  for (int k = 0; k < NC / TPR; ++k) {
    const int c = static_cast<int>(threadIdx.x % TPR) + k * TPR;
    cp_async16(dst + swz<DP>(r, c), at + (ok ? c * 8 : 0), ok);
  }
}

/// acc[mt][nb] (32 rows x 8 NB columns: two m16 tiles, NB n8 blocks) = A B^T over the head dim; A rows a_row0 ..
/// +31 of the [rows][DP] tile at `a`, B rows b_row0 .. + 8 NB - 1 of the [rows][DP] tile at `b`.
template <int DP, int NB>
__device__ __forceinline__ void dot_32(float (&acc)[2][NB][4], uint32_t a, int a_row0, uint32_t b, int b_row0) {
  static_assert(NB % 2 == 0);
  const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) acc[mt][nb][0] = acc[mt][nb][1] = acc[mt][nb][2] = acc[mt][nb][3] = 0.0f;
  // The lane's rows at chunk step 0 (a_row0, b_row0 multiples of 8: the rows' swizzle is the lane's own).
  const uint32_t a0 = a + swz<DP>(a_row0 + (lane & 15), lane >> 4);
  const uint32_t b00 = b + swz<DP>(b_row0 + (mi >> 1) * 8 + (lane & 7), mi & 1);
#pragma unroll
  for (int kd = 0; kd < DP / 16; ++kd) {
    uint32_t af[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
      ldsm_x4(swz_step<DP>(a0, kd * 2) + mt * 16 * DP * 2, af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
#pragma unroll
    for (int np = 0; np < NB / 2; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(swz_step<DP>(b00, kd * 2) + np * 16 * DP * 2, b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma16816(acc[mt][2 * np], af[mt], b0, b1);
        mma16816(acc[mt][2 * np + 1], af[mt], b2, b3);
      }
    }
  }
}

/// acc[mt][nd] (32 x DN*8) += A B over K16 k16 steps, B the [k][DP] tile at `b` (columns n0 .. n0 + 8 DN, read
/// transposed). A: the [m][k] tile at `a` (row stride AW) rows a_row0 .. +31 when !A_T; when A_T, A = the
/// transpose of the [k][m] tile at `a` (its columns a_row0 .. +31).
template <int AW, int DP, int K16, int DN, bool A_T>
__device__ __forceinline__ void mult_32(float (&acc)[2][DN][4], uint32_t a, int a_row0, uint32_t b, int n0) {
  static_assert(DN % 2 == 0);
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  // The lane's addresses at k step 0 (a_row0 and n0 / 8 even, so every chunk step below is even).
  uint32_t a0[2], bn[DN / 2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
    a0[mt] = A_T ? swz_step<AW>(a + swz<AW>((mi >> 1) * 8 + (lane & 7), mi & 1), (a_row0 + mt * 16) / 8)
                 : a + swz<AW>(a_row0 + mt * 16 + (lane & 15), lane >> 4);
#pragma unroll
  for (int nd = 0; nd < DN; nd += 2)
    bn[nd / 2] = swz_step<DP>(b + swz<DP>((mi & 1) * 8 + (lane & 7), mi >> 1), n0 / 8 + nd);
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    uint32_t af[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      if constexpr (A_T)  // matrices (m, k): (0-7, 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
        ldsm_x4_t(a0[mt] + kk * 16 * AW * 2, af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
      else
        ldsm_x4(swz_step<AW>(a0[mt], kk * 2), af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
    }
#pragma unroll
    for (int nd = 0; nd < DN; nd += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(bn[nd / 2] + kk * 16 * DP * 2, b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma16816(acc[mt][nd], af[mt], b0, b1);
        mma16816(acc[mt][nd + 1], af[mt], b2, b3);
      }
    }
  }
}

/// P = exp2(s * sl2 - lse2) of the lane's 32 x 8 NB scores in place (rows mt*16 + quad + 8h: their lse2 `lr` and
/// last key `ir`; element e of n8 block nb at key jl + nb * 8 + (e & 1)); 0 where the key is not attended, unless
/// `full` (every key of the tile attended).
template <int NB>
__device__ __forceinline__ void probabilities(float (&s)[2][NB][4], const BwdParams& p, bool full, int64_t jl,
                                              const int (&ir)[2][2], const float (&lr)[2][2], float sl2) {
  if (full) {  // two loops, so that the mask's tests are not interleaved with the unmasked tiles' exponentials
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nb][e] = ex2(s[mt][nb][e] * sl2 - lr[mt][e >> 1]);
    return;
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = jl + nb * 8 + (e & 1);
        const bool on = j < p.tk && attends(j, ir[mt][e >> 1], p.window);
        s[mt][nb][e] = on ? ex2(s[mt][nb][e] * sl2 - lr[mt][e >> 1]) : 0.0f;
      }
}

/// P and dS = P (dP - D) as bf16 into the swizzled [BR rows][BC keys] tiles at sp / ss: the lane's elements at rows
/// r0 + mt * 16 + 8h, columns c0 + nb * 8 (+1); D of its rows in dr.
template <int BC, int NB>
__device__ __forceinline__ void store_p_ds(unsigned char* sp, unsigned char* ss, const float (&pr)[2][NB][4],
                                           const float (&dp)[2][NB][4], const float (&dr)[2][2], int r0, int c0) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + mt * 16 + 8 * h, c = c0 + nb * 8;
        const uint32_t off = swz<BC>(r, c >> 3) + (c & 7) * 2;
        const float p0 = pr[mt][nb][2 * h], p1 = pr[mt][nb][2 * h + 1];
        *reinterpret_cast<uint32_t*>(sp + off) = pack_bf16(p0, p1);
        *reinterpret_cast<uint32_t*>(ss + off) =
            pack_bf16(p0 * (dp[mt][nb][2 * h] - dr[mt][h]), p1 * (dp[mt][nb][2 * h + 1] - dr[mt][h]));
      }
}

/// dq_acc += the lane's dQ (tile rows r0 + mt * 16 + 8h, their rows of [tq * nh] in rix (-1: past tq, skipped),
/// head-dim columns col0 + nd * 8 (+1)) by fp32 atomics (float2 from sm_90).
template <int DP, int DN>
__device__ __forceinline__ void add_dq(float* dq_acc, const float (&dq)[2][DN][4], const int* rix, int r0, int col0) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int at = rix[r0 + mt * 16 + 8 * h];
      if (at < 0) continue;
      float* row = dq_acc + static_cast<int64_t>(at) * DP + col0;
#pragma unroll
      for (int nd = 0; nd < DN; ++nd) {
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(row + nd * 8), make_float2(dq[mt][nd][2 * h], dq[mt][nd][2 * h + 1]));
#else
        atomicAdd(row + nd * 8, dq[mt][nd][2 * h]);
        atomicAdd(row + nd * 8 + 1, dq[mt][nd][2 * h + 1]);
#endif
      }
    }
}

/// dk += scale dK, dv += dV (G, read-modify-write: one block owns its keys): the lane's elements at keys
/// j0 + mt * 16 + quad + 8h, head-dim columns col0 + nd * 8 (+1); keys past tk are skipped.
template <int DP, int DN, typename G>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, int g, int64_t j0, int col0,
                                            const float (&dk)[2][DN][4], const float (&dv)[2][DN][4]) {
  G* gk = static_cast<G*>(p.dk);
  G* gv = static_cast<G*>(p.dv);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t j = j0 + mt * 16 + 8 * h;
      if (j >= p.tk) continue;
      const int64_t off0 = (j * p.nkv + g) * DP + col0;
#pragma unroll
      for (int nd = 0; nd < DN; ++nd)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t off = off0 + nd * 8 + c;
          gk[off] = from_f32<G>(to_f32(gk[off]) + p.scale * dk[mt][nd][2 * h + c]);
          gv[off] = from_f32<G>(to_f32(gv[off]) + dv[mt][nd][2 * h + c]);
        }
    }
}

template <int DP, int BC, int NBO, typename G>
__global__ void __launch_bounds__(kFusedThreads, 1) attn_bwd_fused_mma_kernel(BwdParams p, float* dq_acc) {
  using L = Fused<DP, BC, NBO>;
  constexpr int NB = L::NB, DNK = L::DNK, DNQ = L::DNQ;
  extern __shared__ __align__(128) unsigned char fused_smem[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(fused_smem));
  const uint32_t sK = base + L::k, sV = base + L::v, sQ = base + L::q, sO = base + L::dout;
  const uint32_t sP = base + L::p, sS = base + L::ds;
  const RowSlot rs{reinterpret_cast<float*>(fused_smem + L::lse), reinterpret_cast<float*>(fused_smem + L::dd),
                   reinterpret_cast<int*>(fused_smem + L::ilim), reinterpret_cast<int*>(fused_smem + L::rix)};
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane >> 2, tq4 = lane & 3;
  const int wm = warp >> 2, wn = warp & 3;          // S / dP: rows wm*32.., keys wn*KW..; dQ: cols wn*DP/4..
  const int kw = warp / L::DG, dw = warp % L::DG;  // dK / dV: keys kw*32.., head-dim columns dw*DP/DG..
  const int g = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BC;
  const bf16_t* q = static_cast<const bf16_t*>(p.q);
  const bf16_t* dout = static_cast<const bf16_t*>(p.dout);

  {  // K and V of the block's keys (keys past tk are zeros)
    const bf16_t* k = static_cast<const bf16_t*>(p.k);
    const bf16_t* v = static_cast<const bf16_t*>(p.v);
    constexpr int NC = DP / 8;
    for (int idx = threadIdx.x; idx < BC * NC; idx += kFusedThreads) {
      const int jj = idx / NC, c = idx % NC;
      const int64_t j = j0 + jj;
      const bool ok = j < p.tk;
      const int64_t off = ok ? (j * p.nkv + g) * DP + c * 8 : 0;
      cp_async16(sK + swz<DP>(jj, c), k + off, ok);
      cp_async16(sV + swz<DP>(jj, c), v + off, ok);
    }
  }
  // Query row i attends key j iff j <= i + q_offset: the first row that sees any key of the block, and under a
  // window the rows end where the block's last key leaves it.
  const int64_t R0 = max(int64_t{0}, j0 - p.q_offset) * p.group;
  const int64_t rows = rows_end(min(p.tk - 1, j0 + BC - 1), p.q_offset, p.window, p.tq) * p.group;
  const int ntiles = R0 < rows ? static_cast<int>((rows - R0 + kBr - 1) / kBr) : 0;
  const int my_row = threadIdx.x / (kFusedThreads / kBr);  // the tile row this thread loads
  auto load_q = [&](int t, int buf) {  // Q (and dout where it has two buffers) and the rows' values
    int i;
    const int row = packed_row(p, g, R0 + static_cast<int64_t>(t) * kBr + my_row, i);
    load_row<DP>(sQ + buf * L::row_tile, q, row, my_row);
    if (NBO == 2) load_row<DP>(sO + buf * L::row_tile, dout, row, my_row);
    if (threadIdx.x % (kFusedThreads / kBr) == 0) {
      const int at = buf * kBr + my_row;
      cp_async4(static_cast<uint32_t>(__cvta_generic_to_shared(rs.lse + at)), p.lse + max(row, 0), row >= 0);
      cp_async4(static_cast<uint32_t>(__cvta_generic_to_shared(rs.D + at)), p.D + max(row, 0), row >= 0);
      rs.ilim[at] = row >= 0 ? static_cast<int>(i + p.q_offset) : -1;
      rs.rix[at] = row;
    }
  };
  auto load_o = [&](int t, int buf) {
    int i;
    load_row<DP>(sO + buf * L::row_tile, dout, packed_row(p, g, R0 + static_cast<int64_t>(t) * kBr + my_row, i),
                 my_row);
  };
  // cp.async groups, oldest first: [K, V, Q 0 (, dout 0)], [dout 0 or nothing]; in iteration t [Q t+1 (, dout t+1)],
  // then [dout t+1 or nothing]. So at the top of iteration t "all but the newest" is Q t, and after Q t+1 is issued
  // "all but the newest" is dout t as well.
  if (ntiles > 0) load_q(0, 0);
  cp_async_commit();
  if (NBO == 1 && ntiles > 0) load_o(0, 0);
  cp_async_commit();

  const float sl2 = p.scale * kLog2e;
  float dk[2][DNK][4], dv[2][DNK][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nd = 0; nd < DNK; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[mt][nd][e] = dv[mt][nd][e] = 0.0f;
  unsigned char* sp_ptr = fused_smem + L::p;
  unsigned char* ss_ptr = fused_smem + L::ds;

  for (int t = 0; t < ntiles; ++t) {
    const int buf = t & 1, obuf = NBO == 2 ? buf : 0;
    cp_async_wait<1>();
    __syncthreads();  // Q t and its rows' values are visible
    if (t + 1 < ntiles) load_q(t + 1, buf ^ 1);
    cp_async_commit();
    const uint32_t qb = sQ + buf * L::row_tile, ob = sO + obuf * L::row_tile;
    const int64_t Rt = R0 + static_cast<int64_t>(t) * kBr;
    // This lane's four rows (wm*32 + mt*16 + quad + 8h): lse * log2(e), D and the last key, or 0, 0, -1 for a row
    // past tq or without keys (lse -inf), which has no gradient; and whether the tile needs no mask: every row
    // attends every key of the block.
    float lr[2][2], dr[2][2];
    int ir[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = buf * kBr + wm * 32 + mt * 16 + quad + 8 * h;
        const float lse = rs.lse[r];
        const bool live = rs.ilim[r] >= 0 && lse != -INFINITY;
        lr[mt][h] = live ? lse * kLog2e : 0.0f;
        dr[mt][h] = live ? rs.D[r] : 0.0f;
        ir[mt][h] = live ? rs.ilim[r] : -1;
      }
    const bool full = p.window <= 0 && p.group_div.div(static_cast<int>(Rt)) + p.q_offset >= j0 + BC - 1 &&
                      j0 + BC <= p.tk && p.group_div.div(static_cast<int>(Rt + kBr - 1)) < p.tq;

    float s[2][NB][4], dp[2][NB][4];
    dot_32<DP, NB>(s, qb, wm * 32, sK, wn * L::KW);  // q . k
    probabilities<NB>(s, p, full, j0 + wn * L::KW + 2 * tq4, ir, lr, sl2);
    cp_async_wait<1>();
    __syncthreads();  // dout t is visible
    dot_32<DP, NB>(dp, ob, wm * 32, sV, wn * L::KW);  // dout . v
    // P and dS = P (dP - D) to shared memory as bf16 [BR rows][BC keys].
    store_p_ds<BC, NB>(sp_ptr, ss_ptr, s, dp, dr, wm * 32 + quad, wn * L::KW + 2 * tq4);
    __syncthreads();  // P and dS are visible
    mult_32<BC, DP, kBr / 16, DNK, true>(dv, sP, kw * 32, ob, dw * (DP / L::DG));  // dV += P^T dout
    // dout t is read for the last time above. With one buffer every warp must be done with it before it is
    // refilled, here, so that the load overlaps dK and dQ; with two, the next iteration's first barrier orders
    // every refill (Q, dout, P, dS, the rows' values) after this one's reads.
    if constexpr (NBO == 1) {
      __syncthreads();
      if (t + 1 < ntiles) load_o(t + 1, 0);
    }
    cp_async_commit();
    mult_32<BC, DP, kBr / 16, DNK, true>(dk, sS, kw * 32, qb, dw * (DP / L::DG));  // dK += dS^T Q
    {
      float dq[2][DNQ][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nd = 0; nd < DNQ; ++nd) dq[mt][nd][0] = dq[mt][nd][1] = dq[mt][nd][2] = dq[mt][nd][3] = 0.0f;
      mult_32<BC, DP, BC / 16, DNQ, false>(dq, sS, wm * 32, sK, wn * (DP / 4));  // dQ = dS K
      add_dq<DP>(dq_acc, dq, rs.rix + buf * kBr, wm * 32 + quad, wn * (DP / 4) + 2 * tq4);
    }
  }
  cp_async_wait<0>();
  store_dk_dv<DP, DNK, G>(p, g, j0 + kw * 32 + quad, dw * (DP / L::DG) + 2 * tq4, dk, dv);
}

/// dq = bf16(scale acc), n values.
__global__ void attn_bwd_dq_convert_kernel(const float* acc, int64_t n, float scale, bf16_t* dq) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2;
  if (i + 1 < n) {
    const float2 a = *reinterpret_cast<const float2*>(acc + i);
    *reinterpret_cast<uint32_t*>(dq + i) = pack_bf16(a.x * scale, a.y * scale);
  } else if (i < n) {
    dq[i] = __float2bfloat16_rn(acc[i] * scale);
  }
}

/// One launch of the kernel's <DP, BC, NBO> shape: a block per BC keys of each kv head.
template <int DP, int BC, int NBO, typename G>
void launch_fused(const BwdParams& p, float* acc) {
  constexpr size_t smem = Fused<DP, BC, NBO>::bytes;
  auto kernel = attn_bwd_fused_mma_kernel<DP, BC, NBO, G>;
  allow_smem(kernel, smem);
  const int64_t blocks = (p.tk + BC - 1) / BC;
  check_grid("attention_backward (CUDA) fused", blocks, p.nkv, 1);
  kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), kFusedThreads, smem, stream()>>>(p, acc);
  AERIE_CUDA_LAUNCHED("attn_bwd_fused_mma_kernel");
}

/// The block shapes, largest first: 128 keys with two dout buffers where the GPU's block holds them (at head dim
/// 64 within 99 KiB: every GPU of 8.x and later; at 128, 162 KiB: sm_80, sm_90, sm_100), else 64 keys (two dout
/// buffers at 64, one at 128: 100,352 bytes). FlashAttention-2 picks alike (flash_bwd_launch_template.h: 64 x 128
/// blocks where 144 KiB fit). AERIE_ATTENTION_BACKWARD_KERNEL=fused64 keeps 64 keys everywhere.
template <int DP, typename G>
void launch_fused_shape(const BwdParams& p, float* acc) {
  const bool keys128 = settings().attention_backward_kernel != "fused64";
  if constexpr (DP == 64) {
    if (keys128 && smem_fits(Fused<64, 128, 2>::bytes)) return launch_fused<64, 128, 2, G>(p, acc);
    return launch_fused<64, 64, 2, G>(p, acc);
  } else {
    if (keys128 && smem_fits(Fused<128, 128, 2>::bytes)) return launch_fused<128, 128, 2, G>(p, acc);
    return launch_fused<128, 64, 1, G>(p, acc);
  }
}

}  // namespace

template <int DP>
size_t bwd_fused_smem() {
  return DP == 64 ? Fused<64, 64, 2>::bytes : Fused<128, 64, 1>::bytes;
}

template <int DP, typename G>
void launch_bwd_fused_tc(const BwdParams& p) {
  const int64_t n = p.tq * p.nh * DP;
  Tensor acc = Tensor::empty({n}, DType::F32, Device::CUDA);
  AERIE_CUDA_CHECK(cudaMemsetAsync(acc.data<float>(), 0, sizeof(float) * n, stream()),
                   "attention_backward (CUDA): clearing dq's accumulator of " << n << " floats");
  if (p.tk > 0) launch_fused_shape<DP, G>(p, acc.data<float>());
  const int64_t pairs = (n + 1) / 2;
  attn_bwd_dq_convert_kernel<<<static_cast<unsigned>((pairs + 255) / 256), 256, 0, stream()>>>(
      acc.data<float>(), n, p.scale, static_cast<bf16_t*>(p.dq));
  AERIE_CUDA_LAUNCHED("attn_bwd_dq_convert_kernel");
}

template size_t bwd_fused_smem<64>();
template size_t bwd_fused_smem<128>();
template void launch_bwd_fused_tc<64, float>(const BwdParams& p);
template void launch_bwd_fused_tc<128, float>(const BwdParams& p);
template void launch_bwd_fused_tc<64, bf16_t>(const BwdParams& p);
template void launch_bwd_fused_tc<128, bf16_t>(const BwdParams& p);

}  // namespace aerie::cuda::attn
