// Logging through Boost.Log: every record carries the MPI world rank ("[r3]") and a severity.
// Usage: AERIE_LOG(info) << "wrote shard " << path;   Rank-0-only progress: see core/progress.h.
#pragma once
#include <boost/log/sources/global_logger_storage.hpp>
#include <boost/log/sources/record_ostream.hpp>
#include <boost/log/sources/severity_logger.hpp>
#include <boost/log/trivial.hpp>

namespace aerie {

/// Sets up the console sink: "<time> [r<rank>] <severity> <message>" on stderr, records below
/// `min_level` ("trace", "debug", "info", "warning", "error") dropped. Call once per process;
/// safe to call again (tests) - later calls only change the rank and level.
void init_logging(int rank, const std::string& min_level = "info");

/// The world rank logged with each record (0 before init_logging).
int log_rank();

/// Drops records below `min_level` while alive, where that raises the threshold (it never lowers it), and
/// puts the threshold back at its end: a job that runs another job's loop as a measurement (calibrate's
/// short extract) without that loop's log lines. Throws aerie::Error on an unknown level name.
class ScopedLogLevel {
 public:
  explicit ScopedLogLevel(const std::string& min_level);
  ~ScopedLogLevel();
  ScopedLogLevel(const ScopedLogLevel&) = delete;
  ScopedLogLevel& operator=(const ScopedLogLevel&) = delete;

 private:
  int previous_;
};

/// `v` with exactly `digits` decimals ("%.*f"), for log lines: format_fixed(2.14017, 3) == "2.140".
std::string format_fixed(double v, int digits);
/// A byte count for log lines in the largest binary unit that keeps it >= 1, with 2 decimals past bytes:
/// format_bytes(0) == "0 bytes", format_bytes(1536) == "1.50 KiB", format_bytes(3 << 30) == "3.00 GiB" (up to PiB).
std::string format_bytes(double bytes);

}  // namespace aerie

#define AERIE_LOG(sev) BOOST_LOG_TRIVIAL(sev)
