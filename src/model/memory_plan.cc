// plan_memory: per-rank weight, scratch and activation bytes from config.json and a tensor list
// (memory_plan.h; the rules and arithmetic: docs/memory-plan.md). The config is parsed here, not by
// model/target_config.h: the plan covers architectures (MLA, MoE) that the target does not build yet.
#include "model/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "model/blocks.h"
#include "model/quant_config.h"

namespace aerie {

namespace {

using nlohmann::json;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fields of config.json the plan needs.
struct ModelShape {
  std::string model_type, wrapper;  // wrapper: the top-level model_type of a multimodal config
  bool mla = false;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;  // MLA
  int64_t experts = 0, top_k = 0, moe_intermediate = 0, shared = 0, first_dense = 0, moe_freq = 1;
  int64_t pack_factor = 8;  // values per int32 of a compressed-tensors weight_packed (32 / 4 bits)
  QuantConfig quant;         // as the loader reads it (read_quant_config)
  int64_t vocab = 0, nextn = 0;  // vocab_size (0: not given); num_nextn_predict_layers (DeepSeek's MTP)
  int64_t max_positions = 0;     // max_position_embeddings (0: not given)
  bool is_moe_layer(int64_t l) const { return experts > 0 && l >= first_dense && l % moe_freq == 0; }
};

int64_t field(const json& j, const char* key, const std::string& source, int64_t dflt = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    AERIE_CHECK(dflt >= 0, source << ": config lacks \"" << key << "\"");
    return dflt;
  }
  AERIE_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 0,
              source << ": \"" << key << "\" is not a non-negative integer: " << j[key].dump());
  return j[key].get<int64_t>();
}

ModelShape parse_shape(const json& top, const std::string& source) {
  AERIE_CHECK(top.is_object(), source << ": config is not a JSON object");
  const bool wrapped = top.contains("text_config") && top["text_config"].is_object();
  const json& c = wrapped ? top["text_config"] : top;
  ModelShape s;
  AERIE_CHECK(c.contains("model_type") && c["model_type"].is_string(),
              source << ": config lacks \"model_type\"" << (wrapped ? " in text_config" : ""));
  s.model_type = c["model_type"].get<std::string>();
  if (wrapped && top.contains("model_type") && top["model_type"].is_string()) s.wrapper = top["model_type"];
  static const char* mla_types[] = {"deepseek_v2", "deepseek_v3", "kimi_k2"};
  static const char* gqa_types[] = {"llama", "mistral", "qwen2", "qwen3"};
  s.mla = std::find(std::begin(mla_types), std::end(mla_types), s.model_type) != std::end(mla_types);
  AERIE_CHECK(s.mla || std::find(std::begin(gqa_types), std::end(gqa_types), s.model_type) != std::end(gqa_types),
              source << ": model_type \"" << s.model_type
                     << "\" is not planned (deepseek_v2, deepseek_v3, kimi_k2, llama, mistral, qwen2, qwen3)");
  s.hidden = field(c, "hidden_size", source);
  s.layers = field(c, "num_hidden_layers", source);
  s.heads = field(c, "num_attention_heads", source);
  AERIE_CHECK(s.hidden > 0 && s.layers > 0 && s.heads > 0, source << ": hidden_size, num_hidden_layers and "
                                                                      "num_attention_heads must be positive");
  s.kv_heads = field(c, "num_key_value_heads", source, s.heads);
  s.head_dim = field(c, "head_dim", source, s.hidden / s.heads);
  s.intermediate = field(c, "intermediate_size", source);
  s.vocab = field(c, "vocab_size", source, 0);
  s.nextn = field(c, "num_nextn_predict_layers", source, 0);
  s.max_positions = field(c, "max_position_embeddings", source, 0);
  if (s.mla) {
    s.q_lora = field(c, "q_lora_rank", source, 0);  // 0: q_proj straight from the hidden state (V2-Lite)
    s.kv_lora = field(c, "kv_lora_rank", source);
    s.qk_nope = field(c, "qk_nope_head_dim", source);
    s.qk_rope = field(c, "qk_rope_head_dim", source);
    s.v_head = field(c, "v_head_dim", source);
    s.experts = field(c, "n_routed_experts", source, 0);
    if (s.experts > 0) {
      s.top_k = field(c, "num_experts_per_tok", source);
      s.moe_intermediate = field(c, "moe_intermediate_size", source);
      s.shared = field(c, "n_shared_experts", source, 0);
      s.first_dense = field(c, "first_k_dense_replace", source, 0);
      s.moe_freq = std::max<int64_t>(1, field(c, "moe_layer_freq", source, 1));
    }
  }
  // The quantization as the loader reads it: the top level's quantization_config, else text_config's, else
  // compression_config (vLLM's order), in a format aerie dequantizes (refused by name otherwise), so that a
  // plan that fits is a model extract loads.
  s.quant = read_quant_config(top, source);
  return s;
}

enum class Split { None, Rows, Cols };

// The role of one tensor: skipped (with its group), or a category, a split and its layer (-1: none).
struct Role {
  std::string skip;  // non-empty: not loaded, grouped under this label
  WeightCategory category = WeightCategory::Other;
  Split split = Split::None;
  int64_t layer = -1;
  int64_t expert = -1;  // routed experts: the <e> of mlp.experts.<e>.*
  bool foreign_layer = false;  // a decoder layer past num_hidden_layers + num_nextn_predict_layers
};

// q_b/kv_b/q/k/v (by head), gate/up (by intermediate): column-parallel rows; o, down: row-parallel columns.
Split projection_split(const std::string& module) {
  static const std::map<std::string, Split> m = {
      {"q_b_proj", Split::Rows},  {"kv_b_proj", Split::Rows},  {"q_proj", Split::Rows},
      {"k_proj", Split::Rows},    {"v_proj", Split::Rows},     {"o_proj", Split::Cols},
      {"gate_proj", Split::Rows}, {"up_proj", Split::Rows},    {"down_proj", Split::Cols},
      {"q_a_proj", Split::None},  {"kv_a_proj_with_mqa", Split::None}};
  auto it = m.find(module);
  return it == m.end() ? Split::None : it->second;
}

Role classify(const std::string& name, const ModelShape& s) {
  Role r;
  if (starts_with(name, "lm_head.") || starts_with(name, "language_model.lm_head.")) {
    r.category = WeightCategory::EmbedLmHead;
    return r;
  }
  std::string prefix;
  for (const char* p : {"language_model.model.", "model.language_model.", "model."})
    if (starts_with(name, p)) {
      prefix = p;
      break;
    }
  if (prefix.empty()) {
    r.skip = name.substr(0, name.find('.')) + ".*";  // vision_tower.*, mm_projector.*
    return r;
  }
  const std::string rel = name.substr(prefix.size());
  if (rel == "embed_tokens.weight") {
    r.category = WeightCategory::EmbedLmHead;
    return r;
  }
  if (rel == "norm.weight") {
    r.category = WeightCategory::Norms;
    return r;
  }
  if (!starts_with(rel, "layers.")) {
    r.skip = prefix + rel.substr(0, rel.find('.')) + ".*";  // model.visual.* of a transformers-5 wrapper
    return r;
  }
  size_t dot = rel.find('.', 7);
  try {
    r.layer = std::stoll(rel.substr(7, dot - 7));
  } catch (const std::exception&) {
    r.category = WeightCategory::Other;
    return r;
  }
  const std::string rest = dot == std::string::npos ? "" : rel.substr(dot + 1);
  if (r.layer >= s.layers) {
    r.skip = prefix + "layers." + std::to_string(r.layer) + ".* (MTP layer: num_nextn_predict_layers)";
    r.foreign_layer = r.layer >= s.layers + s.nextn;
    return r;
  }
  if (ends_with(rest, "rotary_emb.inv_freq")) {
    r.skip = "*.rotary_emb.inv_freq (recomputed)";
    return r;
  }
  // "<module path>.<projection>.<tensor>": the projection is the component before the last.
  const size_t last = rest.rfind('.');
  const std::string owner = rest.substr(0, last);
  const std::string projection = owner.substr(owner.rfind('.') + 1);
  if (ends_with(owner, "norm") || ends_with(owner, "layernorm")) {
    r.category = WeightCategory::Norms;
  } else if (starts_with(rest, "self_attn.")) {
    r.category = WeightCategory::Attention;
    r.split = projection_split(projection);
  } else if (starts_with(rest, "mlp.experts.")) {
    r.category = WeightCategory::RoutedExperts;
    r.split = projection_split(projection);
    try {
      r.expert = std::stoll(rest.substr(std::strlen("mlp.experts.")));
    } catch (const std::exception&) {
      r.expert = -1;
    }
  } else if (starts_with(rest, "mlp.shared_experts.") || starts_with(rest, "mlp.shared_expert.")) {
    r.category = WeightCategory::SharedExperts;
    r.split = projection_split(projection);
  } else if (starts_with(rest, "mlp.gate.") || starts_with(rest, "mlp.shared_expert_gate.")) {
    r.category = WeightCategory::Router;
  } else if (starts_with(rest, "mlp.")) {
    r.category = WeightCategory::DenseMlp;
    r.split = projection_split(projection);
  }
  if (ends_with(rest, ".weight_shape")) r.split = Split::None;  // compressed-tensors' [2] of the full shape
  return r;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  return os.str() + "]";
}

}  // namespace

const char* category_name(WeightCategory c) {
  static const char* names[kWeightCategories] = {"attention", "dense MLP", "shared experts", "routed experts",
                                                 "router",    "embedding + lm_head", "norms", "other"};
  return names[static_cast<int>(c)];
}

int64_t safetensors_dtype_bytes(const std::string& dtype) {
  std::string d = dtype;
  std::transform(d.begin(), d.end(), d.begin(), [](unsigned char ch) { return std::toupper(ch); });
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"F16", 2}, {"BF16", 2},
      {"I16", 2}, {"U16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

namespace {

// The activations of one forward of T tokens on one rank (deepseek-v3.md section 7): the residual stream,
// the attention of one layer, the largest FFN of one layer (layers run one after another), the captures.
void plan_activations(const ModelShape& s, const PlanOptions& opt, MemoryPlan& plan) {
  const int64_t T = plan.tokens_per_forward, H = s.hidden, a = opt.activation_bytes, tp = opt.tp;
  const std::string Ts = std::to_string(T), as = std::to_string(a);
  auto add = [&](std::string what, std::string detail, int64_t bytes) {
    plan.activations.push_back({std::move(what), std::move(detail), bytes});
    plan.activations_per_rank += bytes;
  };
  add("residual stream (fp32) + normed input", Ts + " x " + std::to_string(H) + " x (4 + " + as + ")",
      T * H * (4 + a));
  const int64_t hr = ceil_div(s.heads, tp);
  if (s.mla) {
    const int64_t qk = s.qk_nope + s.qk_rope, lat = s.q_lora + s.kv_lora + s.qk_rope;
    add("attention: q, k, v, output, latents",
        Ts + " x (" + std::to_string(hr) + " heads x (2 x " + std::to_string(qk) + " + 2 x " +
            std::to_string(s.v_head) + ") + " + std::to_string(lat) + ") x " + as,
        T * (hr * (2 * qk + 2 * s.v_head) + lat) * a);
  } else {
    const int64_t kvr = ceil_div(s.kv_heads, tp);
    add("attention: q, k, v, output",
        Ts + " x (2 x " + std::to_string(hr) + " + 2 x " + std::to_string(kvr) + ") heads x " +
            std::to_string(s.head_dim) + " x " + as,
        T * (2 * hr + 2 * kvr) * s.head_dim * a);
  }
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < s.layers; ++l) (s.is_moe_layer(l) ? any_moe : any_dense) = true;
  const int64_t dense = any_dense ? T * 2 * ceil_div(s.intermediate, tp) * a : 0;
  int64_t moe = 0;
  std::string moe_detail;
  if (any_moe) {
    // Expert parallelism: a rank runs whole experts on the pairs routed to them, sized for the worst
    // case that every pair lands on its experts (T k; T k / tp on average).
    const int64_t pairs = T * s.top_k, mi = plan.expert_parallel ? s.moe_intermediate : ceil_div(s.moe_intermediate, tp);
    const int64_t si = ceil_div(s.moe_intermediate * s.shared, tp);
    moe = pairs * (H + 2 * mi) * a + T * 2 * si * a + T * s.experts * 4;
    moe_detail = std::to_string(pairs) + " token-expert pairs" + (plan.expert_parallel ? " (all on this rank's experts, the worst case)" : "") +
                 " x (" + std::to_string(H) + " out + 2 x " +
                 std::to_string(mi) + " gate/up) x " + as + " + shared " + Ts + " x 2 x " + std::to_string(si) +
                 " x " + as + " + router " + Ts + " x " + std::to_string(s.experts) + " x 4";
  }
  if (moe >= dense) {
    add("MoE layer (" + Ts + " x top-" + std::to_string(s.top_k) + ")", moe_detail, moe);
  } else {
    add("MLP: gate/up intermediate", Ts + " x 2 x " + std::to_string(ceil_div(s.intermediate, tp)) + " x " + as,
        dense);
  }
  if (opt.job == PlanJob::Generate) {
    const int64_t rows = std::min(opt.sequences, T);
    add("logits (fp32): one row per sequence", std::to_string(rows) + " x " + std::to_string(s.vocab) + " x 4",
        rows * s.vocab * 4);
    return;
  }
  add("captured: " + std::to_string(opt.aux_layers) + " aux + final hidden states",
      std::to_string(opt.aux_layers + 1) + " x " + Ts + " x " + std::to_string(H) + " x " + as,
      (opt.aux_layers + 1) * T * H * a);
}

// Generate's KV caches: one per sequence, max_length positions (model/target.cc make_cache: GQA keys and
// values of this rank's kv heads; MLA the latent row of kv_lora_rank + qk_rope_head_dim, whole on each rank).
void plan_kv_caches(const ModelShape& s, const PlanOptions& opt, MemoryPlan& plan) {
  if (opt.job != PlanJob::Generate) return;
  const int64_t a = opt.activation_bytes;
  const int64_t row = s.mla ? s.kv_lora + s.qk_rope : 2 * ceil_div(s.kv_heads, opt.tp) * s.head_dim;
  const long double bytes = static_cast<long double>(opt.sequences) * static_cast<long double>(opt.max_length) *
                            static_cast<long double>(s.layers) * static_cast<long double>(row) * a;
  AERIE_CHECK(bytes < 0x1p62L, "memory plan: the KV caches of " << opt.sequences << " sequences of " << opt.max_length
                                                              << " positions would take more than 4 EiB a rank");
  plan.kv_cache_per_rank = opt.sequences * opt.max_length * s.layers * row * a;
  plan.kv_cache_detail = std::to_string(opt.sequences) + " sequences x " + std::to_string(opt.max_length) +
                         " positions x " + std::to_string(s.layers) + " layers x " +
                         (s.mla ? "(" + std::to_string(s.kv_lora) + " + " + std::to_string(s.qk_rope) + ") latent"
                                : "2 x " + std::to_string(ceil_div(s.kv_heads, opt.tp)) + " kv heads x " +
                                      std::to_string(s.head_dim)) +
                         " x " + std::to_string(a);
}

// The per-rank bytes of a tensor split as `split` over tp (the split dimension rounded up); a split of a
// 1-D tensor by columns is none (a row-parallel linear's bias is replicated).
int64_t per_rank_elements(const std::vector<int64_t>& shape, Split split, int64_t tp, bool& divides) {
  int64_t n = 1;
  const int dim = split == Split::Rows ? 0 : split == Split::Cols && shape.size() >= 2 ? 1 : -1;
  divides = true;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (static_cast<int>(i) == dim) {
      divides = shape[i] % tp == 0;
      n *= ceil_div(shape[i], tp);
    } else {
      n *= shape[i];
    }
  }
  return n;
}

std::string category_list(const std::array<bool, kWeightCategories>& in) {
  std::string out;
  for (int c = 0; c < kWeightCategories; ++c)
    if (in[c]) out += (out.empty() ? "" : ", ") + std::string(category_name(static_cast<WeightCategory>(c)));
  return out;
}

}  // namespace

MemoryPlan plan_memory(const json& config, const std::vector<TensorInfo>& tensors, const PlanOptions& opt,
                       const std::string& source) {
  AERIE_CHECK(opt.tp >= 1, "memory plan: tp " << opt.tp << " must be >= 1");
  AERIE_CHECK(opt.max_length >= 1 && opt.batch_tokens >= 0 && opt.batch_size >= 0,
              "memory plan: max length " << opt.max_length << ", batch tokens " << opt.batch_tokens
                                         << ", batch size " << opt.batch_size << ": need max length >= 1, others >= 0");
  // Bounds that keep every product below 2^63 (a plan of 2^63 bytes would wrap and say it fits).
  AERIE_CHECK(opt.job != PlanJob::Generate || (opt.sequences >= 1 && opt.sequences <= kMaxPlanBatch),
              "memory plan: generate's sequences at once must lie in [1, " << kMaxPlanBatch << "], got " << opt.sequences);
  AERIE_CHECK(opt.max_length <= kMaxPlanLength && opt.batch_size <= kMaxPlanBatch && opt.batch_tokens <= kMaxPlanLength,
              "memory plan: max length " << opt.max_length << ", batch size " << opt.batch_size << ", batch tokens "
                                         << opt.batch_tokens << ": beyond any model's context (lengths up to "
                                         << kMaxPlanLength << ", batches up to " << kMaxPlanBatch << ")");
  ModelShape s = parse_shape(config, source);  // vocab filled from embed_tokens when the config lacks it
  MemoryPlan plan;
  plan.tp = opt.tp;
  plan.expert_parallel = opt.expert_parallel && opt.tp > 1 && s.experts > 0;
  AERIE_CHECK(!plan.expert_parallel || s.experts % opt.tp == 0,
              source << ": --expert-parallel: tp " << opt.tp << " does not divide n_routed_experts " << s.experts
                     << " (the jobs refuse this split): choose a tp that divides it, or leave out --expert-parallel");
  if (opt.expert_parallel && !plan.expert_parallel)
    plan.notes.push_back(std::string("--expert-parallel does nothing here: ") +
                         (s.experts == 0 ? "no routed experts" : "tp 1 holds every expert"));
  plan.model = s.wrapper.empty() ? s.model_type : s.wrapper + " (text_config: " + s.model_type + ")";
  std::ostringstream arch;
  if (s.mla) {
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < s.layers; ++l) moe_layers += s.is_moe_layer(l);
    arch << "MLA" << (s.experts ? " + MoE" : "") << ": " << s.layers << " layers";
    if (s.experts)
      arch << " (" << s.layers - moe_layers << " dense, " << moe_layers << " MoE), " << s.experts
           << " routed experts top-" << s.top_k << ", " << s.shared << " shared";
    arch << ", " << s.heads << " heads, hidden " << s.hidden;
  } else {
    arch << "GQA: " << s.layers << " layers, " << s.heads << " heads / " << s.kv_heads << " kv heads, hidden "
         << s.hidden;
  }
  plan.architecture = arch.str();

  const int64_t tp = opt.tp;
  std::map<std::string, size_t> skip_index;
  // Dequantization scratch (bf16), as aerie's forward uses it: a quantized Linear is dequantized into one
  // buffer reused by every Linear (the largest one counts; gate_proj + up_proj are one Linear), and the
  // routed experts need none when the fused grouped GEMM reads them as stored (kernels/gemm.h
  // matmul_grouped_quant: K % 64 of both projections, N % 128 and parts of a multiple of 128 rows), else
  // the experts of a layer in chunks of at most kMoeScratchBytes.
  const bool ep = plan.expert_parallel;
  const int64_t mi_rank = ep ? s.moe_intermediate : ceil_div(s.moe_intermediate, tp);
  const bool fused_experts = s.hidden % 128 == 0 && mi_rank % 128 == 0;
  std::map<int64_t, int64_t> routed_scratch;  // layer -> bf16 bytes of its routed experts' share
  std::map<std::string, int64_t> linear_scratch;  // Linear (gate/up as one) -> bf16 bytes of its share
  std::array<bool, kWeightCategories> fp8{}, int4{};
  std::map<std::string, std::pair<int64_t, std::string>> undivided;  // "dim 0 (rows)" -> count, example
  int64_t others = 0;
  std::string other_example;
  std::set<int64_t> layers_seen;  // decoder layers [0, num_hidden_layers) with any tensor
  std::string fp8_example, int4_example;  // the first F8 weight and the first weight_packed of the list
  for (const TensorInfo& t : tensors) {
    const int64_t esize = safetensors_dtype_bytes(t.dtype);
    AERIE_CHECK(esize > 0, source << " / tensor list: tensor '" << t.name << "' has unknown dtype '" << t.dtype << "'");
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const Role r = classify(t.name, s);
    if (r.layer >= 0 && r.layer < s.layers) layers_seen.insert(r.layer);
    // A tensor list of another model (the wrong file of two long names) would plan with this config's shape
    // and that model's bytes: refused where the two disagree, naming the tensor.
    AERIE_CHECK(!r.foreign_layer, source << " / tensor list: tensor '" << t.name << "' is of decoder layer " << r.layer
                                         << ", but the config has " << s.layers << " layers and "
                                         << (s.nextn ? std::to_string(s.nextn) : std::string("no"))
                                         << " MTP layer(s): is the tensor list of another model?");
    AERIE_CHECK(r.category != WeightCategory::EmbedLmHead || t.shape.size() != 2 ||
                    (t.shape[1] == s.hidden && (s.vocab == 0 || t.shape[0] == s.vocab)),
                source << " / tensor list: tensor '" << t.name << "' is " << shape_string(t.shape)
                       << ", the config's vocab_size x hidden_size is [" << s.vocab << ", " << s.hidden
                       << "]: is the tensor list of another model?");
    if (s.vocab == 0 && r.category == WeightCategory::EmbedLmHead && t.shape.size() == 2)
      s.vocab = t.shape[0];  // a config without vocab_size: generate's logits rows are as wide as embed_tokens
    AERIE_CHECK(r.category != WeightCategory::RoutedExperts || r.expert < s.experts,
                source << " / tensor list: tensor '" << t.name << "' is of routed expert " << r.expert
                       << ", but the config has " << s.experts << " (n_routed_experts): is the tensor list of "
                       << "another model?");
    if (!r.skip.empty()) {
      auto [it, fresh] = skip_index.emplace(r.skip, plan.skipped.size());
      if (fresh) plan.skipped.push_back({r.skip, 0, 0});
      plan.skipped[it->second].tensors += 1;
      plan.skipped[it->second].bytes += numel * esize;
      continue;
    }
    Split split = r.split;
    if (r.category == WeightCategory::EmbedLmHead) split = opt.vocab_parallel_embeddings ? Split::Rows : Split::None;
    bool divides = true;
    int64_t share = per_rank_elements(t.shape, split, tp, divides);
    if (ep && r.category == WeightCategory::RoutedExperts) {
      // Whole experts: rank 0 holds experts [0, E / tp), none of the others (an unnumbered one counts).
      share = std::max<int64_t>(r.expert, 0) < s.experts / tp ? numel : 0;
      divides = true;
    }
    if (!divides) {
      auto& u = undivided[split == Split::Rows ? "dim 0 (rows)" : "dim 1 (columns)"];
      if (u.first++ == 0) u.second = t.name + " " + shape_string(t.shape);
    }
    if (r.category == WeightCategory::EmbedLmHead) {
      bool unused = true;
      const int64_t other = per_rank_elements(t.shape, opt.vocab_parallel_embeddings ? Split::None : Split::Rows,
                                              tp, unused);
      plan.replicated_embedding_delta += (other - share) * esize;
    }
    if (r.category == WeightCategory::Other && others++ == 0) other_example = t.name;
    CategoryBytes& c = plan.weights[static_cast<int>(r.category)];
    c.tensors += 1;
    c.checkpoint += numel * esize;
    const bool is_fp8 = starts_with(t.dtype, "F8") || starts_with(t.dtype, "f8");
    const bool is_int4 = ends_with(t.name, ".weight_packed");
    if (is_fp8 && fp8_example.empty()) fp8_example = t.name;
    if (is_int4 && int4_example.empty()) int4_example = t.name;
    // --fp8-gemm: a dense Linear weight is quantized at load into block FP8 (Linear::use_fp8_gemm).
    const bool linear_category = r.category == WeightCategory::Attention || r.category == WeightCategory::DenseMlp ||
                                 r.category == WeightCategory::SharedExperts ||
                                 r.category == WeightCategory::RoutedExperts;
    if (opt.fp8_gemm && linear_category && !is_fp8 && !is_int4 && esize >= 2 && t.shape.size() == 2 &&
        ends_with(t.name, ".weight")) {
      c.per_rank += share + ceil_div(share, 128 * 128) * 4;
      fp8[static_cast<int>(r.category)] = true;
      // The routed experts keep their grouped GEMM: dequantized into the scratch unless it reads them as stored.
      if (r.category == WeightCategory::RoutedExperts && !fused_experts)
        routed_scratch[r.layer] += share * opt.activation_bytes;
      continue;
    }
    c.per_rank += share * esize;
    if (is_fp8 && opt.fp8_gemm && r.category != WeightCategory::RoutedExperts) {
      fp8[static_cast<int>(r.category)] = true;  // used as stored: no dequantization scratch
      continue;
    }
    if (is_fp8 || is_int4) {
      (is_fp8 ? fp8 : int4)[static_cast<int>(r.category)] = true;
      const int64_t bytes = share * (is_int4 ? s.pack_factor : 1) * opt.activation_bytes;
      if (r.category == WeightCategory::RoutedExperts) {
        if (!fused_experts) routed_scratch[r.layer] += bytes;
      } else {
        std::string linear = t.name.substr(0, t.name.rfind('.'));  // the module, e.g. ...mlp.up_proj
        for (const char* p : {"gate_proj", "up_proj"})
          if (ends_with(linear, p)) linear = linear.substr(0, linear.size() - std::strlen(p)) + "gate_up";
        linear_scratch[linear] += bytes;
      }
    }
  }
  for (const CategoryBytes& c : plan.weights) {
    plan.weight_tensors += c.tensors;
    plan.weights_checkpoint += c.checkpoint;
    plan.weights_per_rank += c.per_rank;
  }
  AERIE_CHECK(plan.weight_tensors > 0, source << ": the tensor list holds no language-model weight (of "
                                              << tensors.size() << " tensors)");
  // The config's quantization against the tensors (a list of the same architecture in another format has the
  // same shapes: Kimi-K2.5's INT4 config with K2-Instruct's FP8 list planned 2x its weights): INT4
  // weight_packed tensors for compressed-tensors, F8 ones for fp8, neither without a quantization_config.
  {
    const bool want_int4 = s.quant.method == QuantConfig::Method::Int4Group;
    const bool want_fp8 = s.quant.method == QuantConfig::Method::Fp8Block;
    const std::string config = "the config's " + s.quant.where +
                               (s.quant.shadows ? " (the top level's, read before text_config's other one, as vLLM "
                                                  "reads them)"
                                                : "");
    std::string why;
    if (want_int4 && int4_example.empty())
      why = config + " is compressed-tensors INT4 (weight_packed tensors), but the tensors have no weight_packed" +
            (fp8_example.empty() ? std::string() : "; they are FP8 (" + fp8_example + ")");
    else if (want_fp8 && fp8_example.empty())
      why = config + " is FP8, but the tensors have no F8 weight" +
            (int4_example.empty() ? std::string() : "; they are INT4 (" + int4_example + ")");
    else if (want_fp8 && !int4_example.empty())
      why = config + " is FP8, but the tensors include INT4 ones (" + int4_example + ")";
    else if (want_int4 && !fp8_example.empty())
      why = config + " is compressed-tensors INT4, but the tensors include FP8 ones (" + fp8_example + ")";
    else if (s.quant.method == QuantConfig::Method::None && (!fp8_example.empty() || !int4_example.empty()))
      why = "the config has no quantization_config, but the tensors are quantized (" +
            (fp8_example.empty() ? int4_example : fp8_example) + ")";
    AERIE_CHECK(why.empty(), source << ": " << why << ": are the config and the tensors of the same checkpoint?");
  }
  std::vector<std::string> quant;
  if (std::count(int4.begin(), int4.end(), true))
    quant.push_back("int4 pack-quantized, " + std::to_string(s.pack_factor) + " per int32 (" + category_list(int4) + ")");
  if (std::count(fp8.begin(), fp8.end(), true))
    quant.push_back(std::string(opt.fp8_gemm ? "W8A8 block fp8, --fp8-gemm" : "fp8 e4m3") + " (" +
                    category_list(fp8) + ")");
  plan.quantization = quant.empty() ? "none" : quant.size() == 1 ? quant[0] : quant[0] + "; " + quant[1];
  for (const auto& [linear, bytes] : linear_scratch)
    if (bytes > plan.scratch_per_rank) {
      plan.scratch_per_rank = bytes;
      plan.scratch_layer = "the largest quantized Linear, " + linear;
    }
  for (const auto& [layer, bytes] : routed_scratch)
    if (std::min(bytes, kMoeScratchBytes) > plan.scratch_per_rank) {
      plan.scratch_per_rank = std::min(bytes, kMoeScratchBytes);
      plan.scratch_layer = "layer " + std::to_string(layer) + "'s routed experts" +
                           (bytes > kMoeScratchBytes ? " (chunks of 4 GiB)" : "");
    }
  if (!fused_experts && s.experts > 0 && std::count(int4.begin(), int4.end(), true) + std::count(fp8.begin(), fp8.end(), true) > 0)
    plan.notes.push_back("moe_intermediate_size / tp = " + std::to_string(mi_rank) + " (or hidden " +
                         std::to_string(s.hidden) + ") is not a multiple of 128: the routed experts are "
                         "dequantized into a bf16 scratch before their GEMMs (slower)");

  for (const auto& [dim, u] : undivided)
    plan.notes.push_back("tp " + std::to_string(tp) + " does not divide " + dim + " of " + std::to_string(u.first) +
                         " tensor(s), e.g. " + u.second + ": shares rounded up");
  if (s.heads % tp != 0 || (!s.mla && s.kv_heads % tp != 0))
    plan.blockers.push_back("tp " + std::to_string(tp) + " does not divide num_attention_heads " +
                            std::to_string(s.heads) + (s.mla ? "" : " / num_key_value_heads " + std::to_string(s.kv_heads)) +
                            ": aerie's attention splits whole heads (the target refuses to load)");
  bool any_dense = false;
  for (int64_t l = 0; l < s.layers; ++l) any_dense = any_dense || !s.is_moe_layer(l);
  if (any_dense && s.intermediate % tp != 0)
    plan.blockers.push_back("tp " + std::to_string(tp) + " does not divide intermediate_size " +
                            std::to_string(s.intermediate) + ": aerie's dense MLP splits it whole (the target refuses to load)");
  if (others > 0)
    plan.notes.push_back(std::to_string(others) + " tensor(s) of no known role counted as replicated, e.g. " +
                         other_example);
  // A checkpoint with fewer layers than its config.json (a truncated download, an edited config): the plan of
  // the config's layers would say "fits" for a model that does not load.
  if (!layers_seen.empty() && static_cast<int64_t>(layers_seen.size()) < s.layers) {
    int64_t missing = 0;
    while (layers_seen.count(missing)) ++missing;
    plan.blockers.push_back("config.json's num_hidden_layers is " + std::to_string(s.layers) + ", the weights hold " +
                            std::to_string(layers_seen.size()) + " of those layers (layer " + std::to_string(missing) +
                            " has no tensor): the target refuses to load");
  }

  // generate: a step's rows are the running sequences' new rows plus the prompts started in it, no more
  // prompts past kGenerateStepRows (one always may start), at most every sequence's whole turn.
  plan.tokens_per_forward =
      opt.job == PlanJob::Generate
          ? std::min(std::max(kGenerateStepRows, opt.max_length), opt.sequences * opt.max_length)
      : opt.batch_size > 0 ? opt.batch_size * opt.max_length
                           : std::max(opt.batch_tokens, opt.max_length);
  AERIE_CHECK(plan.tokens_per_forward <= (int64_t{1} << 31),
              "memory plan: " << plan.tokens_per_forward << " tokens in one forward: beyond any GPU (at most 2^31)");
  plan.beyond_context = opt.job == PlanJob::Generate && s.max_positions > 0 && opt.max_length > s.max_positions;
  if (plan.beyond_context)
    plan.blockers.push_back("--max-length " + std::to_string(opt.max_length) + " exceeds the model's max_position_embeddings " +
                            std::to_string(s.max_positions) + ": aerie generate refuses it");
  plan_activations(s, opt, plan);
  plan_kv_caches(s, opt, plan);
  plan.reserve = opt.reserve;
  plan.gpu_memory = opt.gpu_memory;
  plan.total_per_rank = plan.weights_per_rank + plan.scratch_per_rank + plan.activations_per_rank +
                        plan.kv_cache_per_rank + plan.reserve;
  plan.margin = plan.gpu_memory - plan.total_per_rank;
  plan.fits = plan.margin >= 0 && plan.blockers.empty();
  return plan;
}

}  // namespace aerie
