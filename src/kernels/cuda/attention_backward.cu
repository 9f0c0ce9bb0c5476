// CUDA attention backward (contracts in kernels/attention.h), FlashAttention-2 (Dao 2023) Algorithm 2
// in two passes without atomics: D = rowsum(dout * out); dk/dv per block of 32 keys of one kv head,
// looping over the 32-row tiles of packed query rows that attend them (lane = query row); dq per tile of
// packed query rows, looping over 32-key tiles (lane = key), as the forward. Both recompute
// P = exp(scale q.k - lse) from the saved lse. Row packing and head-dim padding as in attention.cu.
// BF16 work with head dim 64, 128 or 192 (MLA) goes to the tensor-core kernels: on an sm_90a GPU the wgmma passes of
// attention_wgmma.cu; elsewhere (or with AERIE_ATTENTION_BACKWARD_KERNEL=mma) at head dims 64 and 128 the one-pass
// mma.sync kernel of attention_backward_fused.cu, at 192 (or with =mma2 / =mma64) the two mma.sync passes of
// attention_backward_tc.cu.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_common.cuh"

namespace aerie::cuda {
namespace {

using namespace attn;

constexpr int kKpw = 8;  // keys per warp in the dk/dv pass (kWarps * kKpw keys per block)



/// D_i = dout_i . out_i, one warp per (row, head).
template <typename T>
__global__ void __launch_bounds__(kThreads) attn_bwd_dot_kernel(const T* dout, const T* out, int64_t rows, int d,
                                                                 float* D) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float s = 0.0f;
  for (int c = lane; c < d; c += 32) s += to_f32(dout[row * d + c]) * to_f32(out[row * d + c]);
  s = warp_sum(s);
  if (lane == 0) D[row] = s;
}

/// dq_i = scale sum_j P_ij (dout_i . v_j - D_i) k_j for a tile of packed query rows (as the forward).
template <int DP, int RPW, typename T>
__global__ void __launch_bounds__(kThreads) attn_bwd_dq_kernel(BwdParams p) {
  constexpr int BR = kWarps * RPW, NC = (DP + 31) / 32;
  constexpr int KS = padded<DP>();
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [BR][DP]
  float* dOs = Qs + BR * DP;                    // [BR][DP]
  float* Ks = dOs + BR * DP;                    // [kTile][KS]
  float* Vs = Ks + kTile * KS;                  // [kTile][KS]
  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int g = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * BR;

  for (int idx = threadIdx.x; idx < BR * DP; idx += kThreads) {
    const int r = idx / DP, c = idx % DP;
    const int64_t R = r0 + r, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const bool ok = i < p.tq && c < p.d;
    const int64_t off = (i * p.nh + h) * p.d + c;
    Qs[idx] = ok ? to_f32(q[off]) : 0.0f;
    dOs[idx] = ok ? to_f32(dout[off]) : 0.0f;
  }
  int64_t klim[RPW];
  float lse[RPW], Dr[RPW], acc[RPW][NC];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t R = r0 + warp * RPW + rr, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const bool ok = i < p.tq;
    klim[rr] = ok ? i + p.q_offset : -1;
    lse[rr] = ok ? p.lse[i * p.nh + h] : 0.0f;
    Dr[rr] = ok ? p.D[i * p.nh + h] : 0.0f;
#pragma unroll
    for (int t = 0; t < NC; ++t) acc[rr][t] = 0.0f;
  }
  const int64_t i_last = min(p.tq - 1, (r0 + BR - 1) / p.group);
  const int64_t kend = max(int64_t{0}, min(p.tk, i_last + p.q_offset + 1));
  // From the first key of the block's first row (the window's lower bound; 0 without one).
  const int64_t kbeg = first_key(r0 / p.group + p.q_offset, p.window);

  for (int64_t j0 = kbeg; j0 < kend; j0 += kTile) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * DP; idx += kThreads) {
      const int jj = idx / DP, c = idx % DP;
      const int64_t j = j0 + jj;
      const bool ok = j < kend && c < p.d;
      const int64_t off = (j * p.nkv + g) * p.d + c;
      Ks[jj * KS + c] = ok ? to_f32(k[off]) : 0.0f;
      Vs[jj * KS + c] = ok ? to_f32(v[off]) : 0.0f;
    }
    __syncthreads();
    const int64_t j = j0 + lane;
    float sc[RPW], dp[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) sc[rr] = dp[rr] = 0.0f;
    const float* kr = Ks + lane * KS;
    const float* vr = Vs + lane * KS;
    const float* qw = Qs + warp * RPW * DP;
    const float* dow = dOs + warp * RPW * DP;
#pragma unroll 4
    for (int c = 0; c < DP; c += 4) {
#pragma unroll
      for (int rr = 0; rr < RPW; ++rr) {
        sc[rr] += dot4(qw + rr * DP + c, kr + c);
        dp[rr] += dot4(dow + rr * DP + c, vr + c);
      }
    }
    float ds[RPW];  // dS of this lane's key for each row
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const bool ok = j < kend && attends(j, klim[rr], p.window);
      ds[rr] = ok ? expf(sc[rr] * p.scale - lse[rr]) * (dp[rr] - Dr[rr]) : 0.0f;
    }
#pragma unroll 4
    for (int jj = 0; jj < kTile; ++jj) {
      float dsj[RPW];
#pragma unroll
      for (int rr = 0; rr < RPW; ++rr) dsj[rr] = __shfl_sync(0xffffffffu, ds[rr], jj);
      const float* kj = Ks + jj * KS;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int c = lane + 32 * t;
        if (c < DP) {
          const float kc = kj[c];
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) acc[rr][t] += dsj[rr] * kc;
        }
      }
    }
  }

  T* dq = static_cast<T*>(p.dq);
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t R = r0 + warp * RPW + rr, i = R / p.group;
    if (i >= p.tq) continue;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const int64_t row = i * p.nh + h;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int c = lane + 32 * t;
      if (c < p.d) dq[row * p.d + c] = from_f32<T>(acc[rr][t] * p.scale);
    }
  }
}

/// dk_j += scale sum_i dS_ij q_i, dv_j += sum_i P_ij dout_i for kWarps * KPW keys of one kv head,
/// looping over the tiles of packed query rows that attend them.
template <int DP, typename T, typename G, int KPW>
__global__ void __launch_bounds__(kThreads) attn_bwd_dkdv_kernel(BwdParams p) {
  constexpr int BK = kWarps * KPW, NC = (DP + 31) / 32;
  constexpr int QS = padded<DP>();
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [BK][DP]
  float* Vs = Ks + BK * DP;                     // [BK][DP]
  float* Qs = Vs + BK * DP;                     // [kTile][QS]
  float* dOs = Qs + kTile * QS;                 // [kTile][QS]
  const T* q = static_cast<const T*>(p.q);
  const T* dout = static_cast<const T*>(p.dout);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int g = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * BK;

  for (int idx = threadIdx.x; idx < BK * DP; idx += kThreads) {
    const int jj = idx / DP, c = idx % DP;
    const int64_t j = j0 + jj;
    const bool ok = j < p.tk && c < p.d;
    const int64_t off = (j * p.nkv + g) * p.d + c;
    Ks[idx] = ok ? to_f32(k[off]) : 0.0f;
    Vs[idx] = ok ? to_f32(v[off]) : 0.0f;
  }
  float dk[KPW][NC], dv[KPW][NC];
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk)
#pragma unroll
    for (int t = 0; t < NC; ++t) dk[kk][t] = dv[kk][t] = 0.0f;

  // Query row i attends key j iff i >= j - q_offset: the first row that sees any key of the block.
  const int64_t i_start = max(int64_t{0}, j0 - p.q_offset);
  // ... and the row after the last one that attends any (under a window).
  const int64_t rows = rows_end(min(p.tk - 1, j0 + BK - 1), p.q_offset, p.window, p.tq) * p.group;
  for (int64_t R0 = i_start * p.group; R0 < rows; R0 += kTile) {
    __syncthreads();  // Ks/Vs written (first tile), or the previous Qs/dOs used up
    for (int idx = threadIdx.x; idx < kTile * DP; idx += kThreads) {
      const int r = idx / DP, c = idx % DP;
      const int64_t R = R0 + r, i = R / p.group;
      const int h = g * p.group + static_cast<int>(R % p.group);
      const bool ok = i < p.tq && c < p.d;
      const int64_t off = (i * p.nh + h) * p.d + c;
      Qs[r * QS + c] = ok ? to_f32(q[off]) : 0.0f;
      dOs[r * QS + c] = ok ? to_f32(dout[off]) : 0.0f;
    }
    __syncthreads();
    const int64_t R = R0 + lane, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const bool row_ok = i < p.tq;
    const int64_t klim = row_ok ? i + p.q_offset : -1;
    const float lse = row_ok ? p.lse[i * p.nh + h] : 0.0f;
    const float Dr = row_ok ? p.D[i * p.nh + h] : 0.0f;
    float pk[KPW], ds[KPW];
#pragma unroll
    for (int kk = 0; kk < KPW; ++kk) pk[kk] = ds[kk] = 0.0f;
    const float* qr = Qs + lane * QS;
    const float* dor = dOs + lane * QS;
    const float* kw = Ks + warp * KPW * DP;
    const float* vw = Vs + warp * KPW * DP;
#pragma unroll 2
    for (int c = 0; c < DP; c += 4) {
#pragma unroll
      for (int kk = 0; kk < KPW; ++kk) {
        pk[kk] += dot4(qr + c, kw + kk * DP + c);   // the score, for now
        ds[kk] += dot4(dor + c, vw + kk * DP + c);  // dout . v, for now
      }
    }
#pragma unroll
    for (int kk = 0; kk < KPW; ++kk) {
      const int64_t j = j0 + warp * KPW + kk;
      const bool ok = j < p.tk && attends(j, klim, p.window);
      const float pij = ok ? expf(pk[kk] * p.scale - lse) : 0.0f;
      ds[kk] = pij * (ds[kk] - Dr);
      pk[kk] = pij;
    }
#pragma unroll 2
    for (int r = 0; r < kTile; ++r) {
      float qc[NC], doc[NC];
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int c = lane + 32 * t;
        qc[t] = c < DP ? Qs[r * QS + c] : 0.0f;
        doc[t] = c < DP ? dOs[r * QS + c] : 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < KPW; ++kk) {
        const float pr = __shfl_sync(0xffffffffu, pk[kk], r);
        const float dsr = __shfl_sync(0xffffffffu, ds[kk], r);
#pragma unroll
        for (int t = 0; t < NC; ++t) {
          dv[kk][t] += pr * doc[t];
          dk[kk][t] += dsr * qc[t];
        }
      }
    }
  }

  G* gk = static_cast<G*>(p.dk);
  G* gv = static_cast<G*>(p.dv);
#pragma unroll
  for (int kk = 0; kk < KPW; ++kk) {
    const int64_t j = j0 + warp * KPW + kk;
    if (j >= p.tk) continue;
#pragma unroll
    for (int t = 0; t < NC; ++t) {
      const int c = lane + 32 * t;
      if (c >= p.d) continue;
      const int64_t off = (j * p.nkv + g) * p.d + c;
      gk[off] = from_f32<G>(to_f32(gk[off]) + p.scale * dk[kk][t]);
      gv[off] = from_f32<G>(to_f32(gv[off]) + dv[kk][t]);
    }
  }
}

template <typename T, typename G>
struct Backward {
  BwdParams p;
  const char* op;

  template <int DP>
  void run() {
    if constexpr (std::is_same_v<T, bf16_t> && (DP == 64 || DP == 128 || DP == 256)) {
      // The tensor-core passes read whole 16-byte chunks of rows of exactly 64, 128 or 192 values (192: MLA's
      // query/key head, in the DP = 256 bucket of the SIMT kernels).
      constexpr int TD = DP == 256 ? 192 : DP;
      auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
      if (p.d == TD && !few_rows(p.tq * p.group) && aligned(p.q) && aligned(p.k) && aligned(p.v) &&
          aligned(p.dout) && aligned(p.dq) && aligned(p.dk) && aligned(p.dv)) {
        if (wgmma_chosen(settings().attention_backward_kernel)) {  // at 192: the MLA draft's padded heads
          launch_bwd_wgmma<TD, G>(p);
          return;
        }
        if constexpr (TD != 192) {
          if (one_pass_chosen(settings().attention_backward_kernel) && smem_fits(bwd_fused_smem<TD>())) {
            launch_bwd_fused_tc<TD, G>(p);
            return;
          }
        }
        if (p.tk > 0) launch_bwd_dkdv_tc<TD, G>(p);
        launch_bwd_dq_tc<TD>(p);
        return;
      }
    }
    // At DP 256 blocks of 8 keys or rows per warp take 129 KiB of shared memory: on a GPU of 99 KiB per block
    // (sm_86, sm_89, sm_120) they hold 4.
    if constexpr (DP == 256) {
      if (!smem_fits(simt_smem<DP>(kWarps * kKpw))) {
        simt<DP, kKpw / 2, 4>();
        return;
      }
    }
    simt<DP, kKpw, 8>();
  }

  /// The SIMT passes: dk/dv with KPW keys per warp, dq with RPW rows per warp (1 for few rows).
  template <int DP, int KPW, int RPW>
  void simt() {
    if (p.tk > 0) dkdv<DP, KPW>();
    if (few_rows(p.tq * p.group))
      dq<DP, 1>();
    else
      dq<DP, RPW>();
  }

  /// Shared memory of both SIMT passes: a block's `rows` rows (or keys) of two tensors and two streamed tiles.
  template <int DP>
  static constexpr size_t simt_smem(int rows) {
    return sizeof(float) * (2 * rows * DP + 2 * kTile * padded<DP>());
  }

  template <int DP, int KPW>
  void dkdv() {
    constexpr int BK = kWarps * KPW;
    const size_t smem = simt_smem<DP>(BK);
    auto kernel = attn_bwd_dkdv_kernel<DP, T, G, KPW>;
    allow_smem(kernel, smem);
    const int64_t blocks = (p.tk + BK - 1) / BK;
    check_grid(op, blocks, p.nkv, 1);
    kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), kThreads, smem, stream()>>>(p);
    AERIE_CUDA_LAUNCHED("attn_bwd_dkdv_kernel");
  }

  template <int DP, int RPW>
  void dq() {
    constexpr int BR = kWarps * RPW;
    const size_t smem = simt_smem<DP>(BR);
    auto kernel = attn_bwd_dq_kernel<DP, RPW, T>;
    allow_smem(kernel, smem);
    const int64_t blocks = (p.tq * p.group + BR - 1) / BR;
    check_grid(op, blocks, p.nkv, 1);
    kernel<<<dim3(static_cast<unsigned>(blocks), p.nkv), kThreads, smem, stream()>>>(p);
    AERIE_CUDA_LAUNCHED("attn_bwd_dq_kernel");
  }
};

}  // namespace

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, int64_t q_offset, float scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        int64_t window) {
  constexpr const char* op = "attention_backward (CUDA)";
  BwdParams p{};
  p.dout = dout.raw();
  p.q = q.raw();
  p.k = k.raw();
  p.v = v.raw();
  p.lse = lse.data<float>();
  p.dq = dq.raw();
  p.dk = dk.raw();
  p.dv = dv.raw();
  p.tq = q.dim(0);
  p.tk = k.dim(0);
  p.q_offset = q_offset;
  p.nh = static_cast<int>(q.dim(1));
  p.nkv = static_cast<int>(k.dim(1));
  p.group = p.nh / p.nkv;
  p.group_div = FastDivmod(p.group);
  // (+ 64: the packed rows of a last, partial 64-row tile)
  AERIE_CHECK(p.tq * p.nh + 64 < (int64_t{1} << 31), op << ": " << p.tq << " query tokens x " << p.nh
                                                         << " heads exceed the kernels' 2^31 rows of [tokens, heads]");
  p.d = static_cast<int>(q.dim(2));
  p.scale = scale;
  p.window = window;
  if (p.tq == 0 || p.nh == 0 || p.d == 0) return;
  Tensor D = Tensor::empty({p.tq, p.nh}, DType::F32, Device::CUDA);  // dout . out per row
  p.D = D.data<float>();
  const int64_t rows = p.tq * p.nh;
  if (q.dtype() == DType::BF16)
    attn_bwd_dot_kernel<bf16_t><<<blocks_for(rows, kWarps), kThreads, 0, stream()>>>(
        static_cast<const bf16_t*>(p.dout), static_cast<const bf16_t*>(out.raw()), rows, p.d, D.data<float>());
  else
    attn_bwd_dot_kernel<float><<<blocks_for(rows, kWarps), kThreads, 0, stream()>>>(
        static_cast<const float*>(p.dout), static_cast<const float*>(out.raw()), rows, p.d, D.data<float>());
  AERIE_CUDA_LAUNCHED("attn_bwd_dot_kernel");
  if (q.dtype() == DType::F32) {
    Backward<float, float> b{p, op};
    by_head_dim_forward(p.d, op, b);
  } else if (dk.dtype() == DType::F32) {
    Backward<bf16_t, float> b{p, op};
    by_head_dim_forward(p.d, op, b);
  } else {
    Backward<bf16_t, bf16_t> b{p, op};
    by_head_dim_forward(p.d, op, b);
  }
}

}  // namespace aerie::cuda
