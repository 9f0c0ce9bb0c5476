// The tensor type of aerie: a shape, a dtype, a device, and storage that is owned (shared, reference
// counted) or a view into another tensor's storage. Row-major and contiguous, always: a view is a
// contiguous range (a slice along dim 0 or a reshape), never strided.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace aerie {

// F16 (IEEE binary16) is a storage dtype only: checkpoints hold it; Tensor::to converts it, no kernel takes it.
// F8E4M3 (float8 e4m3fn, core/fp8.h; safetensors "F8_E4M3") is a storage dtype of block-FP8 weights: the
// quant kernels (kernels/quant.h) read it, Tensor::to widens it, nothing writes it.
enum class DType : uint8_t { F32, BF16, I32, I64, U8, F16, F8E4M3 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType dt);
const char* dtype_name(DType dt);
/// Parses "F32"/"float32", "BF16"/"bfloat16", "I32"/"int32", "I64"/"int64", "U8"/"uint8"/"BOOL",
/// "F16"/"float16", "F8_E4M3"/"float8_e4m3fn" (the safetensors and h5py/torch spellings). Throws
/// aerie::Error on anything else.
DType dtype_from_name(const std::string& name);
const char* device_name(Device d);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  /// Uninitialised owning tensor. Device::CUDA memory comes from cuda::alloc on the current stream
  /// (core/device.h); without the CUDA backend it throws aerie::Error.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  /// Owning CPU tensor holding a copy of `values`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  /// Non-owning view of memory the caller keeps alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::CPU);
  /// A tensor of `shape` and `dtype` with no storage: what the memory plan builds the target's layers
  /// from (model/plan_source.h), so that a model of 600 GB is planned without allocating it. shape,
  /// dtype, numel, slice and reshape work; raw() is null, and reading or writing its values is a bug.
  static Tensor shape_only(const Shape& shape, DType dtype, Device device = Device::CPU);
  /// Whether this is a shape_only tensor (elements but no storage).
  bool is_shape_only() const { return data_ == nullptr && !shape_.empty() && numel() > 0; }

  bool defined() const { return data_ != nullptr || !shape_.empty(); }
  const Shape& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension i; negative i counts from the end. Throws on a bad index.
  int64_t dim(int64_t i) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  /// Typed pointer; throws aerie::Error if T does not match the dtype.
  template <typename T> T* data();
  template <typename T> const T* data() const;

  /// View of rows [begin, end) along dim 0 (shares storage).
  Tensor slice(int64_t begin, int64_t end) const;
  /// View with another shape of the same numel (shares storage).
  Tensor reshape(const Shape& shape) const;
  /// Deep copy (same dtype and device).
  Tensor clone() const;
  /// Copy on another device (same dtype and shape); host<->GPU copies return when done.
  Tensor to_device(Device device) const;
  /// Copy converted to another dtype (CPU): F32<->BF16 and F32->F16 round to nearest even (F16 overflow
  /// gives inf, as IEEE); F16->F32 and F8E4M3->F32 are exact; ints via static_cast. F16 converts to and
  /// from the other dtypes through F32; F8E4M3 converts to the others through F32 and cannot be a target
  /// (throws aerie::Error).
  Tensor to(DType dtype) const;
  /// Copies the values of src (same numel and dtype, any devices) into this tensor's storage.
  void copy_from(const Tensor& src);
  void fill_zero();
  /// Values as fp32 (any dtype, any device: GPU tensors are copied to the host), for tests and checks.
  std::vector<float> to_float_vector() const;

  /// Throws aerie::Error naming `what` if the shape differs from `expected` (-1 matches any size).
  void check_shape(const Shape& expected, const std::string& what) const;
  void check_dtype(DType expected, const std::string& what) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

template <typename T>
T* Tensor::data() {
  AERIE_CHECK(dtype_ == dtype_of<T>(), "tensor is " << dtype_name(dtype_) << ", accessed as "
                                                    << dtype_name(dtype_of<T>()));
  return static_cast<T*>(data_);
}
template <typename T>
const T* Tensor::data() const {
  return const_cast<Tensor*>(this)->data<T>();
}
template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  Tensor t = empty(shape, dtype_of<T>());
  AERIE_CHECK(t.numel() == static_cast<int64_t>(values.size()),
              "from_vector: " << values.size() << " values for shape " << shape_str(shape));
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

/// Where the F32 host tensor `t` first holds a NaN or an infinity, for messages: "[row, column] = nan"
/// (an index per dimension), or "" when every element is finite. Throws aerie::Error for another dtype
/// or device.
std::string first_nonfinite(const Tensor& t);

}  // namespace aerie
