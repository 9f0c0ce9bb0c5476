// aerie: trains EAGLE-3 draft models. One MPI program with a subcommand per batch job.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"
#include "jobs/jobs.h"

namespace {

const std::map<std::string, std::pair<std::function<int(const std::vector<std::string>&)>, const char*>>&
subcommands() {
  using namespace aerie::jobs;
  static const std::map<std::string, std::pair<std::function<int(const std::vector<std::string>&)>, const char*>>
      m = {
          {"prepare", {prepare, "conversations -> tokens + loss masks (one HDF5 file)"}},
          {"extract", {extract, "target forward, hidden states to HDF5 shards"}},
          {"vocab", {vocab, "draft vocabulary (d2t/t2d) from the loss-masked token counts"}},
          {"train", {train, "train the EAGLE-3 draft with training-time test"}},
          {"export", {export_draft, "write the draft as a directory vLLM and SGLang load (--format speculators: "
                                    "for vllm serve DIR; --best: by acceptance length)"}},
          {"eval", {eval, "acceptance length: teacher-forced and real speculative decoding (--run: every checkpoint)"}},
          {"generate", {generate, "target generation (greedy or sampled): regenerate a conversation set"}},
          {"plan", {plan, "GPU memory per tp rank from config.json and the safetensors headers; with --calibration the "
                         "hours and disk of the jobs for a dataset"}},
          {"calibrate", {calibrate, "measure this node (forward by layer kind, draft step, disk, all-reduce) for "
                                    "aerie plan --calibration"}},
          {"tokenize", {tokenize, "text on stdin -> token ids (and byte offsets) of a tokenizer.json or tiktoken.model"}},
      };
  return m;
}

/// The subcommand list: to stdout for --help, to stderr after a usage error.
void usage(std::ostream& os) {
  os << "usage: mpirun -np N aerie <subcommand> [options]   (aerie <subcommand> --help, aerie help <subcommand>,\n"
        "       aerie --version)\n\nsubcommands:\n";
  for (auto& [name, v] : subcommands()) os << "  " << name << std::string(10 - name.size(), ' ') << v.second << "\n";
}

/// `aerie --version`: the version, the commit and the backends of this build.
void version(std::ostream& os) {
  os << "aerie " << aerie::aerie_version_string() << "   (version " << aerie::aerie_version() << ", git "
     << aerie::aerie_git_commit() << "; the aerie_version every output records)\n"
     << "backends: " << (aerie::cuda::built() ? "CPU, CUDA" : "CPU") << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--version" || args[0] == "-V")) {
    if (rank == 0) version(std::cout);
    MPI_Finalize();
    return 0;
  }
  // `aerie help JOB` is `aerie JOB --help`; `aerie help` the list.
  if (!args.empty() && args[0] == "help") {
    if (args.size() == 1) args = {"--help"};
    else args = {args[1], "--help"};
  }
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    if (rank == 0) usage(args.empty() ? std::cerr : std::cout);
    MPI_Finalize();
    return args.empty() ? 2 : 0;
  }
  auto it = subcommands().find(args[0]);
  if (it == subcommands().end()) {
    if (rank == 0) {
      std::vector<std::string> names;
      for (const auto& [name, job] : subcommands()) names.push_back(name);
      const std::string best = aerie::jobs::closest_name(args[0], names);
      std::cerr << "aerie: unknown subcommand '" << args[0] << "'" << (best.empty() ? "" : " (did you mean " + best + "?)")
                << "\n";
      usage(std::cerr);
    }
    MPI_Finalize();
    return 2;
  }
  std::string level = "info";
  for (size_t i = 1; i + 1 < args.size(); ++i)
    if (args[i] == "--log-level") level = args[i + 1];
  int rc = 0;
  try {
    aerie::init_logging(rank, level);
    rc = it->second.first(std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const aerie::UsageError& e) {
    // Every rank parsed the same arguments and failed the same way: no peer waits in a collective.
    if (rank == 0) std::cerr << e.what() << "\n";
    MPI_Finalize();
    return 2;
  } catch (const aerie::CollectiveError& e) {
    // Thrown by every rank with the same message (e.g. an output lock held by another job).
    if (rank == 0) AERIE_LOG(error) << "aerie " << args[0] << " failed: " << e.what();
    MPI_Finalize();
    return 1;
  } catch (const std::exception& e) {
    // Log, then abort the whole job so that no peer waits forever in a collective. Every rank logs its own
    // error at once (a root cause on one rank is never lost to another's abort); ranks after 0 then wait 0.1 s
    // a rank (at most 3 s) before MPI_Abort, so that where several fail together (the trainers of a streamed run
    // reading one checkpoint) Open MPI is handed one abort, not several at once (its "ORTE_ERROR_LOG: Data
    // unpack" lines then).
    AERIE_LOG(error) << "aerie " << args[0] << " failed: " << e.what();
    std::cerr.flush();
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 * std::min(rank, 30)));
    if (size == 1) {  // no peer to release: a normal exit (MPI_Abort of a lone process adds Open MPI noise)
      MPI_Finalize();
      return 1;
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  MPI_Finalize();
  return rc;
}
