// wgmma (sm_90a) backward of the causal GQA attention, head dim exactly 128, bf16 q/k/v/dout: the two
// passes of attention_backward_tc.cu (dq per tile of packed query rows; dk/dv per tile of keys, no
// atomics) with warpgroup MMAs instead of mma.sync. The math is FlashAttention-2's Algorithm 2 (Dao 2023),
// as there: P = exp(scale q.k - lse) recomputed from the saved lse, dP = dout v^T, dS = P (dP - D);
// dq = scale dS K, dk += scale dS^T Q, dv += P^T dout; P and dS rounded to bf16 as the A operands of the
// second products, everything else fp32. The layout follows FlashAttention-3 (Shah et al. 2024) in the
// part that pays on Hopper: the products read their shared-memory operands through wgmma descriptors,
// and P / dS go from the accumulators of one wgmma straight into the A registers of the next.
//
// dk/dv pass: a block of 2 warpgroups holds 128 keys of one kv head (64 per warpgroup: K, V resident in
// shared memory); 64-row tiles of packed query rows (Q, dout, their lse and D) stream through a double
// buffer (cp.async). Per tile and warpgroup: S^T = K Q^T and dP^T = V dout^T (both operands in shared
// memory, K-major), dV += P^T dout and dK += dS^T Q (P^T, dS^T from registers; Q and dout read MN-major,
// the same tiles transposed). dq pass: a block of 2 warpgroups holds 128 packed query rows (Q, dout
// resident); 64-key tiles of K and V stream; per tile S = Q K^T, dP = dout V^T, dQ += dS K (K MN-major).
// Shared tiles: wgmma's 128-byte swizzle, two 64-column halves per [rows][128] tile (wgmma.cuh).
//
// Row packing, masks and the treatment of rows without keys are attention_backward_tc.cu's.
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/wgmma_rs.cuh"

namespace aerie::cuda::attn {
namespace {

constexpr int kD = 128;              // head dim
constexpr int kWgs = 2;              // warpgroups per block
constexpr int kWThreads = 128 * kWgs;
constexpr int kM = 64;               // rows (dq) or keys (dk/dv) per warpgroup
constexpr int kN = 64;               // keys (dq) or packed rows (dk/dv) per streamed tile
constexpr int kBlock = kWgs * kM;    // rows (dq) or keys (dk/dv) per block
constexpr int kSlots = 3;            // shared-memory slots of the streamed tiles
constexpr float kLog2e = 1.4426950408889634f;

/// Bytes of an [R][128] bf16 tile (two 64-column halves of [R][128 bytes]).
template <int R>
constexpr uint32_t wtile() {
  return R * kD * 2;
}

/// Byte offset of 16-byte chunk c (0 .. 15: columns 8c .. 8c + 7) of row r in an [R][128] tile.
template <int R>
__device__ __forceinline__ uint32_t wswz(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

#ifndef AERIE_NO_WGMMA
/// Packed query rows R0 .. R0 + R - 1 (row R = i * group + head in group of kv head g) of two
/// [tq, nh, 128] tensors (Q and dout) into [R][128] tiles; rows past tq are zeros. Row arithmetic in 32
/// bits (the launch checks that tq * group fits).
template <int R>
__device__ __forceinline__ void load_rows_w(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                            const BwdParams& p, int g, int R0) {
  const int c = threadIdx.x & 15;
#pragma unroll
  for (int r = threadIdx.x >> 4; r < R; r += kWThreads / 16) {
    const int row = R0 + r, i = row / p.group;
    const int h = g * p.group + (row - i * p.group);
    const bool ok = i < p.tq;
    const int64_t off = ok ? (static_cast<int64_t>(i) * p.nh + h) * kD + c * 8 : 0;
    cp_async16(dst_a + wswz<R>(r, c), a + off, ok);
    cp_async16(dst_b + wswz<R>(r, c), b + off, ok);
  }
}

/// Keys j0 .. j0 + R - 1 of kv head g of two [tk, nkv, 128] tensors (K and V); keys past tk are zeros.
template <int R>
__device__ __forceinline__ void load_keys_w(uint32_t dst_a, const bf16_t* a, uint32_t dst_b, const bf16_t* b,
                                            const BwdParams& p, int g, int64_t j0) {
  const int c = threadIdx.x & 15;
#pragma unroll
  for (int jj = threadIdx.x >> 4; jj < R; jj += kWThreads / 16) {
    const int64_t j = j0 + jj;
    const bool ok = j < p.tk;
    const int64_t off = ok ? (j * p.nkv + g) * kD + c * 8 : 0;
    cp_async16(dst_a + wswz<R>(jj, c), a + off, ok);
    cp_async16(dst_b + wswz<R>(jj, c), b + off, ok);
  }
}

__device__ __forceinline__ void fence_acc(float (&d)[2][32]) {
  fence_regs(d[0]);
  fence_regs(d[1]);
}

/// Issues acc (64 x 64) = A B^T over the head dim: A = rows a_row0 .. + 63 of the [RA][128] tile at a,
/// B = the [64][128] tile at b, both K-major. Not committed.
template <int RA>
__device__ __forceinline__ void issue_dot(float (&acc)[32], uint32_t a, int a_row0, uint32_t b) {
  wgmma_fence();
  fence_regs(acc);
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const uint32_t half = ks >> 2, kb = (ks & 3) * 32;
    const uint64_t da = wgmma_desc(a + half * (RA * 128) + a_row0 * 128 + kb), db = wgmma_desc(b + half * (64 * 128) + kb);
    if (ks == 0)
      wgmma_n64<true>(acc, da, db);  // overwrites acc: no zeroing (which would serialize the wgmma in flight)
    else
      wgmma_n64(acc, da, db);
  }
}

/// Issues acc (64 x 128, two 64-column halves) += F B: F the 64 x 64 bf16 A fragments (k = the 64 rows
/// of the tile), B the [64][128] tile at b read MN-major (k along its rows). Not committed.
__device__ __forceinline__ void issue_frags_times_tile(float (&acc)[2][32], uint32_t (&f)[kN / 16][4], uint32_t b) {
  wgmma_fence();
  fence_acc(acc);
  fence_frags(f);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wgmma_rs::mma<64, 1>(acc[h], f[kk], wgmma_desc_mn(b + h * (64 * 128) + kk * 2048, 64 * 128));
}

/// The accumulator pair (nb, e) of a 64 x 64 product as a k16 A fragment: the C of n8 blocks 2kk, 2kk + 1
/// is the A of k step kk (attention_mma.cuh).
__device__ __forceinline__ void to_frag(uint32_t (&f)[kN / 16][4], int nb, const float* x) {
  f[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(x[0], x[1]);
  f[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(x[2], x[3]);
}
#endif  // AERIE_NO_WGMMA

template <typename G>
__global__ void __launch_bounds__(kWThreads, 1) attn_bwd_dkdv_wgmma_kernel(BwdParams p) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync passes off sm_90
#else
  extern __shared__ __align__(1024) uint8_t bwd_smem[];
  uint8_t* mem = nullptr;
  const uint32_t sK = aligned_base(bwd_smem, mem);
  const uint32_t sV = sK + wtile<kBlock>(), sQ0 = sV + wtile<kBlock>();  // slot s: Q, then dout
  float* lse2s = reinterpret_cast<float*>(mem + 2 * wtile<kBlock>() + 2 * kSlots * wtile<kN>());  // [slots][64]
  float* Ds = lse2s + kSlots * kN;                                                                // [slots][64]
  int* ilims = reinterpret_cast<int*>(Ds + kSlots * kN);                                          // [slots][64]
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int quad = lane >> 2, tq4 = lane & 3;
  const int g = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const bf16_t* q = static_cast<const bf16_t*>(p.q);
  const bf16_t* dout = static_cast<const bf16_t*>(p.dout);
  auto slot = [&](int t) { return sQ0 + 2 * (t % kSlots) * wtile<kN>(); };

  load_keys_w<kBlock>(sK, static_cast<const bf16_t*>(p.k), sV, static_cast<const bf16_t*>(p.v), p, g, j0);
  // Query row i attends key j iff j <= i + q_offset: the first row that sees any key of the block.
  const int rows = static_cast<int>(p.tq * p.group);
  const int R0 = static_cast<int>(min(max(int64_t{0}, j0 - p.q_offset) * p.group, static_cast<int64_t>(rows)));
  const int ntiles = (rows - R0 + kN - 1) / kN;
  auto load_tile = [&](int t) {
    const int Rt = R0 + t * kN, sl = t % kSlots;
    load_rows_w<kN>(slot(t), q, slot(t) + wtile<kN>(), dout, p, g, Rt);
    if (threadIdx.x < kN) {
      const int R = Rt + threadIdx.x, i = R / p.group;
      const int h = g * p.group + (R - i * p.group);
      const float lse = i < p.tq ? p.lse[static_cast<int64_t>(i) * p.nh + h] : -INFINITY;
      const bool ok = i < p.tq && lse != -INFINITY;  // a row without keys has no gradient
      lse2s[sl * kN + threadIdx.x] = ok ? lse * kLog2e : 0.0f;
      Ds[sl * kN + threadIdx.x] = ok ? p.D[static_cast<int64_t>(i) * p.nh + h] : 0.0f;
      ilims[sl * kN + threadIdx.x] = ok ? static_cast<int>(i + p.q_offset) : -1;
    }
  };
  if (ntiles > 0) load_tile(0);
  cp_async_commit();

  const float sl2 = p.scale * kLog2e;
  int64_t jk[2];  // this thread's two keys
#pragma unroll
  for (int e = 0; e < 2; ++e) jk[e] = j0 + wg * kM + warp * 16 + quad + 8 * e;
  const int64_t jw_last = j0 + wg * kM + kM - 1;  // the warpgroup's last key
  float dk[2][32], dv[2][32];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) dk[h][i] = dv[h][i] = 0.0f;
  fence_acc(dk);  // the zeros defined before the first wgmma is issued
  fence_acc(dv);
  float s[32], dp[32];
  uint32_t f[kN / 16][4];

  // Per tile: S^T and dP^T issued together; P computed while dP^T runs, dS^T while dV runs; dK left in
  // flight across the next tile's barrier. Three slots: tile t + 1 is loaded into the slot of tile t - 2,
  // whose last reader (dK) every thread has waited for before the barrier of iteration t.
  for (int t = 0; t < ntiles; ++t) {
    const int sl = t % kSlots;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (t + 1 < ntiles) load_tile(t + 1);
    cp_async_commit();
    const uint32_t qb = slot(t), ob = qb + wtile<kN>();
    const float* lt = lse2s + sl * kN;
    const float* dt = Ds + sl * kN;
    const int* it = ilims + sl * kN;
    const int Rt = R0 + t * kN;
    // Every (key, row) pair of the tile attended: no masks.
    const bool full = (Rt + kN - 1) / p.group < p.tq && jw_last < p.tk && Rt / p.group + p.q_offset >= jw_last;

    issue_dot<kBlock>(s, sK, wg * kM, qb);  // S^T = K Q^T
    wgmma_commit();
    issue_dot<kBlock>(dp, sV, wg * kM, ob);  // dP^T = V dout^T
    wgmma_commit();
    wgmma_wait<1>();  // dK of tile t - 1 and S^T
    fence_regs(s);
    fence_acc(dk);
    fence_frags(f);
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nb * 8 + 2 * tq4 + (e & 1);
        float& x = s[nb * 4 + e];
        if (full)
          x = exp2f(x * sl2 - lt[c]);
        else {
          const int64_t j = jk[e >> 1];
          x = j < p.tk && j <= it[c] ? exp2f(x * sl2 - lt[c]) : 0.0f;
        }
      }
      to_frag(f, nb, &s[nb * 4]);
    }
    issue_frags_times_tile(dv, f, ob);  // dV += P^T dout
    wgmma_commit();
    wgmma_wait<1>();  // dP^T
    fence_regs(dp);
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nb * 4 + e] = s[nb * 4 + e] * (dp[nb * 4 + e] - dt[nb * 8 + 2 * tq4 + (e & 1)]);
    wgmma_wait<0>();  // dV: the fragments are free
    fence_acc(dv);
    fence_frags(f);
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb) to_frag(f, nb, &dp[nb * 4]);
    issue_frags_times_tile(dk, f, qb);  // dK += dS^T Q
    wgmma_commit();
  }
  wgmma_wait<0>();
  fence_acc(dk);
  fence_frags(f);
  cp_async_wait<0>();

  G* gk = static_cast<G*>(p.dk);
  G* gv = static_cast<G*>(p.dv);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t j = jk[e];
    if (j >= p.tk) continue;
    const int64_t base = (j * p.nkv + g) * kD + 2 * tq4;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t off = base + h * 64 + nb * 8 + c;
          gk[off] = from_f32<G>(to_f32(gk[off]) + p.scale * dk[h][nb * 4 + 2 * e + c]);
          gv[off] = from_f32<G>(to_f32(gv[off]) + dv[h][nb * 4 + 2 * e + c]);
        }
  }
#endif
}

__global__ void __launch_bounds__(kWThreads, 1) attn_bwd_dq_wgmma_kernel(BwdParams p) {
#ifdef AERIE_NO_WGMMA
  __trap();  // not launched: the host takes the mma.sync passes off sm_90
#else
  extern __shared__ __align__(1024) uint8_t bwd_smem[];
  uint8_t* mem = nullptr;
  const uint32_t sQ = aligned_base(bwd_smem, mem);
  const uint32_t sO = sQ + wtile<kBlock>(), sK0 = sO + wtile<kBlock>();  // slot s: K, then V
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int quad = lane >> 2, tq4 = lane & 3;
  const int g = blockIdx.y;
  const int r0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlock;  // longest rows first
  const bf16_t* k = static_cast<const bf16_t*>(p.k);
  const bf16_t* v = static_cast<const bf16_t*>(p.v);
  auto slot = [&](int t) { return sK0 + 2 * (t % kSlots) * wtile<kN>(); };

  load_rows_w<kBlock>(sQ, static_cast<const bf16_t*>(p.q), sO, static_cast<const bf16_t*>(p.dout), p, g, r0);
  const int64_t i_last = min(p.tq - 1, static_cast<int64_t>((r0 + kBlock - 1) / p.group));
  const int64_t kend = max(int64_t{0}, min(p.tk, i_last + p.q_offset + 1));
  const int ntiles = static_cast<int>((kend + kN - 1) / kN);
  if (ntiles > 0) load_keys_w<kN>(slot(0), k, slot(0) + wtile<kN>(), v, p, g, 0);
  cp_async_commit();

  int64_t klim[2];  // key j is attended iff j <= klim (and j < kend)
  float lse2[2], Dr[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int R = r0 + wg * kM + warp * 16 + quad + 8 * e, i = R / p.group;
    const int h = g * p.group + (R - i * p.group);
    const float lse = i < p.tq ? p.lse[static_cast<int64_t>(i) * p.nh + h] : -INFINITY;
    klim[e] = i < p.tq && lse != -INFINITY ? i + p.q_offset : -1;  // a row without keys has no gradient
    lse2[e] = klim[e] >= 0 ? lse * kLog2e : 0.0f;
    Dr[e] = klim[e] >= 0 ? p.D[static_cast<int64_t>(i) * p.nh + h] : 0.0f;
  }
  const int64_t klim_min = min(klim[0], klim[1]);
  const float sl2 = p.scale * kLog2e;
  float acc[2][32];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[h][i] = 0.0f;
  fence_acc(acc);  // the zeros defined before the first wgmma is issued
  float s[32], dp[32];
  uint32_t f[kN / 16][4];

  // Per tile: S and dP issued together, P computed while dP runs, dQ left in flight across the next
  // tile's barrier; three slots as in the dk/dv pass.
  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (t + 1 < ntiles) load_keys_w<kN>(slot(t + 1), k, slot(t + 1) + wtile<kN>(), v, p, g, static_cast<int64_t>(t + 1) * kN);
    cp_async_commit();
    const uint32_t kb = slot(t), vb = kb + wtile<kN>();
    const int64_t j0 = static_cast<int64_t>(t) * kN;
    const bool full = j0 + kN <= kend && j0 + kN - 1 <= klim_min;  // every key of the tile attended by both rows
    issue_dot<kBlock>(s, sQ, wg * kM, kb);   // S = Q K^T
    wgmma_commit();
    issue_dot<kBlock>(dp, sO, wg * kM, vb);  // dP = dout V^T
    wgmma_commit();
    wgmma_wait<1>();  // dQ of tile t - 1 and S
    fence_regs(s);
    fence_acc(acc);
    fence_frags(f);
#pragma unroll
    for (int nb = 0; nb < kN / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& x = s[nb * 4 + e];
        const int r = e >> 1;
        if (full)
          x = exp2f(x * sl2 - lse2[r]);
        else {
          const int64_t j = j0 + nb * 8 + 2 * tq4 + (e & 1);
          x = j < kend && j <= klim[r] ? exp2f(x * sl2 - lse2[r]) : 0.0f;
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
  cp_async_wait<0>();

  bf16_t* dq = static_cast<bf16_t*>(p.dq);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int R = r0 + wg * kM + warp * 16 + quad + 8 * e, i = R / p.group;
    if (i >= p.tq) continue;
    const int h = g * p.group + (R - i * p.group);
    bf16_t* row = dq + (static_cast<int64_t>(i) * p.nh + h) * kD + 2 * tq4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
        *reinterpret_cast<uint32_t*>(row + hh * 64 + nb * 8) =
            pack_bf16(acc[hh][nb * 4 + 2 * e] * p.scale, acc[hh][nb * 4 + 2 * e + 1] * p.scale);
  }
#endif
}

}  // namespace

template <typename G>
void launch_bwd_wgmma(const BwdParams& p) {
  constexpr size_t kAlign = 1024;  // aligned_base rounds the dynamic shared memory up to 1024 bytes
  // The kernels do the packed-row arithmetic in 32 bits.
  AERIE_CHECK(p.tq * p.group + kBlock < (int64_t{1} << 31),
              "attention_backward (CUDA): " << p.tq << " rows x " << p.group << " heads per kv head exceed 2^31");
  if (p.tk > 0) {
    const size_t smem = 2 * wtile<kBlock>() + 2 * kSlots * wtile<kN>() + kSlots * kN * (2 * sizeof(float) + sizeof(int)) + kAlign;
    auto kernel = attn_bwd_dkdv_wgmma_kernel<G>;
    allow_smem(kernel, smem);
    const int64_t blocks = (p.tk + kBlock - 1) / kBlock;
    check_grid("attention_backward (CUDA) dk/dv", blocks, p.nkv, 1);
    kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), kWThreads, smem, stream()>>>(p);
    AERIE_CUDA_LAUNCHED("attn_bwd_dkdv_wgmma_kernel");
  }
  const size_t smem = 2 * wtile<kBlock>() + 2 * kSlots * wtile<kN>() + kAlign;
  auto kernel = attn_bwd_dq_wgmma_kernel;
  allow_smem(kernel, smem);
  const int64_t blocks = (p.tq * p.group + kBlock - 1) / kBlock;
  check_grid("attention_backward (CUDA) dq", blocks, p.nkv, 1);
  kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), kWThreads, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_bwd_dq_wgmma_kernel");
}

template void launch_bwd_wgmma<float>(const BwdParams& p);
template void launch_bwd_wgmma<bf16_t>(const BwdParams& p);

}  // namespace aerie::cuda::attn
