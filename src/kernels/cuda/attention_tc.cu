// BF16 tensor-core forward of the causal GQA attention (head dims exactly 64, 128 or 192; the MLA
// prefill: q/k head 192 = nope 128 + rope 64 with a value head of 128 (104 KiB of shared memory, two
// blocks per SM), or V zero-padded to 192 (120 KiB, one block)), 16-byte aligned
// q/k/v), used for prefill-sized work; the SIMT kernel of attention.cu does the rest (F32, other head
// dims, decoding). Same contract, row packing (R = i * group + head in group), key splits and outputs
// as attn_fwd_kernel.
//
// FlashAttention-2 (Dao 2023, Algorithm 1) with the register layout of its CUDA implementation: a
// block holds 64 packed query rows (4 warps x 16) and streams 64-key tiles of K and V through shared
// memory, double-buffered with cp.async (the next tile loads while this one is used). Per warp and
// tile: S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32 accumulate; Q's fragments stay in registers
// for the whole kernel, K's come by ldmatrix), the online softmax on the fp32 accumulators in
// registers (base-2 exponentials of scale * log2(e) * s, row max and sum over the 4 lanes that share a
// row), P rounded to bf16 and reused as the A operand of O += P V (V by ldmatrix.trans), O in fp32
// registers rescaled by exp2(m_old - m_new). The row sum l adds the fp32 probabilities (as
// FlashAttention does). Shared-memory rows are XOR-swizzled in 16-byte chunks (chunk ^ row % 8) so
// that ldmatrix's 8 row reads hit 8 distinct bank groups. Where the double buffer does not fit one block (head
// dim 192 on a GPU of 99 KiB per block: sm_86, sm_89, sm_120), the K and V tiles are single-buffered (64 KiB at
// 192 / 128, 72 KiB at 192 / 192): each tile loads after the last one is used.
#include "kernels/cuda/attention_mma.cuh"

namespace aerie::cuda::attn {
namespace {

constexpr int kRowsPerWarp = 16;
static_assert(kTcBlockRows == kWarps * kRowsPerWarp);

// KEYS: keys per streamed tile (64, or 32 where an SM holds only one block of 64); MT: m16 row tiles per warp (a
// block of 4 warps holds 64 MT packed query rows).
template <int DP, int DV, int NBUF, int KEYS, int MT = 1>
struct MmaSmem {
  static constexpr int rows = kWarps * 16 * MT;
  static constexpr size_t q_bytes = sizeof(bf16_t) * rows * DP;
  static constexpr size_t k_bytes = sizeof(bf16_t) * KEYS * DP;  // one K tile
  static constexpr size_t v_bytes = sizeof(bf16_t) * KEYS * DV;  // one V tile
  static constexpr size_t bytes = q_bytes + NBUF * (k_bytes + v_bytes);  // Q, K[NBUF], V[NBUF]
};

/// The online softmax's update for one key tile (FlashAttention-2, Algorithm 1): the rows' new maxima (mx: this
/// lane's maxima of the masked, scaled scores sc, reduced over the quad here), P = exp2(sc - m) rounded to bf16 into
/// pf (the A fragments of P V), and l and O rescaled by exp2(m_old - m_new).
template <int ND, int KEYS>
__device__ __forceinline__ void softmax_update(const float (&sc)[KEYS / 8][4], float (&mx)[2], float (&m)[2],
                                               float (&l)[2], float (&o)[ND][4], uint32_t (&pf)[KEYS / 16][4]) {
  float base[2], corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = quad_max(mx[r]);
    corr[r] = m[r] == -INFINITY ? 0.0f : ex2(m[r] - mx[r]);  // O and l are 0 while m is -inf
    m[r] = mx[r];
    base[r] = mx[r] == -INFINITY ? 0.0f : mx[r];  // a row without keys yet: every p is exp2(-inf) = 0
  }
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nb = 0; nb < KEYS / 8; ++nb) {
    const float p0 = ex2(sc[nb][0] - base[0]), p1 = ex2(sc[nb][1] - base[0]);
    const float p2 = ex2(sc[nb][2] - base[1]), p3 = ex2(sc[nb][3] - base[1]);
    rs[0] += p0 + p1;
    rs[1] += p2 + p3;
    // The accumulator of n8 block nb is half of the A fragment of k16 step nb / 2.
    pf[nb >> 1][(nb & 1) * 2 + 0] = pack_bf16(p0, p1);
    pf[nb >> 1][(nb & 1) * 2 + 1] = pack_bf16(p2, p3);
  }
  l[0] = l[0] * corr[0] + rs[0];
  l[1] = l[1] * corr[1] + rs[1];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    o[nd][0] *= corr[0];
    o[nd][1] *= corr[0];
    o[nd][2] *= corr[1];
    o[nd][3] *= corr[1];
  }
}

/// The kernel's end for one lane: its two rows (packed rows row0 and row0 + 8 of the sequence `s`) of O = o / l and
/// lse = m + log2(l) (in nats) to out / lse, or to the key split's part_out / part_lse.
template <int DV>
__device__ __forceinline__ void store_rows(const FwdParams& p, const Seq& s, const float (&o)[DV / 8][4],
                                           const float (&m)[2], const float (&l)[2], int64_t row0, int g, int split,
                                           int tq4) {
  constexpr int ND = DV / 8;
  bf16_t* out = static_cast<bf16_t*>(p.out);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float lsum = quad_sum(l[e]);
    const int64_t R = row0 + 8 * e, i = R / p.group;
    if (i >= s.tq) continue;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const int64_t row = (s.row0 + i) * p.nh + h;
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const float lse = lsum > 0.0f ? (m[e] + log2f(lsum)) * 0.6931471805599453f : -INFINITY;
    if (p.part_out) {
      const int64_t prow = split * p.tq * p.nh + row;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd)
        *reinterpret_cast<float2*>(p.part_out + prow * DV + nd * 8 + 2 * tq4) =
            make_float2(o[nd][2 * e] * inv, o[nd][2 * e + 1] * inv);
      if (tq4 == 0) p.part_lse[prow] = lse;
    } else {
#pragma unroll
      for (int nd = 0; nd < ND; ++nd)
        *reinterpret_cast<uint32_t*>(out + row * DV + nd * 8 + 2 * tq4) =
            pack_bf16(o[nd][2 * e] * inv, o[nd][2 * e + 1] * inv);
      if (tq4 == 0 && p.lse) p.lse[row] = lse;
    }
  }
}

/// sc[mt][nb] = the warp's 16 MT rows of Q times the KEYS keys of the tile at `kb` ([KEYS][DP], swizzled) over the
/// head dim: Q's fragments from qf where Q_REGS, else read at sq (the address of the warp's first row of the
/// swizzled [rows][DP] Q tile). x4 matrices of K: keys +0 / +8 of a pair of n8 blocks, d chunks 2kd / 2kd+1.
template <int DP, int KEYS, int MT, bool Q_REGS>
__device__ __forceinline__ void tile_scores(float (&sc)[MT][KEYS / 8][4],
                                            const uint32_t (&qf)[Q_REGS ? MT : 1][Q_REGS ? DP / 16 : 1][4],
                                            uint32_t sq, uint32_t kb) {
  constexpr int NB = KEYS / 8;
  const int lane = threadIdx.x & 31, mi = lane >> 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) sc[mt][nb][0] = sc[mt][nb][1] = sc[mt][nb][2] = sc[mt][nb][3] = 0.0f;
  // The lane's rows at chunk step 0 (sq is row 0 of the warp, a multiple of 16 rows: the rows' swizzle is the
  // lane's own), stepped by swz_step.
  const uint32_t q0 = sq + swz<DP>(lane & 15, lane >> 4);
  const uint32_t k0 = kb + swz<DP>((mi >> 1) * 8 + (lane & 7), mi & 1);
#pragma unroll
  for (int kd = 0; kd < DP / 16; ++kd) {
    uint32_t qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (Q_REGS) {
#pragma unroll
        for (int x = 0; x < 4; ++x) qa[mt][x] = qf[mt][kd][x];
      } else {
        ldsm_x4(swz_step<DP>(q0, kd * 2) + mt * 16 * DP * 2, qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
      }
    }
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(swz_step<DP>(k0, kd * 2) + nb * 8 * DP * 2, b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816(sc[mt][nb], qa[mt], b0, b1);
        mma16816(sc[mt][nb + 1], qa[mt], b2, b3);
      }
    }
  }
}

/// One m16 tile's scores to base-2 units and the online softmax (softmax_update): element e of block nb at row
/// quad + 8 (e >> 1) (its last attended key klim[e >> 1]) and key jl + nb * 8 + (e & 1); where `masked`, keys
/// past kend or outside the row's causal window are -inf.
template <int ND, int KEYS>
__device__ __forceinline__ void masked_softmax(float (&sc)[KEYS / 8][4], bool masked, int64_t jl, int64_t kend,
                                               const int64_t (&klim)[2], int64_t window, float sl2, float (&m)[2],
                                               float (&l)[2], float (&o)[ND][4], uint32_t (&pf)[KEYS / 16][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nb = 0; nb < KEYS / 8; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sc[nb][e] * sl2;
      if (masked) {
        const int64_t j = jl + nb * 8 + (e & 1);
        if (j >= kend || !attends(j, klim[e >> 1], window)) x = -INFINITY;
      }
      sc[nb][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
  }
  softmax_update<ND, KEYS>(sc, mx, m, l, o, pf);
}

/// o[mt] += P V: P from pf (the A fragments of each k16 step of keys), V the tile at vb ([KEYS][DV], swizzled).
/// x4.trans matrices of V: keys +0 / +8 of the k16 step, d chunks nd / nd+1.
template <int DV, int KEYS, int MT>
__device__ __forceinline__ void accumulate_pv(float (&o)[MT][DV / 8][4], const uint32_t (&pf)[MT][KEYS / 16][4],
                                              uint32_t vb) {
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  const uint32_t v0 = vb + swz<DV>((mi & 1) * 8 + (lane & 7), mi >> 1);  // the lane's rows at chunk step 0
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
#pragma unroll
    for (int nd = 0; nd < DV / 8; nd += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_t(swz_step<DV>(v0, nd) + kk * 16 * DV * 2, b0, b1, b2, b3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816(o[mt][nd], pf[mt][kk], b0, b1);
        mma16816(o[mt][nd + 1], pf[mt][kk], b2, b3);
      }
    }
  }
}

// DP: the query/key head dim; DV: the value/output head dim (DP, or MLA's 128 against 192); NBUF: K/V buffers;
// KEYS: keys per K/V tile; MT: m16 tiles of 16 rows per warp. With MT = 2 each K / V fragment read from shared
// memory feeds two mma row tiles (FlashAttention-2's 128-row blocks of 4 warps), Q's fragments are read from shared
// memory per tile at head dim 128 and 192 (they would take 64 registers) and kept in registers at 64.
template <int DP, int DV, int NBUF, int KEYS, int MT>
__global__ void __launch_bounds__(kThreads, MT == 1 ? 2 : 1) attn_fwd_mma_kernel(FwdParams p) {
  static_assert(DP == 64 || DP == 128 || DP == 192);
  static_assert(DV == DP || (DP == 192 && DV == 128));
  static_assert(MT == 1 || MT == 2);
  constexpr int NC = DP / 8;       // 16-byte chunks per row of Q, K
  constexpr int NCV = DV / 8;      // of V
  constexpr int KD = DP / 16;      // k16 steps of Q K^T over the head dim
  constexpr int NB = KEYS / 8;     // n8 score blocks per tile
  constexpr int KK = KEYS / 16;    // k16 steps of P V over the keys
  constexpr int ND = DV / 8;       // n8 output blocks
  constexpr bool kQRegs = MT == 1 || DP == 64;  // Q's fragments in registers for the whole kernel
  static_assert(NBUF == 1 || NBUF == 2);
  static_assert(KEYS == 32 || KEYS == 64);
  using L = MmaSmem<DP, DV, NBUF, KEYS, MT>;
  constexpr int BR = L::rows, WR = 16 * MT;  // packed rows per block, per warp
  extern __shared__ __align__(128) unsigned char mma_smem[];
  const uint32_t sQ = static_cast<uint32_t>(__cvta_generic_to_shared(mma_smem));
  const uint32_t sK = sQ + L::q_bytes, sV = sK + NBUF * L::k_bytes;

  Seq s;
  if (!find_seq<BR>(p, s, blockIdx.x)) return;
  // One sequence: the last query tiles have the most keys; start them first.
  if (p.cu == nullptr) s.tile = gridDim.x - 1 - blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, quad = lane >> 2, tq4 = lane & 3;
  const bf16_t* q = static_cast<const bf16_t*>(p.q);
  const bf16_t* k = static_cast<const bf16_t*>(p.k);
  const bf16_t* v = static_cast<const bf16_t*>(p.v);
  const int g = blockIdx.y, split = blockIdx.z;
  const int64_t r0 = s.tile * BR;  // first packed row of the block

  // Q tile (rows past the sequence are zeros).
  for (int idx = threadIdx.x; idx < BR * NC; idx += kThreads) {
    const int r = idx / NC, c = idx % NC;
    const int64_t R = r0 + r, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const bool ok = i < s.tq;
    cp_async16(sQ + swz<DP>(r, c), ok ? q + ((s.row0 + i) * p.nh + h) * DP + c * 8 : q, ok);
  }
  cp_async_commit();

  const int64_t i_first = r0 / p.group;
  const int64_t i_last = min(s.tq - 1, (r0 + BR - 1) / p.group);
  const int64_t kend_block = max(int64_t{0}, min(s.tk, i_last + s.q_offset + 1));
  // The split's keys, from the first key of the block's first row (the window's lower bound).
  const int64_t kbeg = max(split * p.split_len, first_key(i_first + s.q_offset, p.window));
  const int64_t kend = min(kend_block, split * p.split_len + p.split_len);
  const int ntiles = kend > kbeg ? static_cast<int>((kend - kbeg + KEYS - 1) / KEYS) : 0;
  const int64_t klim_min = i_first + s.q_offset;  // every row of the block attends keys <= klim_min
  // ... and, under a window, keys >= kfirst_max (the first key of the block's last row).
  const int64_t kfirst_max = first_key(i_last + s.q_offset, p.window);

  auto load_kv = [&](int t, int buf) {
    const int64_t j0 = kbeg + static_cast<int64_t>(t) * KEYS;
    for (int idx = threadIdx.x; idx < KEYS * NC; idx += kThreads) {
      const int jj = idx / NC, c = idx % NC;
      const int64_t j = j0 + jj;
      const bool ok = j < kend;
      const int64_t kv = ok ? (s.row0 + j) * p.nkv + g : 0;
      cp_async16(sK + buf * L::k_bytes + swz<DP>(jj, c), k + kv * DP + c * 8, ok);
      if (DV == DP || c < NCV) cp_async16(sV + buf * L::v_bytes + swz<DV>(jj, c), v + kv * DV + c * 8, ok);
    }
  };
  if (ntiles > 0) load_kv(0, 0);
  cp_async_commit();

  // This lane's rows: quad and quad + 8 of each of the warp's MT m16 tiles.
  int64_t klim[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t i = (r0 + warp * WR + mt * 16 + quad + 8 * e) / p.group;
      klim[mt][e] = i < s.tq ? i + s.q_offset : -1;
    }
  const float sl2 = p.scale * 1.4426950408889634f;  // scores in base-2 units
  float m[MT][2], l[MT][2];
  float o[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0.0f;
  }

  cp_async_wait<1>();  // Q has landed (the first K/V tile may still be in flight)
  __syncthreads();
  uint32_t qf[kQRegs ? MT : 1][kQRegs ? KD : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kd = 0; kd < KD; ++kd)
        ldsm_x4(sQ + swz<DP>(warp * WR + mt * 16 + (lane & 15), kd * 2 + (lane >> 4)), qf[mt][kd][0], qf[mt][kd][1],
                qf[mt][kd][2], qf[mt][kd][3]);
  }

  for (int t = 0; t < ntiles; ++t) {
    const int buf = next_tile<NBUF>(t, ntiles, load_kv);  // tile t has landed
    const uint32_t kb = sK + buf * L::k_bytes, vb = sV + buf * L::v_bytes;
    const int64_t j0 = kbeg + static_cast<int64_t>(t) * KEYS;

    // S [16 MT rows][KEYS keys] = Q K^T.
    float sc[MT][NB][4];
    tile_scores<DP, KEYS, MT, kQRegs>(sc, qf, sQ + swz<DP>(warp * WR, 0), kb);
    // Online softmax; P as the A fragments of P V.
    const bool masked = j0 + KEYS > kend || j0 + KEYS - 1 > klim_min || j0 < kfirst_max;
    uint32_t pf[MT][KK][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      masked_softmax<ND, KEYS>(sc[mt], masked, j0 + 2 * tq4, kend, klim[mt], p.window, sl2, m[mt], l[mt], o[mt],
                               pf[mt]);
    // O [16 MT][DV] += P [16 MT][KEYS] V [KEYS][DV].
    accumulate_pv<DV, KEYS, MT>(o, pf, vb);
    __syncthreads();  // every warp is done with this buffer before the next iteration refills it
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) store_rows<DV>(p, s, o[mt], m[mt], l[mt], r0 + warp * WR + mt * 16 + quad, g, split, tq4);
}

template <int DP, int DV, int NBUF, int KEYS = 64, int MT = 1>
void launch_mma_nbuf(const FwdParams& p, int64_t tiles, int64_t splits) {
  constexpr size_t smem = MmaSmem<DP, DV, NBUF, KEYS, MT>::bytes;
  auto kernel = attn_fwd_mma_kernel<DP, DV, NBUF, KEYS, MT>;
  allow_smem(kernel, smem);
  kernel<<<dim3(static_cast<unsigned>(tiles), p.nkv, static_cast<unsigned>(splits)), kThreads, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_fwd_mma_kernel");
}

/// The 128-row shape (MT = 2): head dims 64 (64-key tiles), 128 and MLA's 192 / 128 (32-key tiles, as
/// FlashAttention-2 takes at 128 on sm_86 / sm_89; 88 KiB at 192 / 128), where AERIE_ATTENTION_FORWARD_KERNEL is
/// "fa2" (not yet the default: core/settings.h).
template <int DP, int DV = DP>
using WideRows = MmaSmem<DP, DV, 2, DP == 64 ? 64 : 32, 2>;
template <int DP, int DV>
bool wide_rows(const FwdParams&) {
  if constexpr (DP == DV ? DP <= 128 : DV == 128) {
    const std::string& k = settings().attention_forward_kernel;
    return k == "fa2" && smem_fits(WideRows<DP, DV>::bytes);
  } else {
    return false;
  }
}

/// The 128-row shape where wide_rows says so; else the double-buffered kernel where it fits one block (smem_fits),
/// else (head dim 192 only: 64 and 128 take at most 80 KiB) the single-buffered one; at head dims 64 and 128 32-key
/// tiles where only they let two blocks share an SM (one_block_per_sm), unless AERIE_ATTENTION_FORWARD_KERNEL=mma64.
template <int DP, int DV>
void launch_mma(const FwdParams& p, int64_t tiles, int64_t splits) {
  if constexpr (DP == 192) {
    if constexpr (DV == 128) {
      if (wide_rows<DP, DV>(p)) {
        launch_mma_nbuf<DP, DV, 2, 32, 2>(p, tiles, splits);
        return;
      }
    }
    if (!smem_fits(MmaSmem<DP, DV, 2, 64>::bytes)) {
      launch_mma_nbuf<DP, DV, 1>(p, tiles, splits);
      return;
    }
  } else {
    if (wide_rows<DP, DV>(p)) {
      launch_mma_nbuf<DP, DV, 2, DP == 64 ? 64 : 32, 2>(p, tiles, splits);
      return;
    }
    if (one_block_per_sm(MmaSmem<DP, DV, 2, 64>::bytes) && !one_block_per_sm(MmaSmem<DP, DV, 2, 32>::bytes) &&
        !mma64_forced(settings().attention_forward_kernel)) {
      launch_mma_nbuf<DP, DV, 2, 32>(p, tiles, splits);
      return;
    }
  }
  launch_mma_nbuf<DP, DV, 2>(p, tiles, splits);
}

}  // namespace

template <int DP, int DV>
int fwd_tc_block_rows(const FwdParams& p) {
  return wide_rows<DP, DV>(p) ? WideRows<DP, DV>::rows : kTcBlockRows;
}

template <int DP>
void launch_fwd_tc(const FwdParams& p, int64_t tiles, int64_t splits) {
  launch_mma<DP, DP>(p, tiles, splits);
}
template <int DP, int DV>
void launch_fwd_tc_dv(const FwdParams& p, int64_t tiles, int64_t splits) {
  launch_mma<DP, DV>(p, tiles, splits);
}

template int fwd_tc_block_rows<64, 64>(const FwdParams& p);
template int fwd_tc_block_rows<128, 128>(const FwdParams& p);
template int fwd_tc_block_rows<192, 192>(const FwdParams& p);
template int fwd_tc_block_rows<192, 128>(const FwdParams& p);
template void launch_fwd_tc<64>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_tc<128>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_tc<192>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_tc_dv<192, 128>(const FwdParams& p, int64_t tiles, int64_t splits);

}  // namespace aerie::cuda::attn
