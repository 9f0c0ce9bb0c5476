// The memory plan (model/memory_plan.h) on the real tensor lists of Kimi-K2.5 and Kimi-K2-Instruct, a
// DeepSeek-V3 list derived from its real config, small checkpoints read from their headers, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "io/safetensors.h"
#include "model/memory_plan.h"
#include "model/target.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using nlohmann::json;
using testing::data_dir;
using testing::error_of;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::string configs() { return data_dir() + "/kimi-deepseek-configs"; }

// DeepSeek-V3's real config.json, or nothing when ../shared/data lacks it (the caller skips).
std::optional<json> deepseek_v3_config() {
  const std::string path = configs() + "/config-deepseek-v3/config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  return read_model_config(path);
}

const CategoryBytes& cat(const MemoryPlan& p, WeightCategory c) { return p.weights[static_cast<int>(c)]; }

const SkippedGroup* skipped(const MemoryPlan& p, const std::string& what) {
  for (const SkippedGroup& g : p.skipped)
    if (g.what == what) return &g;
  return nullptr;
}

// deepseek-v3.md section 7: Kimi-K2.5 at tp 8 holds 76.2 GB = 71.0 GiB of weights per GPU and fits a 96 GB
// card; one MoE layer's experts dequantized to bf16 are 4.23 GB per rank.
TEST(MemoryPlan, KimiK25RealTensorListTp8Fits96GB) {
  const std::string dir = configs() + "/config-kimi-k25";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  const std::vector<TensorInfo> tensors = read_tensor_list(dir + "/kimi-k2.5.tensors.expanded.jsonl.gz");
  ASSERT_EQ(tensors.size(), 208550u);
  PlanOptions opt;
  opt.tp = 8;
  opt.max_length = 8192;
  opt.gpu_memory = parse_memory_size("96GB");
  const MemoryPlan p = plan_memory(read_model_config(dir + "/config.transformers-5.7.0-redump.json"), tensors, opt);

  EXPECT_NEAR(p.weights_per_rank / GiB, 71.0, 0.71);
  EXPECT_TRUE(p.fits) << "total " << p.total_per_rank / GiB << " GiB";
  EXPECT_GT(p.margin / GiB, 5.0);
  // 60 MoE layers x 384 experts x 3 projections x (weight_packed, weight_scale, weight_shape).
  EXPECT_EQ(cat(p, WeightCategory::RoutedExperts).tensors, 60 * 384 * 3 * 3);
  EXPECT_NEAR(cat(p, WeightCategory::RoutedExperts).checkpoint / 1e9, 570.8, 0.5);
  EXPECT_NEAR(cat(p, WeightCategory::RoutedExperts).per_rank / 1e9, 71.3, 0.1);
  EXPECT_EQ(cat(p, WeightCategory::DenseMlp).tensors, 3);
  EXPECT_EQ(cat(p, WeightCategory::SharedExperts).tensors, 180);
  EXPECT_EQ(cat(p, WeightCategory::Router).tensors, 120);
  EXPECT_EQ(cat(p, WeightCategory::EmbedLmHead).tensors, 2);
  EXPECT_EQ(cat(p, WeightCategory::Other).tensors, 0);
  EXPECT_NEAR(cat(p, WeightCategory::Router).per_rank / 1e9, 0.33, 0.01);  // replicated
  // Replicating embed_tokens + lm_head (2 x 163840 x 7168 bf16) would add 7/8 of them per rank.
  EXPECT_EQ(p.replicated_embedding_delta, int64_t{2} * 163840 * 7168 * 2 / 8 * 7);
  // No dequantization scratch: the INT4 routed experts are the only quantized weights, and the fused
  // grouped GEMM reads them as stored (moe_intermediate / tp = 256, hidden 7168: multiples of 128).
  EXPECT_EQ(p.scratch_per_rank, 0);
  EXPECT_EQ(p.scratch_layer, "");
  EXPECT_EQ(p.tokens_per_forward, 8192);
  ASSERT_NE(skipped(p, "vision_tower.*"), nullptr);
  ASSERT_NE(skipped(p, "mm_projector.*"), nullptr);
  EXPECT_EQ(skipped(p, "vision_tower.*")->tensors + skipped(p, "mm_projector.*")->tensors + p.weight_tensors, 208550);
  // The whole checkpoint, as SOURCE.txt states: 554.27 GiB.
  EXPECT_NEAR((p.weights_checkpoint + skipped(p, "vision_tower.*")->bytes + skipped(p, "mm_projector.*")->bytes) / GiB,
              554.27, 0.01);
  EXPECT_NE(p.quantization.find("int4"), std::string::npos) << p.quantization;
  EXPECT_TRUE(p.notes.empty()) << p.notes.front();
  // Section 7's prefill items at 8192 tokens: per-pair MoE outputs 0.94 GB, captures 470 MB.
  EXPECT_NEAR(p.activations_per_rank / 1e9, 1.9, 0.2);

  // Expert parallelism: rank 0 holds experts 0-47 whole, the same 71.3 GB of routed experts (the INT4
  // scales of 32-column groups split either way); the MoE activations for the worst case (all 65,536
  // pairs on its experts) with the whole intermediate 2048: +0.94 GB of gate/up; still fits.
  PlanOptions ep = opt;
  ep.expert_parallel = true;
  const MemoryPlan q = plan_memory(read_model_config(dir + "/config.transformers-5.7.0-redump.json"), tensors, ep);
  EXPECT_NEAR(cat(q, WeightCategory::RoutedExperts).per_rank / 1e9, 71.3, 0.1);
  EXPECT_EQ(cat(q, WeightCategory::SharedExperts).per_rank, cat(p, WeightCategory::SharedExperts).per_rank);
  EXPECT_EQ(q.activations_per_rank - p.activations_per_rank, int64_t{8192} * 8 * 2 * (2048 - 256) * 2);
  EXPECT_EQ(q.scratch_per_rank, 0);
  EXPECT_TRUE(q.fits);
  EXPECT_TRUE(q.notes.empty()) << q.notes.front();
  EXPECT_TRUE(q.expert_parallel);
  PlanOptions ep5 = ep;  // 384 experts do not split over 5 ranks: refused, as the jobs refuse it
  ep5.tp = 5;
  const std::string refused =
      error_of([&] { plan_memory(read_model_config(dir + "/config.transformers-5.7.0-redump.json"), tensors, ep5); });
  EXPECT_NE(refused.find("does not divide n_routed_experts 384"), std::string::npos) << refused;
  PlanOptions ep1 = ep;  // tp 1: nothing split, said so, the plain plan's figures
  ep1.tp = 1;
  const MemoryPlan one = plan_memory(read_model_config(dir + "/config.transformers-5.7.0-redump.json"), tensors, ep1);
  opt.tp = 1;
  const MemoryPlan plain = plan_memory(read_model_config(dir + "/config.transformers-5.7.0-redump.json"), tensors, opt);
  EXPECT_FALSE(one.expert_parallel);
  EXPECT_EQ(one.activations_per_rank, plain.activations_per_rank);
  ASSERT_EQ(one.notes.size(), plain.notes.size() + 1);
  EXPECT_NE(one.notes.back().find("does nothing here"), std::string::npos);
}

// The same architecture in block FP8 (real list): every linear is F8_E4M3 + an F32 scale_inv, and the 61
// rotary_emb.inv_freq buffers are skipped.
TEST(MemoryPlan, KimiK2InstructRealFp8List) {
  const std::string dir = configs() + "/config-kimi-k2-instruct";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no " << dir;
  const std::vector<TensorInfo> tensors = read_tensor_list(dir + "/kimi-k2-instruct.tensors.expanded.jsonl.gz");
  PlanOptions opt;
  opt.tp = 8;
  const MemoryPlan p = plan_memory(read_model_config(dir), tensors, opt);
  const SkippedGroup* rot = skipped(p, "*.rotary_emb.inv_freq (recomputed)");
  ASSERT_NE(rot, nullptr);
  EXPECT_EQ(rot->tensors, 61);
  EXPECT_NEAR((p.weights_checkpoint + rot->bytes) / GiB, 958.49, 0.01);  // SOURCE.txt's byte total
  EXPECT_NE(p.quantization.find("fp8"), std::string::npos);
  // The routed experts are read as stored; the largest other FP8 Linear is layer 0's dense gate/up
  // (2 x 18432 / 8 rows of 7168), dequantized to bf16.
  EXPECT_EQ(p.scratch_per_rank, int64_t{2} * 18432 / 8 * 7168 * 2);
  EXPECT_NE(p.scratch_layer.find("layers.0.mlp.gate_up"), std::string::npos) << p.scratch_layer;
  EXPECT_NEAR(p.weights_per_rank / 1e9, 958.49 * GiB / 1e9 / 8, 3.0);
}

// A DeepSeek-V3 tensor list as the checkpoint lays it out (README_WEIGHTS.md: FP8 128x128 blocks, the
// MTP layer 61), derived from the real config.json.
std::vector<TensorInfo> deepseek_v3_tensors(const json& c) {
  const int64_t H = c["hidden_size"], L = c["num_hidden_layers"], nh = c["num_attention_heads"];
  const int64_t ql = c["q_lora_rank"], kl = c["kv_lora_rank"], nope = c["qk_nope_head_dim"];
  const int64_t rope = c["qk_rope_head_dim"], vd = c["v_head_dim"], I = c["intermediate_size"];
  const int64_t mi = c["moe_intermediate_size"], E = c["n_routed_experts"], V = c["vocab_size"];
  const int64_t dense = c["first_k_dense_replace"], mtp = c["num_nextn_predict_layers"];
  std::vector<TensorInfo> t;
  auto bf16 = [&](const std::string& n, std::vector<int64_t> s) { t.push_back({n, "BF16", std::move(s)}); };
  auto fp8 = [&](const std::string& n, int64_t N, int64_t K) {
    t.push_back({n + ".weight", "F8_E4M3", {N, K}});
    t.push_back({n + ".weight_scale_inv", "F32", {(N + 127) / 128, (K + 127) / 128}});
  };
  auto ffn = [&](const std::string& p, int64_t inter) {
    fp8(p + "gate_proj", inter, H);
    fp8(p + "up_proj", inter, H);
    fp8(p + "down_proj", H, inter);
  };
  bf16("model.embed_tokens.weight", {V, H});
  bf16("lm_head.weight", {V, H});
  bf16("model.norm.weight", {H});
  for (int64_t l = 0; l < L + mtp; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    bf16(p + "input_layernorm.weight", {H});
    bf16(p + "post_attention_layernorm.weight", {H});
    fp8(p + "self_attn.q_a_proj", ql, H);
    bf16(p + "self_attn.q_a_layernorm.weight", {ql});
    fp8(p + "self_attn.q_b_proj", nh * (nope + rope), ql);
    fp8(p + "self_attn.kv_a_proj_with_mqa", kl + rope, H);
    bf16(p + "self_attn.kv_a_layernorm.weight", {kl});
    fp8(p + "self_attn.kv_b_proj", nh * (nope + vd), kl);
    fp8(p + "self_attn.o_proj", H, nh * vd);
    if (l < dense) {
      ffn(p + "mlp.", I);
      continue;
    }
    bf16(p + "mlp.gate.weight", {E, H});
    t.push_back({p + "mlp.gate.e_score_correction_bias", "F32", {E}});
    for (int64_t e = 0; e < E; ++e) ffn(p + "mlp.experts." + std::to_string(e) + ".", mi);
    ffn(p + "mlp.shared_experts.", mi);
    if (l >= L) {  // the MTP layer's own tensors
      bf16(p + "enorm.weight", {H});
      bf16(p + "hnorm.weight", {H});
      bf16(p + "eh_proj.weight", {H, 2 * H});
      bf16(p + "embed_tokens.weight", {V, H});
      bf16(p + "shared_head.head.weight", {V, H});
    }
  }
  return t;
}

// deepseek-v3.md section 7: DeepSeek-V3 FP8 is about 673 GB, about 84 GB per GPU at tp 8.
TEST(MemoryPlan, DeepSeekV3Tp8) {
  const std::optional<json> config = deepseek_v3_config();
  if (!config) GTEST_SKIP() << "no DeepSeek-V3 config in " << configs();
  const json& cfg = *config;
  PlanOptions opt;
  opt.tp = 8;
  opt.gpu_memory = parse_memory_size("96GB");
  const MemoryPlan p = plan_memory(cfg, deepseek_v3_tensors(cfg), opt);
  EXPECT_NEAR(p.weights_checkpoint / 1e9, 673.0, 1.0);
  EXPECT_NEAR(p.weights_per_rank / 1e9, 84.0, 84.0 * 0.02);
  const SkippedGroup* mtp = skipped(p, "model.layers.61.* (MTP layer: num_nextn_predict_layers)");
  ASSERT_NE(mtp, nullptr);
  EXPECT_EQ(mtp->tensors, 2 + 2 * 5 + 2 + 2 + 257 * 6 + 5);  // norms, attention, router, experts, own
  EXPECT_EQ(cat(p, WeightCategory::DenseMlp).tensors, 3 * 6);
  EXPECT_TRUE(p.fits) << p.total_per_rank / GiB << " GiB";
  // FP8 everywhere, the routed experts read as stored: the scratch is the largest other Linear, a dense
  // layer's gate/up (2 x 18432 / 8 rows of 7168).
  EXPECT_EQ(p.scratch_per_rank, int64_t{2} * 18432 / 8 * 7168 * 2);
  EXPECT_TRUE(p.notes.empty()) << p.notes.front();
  // At tp 32 an expert's slice (2048 / 32 = 64 rows) is not a multiple of 128: its layer's experts are
  // dequantized into the scratch, 256 x 3 x 64 x 7168 bf16 (under the 4 GiB chunk), and a note says so.
  opt.tp = 32;
  const MemoryPlan q = plan_memory(cfg, deepseek_v3_tensors(cfg), opt);
  EXPECT_EQ(q.scratch_per_rank, int64_t{256} * 3 * 64 * 7168 * 2);
  EXPECT_NE(q.scratch_layer.find("routed experts"), std::string::npos) << q.scratch_layer;
  bool noted = false;
  for (const std::string& n : q.notes) noted = noted || n.find("dequantized into a bf16 scratch") != std::string::npos;
  EXPECT_TRUE(noted);
  // --fp8-gemm: the FP8 Linears outside the routed experts are read as stored: no scratch at tp 8; the
  // weights are the same bytes.
  opt.tp = 8;
  opt.fp8_gemm = true;
  const MemoryPlan w = plan_memory(cfg, deepseek_v3_tensors(cfg), opt);
  EXPECT_EQ(w.scratch_per_rank, 0);
  EXPECT_EQ(w.weights_per_rank, p.weights_per_rank);
  EXPECT_NE(w.quantization.find("--fp8-gemm"), std::string::npos) << w.quantization;
}

// A tensor list of another model than the config (a helper gave DeepSeek-V3's config with Kimi-K2.5's list and
// got "fits") is refused, naming the first tensor that disagrees: more routed experts, another vocabulary,
// decoder layers past num_hidden_layers + num_nextn_predict_layers.
TEST(MemoryPlan, TensorListOfAnotherModelIsRefused) {
  const std::optional<json> config = deepseek_v3_config();
  if (!config) GTEST_SKIP() << "no DeepSeek-V3 config in " << configs();
  const json& cfg = *config;
  PlanOptions opt;
  opt.tp = 8;
  json more = cfg;
  more["n_routed_experts"] = 384;
  std::string e = error_of([&] { plan_memory(cfg, deepseek_v3_tensors(more), opt, "ds/config.json"); });
  EXPECT_NE(e.find("is of routed expert 256, but the config has 256 (n_routed_experts)"), std::string::npos) << e;
  json vocab = cfg;
  vocab["vocab_size"] = 163840;
  e = error_of([&] { plan_memory(cfg, deepseek_v3_tensors(vocab), opt, "ds/config.json"); });
  EXPECT_NE(e.find("model.embed_tokens.weight' is [163840, 7168], the config's vocab_size x hidden_size is "
                   "[129280, 7168]"), std::string::npos) << e;
  json fewer = cfg;
  fewer["num_hidden_layers"] = 40;
  e = error_of([&] { plan_memory(fewer, deepseek_v3_tensors(cfg), opt, "ds/config.json"); });
  EXPECT_NE(e.find("is of decoder layer 41, but the config has 40 layers and 1 MTP layer(s)"), std::string::npos) << e;
  // Its own list still plans, the MTP layer 61 skipped as before.
  EXPECT_NO_THROW(plan_memory(cfg, deepseek_v3_tensors(cfg), opt, "ds/config.json"));
}

// A list of the same architecture in another quantization has the same shapes (Kimi-K2.5's INT4 config with
// K2-Instruct's FP8 list planned as if it fit): the config's quantization_config and the list's tensors
// must agree.
TEST(MemoryPlan, TensorListOfAnotherQuantizationIsRefused) {
  const std::optional<json> config = deepseek_v3_config();
  if (!config) GTEST_SKIP() << "no DeepSeek-V3 config in " << configs();
  PlanOptions opt;
  opt.tp = 8;
  const std::vector<TensorInfo> fp8 = deepseek_v3_tensors(*config);
  // Kimi-K2.5's INT4 quantization_config (the fixture's, as the real file writes it).
  json k25_fixture;
  std::ifstream(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/kimi_k25_int4/config.json") >> k25_fixture;
  json int4 = *config;
  int4["quantization_config"] = k25_fixture["quantization_config"];
  std::string e = error_of([&] { plan_memory(int4, fp8, opt, "k25/config.json"); });
  EXPECT_NE(e.find("k25/config.json: the config's quantization_config is compressed-tensors INT4 (weight_packed "
                   "tensors), but the tensors have no weight_packed; they are FP8 (model.layers.0."),
            std::string::npos) << e;
  EXPECT_NE(e.find("are the config and the tensors of the same checkpoint?"), std::string::npos) << e;
  // quant_method in capitals (vLLM lowercases it).
  json int4_caps = int4;
  int4_caps["quantization_config"]["quant_method"] = "Compressed-Tensors";
  e = error_of([&] { plan_memory(int4_caps, fp8, opt, "k25/config.json"); });
  EXPECT_NE(e.find("is compressed-tensors INT4"), std::string::npos) << e;
  // What the loader refuses, plan refuses with the loader's words (a plan that fits is a model extract loads).
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"quant_method", 8}}, "x/config.json: quantization_config.quant_method is missing or not a string: 8"},
      {json::object(), "x/config.json: quantization_config.quant_method is missing or not a string"},
      {{{"quant_method", "awq"}, {"bits", 4}}, "quantization_config.quant_method \"awq\" is not supported"},
      {"compressed-tensors", "x/config.json: quantization_config is not an object: \"compressed-tensors\""},
      {false, "quantization_config is not an object: false"},
  };
  for (const auto& [qc, want] : refused) {
    json bad = *config;
    bad["quantization_config"] = qc;
    e = error_of([&] { plan_memory(bad, fp8, opt, "x/config.json"); });
    EXPECT_NE(e.find(want), std::string::npos) << qc.dump() << ": " << e;
  }
  json bits8 = int4;
  bits8["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  e = error_of([&] { plan_memory(bits8, fp8, opt, "x/config.json"); });
  EXPECT_NE(e.find("quantization_config.config_groups.group_0.weights.num_bits is 8, aerie supports 4 only"),
            std::string::npos) << e;
  json none = *config;
  none.erase("quantization_config");
  e = error_of([&] { plan_memory(none, fp8, opt, "bf16/config.json"); });
  EXPECT_NE(e.find("the config has no quantization_config, but the tensors are quantized"), std::string::npos) << e;
  std::vector<TensorInfo> bf16;
  for (TensorInfo t : fp8) {
    if (t.name.find("scale_inv") != std::string::npos) continue;
    t.dtype = "BF16";
    bf16.push_back(t);
  }
  e = error_of([&] { plan_memory(*config, bf16, opt, "ds/config.json"); });
  EXPECT_NE(e.find("is FP8, but the tensors have no F8 weight"), std::string::npos) << e;
  EXPECT_NO_THROW(plan_memory(none, bf16, opt, "bf16/config.json"));  // a bf16 conversion with its own config
  // A wrapper with a quantization_config at the top level and another in text_config: the top level's is
  // the checkpoint's (vLLM's weight_utils.get_quant_config), text_config's only without one.
  json wrapped = {{"model_type", "kimi_k25"}, {"text_config", *config}};
  wrapped["quantization_config"] = (*config)["quantization_config"];
  wrapped["text_config"]["quantization_config"] = int4["quantization_config"];
  EXPECT_NO_THROW(plan_memory(wrapped, fp8, opt, "w/config.json"));
  e = error_of([&] { plan_memory(wrapped, bf16, opt, "w/config.json"); });
  EXPECT_NE(e.find("the config's quantization_config (the top level's, read before text_config's other one, as "
                   "vLLM reads them) is FP8, but the tensors have no F8 weight"),
            std::string::npos) << e;
  wrapped["quantization_config"] = nullptr;  // null: text_config's
  e = error_of([&] { plan_memory(wrapped, fp8, opt, "w/config.json"); });
  EXPECT_NE(e.find("the config's text_config.quantization_config is compressed-tensors INT4"), std::string::npos) << e;
  wrapped["quantization_config"] = "int4";  // not null: the top level's, refused as the loader refuses it
  e = error_of([&] { plan_memory(wrapped, fp8, opt, "w/config.json"); });
  EXPECT_NE(e.find("w/config.json (its top-level quantization_config, read before text_config's other one, as vLLM "
                   "reads them): quantization_config is not an object: \"int4\""),
            std::string::npos) << e;
  // The real pair of the helper's report: Kimi-K2.5's INT4 config with Kimi-K2-Instruct's FP8 list.
  const std::string k25 = configs() + "/config-kimi-k25", k2 = configs() + "/config-kimi-k2-instruct";
  if (!std::filesystem::exists(k25) || !std::filesystem::exists(k2)) return;
  e = error_of([&] {
    plan_memory(read_model_config(k25 + "/config.transformers-5.7.0-redump.json"),
                read_tensor_list(k2 + "/kimi-k2-instruct.tensors.expanded.jsonl.gz"), opt, "k25");
  });
  EXPECT_NE(e.find("have no weight_packed; they are FP8"), std::string::npos) << e;
}

// The stories260K checkpoint the build converts, from its real header: at tp 1 the plan's weights are the
// file's tensors, byte for byte.
TEST(MemoryPlan, Stories260KHeadersSumToTheFile) {
  AERIE_REQUIRE_MODEL();
  const std::string dir = testing::model_dir();
  const MemoryPlan p = plan_memory(read_model_config(dir), read_checkpoint_tensors(dir), PlanOptions{});
  int64_t sum = 0;
  SafetensorsReader r(dir + "/model.safetensors");
  for (const auto& [name, e] : r.entries()) sum += static_cast<int64_t>(e.nbytes);
  EXPECT_EQ(p.weight_tensors, static_cast<int64_t>(r.entries().size()));
  EXPECT_EQ(p.weights_checkpoint, sum);
  EXPECT_EQ(p.weights_per_rank, sum);
  EXPECT_EQ(p.scratch_per_rank, 0);
  EXPECT_TRUE(p.skipped.empty());
  EXPECT_TRUE(p.fits);
  // --fp8-gemm: every Linear weight (F32 here) held as one byte an element plus a scale per 128 x 128
  // block; the embedding, norms and lm_head as stored.
  PlanOptions w8;
  w8.fp8_gemm = true;
  const MemoryPlan q = plan_memory(read_model_config(dir), read_checkpoint_tensors(dir), w8);
  int64_t want = 0;
  for (const auto& [name, e] : r.entries()) {
    const bool linear = name.find("self_attn.") != std::string::npos || name.find("mlp.") != std::string::npos;
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    want += linear && e.shape.size() == 2 ? numel + (numel + 16383) / 16384 * 4 : static_cast<int64_t>(e.nbytes);
  }
  EXPECT_EQ(q.weights_per_rank, want);
  EXPECT_LT(q.weights_per_rank, p.weights_per_rank);
  EXPECT_EQ(q.weights_checkpoint, sum);
}

// --fp8-gemm on a BF16 MoE target (the deepseek_v3 fixture): its routed experts become block FP8, and with
// moe_intermediate_size 32 (not a multiple of 128) their grouped GEMM dequantizes a layer's experts into the
// scratch: 8 experts x 3 projections x 32 x 64 bf16 (none without --fp8-gemm: BF16 experts are read as they are).
TEST(MemoryPlan, Fp8GemmOnABf16MoeFixture) {
  const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3";
  PlanOptions opt;
  const MemoryPlan plain = plan_memory(read_model_config(dir), read_checkpoint_tensors(dir), opt);
  EXPECT_EQ(plain.scratch_per_rank, 0);
  opt.fp8_gemm = true;
  const MemoryPlan w8 = plan_memory(read_model_config(dir), read_checkpoint_tensors(dir), opt);
  EXPECT_EQ(w8.scratch_per_rank, int64_t{8} * 3 * 32 * 64 * 2);
  EXPECT_NE(w8.scratch_layer.find("routed experts"), std::string::npos) << w8.scratch_layer;
  EXPECT_LT(w8.weights_per_rank, plain.weights_per_rank);
}

// Qwen2 (q/k/v biases) at tp 2, from the fixture's header: only the norms are replicated.
TEST(MemoryPlan, Qwen2FixtureTp2SplitsByHead) {
  const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/qwen2";
  const std::vector<TensorInfo> tensors = read_checkpoint_tensors(dir);
  PlanOptions opt;
  opt.tp = 2;
  const MemoryPlan p = plan_memory(read_model_config(dir), tensors, opt);
  int64_t norms = 0, all = 0;
  SafetensorsReader r(dir + "/model.safetensors");
  for (const auto& [name, e] : r.entries()) {
    all += static_cast<int64_t>(e.nbytes);
    if (name.find("norm") != std::string::npos) norms += static_cast<int64_t>(e.nbytes);
  }
  EXPECT_EQ(p.weights_checkpoint, all);
  EXPECT_EQ(cat(p, WeightCategory::Norms).per_rank, norms);
  EXPECT_EQ(p.weights_per_rank, norms + (all - norms) / 2);  // every other tensor splits in two
  EXPECT_EQ(cat(p, WeightCategory::Attention).per_rank * 2, cat(p, WeightCategory::Attention).checkpoint);
  EXPECT_TRUE(p.notes.empty()) << p.notes.front();
  EXPECT_TRUE(p.blockers.empty()) << p.blockers.front();
  EXPECT_TRUE(p.fits);
  // At tp 3 neither the 4 heads nor the 2 kv heads split: the target would refuse to load, so the plan
  // says it does not run (and does not fit), however small the model.
  opt.tp = 3;
  const MemoryPlan q = plan_memory(read_model_config(dir), tensors, opt);
  ASSERT_FALSE(q.blockers.empty());
  EXPECT_NE(q.blockers.front().find("does not divide num_attention_heads 4"), std::string::npos) << q.blockers.front();
  EXPECT_GE(q.margin, 0);
  EXPECT_FALSE(q.fits);
  // A config that promises more layers than the weights hold (a truncated download, an edited config):
  // the target refuses to load, so the plan does not say it fits.
  nlohmann::json more = read_model_config(dir);
  more["num_hidden_layers"] = more["num_hidden_layers"].get<int64_t>() + 3;
  opt.tp = 2;
  const MemoryPlan m = plan_memory(more, tensors, opt);
  ASSERT_FALSE(m.blockers.empty());
  EXPECT_NE(m.blockers.back().find("the weights hold " + std::to_string(more["num_hidden_layers"].get<int64_t>() - 3) +
                                   " of those layers"),
            std::string::npos)
      << m.blockers.back();
  EXPECT_FALSE(m.fits);
}

// The plan asks for the tensors the loader asks for (build_target_weights over a PlanningSource): a tensor
// the list lacks is a blocker in the loader's words, a language-model tensor no block reads is refused as
// the loader refuses it, a misshapen one too, and each tensor is counted under the block that asked for it.
TEST(MemoryPlan, AsksForTheTensorsTheLoaderAsksFor) {
  const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/qwen2";
  const nlohmann::json config = read_model_config(dir);
  const std::vector<TensorInfo> tensors = read_checkpoint_tensors(dir);
  const MemoryPlan p = plan_memory(config, tensors, PlanOptions{}, "q/config.json");
  EXPECT_TRUE(p.blockers.empty()) << p.blockers.front();
  int64_t attention = 0;  // q/k/v/o weights and q/k/v biases of every layer
  for (const TensorInfo& t : tensors) attention += t.name.find(".self_attn.") != std::string::npos;
  EXPECT_EQ(cat(p, WeightCategory::Attention).tensors, attention);
  EXPECT_EQ(cat(p, WeightCategory::Other).tensors, 0);

  std::vector<TensorInfo> less;
  for (const TensorInfo& t : tensors)
    if (t.name != "model.layers.1.mlp.down_proj.weight") less.push_back(t);
  const MemoryPlan m = plan_memory(config, less, PlanOptions{}, "q/config.json");
  ASSERT_EQ(m.blockers.size(), 1u);
  EXPECT_NE(m.blockers[0].find("no tensor \"model.layers.1.mlp.down_proj.weight\""), std::string::npos) << m.blockers[0];
  EXPECT_FALSE(m.fits);

  std::vector<TensorInfo> more = tensors;
  more.push_back({"model.layers.0.self_attn.o_proj.bias", "BF16", {config["hidden_size"].get<int64_t>()}});
  std::string e = error_of([&] { plan_memory(config, more, PlanOptions{}, "q/config.json"); });
  EXPECT_NE(e.find("tensor \"model.layers.0.self_attn.o_proj.bias\""), std::string::npos) << e;
  EXPECT_NE(e.find("is not part of a qwen2 decoder"), std::string::npos) << e;

  std::vector<TensorInfo> misshapen = tensors;
  for (TensorInfo& t : misshapen)
    if (t.name == "model.layers.0.post_attention_layernorm.weight") t.shape[0] += 1;
  e = error_of([&] { plan_memory(config, misshapen, PlanOptions{}, "q/config.json"); });
  EXPECT_NE(e.find("post_attention_layernorm.weight\": expected shape"), std::string::npos) << e;
}

// --job generate (PlanJob::Generate): the KV caches counted are those the target makes (model/target.cc
// make_cache), here for a GQA and an MLA fixture at tp 1: `sequences` caches of max_length positions, two
// bytes an element (bf16, generate's default on a GPU); a step holds max(8192, max_length) rows, and no more
// than all sequences' whole turns; one F32 logits row per sequence; the total adds the caches; extract's
// plan of the same target has none. A max_length past max_position_embeddings does not run (generate
// refuses it), and lengths or batches whose bytes would wrap around int64 are refused.
TEST(MemoryPlan, GenerateCountsTheKvCachesTheTargetMakes) {
  auto self = testing::self_comm();
  for (const std::string name : {"qwen2", "deepseek_v3"}) {
    const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name;
    const nlohmann::json config = read_model_config(dir);
    const std::vector<TensorInfo> tensors = read_checkpoint_tensors(dir);
    PlanOptions opt;
    opt.job = PlanJob::Generate;
    opt.sequences = 3;
    opt.max_length = 40;
    const MemoryPlan p = plan_memory(config, tensors, opt);
    TargetModel model(dir, *self);
    const KVCache cache = model.make_cache(opt.max_length);
    int64_t elements = 0;
    for (const Tensor& t : cache.k) elements += t.numel();
    for (const Tensor& t : cache.v)
      if (t.defined()) elements += t.numel();
    EXPECT_EQ(p.kv_cache_per_rank, 3 * elements * 2) << name << ": " << p.kv_cache_detail;
    EXPECT_EQ(p.tokens_per_forward, 3 * 40) << name << ": three whole turns, below the 8192 rows of a step";
    EXPECT_TRUE(p.blockers.empty()) << p.blockers.front();
    EXPECT_TRUE(p.fits);
    ASSERT_FALSE(p.activations.empty());
    EXPECT_EQ(p.activations.back().bytes, 3 * config["vocab_size"].get<int64_t>() * 4) << p.activations.back().what;
    EXPECT_EQ(p.total_per_rank,
              p.weights_per_rank + p.scratch_per_rank + p.activations_per_rank + p.kv_cache_per_rank + p.reserve);
    opt.sequences = 6;  // twice the sequences, twice the caches
    EXPECT_EQ(plan_memory(config, tensors, opt).kv_cache_per_rank, 2 * p.kv_cache_per_rank) << name;
    opt.sequences = 1000;
    EXPECT_EQ(plan_memory(config, tensors, opt).tokens_per_forward, kGenerateStepRows) << name;
    const int64_t context = config["max_position_embeddings"].get<int64_t>();
    opt.max_length = context + 1;
    const MemoryPlan beyond = plan_memory(config, tensors, opt);
    EXPECT_TRUE(beyond.beyond_context);
    ASSERT_FALSE(beyond.blockers.empty());
    EXPECT_NE(beyond.blockers.back().find("exceeds the model's max_position_embeddings " + std::to_string(context)),
              std::string::npos) << beyond.blockers.back();
    EXPECT_FALSE(beyond.fits);
    opt.max_length = kMaxPlanLength + 1;
    EXPECT_NE(error_of([&] { plan_memory(config, tensors, opt); }).find("beyond any model's context"), std::string::npos);
    opt.max_length = 40;
    opt.sequences = kMaxPlanBatch + 1;
    EXPECT_NE(error_of([&] { plan_memory(config, tensors, opt); }).find("sequences at once must lie in"), std::string::npos);
    opt.sequences = 6;
    opt.job = PlanJob::Extract;
    const MemoryPlan e = plan_memory(config, tensors, opt);
    EXPECT_EQ(e.kv_cache_per_rank, 0) << name;
    EXPECT_FALSE(e.beyond_context) << "extract plans lengths past the context (long samples are cut)";
    EXPECT_NE(e.activations.back().what.find("captured"), std::string::npos) << name;
  }
  // Kimi-K2.5 at tp 8 (the latent cache whole on every rank): 64 sequences of 4096 tokens hold
  // 64 x 4096 x 61 x 576 x 2 bytes = 17.16 GiB a rank, beyond the 96 GB card's margin; 32 fit.
  const std::string kimi = configs() + "/config-kimi-k25";
  if (!std::filesystem::exists(kimi)) GTEST_SKIP() << "no " << kimi;
  const nlohmann::json kc = read_model_config(kimi + "/config.transformers-5.7.0-redump.json");
  const std::vector<TensorInfo> kt = read_tensor_list(kimi + "/kimi-k2.5.tensors.expanded.jsonl.gz");
  PlanOptions k;
  k.job = PlanJob::Generate;
  k.tp = 8;
  k.sequences = 64;
  k.max_length = 4096;
  k.gpu_memory = parse_memory_size("96GB");
  const MemoryPlan kp = plan_memory(kc, kt, k);
  EXPECT_EQ(kp.kv_cache_per_rank, int64_t{64} * 4096 * 61 * 576 * 2);
  EXPECT_FALSE(kp.fits) << kp.margin / GiB;
  k.sequences = 32;
  EXPECT_TRUE(plan_memory(kc, kt, k).fits);
}

// A sharded checkpoint (model.safetensors.index.json): every shard's header is read.
TEST(MemoryPlan, ShardedCheckpointReadsEveryShard) {
  const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/llama2_linear";
  const json index = read_model_config(dir + "/model.safetensors.index.json");
  EXPECT_EQ(read_checkpoint_tensors(dir).size(), index["weight_map"].size());
}

std::string write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string safetensors_bytes(const std::string& header) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return len + header;
}

TEST(MemoryPlan, BadInputNamesTheFile) {
  const std::string dir = testing::scratch_dir("memory_plan_bad");
  EXPECT_NE(error_of([&] { read_model_config(dir); }).find(dir + "/config.json"), std::string::npos);
  EXPECT_NE(error_of([&] { read_checkpoint_tensors(dir); }).find("no model.safetensors"), std::string::npos);
  // A header that is not JSON.
  const std::string bad = write_file(dir + "/model.safetensors", safetensors_bytes("{not json"));
  std::string e = error_of([&] { read_checkpoint_tensors(dir); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_NE(e.find("bad JSON header"), std::string::npos) << e;
  // The loader's checks (io/safetensors.h), not a second parser's: a header-only copy is a truncated file,
  // which extract would refuse, and so does the plan; with its 16 data bytes it plans.
  const std::string x4 = "{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}";
  write_file(bad, safetensors_bytes(x4));
  e = error_of([&] { read_checkpoint_tensors(dir); });
  EXPECT_NE(e.find(bad + ": tensor 'x': data_offsets [0, 16) outside the data buffer of 0 bytes"), std::string::npos) << e;
  write_file(bad, safetensors_bytes(x4) + std::string(16, '\0'));
  EXPECT_EQ(read_checkpoint_tensors(dir).size(), 1u);
  // Offsets past the buffer of a file that has data, and dtypes the loader does not read.
  write_file(bad, safetensors_bytes("{\"x\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]}}") +
                      std::string(16, '\0'));
  e = error_of([&] { read_checkpoint_tensors(dir); });
  EXPECT_NE(e.find("tensor 'x': data_offsets [8, 24) outside the data buffer of 16 bytes"), std::string::npos) << e;
  for (const std::string dtype : {"I8", "F64", "F12"}) {
    write_file(bad, safetensors_bytes("{\"x\": {\"dtype\": \"" + dtype + "\", \"shape\": [4], \"data_offsets\": [0, 4]}}") +
                        std::string(32, '\0'));
    e = error_of([&] { read_checkpoint_tensors(dir); });
    EXPECT_NE(e.find(bad + ": tensor 'x' has dtype " + dtype + ", not supported"), std::string::npos) << e;
  }
  // A shape whose bytes pass 2^62 (a helper's [2^40, 2^40] embedding was summed as 0 B and "fits"), also
  // where the element count alone does not ([2^31, 2^31] F32: 2^64 bytes wrapped to 0 in the loader).
  for (const std::string shape : {"[1099511627776, 1099511627776]", "[2147483648, 2147483648]"}) {
    write_file(bad, safetensors_bytes("{\"x\": {\"dtype\": \"F32\", \"shape\": " + shape + ", \"data_offsets\": [0, 0]}}"));
    e = error_of([&] { read_checkpoint_tensors(dir); });
    EXPECT_NE(e.find("tensor 'x': shape overflows"), std::string::npos) << shape << ": " << e;
  }
  write_file(bad, std::string("\x10\0\0\0\0\0\0\0{}", 10));
  EXPECT_NE(error_of([&] { read_checkpoint_tensors(dir); }).find("truncated safetensors file"), std::string::npos);
  // An index naming a shard that is not there.
  std::filesystem::remove(bad);
  write_file(dir + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": \"model-1.safetensors\"}}");
  e = error_of([&] { read_checkpoint_tensors(dir); });
  EXPECT_NE(e.find("model-1.safetensors"), std::string::npos) << e;
  // A tensor list with a bad line.
  const std::string list = write_file(dir + "/t.jsonl", "{\"name\": \"a\", \"dtype\": \"bf16\", \"shape\": [2]}\n{oops\n");
  e = error_of([&] { read_tensor_list(list); });
  EXPECT_NE(e.find(list + ":2"), std::string::npos) << e;
  // Config fields.
  const std::vector<TensorInfo> one = {{"model.embed_tokens.weight", "BF16", {8, 4}}};
  e = error_of([&] { plan_memory(json{{"model_type", "llama"}}, one, PlanOptions{}, "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: config lacks \"hidden_size\""), std::string::npos) << e;
  e = error_of([&] { plan_memory(json{{"model_type", "gpt2"}}, one, PlanOptions{}, "x/config.json"); });
  EXPECT_NE(e.find("model_type \"gpt2\" is not planned"), std::string::npos) << e;
}

TEST(MemoryPlan, ParseMemorySize) {
  EXPECT_EQ(parse_memory_size("96GB"), int64_t{96} * 1000 * 1000 * 1000);
  EXPECT_EQ(parse_memory_size("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(parse_memory_size("1.5 gib"), int64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1000"), 1000);
  EXPECT_NE(error_of([] { parse_memory_size("96 GX"); }).find("unknown unit"), std::string::npos);
  EXPECT_NE(error_of([] { parse_memory_size("lots"); }).find("does not start with a number"), std::string::npos);
}

}  // namespace
}  // namespace aerie
