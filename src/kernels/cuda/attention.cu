// CUDA causal GQA attention forward (contracts in kernels/attention.h; launch shapes in cuda/attention.h).
// Flash-style SIMT kernel with fp32 arithmetic and accumulation, after Dao et al. 2022/2023
// (FlashAttention, FlashAttention-2): no Tq x Tk matrix in memory. BF16 prefill-sized work with head dim
// 64, 128 or 192 goes to the tensor-core kernel of attention_tc.cu instead, on an sm_90a GPU with head dims
// 64, 128 or MLA's 192 / 128 to the wgmma kernel of attention_wgmma.cu (AERIE_ATTENTION_FORWARD_KERNEL=mma
// keeps attention_tc.cu's).
//
// Rows of a block: the query rows of ONE kv head g are packed as R = i * group + (h - g * group), so a
// block's rows share the key/value tiles of their kv head (decoding with GQA fills a block from one
// token). Forward and dq pass: each warp owns RPW packed rows, lane j owns key j0 + j of the current
// 32-key tile (its score), and the lanes split the head dim for the output accumulation. dk/dv pass
// (attention_backward.cu): each warp owns KPW keys, lane r owns query row R0 + r of a 32-row tile. The
// head dim is padded to DP in {8, 16, 32, 64, 128} with zeros (so any d <= 128 works; the forward also
// DP = 256, for MLA's 192). Shared-memory
// tiles read per lane along a row are padded to DP + 4 floats (float4 loads, no bank conflicts).
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"

namespace aerie::cuda {
namespace {

using namespace attn;

template <int DP, int RPW, typename T>
__global__ void __launch_bounds__(kThreads) attn_fwd_kernel(FwdParams p) {
  constexpr int BR = kWarps * RPW, NC = (DP + 31) / 32;
  constexpr int KS = padded<DP>();
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [BR][DP]
  float* Ks = Qs + BR * DP;                     // [kTile][KS]
  float* Vs = Ks + kTile * KS;                  // [kTile][DP]
  Seq s;
  if (!find_seq<BR>(p, s, blockIdx.x)) return;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int g = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = s.tile * BR;  // first packed row of the block

  for (int idx = threadIdx.x; idx < BR * DP; idx += kThreads) {
    const int r = idx / DP, c = idx % DP;
    const int64_t R = r0 + r, i = R / p.group;
    const int h = g * p.group + static_cast<int>(R % p.group);
    Qs[idx] = i < s.tq && c < p.d ? to_f32(q[((s.row0 + i) * p.nh + h) * p.d + c]) : 0.0f;
  }
  int64_t klim[RPW];  // row attends key j iff attends(j, klim, window) (-1: padding row)
  float m[RPW], l[RPW], acc[RPW][NC];
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t i = (r0 + warp * RPW + rr) / p.group;
    klim[rr] = i < s.tq ? i + s.q_offset : -1;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int t = 0; t < NC; ++t) acc[rr][t] = 0.0f;
  }
  const int64_t i_last = min(s.tq - 1, (r0 + BR - 1) / p.group);
  const int64_t kend_block = max(int64_t{0}, min(s.tk, i_last + s.q_offset + 1));
  // The split's keys, from the first key of the block's first row (the window's lower bound).
  const int64_t kbeg = max(split * p.split_len, first_key(r0 / p.group + s.q_offset, p.window));
  const int64_t kend = min(kend_block, split * p.split_len + p.split_len);

  for (int64_t j0 = kbeg; j0 < kend; j0 += kTile) {
    __syncthreads();  // the previous tile is used up (and Qs is written before the first)
    for (int idx = threadIdx.x; idx < kTile * DP; idx += kThreads) {
      const int jj = idx / DP, c = idx % DP;
      const int64_t j = j0 + jj;
      const bool ok = j < kend && c < p.d, okv = j < kend && c < p.dv;
      const int64_t kv = (s.row0 + j) * p.nkv + g;
      Ks[jj * KS + c] = ok ? to_f32(k[kv * p.d + c]) : 0.0f;
      Vs[jj * DP + c] = okv ? to_f32(v[kv * p.dv + c]) : 0.0f;
    }
    __syncthreads();
    const int64_t j = j0 + lane;
    float sc[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) sc[rr] = 0.0f;
    const float* kr = Ks + lane * KS;
    const float* qw = Qs + warp * RPW * DP;
#pragma unroll 4
    for (int c = 0; c < DP; c += 4) {
#pragma unroll
      for (int rr = 0; rr < RPW; ++rr) sc[rr] += dot4(qw + rr * DP + c, kr + c);
    }
    float pr[RPW];  // this lane's key's weight for each row, relative to the row's running max
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
      const bool ok = j < kend && attends(j, klim[rr], p.window);
      const float sv = ok ? sc[rr] * p.scale : -INFINITY;
      const float mnew = fmaxf(m[rr], warp_max(sv));
      pr[rr] = ok ? expf(sv - mnew) : 0.0f;
      const float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - mnew);  // l, acc are 0 while m is -inf
      l[rr] = l[rr] * corr + warp_sum(pr[rr]);
#pragma unroll
      for (int t = 0; t < NC; ++t) acc[rr][t] *= corr;
      m[rr] = mnew;
    }
#pragma unroll 4
    for (int jj = 0; jj < kTile; ++jj) {
      float pj[RPW];
#pragma unroll
      for (int rr = 0; rr < RPW; ++rr) pj[rr] = __shfl_sync(0xffffffffu, pr[rr], jj);
      const float* vr = Vs + jj * DP;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int c = lane + 32 * t;
        if (c < DP) {
          const float vv = vr[c];
#pragma unroll
          for (int rr = 0; rr < RPW; ++rr) acc[rr][t] += pj[rr] * vv;
        }
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int rr = 0; rr < RPW; ++rr) {
    const int64_t R = r0 + warp * RPW + rr, i = R / p.group;
    if (i >= s.tq) continue;
    const int h = g * p.group + static_cast<int>(R % p.group);
    const int64_t row = (s.row0 + i) * p.nh + h;
    const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
    const float lse = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    if (p.part_out) {
      const int64_t prow = split * p.tq * p.nh + row;
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int c = lane + 32 * t;
        if (c < p.dv) p.part_out[prow * p.dv + c] = acc[rr][t] * inv;
      }
      if (lane == 0) p.part_lse[prow] = lse;
    } else {
#pragma unroll
      for (int t = 0; t < NC; ++t) {
        const int c = lane + 32 * t;
        if (c < p.dv) out[row * p.dv + c] = from_f32<T>(acc[rr][t] * inv);
      }
      if (lane == 0 && p.lse) p.lse[row] = lse;
    }
  }
}

/// Merges the key splits of the forward: lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) out_s.
/// One warp per (row, head); rows = tq * nh.
template <typename T>
__global__ void __launch_bounds__(kThreads) attn_combine_kernel(const float* part_out, const float* part_lse,
                                                                 int splits, int64_t rows, int d, T* out,
                                                                 float* lse) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[s * rows + row]);
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += mx == -INFINITY ? 0.0f : expf(part_lse[s * rows + row] - mx);
  for (int c = lane; c < d; c += 32) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float w = mx == -INFINITY ? 0.0f : expf(part_lse[s * rows + row] - mx);
      o += w * part_out[(s * rows + row) * d + c];
    }
    out[row * d + c] = from_f32<T>(sum > 0.0f ? o / sum : 0.0f);
  }
  if (lane == 0 && lse) lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

template <typename T>
struct Forward {
  FwdParams p;
  bool varlen;
  const char* op;

  template <int DP>
  void run() {
    if (few_rows(p.tq * p.group)) {
      go<DP, 1>();
      return;
    }
    if constexpr (std::is_same_v<T, bf16_t> && (DP == 64 || DP == 128 || DP == 256)) {
      // The tensor-core kernel reads whole 16-byte chunks of rows of exactly 64, 128 or 192 values (192:
      // MLA's qk head dim, in the DP = 256 bucket of the SIMT kernel).
      constexpr int TD = DP == 256 ? 192 : DP;
      auto aligned = [](const void* ptr, uintptr_t a) { return reinterpret_cast<uintptr_t>(ptr) % a == 0; };
      const bool ok = p.d == TD && aligned(p.q, 16) && aligned(p.k, 16) && aligned(p.v, 16) && aligned(p.out, 4);
      // The wgmma kernel (head dims 64, 128 and MLA's 192 / 128); its grid holds the tiles in y (at most
      // 65535 of 128 rows). At 192 / 128 it pays only with enough keys per block: measured on an H200 (16
      // heads, causal; docs/performance.md) 0.181 against the mma.sync kernel's 0.175 ms at T 2048, 0.222
      // against 0.323 ms at T 3072, 1.28 against 1.80 ms at T 8192 (its blocks of 128 rows hold 173 KB of
      // shared memory, one per SM, and a short key range does not repay loading the 48 KB of Q). The
      // crossover lies between 2048 and 3072 keys: from 2560 it takes wgmma. AERIE_ATTENTION_FORWARD_KERNEL=wgmma
      // takes it anyway.
      // At 192 also the MLA draft's 192 / 192 (its values zero-padded to the key head), at every length: the
      // mma.sync kernel at 192 / 192 is 2.5x slower there (32 heads, T 2048: 0.412 against 0.165 ms; T 8192:
      // 4.99 against 1.97 ms; shorter samples not measured).
      constexpr int WDV = TD == 192 ? 128 : TD;
      const bool wgmma_pays =
          TD != 192 || p.dv == 192 || p.tk >= 2560 || wgmma_forced(settings().attention_forward_kernel);
      if (ok && (p.dv == WDV || p.dv == TD) && wgmma_pays && (p.tq * p.group) / (2 * kTcBlockRows) + p.nseq < 65535 &&
          wgmma_chosen(settings().attention_forward_kernel)) {
        plan_and_launch(2 * kTcBlockRows, [&](int64_t tiles, int64_t splits) {
          if (p.dv == WDV)
            launch_fwd_wgmma<TD, WDV>(p, tiles, splits);
          else
            launch_fwd_wgmma<TD, TD>(p, tiles, splits);
        });
        return;
      }
      if (ok && p.dv == TD) {
        plan_and_launch(fwd_tc_block_rows<TD>(p),
                        [&](int64_t tiles, int64_t splits) { launch_fwd_tc<TD>(p, tiles, splits); });
        return;
      }
      if constexpr (TD == 192) {
        if (ok && p.dv == 128) {  // MLA: value head 128 of a query/key head 192
          plan_and_launch(fwd_tc_block_rows<192, 128>(p),
                          [&](int64_t tiles, int64_t splits) { launch_fwd_tc_dv<192, 128>(p, tiles, splits); });
          return;
        }
      }
    }
    go<DP, 8>();
  }

  template <int DP, int RPW>
  void go() {
    constexpr int BR = kWarps * RPW;
    plan_and_launch(BR, [&](int64_t tiles, int64_t splits) {
      const size_t smem = sizeof(float) * (BR * DP + kTile * padded<DP>() + kTile * DP);
      auto kernel = attn_fwd_kernel<DP, RPW, T>;
      allow_smem(kernel, smem);
      kernel<<<dim3(static_cast<unsigned>(tiles), p.nkv, static_cast<unsigned>(splits)), kThreads, smem, stream()>>>(p);
      AERIE_CUDA_LAUNCHED("attn_fwd_kernel");
    });
  }

  /// Sizes the grid for blocks of BR packed rows, splits the keys when the grid is small, runs
  /// launch(tiles, splits) with the split outputs in p, and merges the splits.
  template <typename Launch>
  void plan_and_launch(int BR, const Launch& launch) {
    const int64_t rows = p.tq * p.group;  // packed rows per kv head (varlen: of all samples)
    const int64_t tiles = (rows + BR - 1) / BR + (varlen ? p.nseq : 0);
    // Few blocks (decoding, short prefill) against many keys: split the keys over blocks (flash-decoding)
    // with at least 4 tiles per split, then merge the splits by log-sum-exp.
    int64_t splits = 1;
    if (!varlen && p.tk >= 4 * kTile) {
      const int64_t blocks = tiles * p.nkv, target = 2 * static_cast<int64_t>(sm_count());
      if (blocks < target) splits = std::min((target + blocks - 1) / blocks, (p.tk + 4 * kTile - 1) / (4 * kTile));
    }
    p.split_len = p.tk;
    Tensor part_out, part_lse;  // freed stream-ordered after the combine kernel
    if (splits > 1) {
      p.split_len = ((p.tk + splits - 1) / splits + kTile - 1) / kTile * kTile;
      splits = (p.tk + p.split_len - 1) / p.split_len;
    }
    if (splits > 1) {
      part_out = Tensor::empty({splits, p.tq, p.nh, p.dv}, DType::F32, Device::CUDA);
      part_lse = Tensor::empty({splits, p.tq, p.nh}, DType::F32, Device::CUDA);
      p.part_out = part_out.data<float>();
      p.part_lse = part_lse.data<float>();
    }
    check_grid(op, tiles, p.nkv, splits);
    launch(tiles, splits);
    if (splits > 1) {
      const int64_t out_rows = p.tq * p.nh;
      attn_combine_kernel<T><<<blocks_for(out_rows, kWarps), kThreads, 0, stream()>>>(
          p.part_out, p.part_lse, static_cast<int>(splits), out_rows, p.dv, static_cast<T*>(p.out), p.lse);
      AERIE_CUDA_LAUNCHED("attn_combine_kernel");
    }
  }
};

FwdParams fwd_params(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale, Tensor& out,
                     Tensor* lse) {
  FwdParams p{};
  p.q = q.raw();
  p.k = k.raw();
  p.v = v.raw();
  p.out = out.raw();
  p.lse = lse ? lse->data<float>() : nullptr;
  p.tq = q.dim(0);
  p.tk = k.dim(0);
  p.q_offset = q_offset;
  p.nh = static_cast<int>(q.dim(1));
  p.nkv = static_cast<int>(k.dim(1));
  p.group = p.nh / p.nkv;
  p.d = static_cast<int>(q.dim(2));
  p.dv = static_cast<int>(v.dim(2));
  p.scale = scale;
  return p;
}

void run_forward(const FwdParams& p, bool varlen, DType dt, const char* op) {
  if (dt == DType::BF16) {
    Forward<bf16_t> f{p, varlen, op};
    by_head_dim_forward(p.d, op, f);
  } else {
    Forward<float> f{p, varlen, op};
    by_head_dim_forward(p.d, op, f);
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse, int64_t window) {
  FwdParams p = fwd_params(q, k, v, q_offset, scale, out, lse);
  p.window = window;
  if (p.tq == 0 || p.nh == 0 || p.d == 0) return;
  run_forward(p, false, q.dtype(), "attention_forward (CUDA)");
}

void attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                              float scale, Tensor& out, Tensor* lse) {
  constexpr const char* op = "attention_forward_varlen (CUDA)";
  FwdParams p = fwd_params(q, k, v, 0, scale, out, lse);
  p.cu = cu_seqlens.data<int32_t>();
  p.nseq = cu_seqlens.dim(0) - 1;
  if (p.tq == 0 || p.nh == 0 || p.d == 0) return;
  AERIE_CHECK(p.nseq >= 1, op << ": " << p.tq << " rows but no sample in cu_seqlens");
  run_forward(p, true, q.dtype(), op);
}

}  // namespace aerie::cuda
