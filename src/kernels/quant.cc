// Weight dequantization: checks and device dispatch (see quant.h).
#include "kernels/quant.h"

#include "kernels/dispatch.h"
#ifdef AERIE_WITH_CUDA
#include "kernels/cuda/quant.h"
#endif

namespace aerie {
namespace cpu {
// cpu/quant.cc: out (n1 - n0, K) F32|BF16 from the absolute rows [n0, n1); arguments already checked.
void dequant_fp8_block(const uint8_t* w /* (N, K) */, const float* scale_inv /* (ceil N/128, ceil K/128) */,
                       int64_t n0, int64_t n1, int64_t k, void* out, DType out_dtype);
void dequant_int4_packed(const int32_t* packed /* (N, ceil K/8) */, const void* scale /* (N, K/group) */,
                         DType scale_dtype, int64_t k, int64_t group, int64_t n0, int64_t n1, void* out,
                         DType out_dtype);
}  // namespace cpu

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// " of <name>" when a name is given (error messages), else "".
std::string of(const std::string& name) { return name.empty() ? std::string() : " of " + name; }

void check_rows_out(const char* op, int64_t n, int64_t k, int64_t n0, int64_t n1, const Tensor& out,
                    const std::string& name) {
  AERIE_CHECK(0 <= n0 && n0 <= n1 && n1 <= n,
              op << ": row range [" << n0 << ", " << n1 << ")" << of(name) << " is not within [0, " << n << ")");
  out.check_shape({n1 - n0, k}, kernels::what(op, "out") + of(name));
  kernels::check_float(out, op, "out");
}

}  // namespace

void dequant_fp8_block(const Tensor& weight, const Tensor& scale_inv, int64_t n0, int64_t n1, Tensor& out,
                       const std::string& name) {
  constexpr const char* op = "dequant_fp8_block";
  AERIE_CHECK(weight.ndim() == 2, op << ": weight" << of(name) << " must be [N, K], got " << shape_str(weight.shape()));
  AERIE_CHECK(weight.dtype() == DType::F8E4M3 || weight.dtype() == DType::U8,
              op << ": weight" << of(name) << " must be F8_E4M3 (or U8 bytes), got " << dtype_name(weight.dtype()));
  const int64_t n = weight.dim(0), k = weight.dim(1);
  const Shape want = {ceil_div(n, kFp8BlockSize), ceil_div(k, kFp8BlockSize)};
  AERIE_CHECK(scale_inv.shape() == want,
              op << ": weight_scale_inv" << of(name) << " has shape " << shape_str(scale_inv.shape())
                 << ", but the weight " << shape_str(weight.shape()) << " in " << kFp8BlockSize << "x"
                 << kFp8BlockSize << " blocks needs " << shape_str(want));
  scale_inv.check_dtype(DType::F32, kernels::what(op, "weight_scale_inv") + of(name));
  check_rows_out(op, n, k, n0, n1, out, name);
  const Device dev = kernels::common_device(op, {{"weight", &weight}, {"weight_scale_inv", &scale_inv}, {"out", &out}});
  if (out.numel() == 0) return;
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::dequant_fp8_block(static_cast<const uint8_t*>(weight.raw()), scale_inv.data<float>(), n0, n1, k,
                            out.raw(), out.dtype());
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  cpu::dequant_fp8_block(static_cast<const uint8_t*>(weight.raw()), scale_inv.data<float>(), n0, n1, k, out.raw(),
                         out.dtype());
}

void dequant_fp8_block(const Tensor& weight, const Tensor& scale_inv, Tensor& out, const std::string& name) {
  AERIE_CHECK(weight.ndim() == 2, "dequant_fp8_block: weight" << of(name) << " must be [N, K], got "
                                                               << shape_str(weight.shape()));
  dequant_fp8_block(weight, scale_inv, 0, weight.dim(0), out, name);
}

int64_t int4_packed_in_features(const Tensor& weight_shape, const Tensor& weight_packed, const std::string& name) {
  constexpr const char* op = "int4_packed_in_features";
  AERIE_CHECK(weight_shape.device() == Device::CPU, op << ": weight_shape" << of(name) << " must be on the CPU");
  AERIE_CHECK(weight_shape.shape() == Shape{2} &&
                  (weight_shape.dtype() == DType::I32 || weight_shape.dtype() == DType::I64),
              op << ": weight_shape" << of(name) << " must be [2] I32 or I64, got " << shape_str(weight_shape.shape())
                 << " " << dtype_name(weight_shape.dtype()));
  const Tensor s = weight_shape.to(DType::I64);
  const int64_t n = s.data<int64_t>()[0], k = s.data<int64_t>()[1];
  AERIE_CHECK(weight_packed.ndim() == 2 && n >= 0 && k >= 0 && weight_packed.dim(0) == n &&
                  weight_packed.dim(1) == ceil_div(k, 8),
              op << ": weight_packed" << of(name) << " has shape " << shape_str(weight_packed.shape())
                 << ", but weight_shape (" << n << ", " << k << ") packs to " << shape_str({n, ceil_div(k, 8)}));
  return k;
}

void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         int64_t n0, int64_t n1, Tensor& out, const std::string& name) {
  constexpr const char* op = "dequant_int4_packed";
  AERIE_CHECK(weight_packed.ndim() == 2, op << ": weight_packed" << of(name) << " must be [N, ceil(K/8)], got "
                                            << shape_str(weight_packed.shape()));
  weight_packed.check_dtype(DType::I32, kernels::what(op, "weight_packed") + of(name));
  const int64_t n = weight_packed.dim(0);
  AERIE_CHECK(k >= 0 && weight_packed.dim(1) == ceil_div(k, 8),
              op << ": weight_packed" << of(name) << " has shape " << shape_str(weight_packed.shape())
                 << ", but K = " << k << " packs to " << shape_str({n, ceil_div(k, 8)}));
  AERIE_CHECK(group_size >= 1 && k % group_size == 0,
              op << ": K = " << k << of(name) << " is not a multiple of the group size " << group_size);
  const Shape want = {n, k / group_size};
  AERIE_CHECK(weight_scale.shape() == want,
              op << ": weight_scale" << of(name) << " has shape " << shape_str(weight_scale.shape())
                 << ", but weight_packed " << shape_str(weight_packed.shape()) << " (K = " << k << ", group "
                 << group_size << ") needs " << shape_str(want));
  kernels::check_float(weight_scale, op, "weight_scale");
  check_rows_out(op, n, k, n0, n1, out, name);
  const Device dev =
      kernels::common_device(op, {{"weight_packed", &weight_packed}, {"weight_scale", &weight_scale}, {"out", &out}});
  if (out.numel() == 0) return;
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::dequant_int4_packed(weight_packed.data<int32_t>(), weight_scale.raw(), weight_scale.dtype(), k, group_size,
                              n0, n1, out.raw(), out.dtype());
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  cpu::dequant_int4_packed(weight_packed.data<int32_t>(), weight_scale.raw(), weight_scale.dtype(), k, group_size,
                           n0, n1, out.raw(), out.dtype());
}

void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         Tensor& out, const std::string& name) {
  AERIE_CHECK(weight_packed.ndim() == 2, "dequant_int4_packed: weight_packed" << of(name)
                                             << " must be [N, ceil(K/8)], got " << shape_str(weight_packed.shape()));
  dequant_int4_packed(weight_packed, weight_scale, k, group_size, 0, weight_packed.dim(0), out, name);
}

}  // namespace aerie
