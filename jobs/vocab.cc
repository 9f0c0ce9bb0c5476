// aerie vocab: the draft vocabulary (d2t/t2d, eagle3.md section 2) from the loss-masked token counts of a
// prepared file.
//   aerie vocab --prepared prepared.h5 --output DIR/draft_vocab.safetensors [--draft-vocab-size 32000]
//               [--model DIR | --vocab-size V] [--force]
// V (the length of t2d) is the target model's vocab_size (config.json of --model), else --vocab-size, else
// the tokenizer's vocabulary recorded in the prepared file. The mapping belongs to the draft: an existing
// output is never overwritten without --force. OUTPUT.lock is held while the job runs (a second vocab into
// OUTPUT is refused, naming the first), and the file is written through a temporary file of this job's
// own (io/output_lock.h). Rank 0 does the work; the other ranks wait.
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/extract.h"
#include "data/vocab.h"
#include "io/h5.h"
#include "jobs/jobs.h"
#include "model/target_config.h"

namespace aerie::jobs {

int vocab(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie vocab: draft vocabulary (d2t/t2d) from the loss-masked token counts");
  desc.add_options()("prepared", po::value<std::string>()->required(), "prepared.h5 written by aerie prepare")(
      "output", po::value<std::string>()->required(), "output draft_vocab.safetensors")(
      "draft-vocab-size", po::value<int64_t>()->default_value(32000), "K (K = V when V is smaller)")(
      "model", po::value<std::string>(), "target model directory: V = vocab_size of its config.json")(
      "vocab-size", po::value<int64_t>(), "V, when no --model is given")(
      "tokenizer-vocab-size", po::value<int64_t>(), "same as --vocab-size")(
      "force", po::bool_switch(), "overwrite an existing output (the mapping belongs to the draft trained with it)");
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("vocab", args, desc, vm)) return 0;
  // Option values first, on every rank (exit 2, no abort), before the prepared file is counted.
  const int64_t K_asked = vm["draft-vocab-size"].as<int64_t>();
  // One token: the draft's softmax over it is 1 whatever the weights, so the loss is 0 and nothing trains.
  if (K_asked < 2)
    throw UsageError("aerie vocab: --draft-vocab-size must be >= 2 (over one token the draft's loss is 0 and "
                     "nothing trains), got " + std::to_string(K_asked));
  // V ids, each counted in an int64 (t2d and the counts are V long): the largest real vocabulary is ~262k;
  // 2^31 bounds it well above any and far below what a typo (4294967301) would allocate.
  for (const char* name : {"vocab-size", "tokenizer-vocab-size"})
    if (vm.count(name) && (vm[name].as<int64_t>() < 1 || vm[name].as<int64_t>() > (int64_t{1} << 31)))
      throw UsageError(std::string("aerie vocab: --") + name + " must be in [1, 2^31], got " +
                       std::to_string(vm[name].as<int64_t>()));
  if (vm.count("model") && (vm.count("vocab-size") || vm.count("tokenizer-vocab-size")))
    throw UsageError("aerie vocab: --model sets V (its config.json's vocab_size); --vocab-size is for a run without "
                     "--model: give one of them");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string output = follow_output_link("vocab", vm["output"].as<std::string>());
  // OUTPUT.lock before the prepared file is read: a second vocab into OUTPUT is refused at start (two
  // of them shared OUTPUT.tmp, and one reporting success left the other's file).
  const OutputLock lock = lock_output(vm, "vocab", output, LockTarget::File);
  if (rank == 0) {
    const std::string prepared = vm["prepared"].as<std::string>();
    AERIE_CHECK(!std::filesystem::is_directory(output),
                "vocab: --output " << output << " is a folder; give the file to write, e.g. " << output
                                   << "/draft_vocab.safetensors");
    AERIE_CHECK(std::filesystem::is_regular_file(prepared),
                "vocab: --prepared " << prepared
                                     << (std::filesystem::exists(prepared) ? " is not a file" : ": no such file")
                                     << " (the --output of aerie prepare)");
    try {
      PreparedFile check(prepared);  // the header and sample offsets only
    } catch (const Error& e) {
      AERIE_THROW("vocab: --prepared " << prepared << " is not a prepared file of aerie prepare: " << e.what());
    }
    if (std::filesystem::exists(output)) {
      // --force replaces a draft vocabulary, nothing else (a mistyped --output over the target's weights or
      // the prepared file would be lost).
      bool is_vocab = false;
      try {
        load_draft_vocab(output);
        is_vocab = true;
      } catch (const Error&) {
      }
      AERIE_CHECK(is_vocab, "vocab: --output " << output << " exists and is not a draft vocabulary of aerie vocab, so it "
                                               << "is not replaced, not even with --force: remove it or choose another "
                                                  "--output");
      AERIE_CHECK(vm["force"].as<bool>(), "vocab: " << output << " exists; the draft vocabulary belongs to the draft "
                                                    << "trained with it (eagle3.md 2). Use --force to replace it.");
    }
    int64_t V = -1;
    std::string source;
    if (vm.count("model")) {
      V = load_model_option("vocab", "model", vm["model"].as<std::string>()).vocab_size;
      source = vm["model"].as<std::string>() + "/config.json";
    } else if (vm.count("vocab-size") || vm.count("tokenizer-vocab-size")) {
      V = vm.count("vocab-size") ? vm["vocab-size"].as<int64_t>() : vm["tokenizer-vocab-size"].as<int64_t>();
      source = "--vocab-size";
    } else {
      h5::File f = h5::File::open(prepared);
      AERIE_CHECK(f.has_attr("vocab_size"), "vocab: " << prepared << " records no vocab_size; pass --model or --vocab-size");
      V = f.int_attr("vocab_size");
      source = prepared + " (the tokenizer's vocabulary; pass --model when the model's is larger)";
      AERIE_LOG(warning) << "vocab: no --model or --vocab-size; V = " << V << " from " << source;
    }
    AERIE_CHECK(V > 0, "vocab: vocabulary size " << V << " from " << source);
    std::vector<int64_t> counts = count_loss_tokens(prepared, V);
    DraftVocab dv = build_draft_vocab(counts, K_asked);
    const int64_t K = dv.draft_vocab_size();
    int64_t total = 0, distinct = 0, covered = 0;
    for (int64_t j = 0; j < V; ++j) {
      total += counts[static_cast<size_t>(j)];
      distinct += counts[static_cast<size_t>(j)] > 0;
      if (dv.t2d[static_cast<size_t>(j)]) covered += counts[static_cast<size_t>(j)];
    }
    if (K < K_asked) AERIE_LOG(info) << "vocab: draft vocab size " << K_asked << " > V = " << V << ", using K = V";
    // Fewer distinct ids than K: the draft vocabulary holds every id the data has, and the other slots get
    // the smallest unused ids (SpecForge #76). Normal for a small data set or vocabulary (the demo: 230 of
    // K = 256); a warning only when most slots are filler (too little data, or the wrong prepared file?).
    if (distinct < K) {
      std::ostringstream msg;
      msg << "vocab: " << distinct << " distinct loss-masked ids for K = " << K << ": all of them are in the draft "
          << "vocabulary, the other " << K - distinct << " slots get the smallest unused ids (as SpecForge fills them)";
      if (2 * distinct < K)
        AERIE_LOG(warning) << msg.str() << "; fewer than half of K: is the data this small?";
      else
        AERIE_LOG(info) << msg.str();
    }
    std::filesystem::path parent = std::filesystem::path(output).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    save_draft_vocab(output, dv, counts, unique_tmp_path(output));
    AERIE_LOG(info) << "vocab: wrote " << output << ": K = " << K << " of V = " << V << " (from " << source << "), "
                    << total << " loss-masked tokens, " << distinct << " distinct ids, the draft vocabulary covers "
                    << (total ? 100.0 * static_cast<double>(covered) / static_cast<double>(total) : 100.0) << "% of them";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return 0;
}

}  // namespace aerie::jobs
