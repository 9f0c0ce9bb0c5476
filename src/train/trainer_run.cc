// run_training: the `aerie train` loop (data, resume, schedule, logging, checkpoints) around train_step.
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <future>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/stop_signals.h"
#include "data/shard.h"
#include "data/shard_pipeline.h"
#include "io/event_file.h"
#include "io/fingerprint.h"
#include "io/output_lock.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/data_order.h"
#include "train/eval.h"
#include "train/schedule.h"
#include "train/target_head.h"
#include "train/trainer.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

// The signal received by any rank of `dp` (collective), 0 if none.
int any_stop_signal(Communicator& dp) { return max_over_ranks(dp, static_cast<int32_t>(StopSignals::received())); }

bool all_finite(const Tensor& t) {
  const float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// Open shard readers of one thread, at most kMaxOpen (samples come from random shards; a large run has
// thousands of files): the least recently used one is closed first. Not thread-safe: each instance
// belongs to one thread. Its HDF5 calls (opening, reading, closing) hold hdf5_mutex(), so two instances
// may be used by two threads (HDF5 as Debian builds it is not thread-safe).
class ShardReaders {
 public:
  explicit ShardReaders(const DataSplit& split) : split_(split) {}
  ~ShardReaders() {
    std::lock_guard<std::mutex> h5(hdf5_mutex());
    open_.clear();
  }
  ShardReaders(const ShardReaders&) = delete;
  ShardReaders& operator=(const ShardReaders&) = delete;

  /// Global sample g of the split, hidden states F32 (ShardReader::read; its errors name the shard).
  HiddenSample read(int64_t g) {
    const SampleRef ref = split_.locate(g);
    std::lock_guard<std::mutex> h5(hdf5_mutex());
    auto it = open_.find(ref.shard);
    if (it == open_.end()) {
      if (open_.size() >= kMaxOpen) {
        auto lru = open_.begin();
        for (auto j = open_.begin(); j != open_.end(); ++j)
          if (j->second.second < lru->second.second) lru = j;
        open_.erase(lru);
      }
      auto r = std::make_unique<ShardReader>(split_.shards[static_cast<size_t>(ref.shard)]);
      it = open_.emplace(ref.shard, std::make_pair(std::move(r), int64_t{0})).first;
    }
    it->second.second = ++uses_;
    return it->second.first->read(ref.index);
  }

 private:
  static constexpr size_t kMaxOpen = 32;
  const DataSplit& split_;
  std::map<int64_t, std::pair<std::unique_ptr<ShardReader>, int64_t>> open_;  // shard -> (reader, last use)
  int64_t uses_ = 0;
};

// A sample read from the shards, with the name of its first non-finite dataset ("" when finite).
struct LoadedSample {
  HiddenSample hs;
  std::string nonfinite;
};

// Reads the samples of the next training step on a background thread while the current step runs: the
// HDF5 read and the bf16 / fp8 -> f32 conversion of a step's samples otherwise sit on its critical path
// (on a GPU they leave it idle; the fp8 shards' dequantization made a SmolLM2 run 1.3x longer,
// docs/performance.md). The samples are the same as read in line, so training is bitwise unchanged; the
// cost is host memory for one more step's samples (F32 [T, 4H] each). A read error surfaces when the
// step that needs the sample takes it, naming the shard and the sample as before.
class StepPrefetcher {
 public:
  explicit StepPrefetcher(const DataSplit& split) : readers_(split) {}
  ~StepPrefetcher() {
    if (next_.valid()) next_.wait();  // the task uses readers_
  }

  /// Starts reading the global samples `g` of step `step` (one read ahead at a time).
  void start(int64_t step, std::vector<int64_t> g) {
    if (next_.valid()) next_.wait();
    next_step_ = step;
    next_ = std::async(std::launch::async, [this, g = std::move(g)] { return load(g); });
  }
  /// The samples `g` of step `step`: those started for it (waiting for them), else read now.
  std::vector<LoadedSample> take(int64_t step, const std::vector<int64_t>& g) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<LoadedSample> out;
    if (next_.valid() && next_step_ == step) {
      out = next_.get();
    } else {
      if (next_.valid()) next_.wait();
      out = load(g);
    }
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  /// Seconds the caller spent in take() (waiting for reads), summed; reset by the caller's reads of it.
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  std::vector<LoadedSample> load(const std::vector<int64_t>& g) {
    std::vector<LoadedSample> out(g.size());
    for (size_t j = 0; j < g.size(); ++j) {
      out[j].hs = readers_.read(g[j]);
      out[j].nonfinite = !all_finite(out[j].hs.aux_hidden)     ? "aux_hidden_states"
                         : !all_finite(out[j].hs.final_hidden) ? "final_hidden_states"
                                                               : "";
    }
    return out;
  }
  ShardReaders readers_;  // used by the task only (and by take() when nothing was started)
  std::future<std::vector<LoadedSample>> next_;
  int64_t next_step_ = -1;
  double wait_s_ = 0;
};

std::string join(const std::vector<double>& v, int precision) {
  std::ostringstream os;
  os.precision(precision);
  for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
  return os.str();
}

// The shards of `dir` with their sample counts, and what they agree on.
struct ShardSet {
  std::vector<std::string> paths;
  std::vector<int64_t> sizes;
  std::vector<int64_t> lengths;  // every sample's token count, by global sample id (--draft-sliding-window auto)
  std::vector<int> aux_layers;
  int64_t hidden_size = 0, num_hidden_layers = 0;
  ShardInfo provenance;      // of the first shard that records it (has_provenance() false: none does)
  std::string target_model;  // the --model path extract recorded (first shard)
  int64_t unrecorded = 0;    // shards of an older aerie, without provenance
  std::string target_gemm;   // ShardInfo::target_gemm, one for all ("w8a8-fp8-block ..." or "")
};

std::string chunk_list(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < 10; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > 10) out += ", ... (" + std::to_string(v.size()) + " in all)";
  return out;
}

// Reads every shard's attributes and checks that the folder is one complete extraction: the same aux
// layers, hidden size and provenance everywhere (issue 17, case 3: a folder mixed by an extract rerun with
// another model), and no chunk missing (case 4) unless opts.allow_missing_shards. The shards are those the
// folder's files record (read_shard_folder, issue 46: a copy of a shard was trained twice): other .h5 files
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

// The shards' target against --model (issue 17, case 3): refuses another target unless
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

// A resumed run's --model and --shards against its checkpoint's provenance (issue 17, case 3).
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

// The draft weights of --init-draft (opts.init_draft: a checkpoint folder, or a run folder's newest complete
// checkpoint, whose folder is returned in `resolved`): its draft config and vocabulary must be this run's (the
// first difference is named), its weights finite, and opts.output_dir must lie outside it (the warm run would
// write into the draft it starts from). A checkpoint of another target than `model` is taken with a warning.
DraftWeights warm_start_weights(const TrainOptions& opts, const DraftConfig& cfg, const DraftVocab& vocab,
                                const TargetFingerprint& model, int rank, std::string& resolved) {
  const std::string& path = opts.init_draft;
  std::string dir = path;
  if (!fs::exists(path + "/draft.safetensors")) {
    const auto latest = latest_checkpoint(path);
    AERIE_CHECK(latest, "train: --init-draft " << path << " is neither a checkpoint folder (no draft.safetensors) "
                                               << "nor a run folder with a complete checkpoint (an export folder is "
                                               << "not read: give the run's checkpoint)");
    dir = *latest;
  }
  resolved = fs::weakly_canonical(dir).string();
  {
    const fs::path out = fs::weakly_canonical(opts.output_dir), init = fs::weakly_canonical(path);
    const auto [end, _] = std::mismatch(init.begin(), init.end(), out.begin(), out.end());
    AERIE_CHECK(end != init.end(), "train: --output " << opts.output_dir << " lies inside --init-draft " << path
                                                      << ": the warm run would write into the draft it starts from; "
                                                      << "use another --output");
  }
  Checkpoint init = load_checkpoint(dir, /*optimizer_state=*/false);  // a new optimizer state
  const nlohmann::json theirs = init.config.to_json(), mine = cfg.to_json();
  const nlohmann::json patch = nlohmann::json::diff(theirs, mine);  // RFC 6902 operations, theirs -> mine
  if (!patch.empty()) {
    // The first difference, as a dotted key; an array is shown whole (aux_layers [1,2,3], not its element 0).
    nlohmann::json::json_pointer at(patch[0]["path"].get<std::string>());
    while (!at.empty() && theirs.contains(at.parent_pointer()) && theirs[at.parent_pointer()].is_array())
      at = at.parent_pointer();
    std::string key = at.to_string().substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    auto shown = [&](const nlohmann::json& j) {
      return j.contains(at) ? j[at].dump() : std::string("(absent: off)");  // to_json leaves out options that are off
    };
    AERIE_THROW("train: --init-draft " << dir << ": its draft has " << key << " = " << shown(theirs) << ", this run's "
                                       << shown(mine)
                                       << "; give this run the draft options (and shards) that draft was trained with");
  }
  AERIE_CHECK(init.vocab.d2t == vocab.d2t && init.vocab.t2d == vocab.t2d,
              "train: --init-draft " << dir << ": its draft vocabulary differs from --vocab; pass its "
                                     << "draft_vocab.safetensors as --vocab");
  for (const auto& [name, t] : init.weights.named())  // checkpoints hold F32 host tensors (load_checkpoint checks)
    AERIE_CHECK(all_finite(*t), "train: --init-draft " << dir << ": its weight " << name << " is not finite");
  const TargetFingerprint trained_on = recorded_target(init.provenance);
  const std::string diff = trained_on.config_sha256.empty() ? std::string() : trained_on.difference(model);
  if (!diff.empty() && rank == 0)
    AERIE_LOG(warning) << "train: --init-draft " << dir << " was trained against another target than --model "
                       << opts.model_dir << " (" << diff << "); starting from it anyway";
  return std::move(init.weights);
}

// Runs `checks` (the checks of a fresh start or resume) on every rank of dp. With `whole_job` (an offline run:
// dp is every rank of the job) through comm's agree_on_refusal, so a refusal ends the job with status 1 and
// the message once. In a streaming run the target's ranks wait outside dp for the plan, so the error stays an
// aerie::Error (main() aborts the job, which releases them).
void refusals_agreed(Communicator& dp, bool whole_job, const std::function<void()>& checks) {
  if (whole_job)
    aerie::agree_on_refusal(dp, "train", checks);
  else
    checks();
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

// Keeps the lines of a JSON-lines log (metrics.jsonl, heldout.jsonl) of steps <= `step` (a killed run may
// have logged past its last checkpoint).
void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a torn last line of a killed run
    }
  }
  write_file_atomic(path, kept);
}

// The TensorBoard scalars of one log interval (docs/formats.md, TensorBoard event files).
std::vector<std::pair<std::string, double>> interval_scalars(const StepMetrics& m, double lr, double tokens_per_s) {
  std::vector<std::pair<std::string, double>> s = {{"train/loss", m.loss()},
                                                   {"train/tau_sim", m.tau_sim()},
                                                   {"train/lr", lr},
                                                   {"train/grad_norm", m.grad_norm},
                                                   {"train/tokens_per_s", tokens_per_s}};
  const std::vector<double> loss_k = m.loss_k(), acc_k = m.acc_k();
  for (size_t k = 0; k < loss_k.size(); ++k) s.emplace_back("train/loss_k/" + std::to_string(k), loss_k[k]);
  for (size_t k = 0; k < acc_k.size(); ++k) s.emplace_back("train/acc_k/" + std::to_string(k), acc_k[k]);
  return s;
}

}  // namespace

TrainResult run_training(const TrainOptions& given_opts, Communicator& dp, StreamClient* stream) {
  TrainOptions opts = given_opts;  // a resume may take settings from its checkpoint
  const int rank = dp.rank();
  AERIE_CHECK(!opts.output_dir.empty(), "train: --output is required");
  AERIE_CHECK(opts.log_every >= 1, "train: --log-every must be >= 1");
  AERIE_CHECK(opts.ttt_steps >= 1, "train: --ttt-steps must be >= 1");
  Device dev = resolve_train_device(opts.device);
  // Every rank of dp resolves the same device (the same option); local_rank() is collective on first use.
  // One GPU per rank (NCCL refuses two ranks on one GPU): "auto" falls back to the CPU when the node has
  // more ranks than GPUs, "cuda" fails.
  // Streaming: only dp's ranks count (the target's ranks may share the GPUs, train/stream.h).
  auto* dp_mpi = dynamic_cast<MpiCommunicator*>(&dp);
  const int node_ranks = dp_mpi != nullptr ? node_size(*dp_mpi) : local_size();
  if (dev == Device::CUDA && node_ranks > cuda::device_count()) {
    AERIE_CHECK(opts.device == "auto", "train: --device cuda with " << node_ranks << " training ranks on a node of "
                                                                   << cuda::device_count()
                                                                   << " GPUs (one GPU per rank)");
    if (rank == 0)
      AERIE_LOG(warning) << "train: " << node_ranks << " training ranks on a node of " << cuda::device_count()
                         << " GPUs: training on the CPU (--device auto)";
    dev = Device::CPU;
  }
  if (dev == Device::CUDA) cuda::select_device(local_rank());
  const TargetConfig target = load_target_config(opts.model_dir);
  const TargetFingerprint model_fp = TargetFingerprint::of_model(opts.model_dir);
  const std::string target_model = opts.target_model_dir.empty() ? opts.model_dir : opts.target_model_dir;
  const ShardSet shards =
      stream != nullptr
          ? streamed_set(*stream, target, target_model == opts.model_dir ? model_fp : TargetFingerprint::of_model(target_model),
                         target_model, opts.stream_target_gemm)
          : scan_shards(opts.shards_dir, target, opts, rank);
  check_shards_target(shards, model_fp, opts, rank);
  AERIE_CHECK(opts.aux_layers.empty() || opts.aux_layers == shards.aux_layers,
              "train: --aux-layers " << nlohmann::json(opts.aux_layers).dump() << ", but the shards in "
                                     << opts.shards_dir << " hold aux layers "
                                     << nlohmann::json(shards.aux_layers).dump()
                                     << " (extract --aux-layers): extract again or drop --aux-layers");
  if (opts.draft_sliding_window_auto) {
    // From the training samples (the split's held-out ones left out); every rank picks the same window,
    // a resumed run the one its checkpoint picked (check_resumable compares them).
    AERIE_CHECK(opts.draft_attention != "mla", "train: --draft-sliding-window auto goes with the Llama draft only: "
                                               "vLLM's Eagle3DeepseekV2ForCausalLM, which serves the MLA draft, "
                                               "reads no sliding window");
    const DataSplit split = make_data_split(shards.paths, shards.sizes, opts.eval_fraction);
    std::vector<int64_t> lengths;
    lengths.reserve(split.train.size());
    for (int64_t g : split.train) lengths.push_back(shards.lengths.at(static_cast<size_t>(g)));
    const AutoWindow w = auto_sliding_window(lengths, target.max_position_embeddings);
    opts.draft_sliding_window = w.window;
    if (rank == 0) {
      std::ostringstream stats;
      stats << "the 90th percentile (" << w.p90 << " tokens) of the " << w.count
            << " training samples' lengths (mean " << std::llround(w.mean) << ", longest " << w.longest << ")";
      if (w.window > 0)
        AERIE_LOG(info) << "train: --draft-sliding-window auto: " << w.window << " keys, the power of two at or "
                        << "above " << stats.str();
      else
        AERIE_LOG(warning) << "train: --draft-sliding-window auto: no window: the power of two at or above "
                           << stats.str() << " reaches the target's max_position_embeddings "
                           << target.max_position_embeddings << ", so it would never apply";
    }
  }
  // The target's head after the cheap checks of the shards (GiBs for a large vocabulary).
  TargetHead head = load_target_head(opts.model_dir, target);
  if (dev != Device::CPU) {  // frozen, uploaded once (a tied lm_head stays one tensor)
    const bool tied = head.lm_head.raw() == head.embed_tokens.raw();
    head.embed_tokens = head.embed_tokens.to_device(dev);
    head.lm_head = tied ? head.embed_tokens : head.lm_head.to_device(dev);
  }
  // Rank 0 writes the run folder; it holds its lock (io/output_lock.h) unless the job took it already
  // (jobs/train.cc, before the target loads). Stale .tmp files are replaced only under it.
  OutputLock lock;
  if (rank == 0) {
    fs::create_directories(opts.output_dir);
    if (!OutputLock::held_here(opts.output_dir, LockTarget::Folder))
      lock = OutputLock::acquire(opts.output_dir, LockTarget::Folder, "train");
  }
  dp.barrier();

  // Fresh start or resume.
  Checkpoint ck;
  std::string vocab_file;
  const auto latest = latest_checkpoint(opts.output_dir);
  const bool whole_job = stream == nullptr;  // offline: dp is every rank of the job
  refusals_agreed(dp, whole_job, [&] {
    if (latest) {
      if (rank == 0) AERIE_LOG(info) << "train: resuming from " << *latest;
      if (rank == 0 && !opts.init_draft.empty())
        AERIE_LOG(info) << "train: --init-draft ignored: the run resumes from its own checkpoint";
      AERIE_CHECK(fs::exists(fs::path(*latest) / "optimizer.safetensors"),
                  "train: resuming from " << *latest << " needs its optimizer state, optimizer.safetensors, which is "
                                          << "gone (deleted to save space?): export and eval do without it; to train "
                                          << "on from its weights with a new optimizer state, give another --output and "
                                          << "--init-draft " << *latest);
      ck = load_checkpoint(*latest);
      // The options whose default changed keep the checkpoint's setting unless given: a requeued job resumes
      // as it started without naming them.
      for (const std::string& line : opts.adopt_checkpoint_defaults(ck.train_options))
        if (rank == 0) AERIE_LOG(info) << "train: " << line;
      opts.check_resumable(ck.train_options);
      check_resume_provenance(ck.provenance, *latest, opts, model_fp, shards, rank);
      check_same_shards(shards, ck.state.split, stream != nullptr);
      AERIE_CHECK(ck.config.aux_layers == shards.aux_layers,
                  "resume: the checkpoint's draft reads aux layers " << nlohmann::json(ck.config.aux_layers).dump() << ", "
                      << (stream != nullptr ? "--aux-layers gives " : "the shards hold ")
                      << nlohmann::json(shards.aux_layers).dump()
                      << (stream != nullptr ? ": rerun with --aux-layers of the checkpoint, or use another --output"
                                            : ": rerun with the shards it was trained on, or use another --output"));
      ck.state.split.shards = shards.paths;
      vocab_file = *latest + "/draft_vocab.safetensors";
      if (!opts.vocab_path.empty() && fs::exists(opts.vocab_path)) {
        DraftVocab given = load_draft_vocab(opts.vocab_path);
        if ((given.d2t != ck.vocab.d2t || given.t2d != ck.vocab.t2d) && rank == 0)
          AERIE_LOG(warning) << "train: " << opts.vocab_path << " differs from the checkpoint's draft vocabulary; "
                             << "the checkpoint's is kept (it belongs to the draft)";
      }
      AERIE_CHECK(ck.config.vocab_size == target.vocab_size && ck.config.hidden_size == target.hidden_size,
                  "resume: the checkpoint's draft (V " << ck.config.vocab_size << ", H " << ck.config.hidden_size
                                                      << ") does not fit the target in " << opts.model_dir);
    } else {
      AERIE_CHECK(!opts.vocab_path.empty(), "train: --vocab is required for a fresh run");
      vocab_file = opts.vocab_path;
      ck.vocab = load_draft_vocab(vocab_file);
      AERIE_CHECK(ck.vocab.vocab_size() == target.vocab_size,
                  vocab_file << ": t2d has V = " << ck.vocab.vocab_size() << ", the target's V is " << target.vocab_size);
      ck.config = opts.apply_draft_shape(DraftConfig::from_target(target, ck.vocab.draft_vocab_size(), shards.aux_layers,
                                                                   opts.draft_attention == "mla"));
      // Initialised on the host (the checkpoint's copy); the device copy is made below.
      const Tensor lm_host = head.lm_head.device() == Device::CPU ? head.lm_head : head.lm_head.to_device(Device::CPU);
      if (opts.init_draft.empty()) {
        ck.weights =
            init_draft_weights(ck.config, lm_host, ck.vocab.selected(), opts.seed, opts.lm_head_init == "random");
      } else {
        AERIE_CHECK(opts.lm_head_init != "random", "train: --lm-head-init random with --init-draft: the lm_head "
                                                   "comes from the --init-draft checkpoint; leave out one of them");
        std::string resolved;
        ck.weights = warm_start_weights(opts, ck.config, ck.vocab, model_fp, rank, resolved);
        if (rank == 0) AERIE_LOG(info) << "train: the draft starts from the weights of " << resolved;
        opts.init_draft = resolved;  // recorded in the checkpoints' train options as the folder read
      }
      ck.adam_m = DraftWeights::zeros(ck.config);
      ck.adam_v = DraftWeights::zeros(ck.config);
      ck.state.split = make_data_split(shards.paths, shards.sizes, opts.eval_fraction);
      ck.state.seed = opts.seed;
      ck.state.batch_size = opts.batch_size;
    }
  });
  ck.train_options = opts.to_json();
  ck.provenance = make_provenance(opts, model_fp, target, shards, vocab_file);
  TrainState& st = ck.state;
  BatchOrder order(st.split, opts.batch_size, opts.seed);
  st.steps_per_epoch = order.steps_per_epoch();
  const int64_t total = opts.steps > 0 ? opts.steps : std::max<int64_t>(1, opts.epochs) * order.steps_per_epoch();
  refusals_agreed(dp, whole_job, [&] {
    AERIE_CHECK(!latest || st.total_steps == total,
                "resume: " << total << " total steps now, the checkpoint planned " << st.total_steps);
  });
  st.total_steps = total;
  const LrSchedule sched = LrSchedule::make(opts.lr, total, opts.warmup_ratio);
  const std::string metrics_path = opts.output_dir + "/metrics.jsonl";
  const std::string heldout_path = opts.output_dir + "/heldout.jsonl";
  if (rank == 0) {
    write_file_atomic(opts.output_dir + "/data_split.json", st.split.to_json().dump(1) + "\n");
    if (latest) {
      truncate_metrics(metrics_path, st.step);
      truncate_metrics(heldout_path, st.step);
      const int64_t dropped = truncate_event_files(opts.output_dir, st.step);
      if (dropped > 0)
        AERIE_LOG(info) << "train: dropped " << dropped << " TensorBoard event(s) past step " << st.step
                        << " from the event files of the killed run";
    }
    std::ostringstream weight_decay_text;
    if (opts.weight_decay != 0) weight_decay_text << ", weight decay " << opts.weight_decay;
    AERIE_LOG(info) << "train: " << st.split.train.size() << " training samples (" << st.split.eval.size()
                    << " held out) "
                    << (stream != nullptr ? "of " + opts.prepared_path + ", streamed from the target's ranks"
                                          : "in " + std::to_string(shards.paths.size()) + " shards")
                    << ", " << total << " steps of "
                    << opts.batch_size << " samples on " << dp.size() << (dp.size() == 1 ? " dp rank, " : " dp ranks, ")
                    << order.steps_per_epoch() << " steps per epoch, warmup " << sched.warmup_steps
                    << " steps (--warmup-ratio " << opts.warmup_ratio << " of " << total << ", rounded down), K = " << ck.config.draft_vocab_size << ", aux layers "
                    << nlohmann::json(ck.config.aux_layers).dump() << ", device " << device_name(dev) << ", compute "
                    << (resolve_compute_dtype(opts.precision, dev) == DType::BF16 ? "bf16 (fp32 master weights)" : "fp32")
                    << ", draft layer: "
                    << (ck.config.is_mla()
                            ? "MLA, " + std::to_string(ck.config.num_attention_heads) + " heads, " +
                                  (ck.config.q_lora_rank > 0 ? "q_lora " + std::to_string(ck.config.q_lora_rank)
                                                             : std::string("no query LoRA (q_proj)")) +
                                  ", kv_lora " +
                                  std::to_string(ck.config.kv_lora_rank) + ", head dims " +
                                  std::to_string(ck.config.qk_nope_head_dim) + " + " +
                                  std::to_string(ck.config.qk_rope_head_dim) + " / v " +
                                  std::to_string(ck.config.v_head_dim)
                            : std::to_string(ck.config.num_attention_heads) + " query heads, " +
                                  std::to_string(ck.config.num_key_value_heads) + " kv heads, head dim " +
                                  std::to_string(ck.config.head_dim))
                    << ", MLP " << ck.config.intermediate_size
                    << (ck.config.norm_before_residual ? ", norm_before_residual (EAGLE-3.1)" : "")
                    << (ck.config.norm_output ? ", norm_output (EAGLE-3.1)" : "")
                    << (ck.config.norm_before_fc ? ", norm_before_fc (EAGLE-3.1)" : "")
                    << (ck.config.fc_norm ? ", fc_norm (EAGLE-3.1)" : "")
                    << (ck.config.sliding_window > 0
                            ? ", sliding window " + std::to_string(ck.config.sliding_window) +
                                  (ck.config.sliding_window == 1 ? " key" : " keys")
                            : std::string())
                    << ", AdamW betas " << opts.adam_beta1 << " / " << opts.adam_beta2
                    << weight_decay_text.str()
                    << ", lm_head init "
                    << opts.lm_head_init << ", loss over " << (opts.loss_normalization == "all" ? "all" : "trained")
                    << " rows";
    if (opts.batch_size < dp.size())
      AERIE_LOG(warning) << "train: --batch-size " << opts.batch_size << " is below the " << dp.size()
                         << " dp ranks: " << dp.size() - opts.batch_size
                         << (dp.size() - opts.batch_size == 1 ? " of them gets no sample and idles" : " of them get no sample and idle")
                         << " each step (a resumed run keeps its batch size; start a run with a batch of at least the "
                         << "most ranks it will train on)";
  }
  TrainResult result;
  result.total_steps = total;
  // Streaming: the target's ranks learn the steps to compute (none when the run is complete).
  const int64_t heldout_count = std::min<int64_t>(opts.heldout_samples, static_cast<int64_t>(st.split.eval.size()));
  if (stream != nullptr) {
    StreamPlan plan;
    plan.start_step = st.step;
    plan.total_steps = total;
    plan.batch_size = opts.batch_size;
    plan.seed = opts.seed;
    plan.num_samples = st.split.num_samples();
    plan.num_train = static_cast<int64_t>(st.split.train.size());
    for (size_t i = 0; i < st.split.eval.size(); ++i)  // the held-out samples are the last ones (make_data_split)
      AERIE_CHECK(st.split.eval[i] == plan.num_train + static_cast<int64_t>(i),
                  "train (stream): the split's held-out samples are not the last ones of " << opts.prepared_path);
    plan.num_heldout = heldout_count;
    plan.queue = opts.stream_queue;
    plan.trainers = dp.size();
    stream->start(plan, rank);
  }
  if (st.step >= total) {
    if (rank == 0) AERIE_LOG(info) << "train: the checkpoint is already at step " << st.step << " of " << total;
    if (stream != nullptr) stream->finish(st.step - 1, [&](int64_t s) { return order.batch(s); }, rank, dp.size());
    result.checkpoint = *latest;
    result.step = st.step;
    return result;
  }
  if (latest) result.checkpoint = *latest;
  // TensorBoard: a new event file per run or resume, beside metrics.jsonl (rank 0 writes both).
  std::unique_ptr<EventFileWriter> events;
  if (rank == 0) {
    if (event_files_supported()) {
      events = std::make_unique<EventFileWriter>(opts.output_dir);
      AERIE_LOG(info) << "train: TensorBoard events in " << events->path() << " (tensorboard --logdir "
                      << opts.output_dir << ")";
    } else {
      AERIE_LOG(info) << "train: " << event_files_unsupported_reason() << "; the curves are in " << metrics_path;
    }
  }
  StopSignals stop_signals;

  // On a GPU the weights and moments live there for the whole run; ck keeps the host copies a checkpoint
  // is written from (the file format does not depend on the device). On the CPU they share storage.
  AdamState opt = dev == Device::CPU ? AdamState{std::move(ck.adam_m), std::move(ck.adam_v), st.step}
                                     : AdamState{ck.adam_m.to_device(dev), ck.adam_v.to_device(dev), st.step};
  DraftWeights w_dev = dev == Device::CPU ? DraftWeights() : ck.weights.to_device(dev);
  DraftWeights& w = dev == Device::CPU ? ck.weights : w_dev;
  const DType compute = resolve_compute_dtype(opts.precision, dev);
  StepScratch scratch = StepScratch::zeros(ck.config, dev, compute);
  // Gradients on GPUs are summed by NCCL over the same ranks as dp (MPI keeps the host-side counts).
  std::unique_ptr<NcclCommunicator> nccl;
  if (dev == Device::CUDA && dp.size() > 1) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(&dp);
    AERIE_CHECK(mpi != nullptr, "train: --device cuda with several ranks needs an MPI communicator for NCCL");
    nccl = std::make_unique<NcclCommunicator>(*mpi);
  }
  const std::vector<int64_t> selected = ck.vocab.selected();
  StepRecipe recipe;
  recipe.adam_beta1 = opts.adam_beta1;
  recipe.adam_beta2 = opts.adam_beta2;
  recipe.weight_decay = opts.weight_decay;
  recipe.normalize_by_all_rows = opts.loss_normalization == "all";
  // Shard readers: the held-out scoring's (this thread) and the training steps' (read one step ahead).
  std::unique_ptr<ShardReaders> heldout_readers;
  std::unique_ptr<StepPrefetcher> prefetch;
  if (stream == nullptr) {
    heldout_readers = std::make_unique<ShardReaders>(st.split);
    prefetch = std::make_unique<StepPrefetcher>(st.split);
  }
  // Teacher-forced acc_k / tau_sim of the draft now on the first opts.heldout_samples held-out samples
  // (eagle3.md section 4, as `aerie eval` computes them), spread over dp; rank 0 logs and records them.
  const int64_t num_heldout = heldout_count;
  auto score_heldout = [&]() {
    const int S = opts.ttt_steps;
    const std::vector<double> ones(static_cast<size_t>(S), 1.0);
    TeacherForced tf;
    for (int64_t i = rank; i < num_heldout; i += dp.size()) {
      const int64_t g = st.split.eval[static_cast<size_t>(i)];
      HiddenSample hs;
      if (stream != nullptr) {
        hs = stream->heldout_sample(g, i);
      } else {
        hs = heldout_readers->read(g);
      }
      if (!all_finite(hs.aux_hidden) || !all_finite(hs.final_hidden)) continue;  // named when trained on
      TTTSample t = make_ttt_sample(std::move(hs.ids), std::move(hs.loss_mask), std::move(hs.aux_hidden),
                                    hs.final_hidden, head.lm_head, selected);
      if (dev != Device::CPU) t.aux_hidden = t.aux_hidden.to_device(dev);
      tf.add(ttt_forward_backward(ck.config, w, head.embed_tokens, t, ck.vocab.d2t, ck.vocab.t2d, S, ones, nullptr));
    }
    tf.all_reduce(dp, S);
    if (rank != 0) return;
    AERIE_LOG(info) << "train: step " << st.step << " held out (" << tf.samples << " samples): tau_sim "
                    << tf.tau_sim() << " | acc_k " << join(tf.acc_k(), 3);
    nlohmann::json j = {{"step", st.step}, {"tau_sim", tf.tau_sim()}, {"acc_k", tf.acc_k()}, {"samples", tf.samples}};
    std::ofstream out(heldout_path, std::ios::app);
    out << j.dump() << "\n";
    AERIE_CHECK(out.good(), "train: cannot append to " << heldout_path);
    if (events) {
      std::vector<std::pair<std::string, double>> s = {{"heldout/tau_sim", tf.tau_sim()}};
      const std::vector<double> acc = tf.acc_k();
      for (size_t k = 0; k < acc.size(); ++k) s.emplace_back("heldout/acc_k/" + std::to_string(k), acc[k]);
      events->add_scalars(st.step, s);
    }
  };
  auto save = [&]() {
    if (num_heldout > 0) score_heldout();
    if (dev == Device::CPU) {
      ck.adam_m = opt.m;  // shares storage: no copy
      ck.adam_v = opt.v;
    } else {
      ck.weights = w.to_device(Device::CPU);
      ck.adam_m = opt.m.to_device(Device::CPU);
      ck.adam_v = opt.v.to_device(Device::CPU);
    }
    st.epoch = order.epoch_of(st.step);
    st.position = order.position_of(st.step);
    std::string dir = save_checkpoint(opts.output_dir, ck, vocab_file, dp);
    // The next checkpoint copies the vocabulary from this one: the one resumed from (or --vocab) may be
    // gone by then (--keep-checkpoints removes old checkpoints; found by the scaling-script helper).
    vocab_file = dir + "/draft_vocab.safetensors";
    if (rank == 0) {
      AERIE_LOG(info) << "train: checkpoint " << dir;
      const int removed = remove_old_checkpoints(opts.output_dir, opts.keep_checkpoints);
      if (removed > 0)
        AERIE_LOG(info) << "train: removed " << removed << " older checkpoint(s) of " << opts.output_dir
                        << " (--keep-checkpoints " << opts.keep_checkpoints << ")";
    }
    return dir;
  };

  Progress progress("train", "steps", static_cast<double>(total - st.step), rank, 0.0);
  StepMetrics interval;
  auto t0 = std::chrono::steady_clock::now();
  int64_t steps_in_interval = 0;
  int64_t steps_run = 0, empty_steps = 0;  // empty: no TTT row of step 0 in the whole global batch
  int64_t skipped_local = 0, interval_skipped = 0;  // non-finite samples skipped (this rank; the interval, global)
  double total_data_wait = 0;  // seconds this rank's loop waited for shard reads (rank 0's is logged)
  const auto loop_start = std::chrono::steady_clock::now();
  while (st.step < total) {
    const int64_t step = st.step;
    const std::vector<int64_t> mine = BatchOrder::rank_share(order.batch(step), rank, dp.size());
    std::vector<TTTSample> local;
    std::string skipped_here;  // this rank's non-finite samples of the step, for the message
    std::vector<LoadedSample> loaded;
    if (prefetch) {
      loaded = prefetch->take(step, mine);
      if (step + 1 < total) prefetch->start(step + 1, BatchOrder::rank_share(order.batch(step + 1), rank, dp.size()));
    }
    for (size_t j = 0; j < mine.size(); ++j) {
      const int64_t g = mine[j];
      const SampleRef ref = st.split.locate(g);
      // Batch position of mine[j]: rank_share gives this rank positions rank, rank + dp, ...
      HiddenSample hs;
      std::string bad;
      if (prefetch) {
        hs = std::move(loaded[j].hs);
        bad = std::move(loaded[j].nonfinite);
      } else {
        hs = stream->train_sample(g, rank + static_cast<int64_t>(j) * dp.size());
        bad = !all_finite(hs.aux_hidden) ? "aux_hidden_states" : !all_finite(hs.final_hidden) ? "final_hidden_states" : "";
      }
      // A token id outside the target's vocabulary (a damaged shard, or one of another tokenizer's prepared
      // file): named here, not deep in the embedding lookup.
      const int64_t V = head.embed_tokens.dim(0);
      for (size_t t = 0; t < hs.ids.size(); ++t)
        AERIE_CHECK(hs.ids[t] >= 0 && hs.ids[t] < V,
                    "train: " << st.split.shards[static_cast<size_t>(ref.shard)] << " sample " << ref.index
                              << " (prepared sample " << hs.sample_index << ") holds token id " << hs.ids[t]
                              << " at position " << t << ", outside the target's vocabulary [0, " << V
                              << ") of --model (a damaged shard, or shards of another model's prepared file?)");
      // A sample with a NaN or infinity in its hidden states would make the whole step's gradient
      // non-finite: it is skipped, named and counted (issue 17, case 5).
      if (!bad.empty()) {
        const std::string what = st.split.shards[static_cast<size_t>(ref.shard)] + " sample " +
                                 std::to_string(ref.index) + " (prepared sample " + std::to_string(hs.sample_index) +
                                 ")";
        AERIE_LOG(warning) << "train: step " << step + 1 << ": skipping " << what << ": non-finite " << bad;
        skipped_here += (skipped_here.empty() ? "" : ", ") + what;
        ++skipped_local;
        continue;
      }
      // The targets are made where W_lm lives (final_hidden goes there); f goes to the device once.
      local.push_back(make_ttt_sample(std::move(hs.ids), std::move(hs.loss_mask), std::move(hs.aux_hidden),
                                      hs.final_hidden, head.lm_head, selected));
      if (dev != Device::CPU) local.back().aux_hidden = local.back().aux_hidden.to_device(dev);
    }
    // Every rank's count of kept and skipped samples: a step none of whose samples is finite stops the run.
    Tensor kept = Tensor::from_vector<int64_t>({static_cast<int64_t>(local.size()), skipped_local}, {2});
    dp.all_reduce_sum(kept);
    skipped_local = 0;
    result.skipped_nonfinite += kept.data<int64_t>()[1];
    interval_skipped += kept.data<int64_t>()[1];
    AERIE_CHECK(kept.data<int64_t>()[0] > 0,
                "train: every sample of step " << step + 1 << " has non-finite hidden states"
                                               << (skipped_here.empty() ? "" : " (this rank's: " + skipped_here + ")")
                                               << (stream != nullptr ? ": the target's forward overflowed (--target-dtype?)"
                                                                     : ": the shards are damaged or the target's forward overflowed; "
                                                                       "extract them again"));
    const double lr = sched.at(step);
    StepMetrics m = train_step(ck.config, w, opt, head.embed_tokens, local, ck.vocab, opts.ttt_steps, lr,
                               opts.max_grad_norm, dp, scratch, nccl.get(), recipe);
    if (!std::isfinite(m.grad_norm)) {
      std::string samples;
      for (int64_t g : mine) {
        const SampleRef ref = st.split.locate(g);
        samples += (samples.empty() ? "" : ", ") + st.split.shards[static_cast<size_t>(ref.shard)] + " sample " +
                   std::to_string(ref.index);
      }
      AERIE_THROW("train: non-finite gradient norm at step " << step + 1 << " (finite inputs; this rank's samples: "
                                                            << samples << "): lower --lr or --max-grad-norm");
    }
    ++steps_run;
    if (m.valid.empty() || m.valid[0] == 0) {
      // eagle3.md section 4: row t of TTT step 0 trains iff loss_mask[t + 2] = 1 and the target's token
      // at t + 1 is in the draft vocabulary; a batch without such a row gives loss 0 and no update.
      if (empty_steps++ == 0 && rank == 0) {
        std::ostringstream ids;
        for (size_t i = 0; i < mine.size() && i < 8; ++i) ids << (i ? ", " : "") << mine[i];
        AERIE_LOG(warning) << "train: step " << step + 1 << " has no trainable row: none of its samples (rank 0's: "
                           << ids.str() << (mine.size() > 8 ? ", ..." : "")
                           << ") has a loss token at position >= 2 whose target token is in the draft vocabulary, "
                           << "so the step trains nothing (loss 0); further such steps are counted, not logged";
      }
    }
    interval.add(m);
    ++steps_in_interval;
    st.step = step + 1;
    if (st.step % opts.log_every == 0 || st.step == total) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double tps = secs > 0 ? static_cast<double>(interval.tokens) / secs : 0.0;
      const double data_wait = prefetch ? prefetch->take_wait_seconds() : 0.0;
      total_data_wait += data_wait;
      if (rank == 0) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "train: step %lld/%lld epoch %lld loss %.4f tau_sim %.3f lr %.3e grad_norm %.3f %.0f tokens/s",
                      static_cast<long long>(st.step), static_cast<long long>(total),
                      static_cast<long long>(order.epoch_of(step)), interval.loss(), interval.tau_sim(), lr,
                      interval.grad_norm, tps);
        AERIE_LOG(info) << buf << " | loss_k " << join(interval.loss_k(), 4) << " | acc_k " << join(interval.acc_k(), 3);
        nlohmann::json j = {{"step", st.step},           {"epoch", order.epoch_of(step)},
                            {"loss", interval.loss()},   {"loss_k", interval.loss_k()},
                            {"acc_k", interval.acc_k()}, {"tau_sim", interval.tau_sim()},
                            {"lr", lr},                  {"grad_norm", interval.grad_norm},
                            {"tokens", interval.tokens}, {"tokens_per_s", tps},
                            {"seconds", secs}};
        if (prefetch) j["data_wait_s"] = data_wait;
        if (interval_skipped > 0) j["skipped_nonfinite"] = interval_skipped;
        std::ofstream out(metrics_path, std::ios::app);
        out << j.dump() << "\n";
        AERIE_CHECK(out.good(), "train: cannot append to " << metrics_path);
        if (events) events->add_scalars(st.step, interval_scalars(interval, lr, tps));
      }
      progress.add(static_cast<double>(steps_in_interval));
      interval_skipped = 0;
      interval = StepMetrics();
      steps_in_interval = 0;
      t0 = std::chrono::steady_clock::now();
    }
    const bool due = (opts.checkpoint_every > 0 && st.step % opts.checkpoint_every == 0) || st.step == total;
    // The stop is decided before the checkpoint (streaming: the credit tells the target both).
    if (st.step < total) result.stop_signal = any_stop_signal(dp);
    const bool stopping = result.stop_signal != 0;
    if (stream != nullptr)
      stream->step_done(step, (due || stopping) && num_heldout > 0, stopping || st.step == total, result.stop_signal,
                        rank);
    if (due || stopping) result.checkpoint = save();
    if (stopping) {
      if (rank == 0)
        AERIE_LOG(warning) << "train: stopped by signal " << result.stop_signal << " after step " << st.step << " of "
                           << total << "; rerun the same command to resume from " << result.checkpoint;
      break;
    }
  }
  if (stream != nullptr) {
    stream->finish(st.step - 1, [&](int64_t s) { return order.batch(s); }, rank, dp.size());
    if (rank == 0)
      AERIE_LOG(info) << "train: trainer rank 0 received " << stream->received_bytes() / (1 << 20) << " MiB of hidden states "
                      << "from the target and waited " << std::fixed << std::setprecision(1) << stream->wait_seconds()
                      << " s for them";
  }
  if (result.stop_signal == 0) progress.finish();
  if (prefetch) total_data_wait += prefetch->take_wait_seconds();
  if (prefetch && rank == 0 && steps_run > 0) {
    const double loop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
    AERIE_LOG(info) << "train: the steps waited " << std::fixed << std::setprecision(1) << total_data_wait
                    << " s for shard reads (" << (loop_s > 0 ? 100.0 * total_data_wait / loop_s : 0.0)
                    << "% of " << loop_s << " s; read one step ahead)";
  }
  AERIE_CHECK(steps_run == 0 || empty_steps < steps_run,
              "train: none of the " << steps_run << " steps had a trainable row (loss 0, nothing learned): the "
                                    << "samples' loss tokens all sit at positions 0-1, or their target tokens are "
                                    << "all outside the draft vocabulary (" << opts.vocab_path << ")");
  if (empty_steps > 0 && rank == 0)
    AERIE_LOG(warning) << "train: " << empty_steps << " of " << steps_run << " steps had no trainable row";
  if (rank == 0 && result.skipped_nonfinite > 0)
    AERIE_LOG(warning) << "train: skipped " << result.skipped_nonfinite << " draw(s) of samples with non-finite hidden "
                       << "states (named above; skipped_nonfinite in metrics.jsonl)";
  result.step = st.step;
  return result;
}

}  // namespace aerie
