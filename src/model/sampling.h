// Token sampling for generation with the target: temperature and nucleus (top-p) sampling with a seeded,
// platform-independent RNG, greedy (argmax) at temperature 0.
//
// Nucleus sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", section 3.1: keep
// the smallest set of most probable tokens whose probability mass reaches p, renormalise, draw. The order of
// operations is transformers' (TemperatureLogitsWarper, then TopPLogitsWarper): p_i = softmax(logits / T).
#pragma once
#include <cstdint>
#include <vector>

namespace aerie {

class LlamaModel;

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax); > 0: softmax(logits / temperature)
  double top_p = 1.0;        // nucleus mass in (0, 1]; 1 keeps every token
};

/// Throws aerie::Error unless temperature >= 0 (finite) and 0 < top_p <= 1.
void check_sampling_params(const SamplingParams& p);

/// A small deterministic RNG (splitmix64, Steele et al. 2014) whose draws are the same on every platform and
/// standard library (std::uniform_real_distribution is not), so that sampled text is reproducible anywhere.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  /// Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t state_;
};

/// The RNG seed of sequence `index` (e.g. a conversation's index in its input file) under a run's `seed`:
/// a hash of both, so that the draws of a sequence do not depend on which rank generates it or in what order.
uint64_t sequence_seed(uint64_t seed, uint64_t index);

/// The distribution sample_token draws from: probs [V] (double, sums to 1), zero outside the nucleus.
/// Greedy (temperature 0): one-hot on the argmax. Ties in the nucleus order go to the smaller id.
std::vector<double> sampling_distribution(const float* logits, int64_t V, const SamplingParams& p);

/// One token from a logits row [V] F32. Temperature 0: the argmax (ties: the smallest id, as greedy_generate)
/// and the RNG is not used. Otherwise one uniform draw u from `rng` picks the first token whose cumulative
/// renormalised probability exceeds u, in order of decreasing probability (ties by id) when top_p < 1 and in
/// id order when top_p = 1 (no sort needed). Throws
/// aerie::Error on V <= 0 or invalid params.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, SampleRng& rng);

/// Decodes one sequence with a KV cache: the prompt (all but its last token without logits, then the last),
/// then one token at a time, each drawn by sample_token, until a token of `stop_ids` (kept, last) or max_new
/// tokens. Returns the generated ids only. One sequence at a time (KVCache holds one). Collective over the
/// model's tp group: tp rank 0 draws and broadcasts its token, so every rank returns the same ids (rank 0's
/// rng is the one that counts; keep the ranks' rngs equal anyway). Greedy (temperature 0) equals
/// greedy_generate. Throws aerie::Error on an empty prompt or invalid params.
std::vector<int32_t> sample_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids, const SamplingParams& p, SampleRng& rng);

}  // namespace aerie
