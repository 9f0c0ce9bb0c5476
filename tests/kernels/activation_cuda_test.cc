// SwiGLU on CUDA against the CPU reference (kernels/cpu/activation.cc): F32/BF16 inputs and outputs,
// forward and backward, outputs aliasing inputs, odd sizes. Skipped without a GPU.
#include "cuda_test_util.h"
#include "kernels/activation.h"

namespace aerie {
namespace {

using testing::expect_close_as;
using testing::gpu;
using testing::random_as;

struct Rows {
  int64_t n, i;
};
const Rows kShapes[] = {{1, 1}, {1, 4096}, {7, 33}, {64, 11008}, {3, 1000}};

TEST(SwigluCuda, ForwardAndBackwardMatchCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Rows& s : kShapes)
    for (DType in : {DType::F32, DType::BF16})
      for (DType out : {DType::F32, DType::BF16}) {
        const std::string what = "N " + std::to_string(s.n) + " I " + std::to_string(s.i) + " " + dtype_name(in) +
                                 " -> " + dtype_name(out);
        const Shape sh{s.n, s.i};
        Tensor gate = random_as(sh, in, 21, -6.0f, 6.0f), up = random_as(sh, in, 22, -2.0f, 2.0f);
        Tensor dout = random_as(sh, out, 23);
        Tensor o = Tensor::empty(sh, out), dg = Tensor::empty(sh, out), du = Tensor::empty(sh, out);
        swiglu_forward(gate, up, o);
        swiglu_backward(dout, gate, up, dg, du);

        Tensor gg = gpu(gate), ug = gpu(up), dog = gpu(dout);
        Tensor og = Tensor::empty(sh, out, Device::CUDA), dgg = Tensor::empty(sh, out, Device::CUDA),
               dug = Tensor::empty(sh, out, Device::CUDA);
        swiglu_forward(gg, ug, og);
        swiglu_backward(dog, gg, ug, dgg, dug);
        expect_close_as(og, o, out, "out " + what);
        expect_close_as(dgg, dg, out, "dgate " + what);
        expect_close_as(dug, du, out, "dup " + what);

        // dgate written over dout (same dtype): the same values.
        swiglu_backward(dog, gg, ug, dog, dug);
        EXPECT_EQ(dog.to_float_vector(), dgg.to_float_vector()) << what;
      }
}

// All-BF16 tensors of a multiple of 8 elements at 16-byte aligned addresses take the 8-elements-per-thread
// kernel; the same data at an address 8 bytes off takes the scalar one: equal bit for bit.
TEST(SwigluCuda, VectorizedBf16EqualsTheScalarKernel) {
  AERIE_REQUIRE_CUDA();
  const int64_t rows = 2 * 1000 + 1;  // [rows, 4] bf16: rows 1.. start 8 bytes into the buffer
  Tensor g = gpu(random_as({rows, 4}, DType::BF16, 31, -6.0f, 6.0f)), u = gpu(random_as({rows, 4}, DType::BF16, 32));
  Tensor d = gpu(random_as({rows, 4}, DType::BF16, 33));
  auto run = [&](const Tensor& gg, const Tensor& ug, const Tensor& dg) {
    const Shape sh = gg.shape();
    Tensor o = Tensor::empty(sh, DType::BF16, Device::CUDA), a = Tensor::empty(sh, DType::BF16, Device::CUDA),
           b = Tensor::empty(sh, DType::BF16, Device::CUDA);
    swiglu_forward(gg, ug, o);
    swiglu_backward(dg, gg, ug, a, b);
    return std::vector<std::vector<float>>{o.to_float_vector(), a.to_float_vector(), b.to_float_vector()};
  };
  const Tensor gs = g.slice(1, rows), us = u.slice(1, rows), ds = d.slice(1, rows);  // misaligned: scalar
  EXPECT_EQ(run(gs.clone(), us.clone(), ds.clone()), run(gs, us, ds));
}

TEST(SwigluCuda, MixedInputDtypes) {
  AERIE_REQUIRE_CUDA();
  const Shape sh{5, 77};
  Tensor gate = random_as(sh, DType::BF16, 24, -6.0f, 6.0f), up = random_as(sh, DType::F32, 25);
  Tensor o = Tensor::empty(sh, DType::F32);
  swiglu_forward(gate, up, o);
  Tensor og = Tensor::empty(sh, DType::F32, Device::CUDA);
  swiglu_forward(gpu(gate), gpu(up), og);
  expect_close_as(og, o, DType::F32, "out");
}

}  // namespace
}  // namespace aerie
