// The quantized targets (issue 12 item 4): DeepSeek-V3's block FP8 and Kimi-K2.5's INT4 experts kept as
// shipped and dequantized per Linear (model/linear.h), against transformers 5.17 on the tiny fixtures
// of tools/reference/make_deepseek_fixtures.py (tests/model/fixtures/hf/README.md):
//   hf/deepseek_v3_fp8   deepseek_v3's weights, every attention / MLP / expert Linear block FP8
//   hf/kimi_k25_int4     Kimi-K2.5's wrapper (language_model.*, vision_tower.*, mm_projector.*), routed
//                        experts INT4 pack-quantized (group 32)
// F32 mode keeps the exact fp32 dequantized products, so it is compared with reference_f32_dequant
// (transformers' fp32 forward of those products) at the fp32 tolerance of deepseek_test.cc; BF16 mode
// rounds them to bf16 as reference.safetensors does and is held to a measured relative L2 bound.
// Also: the weights stay compressed after load, tensor-parallel slices of the quantized tensors
// dequantize to the slices of the whole (block-misaligned FP8 slices included), and the errors of
// bad quantization configs and tensors name the file and the field or tensor.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "hf_reference.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/rope.h"
#include "model/target.h"
#include "model/target_config.h"
#include "model/weight_source.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::fixture;
using testing::self_comm;

std::vector<int32_t> reference_ids(const SafetensorsFile& ref) {
  const Tensor& t = ref.tensors.at("ids");
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

/// The BF16 mode of `dir` against `reference`: the relative L2 of every r^k (k = 1..N), z and the logits,
/// each over the tokens whose r^N row is within 10% of the reference's (printed); returns the worst
/// and sets `flipped` to the number of tokens left out. A token left out is one whose MoE router pick
/// flipped under the bf16 activations: deepseek_v3_fp8's smallest layer-2 router margin is 0.0025
/// (reference metadata), token 14 there lands 35% away at r^3 while every other token stays below 3%.
double bf16_rel_l2(const std::string& dir, const std::string& reference, int& flipped) {
  auto self = self_comm();
  TargetModel m(dir, *self, {Device::CPU, DType::BF16});
  SafetensorsFile ref = load_safetensors(reference);
  const int N = static_cast<int>(m.config().num_hidden_layers);
  const int64_t H = m.config().hidden_size, V = m.config().vocab_size;
  std::vector<int> aux;
  for (int k = 0; k <= N; ++k) aux.push_back(k);
  const std::vector<int32_t> ids = reference_ids(ref);
  const int64_t T = static_cast<int64_t>(ids.size());
  TargetOutput o = m.forward(ids, nullptr, aux, true);
  std::vector<std::vector<float>> got, want;  // r^1..r^N, z, logits: [T, C] each
  for (int k = 1; k <= N; ++k) {
    got.push_back(testing::cols(o.aux_hidden, k * H, (k + 1) * H));
    want.push_back(ref.tensors.at("r").slice(k, k + 1).to_float_vector());
  }
  got.push_back(o.final_hidden.to_float_vector());
  want.push_back(ref.tensors.at("z").to_float_vector());
  got.push_back(o.logits.to_float_vector());
  want.push_back(ref.tensors.at("logits").to_float_vector());
  std::vector<bool> keep(static_cast<size_t>(T));
  flipped = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto& g = got[N - 1];
    const auto& w = want[N - 1];
    keep[t] = testing::rel_l2({g.begin() + t * H, g.begin() + (t + 1) * H}, {w.begin() + t * H, w.begin() + (t + 1) * H}) < 0.1;
    flipped += keep[t] ? 0 : 1;
  }
  double worst = 0;
  std::printf("%s: bf16 mode vs %s, relative L2 (%d token(s) left out):", dir.c_str(), reference.c_str(), flipped);
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t C = i + 1 == got.size() ? V : H;
    std::vector<float> g, w;
    for (int64_t t = 0; t < T; ++t) {
      if (!keep[t]) continue;
      g.insert(g.end(), got[i].begin() + t * C, got[i].begin() + (t + 1) * C);
      w.insert(w.end(), want[i].begin() + t * C, want[i].begin() + (t + 1) * C);
    }
    const double e = testing::rel_l2(g, w);
    std::printf(" %.4g", e);
    worst = std::max(worst, e);
  }
  std::printf("\n");
  return worst;
}

TEST(QuantFp8, ConfigIsBlockFp8) {
  EXPECT_EQ(load_target_config(fixture("deepseek_v3_fp8")).quant.method, QuantConfig::Method::Fp8Block);
  EXPECT_EQ(load_target_config(fixture("kimi_k25_int4")).quant.method, QuantConfig::Method::Int4Group);
  EXPECT_EQ(load_target_config(fixture("deepseek_v3")).quant.method, QuantConfig::Method::None);
}

TEST(QuantFp8, F32MatchesTheF32DequantReference) {
  auto self = self_comm();
  TargetModel model(fixture("deepseek_v3_fp8"), *self);
  testing::compare_with_reference(model, fixture("deepseek_v3_fp8") + "/reference_f32_dequant.safetensors", 5);
}

// Kimi's fixture differs from transformers by more than deepseek_v3's from layer 0 on, which holds no
// INT4 weight: r^1 by 4.6e-5 (deepseek_v3_fp8: 1.3e-5), growing with |r| to 2.06e-4 at r^3 (|r| <= 21.2,
// 1e-5 of the scale; r^2 8.2e-5, z and the logits within the usual bound). The reference's rope tables
// are matched first, so this is fp32 summation order through YaRN factor 64 attention, not a table;
// atol 5e-4 leaves 2.4x over the measured worst, still far below an INT4 nibble or group scale error
// (one wrong nibble of one expert moves r by ~1e-2 here).
TEST(QuantInt4, F32MatchesTheF32DequantReference) {
  auto self = self_comm();
  TargetModel model(fixture("kimi_k25_int4"), *self);
  SafetensorsFile ref = load_safetensors(fixture("kimi_k25_int4") + "/reference_f32_dequant.safetensors");
  const TargetConfig& c = model.config();
  testing::expect_close(rope_inv_freq(c.rope, c.mla.qk_rope_head_dim), ref.tensors.at("rope.inv_freq").to_float_vector(),
                        0.0f, 1e-6f, "inv_freq");
  EXPECT_NEAR(rope_attention_factor(c.rope), ref.tensors.at("rope.attention_scaling").to_float_vector()[0], 1e-7);
  testing::compare_with_reference(model, fixture("kimi_k25_int4") + "/reference_f32_dequant.safetensors", 5, 5e-4f,
                                  testing::kRtol);
}

// The BF16 mode dequantizes to bf16 as reference.safetensors does; what is left is the bf16 rounding of
// the GEMM inputs (deepseek_test.cc: 0.015-0.017 on the unquantized fixture). Measured: deepseek_v3_fp8
// worst 0.0139 with one token (a router flip, see bf16_rel_l2) left out, kimi_k25_int4 0.0233 (r^3)
// with none; the Llama families' bound kBf16RelL2 = 0.03.
TEST(QuantFp8, Bf16ModeWithinTheBf16Bound) {
  int flipped = 0;
  EXPECT_LE(bf16_rel_l2(fixture("deepseek_v3_fp8"), fixture("deepseek_v3_fp8") + "/reference.safetensors", flipped),
            0.03);
  // Tokens whose bf16 router picks another expert than transformers' (a near-tie decided by bf16
  // rounding; left out of the L2): 1 with OpenBLAS's Zen kernels, 2 with its Haswell, SkylakeX and
  // Sandybridge kernels since the expert outputs are rounded to bf16 as transformers' are (measured);
  // a wrong router flips most of the 24.
  EXPECT_LE(flipped, 2);
}

TEST(QuantInt4, Bf16ModeWithinTheBf16Bound) {
  int flipped = 0;
  EXPECT_LE(bf16_rel_l2(fixture("kimi_k25_int4"), fixture("kimi_k25_int4") + "/reference.safetensors", flipped),
            0.03);
  EXPECT_EQ(flipped, 0);
}

/// Linear `name` [N, K] of `dir` for tp rank r of `tp` (no communicator needed: a WeightSource only
/// slices), in the stored format, on the CPU.
Linear load_at(const std::string& dir, const std::string& name, const Shape& full, TpSplit split, int r, int tp) {
  auto src = checkpoint_weights(dir, r, tp, Device::CPU, DType::F32, load_target_config(dir).quant);
  return src->load_linear(name, full, split);
}

std::vector<float> dense_of(const Linear& L) {
  Tensor w = Tensor::empty({L.out, L.in}, DType::F32);
  L.dequantize(w);
  return w.to_float_vector();
}

TEST(QuantFp8, WeightsStayCompressed) {
  const std::string p = "model.layers.1.mlp.";
  Linear gu = load_at(fixture("deepseek_v3_fp8"), p + "experts.3.gate_proj", {32, 64}, TpSplit::None, 0, 1);
  EXPECT_EQ(gu.format, WeightFormat::BlockFp8);
  ASSERT_EQ(gu.parts.size(), 1u);
  EXPECT_FALSE(gu.weight.defined());
  EXPECT_EQ(gu.parts[0].weight.dtype(), DType::F8E4M3);
  EXPECT_EQ(gu.parts[0].scale.dtype(), DType::F32);
  EXPECT_EQ(gu.parts[0].scale.shape(), (Shape{1, 1}));
  EXPECT_EQ(gu.weight_bytes(), 32 * 64 + 4);
  // The router and the norms stay dense; lm_head too.
  auto src = checkpoint_weights(fixture("deepseek_v3_fp8"), 0, 1, Device::CPU, DType::BF16,
                                load_target_config(fixture("deepseek_v3_fp8")).quant);
  EXPECT_EQ(src->load_linear("lm_head", {256, 64}, TpSplit::None).format, WeightFormat::Dense);
}

TEST(QuantInt4, WeightsStayCompressed) {
  const std::string e = "language_model.model.layers.2.mlp.experts.5.";
  Linear down = load_at(fixture("kimi_k25_int4"), e + "down_proj", {64, 64}, TpSplit::Cols, 0, 1);
  EXPECT_EQ(down.format, WeightFormat::Int4Group);
  EXPECT_EQ(down.parts[0].weight.dtype(), DType::I32);
  EXPECT_EQ(down.parts[0].weight.shape(), (Shape{64, 8}));
  EXPECT_EQ(down.parts[0].scale.dtype(), DType::BF16);
  EXPECT_EQ(down.parts[0].scale.shape(), (Shape{64, 2}));
  // Kimi-K2.5 quantizes the routed experts only: attention and shared experts are dense BF16.
  Linear q = load_at(fixture("kimi_k25_int4"), "language_model.model.layers.2.self_attn.q_a_proj", {32, 64},
                     TpSplit::None, 0, 1);
  EXPECT_EQ(q.format, WeightFormat::Dense);
}

// Random weights in the shipped formats (the speed benchmark's targets): Kimi-K2.5's routed experts INT4
// and nothing else, DeepSeek-V3's Linears FP8, with scales that give weights of about the requested std;
// a forward of such a random target is finite.
TEST(QuantRandom, RandomWeightsInTheShippedFormats) {
  const TargetConfig kimi = load_target_config(fixture("kimi_k25_int4"));
  auto r = random_weights(3, 0, 1, Device::CPU, DType::F32, 0.02f, kimi.quant);
  Linear e = r->load_linear("model.layers.1.mlp.experts.0.down_proj", {64, 64}, TpSplit::Cols);
  ASSERT_EQ(e.format, WeightFormat::Int4Group);
  EXPECT_EQ(e.parts[0].weight.shape(), (Shape{64, 8}));
  EXPECT_EQ(r->load_linear("model.layers.1.self_attn.q_a_proj", {32, 64}, TpSplit::None).format, WeightFormat::Dense);
  auto f = random_weights(3, 0, 1, Device::CPU, DType::F32, 0.02f,
                          load_target_config(fixture("deepseek_v3_fp8")).quant);
  Linear q = f->load_linear("model.layers.0.self_attn.q_b_proj", {96, 32}, TpSplit::Rows);
  ASSERT_EQ(q.format, WeightFormat::BlockFp8);
  for (const Linear* L : {&e, &q}) {
    const std::vector<float> w = dense_of(*L);
    double ss = 0;
    for (float x : w) {
      ASSERT_TRUE(std::isfinite(x));
      ss += double{x} * x;
    }
    const double rms = std::sqrt(ss / w.size());
    EXPECT_GT(rms, 0.01);
    EXPECT_LT(rms, 0.04);
  }
  auto self = self_comm();
  TargetModel m = TargetModel::random(kimi, *self, {Device::CPU, DType::F32}, 5);
  const TargetOutput out = m.forward({1, 2, 3, 4, 5, 6}, nullptr, {1, 2, 3}, true);
  for (float x : out.logits.to_float_vector()) ASSERT_TRUE(std::isfinite(x));
}

/// Rank r's slice of `name` under tp 2 dequantizes to the same slice of the whole dequantized weight.
void expect_slices_exact(const std::string& dir, const std::string& name, const Shape& full, TpSplit split) {
  const std::vector<float> whole = dense_of(load_at(dir, name, full, TpSplit::None, 0, 1));
  const int64_t N = full[0], K = full[1];
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> part = dense_of(load_at(dir, name, full, split, r, 2));
    std::vector<float> want;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < K; ++j) {
        const bool in = split == TpSplit::Rows ? i / (N / 2) == r : j / (K / 2) == r;
        if (in) want.push_back(whole[i * K + j]);
      }
    EXPECT_EQ(part, want) << name << " rank " << r << " of 2";
  }
}

// The tp 2 slices of the fixtures: dense MLP gate rows [96, 192) and down_proj columns [96, 192) start
// inside the first 128-block and end in the partial edge block; q_b's 48 rows of 96 and the experts'
// 16 down columns of 32 lie inside one block. All are exact: each stored block keeps its own scale.
TEST(QuantFp8, TpSlicesAreExactInsideAndAcrossBlocks) {
  const std::string d = fixture("deepseek_v3_fp8"), l0 = "model.layers.0.", l1 = "model.layers.1.";
  expect_slices_exact(d, l0 + "mlp.gate_proj", {192, 64}, TpSplit::Rows);
  expect_slices_exact(d, l0 + "mlp.down_proj", {64, 192}, TpSplit::Cols);
  expect_slices_exact(d, l0 + "self_attn.q_b_proj", {96, 32}, TpSplit::Rows);
  expect_slices_exact(d, l0 + "self_attn.o_proj", {64, 64}, TpSplit::Cols);
  expect_slices_exact(d, l1 + "mlp.experts.0.down_proj", {64, 32}, TpSplit::Cols);
  Linear gu = load_at(d, l0 + "mlp.gate_proj", {192, 64}, TpSplit::Rows, 1, 2);
  EXPECT_EQ(gu.parts[0].r_off, 96);  // stored from row 0: the block of rows 96..127
  EXPECT_EQ(gu.parts[0].weight.dim(0), 192);
}

TEST(QuantInt4, TpSlicesAreExact) {
  const std::string d = fixture("kimi_k25_int4"), e = "language_model.model.layers.1.mlp.experts.2.";
  expect_slices_exact(d, e + "gate_proj", {64, 64}, TpSplit::Rows);
  expect_slices_exact(d, e + "down_proj", {64, 64}, TpSplit::Cols);  // 32 columns: one group per rank
  // tp 4 would give 16 columns, half a group: an error naming the tensor.
  const std::string err = testing::error_of([&] { load_at(d, e + "down_proj", {64, 64}, TpSplit::Cols, 0, 4); });
  EXPECT_NE(err.find(e + "down_proj.weight_packed"), std::string::npos) << err;
  EXPECT_NE(err.find("group"), std::string::npos) << err;
}

TEST(QuantInt4, WrapperSkipsTheVisionTensors) {
  HfCheckpoint ck(fixture("kimi_k25_int4"));
  EXPECT_EQ(ck.decoder_prefix(), "language_model.model.");
  EXPECT_EQ(ck.lm_head_name(), "language_model.lm_head.weight");
  const auto others = ck.other_tensors();
  ASSERT_EQ(others.size(), 2u);
  EXPECT_GT(others.at("vision_tower"), 0);
  EXPECT_GT(others.at("mm_projector"), 0);
  auto self = self_comm();
  init_logging(0, "info");
  ::testing::internal::CaptureStderr();
  TargetModel m(fixture("kimi_k25_int4"), *self);  // finish(): every language-model tensor read, the rest logged
  const std::string log = ::testing::internal::GetCapturedStderr();
  init_logging(0, "warning");
  EXPECT_EQ(m.config().model_type, "deepseek_v3");
  EXPECT_NE(log.find("skipped the tensors outside the language model: mm_projector.* ("), std::string::npos) << log;
  EXPECT_NE(log.find("vision_tower.* ("), std::string::npos) << log;
}

// ---- errors --------------------------------------------------------------------------------------

/// A copy of fixture `name` as one model.safetensors, its tensors passed through `edit`, and its
/// config.json through `edit_config`.
std::string edited_copy(const std::string& name, const std::string& tag,
                        const std::function<void(std::map<std::string, Tensor>&)>& edit,
                        const std::function<void(nlohmann::json&)>& edit_config = {}) {
  const std::string dir = testing::scratch_dir("quant_" + tag);
  SafetensorsFile all;
  for (const auto& f : std::filesystem::directory_iterator(fixture(name))) {
    const std::string fn = f.path().filename().string();
    if (fn.rfind("model-", 0) != 0 && fn != "model.safetensors") continue;
    for (auto& [k, v] : load_safetensors(f.path().string()).tensors) all.tensors[k] = v;
  }
  edit(all.tensors);
  save_safetensors(dir + "/model.safetensors", all);
  nlohmann::json c;
  std::ifstream(fixture(name) + "/config.json") >> c;
  if (edit_config) edit_config(c);
  std::ofstream(dir + "/config.json") << c.dump();
  return dir;
}

std::string load_error(const std::string& dir) {
  return testing::error_of([&] {
    auto self = self_comm();
    TargetModel m(dir, *self);
  });
}

TEST(QuantErrors, BadQuantizationConfigsNameTheField) {
  auto none = [](std::map<std::string, Tensor>&) {};
  struct Case {
    const char* fixture;
    std::function<void(nlohmann::json&)> edit;
    const char* want;
  };
  auto& fp8 = "deepseek_v3_fp8";
  auto& int4 = "kimi_k25_int4";
  const std::vector<Case> cases = {
      {fp8, [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; }, "quant_method \"awq\""},
      {fp8, [](nlohmann::json& c) { c["quantization_config"]["fmt"] = "e5m2"; }, "quantization_config.fmt"},
      {fp8, [](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {64, 64}; },
       "quantization_config.weight_block_size"},
      {fp8, [](nlohmann::json& c) { c["quantization_config"]["modules_to_not_convert"] = {"x"}; },
       "quantization_config.modules_to_not_convert"},
      // Kimi-K2.5's wrapper carries one at the top level (what vLLM reads) and one in text_config.
      {int4, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 128; },
       "weights.group_size"},
      {int4, [](nlohmann::json& c) { c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8; },
       "weights.num_bits"},
      {int4, [](nlohmann::json& c) { c["quantization_config"]["format"] = "int-quantized"; },
       "quantization_config.format"},
      // Without a top-level one, text_config's is read (vLLM: "some vision model may keep
      // quantization_config in their text_config").
      {int4,
       [](nlohmann::json& c) {
         c.erase("quantization_config");
         c["text_config"]["quantization_config"]["format"] = "int-quantized";
       },
       "quantization_config.format"},
  };
  int i = 0;
  for (const Case& k : cases) {
    const std::string dir = edited_copy(k.fixture, "cfg" + std::to_string(i++), none, k.edit);
    const std::string err = testing::error_of([&] { load_target_config(dir); });
    EXPECT_NE(err.find("config.json"), std::string::npos) << err;
    EXPECT_NE(err.find(k.want), std::string::npos) << "want \"" << k.want << "\" in: " << err;
  }
}

TEST(QuantConfigTest, TheTopLevelQuantizationConfigWinsOverTextConfigs) {
  // vLLM (model_executor/model_loader/weight_utils.py, get_quant_config) reads hf_config.quantization_config
  // and falls back to text_config's only when the top level has none; the loader and the memory plan alike.
  auto none = [](std::map<std::string, Tensor>&) {};
  const nlohmann::json fp8 = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  std::string dir = edited_copy("kimi_k25_int4", "top_wins", none,
                                [&](nlohmann::json& c) { c["text_config"]["quantization_config"] = fp8; });
  EXPECT_EQ(load_target_config(dir).quant.method, QuantConfig::Method::Int4Group);
  EXPECT_EQ(load_error(dir), "");  // INT4 tensors, as the top level says
  dir = edited_copy("kimi_k25_int4", "text_fallback", none, [&](nlohmann::json& c) {
    c.erase("quantization_config");
    c["text_config"]["quantization_config"] = fp8;
  });
  EXPECT_EQ(load_target_config(dir).quant.method, QuantConfig::Method::Fp8Block);
  dir = edited_copy("kimi_k25_int4", "null_top", none, [&](nlohmann::json& c) { c["quantization_config"] = nullptr; });
  EXPECT_EQ(load_target_config(dir).quant.method, QuantConfig::Method::Int4Group) << "a null top level: text_config's";
  // Older compressed-tensors checkpoints: compression_config when neither has a quantization_config.
  dir = edited_copy("kimi_k25_int4", "compression_config", none, [&](nlohmann::json& c) {
    c["compression_config"] = c["quantization_config"];
    c.erase("quantization_config");
    c["text_config"].erase("quantization_config");
  });
  EXPECT_EQ(load_target_config(dir).quant.method, QuantConfig::Method::Int4Group);
  // The messages say which one was read.
  dir = edited_copy("kimi_k25_int4", "fp8_over_int4", none, [&](nlohmann::json& c) { c["quantization_config"] = fp8; });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("is INT4 pack-quantized, but " + dir + "/config.json's quantization_config is block FP8 (quant_method "
                   "fp8) (the top level's, read before text_config's other one, as vLLM reads them)"),
            std::string::npos) << e;
  dir = edited_copy("kimi_k25_int4", "text_string", none, [&](nlohmann::json& c) {
    c.erase("quantization_config");
    c["text_config"]["quantization_config"] = "int4";
  });
  e = testing::error_of([&] { load_target_config(dir); });
  EXPECT_NE(e.find("config.json: text_config.quantization_config is not an object: \"int4\""), std::string::npos) << e;
  dir = edited_copy("kimi_k25_int4", "shadowed_bad", none, [&](nlohmann::json& c) {
    c["quantization_config"]["format"] = "int-quantized";
    c["text_config"]["quantization_config"] = fp8;
  });
  e = testing::error_of([&] { load_target_config(dir); });
  EXPECT_NE(e.find("config.json (its top-level quantization_config, read before text_config's other one, as vLLM "
                   "reads them): quantization_config.format is \"int-quantized\""),
            std::string::npos) << e;
}

TEST(QuantErrors, TensorsOfAnUnexpectedFormatAreNamed) {
  // F8 weights without a quantization_config.
  std::string dir = edited_copy("deepseek_v3_fp8", "no_config", [](auto&) {},
                                [](nlohmann::json& c) { c.erase("quantization_config"); });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("\"model.layers.0.self_attn.q_a_proj.weight\" is F8_E4M3"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  // An FP8 weight without its scale.
  dir = edited_copy("deepseek_v3_fp8", "no_scale",
                    [](auto& t) { t.erase("model.layers.0.self_attn.kv_b_proj.weight_scale_inv"); });
  err = load_error(dir);
  EXPECT_NE(err.find("\"model.layers.0.self_attn.kv_b_proj.weight\" has no"), std::string::npos) << err;
  // A scale of the wrong shape.
  dir = edited_copy("deepseek_v3_fp8", "bad_scale", [](auto& t) {
    t["model.layers.0.mlp.gate_proj.weight_scale_inv"] = Tensor::zeros({1, 1}, DType::F32);  // 192 rows: 2 blocks
  });
  err = load_error(dir);
  EXPECT_NE(err.find("\"model.layers.0.mlp.gate_proj.weight_scale_inv\" is [1, 1], expected [2, 1]"), std::string::npos)
      << err;
  // A weight_packed without weight_scale.
  const std::string e = "language_model.model.layers.1.mlp.experts.4.up_proj.";
  dir = edited_copy("kimi_k25_int4", "no_int4_scale", [&](auto& t) { t.erase(e + "weight_scale"); });
  err = load_error(dir);
  EXPECT_NE(err.find("\"" + e + "weight_packed\" has no \"" + e + "weight_scale\""), std::string::npos) << err;
  // weight_shape disagreeing with the packed weight (I64, as compressed-tensors writes it).
  dir = edited_copy("kimi_k25_int4", "bad_shape", [&](auto& t) {
    t[e + "weight_shape"] = Tensor::from_vector(std::vector<int64_t>{64, 128}, {2});
  });
  err = load_error(dir);
  EXPECT_NE(err.find("\"" + e + "weight_shape\" says (64, 128)"), std::string::npos) << err;
  // I64 weight_shape of the right values is fine.
  dir = edited_copy("kimi_k25_int4", "i64_shape", [&](auto& t) {
    t[e + "weight_shape"] = Tensor::from_vector(std::vector<int64_t>{64, 64}, {2});
  });
  EXPECT_EQ(load_error(dir), "");
  // INT4 tensors in a checkpoint that announces FP8.
  dir = edited_copy("kimi_k25_int4", "int4_as_fp8", [](auto&) {}, [](nlohmann::json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  });
  err = load_error(dir);
  EXPECT_NE(err.find("weight_packed\" is INT4 pack-quantized"), std::string::npos) << err;
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

// W8A8 (Linear::use_fp8_gemm, --fp8-gemm): a dense weight is quantized to block FP8 and freed; a block-FP8
// checkpoint's weight keeps its bytes; a slice starting inside a block keeps the dequantizing path.
TEST(QuantFp8, W8A8LinearFormats) {
  const std::string dir = fixture("deepseek_v3_fp8");
  Linear head = load_at(dir, "lm_head", {256, 64}, TpSplit::None, 0, 1);
  const std::vector<float> dense = dense_of(head);
  ASSERT_EQ(head.format, WeightFormat::Dense);
  ASSERT_TRUE(head.use_fp8_gemm());
  EXPECT_EQ(head.format, WeightFormat::BlockFp8);
  EXPECT_FALSE(head.weight.defined());
  ASSERT_EQ(head.fp8_gemm.size(), 1u);
  EXPECT_EQ(head.parts[0].weight.dtype(), DType::F8E4M3);
  EXPECT_EQ(head.fp8_gemm[0].scale.shape(), (Shape{2, 4}));  // one K block, padded to 4 for cuBLASLt
  EXPECT_EQ(head.weight_bytes(), 256 * 64 + 2 * 4);
  const std::vector<float> back = dense_of(head);
  double num = 0, den = 0;
  for (size_t i = 0; i < dense.size(); ++i) num += (back[i] - dense[i]) * (back[i] - dense[i]), den += dense[i] * dense[i];
  EXPECT_LT(std::sqrt(num / den), 0.05);  // e4m3: 3 mantissa bits
  EXPECT_GT(std::sqrt(num / den), 1e-4);

  const std::string e = "model.layers.1.mlp.experts.3.gate_proj";
  Linear gu = load_at(dir, e, {32, 64}, TpSplit::None, 0, 1);
  const void* bytes = gu.parts[0].weight.raw();
  ASSERT_TRUE(gu.use_fp8_gemm());
  EXPECT_EQ(gu.fp8_gemm[0].weight.raw(), bytes);
  Linear half = load_at(dir, e, {32, 64}, TpSplit::Rows, 1, 2);  // rows 16..31: inside the first block
  EXPECT_FALSE(half.use_fp8_gemm());
  EXPECT_TRUE(half.fp8_gemm.empty());
}

// The forward with W8A8 GEMMs stays within the quantization error of the dequantizing one (first layer:
// dense MLA + MLP, before any router can flip), and differs from it (the path ran). Measured 0.104: the
// activations of q_a/q_b, kv_a/kv_b, o, gate/up and down each lose ~2.6% (e4m3's RMS rounding error) and
// the layer's update dwarfs this fixture's embedding; a wrong scale layout gives errors of order 1.
TEST(QuantFp8, W8A8ForwardNearTheDequantizedOne) {
  auto self = self_comm();
  const std::string dir = fixture("deepseek_v3_fp8");
  TargetModelOptions o{Device::CPU, DType::BF16};
  TargetModel plain(dir, *self, o);
  o.fp8_gemm = true;
  TargetModel w8a8(dir, *self, o);
  const std::vector<int32_t> ids = testing::some_ids(24, plain.config().vocab_size, 5);
  const TargetOutput a = plain.forward(ids, nullptr, {1}, false), b = w8a8.forward(ids, nullptr, {1}, false);
  const double e = testing::rel_l2(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector());
  std::printf("W8A8 vs dequantized BF16, r^1 relative L2: %.4g\n", e);
  EXPECT_LT(e, 0.2);
  EXPECT_GT(e, 1e-4);
  // 23 tokens (not a multiple of 4: the zero-padded rows of Linear::matmul) give the first 23 rows of the
  // 24-token forward: the padding rows touch no other row, causal attention sees no later token (up to
  // fp32 summation order, which BLAS may pick by the row count).
  const std::vector<int32_t> first(ids.begin(), ids.end() - 1);
  const TargetOutput c = w8a8.forward(first, nullptr, {1}, false);
  const std::vector<float> bv = b.aux_hidden.to_float_vector(), cv = c.aux_hidden.to_float_vector();
  ASSERT_EQ(cv.size() * 24, bv.size() * 23);
  EXPECT_LT(testing::rel_l2(cv, std::vector<float>(bv.begin(), bv.begin() + static_cast<long>(cv.size()))), 1e-5);
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

// W8A8 on a trained target (stories260K, F32 mode): how far its hidden states and logits move from the
// unquantized forward (printed; docs/quantization.md). Bounded loosely (0.15: a scale layout error is of
// order 1); the question that matters, the acceptance of a draft trained on W8A8 shards, is
// tools/bench/w8a8_demo.sh's.
TEST(QuantFp8, W8A8OnATrainedTarget) {
  AERIE_REQUIRE_MODEL();
  auto self = self_comm();
  TargetModelOptions o{Device::CPU, DType::F32};
  TargetModel plain(testing::model_dir(), *self, o);
  o.fp8_gemm = true;
  TargetModel w8a8(testing::model_dir(), *self, o);
  const int N = static_cast<int>(plain.config().num_hidden_layers);
  const std::vector<int32_t> ids = testing::some_ids(64, plain.config().vocab_size, 3);
  std::vector<int> aux;
  for (int k = 1; k <= N; ++k) aux.push_back(k);
  const TargetOutput a = plain.forward(ids, nullptr, aux, true), b = w8a8.forward(ids, nullptr, aux, true);
  const double eh = testing::rel_l2(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector());
  const double ez = testing::rel_l2(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector());
  const double el = testing::rel_l2(b.logits.to_float_vector(), a.logits.to_float_vector());
  std::printf("stories260K W8A8 vs F32, relative L2: r^1..r^%d %.4g, z %.4g, logits %.4g\n", N, eh, ez, el);
  EXPECT_LT(eh, 0.15);
  EXPECT_LT(ez, 0.15);
  EXPECT_GT(ez, 1e-4);
}

}  // namespace
}  // namespace aerie
