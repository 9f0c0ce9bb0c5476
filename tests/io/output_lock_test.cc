// OutputLock (io/output_lock.h): the holder record, a second lock refused naming the holder, the stale-lock
// rules (a dead pid, a reused pid, a reboot, another host, a requeued Slurm job) and --force-unlock.
// Two real processes: tests/mpi/concurrent_outputs.sh (two extract runs, two train runs into one folder).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/output_lock.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

using testing::error_of;  // tests/test_util.h

// A record of this process for `job`, with fields changed by `edit`.
std::string record(const std::function<void(LockHolder&)>& edit) {
  LockHolder h = LockHolder::self("extract");
  edit(h);
  return h.to_json();
}

int64_t pid_max() {
  std::ifstream in("/proc/sys/kernel/pid_max");
  int64_t n = 4194304;
  in >> n;
  return n;  // never a pid: pids are below pid_max
}

TEST(OutputLock, RecordNamesThisProcessAndReleaseRemovesIt) {
  const std::string dir = testing::scratch_dir("output_lock_record") + "/shards";  // created by acquire
  OutputLock lock = OutputLock::acquire(dir, LockTarget::Folder, "extract");
  ASSERT_TRUE(lock.held());
  EXPECT_EQ(lock.path(), fs::absolute(dir + "/.aerie.lock").lexically_normal().string());
  EXPECT_TRUE(fs::is_directory(dir));
  LockHolder h;
  ASSERT_TRUE(LockHolder::from_json(slurp(lock.path()), h)) << slurp(lock.path());
  EXPECT_EQ(h.job, "extract");
  EXPECT_EQ(h.pid, static_cast<int64_t>(::getpid()));
  EXPECT_EQ(h.host, LockHolder::self("x").host);
  EXPECT_GE(h.pid_start, 0);
  EXPECT_TRUE(OutputLock::held_here(dir, LockTarget::Folder));
  EXPECT_TRUE(OutputLock::held_here(dir + "/", LockTarget::Folder));  // the same folder
  lock.release();
  EXPECT_FALSE(lock.held());
  EXPECT_FALSE(fs::exists(dir + "/.aerie.lock"));
  EXPECT_FALSE(OutputLock::held_here(dir, LockTarget::Folder));
  // Taken again after the release.
  EXPECT_TRUE(OutputLock::acquire(dir, LockTarget::Folder, "extract").held());
}

// A folder the lock created and nothing else wrote to (a job refused before its first shard) is removed on
// release; one with content, or one that existed before, stays (found by a new-user trial).
TEST(OutputLock, AnEmptyFolderItCreatedIsRemovedOnRelease) {
  const std::string base = testing::scratch_dir("output_lock_created");
  OutputLock a = OutputLock::acquire(base + "/empty", LockTarget::Folder, "extract");
  a.release();
  EXPECT_FALSE(fs::exists(base + "/empty"));
  OutputLock b = OutputLock::acquire(base + "/written", LockTarget::Folder, "extract");
  std::ofstream(base + "/written/shard-00000.h5") << "x";
  b.release();
  EXPECT_TRUE(fs::exists(base + "/written/shard-00000.h5"));
  fs::create_directories(base + "/existing");
  OutputLock c = OutputLock::acquire(base + "/existing", LockTarget::Folder, "extract");
  c.release();
  EXPECT_TRUE(fs::is_directory(base + "/existing"));
}

TEST(OutputLock, FileTargetLocksFileDotLock) {
  const std::string dir = testing::scratch_dir("output_lock_file");
  const std::string out = dir + "/sub/prepared.h5";
  EXPECT_EQ(OutputLock::lock_path(out, LockTarget::File), fs::absolute(out + ".lock").lexically_normal().string());
  OutputLock lock = OutputLock::acquire(out, LockTarget::File, "prepare");
  EXPECT_TRUE(fs::exists(out + ".lock"));
  EXPECT_FALSE(fs::exists(out));  // only the lock file
  std::string e = error_of([&] { OutputLock::acquire(out, LockTarget::File, "prepare"); });
  EXPECT_NE(e.find("prepare: --output " + out + " is in use by another job: aerie prepare on host"), std::string::npos) << e;
}

TEST(OutputLock, SecondLockRefusedNamingTheHolder) {
  const std::string dir = testing::scratch_dir("output_lock_second");
  OutputLock first = OutputLock::acquire(dir, LockTarget::Folder, "train");
  // Another open file description of the same file: flock refuses it as it would another process.
  LockOptions force;
  force.force_unlock = true;  // never overrides a held flock
  for (const LockOptions& o : {LockOptions{}, force}) {
    std::string e = error_of([&] { OutputLock::acquire(dir, LockTarget::Folder, "train", o); });
    EXPECT_NE(e.find("train: --output " + dir + " is in use by another job: aerie train on host " +
                     LockHolder::self("x").host + ", pid " + std::to_string(::getpid())),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("holds the lock " + first.path()), std::string::npos) << e;
  }
  EXPECT_TRUE(first.held());
  EXPECT_TRUE(fs::exists(first.path()));  // the refused attempt left the holder's file alone
}

TEST(OutputLock, StaleRecordOfThisHostIsTakenOver) {
  const std::string dir = testing::scratch_dir("output_lock_stale");
  const std::string path = dir + "/.aerie.lock";
  const std::vector<std::pair<std::string, std::function<void(LockHolder&)>>> stale = {
      {"dead pid", [](LockHolder& h) { h.pid = pid_max(); }},
      {"reused pid", [](LockHolder& h) { h.pid_start += 12345; }},  // this pid, another start time
      {"rebooted", [](LockHolder& h) { h.boot_id = "00000000-0000-0000-0000-000000000000"; }},
      {"torn record", nullptr},
  };
  for (const auto& [what, edit] : stale) {
    write(path, edit ? record(edit) : std::string("{\"format\": \"aerie.output_lock\", \"ho"));
    OutputLock lock = OutputLock::acquire(dir, LockTarget::Folder, "extract");
    LockHolder h;
    ASSERT_TRUE(LockHolder::from_json(slurp(path), h)) << what;
    EXPECT_EQ(h.pid, static_cast<int64_t>(::getpid())) << what;
  }
}

TEST(OutputLock, LiveRecordWithFreeFlockIsRefused) {
  // A record of a live process of this host whose flock is free (a file system that ignores flock).
  const std::string dir = testing::scratch_dir("output_lock_live");
  write(dir + "/.aerie.lock", record([](LockHolder&) {}));
  std::string e = error_of([&] { OutputLock::acquire(dir, LockTarget::Folder, "extract"); });
  EXPECT_NE(e.find("which still runs"), std::string::npos) << e;
  EXPECT_NE(e.find("--force-unlock"), std::string::npos) << e;
  LockOptions force;
  force.force_unlock = true;
  EXPECT_TRUE(OutputLock::acquire(dir, LockTarget::Folder, "extract", force).held());
}

TEST(OutputLock, OtherHostNeedsForceUnlockOrTheSameSlurmJob) {
  const std::string dir = testing::scratch_dir("output_lock_other_host");
  const std::string path = dir + "/.aerie.lock";
  const std::string other = record([](LockHolder& h) {
    h.host = "node-elsewhere";
    h.slurm_job_id = "4242";
  });
  ::unsetenv("SLURM_JOB_ID");
  write(path, other);
  std::string e = error_of([&] { OutputLock::acquire(dir, LockTarget::Folder, "extract"); });
  EXPECT_NE(e.find("names aerie extract on host node-elsewhere, pid " + std::to_string(::getpid()) + ", Slurm job 4242"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("on another host"), std::string::npos) << e;
  EXPECT_NE(e.find("rerun with --force-unlock"), std::string::npos) << e;
  EXPECT_EQ(slurp(path), other);  // left as it was

  ::setenv("SLURM_JOB_ID", "4243", 1);  // another Slurm job: refused as well
  EXPECT_NE(error_of([&] { OutputLock::acquire(dir, LockTarget::Folder, "extract"); }).find("on another host"),
            std::string::npos);
  ::setenv("SLURM_JOB_ID", "4242", 1);  // the same job, requeued (possibly on another node): taken over
  EXPECT_TRUE(OutputLock::acquire(dir, LockTarget::Folder, "extract").held());
  ::unsetenv("SLURM_JOB_ID");

  write(path, other);
  LockOptions force;
  force.force_unlock = true;
  OutputLock lock = OutputLock::acquire(dir, LockTarget::Folder, "extract", force);
  LockHolder h;
  ASSERT_TRUE(LockHolder::from_json(slurp(path), h));
  EXPECT_EQ(h.host, LockHolder::self("x").host);
}

TEST(OutputLock, CollectiveAcquireJoinsTheJobsLockAndThrowsCollectiveError) {
  const std::string dir = testing::scratch_dir("output_lock_collective");
  {
    OutputLock job = acquire_output_lock(MPI_COMM_SELF, dir, LockTarget::Folder, "extract");
    ASSERT_TRUE(job.held());
    // The library inside the job: the job's lock stays in charge.
    OutputLock inner = acquire_output_lock(MPI_COMM_SELF, dir, LockTarget::Folder, "extract");
    EXPECT_FALSE(inner.held());
    EXPECT_TRUE(job.held());
  }
  EXPECT_FALSE(fs::exists(dir + "/.aerie.lock"));
  // Another holder (a raw flock, as another process would have): every rank throws CollectiveError.
  int fd = ::open((dir + "/.aerie.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  EXPECT_THROW(acquire_output_lock(MPI_COMM_SELF, dir, LockTarget::Folder, "extract"), CollectiveError);
  std::string e = error_of([&] { acquire_output_lock(MPI_COMM_SELF, dir, LockTarget::Folder, "extract"); });
  EXPECT_NE(e.find("(holder not recorded yet)"), std::string::npos) << e;
  ::close(fd);
}

}  // namespace
}  // namespace aerie
