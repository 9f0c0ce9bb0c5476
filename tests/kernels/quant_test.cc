// Weight dequantization (kernels/quant.h) on the CPU against the goldens of
// tools/reference/quant_router_golden.py: torch's e4m3fn decode of all 256 codes, the block-FP8 formula
// on a 144 x 200 weight (partial edge blocks), compressed-tensors' pack-quantized INT4 on 64 x 96; all
// bitwise. Row ranges, the U8 / I32 / I64 variants and the error messages.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/fp8.h"
#include "kernel_test_util.h"
#include "kernels/quant.h"
#include "quant_fixture.h"

namespace aerie {
namespace {

using testing::bf16_bits;
using testing::expect_error;
using testing::golden;

std::vector<uint16_t> rows_of(const std::vector<uint16_t>& v, int64_t k, int64_t n0, int64_t n1) {
  return std::vector<uint16_t>(v.begin() + n0 * k, v.begin() + n1 * k);
}

TEST(Fp8, DecodesAllCodesAsTorch) {
  const Tensor& codes = golden("fp8.codes");
  const Tensor& bits = golden("fp8.codes_f32_bits");
  ASSERT_EQ(codes.numel(), 256);
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(codes.data<uint8_t>()[c], c);
    EXPECT_EQ(fp8_e4m3fn_to_f32_bits(static_cast<uint8_t>(c)), static_cast<uint32_t>(bits.data<int32_t>()[c]))
        << "code 0x" << std::hex << c;
  }
  // Spot values of the spec: 1.0, the max 448, the smallest subnormal 2^-9, -0, NaN.
  EXPECT_EQ(fp8_e4m3fn_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3fn_to_float(0x01), 0x1.0p-9f);
  EXPECT_EQ(fp8_e4m3fn_to_f32_bits(0x80), 0x80000000u);
  EXPECT_TRUE(std::isnan(fp8_e4m3fn_to_float(0x7F)) && std::isnan(fp8_e4m3fn_to_float(0xFF)));
  // Tensor::to widens F8E4M3 the same way.
  Tensor t = Tensor::empty({256}, DType::F8E4M3);
  std::memcpy(t.raw(), codes.raw(), 256);
  const Tensor f = t.to(DType::F32);
  EXPECT_EQ(std::memcmp(f.raw(), bits.raw(), 1024), 0);
  expect_error([&] { (void)f.to(DType::F8E4M3); }, "F8_E4M3");
}

TEST(Fp8, BlockDequantMatchesGoldenBitwise) {
  const Tensor& w = golden("fp8.weight");
  const Tensor& s = golden("fp8.weight_scale_inv");
  ASSERT_EQ(w.dtype(), DType::F8E4M3);
  const int64_t n = w.dim(0), k = w.dim(1);
  const auto want = bf16_bits(golden("fp8.dequant_bf16"));
  Tensor out = Tensor::empty({n, k}, DType::BF16);
  dequant_fp8_block(w, s, out);
  EXPECT_EQ(bf16_bits(out), want);
  // F32: the exact fp32 product, which rounds to the golden.
  Tensor f = Tensor::empty({n, k}, DType::F32);
  dequant_fp8_block(w, s, f);
  const float* fp = f.data<float>();
  const uint8_t* wp = static_cast<const uint8_t*>(w.raw());
  for (int64_t i = 0; i < n * k; ++i) {
    ASSERT_EQ(fp[i], fp8_e4m3fn_to_float(wp[i]) * s.data<float>()[(i / k / 128) * 2 + (i % k) / 128]) << i;
    ASSERT_EQ(bf16::from_float(fp[i]), want[static_cast<size_t>(i)]) << i;
  }
  // Row ranges (within a block, across the block edge, the partial last block, empty) and U8 bytes.
  Tensor wu = Tensor::wrap(const_cast<void*>(w.raw()), w.shape(), DType::U8);
  for (auto [n0, n1] : {std::pair<int64_t, int64_t>{100, 130}, {128, 144}, {0, 1}, {143, 144}, {5, 5}}) {
    Tensor o = Tensor::empty({n1 - n0, k}, DType::BF16);
    dequant_fp8_block(wu, s, n0, n1, o);
    EXPECT_EQ(bf16_bits(o), rows_of(want, k, n0, n1)) << n0 << ".." << n1;
  }
}

TEST(Fp8, RejectsBadShapesNamingThem) {
  const Tensor& w = golden("fp8.weight");
  Tensor out = Tensor::empty({144, 200}, DType::BF16);
  Tensor bad = Tensor::zeros({2, 1}, DType::F32);
  expect_error([&] { dequant_fp8_block(w, bad, out, "layers.0.self_attn.q_a_proj"); }, "[2, 1]");
  expect_error([&] { dequant_fp8_block(w, bad, out, "layers.0.self_attn.q_a_proj"); }, "[144, 200]");
  expect_error([&] { dequant_fp8_block(w, bad, out, "layers.0.self_attn.q_a_proj"); }, "q_a_proj");
  const Tensor& s = golden("fp8.weight_scale_inv");
  expect_error([&] { dequant_fp8_block(w, s.to(DType::BF16), out); }, "weight_scale_inv");
  expect_error([&] { dequant_fp8_block(w, s, 10, 200, out); }, "row range");
  expect_error([&] { dequant_fp8_block(w, s, 0, 10, out); }, "out");
  Tensor f32w = Tensor::zeros({144, 200}, DType::F32);
  expect_error([&] { dequant_fp8_block(f32w, s, out); }, "F8_E4M3");
}

TEST(Int4, PackQuantizedMatchesCompressedTensorsBitwise) {
  const Tensor& packed = golden("int4.weight_packed");
  const Tensor& scale = golden("int4.weight_scale");
  const Tensor& shape = golden("int4.weight_shape");
  EXPECT_EQ(shape.dtype(), DType::I64);  // compressed-tensors writes int64
  const int64_t k = int4_packed_in_features(shape, packed, "w");
  EXPECT_EQ(k, 96);
  const int64_t n = packed.dim(0);
  EXPECT_EQ(int4_packed_in_features(shape.to(DType::I32), packed), k);  // the Kimi-K2.5 checkpoint's int32
  const auto want = bf16_bits(golden("int4.dequant_bf16"));
  Tensor out = Tensor::empty({n, k}, DType::BF16);
  dequant_int4_packed(packed, scale, k, kInt4GroupSize, out);
  EXPECT_EQ(bf16_bits(out), want);
  // F32 output: the exact product (fp32 holds q * scale exactly), which rounds to the bf16 golden.
  Tensor f = Tensor::empty({n, k}, DType::F32);
  dequant_int4_packed(packed, scale, k, kInt4GroupSize, f);
  const float* fp = f.data<float>();
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(bf16::from_float(fp[i]), want[static_cast<size_t>(i)]) << i;
  // F32 scales give the same values; row ranges.
  Tensor f2 = Tensor::empty({n, k}, DType::BF16);
  dequant_int4_packed(packed, scale.to(DType::F32), k, kInt4GroupSize, f2);
  EXPECT_EQ(bf16_bits(f2), want);
  for (auto [n0, n1] : {std::pair<int64_t, int64_t>{3, 17}, {63, 64}, {0, 64}, {7, 7}}) {
    Tensor o = Tensor::empty({n1 - n0, k}, DType::BF16);
    dequant_int4_packed(packed, scale, k, kInt4GroupSize, n0, n1, o);
    EXPECT_EQ(bf16_bits(o), rows_of(want, k, n0, n1)) << n0 << ".." << n1;
  }
}

TEST(Int4, NibbleOrderAndOffset) {
  // One row of 8 values -8..7 packed by hand as compressed-tensors does: value + 8, lowest nibble first.
  const int q[8] = {-8, 7, 0, -1, 3, -5, 1, 6};
  uint32_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(q[i] + 8) << (4 * i);
  Tensor packed = Tensor::from_vector<int32_t>({static_cast<int32_t>(word)}, {1, 1});
  Tensor scale = Tensor::from_vector<float>({0.5f}, {1, 1});
  Tensor out = Tensor::empty({1, 8}, DType::F32);
  dequant_int4_packed(packed, scale, 8, 8, out);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out.data<float>()[i], 0.5f * static_cast<float>(q[i])) << i;
}

TEST(Int4, RejectsBadShapesNamingThem) {
  const Tensor& packed = golden("int4.weight_packed");
  const Tensor& scale = golden("int4.weight_scale");
  Tensor out = Tensor::empty({64, 96}, DType::BF16);
  Tensor bad = Tensor::zeros({64, 4}, DType::BF16);
  expect_error([&] { dequant_int4_packed(packed, bad, 96, 32, out, "experts.3.down_proj"); }, "[64, 4]");
  expect_error([&] { dequant_int4_packed(packed, bad, 96, 32, out, "experts.3.down_proj"); }, "[64, 3]");
  expect_error([&] { dequant_int4_packed(packed, bad, 96, 32, out, "experts.3.down_proj"); }, "down_proj");
  expect_error([&] { dequant_int4_packed(packed, scale, 95, 32, out); }, "K = 95");
  expect_error([&] { dequant_int4_packed(packed, scale, 96, 20, out); }, "group size 20");
  expect_error([&] { dequant_int4_packed(packed, scale, 96, 32, 0, 65, out); }, "row range");
  expect_error([&] { dequant_int4_packed(packed.to(DType::I64), scale, 96, 32, out); }, "weight_packed");
  Tensor shape = Tensor::from_vector<int64_t>({64, 128}, {2});
  expect_error([&] { (void)int4_packed_in_features(shape, packed, "experts.3.down_proj"); }, "(64, 128)");
  expect_error([&] { (void)int4_packed_in_features(shape, packed, "experts.3.down_proj"); }, "down_proj");
  Tensor shape3 = Tensor::from_vector<int64_t>({64, 96, 1}, {3});
  expect_error([&] { (void)int4_packed_in_features(shape3, packed); }, "weight_shape");
}

// dequant_batch is one dequant_fp8_block / dequant_int4_packed call per item, bit for bit (row ranges,
// F32 and BF16 outputs, views into one stacked buffer), and checks each item as the single call does.
TEST(DequantBatch, EqualsOneCallPerItem) {
  const Tensor fw = golden("fp8.weight"), fs = golden("fp8.weight_scale_inv");
  const Tensor ip = golden("int4.weight_packed"), is = golden("int4.weight_scale");
  const int64_t fn = fw.dim(0), fk = fw.dim(1), in = ip.dim(0), ik = 96;
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor stacked = Tensor::zeros({fn * fk + (in - 1) * ik + 2 * fk}, dt);
    Tensor a = stacked.slice(0, fn * fk).reshape({fn, fk});
    Tensor b = stacked.slice(fn * fk, fn * fk + (in - 1) * ik).reshape({in - 1, ik});
    Tensor c = stacked.slice(fn * fk + (in - 1) * ik, fn * fk + (in - 1) * ik + 2 * fk).reshape({2, fk});
    dequant_batch({{false, fw, fs, 0, 0, fn, a, "a"}, {true, ip, is, ik, 1, in, b, "b"},
                   {false, fw, fs, 0, fn - 2, fn, c, "c"}});
    Tensor ra = Tensor::empty({fn, fk}, dt), rb = Tensor::empty({in - 1, ik}, dt), rc = Tensor::empty({2, fk}, dt);
    dequant_fp8_block(fw, fs, ra);
    dequant_int4_packed(ip, is, ik, kInt4GroupSize, 1, in, rb);
    dequant_fp8_block(fw, fs, fn - 2, fn, rc);
    EXPECT_EQ(a.to_float_vector(), ra.to_float_vector());
    EXPECT_EQ(b.to_float_vector(), rb.to_float_vector());
    EXPECT_EQ(c.to_float_vector(), rc.to_float_vector());
  }
  Tensor bad = Tensor::empty({2, 5}, DType::F32);
  try {
    dequant_batch({{false, fw, fs, 0, 0, 2, bad, "model.layers.1.mlp.experts.3.up_proj.weight"}});
    ADD_FAILURE() << "no error for an out of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.3.up_proj"), std::string::npos) << e.what();
  }
}

// Real weights (SmolLM2-135M-Instruct's q_proj and down_proj slices, tools/reference/real_quant_golden.py):
// aerie's dequantization equals torch's block-FP8 formula and compressed-tensors' decompress bit for bit in
// BF16, and its F32 output rounds to the same bf16 (both goldens are the fp32 product rounded once).
TEST(RealWeights, DequantizationEqualsTheLibrariesBitwise) {
  using testing::real_golden;
  const Tensor& fw = real_golden("fp8.weight");
  const Tensor& iw = real_golden("int4.weight_packed");
  const int64_t k4 = iw.dim(1) * 8;
  for (DType dt : {DType::BF16, DType::F32}) {
    Tensor f = Tensor::empty(fw.shape(), dt), i = Tensor::empty({iw.dim(0), k4}, dt);
    dequant_fp8_block(fw, real_golden("fp8.weight_scale_inv"), f, "q_proj");
    dequant_int4_packed(iw, real_golden("int4.weight_scale"), k4, kInt4GroupSize, i, "down_proj");
    EXPECT_EQ(bf16_bits(f.to(DType::BF16)), bf16_bits(real_golden("fp8.dequant_bf16"))) << dtype_name(dt);
    EXPECT_EQ(bf16_bits(i.to(DType::BF16)), bf16_bits(real_golden("int4.dequant_bf16"))) << dtype_name(dt);
  }
}

// float_to_fp8_e4m3fn (the fp8 shards' encoder): every finite code round-trips, the midpoint between two
// neighbouring codes goes to the even one and the next float above / below it to the upper / lower one,
// magnitudes beyond 448 saturate to +-448 (e4m3fn has no infinity), NaN stays NaN.
TEST(Fp8, EncodesRoundToNearestEvenAndSaturates) {
  for (int c = 0; c < 256; ++c) {
    const float f = fp8_e4m3fn_to_float(static_cast<uint8_t>(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_fp8_e4m3fn(f), c) << "code " << c;
  }
  for (int c = 0; c < 0x7E; ++c) {
    const float a = fp8_e4m3fn_to_float(static_cast<uint8_t>(c)), b = fp8_e4m3fn_to_float(static_cast<uint8_t>(c + 1));
    const float mid = (a + b) / 2;  // exact: the codes differ in one step
    EXPECT_EQ(float_to_fp8_e4m3fn(mid), c % 2 == 0 ? c : c + 1) << "between " << c << " and " << c + 1;
    EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(mid, 1e9f)), c + 1) << c;
    EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(float_to_fp8_e4m3fn(-mid), (c % 2 == 0 ? c : c + 1) | 0x80) << c;
  }
  EXPECT_EQ(float_to_fp8_e4m3fn(1e6f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3fn(-500.0f), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3fn(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3fn(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(float_to_fp8_e4m3fn(1e-30f), 0x00);
}

}  // namespace
}  // namespace aerie
