#include "core/progress.h"

#include <cmath>
#include <cstdio>

#include "core/log.h"

namespace aerie {

std::string format_amount(double x) {
  char buf[64];
  if (!std::isfinite(x) || x < 0) std::snprintf(buf, sizeof buf, "%g", x);
  else if (x == std::floor(x) || x >= 100) std::snprintf(buf, sizeof buf, "%.0f", x);
  else std::snprintf(buf, sizeof buf, "%.*f", x < 10 ? 2 : 1, x);
  return buf;
}

Progress::Progress(std::string what, std::string unit, double total, int rank, double interval_s)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), rank_(rank), interval_s_(interval_s),
      start_(std::chrono::steady_clock::now()), last_(start_) {}

double Progress::rate() const {
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return s > 0 ? done_ / s : 0.0;
}

void Progress::add(double n) {
  done_ += n;
  auto now = std::chrono::steady_clock::now();
  if (rank_ != 0 || std::chrono::duration<double>(now - last_).count() < interval_s_) return;
  last_ = now;
  double r = rate();
  double eta = r > 0 && total_ > done_ ? (total_ - done_) / r : 0.0;
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s: %s/%s %s (%.1f%%), %.1f %s/s, ETA %.0f s", what_.c_str(),
                format_amount(done_).c_str(), format_amount(total_).c_str(), unit_.c_str(),
                total_ > 0 ? 100.0 * done_ / total_ : 0.0, r, unit_.c_str(), eta);
  AERIE_LOG(info) << buf;
}

void Progress::finish() {
  if (rank_ != 0) return;
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char buf[320];
  // Two decimals under 10 s: a short job's time still compares (tools/bench/plan_check.sh).
  std::snprintf(buf, sizeof buf, "%s: done, %s %s in %.*f s (%.1f %s/s)", what_.c_str(), format_amount(done_).c_str(),
                unit_.c_str(), s < 10 ? 2 : 1, s, rate(), unit_.c_str());
  AERIE_LOG(info) << buf;
}

}  // namespace aerie
