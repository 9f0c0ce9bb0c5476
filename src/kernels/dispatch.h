// Internal helpers of the op families (src/kernels/<family>.cc): the device check and dispatch shared by
// every op. Not part of the public kernel interface.
#pragma once
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace aerie::kernels {

/// The one device of the named tensors of `op`; throws aerie::Error naming the first tensor whose
/// device differs from the first one's.
inline Device common_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const auto& first = *ts.begin();
  const Device d = first.second->device();
  for (const auto& [name, t] : ts)
    AERIE_CHECK(t->device() == d, op << ": tensor " << name << " is on " << device_name(t->device()) << ", "
                                     << first.first << " on " << device_name(d));
  return d;
}

/// The same for a list built at run time (ops over a variable number of tensors).
inline Device common_device(const char* op, const std::vector<std::pair<const char*, const Tensor*>>& ts) {
  AERIE_CHECK(!ts.empty(), op << ": no tensors");
  const auto& first = ts.front();
  const Device d = first.second->device();
  for (const auto& [name, t] : ts)
    AERIE_CHECK(t->device() == d, op << ": tensor " << name << " is on " << device_name(t->device()) << ", "
                                     << first.first << " on " << device_name(d));
  return d;
}

/// Thrown by the dispatch of every op when its tensors live on a device this build has no backend for.
[[noreturn]] inline void throw_no_backend(const char* op, Device d) {
  AERIE_THROW(op << ": the " << device_name(d) << " backend is not built (CPU only)");
}

/// Throws (throw_no_backend) when this build has no backend for `d`: for the ops whose GPU path is more than the
/// one call of AERIE_CUDA_DISPATCH.
inline void check_backend(const char* op, Device d) {
#ifndef AERIE_WITH_CUDA
  if (d != Device::CPU) throw_no_backend(op, d);
#else
  (void)op;
  (void)d;
#endif
}

/// The CUDA branch of an op's dispatch, written once (as CTranslate2 writes its device dispatch once): on a CUDA
/// device it evaluates `call` (an expression: the family's cuda:: function) and returns its value from the op (a
/// void op returns the void call); in a build without the CUDA backend it throws naming the op, and `call` is not
/// compiled, so an op's .cc holds no #ifdef. Usage: AERIE_CUDA_DISPATCH(op, dev, cuda::swiglu_forward(g, u, out));
#ifdef AERIE_WITH_CUDA
#define AERIE_CUDA_DISPATCH(op, dev, ...)                   \
  do {                                                      \
    if ((dev) == ::aerie::Device::CUDA) return __VA_ARGS__; \
  } while (0)
#else
#define AERIE_CUDA_DISPATCH(op, dev, ...)                                            \
  do {                                                                               \
    if ((dev) == ::aerie::Device::CUDA) ::aerie::kernels::throw_no_backend(op, dev); \
  } while (0)
#endif

/// "op: name" for Tensor::check_shape / check_dtype messages.
inline std::string what(const char* op, const char* name) { return std::string(op) + ": " + name; }

/// Throws aerie::Error naming `op` and the tensor `name` unless t is F32 or BF16.
inline void check_float(const Tensor& t, const char* op, const char* name) {
  AERIE_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16,
              op << ": " << name << " must be F32 or BF16, got " << dtype_name(t.dtype()));
}
/// t as F32 (t itself when it already is; a widened CPU copy for BF16): the fp32-only CPU references.
inline Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }
/// Where to compute `out` in fp32: out itself when F32, else a new F32 tensor (then store_f32).
inline Tensor f32_out(const Tensor& out) {
  return out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), DType::F32);
}
/// Rounds the fp32 result f into a non-F32 `out` (nothing when f_out gave out itself).
inline void store_f32(Tensor& out, const Tensor& f) {
  if (out.dtype() != DType::F32) out.copy_from(f.to(out.dtype()));
}

}  // namespace aerie::kernels
