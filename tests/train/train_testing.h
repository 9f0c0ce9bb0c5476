// Shared by the train tests: a tiny target (config.json written to a scratch folder, random embedding and
// lm_head), its draft config and vocabulary, random TTT samples, deep copies and bitwise comparison.
#pragma once
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/vocab.h"
#include "model/draft.h"
#include "model/target_config.h"
#include "test_util.h"

namespace aerie::testing {

struct TinyTrainSetup {
  std::string target_dir;
  TargetConfig target;
  DraftConfig cfg;
  DraftVocab vocab;
  Tensor embed, lm_head;  // [V, H] F32
  DraftWeights w;
};

inline Tensor random_f32(const Shape& s, std::mt19937_64& rng, double scale) {
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(scale * (static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0));
  return t;
}

/// Target: H 8, 2 heads of 4, 1 kv head, I 12, N 6 layers, V 16, 131072 positions, llama3 rope scaling,
/// rope_theta 500000 (values a draft config must copy). Draft vocabulary: K = 10 of the 16 ids.
inline TinyTrainSetup make_tiny_setup(const std::string& dir, std::vector<int> aux_layers = {2, 3, 3}) {
  TinyTrainSetup s;
  s.target_dir = dir;
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", 8},
                      {"intermediate_size", 12},
                      {"num_hidden_layers", 6},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 1},
                      {"head_dim", 4},
                      {"vocab_size", 16},
                      {"max_position_embeddings", 131072},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 500000.0},
                      {"rope_scaling",
                       {{"factor", 8.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192},
                        {"rope_type", "llama3"}}},
                      {"tie_word_embeddings", false}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  s.target = load_target_config(dir);
  std::vector<int64_t> selected = {0, 1, 2, 4, 5, 7, 9, 10, 12, 15};
  s.vocab.t2d.assign(16, 0);
  for (size_t i = 0; i < selected.size(); ++i) {
    s.vocab.d2t.push_back(selected[i] - static_cast<int64_t>(i));
    s.vocab.t2d[static_cast<size_t>(selected[i])] = 1;
  }
  s.cfg = DraftConfig::from_target(s.target, 10, aux_layers);
  std::mt19937_64 rng(11);
  s.embed = random_f32({16, 8}, rng, 1.0);
  s.lm_head = random_f32({16, 8}, rng, 1.0);
  s.w = init_draft_weights(s.cfg, s.lm_head, selected, 5);
  return s;
}

/// Turns EAGLE-3.1's norm_before_fc on in a setup: cfg.norm_before_fc and w.input_norm [3 H_t], ones plus
/// U(-0.25, 0.25) noise from `seed` (a trained-looking weight, so that a dropped term shows).
inline void enable_norm_before_fc(TinyTrainSetup& s, uint64_t seed) {
  s.cfg.norm_before_fc = true;
  std::mt19937_64 rng(seed);
  s.w.input_norm = random_f32({3 * s.cfg.target_hidden_size}, rng, 0.25);
  for (int64_t i = 0; i < s.w.input_norm.numel(); ++i) s.w.input_norm.data<float>()[i] += 1.0f;
}

/// A random sample of T tokens for the setup's target (random hidden states, targets through the lm_head).
inline TTTSample make_random_sample(const TinyTrainSetup& s, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  std::vector<uint8_t> mask(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    ids[static_cast<size_t>(t)] = static_cast<int32_t>(rng() % 16);
    mask[static_cast<size_t>(t)] = (rng() % 4) != 0;
  }
  Tensor aux = random_f32({T, 3 * s.cfg.target_hidden_size}, rng, 1.0);
  Tensor z = random_f32({T, 8}, rng, 2.0);
  return make_ttt_sample(ids, mask, aux, z, s.lm_head, s.vocab.selected());
}

inline DraftWeights clone_weights(const DraftWeights& w) {
  DraftWeights c = w;
  for (auto& [n, t] : c.named()) *t = t->clone();
  return c;
}

/// Number of elements whose bits differ, over all tensors.
inline int64_t count_bit_differences(const DraftWeights& a, const DraftWeights& b) {
  int64_t bad = 0;
  auto na = a.named();
  auto nb = b.named();
  if (na.size() != nb.size()) return -1;  // one has norm_before_fc's input_norm, the other not
  for (size_t i = 0; i < na.size(); ++i) {
    const Tensor& x = *na[i].second;
    const Tensor& y = *nb[i].second;
    if (x.nbytes() != y.nbytes()) return -1;
    const uint32_t* px = static_cast<const uint32_t*>(x.raw());
    const uint32_t* py = static_cast<const uint32_t*>(y.raw());
    for (int64_t j = 0; j < x.numel(); ++j) bad += px[j] != py[j];
  }
  return bad;
}

}  // namespace aerie::testing
