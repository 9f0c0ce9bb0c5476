#include <fstream>
#include <iostream>

#include <mpi.h>

#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {

bool parse_options(const std::string& job, const std::vector<std::string>& args, po::options_description& desc,
                   po::variables_map& vm) {
  po::options_description common("Common options");
  common.add_options()("help,h", "show this help")(
      "config", po::value<std::string>(), "INI file with options of this job (command line overrides it)")(
      "log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warning, error");
  po::options_description all;
  all.add(desc).add(common);
  try {
    po::store(po::command_line_parser(args).options(all).run(), vm);
    if (vm.count("config")) {
      std::string path = vm["config"].as<std::string>();
      std::ifstream in(path);
      if (!in) throw UsageError("cannot open config file " + path);
      try {
        // allow_unregistered = false: a typo in a config file is an error, not a silent default.
        po::store(po::parse_config_file(in, all, false), vm);
      } catch (const po::error& e) {
        throw UsageError("config file " + path + ": " + e.what());
      }
    }
    if (vm.count("help")) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::cout << "usage: aerie " << job << " [options]\n" << all << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError("aerie " + job + ": " + e.what() + " (see aerie " + job + " --help)");
  }
  return true;
}

void add_lock_options(po::options_description& desc) {
  desc.add_options()("force-unlock", po::bool_switch()->default_value(false),
                     "take over the output's lock from a job aerie cannot check (recorded on another host); "
                     "only after making sure that job has ended (docs/formats.md, Output locks)");
}

OutputLock lock_output(const po::variables_map& vm, const std::string& job, const std::string& target,
                       LockTarget kind) {
  LockOptions o;
  o.force_unlock = vm.count("force-unlock") && vm["force-unlock"].as<bool>();
  return acquire_output_lock(MPI_COMM_WORLD, target, kind, job, o);
}

}  // namespace aerie::jobs
