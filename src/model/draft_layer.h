// Internal to the draft (src/model/draft*.cc): one application of the draft's decoder layer to n rows
// at consecutive positions, split around the attention so that the TTT trainer and the decoder can
// plug in their own key/value sets, plus the TTT attention (causal step-0 part + diagonal, merged by
// log-sum-exp). Math: /work/shared/docs/eagle3.md sections 3-4.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "model/draft.h"

namespace aerie::draft_detail {

/// Everything the backward needs from one layer application (n rows, positions pos0 .. pos0+n-1).
/// Dtypes: C = the compute dtype (LayerCtx::compute: F32, or BF16 under bf16 compute); the residual
/// stream (h, y, o), the rstd's, lse and the logits are F32 in both modes.
struct LayerActs {
  int64_t n = 0, pos0 = 0;
  Tensor positions;         // [n] I32
  Tensor e_raw, rstd_e;     // [n, H] C embed_tokens[u], [n] F32 (input_layernorm(e_raw) lives only in a)
  Tensor h, rstd_h;         // [n, H] F32 input hidden, [n] F32 (hidden_norm(h) lives only in a)
  Tensor hn_res;            // [n, H] F32 hidden_norm(h), the residual base under norm_before_residual (else undefined)
  Tensor a;                 // [n, 2H] C concat(input_layernorm(e_raw), hidden_norm(h))
  Tensor q, k, v;           // [n, n_h, d], [n, n_kv, d], [n, n_kv, d] C; q and k after RoPE (MLA: d = qk_nope +
                            // qk_rope, n_kv = n_h, k = [k_nope | shared roped k_pe], v = [v | 0] zero-padded to d)
  Tensor attn, lse;         // [n, n_h, d] C attention output, [n, n_h] F32 its log-sum-exp
  // MLA only (DraftConfig::is_mla): the query LoRA (q_lora_rank > 0) and the latent.
  Tensor qa, rstd_qa, qan;  // [n, q_lora] C q_a_proj(a), [n] F32, [n, q_lora] C q_a_layernorm(qa)
  Tensor c_lat, rstd_c, cn; // [n, kv_lora] C the latent before kv_a_layernorm, [n] F32, [n, kv_lora] C after
  Tensor o_in;              // [n, n_h v_head_dim] C the heads' first v_head_dim columns of attn: o_proj's input
  Tensor y, rstd_y, n2;     // [n, H] F32 h (or hn_res) + o_proj(attn), [n], [n, H] C post_attention_layernorm(y)
  Tensor gate, up, act;     // [n, I] C
  Tensor o, rstd_o, no;     // [n, H] F32 layer output (the next step's hidden), [n], [n, H] C norm(o)
  Tensor no_out;            // [n, H] F32 norm(o), the next step's hidden under norm_output (else undefined)
  Tensor logits;            // [n, K] F32
};

/// The hidden state a draft step hands to the next one: a.o, or norm(o) (a.no_out) under norm_output.
inline const Tensor& next_hidden(const LayerActs& a) { return a.no_out.defined() ? a.no_out : a.o; }

/// Shared constants of a layer application.
struct LayerCtx {
  const DraftConfig& cfg;
  const DraftWeights& w;
  const Tensor& embed;          // [V, H] F32 or BF16, frozen
  std::vector<float> inv_freq;  // RoPE inverse frequencies [d/2] (MLA: [qk_rope/2], interleaved pairs)
  std::vector<float> neg_inv_freq;  // MLA: -inv_freq (the interleaved rope's backward rotates by -angle)
  float rope_scale = 1.0f;      // MLA: rope_attention_factor (cos/sin multiplier)
  Tensor head_ones;             // MLA: [n_h] F32 ones on `device` (sums the heads' rope-key gradients)
  float scale;                  // the softmax scale, DraftConfig::softmax_scale() (1/sqrt(d) for Llama)
  Device device;                // where the weights (and so every activation) live: w.fc's device
  /// The GEMM input dtype: the matrices' dtype (all nine agree), F32, or BF16 for a compute copy
  /// (DraftWeights::compute_copy): then the activations that feed a GEMM are bf16 and every GEMM
  /// accumulates in fp32 (see ttt_forward_backward in draft.h).
  DType compute;
  /// Optional [>= max position + 1] I32 table 0, 1, 2, ... on `device` (the TTT pass sets it once per
  /// sample): layer_qkv then slices its positions from it instead of building them on the host.
  Tensor arange;
  /// Throws aerie::Error when embed is not [V, H] or lives on another device than the weights, when
  /// the matrices do not share one dtype (F32 or BF16), when the weights are not the config's layout
  /// (Llama or MLA, each tensor of DraftWeights::zeros(cfg)'s shape), or when input_norm is not there
  /// exactly under norm_before_fc ([3 H_t], on the weights' device), or fc_norm.{0,1,2} exactly under
  /// fc_norm ([H_t] each).
  LayerCtx(const DraftConfig& c, const DraftWeights& w, const Tensor& embed);
};

/// What layer_fc_backward needs from layer_fc: the norm's output and rstd under norm_before_fc or fc_norm.
struct FcActs {
  Tensor fn;    // [n, 3 H_t] C input_norm(f), the fc GEMM's input (undefined without norm_before_fc)
  Tensor rstd;  // [n] F32 the norm's 1/rms ([3, n] under fc_norm, one row per chunk; undefined without either)
};

/// The fused feature's projection g = fc(f) [n, H] F32 (eagle3.md section 3), or g = fc(input_norm(f))
/// under EAGLE-3.1's norm_before_fc (vLLM's combine_hidden_states: input_norm over the whole
/// concatenation [n, 3 H_t], eps = rms_norm_eps, before fc). f: [n, 3 H_t] in the compute dtype (the norm
/// reads it as it is, fp32 arithmetic, and writes input_norm(f) in the compute dtype), or, under fc_norm,
/// g = fc(concat_k fc_norm.k(f_k)) (one RMSNorm per aux chunk f_k of H_t columns, SpecForge 0.2.0's
/// project_hidden_states; the same dtypes). acts (optional): receives fn and rstd for layer_fc_backward.
/// Throws aerie::Error on a shape mismatch.
Tensor layer_fc(const LayerCtx& c, const Tensor& f, FcActs* acts);
/// Backward of layer_fc: dg [n, H] F32 -> adds dg^T fn (or dg^T f) to g.fc and, under norm_before_fc,
/// the input norm's weight gradient (RMSNorm backward of d fn = dg fc) to g.input_norm (under fc_norm
/// each chunk's to g.fc_norm[k], from d fn's and f's columns of that chunk). f is frozen: no
/// gradient for it. on_fc_ready (optional) is called once fc's gradient is final, before the norm's.
void layer_fc_backward(const LayerCtx& c, const Tensor& f, const FcActs& acts, const Tensor& dg, DraftWeights& g,
                       const std::function<void()>& on_fc_ready = {});

/// Up to the attention: e, hn, a, q, k, v (RoPE at positions pos0 + i). ids: n input tokens u; h: [n, H].
/// MLA: q from q_b(q_a_layernorm(q_a(a))) (or q_proj(a)), its rope columns rotated (interleaved); the
/// latent [kv_a_layernorm(c) | rope(k_pe)] from kv_a_proj_with_mqa(a) and k, v expanded from kv_b(cn).
/// Host ids (copied to the weights' device when that is not the CPU).
void layer_qkv(const LayerCtx& c, const int32_t* ids, int64_t n, const Tensor& h, int64_t pos0, LayerActs& a);
/// The same with ids: [n] I32 already on the weights' device (no host work on CUDA besides launches).
void layer_qkv(const LayerCtx& c, const Tensor& ids, const Tensor& h, int64_t pos0, LayerActs& a);
/// After the attention (a.attn filled): y, MLP, o, logits.
void layer_out(const LayerCtx& c, LayerActs& a);

/// Backward of lm_head only (logits = lm_head(no)): dlogits [n, K] F32 -> returns dno [n, H] F32, adds to
/// g.lm_head (F32). Done right after the loss so that no [n, K] tensor outlives its step. Under bf16
/// compute dlogits is rounded to a bf16 copy for the two GEMMs (fp32 accumulation).
Tensor layer_head_backward(const LayerCtx& c, const LayerActs& a, const Tensor& dlogits, DraftWeights& g);
/// Backward of the rest of layer_out from dno (layer_head_backward). do_extra: gradient into the first
/// do_extra.dim(0) rows of the next step's hidden (o, or norm(o) under norm_output: then added to dno,
/// whose rows it changes) from the next TTT step, or an undefined tensor. Adds weight
/// gradients to g. Returns dattn [n, n_h, d] (compute dtype: attention_backward's dout) and dh [n, H] F32
/// (the residual path only). dno, do_extra: F32.
void layer_out_backward(const LayerCtx& c, const LayerActs& a, const Tensor& dno, const Tensor& do_extra,
                        DraftWeights& g, Tensor& dattn, Tensor& dh);
/// Backward of layer_qkv from the gradients w.r.t. the post-RoPE q, k and v (dq, dk modified in place
/// by the inverse rotation; MLA: dk's nope and dv's first v_head_dim columns feed kv_b, dk's rope columns
/// summed over the heads feed the shared k_pe, dv's padding is ignored). Adds weight gradients to g (embed_tokens is frozen). dh (F32): on entry the
/// residual path's gradient (layer_out_backward's), w.r.t. h, or w.r.t. hidden_norm(h) under
/// norm_before_residual; on return dL/dh.
/// dq: compute dtype (attention_backward's); dk, dv: F32 or the compute dtype.
void layer_qkv_backward(const LayerCtx& c, const LayerActs& a, Tensor& dq, Tensor& dk, const Tensor& dv,
                        DraftWeights& g, Tensor& dh);

/// TTT attention of n query rows: row i attends to the keys j <= i + q_offset of k0/v0 (causal,
/// attention_forward) and to row i of every diag_k[j]/diag_v[j] (the diagonal: its own keys of the
/// earlier TTT steps / its own earlier guesses), merged by log-sum-exp. q: [n, n_h, d]; k0, v0:
/// [Tk, n_kv, d]; diag tensors [>= n, n_kv, d]. out: [n, n_h, d], lse: [n, n_h]. window > 0
/// (DraftConfig::sliding_window): row i sees the step-0 keys i + q_offset - window < j <= i + q_offset
/// only (speculators' mask: the window counts from the row, the diagonal keys are always seen). Any
/// device and dtype that kernels/attention.h takes (attention_forward + attention_merge_diagonal_forward).
void ttt_attention_forward(const Tensor& q, const Tensor& k0, const Tensor& v0, const std::vector<const Tensor*>& diag_k,
                           const std::vector<const Tensor*>& diag_v, int64_t q_offset, float scale, int64_t window,
                           Tensor& out, Tensor& lse);
/// Its backward (q_offset 0) from the merged out/lse: dq OVERWRITTEN; dk0, dv0 and the diagonal
/// gradients (rows 0..n-1 of ddiag_k/ddiag_v) ADDED to.
void ttt_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k0, const Tensor& v0,
                            const std::vector<const Tensor*>& diag_k, const std::vector<const Tensor*>& diag_v,
                            const Tensor& out, const Tensor& lse, float scale, int64_t window, Tensor& dq, Tensor& dk0,
                            Tensor& dv0, const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v);

}  // namespace aerie::draft_detail
