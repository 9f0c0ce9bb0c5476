// A lock on a job's output (a folder or a file), so that two jobs never write into the same output at once
// (two `extract` runs into one folder left a corrupt shard under its final name; two `train` runs
// into one folder interleaved their checkpoints and metrics).
//
// Mechanism: flock(2) on a lock file, which the kernel releases when the holding process dies (kill -9
// included), plus a holder record written into that file (job, host, pid, Slurm job id, start time), read
// back to name the holder in a refusal and to recognise a lock left by a job that was killed:
//   - a folder output (extract's shards, train's run folder) is locked by DIR/.aerie.lock;
//   - a file output (prepare's prepared.h5, generate's JSONL) by FILE.lock beside it.
// acquire() takes flock(LOCK_EX | LOCK_NB) on the lock file (never waits):
//   1. the flock is held by another process: refused, naming the holder from its record;
//   2. the flock is free and the file holds no record (none yet, or an empty one): taken;
//   3. the flock is free but a record remains (its holder ended without release(): kill -9, a node lost).
//      It is stale, and taken over with a warning naming it, when
//        - it names this host and its process is gone (no such pid, or the pid now belongs to a process
//          started at another time, or the host rebooted since: /proc/sys/kernel/random/boot_id), or
//        - it names another host and the same Slurm job id as this process (a requeued job: Slurm starts
//          the new run only after the old one ended);
//      otherwise (another host, another or no Slurm job) aerie cannot check that process, and refuses
//      unless LockOptions::force_unlock (`--force-unlock`): the user confirms the holder is gone. A record
//      of a live process on this host whose flock is free (a file system that ignores flock) is refused
//      the same way.
// release() (and the destructor) unlinks the lock file and closes it. acquire() checks that the file it
// locked is still the one at the path (a holder may unlink it in between) and retries otherwise, so two
// processes never both hold a lock.
//
// Network file systems: on Linux NFS (v3 with lockd, v4) flock is emulated with whole-file POSIX locks that
// the server keeps across clients, so the lock holds between hosts; a client that dies keeps its lock
// until the server's lease expires (NFSv4: about 90 s) and a rerun is refused until then. A mount with
// local_lock=flock or -o nolock gives node-local locks only. Lustre gives cluster-wide flock with the
// `flock` mount option, node-local ones with `localflock`, and ENOSYS without either. Where the lock is
// node-local, jobs on two hosts are still told apart by the record (rule 3: another host is refused
// unless --force-unlock), except for two jobs starting within the same moment. Where flock fails
// (ENOLCK, ENOSYS, EOPNOTSUPP), acquire() warns and relies on the record alone.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

namespace aerie {

/// The process a lock record names (the content of the lock file, JSON).
struct LockHolder {
  std::string job;            // "extract", "train", ...
  std::string host;           // gethostname()
  int64_t pid = 0;            // the holding process (world rank 0 of an MPI job)
  std::string slurm_job_id;   // $SLURM_JOB_ID, empty outside Slurm
  std::string started;        // UTC, "2025-01-31 12:00:00 UTC"
  std::string boot_id;        // /proc/sys/kernel/random/boot_id of the host (empty if unknown)
  int64_t pid_start = -1;     // the process's start time, clock ticks after boot (/proc/PID/stat field 22)

  /// This process, as a holder of a lock for `job`.
  static LockHolder self(const std::string& job);
  std::string to_json() const;
  /// Parses a record; false when `text` is not one (empty, torn by a killed writer, another file).
  static bool from_json(const std::string& text, LockHolder& out);
  /// "aerie extract on host node1, pid 1234, Slurm job 5678, started 2025-01-31 12:00:00 UTC".
  std::string describe() const;
};

/// Whether a lock is taken on a folder (DIR/.aerie.lock) or on a file (FILE.lock).
enum class LockTarget { Folder, File };

struct LockOptions {
  /// Take over a record that aerie cannot prove stale (rule 3 above). Never overrides a held flock.
  bool force_unlock = false;
  /// The option that named the output, for messages ("--output").
  std::string option = "--output";
};

/// An exclusive lock on one output, held from acquire() until release() or destruction. Movable.
class OutputLock {
 public:
  OutputLock() = default;
  OutputLock(OutputLock&& o) noexcept;
  OutputLock& operator=(OutputLock&& o) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  ~OutputLock();

  /// Locks `target` for `job` by the rules above: a Folder target is created when missing (and its
  /// parents), a File target's parent folder too. Throws aerie::Error naming `job`, the option, the
  /// target, the holder and the lock file when another process holds the lock or when a record is not
  /// provably stale (without options.force_unlock); and on I/O errors (naming the lock file). Logs a
  /// warning naming the old holder when it takes over a stale lock.
  static OutputLock acquire(const std::string& target, LockTarget kind, const std::string& job,
                            const LockOptions& options = {});
  /// The lock file of `target`: TARGET/.aerie.lock for a folder, TARGET.lock for a file.
  static std::string lock_path(const std::string& target, LockTarget kind);
  /// Whether an OutputLock of this process holds `target` now (library code that can be called with or
  /// without its job's lock takes one only when none is held).
  static bool held_here(const std::string& target, LockTarget kind);

  bool held() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  /// Unlinks the lock file and releases the flock; nothing when not held. A folder that acquire created
  /// for a Folder lock and that is still empty (a job refused before writing anything) is removed too.
  /// Does not throw.
  void release() noexcept;

 private:
  int fd_ = -1;
  std::string path_;         // absolute, normalised
  std::string created_dir_;  // the Folder target when acquire created it, else ""
};

/// A temporary file name for `path` that no other writer uses: "<path>.<host>.<pid>.tmp". A job writes its
/// output there and renames it over `path`, so that two writers of one output (jobs on a file system
/// without flock, or one that took over a lock with --force-unlock) never share a temporary file, and one's
/// rename never publishes the other's half-written bytes (two vocab jobs shared OUTPUT.tmp). A
/// writer killed before its rename leaves its file behind, named by its host and pid.
std::string unique_tmp_path(const std::string& path);

/// acquire() on rank 0 of `comm` only (the rank that coordinates the writers of an MPI job; the other
/// ranks get an empty OutputLock), collective over `comm`: every rank learns the outcome, and on a
/// refusal every rank throws aerie::CollectiveError with rank 0's message (main() then ends the job with
/// status 1 and the message once, no MPI_Abort). When this process already holds the lock (held_here: the
/// job took it before calling the library), rank 0 gets an empty OutputLock too and the earlier lock
/// stays in charge.
OutputLock acquire_output_lock(MPI_Comm comm, const std::string& target, LockTarget kind, const std::string& job,
                               const LockOptions& options = {});

}  // namespace aerie
