// The batch jobs of aerie, one subcommand each. Every job is collective over MPI_COMM_WORLD: all ranks
// call it with the same arguments. A job returns 0 on success and throws aerie::Error on failure.
#pragma once
#include <boost/program_options.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/fingerprint.h"
#include "io/output_lock.h"
#include "model/target_config.h"

namespace aerie::jobs {

namespace po = boost::program_options;

/// Parses `args` (the arguments after the subcommand) against `desc`, plus the common options
/// --config FILE (an INI file of the same options; the command line overrides it) and --help.
/// Returns false if --help was given (usage printed on rank 0). Throws aerie::Error on unknown or
/// malformed options, naming the option and the file.
bool parse_options(const std::string& job, const std::vector<std::string>& args, po::options_description& desc,
                   po::variables_map& vm);

/// The name of `names` closest to the mistyped `given` (Levenshtein distance within 2 edits, or a third of its
/// length if more), or "" when none is that close: option and subcommand suggestions ("did you mean ...?").
std::string closest_name(const std::string& given, const std::vector<std::string>& names);

/// Adds --force-unlock to `desc` (the jobs that lock their output: io/output_lock.h).
void add_lock_options(po::options_description& desc);

/// Locks the job's output (`target`, named by --output) on world rank 0 (io/output_lock.h), before the
/// job reads its model: a second job into the same output is refused at start, naming the holder.
/// Collective over MPI_COMM_WORLD; throws aerie::CollectiveError on every rank on a refusal. `vm` must
/// hold the options of add_lock_options.
OutputLock lock_output(const po::variables_map& vm, const std::string& job, const std::string& target,
                       LockTarget kind);

/// The provenance fingerprint of the target folder `dir` (io/fingerprint.h; of_random when random_seed >= 0),
/// computed on world rank 0 and broadcast (one rank reads the files). Collective over MPI_COMM_WORLD;
/// throws aerie::CollectiveError on every rank with rank 0's message when the files cannot be read.
TargetFingerprint fingerprint_target(const std::string& dir, int64_t random_seed = -1);

/// Runs `f` on world rank 0 only; collective over MPI_COMM_WORLD: when `f` throws aerie::Error, every rank
/// throws aerie::CollectiveError with its message (a clean refusal at start instead of an MPI_Abort).
void on_rank0(const std::function<void()>& f);

/// load_target_config(dir) (model/target_config.h) with its error prefixed "JOB: --OPTION DIR: ", so that a
/// missing folder, a folder without config.json or a draft export given as the target names the option
/// that gave it. Throws aerie::Error.
TargetConfig load_model_option(const std::string& job, const std::string& option, const std::string& dir);

/// The file an --output names, with symbolic links followed: the jobs write OUTPUT.tmp and rename it over
/// OUTPUT, which would replace a link (say prepared.h5 -> /scratch/data/prepared.h5) by a regular file in
/// the link's folder and leave the link's target stale. A link (also a chain, or one whose target does not
/// exist yet) gives its final target, a relative target taken from the link's folder; anything else `path`
/// unchanged. With `log`, world rank 0 logs "JOB: --output PATH is a symbolic link: writing TARGET". Throws
/// aerie::Error naming the link when it cannot be read or loops (more than 40 links).
std::string follow_output_link(const std::string& job, const std::string& path, bool log = true);

/// Refuses to replace what the job's --output names unless it is missing, empty or `is_own(path)` recognises it as
/// this job's kind of output (`what`, e.g. "a prepared file of aerie prepare"): an --output typed over a
/// model's weights, a prepared file or a draft vocabulary would otherwise be lost. A folder is refused too.
/// Throws aerie::Error "JOB: --output PATH exists and is not WHAT (it is an HDF5 file ...) ...". `is_own`
/// is called only for an existing regular file; an exception from it counts as false.
void check_output_replaceable(const std::string& job, const std::string& path, const std::string& what,
                              const std::function<bool(const std::string&)>& is_own);

/// A job's option list for --help, 110 columns wide (Boost's 80 cut long option names such as
/// --draft-norm-before-residual=false inside descriptions in two).
po::options_description job_options(const std::string& caption);

/// `text` without the blanks (spaces, tabs) around it.
std::string trim_blanks(const std::string& text);

/// `text` as a whole a decimal integer, blanks around it ignored ("12", " -3"; not "", "+12", "12a", "1 2"
/// or one beyond int64): the value, else nullopt.
std::optional<int64_t> parse_int64(const std::string& text);

/// --aux-layers "2,5,8" -> {2, 5, 8}; empty -> default_aux_layers(num_layers) (eagle3.md section 1). Throws
/// aerie::Error prefixed with `job` unless it names 3 ascending integers in [0, num_layers].
std::vector<int> parse_aux_layers(const std::string& s, int64_t num_layers, const std::string& job);

int prepare(const std::vector<std::string>& args);
int extract(const std::vector<std::string>& args);
int vocab(const std::vector<std::string>& args);
int train(const std::vector<std::string>& args);
int export_draft(const std::vector<std::string>& args);
int eval(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int tokenize(const std::vector<std::string>& args);
int plan(const std::vector<std::string>& args);
int calibrate(const std::vector<std::string>& args);

}  // namespace aerie::jobs
