#include "core/pinned_memory.h"

#include <utility>

#include "core/cuda_check.h"

namespace aerie::cuda {

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    PinnedBuffer dropped(std::move(*this));
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

#ifdef AERIE_WITH_CUDA

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes ? bytes : 1) {
  AERIE_CUDART(cudaHostAlloc(&p_, bytes_, cudaHostAllocPortable),
               "cudaHostAlloc of " << bytes_ << " bytes of pinned host memory");
}
PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  AERIE_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
               "cudaMemcpyAsync (device to host) of " << bytes << " bytes");
}

#else  // CPU-only build

PinnedBuffer::PinnedBuffer(size_t) { detail::no_backend("cuda::PinnedBuffer"); }
PinnedBuffer::~PinnedBuffer() = default;
void copy_to_host_async(void*, const void*, size_t, Stream) { detail::no_backend("cuda::copy_to_host_async"); }

#endif

}  // namespace aerie::cuda
