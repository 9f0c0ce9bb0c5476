// Token sampling for generation with the target: temperature and nucleus (top-p) sampling with a seeded,
// platform-independent RNG, greedy (argmax) at temperature 0.
//
// Nucleus sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", section 3.1: keep
// the smallest set of most probable tokens whose probability mass reaches p, renormalise, draw. The order of
// operations is transformers' (TemperatureLogitsWarper, then TopPLogitsWarper): p_i = softmax(logits / T).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace aerie {

class TargetModel;

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

/// Batched decoding with a KV cache per sequence (continuous batching): sequences are queued with submit()
/// and decoded together, up to `batch_size` at a time, by step(), each with its own KVCache (prompt +
/// max_new positions, allocated when it starts), its own SampleRng and its own stop rule.
///
/// One step() is one TargetModel::forward_batch (Logits::Last): free slots are first refilled from the queue
/// (FIFO, within max_step_rows), and a sequence that starts is prefilled in that same forward (its whole prompt; the last row's
/// logits give its first token), while every running sequence feeds its last token. Each sequence then
/// draws its next token from its own logits row with sample_token and its own rng; it finishes after a
/// token of `stop_ids` (kept, last) or after max_new tokens, and its slot is free for the next step. So a
/// sequence's tokens depend only on its prompt, max_new, rng and the model (not on the batch size nor on
/// the other sequences of the batch), as long as forward_batch computes each row as forward() would: exact
/// on the CPU (row-independent GEMMs); on CUDA equal up to fp32 summation order, so a near tie of two
/// tokens may go either way there.
///
/// Tensor parallel: collective over the model's tp group. Every rank must submit the same sequences in the
/// same order and call step() together; every rank draws (its rng advances as rank 0's), and tp rank 0's
/// tokens of the step ([B] I32, one broadcast on the model's device) are the ones every rank keeps, so all
/// ranks return the same ids even if their all-reduced logits differed in the last bit.
class BatchDecoder {
 public:
  /// max_step_rows: the rows of one forward (prefill rows + running sequences) above which no further
  /// sequence starts in that step (one always may, when none is running), so that admitting many long
  /// prompts at once does not make one huge forward (activations grow with the rows); it does not change
  /// any sequence's tokens. Throws aerie::Error unless batch_size >= 1, max_step_rows >= 1 and `p` is valid
  /// (check_sampling_params).
  BatchDecoder(TargetModel& model, int64_t batch_size, std::vector<int32_t> stop_ids, const SamplingParams& p,
               int64_t max_step_rows = 8192);
  ~BatchDecoder();
  BatchDecoder(const BatchDecoder&) = delete;
  BatchDecoder& operator=(const BatchDecoder&) = delete;

  /// Queues a sequence under the caller's `key`. Throws aerie::Error on an empty prompt or max_new < 1.
  void submit(int64_t key, std::vector<int32_t> prompt, int64_t max_new, const SampleRng& rng);

  struct Finished {
    int64_t key;
    std::vector<int32_t> ids;  // generated ids, the stop id last when one ended it
    SampleRng rng;             // the sequence's rng after its last draw
  };
  /// One decoding step (see above); returns the sequences that finished in it, in slot order. Nothing to
  /// do (idle()): returns nothing and calls nothing. Throws what forward_batch throws.
  std::vector<Finished> step();

  bool idle() const;
  int64_t running() const;  // sequences in the batch
  int64_t queued() const;   // submitted, not started
  int64_t batch_size() const { return batch_size_; }
  /// Tokens fed to the model so far (prompt rows + decoded rows), for throughput logs.
  int64_t rows() const { return rows_; }

 private:
  struct Sequence;
  TargetModel& model_;
  int64_t batch_size_, max_step_rows_;
  std::vector<int32_t> stop_ids_;
  SamplingParams params_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  int64_t rows_ = 0;
};

/// Decodes one sequence (a BatchDecoder of batch size 1): the prompt, then one token at a time drawn by
/// sample_token, until a token of `stop_ids` (kept, last) or max_new tokens. Returns the generated ids
/// only (none when max_new <= 0); `rng` is advanced by the draws. Collective over the model's tp group
/// (see BatchDecoder). Greedy (temperature 0) equals greedy_generate. Throws aerie::Error on an empty
/// prompt or invalid params.
std::vector<int32_t> sample_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids, const SamplingParams& p, SampleRng& rng);

}  // namespace aerie
