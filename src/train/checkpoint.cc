#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "core/log.h"
#include "core/version.h"
#include "io/safetensors.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFormat = "aerie.train_state";

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  AERIE_CHECK(fd >= 0, "cannot open " << path << " to sync it");
  int rc = ::fsync(fd);
  ::close(fd);
  AERIE_CHECK(rc == 0, "fsync of " << path << " failed");
}

std::map<std::string, std::string> checkpoint_metadata(int64_t step) {
  return {{"format", kCheckpointFormat},
          {"format_version", std::to_string(kCheckpointFormatVersion)},
          {"step", std::to_string(step)},
          {"aerie_version", aerie_version_string()}};
}

void check_metadata(const SafetensorsFile& f, const std::string& path) {
  auto it = f.metadata.find("format");
  AERIE_CHECK(it != f.metadata.end() && it->second == kCheckpointFormat,
              path << ": not an " << kCheckpointFormat << " file");
  it = f.metadata.find("format_version");
  AERIE_CHECK(it != f.metadata.end() && it->second == std::to_string(kCheckpointFormatVersion),
              path << ": format version " << (it == f.metadata.end() ? "?" : it->second) << ", expected "
                   << kCheckpointFormatVersion);
}

// Fills `w` (already shaped by DraftWeights::zeros) from `f`'s tensors prefix + export name.
void take_tensors(const SafetensorsFile& f, const std::string& prefix, DraftWeights& w, const std::string& path) {
  for (auto& [name, t] : w.named()) {
    auto it = f.tensors.find(prefix + name);
    AERIE_CHECK(it != f.tensors.end(), path << ": tensor " << prefix + name << " missing");
    it->second.check_dtype(DType::F32, path + ": " + prefix + name);
    it->second.check_shape(t->shape(), path + ": " + prefix + name);
    *t = it->second;
  }
  // A tensor the config's layout does not have (input_norm.weight or fc_norm.* of a config edited to say
  // otherwise) would be dropped silently: the draft would lose a trained weight.
  const std::vector<std::pair<std::string, Tensor*>> named = w.named();
  for (const auto& [name, t] : f.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    bool known = false;
    for (const auto& e : named) known = known || prefix + e.first == name;
    AERIE_CHECK(known, path << ": holds " << name << ", which the checkpoint's config.json does not have (its draft "
                            << "options: norm_before_fc, fc_norm); a checkpoint whose config was edited?");
  }
}

bool is_complete(const fs::path& dir) { return fs::is_directory(dir) && fs::exists(dir / "DONE"); }

}  // namespace

nlohmann::json TrainState::to_json() const {
  return {{"format", kStateFormat},
          {"format_version", 1},
          {"step", step},
          {"total_steps", total_steps},
          {"batch_size", batch_size},
          {"steps_per_epoch", steps_per_epoch},
          {"epoch", epoch},
          {"position", position},
          {"seed", seed},
          {"rng", "epoch e: Fisher-Yates permutation of the training samples driven by std::mt19937_64(seed + e)"},
          {"data_split", split.to_json()}};
}

TrainState TrainState::from_json(const nlohmann::json& j) {
  AERIE_CHECK(j.value("format", "") == kStateFormat && j.value("format_version", 0) == 1,
              "train state: expected format " << kStateFormat << " version 1");
  TrainState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.batch_size = j.at("batch_size").get<int64_t>();
    s.steps_per_epoch = j.at("steps_per_epoch").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.position = j.at("position").get<int64_t>();
    s.seed = j.at("seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW("train state: " << e.what());
  }
  s.split = DataSplit::from_json(j.at("data_split"));
  return s;
}

std::string checkpoint_dir(const std::string& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

void write_file_atomic(const std::string& path, const std::string& text, const std::string& tmp_path) {
  const std::string tmp = tmp_path.empty() ? path + ".tmp" : tmp_path;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    AERIE_CHECK(out, "cannot create " << tmp);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    AERIE_CHECK(out, "write to " << tmp << " failed");
  }
  fsync_path(tmp, false);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  AERIE_CHECK(!ec, "cannot rename " << tmp << " to " << path << ": " << ec.message());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "cannot open " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  AERIE_CHECK(in.good() || in.eof(), "read of " << path << " failed");
  return ss.str();
}

std::string save_checkpoint(const std::string& run_dir, const Checkpoint& ck, const std::string& vocab_file,
                            Communicator& comm) {
  const std::string final_dir = checkpoint_dir(run_dir, ck.state.step);
  const std::string tmp_dir = final_dir + ".tmp";
  if (comm.rank() == 0) {
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    const auto meta = checkpoint_metadata(ck.state.step);
    SafetensorsFile w;
    w.metadata = meta;
    for (auto& [name, t] : ck.weights.named()) w.tensors[name] = *t;
    save_safetensors(tmp_dir + "/draft.safetensors", w);
    SafetensorsFile o;
    o.metadata = meta;
    for (auto& [name, t] : ck.adam_m.named()) o.tensors["m." + name] = *t;
    for (auto& [name, t] : ck.adam_v.named()) o.tensors["v." + name] = *t;
    save_safetensors(tmp_dir + "/optimizer.safetensors", o);
    write_file_atomic(tmp_dir + "/draft_vocab.safetensors", read_file(vocab_file));
    nlohmann::json config = {{"draft", ck.config.to_json()}, {"train", ck.train_options}};
    if (!ck.provenance.is_null()) config["provenance"] = ck.provenance;
    config["aerie_version"] = aerie_version_string();  // who wrote the checkpoint (not read back)
    write_file_atomic(tmp_dir + "/config.json", config.dump(2) + "\n");
    nlohmann::json state = ck.state.to_json();
    state["aerie_version"] = aerie_version_string();
    write_file_atomic(tmp_dir + "/state.json", state.dump(2) + "\n");
  }
  comm.barrier();
  if (comm.rank() == 0) {
    write_file_atomic(tmp_dir + "/DONE", "step " + std::to_string(ck.state.step) + "\n");
    fsync_path(tmp_dir, true);
    fs::remove_all(final_dir);  // a stale DONE-less folder of the same step
    std::error_code ec;
    fs::rename(tmp_dir, final_dir, ec);
    AERIE_CHECK(!ec, "cannot rename " << tmp_dir << " to " << final_dir << ": " << ec.message());
    fsync_path(fs::path(final_dir).parent_path().string(), true);
  }
  comm.barrier();
  return final_dir;
}

std::map<int64_t, std::string> complete_checkpoints(const std::string& run_dir) {
  std::map<int64_t, std::string> out;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(dir)) return out;
  static const std::regex name_re("step-([0-9]{8,})");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, name_re)) continue;  // also skips "step-X.tmp"
    if (!is_complete(e.path())) {
      AERIE_LOG(debug) << "checkpoint " << e.path().string() << " has no DONE marker; ignored";
      continue;
    }
    out[std::stoll(m[1].str())] = e.path().string();
  }
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.rbegin()->second;
}

int remove_old_checkpoints(const std::string& run_dir, int keep) {
  if (keep <= 0) return 0;
  auto all = complete_checkpoints(run_dir);
  int removed = 0;
  while (static_cast<int>(all.size()) > keep) {
    // DONE first: a deletion cut short leaves an incomplete folder, never a damaged "complete" one.
    fs::remove(fs::path(all.begin()->second) / "DONE");
    fs::remove_all(all.begin()->second);
    all.erase(all.begin());
    ++removed;
  }
  return removed;
}

std::string resolve_checkpoint(const std::string& path) {
  if (is_complete(path) && fs::exists(fs::path(path) / "state.json")) return path;
  auto latest = latest_checkpoint(path);
  AERIE_CHECK(latest, path << " is neither a complete checkpoint folder (with DONE) nor a run folder with one "
                              "under checkpoints/");
  return *latest;
}

Checkpoint load_checkpoint(const std::string& dir, bool optimizer_state) {
  AERIE_CHECK(is_complete(dir), "checkpoint " << dir << " is incomplete (no DONE marker)");
  Checkpoint ck;
  const std::string cfg_path = dir + "/config.json";
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(read_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(cfg_path << ": " << e.what());
  }
  AERIE_CHECK(cfg.contains("draft") && cfg.contains("train"), cfg_path << ": expected the keys draft and train");
  ck.config = DraftConfig::from_json(cfg["draft"]);
  ck.train_options = cfg["train"];
  if (cfg.contains("provenance")) ck.provenance = cfg["provenance"];
  const std::string state_path = dir + "/state.json";
  try {
    ck.state = TrainState::from_json(nlohmann::json::parse(read_file(state_path)));
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(state_path << ": " << e.what());
  } catch (const Error& e) {
    AERIE_THROW(state_path << ": " << e.what());
  }
  const std::string wpath = dir + "/draft.safetensors", opath = dir + "/optimizer.safetensors";
  SafetensorsFile w = load_safetensors(wpath);
  check_metadata(w, wpath);
  ck.weights = DraftWeights::zeros(ck.config);
  take_tensors(w, "", ck.weights, wpath);
  SafetensorsFile o;
  if (optimizer_state) {
    o = load_safetensors(opath);
    check_metadata(o, opath);
    ck.adam_m = DraftWeights::zeros(ck.config);
    ck.adam_v = DraftWeights::zeros(ck.config);
    take_tensors(o, "m.", ck.adam_m, opath);
    take_tensors(o, "v.", ck.adam_v, opath);
  }
  for (const auto* f : {&w, &o}) {
    if (f == &o && !optimizer_state) continue;
    const std::string step = f->metadata.count("step") ? f->metadata.at("step") : "?";
    AERIE_CHECK(step == std::to_string(ck.state.step),
                dir << ": tensors of step " << step << " but state.json says step " << ck.state.step);
  }
  ck.vocab = load_draft_vocab(dir + "/draft_vocab.safetensors");
  AERIE_CHECK(ck.vocab.draft_vocab_size() == ck.config.draft_vocab_size && ck.vocab.vocab_size() == ck.config.vocab_size,
              dir << ": draft_vocab.safetensors has K = " << ck.vocab.draft_vocab_size() << ", V = "
                  << ck.vocab.vocab_size() << ", the config K = " << ck.config.draft_vocab_size << ", V = "
                  << ck.config.vocab_size);
  return ck;
}

}  // namespace aerie
