// Ordering and timing of GPU work across streams and host threads: an event (record it on a stream, wait
// for it, ask whether it has completed, the time between two) and a stream owned by its holder that can
// wait for an event. Every type compiles in a CPU-only build (no AERIE_WITH_CUDA): there the constructors
// throw aerie::Error (no GPU work exists to order) and the destructors do nothing.
#pragma once
#include "core/device.h"

namespace aerie::cuda {

/// A CUDA event on the device current when it is made. Movable, not copyable; destroyed with the
/// object (cudaEventDestroy: the runtime releases it once its recorded work has completed).
class Event {
 public:
  /// A new event. `timing`: it records a time stamp for elapsed_ms; without (the default,
  /// cudaEventDisableTiming) it only orders work and costs less. Throws aerie::Error on a CUDA error or
  /// in a build without the backend.
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// Captures the work queued on stream `s` so far: the event completes when that work is done.
  /// Throws aerie::Error on a CUDA error.
  void record(Stream s);
  /// Blocks the calling host thread until the recorded work is done (at once if nothing was recorded).
  /// Throws aerie::Error carrying the CUDA error, also one of the recorded work itself, after `what`
  /// (the wait, as the message names it).
  void synchronize(const char* what = "cudaEventSynchronize");
  /// Like synchronize(), without throwing: true when the recorded work completed, false when the runtime
  /// reports an error (left for the next checked call to report).
  bool wait() noexcept;
  /// True when the recorded work is done (or nothing was recorded); false while it still runs or when
  /// the runtime reports an error. Never blocks, never throws.
  bool query() noexcept;

  void* handle() const { return e_; }  // cudaEvent_t

 private:
  void* e_ = nullptr;
};

/// Milliseconds of GPU time between the completion of `start` and of `end`: two timing events
/// (Event(true)), both recorded, `end` completed (synchronize() it first); resolution about 0.5 us.
/// Throws aerie::Error on a CUDA error (e.g. an event made without timing, or not yet completed).
float elapsed_ms(const Event& start, const Event& end);

/// A non-blocking stream of the device current when it is made, owned by the object (a side stream,
/// e.g. for copies that overlap the current stream's kernels). Not copyable.
class OwnedStream {
 public:
  /// Throws aerie::Error on a CUDA error or in a build without the backend.
  OwnedStream();
  /// Waits for the work queued on the stream (errors ignored: a destructor), then destroys it; device
  /// memory that this work reads may be freed after the object.
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

  Stream get() const { return s_; }
  /// Work queued on this stream after the call waits until `e`'s recorded work is done; the host does
  /// not block (cudaStreamWaitEvent). Throws aerie::Error on a CUDA error.
  void wait(const Event& e);
  /// Work queued on this stream after the call waits for all the work queued on `other` so far (an
  /// event recorded on `other`, waited for, then released). Throws aerie::Error on a CUDA error.
  void wait_for(Stream other);

 private:
  Stream s_ = nullptr;
};

}  // namespace aerie::cuda
