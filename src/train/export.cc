#include "train/export.h"

#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "core/log.h"
#include "core/version.h"
#include "io/safetensors.h"
#include "kernels/rope.h"
#include "model/rope_config.h"
#include "train/checkpoint.h"

namespace aerie {

namespace fs = std::filesystem;

nlohmann::json export_config(const DraftConfig& cfg, const TargetConfig& target, const ServingTarget& serving) {
  AERIE_CHECK(cfg.vocab_size == target.vocab_size && cfg.target_hidden_size == target.hidden_size,
              "export: the draft (V " << cfg.vocab_size << ", target H " << cfg.target_hidden_size
                                      << ") does not fit the target (V " << target.vocab_size << ", H "
                                      << target.hidden_size << ")");
  // Another layer count: the aux layers would read other depths of another model, and
  // whether they are the default ones (written to eagle_config or not) would change.
  AERIE_CHECK(cfg.target_num_hidden_layers <= 0 || cfg.target_num_hidden_layers == target.num_hidden_layers,
              "export: the target has " << target.num_hidden_layers << " layers, the draft was trained on hidden "
                                        << "states of a target of " << cfg.target_num_hidden_layers
                                        << " layers (aux layers " << nlohmann::json(cfg.aux_layers).dump()
                                        << "): export with the --model it was trained with");
  // The export copies the rope from --model (as the target wrote it); a draft trained with another rope would
  // be served with positions it never saw (a quantized copy of the training target has the same rope).
  {
    const RopeParams &a = cfg.rope, &b = target.rope;
    const bool same = a.theta == b.theta && a.type == b.type && a.factor == b.factor &&
                      a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
                      a.original_max_position_embeddings == b.original_max_position_embeddings &&
                      a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
                      a.mscale_all_dim == b.mscale_all_dim;
    AERIE_CHECK(same, "export: the draft was trained with rope " << a.type << " theta " << a.theta << " factor "
                                                             << a.factor << ", the target has rope " << b.type
                                                             << " theta " << b.theta << " factor " << b.factor
                                                             << ": export with the --model it was trained with");
  }
  AERIE_CHECK(cfg.aux_layers.size() == 3, "export: the draft config has " << cfg.aux_layers.size() << " aux layers");
  for (int a : cfg.aux_layers)
    AERIE_CHECK(a >= 0 && a <= target.num_hidden_layers,
                "export: aux layer " << a << " outside [0, " << target.num_hidden_layers << "]");
  nlohmann::json j = cfg.to_json();
  j.erase("aerie");  // aerie's private copy of the aux layers: not part of the format
  // Copied from the target as it wrote them (eagle3.md section 4 traps: 2048 positions, lost rope).
  const nlohmann::json& raw = target.raw;
  j["max_position_embeddings"] = target.max_position_embeddings;
  j["rope_theta"] = raw.is_object() && raw.contains("rope_theta") ? raw["rope_theta"] : nlohmann::json(target.rope.theta);
  // transformers 5.x writes both as one "rope_parameters" object: exported in the 4.x spelling that vLLM and
  // SGLang read (rope_theta + rope_scaling, the latter null for the default rope).
  j["rope_scaling"] = rope_scaling_4x(raw);
  if (raw.is_object() && !raw.contains("rope_scaling") && raw.contains("rope_parameters") &&
      raw["rope_parameters"].is_object() && raw["rope_parameters"].contains("rope_theta"))
    j["rope_theta"] = raw["rope_parameters"]["rope_theta"];
  j["num_hidden_layers"] = 1;
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  if (cfg.target_hidden_size != cfg.hidden_size)
    j["target_hidden_size"] = cfg.target_hidden_size;
  else
    j.erase("target_hidden_size");
  // The aux ids in both places the engines read, default layers too: vLLM 0.16-0.34 take the capture list
  // from the top-level key only (an id list only in eagle_config left vLLM 0.26 capturing its default
  // layers); SGLang reads eagle_config's only, in the convention of its release (eagle_config_aux_ids).
  // The lists differ: SGLang adds 1 to the ids of most targets (eagle_config_aux_ids; check_serving_target
  // refuses or warns where no list serves). vLLM 0.22-0.33's older runner falls back to eagle_config's list
  // only without the top-level one, and sizes fc by that list's length alone.
  j["eagle_aux_hidden_state_layer_ids"] = cfg.aux_layers;
  std::vector<int> sglang_ids;
  std::string why;
  if (!eagle_config_aux_ids(cfg.aux_layers, target, serving, sglang_ids, why))
    sglang_ids = cfg.aux_layers;  // no list serves SGLang (refused for it, warned otherwise): aerie's ids
  j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", sglang_ids}};
  j["aerie_version"] = aerie_version_string();  // who wrote it (ignored by vLLM and SGLang)
  return j;
}

SafetensorsFile export_tensors(const DraftConfig& cfg, const DraftWeights& weights, const DraftVocab& vocab) {
  AERIE_CHECK(vocab.draft_vocab_size() == cfg.draft_vocab_size && vocab.vocab_size() == cfg.vocab_size,
              "export: d2t/t2d sizes (K " << vocab.draft_vocab_size() << ", V " << vocab.vocab_size()
                                          << ") differ from the config's (K " << cfg.draft_vocab_size << ", V "
                                          << cfg.vocab_size << ")");
  const DraftWeights shapes = DraftWeights::zeros(cfg);
  SafetensorsFile f;
  f.metadata = {{"format", "pt"}, {"aerie_version", aerie_version_string()}};
  auto want = shapes.named();
  auto have = weights.named();
  if (have.size() != want.size()) {  // name the tensors one side has and the other lacks
    std::set<std::string> h, w;
    for (const auto& e : have) h.insert(e.first);
    for (const auto& e : want) w.insert(e.first);
    std::string extra, missing;
    for (const auto& n : h)
      if (!w.count(n)) extra += (extra.empty() ? "" : ", ") + n;
    for (const auto& n : w)
      if (!h.count(n)) missing += (missing.empty() ? "" : ", ") + n;
    AERIE_THROW("export: the weights hold " << have.size() << " tensors, the config wants " << want.size()
                                            << (missing.empty() ? "" : "; missing: " + missing)
                                            << (extra.empty() ? "" : "; not in the config's layout: " + extra)
                                            << " (norm_before_fc " << (cfg.norm_before_fc ? "on" : "off")
                                            << ", fc_norm " << (cfg.fc_norm ? "on" : "off") << ")");
  }
  for (size_t i = 0; i < have.size(); ++i) {
    have[i].second->check_shape(want[i].second->shape(), "export: " + have[i].first);
    f.tensors[have[i].first] = have[i].second->to(DType::BF16);
  }
  // A draft vocabulary of every target id (K == V) maps each draft id to itself: d2t is all zeros and is left out.
  // vLLM 0.30.0 on has no draft_id_to_target_id parameter then and refuses a d2t by a ValueError (vllm==0.30.0
  // model_executor/models/llama_eagle3.py:339 and deepseek_eagle3.py); without it vLLM 0.9.1 on and SGLang map
  // draft ids to the same target ids, as the zeros would.
  if (cfg.draft_vocab_size != cfg.vocab_size) f.tensors["d2t"] = Tensor::from_vector(vocab.d2t, {cfg.draft_vocab_size});
  f.tensors["t2d"] = Tensor::from_vector(vocab.t2d, {cfg.vocab_size});
  return f;
}

void record_export_checkpoint(nlohmann::json& config, SafetensorsFile& tensors, const nlohmann::json& source) {
  if (source.is_null()) return;
  AERIE_CHECK(source.is_object() && source.contains("step") && source["step"].is_number_integer(),
              "export: the checkpoint source " << source.dump() << " has no integer step");
  config["aerie_checkpoint"] = source;
  tensors.metadata["checkpoint_step"] = std::to_string(source["step"].get<int64_t>());
  tensors.metadata["checkpoint_selected_by"] = source.value("selected_by", std::string("given"));
}

void write_export_dir(const std::string& out_dir, const nlohmann::json& config, const SafetensorsFile& tensors) {
  const fs::path out = fs::path(out_dir).lexically_normal();
  const fs::path tmp = out.string() + ".tmp";
  // Only an earlier export (or an empty folder) is replaced: anything else in --output, or in the
  // .tmp / .old siblings the replacement uses, is refused by name, never removed (a typo of a run folder
  // would otherwise lose it).
  for (const fs::path& d : {out, tmp, fs::path(out.string() + ".old")}) {
    if (!fs::exists(d)) continue;
    AERIE_CHECK(fs::is_directory(d), "export: " << d.string() << " exists and is not a folder");
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      AERIE_CHECK(n == "config.json" || n == "model.safetensors" || n == "config.json.tmp" ||
                      n == "model.safetensors.tmp",
                  "export: " << d.string() << " holds " << n << ", which is not part of an export (config.json, "
                             << "model.safetensors): refusing to replace it; choose another --output or empty it");
    }
  }
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_safetensors((tmp / "model.safetensors").string(), tensors, {"t2d"});
  write_file_atomic((tmp / "config.json").string(), config.dump(2) + "\n");
  const fs::path old = out.string() + ".old";
  fs::remove_all(old);
  if (fs::exists(out)) {
    if (!fs::is_empty(out)) AERIE_LOG(info) << "export: replacing the earlier export in " << out.string();
    fs::rename(out, old);
  }
  fs::rename(tmp, out);
  fs::remove_all(old);
}

namespace {

/// "vLLM X and later, SGLang in no release up to Y" for the --for any log line.
std::string first_releases(const DraftConfig& cfg, const TargetConfig& target, const std::string& format) {
  std::string out;
  for (ServingEngine e : {ServingEngine::Vllm, ServingEngine::Sglang}) {
    EngineRelease first;
    const bool any = first_serving_release(serving_needs(cfg, target, e, format), first);
    out += std::string(out.empty() ? "" : ", ") + (e == ServingEngine::Vllm ? "vLLM " : "SGLang ") +
           (any ? first.str() + " and later" : "in no release up to " + newest_checked_release(e).str());
  }
  return out;
}

}  // namespace

void check_serving_target(const DraftConfig& cfg, const TargetConfig& target, const ServingTarget& serving,
                          const std::string& format) {
  const std::vector<ServingNeed> needs = serving_needs(cfg, target, serving.engine, format);
  std::vector<std::string> unmet = unmet_serving_needs(needs, serving);
  std::vector<int> ids;
  std::string aux_why;
  eagle_config_aux_ids(cfg.aux_layers, target, serving, ids, aux_why);
  if (serving.engine == ServingEngine::Sglang && !aux_why.empty() && format == "eagle3") unmet.push_back(aux_why);
  if (!unmet.empty()) {
    std::string all;
    for (size_t i = 0; i < unmet.size(); ++i) all += (i == 0 ? "" : "; and ") + unmet[i];
    AERIE_THROW("export --for " << serving.name() << ": " << all);
  }
  if (serving.has_release && newest_checked_release(serving.engine) < serving.release)
    AERIE_LOG(warning) << "export: " << serving.name() << " is newer than the newest release aerie checked ("
                       << newest_checked_release(serving.engine).str() << "): checked as that one";
  if (serving.engine == ServingEngine::Any) {
    // Who serves it: a warning when no vLLM release does (the speculators format is vLLM's alone; --for vllm
    // refuses); then what the newest SGLang would read or run otherwise than trained.
    const std::vector<std::string> vllm = unmet_serving_needs(serving_needs(cfg, target, ServingEngine::Vllm, format),
                                                              ServingTarget(ServingEngine::Vllm));
    EngineRelease first;
    const bool vllm_serves = first_serving_release(serving_needs(cfg, target, ServingEngine::Vllm, format), first);
    if (!vllm_serves) {
      std::string all;
      for (size_t i = 0; i < vllm.size(); ++i) all += (i == 0 ? "" : "; and ") + vllm[i];
      AERIE_LOG(warning) << "export: " << (format == "speculators" ? "--format speculators is read by vLLM alone, and " : "")
                         << all;
    }
    std::vector<std::string> sglang;
    if (format == "eagle3") {
      sglang = unmet_serving_needs(serving_needs(cfg, target, ServingEngine::Sglang, format),
                                   ServingTarget(ServingEngine::Sglang));
      if (!aux_why.empty()) sglang.push_back(aux_why);
    }
    for (const std::string& why : sglang)
      AERIE_LOG(warning) << "export: " << why << (vllm_serves ? "; export --for vllm silences this warning" : "");
    AERIE_LOG(info) << "export: served as trained by " << first_releases(cfg, target, format)
                    << "; docs/formats.md \"Engine releases\" has the table";
  } else {
    EngineRelease first;
    if (first_serving_release(needs, first))
      AERIE_LOG(info) << "export: for " << serving.name() << "; served as trained from "
                      << (serving.engine == ServingEngine::Vllm ? "vLLM " : "SGLang ") << first.str() << " and later";
  }
}

void write_export(const std::string& out_dir, const DraftConfig& cfg, const DraftWeights& weights,
                  const DraftVocab& vocab, const TargetConfig& target, const ServingTarget& engine,
                  const nlohmann::json& source) {
  if (cfg.is_mla()) {
    // vLLM's Eagle3DeepseekV2ForCausalLM has fc(f) without input_norm and hands the pre-norm hidden on.
    AERIE_CHECK(!cfg.norm_before_fc && !cfg.norm_output,
                "export: the MLA draft was trained with " << (cfg.norm_before_fc ? "norm_before_fc" : "norm_output")
                                                          << ", which vLLM's Eagle3DeepseekV2ForCausalLM does not run "
                                                             "(no input_norm; the pre-norm hidden is handed on): it "
                                                             "would serve another draft");
  }
  check_serving_target(cfg, target, engine, "eagle3");
  // The MLA draft keeps vLLM's name for SGLang too: every SGLang release with the MLA draft (0.5.12 to
  // 0.5.23) registers Eagle3DeepseekV2ForCausalLM only (sglang/srt/models/kimi_k25_eagle3.py).
  nlohmann::json config = export_config(cfg, target, engine);
  SafetensorsFile f = export_tensors(cfg, weights, vocab);
  record_export_checkpoint(config, f, source);
  write_export_dir(out_dir, config, f);
}

ExportedDraft load_export(const std::string& dir, int64_t target_num_hidden_layers) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(cfg_path << ": " << e.what());
  }
  // A speculators export (speculators_model_type) holds the Llama layer keys in transformer_layer_config
  // and names the decoder layer layers.0.
  const bool speculators = j.is_object() && j.contains("speculators_model_type");
  ExportedDraft d;
  try {
    d.config = DraftConfig::from_json(speculators ? eagle3_config_from_speculators(j) : j);
  } catch (const Error& e) {
    AERIE_THROW(cfg_path << ": " << e.what());
  }
  if (d.config.aux_layers.empty() && target_num_hidden_layers > 0)
    d.config.aux_layers = default_aux_layers(target_num_hidden_layers);
  if (target_num_hidden_layers > 0) d.config.target_num_hidden_layers = target_num_hidden_layers;

  SafetensorsFile f = load_safetensors(st_path);
  d.weights = DraftWeights::zeros(d.config);
  std::set<std::string> read = {"d2t", "t2d"};
  for (auto& [export_name, t] : d.weights.named()) {
    const std::string name = speculators ? speculators_tensor_name(export_name) : export_name;
    read.insert(name);
    auto it = f.tensors.find(name);
    AERIE_CHECK(it != f.tensors.end(), st_path << ": tensor " << name << " missing");
    it->second.check_shape(t->shape(), st_path + ": " + name);
    AERIE_CHECK(it->second.dtype() == DType::BF16 || it->second.dtype() == DType::F32,
                st_path << ": " << name << " is " << dtype_name(it->second.dtype()) << ", expected BF16 or F32");
    *t = it->second.to(DType::F32);
  }
  // A trained weight the config does not switch on would be dropped silently (vLLM's loader fails on it by a
  // KeyError): the draft was trained as another layer. Other extra tensors (embed_tokens of some exporters)
  // are named in a warning.
  std::vector<std::string> unread;
  for (const auto& [name, t] : f.tensors) {
    if (read.count(name)) continue;
    AERIE_CHECK(name != "input_norm.weight",
                st_path << ": holds input_norm.weight, the trained norm of norm_before_fc, but " << cfg_path
                        << " does not switch norm_before_fc on (config.norm_before_fc or eagle_config.norm_before_fc): "
                           "the draft would run without the norm it was trained with");
    const std::string fc_norm_why =
        d.config.fc_norm ? ", which is not one of the three per-chunk norms fc_norm.{0,1,2}.weight that " + cfg_path +
                               " switches on"
                         : ", a per-chunk norm of fc_norm, but " + cfg_path +
                               " does not switch fc_norm on (config.fc_norm): the draft would run without the norms "
                               "it was trained with";
    AERIE_CHECK(name.rfind("fc_norm.", 0) != 0, st_path << ": holds " << name << fc_norm_why);
    unread.push_back(name);
  }
  if (!unread.empty()) {
    std::string list;
    for (size_t i = 0; i < unread.size() && i < 5; ++i) list += (i ? ", " : "") + unread[i];
    AERIE_LOG(warning) << st_path << ": " << unread.size() << " tensor(s) the draft does not read: " << list
                       << (unread.size() > 5 ? ", ..." : "");
  }
  const int64_t K = d.config.draft_vocab_size, V = d.config.vocab_size;
  auto d2t = f.tensors.find("d2t");
  auto t2d = f.tensors.find("t2d");
  AERIE_CHECK(t2d != f.tensors.end(), st_path << ": t2d missing");
  AERIE_CHECK(d2t != f.tensors.end() || K == V, st_path << ": d2t missing (an export leaves it out only when the draft "
                                                             "vocabulary is the target's, here "
                                                          << K << " of " << V << " ids)");
  t2d->second.check_dtype(DType::U8, st_path + ": t2d");
  t2d->second.check_shape({V}, st_path + ": t2d");
  if (d2t == f.tensors.end()) {
    d.vocab.d2t.assign(static_cast<size_t>(K), 0);  // every target id, each its own draft id
  } else {
    d2t->second.check_dtype(DType::I64, st_path + ": d2t");
    d2t->second.check_shape({K}, st_path + ": d2t");
    d.vocab.d2t.assign(d2t->second.data<int64_t>(), d2t->second.data<int64_t>() + K);
  }
  d.vocab.t2d.assign(t2d->second.data<uint8_t>(), t2d->second.data<uint8_t>() + V);
  // d2t and t2d must describe the same ascending id set.
  std::vector<uint8_t> from_d2t(static_cast<size_t>(V), 0);
  int64_t prev = -1;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t s = i + d.vocab.d2t[static_cast<size_t>(i)];
    AERIE_CHECK(s > prev && s < V, st_path << ": d2t[" << i << "] gives target id " << s << ", not ascending in [0, " << V << ")");
    from_d2t[static_cast<size_t>(s)] = 1;
    prev = s;
  }
  for (int64_t v = 0; v < V; ++v)
    AERIE_CHECK((d.vocab.t2d[static_cast<size_t>(v)] != 0) == (from_d2t[static_cast<size_t>(v)] != 0),
                st_path << ": t2d[" << v << "] disagrees with d2t");
  return d;
}

}  // namespace aerie
