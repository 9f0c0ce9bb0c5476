// aerie errors: library code throws aerie::Error with context (what, which file/tensor/rank);
// only main() catches, logs and calls MPI_Abort so that no peer hangs in a collective.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace aerie {

/// The one exception type of aerie. The message names the file, line, tensor or rank involved.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A bad command line or config file: the same on every rank (all ranks parse the same arguments),
/// so main() ends the job normally with exit status 2 instead of aborting it.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An error that every rank of the job throws together with the same message (e.g. an output lock that rank
/// 0 could not take, broadcast to all ranks: io/output_lock.h): no peer waits in a collective, so main()
/// logs it once and ends the job normally with exit status 1 instead of aborting it.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(const std::string& msg, const char* file, int line);
}  // namespace detail

}  // namespace aerie

/// AERIE_CHECK(cond, "tensor " << name << " has " << n << " rows"): throws aerie::Error
/// with the message and the source location when cond is false.
#define AERIE_CHECK(cond, msg)                                          \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::ostringstream aerie_check_os_;                               \
      aerie_check_os_ << msg;                                           \
      ::aerie::detail::throw_error(aerie_check_os_.str(), __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

/// AERIE_THROW("message " << x): unconditional aerie::Error.
#define AERIE_THROW(msg) AERIE_CHECK(false, msg)

/// AERIE_USAGE_CHECK(cond, "aerie train: --batch-size must be >= 1, got " << n): throws aerie::UsageError
/// (a bad option value, the same on every rank: exit status 2, no MPI_Abort) with the message alone.
#define AERIE_USAGE_CHECK(cond, msg)                                    \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::ostringstream aerie_usage_os_;                               \
      aerie_usage_os_ << msg;                                           \
      throw ::aerie::UsageError(aerie_usage_os_.str());                 \
    }                                                                   \
  } while (0)
