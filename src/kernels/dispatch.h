// Internal helpers of the op families (src/kernels/<family>.cc): the device check and dispatch shared by
// every op. Not part of the public kernel interface.
#pragma once
#include <initializer_list>
#include <utility>

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

/// Thrown by the dispatch of every op when its tensors live on a device this build has no backend for.
[[noreturn]] inline void throw_no_backend(const char* op, Device d) {
  AERIE_THROW(op << ": the " << device_name(d) << " backend is not built (CPU only)");
}

/// "op: name" for Tensor::check_shape / check_dtype messages.
inline std::string what(const char* op, const char* name) { return std::string(op) + ": " + name; }

}  // namespace aerie::kernels
