// BF16 tensor-core backward of the causal GQA attention in two passes (head dims exactly 64, 128 or 192, the last
// MLA's query/key head with its values zero-padded to it: the MLA draft's TTT; at 64 and 128 the one-pass kernel of
// attention_backward_fused.cu runs instead unless AERIE_ATTENTION_BACKWARD_KERNEL is mma2 or mma64): the two passes of
// attention_backward.cu (dq per tile of packed query rows; dk/dv per tile of keys, no atomics) with
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) instead of SIMT dot products. FlashAttention-2 (Dao
// 2023) Algorithm 2: P = exp(scale q.k - lse) is recomputed from the saved lse, dP = dout v^T,
// dS = P (dP - D); dq = scale dS K, dk += scale dS^T Q, dv += P^T dout. P and dS are rounded to bf16 as
// the A operands of the second products (as FlashAttention-2 does); everything else is fp32.
//
// dq pass: W warps x 16 packed query rows; Q and dout stay in shared memory, TB-key tiles of K and V
// stream through a double buffer (cp.async). dk/dv pass: W warps x 16 keys of one kv head; K and V stay
// in shared memory, TB-row tiles of packed query rows (Q, dout, their lse and D) stream through a
// double buffer. The shapes (Config below): 4 warps and 64-wide tiles, two blocks per SM where an SM holds two
// (an H100's 228 KiB); at head dims up to 128 on a GPU whose SM holds one such block of ~97 KiB (sm_86, sm_89,
// sm_120: 100 KiB per SM), 8 warps and 32-wide tiles in the same shared memory, so that 8 warps share the SM, not
// 4 (FlashAttention-2 also runs 8 warps there). At head dim 192 on a GPU of 99 KiB per block the streamed tiles
// are single-buffered instead (96 KiB in place of 144). Register layouts and shared-memory swizzle:
// attention_mma.cuh.
#include "kernels/cuda/attention_mma.cuh"

namespace aerie::cuda::attn {
namespace {

/// Bytes of a [ROWS][DP] bf16 tile.
template <int DP, int ROWS>
constexpr size_t tile_bytes() {
  return sizeof(bf16_t) * ROWS * DP;
}

/// Loads keys j0 .. j0+ROWS-1 of kv head g of a [tk, nkv, DP] tensor; keys past tk are zeros.
template <int DP, int ROWS>
__device__ __forceinline__ void load_keys(uint32_t dst, const bf16_t* src, const BwdParams& p, int g, int64_t j0) {
  constexpr int NC = DP / 8;
  for (int idx = threadIdx.x; idx < ROWS * NC; idx += blockDim.x) {
    const int jj = idx / NC, c = idx % NC;
    const int64_t j = j0 + jj;
    const bool ok = j < p.tk;
    cp_async16(dst + swz<DP>(jj, c), ok ? src + (j * p.nkv + g) * DP + c * 8 : src, ok);
  }
}

/// acc[nb] (16 rows x TB columns, n8 blocks) = A B^T over the head dim: A rows a_row0 .. +15 of the tile
/// at `a`, B = the TB rows of the tile at `b` (both swizzled [rows][DP]).
template <int DP, int TB>
__device__ __forceinline__ void rows_dot_rows(float (&acc)[TB / 8][4], uint32_t a, int a_row0, uint32_t b) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
  for (int nb = 0; nb < TB / 8; ++nb) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
#pragma unroll
  for (int kd = 0; kd < DP / 16; ++kd) {
    uint32_t af[4];
    ldsm_x4(a + swz<DP>(a_row0 + (lane & 15), kd * 2 + (lane >> 4)), af[0], af[1], af[2], af[3]);
#pragma unroll
    for (int nb = 0; nb < TB / 8; nb += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(b + swz<DP>(nb * 8 + (mi >> 1) * 8 + (lane & 7), kd * 2 + (mi & 1)), b0, b1, b2, b3);
      mma16816(acc[nb], af, b0, b1);
      mma16816(acc[nb + 1], af, b2, b3);
    }
  }
}

/// acc[nd] (16 x DP) += A [16][TB] (bf16 fragments, k = the tile's TB rows) times the tile at `b`
/// ([TB][DP], read transposed).
template <int DP, int TB>
__device__ __forceinline__ void frags_times_tile(float (&acc)[DP / 8][4], const uint32_t (&af)[TB / 16][4],
                                                 uint32_t b) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < TB / 16; ++kk) {
#pragma unroll
    for (int nd = 0; nd < DP / 8; nd += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(b + swz<DP>(kk * 16 + (mi & 1) * 8 + (lane & 7), nd + (mi >> 1)), b0, b1, b2, b3);
      mma16816(acc[nd], af[kk], b0, b1);
      mma16816(acc[nd + 1], af[kk], b2, b3);
    }
  }
}

/// A pass's shape: W warps of 16 resident rows (dq) or keys (dk/dv) each, TB keys or rows per streamed tile,
/// NBUF streamed buffers.
template <int W, int TB, int NBUF>
struct Config {
  static_assert(W == 4 || W == 8);
  static_assert(TB == 32 || TB == 64);
  static_assert(NBUF == 1 || NBUF == 2);
  static constexpr int kWarpsPerBlock = W, kThreadsPerBlock = 32 * W, kResident = 16 * W, kTile = TB, kBufs = NBUF;
};

/// Shared memory of the dq pass (Q, dout, K[NBUF], V[NBUF]) and of the dk/dv pass (K, V, Q[NBUF], dout[NBUF],
/// and per streamed row its lse, D and last key).
template <int DP, typename C>
constexpr size_t dq_smem() {
  return 2 * tile_bytes<DP, C::kResident>() + 2 * C::kBufs * tile_bytes<DP, C::kTile>();
}
template <int DP, typename C>
constexpr size_t dkdv_smem() {
  return 2 * tile_bytes<DP, C::kResident>() + 2 * C::kBufs * tile_bytes<DP, C::kTile>() +
         C::kBufs * C::kTile * (2 * sizeof(float) + sizeof(int));
}

template <int DP, typename C>
__global__ void __launch_bounds__(C::kThreadsPerBlock, C::kWarpsPerBlock == 4 ? 2 : 1)
    attn_bwd_dq_mma_kernel(BwdParams p) {
  static_assert(DP == 64 || DP == 128 || DP == 192);
  constexpr int TB = C::kTile, RB = C::kResident, NBUF = C::kBufs;
  constexpr int NB = TB / 8, ND = DP / 8;
  extern __shared__ __align__(128) unsigned char bwd_smem[];
  const uint32_t sQ = static_cast<uint32_t>(__cvta_generic_to_shared(bwd_smem));
  const uint32_t sO = sQ + tile_bytes<DP, RB>(), sK = sO + tile_bytes<DP, RB>();
  const uint32_t sV = sK + NBUF * tile_bytes<DP, TB>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane >> 2, tq4 = lane & 3;
  const int g = blockIdx.y;
  const int64_t r0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * RB;  // longest rows first
  const bf16_t* k = static_cast<const bf16_t*>(p.k);
  const bf16_t* v = static_cast<const bf16_t*>(p.v);

  load_rows<DP, RB>(sQ, static_cast<const bf16_t*>(p.q), p, g, r0);
  load_rows<DP, RB>(sO, static_cast<const bf16_t*>(p.dout), p, g, r0);
  const int64_t i_last = min(p.tq - 1, (r0 + RB - 1) / p.group);
  const int64_t kend = max(int64_t{0}, min(p.tk, i_last + p.q_offset + 1));
  // Key tiles t0 .. : under a window, from the tile of the block's first row's first key.
  const int t0 = static_cast<int>(first_key(r0 / p.group + p.q_offset, p.window) / TB);
  const int ntiles = max(0, static_cast<int>((kend + TB - 1) / TB) - t0);
  auto load_kv = [&](int t, int buf) {
    load_keys<DP, TB>(sK + buf * tile_bytes<DP, TB>(), k, p, g, static_cast<int64_t>(t0 + t) * TB);
    load_keys<DP, TB>(sV + buf * tile_bytes<DP, TB>(), v, p, g, static_cast<int64_t>(t0 + t) * TB);
  };
  if (ntiles > 0) load_kv(0, 0);
  cp_async_commit();

  int64_t klim[2];  // key j is attended iff j <= klim (and j < kend)
  float lse2[2], Dr[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t R = r0 + warp * 16 + quad + 8 * e, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const float lse = i < p.tq ? p.lse[i * p.nh + h] : -INFINITY;
    klim[e] = i < p.tq && lse != -INFINITY ? i + p.q_offset : -1;  // a row without keys has no gradient
    lse2[e] = klim[e] >= 0 ? lse * kLog2e : 0.0f;
    Dr[e] = klim[e] >= 0 ? p.D[i * p.nh + h] : 0.0f;
  }
  const float sl2 = p.scale * kLog2e;
  float acc[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

  for (int t = 0; t < ntiles; ++t) {
    const int buf = next_tile<NBUF>(t, ntiles, load_kv);
    const uint32_t kb = sK + buf * tile_bytes<DP, TB>(), vb = sV + buf * tile_bytes<DP, TB>();
    const int64_t j0 = static_cast<int64_t>(t0 + t) * TB;
    float s[NB][4], dp[NB][4];
    rows_dot_rows<DP, TB>(s, sQ, warp * 16, kb);   // q . k
    rows_dot_rows<DP, TB>(dp, sO, warp * 16, vb);  // dout . v
    uint32_t dsf[TB / 16][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t j = j0 + nb * 8 + 2 * tq4 + (e & 1);
        const int r = e >> 1;
        const float pr = j < kend && attends(j, klim[r], p.window) ? ex2(s[nb][e] * sl2 - lse2[r]) : 0.0f;
        ds[e] = pr * (dp[nb][e] - Dr[r]);
      }
      dsf[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(ds[0], ds[1]);
      dsf[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
    }
    frags_times_tile<DP, TB>(acc, dsf, kb);  // dS K
    __syncthreads();
  }
  cp_async_wait<0>();

  bf16_t* dq = static_cast<bf16_t*>(p.dq);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t R = r0 + warp * 16 + quad + 8 * e, i = R / p.group;
    if (i >= p.tq) continue;
    const int h = g * p.group + static_cast<int>(R % p.group);
    bf16_t* row = dq + (i * p.nh + h) * DP;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd)
      *reinterpret_cast<uint32_t*>(row + nd * 8 + 2 * tq4) =
          pack_bf16(acc[nd][2 * e] * p.scale, acc[nd][2 * e + 1] * p.scale);
  }
}

template <int DP, typename G, typename C>
__global__ void __launch_bounds__(C::kThreadsPerBlock, 1) attn_bwd_dkdv_mma_kernel(BwdParams p) {
  static_assert(DP == 64 || DP == 128 || DP == 192);
  constexpr int TB = C::kTile, RB = C::kResident, NBUF = C::kBufs;
  constexpr int NB = TB / 8, ND = DP / 8;
  extern __shared__ __align__(128) unsigned char bwd_smem[];
  const uint32_t sK = static_cast<uint32_t>(__cvta_generic_to_shared(bwd_smem));
  const uint32_t sV = sK + tile_bytes<DP, RB>(), sQ = sV + tile_bytes<DP, RB>();
  const uint32_t sO = sQ + NBUF * tile_bytes<DP, TB>();
  float* lse2s = reinterpret_cast<float*>(bwd_smem + 2 * tile_bytes<DP, RB>() + 2 * NBUF * tile_bytes<DP, TB>());
  float* Ds = lse2s + NBUF * TB;                          // [NBUF][TB], as lse2s
  int* ilims = reinterpret_cast<int*>(Ds + NBUF * TB);    // [NBUF][TB]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane >> 2, tq4 = lane & 3;
  const int g = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * RB;
  const bf16_t* q = static_cast<const bf16_t*>(p.q);
  const bf16_t* dout = static_cast<const bf16_t*>(p.dout);

  load_keys<DP, RB>(sK, static_cast<const bf16_t*>(p.k), p, g, j0);
  load_keys<DP, RB>(sV, static_cast<const bf16_t*>(p.v), p, g, j0);
  // Query row i attends key j iff j <= i + q_offset: the first row that sees any key of the block.
  const int64_t R0 = max(int64_t{0}, j0 - p.q_offset) * p.group;
  // ... and under a window the rows end where the block's last key leaves it.
  const int64_t rows = rows_end(min(p.tk - 1, j0 + RB - 1), p.q_offset, p.window, p.tq) * p.group;
  const int ntiles = R0 < rows ? static_cast<int>((rows - R0 + TB - 1) / TB) : 0;
  auto load_tile = [&](int t, int buf) {
    const int64_t Rt = R0 + static_cast<int64_t>(t) * TB;
    load_rows<DP, TB>(sQ + buf * tile_bytes<DP, TB>(), q, p, g, Rt);
    load_rows<DP, TB>(sO + buf * tile_bytes<DP, TB>(), dout, p, g, Rt);
    if (threadIdx.x < TB)
      row_values(p, g, Rt + threadIdx.x, lse2s[buf * TB + threadIdx.x], Ds[buf * TB + threadIdx.x],
                 ilims[buf * TB + threadIdx.x]);
  };
  if (ntiles > 0) load_tile(0, 0);
  cp_async_commit();

  const float sl2 = p.scale * kLog2e;
  int64_t jk[2];  // this lane's two keys
#pragma unroll
  for (int e = 0; e < 2; ++e) jk[e] = j0 + warp * 16 + quad + 8 * e;
  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[nd][e] = dv[nd][e] = 0.0f;

  for (int t = 0; t < ntiles; ++t) {
    const int buf = next_tile<NBUF>(t, ntiles, load_tile);
    const uint32_t qb = sQ + buf * tile_bytes<DP, TB>(), ob = sO + buf * tile_bytes<DP, TB>();
    const float* lt = lse2s + buf * TB;
    const float* dt = Ds + buf * TB;
    const int* it = ilims + buf * TB;
    // P^T [16 keys][TB rows] and dV += P^T dout.
    float pt[NB][4];
    rows_dot_rows<DP, TB>(pt, sK, warp * 16, qb);  // k . q
    uint32_t af[TB / 16][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nb * 8 + 2 * tq4 + (e & 1);
        const int64_t j = jk[e >> 1];
        pt[nb][e] = j < p.tk && attends(j, it[c], p.window) ? ex2(pt[nb][e] * sl2 - lt[c]) : 0.0f;
      }
      af[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(pt[nb][0], pt[nb][1]);
      af[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(pt[nb][2], pt[nb][3]);
    }
    frags_times_tile<DP, TB>(dv, af, ob);
    // dS^T = P^T (dP^T - D) and dK += dS^T Q.
    float dpt[NB][4];
    rows_dot_rows<DP, TB>(dpt, sV, warp * 16, ob);  // v . dout
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[e] = pt[nb][e] * (dpt[nb][e] - dt[nb * 8 + 2 * tq4 + (e & 1)]);
      af[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(ds[0], ds[1]);
      af[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(ds[2], ds[3]);
    }
    frags_times_tile<DP, TB>(dk, af, qb);
    __syncthreads();
  }
  cp_async_wait<0>();

  G* gk = static_cast<G*>(p.dk);
  G* gv = static_cast<G*>(p.dv);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t j = jk[e];
    if (j >= p.tk) continue;
    const int64_t base = (j * p.nkv + g) * DP + 2 * tq4;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t off = base + nd * 8 + c;
        gk[off] = from_f32<G>(to_f32(gk[off]) + p.scale * dk[nd][2 * e + c]);
        gv[off] = from_f32<G>(to_f32(gv[off]) + dv[nd][2 * e + c]);
      }
    }
  }
}

}  // namespace

namespace {

template <int DP, typename C>
void launch_dq(const BwdParams& p) {
  constexpr size_t smem = dq_smem<DP, C>();
  auto kernel = attn_bwd_dq_mma_kernel<DP, C>;
  allow_smem(kernel, smem);
  const int64_t blocks = (p.tq * p.group + C::kResident - 1) / C::kResident;
  check_grid("attention_backward (CUDA) dq", blocks, p.nkv, 1);
  kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), C::kThreadsPerBlock, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_bwd_dq_mma_kernel");
}

template <int DP, typename G, typename C>
void launch_dkdv(const BwdParams& p) {
  constexpr size_t smem = dkdv_smem<DP, C>();
  auto kernel = attn_bwd_dkdv_mma_kernel<DP, G, C>;
  allow_smem(kernel, smem);
  const int64_t blocks = (p.tk + C::kResident - 1) / C::kResident;
  check_grid("attention_backward (CUDA) dk/dv", blocks, p.nkv, 1);
  kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), C::kThreadsPerBlock, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_bwd_dkdv_mma_kernel");
}

using Wide = Config<4, 64, 2>;    // 4 warps, 64-wide double-buffered tiles: two blocks per SM of 228 KiB
using Single = Config<4, 64, 1>;  // head dim 192 where the double buffer does not fit one block
using Eight = Config<8, 32, 2>;   // 8 warps, 32-wide double-buffered tiles: an SM of 100 KiB

/// Whether the 8-warp shape runs: an SM holds only one block of the 4-warp one (one_block_per_sm) and the 8-warp
/// one fits a block, unless AERIE_ATTENTION_BACKWARD_KERNEL=mma64.
inline bool eight_warps_pay(size_t wide, size_t eight) {
  return !mma64_forced(settings().attention_backward_kernel) && one_block_per_sm(wide) && smem_fits(eight);
}

}  // namespace

// Head dims 64 and 128: 4 warps and 64-wide tiles, or 8 warps and 32-wide ones where an SM holds only one block of
// the first (eight_warps_pay). Head dim 192: 4 warps, double-buffered where that fits one block (smem_fits), else
// single-buffered.
template <int DP>
void launch_bwd_dq_tc(const BwdParams& p) {
  if constexpr (DP == 192) {
    if (!smem_fits(dq_smem<DP, Wide>())) {
      launch_dq<DP, Single>(p);
      return;
    }
  } else {
    if (eight_warps_pay(dq_smem<DP, Wide>(), dq_smem<DP, Eight>())) {
      launch_dq<DP, Eight>(p);
      return;
    }
  }
  launch_dq<DP, Wide>(p);
}

template <int DP, typename G>
void launch_bwd_dkdv_tc(const BwdParams& p) {
  if constexpr (DP == 192) {
    if (!smem_fits(dkdv_smem<DP, Wide>())) {
      launch_dkdv<DP, G, Single>(p);
      return;
    }
  } else {
    if (eight_warps_pay(dkdv_smem<DP, Wide>(), dkdv_smem<DP, Eight>())) {
      launch_dkdv<DP, G, Eight>(p);
      return;
    }
  }
  launch_dkdv<DP, G, Wide>(p);
}

template void launch_bwd_dq_tc<64>(const BwdParams& p);
template void launch_bwd_dq_tc<128>(const BwdParams& p);
template void launch_bwd_dq_tc<192>(const BwdParams& p);
template void launch_bwd_dkdv_tc<64, float>(const BwdParams& p);
template void launch_bwd_dkdv_tc<128, float>(const BwdParams& p);
template void launch_bwd_dkdv_tc<64, bf16_t>(const BwdParams& p);
template void launch_bwd_dkdv_tc<128, bf16_t>(const BwdParams& p);
template void launch_bwd_dkdv_tc<192, float>(const BwdParams& p);
template void launch_bwd_dkdv_tc<192, bf16_t>(const BwdParams& p);

}  // namespace aerie::cuda::attn
