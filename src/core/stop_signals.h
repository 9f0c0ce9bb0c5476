// Graceful stop on SIGTERM, SIGINT and SIGUSR1 (Slurm's preemption warning, `scancel --signal`):
// the handler only records the signal; long-running jobs poll it between units of work (a train step,
// an extraction chunk), finish the unit, save their state and exit with kPreemptedExitCode. A second
// signal kills the process as the default action would.
#pragma once
#include <signal.h>

#include <array>

namespace aerie {

/// Exit status of a job stopped by a signal after saving its work (slurm/step.sh requeues on it).
inline constexpr int kPreemptedExitCode = 3;

/// RAII: installs the handler for SIGTERM, SIGINT and SIGUSR1 (SA_RESTART, so I/O and MPI calls in
/// flight continue) and restores the previous handlers on destruction. One instance at a time.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The signal received since construction, 0 if none (this process only).
  static int received();

 private:
  static constexpr std::array<int, 3> kSignals = {SIGTERM, SIGINT, SIGUSR1};
  std::array<struct sigaction, 3> old_{};
};

}  // namespace aerie
