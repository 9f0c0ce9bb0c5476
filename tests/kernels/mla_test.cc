// The ops of MLA's absorbed decode (kernels/mla.h) on the CPU against naive double-precision loops:
// matmul_strided_batched reading per-head slices in place (offsets, leading dimensions, batch strides,
// both op(B)), with F32 and BF16 inputs and outputs; causal_softmax_rows' masking by (token, head) row;
// and their errors.
#include "kernels/mla.h"

#include <cmath>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

TEST(MatmulStridedBatched, PerHeadSlicesInPlace) {
  // a = q [m, nh, dk] read as nh matrices [m, nope] (ld nh dk, stride dk); b = kv_b [nh (nope + v), lora]
  // read as nh matrices [nope, lora] (stride (nope + v) lora) or [v, lora]^T; c [m, nh, n] (ld nh n).
  const int64_t m = 3, nh = 4, dk = 12, nope = 8, vd = 5, lora = 6;
  const Tensor q = random_tensor({m, nh, dk}, 1), w = random_tensor({nh * (nope + vd), lora}, 2);
  for (bool trans_b : {false, true}) {
    const int64_t k = trans_b ? lora : nope, n = trans_b ? vd : lora;
    const int64_t b_off = trans_b ? nope * lora : 0;
    // trans_b: a is [m, lora] slices of q's first lora columns per head.
    for (DType dt : {DType::F32, DType::BF16}) {
      const Tensor qa = q.to(dt), wa = w.to(dt);
      Tensor c = Tensor::zeros({m, nh, n}, dt);
      matmul_strided_batched({&qa, 0, nh * dk, dk}, {&wa, b_off, lora, (nope + vd) * lora}, {&c, 0, nh * n, n}, m, n, k,
                             nh, trans_b);
      const auto qv = qa.to_float_vector(), wv = wa.to_float_vector(), cv = c.to_float_vector();
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double x = qv[(i * nh + h) * dk + p];
              const double y = trans_b ? wv[b_off + h * (nope + vd) * lora + j * lora + p]
                                       : wv[h * (nope + vd) * lora + p * lora + j];
              s += x * y;
            }
            const double tol = dt == DType::F32 ? 1e-5 : 1e-2 * std::fabs(s) + 1e-5;
            ASSERT_NEAR(cv[(i * nh + h) * n + j], s, tol) << "head " << h << " row " << i << " col " << j
                                                          << " trans_b " << trans_b << " " << dtype_name(dt);
          }
    }
  }
  // BF16 inputs into an F32 c: the fp32 sums unrounded.
  const Tensor qb = q.to(DType::BF16), wb = w.to(DType::BF16);
  Tensor c32 = Tensor::zeros({m, nh, lora}, DType::F32), cb = Tensor::zeros({m, nh, lora}, DType::BF16);
  matmul_strided_batched({&qb, 0, nh * dk, dk}, {&wb, 0, lora, (nope + vd) * lora}, {&c32, 0, nh * lora, lora}, m, lora,
                         nope, nh, false);
  matmul_strided_batched({&qb, 0, nh * dk, dk}, {&wb, 0, lora, (nope + vd) * lora}, {&cb, 0, nh * lora, lora}, m, lora,
                         nope, nh, false);
  EXPECT_EQ(c32.to(DType::BF16).to_float_vector(), cb.to_float_vector());
}

TEST(MatmulStridedBatched, ViewsOutsideTheirTensorAreNamed) {
  const Tensor a = random_tensor({4, 4}, 1), b = random_tensor({4, 4}, 2);
  Tensor c = Tensor::zeros({4, 4}, DType::F32);
  testing::expect_error([&] { matmul_strided_batched({&a, 0, 4, 12}, {&b, 0, 4, 0}, {&c, 0, 4, 0}, 2, 2, 2, 2, false); },
                        "a (2 x [2, 2], offset 0, ld 4, stride 12) reaches past its tensor [4, 4]");
  testing::expect_error([&] { matmul_strided_batched({&a, 0, 1, 0}, {&b, 0, 4, 0}, {&c, 0, 4, 0}, 2, 2, 2, 1, false); },
                        "a has ld 1 for rows of 2");
  const Tensor ab = a.to(DType::BF16);
  testing::expect_error([&] { matmul_strided_batched({&ab, 0, 4, 0}, {&b, 0, 4, 0}, {&c, 0, 4, 0}, 2, 2, 2, 1, false); },
                        "a is BF16, b F32");
}

TEST(CausalSoftmaxRows, MasksByTokenNotByRow) {
  // 3 tokens x 2 heads from position 4: rows 0-1 see keys 0..4, rows 2-3 keys 0..5, rows 4-5 keys 0..6.
  const int64_t group = 2, R = 6, L = 7, p0 = 4;
  const float scale = 0.7f;
  const Tensor s = random_tensor({R, L}, 3, -3.0f, 3.0f);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor p = Tensor::empty({R, L}, dt);
    causal_softmax_rows(s, scale, group, p0, p);
    const auto sv = s.to_float_vector(), pv = p.to_float_vector();
    for (int64_t r = 0; r < R; ++r) {
      const int64_t keys = p0 + r / group + 1;
      double mx = -1e30, sum = 0;
      for (int64_t j = 0; j < keys; ++j) mx = std::max(mx, double{scale} * sv[r * L + j]);
      for (int64_t j = 0; j < keys; ++j) sum += std::exp(double{scale} * sv[r * L + j] - mx);
      for (int64_t j = 0; j < L; ++j) {
        const double want = j < keys ? std::exp(double{scale} * sv[r * L + j] - mx) / sum : 0.0;
        ASSERT_NEAR(pv[r * L + j], want, dt == DType::F32 ? 1e-6 : 4e-3 * want + 1e-7) << "row " << r << " key " << j;
      }
    }
  }
  Tensor p = Tensor::empty({R, L}, DType::F32);
  testing::expect_error([&] { causal_softmax_rows(s, scale, group, 5, p); }, "do not fit 7 keys");
  testing::expect_error([&] { causal_softmax_rows(s, scale, 4, 0, p); }, "6 rows in groups of 4");
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

TEST(MlaExpandKv, KeysValuesAndTheSharedRopeKey) {
  const int64_t L = 3, nh = 2, nope = 4, vd = 3, lora = 5, rope = 2, dk = nope + rope;
  const Tensor kv = testing::random_tensor({L, nh * (nope + vd)}, 7), lat = testing::random_tensor({L, lora + rope}, 8);
  Tensor K = Tensor::empty({L, nh, dk}, DType::F32), V = Tensor::empty({L, nh, dk}, DType::F32);
  mla_expand_kv(kv, lat, nope, vd, lora, K, V);
  const auto kvv = kv.to_float_vector(), lv = lat.to_float_vector(), Kv = K.to_float_vector(), Vv = V.to_float_vector();
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t c = 0; c < dk; ++c) {
        const float k = c < nope ? kvv[l * nh * (nope + vd) + h * (nope + vd) + c] : lv[l * (lora + rope) + lora + c - nope];
        const float v = c < vd ? kvv[l * nh * (nope + vd) + h * (nope + vd) + nope + c] : 0.0f;
        ASSERT_EQ(Kv[(l * nh + h) * dk + c], k) << l << " " << h << " " << c;
        ASSERT_EQ(Vv[(l * nh + h) * dk + c], v) << l << " " << h << " " << c;
      }
  Tensor bad = Tensor::empty({L, nh, 2}, DType::F32);
  testing::expect_error([&] { mla_expand_kv(kv, lat, nope, vd, lora, K, bad); }, "do not fit nope 4, v 3");
}

}  // namespace
}  // namespace aerie
