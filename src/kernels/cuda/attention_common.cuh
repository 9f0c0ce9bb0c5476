// Internal to the CUDA attention kernels (attention.cu, attention_backward.cu, attention_merge.cu):
// block shape constants and the launch helpers they share.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "core/settings.h"
#include "kernels/cuda/wgmma.cuh"

namespace aerie::cuda::attn {

using bf16_t = __nv_bfloat16;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 32;     // keys per tile (forward, dq), query rows per tile (dk/dv)
/// Row stride (floats) of the shared-memory tiles that a lane reads along a row: DP + 4 keeps the rows
/// 16-byte aligned for float4 loads, and the 8 lanes of each float4 phase on distinct banks.
template <int DP>
__host__ __device__ constexpr int padded() { return DP + 4; }

/// a . b over 4 floats (16-byte aligned shared memory).
__device__ __forceinline__ float dot4(const float* a, const float* b) {
  const float4 x = *reinterpret_cast<const float4*>(a), y = *reinterpret_cast<const float4*>(b);
  return x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
}

/// Whether an attention op takes its wgmma kernel (attention_wgmma.cu): an sm_90a GPU, unless its setting
/// (core/settings.h: AERIE_ATTENTION_FORWARD_KERNEL / _BACKWARD_KERNEL) says "mma", "mma64", "fa2", "mma2" or
/// "fused64" ("wgmma" or "": auto).
inline bool wgmma_chosen(const std::string& setting) {
  return setting != "mma" && setting != "mma64" && setting != "fa2" && setting != "mma2" && setting != "fused64" &&
         wgmma_device();
}

/// Whether the backward's mma.sync kernels at head dims 64 and 128 are the one-pass kernel (attention_backward_fused.cu)
/// rather than the two passes (attention_backward_tc.cu): unless the setting says "mma2" or "mma64".
inline bool one_pass_chosen(const std::string& setting) { return setting != "mma2" && setting != "mma64"; }

/// Whether the setting says "mma64": the mma.sync kernels' 4-warp, 64-wide shape also where the SM's size would
/// take the 8-warp or 32-key one.
inline bool mma64_forced(const std::string& setting) { return setting == "mma64"; }

/// Whether the setting says "wgmma" explicitly: the wgmma kernel also where the automatic choice would not take
/// it (the forward at head dim 192 / 128 with few keys), for tests and benchmarks.
inline bool wgmma_forced(const std::string& setting) { return setting == "wgmma"; }

inline int sm_count() {
  int dev = 0, n = 0;
  AERIE_CUDA_CHECK(cudaGetDevice(&dev), "attention: cudaGetDevice");
  AERIE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "attention: SM count");
  return n;
}

/// Allows `bytes` of dynamic shared memory for `kernel` (needed above the default 48 KiB); throws aerie::Error
/// when the GPU, or the one AERIE_CUDA_EMULATE names, has less (check_smem). Under emulation the SM's shared
/// memory is capped at the emulated GPU's too (plan_occupancy).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  check_smem("attention", bytes);
  plan_occupancy(kernel);
  if (bytes > 48 * 1024)
    AERIE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     "attention: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " << bytes << ")");
}

/// The forward's dispatch: by_head_dim, and DP = 256 for 128 < d <= 256 (MLA's query/key head of 192,
/// nope 128 + rope 64, with the value heads zero-padded to it). The backward takes it too (the MLA draft's
/// TTT): bf16 at exactly 192 in the tensor-core passes, else the SIMT kernels.
template <typename F>
void by_head_dim_forward(int64_t d, const char* op, F& f);

/// Calls f.template run<DP>() with DP the smallest of 8, 16, 32, 64, 128 that holds the head dim d.
template <typename F>
void by_head_dim(int64_t d, const char* op, F& f) {
  if (d <= 8)
    f.template run<8>();
  else if (d <= 16)
    f.template run<16>();
  else if (d <= 32)
    f.template run<32>();
  else if (d <= 64)
    f.template run<64>();
  else if (d <= 128)
    f.template run<128>();
  else
    AERIE_THROW(op << ": head dim " << d << " is not supported by the CUDA backend (at most 128)");
}

template <typename F>
void by_head_dim_forward(int64_t d, const char* op, F& f) {
  if (d > 128 && d <= 256) {
    f.template run<256>();
    return;
  }
  AERIE_CHECK(d <= 256, op << ": head dim " << d << " is not supported by the CUDA forward (at most 256)");
  by_head_dim(d, op, f);
}

/// Sliding window (window > 0; 0: none, kernels/attention.h): a row whose last attended key is klim =
/// i + q_offset attends key j iff klim - window < j <= klim (klim < 0: a padding row, no key).
__host__ __device__ __forceinline__ bool attends(int64_t j, int64_t klim, int64_t window) {
  return j <= klim && (window <= 0 || j > klim - window);
}
/// The first key that a row whose last key is klim attends under the window (0 without one).
__host__ __device__ __forceinline__ int64_t first_key(int64_t klim, int64_t window) {
  return window > 0 && klim - window + 1 > 0 ? klim - window + 1 : 0;
}
/// One past the last query row that attends key j: rows i with j - q_offset <= i < j - q_offset + window
/// (tq without a window), clipped to [0, tq].
__host__ __device__ __forceinline__ int64_t rows_end(int64_t j, int64_t q_offset, int64_t window, int64_t tq) {
  if (window <= 0) return tq;
  const int64_t e = j - q_offset + window;
  return e < 0 ? 0 : e > tq ? tq : e;
}

/// Rows per warp of the forward / dq kernels: 1 when a kv head has few packed query rows (decoding: a
/// block of 4 rows then holds one token's group of heads), else 8.
inline bool few_rows(int64_t packed_rows) { return packed_rows <= 64; }

inline void check_grid(const char* op, int64_t x, int64_t y, int64_t z) {
  AERIE_CHECK(x >= 1 && x <= 0x7fffffff && y >= 1 && y <= 65535 && z >= 1 && z <= 65535,
              op << ": grid " << x << " x " << y << " x " << z << " is out of CUDA's range");
}

// ------------------------------------------------------------------------------------------------
// The forward's parameters, shared by the SIMT kernel (attention.cu) and the tensor-core one
// (attention_tc.cu).

struct FwdParams {
  const void* q;  // [rows, nh, d] T
  const void* k;  // [rows_k, nkv, d] T
  const void* v;
  void* out;              // [rows, nh, d] T
  float* lse;             // [rows, nh] or null
  float* part_out;        // key splits > 1: [splits, tq, nh, d] fp32 (normalised per split), else null
  float* part_lse;        // [splits, tq, nh]
  const int32_t* cu;      // varlen: cu_seqlens [nseq + 1] (null: one sequence)
  int64_t nseq;
  int64_t tq, tk, q_offset;  // one sequence; varlen: tq = tk = N (total rows), q_offset 0
  int nh, nkv, group, d;
  int dv;  // v's and out's head dim (<= d; the forward)
  float scale;
  int64_t split_len;  // keys per split
  int64_t window;     // sliding window (0: none; not with cu)
};

/// The sequence a block works on: its first row in q/k/v/out/lse, its lengths, and the block's query
/// tile inside it.
struct Seq {
  int64_t row0, tq, tk, q_offset, tile;
};

/// Varlen: walks the samples, each taking ceil(len * group / BR) tiles, to find block b's one.
/// Boundaries are clamped into [0, N]. False when the block has no tile (the grid is an upper bound).
/// b: the block's index along the tiles (blockIdx.x in the SIMT and mma.sync kernels).
template <int BR>
__device__ bool find_seq(const FwdParams& p, Seq& s, int64_t b) {
  if (p.cu == nullptr) {
    s = Seq{0, p.tq, p.tk, p.q_offset, b};
    return true;
  }
  for (int64_t n = 0; n < p.nseq; ++n) {
    const int64_t c0 = min(max(static_cast<int64_t>(p.cu[n]), int64_t{0}), p.tq);
    const int64_t c1 = min(max(static_cast<int64_t>(p.cu[n + 1]), c0), p.tq);
    const int64_t tiles = ((c1 - c0) * p.group + BR - 1) / BR;
    if (b < tiles) {
      s = Seq{c0, c1 - c0, c1 - c0, 0, b};
      return true;
    }
    b -= tiles;
  }
  return false;
}

/// Packed query rows per block of the tensor-core forward (4 warps x 16 rows).
constexpr int kTcBlockRows = 64;
/// The BF16 tensor-core forward (attention_tc.cu, head dim d == DP = 64 or 128, q/k/v 16-byte aligned,
/// out 4-byte aligned): grid tiles x nkv x splits, with the
/// same row packing, key splits and outputs as the SIMT attn_fwd_kernel.
template <int DP>
void launch_fwd_tc(const FwdParams& p, int64_t tiles, int64_t splits);
/// Packed query rows per block of launch_fwd_tc<DP> / launch_fwd_tc_dv<DP, DV> for these parameters and settings:
/// kTcBlockRows, or 128 where the 128-row shape runs (head dims 64, 128 and 192 / 128).
template <int DP, int DV = DP>
int fwd_tc_block_rows(const FwdParams& p);
/// The same with a value head of DV < DP columns (MLA: 192 / 128).
template <int DP, int DV>
void launch_fwd_tc_dv(const FwdParams& p, int64_t tiles, int64_t splits);

// ------------------------------------------------------------------------------------------------
// The backward's parameters, shared by the SIMT kernels (attention_backward.cu) and the tensor-core
// ones (attention_backward_tc.cu).

/// n / d and n % d for 0 <= n < 2^31 and a divisor d >= 1 fixed at launch, by one multiply-high and a shift
/// (Granlund & Montgomery 1994, "Division by invariant integers using multiplication", section 4; CUTLASS's
/// FastDivmod takes the same constants): where a kernel's hot loop maps packed rows to (token, head), the int64
/// division it replaces costs tens of instructions.
struct FastDivmod {
  int d = 1;
  uint32_t mul = 0, shr = 0;
  FastDivmod() = default;
  /// Throws nothing: d < 1 is the caller's bug (taken as 1).
  explicit FastDivmod(int divisor) : d(std::max(divisor, 1)) {
    if (d == 1) return;
    int l = 0;  // ceil(log2 d)
    while ((1u << l) < static_cast<uint32_t>(d)) ++l;
    const int p = 31 + l;
    mul = static_cast<uint32_t>(((uint64_t{1} << p) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    shr = static_cast<uint32_t>(p - 32);
  }
  __device__ __forceinline__ int div(int n) const {
    return d == 1 ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), mul) >> shr);
  }
  /// q = n / d, r = n % d.
  __device__ __forceinline__ void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * d;
  }
};

struct BwdParams {
  const void* dout;  // [tq, nh, d] T
  const void* q;
  const void* k;  // [tk, nkv, d] T
  const void* v;
  const float* lse;  // [tq, nh]
  const float* D;    // [tq, nh]: dout . out
  void* dq;          // [tq, nh, d] T, overwritten
  void* dk;          // [tk, nkv, d] G, added to
  void* dv;
  int64_t tq, tk, q_offset;
  int nh, nkv, group, d;
  float scale;
  int64_t window;  // sliding window (0: none)
  FastDivmod group_div;  // by group: packed row R (< tq * group <= tq * nh < 2^31) -> token R / group, head R % group
};

/// The BF16 tensor-core backward passes (attention_backward_tc.cu, head dim d == DP = 64, 128 or 192, every
/// tensor 16-byte aligned): dq (overwritten, bf16) and dk/dv (added to, G = float or bf16).
template <int DP>
void launch_bwd_dq_tc(const BwdParams& p);
template <int DP, typename G>
void launch_bwd_dkdv_tc(const BwdParams& p);
/// The one-pass BF16 tensor-core backward (attention_backward_fused.cu, head dim d == DP = 64 or 128, every tensor
/// 16-byte aligned): dq overwritten (through an fp32 accumulator of tq x nh x DP it allocates), dk / dv added to;
/// bwd_fused_smem: its shared memory per block (bytes).
template <int DP, typename G>
void launch_bwd_fused_tc(const BwdParams& p);
template <int DP>
size_t bwd_fused_smem();
/// The forward with wgmma (attention_wgmma.cu: sm_90a, query/key head D and value head DV exactly (64, 64),
/// (128, 128), MLA's (192, 128) or the MLA draft's padded (192, 192), bf16, 16-byte aligned; grid nkv x tiles x splits with tiles of 128 packed
/// rows; the same contract as launch_fwd_tc).
template <int D, int DV>
void launch_fwd_wgmma(const FwdParams& p, int64_t tiles, int64_t splits);
/// Both backward passes with wgmma (attention_wgmma.cu: sm_90a, head dim d exactly D = 64, 128 or 192, the
/// same inputs and outputs as the two tensor-core passes above; at 192 the dk/dv pass runs as two launches,
/// dV then dK).
template <int D, typename G>
void launch_bwd_wgmma(const BwdParams& p);

}  // namespace aerie::cuda::attn
