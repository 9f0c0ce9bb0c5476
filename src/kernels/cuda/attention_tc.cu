// BF16 tensor-core forward of the causal GQA attention (head dims 64 and 128), used for prefill-sized
// work; the SIMT kernel of attention.cu does the rest (F32, other head dims, decoding). Same contract,
// row packing (R = i * group + head in group), key splits and outputs as attn_fwd_kernel.
//
// A block holds 64 packed query rows (4 warps x 16) and streams 64-key tiles of K and V through shared
// memory as bf16. Per tile and warp: S = Q K^T with WMMA 16x16x16 bf16 -> fp32 (FlashAttention-2, Dao
// 2023), the online softmax row by row in fp32 (lanes over the 64 keys), P rounded to bf16 (as
// FlashAttention does) and O += P V with WMMA, O kept in fp32 in shared memory and rescaled by
// exp(m_old - m_new) before each tile. The row sum l adds the fp32 probabilities.
#include <mma.h>

#include "kernels/cuda/attention_common.cuh"

namespace aerie::cuda::attn {
namespace {

using namespace nvcuda;

constexpr int kTcRows = 16;  // packed query rows per warp (one WMMA tile)
constexpr int kTcKeys = 64;  // keys per tile
static_assert(kTcBlockRows == kWarps * kTcRows);

/// Shared-memory layout (byte offsets, every region and WMMA pointer 32-byte aligned): bf16 Q [64][LD],
/// K [64][LD], V [64][LD]; per warp fp32 S [16][LDS], bf16 P [16][LDP], fp32 O [16][LDO].
template <int DP>
struct TcLayout {
  static constexpr int LD = DP + 8, LDS = kTcKeys + 4, LDP = kTcKeys + 8, LDO = DP + 4;
  static constexpr size_t q = 0;
  static constexpr size_t k = q + sizeof(bf16_t) * kTcBlockRows * LD;
  static constexpr size_t v = k + sizeof(bf16_t) * kTcKeys * LD;
  static constexpr size_t s = v + sizeof(bf16_t) * kTcKeys * LD;
  static constexpr size_t pb = s + sizeof(float) * kWarps * kTcRows * LDS;
  static constexpr size_t o = pb + sizeof(bf16_t) * kWarps * kTcRows * LDP;
  static constexpr size_t bytes = o + sizeof(float) * kWarps * kTcRows * LDO;
  static_assert(k % 32 == 0 && v % 32 == 0 && s % 32 == 0 && pb % 32 == 0 && o % 32 == 0);
  static_assert((kTcRows * LD * 2) % 32 == 0 && (kTcRows * LDS * 4) % 32 == 0 && (kTcRows * LDP * 2) % 32 == 0 &&
                (kTcRows * LDO * 4) % 32 == 0);
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int DP>
__global__ void __launch_bounds__(kThreads) attn_fwd_tc_kernel(FwdParams p) {
  static_assert(DP % 16 == 0);
  using L = TcLayout<DP>;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(tc_smem + L::q);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(tc_smem + L::k);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(tc_smem + L::v);
  Seq s;
  if (!find_seq<kTcBlockRows>(p, s)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* Sw = reinterpret_cast<float*>(tc_smem + L::s) + warp * kTcRows * L::LDS;
  bf16_t* Pw = reinterpret_cast<bf16_t*>(tc_smem + L::pb) + warp * kTcRows * L::LDP;
  float* Ow = reinterpret_cast<float*>(tc_smem + L::o) + warp * kTcRows * L::LDO;
  const bf16_t* q = static_cast<const bf16_t*>(p.q);
  const bf16_t* k = static_cast<const bf16_t*>(p.k);
  const bf16_t* v = static_cast<const bf16_t*>(p.v);
  const int g = blockIdx.y, split = blockIdx.z;
  const int64_t r0 = s.tile * kTcBlockRows;  // first packed row of the block
  const bf16_t zero = __float2bfloat16_rn(0.0f);

  for (int idx = threadIdx.x; idx < kTcBlockRows * DP; idx += kThreads) {
    const int r = idx / DP, c = idx % DP;
    const int64_t R = r0 + r, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    Qs[r * L::LD + c] = i < s.tq && c < p.d ? q[((s.row0 + i) * p.nh + h) * p.d + c] : zero;
  }
  for (int idx = lane; idx < kTcRows * L::LDO; idx += 32) Ow[idx] = 0.0f;
  int64_t klim[kTcRows];  // row attends key j iff j <= klim (-1: padding row)
  float m[kTcRows], l[kTcRows];
#pragma unroll
  for (int r = 0; r < kTcRows; ++r) {
    const int64_t i = (r0 + warp * kTcRows + r) / p.group;
    klim[r] = i < s.tq ? i + s.q_offset : -1;
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  const int64_t i_last = min(s.tq - 1, (r0 + kTcBlockRows - 1) / p.group);
  const int64_t kend_block = max(int64_t{0}, min(s.tk, i_last + s.q_offset + 1));
  const int64_t kbeg = split * p.split_len, kend = min(kend_block, kbeg + p.split_len);

  for (int64_t j0 = kbeg; j0 < kend; j0 += kTcKeys) {
    __syncthreads();  // the previous tile is used up (and Qs, Ow are written before the first)
    for (int idx = threadIdx.x; idx < kTcKeys * DP; idx += kThreads) {
      const int jj = idx / DP, c = idx % DP;
      const int64_t j = j0 + jj;
      const bool ok = j < kend && c < p.d;
      const int64_t off = ((s.row0 + j) * p.nkv + g) * p.d + c;
      Ks[jj * L::LD + c] = ok ? k[off] : zero;
      Vs[jj * L::LD + c] = ok ? v[off] : zero;
    }
    __syncthreads();
    // S [16 rows][64 keys] = Q_w K^T: K row-major [key][d] is K^T column-major.
#pragma unroll
    for (int nb = 0; nb < kTcKeys / 16; ++nb) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < DP; kk += 16) {
        FragA a;
        FragBCol b;
        wmma::load_matrix_sync(a, Qs + warp * kTcRows * L::LD + kk, L::LD);
        wmma::load_matrix_sync(b, Ks + nb * 16 * L::LD + kk, L::LD);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Sw + nb * 16, acc, L::LDS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax, one row at a time: lane owns keys lane and lane + 32 of the tile.
#pragma unroll
    for (int r = 0; r < kTcRows; ++r) {
      float sv[2], mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = lane + 32 * e;
        const int64_t j = j0 + col;
        const bool ok = j < kend && j <= klim[r];
        sv[e] = ok ? Sw[r * L::LDS + col] * p.scale : -INFINITY;
        mx = fmaxf(mx, sv[e]);
      }
      const float mnew = fmaxf(m[r], warp_max(mx));
      const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);  // O, l are 0 while m is -inf
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = sv[e] == -INFINITY ? 0.0f : expf(sv[e] - mnew);
        Pw[r * L::LDP + lane + 32 * e] = __float2bfloat16_rn(pe);
        sum += pe;
      }
      l[r] = l[r] * corr + warp_sum(sum);
      m[r] = mnew;
      for (int c = lane; c < DP; c += 32) Ow[r * L::LDO + c] *= corr;
    }
    __syncwarp();
    // O [16][DP] += P [16][64] V [64][DP].
#pragma unroll
    for (int n0 = 0; n0 < DP; n0 += 16) {
      FragC acc;
      wmma::load_matrix_sync(acc, Ow + n0, L::LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTcKeys; kk += 16) {
        FragA a;
        FragBRow b;
        wmma::load_matrix_sync(a, Pw + kk, L::LDP);
        wmma::load_matrix_sync(b, Vs + kk * L::LD + n0, L::LD);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ow + n0, acc, L::LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();

  bf16_t* out = static_cast<bf16_t*>(p.out);
#pragma unroll
  for (int r = 0; r < kTcRows; ++r) {
    const int64_t R = r0 + warp * kTcRows + r, i = R / p.group;
    if (i >= s.tq) continue;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const int64_t row = (s.row0 + i) * p.nh + h;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const float lse = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    if (p.part_out) {
      const int64_t prow = split * p.tq * p.nh + row;
      for (int c = lane; c < p.d; c += 32) p.part_out[prow * p.d + c] = Ow[r * L::LDO + c] * inv;
      if (lane == 0) p.part_lse[prow] = lse;
    } else {
      for (int c = lane; c < p.d; c += 32) out[row * p.d + c] = __float2bfloat16_rn(Ow[r * L::LDO + c] * inv);
      if (lane == 0 && p.lse) p.lse[row] = lse;
    }
  }
}

}  // namespace

template <int DP>
void launch_fwd_tc(const FwdParams& p, int64_t tiles, int64_t splits) {
  constexpr size_t smem = TcLayout<DP>::bytes;
  auto kernel = attn_fwd_tc_kernel<DP>;
  allow_smem(kernel, smem);
  kernel<<<dim3(static_cast<unsigned>(tiles), p.nkv, static_cast<unsigned>(splits)), kThreads, smem, stream()>>>(p);
  AERIE_CUDA_LAUNCHED("attn_fwd_tc_kernel");
}

template void launch_fwd_tc<64>(const FwdParams& p, int64_t tiles, int64_t splits);
template void launch_fwd_tc<128>(const FwdParams& p, int64_t tiles, int64_t splits);

}  // namespace aerie::cuda::attn
