// aerie prepare: conversations -> tokens + loss masks, one HDF5 file ("aerie.prepared" v1, src/data/prepare.h).
//   mpirun -np R aerie prepare --input FILE.jsonl|FILE.json|FILE.txt --tokenizer DIR --output prepared.h5
//          [--format auto|sharegpt|openai|tokenized|text] [--template plain|llama3|qwen3|...] [--max-length 2048]
//          [--overlong truncate|drop] [--max-samples N] [--overwrite]
// Every rank reads and tokenizes its own byte range of the input; all ranks write the one output file
// collectively (MPI-IO), as "<output>.tmp" renamed when complete.
#include <mpi.h>

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/extract.h"
#include "data/prepare.h"
#include "jobs/jobs.h"
#include "model/target_config.h"

namespace aerie::jobs {

int prepare(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie prepare: conversations -> tokens + loss masks (one HDF5 file)");
  desc.add_options()("input", po::value<std::string>()->required(),
                     "input: JSONL (ShareGPT, OpenAI messages or pre-tokenized), a JSON array of such records, or plain text (.txt)")(
      "format", po::value<std::string>()->default_value("auto"),
      "auto, sharegpt, openai, tokenized, text (auto: text for .txt, else detected per JSONL line)")(
      "tokenizer", po::value<std::string>()->required(), "directory with tokenizer.json or tiktoken.model (or the file)")(
      "template", po::value<std::string>()->default_value("plain"),
      "chat template: a name of configs/templates (llama3, llama3.1, mistral, mistral-v1, mistral-v3, qwen2.5, "
      "qwen3, qwen3-nothink, deepseek-v3, kimi-k2, kimi-k2-thinking, chatml, smollm2) or a path to such an INI file; plain = BOS + turn "
      "texts, EOS after each assistant turn (base models). See docs/preparing-data.md")(
      "output", po::value<std::string>()->required(), "output prepared.h5")(
      "max-length", po::value<int64_t>()->default_value(2048), "maximum tokens per sample")(
      "overlong", po::value<std::string>()->default_value("truncate"),
      "samples longer than --max-length: truncate (keep the first max-length tokens) or drop")(
      "max-samples", po::value<int64_t>()->default_value(-1), "keep the first N usable samples (-1: all)")(
      "overwrite", po::bool_switch(),
      "replace an --output prepared with other settings or from older files (refused otherwise: shards extracted "
      "from it would no longer match it); an up-to-date --output is kept either way")(
      "no-space-check", po::bool_switch(),
      "start even when the --output's file system reports less free space than the file needs (refused "
      "otherwise, before the file is created)");
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("prepare", args, desc, vm)) return 0;

  PrepareOptions opt;
  opt.input = vm["input"].as<std::string>();
  opt.format = input_format_from_name(vm["format"].as<std::string>());
  opt.tokenizer = vm["tokenizer"].as<std::string>();
  opt.chat_template = vm["template"].as<std::string>();
  opt.output = follow_output_link("prepare", vm["output"].as<std::string>());
  opt.max_length = vm["max-length"].as<int64_t>();
  opt.overlong = overlong_from_name(vm["overlong"].as<std::string>());
  opt.max_samples = vm["max-samples"].as<int64_t>();
  opt.space_check = !vm["no-space-check"].as<bool>();
  AERIE_USAGE_CHECK(opt.max_samples == -1 || opt.max_samples >= 1,
                    "aerie prepare: --max-samples " << opt.max_samples << " keeps no sample (-1: all, N >= 1: the first N)");
  {  // A missing input is the error, before any note on the other options. A plain Error (logged, then MPI_Abort):
     // a rank that alone cannot see the file (a node-local path) ends the job instead of leaving the others waiting.
    std::error_code ec;
    AERIE_CHECK(std::filesystem::is_regular_file(opt.input, ec),
                "aerie prepare: --input " << opt.input << ": "
                                          << (std::filesystem::exists(opt.input, ec) ? "not a regular file" : "no such file"));
  }
  // The target's context: when the tokenizer folder is the model's (config.json
  // beside tokenizer.json), samples longer than its max_position_embeddings would be refused by extract.
  const std::filesystem::path cfg_dir = std::filesystem::is_directory(opt.tokenizer)
                                            ? std::filesystem::path(opt.tokenizer)
                                            : std::filesystem::path(opt.tokenizer).parent_path();
  if (std::filesystem::exists(cfg_dir / "config.json")) {
    try {
      const TargetConfig c = load_target_config(cfg_dir.string());
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (c.max_position_embeddings > 0 && opt.max_length > c.max_position_embeddings && rank == 0)
        AERIE_LOG(warning) << "prepare: --max-length " << opt.max_length << " exceeds max_position_embeddings "
                           << c.max_position_embeddings << " of " << (cfg_dir / "config.json").string()
                           << ": extract refuses longer samples; pass --max-length " << c.max_position_embeddings;
    } catch (const Error&) {
      // Not a config aerie reads (a tokenizer-only folder with another config.json): nothing to check.
    }
  }
  // Before any work: an --output that names a folder or another kind of file (a model's weights, a draft
  // vocabulary, an eval result) is refused, not replaced when the job ends.
  on_rank0([&] {
    check_output_replaceable("prepare", opt.output, "a prepared file of aerie prepare",
                             [](const std::string& p) { return PreparedFile(p).num_samples() >= 0; });
  });
  // OUTPUT.lock, held by rank 0 while the ranks write OUTPUT.tmp: a second prepare into OUTPUT is refused.
  const OutputLock lock = lock_output(vm, "prepare", opt.output, LockTarget::File);
  // A rerun (a Slurm requeue, a script run twice) keeps an --output that is up to date (the same settings,
  // newer than its input, tokenizer and template files: make's rule) and refuses to replace another run's
  // without --overwrite: the shards extracted from it record it (its fingerprint), so a new one orphans them.
  int up_to_date = 0;
  on_rank0([&] {
    std::error_code ec;  // a missing or empty --output (check_output_replaceable took it) is written
    if (!std::filesystem::is_regular_file(opt.output) || std::filesystem::file_size(opt.output, ec) == 0 || ec) return;
    const PreparedFileState state = prepared_file_state(opt);
    if (state.kind == PreparedFileState::UpToDate) {
      up_to_date = 1;
      AERIE_LOG(info) << "prepare: " << opt.output << " is up to date (prepared from " << opt.input
                      << " with these settings, newer than its input, tokenizer and template files; "
                      << PreparedFile(opt.output).num_samples() << " samples): nothing to do. Remove it to prepare again";
    } else if (state.kind == PreparedFileState::Legacy) {
      AERIE_LOG(info) << "prepare: preparing " << opt.output << " again: it was " << state.why;
    } else if (vm["overwrite"].as<bool>()) {
      AERIE_LOG(warning) << "prepare: replacing " << opt.output << " (--overwrite): " << state.why;
    } else {
      AERIE_THROW("prepare: --output " << opt.output << " was prepared with other settings or from older files: "
                                       << state.why << ". Shards extracted from it record that file and would no "
                                       << "longer match a new one: pass --overwrite to replace it, or choose "
                                       << "another --output");
    }
  });
  MPI_Bcast(&up_to_date, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (up_to_date) return 0;
  run_prepare(opt, MPI_COMM_WORLD);
  return 0;
}

}  // namespace aerie::jobs
