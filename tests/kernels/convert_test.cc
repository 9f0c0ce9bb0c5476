// convert: exact CPU results on chosen bit patterns (round-to-nearest-even ties, NaN, Inf, overflow,
// subnormals), every bf16 pattern round-tripped, int widening/narrowing, errors; CUDA equal to the CPU
// bit for bit.
#include "kernels/convert.h"

#include <cstring>
#include <limits>
#include <random>

#include "kernel_test_util.h"

namespace aerie {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// (fp32 bits, expected bf16 bits) pairs: round to nearest, ties to even, NaN quiet, Inf and overflow.
const std::vector<std::pair<uint32_t, uint16_t>> kCases = {
    {0x3f800000u, 0x3f80},  // 1
    {0x3f808000u, 0x3f80},  // 1 + 2^-8: tie between 1 and 1 + 2^-7, to the even 1
    {0x3f818000u, 0x3f82},  // 1 + 3 * 2^-8: tie, to the even 1 + 2^-6
    {0x3f808001u, 0x3f81},  // just above the tie: up
    {0x3f807fffu, 0x3f80},  // just below the tie: down
    {0xbf818000u, 0xbf82},  // the tie again, negative
    {0x80000000u, 0x8000},  // -0
    {0x00000000u, 0x0000},  // +0
    {0x7f800000u, 0x7f80},  // +Inf
    {0xff800000u, 0xff80},  // -Inf
    {0x7fc00000u, 0x7fc0},  // quiet NaN
    {0xffc00000u, 0xffc0},  // negative quiet NaN
    {0x7f800001u, 0x7fc0},  // signalling NaN whose payload is below bf16: still NaN, made quiet
    {0x7fbfffffu, 0x7fff},  // NaN with a full payload: not rounded into Inf or the next exponent
    {0x7f7fffffu, 0x7f80},  // FLT_MAX overflows to +Inf
    {0x7f7f7fffu, 0x7f7f},  // the largest value that rounds down to the bf16 max
    {0x00010000u, 0x0001},  // the smallest bf16 subnormal, exact
    {0x00018000u, 0x0002},  // subnormal tie, to even
    {0x00008000u, 0x0000},  // half the smallest subnormal: tie, to even 0
    {0x00000001u, 0x0000},  // the smallest fp32 subnormal rounds to 0
};

TEST(Convert, F32ToBf16RoundsToNearestEven) {
  std::vector<float> in;
  for (auto [f, b] : kCases) in.push_back(from_bits(f));
  Tensor src = Tensor::from_vector(in, {static_cast<int64_t>(in.size())});
  Tensor dst = Tensor::empty(src.shape(), DType::BF16);
  convert(src, dst);
  for (size_t i = 0; i < kCases.size(); ++i)
    EXPECT_EQ(dst.data<bf16>()[i].bits, kCases[i].second) << "fp32 bits 0x" << std::hex << kCases[i].first;
}

TEST(Convert, EveryBf16RoundTripsExactly) {
  Tensor b = Tensor::empty({65536}, DType::BF16);
  for (uint32_t i = 0; i < 65536; ++i) b.data<bf16>()[i].bits = static_cast<uint16_t>(i);
  Tensor f = Tensor::empty({65536}, DType::F32), back = Tensor::empty({65536}, DType::BF16);
  convert(b, f);
  convert(f, back);
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(bits_of(f.data<float>()[i]), i << 16) << i;  // BF16 -> F32 is exact
    const bool nan = (i & 0x7fffu) > 0x7f80u;
    // Back again: the same bits, except that NaNs come back quiet.
    ASSERT_EQ(back.data<bf16>()[i].bits, nan ? (i | 0x40u) : i) << "bf16 bits 0x" << std::hex << i;
  }
}

TEST(Convert, IntsWidenAndNarrow) {
  const std::vector<int32_t> v = {0, 1, -1, 123456789, std::numeric_limits<int32_t>::min(),
                                  std::numeric_limits<int32_t>::max()};
  Tensor i32 = Tensor::from_vector(v, {2, 3});
  Tensor i64 = Tensor::empty({2, 3}, DType::I64), back = Tensor::empty({2, 3}, DType::I32);
  convert(i32, i64);
  convert(i64, back);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(i64.data<int64_t>()[i], static_cast<int64_t>(v[i]));
    EXPECT_EQ(back.data<int32_t>()[i], v[i]);
  }
  // Outside int32: static_cast (wraps modulo 2^32), as documented.
  Tensor big = Tensor::from_vector<int64_t>({(int64_t{1} << 32) + 5}, {1});
  Tensor small = Tensor::empty({1}, DType::I32);
  convert(big, small);
  EXPECT_EQ(small.data<int32_t>()[0], 5);
}

TEST(Convert, AgreesWithTensorToAndCopiesSameDtype) {
  Tensor x = testing::random_tensor({33, 17}, 11, -1e4f, 1e4f);
  Tensor b = Tensor::empty(x.shape(), DType::BF16);
  convert(x, b);
  const Tensor want = x.to(DType::BF16);
  EXPECT_EQ(std::memcmp(b.raw(), want.raw(), b.nbytes()), 0);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  convert(x, y);
  EXPECT_EQ(y.to_float_vector(), x.to_float_vector());
}

TEST(Convert, ErrorsNameTheTensor) {
  Tensor x = Tensor::zeros({4, 3}, DType::F32);
  Tensor bad_shape = Tensor::empty({3, 4}, DType::BF16);
  testing::expect_error([&] { convert(x, bad_shape); }, "convert: dst");
  Tensor ints = Tensor::empty({4, 3}, DType::I32);
  testing::expect_error([&] { convert(x, ints); }, "no conversion from F32");
}

// CUDA: the same conversions on the GPU give the CPU's bits.
void expect_cuda_equals_cpu(const Tensor& src, DType to) {
  Tensor want = Tensor::empty(src.shape(), to);
  convert(src, want);
  Tensor got = Tensor::empty(src.shape(), to, Device::CUDA);
  convert(src.to_device(Device::CUDA), got);
  const Tensor host = got.to_device(Device::CPU);
  EXPECT_EQ(std::memcmp(host.raw(), want.raw(), want.nbytes()), 0)
      << dtype_name(src.dtype()) << " -> " << dtype_name(to) << " of " << src.numel() << " elements";
}

TEST(ConvertCuda, EqualsCpuBitwise) {
  AERIE_REQUIRE_CUDA();
  // Special values, then random values over a wide range, at sizes below one block, odd, and beyond
  // one grid-stride pass (65535 blocks x 256 threads = 16.8M elements).
  for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{1000003}, int64_t{17000001}}) {
    SCOPED_TRACE(n);
    Tensor f = testing::random_tensor({n}, static_cast<uint32_t>(n), -1e38f, 1e38f);
    for (size_t i = 0; i < kCases.size() && static_cast<int64_t>(i) < n; ++i)
      f.data<float>()[i] = from_bits(kCases[i].first);
    if (n > 1000) f.data<float>()[n / 2] = from_bits(0x3f808000u);  // a tie somewhere in the middle
    expect_cuda_equals_cpu(f, DType::BF16);
    Tensor b = Tensor::empty({n}, DType::BF16);
    for (int64_t i = 0; i < n; ++i) b.data<bf16>()[i].bits = static_cast<uint16_t>(i * 2654435761u >> 16);
    expect_cuda_equals_cpu(b, DType::F32);
    Tensor i64 = Tensor::empty({n}, DType::I64);
    std::mt19937_64 gen(static_cast<uint64_t>(n));
    for (int64_t i = 0; i < n; ++i) i64.data<int64_t>()[i] = static_cast<int64_t>(gen());
    expect_cuda_equals_cpu(i64, DType::I32);
    Tensor i32 = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) i32.data<int32_t>()[i] = static_cast<int32_t>(gen());
    expect_cuda_equals_cpu(i32, DType::I64);
  }
  // Every bf16 pattern, and a same-dtype copy on the device.
  Tensor all = Tensor::empty({65536}, DType::BF16);
  for (uint32_t i = 0; i < 65536; ++i) all.data<bf16>()[i].bits = static_cast<uint16_t>(i);
  expect_cuda_equals_cpu(all, DType::F32);
  expect_cuda_equals_cpu(all, DType::BF16);
}

TEST(ConvertCuda, MixedDevicesNameTheTensor) {
  AERIE_REQUIRE_CUDA();
  Tensor x = Tensor::zeros({4}, DType::F32);
  Tensor y = Tensor::empty({4}, DType::BF16, Device::CUDA);
  testing::expect_error([&] { convert(x, y); }, "tensor dst is on cuda");
}

}  // namespace
}  // namespace aerie
