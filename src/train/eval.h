// Evaluation of an EAGLE-3 draft (eagle3.md section 6): real speculative decoding with the target
// (greedy, chain of n draft tokens, lossless check against plain greedy decoding), and the teacher-forced
// acc_k / tau_sim of section 4 on held-out extraction shards.
#pragma once
#include <cstdint>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/prepare_template.h"
#include "data/vocab.h"
#include "model/draft.h"
#include "model/sampling.h"
#include "model/target.h"
#include "tokenizer/tokenizer.h"

namespace aerie {

/// A draft ready to run: config, F32 weights, vocabulary mapping.
struct LoadedDraft {
  DraftConfig cfg;
  DraftWeights weights;
  DraftVocab vocab;
  // A checkpoint's provenance (its target's fingerprint among it), an aerie export's {"target": ...} from
  // config.json's aerie_checkpoint; null when neither records one.
  nlohmann::json provenance;
};

/// Reads a draft from an export directory (eagle3.md section 5: config.json + model.safetensors, bf16
/// weights under the export names, d2t I64, t2d BOOL) or from a training checkpoint (a step-%08d folder or
/// a run directory: its latest complete checkpoint), the export through train/export.h's load_export
/// (target_num_hidden_layers: for the default aux layers, which an export does not name). Throws
/// aerie::Error naming the file and tensor on a missing/mis-shaped tensor or an inconsistent d2t/t2d.
LoadedDraft load_draft(const std::string& path, int64_t target_num_hidden_layers = 0);

/// One speculative-decoding run of a prompt.
struct SpecDecodeResult {
  std::vector<int32_t> tokens;        // prompt + generated ids (same stopping rule as greedy_generate)
  int64_t generated = 0;              // new tokens, including the one of the prefill
  int64_t verify_passes = 0;          // target forwards after the prefill
  int64_t verify_tokens = 0;          // new tokens those passes yielded (accepted + 1 each, cut at the end)
  // [n]: passes in which draft position i (0-based) was accepted and emitted (a pass cut at max_new or a
  // stop token counts only the guesses before the cut), so 1 + sum_i accepted_at[i] / verify_passes equals
  // verify_tokens / verify_passes except for a last pass cut inside its guesses (it lacks its target token).
  std::vector<int64_t> accepted_at;  // [n], or [tree depth] for a tree (SpecDecodeOptions::tree_topk > 1)
  // With SpecDecodeOptions::follow: the first new token (0-based) where the target's own argmax is not the
  // followed token; -1 where they agree throughout.
  int64_t own_first_difference = -1;
};

/// Greedy chain speculative decoding (eagle3.md section 6). Prefill: the target's forward of the prompt
/// (aux hidden states of cfg.aux_layers, logits) gives x_P; the draft caches positions 0..P-1. Each cycle:
/// the draft proposes n tokens, the target verifies [last token, guesses] in one forward with its KV
/// cache, the longest prefix of guesses equal to the target's argmaxes is accepted plus one target token,
/// both caches are truncated to the verified positions and the draft appends them with the target's aux
/// hidden states. Stops after max_new new tokens or after a token of stop_ids (like greedy_generate).
/// The draft runs on the target's device (CPU, or the target's GPU: its weights are copied there when they
/// live elsewhere); the target's aux hidden states (F32 or BF16) are widened to F32 for it.
/// Collective over the target's tp group (tp rank 0's tokens are broadcast). prompt must be non-empty and
/// prompt + max_new + n + 1 must fit in the target's max_position_embeddings (aerie::Error otherwise).
SpecDecodeResult speculative_generate(TargetModel& target, const LoadedDraft& draft, const std::vector<int32_t>& prompt,
                                      int num_draft_tokens, int64_t max_new, const std::vector<int32_t>& stop_ids);

/// A draft's distribution over target ids for one guess: probs[i] of target id ids[i] (the ids with
/// probability > 0 may be a subset; every other id has probability 0).
struct DraftDist {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

/// What speculative decoding needs from a draft (DraftDecoder for a real one; tests plug in oracles).
class Proposer {
 public:
  virtual ~Proposer() = default;
  /// The next n positions were verified: the target's aux hidden states [n, 3H] F32 of their tokens and
  /// the token that follows each (x_{p+1}).
  virtual void append_verified(const Tensor& aux_hidden, const std::vector<int32_t>& next_tokens) = 0;
  /// n guesses for the tokens after the last next_token.
  virtual std::vector<int32_t> propose(int n) = 0;
  /// n sampled guesses and the n distributions they were drawn from (q[i] over target ids; q[i] of
  /// guess i > 0). The default: propose's deterministic guesses, each with q = 1 on itself (a valid draft
  /// distribution for the rejection rule).
  virtual std::vector<int32_t> propose_sampled(int n, const SamplingParams& p, SampleRng& rng,
                                               std::vector<DraftDist>& q);
  /// A draft tree of at most `budget` nodes (DraftDecoder::propose_tree). The default: propose's chain of
  /// min(budget, depth) tokens as a one-path tree.
  virtual DraftTree propose_tree(int budget, int topk, int depth);
};

/// The rule that turns one verification pass into emitted tokens at temperature > 0:
/// p: the target's n + 1 distributions [V] (p[i] after the input's row i: row 0 the last verified token,
/// row i guess i - 1), q: the n draft distributions, guesses [n]; returns the accepted guesses then one
/// more token (1 to n + 1 tokens). rng: the run's draws.
using AcceptRule = std::function<std::vector<int32_t>(const std::vector<std::vector<double>>& p,
                                                      const std::vector<DraftDist>& q,
                                                      const std::vector<int32_t>& guesses, SampleRng& rng)>;

/// The standard speculative sampling rule (Leviathan et al. 2023, "Fast Inference from Transformers via
/// Speculative Decoding", Algorithm 1; Chen et al. 2023, Algorithm 2), whose output has exactly the
/// target's distribution: guess i is accepted with probability min(1, p_i(g_i) / q_i(g_i)) (one
/// rng.uniform() each, in order); at the first rejection one token is drawn from the residual
/// norm(max(0, p_i - q_i)) and the pass ends; when all n are accepted a bonus token is drawn from p_n
/// (one rng.uniform() per draw, ids in order). A residual of zero mass (p_i <= q_i everywhere, within
/// rounding) draws from p_i. Throws aerie::Error on inconsistent sizes or a guess with q = 0.
std::vector<int32_t> accept_speculative_sampling(const std::vector<std::vector<double>>& p,
                                                 const std::vector<DraftDist>& q, const std::vector<int32_t>& guesses,
                                                 SampleRng& rng);

/// Settings of one speculative decoding run.
struct SpecDecodeOptions {
  int num_draft_tokens = 7;
  int64_t max_new = 64;
  std::vector<int32_t> stop_ids;
  /// Temperature 0 (the default): the greedy chain, whose output equals greedy decoding. > 0: speculative
  /// sampling: the first token is drawn from the target's sampling_distribution, guesses from the
  /// proposer's propose_sampled, and each pass's tokens by `accept` (default accept_speculative_sampling),
  /// so that the output is distributed as sample_generate's with the same params.
  SamplingParams sampling;
  uint64_t seed = 0;  // the run's SampleRng (tp rank 0 draws; the others take its tokens)
  AcceptRule accept;  // empty: accept_speculative_sampling (tests pass wrong rules to see them caught)
  /// tree_topk > 1: each pass verifies a draft tree (Proposer::propose_tree with budget num_draft_tokens,
  /// this topk and depth tree_depth, 0: num_draft_tokens) in one TargetModel::forward_tree, and the
  /// longest root-to-node path whose tokens equal the target's argmaxes is accepted, plus the target's
  /// next token (greedy only: the output still equals greedy decoding). accepted_at[i] counts the passes
  /// that accepted a node at depth i + 1. 1: the chain.
  int tree_topk = 1;
  int tree_depth = 0;
  /// Non-empty (greedy chains only): a continuation to follow instead of the target's argmaxes, e.g. another
  /// engine's greedy answer where its target parts from this one. Each pass accepts the guesses equal to the
  /// followed tokens and emits the next followed token, so the run's output is prompt + follow (cut at
  /// max_new or a stop id) and its acceptance is the draft's along that text, as an engine whose target
  /// wrote it measures it; SpecDecodeResult::own_first_difference says where the target itself would part.
  std::vector<int32_t> follow;
};

/// The same loop with any proposer; aux_layers: the target layers whose inputs the proposer reads.
SpecDecodeResult speculative_generate(TargetModel& target, Proposer& proposer, const std::vector<int>& aux_layers,
                                      const std::vector<int32_t>& prompt, int num_draft_tokens, int64_t max_new,
                                      const std::vector<int32_t>& stop_ids);

/// The loop with the options above (greedy or sampled); the other overloads are its greedy cases.
SpecDecodeResult speculative_generate(TargetModel& target, Proposer& proposer, const std::vector<int>& aux_layers,
                                      const std::vector<int32_t>& prompt, const SpecDecodeOptions& opts);
SpecDecodeResult speculative_generate(TargetModel& target, const LoadedDraft& draft, const std::vector<int32_t>& prompt,
                                      const SpecDecodeOptions& opts);

/// Sums of the teacher-forced TTT metrics (ttt_forward_backward without gradients).
struct TeacherForced {
  std::vector<int64_t> correct, acc_rows;  // [S]
  int64_t samples = 0;
  void add(const TTTStats& st);
  std::vector<double> acc_k() const;  // correct_k / acc_rows_k (0 without rows)
  double tau_sim() const;             // 1 + sum_k prod_{j<=k} acc_j
  /// Sums over `c` (every rank calls it), the per-step vectors first sized to S.
  void all_reduce(Communicator& c, int S);
};

/// Options of `aerie eval` (jobs/eval.cc).
struct EvalOptions {
  std::string model_dir, draft_path, prompts_path, output_path;
  // --write-prompts: a JSONL of every evaluated prompt's ids, stop ids and greedy answer (EvalSession::
  // write_prompt_records), what tools/engine_eval feeds a serving engine; "" writes none.
  std::string prompts_out;
  // --follow: a prompt-ids JSONL (read_prompt_ids_file) whose prompts are evaluated instead of --prompts', each
  // speculative run following the record's greedy_ids (SpecDecodeOptions::follow) instead of this target's
  // argmaxes: the acceptance length along another engine's answers (tools/engine_eval --write-answers). No
  // greedy decoding, lossless check or speed-up then; eval.json's "follow" says where this target parts.
  std::string follow_path;
  int64_t num_prompts = 16, max_new_tokens = 64, max_prompt_tokens = 0;  // 0: whole prompts
  int num_draft_tokens = 7;
  bool untrained = false;
  uint64_t seed = 0;                    // init_draft_weights seed of the untrained draft (train's --seed)
  // Speculative sampling (temperature > 0; 0: the greedy chain with its lossless check): the target's and
  // the draft's distributions at this temperature and nucleus mass; prompt i's draws from
  // sequence_seed(sample_seed, i).
  double temperature = 0.0, top_p = 1.0;
  uint64_t sample_seed = 0;
  // Draft trees (SpecDecodeOptions::tree_topk / tree_depth; greedy only): tree_topk 1 is the chain of
  // num_draft_tokens; > 1 verifies a tree of num_draft_tokens nodes, tree_depth deep (0: num_draft_tokens).
  int tree_topk = 1, tree_depth = 0;
  std::string shards_dir, data_split_path;  // teacher-forced eval; empty shards: on the generated texts
  std::string chat_template = "plain";  // data/prepare_template.h: how a prompt (one user turn) becomes ids
  std::string device = "auto";  // auto (cuda when every rank of the node has a GPU), cpu or cuda
  std::string dtype = "f32";    // the target's compute dtype (TargetModelOptions): f32, bf16 or auto (bf16 on cuda)
  int64_t num_eval_samples = 64;
  int ttt_steps = 7;
  int tp = 1;
  bool expert_parallel = false;  // TargetModelOptions::expert_parallel (MoE targets)
  bool fp8_gemm = false;         // TargetModelOptions::fp8_gemm (eval --fp8-gemm)
};

/// Reads prompts: the first user turn of each record of a prompt set, as `aerie generate --input` reads it
/// (data/prompt_input.h's PromptFile and parse_prompt_record): a ".txt" file's stories give their first
/// sentence; JSONL lines or JSON array elements give "turns"[0] (MT-Bench, Spec-Bench), "prompt", "text",
/// "question", "instruction" (with Alpaca's "input"), or the first user turn of a ShareGPT/OpenAI
/// conversation. At most `max_prompts` prompts (0: all). Throws aerie::Error naming the file when it cannot
/// be read or holds none, and the file and line of a record that is not a JSON object.
/// categories (optional): each prompt's string "category" (MT-Bench, Spec-Bench), "" where it has none.
std::vector<std::string> read_prompts(const std::string& path, int64_t max_prompts,
                                      std::vector<std::string>* categories = nullptr);

/// One line of a prompt-ids file (EvalSession::write_prompt_records; docs/formats.md "Prompt ids").
struct PromptIdsRecord {
  int64_t index = 0;
  std::string category;  // "" for null or none
  std::vector<int32_t> prompt_ids, stop_ids, greedy_ids;
};

/// Reads a prompt-ids JSONL (what `aerie eval --write-prompts` writes, or tools/engine_eval --write-answers
/// with an engine's answers as greedy_ids): at most max_records records (0: all), blank lines skipped. Each
/// record needs "index" (an integer), "prompt_ids" (non-empty), "stop_ids" and "greedy_ids" (non-empty),
/// lists of ids in [0, vocab_size) (vocab_size 0: not checked), and may carry "category" (a string or null).
/// Throws aerie::Error naming the file and line (and the field) of the first bad record, or the file when it
/// cannot be read or holds no record.
std::vector<PromptIdsRecord> read_prompt_ids_file(const std::string& path, int64_t max_records, int64_t vocab_size = 0);

/// The ids of an eval prompt: one user turn `text` rendered by tmpl.render_prompt, i.e. with the template's
/// generation prompt (the assistant header, e.g. ChatML's "<|im_start|>assistant\n"), so that the target
/// answers as it does when served; each text segment tokenized by tmpl.encode_text (as `aerie generate`
/// builds its prompts). "plain": BOS + text.
std::vector<int32_t> eval_prompt_ids(const ChatTemplate& tmpl, const std::string& text, const Tokenizer& tok);

/// What `aerie eval` sets up once for any number of drafts (every checkpoint of a run: train/checkpoint_eval.h):
/// the tp/dp groups and the device, the target, its tokenizer, the prompts and their plain greedy answers
/// (the reference of the lossless check and of speedup, which do not depend on the draft), and the list of
/// teacher-forced samples. All members are collective over the world unless said otherwise.
class EvalSession {
 public:
  /// Sets up as run_eval does (see there); opts.draft_path, untrained, seed and output_path are not read.
  /// Decodes every prompt greedily (the long part for a large target). Throws aerie::Error as run_eval.
  explicit EvalSession(const EvalOptions& opts);
  ~EvalSession();
  EvalSession(const EvalSession&) = delete;
  EvalSession& operator=(const EvalSession&) = delete;

  /// The draft at `path` (load_draft: an export, a checkpoint or a run folder), on the target's device.
  /// Throws aerie::Error naming the path when it cannot be read or its widths do not fit the target.
  LoadedDraft load(const std::string& path) const;
  /// The untrained draft of `like`'s config and vocabulary (init_draft_weights with `seed`, train's --seed).
  LoadedDraft untrained(const LoadedDraft& like, uint64_t seed) const;
  /// Speculative decoding of every prompt with `draft`, checked against the greedy answers, and the
  /// teacher-forced metrics: the eval.json keys num_prompts, acceptance_length (new tokens per verification
  /// pass), acceptance_rate_per_position and conditional_acceptance_rate_per_position ([n]), lossless,
  /// lossless_failures (at temperature > 0 instead: sampling {temperature, top_p, sample_seed}),
  /// verify_passes, tokens_generated, spec_seconds, speedup, acc_k ([ttt_steps]), tau_sim,
  /// teacher_forced_samples; when prompts carry a "category": per_category {name: the speculative figures
  /// and speedup of its prompts} (prompts without one under "(none)"); with EvalOptions::follow_path, instead of
  /// lossless, lossless_failures and speedup, own_greedy_agreement and own_first_difference {median, min, max}
  /// (docs/formats.md). `name` labels the draft in warnings ("" for none). Throws
  /// aerie::Error when a shard of the teacher-forced samples was not extracted with the draft's aux layers.
  nlohmann::json evaluate(const LoadedDraft& draft, const std::string& name = "");
  /// The eval.json keys that do not depend on the draft: model, prompts, chat_template, device, dtype,
  /// prompts_too_long, num_draft_tokens, max_new_tokens, greedy_seconds, greedy_tokens,
  /// teacher_forced_source, ttt_steps and (world rank 0) example. Local.
  nlohmann::json context() const;
  /// The target's compute dtype as resolved from opts.dtype: "f32" or "bf16". Local.
  std::string dtype_name() const;
  int world_rank() const;
  /// Writes `path` (world rank 0, atomically): one JSON object per evaluated prompt, in the order of
  /// --prompts: {"index": its index in --prompts, "category": string or null, "prompt_ids": [I32] (the ids
  /// the target was fed: chat template and generation prompt included), "stop_ids": [I32] (the ids that
  /// end an answer), "greedy_ids": [I32] (the plain greedy answer's new tokens, a stop id included where
  /// one ended it)} (docs/formats.md "Prompt ids"). What
  /// tools/engine_eval feeds vLLM or SGLang so that the engine decodes the same token ids. Collective over
  /// the world (the replicas' prompts are gathered). Throws aerie::Error naming the path when it cannot be
  /// written.
  void write_prompt_records(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// `aerie eval`: collective over the world (tp groups of opts.tp ranks; prompts spread over dp
/// replicas). The target and the draft run on opts.device: on CUDA each rank uses GPU local_rank() and the
/// tp group reduces over NCCL; the draft computes in F32, the target in opts.dtype. Prompts are rendered by
/// eval_prompt_ids with opts.chat_template; with max_prompt_tokens a longer plain prompt is cut, a longer
/// chat prompt skipped (prompts_too_long). Answers stop at the template's end-of-turn token, the config's
/// and tokenizer's EOS, or BOS. Returns the eval.json object (written to opts.output_path by world rank 0
/// when set): acceptance_length, acceptance_rate_per_position, (conditional_)acceptance_rate_per_position,
/// lossless, num_prompts, tokens_generated, verify_passes, speedup, tau_sim, acc_k, teacher_forced_source,
/// device, dtype, chat_template, example (prompt 0 and its greedy answer as text), and with
/// opts.untrained the same figures of the untrained draft (acceptance_length_untrained, ...), and in the file
/// aerie_version. An EvalSession evaluating opts.draft_path. At temperature > 0 the speculative runs
/// sample (SpecDecodeOptions: the standard rejection rule, so their output is distributed as the target's
/// sampling) and eval.json has "sampling" {temperature, top_p, sample_seed} instead of lossless /
/// lossless_failures (a sampled output is not compared with greedy decoding; greedy decoding still gives
/// speedup's baseline and the teacher-forced fallback texts). World rank 0 logs the acceptance length,
/// lossless (or the temperature), tau_sim and the draft's variant (EAGLE-3, or its EAGLE-3.1 options), and
/// with opts.untrained a line with the untrained draft's acceptance length and tau_sim.
nlohmann::json run_eval(const EvalOptions& opts);

}  // namespace aerie
