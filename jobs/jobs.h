// The batch jobs of aerie, one subcommand each. Every job is collective over MPI_COMM_WORLD: all ranks
// call it with the same arguments. A job returns 0 on success and throws aerie::Error on failure.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace aerie::jobs {

namespace po = boost::program_options;

/// Parses `args` (the arguments after the subcommand) against `desc`, plus the common options
/// --config FILE (an INI file of the same options; the command line overrides it) and --help.
/// Returns false if --help was given (usage printed on rank 0). Throws aerie::Error on unknown or
/// malformed options, naming the option and the file.
bool parse_options(const std::string& job, const std::vector<std::string>& args, po::options_description& desc,
                   po::variables_map& vm);

int prepare(const std::vector<std::string>& args);
int extract(const std::vector<std::string>& args);
int vocab(const std::vector<std::string>& args);
int train(const std::vector<std::string>& args);
int export_draft(const std::vector<std::string>& args);
int eval(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int tokenize(const std::vector<std::string>& args);
int plan(const std::vector<std::string>& args);

}  // namespace aerie::jobs
