#include "core/tensor.h"

#include "core/device.h"
#include "core/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

namespace aerie {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::F16: return 2;
    case DType::F8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::F16: return "F16";
    case DType::F8E4M3: return "F8_E4M3";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "F32" || n == "float32") return DType::F32;
  if (n == "BF16" || n == "bfloat16") return DType::BF16;
  if (n == "I32" || n == "int32") return DType::I32;
  if (n == "I64" || n == "int64") return DType::I64;
  if (n == "U8" || n == "uint8" || n == "BOOL" || n == "bool") return DType::U8;
  if (n == "F16" || n == "float16") return DType::F16;
  if (n == "F8_E4M3" || n == "float8_e4m3fn") return DType::F8E4M3;
  AERIE_THROW("unsupported dtype '" << n << "'");
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

std::string first_nonfinite(const Tensor& t) {
  AERIE_CHECK(t.dtype() == DType::F32 && t.device() == Device::CPU,
              "first_nonfinite: needs an F32 host tensor, got " << dtype_name(t.dtype()) << " on " << device_name(t.device()));
  const float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    if (std::isfinite(p[i])) continue;
    std::vector<int64_t> at(static_cast<size_t>(t.ndim()));
    for (int64_t d = t.ndim() - 1, r = i; d >= 0; --d) {
      at[static_cast<size_t>(d)] = r % t.dim(d);
      r /= t.dim(d);
    }
    std::ostringstream os;
    os << "[";
    for (size_t d = 0; d < at.size(); ++d) os << (d ? ", " : "") << at[d];
    os << "] = " << p[i];
    return os.str();
  }
  return "";
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

static int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    AERIE_CHECK(d >= 0, "negative dimension in shape " << shape_str(s));
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (device == Device::CUDA) {
    cuda::Stream s = cuda::current_stream();
    void* p = cuda::alloc(bytes, s);
    t.storage_ = std::shared_ptr<void>(p, [s](void* q) { cuda::free(q, s); });
    t.data_ = p;
    return t;
  }
  // 64-byte aligned so that SIMD loads and a later CUDA pinned copy are happy.
  void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  AERIE_CHECK(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  t.storage_ = std::shared_ptr<void>(p, std::free);
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::shape_only(const Shape& shape, DType dtype, Device device) { return wrap(nullptr, shape, dtype, device); }

int64_t Tensor::dim(int64_t i) const {
  int64_t n = ndim();
  if (i < 0) i += n;
  AERIE_CHECK(i >= 0 && i < n, "dim " << i << " out of range for shape " << shape_str(shape_));
  return shape_[static_cast<size_t>(i)];
}

int64_t Tensor::numel() const { return shape_numel(shape_); }

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  AERIE_CHECK(ndim() >= 1, "slice of a 0-d tensor");
  AERIE_CHECK(0 <= begin && begin <= end && end <= shape_[0],
              "slice [" << begin << ", " << end << ") out of range for shape " << shape_str(shape_));
  Tensor t = *this;
  int64_t row = numel() / std::max<int64_t>(1, shape_[0]);
  if (shape_[0] == 0) row = 0;
  if (data_ != nullptr) t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  AERIE_CHECK(shape_numel(shape) == numel(),
              "reshape " << shape_str(shape_) << " -> " << shape_str(shape) << " changes numel");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to_device(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  AERIE_CHECK(src.numel() == numel() && src.dtype() == dtype_,
              "copy_from: " << shape_str(src.shape()) << " " << dtype_name(src.dtype()) << " into "
                            << shape_str(shape_) << " " << dtype_name(dtype_));
  if (!nbytes()) return;
  if (device_ == Device::CPU && src.device_ == Device::CPU)
    std::memmove(data_, src.data_, nbytes());
  else
    cuda::memcpy(data_, src.data_, nbytes());
}

void Tensor::fill_zero() {
  if (!nbytes()) return;
  if (device_ == Device::CPU)
    std::memset(data_, 0, nbytes());
  else
    cuda::memset_zero(data_, nbytes());
}

namespace {
template <typename T>
float as_float(T v) { return static_cast<float>(v); }
template <typename Dst, typename Src>
void convert(const Src* s, Dst* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Dst, bf16>) d[i] = bf16(static_cast<float>(s[i]));
    else if constexpr (std::is_same_v<Src, bf16>) d[i] = static_cast<Dst>(static_cast<float>(s[i]));
    else d[i] = static_cast<Dst>(s[i]);
  }
}
template <typename Src>
void convert_from(const Src* s, Tensor& out, int64_t n) {
  switch (out.dtype()) {
    case DType::F32: convert(s, out.data<float>(), n); break;
    case DType::BF16: convert(s, out.data<bf16>(), n); break;
    case DType::I32: convert(s, out.data<int32_t>(), n); break;
    case DType::I64: convert(s, out.data<int64_t>(), n); break;
    case DType::U8: convert(s, out.data<uint8_t>(), n); break;
    case DType::F16: break;     // Tensor::to goes through F32 for F16
    case DType::F8E4M3: break;  // not a target (checked in Tensor::to)
  }
}

// IEEE binary16 <-> binary32 (the layout of torch.float16 and safetensors "F16").
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in fp32
    const float f = static_cast<float>(m) * 0x1.0p-24f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);  // inf, or a quiet NaN
  } else {
    u = sign | ((e + 112u) << 23) | (m << 13);  // rebias 15 -> 127
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch's float -> float16 cast; |f| >= 65520 (the tie above 65504) gives inf.
uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // inf
  if (ax < 0x38800000u) {                        // below 2^-14: subnormal half, units of 2^-24
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1.0p24f));  // 1024 encodes 2^-14 exactly
  }
  const uint32_t mant = ax & 0x7fffffu;
  uint32_t h = (((ax >> 23) - 112u) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return sign | static_cast<uint16_t>(h);
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
  AERIE_CHECK(device_ == Device::CPU, "Tensor::to(dtype) is implemented for CPU tensors");
  if (dtype == dtype_) return clone();
  int64_t n = numel();
  AERIE_CHECK(dtype != DType::F8E4M3, "Tensor::to: no conversion from " << dtype_name(dtype_) << " to F8_E4M3");
  if (dtype_ == DType::F8E4M3) {
    Tensor f = empty(shape_, DType::F32, device_);
    const uint8_t* s = static_cast<const uint8_t*>(data_);
    float* d = f.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = fp8_e4m3fn_to_float(s[i]);
    return dtype == DType::F32 ? f : f.to(dtype);
  }
  if (dtype_ == DType::F16) {
    Tensor f = empty(shape_, DType::F32, device_);
    const uint16_t* s = static_cast<const uint16_t*>(data_);
    float* d = f.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = f16_to_float(s[i]);
    return dtype == DType::F32 ? f : f.to(dtype);
  }
  if (dtype == DType::F16) {
    const Tensor f = dtype_ == DType::F32 ? *this : to(DType::F32);
    Tensor out = empty(shape_, DType::F16, device_);
    const float* s = f.data<float>();
    uint16_t* d = static_cast<uint16_t*>(out.raw());
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_f16(s[i]);
    return out;
  }
  Tensor out = empty(shape_, dtype, device_);
  switch (dtype_) {
    case DType::F32: convert_from(data<float>(), out, n); break;
    case DType::BF16: convert_from(data<bf16>(), out, n); break;
    case DType::I32: convert_from(data<int32_t>(), out, n); break;
    case DType::I64: convert_from(data<int64_t>(), out, n); break;
    case DType::U8: convert_from(data<uint8_t>(), out, n); break;
    case DType::F16: break;     // handled above
    case DType::F8E4M3: break;  // handled above
  }
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  if (device_ != Device::CPU) return to_device(Device::CPU).to_float_vector();
  Tensor f = dtype_ == DType::F32 ? *this : to(DType::F32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + numel());
}

void Tensor::check_shape(const Shape& expected, const std::string& what) const {
  bool ok = expected.size() == shape_.size();
  for (size_t i = 0; ok && i < expected.size(); ++i)
    ok = expected[i] < 0 || expected[i] == shape_[i];
  AERIE_CHECK(ok, what << ": expected shape " << shape_str(expected) << ", got " << shape_str(shape_));
}

void Tensor::check_dtype(DType expected, const std::string& what) const {
  AERIE_CHECK(dtype_ == expected, what << ": expected dtype " << dtype_name(expected) << ", got "
                                       << dtype_name(dtype_));
}

}  // namespace aerie
