// aerie extract: the target's hidden states of every prepared sample, to HDF5 shards.
//   mpirun -np R aerie extract --model DIR --prepared prepared.h5 --output SHARD_DIR [--tp 1]
//          [--samples-per-shard 64] [--aux-layers 2,5,8] [--device auto|cpu|cuda] [--dtype auto|f32|bf16]
//          [--random-weights SEED] [--skip-nonfinite]
// R/tp groups of tp consecutive ranks each run the target (tensor parallel) over chunks handed out by
// rank 0; each group's leader writes its shards. On CUDA each rank uses GPU local_rank() and the tp
// group reduces over NCCL (the MPI communicators still hand out the chunks). Rerunning after a kill redoes only missing shards.
// SIGTERM/SIGINT/SIGUSR1 (Slurm preemption) stop the run after the shards in hand are closed; the exit
// status is then 3 (as for train), and a rerun does the rest. A second signal kills as usual.
// A sample whose hidden states hold a NaN or an infinity stops the job with an error naming it; with
// --skip-nonfinite it is left out of its shard, named in a warning and counted.
// The work and the dispatch protocol: src/data/extract.h. The shard format: src/data/shard.h,
// docs/formats.md.
#include <signal.h>

#include <csignal>
#include <iomanip>
#include <sstream>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "data/extract.h"
#include "data/prepare.h"
#include "io/h5.h"
#include "jobs/jobs.h"
#include "jobs/target_device.h"
#include "kernels/gemm.h"
#include "model/target.h"

namespace aerie::jobs {
namespace {

// The tokenizer a prepared file was made with against --model's: both encode prepare's probe text
// (data/prepare.h tokenizer_probe). Another result means the prepared ids are other tokens to this target
// (a tokenizer of the same vocabulary size passes the id range check). A warning: nothing is checked for
// a prepared file of an older aerie (no probe) or a model folder without a tokenizer aerie reads.
void warn_other_tokenizer(const std::string& prepared, const std::string& model_dir) {
  std::string theirs, made_with;
  {
    h5::File f = h5::File::open(prepared);
    if (!f.has_attr("tokenizer_probe")) return;
    theirs = f.string_attr("tokenizer_probe");
    made_with = f.has_attr("tokenizer") ? f.string_attr("tokenizer") : std::string("?");
  }
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::load(model_dir);
  } catch (const Error&) {
    return;
  }
  const std::string mine = tokenizer_probe(*tok);
  if (mine != theirs)
    AERIE_LOG(warning) << "extract: --prepared " << prepared << " was tokenized with " << made_with
                       << ", which encodes a probe text differently from --model " << model_dir
                       << "'s tokenizer (tokenizer_probe " << theirs << " against " << mine
                       << "): its ids may be other tokens to this target; prepare again with --tokenizer " << model_dir;
}

// extract's options (its --help).
po::options_description extract_options() {
  po::options_description desc = job_options("aerie extract: target hidden states to HDF5 shards");
  desc.add_options()("model", po::value<std::string>()->required(), "target model directory (config.json, model.safetensors)")(
      "prepared", po::value<std::string>()->required(), "prepared.h5 written by aerie prepare")(
      "output", po::value<std::string>()->required(), "shard folder (shard-%05d.h5; created)")(
      "tp", po::value<int>()->default_value(1), "tensor-parallel ranks per target replica")(
      "samples-per-shard", po::value<int64_t>()->default_value(64), "prepared samples per shard (chunk size)")(
      "batch-tokens", po::value<int64_t>()->default_value(2048),
      "GPU (or --tp-overlap at --tp 2 or more): consecutive samples share one forward up to this many tokens (a "
      "longer sample goes alone; --tp-overlap splits only forwards of two or more samples); 0: one sample per "
      "forward")(
      "aux-layers", po::value<std::string>()->default_value(""),
      "3 ascending layer ids k, 'input of decoder layer k' (vLLM's convention); default 2,N/2,N-3")(
      "skip-nonfinite", po::bool_switch(),
      "leave out a sample whose hidden states hold a NaN or an infinity (each named in a warning, the total in "
      "the summary and in each shard's skipped_nonfinite attribute) instead of stopping with an error naming it")(
      "storage", po::value<std::string>()->default_value("bf16"),
      "hidden states in the shards: bf16, or fp8 (e4m3fn codes with one fp32 scale per token and H-wide "
      "vector: about half the bytes; shard format version 2, which train reads as well)")(
      "no-space-check", po::bool_switch(),
      "start even when the shards' estimated size (tokens x (8 H + 5) bytes, fp8: 4 H + 21) exceeds the "
      "output's free space")(
      "random-weights", po::value<int64_t>()->default_value(-1),
      "benchmarks: random N(0, 0.02^2) weights from this seed (>= 0) instead of the checkpoint; --model "
      "then needs only config.json");
  add_target_device_options(desc);
  add_tp_overlap_option(desc);
  add_lock_options(desc);
  return desc;
}

}  // namespace

int extract(const std::vector<std::string>& args) {
  po::options_description desc = extract_options();
  po::variables_map vm;
  if (!parse_options("extract", args, desc, vm)) return 0;
  // Bad input is reported before the target loads (minutes for a large checkpoint).
  const int64_t batch_tokens = vm["batch-tokens"].as<int64_t>();
  AERIE_CHECK(batch_tokens >= 0, "extract: --batch-tokens " << batch_tokens << " is negative (0: one sample per forward)");
  ExtractOptions opt;
  opt.prepared = vm["prepared"].as<std::string>();
  opt.output = vm["output"].as<std::string>();
  opt.samples_per_shard = vm["samples-per-shard"].as<int64_t>();
  opt.batch_tokens = batch_tokens;
  opt.skip_nonfinite = vm["skip-nonfinite"].as<bool>();
  const std::string storage = vm["storage"].as<std::string>();
  AERIE_CHECK(storage == "bf16" || storage == "fp8",
              "extract: --storage '" << storage << "' is not bf16 or fp8");
  opt.meta.fp8 = storage == "fp8";
  check_extract_inputs(opt);
  // Before the target loads: a second extract into this folder is refused at once (rank 0 holds the lock
  // until the job ends; run_extract removes stale .tmp files only under it).
  const OutputLock lock = lock_output(vm, "extract", opt.output, LockTarget::Folder);

  ParallelGroups groups = ParallelGroups::create(vm["tp"].as<int>());
  TargetDevice target = resolve_target_device(vm, groups, "extract");
  const TargetModelOptions& mopt = target.options;
  if (mopt.fp8_gemm) opt.meta.target_gemm = fp8_gemm_tag(vm["tp"].as<int>());
  opt.meta.target_dtype = mopt.dtype == DType::BF16 ? "bf16" : "f32";
  Communicator& model_tp = *target.tp;
  const std::string model_dir = vm["model"].as<std::string>();
  const int64_t random_seed = vm["random-weights"].as<int64_t>();
  // config.json alone first: a bad --aux-layers, or a shard folder of another run (another model, prepared
  // file, aux layers), is reported before the weights load.
  {
    const TargetConfig c = load_model_option("extract", "model", model_dir);
    opt.meta.aux_layers = parse_aux_layers(vm["aux-layers"].as<std::string>(), c.num_hidden_layers, "extract");
    opt.meta.target_model = model_dir;
    opt.meta.hidden_size = c.hidden_size;
    opt.meta.num_hidden_layers = c.num_hidden_layers;
    opt.vocab_size = c.vocab_size;
    opt.meta.target = fingerprint_target(model_dir, random_seed);
    on_rank0([&] {
      // The target's context: a sample past max_position_embeddings is refused here,
      // before the weights load, not run with positions the model was not made for.
      if (c.max_position_embeddings > 0) {
        const PreparedFile prepared(opt.prepared);
        const auto& off = prepared.sample_offsets();
        int64_t longest = 0, at = -1;
        for (size_t i = 0; i + 1 < off.size(); ++i)
          if (off[i + 1] - off[i] > longest) longest = off[i + 1] - off[i], at = static_cast<int64_t>(i);
        AERIE_CHECK(longest <= c.max_position_embeddings,
                    "extract: sample " << at << " of " << opt.prepared << " has " << longest
                                       << " tokens, past the target's max_position_embeddings "
                                       << c.max_position_embeddings << " (" << model_dir
                                       << "/config.json): prepare again with --max-length "
                                       << c.max_position_embeddings << " (--overlong truncate or drop)");
      }
      warn_other_tokenizer(opt.prepared, model_dir);
      const int64_t complete = check_existing_shards(opt);
      // The disk estimate before the weights load.
      const ShardSpace sp = estimate_shard_space(opt, c.hidden_size);
      AERIE_LOG(info) << "extract: the shards take about " << format_bytes(static_cast<double>(sp.bytes_total)) << " ("
                      << sp.tokens << " tokens x " << sp.bytes_per_token << " bytes, " << (opt.meta.fp8 ? "fp8" : "bf16")
                      << ", and per sample 16 bytes and per shard 64 KiB of index), "
                      << (complete < sp.shards && sp.bytes_needed > 0 ? format_bytes(static_cast<double>(sp.bytes_needed)) + " still to write"
                                                       : std::string("all written already"))
                      << "; " << (sp.bytes_available >= 0 ? format_bytes(static_cast<double>(sp.bytes_available)) + " free at " + sp.where
                                                          : "free space unknown");
      if (!vm["no-space-check"].as<bool>()) check_shard_space(sp);
    });
  }
  TargetModel model = random_seed >= 0
                         ? TargetModel::random(load_target_config(model_dir), model_tp, mopt, static_cast<uint64_t>(random_seed))
                         : TargetModel(model_dir, model_tp, mopt);
  const TargetConfig& cfg = model.config();
  const bool overlap = mopt.tp_overlap && tp_overlap_unused(model_tp.size(), batch_tokens).empty();

  if (groups.map.world_rank == 0) {
    // Few forwards of several samples (the only ones --tp-overlap splits): the layout line says so, a warning why.
    const std::string packing = overlap ? tp_overlap_packing_warning("extract", opt.prepared,
                                                                     PreparedFile(opt.prepared).sample_offsets(),
                                                                     opt.samples_per_shard, batch_tokens)
                                        : std::string();
    AERIE_LOG(info) << "extract: target " << model_dir << " (" << cfg.num_hidden_layers << " layers, hidden "
                    << cfg.hidden_size << "), aux layers " << opt.meta.aux_layers[0] << ","
                    << opt.meta.aux_layers[1] << "," << opt.meta.aux_layers[2] << ", on " << device_name(mopt.device)
                    << " in " << aerie::dtype_name(mopt.dtype) << (mopt.fp8_gemm ? " with W8A8 block-FP8 GEMMs" : "")
                    << (random_seed >= 0 ? ", random weights" : "")
                    << (overlap && packing.empty() ? ", tp all-reduces overlapped with compute (two micro-batches)"
                        : overlap ? ", --tp-overlap on the forwards of several samples only (below)"
                                  : "");
    if (mopt.tp_overlap && !overlap)
      AERIE_LOG(warning) << "extract: --tp-overlap does nothing " << tp_overlap_unused(model_tp.size(), batch_tokens);
    if (!packing.empty()) AERIE_LOG(warning) << packing;
  }

  const std::vector<int> aux_layers = opt.meta.aux_layers;
  if (groups.map.world_rank == 0 && (aux_layers[0] == aux_layers[1] || aux_layers[1] == aux_layers[2])) {
    AERIE_LOG(warning) << "extract: aux layers " << aux_layers[0] << "," << aux_layers[1] << "," << aux_layers[2]
                       << " name one layer more than once"
                       << (vm["aux-layers"].as<std::string>().empty()
                               ? " (the default 2, N/2, N-3 of a " + std::to_string(cfg.num_hidden_layers) +
                                     "-layer target)"
                               : std::string())
                       << ": the draft gets the same hidden state twice, and neither vLLM nor SGLang can serve it "
                          "(both capture a layer once: docs/formats.md \"Engine releases\"); --aux-layers picks "
                          "distinct ones";
  }
  const TargetForward forward = model.hidden_states_forward(aux_layers);
  // On a GPU consecutive samples share a forward (up to opt.batch_tokens rows): larger GEMMs; with --tp-overlap
  // on the CPU too (its two micro-batches are sequences of one forward).
  if ((mopt.device == Device::CUDA || overlap) && opt.batch_tokens > 0)
    opt.forward_batch = model.hidden_states_forward_batch(aux_layers);
  StopSignals stop_signals;
  opt.stop_requested = [] { return StopSignals::received() != 0; };
  ExtractStats stats = run_extract(opt, groups, forward);
  if (groups.map.world_rank == 0 && !model.profile_summary().empty())
    AERIE_LOG(info) << "extract: op times (AERIE_PROFILE=1), rank 0: " << model.profile_summary();
  if (groups.map.world_rank == 0 && !gemm_search_summary().empty())
    AERIE_LOG(info) << "extract: rank 0: " << gemm_search_summary();
  if (mopt.device == Device::CUDA) log_gpu_memory("extract", groups.map.world_rank);
  if (stats.stopped && stats.chunks_skipped + stats.chunks_done < stats.chunks) {
    if (groups.map.world_rank == 0) {
      AERIE_LOG(warning) << "extract: stopped by a signal with " << stats.chunks_skipped + stats.chunks_done
                         << " of " << stats.chunks << " shards complete; rerun the same command to finish";
    }
    return kPreemptedExitCode;  // the batch script requeues the job (slurm/)
  }
  return 0;
}

}  // namespace aerie::jobs
