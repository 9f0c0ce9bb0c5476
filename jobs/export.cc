// aerie export: a training checkpoint -> the draft directory vLLM and SGLang load (eagle3.md section 5),
// or with --format speculators the speculators layout that `vllm serve EXPORT_DIR` opens by itself.
//
//   aerie export --checkpoint RUN_DIR[/checkpoints/step-X] --model TARGET_DIR --output EXPORT_DIR
//                [--format eagle3|speculators [--verifier NAME_OR_PATH] [--speculative-tokens N]]
//
// A run folder means its newest complete checkpoint; with --best the checkpoint of the highest acceptance
// length in the run's checkpoint table (aerie eval --run, train/checkpoint_eval.h), ties to the later step:
//   aerie export --checkpoint RUN_DIR --best --model TARGET_DIR --output EXPORT_DIR
// config.json's "aerie_checkpoint" and model.safetensors' metadata record which step was exported and why,
// in either --format (--best works with both).
// Rank 0 writes; the other ranks wait.
#include <filesystem>
#include <map>
#include <sstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "io/fingerprint.h"
#include "jobs/jobs.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/checkpoint_eval.h"
#include "train/export.h"

namespace aerie::jobs {

namespace {

namespace fs = std::filesystem;

/// export --best: the checkpoint folder of `run_dir` in the row of the highest acceptance length of its
/// checkpoint table (`table_path`, "" for RUN_DIR/checkpoint_eval.json; ties to the later step), logged with
/// why; `source` gets selected_by, acceptance_length and eval_table. Throws aerie::Error naming the file
/// when the table is missing or not one, was measured on another target than `model_dir`, or names a
/// checkpoint that is gone or changed since it was evaluated.
std::string best_checkpoint_of_run(const std::string& run_dir, const std::string& table_path,
                                   const std::string& model_dir, nlohmann::json& source) {
  AERIE_CHECK(!(fs::exists(fs::path(run_dir) / "DONE") && fs::exists(fs::path(run_dir) / "state.json")),
              "export --best: --checkpoint " << run_dir << " is one checkpoint; --best chooses among the checkpoints "
                                             << "of a run: give the run folder (the --output of aerie train)");
  const std::string path = table_path.empty() ? checkpoint_eval_path(run_dir) : table_path;
  CheckpointEvalTable table;
  try {
    table = read_checkpoint_eval(path);
  } catch (const Error& e) {
    AERIE_THROW("export --best: " << e.what() << "; evaluate the run's checkpoints first: aerie eval --run "
                                  << run_dir << " --model " << model_dir << " --prompts HELD_OUT_PROMPTS ...");
  }
  // The acceptance lengths were measured with a target: the one this export is for.
  const TargetFingerprint now = TargetFingerprint::of_model(model_dir);
  TargetFingerprint was;
  was.config_sha256 = table.settings.value("target_config_sha256", "");
  was.weights_sha256 = table.settings.value("target_weights_sha256", "");
  const std::string diff = was.difference(now);
  AERIE_CHECK(diff.empty(), "export --best: " << path << " was made with the target "
                                              << table.settings.value("model", std::string("?"))
                                              << ", which is not --model " << model_dir << " (" << diff
                                              << "): evaluate the checkpoints with this target (aerie eval --run "
                                              << run_dir << " --output OTHER.json) and export --best --eval-table "
                                              << "OTHER.json");
  const CheckpointEvalRow& best = best_checkpoint(table, path);
  const std::map<int64_t, std::string> all = complete_checkpoints(run_dir);
  const auto it = all.find(best.step);
  if (it == all.end()) {
    // The best row whose checkpoint is still there and is the one the table evaluated (the table may be
    // another run's: --eval-table), to name in the error.
    const CheckpointEvalRow* present = nullptr;
    for (const CheckpointEvalRow& r : table.rows)
      if (all.count(r.step) && checkpoint_fingerprint(all.at(r.step)) == r.fingerprint &&
          (!present || r.acceptance_length() > present->acceptance_length() ||
                                (r.acceptance_length() == present->acceptance_length() && r.step > present->step)))
        present = &r;
    AERIE_THROW("export --best: the best checkpoint of " << path << ", step " << best.step << " (acceptance length "
                << best.acceptance_length() << "), is no longer in " << run_dir
                << " (removed by train --keep-checkpoints?); "
                << (present ? "the best still there is step " + std::to_string(present->step) +
                                  " (acceptance length " + std::to_string(present->acceptance_length()) +
                                  "): export it with --checkpoint " + checkpoint_dir(run_dir, present->step)
                            : std::string("no checkpoint the table evaluated is left in it (another run's table?): "
                                          "evaluate the run again")));
  }
  AERIE_CHECK(checkpoint_fingerprint(it->second) == best.fingerprint,
              "export --best: " << it->second << " is not the checkpoint of step " << best.step << " that " << path
                                << " evaluated (the run was trained again into " << run_dir
                                << "?): evaluate it again with aerie eval --run into a new table");
  std::vector<int64_t> ties, missing;
  for (const CheckpointEvalRow& r : table.rows)
    if (r.step != best.step && r.acceptance_length() == best.acceptance_length()) ties.push_back(r.step);
  for (const auto& [step, d] : all)
    if (!table.find(step)) missing.push_back(step);
  if (!missing.empty())
    AERIE_LOG(warning) << "export --best: " << missing.size() << " checkpoint(s) of " << run_dir << " are not in " << path
                       << " (steps " << nlohmann::json(missing).dump() << "): chosen among its " << table.rows.size()
                       << " rows only (aerie eval --run adds them)";
  std::ostringstream why;
  why << "export --best: step " << best.step << " of " << run_dir << ": acceptance length "
      << best.acceptance_length() << " (tau_sim " << best.figures.value("tau_sim", 0.0) << "), the highest of the "
      << table.rows.size() << " checkpoints in " << path;
  if (!ties.empty()) why << "; tied with step(s) " << nlohmann::json(ties).dump() << ", the later step is taken";
  AERIE_LOG(info) << why.str();
  source = {{"selected_by", "best_acceptance_length"},
            {"acceptance_length", best.acceptance_length()},
            {"eval_table", path}};
  return it->second;
}

/// A NaN or an infinity in the draft of checkpoint `dir` (a diverged run) is refused, not exported for an
/// engine to serve: throws aerie::Error naming the weight and the element.
void check_finite_weights(const std::string& dir, const DraftWeights& weights) {
  for (auto& [name, t] : weights.named()) {
    const std::string bad = t->defined() ? first_nonfinite(*t) : std::string();
    AERIE_CHECK(bad.empty(), "export: --checkpoint " << dir << ": the draft's weight " << name << " is not finite at "
                                                     << bad << " (a diverged run?): export an earlier checkpoint of "
                                                     << "the run (--checkpoint RUN/checkpoints/step-N)");
  }
}

/// --for's value (serving_target_from_string); a bad one is a usage error.
ServingTarget parse_for_option(const std::string& value) {
  try {
    return serving_target_from_string(value);
  } catch (const Error& e) {
    AERIE_USAGE_CHECK(false, "aerie " << e.what());
  }
  return {};
}

// The checkpoint's target fingerprint against --model `model` (a warning only: a draft trained on one copy of a
// model is served with another, e.g. a quantized one; the layer count and widths are checked by write_export).
void warn_other_target(const Checkpoint& ck, const std::string& dir, const std::string& model) {
  if (!ck.provenance.is_object() || !ck.provenance.contains("target")) return;
  const nlohmann::json& t = ck.provenance["target"];
  TargetFingerprint trained, given = TargetFingerprint::of_model(model);
  trained.config_sha256 = t.value("config_sha256", "");
  trained.weights_sha256 = t.value("weights_sha256", "");
  const std::string diff = trained.difference(given);
  if (!diff.empty())
    AERIE_LOG(warning) << "export: --model " << model << " is not the target " << dir
                       << " was trained with (" << t.value("model", std::string("?")) << "): " << diff;
}

// An --output `out` holding another run's export is not replaced without `force` (it may be all that is left
// of that run); the same run's (a newer or better step than checkpoint `dir`) is. A model's own folder is never
// replaced. Throws aerie::Error naming what --output holds.
void check_output_replaceable(const std::string& out, const std::string& dir, bool force) {
  const fs::path prev_config = fs::path(out) / "config.json";
  const nlohmann::json prev = fs::exists(prev_config)
                                  ? nlohmann::json::parse(read_file(prev_config.string()), nullptr, false)
                                  : nlohmann::json();
  if (fs::exists(prev_config)) {
    // A model's own folder (config.json + model.safetensors, no tokenizer) is never replaced, --force or not:
    // only a draft export is (an EAGLE architecture, a speculators config, or aerie's record).
    bool draft = prev.is_object() && (prev.contains("aerie_checkpoint") || prev.contains("speculators_model_type"));
    if (prev.is_object() && prev.contains("architectures") && prev["architectures"].is_array())
      for (const auto& a : prev["architectures"])
        draft = draft || (a.is_string() && a.get<std::string>().find("Eagle") != std::string::npos);
    AERIE_CHECK(draft, "export: --output " << out << " holds config.json of "
                                           << (prev.is_object() && prev.contains("architectures")
                                                   ? prev["architectures"].dump()
                                                   : std::string("no draft architecture"))
                                           << ", not a draft export: refusing to replace it (even with --force); "
                                           << "choose another --output");
  }
  if (fs::exists(prev_config) && !force) {
    // Paths compared resolved (symlinks, "..", a trailing slash from tab completion).
    auto run_of = [](const fs::path& p) {
      std::error_code ec;
      fs::path ck = fs::weakly_canonical(p, ec);
      if (ec) ck = fs::absolute(p).lexically_normal();
      if (ck.filename().empty()) ck = ck.parent_path();
      return ck.parent_path().filename() == "checkpoints" ? ck.parent_path().parent_path() : ck;
    };
    const std::string prev_ck = prev.is_object() && prev.contains("aerie_checkpoint") &&
                                        prev["aerie_checkpoint"].is_object()
                                    ? prev["aerie_checkpoint"].value("checkpoint", std::string())
                                    : std::string();
    const fs::path this_run = run_of(fs::path(dir));
    AERIE_CHECK(!prev_ck.empty() && run_of(fs::path(prev_ck)) == this_run,
                "export: --output " << out << " holds the export of "
                                    << (prev_ck.empty() ? std::string("another draft (its config.json names no aerie checkpoint)")
                                                        : "another run (" + prev_ck + ")")
                                    << ", not of " << this_run.string()
                                    << ": pass --force to replace it, or choose another --output");
  }
}

}  // namespace

int export_draft(const std::vector<std::string>& args) {
  po::options_description desc = job_options(
      "aerie export: write the draft as a directory vLLM and SGLang load (--best: the checkpoint of the highest "
      "acceptance length in the run's checkpoint table, aerie eval --run)");
  desc.add_options()("checkpoint", po::value<std::string>()->required(),
                     "checkpoint folder (step-X with DONE) or run folder (its newest checkpoint)")(
      "model", po::value<std::string>()->required(), "target model directory (config.json): rope and positions")(
      "output", po::value<std::string>()->required(), "export directory (config.json, model.safetensors)")(
      "best", po::bool_switch()->default_value(false),
      "export the checkpoint of the run (--checkpoint RUN_DIR) with the highest acceptance length in its "
      "checkpoint table (aerie eval --run writes it; ties go to the later step)")(
      "eval-table", po::value<std::string>()->default_value(""),
      "with --best: the checkpoint table to choose from (default RUN_DIR/checkpoint_eval.json)")(
      "for", po::value<std::string>()->default_value("any"),
      "serving engine and optionally its release: any (logs the first vLLM and SGLang releases that serve the "
      "draft as trained, and warns about what SGLang would read otherwise), vllm, sglang, vllm==0.18.0, "
      "sglang==0.5.14 (refuses a draft or target that release would refuse or misread, naming the first "
      "release that serves it: DeepSeek/Kimi targets and the MLA draft, norm_before_residual (train's "
      "default), norm_output, norm_before_fc, fc_norm, a sliding window, aux ids; without a release the newest "
      "aerie checked; eagle_config's aux ids in SGLang's convention for the target and release; docs/formats.md "
      "\"Engine releases\")")(
      "format", po::value<std::string>()->default_value("eagle3"),
      "eagle3 (LlamaForCausalLMEagle3 with midlayer.* names: vLLM --speculative-config and SGLang) or "
      "speculators (the speculators library's layout, speculators_model_type eagle3 with layers.0.* names: "
      "`vllm serve OUTPUT` serves the target named in its config with this draft; vLLM only)")(
      "verifier", po::value<std::string>(),
      "--format speculators: the target vLLM loads (speculators_config.verifier.name_or_path), a Hugging "
      "Face id or a path on the serving machine (default: --model as an absolute path)")(
      "speculative-tokens", po::value<int>()->default_value(3),
      "--format speculators: draft tokens per step (proposal_methods[0].speculative_tokens, vLLM's "
      "num_speculative_tokens; a --speculative-config given to vllm serve overrides it)");
  desc.add_options()("force", po::bool_switch()->default_value(false),
                     "replace an --output that holds the export of another run (an export of the same run, e.g. "
                     "a rerun of --best after more training, is replaced without it)");
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("export", args, desc, vm)) return 0;
  AERIE_USAGE_CHECK(vm["best"].as<bool>() || vm["eval-table"].as<std::string>().empty(),
                    "aerie export: --eval-table needs --best");
  auto world = MpiCommunicator::world();
  // OUT.lock beside the export (the folder itself is replaced by a rename): a second export into OUT is
  // refused while this one runs.
  const ServingTarget engine = parse_for_option(vm["for"].as<std::string>());  // before any work
  const std::string format_name = vm["format"].as<std::string>();
  AERIE_USAGE_CHECK(format_name == "eagle3" || format_name == "speculators",
                    "aerie export: --format '" << format_name << "' is not eagle3 or speculators");
  const ExportFormat format = export_format_from_string(format_name);
  SpeculatorsOptions spec;
  spec.speculative_tokens = vm["speculative-tokens"].as<int>();
  spec.serving = engine;
  if (format == ExportFormat::Speculators) {
    AERIE_USAGE_CHECK(engine.engine != ServingEngine::Sglang,
                      "aerie export: --format speculators is read by vLLM, not SGLang: drop --for sglang "
                      "(SGLang loads the default --format eagle3)");
    AERIE_USAGE_CHECK(spec.speculative_tokens >= 1,
                      "aerie export: --speculative-tokens " << spec.speculative_tokens << " is not >= 1");
    spec.verifier = vm.count("verifier") ? vm["verifier"].as<std::string>()
                                         : std::filesystem::absolute(vm["model"].as<std::string>())
                                               .lexically_normal()
                                               .string();
    AERIE_USAGE_CHECK(!spec.verifier.empty(), "aerie export: --verifier is empty");
  } else {
    AERIE_USAGE_CHECK(!vm.count("verifier") && vm["speculative-tokens"].defaulted(),
                      "aerie export: --verifier and --speculative-tokens are options of --format speculators");
  }
  const OutputLock lock = lock_output(vm, "export", vm["output"].as<std::string>(), LockTarget::File);
  if (world->rank() == 0) {
    // The cheap checks first (the output path, the checkpoint folder, config.json), then the weights.
    const std::string out = vm["output"].as<std::string>(), given = vm["checkpoint"].as<std::string>();
    AERIE_CHECK(!std::filesystem::exists(out) || std::filesystem::is_directory(out),
                "export: --output " << out << " exists and is not a folder");
    AERIE_CHECK(std::filesystem::exists(given), "export: --checkpoint " << given << ": no such folder");
    const bool best = vm["best"].as<bool>();
    std::string dir;
    nlohmann::json source;
    try {
      dir = best ? best_checkpoint_of_run(given, vm["eval-table"].as<std::string>(), vm["model"].as<std::string>(), source)
                 : resolve_checkpoint(given);
    } catch (const Error& e) {
      if (best) throw;
      const bool is_export = std::filesystem::exists(std::filesystem::path(given) / "model.safetensors");
      AERIE_THROW("export: --checkpoint " << given
                                          << (is_export ? " holds model.safetensors (an export, not a checkpoint): it is"
                                                        : " is")
                                          << " neither a complete checkpoint folder (step-X with DONE) "
                                          << "nor a run folder of aerie train with one under checkpoints/");
    }
    const TargetConfig target = load_model_option("export", "model", vm["model"].as<std::string>());
    Checkpoint ck = load_checkpoint(dir, /*optimizer_state=*/false);  // the weights alone
    check_finite_weights(dir, ck.weights);
    warn_other_target(ck, dir, vm["model"].as<std::string>());
    check_output_replaceable(out, dir, vm["force"].as<bool>());
    if (!best) source = {{"selected_by", dir == given ? "given" : "newest"}};
    {  // meaningful wherever the export goes; no trailing slash (tab completion), so that runs compare
      fs::path ck = fs::absolute(dir).lexically_normal();
      if (ck.filename().empty()) ck = ck.parent_path();
      source["checkpoint"] = ck.string();
    }
    source["step"] = ck.state.step;
    // The target the draft was trained with, for eval's check of an export against its --model.
    if (ck.provenance.is_object() && ck.provenance.contains("target")) source["target"] = ck.provenance["target"];
    // Hidden states of a W8A8 target (--fp8-gemm): the draft is meant for a target served that way.
    if (ck.provenance.is_object() && ck.provenance.contains("shards") && ck.provenance["shards"].is_object() &&
        ck.provenance["shards"].contains("target_gemm"))
      source["target_gemm"] = ck.provenance["shards"]["target_gemm"];
    if (format == ExportFormat::Speculators) {
      write_speculators_export(out, ck.config, ck.weights, ck.vocab, target, spec, source);
      AERIE_LOG(info) << "export: " << dir << " (step " << ck.state.step << ") -> " << out
                      << " (speculators format; serve with: vllm serve " << out << ", target " << spec.verifier
                      << ")";
    } else {
      write_export(out, ck.config, ck.weights, ck.vocab, target, engine, source);
      AERIE_LOG(info) << "export: " << dir << " (step " << ck.state.step << ") -> " << out;
    }
  }
  world->barrier();
  return 0;
}

}  // namespace aerie::jobs
