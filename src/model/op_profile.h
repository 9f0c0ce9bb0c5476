// Opt-in timing of the target forward's ops by category: with the environment variable AERIE_PROFILE=1,
// TargetModel times every op of its forward (CUDA: an event recorded before and after the op on the
// current stream, then a synchronisation on the second one; CPU: steady_clock) and sums the times per
// category; TargetModel::profile_summary() formats them. Synchronising after every op makes the run
// slower than without profiling (no overlap between ops and the host), so the numbers are each op's
// own device time, for finding where a forward spends it, not the forward's wall time.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace aerie {

namespace cuda {
class Event;
}  // namespace cuda

enum class OpKind { Gemm, Attention, Norm, Rope, Activation, Other, AllReduce };
inline constexpr int kOpKinds = 7;

class OpProfile {
 public:
  /// True when the environment variable AERIE_PROFILE is "1" (read once per process).
  static bool enabled_by_env();
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  /// Runs fn(); when enabled, adds its time on `device` to `kind`.
  template <class F> void time(OpKind kind, Device device, F&& fn) {
    if (!enabled_) {
      fn();
      return;
    }
    begin(device);
    fn();
    end(kind, device);
  }
  /// Counts one forward call of `rows` rows.
  void count_forward(int64_t rows) {
    ++forwards_;
    rows_ += rows;
  }
  /// "N forward calls, R rows: gemm 12.3 ms (45.6%), attention ..., total T ms (per call t ms)";
  /// empty when disabled or nothing was timed.
  std::string summary() const;

 private:
  void begin(Device device);
  void end(OpKind kind, Device device);
  bool enabled_ = false;
  std::array<double, kOpKinds> ms_{};
  int64_t forwards_ = 0, rows_ = 0;
  double t0_ = 0;                              // CPU: steady_clock seconds at begin()
  std::unique_ptr<cuda::Event> ev0_, ev1_;     // CUDA: timing events before / after the op, made on first use
};

}  // namespace aerie
