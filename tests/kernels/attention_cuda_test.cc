// CUDA attention against the CPU reference on the same random inputs: forward (prefill, q_offset,
// decoding with the key split, rows without keys), backward (dq, dk, dv added to non-zero values), the
// packed variable-length prefill and the TTT diagonal merge, for F32 and BF16 inputs and head dims 8..128.
// BF16 cases give the CPU reference the bf16-rounded values as F32, so both sides see equal inputs.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/settings.h"
#include "kernel_test_util.h"
#include "kernels/attention.h"

namespace aerie {
namespace {

using testing::random_tensor;

/// The F32 tensor as the given dtype would hold it (bf16-rounded values, still F32).
Tensor rounded(const Tensor& f32, DType dt) { return dt == DType::F32 ? f32.clone() : f32.to(dt).to(DType::F32); }
/// The F32 tensor converted to dt on the GPU.
Tensor on_gpu(const Tensor& f32, DType dt) { return (dt == DType::F32 ? f32 : f32.to(dt)).to_device(Device::CUDA); }
/// Values with -inf (the lse of a row without keys) replaced by -1e30, so that expect_close can compare them.
std::vector<float> finite(std::vector<float> x) {
  for (auto& e : x)
    if (std::isinf(e) && e < 0) e = -1e30f;
  return x;
}

// Tolerances (style.md: |got - ref| <= atol + rtol |ref|). F32: the same fp32 formulas summed in another
// order over up to 1000 keys (tiles, online rescaling, key splits), so a few 1e-6 relative; 1e-4 absolute
// for gradients, which sum up to 1000 products with cancellation. BF16 outputs: one bf16 rounding on each
// side of equal fp32 values that differ in the last fp32 bits, i.e. up to one bf16 step (2^-8 relative).
constexpr float kF32Atol = 2e-5f, kF32Rtol = 1e-4f, kF32GradAtol = 1e-4f, kF32GradRtol = 1e-3f;
constexpr float kBf16Atol = 1e-2f, kBf16Rtol = 1e-2f;
float atol_of(DType dt, bool grad) { return dt == DType::BF16 ? kBf16Atol : grad ? kF32GradAtol : kF32Atol; }
float rtol_of(DType dt, bool grad) { return dt == DType::BF16 ? kBf16Rtol : grad ? kF32GradRtol : kF32Rtol; }

struct Case {
  int64_t tq, tk, nh, nkv, d, q_offset;
  DType dt;
  DType grad_dt;       // dk/dv dtype in the backward
  int64_t window = 0;  // sliding window (0: none)
  const char* emulate = nullptr;  // AERIE_CUDA_EMULATE for the case (core/gpu_limits.h): "sm_120" plans for 99 KiB
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = "Tq" + std::to_string(c.tq) + "_Tk" + std::to_string(c.tk) + "_nh" + std::to_string(c.nh) + "_nkv" +
                  std::to_string(c.nkv) + "_d" + std::to_string(c.d) + "_off" +
                  (c.q_offset < 0 ? "m" + std::to_string(-c.q_offset) : std::to_string(c.q_offset)) + "_" +
                  dtype_name(c.dt);
  if (c.grad_dt != c.dt) s += std::string("_grad") + dtype_name(c.grad_dt);
  if (c.window > 0) s += "_win" + std::to_string(c.window);
  if (c.emulate) s += std::string("_as_") + c.emulate;
  return s;
}

class AttentionCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  // A case with `emulate` runs as on that GPU (no wgmma, its shared memory per block); the others as the suite's
  // environment says (tools/bench/gpu_paths.sh runs the whole suite under AERIE_CUDA_EMULATE=sm_120 too).
  void SetUp() override {
    if (GetParam().emulate) env_.emplace("AERIE_CUDA_EMULATE", GetParam().emulate);
  }
  std::optional<testing::ScopedEnv> env_;
};

TEST_P(AttentionCudaTest, ForwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const Case c = GetParam();
  const float scale = 1.0f / std::sqrt(float(c.d));
  const Tensor q = rounded(random_tensor({c.tq, c.nh, c.d}, 1, -2.0f, 2.0f), c.dt);
  const Tensor k = rounded(random_tensor({c.tk, c.nkv, c.d}, 2, -2.0f, 2.0f), c.dt);
  const Tensor v = rounded(random_tensor({c.tk, c.nkv, c.d}, 3), c.dt);
  Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({c.tq, c.nh}, DType::F32);
  attention_forward(q, k, v, c.q_offset, scale, out, &lse, c.window);

  const Tensor gq = on_gpu(q, c.dt), gk = on_gpu(k, c.dt), gv = on_gpu(v, c.dt);
  if (c.d > 256) {  // beyond the CUDA kernels: refused by name
    Tensor gout = Tensor::empty(q.shape(), c.dt, Device::CUDA);
    EXPECT_THROW(attention_forward(gq, gk, gv, c.q_offset, scale, gout, nullptr), Error);
    return;
  }
  // Every BF16 tensor-core forward: the wgmma kernel (the default on an H100 / H200; elsewhere the same as "mma"),
  // the mma.sync one with 16 rows per warp ("mma") and with 32 ("fa2" at head dims 64 and 128).
  for (const char* kernel : {"wgmma", "mma", "fa2"}) {
    SCOPED_TRACE(kernel);
    testing::ScopedEnv choice("AERIE_ATTENTION_FORWARD_KERNEL", kernel);  // the caller's own comes back after
    Tensor gout = Tensor::empty(q.shape(), c.dt, Device::CUDA);
    Tensor glse = Tensor::empty({c.tq, c.nh}, DType::F32, Device::CUDA);
    attention_forward(gq, gk, gv, c.q_offset, scale, gout, &glse, c.window);
    testing::expect_close(gout.to_float_vector(), rounded(out, c.dt).to_float_vector(), atol_of(c.dt, false),
                          rtol_of(c.dt, false), "out");
    testing::expect_close(finite(glse.to_float_vector()), finite(lse.to_float_vector()), kF32Atol, kF32Rtol, "lse");
    Tensor gout2 = Tensor::empty(q.shape(), c.dt, Device::CUDA);
    attention_forward(gq, gk, gv, c.q_offset, scale, gout2, nullptr, c.window);  // no lse wanted: the same out
    EXPECT_EQ(gout2.to_float_vector(), gout.to_float_vector());
  }
}

TEST_P(AttentionCudaTest, BackwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const Case c = GetParam();
  const float scale = 1.0f / std::sqrt(float(c.d));
  const Tensor q = rounded(random_tensor({c.tq, c.nh, c.d}, 4, -2.0f, 2.0f), c.dt);
  const Tensor k = rounded(random_tensor({c.tk, c.nkv, c.d}, 5, -2.0f, 2.0f), c.dt);
  const Tensor v = rounded(random_tensor({c.tk, c.nkv, c.d}, 6), c.dt);
  const Tensor dout = rounded(random_tensor({c.tq, c.nh, c.d}, 7), c.dt);
  Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({c.tq, c.nh}, DType::F32);
  attention_forward(q, k, v, c.q_offset, scale, out, &lse, c.window);
  out = rounded(out, c.dt);  // the out the GPU side is given
  const Tensor dk0 = rounded(random_tensor(k.shape(), 8), c.grad_dt);  // added to
  const Tensor dv0 = rounded(random_tensor(v.shape(), 9), c.grad_dt);

  Tensor dq = random_tensor(q.shape(), 10), dk = dk0.clone(), dv = dv0.clone();  // dq overwritten
  attention_backward(dout, q, k, v, out, lse, c.q_offset, scale, dq, dk, dv, c.window);

  if (c.d > 256) {  // beyond the CUDA kernels: the backward refuses them by name
    Tensor gdq = on_gpu(random_tensor(q.shape(), 11), c.dt), gdk = on_gpu(dk0, c.grad_dt), gdv = on_gpu(dv0, c.grad_dt);
    EXPECT_THROW(attention_backward(on_gpu(dout, c.dt), on_gpu(q, c.dt), on_gpu(k, c.dt), on_gpu(v, c.dt),
                                    on_gpu(out, c.dt), lse.to_device(Device::CUDA), c.q_offset, scale, gdq, gdk, gdv),
                 Error);
    return;
  }
  // Every BF16 tensor-core backward at head dims 64, 128 and 192: the wgmma passes (the default on an H100 /
  // H200; elsewhere, and at other head dims, the same as "mma"), the one-pass mma.sync kernel ("mma" at 64 and 128:
  // blocks of 128 keys where they fit, "fused64" of 64) and the two mma.sync passes ("mma2").
  for (const char* kernel : {"wgmma", "mma", "fused64", "mma2"}) {
    SCOPED_TRACE(kernel);
    testing::ScopedEnv choice("AERIE_ATTENTION_BACKWARD_KERNEL", kernel);  // the caller's own comes back after
    Tensor gdq = on_gpu(random_tensor(q.shape(), 11), c.dt), gdk = on_gpu(dk0, c.grad_dt), gdv = on_gpu(dv0, c.grad_dt);
    attention_backward(on_gpu(dout, c.dt), on_gpu(q, c.dt), on_gpu(k, c.dt), on_gpu(v, c.dt), on_gpu(out, c.dt),
                       lse.to_device(Device::CUDA), c.q_offset, scale, gdq, gdk, gdv, c.window);
    testing::expect_close(gdq.to_float_vector(), rounded(dq, c.dt).to_float_vector(), atol_of(c.dt, true),
                          rtol_of(c.dt, true), "dq");
    // F32 dk/dv of BF16 inputs get the bf16 tolerance: the tensor-core backward rounds P and dS to bf16 as
    // the A operands of dV = P^T dout and dK = dS^T Q (as FlashAttention-2 does), a 2^-9 relative error
    // per term (seen: up to 2e-3 absolute on values of about 0.5, against 1e-4 + 1e-3 |ref| for F32).
    const DType gtol = c.dt == DType::BF16 ? DType::BF16 : c.grad_dt;
    testing::expect_close(gdk.to_float_vector(), rounded(dk, c.grad_dt).to_float_vector(), atol_of(gtol, true),
                          rtol_of(gtol, true), "dk");
    testing::expect_close(gdv.to_float_vector(), rounded(dv, c.grad_dt).to_float_vector(), atol_of(gtol, true),
                          rtol_of(gtol, true), "dv");
  }
}

constexpr DType F32 = DType::F32, BF16 = DType::BF16;
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCudaTest,
    ::testing::Values(Case{300, 300, 8, 2, 64, 0, F32, F32},       // prefill, GQA, key split on a small grid
                      Case{300, 300, 8, 2, 64, 0, BF16, F32},
                      Case{200, 200, 4, 4, 128, 0, BF16, BF16},    // plain multi-head, d 128
                      Case{129, 129, 8, 2, 128, 0, BF16, F32},     // tensor-core paths: GQA, partial tiles
                      Case{700, 700, 16, 2, 128, 0, BF16, F32},    // group 8, many tiles in both passes
                      Case{100, 100, 8, 2, 128, -5, BF16, BF16},   // rows 0..4 attend no key, d 128
                      Case{515, 515, 4, 1, 64, 0, BF16, BF16},     // multi-query, 9 key tiles
                      Case{700, 700, 16, 2, 64, 0, BF16, F32},     // group 8, many tiles, d 64
                      Case{300, 300, 12, 4, 64, 0, BF16, F32},     // group 3: packed rows not a power of 2
                      Case{300, 300, 10, 2, 128, 7, BF16, BF16},   // group 5 after a cache, d 128
                      Case{1000, 1000, 8, 2, 128, 0, F32, F32},    // long prefill
                      Case{37, 500, 8, 2, 128, 463, F32, F32},     // chunked prefill after a cache
                      Case{37, 500, 8, 2, 128, 463, BF16, BF16},
                      Case{1, 1000, 8, 2, 128, 999, F32, F32},     // decoding: one token, key split
                      Case{1, 1000, 8, 2, 128, 999, BF16, F32},
                      Case{3, 777, 4, 4, 64, 774, BF16, BF16},     // a few tokens, odd Tk
                      Case{65, 65, 4, 4, 16, 0, F32, F32},         // small head dim
                      Case{150, 150, 4, 4, 192, 0, F32, F32},      // MLA's query/key head (the MLA draft's TTT:
                                                                   // the SIMT backward's DP 256 bucket)
                      Case{150, 150, 4, 4, 192, 0, BF16, F32},
                      Case{20, 170, 4, 4, 192, 150, BF16, BF16},   // chunked, d 192
                      Case{700, 700, 8, 2, 192, 0, BF16, F32},     // d 192, GQA, many tiles in every pass
                      Case{150, 150, 4, 4, 192, 0, BF16, BF16},    // d 192, bf16 dk / dv (the dV, dK launches)
                      Case{70, 70, 6, 3, 40, 0, F32, F32},         // head dim padded to 64
                      Case{40, 40, 2, 1, 264, 0, F32, F32},        // beyond 256: refused
                      Case{33, 40, 4, 1, 8, 7, BF16, F32},         // multi-query, d 8
                      Case{20, 20, 4, 2, 32, -3, F32, F32},        // rows 0..2 attend no key
                      // Sliding windows (the draft's --draft-sliding-window): every kernel's lower bound,
                      // windows shorter and longer than a key tile, not multiples of it.
                      Case{300, 300, 8, 2, 64, 0, F32, F32, 45},   // SIMT forward / backward
                      Case{300, 300, 8, 2, 64, 0, BF16, F32, 45},  // mma.sync, d 64
                      Case{700, 700, 16, 2, 128, 0, BF16, F32, 200},  // wgmma and mma.sync, d 128
                      Case{700, 700, 4, 4, 128, 0, BF16, BF16, 70},
                      Case{129, 129, 8, 2, 128, 0, BF16, F32, 1},  // each row its own key only
                      Case{150, 150, 4, 4, 192, 0, BF16, F32, 33},  // d 192 (the MLA draft)
                      Case{150, 150, 4, 4, 192, 0, F32, F32, 100},
                      Case{1, 1000, 8, 2, 128, 999, BF16, F32, 300},  // decoding, key split
                      Case{37, 500, 8, 2, 128, 463, F32, F32, 64},    // chunked after a cache
                      Case{37, 500, 8, 2, 128, 463, BF16, BF16, 64},
                      Case{70, 70, 6, 3, 40, 0, F32, F32, 2000},       // window beyond the sequence: causal
                      // As on an RTX PRO 6000 (sm_120: mma.sync, 99 KiB per block): at d 192 the single-buffered
                      // tensor-core forward and backward, and the SIMT backward's blocks of 4 keys / rows (F32).
                      Case{150, 150, 4, 4, 192, 0, F32, F32, 0, "sm_120"},
                      Case{150, 150, 4, 4, 192, 0, BF16, BF16, 0, "sm_120"},
                      Case{700, 700, 8, 2, 192, 0, BF16, F32, 0, "sm_120"},
                      Case{20, 170, 4, 4, 192, 150, BF16, BF16, 0, "sm_120"},
                      Case{150, 150, 4, 4, 192, 0, BF16, F32, 33, "sm_120"},
                      Case{700, 700, 16, 2, 128, 0, BF16, F32, 200, "sm_120"},
                      // ... and at d 64 / 128 (the one-pass backward; "fa2" the 128-row forward): partial tiles,
                      // group 8, no-key rows, chunked after a cache, a window.
                      Case{129, 129, 8, 2, 128, 0, BF16, F32, 0, "sm_120"},
                      Case{700, 700, 16, 2, 64, 0, BF16, BF16, 0, "sm_120"},
                      Case{100, 100, 8, 2, 128, -5, BF16, BF16, 0, "sm_120"},
                      Case{37, 500, 8, 2, 128, 463, BF16, F32, 0, "sm_120"},
                      Case{300, 300, 8, 2, 64, 0, BF16, F32, 45, "sm_120"},
                      Case{200, 200, 6, 2, 128, 0, BF16, F32, 0, "sm_120"}),  // group 3
    case_name);

// ------------------------------------------------------------------------------------------------

class AttentionVarlenCudaTest : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionVarlenCudaTest, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const DType dt = GetParam();
  struct Heads {
    int64_t nh, nkv, d;
  };
  for (const auto& [nh, nkv, d] : std::vector<Heads>{{8, 2, 64}, {4, 4, 128}, {4, 2, 16}}) {
    SCOPED_TRACE("nh " + std::to_string(nh) + " nkv " + std::to_string(nkv) + " d " + std::to_string(d));
    const std::vector<int32_t> cu{0, 1, 38, 38, 238};  // lengths 1, 37, 0, 200
    const int64_t n = cu.back();
    const float scale = 1.0f / std::sqrt(float(d));
    const Tensor q = rounded(random_tensor({n, nh, d}, 21, -2.0f, 2.0f), dt);
    const Tensor k = rounded(random_tensor({n, nkv, d}, 22, -2.0f, 2.0f), dt);
    const Tensor v = rounded(random_tensor({n, nkv, d}, 23), dt);
    const Tensor cs = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
    Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({n, nh}, DType::F32);
    attention_forward_varlen(q, k, v, cs, scale, out, &lse);
    Tensor gout = Tensor::empty(q.shape(), dt, Device::CUDA), glse = Tensor::empty({n, nh}, DType::F32, Device::CUDA);
    const Tensor gq = on_gpu(q, dt), gk = on_gpu(k, dt), gv = on_gpu(v, dt), gcs = cs.to_device(Device::CUDA);
    attention_forward_varlen(gq, gk, gv, gcs, scale, gout, &glse);
    testing::expect_close(gout.to_float_vector(), rounded(out, dt).to_float_vector(), atol_of(dt, false),
                          rtol_of(dt, false), "out");
    testing::expect_close(glse.to_float_vector(), lse.to_float_vector(), kF32Atol, kF32Rtol, "lse");
    Tensor gout2 = Tensor::empty(q.shape(), dt, Device::CUDA);
    attention_forward_varlen(gq, gk, gv, gcs, scale, gout2, nullptr);
    EXPECT_EQ(gout2.to_float_vector(), gout.to_float_vector());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionVarlenCudaTest, ::testing::Values(F32, BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ------------------------------------------------------------------------------------------------

struct MergeCase {
  int64_t n, nh, nkv, d;
  int J;
  DType dt, grad_dt;
};

class AttentionMergeCudaTest : public ::testing::TestWithParam<MergeCase> {};

TEST_P(AttentionMergeCudaTest, ForwardAndBackwardMatchCpu) {
  AERIE_REQUIRE_CUDA();
  const MergeCase c = GetParam();
  const DType dt = c.dt;
  const float scale = 1.0f / std::sqrt(float(c.d));
  const int64_t rows = c.n + 3;  // the diagonal tensors may be longer than q (TTT: earlier steps have more rows)
  const Tensor q = rounded(random_tensor({c.n, c.nh, c.d}, 31, -2.0f, 2.0f), dt);
  const Tensor k0 = rounded(random_tensor({c.n, c.nkv, c.d}, 32, -2.0f, 2.0f), dt);
  const Tensor v0 = rounded(random_tensor({c.n, c.nkv, c.d}, 33), dt);
  std::vector<Tensor> dk, dv, gdk, gdv;
  for (int j = 0; j < c.J; ++j) {
    dk.push_back(rounded(random_tensor({rows, c.nkv, c.d}, 40 + j, -2.0f, 2.0f), dt));
    dv.push_back(rounded(random_tensor({rows, c.nkv, c.d}, 60 + j), dt));
    gdk.push_back(on_gpu(dk.back(), dt));
    gdv.push_back(on_gpu(dv.back(), dt));
  }
  std::vector<const Tensor*> pk, pv, gpk, gpv;
  for (int j = 0; j < c.J; ++j) {
    pk.push_back(&dk[j]);
    pv.push_back(&dv[j]);
    gpk.push_back(&gdk[j]);
    gpv.push_back(&gdv[j]);
  }
  // Forward: the causal result (CPU), then the merge on each device from the same values.
  Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({c.n, c.nh}, DType::F32);
  attention_forward(q, k0, v0, 0, scale, out, &lse);
  out = rounded(out, dt);
  Tensor gout = on_gpu(out, dt), glse = lse.to_device(Device::CUDA);
  attention_merge_diagonal_forward(q, pk, pv, scale, out, lse);
  attention_merge_diagonal_forward(on_gpu(q, dt), gpk, gpv, scale, gout, glse);
  testing::expect_close(gout.to_float_vector(), rounded(out, dt).to_float_vector(), atol_of(dt, false),
                        rtol_of(dt, false), "merged out");
  testing::expect_close(glse.to_float_vector(), lse.to_float_vector(), kF32Atol, kF32Rtol, "merged lse");

  // Backward from the merged values (CPU's, so both sides start equal): dq and the gradients added to.
  out = rounded(out, dt);
  const Tensor dout = rounded(random_tensor(q.shape(), 34), dt);
  Tensor dq = rounded(random_tensor(q.shape(), 35), dt);
  Tensor gdq = on_gpu(dq, dt);
  std::vector<Tensor> gk, gv, ggk, ggv;
  for (int j = 0; j < c.J; ++j) {
    gk.push_back(rounded(random_tensor({rows, c.nkv, c.d}, 80 + j), c.grad_dt));
    gv.push_back(rounded(random_tensor({rows, c.nkv, c.d}, 90 + j), c.grad_dt));
    ggk.push_back(on_gpu(gk.back(), c.grad_dt));
    ggv.push_back(on_gpu(gv.back(), c.grad_dt));
  }
  std::vector<Tensor*> pgk, pgv, gpgk, gpgv;
  for (int j = 0; j < c.J; ++j) {
    pgk.push_back(&gk[j]);
    pgv.push_back(&gv[j]);
    gpgk.push_back(&ggk[j]);
    gpgv.push_back(&ggv[j]);
  }
  attention_merge_diagonal_backward(dout, q, pk, pv, out, lse, scale, dq, pgk, pgv);
  attention_merge_diagonal_backward(on_gpu(dout, dt), on_gpu(q, dt), gpk, gpv, on_gpu(out, dt),
                                    lse.to_device(Device::CUDA), scale, gdq, gpgk, gpgv);
  testing::expect_close(gdq.to_float_vector(), rounded(dq, dt).to_float_vector(), atol_of(dt, true),
                        rtol_of(dt, true), "dq");
  for (int j = 0; j < c.J; ++j) {
    testing::expect_close(ggk[j].to_float_vector(), rounded(gk[j], c.grad_dt).to_float_vector(),
                          atol_of(c.grad_dt, true), rtol_of(c.grad_dt, true), "ddiag_k " + std::to_string(j));
    testing::expect_close(ggv[j].to_float_vector(), rounded(gv[j], c.grad_dt).to_float_vector(),
                          atol_of(c.grad_dt, true), rtol_of(c.grad_dt, true), "ddiag_v " + std::to_string(j));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionMergeCudaTest,
    ::testing::Values(MergeCase{50, 8, 2, 64, 0, F32, F32}, MergeCase{50, 8, 2, 64, 1, F32, F32},
                      MergeCase{50, 8, 2, 64, 3, BF16, F32}, MergeCase{50, 8, 2, 128, 6, F32, F32},
                      MergeCase{50, 4, 4, 128, 6, BF16, BF16}, MergeCase{31, 4, 2, 16, 3, F32, F32},
                      MergeCase{20, 8, 2, 40, 11, F32, F32},   // 11 > 8: two launches
                      MergeCase{40, 4, 4, 192, 6, F32, F32},   // the MLA draft's query/key head
                      MergeCase{40, 4, 4, 192, 6, BF16, F32}),
    [](const ::testing::TestParamInfo<MergeCase>& info) {
      const MergeCase& c = info.param;
      return "n" + std::to_string(c.n) + "_nh" + std::to_string(c.nh) + "_nkv" + std::to_string(c.nkv) + "_d" +
             std::to_string(c.d) + "_J" + std::to_string(c.J) + "_" + dtype_name(c.dt) + "_grad" +
             dtype_name(c.grad_dt);
    });

// Milliseconds per call of f on the GPU: one untimed warm-up, then the mean of 5 calls.
double time_ms(const std::function<void()>& f) {
  f();
  cuda::synchronize();
  const int reps = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// A random BF16 tensor on the GPU.
Tensor gpu_rand(const Shape& s, uint32_t seed) { return random_tensor(s, seed).to(DType::BF16).to_device(Device::CUDA); }

// Throughput on a Llama-3-8B-shaped layer (32 heads, 8 kv heads, d 128, bf16), printed for the record;
// asserts only that the results are finite (the tests above check the values).
// Reports (asserts nothing about speed: benchmarks live in tools/bench) both BF16 forwards and both
// backwards (wgmma, mma) and decoding at the 8B draft's shape (32 / 8 heads, d 128), T 2048 and 8192.
// FLOPs count the causal half: 4 T^2 / 2 nh d for the forward, 2.5 times that for the backward.
TEST(AttentionCudaPerf, ReportsThroughput) {
  AERIE_REQUIRE_CUDA();
  const int64_t nh = 32, nkv = 8, d = 128;
  const float scale = 1.0f / std::sqrt(float(d));
  for (const int64_t t : {int64_t{2048}, int64_t{8192}}) {
    const Tensor q = gpu_rand({t, nh, d}, 1), k = gpu_rand({t, nkv, d}, 2), v = gpu_rand({t, nkv, d}, 3);
    const Tensor dout = gpu_rand({t, nh, d}, 4);
    Tensor out = Tensor::empty({t, nh, d}, DType::BF16, Device::CUDA);
    Tensor lse = Tensor::empty({t, nh}, DType::F32, Device::CUDA);
    Tensor dq = Tensor::empty({t, nh, d}, DType::BF16, Device::CUDA);
    Tensor dk = Tensor::zeros({t, nkv, d}, DType::F32, Device::CUDA);
    Tensor dv = Tensor::zeros({t, nkv, d}, DType::F32, Device::CUDA);
    const double flop = 2.0 * 2.0 * double(t) * double(t) / 2.0 * double(nh) * double(d);  // causal QK^T and PV
    double fwd[2], bwd[2];
    for (int i = 1; i >= 0; --i) {  // mma first: the backward below gets the default (wgmma) forward's out and lse
      {
        testing::ScopedEnv choice("AERIE_ATTENTION_FORWARD_KERNEL", i == 0 ? "wgmma" : "mma");
        fwd[i] = time_ms([&] { attention_forward(q, k, v, 0, scale, out, &lse); });
      }
    }
    for (int i = 0; i < 2; ++i) {
      {
        testing::ScopedEnv choice("AERIE_ATTENTION_BACKWARD_KERNEL", i == 0 ? "wgmma" : "mma");
        bwd[i] = time_ms([&] { attention_backward(dout, q, k, v, out, lse, 0, scale, dq, dk, dv); });
      }
    }
    const Tensor q1 = gpu_rand({1, nh, d}, 5);
    Tensor out1 = Tensor::empty({1, nh, d}, DType::BF16, Device::CUDA);
    const double dec = time_ms([&] { attention_forward(q1, k, v, t - 1, scale, out1, nullptr); });
    std::printf("[ perf ] attention T=%lld nh=%lld nkv=%lld d=%lld bf16: forward wgmma %.3f ms (%.1f TFLOP/s), "
                "mma %.3f ms (%.1f TFLOP/s); backward wgmma %.3f ms (%.1f TFLOP/s), mma %.3f ms (%.1f TFLOP/s); "
                "decode 1 x %lld keys %.3f ms\n",
                (long long)t, (long long)nh, (long long)nkv, (long long)d, fwd[0], flop / fwd[0] * 1e-9, fwd[1],
                flop / fwd[1] * 1e-9, bwd[0],
                2.5 * flop / bwd[0] * 1e-9, bwd[1], 2.5 * flop / bwd[1] * 1e-9, (long long)t, dec);
    for (float x : out.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
    for (float x : dq.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
    for (float x : out1.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
  }
}

// The other head dims of the wgmma kernels against the mma.sync ones, printed for the record (asserts only
// that both agree, within bf16's rounding of the outputs): d 64 (32 / 8 heads, a Llama-3.2-1B-like layer),
// forward and backward at T 2048 and 8192; MLA's 192 / 128 forward (16 heads, a DeepSeek-V3 tp 8 prefill)
// at T 2048 .. 8192, where attention.cu's automatic choice switches kernels (at 2560 keys); the MLA draft's
// 192 / 192 (32 heads, values zero-padded to 192), forward and backward at T 2048 and 8192.
// FLOPs count the causal half: 2 T^2 / 2 nh (d + dv) for the forward, 2.5 times that for the backward.
TEST(AttentionCudaPerf, ReportsHeadDims) {
  AERIE_REQUIRE_CUDA();
  struct C {
    int64_t nh, nkv, d, dv, t;
  };
  for (const C& c : {C{32, 8, 64, 64, 2048}, C{32, 8, 64, 64, 8192}, C{16, 16, 192, 128, 2048},
                     C{16, 16, 192, 128, 3072}, C{16, 16, 192, 128, 4096}, C{16, 16, 192, 128, 6144},
                     C{16, 16, 192, 128, 8192}, C{32, 32, 192, 192, 2048}, C{32, 32, 192, 192, 8192}}) {
    const int64_t t = c.t;
    const float scale = 1.0f / std::sqrt(float(c.d));
    const Tensor q = gpu_rand({t, c.nh, c.d}, 1), k = gpu_rand({t, c.nkv, c.d}, 2), v = gpu_rand({t, c.nkv, c.dv}, 3);
    Tensor out[2] = {Tensor::empty({t, c.nh, c.dv}, DType::BF16, Device::CUDA),
                     Tensor::empty({t, c.nh, c.dv}, DType::BF16, Device::CUDA)};
    Tensor lse[2] = {Tensor::empty({t, c.nh}, DType::F32, Device::CUDA),
                     Tensor::empty({t, c.nh}, DType::F32, Device::CUDA)};
    double ms[2];
    for (int i = 0; i < 2; ++i) {
      {
        testing::ScopedEnv choice("AERIE_ATTENTION_FORWARD_KERNEL", i == 0 ? "wgmma" : "mma");
        ms[i] = time_ms([&] { attention_forward(q, k, v, 0, scale, out[i], &lse[i]); });
      }
    }
    const double flop = 2.0 * double(t) * double(t) / 2.0 * double(c.nh) * double(c.d + c.dv);
    std::printf("[ perf ] attention forward T=%lld nh=%lld nkv=%lld d=%lld dv=%lld bf16: wgmma %.3f ms (%.1f "
                "TFLOP/s), mma %.3f ms (%.1f TFLOP/s)\n",
                (long long)t, (long long)c.nh, (long long)c.nkv, (long long)c.d, (long long)c.dv, ms[0],
                flop / ms[0] * 1e-9, ms[1], flop / ms[1] * 1e-9);
    // Both kernels round the same fp32 softmax to bf16 outputs: they differ by a few bf16 ulps at most.
    testing::expect_close(out[0].to_float_vector(), out[1].to_float_vector(), 2e-2, 2e-2, "wgmma vs mma out");
    testing::expect_close(lse[0].to_float_vector(), lse[1].to_float_vector(), 1e-4, 1e-4, "wgmma vs mma lse");
    if (c.d != c.dv) continue;  // the backward of MLA's value head is the SIMT kernel's
    const Tensor dout = gpu_rand({t, c.nh, c.d}, 4);
    Tensor dq[2], dk[2], dv[2];
    for (int i = 0; i < 2; ++i) {
      dq[i] = Tensor::empty({t, c.nh, c.d}, DType::BF16, Device::CUDA);
      dk[i] = Tensor::zeros({t, c.nkv, c.d}, DType::F32, Device::CUDA);
      dv[i] = Tensor::zeros({t, c.nkv, c.d}, DType::F32, Device::CUDA);
      {
        testing::ScopedEnv choice("AERIE_ATTENTION_BACKWARD_KERNEL", i == 0 ? "wgmma" : "mma");
        ms[i] = time_ms([&] { attention_backward(dout, q, k, v, out[0], lse[0], 0, scale, dq[i], dk[i], dv[i]); });
      }
    }
    std::printf("[ perf ] attention backward T=%lld nh=%lld nkv=%lld d=%lld bf16: wgmma %.3f ms (%.1f TFLOP/s), "
                "mma %.3f ms (%.1f TFLOP/s)\n",
                (long long)t, (long long)c.nh, (long long)c.nkv, (long long)c.d, ms[0], 2.5 * flop / ms[0] * 1e-9,
                ms[1], 2.5 * flop / ms[1] * 1e-9);
    // dq is rewritten per call; dk and dv summed the same gradients over six calls in both: compared relative
    // to their largest value (the per-call differences are bf16 roundings of P and dS in either kernel).
    testing::expect_close(dq[0].to_float_vector(), dq[1].to_float_vector(), 2e-2, 2e-2, "wgmma vs mma dq");
    for (Tensor* g : {dk, dv}) {
      const std::vector<float> a = g[0].to_float_vector(), b = g[1].to_float_vector();
      float amax = 0.0f;
      for (float x : b) amax = std::max(amax, std::fabs(x));
      testing::expect_close(a, b, 1e-2f * amax, 2e-2f, g == dk ? "wgmma vs mma dk" : "wgmma vs mma dv");
    }
  }
}

// MLA's prefill shapes (query/key head 192, value head 128) on the GPU against the CPU: the tensor-core
// kernels, mma.sync (the automatic choice at these lengths) and wgmma (forced) (BF16 prefill, chunked after a
// cache, 16 heads of 600 rows), the SIMT kernel (F32) and the key
// splits with their merge (one row against 1000 keys), plain and varlen.
TEST(AttentionCudaValueHead, MlaShapesMatchCpu) {
  AERIE_REQUIRE_CUDA();
  struct C {
    int64_t tq, tk, nh, off;
    DType dt;
  };
  const int64_t d = 192, dv = 128;
  for (const C& c : {C{150, 150, 4, 0, BF16}, C{150, 150, 4, 0, F32}, C{20, 170, 4, 150, BF16},
                     C{600, 600, 16, 0, BF16}, C{1, 1000, 8, 999, BF16}, C{1, 1000, 8, 999, F32}}) {
    SCOPED_TRACE(std::to_string(c.tq) + "x" + std::to_string(c.tk) + " " + dtype_name(c.dt));
    const float scale = 1.0f / std::sqrt(float(d));
    const Tensor q = rounded(random_tensor({c.tq, c.nh, d}, 1, -2.0f, 2.0f), c.dt);
    const Tensor k = rounded(random_tensor({c.tk, c.nh, d}, 2, -2.0f, 2.0f), c.dt);
    const Tensor v = rounded(random_tensor({c.tk, c.nh, dv}, 3), c.dt);
    Tensor out = Tensor::empty({c.tq, c.nh, dv}, DType::F32), lse = Tensor::empty({c.tq, c.nh}, DType::F32);
    attention_forward(q, k, v, c.off, scale, out, &lse);
    // The automatic choice (mma.sync below 2560 keys at this head dim), the wgmma kernel
    // forced, and as on an sm_120 GPU (99 KiB per block) the automatic choice (mma.sync, 64 rows, K and V
    // single-buffered) and FlashAttention-2's shape (fa2: 128 rows, 32-key tiles).
    for (const char* kernel : {"", "wgmma", "sm_120", "sm_120+fa2"}) {
      SCOPED_TRACE(*kernel ? kernel : "auto");
      const bool as120 = std::string(kernel).rfind("sm_120", 0) == 0;
      std::optional<testing::ScopedEnv> emulate;
      if (as120) emulate.emplace("AERIE_CUDA_EMULATE", "sm_120");
      std::optional<testing::ScopedEnv> choice;  // "" and sm_120: the automatic choice, whatever the caller set
      const char* forced = !*kernel ? nullptr : !as120 ? kernel : std::string(kernel) == "sm_120+fa2" ? "fa2" : nullptr;
      choice.emplace("AERIE_ATTENTION_FORWARD_KERNEL", forced);
      Tensor gout = Tensor::empty({c.tq, c.nh, dv}, c.dt, Device::CUDA);
      Tensor glse = Tensor::empty({c.tq, c.nh}, DType::F32, Device::CUDA);
      attention_forward(on_gpu(q, c.dt), on_gpu(k, c.dt), on_gpu(v, c.dt), c.off, scale, gout, &glse);
      testing::expect_close(gout.to_float_vector(), rounded(out, c.dt).to_float_vector(), atol_of(c.dt, false),
                            rtol_of(c.dt, false), "out");
      testing::expect_close(finite(glse.to_float_vector()), finite(lse.to_float_vector()), kF32Atol, kF32Rtol, "lse");
    }
    if (c.off != 0 || c.tq != c.tk) continue;
    const Tensor cu = Tensor::from_vector<int32_t>({0, static_cast<int32_t>(c.tq / 3), static_cast<int32_t>(c.tq)}, {3});
    Tensor vout = Tensor::empty({c.tq, c.nh, dv}, DType::F32);
    attention_forward_varlen(q, k, v, cu, scale, vout, nullptr);
    Tensor gv = Tensor::empty({c.tq, c.nh, dv}, c.dt, Device::CUDA);
    attention_forward_varlen(on_gpu(q, c.dt), on_gpu(k, c.dt), on_gpu(v, c.dt), cu.to_device(Device::CUDA), scale, gv,
                             nullptr);
    testing::expect_close(gv.to_float_vector(), rounded(vout, c.dt).to_float_vector(), atol_of(c.dt, false),
                          rtol_of(c.dt, false), "varlen out");
  }
}

}  // namespace
}  // namespace aerie
