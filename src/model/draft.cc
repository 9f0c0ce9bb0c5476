// DraftConfig (from the target, to/from the export config.json), DraftWeights (names, zeros, init),
// the TTT sample (target distribution from the stored final hidden states) and the valid counts.
// Math: /work/shared/docs/eagle3.md sections 2-5.
#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "model/draft.h"
#include "kernels/rope.h"
#include "model/rope_config.h"

namespace aerie {

namespace {

int64_t get_int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  AERIE_CHECK(it != j.end() && it->is_number_integer(), "draft config: missing or non-integer field '" << key << "'");
  return it->get<int64_t>();
}

// Deterministic U(-bound, bound) from mt19937_64, independent of the standard library's distributions
// (std::uniform_real_distribution is implementation-defined): 53 random bits -> [0, 1).
void fill_uniform(Tensor& t, double bound, std::mt19937_64& rng) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    p[i] = static_cast<float>(bound * (2.0 * u - 1.0));
  }
}

}  // namespace

DraftConfig DraftConfig::from_target(const TargetConfig& t, int64_t K, std::vector<int> aux_layers, bool mla) {
  AERIE_CHECK(K > 0 && K <= t.vocab_size, "draft_vocab_size " << K << " must be in (0, V = " << t.vocab_size << "]");
  AERIE_CHECK(aux_layers.size() == 3, "draft config: need 3 aux layers, got " << aux_layers.size());
  for (int a : aux_layers)
    AERIE_CHECK(a >= 0 && a <= t.num_hidden_layers,
                "draft config: aux layer " << a << " outside [0, " << t.num_hidden_layers << "]");
  DraftConfig c;
  c.hidden_size = t.hidden_size;
  c.target_hidden_size = t.hidden_size;
  c.num_attention_heads = t.num_attention_heads;
  c.num_key_value_heads = t.num_key_value_heads;
  c.head_dim = t.head_dim;
  if (t.mla.enabled()) {
    // An MLA target's head_dim is its rotary width (DeepseekV3Config: qk_rope_head_dim, 64), not an
    // attention head: the draft is a Llama layer with the target's heads of v_head_dim (128) each and as
    // many kv heads, SpecForge's Kimi-K2/K2.5 draft shape (64 x 128, 64 kv heads, intermediate 18432).
    c.head_dim = t.mla.v_head_dim;
    c.num_key_value_heads = t.num_attention_heads;
  }
  if (mla) {
    AERIE_CHECK(t.mla.enabled(), "the MLA draft needs a target with MLA attention (DeepSeek-V3 / Kimi-K2: "
                                 "kv_lora_rank in its config.json); this target has none: use the Llama draft");
    // A target without a query LoRA (DeepSeek-V2-Lite: q_proj) still gets a draft with one, of kv_lora_rank: no
    // engine release loads an MLA draft without it (src/train/serving_engines.cc), and the draft is trained anew.
    c.q_lora_rank = t.mla.q_lora_rank > 0 ? t.mla.q_lora_rank : t.mla.kv_lora_rank;
    c.kv_lora_rank = t.mla.kv_lora_rank;
    c.qk_nope_head_dim = t.mla.qk_nope_head_dim;
    c.qk_rope_head_dim = t.mla.qk_rope_head_dim;
    c.v_head_dim = t.mla.v_head_dim;
    c.head_dim = t.mla.qk_rope_head_dim;  // DeepseekV3Config's head_dim
    c.num_key_value_heads = t.num_attention_heads;
  }
  c.intermediate_size = t.intermediate_size;
  c.vocab_size = t.vocab_size;
  c.draft_vocab_size = K;
  c.max_position_embeddings = t.max_position_embeddings;
  c.rms_norm_eps = t.rms_norm_eps;
  c.rope = t.rope;
  // In the 4.x spelling (a transformers 5.x target's rope_parameters converted), so that the draft config
  // written to checkpoints and exports reads back as the same rope.
  c.rope_scaling = rope_scaling_4x(t.raw);
  c.aux_layers = std::move(aux_layers);
  c.target_num_hidden_layers = t.num_hidden_layers;
  return c;
}

float DraftConfig::softmax_scale() const {
  // The MLA draft's as the target's MLA (arch_deepseek.cc); the Llama draft's 1/sqrt(head_dim).
  return static_cast<float>(is_mla() ? mla_softmax_scale(rope, attn_qk_dim())
                                     : 1.0 / std::sqrt(static_cast<double>(head_dim)));
}

nlohmann::json DraftConfig::to_json() const {
  nlohmann::json j;
  if (is_mla()) {
    // vLLM's Eagle3DeepseekV2ForCausalLM (model_executor/models/deepseek_eagle3.py) takes a DeepseekV2Config or
    // a DeepseekV3Config; the decoder layer always uses the dense MLP of intermediate_size, never MoE. The
    // model_type is deepseek_v2: every vLLM release 0.18.0 to 0.34.0 turns a draft of model_type deepseek_v3
    // into DeepSeek's MTP module (config/speculative.py, hf_config_override: "Eagle3DeepSeekMTPModel ... not
    // supported", seen with vLLM 0.26.0 on an H100), and transformers' DeepseekV2Config has every MLA field.
    j["architectures"] = {"Eagle3DeepseekV2ForCausalLM"};
    j["model_type"] = "deepseek_v2";
    j["q_lora_rank"] = q_lora_rank > 0 ? nlohmann::json(q_lora_rank) : nlohmann::json();
    j["kv_lora_rank"] = kv_lora_rank;
    j["qk_nope_head_dim"] = qk_nope_head_dim;
    j["qk_rope_head_dim"] = qk_rope_head_dim;
    j["v_head_dim"] = v_head_dim;
    j["rope_interleave"] = true;  // transformers' DeepseekV3Config: the interleaved rope of the checkpoints
    // No MoE in the draft: 0 routed experts. Both engines build the dense DeepseekV2MLP regardless (vLLM 0.26.0
    // model_executor/models/deepseek_eagle3.py, SGLang 0.5.21 srt/models/kimi_k25_eagle3.py); null is refused by
    // transformers 5's DeepseekV3Config (a strict dataclass, n_routed_experts: int), which vLLM parses it with.
    j["n_routed_experts"] = 0;
    j["first_k_dense_replace"] = 1;
  } else {
    j["architectures"] = {"LlamaForCausalLMEagle3"};
    j["model_type"] = "llama";
  }
  j["hidden_size"] = hidden_size;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = 1;
  j["rms_norm_eps"] = rms_norm_eps;
  j["vocab_size"] = vocab_size;
  j["draft_vocab_size"] = draft_vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope.theta;
  j["rope_scaling"] = rope_scaling;
  if (is_mla() && rope.type == "default") {
    // vLLM 0.18.0-0.27.1 (model_executor/models/deepseek_eagle3.py) turn any truthy rope_scaling of an MLA draft
    // into "deepseek_yarn", and transformers 5 (vLLM 0.26.0 needs >= 5.5.3) fills an absent one with
    // {"rope_type": "default", ...}: the engine then reads a YaRN factor that is not there. A YaRN of factor 1 is
    // the plain rope in every reader (the interpolated and extrapolated frequencies agree, mscale 1).
    j["rope_scaling"] = {{"type", "yarn"},     {"factor", 1.0}, {"original_max_position_embeddings", max_position_embeddings},
                         {"beta_fast", 32},    {"beta_slow", 1}, {"mscale", 1.0},
                         {"mscale_all_dim", 1.0}};
  }
  j["tie_word_embeddings"] = false;
  j["torch_dtype"] = "bfloat16";
  j["hidden_act"] = "silu";
  if (target_hidden_size != hidden_size) j["target_hidden_size"] = target_hidden_size;
  if (norm_before_residual) j["norm_before_residual"] = true;  // vLLM: getattr(config, ..., False)
  if (norm_output) j["norm_output"] = true;                    // vLLM, SGLang: getattr(config, ..., False)
  // vLLM and SGLang: eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False)); written at
  // the top level, where speculators' config and vLLM's speculators reader (algos.py) keep it too.
  if (norm_before_fc) j["norm_before_fc"] = true;
  if (fc_norm) j["fc_norm"] = true;  // SpecForge's LlamaForCausalLMEagle3: getattr(config, "fc_norm", False)
  if (sliding_window > 0) {  // vLLM's LlamaAttention: layer_types[layer - target_layer_count] == "sliding_attention"
    j["sliding_window"] = sliding_window;
    j["layer_types"] = {"sliding_attention"};
    j["use_sliding_window"] = true;  // speculators' transformer_layer_config writes it too
  }
  // vLLM's default ids exist from N = 3 layers on; a smaller target always gets its ids written.
  bool is_default = target_num_hidden_layers >= 3 && aux_layers == default_aux_layers(target_num_hidden_layers);
  if (!aux_layers.empty() && !is_default) j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = aux_layers;
  j["aerie"] = {{"aux_layers", aux_layers},
                {"aux_layer_convention", "input of decoder layer k (vLLM); SpecForge's ids are these minus 1"},
                {"target_num_hidden_layers", target_num_hidden_layers}};
  return j;
}

DraftConfig DraftConfig::from_json(const nlohmann::json& j) {
  DraftConfig c;
  // One decoder layer: a config of more (a multi-layer EAGLE-3 draft) would be read as its first layer alone.
  AERIE_CHECK(!j.contains("num_hidden_layers") || !j["num_hidden_layers"].is_number_integer() ||
                  j["num_hidden_layers"].get<int64_t>() == 1,
              "draft config: num_hidden_layers " << j["num_hidden_layers"].dump()
                                                 << ": aerie's drafts have one decoder layer (midlayer)");
  c.hidden_size = get_int(j, "hidden_size");
  c.target_hidden_size = j.contains("target_hidden_size") ? get_int(j, "target_hidden_size") : c.hidden_size;
  c.num_attention_heads = get_int(j, "num_attention_heads");
  c.num_key_value_heads =
      j.contains("num_key_value_heads") ? get_int(j, "num_key_value_heads") : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? get_int(j, "head_dim")
                                                                  : c.hidden_size / c.num_attention_heads;
  // The layer: architectures names it when given (vLLM's MLA draft class, its V3 alias, SGLang's names),
  // and the MLA fields must agree with it.
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  const bool mla_arch = arch == "Eagle3DeepseekV2ForCausalLM" || arch == "Eagle3DeepseekV3ForCausalLM" ||
                        arch == "DeepseekV2ForCausalLMEagle3" || arch == "DeepseekV3ForCausalLMEagle3";
  const bool has_lora = j.contains("kv_lora_rank") && !j["kv_lora_rank"].is_null();
  AERIE_CHECK(!mla_arch || has_lora, "draft config: architectures " << arch
                                                                    << " is an MLA draft, but kv_lora_rank is missing");
  AERIE_CHECK(!has_lora || arch.empty() || mla_arch,
              "draft config: kv_lora_rank is set (an MLA draft) but architectures is " << arch
                                                                                       << " (the MLA draft is "
                                                                                          "Eagle3DeepseekV2ForCausalLM)");
  if (has_lora) {  // the MLA draft (DeepseekV3Config fields)
    c.kv_lora_rank = get_int(j, "kv_lora_rank");
    c.q_lora_rank = j.contains("q_lora_rank") && !j["q_lora_rank"].is_null() ? get_int(j, "q_lora_rank") : 0;
    c.qk_nope_head_dim = get_int(j, "qk_nope_head_dim");
    c.qk_rope_head_dim = get_int(j, "qk_rope_head_dim");
    c.v_head_dim = get_int(j, "v_head_dim");
    AERIE_CHECK(c.kv_lora_rank > 0 && c.q_lora_rank >= 0 && c.qk_nope_head_dim > 0 && c.qk_rope_head_dim > 0 &&
                    c.qk_rope_head_dim % 2 == 0 && c.v_head_dim > 0 &&
                    c.v_head_dim <= c.qk_nope_head_dim + c.qk_rope_head_dim,
                "draft config: MLA sizes kv_lora_rank " << c.kv_lora_rank << ", q_lora_rank " << c.q_lora_rank
                                                        << ", qk_nope_head_dim " << c.qk_nope_head_dim
                                                        << ", qk_rope_head_dim " << c.qk_rope_head_dim << ", v_head_dim "
                                                        << c.v_head_dim
                                                        << " (positive, rope even, v_head_dim <= nope + rope)");
    c.head_dim = c.qk_rope_head_dim;
    c.num_key_value_heads = c.num_attention_heads;
  }
  c.intermediate_size = get_int(j, "intermediate_size");
  c.vocab_size = get_int(j, "vocab_size");
  c.draft_vocab_size = j.contains("draft_vocab_size") ? get_int(j, "draft_vocab_size") : c.vocab_size;
  c.max_position_embeddings = get_int(j, "max_position_embeddings");
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-5);
  c.rope = rope_params_from_config(j, c.max_position_embeddings, "draft config");
  c.rope_scaling = j.contains("rope_scaling") ? j["rope_scaling"] : nlohmann::json();
  if (j.contains("norm_before_residual")) {
    AERIE_CHECK(j["norm_before_residual"].is_boolean(),
                "draft config: norm_before_residual must be true or false, got " << j["norm_before_residual"].dump());
    c.norm_before_residual = j["norm_before_residual"].get<bool>();
  }
  if (j.contains("norm_output")) {
    AERIE_CHECK(j["norm_output"].is_boolean(),
                "draft config: norm_output must be true or false, got " << j["norm_output"].dump());
    c.norm_output = j["norm_output"].get<bool>();
  }
  // The sliding window, as vLLM reads it: layer_types names the layer's kind (one layer), sliding_window its
  // width; a sliding_window without layer_types is not applied (vLLM's LlamaAttention).
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const nlohmann::json& lt = j["layer_types"];
    AERIE_CHECK(lt.is_array() && lt.size() == 1 && lt[0].is_string(),
                "draft config: layer_types must list the one draft layer's kind, got " << lt.dump());
    const std::string kind = lt[0].get<std::string>();
    AERIE_CHECK(kind == "full_attention" || kind == "sliding_attention",
                "draft config: layer_types[0] is '" << kind << "' (full_attention or sliding_attention)");
    if (kind == "sliding_attention") {
      AERIE_CHECK(j.contains("sliding_window") && j["sliding_window"].is_number_integer() &&
                      j["sliding_window"].get<int64_t>() > 0,
                  "draft config: layer_types is sliding_attention but sliding_window is "
                      << (j.contains("sliding_window") ? j["sliding_window"].dump() : std::string("missing"))
                      << " (want a positive integer number of keys)");
      c.sliding_window = j["sliding_window"].get<int64_t>();
    }
  }
  // norm_before_fc: eagle_config's key first, then the top level's (vLLM's and SGLang's reading; NVIDIA's
  // EAGLE-3 checkpoints keep it in eagle_config).
  for (const nlohmann::json* src : {&j, j.contains("eagle_config") && j["eagle_config"].is_object() ? &j["eagle_config"]
                                                                                                     : nullptr}) {
    if (!src || !src->contains("norm_before_fc")) continue;
    const nlohmann::json& v = (*src)["norm_before_fc"];
    AERIE_CHECK(v.is_boolean(), "draft config: " << (src == &j ? "" : "eagle_config.")
                                                 << "norm_before_fc must be true or false, got " << v.dump());
    c.norm_before_fc = v.get<bool>();  // eagle_config's, read last, wins
  }
  if (j.contains("fc_norm") && !j["fc_norm"].is_null()) {
    AERIE_CHECK(j["fc_norm"].is_boolean(), "draft config: fc_norm must be true or false, got " << j["fc_norm"].dump());
    c.fc_norm = j["fc_norm"].get<bool>();
  }
  if (j.contains("aerie")) {
    const auto& a = j["aerie"];
    c.aux_layers = a.value("aux_layers", std::vector<int>{});
    c.target_num_hidden_layers = a.value("target_num_hidden_layers", int64_t{0});
  } else if (j.contains("eagle_aux_hidden_state_layer_ids") && j["eagle_aux_hidden_state_layer_ids"].is_array()) {
    // vLLM's key (its capture list; aerie's exports write it always, in aerie's convention); eagle_config's
    // may hold SGLang's convention of an older release (export --for sglang==X).
    c.aux_layers = j["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>();
  } else if (j.contains("eagle_config") && j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    c.aux_layers = j["eagle_config"]["eagle_aux_hidden_state_layer_ids"].get<std::vector<int>>();
  }
  AERIE_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
              "draft config: num_attention_heads " << c.num_attention_heads << " not a multiple of num_key_value_heads "
                                                   << c.num_key_value_heads);
  AERIE_CHECK(c.draft_vocab_size > 0 && c.draft_vocab_size <= c.vocab_size,
              "draft config: draft_vocab_size " << c.draft_vocab_size << " outside (0, " << c.vocab_size << "]");
  AERIE_CHECK(!(c.fc_norm && c.norm_before_fc),
              "draft config: fc_norm (one norm per aux chunk) and norm_before_fc (one norm over the concatenation) "
              "are both on; a draft has one of them (speculators refuses the pair)");
  AERIE_CHECK(!(c.is_mla() && c.fc_norm),
              "draft config: an MLA draft with fc_norm (vLLM's Eagle3DeepseekV2ForCausalLM has fc(f) without norms)");
  AERIE_CHECK(!(c.is_mla() && c.sliding_window > 0),
              "draft config: an MLA draft with a sliding window (" << c.sliding_window
                                                                   << "): vLLM's Eagle3DeepseekV2ForCausalLM has none");
  return c;
}

std::vector<std::pair<std::string, Tensor*>> DraftWeights::named() {
  std::vector<std::pair<std::string, Tensor*>> out = {{"fc.weight", &fc}};
  if (kv_a_proj_with_mqa.defined()) {  // the MLA draft: vLLM's DeepseekV2MLAAttention names
    if (q_a_proj.defined()) {
      out.emplace_back("midlayer.self_attn.q_a_proj.weight", &q_a_proj);
      out.emplace_back("midlayer.self_attn.q_a_layernorm.weight", &q_a_layernorm);
      out.emplace_back("midlayer.self_attn.q_b_proj.weight", &q_b_proj);
    } else {
      out.emplace_back("midlayer.self_attn.q_proj.weight", &q_proj);
    }
    out.emplace_back("midlayer.self_attn.kv_a_proj_with_mqa.weight", &kv_a_proj_with_mqa);
    out.emplace_back("midlayer.self_attn.kv_a_layernorm.weight", &kv_a_layernorm);
    out.emplace_back("midlayer.self_attn.kv_b_proj.weight", &kv_b_proj);
  } else {
    out.emplace_back("midlayer.self_attn.q_proj.weight", &q_proj);
    out.emplace_back("midlayer.self_attn.k_proj.weight", &k_proj);
    out.emplace_back("midlayer.self_attn.v_proj.weight", &v_proj);
  }
  const std::vector<std::pair<std::string, Tensor*>> rest = {
      {"midlayer.self_attn.o_proj.weight", &o_proj},
      {"midlayer.mlp.gate_proj.weight", &gate_proj},
      {"midlayer.mlp.up_proj.weight", &up_proj},
      {"midlayer.mlp.down_proj.weight", &down_proj},
      {"midlayer.input_layernorm.weight", &input_layernorm},
      {"midlayer.hidden_norm.weight", &hidden_norm},
      {"midlayer.post_attention_layernorm.weight", &post_attention_layernorm},
      {"norm.weight", &norm},
      {"lm_head.weight", &lm_head}};
  out.insert(out.end(), rest.begin(), rest.end());
  // EAGLE-3.1's norm_before_fc: vLLM loads "input_norm.weight" as model.input_norm, SGLang likewise,
  // speculators' Eagle3DraftModel has input_norm at the top level.
  if (input_norm.defined()) out.emplace_back("input_norm.weight", &input_norm);
  // EAGLE-3.1's per-chunk norms: SpecForge's nn.ModuleList fc_norm at the top level.
  if (fc_norm[0].defined())
    for (int k = 0; k < 3; ++k) out.emplace_back("fc_norm." + std::to_string(k) + ".weight", &fc_norm[k]);
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> DraftWeights::named() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (auto& [n, t] : const_cast<DraftWeights*>(this)->named()) out.emplace_back(n, t);
  return out;
}

std::vector<std::string> DraftWeights::names(const DraftConfig& c) {
  DraftWeights w;  // one-element placeholders in the tensors cfg's layout defines
  const Tensor one = Tensor::empty({1}, DType::F32);
  w.fc = w.o_proj = w.gate_proj = w.up_proj = w.down_proj = w.lm_head = one;
  w.input_layernorm = w.hidden_norm = w.post_attention_layernorm = w.norm = one;
  if (c.is_mla()) {
    w.kv_a_proj_with_mqa = w.kv_a_layernorm = w.kv_b_proj = one;
    if (c.q_lora_rank > 0)
      w.q_a_proj = w.q_a_layernorm = w.q_b_proj = one;
    else
      w.q_proj = one;
  } else {
    w.q_proj = w.k_proj = w.v_proj = one;
  }
  if (c.norm_before_fc) w.input_norm = one;
  if (c.fc_norm) w.fc_norm[0] = w.fc_norm[1] = w.fc_norm[2] = one;
  std::vector<std::string> out;
  for (const auto& [name, t] : w.named()) out.push_back(name);
  return out;
}

DraftWeights DraftWeights::to_device(Device device) const {
  DraftWeights out = *this;  // the same tensors defined, so that named() lists the same entries
  auto dst = out.named();
  auto src = named();
  for (size_t i = 0; i < src.size(); ++i) *dst[i].second = src[i].second->to_device(device);
  return out;
}

namespace {
// The matrices of a DraftWeights (the GEMM weights: the 2-D entries), in named() order.
std::vector<Tensor*> matrices(DraftWeights& w) {
  std::vector<Tensor*> out;
  for (auto& [name, t] : w.named())
    if (t->ndim() == 2) out.push_back(t);
  return out;
}
}  // namespace

DraftWeights DraftWeights::compute_copy(DType dtype) const {
  AERIE_CHECK(dtype == DType::F32 || dtype == DType::BF16,
              "DraftWeights::compute_copy: dtype must be F32 or BF16, got " << dtype_name(dtype));
  DraftWeights c = *this;  // shares every tensor (the norm weights stay shared)
  if (dtype == DType::F32) return c;
  for (Tensor* m : matrices(c)) {
    m->check_dtype(DType::F32, "DraftWeights::compute_copy: master weight");
    *m = Tensor::empty(m->shape(), dtype, m->device());
  }
  refresh_compute_copy(c);
  return c;
}

void DraftWeights::refresh_compute_copy(DraftWeights& compute) const {
  // The norm weights (1-D entries of named()): shared F32 storage, whatever compute held before.
  {
    auto src = const_cast<DraftWeights&>(*this).named(), dst = compute.named();
    AERIE_CHECK(src.size() == dst.size(), "DraftWeights::refresh_compute_copy: " << dst.size() << " tensors for "
                                                                                 << src.size() << " masters");
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i].second->ndim() == 1) *dst[i].second = *src[i].second;
  }
  std::vector<Tensor*> src = matrices(const_cast<DraftWeights&>(*this)), dst = matrices(compute);
  for (size_t i = 0; i < src.size(); ++i) {
    if (dst[i]->raw() == src[i]->raw()) continue;  // an F32 copy shares the masters
    dst[i]->check_shape(src[i]->shape(), "DraftWeights::refresh_compute_copy: matrix " + std::to_string(i));
    convert(*src[i], *dst[i]);
  }
}

double DraftConfig::num_parameters() const {
  const double H = static_cast<double>(hidden_size), Ht = static_cast<double>(target_hidden_size),
               nh = static_cast<double>(num_attention_heads), I = static_cast<double>(intermediate_size),
               K = static_cast<double>(draft_vocab_size);
  double n = H * 3 * Ht + 4 * H + K * H + 3 * H * I;  // fc, the four norms, lm_head, the MLP
  if (is_mla()) {
    const double dq = static_cast<double>(attn_qk_dim()), lora = static_cast<double>(kv_lora_rank),
                 ql = static_cast<double>(q_lora_rank);
    n += ql > 0 ? ql * 2 * H + ql + nh * dq * ql : nh * dq * 2 * H;
    n += (lora + static_cast<double>(qk_rope_head_dim)) * 2 * H + lora +
         nh * static_cast<double>(qk_nope_head_dim + v_head_dim) * lora;
    n += H * nh * static_cast<double>(v_head_dim);  // o_proj
  } else {
    const double d = static_cast<double>(head_dim), kv = static_cast<double>(num_key_value_heads);
    n += (nh + 2 * kv) * d * 2 * H + H * nh * d;  // q, k, v, o
  }
  if (norm_before_fc) n += 3 * Ht;
  if (fc_norm) n += 3 * Ht;
  return n;
}

DraftWeights DraftWeights::zeros(const DraftConfig& c, Device device) {
  const int64_t H = c.hidden_size, Ht = c.target_hidden_size,
                qd = c.num_attention_heads * (c.is_mla() ? c.attn_v_dim() : c.head_dim),
                kvd = c.num_key_value_heads * c.head_dim, I = c.intermediate_size, K = c.draft_vocab_size;
  AERIE_CHECK(H > 0 && Ht > 0 && qd > 0 && kvd > 0 && I > 0 && K > 0,
              "DraftWeights::zeros: config has a non-positive size (H " << H << ", H_t " << Ht << ", heads*d " << qd
                                                                        << ", kv*d " << kvd << ", I " << I << ", K " << K
                                                                        << ")");
  DraftWeights w;
  auto z = [device](Shape s) { return Tensor::zeros(s, DType::F32, device); };
  w.fc = z({H, 3 * Ht});
  if (c.is_mla()) {
    const int64_t nh = c.num_attention_heads, dq = c.attn_qk_dim(), lora = c.kv_lora_rank;
    AERIE_CHECK(lora > 0 && c.qk_rope_head_dim > 0 && c.qk_nope_head_dim > 0 && c.v_head_dim > 0 && c.q_lora_rank >= 0,
                "DraftWeights::zeros: MLA config has a non-positive size");
    if (c.q_lora_rank > 0) {
      w.q_a_proj = z({c.q_lora_rank, 2 * H});
      w.q_a_layernorm = z({c.q_lora_rank});
      w.q_b_proj = z({nh * dq, c.q_lora_rank});
    } else {
      w.q_proj = z({nh * dq, 2 * H});
    }
    w.kv_a_proj_with_mqa = z({lora + c.qk_rope_head_dim, 2 * H});
    w.kv_a_layernorm = z({lora});
    w.kv_b_proj = z({nh * (c.qk_nope_head_dim + c.v_head_dim), lora});
  } else {
    w.q_proj = z({qd, 2 * H});
    w.k_proj = z({kvd, 2 * H});
    w.v_proj = z({kvd, 2 * H});
  }
  w.o_proj = z({H, qd});
  w.gate_proj = z({I, H});
  w.up_proj = z({I, H});
  w.down_proj = z({H, I});
  w.input_layernorm = z({H});
  w.hidden_norm = z({H});
  w.post_attention_layernorm = z({H});
  w.norm = z({H});
  w.lm_head = z({K, H});
  if (c.norm_before_fc) w.input_norm = z({3 * Ht});
  if (c.fc_norm)
    for (Tensor& t : w.fc_norm) t = z({Ht});
  return w;
}

DraftWeights init_draft_weights(const DraftConfig& cfg, const Tensor& target_lm_head,
                                const std::vector<int64_t>& selected, uint64_t seed, bool random_lm_head) {
  DraftWeights w = DraftWeights::zeros(cfg);
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, K = cfg.draft_vocab_size;
  target_lm_head.check_shape({V, H}, "init_draft_weights: target lm_head");
  AERIE_CHECK(target_lm_head.device() == Device::CPU, "init_draft_weights: the target lm_head must be on the host");
  AERIE_CHECK(static_cast<int64_t>(selected.size()) == K,
              "init_draft_weights: " << selected.size() << " selected ids for K = " << K);
  std::mt19937_64 rng(seed);
  // Linears in the order of named() but lm_head, each U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch
  // nn.Linear's bound); the norm weights (1-D: the four layer norms, the MLA latent norms, norm_before_fc's
  // input_norm) 1, RMSNorm's init, drawn from no random number.
  for (auto& [name, t] : w.named()) {
    if (t == &w.lm_head) continue;
    if (t->ndim() == 2)
      fill_uniform(*t, 1.0 / std::sqrt(static_cast<double>(t->dim(1))), rng);
    else
      std::fill(t->data<float>(), t->data<float>() + t->numel(), 1.0f);
  }
  if (random_lm_head) {
    for (int64_t i = 0; i < K; ++i)
      AERIE_CHECK(selected[i] >= 0 && selected[i] < V && (i == 0 || selected[i] > selected[i - 1]),
                  "init_draft_weights: selected ids must ascend inside [0, " << V << "), bad at " << i);
    fill_uniform(w.lm_head, 1.0 / std::sqrt(static_cast<double>(H)), rng);
    return w;
  }
  Tensor lm = target_lm_head.dtype() == DType::F32 ? target_lm_head : target_lm_head.to(DType::F32);
  for (int64_t i = 0; i < K; ++i) {
    AERIE_CHECK(selected[i] >= 0 && selected[i] < V && (i == 0 || selected[i] > selected[i - 1]),
                "init_draft_weights: selected ids must ascend inside [0, " << V << "), bad at " << i);
    std::copy_n(lm.data<float>() + selected[i] * H, H, w.lm_head.data<float>() + i * H);
  }
  return w;
}

TTTSample make_ttt_sample(std::vector<int32_t> ids, std::vector<uint8_t> loss_mask, Tensor aux_hidden,
                          const Tensor& final_hidden, const Tensor& target_lm_head,
                          const std::vector<int64_t>& selected) {
  const int64_t T = static_cast<int64_t>(ids.size());
  AERIE_CHECK(static_cast<int64_t>(loss_mask.size()) == T, "make_ttt_sample: " << loss_mask.size()
                                                                                << " loss-mask entries for " << T << " ids");
  AERIE_CHECK(aux_hidden.ndim() == 2 && aux_hidden.dim(0) == T,
              "make_ttt_sample: aux_hidden " << shape_str(aux_hidden.shape()) << " for " << T << " ids");
  const int64_t V = target_lm_head.dim(0), H = target_lm_head.dim(1), K = static_cast<int64_t>(selected.size());
  final_hidden.check_shape({T, H}, "make_ttt_sample: final_hidden");
  for (int64_t s : selected) AERIE_CHECK(s >= 0 && s < V, "make_ttt_sample: selected id " << s << " outside [0, " << V << ")");
  TTTSample out;
  out.ids = std::move(ids);
  out.loss_mask = std::move(loss_mask);
  AERIE_CHECK(aux_hidden.dtype() == DType::F32 || aux_hidden.dtype() == DType::BF16,
              "make_ttt_sample: aux_hidden must be F32 or BF16, got " << dtype_name(aux_hidden.dtype()));
  out.aux_hidden = std::move(aux_hidden);  // F32 or BF16, kept (ttt_forward_backward converts it where needed)
  // Computed where W_lm lives (target_probs stays there; the argmax comes to the host). 64 rows at a time
  // on the CPU (a [64, V] fp32 buffer for a 128K vocabulary), 512 on a GPU (fewer, larger GEMMs).
  const Device dev = target_lm_head.device();
  out.target_probs = Tensor::empty({T, K}, DType::F32, dev);
  Tensor argmax = Tensor::empty({T}, DType::I64, dev);
  Tensor sel = Tensor::from_vector(selected, {K});
  if (dev != Device::CPU) sel = sel.to_device(dev);
  target_distribution(final_hidden.device() == dev ? final_hidden : final_hidden.to_device(dev), target_lm_head, sel,
                      out.target_probs, argmax, dev == Device::CPU ? 64 : 512);
  if (dev != Device::CPU) argmax = argmax.to_device(Device::CPU);
  out.target_argmax.assign(argmax.data<int64_t>(), argmax.data<int64_t>() + T);
  return out;
}

std::vector<int64_t> ttt_valid_counts(const TTTSample& s, const std::vector<uint8_t>& t2d, int num_steps) {
  const int64_t T = static_cast<int64_t>(s.ids.size());
  AERIE_CHECK(static_cast<int64_t>(s.loss_mask.size()) == T && static_cast<int64_t>(s.target_argmax.size()) == T,
              "ttt_valid_counts: ids/loss_mask/target_argmax sizes differ");
  std::vector<int64_t> v(num_steps, 0);
  for (int k = 0; k < num_steps; ++k)
    for (int64_t t = 0; t + k + 2 <= T - 1; ++t) {
      const int64_t am = s.target_argmax[t + k + 1];
      AERIE_CHECK(am >= 0 && am < static_cast<int64_t>(t2d.size()), "ttt_valid_counts: target argmax " << am
                                                                                                         << " outside t2d");
      if (s.loss_mask[t + k + 2] && t2d[am]) ++v[k];
    }
  return v;
}

}  // namespace aerie
