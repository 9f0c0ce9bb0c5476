#include "core/device_event.h"

#include <utility>

#include "core/cuda_check.h"

namespace aerie::cuda {

Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    Event dropped(std::move(*this));
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

void OwnedStream::wait_for(Stream other) {
  Event ready;
  ready.record(other);
  wait(ready);
}  // `ready` is released once it has completed

#ifdef AERIE_WITH_CUDA

namespace {
cudaEvent_t ev(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

Event::Event(bool timing) {
  cudaEvent_t e = nullptr;
  AERIE_CUDART(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
  e_ = e;
}
Event::~Event() {
  if (e_) cudaEventDestroy(ev(e_));
}
void Event::record(Stream s) {
  AERIE_CUDART(cudaEventRecord(ev(e_), static_cast<cudaStream_t>(s)), "cudaEventRecord");
}
void Event::synchronize(const char* what) { AERIE_CUDART(cudaEventSynchronize(ev(e_)), what); }
bool Event::wait() noexcept { return cudaEventSynchronize(ev(e_)) == cudaSuccess; }
bool Event::query() noexcept { return cudaEventQuery(ev(e_)) == cudaSuccess; }

float elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  AERIE_CUDART(cudaEventElapsedTime(&ms, ev(start.handle()), ev(end.handle())), "cudaEventElapsedTime");
  return ms;
}

OwnedStream::OwnedStream() : s_(create_stream()) {}
OwnedStream::~OwnedStream() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(s_));
  destroy_stream(s_);
}
void OwnedStream::wait(const Event& e) {
  AERIE_CUDART(cudaStreamWaitEvent(static_cast<cudaStream_t>(s_), ev(e.handle()), 0), "cudaStreamWaitEvent");
}

#else  // CPU-only build: no event or stream can be made, so the members below are never reached

using detail::no_backend;
Event::Event(bool) { no_backend("cuda::Event"); }
Event::~Event() = default;
void Event::record(Stream) { no_backend("cuda::Event::record"); }
void Event::synchronize(const char*) { no_backend("cuda::Event::synchronize"); }
bool Event::wait() noexcept { return false; }
bool Event::query() noexcept { return false; }
float elapsed_ms(const Event&, const Event&) { no_backend("cuda::elapsed_ms"); }
OwnedStream::OwnedStream() { no_backend("cuda::OwnedStream"); }
OwnedStream::~OwnedStream() = default;
void OwnedStream::wait(const Event&) { no_backend("cuda::OwnedStream::wait"); }

#endif

}  // namespace aerie::cuda
