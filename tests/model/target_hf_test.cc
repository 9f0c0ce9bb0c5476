// TargetModel against Hugging Face transformers (LlamaForCausalLM, float64, eager attention): golden
// values made by tools/reference/llama_reference.py (transformers 5.17, torch 2.11) and committed under
// tests/model/fixtures/:
//   stories260K_hf.safetensors  the converted stories260K (build/models/stories260K), 16 ids
//   tiny_llama3/ + tiny_llama3_hf.safetensors  a random bf16 Llama written by save_pretrained (untied
//     lm_head, head_dim 16 != H/heads, GQA 2:1, llama3 rope_scaling in transformers 5's rope_parameters,
//     original_max_position_embeddings 32), 40 ids, so positions cross all three llama3 frequency bands.
// Each file holds ids [T], r [N+1, T, H] (r^k = input of layer k, r^N = input of the final norm),
// z [T, H] and logits [T, V]. If the converter (tools/convert_llama2c.py) changes its output, rerun the
// script: `python3 tools/reference/llama_reference.py build/models/stories260K tests/model/fixtures/...`.
#include "comm/communicator.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "test_util.h"

namespace aerie {
namespace {

std::string fixture(const std::string& name) { return std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/" + name; }

/// Columns [c0, c1) of a 2-D tensor, row-major.
std::vector<float> cols(const Tensor& t, int64_t c0, int64_t c1) {
  std::vector<float> all = t.to_float_vector(), out;
  for (int64_t i = 0; i < t.dim(0); ++i)
    out.insert(out.end(), all.begin() + i * t.dim(1) + c0, all.begin() + i * t.dim(1) + c1);
  return out;
}

// fp32 forward vs float64 transformers: values are O(1..10), and each is a sum of many fp32 products,
// so a value near 0 carries an absolute error of ~1e-7 x the sum of |terms| (~1e2): atol, not rtol, is
// what matters. Measured worst on stories260K: 2.4e-5 absolute on a logit of 0.0176 (cached decoding);
// atol 1e-4 + rtol 2e-5 leaves room for other BLAS builds.
void compare_with_hf(const std::string& model_dir, const std::string& golden, float atol, float rtol) {
  SafetensorsFile ref = load_safetensors(golden);
  const Tensor& ids_t = ref.tensors.at("ids");
  std::vector<int32_t> ids(ids_t.data<int32_t>(), ids_t.data<int32_t>() + ids_t.numel());
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  TargetModel model(model_dir, *self);
  const int N = static_cast<int>(model.config().num_hidden_layers);
  const int64_t H = model.config().hidden_size, T = static_cast<int64_t>(ids.size());
  std::vector<int> aux;
  for (int k = 0; k <= N; ++k) aux.push_back(k);
  TargetOutput out = model.forward(ids, nullptr, aux, true);
  const Tensor& r = ref.tensors.at("r");
  ASSERT_EQ(r.shape(), (Shape{N + 1, T, H}));
  for (int k = 0; k <= N; ++k)
    testing::expect_close(cols(out.aux_hidden, k * H, (k + 1) * H), r.slice(k, k + 1).to_float_vector(), atol, rtol,
                          "r^" + std::to_string(k));
  testing::expect_close(out.final_hidden.to_float_vector(), ref.tensors.at("z").to_float_vector(), atol, rtol, "z");
  testing::expect_close(out.logits.to_float_vector(), ref.tensors.at("logits").to_float_vector(), atol, rtol,
                        "logits");
  // The same through the KV cache, one token at a time.
  KVCache cache = model.make_cache(T);
  std::vector<float> logits = ref.tensors.at("logits").to_float_vector();
  const int64_t V = model.config().vocab_size;
  for (int64_t t = 0; t < T; ++t) {
    TargetOutput o = model.forward({ids[t]}, &cache, {}, true);
    testing::expect_close(o.logits.to_float_vector(),
                          std::vector<float>(logits.begin() + t * V, logits.begin() + (t + 1) * V), atol, rtol,
                          "cached logits at " + std::to_string(t));
  }
}

TEST(TargetHf, Stories260KMatchesTransformers) {
  AERIE_REQUIRE_MODEL();
  compare_with_hf(testing::model_dir(), fixture("stories260K_hf.safetensors"), 1e-4f, 2e-5f);
}

TEST(TargetHf, TinyLlama3RopeBf16MatchesTransformers) {
  const std::string dir = fixture("tiny_llama3");
  TargetConfig cfg = load_target_config(dir);
  ASSERT_EQ(cfg.rope.type, "llama3");  // read from transformers 5's rope_parameters
  ASSERT_FALSE(cfg.tie_word_embeddings);
  compare_with_hf(dir, fixture("tiny_llama3_hf.safetensors"), 1e-4f, 2e-5f);
}

}  // namespace
}  // namespace aerie
