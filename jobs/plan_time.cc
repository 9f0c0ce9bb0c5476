// aerie plan --calibration: the hours and bytes of extract and train for a dataset, from what aerie calibrate
// measured on the node (train/time_plan.h). Printed after the memory plan.
#include "jobs/plan_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/extract.h"
#include "train/time_plan.h"

namespace aerie::jobs {

namespace {

std::string hours(double s) {
  char buf[64];
  if (s < 10)  // a check run's jobs: two decimals to compare with the jobs' own times
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s < 600)
    std::snprintf(buf, sizeof buf, "%.1f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else if (s < 7 * 86400)
    std::snprintf(buf, sizeof buf, "%.2f h", s / 3600);
  else if (s < 730 * 86400)
    std::snprintf(buf, sizeof buf, "%.1f days", s / 86400);
  else
    std::snprintf(buf, sizeof buf, "%.1f years", s / (365.25 * 86400));
  return buf;
}

// A note for each length the plan reads past the calibration's largest point (along the last segment's power law,
// which a small calibration's launch-bound points can make far too flat): the longest sample against the draft
// step's and the forward's curve, extract's packed forwards against the forward's fit, and generate's prompt + new
// tokens. A suggestion to calibrate further stops at the target's max_position_embeddings (`max_position`, 0: none),
// which calibrate's --tokens cannot pass.
void print_extrapolation_notes(const Calibration& c, const Workload& w, int64_t max_position) {
  const double longest =
      w.lengths.empty() ? w.mean_tokens : static_cast<double>(*std::max_element(w.lengths.begin(), w.lengths.end()));
  auto note = [&](const char* what, double want, int64_t have, const char* option, const char* how) {
    if (want <= static_cast<double>(have)) return;
    const double reach = max_position > 0 ? std::min(want, static_cast<double>(max_position)) : want;
    std::printf("  (%s reach %.0f tokens, the calibration's %lld: read past it %s", what, want,
                static_cast<long long>(have), how);
    if (reach > static_cast<double>(have))
      std::printf("; calibrate with %s up to %.0f for a measured curve)\n", option, reach);
    else
      std::printf("; the target's max_position_embeddings %lld bounds calibrate's %s)\n",
                  static_cast<long long>(max_position), option);
  };
  const char* segment = "along its last segment";
  // Most samples shorter than the smallest point: read below it (a GPU's launch-bound short steps make that
  // reading the plan's least sure).
  auto below = [&](const char* what, const TimeCurve& curve, const char* option) {
    if (w.mean_tokens < 0.75 * static_cast<double>(curve.tokens.front()))
      std::printf("  (%s: %s tokens on average, the calibration's smallest %lld: read below it along its first "
                  "segment; calibrate with %s from %.0f for a measured curve)\n",
                  what, format_amount(w.mean_tokens).c_str(), static_cast<long long>(curve.tokens.front()), option,
                  std::floor(w.mean_tokens));
  };
  below("the samples", c.train_sample, "--train-tokens");
  note("the samples", longest, c.train_sample.tokens.back(), "--train-tokens", segment);
  note("the samples' forwards", longest, c.base.tokens.back(), "--tokens", segment);
  if (w.batch_tokens > 0)
    note("the packed forwards", static_cast<double>(w.batch_tokens), c.base.tokens.back(), "--tokens",
         "by the fit of its points (a fixed, a per-token and an attention term; the attention per sample)");
  if (w.gen_responses > 0) note("generate's prompts", w.gen_prompt_tokens, c.base.tokens.back(), "--tokens", segment);
  // generate's decoding is costed per new token from one run of the calibration's lengths: an answer or prompt much
  // longer or shorter than it reads the KV caches of other lengths (a new user's plan at 273 new tokens from a
  // calibration of 32 came out 44% short).
  const Calibration::Generation& g = c.generate;
  if (w.gen_responses > 0 && g.new_tokens > 0 && g.prompt_tokens > 0) {
    const double pr = w.gen_prompt_tokens / static_cast<double>(g.prompt_tokens),
                 nr = w.gen_new_tokens / static_cast<double>(g.new_tokens);
    if (pr > 2 || pr < 0.5 || nr > 2 || nr < 0.5)
      std::printf("  (generate: %s prompt + %s new tokens a response, the calibration decoded %lld + %lld: calibrate "
                  "with --gen-prompt-tokens %.0f --gen-new-tokens %.0f for a measured decode)\n",
                  format_amount(w.gen_prompt_tokens).c_str(), format_amount(w.gen_new_tokens).c_str(),
                  static_cast<long long>(g.prompt_tokens), static_cast<long long>(g.new_tokens),
                  std::ceil(w.gen_prompt_tokens), std::ceil(w.gen_new_tokens));
  }
}

// The streaming train's line: instead of extract + train (`alone`: the only job planned), no shards.
void print_stream_line(const JobTime& t, const Calibration& c, const Workload& w, double cost, const std::string& devices,
                       bool alone) {
  std::printf("  streamed%s (train --prepared --target-ranks %d: %d target replica(s), %d trainer rank(s)%s):\n"
              "  train    %10s  (target %s, draft %s, messages %s: %s-bound)  no shards; %s of hidden states queued "
              "per replica leader",
              alone ? "" : " instead", w.stream_target_ranks, w.stream_target_ranks / w.tp, w.world - w.stream_target_ranks,
              w.stream_colocated ? ", sharing devices" : "", hours(t.seconds).c_str(), hours(t.target_seconds).c_str(),
              hours(t.draft_seconds).c_str(), c.stream_bytes_per_s > 0 ? hours(t.message_seconds).c_str() : "not measured",
              t.bound.c_str(), format_bytes(static_cast<double>(t.queue_bytes)).c_str());
  if (cost > 0) std::printf("  cost %.2f (%d %s at --gpu-hour-cost %g)", t.seconds / 3600 * w.devices() * cost,
                            w.devices(), devices.c_str(), cost);
  std::printf("\n");
}

/// f(), an aerie::Error it throws reworded as a UsageError naming `option`: a file the user gave that cannot be
/// read is the user's input, as a bad option is (exit status 2; 1 stays "does not fit").
template <typename F>
auto as_usage(const char* option, F&& f) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(std::string("aerie plan: ") + option + " " + e.what());
  }
}

}  // namespace

std::string calibration_target(const TargetConfig& t) {
  std::ostringstream s;
  s << "vocab " << t.vocab_size << ", intermediate " << t.intermediate_size << ", heads " << t.num_attention_heads
    << " / kv " << t.num_key_value_heads << " x " << t.head_dim;
  if (t.mla.enabled()) s << ", mla " << t.mla.q_lora_rank << " / " << t.mla.kv_lora_rank;
  if (t.moe.n_routed_experts > 0)
    s << ", experts " << t.moe.n_routed_experts << " top " << t.moe.num_experts_per_tok << " x "
      << t.moe.moe_intermediate_size << " (+" << t.moe.n_shared_experts << " shared)";
  s << ", " << describe(t.quant.method);
  return s.str();
}

void add_time_plan_options(po::options_description& desc) {
  desc.add_options()("calibration", po::value<std::string>()->default_value(""),
                     "calibration.json of aerie calibrate on this node: also print the time and disk of extract and "
                     "train (and generate with --generate-responses, the streamed train with --stream-target-ranks) "
                     "for --samples samples of --mean-tokens tokens, or the samples of --prepared")(
      "samples", po::value<int64_t>()->default_value(0), "with --calibration: the dataset's samples")(
      "prepared", po::value<std::string>()->default_value(""),
      "with --calibration: the dataset as aerie prepare wrote it (each sample costed at its length; instead of "
      "--samples and --mean-tokens)")(
      "mean-tokens", po::value<double>()->default_value(0), "with --calibration: tokens per sample (prompt + answer)")(
      "epochs", po::value<int>()->default_value(1), "with --calibration: train's passes over the samples")(
      "train-steps", po::value<int64_t>()->default_value(0),
      "with --calibration: train --steps (0: --epochs), each of --train-batch-size samples")(
      "train-batch-size", po::value<int64_t>()->default_value(8), "with --calibration: train --batch-size")(
      "world", po::value<int>()->default_value(0),
      "with --calibration: the job's ranks (0: the world size, or a --model-tp calibration's tp where that is "
      "larger); dp = world / tp")(
      "storage", po::value<std::string>()->default_value("bf16"), "with --calibration: extract --storage (bf16, fp8)")(
      "samples-per-shard", po::value<int64_t>()->default_value(64),
      "with --calibration: extract --samples-per-shard (the chunk a tp group takes at a time: few chunks split "
      "unevenly over the groups)")(
      "gpu-hour-cost", po::value<double>()->default_value(0), "with --calibration: price of one GPU-hour (0: none)")(
      "generate-responses", po::value<int64_t>()->default_value(0),
      "with --calibration: also plan generate (regenerating the answers): this many responses (0: none)")(
      "generate-prompt-tokens", po::value<double>()->default_value(0),
      "with --generate-responses: the mean prompt tokens of a response (the conversation so far)")(
      "generate-new-tokens", po::value<double>()->default_value(0),
      "with --generate-responses: the mean new tokens of a response (at most generate --max-new-tokens)")(
      "stream-target-ranks", po::value<int>()->default_value(0),
      "with --calibration: also plan the streaming train (train --prepared --target-ranks N): N of the ranks run "
      "the target, the rest train")(
      "stream-colocated", po::bool_switch(),
      "with --stream-target-ranks: the target's and the trainers' ranks share devices (one GPU for both), so "
      "their compute adds up");
}

namespace {

// --calibration's file, checked as the user's input (exit status 2 on any fault).
Calibration read_calibration_file(const std::string& path) {
  AERIE_USAGE_CHECK(!std::filesystem::is_directory(path),
                    "aerie plan: --calibration " << path << " is a folder, not the calibration.json of aerie calibrate");
  std::ifstream f(path);
  AERIE_USAGE_CHECK(f.good(), "aerie plan: --calibration " << path << " cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {  // nlohmann's parse errors, and a read that fails midway
    throw UsageError("aerie plan: --calibration " + path + ": " + e.what());
  }
  return as_usage("--calibration", [&] { return calibration_from_json(j, path); });
}

// The dataset: --prepared's samples and lengths, or --samples x --mean-tokens.
void read_dataset(const po::variables_map& vm, const TargetConfig& target, Workload& w) {
  if (const std::string prepared = vm["prepared"].as<std::string>(); !prepared.empty()) {
    AERIE_USAGE_CHECK(!std::filesystem::is_directory(prepared),
                      "aerie plan: --prepared " << prepared << " is a folder, not the prepared .h5 file of aerie prepare");
    AERIE_USAGE_CHECK(vm["samples"].defaulted() && vm["mean-tokens"].defaulted(),
                      "aerie plan: --prepared gives the samples and their lengths: drop --samples / --mean-tokens");
    const PreparedFile p = as_usage("--prepared", [&] { return PreparedFile(prepared); });
    const std::vector<int64_t>& off = p.sample_offsets();
    for (size_t i = 0; i + 1 < off.size(); ++i) w.lengths.push_back(off[i + 1] - off[i]);
    AERIE_USAGE_CHECK(!w.lengths.empty(), "aerie plan: --prepared " << prepared << " holds no samples");
    w.samples = static_cast<int64_t>(w.lengths.size());
    w.mean_tokens = static_cast<double>(off.back() - off.front()) / static_cast<double>(w.samples);
  } else {
    w.samples = vm["samples"].as<int64_t>();
    w.mean_tokens = vm["mean-tokens"].as<double>();
    AERIE_USAGE_CHECK(!vm["samples"].defaulted() && !vm["mean-tokens"].defaulted(),
                      "aerie plan: --calibration needs the dataset: --prepared FILE, or --samples and --mean-tokens");
    AERIE_USAGE_CHECK(w.samples >= 1 && w.samples <= 1000000000000,
                      "aerie plan: --samples " << w.samples << " is not 1 to 10^12");
    AERIE_USAGE_CHECK(w.mean_tokens >= 1 && w.mean_tokens <= 1e7,
                      "aerie plan: --mean-tokens " << w.mean_tokens << " is not 1 to 10^7");
  }
  AERIE_USAGE_CHECK(target.max_position_embeddings <= 0 || w.mean_tokens <= static_cast<double>(target.max_position_embeddings),
                    "aerie plan: --mean-tokens " << w.mean_tokens << " is past the model's max_position_embeddings "
                                                 << target.max_position_embeddings << " (a sample's tokens)");
}

// train (--epochs or --train-steps x --train-batch-size), generate (--generate-*) and the streamed train (--stream-*).
void read_jobs(const po::variables_map& vm, const TargetConfig& target, const Calibration& c, const std::string& path,
               Workload& w) {
  w.epochs = vm["epochs"].as<int>();
  const int64_t steps = vm["train-steps"].as<int64_t>(), batch = vm["train-batch-size"].as<int64_t>();
  AERIE_USAGE_CHECK(w.epochs >= 1, "aerie plan: --epochs " << w.epochs << " must be >= 1");
  AERIE_USAGE_CHECK(steps == 0 || vm["epochs"].defaulted(),
                    "aerie plan: --epochs and --train-steps both say how much train draws: give one");
  AERIE_USAGE_CHECK(steps >= 0 && steps <= 1000000000, "aerie plan: --train-steps " << steps << " is not 0 to 10^9");
  AERIE_USAGE_CHECK(batch >= 1 && batch <= 1000000, "aerie plan: --train-batch-size " << batch << " is not 1 to 10^6");
  w.train_samples = steps * batch;
  w.train_batch_size = batch;
  w.samples_per_shard = vm["samples-per-shard"].as<int64_t>();
  AERIE_USAGE_CHECK(w.samples_per_shard >= 1, "aerie plan: --samples-per-shard " << w.samples_per_shard << " must be >= 1");
  w.stream_target_ranks = vm["stream-target-ranks"].as<int>();
  w.stream_colocated = vm["stream-colocated"].as<bool>();
  AERIE_USAGE_CHECK(w.stream_target_ranks >= 0, "aerie plan: --stream-target-ranks " << w.stream_target_ranks << " is negative");
  AERIE_USAGE_CHECK(!w.stream_colocated || w.stream_target_ranks > 0,
                    "aerie plan: --stream-colocated describes the streaming train: give --stream-target-ranks too");
  w.gen_responses = vm["generate-responses"].as<int64_t>();
  w.gen_prompt_tokens = vm["generate-prompt-tokens"].as<double>();
  w.gen_new_tokens = vm["generate-new-tokens"].as<double>();
  AERIE_USAGE_CHECK(w.gen_responses >= 0 && w.gen_responses <= 1000000000000,
                    "aerie plan: --generate-responses " << w.gen_responses << " is not 0 to 10^12");
  AERIE_USAGE_CHECK(w.gen_responses > 0 || (vm["generate-prompt-tokens"].defaulted() && vm["generate-new-tokens"].defaulted()),
                    "aerie plan: --generate-prompt-tokens / --generate-new-tokens describe generate: give --generate-responses too");
  if (w.gen_responses == 0) return;
  AERIE_USAGE_CHECK(w.gen_prompt_tokens >= 1 && w.gen_prompt_tokens <= 1e7,
                    "aerie plan: --generate-responses needs --generate-prompt-tokens, 1 to 10^7 (got " << w.gen_prompt_tokens << ")");
  AERIE_USAGE_CHECK(w.gen_new_tokens >= 1 && w.gen_new_tokens <= 1e7,
                    "aerie plan: --generate-responses needs --generate-new-tokens, 1 to 10^7 (got " << w.gen_new_tokens << ")");
  AERIE_USAGE_CHECK(target.max_position_embeddings <= 0 ||
                        w.gen_prompt_tokens + w.gen_new_tokens <= static_cast<double>(target.max_position_embeddings),
                    "aerie plan: --generate-prompt-tokens + --generate-new-tokens is "
                        << w.gen_prompt_tokens + w.gen_new_tokens << " tokens, past the model's max_position_embeddings "
                        << target.max_position_embeddings);
  AERIE_USAGE_CHECK(c.generate.seconds > 0,
                    "aerie plan: --calibration " << path << " holds no generate measurement (an older aerie's): calibrate again");
}

}  // namespace

std::optional<Calibration> read_calibration_option(const po::variables_map& vm) {
  const std::string path = vm["calibration"].as<std::string>();
  AERIE_USAGE_CHECK(!path.empty() || vm["calibration"].defaulted(),
                    "aerie plan: --calibration is empty (give the calibration.json of aerie calibrate)");
  if (path.empty()) {
    // The time plan's own options mean nothing without a calibration: refused, not ignored.
    for (const char* o : {"samples", "prepared", "mean-tokens", "epochs", "train-steps", "train-batch-size", "world",
                          "storage", "samples-per-shard", "gpu-hour-cost", "generate-responses", "generate-prompt-tokens",
                          "generate-new-tokens", "stream-target-ranks", "stream-colocated"})
      AERIE_USAGE_CHECK(!vm.count(o) || vm[o].defaulted(),
                        "aerie plan: --" << o << " describes the time and disk plan, which needs --calibration FILE "
                                         << "(the calibration.json of aerie calibrate on the node: docs/time-plan.md)");
    return std::nullopt;
  }
  return read_calibration_file(path);
}

TimePlan read_time_plan(const po::variables_map& vm, const Calibration& calibration, const TargetConfig& target, int tp,
                        int world, int64_t batch_tokens) {
  TimePlan plan;
  plan.path = vm["calibration"].as<std::string>();
  plan.wanted = true;
  const Calibration& c = plan.calibration = calibration;
  const std::string& path = plan.path;
  // The calibration must be of this target: its hidden size and its layers of each kind (the shards' bytes and the
  // forward's), at this tp.
  int64_t moe = 0, cal_dense = 0, cal_moe = 0;
  for (int64_t l = 0; l < target.num_hidden_layers; ++l) moe += target.moe.is_moe_layer(l) ? 1 : 0;
  for (const LayerKindTimes& l : c.layers) (l.kind == "moe" ? cal_moe : cal_dense) += l.count;
  AERIE_USAGE_CHECK(c.hidden_size == target.hidden_size && cal_moe == moe && cal_dense == target.num_hidden_layers - moe,
                    "aerie plan: --calibration " << path << " measured " << c.model << " (hidden " << c.hidden_size << ", "
                                                 << cal_dense << " dense and " << cal_moe
                                                 << " MoE layers), not this target (hidden " << target.hidden_size << ", "
                                                 << target.num_hidden_layers - moe << " dense and " << moe << " MoE layers)");
  AERIE_USAGE_CHECK(c.target.empty() || c.target == calibration_target(target),
                    "aerie plan: --calibration " << path << " measured a target of " << c.target
                                                 << "; this one is of " << calibration_target(target)
                                                 << ": calibrate this model");
  AERIE_USAGE_CHECK(c.draft_vocab_size <= target.vocab_size,
                    "aerie plan: --calibration " << path << " measured the draft's step at a draft vocabulary of "
                                                 << c.draft_vocab_size << ", past this target's vocabulary of "
                                                 << target.vocab_size << ": a calibration of another model");
  AERIE_USAGE_CHECK(c.tp == tp, "aerie plan: --calibration " << path << (c.tp_modeled ? " modeled" : " measured")
                                                             << " the forward at tp " << c.tp << ", the plan is for tp "
                                                             << tp << ": plan with --tp " << c.tp << ", or calibrate with "
                                                             << (c.tp_modeled ? "--model-tp " : "--tp ") << tp);
  const bool ep = vm.count("expert-parallel") > 0 && vm["expert-parallel"].as<bool>();
  if (target.moe.n_routed_experts > 0 && tp > 1 && c.expert_parallel >= 0 && (c.expert_parallel == 1) != ep)
    plan.layout_note = std::string("the calibration's forward ran ") + (ep ? "without" : "with") +
                       " --expert-parallel, this plan is for a run " + (ep ? "with" : "without") +
                       " it: its MoE layers' times are the other split's; calibrate as the jobs will run";
  Workload& w = plan.workload;
  read_dataset(vm, target, w);
  read_jobs(vm, target, c, path, w);
  // plan --job generate --batch-size B: the batch generate will decode (with --job extract, --batch-size is the forward's).
  const bool generate_job = vm.count("job") && vm["job"].as<std::string>() == "generate";
  if (const int64_t b = generate_job && vm.count("batch-size") ? vm["batch-size"].as<int64_t>() : 0;
      w.gen_responses > 0 && b > 0 && b != c.generate.batch)
    plan.generate_note = "generate is costed at the calibration's decoding of " + std::to_string(c.generate.batch) +
                         " sequences at once, not --batch-size " + std::to_string(b) +
                         "'s: calibrate --gen-batch-size " + std::to_string(b) + " for its own";
  AERIE_USAGE_CHECK(vm["world"].as<int>() >= 0, "aerie plan: --world " << vm["world"].as<int>() << " is negative");
  // No --world: the ranks plan runs on, and at least the calibration's tp group (a calibration of one rank of a
  // modeled group, --model-tp, is made on fewer GPUs than the node it models; a tp-2 calibration read by a plan run
  // without mpirun).
  w.world = vm["world"].as<int>() > 0 ? vm["world"].as<int>() : std::max(world, c.tp);
  // A streamed train's trainers need not fill a tp group (train -np 3 --target-ranks 2 --tp 2): only it is planned.
  AERIE_USAGE_CHECK(w.world % tp == 0 || w.stream_target_ranks > 0,
                    "aerie plan: " << w.world << " ranks do not split into tp groups of " << tp
                                   << " (--world N plans N ranks without running on them; with --stream-target-ranks "
                                      "only the target's ranks must split so)");
  // The shards' bytes are counted in int64 (data/extract.h shard_bytes).
  const double shard_estimate = static_cast<double>(w.samples) * w.mean_tokens *
                                static_cast<double>(shard_bytes_per_token(c.hidden_size, false));
  AERIE_USAGE_CHECK(shard_estimate < 4e18, "aerie plan: " << w.samples << " samples of " << w.mean_tokens
                                                          << " tokens make shards of about " << shard_estimate
                                                          << " bytes: past what a plan counts (4 x 10^18)");
  plan.gpu_hour_cost = vm["gpu-hour-cost"].as<double>();
  AERIE_USAGE_CHECK(plan.gpu_hour_cost >= 0 && std::isfinite(plan.gpu_hour_cost),
                    "aerie plan: --gpu-hour-cost " << plan.gpu_hour_cost << " is not a price");
  w.tp = tp;
  // The CPU backend runs one sample per forward, unless --tp-overlap (its micro-batches are a forward's samples).
  w.batch_tokens = c.device == "cpu" && !(c.tp_overlap && c.tp > 1) ? 0 : batch_tokens;
  plan.storage = vm["storage"].as<std::string>();
  AERIE_USAGE_CHECK(plan.storage == "bf16" || plan.storage == "fp8",
                    "aerie plan: --storage '" << plan.storage << "' is not bf16 or fp8");
  w.fp8_storage = plan.storage == "fp8";
  AERIE_USAGE_CHECK(w.stream_target_ranks % tp == 0 && w.stream_target_ranks < w.world,
                    "aerie plan: --stream-target-ranks " << w.stream_target_ranks << " must be a multiple of tp " << tp
                                                         << " and leave trainer ranks among the " << w.world
                                                         << " (--world; e.g. --world " << w.stream_target_ranks + tp
                                                         << " for one trainer group beside the target's ranks)");
  plan.jobs = as_usage(("--calibration " + path + ":").c_str(), [&] { return plan_time(c, w); });
  plan.max_position = target.max_position_embeddings;
  // A --tp-overlap calibration timed every forward split in two; the jobs split only forwards of several samples.
  if (c.tp_overlap && c.tp > 1 && w.batch_tokens > 0 && !w.lengths.empty()) {
    const std::string warning = tp_overlap_packing_warning("extract", vm["prepared"].as<std::string>(), w.offsets(),
                                                           w.samples_per_shard, w.batch_tokens);
    if (!warning.empty())
      plan.packing_note = warning + "; the plan costs every forward as the calibration's overlapped ones, so the "
                                    "forwards of one sample come out short";
  }
  return plan;
}

void print_time_plan(const TimePlan& plan) {
  if (!plan.wanted) return;
  const Calibration& c = plan.calibration;
  const Workload& w = plan.workload;
  const double cost = plan.gpu_hour_cost;
  const int dev = w.devices();             // the ranks of generate, extract and the offline train (time_plan.h)
  const bool offline = dev % w.tp == 0;  // else the streamed train alone (plan_time)
  const std::string layout =
      (offline ? std::string(w.gen_responses > 0 ? "generate and " : "") + "extract in " + std::to_string(dev / w.tp) +
                     " tp group(s), train data parallel over all " + std::to_string(dev)
               : "not tp groups of " + std::to_string(w.tp) + ": the streamed train alone") +
      (dev != w.world ? "; " + std::to_string(dev) + " devices, the streamed train's ranks two a device" : "");
  const std::string measured_batch = c.train_batch > 0 ? ", measured in steps of " + std::to_string(c.train_batch) : "";
  std::printf("\ntime and disk (calibration %s: %s, tp %d%s; the draft's step at vocabulary %lld, %d TTT steps%s): "
              "%lld samples x %s tokens, %d rank(s) (%s)%s\n",
              plan.path.c_str(), c.device.c_str(), c.tp, c.tp_overlap ? " with --tp-overlap" : "",
              static_cast<long long>(c.draft_vocab_size), c.ttt_steps, measured_batch.c_str(),
              static_cast<long long>(w.samples), format_amount(w.mean_tokens).c_str(), w.world, layout.c_str(),
              w.train_samples > 0 ? (", train " + std::to_string(w.train_samples) + " samples drawn").c_str()
              : w.epochs > 1     ? (", " + std::to_string(w.epochs) + " epochs").c_str()
                                 : "");
  if (c.tp_modeled)
    std::printf("  (the calibration ran one rank of each tp group of %d on %s and modeled the group's all-reduces at "
                "%.1f GB/s bus bandwidth and %.1f us each (calibrate --model-tp): the other ranks' compute is taken to "
                "be this one's, and their links the given ones; calibrate on the node itself to measure both)\n",
                c.tp, c.device.c_str(), c.allreduce_bus_bytes_per_s / 1e9, c.allreduce_latency_s * 1e6);
  if (c.world != w.world && !c.tp_modeled)  // a modeled group's note above says what one rank leaves out
    std::printf("  (the calibration ran %d rank(s) at once, the plan has %d: where ranks share a node's cores, memory "
                "bandwidth or links, calibrate with the job's own rank count)\n",
                c.world, w.world);
  if (c.train_batch > 0 && w.train_batch_size != c.train_batch)
    std::printf("  (the draft's step measured in steps of %lld, this plan's train in steps of %lld: calibrate "
                "--train-batch-size %lld for its own)\n",
                static_cast<long long>(c.train_batch), static_cast<long long>(w.train_batch_size),
                static_cast<long long>(std::max<int64_t>(2, w.train_batch_size)));
  if (c.cpu_cores == 1 && c.device != "cpu")
    std::printf("  (the calibration's ranks ran on 1 CPU core each: bound so, extract's writer and train's shard reader "
                "take turns with the thread that launches the GPU's kernels, a cost the calibration does not see; run "
                "the jobs, and calibrate, with several cores per rank: mpirun --bind-to none, Slurm --cpus-per-task)\n");
  print_extrapolation_notes(c, w, plan.max_position);
  if (!plan.packing_note.empty()) std::printf("  (%s)\n", plan.packing_note.c_str());
  if (!plan.layout_note.empty()) std::printf("  (%s)\n", plan.layout_note.c_str());
  if (!plan.generate_note.empty()) std::printf("  (%s)\n", plan.generate_note.c_str());
  const int trainers = w.world - w.stream_target_ranks;
  if (offline && w.train_batch_size < dev)
    std::printf("  (--train-batch-size %lld is below the %d ranks that train: %d of them get no sample each step and "
                "idle, as train warns; the plan costs the step of the busiest)\n",
                static_cast<long long>(w.train_batch_size), dev, dev - static_cast<int>(w.train_batch_size));
  else if (w.stream_target_ranks > 0 && w.train_batch_size < trainers)
    std::printf("  (--train-batch-size %lld is below the streamed train's %d trainer ranks: some idle each step)\n",
                static_cast<long long>(w.train_batch_size), trainers);
  const std::string devices = c.device == "cpu" ? "ranks" : "GPUs";
  auto price = [&](double seconds) {
    if (cost > 0)
      std::printf("  cost %.2f (%d %s at --gpu-hour-cost %g)", seconds / 3600 * dev * cost, dev, devices.c_str(), cost);
  };
  double total = 0;
  for (const JobTime& t : plan.jobs) {
    if (t.job == "train --prepared") continue;  // after the total
    total += t.seconds;
    std::printf("  %-8s %10s  (compute %s, disk %s: %s-bound)", t.job.c_str(), hours(t.seconds).c_str(),
                hours(t.compute_seconds).c_str(), hours(t.disk_seconds).c_str(), t.bound.c_str());
    if (t.bytes > 0) std::printf("  shards %s (%s)", format_bytes(static_cast<double>(t.bytes)).c_str(), plan.storage.c_str());
    price(t.seconds);
    std::printf("\n");
  }
  if (offline) {
    std::printf("  total    %10s", hours(total).c_str());
    price(total);
    std::printf("  (%sextract + train; model loading, prepare and vocab not counted; docs/time-plan.md)\n",
                w.gen_responses > 0 ? "generate + " : "");
  }
  for (const JobTime& t : plan.jobs)
    if (t.job == "train --prepared") print_stream_line(t, c, w, cost, devices, !offline);
}

}  // namespace aerie::jobs
