// Progress of long work, reported from rank 0: done/total, rate (units/s) and ETA, at most once per
// `interval_s` seconds of wall time.
#pragma once
#include <chrono>
#include <string>

namespace aerie {

/// An amount of a progress line's unit as text: whole numbers as they are ("12", "4096"), fractions with
/// three significant figures up to 100 ("0.00", "0.37", "2.50", "12.5") and none above ("1235"); so a small
/// job's "0.37 MiB" does not print as "0 MiB". Negative and non-finite values print as %g does.
std::string format_amount(double x);

class Progress {
 public:
  /// `what` names the work ("extract"), `unit` the counted thing ("tokens"). Only the process with
  /// `rank` == 0 logs; the others count silently.
  Progress(std::string what, std::string unit, double total, int rank, double interval_s = 5.0);
  /// Adds `n` units; logs "what: done/total unit (pct%), rate unit/s, ETA" when the interval passed.
  void add(double n);
  /// Logs the final line (total time and mean rate) on rank 0.
  void finish();
  double rate() const;  // units per second since construction

 private:
  std::string what_, unit_;
  double total_, done_ = 0;
  int rank_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace aerie
