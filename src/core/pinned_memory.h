// Page-locked (pinned) host memory and the asynchronous device-to-host copy into it: a copy into pinned
// memory runs on its stream while the host goes on (a copy into pageable memory is staged and waited
// for). Compiles in a CPU-only build (no AERIE_WITH_CUDA): there allocating and copying throw
// aerie::Error.
#pragma once
#include <cstddef>

#include "core/device.h"

namespace aerie::cuda {

/// `bytes` bytes of pinned host memory, usable with every device (cudaHostAllocPortable); freed
/// (cudaFreeHost, which waits for the device's work) with the object. Movable, not copyable; a
/// default-constructed or moved-from buffer holds nothing.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  /// Throws aerie::Error naming the size when the runtime cannot allocate it, and in a build without the
  /// backend. A request of 0 bytes allocates 1.
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return p_; }
  /// Bytes allocated (0 when the buffer holds nothing).
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

/// Queues a copy of `bytes` bytes from device memory `src` to host memory `dst` on stream `s`
/// (cudaMemcpyAsync, device to host) and returns without waiting for it when `dst` is pinned: the data
/// is in `dst` once an Event recorded on `s` after the call has completed; until then neither buffer may
/// be freed or reused. Throws aerie::Error on a CUDA error (also in a build without the backend).
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s);

}  // namespace aerie::cuda
