#include "train/serving_engines.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace aerie {

namespace {

// Every fact below was read in the released wheels (pip download --no-deps vllm==X / sglang==Y, the files
// named), over every release from vLLM 0.8.0 to 0.34.0 and SGLang 0.4.3 to 0.5.23; the first release of each
// is the first of those whose code does it. Paths are inside the wheel.
const EngineRelease kNewestVllm{0, 34, 0};
const EngineRelease kNewestSglang{0, 5, 23};
// sglang==0.5.13 srt/models/deepseek_v2.py:2752-2755: a DeepSeek/Kimi target adds 1 to explicit ids only
// when the first is 1; earlier releases add 1 to every id (Llama-family targets do in every release:
// sglang==0.5.23 srt/models/llama.py:929-940).
const EngineRelease kSglangDeepseekFirstIdRule{0, 5, 13};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

ServingNeed need(std::string what, const EngineRelease& first, std::string source) {
  return ServingNeed{std::move(what), true, first, std::move(source)};
}
ServingNeed never(std::string what, std::string source) {
  return ServingNeed{std::move(what), false, EngineRelease{}, std::move(source)};
}

bool is_deepseek_family(const TargetConfig& t) {
  return t.model_type == "deepseek_v3" || t.model_type == "kimi_k2";
}
// The target's family as the engines' EAGLE-3 target lists name it: Kimi-K2.5's wrapper (kimi_k25), else the
// text model's model_type.
std::string target_family(const TargetConfig& t) {
  return t.wrapper_model_type == "kimi_k25" ? t.wrapper_model_type : t.model_type;
}
bool has_default_aux(const DraftConfig& cfg, const TargetConfig& t) {
  return t.num_hidden_layers >= 3 && cfg.aux_layers == default_aux_layers(t.num_hidden_layers);  // none below 3 layers
}
bool has_repeated_aux(const DraftConfig& cfg) {
  for (size_t i = 1; i < cfg.aux_layers.size(); ++i)
    if (std::find(cfg.aux_layers.begin(), cfg.aux_layers.begin() + static_cast<int64_t>(i), cfg.aux_layers[i]) !=
        cfg.aux_layers.begin() + static_cast<int64_t>(i))
      return true;
  return false;
}
bool aux_has_last_output(const DraftConfig& cfg, const TargetConfig& t) {
  return std::find(cfg.aux_layers.begin(), cfg.aux_layers.end(), static_cast<int>(t.num_hidden_layers)) !=
         cfg.aux_layers.end();
}

void vllm_target_needs(const TargetConfig& target, std::vector<ServingNeed>& n) {
  // The eagle3 target list, a substring match on the target's text model_type (vllm==0.10.1
  // vllm/config/__init__.py:2347-2353 "llama", "qwen"; vllm==0.18.0 vllm/config/speculative.py:780-793 adds
  // deepseek_v2/v3, kimi_k2, kimi_k25); from 0.22.0 no list: the target class must be SupportsEagle3, which
  // MistralForCausalLM inherits from LlamaForCausalLM (vllm==0.22.0 vllm/model_executor/models/mistral.py).
  const std::string family = target_family(target);
  if (family == "qwen3")
    n.push_back(need("EAGLE-3 for a qwen3 target", EngineRelease{0, 10, 1},
                     "vllm==0.10.1 vllm/config/__init__.py:2347 (eagle3 target types)"));
  else if (family == "qwen2")  // 0.10.1 lists "qwen" but its Qwen2ForCausalLM is not SupportsEagle3 yet
    n.push_back(need("EAGLE-3 for a qwen2 target", EngineRelease{0, 10, 2},
                     "vllm==0.10.2 vllm/model_executor/models/qwen2.py (SupportsEagle3)"));
  else if (family == "deepseek_v3" || family == "kimi_k2" || family == "kimi_k25")
    n.push_back(need("EAGLE-3 for a " + family + " target", EngineRelease{0, 18, 0},
                     "vllm==0.18.0 vllm/config/speculative.py:780 (eagle3 target types)"));
  else if (family == "qwen3_moe")  // "qwen" in the list; the class SupportsEagle3 from 0.11.1
    n.push_back(need("EAGLE-3 for a qwen3_moe target", EngineRelease{0, 11, 1},
                     "vllm==0.11.1 vllm/model_executor/models/qwen3_moe.py (SupportsEagle3)"));
  else if (family == "mixtral")
    n.push_back(never("EAGLE-3 for a mixtral target",
                      "no released vLLM (0.8.0 to 0.34.0): MixtralForCausalLM is not SupportsEagle3 "
                      "(vllm/model_executor/models/mixtral.py)"));
  else if (family == "mistral")
    n.push_back(need("EAGLE-3 for a mistral target", EngineRelease{0, 22, 0},
                     "vllm==0.22.0 vllm/v1/worker/gpu_model_runner.py:5208 (no target list; SupportsEagle3)"));
  // A multimodal wrapper around the text model: its own class must be SupportsEagle3.
  const std::string& w = target.wrapper_model_type;
  if (w == "llava")
    n.push_back(need("EAGLE-3 for a llava wrapper target", EngineRelease{0, 15, 0},
                     "vllm==0.15.0 vllm/model_executor/models/llava.py (SupportsEagle3)"));
  else if (w == "mistral3")
    n.push_back(need("EAGLE-3 for a mistral3 wrapper target", EngineRelease{0, 16, 0},
                     "vllm==0.16.0 vllm/model_executor/models/mistral3.py (SupportsEagle3)"));
  else if (!w.empty() && w != "kimi_k25")
    n.push_back(never("EAGLE-3 for a " + w + " wrapper target", "not checked in vLLM's released code"));
}

std::vector<ServingNeed> vllm_needs(const DraftConfig& cfg, const TargetConfig& target, const std::string& format) {
  std::vector<ServingNeed> n;
  const bool spec = format == "speculators";
  if (cfg.is_mla())
    n.push_back(need("the MLA draft (Eagle3DeepseekV2ForCausalLM)", EngineRelease{0, 18, 0},
                     "vllm==0.18.0 vllm/model_executor/models/registry.py:558"));
  else if (spec)
    n.push_back(need("the speculators format", EngineRelease{0, 10, 1},
                     "vllm==0.10.1 vllm/transformers_utils/configs/speculators/algos.py:16"));
  else  // 0.10.1 has the registry entry commented out; 0.10.0 renames it Eagle3LlamaForCausalLMEagle3
    n.push_back(need("the architecture LlamaForCausalLMEagle3", EngineRelease{0, 10, 2},
                     "vllm==0.10.2 vllm/model_executor/models/registry.py:283"));
  // Without a query LoRA (q_proj, DeepSeek-V2-Lite's layout) the loader still stacks kv_a_proj_with_mqa into
  // fused_qkv_a_proj, which DeepseekV2MLAAttention builds only with q_lora_rank: no release loads it.
  if (cfg.is_mla() && cfg.q_lora_rank == 0)
    n.push_back(never("an MLA draft without a query LoRA (q_lora_rank null, as its target)",
                      "vllm==0.34.0 vllm/model_executor/models/deepseek_eagle3.py:265 (kv_a_proj_with_mqa -> "
                      "fused_qkv_a_proj; 0.18.0-0.24.0 load_weights likewise)"));
  if (cfg.is_mla() && cfg.rope.type != "default" && cfg.rope.type != "yarn")  // the plain rope is written as YaRN 1
    n.push_back(need("an MLA draft with " + cfg.rope.type + " rope scaling (0.18.0-0.27.1 read any as DeepSeek's YaRN)",
                     EngineRelease{0, 28, 0}, "vllm==0.27.1 vllm/model_executor/models/deepseek_eagle3.py:74"));
  vllm_target_needs(target, n);
  if (!has_default_aux(cfg, target))
    n.push_back(need("aux layers other than the default (2, N/2, N-3)", EngineRelease{0, 11, 1},
                     spec ? "vllm==0.11.1 vllm/transformers_utils/configs/speculators/algos.py:35"
                          : "vllm==0.11.1 vllm/v1/worker/gpu_model_runner.py:3410 (the top-level key)"));
  const bool deepseek = is_deepseek_family(target);
  if (aux_has_last_output(cfg, target))
    n.push_back(deepseek ? need("aux layer N (the last layer's output) of a DeepSeek/Kimi target", EngineRelease{0, 25, 0},
                                "vllm==0.25.0 vllm/model_executor/models/deepseek_v2.py (end_layer capture)")
                         : need("aux layer N (the last layer's output)", EngineRelease{0, 18, 0},
                                "vllm==0.18.0 vllm/model_executor/models/llama.py:426"));
  if (!cfg.aux_layers.empty() && cfg.aux_layers.front() == 0)  // hidden_states + residual with no residual yet
    n.push_back(deepseek ? never("aux layer 0 (the embedding output) of a DeepSeek/Kimi target",
                                 "vllm==0.34.0 vllm/model_executor/models/deepseek_v2.py:1561 (residual None)")
                         : need("aux layer 0 (the embedding output)", EngineRelease{0, 18, 0},
                                "vllm==0.18.0 vllm/model_executor/models/interfaces.py:1290 (residual None)"));
  if (has_repeated_aux(cfg))
    n.push_back(never("a repeated aux layer (each layer is captured once: extract with distinct --aux-layers)",
                      "vllm==0.34.0 vllm/model_executor/models/interfaces.py (_maybe_add_hidden_state: layer_idx in "
                      "aux_hidden_state_layers)"));
  if (cfg.norm_before_residual)
    n.push_back(need("norm_before_residual (EAGLE-3.1; train's default)", EngineRelease{0, 10, 1},
                     "vllm==0.10.1 vllm/model_executor/models/llama_eagle3.py:54"));
  if (cfg.norm_before_fc)
    n.push_back(spec ? need("norm_before_fc", EngineRelease{0, 19, 0},
                            "vllm==0.19.0 vllm/transformers_utils/configs/speculators/algos.py")
                     : need("norm_before_fc", EngineRelease{0, 18, 0},
                            "vllm==0.18.0 vllm/model_executor/models/llama_eagle3.py:153"));
  struct Flag {
    bool on;
    const char* what;
    const char* line;  // in vllm==0.22.0 vllm/model_executor/models/llama_eagle3.py
  };
  for (const Flag& f : {Flag{cfg.norm_output, "norm_output", "221"}, Flag{cfg.fc_norm, "fc_norm", "200"}})
    if (f.on)
      n.push_back(spec ? need(f.what, EngineRelease{0, 25, 0}, "vllm==0.25.0 vllm/transformers_utils/configs/speculators/algos.py")
                       : need(f.what, EngineRelease{0, 22, 0},
                              std::string("vllm==0.22.0 vllm/model_executor/models/llama_eagle3.py:") + f.line));
  if (cfg.sliding_window > 0)  // 0.10.1 indexes layer_types with the target's layer numbers
    n.push_back(need("a sliding window (layer_types, sliding_window)", EngineRelease{0, 10, 2},
                     "vllm==0.10.2 vllm/model_executor/models/llama.py:180"));
  return n;
}

std::vector<ServingNeed> sglang_needs(const DraftConfig& cfg, const TargetConfig& target, const std::string& format) {
  std::vector<ServingNeed> n;
  if (format == "speculators")
    n.push_back(never("the speculators format", "sglang==0.5.23 (loads LlamaForCausalLMEagle3 configs only)"));
  if (cfg.is_mla())
    n.push_back(need("the MLA draft (Eagle3DeepseekV2ForCausalLM)", EngineRelease{0, 5, 12},
                     "sglang==0.5.12 sglang/srt/models/kimi_k25_eagle3.py"));
  else
    n.push_back(need("LlamaForCausalLMEagle3 with a draft vocabulary (d2t)", EngineRelease{0, 4, 4, 0, 2},
                     "sglang==0.4.4.post2 sglang/srt/models/llama_eagle3.py (hot_token_id from d2t)"));
  if (cfg.is_mla() && cfg.q_lora_rank == 0)
    n.push_back(never("an MLA draft without a query LoRA (q_lora_rank null, as its target)",
                      "sglang==0.5.23 sglang/srt/models/kimi_k25_eagle3.py:114 (\"Eagle3 MLA layer requires "
                      "q_lora_rank\"; 0.5.12 on)"));
  // Targets with EAGLE-3 capture (set_eagle3_layers_to_capture); MistralForCausalLM subclasses
  // LlamaForCausalLM in every release (sglang/srt/models/mistral.py).
  const std::string family = target_family(target);
  if (family == "qwen3")
    n.push_back(need("EAGLE-3 for a qwen3 target", EngineRelease{0, 4, 9}, "sglang==0.4.9 sglang/srt/models/qwen3.py:461"));
  else if (family == "qwen2")
    n.push_back(need("EAGLE-3 for a qwen2 target", EngineRelease{0, 5, 2}, "sglang==0.5.2rc0 sglang/srt/models/qwen2.py:630"));
  else if (family == "deepseek_v3" || family == "kimi_k2")
    n.push_back(need("EAGLE-3 for a " + family + " target", EngineRelease{0, 5, 4, 0, 2},
                     "sglang==0.5.4.post2 sglang/srt/models/deepseek_v2.py"));
  else if (family == "qwen3_moe")
    n.push_back(need("EAGLE-3 for a qwen3_moe target", EngineRelease{0, 4, 9},
                     "sglang==0.4.9 sglang/srt/models/qwen3_moe.py (set_eagle3_layers_to_capture)"));
  else if (family == "mixtral")
    n.push_back(never("EAGLE-3 for a mixtral target",
                      "no released SGLang (0.4.3 to 0.5.23): sglang/srt/models/mixtral.py has no "
                      "set_eagle3_layers_to_capture"));
  else if (family == "kimi_k25")
    n.push_back(need("EAGLE-3 for a kimi_k25 target", EngineRelease{0, 5, 10},
                     "sglang==0.5.10rc0 sglang/srt/models/kimi_k25.py"));
  const std::string& w = target.wrapper_model_type;
  if (!w.empty() && w != "kimi_k25")
    n.push_back(never("EAGLE-3 for a " + w + " wrapper target (no set_eagle3_layers_to_capture)",
                      "sglang==0.5.23 sglang/srt/model_executor/attention_backend_setup.py:54"));
  if (!has_default_aux(cfg, target))
    n.push_back(need("aux layers other than the default (2, N/2, N-3)", EngineRelease{0, 4, 9},
                     "sglang==0.4.9 sglang/srt/model_executor/model_runner.py:331 (eagle_config's list)"));
  if (aux_has_last_output(cfg, target))
    n.push_back(never("aux layer N (the last layer's output: captured only before a layer; extract with "
                      "--aux-layers below N for SGLang)",
                      "sglang==0.5.23 sglang/srt/models/llama.py:486-492, deepseek_v2.py:3176"));
  if (has_repeated_aux(cfg))
    n.push_back(never("a repeated aux layer (each layer is captured once: extract with distinct --aux-layers)",
                      "sglang==0.5.23 sglang/srt/models/llama.py:492 (i in layers_to_capture)"));
  const std::string file = cfg.is_mla() ? "sglang/srt/models/kimi_k25_eagle3.py" : "sglang/srt/models/llama_eagle3.py";
  if (cfg.norm_before_residual)
    n.push_back(never("norm_before_residual (EAGLE-3.1; train's default: train with --draft-norm-before-residual=false)",
                      "sglang==0.5.23 " + file + " (residual = hidden_states)"));
  const EngineRelease norms = cfg.is_mla() ? EngineRelease{0, 5, 13} : EngineRelease{0, 5, 12};
  if (cfg.norm_output) n.push_back(need("norm_output", norms, "sglang==" + norms.str() + " " + file));
  if (cfg.fc_norm) n.push_back(need("fc_norm", norms, "sglang==" + norms.str() + " " + file));
  if (cfg.norm_before_fc)
    n.push_back(need("norm_before_fc", EngineRelease{0, 5, 17}, "sglang==0.5.17 sglang/srt/models/llama_eagle3.py:165"));
  if (cfg.sliding_window > 0)
    n.push_back(never("a sliding window of " + std::to_string(cfg.sliding_window) +
                          " keys (train without --draft-sliding-window for SGLang)",
                      "sglang==0.5.23 sglang/srt/models/llama.py (the draft config's sliding_window and layer_types "
                      "are not read)"));
  return n;
}

}  // namespace

EngineRelease EngineRelease::parse(const std::string& s) {
  EngineRelease r;
  int* parts[4] = {&r.major, &r.minor, &r.patch, &r.extra};
  size_t i = 0;
  auto number = [&](int& v) {
    v = 0;
    const size_t start = i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      AERIE_CHECK(v < 100000, "engine release '" << s << "' is not a release number such as 0.18.0");
      v = v * 10 + (s[i] - '0');
    }
    return i > start;
  };
  auto digit_at = [&](size_t k) { return k < s.size() && std::isdigit(static_cast<unsigned char>(s[k])); };
  int k = 0;
  while (k < 4 && number(*parts[k])) {
    ++k;
    if (k < 4 && s[i] == '.' && digit_at(i + 1)) ++i;
    else break;
  }
  bool ok = k >= 2;
  // PEP 440's suffixes: a pre-release ("rc1", "a2", "b3") and a development release (".dev0") count as their
  // release (flagged: the log says so), ".postN" after it; a local version ("+cu130") is ignored.
  auto word = [&](const char* w) {
    const size_t n = std::char_traits<char>::length(w);
    if (s.compare(i, n, w) != 0 || !digit_at(i + n)) return false;
    i += n;
    return true;
  };
  int ignored = 0;
  if (ok && (word("rc") || word("a") || word("b") || word("c"))) {
    r.prerelease = true;
    number(ignored);
  }
  if (ok && word(".post")) number(r.post);
  if (ok && (word(".dev") || word("dev"))) {
    r.prerelease = true;
    number(ignored);
  }
  ok = ok && (i == s.size() || s[i] == '+');
  AERIE_CHECK(ok, "engine release '" << s << "' is not a release number such as 0.18.0");
  return r;
}

std::string EngineRelease::str() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch) +
         (extra > 0 ? std::string(".") + std::to_string(extra) : "") +
         (post > 0 ? std::string(".post") + std::to_string(post) : "");
}

EngineRelease newest_checked_release(ServingEngine engine) {
  return engine == ServingEngine::Sglang ? kNewestSglang : kNewestVllm;
}

EngineRelease ServingTarget::effective_release() const {
  return has_release ? release : newest_checked_release(engine);
}

std::string ServingTarget::name() const {
  if (engine == ServingEngine::Any) return "any engine";
  const std::string e = engine == ServingEngine::Vllm ? "vLLM " : "SGLang ";
  if (!has_release) return e + effective_release().str() + " (the newest release aerie checked)";
  return e + given + (given != release.str() ? " (taken as " + release.str() + ")" : "");
}

ServingTarget serving_target_from_string(const std::string& value) {
  // Blanks around the value and around "==" (a quoted "vllm == 0.18.0") are not part of it.
  std::string s;
  for (char c : value)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  const size_t eq = s.find("==");
  const std::string engine = lower(s.substr(0, eq));
  ServingTarget t;
  if (engine == "any") t.engine = ServingEngine::Any;
  else if (engine == "vllm") t.engine = ServingEngine::Vllm;
  else if (engine == "sglang") t.engine = ServingEngine::Sglang;
  else AERIE_THROW("export: --for " << s << ": want any, vllm or sglang, optionally with a release (vllm==0.18.0)");
  if (eq != std::string::npos) {
    AERIE_CHECK(t.engine != ServingEngine::Any, "export: --for " << s << ": 'any' has no release (--for vllm==X or "
                                                                 "sglang==Y)");
    try {
      t.given = s.substr(eq + 2);
      t.release = EngineRelease::parse(t.given);
    } catch (const Error& e) {
      AERIE_THROW("export: --for " << s << ": " << e.what());
    }
    t.has_release = true;
  }
  return t;
}

ServingEngine serving_engine_from_string(const std::string& s) { return serving_target_from_string(s).engine; }

std::vector<ServingNeed> serving_needs(const DraftConfig& cfg, const TargetConfig& target, ServingEngine engine,
                                       const std::string& format) {
  if (engine == ServingEngine::Vllm) return vllm_needs(cfg, target, format);
  if (engine == ServingEngine::Sglang) return sglang_needs(cfg, target, format);
  return {};
}

bool first_serving_release(const std::vector<ServingNeed>& needs, EngineRelease& first) {
  first = EngineRelease{};
  for (const ServingNeed& n : needs) {
    if (!n.first_release_known) return false;
    first = std::max(first, n.first_release);
  }
  return true;
}

std::vector<std::string> unmet_serving_needs(const std::vector<ServingNeed>& needs, const ServingTarget& target) {
  std::vector<std::string> out;
  if (target.engine == ServingEngine::Any) return out;
  const EngineRelease r = target.effective_release();
  const std::string engine = target.engine == ServingEngine::Vllm ? "vLLM" : "SGLang";
  for (const ServingNeed& n : needs) {
    if (n.first_release_known && !(r < n.first_release)) continue;
    out.push_back(n.first_release_known
                      ? engine + " " + r.str() + " does not serve " + n.what + ": the first release that does is " +
                            n.first_release.str() + "; read in " + n.source
                      : "no " + engine + " release aerie checked (up to " + newest_checked_release(target.engine).str() +
                            ") serves " + n.what + "; read in " + n.source);
  }
  return out;
}

bool eagle_config_aux_ids(const std::vector<int>& aux, const TargetConfig& target, const ServingTarget& serving,
                          std::vector<int>& ids, std::string& why) {
  const EngineRelease release =
      serving.engine == ServingEngine::Sglang ? serving.effective_release() : newest_checked_release(ServingEngine::Sglang);
  const bool first_id_rule = is_deepseek_family(target) && !(release < kSglangDeepseekFirstIdRule);
  why.clear();
  ids.clear();
  for (int a : aux) ids.push_back(a - 1);
  auto list = [](const std::vector<int>& v) { return nlohmann::json(v).dump(); };
  if (!first_id_rule) {  // every id + 1: the output-of-layer convention (SpecForge's)
    if (std::find(aux.begin(), aux.end(), 0) == aux.end()) return true;
    why = "SGLang " + release.str() + " adds 1 to every aux id of a " + target_family(target) +
          " target, so the embedding output (aux layer 0) cannot be named to it: extract with --aux-layers >= 1 "
          "and train on those shards";
    return false;
  }
  if (!aux.empty() && aux.front() == 2) return true;  // [1, ...]: +1 as the first id is 1
  ids = aux;
  if (aux.empty() || aux.front() != 1) return true;   // as written
  // [1, b, c]: only the first id is tested and the layers are captured in layer order, so [b, 1, c] captures
  // layers 1, b, c as trained.
  const auto other = std::find_if(ids.begin(), ids.end(), [](int a) { return a != 1; });
  if (other != ids.end()) {
    std::iter_swap(ids.begin(), other);
    return true;
  }
  std::vector<int> plus(aux);
  for (int& a : plus) ++a;
  why = "SGLang " + release.str() + " reads a " + target_family(target) + " target's aux ids whose first id is 1 "
        "as output-of-layer ids (+1): " + list(aux) + " would capture the inputs of layers " + list(plus);
  return false;
}

}  // namespace aerie
