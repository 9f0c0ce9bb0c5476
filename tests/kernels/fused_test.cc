// The fused forward ops (kernels/fused.h): on the CPU against the unfused ops they replace (rmsnorm_forward,
// rope_apply, swiglu_forward, add_inplace), which must give the same fp32 bits on F32 tensors; on CUDA
// against the CPU reference, F32 and BF16, odd sizes (skipped without a GPU); and the argument checks.
#include <cstring>

#include "cuda_test_util.h"
#include "kernels/activation.h"
#include "kernels/fused.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"
#include "kernels/tensor_ops.h"

namespace aerie {
namespace {

using testing::expect_close_as;
using testing::gpu;
using testing::random_as;

Tensor positions_of(int64_t n, int32_t start) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<int32_t>(i * 37 % 4099);
  return Tensor::from_vector(p, {n});
}

/// Columns [c0, c0 + c) of a 2-D CPU tensor as a new [rows, c] tensor.
Tensor cols(const Tensor& t, int64_t c0, int64_t c) {
  Tensor out = Tensor::empty({t.dim(0), c}, t.dtype());
  copy_columns(t, c0, out, 0, c);
  return out;
}

void expect_bits_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  EXPECT_EQ(std::memcmp(got.raw(), ref.raw(), got.numel() * dtype_size(got.dtype())), 0) << what;
}

struct QkvCase {
  int64_t n, nq, nkv, d;
};
// d 2..64, 128, 256, 512 and 1024 take the kernel's 1, 2, 4, 8 and 16 pairs per lane.
const QkvCase kQkvCases[] = {{1, 1, 1, 2},     {7, 4, 2, 8},     {13, 6, 3, 30},  {33, 8, 2, 128},
                            {5, 4, 1, 256},   {2, 2, 2, 512},   {3, 2, 1, 1024}};

TEST(FusedQkvRope, CpuEqualsUnfusedOps) {
  const auto inv = rope_inv_freq(RopeParams{}, 30);
  for (bool norm : {false, true}) {
    const int64_t n = 13, nq = 6, nkv = 3, d = 30;
    Tensor qkv = random_as({n, (nq + 2 * nkv) * d}, DType::F32, 1, -2.0f, 2.0f);
    Tensor qn = norm ? random_as({d}, DType::F32, 2, 0.5f, 1.5f) : Tensor();
    Tensor kn = norm ? random_as({d}, DType::F32, 3, 0.5f, 1.5f) : Tensor();
    Tensor pos = positions_of(n, 5);
    Tensor q = Tensor::empty({n, nq, d}, DType::F32), k = Tensor::empty({n, nkv, d}, DType::F32),
           v = Tensor::empty({n, nkv, d}, DType::F32);
    qkv_rope_forward(qkv, pos, inv, qn, kn, 1e-6f, q, k, v);
    Tensor rq = cols(qkv, 0, nq * d).reshape({n, nq, d}), rk = cols(qkv, nq * d, nkv * d).reshape({n, nkv, d}),
           rv = cols(qkv, (nq + nkv) * d, nkv * d).reshape({n, nkv, d});
    if (norm) {
      Tensor q2 = rq.reshape({n * nq, d}), k2 = rk.reshape({n * nkv, d});
      rmsnorm_forward(q2, qn, 1e-6f, q2, nullptr);
      rmsnorm_forward(k2, kn, 1e-6f, k2, nullptr);
    }
    rope_apply(rq, pos, inv);
    rope_apply(rk, pos, inv);
    const std::string what = norm ? "with q/k norm" : "without norm";
    expect_bits_equal(q, rq, what + ": q");
    expect_bits_equal(k, rk, what + ": k");
    expect_bits_equal(v, rv, what + ": v");
  }
}

TEST(FusedQkvRope, Bf16CpuIsRoundedF32) {
  // BF16 in, BF16 out: the F32 result on the widened input, rounded once.
  const int64_t n = 5, nq = 4, nkv = 2, d = 16;
  const auto inv = rope_inv_freq(RopeParams{}, d);
  Tensor qkv = random_as({n, (nq + 2 * nkv) * d}, DType::BF16, 4);
  Tensor qn = random_as({d}, DType::F32, 5, 0.5f, 1.5f), kn = random_as({d}, DType::BF16, 6, 0.5f, 1.5f);
  Tensor pos = positions_of(n, 0);
  Tensor q = Tensor::empty({n, nq, d}, DType::BF16), k = Tensor::empty({n, nkv, d}, DType::BF16),
         v = Tensor::empty({n, nkv, d}, DType::BF16);
  Tensor qf = Tensor::empty({n, nq, d}, DType::F32), kf = Tensor::empty({n, nkv, d}, DType::F32),
         vf = Tensor::empty({n, nkv, d}, DType::F32);
  qkv_rope_forward(qkv, pos, inv, qn, kn, 1e-6f, q, k, v);
  qkv_rope_forward(qkv.to(DType::F32), pos, inv, qn, kn.to(DType::F32), 1e-6f, qf, kf, vf);
  expect_bits_equal(q, qf.to(DType::BF16), "q");
  expect_bits_equal(k, kf.to(DType::BF16), "k");
  expect_bits_equal(v, vf.to(DType::BF16), "v");
}

TEST(FusedSwigluPacked, CpuEqualsUnfusedOp) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t n = 9, I = 37;
    Tensor gu = random_as({n, 2 * I}, dt, 7, -4.0f, 4.0f);
    Tensor out = Tensor::empty({n, I}, dt), ref = Tensor::empty({n, I}, dt);
    swiglu_packed_forward(gu, out);
    swiglu_forward(cols(gu, 0, I), cols(gu, I, I), ref);
    expect_bits_equal(out, ref, dtype_name(dt));
  }
}

TEST(FusedAddRmsnorm, CpuEqualsUnfusedOps) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t n = 6, H = 45;
    Tensor r = random_as({n, H}, DType::F32, 8, -3.0f, 3.0f), x = random_as({n, H}, dt, 9);
    Tensor w = random_as({H}, dt, 10, 0.5f, 1.5f);
    Tensor r2 = r.clone(), y = Tensor::empty({n, H}, dt), y2 = Tensor::empty({n, H}, dt);
    add_rmsnorm_forward(r, x, w, 1e-5f, y);
    add_inplace(r2, x);
    rmsnorm_forward(r2, w, 1e-5f, y2, nullptr);
    expect_bits_equal(r, r2, std::string(dtype_name(dt)) + ": r");
    expect_bits_equal(y, y2, std::string(dtype_name(dt)) + ": y");
  }
}

TEST(Fused, RejectsBadArguments) {
  const auto inv = rope_inv_freq(RopeParams{}, 8);
  Tensor qkv = Tensor::zeros({3, 4 * 8}, DType::F32), pos = positions_of(3, 0);
  Tensor q = Tensor::empty({3, 2, 8}, DType::F32), k = Tensor::empty({3, 1, 8}, DType::F32),
         v = Tensor::empty({3, 1, 8}, DType::F32);
  testing::expect_error([&] { qkv_rope_forward(qkv.slice(0, 2), pos, inv, Tensor(), Tensor(), 1e-6f, q, k, v); },
                        "qkv");
  Tensor qn = Tensor::zeros({8}, DType::F32);
  testing::expect_error([&] { qkv_rope_forward(qkv, pos, inv, qn, Tensor(), 1e-6f, q, k, v); }, "both");
  testing::expect_error([&] { qkv_rope_forward(qkv, pos, {1.0f}, Tensor(), Tensor(), 1e-6f, q, k, v); },
                        "inv_freq");
  Tensor out = Tensor::empty({3, 5}, DType::F32);
  testing::expect_error([&] { swiglu_packed_forward(Tensor::zeros({3, 9}, DType::F32), out); }, "gu");
  Tensor r = Tensor::zeros({2, 4}, DType::F32), y = Tensor::empty({2, 4}, DType::F32);
  Tensor w = Tensor::zeros({4}, DType::F32);
  testing::expect_error([&] { add_rmsnorm_forward(r, Tensor::zeros({2, 3}, DType::F32), w, 1e-5f, y); }, "x");
  testing::expect_error([&] { add_rmsnorm_forward(r, Tensor::zeros({2, 4}, DType::F32), w, 1e-5f, r); },
                        "alias");
}

TEST(FusedCuda, QkvRopeMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  RopeParams p;
  p.theta = 500000.0;
  for (const QkvCase c : kQkvCases)
    for (DType dt : {DType::F32, DType::BF16})
      for (bool norm : {false, true}) {
        const std::string what = "n " + std::to_string(c.n) + " nq " + std::to_string(c.nq) + " nkv " +
                                 std::to_string(c.nkv) + " d " + std::to_string(c.d) + " " + dtype_name(dt) +
                                 (norm ? " norm" : "");
        const auto inv = rope_inv_freq(p, c.d);
        Tensor qkv = random_as({c.n, (c.nq + 2 * c.nkv) * c.d}, dt, 11, -2.0f, 2.0f);
        Tensor qn = norm ? random_as({c.d}, DType::F32, 12, 0.5f, 1.5f) : Tensor();
        Tensor kn = norm ? random_as({c.d}, dt, 13, 0.5f, 1.5f) : Tensor();
        Tensor pos = positions_of(c.n, 100);
        Tensor q = Tensor::empty({c.n, c.nq, c.d}, dt), k = Tensor::empty({c.n, c.nkv, c.d}, dt),
               v = Tensor::empty({c.n, c.nkv, c.d}, dt);
        Tensor qg = gpu(q), kg = gpu(k), vg = gpu(v);
        qkv_rope_forward(qkv, pos, inv, qn, kn, 1e-6f, q, k, v);
        qkv_rope_forward(gpu(qkv), gpu(pos), inv, norm ? gpu(qn) : Tensor(), norm ? gpu(kn) : Tensor(), 1e-6f, qg,
                         kg, vg);
        // fp32 on both devices; the sum of squares over d (<= 1024 terms) in another order and
        // cosf/sinf within an ulp or two of glibc: the F32 tolerance of cuda_test_util.h.
        expect_close_as(qg, q, dt, what + ": q");
        expect_close_as(kg, k, dt, what + ": k");
        expect_close_as(vg, v, dt, what + ": v");
      }
}

TEST(FusedCuda, QkvRopeWritesIntoCacheViews) {
  AERIE_REQUIRE_CUDA();
  // k and v as row slices of larger buffers (a KV cache): only those rows change.
  const int64_t n = 5, nq = 4, nkv = 2, d = 64;
  const auto inv = rope_inv_freq(RopeParams{}, d);
  Tensor qkv = random_as({n, (nq + 2 * nkv) * d}, DType::BF16, 14);
  Tensor pos = positions_of(n, 3);
  Tensor q = Tensor::empty({n, nq, d}, DType::BF16), k = Tensor::empty({n, nkv, d}, DType::BF16),
         v = Tensor::empty({n, nkv, d}, DType::BF16);
  qkv_rope_forward(qkv, pos, inv, Tensor(), Tensor(), 1e-6f, q, k, v);
  Tensor kc = Tensor::zeros({12, nkv, d}, DType::BF16, Device::CUDA);
  Tensor vc = Tensor::zeros({12, nkv, d}, DType::BF16, Device::CUDA);
  Tensor qg = gpu(q), ks = kc.slice(3, 3 + n), vs = vc.slice(3, 3 + n);
  qkv_rope_forward(gpu(qkv), gpu(pos), inv, Tensor(), Tensor(), 1e-6f, qg, ks, vs);
  expect_close_as(kc.slice(3, 3 + n), k, DType::BF16, "k rows");
  expect_close_as(vc.slice(3, 3 + n), v, DType::BF16, "v rows");
  for (float x : kc.slice(0, 3).to_float_vector()) ASSERT_EQ(x, 0.0f);
  for (float x : vc.slice(3 + n, 12).to_float_vector()) ASSERT_EQ(x, 0.0f);
}

TEST(FusedCuda, SwigluPackedMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  // I % 8 == 0 with BF16 takes the 16-byte-vector kernel, the other sizes the one-element kernel.
  for (int64_t n : {1, 7, 130})
    for (int64_t I : {1, 37, 1000, 1024})
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "n " + std::to_string(n) + " I " + std::to_string(I) + " " + dtype_name(dt);
        Tensor gu = random_as({n, 2 * I}, dt, 15, -6.0f, 6.0f);
        Tensor out = Tensor::empty({n, I}, dt), og = gpu(out);
        swiglu_packed_forward(gu, out);
        swiglu_packed_forward(gpu(gu), og);
        expect_close_as(og, out, dt, what);
      }
}

TEST(FusedCuda, AddRmsnormMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  // H % 4 == 0 up to 8192 takes the vector kernel (1, 2, 4 or 8 passes), the other sizes the scalar one.
  for (int64_t n : {1, 5, 67})
    for (int64_t H : {1, 45, 1028, 3000, 4096, 8192, 8196})
      for (DType xt : {DType::F32, DType::BF16})
        for (DType yt : {DType::F32, DType::BF16}) {
          const std::string what = "n " + std::to_string(n) + " H " + std::to_string(H) + " x " + dtype_name(xt) +
                                   " y " + dtype_name(yt);
          Tensor r = random_as({n, H}, DType::F32, 16, -3.0f, 3.0f), x = random_as({n, H}, xt, 17);
          Tensor w = random_as({H}, xt, 18, 0.5f, 1.5f);
          Tensor rg = gpu(r), y = Tensor::empty({n, H}, yt), yg = gpu(y);
          add_rmsnorm_forward(r, x, w, 1e-5f, y);
          add_rmsnorm_forward(rg, gpu(x), gpu(w), 1e-5f, yg);
          expect_close_as(rg, r, DType::F32, what + ": r");
          // the block's sum of squares over H in another order than the CPU's: F32 tolerance.
          expect_close_as(yg, y, yt, what + ": y");
        }
}

}  // namespace
}  // namespace aerie
