// The comparison of a TargetModel with a reference.safetensors of tests/model/fixtures/hf (ids, r [N+1,
// T, H], z, logits; tests/model/fixtures/hf/README.md), shared by the Llama-family and DeepSeek tests.
#pragma once
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/target.h"
#include "test_util.h"

namespace aerie::testing {

/// aerie in fp32 against transformers in float64 (or fp32 for the DeepSeek fixtures): see the tolerance
/// note in target_hf_families_test.cc.
constexpr float kAtol = 1e-4f, kRtol = 2e-5f;

inline std::string fixture(const std::string& name) {
  return std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name;
}

/// Columns [c0, c1) of a 2-D tensor, row-major.
inline std::vector<float> cols(const Tensor& t, int64_t c0, int64_t c1) {
  std::vector<float> all = t.to_float_vector(), out;
  for (int64_t i = 0; i < t.dim(0); ++i)
    out.insert(out.end(), all.begin() + i * t.dim(1) + c0, all.begin() + i * t.dim(1) + c1);
  return out;
}

/// The reference's token ids ("ids", I32).
inline std::vector<int32_t> reference_ids(const SafetensorsFile& ref) {
  const Tensor& t = ref.tensors.at("ids");
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

/// 0, 1, .., N: every layer input and the last layer's output, the rows of the reference's r.
inline std::vector<int> every_layer(const TargetModel& model) {
  std::vector<int> aux;
  for (int k = 0; k <= static_cast<int>(model.config().num_hidden_layers); ++k) aux.push_back(k);
  return aux;
}

/// Every r^k, z and the logits of `model` on the reference ids, in one prefill; then the logits again
/// through the KV cache: a prefill of the first `split` ids and the rest one token at a time.
inline void compare_with_reference(TargetModel& model, const std::string& reference, int64_t split = 5,
                                   float atol = kAtol, float rtol = kRtol) {
  SafetensorsFile ref = load_safetensors(reference);
  const std::vector<int32_t> ids = reference_ids(ref);
  const int N = static_cast<int>(model.config().num_hidden_layers);
  const int64_t H = model.config().hidden_size, V = model.config().vocab_size, T = static_cast<int64_t>(ids.size());
  TargetOutput out = model.forward(ids, nullptr, every_layer(model), true);
  const Tensor& r = ref.tensors.at("r");
  ASSERT_EQ(r.shape(), (Shape{N + 1, T, H}));
  for (int k = 0; k <= N; ++k)
    testing::expect_close(cols(out.aux_hidden, k * H, (k + 1) * H), r.slice(k, k + 1).to_float_vector(), atol,
                          rtol, reference + ": r^" + std::to_string(k));
  testing::expect_close(out.final_hidden.to_float_vector(), ref.tensors.at("z").to_float_vector(), atol, rtol,
                        reference + ": z");
  std::vector<float> logits = ref.tensors.at("logits").to_float_vector();
  testing::expect_close(out.logits.to_float_vector(), logits, atol, rtol, reference + ": logits");

  KVCache cache = model.make_cache(T);
  TargetOutput pre = model.forward(std::vector<int32_t>(ids.begin(), ids.begin() + split), &cache, {}, true);
  testing::expect_close(pre.logits.to_float_vector(), std::vector<float>(logits.begin(), logits.begin() + split * V),
                        atol, rtol, reference + ": cached prefill logits");
  for (int64_t t = split; t < T; ++t) {
    TargetOutput o = model.forward({ids[t]}, &cache, {}, true);
    testing::expect_close(o.logits.to_float_vector(),
                          std::vector<float>(logits.begin() + t * V, logits.begin() + (t + 1) * V), atol, rtol,
                          reference + ": cached logits at " + std::to_string(t));
  }
}

}  // namespace aerie::testing
