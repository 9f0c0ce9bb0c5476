// The shard folder (or streamed prepared file) of a training run and its provenance checks (shard_set.h).
#include "train/shard_set.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "core/log.h"
#include "train/checkpoint.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

std::string chunk_list(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < 10; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 10) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

}  // namespace

// Reads every shard's attributes and checks that the folder is one complete extraction: the same aux
// layers, hidden size and provenance everywhere (a folder mixed by an extract rerun with
// another model), and no chunk missing (case 4) unless opts.allow_missing_shards. The shards are those the
// folder's files record (read_shard_folder: a copy of a shard was trained twice): other .h5 files
// are skipped with a warning naming each. Logs on rank 0.
ShardSet scan_shards(const std::string& dir, const TargetConfig& target, const TrainOptions& opts, int rank) {
  ShardSet s;
  std::string first_recorded;
  std::vector<int64_t> chunks;
  int64_t num_chunks = -1, fp8_shards = 0, bf16_shards = 0;
  const ShardFolder folder = read_shard_folder(dir);
  if (rank == 0)
    for (const SkippedShardFile& f : folder.skipped)
      AERIE_LOG(warning) << "train: --shards " << dir << ": skipping " << f.path << ": " << f.why
                         << " (each chunk is trained once, from its shard-NNNNN.h5; move the file "
                         << "out of the folder to silence this)";
  for (const std::string& p : folder.shards) {
    ShardReader r(p);
    const ShardInfo& info = r.info();
    if (s.paths.empty()) {
      s.aux_layers = info.aux_layers;
      s.hidden_size = info.hidden_size;
      s.num_hidden_layers = info.num_hidden_layers;
      s.target_model = info.target_model;
      s.target_gemm = info.target_gemm;
    }
    AERIE_CHECK(info.aux_layers == s.aux_layers && info.hidden_size == s.hidden_size,
                p << ": aux layers / hidden size differ from " << s.paths.front() << "'s");
    auto gemm = [](const std::string& g) { return g.empty() ? std::string("the compute dtype's GEMMs") : g; };
    AERIE_CHECK(info.target_gemm == s.target_gemm,
                "train: --shards " << dir << " mixes hidden states of two target precisions: " << p << " ("
                                   << gemm(info.target_gemm) << ") and " << s.paths.front() << " ("
                                   << gemm(s.target_gemm)
                                   << ", extract --fp8-gemm or not). Train on the shards of one extraction.");
    if (!info.has_provenance()) {
      ++s.unrecorded;
    } else if (!s.provenance.has_provenance()) {
      s.provenance = info;
      first_recorded = p;
    } else {
      const std::string diff = info.target.difference(s.provenance.target);
      AERIE_CHECK(diff.empty(), "train: --shards " << dir << " mixes the shards of two targets: " << p << " and "
                                                   << first_recorded << ": " << diff << " (" << info.target.describe()
                                                   << " from " << info.target_model << ", against "
                                                   << s.provenance.target.describe() << " from "
                                                   << s.provenance.target_model
                                                   << "). Extract into an empty folder with one --model.");
      AERIE_CHECK(info.prepared_sha256 == s.provenance.prepared_sha256 && info.num_chunks == s.provenance.num_chunks,
                  "train: --shards " << dir << " mixes the shards of two extractions: " << p << " and "
                                     << first_recorded << " come from different prepared files or chunkings "
                                     << "(prepared sha256 " << info.prepared_sha256.substr(0, 12) << ".. of "
                                     << info.num_chunks << " chunks, against "
                                     << s.provenance.prepared_sha256.substr(0, 12) << ".. of "
                                     << s.provenance.num_chunks << ")");
    }
    if (info.num_chunks > 0) num_chunks = info.num_chunks;
    (info.fp8 ? fp8_shards : bf16_shards) += 1;
    chunks.push_back(info.chunk);
    s.paths.push_back(fs::absolute(p).lexically_normal().string());
    s.sizes.push_back(info.num_samples);
    for (int64_t i = 0; i < info.num_samples; ++i) s.lengths.push_back(r.sample_length(i));
  }
  AERIE_CHECK(!s.paths.empty(), "train: no shard-*.h5 files in " << dir);
  // The storage (extract --storage): one per folder as extract writes it; a mix (shards copied between
  // folders) trains, but is named.
  if (rank == 0) {
    if (fp8_shards > 0 && bf16_shards > 0)
      AERIE_LOG(warning) << "train: --shards " << dir << " mixes " << fp8_shards << " fp8 and " << bf16_shards
                         << " bf16 shards (extract writes one storage per folder: shards copied between folders?)";
    else
      AERIE_LOG(info) << "train: " << s.paths.size() << " shards, hidden states stored as "
                      << (fp8_shards > 0 ? "fp8 (format version 2)" : "bf16 (format version 1)");
  }
  AERIE_CHECK(s.hidden_size == target.hidden_size,
              "train: shards hold hidden size " << s.hidden_size << ", the target's is " << target.hidden_size);
  AERIE_CHECK(s.num_hidden_layers == 0 || s.num_hidden_layers == target.num_hidden_layers,
              "train: shards come from a target with " << s.num_hidden_layers << " layers, --model has "
                                                       << target.num_hidden_layers);
  // Missing chunks: the extraction's chunk count when the shards record it, else gaps below the last chunk.
  std::vector<int64_t> sorted = chunks;
  std::sort(sorted.begin(), sorted.end());
  const int64_t expected = num_chunks > 0 ? num_chunks : (sorted.empty() ? 0 : sorted.back() + 1);
  std::vector<int64_t> missing;
  for (int64_t c = 0, k = 0; c < expected; ++c) {
    while (k < static_cast<int64_t>(sorted.size()) && sorted[static_cast<size_t>(k)] < c) ++k;
    if (k >= static_cast<int64_t>(sorted.size()) || sorted[static_cast<size_t>(k)] != c) missing.push_back(c);
  }
  if (!missing.empty()) {
    std::ostringstream why;
    why << "--shards " << dir << " holds " << s.paths.size() << " of " << expected << " shards of its extraction: "
        << "chunk(s) " << chunk_list(missing) << " missing (an extract that has not finished, or lost files)";
    AERIE_CHECK(opts.allow_missing_shards, "train: " << why.str() << "; rerun aerie extract with the same options to "
                                                     << "complete the folder, or pass --allow-missing-shards to train "
                                                     << "on the shards that are there");
    if (rank == 0) AERIE_LOG(warning) << "train: " << why.str() << "; training on the rest (--allow-missing-shards)";
  }
  if (rank == 0 && s.unrecorded > 0)
    AERIE_LOG(warning) << "train: " << s.unrecorded << " of " << s.paths.size() << " shards in " << dir
                       << " record no provenance (written by an older aerie): that they come from --model "
                       << opts.model_dir << " and one prepared file is not checked";
  return s;
}

// The shards' target against --model: refuses another target unless
// opts.allow_other_target. Shards of extract --random-weights are compared by config.json only.
void check_shards_target(const ShardSet& s, const TargetFingerprint& model, const TrainOptions& opts, int rank) {
  if (!s.provenance.has_provenance()) return;
  const TargetFingerprint& theirs = s.provenance.target;
  std::string diff = theirs.difference(model);
  if (theirs.random() && diff.rfind("the weights differ", 0) == 0) {
    if (rank == 0)
      AERIE_LOG(warning) << "train: the shards in " << opts.shards_dir << " come from random weights ("
                         << theirs.weights_sha256 << ", extract --random-weights) with the config.json of --model "
                         << opts.model_dir << "; their weights are not compared";
    return;
  }
  if (diff.empty()) return;
  std::ostringstream why;
  const bool streamed = !opts.prepared_path.empty();
  if (streamed)
    why << "--target-model " << s.target_model << " (whose hidden states the draft trains on) is another "
        << "target than --model " << opts.model_dir << " (its embedding and lm_head): " << diff << " (--target-model: "
        << theirs.describe() << "; --model: " << model.describe() << ")";
  else
    why << "the shards in " << opts.shards_dir << " were extracted from another target than --model "
        << opts.model_dir << ": " << diff << " (the shards: " << theirs.describe() << ", from "
        << s.provenance.target_model << "; --model: " << model.describe() << ")";
  AERIE_CHECK(opts.allow_other_target, "train: " << why.str()
                                                 << (streamed ? ". Give one model to both, or pass " : ". Extract the shards with this --model, or pass ")
                                                 << "--allow-other-target if that is intended (e.g. a quantized copy of "
                                                    "the same model)");
  if (rank == 0) AERIE_LOG(warning) << "train: " << why.str() << "; training anyway (--allow-other-target)";
}

// Streaming (train/stream.h): the prepared file in the place of the shards: one "shard" of N samples
// (global sample g = prepared sample g), the aux layers of --aux-layers, the provenance of the target and
// the prepared file that the shards of an extraction would record.
ShardSet streamed_set(const StreamClient& stream, const TargetConfig& target, const TargetFingerprint& model,
                      const std::string& model_dir, const std::string& target_gemm) {
  // `model`, `model_dir`: the target the target's ranks run (--target-model).
  ShardSet s;
  s.paths = {fs::absolute(stream.prepared_path()).lexically_normal().string()};
  s.sizes = {stream.num_samples()};
  const std::vector<int64_t>& offsets = stream.prepared().sample_offsets();
  for (size_t i = 0; i + 1 < offsets.size(); ++i) s.lengths.push_back(offsets[i + 1] - offsets[i]);
  s.aux_layers = stream.aux_layers();
  s.hidden_size = target.hidden_size;
  s.num_hidden_layers = target.num_hidden_layers;
  s.provenance.target = model;
  s.provenance.prepared_sha256 = stream.prepared().fingerprint();
  s.provenance.num_chunks = 1;
  s.target_model = model_dir;
  s.target_gemm = target_gemm;
  return s;
}

// The run's inputs as recorded in its checkpoints (Checkpoint::provenance).
nlohmann::json make_provenance(const TrainOptions& opts, const TargetFingerprint& model, const TargetConfig& target,
                               const ShardSet& s, const std::string& vocab_file) {
  const bool streamed = !opts.prepared_path.empty();
  nlohmann::json shards = {{"dir", streamed ? s.paths.at(0) : fs::absolute(opts.shards_dir).lexically_normal().string()},
                           {"count", s.paths.size()}};
  if (streamed) shards["streamed"] = true;
  if (!s.target_gemm.empty()) shards["target_gemm"] = s.target_gemm;
  if (s.provenance.has_provenance()) {
    shards["target_config_sha256"] = s.provenance.target.config_sha256;
    shards["target_weights_sha256"] = s.provenance.target.weights_sha256;
    shards["prepared_sha256"] = s.provenance.prepared_sha256;
    shards["num_chunks"] = s.provenance.num_chunks;
  }
  return {{"target",
           {{"model", fs::absolute(opts.model_dir).lexically_normal().string()},  // absolute, as shards.dir
            {"config_sha256", model.config_sha256},
            {"weights_sha256", model.weights_sha256},
            {"num_hidden_layers", target.num_hidden_layers}}},
          {"shards", shards},
          {"vocab_sha256", sha256_hex(read_file(vocab_file))}};
}

// The target fingerprint a checkpoint's provenance records (empty digests when it records none).
TargetFingerprint recorded_target(const nlohmann::json& provenance) {
  const nlohmann::json t =
      provenance.is_object() ? provenance.value("target", nlohmann::json::object()) : nlohmann::json::object();
  TargetFingerprint f;
  f.config_sha256 = t.value("config_sha256", "");
  f.weights_sha256 = t.value("weights_sha256", "");
  return f;
}

// A resumed run's --model and --shards against its checkpoint's provenance.
void check_resume_provenance(const nlohmann::json& was, const std::string& checkpoint, const TrainOptions& opts,
                             const TargetFingerprint& model, const ShardSet& s, int rank) {
  if (was.is_null()) {
    if (rank == 0)
      AERIE_LOG(warning) << "train: " << checkpoint << " records no provenance (written by an older aerie): --model "
                         << "and --shards are checked by their shapes and shard names only";
    return;
  }
  const nlohmann::json t = was.value("target", nlohmann::json::object());
  const std::string diff = recorded_target(was).difference(model);
  if (!diff.empty()) {
    std::ostringstream why;
    why << "resume: --model " << opts.model_dir << " is not the target " << checkpoint << " was trained with ("
        << t.value("model", std::string("?")) << "): " << diff;
    AERIE_CHECK(opts.allow_other_target, why.str() << ". Rerun with that --model, or use another --output");
    if (rank == 0) AERIE_LOG(warning) << "train: " << why.str() << "; resuming anyway (--allow-other-target)";
  }
  const nlohmann::json sh = was.value("shards", nlohmann::json::object());
  const std::string gemm_was = sh.value("target_gemm", std::string());
  if (gemm_was != s.target_gemm) {
    auto gemm = [](const std::string& g) { return g.empty() ? std::string("the compute dtype's GEMMs") : g; };
    AERIE_THROW("resume: " << checkpoint << " was trained on hidden states of a target run with " << gemm(gemm_was)
                           << ", " << (opts.prepared_path.empty() ? "--shards " + opts.shards_dir + " hold"
                                                                  : std::string("this run's target runs"))
                           << " " << gemm(s.target_gemm) << ": rerun "
                           << (gemm_was.empty() ? "without" : "with") << " --fp8-gemm"
                           << (opts.prepared_path.empty() ? " shards" : "") << ", or use another --output");
  }
  if (sh.contains("prepared_sha256") && s.provenance.has_provenance()) {
    TargetFingerprint shard_target;
    shard_target.config_sha256 = sh.value("target_config_sha256", "");
    shard_target.weights_sha256 = sh.value("target_weights_sha256", "");
    std::string sdiff = shard_target.difference(s.provenance.target);
    if (sdiff.empty() && sh.value("prepared_sha256", "") != s.provenance.prepared_sha256)
      sdiff = opts.prepared_path.empty() ? "they were extracted from another prepared file"
                                         : "the prepared file's content differs";
    else if (!sdiff.empty())
      sdiff = "they were extracted from another target: " + sdiff;
    AERIE_CHECK(sdiff.empty(), "resume: " << (opts.prepared_path.empty() ? "--shards " + opts.shards_dir + " are not the shards "
                                                                          : "the hidden states of --prepared " + opts.prepared_path +
                                                                                " are not the ones ")
                                          << checkpoint
                                                   << " was trained on (" << sh.value("dir", std::string("?"))
                                                   << "): " << sdiff
                                                   << (opts.prepared_path.empty() ? ". Rerun with those --shards, or use another --output"
                                                                                  : ". Rerun with that --prepared and --target-model, or use another --output"));
  } else if (sh.contains("prepared_sha256") && rank == 0) {
    AERIE_LOG(warning) << "train: the shards in " << opts.shards_dir << " record no provenance, the ones "
                       << checkpoint << " was trained on did: not checked that they are the same";
  }
}

// The shards must be the ones the checkpoint was trained on (names and sample counts; the folder may move).
// Streaming: the prepared file may also be renamed (its fingerprint is checked by the provenance).
void check_same_shards(const ShardSet& now, const DataSplit& was, bool streamed) {
  AERIE_CHECK(now.paths.size() == was.shards.size(), "resume: " << now.paths.size() << " shards now, the checkpoint "
                                                                << "used " << was.shards.size());
  for (size_t i = 0; i < now.paths.size(); ++i) {
    AERIE_CHECK((streamed || fs::path(now.paths[i]).filename() == fs::path(was.shards[i]).filename()) &&
                    now.sizes[i] == was.shard_sizes[i],
                "resume: shard " << now.paths[i] << " (" << now.sizes[i] << " samples) differs from the checkpoint's "
                                 << was.shards[i] << " (" << was.shard_sizes[i] << " samples)");
  }
}


}  // namespace aerie
