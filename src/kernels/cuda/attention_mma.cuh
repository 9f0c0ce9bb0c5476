// Internal to the tensor-core attention kernels (attention_tc.cu forward, attention_backward_tc.cu):
// PTX wrappers for cp.async, ldmatrix and mma.sync m16n8k16 (bf16 in, fp32 accumulate), the swizzled
// shared-memory tile layout and the reductions over the 4 lanes of an mma accumulator row.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane = 4 * quad + tq4:
//   A 16x16 (4 regs of 2 bf16): a0 (row quad, cols 2tq4, +1), a1 (row quad+8, same cols),
//                               a2 (row quad, cols 2tq4+8, +9), a3 (row quad+8, cols 2tq4+8, +9);
//   B 16x8  (2 regs):           b0 (rows 2tq4, +1, col quad), b1 (rows 2tq4+8, +9, col quad);
//   C 16x8  (4 fp32):           c0, c1 (row quad, cols 2tq4, +1), c2, c3 (row quad+8, same cols).
// So the C of two neighbouring n8 blocks, rounded to bf16, is the A of one k16 step (P in P V).
// ldmatrix.x4 reads four 8x8 bf16 matrices (lanes 8m .. 8m+7 give the row addresses of matrix m):
//   - A from a row-major [rows][k] tile: lane -> row (lane & 15), k chunk (lane >> 4);
//   - B from a [n][k] row-major tile (K in Q K^T): non-transposed;
//   - B from a [k][n] row-major tile (V in P V): .trans.
#pragma once
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace aerie::cuda::attn {

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][DP] bf16 tile.
template <int DP>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * DP * 2 + ((chunk ^ (row & 7)) << 4));
}

/// swz<W>(row, c + dc) from lane_addr = tile + swz<W>(row, c), for a lane's chunk c < 2 and an even dc: the swizzle
/// XORs only a chunk's low 3 bits and c + dc = c | dc, so the step is an XOR of dc's low 3 bits and an add of the
/// rest (both constants where dc is). Needs tile + row * 2W with bits 4-6 clear: the tiles 128-byte aligned (every
/// tile of the kernels is a multiple of 128 bytes from the dynamic shared memory's __align__(128) base) and W a
/// multiple of 64.
template <int W>
__device__ __forceinline__ uint32_t swz_step(uint32_t lane_addr, int dc) {
  static_assert(W % 64 == 0);
  return (lane_addr ^ static_cast<uint32_t>((dc & 7) << 4)) + static_cast<uint32_t>((dc & ~7) << 4);
}

/// 16 bytes global -> shared, asynchronously; `valid` false writes 16 zero bytes (reads nothing).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
/// 4 bytes global -> shared, asynchronously (through L1: .ca, the only form below 16 bytes); `valid` false writes
/// 4 zero bytes.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// c += a b: m16n8k16, A row-major bf16 (4 registers), B column-major bf16 (2), C fp32 (4).
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to bf16 in one register, `lo` in the low half (the smaller column).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

constexpr float kLog2e = 1.4426950408889634f;

/// 2^x with the MUFU's approximation (ex2.approx.ftz, relative error ~2^-22: below the bf16 rounding of P
/// that follows; -inf gives 0); exp2f without fast-math adds a denormal fix-up around it (four instructions and a
/// branch per value in the kernels' softmax).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Loads a [ROWS][DP] tile of packed query rows R0 .. R0+ROWS-1 (row R = i * group + head in group of kv head
/// g; R < 2^31, as attention_backward checks) of a [tq, nh, DP] tensor into swizzled shared memory; rows past tq
/// are zeros. All threads of the block.
template <int DP, int ROWS>
__device__ __forceinline__ void load_rows(uint32_t dst, const bf16_t* src, const BwdParams& p, int g, int64_t R0) {
  constexpr int NC = DP / 8;
  for (int idx = threadIdx.x; idx < ROWS * NC; idx += blockDim.x) {
    const int r = idx / NC, c = idx % NC;
    int i, hg;
    p.group_div.divmod(static_cast<int>(R0 + r), i, hg);
    const bool ok = i < p.tq;
    cp_async16(dst + swz<DP>(r, c), ok ? src + (static_cast<int64_t>(i) * p.nh + g * p.group + hg) * DP + c * 8 : src,
               ok);
  }
}

/// The backward's values of packed query row R of kv head g: lse * log2(e), D and its last attended key i +
/// q_offset; 0, 0 and -1 for a row past tq or without keys (lse -inf), which has no gradient.
__device__ __forceinline__ void row_values(const BwdParams& p, int g, int64_t R, float& lse2, float& D, int& ilim) {
  int i, hg;
  p.group_div.divmod(static_cast<int>(R), i, hg);
  const int64_t at = static_cast<int64_t>(i) * p.nh + g * p.group + hg;
  const float lse = i < p.tq ? p.lse[at] : -INFINITY;
  const bool ok = i < p.tq && lse != -INFINITY;
  lse2 = ok ? lse * kLog2e : 0.0f;
  D = ok ? p.D[at] : 0.0f;
  ilim = ok ? static_cast<int>(i + p.q_offset) : -1;
}

/// The kernels that stream K/V (or Q/dout) tiles through NBUF shared buffers (2: double-buffered; 1: where two do
/// not fit the block's shared memory): the streamed tile t's buffer, loading it first where there is one buffer (the previous iteration's last
/// sync freed it), or tile t + 1 into the other buffer where there are two; then waits for tile t and syncs.
template <int NBUF, typename Load>
__device__ __forceinline__ int next_tile(int t, int ntiles, Load&& load) {
  const int buf = NBUF == 2 ? t & 1 : 0;
  if constexpr (NBUF == 2) {
    if (t + 1 < ntiles) load(t + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    if (t > 0) load(t, 0);
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  return buf;
}

}  // namespace aerie::cuda::attn
