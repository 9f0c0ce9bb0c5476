// The error checks of src/core's CUDA runtime wrappers (device.cc, device_event.cc, pinned_memory.cc,
// device_memory.cc); included by those .cc files only, so that no other layer sees the CUDA headers.
#pragma once
#include "core/error.h"

#ifdef AERIE_WITH_CUDA
#include <cuda_runtime.h>

/// AERIE_CUDART(cudaX(...), "what " << n): throws aerie::Error with `what`, the CUDA error's name and
/// its description when the call does not return cudaSuccess.
#define AERIE_CUDART(call, what)                                                                    \
  do {                                                                                              \
    cudaError_t err_ = (call);                                                                      \
    AERIE_CHECK(err_ == cudaSuccess, what << ": " << cudaGetErrorName(err_) << " ("                 \
                                          << cudaGetErrorString(err_) << ")");                      \
  } while (0)
#endif

namespace aerie::cuda::detail {

/// Throws aerie::Error: `what` needs the CUDA backend, which this build lacks.
[[noreturn]] void no_backend(const char* what);

}  // namespace aerie::cuda::detail
