// Weight dequantization on CUDA against the CPU reference (kernels/cpu/quant.cc), bitwise: the goldens'
// weights, and random bytes / words covering every e4m3fn code (NaN included) and every nibble, with
// partial edge blocks, row ranges and both output dtypes. Skipped without a GPU.
#include <random>

#include "cuda_test_util.h"
#include "kernels/quant.h"
#include "quant_fixture.h"

namespace aerie {
namespace {

using testing::gpu;

// Bitwise equality of two F32 or BF16 tensors (any devices), except that any NaN equals any NaN: a GPU
// multiply returns the canonical NaN 0x7FFFFFFF where x86 keeps the operand's payload (measured on an
// H200: the NaN codes 0x7F / 0xFF times a scale differ in payload only).
void expect_same_bits(const Tensor& got, const Tensor& ref, const std::string& what) {
  const Tensor g = got.to_device(Device::CPU), r = ref.to_device(Device::CPU);
  ASSERT_EQ(g.nbytes(), r.nbytes()) << what;
  ASSERT_EQ(g.dtype(), r.dtype()) << what;
  const bool f32 = g.dtype() == DType::F32;
  const int64_t n = g.numel();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t a = 0, b = 0;
    if (f32) {
      a = static_cast<const uint32_t*>(g.raw())[i];
      b = static_cast<const uint32_t*>(r.raw())[i];
    } else {
      a = static_cast<const uint16_t*>(g.raw())[i];
      b = static_cast<const uint16_t*>(r.raw())[i];
    }
    auto nan = [f32](uint32_t u) { return f32 ? (u & 0x7fffffffu) > 0x7f800000u : (u & 0x7fffu) > 0x7f80u; };
    if (a != b && !(nan(a) && nan(b)) && ++bad <= 3) ADD_FAILURE() << what << "[" << i << "]: " << a << " vs " << b;
  }
  EXPECT_EQ(bad, 0) << what;
}

Tensor random_bytes(const Shape& s, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(s, dt);
  std::mt19937 gen(seed);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(gen());
  return t;
}

TEST(QuantCuda, Fp8BlockMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  struct Case {
    Tensor w, s;
  };
  std::vector<Case> cases = {{testing::golden("fp8.weight"), testing::golden("fp8.weight_scale_inv")}};
  for (auto [n, k] : {std::pair<int64_t, int64_t>{300, 257}, {1, 1}, {128, 128}})
    cases.push_back({random_bytes({n, k}, DType::F8E4M3, 7),
                     testing::random_tensor({(n + 127) / 128, (k + 127) / 128}, 8, 1e-4f, 1e-1f)});
  for (const Case& c : cases) {
    const int64_t n = c.w.dim(0), k = c.w.dim(1);
    const Tensor wg = gpu(c.w), sg = gpu(c.s);
    for (DType dt : {DType::BF16, DType::F32})
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n}, {n - 1, n}}) {
        const std::string what = shape_str(c.w.shape()) + " rows " + std::to_string(n0) + ".." +
                                 std::to_string(n1) + " " + dtype_name(dt);
        Tensor ref = Tensor::empty({n1 - n0, k}, dt), got = Tensor::empty({n1 - n0, k}, dt, Device::CUDA);
        dequant_fp8_block(c.w, c.s, n0, n1, ref);
        dequant_fp8_block(wg, sg, n0, n1, got);
        expect_same_bits(got, ref, what);
      }
  }
}

TEST(QuantCuda, Int4PackedMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  struct Case {
    Tensor packed, scale;
    int64_t k, group;
  };
  std::vector<Case> cases = {{testing::golden("int4.weight_packed"), testing::golden("int4.weight_scale"), 96, 32}};
  cases.push_back({random_bytes({300, 7168 / 8}, DType::I32, 9),
                   testing::random_tensor({300, 7168 / 32}, 10, -1e-2f, 1e-2f).to(DType::BF16), 7168, 32});
  cases.push_back({random_bytes({5, 5}, DType::I32, 11), testing::random_tensor({5, 4}, 12), 36, 9});  // K % 8 != 0
  for (const Case& c : cases) {
    const int64_t n = c.packed.dim(0);
    const Tensor pg = gpu(c.packed), sg = gpu(c.scale);
    for (DType dt : {DType::BF16, DType::F32})
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {n / 2, n}, {1, 2}}) {
        const std::string what = shape_str(c.packed.shape()) + " rows " + std::to_string(n0) + ".." +
                                 std::to_string(n1) + " " + dtype_name(dt);
        Tensor ref = Tensor::empty({n1 - n0, c.k}, dt), got = Tensor::empty({n1 - n0, c.k}, dt, Device::CUDA);
        dequant_int4_packed(c.packed, c.scale, c.k, c.group, n0, n1, ref);
        dequant_int4_packed(pg, sg, c.k, c.group, n0, n1, got);
        expect_same_bits(got, ref, what);
      }
  }
}

// One launch for many items (the experts of an MoE chunk): bitwise the CPU's single calls, for FP8 and
// INT4 items of different sizes and row ranges in one batch, into views of one stacked buffer.
TEST(QuantCuda, DequantBatchMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const Tensor fw = random_bytes({300, 257}, DType::F8E4M3, 21);
  const Tensor fs = testing::random_tensor({3, 3}, 22, 1e-4f, 1e-1f);
  const Tensor fw2 = random_bytes({260, 384}, DType::F8E4M3, 25);  // K % 8 == 0: the 8-wide path
  const Tensor fs2 = testing::random_tensor({3, 3}, 26, 1e-4f, 1e-1f);
  const Tensor ip = random_bytes({200, 7168 / 8}, DType::I32, 23);
  const Tensor is = testing::random_tensor({200, 7168 / 32}, 24, -1e-2f, 1e-2f).to(DType::BF16);
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t sizes[] = {300 * 257, 199 * 7168, 5 * 257, 200 * 7168, 130 * 384};
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    Tensor host = Tensor::zeros({total}, dt), dev = Tensor::zeros({total}, dt, Device::CUDA);
    auto items = [&](const Tensor& buf, const Tensor& w8, const Tensor& s8, const Tensor& w4, const Tensor& s4,
                     const Tensor& w82, const Tensor& s82) {
      int64_t o = 0;
      auto view = [&](int64_t rows, int64_t k) {
        Tensor v = buf.slice(o, o + rows * k).reshape({rows, k});
        o += rows * k;
        return v;
      };
      std::vector<DequantItem> v;
      v.push_back({false, w8, s8, 0, 0, 300, view(300, 257), "fp8 all"});
      v.push_back({true, w4, s4, 7168, 1, 200, view(199, 7168), "int4 1.."});
      v.push_back({false, w8, s8, 0, 127, 132, view(5, 257), "fp8 127..132"});
      v.push_back({true, w4, s4, 7168, 0, 200, view(200, 7168), "int4 all"});
      v.push_back({false, w82, s82, 0, 129, 259, view(130, 384), "fp8 8-wide 129..259"});
      return v;
    };
    dequant_batch(items(host, fw, fs, ip, is, fw2, fs2));
    dequant_batch(items(dev, gpu(fw), gpu(fs), gpu(ip), gpu(is), gpu(fw2), gpu(fs2)));
    expect_same_bits(dev, host, std::string("dequant_batch ") + dtype_name(dt));
  }
}

// The real-weight goldens (tools/reference/real_quant_golden.py) through the CUDA kernels, single and batched.
TEST(QuantCuda, RealWeightsEqualTheLibrariesBitwise) {
  AERIE_REQUIRE_CUDA();
  using testing::real_golden;
  const Tensor fw = gpu(real_golden("fp8.weight")), fs = gpu(real_golden("fp8.weight_scale_inv"));
  const Tensor iw = gpu(real_golden("int4.weight_packed")), is = gpu(real_golden("int4.weight_scale"));
  const int64_t k4 = iw.dim(1) * 8;
  Tensor f = Tensor::empty(fw.shape(), DType::BF16, Device::CUDA), i = Tensor::empty({iw.dim(0), k4}, DType::BF16, Device::CUDA);
  dequant_fp8_block(fw, fs, f);
  dequant_int4_packed(iw, is, k4, kInt4GroupSize, i);
  expect_same_bits(f, real_golden("fp8.dequant_bf16"), "fp8 single");
  expect_same_bits(i, real_golden("int4.dequant_bf16"), "int4 single");
  Tensor fb = Tensor::empty(fw.shape(), DType::BF16, Device::CUDA), ib = Tensor::empty({iw.dim(0), k4}, DType::BF16, Device::CUDA);
  dequant_batch({{false, fw, fs, 0, 0, fw.dim(0), fb, "q_proj"}, {true, iw, is, k4, 0, iw.dim(0), ib, "down_proj"}});
  expect_same_bits(fb, real_golden("fp8.dequant_bf16"), "fp8 batched");
  expect_same_bits(ib, real_golden("int4.dequant_bf16"), "int4 batched");
}

}  // namespace
}  // namespace aerie
