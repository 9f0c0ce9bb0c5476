// aerie plan: the GPU memory of a target per tensor-parallel rank, from config.json and the safetensors
// headers alone (no tensor data is read), before an extract (or, --job generate, a generate) run commits
// GPUs to it; with --calibration (aerie calibrate's file) also the hours and disk of the jobs for a dataset
// (jobs/plan_time.cc).
//   aerie plan --model DIR [--job extract|generate] [--tp 8] [--max-length 8192] [--batch-tokens 2048 | --batch-size B]
//              [--gpu-memory 96GB] [--reserve 2GiB] [--embed-split replicated|vocab]
//   aerie plan --model-config config.json --tensors tensors.jsonl.gz ...   (a tensor list instead of DIR)
// --tp defaults to the calibration's, else the world size (mpirun -np 8 aerie plan ... plans tp 8); --gpu-memory to this GPU's
// memory, else 80 GiB. Rank 0 prints. The rules and the arithmetic: docs/memory-plan.md; the planning
// itself: src/model/memory_plan.h. Exit status 0 when the plan fits the GPU memory, 1 when it does not.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "jobs/jobs.h"
#include "jobs/plan_time.h"
#include "jobs/target_device.h"
#include "model/memory_plan.h"
#include "model/target_config.h"

namespace aerie::jobs {

namespace {

// 71.02 GiB, 3.50 MiB, 812 B: binary units, chosen per value (core/log.h's format_bytes), signed.
std::string bytes_str(int64_t b) {
  const int64_t a = b < 0 ? -b : b;
  return (b < 0 ? "-" : "") + (a < 1024 ? std::to_string(a) + " B" : format_bytes(static_cast<double>(a)));
}

std::string gb_str(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(b) / 1e9);
  return buf;
}

// One row: label, tensors, checkpoint bytes, per-rank bytes, then a free-form tail.
void row(std::ostream& os, const std::string& label, const std::string& tensors, const std::string& ckpt,
         const std::string& rank, const std::string& tail = "") {
  char buf[160];
  std::snprintf(buf, sizeof buf, "  %-40s %9s %12s %12s", label.c_str(), tensors.c_str(), ckpt.c_str(), rank.c_str());
  std::string line = buf + (tail.empty() ? "" : "   " + tail);
  line.erase(line.find_last_not_of(' ') + 1);
  os << line << "\n";
}

void print_plan(std::ostream& os, const MemoryPlan& p, const PlanOptions& opt, const std::string& gpu_source) {
  const bool generate = opt.job == PlanJob::Generate;
  os << "aerie plan" << (generate ? " (aerie generate)" : "") << ": " << p.model << "\n"
     << "  " << p.architecture << "\n"
     << "  quantized: " << p.quantization << "\n"
     << "  tp " << p.tp << (p.expert_parallel ? " (routed experts split by expert: --expert-parallel)" : "") << ", ";
  if (generate)
    os << opt.sequences << (opt.sequences == 1 ? " sequence" : " sequences") << " of up to " << opt.max_length
       << " tokens (--batch-size, --max-length), up to " << p.tokens_per_forward << " rows per step ("
       << (p.tokens_per_forward < std::max(kGenerateStepRows, opt.max_length)
               ? "every sequence's whole turn, --batch-size x --max-length"
               : "max(" + std::to_string(kGenerateStepRows) + ", --max-length)")
       << ")";
  else
    os << p.tokens_per_forward << " tokens per forward ("
       << (opt.batch_size > 0 ? "--batch-size " + std::to_string(opt.batch_size) + " x --max-length "
                              : "max(--batch-tokens " + std::to_string(opt.batch_tokens) + ", --max-length ")
       << opt.max_length << (opt.batch_size > 0 ? ")" : "))");
  os << ", GPU " << bytes_str(p.gpu_memory) << " = " << gb_str(p.gpu_memory) << " (" << gpu_source << ")\n\n";
  os << "per rank of tp " << p.tp << ":\n";
  row(os, "weights", "tensors", "checkpoint", "per rank");
  for (int c = 0; c < kWeightCategories; ++c) {
    const CategoryBytes& w = p.weights[c];
    if (w.tensors == 0) continue;
    std::string tail;
    if (static_cast<WeightCategory>(c) == WeightCategory::EmbedLmHead)
      tail = std::string(opt.vocab_parallel_embeddings ? "vocab-parallel" : "replicated") +
             " (--embed-split " + (opt.vocab_parallel_embeddings ? "replicated: " : "vocab: ") +
             (p.replicated_embedding_delta >= 0 ? "+" : "") + bytes_str(p.replicated_embedding_delta) + ")";
    row(os, "  " + std::string(category_name(static_cast<WeightCategory>(c))), std::to_string(w.tensors),
        bytes_str(w.checkpoint), bytes_str(w.per_rank), tail);
  }
  row(os, "  total", std::to_string(p.weight_tensors), bytes_str(p.weights_checkpoint), bytes_str(p.weights_per_rank),
      gb_str(p.weights_per_rank));
  if (!p.skipped.empty()) {
    row(os, "skipped (not loaded)", "", "", "");
    for (const SkippedGroup& g : p.skipped) row(os, "  " + g.what, std::to_string(g.tensors), bytes_str(g.bytes), "-");
  }
  row(os, "dequant scratch (bf16)", "", "", bytes_str(p.scratch_per_rank),
      p.scratch_layer.empty() ? "none (no quantized weights, or only routed experts read as stored)" : p.scratch_layer);
  row(os, "activations (one forward)", "", "", bytes_str(p.activations_per_rank));
  for (const ActivationItem& a : p.activations) row(os, "  " + a.what, "", "", bytes_str(a.bytes), a.detail);
  if (generate) row(os, "KV caches (bf16)", "", "", bytes_str(p.kv_cache_per_rank), p.kv_cache_detail);
  row(os, "reserve (CUDA, NCCL, cuBLAS)", "", "", bytes_str(p.reserve), "--reserve");
  row(os, "total", "", "", bytes_str(p.total_per_rank), gb_str(p.total_per_rank));
  for (const std::string& n : p.notes) os << "note: " << n << "\n";
  for (const std::string& b : p.blockers) os << "does not run: " << b << "\n";
  os << "\n"
     << (p.fits ? "fits: " : !p.blockers.empty() ? "does NOT run (above); memory: " : "does NOT fit: ") << bytes_str(p.total_per_rank) << " per rank of "
     << bytes_str(p.gpu_memory) << ", margin " << bytes_str(p.margin) << " (" << gb_str(p.margin) << ")";
  // Which embedding layout the line counted (found by a new-user trial: aerie's own loader replicates them).
  if (opt.vocab_parallel_embeddings && p.replicated_embedding_delta > 0) {
    // The headline is the contract's arithmetic (deepseek-v3.md section 7, vLLM's layout); what aerie's own
    // extract needs today gets its own verdict line (a Kimi user's trial read the first as aerie's margin).
    const int64_t total = p.total_per_rank + p.replicated_embedding_delta, margin = p.gpu_memory - total;
    os << ", with embed_tokens / lm_head split by vocabulary (vLLM's layout)\n"
       << "aerie " << (generate ? "generate" : "extract") << " today (embed_tokens / lm_head replicated, --embed-split replicated): " << bytes_str(total)
       << " per rank, margin " << bytes_str(margin) << " (" << gb_str(margin) << "): "
       << (margin >= 0 ? "fits" : "does NOT fit");
  }
  os << "\n";
}

// What would fit when plan `p` does not (printed to stdout): the smallest larger tp (a power of two) that fits
// the same GPU (a target that does not run at this tp: the largest smaller one that runs and fits); then
// generate: the most sequences at once that fit at this tp, or at the smallest larger tp where some do (MLA's
// latent cache does not shrink with tp); extract: the longest --max-length that fits this tp (a halving
// search over the activations' share). `config`, `tensors`, `config_file` and `opt`: as plan_memory took them.
void print_suggestions(const MemoryPlan& p, const PlanOptions& opt, const nlohmann::json& config,
                       const std::vector<TensorInfo>& tensors, const std::string& config_file) {
  // Suggestions are for aerie's own runs: embed_tokens and lm_head replicated, whatever --embed-split says.
  const std::string layout = opt.vocab_parallel_embeddings ? " (embed_tokens / lm_head replicated, as aerie loads them)" : "";
  const auto fits = [&](PlanOptions o) -> std::optional<MemoryPlan> {
    o.vocab_parallel_embeddings = false;
    try {
      MemoryPlan q = plan_memory(config, tensors, o, config_file);
      if (q.fits) return q;
    } catch (const Error&) {  // a split the target refuses
    }
    return std::nullopt;
  };
  // The most sequences in [1, below) that fit at `tp` (memory grows with them: a bisection), or 0.
  const auto most_sequences = [&](int64_t tp, int64_t below) -> std::pair<int64_t, std::optional<MemoryPlan>> {
    PlanOptions o = opt;
    o.tp = static_cast<int>(tp);
    o.sequences = 1;
    std::optional<MemoryPlan> best = fits(o);
    if (!best) return {0, std::nullopt};
    int64_t lo = 1, hi = below - 1;
    while (lo < hi) {
      o.sequences = lo + (hi - lo + 1) / 2;
      if (std::optional<MemoryPlan> q = fits(o)) {
        lo = o.sequences;
        best = q;
      } else {
        hi = o.sequences - 1;
      }
    }
    return {lo, best};
  };
  bool suggested = false;
  for (int64_t tp = 2; tp <= 64 && !suggested; tp *= 2) {
    if (tp <= opt.tp) continue;
    PlanOptions o = opt;
    o.tp = static_cast<int>(tp);
    if (std::optional<MemoryPlan> q = fits(o)) {
      std::cout << "fits at --tp " << tp << layout << ": " << bytes_str(q->total_per_rank) << " per rank, margin "
                << bytes_str(q->margin) << "\n";
      suggested = true;
    }
  }
  if (!suggested && !p.blockers.empty()) {
    for (int64_t tp = 32; tp >= 1 && !suggested; tp /= 2) {
      if (tp >= opt.tp) continue;
      PlanOptions o = opt;
      o.tp = static_cast<int>(tp);
      if (std::optional<MemoryPlan> q = fits(o)) {
        std::cout << "runs and fits at --tp " << tp << layout << ": " << bytes_str(q->total_per_rank) << " per rank, margin "
                  << bytes_str(q->margin) << "\n";
        suggested = true;
      }
    }
  }
  const bool length_blocked = p.beyond_context;
  if (opt.job == PlanJob::Generate && opt.sequences > 1 && !length_blocked) {
    std::vector<int64_t> tps = {opt.tp};
    for (int64_t tp = 2; tp <= 64; tp *= 2)
      if (tp > opt.tp) tps.push_back(tp);
    for (const int64_t tp : tps) {
      const auto [b, q] = most_sequences(tp, opt.sequences);
      if (b > 0) {
        std::cout << "fits at " << (tp == opt.tp ? "tp " : "--tp ") << tp << " with --batch-size " << b << " (the most "
                  << "that fit)" << layout << ": " << bytes_str(q->total_per_rank) << " per rank, margin " << bytes_str(q->margin) << "\n";
        suggested = true;
        break;
      }
    }
  } else if (opt.job == PlanJob::Extract && p.blockers.empty() && opt.max_length > 1024 && opt.batch_size == 0) {
    for (int64_t len = opt.max_length / 2; len >= 1024; len /= 2) {
      PlanOptions o = opt;
      o.max_length = len;
      o.batch_tokens = std::min(o.batch_tokens, len);
      if (std::optional<MemoryPlan> q = fits(o)) {
        std::cout << "fits at tp " << opt.tp << " with --max-length " << len
                  << (o.batch_tokens != opt.batch_tokens ? " --batch-tokens " + std::to_string(o.batch_tokens) : "")
                  << layout << ": " << bytes_str(q->total_per_rank) << " per rank, margin " << bytes_str(q->margin) << "\n";
        suggested = true;
        break;
      }
    }
  }
  if (!suggested)
    std::cout << (p.reserve >= p.gpu_memory
                      ? "nothing fits: --reserve " + bytes_str(p.reserve) + " (CUDA, NCCL and cuBLAS's own memory) alone is "
                            "the GPU's " + bytes_str(p.gpu_memory) + " or more"
                  : length_blocked ? "no suggestion: --max-length must stay within max_position_embeddings"
                  : !p.blockers.empty()
                      ? "no tp from 1 to 64 runs this target within " + bytes_str(p.gpu_memory)
                      : "nothing up to tp 64 (or " +
                            std::string(opt.job == PlanJob::Generate ? "--batch-size 1" : "--max-length 1024") +
                            " at tp " + std::to_string(opt.tp) + ") fits " + bytes_str(p.gpu_memory))
              << "\n";
}

}  // namespace

int plan(const std::vector<std::string>& args) {
  po::options_description desc = job_options(
      "aerie plan: GPU memory per tp rank from config.json and safetensors headers; with --calibration also the "
      "hours and disk of generate, extract and train for a dataset");
  desc.add_options()("job", po::value<std::string>()->default_value("extract"),
                     "the job planned: extract (one forward and the aux captures), or generate (--batch-size "
                     "KV caches of --max-length tokens, the decoding steps' rows and logits)")(
      "model", po::value<std::string>()->default_value(""),
                     "target model directory (config.json, model.safetensors or model.safetensors.index.json; "
                     "only the headers are read)")(
      "model-config", po::value<std::string>()->default_value(""), "config.json to use instead of --model's")(
      "tensors", po::value<std::string>()->default_value(""),
      "a tensor list instead of --model's headers: one {\"name\", \"shape\", \"dtype\"} per line (.jsonl or .jsonl.gz)")(
      "tp", po::value<int>()->default_value(0), "tensor-parallel ranks (0: the --calibration's, else the world size)")(
      "max-length", po::value<int64_t>()->default_value(8192),
      "tokens of the longest sample (default 8192, or the model's max_position_embeddings when smaller)")(
      "batch-tokens", po::value<int64_t>()->default_value(2048),
      "as extract --batch-tokens: a forward holds max(batch-tokens, max-length) tokens")(
      "batch-size", po::value<int64_t>()->default_value(0),
      "extract: > 0: batch-size x max-length tokens per forward instead; generate: sequences decoded at once "
      "(generate --batch-size; 0: its default, 16)")(
      "gpu-memory", po::value<std::string>()->default_value(""),
      "memory per GPU, e.g. 96GB, 80GiB (default: this GPU's, else 80GiB)")(
      "reserve", po::value<std::string>()->default_value("2GiB"), "CUDA context, NCCL and cuBLAS workspaces per GPU")(
      "embed-split", po::value<std::string>()->default_value("replicated"),
      "embed_tokens and lm_head: replicated (whole on every rank, as aerie's jobs load them) or vocab (rows "
      "split over tp, as vLLM/SGLang and deepseek-v3.md section 7's arithmetic)")(
      "expert-parallel", po::bool_switch(),
      "routed experts split over tp by expert, as extract/eval/generate --expert-parallel (the MoE "
      "activations counted for the worst case: every pair on one rank's experts)")(
      "fp8-gemm", po::bool_switch(),
      "as extract/eval/generate/streaming train --fp8-gemm: the Linears' weights held as block FP8 (a BF16 target's quantized "
      "at load: half their bytes), no dequantization buffer for FP8 Linears outside the routed experts");
  add_time_plan_options(desc);
  po::variables_map vm;
  if (!parse_options("plan", args, desc, vm)) return 0;
  const std::string model = vm["model"].as<std::string>(), config_path = vm["model-config"].as<std::string>(),
                    tensors_path = vm["tensors"].as<std::string>(), embed = vm["embed-split"].as<std::string>();
  AERIE_USAGE_CHECK(!model.empty() || (!config_path.empty() && !tensors_path.empty()),
                    "aerie plan: give --model DIR, or --model-config FILE and --tensors FILE");
  AERIE_USAGE_CHECK(embed == "vocab" || embed == "replicated",
                    "aerie plan: --embed-split '" << embed << "' is not vocab or replicated");
  const std::string job = vm["job"].as<std::string>();
  AERIE_USAGE_CHECK(job == "extract" || job == "generate",
                    "aerie plan: --job '" << job << "' is not extract or generate (train and eval are not planned yet)");
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PlanOptions opt;
  AERIE_USAGE_CHECK(vm["tp"].as<int>() >= 0, "aerie plan: --tp " << vm["tp"].as<int>() << " is negative");
  // No --tp: the calibration's (its forward was measured there), else the world size.
  const std::optional<Calibration> calibration = read_calibration_option(vm);
  const int cal_tp = vm["tp"].as<int>() == 0 && calibration ? calibration->tp : 0;
  opt.tp = vm["tp"].as<int>() > 0 ? vm["tp"].as<int>() : cal_tp > 0 ? cal_tp : world;
  opt.max_length = vm["max-length"].as<int64_t>();
  opt.batch_tokens = vm["batch-tokens"].as<int64_t>();
  opt.batch_size = vm["batch-size"].as<int64_t>();
  AERIE_USAGE_CHECK(opt.max_length >= 1, "aerie plan: --max-length " << opt.max_length << " must be >= 1");
  AERIE_USAGE_CHECK(opt.batch_tokens >= 0, "aerie plan: --batch-tokens " << opt.batch_tokens << " is negative");
  AERIE_USAGE_CHECK(opt.batch_size >= 0, "aerie plan: --batch-size " << opt.batch_size << " is negative");
  AERIE_USAGE_CHECK(opt.max_length <= kMaxPlanLength && opt.batch_tokens <= kMaxPlanLength && opt.batch_size <= kMaxPlanBatch,
                    "aerie plan: --max-length and --batch-tokens up to " << kMaxPlanLength << ", --batch-size up to "
                                                                         << kMaxPlanBatch << " (beyond any model)");
  if (job == "generate") {
    // generate's --batch-size is its sequences at once; its steps are BatchDecoder's, not --batch-tokens
    opt.job = PlanJob::Generate;
    opt.sequences = opt.batch_size > 0 ? opt.batch_size : 16;
    opt.batch_size = 0;
    AERIE_USAGE_CHECK(vm["batch-tokens"].defaulted(),
                      "aerie plan: --batch-tokens is extract's; generate's steps hold up to max(" << kGenerateStepRows
                                                                                          << ", --max-length) rows");
  }
  opt.vocab_parallel_embeddings = embed == "vocab";
  opt.expert_parallel = vm["expert-parallel"].as<bool>();
  opt.fp8_gemm = vm["fp8-gemm"].as<bool>();
  auto size_option = [&](const char* name) {
    const std::string v = vm[name].as<std::string>();
    // "--gpu-memory 96" is more likely 96 GB than 96 bytes: a unit is required.
    AERIE_USAGE_CHECK(std::any_of(v.begin(), v.end(), [](unsigned char c) { return std::isalpha(c); }),
                      "aerie plan: --" << name << " '" << v << "' needs a unit (e.g. 96GB, 80GiB)");
    try {
      return parse_memory_size(v);
    } catch (const Error& e) {
      throw UsageError(std::string("aerie plan: --") + name + ": " + e.what());
    }
  };
  std::string gpu_source = "--gpu-memory";
  if (!vm["gpu-memory"].as<std::string>().empty()) {
    opt.gpu_memory = size_option("gpu-memory");
    // 0 or 96TB is a typo: GPUs of 2026 hold 16 GB to 288 GB (B300); a bound of 4 TiB leaves room.
    AERIE_USAGE_CHECK(opt.gpu_memory >= (int64_t{1} << 30) && opt.gpu_memory <= (int64_t{4} << 40),
                      "aerie plan: --gpu-memory " << vm["gpu-memory"].as<std::string>()
                                                  << " is not one GPU's memory (1 GiB to 4 TiB; e.g. 96GB, 141GB, 80GiB)");
  } else if (const int64_t total = gpu_total_memory(); total > 0) {
    opt.gpu_memory = total;
    gpu_source = "this GPU";
  } else {
    gpu_source = "default: no GPU here";
  }
  opt.reserve = size_option("reserve");

  // A model folder gets the checks every job's --model gets (a missing folder, a symlink loop, a run,
  // checkpoint or shard folder, a draft export, a model_type aerie does not run), each named with the option.
  if (config_path.empty()) load_model_option("plan", "model", model);
  const std::string config_file = config_path.empty() ? model + "/config.json" : config_path;
  const nlohmann::json config = read_model_config(config_file);
  const std::string draft = eagle_draft_marker(config);
  AERIE_CHECK(draft.empty(), "plan: " << config_file << ": an EAGLE draft's config (" << draft
                                      << "), not a target model's: plan the target the draft is trained for");
  const std::vector<TensorInfo> tensors = tensors_path.empty() ? read_checkpoint_tensors(model)
                                                               : read_tensor_list(tensors_path);
  // The default --max-length stays within the model's context (a small model's 512 would block the plan).
  const auto mpe = config.find("max_position_embeddings");
  const int64_t context = mpe != config.end() && mpe->is_number_integer() ? mpe->get<int64_t>() : 0;
  if (vm["max-length"].defaulted() && context > 0) opt.max_length = std::min(opt.max_length, context);
  // The time plan's inputs are checked before anything is printed (a bad calibration ends the job at once).
  const TimePlan time_plan = calibration ? read_time_plan(vm, *calibration, target_config_from_json(config, config_file),
                                                          opt.tp, world, opt.batch_tokens)
                                         : TimePlan{};
  MemoryPlan p = plan_memory(config, tensors, opt, config_file);
  if (cal_tp > 0) p.notes.push_back("tp " + std::to_string(opt.tp) + ": the calibration's (no --tp given)");
  if (opt.job == PlanJob::Generate && vm["max-length"].defaulted())
    p.notes.push_back("--max-length " + std::to_string(opt.max_length) + " is the plan's default (8192, or the model's "
                      "max_position_embeddings when smaller); aerie generate's own is "
                      "the model's max_position_embeddings, and each sequence's KV cache holds its prompt + --max-new "
                      "tokens (at most --max-length): plan with the --max-length given to generate, or the longest "
                      "prompt + --max-new");
  if (rank == 0) {
    print_plan(std::cout, p, opt, gpu_source);
    if (!p.fits) print_suggestions(p, opt, config, tensors, config_file);
    std::cout.flush();
  }
  if (rank == 0 && time_plan.wanted) {
    // A time for a layout that does not run would read as a plan (a new user's trial took it for one).
    if (p.fits)
      print_time_plan(time_plan);
    else
      std::printf("\ntime and disk: not planned, as this layout does not %s (above): plan one that does, with the "
                  "same --calibration\n", p.blockers.empty() ? "fit" : "run");
    std::fflush(stdout);
  }
  return p.fits ? 0 : 1;  // a script can branch on it (the plan is printed either way)
}

}  // namespace aerie::jobs
