// aerie export: a training checkpoint -> the draft directory vLLM and SGLang load (eagle3.md section 5).
//
//   aerie export --checkpoint RUN_DIR[/checkpoints/step-X] --model TARGET_DIR --output EXPORT_DIR
//
// A run folder means its newest complete checkpoint. Rank 0 writes; the other ranks wait.
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "io/fingerprint.h"
#include "jobs/jobs.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace aerie::jobs {

int export_draft(const std::vector<std::string>& args) {
  po::options_description desc("aerie export: write the draft as a directory vLLM and SGLang load");
  desc.add_options()("checkpoint", po::value<std::string>()->required(),
                     "checkpoint folder (step-X with DONE) or run folder (its newest checkpoint)")(
      "model", po::value<std::string>()->required(), "target model directory (config.json): rope and positions")(
      "output", po::value<std::string>()->required(), "export directory (config.json, model.safetensors)")(
      "for", po::value<std::string>()->default_value("any"),
      "serving engine: any (aerie's input-of-layer aux ids, vLLM's; warns when SGLang would read them "
      "otherwise), vllm, or sglang (refuses aux ids SGLang would misread; docs/formats.md)");
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("export", args, desc, vm)) return 0;
  auto world = MpiCommunicator::world();
  // OUT.lock beside the export (the folder itself is replaced by a rename): a second export into OUT is
  // refused while this one runs.
  const ServingEngine engine = serving_engine_from_string(vm["for"].as<std::string>());  // before any work
  const OutputLock lock = lock_output(vm, "export", vm["output"].as<std::string>(), LockTarget::File);
  if (world->rank() == 0) {
    // The cheap checks first (the output path, the checkpoint folder, config.json), then the weights.
    const std::string out = vm["output"].as<std::string>(), given = vm["checkpoint"].as<std::string>();
    AERIE_CHECK(!std::filesystem::exists(out) || std::filesystem::is_directory(out),
                "export: --output " << out << " exists and is not a folder");
    AERIE_CHECK(std::filesystem::exists(given), "export: --checkpoint " << given << ": no such folder");
    std::string dir;
    try {
      dir = resolve_checkpoint(given);
    } catch (const Error& e) {
      const bool is_export = std::filesystem::exists(std::filesystem::path(given) / "model.safetensors");
      AERIE_THROW("export: --checkpoint " << given
                                          << (is_export ? " holds model.safetensors (an export, not a checkpoint): it is"
                                                        : " is")
                                          << " neither a complete checkpoint folder (step-X with DONE) "
                                          << "nor a run folder of aerie train with one under checkpoints/");
    }
    const TargetConfig target = load_target_config(vm["model"].as<std::string>());
    Checkpoint ck = load_checkpoint(dir);
    // The checkpoint's target fingerprint (a warning only: a draft trained on one copy of a model is
    // served with another, e.g. a quantized one; the layer count and widths are checked by write_export).
    if (ck.provenance.is_object() && ck.provenance.contains("target")) {
      const nlohmann::json& t = ck.provenance["target"];
      TargetFingerprint trained, given = TargetFingerprint::of_model(vm["model"].as<std::string>());
      trained.config_sha256 = t.value("config_sha256", "");
      trained.weights_sha256 = t.value("weights_sha256", "");
      const std::string diff = trained.difference(given);
      if (!diff.empty())
        AERIE_LOG(warning) << "export: --model " << vm["model"].as<std::string>() << " is not the target " << dir
                           << " was trained with (" << t.value("model", std::string("?")) << "): " << diff;
    }
    write_export(out, ck.config, ck.weights, ck.vocab, target, engine);
    AERIE_LOG(info) << "export: " << dir << " (step " << ck.state.step << ") -> " << out;
  }
  world->barrier();
  return 0;
}

}  // namespace aerie::jobs
