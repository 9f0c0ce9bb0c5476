// OutputLock: flock(2) on a lock file plus a holder record (see output_lock.h for the rules).
#include "io/output_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// Fields 3 (state) and 22 (starttime, clock ticks after boot) of /proc/PID/stat; false when the process
// does not exist or the file cannot be read (not Linux).
bool process_stat(int64_t pid, char& state, int64_t& start) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!in || !std::getline(in, s)) return false;
  const size_t close = s.rfind(')');  // the command name (field 2) may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream rest(s.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return false;
    if (i == 3) state = field.empty() ? '?' : field[0];
  }
  try {
    start = std::stoll(field);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

int64_t process_start(int64_t pid) {
  char state = '?';
  int64_t start = -1;
  return process_stat(pid, state, start) ? start : -1;
}

// A process that runs (a zombie, killed and not yet reaped by its parent, does not: kill(pid, 0) still
// succeeds on it, but it holds no file and writes nothing).
bool process_exists(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  char state = '?';
  int64_t start = -1;
  if (process_stat(pid, state, start) && (state == 'Z' || state == 'X')) return false;
  return true;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The lock files this process holds (absolute paths), for held_here().
std::mutex g_mutex;
std::set<std::string>& held_set() {
  static std::set<std::string> s;
  return s;
}

std::string read_fd(int fd) {
  std::string text;
  char buf[4096];
  off_t off = 0;
  for (;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, off);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    off += n;
    if (text.size() > (1 << 16)) break;  // not a lock record
  }
  return text;
}

// Why a record whose flock is free belongs to a process that is gone ("" = it may be alive).
std::string stale_reason(const LockHolder& h, const LockHolder& me) {
  if (h.host == me.host) {
    if (!h.boot_id.empty() && !me.boot_id.empty() && h.boot_id != me.boot_id)
      return "the host has rebooted since";
    if (!process_exists(h.pid)) return "no process " + std::to_string(h.pid) + " runs on this host (any more)";
    if (h.pid_start >= 0) {
      const int64_t now = process_start(h.pid);
      if (now >= 0 && now != h.pid_start) return "pid " + std::to_string(h.pid) + " now belongs to another process";
    }
    return "";
  }
  if (!me.slurm_job_id.empty() && h.slurm_job_id == me.slurm_job_id)
    return "it is an earlier run of this Slurm job " + me.slurm_job_id + " (requeued)";
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------------ LockHolder

std::string unique_tmp_path(const std::string& path) {
  return path + "." + host_name() + "." + std::to_string(::getpid()) + ".tmp";
}

LockHolder LockHolder::self(const std::string& job) {
  LockHolder h;
  h.job = job;
  h.host = host_name();
  h.pid = static_cast<int64_t>(::getpid());
  if (const char* id = std::getenv("SLURM_JOB_ID")) h.slurm_job_id = id;
  h.started = utc_now();
  h.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  h.pid_start = process_start(h.pid);
  return h;
}

std::string LockHolder::to_json() const {
  nlohmann::json j = {{"format", "aerie.output_lock"}, {"job", job},         {"host", host},
                      {"pid", pid},                    {"slurm_job_id", slurm_job_id}, {"started", started},
                      {"boot_id", boot_id},            {"pid_start", pid_start}};
  return j.dump(1) + "\n";
}

bool LockHolder::from_json(const std::string& text, LockHolder& out) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "aerie.output_lock") return false;
  try {
    out.job = j.value("job", "");
    out.host = j.at("host").get<std::string>();
    out.pid = j.at("pid").get<int64_t>();
    out.slurm_job_id = j.value("slurm_job_id", "");
    out.started = j.value("started", "");
    out.boot_id = j.value("boot_id", "");
    out.pid_start = j.value("pid_start", int64_t{-1});
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

std::string LockHolder::describe() const {
  std::ostringstream os;
  os << "aerie " << (job.empty() ? "?" : job) << " on host " << host << ", pid " << pid;
  if (!slurm_job_id.empty()) os << ", Slurm job " << slurm_job_id;
  if (!started.empty()) os << ", started " << started;
  return os.str();
}

// ------------------------------------------------------------------------------------------ OutputLock

std::string OutputLock::lock_path(const std::string& target, LockTarget kind) {
  fs::path p = fs::absolute(fs::path(target)).lexically_normal();
  if (kind == LockTarget::Folder) return (p / ".aerie.lock").string();
  if (!p.has_filename()) p = p.parent_path();  // "dir/file/" -> "dir/file"
  return p.string() + ".lock";
}

bool OutputLock::held_here(const std::string& target, LockTarget kind) {
  std::lock_guard<std::mutex> g(g_mutex);
  return held_set().count(lock_path(target, kind)) > 0;
}

OutputLock::OutputLock(OutputLock&& o) noexcept
    : fd_(o.fd_), path_(std::move(o.path_)), created_dir_(std::move(o.created_dir_)) {
  o.fd_ = -1;
}

OutputLock& OutputLock::operator=(OutputLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    created_dir_ = std::move(o.created_dir_);
    o.fd_ = -1;
  }
  return *this;
}

OutputLock::~OutputLock() { release(); }

void OutputLock::release() noexcept {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while the flock is held: a waiting opener of this inode then retries
  ::close(fd_);
  fd_ = -1;
  if (!created_dir_.empty()) {  // a refused job leaves no empty output folder behind
    std::error_code ec;
    if (fs::is_empty(created_dir_, ec) && !ec) fs::remove(created_dir_, ec);
    created_dir_.clear();
  }
  std::lock_guard<std::mutex> g(g_mutex);
  held_set().erase(path_);
}

OutputLock OutputLock::acquire(const std::string& target, LockTarget kind, const std::string& job,
                               const LockOptions& options) {
  const std::string path = lock_path(target, kind);
  const std::string what = job + ": " + options.option + " " + target;
  std::error_code ec;
  const bool created = kind == LockTarget::Folder && !fs::exists(target, ec);
  fs::create_directories(kind == LockTarget::Folder ? fs::path(target) : fs::path(path).parent_path(), ec);
  AERIE_CHECK(!ec, what << ": cannot create the folder for the lock file " << path << ": " << ec.message());
  const LockHolder me = LockHolder::self(job);
  for (int attempt = 0;; ++attempt) {
    AERIE_CHECK(attempt < 100, what << ": the lock file " << path << " keeps being replaced by another process");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    AERIE_CHECK(fd >= 0, what << ": cannot open the lock file " << path << ": " << std::strerror(errno));
    bool flocked = true;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK || err == EINTR) {
        LockHolder h;
        const std::string text = read_fd(fd);
        ::close(fd);
        AERIE_THROW(what << " is in use by another job: "
                         << (LockHolder::from_json(text, h) ? h.describe() : std::string("(holder not recorded yet)"))
                         << " holds the lock " << path
                         << ". Wait for that job to end, or give this job another " << options.option << ".");
      }
      if (err != ENOLCK && err != ENOSYS && err != EOPNOTSUPP && err != EINVAL) {
        ::close(fd);
        AERIE_THROW(what << ": flock of the lock file " << path << " failed: " << std::strerror(err));
      }
      AERIE_LOG(warning) << what << ": the file system does not lock " << path << " (flock: " << std::strerror(err)
                         << "); relying on its holder record alone (docs/formats.md, Output locks)";
      flocked = false;
    }
    // The path may have been unlinked (and perhaps recreated) by a holder's release() between our open and
    // our flock: then we locked an orphan inode, and try again.
    struct stat by_fd {}, by_path {};
    if (::fstat(fd, &by_fd) != 0 || ::stat(path.c_str(), &by_path) != 0 || by_fd.st_ino != by_path.st_ino ||
        by_fd.st_dev != by_path.st_dev) {
      ::close(fd);
      continue;
    }
    const std::string text = read_fd(fd);
    LockHolder old;
    if (LockHolder::from_json(text, old)) {
      const std::string reason = stale_reason(old, me);
      if (reason.empty() && !options.force_unlock) {
        ::close(fd);
        if (old.host != me.host) {
          AERIE_THROW(what << ": the lock " << path << " names " << old.describe()
                           << ", on another host, where aerie cannot tell whether it still runs. If that job has "
                              "ended (squeue -j ID, or the host is down), rerun with --force-unlock; else wait "
                              "for it or give this job another "
                           << options.option << ".");
        }
        AERIE_THROW(what << ": the lock " << path << " names " << old.describe()
                         << ", which still runs, although its lock is free (a file system that ignores flock?). "
                            "Wait for it to end, or, if it does not write here, rerun with --force-unlock.");
      }
      AERIE_LOG(warning) << job << ": taking over the lock " << path << " of " << old.describe() << ": "
                         << (reason.empty() ? std::string("--force-unlock") : reason)
                         << (flocked ? "" : " (no flock on this file system)");
    } else if (!text.empty() && !flocked) {
      ::close(fd);
      AERIE_THROW(what << ": the lock file " << path << " holds no aerie lock record; remove it if no job uses "
                       << target);
    } else if (!text.empty()) {
      // Its flock is free, so no job holds it; but what wrote it is unknown (a damaged record, a file
      // copied over it): said once, then replaced by this job's record.
      AERIE_LOG(warning) << job << ": taking over the lock " << path << ", which holds no readable aerie lock record ("
                         << text.size() << " bytes" << (text.size() > (1 << 16) ? " or more" : "")
                         << ") and is not flocked by any process";
    }
    const std::string mine = me.to_json();
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()) ||
        ::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      AERIE_THROW(what << ": cannot write the lock file " << path << ": " << std::strerror(err));
    }
    OutputLock lock;
    lock.fd_ = fd;
    lock.path_ = path;
    if (created) lock.created_dir_ = fs::absolute(target, ec).lexically_normal().string();
    {
      std::lock_guard<std::mutex> g(g_mutex);
      held_set().insert(path);
    }
    AERIE_LOG(debug) << job << ": locked " << path;
    return lock;
  }
}

OutputLock acquire_output_lock(MPI_Comm comm, const std::string& target, LockTarget kind, const std::string& job,
                               const LockOptions& options) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  OutputLock lock;
  std::string error;
  if (rank == 0 && !OutputLock::held_here(target, kind)) {
    try {
      lock = OutputLock::acquire(target, kind, job, options);
    } catch (const Error& e) {
      error = e.what();
      if (error.empty()) error = "cannot lock " + target;
    }
  }
  int64_t n = static_cast<int64_t>(error.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, comm);
  if (n == 0) return lock;
  error.resize(static_cast<size_t>(n));
  MPI_Bcast(error.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  throw CollectiveError(error);
}

}  // namespace aerie
