// plan_memory: per-rank weight, scratch and activation bytes from config.json and a tensor list
// (memory_plan.h; the rules and arithmetic: docs/memory-plan.md). The config is read by
// target_config_from_json and the layers are built by build_target_weights over a PlanningSource
// (model/plan_source.h), as the loader reads and builds them; this file adds the bytes up.
#include "model/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/plan_source.h"
#include "model/target_config.h"
#include "model/target_impl.h"

namespace aerie {

namespace {

using nlohmann::json;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& x) {
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A model_type the architecture table lacks is refused before its config is read (the table's rows are
// what the plan builds); a multimodal wrapper's is its text_config's, as target_config_from_json takes it.
void check_planned_model_type(const json& config, const std::string& source) {
  AERIE_CHECK(config.is_object(), source << ": config is not a JSON object");
  const bool wrapped = !config.contains("hidden_size") && config.contains("text_config") && config["text_config"].is_object();
  const json& c = wrapped ? config["text_config"] : config;
  if (!c.contains("model_type") || !c["model_type"].is_string()) return;  // target_config_from_json says why
  const std::string type = c["model_type"].get<std::string>();
  std::string built;
  for (const Architecture& a : architectures()) {
    if (a.model_type == type) return;  // built, or refused by find_architecture naming its blocks
    if (a.build_layer) built += (built.empty() ? "" : ", ") + a.model_type;
  }
  AERIE_THROW(source << ": model_type \"" << type << "\" is not planned (" << built << ")");
}

// The number after `key` in `name` ("layers.", "experts."), or -1.
int64_t index_after(const std::string& name, const std::string& key) {
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  const size_t b = at + key.size();
  size_t e = b;
  while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
  return e > b && e - b < 10 ? std::stoll(name.substr(b, e - b)) : -1;
}

// A tensor list of another model than the config (the wrong file of two long names) would fail to load
// with a shape error deep in a layer; it is refused here naming the first tensor that disagrees: a decoder
// layer past num_hidden_layers + num_nextn_predict_layers, an embedding or lm_head of another shape than
// [vocab_size, hidden_size], a routed expert past n_routed_experts.
void check_same_model(const std::vector<TensorInfo>& tensors, const TargetConfig& cfg, const std::string& prefix,
                      const std::string& source) {
  const int64_t L = cfg.num_hidden_layers, mtp = cfg.num_nextn_predict_layers, E = cfg.moe.n_routed_experts;
  for (const TensorInfo& t : tensors) {
    const bool decoder = starts_with(t.name, prefix);
    const int64_t layer = decoder && starts_with(t.name, prefix + "layers.") ? index_after(t.name, prefix + "layers.") : -1;
    AERIE_CHECK(layer < L + mtp, source << " / tensor list: tensor '" << t.name << "' is of decoder layer " << layer
                                        << ", but the config has " << L << " layers and "
                                        << (mtp ? std::to_string(mtp) : std::string("no"))
                                        << " MTP layer(s): is the tensor list of another model?");
    const bool embedding = t.name == prefix + "embed_tokens.weight" || t.name == "lm_head.weight" ||
                           t.name == "language_model.lm_head.weight";
    const std::vector<int64_t> want = {cfg.vocab_size, cfg.hidden_size};
    AERIE_CHECK(!embedding || t.shape == want,
                source << " / tensor list: tensor '" << t.name << "' is " << shape_str(t.shape)
                       << ", the config's vocab_size x hidden_size is [" << cfg.vocab_size << ", " << cfg.hidden_size
                       << "]: is the tensor list of another model?");
    const int64_t expert = layer >= 0 && layer < L ? index_after(t.name, ".experts.") : -1;
    AERIE_CHECK(expert < E || E == 0, source << " / tensor list: tensor '" << t.name << "' is of routed expert " << expert
                                             << ", but the config has " << E << " (n_routed_experts): is the tensor "
                                             << "list of another model?");
  }
}

// The config's quantization against the tensors (a list of the same architecture in another format has the
// same shapes: Kimi-K2.5's INT4 config with K2-Instruct's FP8 list planned 2x its weights): INT4
// weight_packed tensors for compressed-tensors, F8 ones for fp8, neither without a quantization_config. The
// loader would refuse the first such tensor; this names the pair.
void check_quantization(const std::vector<TensorInfo>& tensors, const QuantConfig& q, const std::string& prefix,
                        const std::string& source) {
  std::string fp8, int4;  // the first F8 weight and the first weight_packed of the language model
  for (const TensorInfo& t : tensors) {
    if (!starts_with(t.name, prefix) && !ends_with(t.name, "lm_head.weight")) continue;
    if (fp8.empty() && (starts_with(t.dtype, "F8") || starts_with(t.dtype, "f8"))) fp8 = t.name;
    if (int4.empty() && ends_with(t.name, ".weight_packed")) int4 = t.name;
  }
  const bool want_int4 = q.method == QuantConfig::Method::Int4Group, want_fp8 = q.method == QuantConfig::Method::Fp8Block;
  const std::string config =
      "the config's " + q.where +
      (q.shadows ? " (the top level's, read before text_config's other one, as vLLM reads them)" : "");
  std::string why;
  if (want_int4 && int4.empty())
    why = config + " is compressed-tensors INT4 (weight_packed tensors), but the tensors have no weight_packed" +
          (fp8.empty() ? std::string() : "; they are FP8 (" + fp8 + ")");
  else if (want_fp8 && fp8.empty())
    why = config + " is FP8, but the tensors have no F8 weight" + (int4.empty() ? std::string() : "; they are INT4 (" + int4 + ")");
  else if (want_fp8 && !int4.empty())
    why = config + " is FP8, but the tensors include INT4 ones (" + int4 + ")";
  else if (want_int4 && !fp8.empty())
    why = config + " is compressed-tensors INT4, but the tensors include FP8 ones (" + fp8 + ")";
  else if (q.method == QuantConfig::Method::None && (!fp8.empty() || !int4.empty()))
    why = "the config has no quantization_config, but the tensors are quantized (" + (fp8.empty() ? int4 : fp8) + ")";
  AERIE_CHECK(why.empty(), source << ": " << why << ": are the config and the tensors of the same checkpoint?");
}

// The build of the plan: the loader's build_target_weights over the tensors at opt.tp. Where the blocks
// refuse that tp (heads, an intermediate size, a quantized split), their message is a blocker and the
// layers are built at tp 1 instead, each share of opt.tp rounded up (errors of that build throw). A tensor
// the list lacks is a blocker (a truncated download: the layers the weights hold, in the old words).
std::unique_ptr<PlanningSource> build_plan(const TargetConfig& cfg, const std::vector<TensorInfo>& tensors,
                                           const PlanOptions& opt, const std::string& source, MemoryPlan& plan) {
  const std::string label = source + " / tensor list";
  auto src = std::make_unique<PlanningSource>(tensors, label, opt.tp, opt.tp, cfg.quant);
  check_same_model(tensors, cfg, src->decoder_prefix(), source);
  check_quantization(tensors, cfg.quant, src->decoder_prefix(), source);
  src->set_expert_parallel(opt.expert_parallel);
  try {
    build_target_weights(*src, cfg);
  } catch (const Error& e) {
    if (opt.tp == 1) throw;
    src = std::make_unique<PlanningSource>(tensors, label, 1, opt.tp, cfg.quant);
    build_target_weights(*src, cfg);  // an error here is not the tp's: it throws
    plan.blockers.push_back(std::string(e.what()) + " (the target refuses to load at tp " + std::to_string(opt.tp) + ")");
  }
  src->finish("a " + cfg.model_type + " decoder of this config");
  const int64_t L = cfg.num_hidden_layers, held = static_cast<int64_t>(src->layers_found().size());
  std::vector<std::string> missing;  // of the layers the weights hold (the others: one blocker below)
  for (const auto& [layer, message] : src->missing())
    if (layer < 0 || src->layers_found().count(layer)) missing.push_back(message);
  if (!missing.empty())
    plan.blockers.push_back(missing.front() +
                            (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more missing)" : "") +
                            ": the target refuses to load");
  if (held > 0 && held < L) {
    int64_t first = 0;
    while (src->layers_found().count(first)) ++first;
    plan.blockers.push_back("config.json's num_hidden_layers is " + std::to_string(L) + ", the weights hold " +
                            std::to_string(held) + " of those layers (layer " + std::to_string(first) +
                            " has no tensor): the target refuses to load");
  }
  return src;
}

// The label of a tensor the build did not ask for, under which plan.skipped groups it.
std::string skipped_label(const PlanningSource& src, const std::string& name) {
  const auto [prefix, why] = src.skipped_as(name);
  if (!why.empty()) return prefix + (prefix == name ? "" : "*") + " (" + why + ")";
  if (ends_with(name, "rotary_emb.inv_freq")) return "*.rotary_emb.inv_freq (recomputed)";
  // Outside the language model (vision_tower.*, mm_projector.*, a transformers-5 wrapper's model.visual.*):
  // the name's components up to the first that leaves the decoder prefix.
  const std::string& prefix_ = src.decoder_prefix();
  size_t end = name.find('.');
  while (end != std::string::npos && end < prefix_.size() && name.compare(0, end + 1, prefix_, 0, end + 1) == 0)
    end = name.find('.', end + 1);
  return name.substr(0, end) + ".*";
}

std::string category_list(const std::array<bool, kWeightCategories>& in) {
  std::string out;
  for (int c = 0; c < kWeightCategories; ++c)
    if (in[c]) out += (out.empty() ? "" : ", ") + std::string(category_name(static_cast<WeightCategory>(c)));
  return out;
}

// The weights of the build by category (rank 0's bytes as stored; the embedding and lm_head by
// PlanOptions::vocab_parallel_embeddings; --fp8-gemm's block FP8 for Dense Linears), the quantization
// line, the dequantization scratch and the notes on rounded shares.
void count_weights(const PlanningSource& src, const TargetConfig& cfg, const PlanOptions& opt, MemoryPlan& plan) {
  const int64_t tp = opt.tp, a = opt.activation_bytes;
  std::array<bool, kWeightCategories> fp8{}, int4{};
  std::map<std::string, std::pair<int64_t, std::string>> undivided;  // "dim 0 (rows)" -> count, example
  int64_t others = 0;
  std::string other_example;
  for (const PlannedTensor& t : src.tensors()) {
    const int c = static_cast<int>(t.category);
    const int64_t numel = numel_of(t.shape), esize = t.element_bytes;
    CategoryBytes& w = plan.weights[c];
    w.tensors += 1;
    w.checkpoint += numel * esize;
    int64_t share = t.rank_elements;
    bool rounded = t.undivided;
    TpSplit split = t.split;
    if (t.category == WeightCategory::EmbedLmHead) {  // the loader replicates them; vLLM splits rows
      const auto rows = [&](bool parallel) { return parallel ? ceil_div(t.shape[0], tp) * numel / t.shape[0] : numel; };
      share = rows(opt.vocab_parallel_embeddings);
      plan.replicated_embedding_delta += (rows(!opt.vocab_parallel_embeddings) - share) * esize;
      rounded = opt.vocab_parallel_embeddings && t.shape[0] % tp != 0;
      split = TpSplit::Rows;
    }
    if (rounded) {
      auto& u = undivided[split == TpSplit::Rows ? "dim 0 (rows)" : "dim 1 (columns)"];
      if (u.first++ == 0) u.second = t.name + " " + shape_str(t.shape);
    }
    if (t.category == WeightCategory::Other && others++ == 0) other_example = t.name;
    if (opt.fp8_gemm && t.dense_weight && esize >= 2) {  // Linear::use_fp8_gemm: 1 byte + a scale per 128 x 128
      w.per_rank += share + ceil_div(share, 128 * 128) * 4;
      fp8[c] = true;
      continue;
    }
    w.per_rank += share * esize;
    if (t.linear >= 0 && src.linears()[t.linear].format != WeightFormat::Dense)
      (src.linears()[t.linear].format == WeightFormat::BlockFp8 ? fp8 : int4)[c] = true;
  }
  for (const CategoryBytes& c : plan.weights) {
    plan.weight_tensors += c.tensors;
    plan.weights_checkpoint += c.checkpoint;
    plan.weights_per_rank += c.per_rank;
  }
  std::vector<std::string> quant;
  if (std::count(int4.begin(), int4.end(), true))
    quant.push_back("int4 pack-quantized, " + std::to_string(32 / 4) + " per int32 (" + category_list(int4) + ")");
  if (std::count(fp8.begin(), fp8.end(), true))
    quant.push_back(std::string(opt.fp8_gemm ? "W8A8 block fp8, --fp8-gemm" : "fp8 e4m3") + " (" + category_list(fp8) + ")");
  plan.quantization = quant.empty() ? "none" : quant.size() == 1 ? quant[0] : quant[0] + "; " + quant[1];

  // Dequantization scratch (bf16), as aerie's forward uses it: a quantized Linear is dequantized into one
  // buffer reused by every Linear (the largest one counts), and the routed experts need none when the fused
  // grouped GEMM reads them as stored (kernels/gemm.h matmul_grouped_quant: K % 64 of both projections,
  // N % 128 and parts of a multiple of 128 rows), else the experts of a layer in chunks of at most
  // kMoeScratchBytes. --fp8-gemm: FP8 Linears outside the routed experts are read as stored.
  const int64_t mi = cfg.moe.moe_intermediate_size, mi_rank = plan.expert_parallel ? mi : ceil_div(mi, tp);
  const bool fused_experts = cfg.hidden_size % 128 == 0 && mi_rank % 128 == 0;
  std::map<int64_t, int64_t> routed;  // layer -> bf16 bytes of its routed experts' share
  for (const PlannedLinear& L : src.linears()) {
    const bool quantized = L.format != WeightFormat::Dense, converted = opt.fp8_gemm && !quantized;
    const int64_t bytes = L.out * L.in * a;
    if (L.category == WeightCategory::RoutedExperts) {
      if ((quantized || converted) && !fused_experts) routed[L.layer] += bytes;
    } else if (quantized && !(opt.fp8_gemm && L.format == WeightFormat::BlockFp8) && bytes > plan.scratch_per_rank) {
      plan.scratch_per_rank = bytes;
      plan.scratch_layer = "the largest quantized Linear, " + L.name;
    }
  }
  for (const auto& [layer, bytes] : routed)
    if (std::min(bytes, kMoeScratchBytes) > plan.scratch_per_rank) {
      plan.scratch_per_rank = std::min(bytes, kMoeScratchBytes);
      plan.scratch_layer = "layer " + std::to_string(layer) + "'s routed experts" +
                           (bytes > kMoeScratchBytes ? " (chunks of 4 GiB)" : "");
    }
  if (!fused_experts && cfg.moe.n_routed_experts > 0 &&
      std::count(int4.begin(), int4.end(), true) + std::count(fp8.begin(), fp8.end(), true) > 0)
    plan.notes.push_back("moe_intermediate_size / tp = " + std::to_string(mi_rank) + " (or hidden " +
                         std::to_string(cfg.hidden_size) + ") is not a multiple of 128: the routed experts are "
                         "dequantized into a bf16 scratch before their GEMMs (slower)");
  for (const auto& [dim, u] : undivided)
    plan.notes.push_back("tp " + std::to_string(tp) + " does not divide " + dim + " of " + std::to_string(u.first) +
                         " tensor(s), e.g. " + u.second + ": shares rounded up");
  if (others > 0)
    plan.notes.push_back(std::to_string(others) + " tensor(s) asked for outside any block counted as replicated, e.g. " +
                         other_example);
}

// The tensors the build did not ask for (the MTP layers, a tied checkpoint's lm_head copy, rotary tables,
// a vision tower), grouped in the order of the list.
void count_skipped(const PlanningSource& src, const std::vector<TensorInfo>& tensors, MemoryPlan& plan) {
  std::map<std::string, size_t> index;
  for (const TensorInfo& t : tensors) {
    if (src.asked(t.name)) continue;
    auto [it, fresh] = index.emplace(skipped_label(src, t.name), plan.skipped.size());
    if (fresh) plan.skipped.push_back({it->first, 0, 0});
    plan.skipped[it->second].tensors += 1;
    plan.skipped[it->second].bytes += numel_of(t.shape) * safetensors_dtype_bytes(t.dtype);
  }
}

// "MLA + MoE: 61 layers (3 dense, 58 MoE), 256 routed experts top-8, 1 shared, 128 heads, hidden 7168".
std::string describe_architecture(const TargetConfig& cfg) {
  const auto& m = cfg.moe;
  const bool mla = cfg.mla.enabled();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) moe_layers += m.is_moe_layer(l);
  std::ostringstream os;
  os << (mla ? "MLA" : "GQA") << (m.n_routed_experts ? " + MoE" : "") << ": " << cfg.num_hidden_layers << " layers";
  if (m.n_routed_experts)
    os << " (" << cfg.num_hidden_layers - moe_layers << " dense, " << moe_layers << " MoE), " << m.n_routed_experts
       << " routed experts top-" << m.num_experts_per_tok << ", " << m.n_shared_experts << " shared";
  os << ", " << cfg.num_attention_heads << " heads";
  if (!mla) os << " / " << cfg.num_key_value_heads << " kv heads";
  os << ", hidden " << cfg.hidden_size;
  return os.str();
}

// The activations of one forward of T tokens on one rank (deepseek-v3.md section 7): the residual stream,
// the attention of one layer, the largest FFN of one layer (layers run one after another), the captures.
void plan_activations(const TargetConfig& cfg, const PlanOptions& opt, MemoryPlan& plan) {
  const int64_t T = plan.tokens_per_forward, H = cfg.hidden_size, a = opt.activation_bytes, tp = opt.tp;
  const std::string Ts = std::to_string(T), as = std::to_string(a);
  auto add = [&](std::string what, std::string detail, int64_t bytes) {
    plan.activations.push_back({std::move(what), std::move(detail), bytes});
    plan.activations_per_rank += bytes;
  };
  add("residual stream (fp32) + normed input", Ts + " x " + std::to_string(H) + " x (4 + " + as + ")",
      T * H * (4 + a));
  const int64_t hr = ceil_div(cfg.num_attention_heads, tp);
  if (cfg.mla.enabled()) {
    const auto& m = cfg.mla;
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim, lat = m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim;
    add("attention: q, k, v, output, latents",
        Ts + " x (" + std::to_string(hr) + " heads x (2 x " + std::to_string(qk) + " + 2 x " +
            std::to_string(m.v_head_dim) + ") + " + std::to_string(lat) + ") x " + as,
        T * (hr * (2 * qk + 2 * m.v_head_dim) + lat) * a);
  } else {
    const int64_t kvr = ceil_div(cfg.num_key_value_heads, tp);
    add("attention: q, k, v, output",
        Ts + " x (2 x " + std::to_string(hr) + " + 2 x " + std::to_string(kvr) + ") heads x " +
            std::to_string(cfg.head_dim) + " x " + as,
        T * (2 * hr + 2 * kvr) * cfg.head_dim * a);
  }
  const auto& moe = cfg.moe;
  bool any_dense = false, any_moe = false;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) (moe.is_moe_layer(l) ? any_moe : any_dense) = true;
  const int64_t dense = any_dense ? T * 2 * ceil_div(cfg.intermediate_size, tp) * a : 0;
  int64_t moe_bytes = 0;
  std::string moe_detail;
  if (any_moe) {
    // Expert parallelism: a rank runs whole experts on the pairs routed to them, sized for the worst
    // case that every pair lands on its experts (T k; T k / tp on average).
    const int64_t pairs = T * moe.num_experts_per_tok;
    const int64_t mi = plan.expert_parallel ? moe.moe_intermediate_size : ceil_div(moe.moe_intermediate_size, tp);
    const int64_t si = ceil_div(moe.moe_intermediate_size * moe.n_shared_experts, tp);
    moe_bytes = pairs * (H + 2 * mi) * a + T * 2 * si * a + T * moe.n_routed_experts * 4;
    moe_detail = std::to_string(pairs) + " token-expert pairs" +
                 (plan.expert_parallel ? " (all on this rank's experts, the worst case)" : "") + " x (" +
                 std::to_string(H) + " out + 2 x " + std::to_string(mi) + " gate/up) x " + as + " + shared " + Ts +
                 " x 2 x " + std::to_string(si) + " x " + as + " + router " + Ts + " x " +
                 std::to_string(moe.n_routed_experts) + " x 4";
  }
  if (moe_bytes >= dense) {
    add("MoE layer (" + Ts + " x top-" + std::to_string(moe.num_experts_per_tok) + ")", moe_detail, moe_bytes);
  } else {
    add("MLP: gate/up intermediate", Ts + " x 2 x " + std::to_string(ceil_div(cfg.intermediate_size, tp)) + " x " + as,
        dense);
  }
  if (opt.job == PlanJob::Generate) {
    const int64_t rows = std::min(opt.sequences, T);
    add("logits (fp32): one row per sequence", std::to_string(rows) + " x " + std::to_string(cfg.vocab_size) + " x 4",
        rows * cfg.vocab_size * 4);
    return;
  }
  add("captured: " + std::to_string(opt.aux_layers) + " aux + final hidden states",
      std::to_string(opt.aux_layers + 1) + " x " + Ts + " x " + std::to_string(H) + " x " + as,
      (opt.aux_layers + 1) * T * H * a);
}

// Generate's KV caches: one per sequence, max_length positions (model/target.cc make_cache: GQA keys and
// values of this rank's kv heads; MLA the latent row of kv_lora_rank + qk_rope_head_dim, whole on each rank).
void plan_kv_caches(const TargetConfig& cfg, const PlanOptions& opt, MemoryPlan& plan) {
  if (opt.job != PlanJob::Generate) return;
  const int64_t a = opt.activation_bytes, L = cfg.num_hidden_layers, kv = ceil_div(cfg.num_key_value_heads, opt.tp);
  const bool mla = cfg.mla.enabled();
  const int64_t row = mla ? cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim : 2 * kv * cfg.head_dim;
  const long double bytes = static_cast<long double>(opt.sequences) * static_cast<long double>(opt.max_length) *
                            static_cast<long double>(L) * static_cast<long double>(row) * a;
  AERIE_CHECK(bytes < 0x1p62L, "memory plan: the KV caches of " << opt.sequences << " sequences of " << opt.max_length
                                                              << " positions would take more than 4 EiB a rank");
  plan.kv_cache_per_rank = opt.sequences * opt.max_length * L * row * a;
  plan.kv_cache_detail = std::to_string(opt.sequences) + " sequences x " + std::to_string(opt.max_length) +
                         " positions x " + std::to_string(L) + " layers x " +
                         (mla ? "(" + std::to_string(cfg.mla.kv_lora_rank) + " + " +
                                    std::to_string(cfg.mla.qk_rope_head_dim) + ") latent"
                              : "2 x " + std::to_string(kv) + " kv heads x " + std::to_string(cfg.head_dim)) +
                         " x " + std::to_string(a);
}

void check_options(const PlanOptions& opt) {
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
}

}  // namespace

int64_t safetensors_dtype_bytes(const std::string& dtype) {
  std::string d = dtype;
  std::transform(d.begin(), d.end(), d.begin(), [](unsigned char ch) { return std::toupper(ch); });
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"F16", 2}, {"BF16", 2},
      {"I16", 2}, {"U16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

MemoryPlan plan_memory(const json& config, const std::vector<TensorInfo>& tensors, const PlanOptions& opt,
                       const std::string& source) {
  check_options(opt);
  check_planned_model_type(config, source);
  const TargetConfig cfg = target_config_from_json(config, source);
  const int64_t E = cfg.moe.n_routed_experts;
  MemoryPlan plan;
  plan.tp = opt.tp;
  plan.expert_parallel = opt.expert_parallel && opt.tp > 1 && E > 0;
  AERIE_CHECK(!plan.expert_parallel || E % opt.tp == 0,
              source << ": --expert-parallel: tp " << opt.tp << " does not divide n_routed_experts " << E
                     << " (the jobs refuse this split): choose a tp that divides it, or leave out --expert-parallel");
  if (opt.expert_parallel && !plan.expert_parallel)
    plan.notes.push_back(std::string("--expert-parallel does nothing here: ") +
                         (E == 0 ? "no routed experts" : "tp 1 holds every expert"));
  plan.model = cfg.wrapper_model_type.empty() ? cfg.model_type
                                              : cfg.wrapper_model_type + " (text_config: " + cfg.model_type + ")";
  plan.architecture = describe_architecture(cfg);

  const std::unique_ptr<PlanningSource> src = build_plan(cfg, tensors, opt, source, plan);
  count_weights(*src, cfg, opt, plan);
  count_skipped(*src, tensors, plan);

  // generate: a step's rows are the running sequences' new rows plus the prompts started in it, no more
  // prompts past kGenerateStepRows (one always may start), at most every sequence's whole turn.
  plan.tokens_per_forward =
      opt.job == PlanJob::Generate
          ? std::min(std::max(kGenerateStepRows, opt.max_length), opt.sequences * opt.max_length)
      : opt.batch_size > 0 ? opt.batch_size * opt.max_length
                           : std::max(opt.batch_tokens, opt.max_length);
  AERIE_CHECK(plan.tokens_per_forward <= (int64_t{1} << 31),
              "memory plan: " << plan.tokens_per_forward << " tokens in one forward: beyond any GPU (at most 2^31)");
  plan.beyond_context = opt.job == PlanJob::Generate && opt.max_length > cfg.max_position_embeddings;
  if (plan.beyond_context)
    plan.blockers.push_back("--max-length " + std::to_string(opt.max_length) +
                            " exceeds the model's max_position_embeddings " +
                            std::to_string(cfg.max_position_embeddings) + ": aerie generate refuses it");
  plan_activations(cfg, opt, plan);
  plan_kv_caches(cfg, opt, plan);
  plan.reserve = opt.reserve;
  plan.gpu_memory = opt.gpu_memory;
  plan.total_per_rank = plan.weights_per_rank + plan.scratch_per_rank + plan.activations_per_rank +
                        plan.kv_cache_per_rank + plan.reserve;
  plan.margin = plan.gpu_memory - plan.total_per_rank;
  plan.fits = plan.margin >= 0 && plan.blockers.empty();
  return plan;
}

}  // namespace aerie
