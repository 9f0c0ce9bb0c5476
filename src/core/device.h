// The GPU runtime as the rest of aerie sees it: whether a CUDA device is there, which one this rank
// uses, the current stream, and raw device memory. Every function compiles in a CPU-only build (no
// AERIE_WITH_CUDA): there cuda::available() is false and the others throw aerie::Error.
//
// Streams: each host thread has a current stream (initially a per-thread non-blocking stream of the
// selected device); kernels and Tensor copies are issued on it. StreamGuard switches it for a scope.
// Device memory is stream-ordered (cudaMallocAsync / cudaFreeAsync from the device's default memory
// pool, which caches freed blocks): a tensor is allocated and freed on the stream current at its
// creation, so a tensor used on another stream must be synchronised by the user (events) before it is
// dropped.
#pragma once
#include <cstddef>
#include <string>

namespace aerie::cuda {

using Stream = void*;  // cudaStream_t, kept opaque so that CPU-only code need not include CUDA headers

/// True when aerie was built with the CUDA backend AND at least one CUDA device is visible.
bool available();
/// True when aerie was built with the CUDA backend (whether or not a device is present).
bool built();
/// Number of visible CUDA devices (0 without the backend or without a driver).
int device_count();
/// Why available() is false, for test skips and errors ("" when it is true).
std::string unavailable_reason();
/// Selects the GPU of a rank: device local_rank % device_count(). Logs the choice. Throws aerie::Error
/// when there is no device.
void select_device(int local_rank);
/// The selected device's ordinal (0 until select_device is called).
int current_device();
/// The current device's name as CUDA reports it ("NVIDIA H100 80GB HBM3"). Throws aerie::Error without the backend.
std::string current_device_name();
/// Makes `device` the CUDA runtime's current device for the calling host thread (cudaSetDevice): a
/// thread other than the one that called select_device starts on device 0, where its first runtime call
/// would create a context. Throws aerie::Error on a CUDA error or in a build without the backend.
void set_thread_device(int device);

/// The calling thread's current stream.
Stream current_stream();
/// A new non-blocking stream on the current device (owned by the caller: destroy_stream).
Stream create_stream();
void destroy_stream(Stream s);
/// Blocks until the work queued on `s` is done; throws aerie::Error carrying any CUDA error.
void synchronize(Stream s);
inline void synchronize() { synchronize(current_stream()); }

/// Sets the calling thread's current stream for the lifetime of the guard.
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_;
};

/// Device memory, stream-ordered on `s`. alloc throws aerie::Error naming the size on failure.
void* alloc(size_t bytes, Stream s);
void free(void* p, Stream s);
/// Copy of `bytes` between any two of host/device (unified addressing decides the direction), queued
/// on the current stream. Returns after the copy when the destination is host memory (the data is
/// there) or either side is page-locked host memory; at once for device-to-device, and for pageable
/// host to device, where cudaMemcpyAsync has staged the source before it returns (CUDA runtime API,
/// "API synchronization behavior"), so the host buffer is free to reuse while the device still works
/// on earlier kernels (the target's forward uploads its ids and positions this way without waiting
/// for the previous forward).
void memcpy(void* dst, const void* src, size_t bytes);
void memset_zero(void* p, size_t bytes);
/// Throws aerie::Error with `what` and the CUDA error string if the last kernel launch failed.
void check_last_error(const char* what);

}  // namespace aerie::cuda
