// Which releases of vLLM and SGLang serve an export as trained (`aerie export --for vllm==X`), read from the
// released wheels' code (pip download --no-deps vllm==X / sglang==Y; each fact names its release and file in
// serving_engines.cc and in docs/formats.md "Engine releases").
#pragma once
#include <string>
#include <vector>

#include "model/draft.h"
#include "model/target_config.h"

namespace aerie {

/// The serving engine an export is written for (`aerie export --for`; docs/formats.md "Engine releases").
/// Both read aux ids as inputs of decoder layer k (aerie's convention), from different keys:
///  - vLLM (0.11.1 on) the draft config's top-level eagle_aux_hidden_state_layer_ids, as written;
///  - SGLang (0.4.9 on) eagle_config.eagle_aux_hidden_state_layer_ids only, adding 1 to every id for
///    Llama-family targets (all releases) and DeepSeek/Kimi targets before 0.5.13; from 0.5.13 a DeepSeek/
///    Kimi target adds 1 only when the first id is 1 (eagle_config_aux_ids writes the list accordingly).
enum class ServingEngine { Any, Vllm, Sglang };

/// A release number as PEP 440 writes it, "MAJOR.MINOR[.PATCH[.N]][{a|b|rc}N][.postN][.devN][+local]" (a
/// missing PATCH is 0). A pre-release or development release counts as its release (0.5.2rc0 as 0.5.2;
/// `prerelease` says it was one); the local part is ignored. Compared numerically, post last.
struct EngineRelease {
  int major = 0, minor = 0, patch = 0, extra = 0, post = 0;
  bool prerelease = false;  // not compared
  /// Parses "0.18.0", "0.18", "0.10.1.1", "0.5.14.post1", "0.10.1rc1", "0.18.0.dev3+cu130". Throws
  /// aerie::Error naming `s` otherwise.
  static EngineRelease parse(const std::string& s);
  std::string str() const;  // "0.18.0", "0.10.1.1", "0.4.4.post2"
  friend bool operator<(const EngineRelease& a, const EngineRelease& b) {
    if (a.major != b.major) return a.major < b.major;
    if (a.minor != b.minor) return a.minor < b.minor;
    if (a.patch != b.patch) return a.patch < b.patch;
    return a.extra != b.extra ? a.extra < b.extra : a.post < b.post;
  }
  friend bool operator==(const EngineRelease& a, const EngineRelease& b) {
    return !(a < b) && !(b < a);
  }
};

/// The newest release of each engine whose code aerie's export was checked against (what `--for vllm`
/// without a release means).
EngineRelease newest_checked_release(ServingEngine engine);

/// What `aerie export --for` names: an engine and, optionally, its release ("vllm==0.16.0").
struct ServingTarget {
  ServingEngine engine = ServingEngine::Any;
  bool has_release = false;  // false: the newest checked release (newest_checked_release)
  EngineRelease release;
  std::string given;  // the release as --for spelled it ("0.18.0rc1"); "" without one
  ServingTarget(ServingEngine e = ServingEngine::Any) : engine(e) {}  // NOLINT: an engine is a target
  /// The release the export is checked against: the given one, else newest_checked_release(engine).
  EngineRelease effective_release() const;
  /// "vLLM 0.16.0", "vLLM 0.18.0rc1 (taken as 0.18.0)", "SGLang 0.5.23 (the newest release aerie checked)",
  /// "any engine".
  std::string name() const;
};

/// Parses "any", "vllm", "sglang", "vllm==0.18.0", "sglang==0.5.14" (case-insensitive engine name; blanks
/// ignored).
/// Throws aerie::Error naming the value otherwise (also for "any==X": any has no release).
ServingTarget serving_target_from_string(const std::string& s);
/// The engine of serving_target_from_string(s).
ServingEngine serving_engine_from_string(const std::string& s);

/// One thing of an export that an engine must read as trained, and the first release of that engine that
/// does (`first_release_known` false: no release read does).
struct ServingNeed {
  std::string what;    // e.g. "a deepseek_v3 target", "norm_before_residual"
  bool first_release_known = false;
  EngineRelease first_release;
  std::string source;  // the released file that shows it, e.g. "vllm==0.18.0 vllm/config/speculative.py"
};

/// Every need of an export of draft `cfg` for `target` in `format` ("eagle3" or "speculators") that
/// `engine` (Vllm or Sglang) must meet, with the first release meeting it. Any: empty.
std::vector<ServingNeed> serving_needs(const DraftConfig& cfg, const TargetConfig& target, ServingEngine engine,
                                       const std::string& format = "eagle3");

/// The first release of `engine` that meets every need (false when some need has none).
bool first_serving_release(const std::vector<ServingNeed>& needs, EngineRelease& first);

/// The sentences of the needs that `target`'s release does not meet, each naming the first release that
/// does ("" when every need is met). For ServingEngine::Any: "".
std::vector<std::string> unmet_serving_needs(const std::vector<ServingNeed>& needs, const ServingTarget& target);

/// The list to write as eagle_config.eagle_aux_hidden_state_layer_ids so that SGLang at `serving`'s release
/// (the newest checked for Any and Vllm, which do not read it) captures aerie's `aux` (inputs of decoder
/// layer k) of `target`: aux - 1 where SGLang adds 1 to every id (Llama-family targets; DeepSeek/Kimi
/// before 0.5.13), for DeepSeek/Kimi from 0.5.13 aux - 1 when aux starts at 2 (read +1 as its first id is
/// 1) else aux as written. Returns false, with `why` saying what SGLang would capture and which aux layers
/// it can capture, when no list does (an id 0 where every id gets +1; a DeepSeek/Kimi list starting at 1
/// from 0.5.13 on); `ids` then holds aux - 1 (or aux) as the nearest list.
bool eagle_config_aux_ids(const std::vector<int>& aux, const TargetConfig& target, const ServingTarget& serving,
                          std::vector<int>& ids, std::string& why);

}  // namespace aerie
