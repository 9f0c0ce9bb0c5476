// The EAGLE-3 draft (eagle3.md section 3): fc 3H -> H, one Llama decoder layer whose attention reads
// 2H (embedding, hidden), lm_head over the draft vocabulary. Training-time test (section 4) forward
// and backward on the CPU, and a decoder with a KV cache for speculative decoding (section 6).
// Sources: EAGLE-3 (Li et al. 2025, arXiv 2503.01840) section 3; SpecForge llama3_eagle.py;
// vLLM/SGLang llama_eagle3.py.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/target_config.h"
#include "model/sampling.h"

namespace aerie {

struct DraftConfig {
  int64_t hidden_size = 0;         // H of the draft (= the target's)
  int64_t target_hidden_size = 0;  // H of the target (fc reads 3 * this)
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0, intermediate_size = 0;
  int64_t vocab_size = 0;        // V (target vocabulary)
  int64_t draft_vocab_size = 0;  // K
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  RopeParams rope;
  nlohmann::json rope_scaling;  // copied verbatim from the target's config.json (null if absent)
  std::vector<int> aux_layers;  // aerie convention: input of layer k (vLLM's)
  int64_t target_num_hidden_layers = 0;  // N of the target (0 if unknown): decides whether aux_layers is default
  /// EAGLE-3.1's norm_before_residual (speculators, vLLM: config.norm_before_residual; SGLang has no such
  /// option): the layer's residual base is hidden_norm(h) instead of h, y = hidden_norm(h) +
  /// o_proj(attention) (eagle3.md section 3 with the option; docs/design.md). Off by default (the
  /// original EAGLE-3 layout).
  bool norm_before_residual = false;
  /// EAGLE-3.1's norm_output (speculators, vLLM, SGLang: config.norm_output): the hidden state a draft
  /// step hands to the next one is norm(o), the lm_head's input, instead of the layer output o (vLLM's
  /// hidden_prenorm). Off by default (the original EAGLE-3 chain).
  bool norm_output = false;
  /// EAGLE-3.1's norm_before_fc (vLLM, SGLang: eagle_config.norm_before_fc, else config.norm_before_fc;
  /// speculators: config.norm_before_fc): one RMSNorm with a trained weight input_norm [3 H_t] over the
  /// concatenated aux hidden states before fc, g = fc(input_norm(f)) (the draft's rms_norm_eps). Off by
  /// default (the original EAGLE-3 fc(f)).
  bool norm_before_fc = false;
  /// EAGLE-3.1's per-chunk norm (SpecForge 0.2.0's and speculators' config.fc_norm): one RMSNorm with a
  /// trained weight fc_norm.k [H_t] over each aux chunk f_k of the fused feature before fc,
  /// g = fc(concat(fc_norm.0(f_1), fc_norm.1(f_2), fc_norm.2(f_3))) (the draft's rms_norm_eps; SpecForge's
  /// Eagle3DraftModel.project_hidden_states). Off by default; not with norm_before_fc (speculators refuses
  /// the pair) nor with the MLA draft.
  bool fc_norm = false;
  /// A sliding window for the draft's attention (speculators' default 2048; vLLM: config.layer_types =
  /// ["sliding_attention"] with config.sliding_window): a TTT row i sees the step-0 keys of positions
  /// i - sliding_window < j <= i, and always its own diagonal keys (speculators'
  /// create_combined_mask_mod); the decoder's row of position p the cached keys p - sliding_window < j <= p.
  /// 0: none (full causal attention, the original EAGLE-3 layer).
  int64_t sliding_window = 0;
  /// The MLA draft (vLLM's Eagle3DeepseekV2ForCausalLM, TorchSpec's and Model-Optimizer's
  /// Kimi-K2 drafts): the layer's attention is DeepSeek-V2/V3 multi-head latent attention reading the
  /// 2H input (q_a_proj -> q_a_layernorm -> q_b_proj, or q_proj when q_lora_rank is 0;
  /// kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj; one interleaved rope key of qk_rope_head_dim
  /// shared by the heads; o_proj from num_attention_heads * v_head_dim), the rest as the Llama draft.
  /// kv_lora_rank > 0 marks it; then head_dim is qk_rope_head_dim and num_key_value_heads
  /// num_attention_heads (DeepseekV3Config's reading). Math: docs/design.md "The MLA draft".
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool is_mla() const { return kv_lora_rank > 0; }
  /// The attention as the TTT kernels see it: kv heads (MLA: one per query head, the keys expanded),
  /// the query/key head dim (MLA: qk_nope + qk_rope) and the width of a head's output that o_proj
  /// reads (MLA: v_head_dim; the values are zero-padded to the key width inside the attention).
  int64_t attn_kv_heads() const { return is_mla() ? num_attention_heads : num_key_value_heads; }
  int64_t attn_qk_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int64_t attn_v_dim() const { return is_mla() ? v_head_dim : head_dim; }
  /// The number of trainable parameters DraftWeights::zeros allocates for this config, as a double (an
  /// absurd size, --draft-heads 1000000, must not overflow before it is refused).
  double num_parameters() const;
  /// The attention's softmax scale: 1/sqrt(head_dim), or for MLA (qk_nope + qk_rope)^-0.5 times
  /// yarn mscale(factor, mscale_all_dim)^2 under a scaled rope with mscale_all_dim (DeepseekV3Attention).
  float softmax_scale() const;

  /// Copies width, heads, MLP width, eps, RoPE and max positions from the target (eagle3.md 3).
  /// mla: the MLA draft, with the target's q/kv LoRA ranks and head dims (the target must be an MLA
  /// model, DeepSeek-V3 / Kimi-K2; one without a query LoRA gives a draft with one of kv_lora_rank, the
  /// layout the engines load). Throws aerie::Error unless 0 < draft_vocab_size <= V, aux_layers
  /// has 3 ids in [0, N], and (mla) the target has MLA attention.
  static DraftConfig from_target(const TargetConfig& target, int64_t draft_vocab_size, std::vector<int> aux_layers,
                                 bool mla = false);
  /// The export config.json of eagle3.md section 5 (LlamaForCausalLMEagle3, torch_dtype bfloat16,
  /// target_hidden_size only when it differs, eagle_config.eagle_aux_hidden_state_layer_ids only when
  /// aux_layers is not the default of target_num_hidden_layers) plus an "aerie" object holding
  /// aux_layers (aerie's input-of-layer-k convention), its convention and target_num_hidden_layers,
  /// so that from_json restores every field exactly.
  nlohmann::json to_json() const;
  /// Reads to_json's output, or a plain LlamaForCausalLMEagle3 config.json (aux layers then from
  /// eagle_config, else empty). Throws aerie::Error naming the missing/malformed field.
  static DraftConfig from_json(const nlohmann::json& j);
};

/// Trainable draft parameters, F32 (master weights; also used for gradients and AdamW moments), or a
/// compute copy (compute_copy: the nine matrices BF16, the norm weights shared F32) for bf16 compute.
/// input_norm exists (is defined) only for a draft with norm_before_fc: named() lists it then, last;
/// fc_norm[0..2] only for a draft with fc_norm: named() lists them then, last, as fc_norm.{0,1,2}.weight.
struct DraftWeights {
  Tensor fc;                          // [H, 3 H_t]
  Tensor q_proj;                      // [n_h d, 2H]
  Tensor k_proj, v_proj;              // [n_kv d, 2H]
  Tensor o_proj;                      // [H, n_h d]
  Tensor gate_proj, up_proj;          // [I, H]
  Tensor down_proj;                   // [H, I]
  Tensor input_layernorm, hidden_norm, post_attention_layernorm, norm;  // [H]
  Tensor lm_head;                     // [K, H]
  Tensor input_norm;                  // [3 H_t] under norm_before_fc (EAGLE-3.1), else undefined
  Tensor fc_norm[3];                  // [H_t] each under fc_norm (EAGLE-3.1's per-chunk norms), else undefined
  // The MLA draft (DraftConfig::is_mla; k_proj / v_proj undefined then, q_proj only without q_lora_rank):
  // dq = qk_nope + qk_rope, lat = kv_lora_rank + qk_rope, o_proj [H, n_h v_head_dim].
  Tensor q_a_proj;                    // [q_lora, 2H]
  Tensor q_a_layernorm;               // [q_lora]
  Tensor q_b_proj;                    // [n_h dq, q_lora]   (q_proj [n_h dq, 2H] without q_lora_rank)
  Tensor kv_a_proj_with_mqa;          // [lat, 2H]
  Tensor kv_a_layernorm;              // [kv_lora]
  Tensor kv_b_proj;                   // [n_h (qk_nope + v_head_dim), kv_lora]

  /// (export name, tensor) in a fixed order, names as eagle3.md section 5 ("fc.weight",
  /// "midlayer.self_attn.q_proj.weight", ..., "norm.weight", "lm_head.weight"), then "input_norm.weight"
  /// when input_norm is defined (vLLM's, SGLang's and speculators' name of the norm_before_fc weight), or
  /// "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight" when fc_norm[0] is (SpecForge's names).
  /// An MLA draft (kv_a_proj_with_mqa defined) lists its attention as vLLM's Eagle3DeepseekV2ForCausalLM
  /// loads it: "midlayer.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
  /// kv_a_layernorm, kv_b_proj, o_proj}.weight" in place of q/k/v/o_proj. Matrices are the 2-D entries,
  /// norm weights the 1-D ones.
  std::vector<std::pair<std::string, Tensor*>> named();
  std::vector<std::pair<std::string, const Tensor*>> named() const;
  /// The names named() lists for a draft of config cfg (no tensor allocated).
  static std::vector<std::string> names(const DraftConfig& cfg);
  /// Zero F32 tensors of the config's shapes on `device` (CPU or CUDA); input_norm only under
  /// cfg.norm_before_fc, fc_norm only under cfg.fc_norm.
  static DraftWeights zeros(const DraftConfig& cfg, Device device = Device::CPU);
  /// A deep copy of every tensor on `device` (same dtypes and shapes): weights go to the GPU with it and
  /// come back to the host for a checkpoint. Copies between host and GPU return when done.
  DraftWeights to_device(Device device) const;
  /// The device of the tensors (fc's; all of them live on one device).
  Device device() const { return fc.device(); }
  /// The compute copy of mixed-precision training (eagle3.md section 4: fp32 master weights, bf16
  /// compute): the matrices (the 2-D entries of named(); nine for the Llama draft) (fc, q/k/v/o_proj, gate/up/down_proj, lm_head) converted to `dtype` (F32
  /// or BF16, round to nearest even) on the same device, the RMSNorm weights (four, five with input_norm) SHARED with these
  /// weights (the same F32 storage, so updates of the masters reach them at once). dtype F32 returns a
  /// copy that shares every tensor. Throws aerie::Error for another dtype or non-F32 masters.
  DraftWeights compute_copy(DType dtype) const;
  /// Rewrites the matrices of `compute` (made by compute_copy of weights of this shape) from these
  /// masters: one convert per matrix (queued on the current stream on CUDA); matrices that share storage
  /// with the masters (an F32 copy) are left alone; compute's norm weights are pointed at these masters'
  /// (shared storage). Throws aerie::Error on mismatched shapes.
  void refresh_compute_copy(DraftWeights& compute) const;
  /// The dtype of the matrices: F32 (masters, gradients), or BF16 for a bf16 compute copy.
  DType compute_dtype() const { return fc.dtype(); }
};

/// Initial weights: linears ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from a seeded std::mt19937_64
/// (nn.Linear's default bound), drawn in named() order, norms = 1 (the MLA latent norms too) (input_norm too, under norm_before_fc: RMSNorm's init), lm_head = rows `selected` (s_0..s_{K-1}) of the target's
/// W_lm [V, H], or with `random_lm_head` U(-1/sqrt(H), 1/sqrt(H)) drawn after the other linears (so
/// they are the same draws: SpecForge's nn.Linear init of its lm_head). Deterministic for a given seed.
DraftWeights init_draft_weights(const DraftConfig& cfg, const Tensor& target_lm_head,
                                const std::vector<int64_t>& selected, uint64_t seed, bool random_lm_head = false);

/// One training sample, prepared from an extraction shard (no packing: one sample per row block).
struct TTTSample {
  std::vector<int32_t> ids;        // x_0..x_{T-1}
  std::vector<uint8_t> loss_mask;  // m_0..m_{T-1}
  Tensor aux_hidden;               // [T, 3 H_t] F32 or BF16 (as stored by extraction): f_t
  Tensor target_probs;             // [T, K] F32: row p = softmax(l_p restricted to s_0..s_{K-1})
  std::vector<int64_t> target_argmax;  // [T]: argmax over all V of l_p
};

/// Builds a TTTSample from the stored final hidden states z [T, H] (F32 or BF16): l_p = W_lm z_p with
/// the target's lm_head [V, H] (eagle3.md section 1: logits AFTER the final norm), computed where W_lm
/// lives. aux_hidden is kept as given: F32, or BF16 (not widened: ttt_forward_backward converts it to
/// its compute dtype on the weights' device).
TTTSample make_ttt_sample(std::vector<int32_t> ids, std::vector<uint8_t> loss_mask, Tensor aux_hidden,
                          const Tensor& final_hidden, const Tensor& target_lm_head,
                          const std::vector<int64_t>& selected);

/// Per-step statistics of one TTT pass (sums, so that they add over samples and ranks).
struct TTTStats {
  std::vector<double> loss_sum;     // [S] sum_t valid * CE
  std::vector<int64_t> valid;       // [S] number of valid rows (loss denominator)
  std::vector<int64_t> correct;     // [S] rows counted by acc_k whose prediction is right
  std::vector<int64_t> acc_rows;    // [S] rows counted by acc_k (m_{t+k+2} = 1, t+k+2 <= T-1)
};

/// valid_k counts of eagle3.md section 4 for one sample (a cheap pass over the data only), so that a
/// data-parallel step can all-reduce the denominators before the backward.
std::vector<int64_t> ttt_valid_counts(const TTTSample& s, const std::vector<uint8_t>& t2d, int num_steps);

/// Called by ttt_forward_backward with the index (in DraftWeights::named() order) of a parameter whose
/// gradient in *grads receives no further term in that call, so that a data-parallel trainer can start
/// its all-reduce while the backward goes on.
using GradReadyFn = std::function<void(int param_index)>;

/// The order in which ttt_forward_backward reports gradients final (every parameter once, always this
/// order): lm_head (all its terms come from the forward), norm, down/gate/up_proj,
/// post_attention_layernorm, o_proj (the step-0 MLP backward), q/k/v_proj, input_layernorm, hidden_norm
/// (the step-0 attention backward; the MLA draft's attention weights in named() order in their place),
/// fc, and under cfg.norm_before_fc input_norm (last of named(), whose gradient follows fc's:
/// d input_norm(f) = dg fc). Indices into DraftWeights::zeros(cfg).named().
std::vector<int> ttt_gradient_ready_order(const DraftConfig& cfg);

/// The S-step training-time test on one sample: forward, loss and metrics; when `grads` is non-null
/// also the backward, ADDING d(sum_k step_weight[k] * loss_sum_k)/dw into *grads
/// (step_weight[k] = 0.8^k / global valid_k for the eagle3.md loss). embed_tokens: the target's
/// [V, H] (frozen). Attention: step-0 causal + the diagonal, never a T x T matrix.
/// Rows: step k computes rows t = 0 .. T-2-k only (those whose input token x_{t+k+1} exists). The
/// others are exactly dead: they are never valid nor counted by acc_k (both need t+k+2 <= T-1), later
/// steps read only rows t' < T-2-k of step k (their own row through h and the diagonal), and the
/// step-0 keys of a row t are attended only by rows >= t. So skipping them changes nothing.
/// The hidden passed to step k+1 is NOT detached (SpecForge llama3_eagle: hidden_states = the layer
/// output, gradients flow back through all steps). step_logits (optional): receives per step the
/// draft logits [T-1-k, K] F32 (an empty [0, K] tensor when the step has no row). Throws aerie::Error
/// on inconsistent shapes (sample vs config, d2t/t2d sizes, step_weight shorter than num_steps).
/// Precision: the dtype of w's matrices decides. F32 weights: everything fp32 (the reference; on CUDA
/// true fp32 GEMMs). A BF16 compute copy (DraftWeights::compute_copy): the GEMM inputs are bf16 (the
/// matrices; f; the norm outputs, q/k/v, the attention output and the MLP activations, made in bf16 by
/// the op that produces them, input_norm(f) under norm_before_fc too (the norm reads the bf16 f, as vLLM's
/// bf16 model does); the gradients dlogits, d(o), d(y), dq/dk/dv and d(g), rounded to bf16
/// once before their GEMMs), every GEMM accumulates in fp32, and F32 stays: the residual stream h, y, o
/// (the GEMMs adding into it write F32), the logits, softmax and cross-entropy, the RMSNorm arithmetic,
/// the attention softmax (q/k/v bf16: the tensor-core forward), the key/value gradient sums over steps,
/// and the weight gradients (grads: F32, the GEMMs add into them in fp32; d input_norm(f) = dg fc is F32).
/// grads must be F32 (with input_norm exactly when cfg.norm_before_fc).
/// on_grad_ready (optional, only with grads): see GradReadyFn and ttt_gradient_ready_order.
TTTStats ttt_forward_backward(const DraftConfig& cfg, const DraftWeights& w, const Tensor& embed_tokens,
                              const TTTSample& s, const std::vector<int64_t>& d2t, const std::vector<uint8_t>& t2d,
                              int num_steps, const std::vector<double>& step_weight, DraftWeights* grads,
                              std::vector<Tensor>* step_logits = nullptr, const GradReadyFn& on_grad_ready = {});

/// The draft at inference (eagle3.md section 6), one sequence, greedy chain. It keeps the
/// target-conditioned cache: the step-0 keys/values (and outputs o) of every verified position p,
/// computed from the target's aux hidden state f_p and the next token u_p = x_{p+1}. propose() runs
/// the chain from the last cached position: guess 1 comes from that position's step-0 logits; guess j+1
/// from a step-j query at position p+j (input: guess j, hidden: the previous step's o) that attends to
/// the cache 0..p plus the chain's own keys of steps 1..j - exactly the TTT attention of section 4 (the
/// "diagonal"), so training sees what inference sees. The chain's keys are never added to the cache.
/// A tree of draft tokens after the last verified token (EAGLE-2's dynamic draft tree, SGLang's
/// num_steps / eagle_topk / num_draft_tokens): tokens[i] (target ids) is a child of node parent[i] (-1:
/// of the last verified token, the root); nodes in breadth-first order (depths ascending, parent[i] < i).
struct DraftTree {
  std::vector<int32_t> tokens, parent;
};

class DraftDecoder {
 public:
  /// cfg/weights/embed_tokens [V, H] are referenced, not copied (keep them alive). d2t: [K] offsets.
  /// max_len: cache capacity in positions. Throws aerie::Error on inconsistent sizes.
  DraftDecoder(const DraftConfig& cfg, const DraftWeights& weights, const Tensor& embed_tokens,
               std::vector<int64_t> d2t, int64_t max_len);
  ~DraftDecoder();
  DraftDecoder(DraftDecoder&&) noexcept;
  DraftDecoder& operator=(DraftDecoder&&) noexcept;

  /// Runs step 0 for positions length() .. length()+n-1 and caches their keys/values and outputs.
  /// aux_hidden: [n, 3 H_t] F32 (f_p of those positions, from the target); next_tokens: [n] target ids,
  /// next_tokens[i] = x_{p+1} for p = length()+i. Throws if the cache would exceed max_len.
  void append_verified(const Tensor& aux_hidden, const std::vector<int32_t>& next_tokens);
  /// Drops cached positions >= len. Throws if len > length() or len < 0.
  void truncate(int64_t len);
  int64_t length() const;
  /// n >= 1 greedy guesses (target ids, via d2t) for positions length()+1 .. length()+n, i.e. the tokens
  /// after next_tokens.back(). Needs length() >= 1. logits (optional): the n draft logit rows [K].
  std::vector<int32_t> propose(int n, std::vector<std::vector<float>>* logits = nullptr);
  /// n >= 1 sampled guesses for the same positions: guess i is drawn (one rng.uniform() each, in draft-id
  /// order against the cumulative sums) from q_i = sampling_distribution(draft logits row i, p) over the K
  /// draft ids, and the chain continues from the drawn token. Temperature 0: propose's greedy chain, no
  /// draw. q (optional): the n distributions [K] (double; q_i of the returned guess i is > 0). Throws
  /// aerie::Error on invalid params (check_sampling_params) or as propose.
  std::vector<int32_t> propose_sampled(int n, const SamplingParams& p, SampleRng& rng,
                                       std::vector<std::vector<double>>* q = nullptr);
  /// A draft tree of at most `budget` nodes (EAGLE-2, Li et al. 2024, section 4; SGLang's tree with
  /// num_steps = depth, eagle_topk = topk, num_draft_tokens = budget + 1): the root's top-k draft tokens
  /// form depth 1; at each further depth the top-k nodes of the previous one by score (the sum of the
  /// draft's log-probabilities along the path) are expanded, each by one draft step (the chain's step at
  /// its position, attending the cache and its own ancestors' keys) into its top-k children; then the
  /// `budget` nodes of the highest score (ties: the earlier made, so every parent precedes its children)
  /// form the tree. topk = 1 gives propose(min(budget, depth))'s chain. Throws aerie::Error unless
  /// budget, topk, depth >= 1 and length() >= 1.
  DraftTree propose_tree(int budget, int topk, int depth);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace aerie
