// Weight dequantization: checks and device dispatch (see quant.h).
#include "kernels/quant.h"

#include "kernels/cuda/quant.h"
#include "kernels/dispatch.h"

namespace aerie {
namespace cpu {
// cpu/quant.cc: out (n1 - n0, K) F32|BF16 from the absolute rows [n0, n1); arguments already checked.
void dequant_fp8_block(const uint8_t* w /* (N, K) */, const float* scale_inv /* (ceil N/128, ceil K/128) */,
                       int64_t n0, int64_t n1, int64_t k, void* out, DType out_dtype);
void dequant_int4_packed(const int32_t* packed /* (N, ceil K/8) */, const void* scale /* (N, K/group) */,
                         DType scale_dtype, int64_t k, int64_t group, int64_t n0, int64_t n1, void* out,
                         DType out_dtype);
void quantize_fp8_rows(const void* x, DType x_dtype, int64_t m, int64_t k, uint8_t* q, float* scale);
void quantize_fp8_block(const void* w, DType w_dtype, int64_t n, int64_t k, uint8_t* q, float* scale_inv);
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

namespace {

/// The checks of dequant_fp8_block; returns the device.
Device check_fp8(const Tensor& weight, const Tensor& scale_inv, int64_t n0, int64_t n1, const Tensor& out,
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
  return kernels::common_device(op, {{"weight", &weight}, {"weight_scale_inv", &scale_inv}, {"out", &out}});
}

}  // namespace

void dequant_fp8_block(const Tensor& weight, const Tensor& scale_inv, int64_t n0, int64_t n1, Tensor& out,
                       const std::string& name) {
  [[maybe_unused]] constexpr const char* op = "dequant_fp8_block";
  const Device dev = check_fp8(weight, scale_inv, n0, n1, out, name);
  const int64_t k = weight.dim(1);
  if (out.numel() == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::dequant_fp8_block(static_cast<const uint8_t*>(weight.raw()), scale_inv.data<float>(), n0,
                                              n1, k, out.raw(), out.dtype()));
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

namespace {

/// The checks of dequant_int4_packed; returns the device.
Device check_int4(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size, int64_t n0,
                  int64_t n1, const Tensor& out, const std::string& name) {
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
  return kernels::common_device(op, {{"weight_packed", &weight_packed}, {"weight_scale", &weight_scale}, {"out", &out}});
}

}  // namespace

void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         int64_t n0, int64_t n1, Tensor& out, const std::string& name) {
  [[maybe_unused]] constexpr const char* op = "dequant_int4_packed";
  const Device dev = check_int4(weight_packed, weight_scale, k, group_size, n0, n1, out, name);
  if (out.numel() == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::dequant_int4_packed(weight_packed.data<int32_t>(), weight_scale.raw(), weight_scale.dtype(),
                                                k, group_size, n0, n1, out.raw(), out.dtype()));
  cpu::dequant_int4_packed(weight_packed.data<int32_t>(), weight_scale.raw(), weight_scale.dtype(), k, group_size,
                           n0, n1, out.raw(), out.dtype());
}

void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         Tensor& out, const std::string& name) {
  AERIE_CHECK(weight_packed.ndim() == 2, "dequant_int4_packed: weight_packed" << of(name)
                                             << " must be [N, ceil(K/8)], got " << shape_str(weight_packed.shape()));
  dequant_int4_packed(weight_packed, weight_scale, k, group_size, 0, weight_packed.dim(0), out, name);
}

namespace {

/// The GPU's descriptions of the non-empty items (raw pointers into their tensors), for cuda::dequant_batch.
[[maybe_unused]] std::vector<cuda::DequantDesc> dequant_descs(const std::vector<DequantItem>& items,
                                                              int64_t group_size) {
  std::vector<cuda::DequantDesc> descs;
  for (const DequantItem& it : items) {
    if (it.out.numel() == 0) continue;
    cuda::DequantDesc d;
    d.weight = it.weight.raw();
    d.scale = it.scale.raw();
    d.out = const_cast<void*>(it.out.raw());  // out is a view: writing through it is the point
    d.n0 = it.n0;
    d.rows = it.n1 - it.n0;
    d.k = it.int4 ? it.k : it.weight.dim(1);
    d.group = group_size;
    d.int4 = it.int4;
    d.scale_f32 = it.scale.dtype() == DType::F32;
    d.out_f32 = it.out.dtype() == DType::F32;
    descs.push_back(d);
  }
  return descs;
}

}  // namespace

void dequant_batch(const std::vector<DequantItem>& items, int64_t group_size) {
  constexpr const char* op = "dequant_batch";
  if (items.empty()) return;
  std::vector<Device> devs;
  for (const DequantItem& it : items)
    devs.push_back(it.int4 ? check_int4(it.weight, it.scale, it.k, group_size, it.n0, it.n1, it.out, it.name)
                           : check_fp8(it.weight, it.scale, it.n0, it.n1, it.out, it.name));
  for (const Device d : devs)
    AERIE_CHECK(d == devs[0], op << ": the items are on different devices (" << items.front().name << ", ...)");
  AERIE_CUDA_DISPATCH(op, devs[0], cuda::dequant_batch(dequant_descs(items, group_size)));
  for (const DequantItem& it : items) {
    Tensor out = it.out;
    if (it.int4)
      dequant_int4_packed(it.weight, it.scale, it.k, group_size, it.n0, it.n1, out, it.name);
    else
      dequant_fp8_block(it.weight, it.scale, it.n0, it.n1, out, it.name);
  }
}

namespace {

/// The checks of the two quantizations: src [R, K] F32|BF16, q [R, K] F8E4M3|U8, scale `want` F32.
Device check_quantize(const char* op, const Tensor& src, const Tensor& q, const Tensor& scale, const Shape& want) {
  AERIE_CHECK(src.ndim() == 2, op << ": the input must be 2-D, got " << shape_str(src.shape()));
  kernels::check_float(src, op, "input");
  q.check_shape(src.shape(), kernels::what(op, "q"));
  AERIE_CHECK(q.dtype() == DType::F8E4M3 || q.dtype() == DType::U8,
              op << ": q must be F8_E4M3 (or U8), got " << dtype_name(q.dtype()));
  scale.check_shape(want, kernels::what(op, "scale"));
  scale.check_dtype(DType::F32, kernels::what(op, "scale"));
  return kernels::common_device(op, {{"input", &src}, {"q", &q}, {"scale", &scale}});
}

}  // namespace

namespace {

/// A quantization kernel: (src, its dtype, rows, cols, codes, scales) (cpu/quant.cc, cuda/quant.cu).
using QuantizeFn = void (*)(const void*, DType, int64_t, int64_t, uint8_t*, float*);
#ifdef AERIE_WITH_CUDA
#define AERIE_CUDA_QUANTIZE(f) &cuda::f
#else
#define AERIE_CUDA_QUANTIZE(f) nullptr
#endif

/// The checks (check_quantize, scale `want`) and the device dispatch of both quantizations of src [R, K];
/// cuda_fn is null without the CUDA backend.
void quantize_on_device(const char* op, const Tensor& src, Tensor& q, Tensor& scale, const Shape& want,
                        QuantizeFn cpu_fn, QuantizeFn cuda_fn) {
  const Device dev = check_quantize(op, src, q, scale, want);
  if (src.numel() == 0) return;
  QuantizeFn fn = cpu_fn;
  if (dev == Device::CUDA) {
    kernels::check_backend(op, dev);
    fn = cuda_fn;
  }
  fn(src.raw(), src.dtype(), src.dim(0), src.dim(1), static_cast<uint8_t*>(q.raw()), scale.data<float>());
}

}  // namespace

void quantize_fp8_rows(const Tensor& x, Tensor& q, Tensor& scale) {
  AERIE_CHECK(x.ndim() == 2, "quantize_fp8_rows: x must be [M, K], got " << shape_str(x.shape()));
  quantize_on_device("quantize_fp8_rows", x, q, scale, {ceil_div(x.dim(1), kFp8BlockSize), x.dim(0)},
                     &cpu::quantize_fp8_rows, AERIE_CUDA_QUANTIZE(quantize_fp8_rows));
}

void quantize_fp8_block(const Tensor& w, Tensor& q, Tensor& scale_inv) {
  AERIE_CHECK(w.ndim() == 2, "quantize_fp8_block: w must be [N, K], got " << shape_str(w.shape()));
  quantize_on_device("quantize_fp8_block", w, q, scale_inv,
                     {ceil_div(w.dim(0), kFp8BlockSize), ceil_div(w.dim(1), kFp8BlockSize)}, &cpu::quantize_fp8_block,
                     AERIE_CUDA_QUANTIZE(quantize_fp8_block));
}

}  // namespace aerie
