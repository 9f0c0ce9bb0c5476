// The absorbed-decode ops (kernels/mla.h) on CUDA against the CPU reference: the strided batched GEMM
// over per-head slices (tolerance: summation order only, (3 K + 8) u sum|a b| as gemm_cuda_test.cc
// argues, plus one bf16 ulp for a BF16 c), and the causal softmax (a few fp32 ulps: __expf and the
// order of the sum). Skipped without a GPU.
#include <cmath>

#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/mla.h"

namespace aerie {
namespace {

using testing::gpu;
using testing::random_tensor;

TEST(MlaCuda, StridedBatchedMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const int64_t m = 5, nh = 16, dk = 192, nope = 128, vd = 128, lora = 512;
  const Tensor q = random_tensor({m, nh, dk}, 1), w = random_tensor({nh * (nope + vd), lora}, 2);
  for (bool trans_b : {false, true}) {
    const int64_t k = trans_b ? lora : nope, n = trans_b ? vd : lora, lda = trans_b ? lora : nh * dk;
    const Tensor a = trans_b ? random_tensor({m, nh, lora}, 3) : q;
    const int64_t sa = trans_b ? lora : dk, b_off = trans_b ? nope * lora : 0;
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (trans_b ? " trans_b" : ""));
      const Tensor ah = a.to(dt), wh = w.to(dt), ag = gpu(ah), wg = gpu(wh);
      Tensor ch = Tensor::zeros({m, nh, n}, dt), cg = gpu(ch);
      matmul_strided_batched({&ah, 0, lda, sa}, {&wh, b_off, lora, (nope + vd) * lora}, {&ch, 0, nh * n, n}, m, n, k,
                             nh, trans_b);
      matmul_strided_batched({&ag, 0, lda, sa}, {&wg, b_off, lora, (nope + vd) * lora}, {&cg, 0, nh * n, n}, m, n, k,
                             nh, trans_b);
      const auto got = cg.to_device(Device::CPU).to_float_vector(), ref = ch.to_float_vector();
      // |a|, |w| < 1: sum |a b| <= k; bound by k for every element.
      const double u = 1.0 / (1 << 24), tol = (3.0 * k + 8.0) * u * k;
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double t = tol + (dt == DType::BF16 ? std::ldexp(std::fabs(ref[i]), -7) : 0.0);
        if (!(std::fabs(got[i] - ref[i]) <= t) && ++bad <= 3) ADD_FAILURE() << i << ": " << got[i] << " vs " << ref[i];
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(MlaCuda, CausalSoftmaxMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const int64_t group = 64, tokens = 4, p0 = 1000, L = p0 + tokens;
  const Tensor s = random_tensor({group * tokens, L}, 4, -20.0f, 20.0f);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor ph = Tensor::empty({group * tokens, L}, dt), pg = Tensor::empty({group * tokens, L}, dt, Device::CUDA);
    causal_softmax_rows(s, 0.1f, group, p0, ph);
    causal_softmax_rows(gpu(s), 0.1f, group, p0, pg);
    const auto got = pg.to_device(Device::CPU).to_float_vector(), ref = ph.to_float_vector();
    int bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double t = (dt == DType::F32 ? 1e-5 : 8e-3) * std::fabs(ref[i]) + 1e-9;
      if (!(std::fabs(got[i] - ref[i]) <= t) && ++bad <= 3) ADD_FAILURE() << i << ": " << got[i] << " vs " << ref[i];
    }
    EXPECT_EQ(bad, 0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

TEST(MlaCuda, ExpandKvMatchesCpuBitwise) {
  AERIE_REQUIRE_CUDA();
  const int64_t L = 37, nh = 16, nope = 128, vd = 128, lora = 512, rope = 64, dk = nope + rope;
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor kv = testing::random_tensor({L, nh * (nope + vd)}, 9).to(dt);
    const Tensor lat = testing::random_tensor({L, lora + rope}, 10).to(dt);
    Tensor K = Tensor::empty({L, nh, dk}, dt), V = Tensor::empty({L, nh, dk}, dt);
    Tensor Kg = Tensor::empty({L, nh, dk}, dt, Device::CUDA), Vg = Tensor::empty({L, nh, dk}, dt, Device::CUDA);
    mla_expand_kv(kv, lat, nope, vd, lora, K, V);
    mla_expand_kv(testing::gpu(kv), testing::gpu(lat), nope, vd, lora, Kg, Vg);
    EXPECT_EQ(Kg.to_device(Device::CPU).to_float_vector(), K.to_float_vector()) << dtype_name(dt);
    EXPECT_EQ(Vg.to_device(Device::CPU).to_float_vector(), V.to_float_vector()) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace aerie
