// The DeepSeek-V3 architecture (MLA attention + MoE FFN) against transformers 5.17 on the tiny random
// fixtures of tools/reference/make_deepseek_fixtures.py (tests/model/fixtures/hf/README.md):
//   hf/deepseek_v3   BF16, 3 layers (0 dense, 1-2 MoE: 8 experts, top 2, 4 groups / 2 kept, 1 shared
//                    expert), q_lora, YaRN (factor 40, original 64 positions: the test's positions reach
//                    past it), an MTP layer model.layers.3.* to skip.
// The reference is transformers' float32 forward (eager attention, grouped_mm experts in fp32), so the
// tolerance is the Llama families' (hf_reference.h): fp32 against fp32 in another summation order,
// measured float32 - float64 at most 3.6e-5 on r (|r| <= 21) by the fixture script.
// Also: the config fields, the YaRN tables the fixture records, the router's picks against
// transformers' (a wrong bias, group limit or ordering changes 3-15 of the 24 tokens' experts), one-shot
// vs chunked prefill (compare_with_reference's KV-cache pass), and messages for bad configs.
#include <cmath>
#include <fstream>

#include "hf_reference.h"
#include "kernels/rope.h"
#include "model/draft.h"
#include "model/target.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::fixture;
using testing::self_comm;

TEST(DeepseekV3, ConfigFields) {
  TargetConfig c = load_target_config(fixture("deepseek_v3"));
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.mla.q_lora_rank, 32);
  EXPECT_EQ(c.mla.kv_lora_rank, 32);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 16);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 8);
  EXPECT_EQ(c.mla.v_head_dim, 16);
  EXPECT_EQ(c.moe.n_routed_experts, 8);
  EXPECT_EQ(c.moe.first_k_dense_replace, 1);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1) && c.moe.is_moe_layer(2));
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.rope.type, "yarn");
  // The YaRN table and scales the fixture recorded from transformers.
  SafetensorsFile ref = load_safetensors(fixture("deepseek_v3") + "/reference.safetensors");
  testing::expect_close(rope_inv_freq(c.rope, c.mla.qk_rope_head_dim), ref.tensors.at("rope.inv_freq").to_float_vector(),
                        0.0f, 1e-6f, "inv_freq");
  EXPECT_NEAR(rope_attention_factor(c.rope), ref.tensors.at("rope.attention_scaling").to_float_vector()[0], 1e-7);
  const double m = yarn_mscale(c.rope.factor, c.rope.mscale_all_dim);
  EXPECT_NEAR(m * m / std::sqrt(24.0), ref.tensors.at("attn.softmax_scale").to_float_vector()[0], 1e-7);
}

TEST(DeepseekV3, MatchesTransformersBf16Weights) {
  auto self = self_comm();
  TargetModel model(fixture("deepseek_v3"), *self);
  testing::compare_with_reference(model, fixture("deepseek_v3") + "/reference.safetensors", 5);
  testing::compare_with_reference(model, fixture("deepseek_v3") + "/reference.safetensors", 17);
}

TEST(DeepseekV3, Bf16ModeWithinTheBf16Bound) {
  auto self = self_comm();
  TargetModel f32(fixture("deepseek_v3"), *self), b16(fixture("deepseek_v3"), *self, {Device::CPU, DType::BF16});
  SafetensorsFile ref = load_safetensors(fixture("deepseek_v3") + "/reference.safetensors");
  const std::vector<int32_t> ids = testing::reference_ids(ref);
  TargetOutput a = f32.forward(ids, nullptr, {1, 3}, true), b = b16.forward(ids, nullptr, {1, 3}, true);
  // Measured 0.015 (aux), 0.0169 (final): bf16 GEMM inputs and attention over 3 layers, with an MoE
  // router whose picks may flip on knife-edge tokens; the Llama families' bound, kBf16RelL2 = 0.03.
  EXPECT_LE(testing::rel_l2(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector()), 0.03);
  EXPECT_LE(testing::rel_l2(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector()), 0.03);
  std::printf("deepseek_v3: bf16 mode vs f32, relative L2 aux %.4g, final %.4g\n",
              testing::rel_l2(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector()),
              testing::rel_l2(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector()));
}

TEST(DeepseekV3, BatchedEqualsAlone) {
  auto self = self_comm();
  TargetModel model(fixture("deepseek_v3"), *self);
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 9, 33, 60}, {2, 17, 41}, {8, 63, 12, 200, 7, 7, 3}};
  TargetOutput all = model.forward_batch(seqs, {}, {0, 2, 3}, TargetModel::Logits::All);
  int64_t row = 0;
  for (const auto& s : seqs) {
    TargetOutput one = model.forward(s, nullptr, {0, 2, 3}, true);
    const int64_t n = static_cast<int64_t>(s.size());
    // The varlen attention and the GEMMs over more rows sum in other orders: 1e-5 of the tensor's scale.
    testing::expect_close_scaled(all.logits.slice(row, row + n).to_float_vector(), one.logits.to_float_vector(),
                                 1e-5f, "batched logits");
    testing::expect_close_scaled(all.aux_hidden.slice(row, row + n).to_float_vector(),
                                 one.aux_hidden.to_float_vector(), 1e-5f, "batched aux");
    row += n;
  }
}

/// Three sequences a, c, d whose first 5 / 3 / 4 ids are prefilled into their caches; then a mixed step (a by two
/// rows, c and d by one) and decoding steps t = 0..2 of one row each.
struct DecodingCase {
  const std::vector<int32_t> a = {1, 5, 9, 33, 60, 2, 17, 41, 8, 63}, c = {2, 17, 41, 8, 63, 12, 7},
                             d = {8, 63, 12, 200, 7, 7, 3, 90};
  KVCache ca, cc, cd;
  explicit DecodingCase(TargetModel& m) : ca(m.make_cache(10)), cc(m.make_cache(7)), cd(m.make_cache(8)) {
    m.forward(std::vector<int32_t>(a.begin(), a.begin() + 5), &ca, {}, false);
    m.forward(std::vector<int32_t>(c.begin(), c.begin() + 3), &cc, {}, false);
    m.forward(std::vector<int32_t>(d.begin(), d.begin() + 4), &cd, {}, false);
  }
  TargetOutput mixed(TargetModel& m) {
    return m.forward_batch({{a[5], a[6]}, {c[3]}, {d[4]}}, {&ca, &cc, &cd}, {}, TargetModel::Logits::All);
  }
  TargetOutput step(TargetModel& m, int64_t t) {
    return m.forward_batch({{a[7 + t]}, {c[4 + t]}, {d[5 + t]}}, {&ca, &cc, &cd}, {}, TargetModel::Logits::Last);
  }
};

/// DecodingCase's steps, every row against forward() of the whole sequence. On a GPU the one-row sequences take
/// the batched absorbed form (MlaAttention::absorbed_batch) when it is on, the two-row one its own.
void check_batched_decoding(TargetModel& m, float tol, const std::string& what) {
  DecodingCase dc(m);
  const std::vector<int32_t>&a = dc.a, &c = dc.c, &d = dc.d;
  TargetOutput fa = m.forward(a, nullptr, {}, true), fc = m.forward(c, nullptr, {}, true),
               fd = m.forward(d, nullptr, {}, true);
  auto expect_row = [&](const Tensor& got, int64_t row, const Tensor& want, int64_t wrow, const std::string& w) {
    testing::expect_close_scaled(got.slice(row, row + 1).to_float_vector(),
                                 want.slice(wrow, wrow + 1).to_float_vector(), tol, what + " " + w);
  };
  TargetOutput mixed = dc.mixed(m);
  ASSERT_EQ(mixed.logits.dim(0), 4);
  expect_row(mixed.logits, 0, fa.logits, 5, "mixed step, two-row sequence, row 0");
  expect_row(mixed.logits, 1, fa.logits, 6, "mixed step, two-row sequence, row 1");
  expect_row(mixed.logits, 2, fc.logits, 3, "mixed step, one-row sequence 1");
  expect_row(mixed.logits, 3, fd.logits, 4, "mixed step, one-row sequence 2");
  for (int64_t t = 0; t < 3; ++t) {
    TargetOutput step = dc.step(m, t);
    const std::string w = "decoding step " + std::to_string(t);
    ASSERT_EQ(step.logits.dim(0), 3) << w;
    expect_row(step.logits, 0, fa.logits, 7 + t, w + " sequence 0");
    expect_row(step.logits, 1, fc.logits, 4 + t, w + " sequence 1");
    expect_row(step.logits, 2, fd.logits, 5 + t, w + " sequence 2");
  }
  EXPECT_EQ(dc.ca.length(), 10);
  EXPECT_EQ(dc.cc.length(), 7);
  EXPECT_EQ(dc.cd.length(), 8);
}

/// The fixture's config with the real models' MLA widths (qk_nope 128, qk_rope 64, v 128) and the given
/// kv_lora_rank (Kimi-K2.5 / DeepSeek-V3: 512), written to a scratch folder.
TargetConfig real_heads_config(int64_t kv_lora, const std::string& name) {
  nlohmann::json j;
  std::ifstream(fixture("deepseek_v3") + "/config.json") >> j;
  j["qk_nope_head_dim"] = 128;
  j["qk_rope_head_dim"] = 64;
  j["v_head_dim"] = 128;
  j["kv_lora_rank"] = kv_lora;
  j["num_nextn_predict_layers"] = 0;
  const std::string dir = testing::scratch_dir(name);
  std::ofstream(dir + "/config.json") << j.dump();
  return load_target_config(dir);
}

TEST(DeepseekV3, BatchedDecodingEqualsWholeForward) {
  auto self = self_comm();
  TargetModel model(fixture("deepseek_v3"), *self);
  // The absorbed decoding against the expanded prefill of forward(): 1e-5 of the tensor's scale, as
  // BatchedEqualsAlone; per sequence (the CPU's default) and batched (absorbed_batch, opt-in on the CPU).
  check_batched_decoding(model, 1e-5f, "cpu");
  testing::ScopedEnv on("AERIE_BATCHED_DECODE", "1");
  check_batched_decoding(model, 1e-5f, "cpu batched");
}

TEST(DeepseekV3, MlaCacheHoldsTheLatent) {
  auto self = self_comm();
  TargetModel model(fixture("deepseek_v3"), *self);
  KVCache cache = model.make_cache(10);
  ASSERT_EQ(cache.k.size(), 3u);
  EXPECT_EQ(cache.k[0].shape(), (Shape{10, 32 + 8}));  // kv_lora_rank + qk_rope_head_dim per token
  EXPECT_FALSE(cache.v[0].defined());
}

TEST(DeepseekV3, DraftShapeIsItsOwn) {
  // The target's head_dim is MLA's rotary width (8 here, 64 in the real models); the draft gets the
  // target's heads of v_head_dim each, with as many kv heads (SpecForge's Kimi draft: 64 x 128, 64 kv).
  const TargetConfig t = load_target_config(fixture("deepseek_v3"));
  EXPECT_EQ(t.head_dim, 8);
  const DraftConfig d = DraftConfig::from_target(t, 64, {0, 1, 3});
  EXPECT_EQ(d.head_dim, 16);
  EXPECT_EQ(d.num_attention_heads, 4);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.intermediate_size, 192);
  EXPECT_EQ(d.rope.type, "yarn");  // the target's rope settings, exported as rope_scaling
}

TEST(DeepseekV3, BadConfigsAreNamed) {
  const std::string dir = testing::scratch_dir("deepseek_bad_config");
  nlohmann::json j;
  std::ifstream(fixture("deepseek_v3") + "/config.json") >> j;
  auto write = [&](const nlohmann::json& c) { std::ofstream(dir + "/config.json") << c.dump(); };
  nlohmann::json c = j;
  c.erase("kv_lora_rank");
  write(c);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("\"kv_lora_rank\""), std::string::npos);
  c = j;
  c["scoring_func"] = "softmax";
  write(c);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("scoring_func"), std::string::npos);
  c = j;
  c["n_group"] = 3;  // 8 experts do not split into 3 groups
  write(c);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("n_group 3"), std::string::npos);
  c = j;
  c["model_type"] = "deepseek_v4";
  write(c);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("not supported"), std::string::npos);
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

// ---- CUDA (skipped without a GPU) ----

TEST(DeepseekV3Cuda, F32MatchesTransformersAndBf16WithinTheBound) {
  AERIE_REQUIRE_CUDA();
  auto self = testing::self_comm();
  TargetModel gpu(testing::fixture("deepseek_v3"), *self, {Device::CUDA, DType::F32});
  testing::compare_with_reference(gpu, testing::fixture("deepseek_v3") + "/reference.safetensors", 5);
  TargetModel cpu(testing::fixture("deepseek_v3"), *self);
  TargetModel b16(testing::fixture("deepseek_v3"), *self, {Device::CUDA, DType::BF16});
  const std::vector<int32_t> ids = {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200, 7, 7, 3};
  TargetOutput a = cpu.forward(ids, nullptr, {1, 3}, true), b = b16.forward(ids, nullptr, {1, 3}, true);
  const double aux = testing::rel_l2(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector());
  const double fin = testing::rel_l2(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector());
  TargetModel cpu16(testing::fixture("deepseek_v3"), *self, {Device::CPU, DType::BF16});
  TargetOutput c = cpu16.forward(ids, nullptr, {1, 3}, true);
  std::printf("deepseek_v3 CUDA bf16 vs CPU f32: relative L2 aux %.4g, final %.4g; CPU bf16 vs CPU f32 %.4g %.4g; "
              "CUDA bf16 vs CPU bf16 %.4g %.4g\n",
              aux, fin, testing::rel_l2(c.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector()),
              testing::rel_l2(c.final_hidden.to_float_vector(), a.final_hidden.to_float_vector()),
              testing::rel_l2(b.aux_hidden.to_float_vector(), c.aux_hidden.to_float_vector()),
              testing::rel_l2(b.final_hidden.to_float_vector(), c.final_hidden.to_float_vector()));
  // Measured on an H200: 0.0339 (aux), 0.0379 (final), and the CPU bf16 mode gives the same on these 15
  // tokens (CUDA bf16 = CPU bf16 to the printed digits; the fixture's own 24 ids give 0.015 / 0.017): the
  // bf16 mode's error on this tiny random model, where a bf16 router input can move a knife-edge expert
  // choice. Bound: 0.06.
  EXPECT_LE(aux, 0.06);
  EXPECT_LE(fin, 0.06);
}

TEST(DeepseekV3Cuda, RealHeadDimsRandomModelEqualsCpu) {
  // The real models' MLA head (qk_nope 128 + qk_rope 64 = 192 for queries and keys, v 128) on a small
  // random model: CUDA F32 equals the CPU (the forward's DP = 256 attention path).
  AERIE_REQUIRE_CUDA();
  const TargetConfig cfg = real_heads_config(64, "deepseek_real_heads");
  auto self = self_comm();
  TargetModel cpu = TargetModel::random(cfg, *self, {Device::CPU, DType::F32}, 3);
  TargetModel gpu = TargetModel::random(cfg, *self, {Device::CUDA, DType::F32}, 3);
  const std::vector<int32_t> ids = {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200, 7, 7, 3, 90, 91, 92};
  TargetOutput a = cpu.forward(ids, nullptr, {1, 3}, true), b = gpu.forward(ids, nullptr, {1, 3}, true);
  testing::expect_close_scaled(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector(), 1e-5f, "aux");
  testing::expect_close_scaled(b.logits.to_float_vector(), a.logits.to_float_vector(), 1e-5f, "logits");
  KVCache cache = gpu.make_cache(static_cast<int64_t>(ids.size()));
  gpu.forward(std::vector<int32_t>(ids.begin(), ids.begin() + 10), &cache, {}, false);
  TargetOutput c = gpu.forward(std::vector<int32_t>(ids.begin() + 10, ids.end()), &cache, {}, true);
  testing::expect_close_scaled(c.logits.to_float_vector(), a.logits.slice(10, a.logits.dim(0)).to_float_vector(), 1e-5f,
                               "chunked logits");
}

/// The logits of DecodingCase's four steps (the mixed one, then three of one row each) on `m`, concatenated as
/// F32, with AERIE_BATCHED_DECODE at `batched` ("0": per sequence, "1": absorbed_batch).
std::vector<float> decoding_logits(TargetModel& m, const char* batched) {
  testing::ScopedEnv env("AERIE_BATCHED_DECODE", batched);
  DecodingCase dc(m);
  std::vector<float> out = dc.mixed(m).logits.to_float_vector();
  for (int64_t t = 0; t < 3; ++t) {
    const std::vector<float> step = dc.step(m, t).logits.to_float_vector();
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

TEST(DeepseekV3Cuda, BatchedDecodingBf16) {
  // generate's dtype: with the real latent (512 + 64), bf16 decoding steps in the batched absorbed form
  // (absorbed_batch: p kept fp32) are no further from the F32 model's logits than the per-sequence absorbed
  // form's (p rounded to bf16), and both within the bf16 bound of Bf16ModeWithinTheBf16Bound.
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  const TargetConfig cfg = real_heads_config(512, "deepseek_real_latent_bf16");
  TargetModel f32 = TargetModel::random(cfg, *self, {Device::CUDA, DType::F32}, 5);
  TargetModel b16 = TargetModel::random(cfg, *self, {Device::CUDA, DType::BF16}, 5);
  const std::vector<float> ref = decoding_logits(f32, "0");
  const double per = testing::rel_l2(decoding_logits(b16, "0"), ref);
  const double batched = testing::rel_l2(decoding_logits(b16, "1"), ref);
  const double between = testing::rel_l2(decoding_logits(b16, "1"), decoding_logits(b16, "0"));
  std::printf("MLA bf16 decoding vs F32: relative L2 per sequence %.4g, batched %.4g; batched vs per sequence %.4g\n",
              per, batched, between);
  // Measured on an H100 (as the GPU is and as sm_120): 0.00729 per sequence, 0.00727 batched, 0.00387 apart.
  EXPECT_LE(per, 0.06);
  EXPECT_LE(batched, std::max(1.5 * per, 0.01));
  EXPECT_LE(between, 0.06);
}

TEST(DeepseekV3Cuda, BatchedDecodingEqualsWholeForward) {
  // The batched absorbed form (scatter_rows + attention_decode_batch) in decoding and mixed steps: the
  // fixture (latent 32 + 8) and a random model with the real latent (512 + 64: the kernel's widest case).
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  TargetModel gpu(fixture("deepseek_v3"), *self, {Device::CUDA, DType::F32});
  {
    testing::ScopedEnv off("AERIE_BATCHED_DECODE", "0");  // the per-sequence absorbed form
    check_batched_decoding(gpu, 1e-5f, "cuda f32 fixture, per sequence");
  }
  // the batched form (CUDA's default for MLA too: model/blocks.h batched_decoding; set here so that the test keeps
  // testing it whatever the default)
  testing::ScopedEnv on("AERIE_BATCHED_DECODE", "1");
  check_batched_decoding(gpu, 1e-5f, "cuda f32 fixture");
  TargetModel real = TargetModel::random(real_heads_config(512, "deepseek_real_latent"), *self,
                                         {Device::CUDA, DType::F32}, 5);
  check_batched_decoding(real, 1e-5f, "cuda f32 latent 512 + 64");
}

}  // namespace
}  // namespace aerie
