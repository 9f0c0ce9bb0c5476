// The building blocks of the target's decoder layers (llama.cpp's build_attn / build_ffn in aerie's
// terms): a forward context shared by every block of one forward, a Linear that knows its weight
// format, and the two block interfaces (attention, FFN) that architecture files combine into
// DecoderLayers. The scaffold around them (capture, residual, norms) is written once, in decoder.cc.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "kernels/moe_router.h"
#include "model/linear.h"
#include "model/op_profile.h"
#include "model/target.h"
#include "model/weight_source.h"

namespace aerie {

/// The rows of one forward: B sequences whose rows are concatenated (n = sum n_b); sequence b's rows
/// are start[b] .. start[b+1]-1 at positions p0[b] .. (p0[b] = its cache length, 0 without a cache).
struct ForwardBatch {
  int64_t B = 0, n = 0, longest = 0;
  std::vector<int64_t> start, p0;  // [B + 1], [B]
  std::vector<KVCache*> cache;     // [B], null: no cache
  Tensor positions;                // [n] I32 on the model's device
  Tensor cu_seqlens;               // [B + 1] I32: defined when every sequence starts at 0 and B > 1
  bool direct_cache = false;       // B == 1 with a cache: k/v may be written into its slots directly
  // A token tree (TargetModel::forward_tree; B == 1 with a cache): row i's parent row (-1 for row 0) and
  // depth (its position is p0 + depth); empty for a sequence.
  std::vector<int32_t> tree_parent, tree_depth;
  // The tree's path keys, built once per forward for every layer: rows tree_groups[g].begin .. end-1
  // are the rows of depth D = tree_groups[g].depth, and entries offset + j m .. offset + (j+1) m - 1
  // of tree_path_slots (m = end - begin; j = 0 .. D) are the cache slots of those rows' ancestors at
  // depth j (j = D: the rows themselves), all below p0 + n.
  struct TreeGroup {
    int64_t begin = 0, end = 0, offset = 0;
    int32_t depth = 0;
  };
  std::vector<TreeGroup> tree_groups;
  Tensor tree_path_slots;  // [sum over groups of m (D + 1)] I32 on the model's device
};

/// What every block of one forward shares: device, compute dtype, tp group, op profile, the batch, and
/// a workspace of per-forward buffers reused by every layer (one allocation per forward, as the layers
/// of one target have one shape).
class ForwardContext {
 public:
  /// The scratch pool is the context's own, or `shared_scratch` when given: the micro-batches of one
  /// forward (TargetModel's --tp-overlap) share one, so a dequantized weight is held once, not per
  /// micro-batch (a scratch lives within one call on the compute stream; the memory plan counts one).
  ForwardContext(Device device, DType dtype, Communicator& tp, OpProfile& prof, const ForwardBatch& batch,
                 std::map<std::string, Tensor>* shared_scratch = nullptr)
      : device(device), dtype(dtype), tp(tp), prof(prof), batch(batch),
        scratch_(shared_scratch ? shared_scratch : &own_scratch_) {}
  const Device device;
  const DType dtype;  // compute dtype: GEMM inputs, KV cache, captured outputs
  Communicator& tp;
  OpProfile& prof;
  const ForwardBatch& batch;

  /// The workspace buffer `name` of `shape` and `dtype` on the device (contents undefined): the same
  /// storage for every layer that asks with the same shape and dtype during this forward.
  Tensor buffer(const std::string& name, const Shape& shape, DType dtype);
  /// A flat workspace of `numel` elements of `dtype` (contents undefined) that only grows: every
  /// caller of one name shares the storage of the largest request so far (Linear's dequantized
  /// weight: one buffer per forward for all layers, whatever their shapes). Device memory is
  /// stream-ordered, so growing it while earlier work still reads the old storage is safe.
  Tensor scratch(const std::string& name, int64_t numel, DType dtype);
  /// y = x W^T + beta y (matmul), timed as a GEMM.
  void gemm(const Tensor& x, const Tensor& W, Tensor& y, float beta = 0.0f);
  /// y += b broadcast over rows (y [n, M], b [M]; nothing when b is undefined), timed as Other: a K = 1
  /// GEMM with beta 1 against a ones column (one fp32 rounding per element, as a direct add).
  void add_bias(Tensor& y, const Tensor& b);
  /// Sums y over the tp group (nothing at tp 1), timed as AllReduce, then adds `bias` (the summed output's
  /// bias, added once; undefined: none). With defer_reduction set (and tp > 1) the sum is only started
  /// (Communicator::start_all_reduce_sum) and the bias waits: finish_reduction() completes both, and y must
  /// not be touched before it. One reduction at a time per context.
  void all_reduce(Tensor& y, const Tensor& bias = Tensor());
  /// Completes the reduction all_reduce started under defer_reduction (its wait timed as AllReduce) and adds
  /// its bias; nothing when none is pending.
  void finish_reduction();
  /// Whether all_reduce only starts its sum: TargetModel's two micro-batches, each with its own context,
  /// whose blocks' all-reduces run while the other micro-batch computes.
  bool defer_reduction = false;

 private:
  std::unique_ptr<PendingCollective> pending_;
  Tensor pending_y_, pending_bias_;
  std::map<std::string, Tensor> buffers_;
  std::map<std::string, Tensor> own_scratch_;
  std::map<std::string, Tensor>* scratch_;  // own_scratch_ or the forward's shared pool
  Tensor ones_;  // [n, 1] of 1 in the compute dtype, made at the first bias
};

/// An attention block: from h = input_layernorm(r) [n, H] (compute dtype) to the residual update
/// out [n, H] F32, summed over the tp group (every rank returns the full sum), bias included. Appends
/// the batch's keys/values (or whatever it caches) to the KV caches of its layer.
class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  virtual void forward(ForwardContext& ctx, int64_t layer, const Tensor& h, Tensor& out) = 0;
  /// The shape of one cached position of this block for this rank: the K and V rows (e.g. [nkv, d]).
  virtual Shape cache_k_row() const = 0;
  virtual Shape cache_v_row() const = 0;
};

/// A feed-forward block: from h = post_attention_layernorm(r) [n, H] (compute dtype) to the residual
/// update out [n, H] F32, summed over the tp group, bias included.
class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual void forward(ForwardContext& ctx, const Tensor& h, Tensor& out) = 0;
};

/// One decoder layer: r += attn(input_norm(r)); r += ffn(post_norm(r)) (pre-norm, RMSNorm weights F32).
struct DecoderLayer {
  Tensor input_norm, post_norm;  // [H] F32, replicated
  std::unique_ptr<AttentionBlock> attn;
  std::unique_ptr<FfnBlock> ffn;
};

}  // namespace aerie

namespace aerie {

/// Grouped-query attention (Llama, Mistral, Qwen2/3; transformers' LlamaAttention): q/k/v projections
/// in one packed GEMM, optional biases, optional q/k RMSNorm over head_dim (Qwen3), RoPE of inv_freq,
/// causal softmax(q k^T * d^-0.5) v with an optional sliding window, o_proj (row-parallel).
struct GqaSpec {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;  // full sizes (heads split over tp)
  bool qkv_bias = false, o_bias = false, qk_norm = false;
  int64_t window = 0;           // sliding window W (0 = full attention)
  std::vector<float> inv_freq;  // [head_dim / 2]
  float eps = 1e-6f;            // the q/k norms' epsilon
};
/// Loads `prefix` {q,k,v,o}_proj.{weight,bias} and {q,k}_norm.weight (as the spec says) from `src`:
/// q/k/v rows of this rank's heads, o_proj's columns. Throws aerie::Error when tp does not divide the
/// heads or kv heads, or a tensor is missing or misshapen.
std::unique_ptr<AttentionBlock> make_gqa_attention(WeightSource& src, const GqaSpec& spec, const std::string& prefix);

/// The SwiGLU MLP (transformers' LlamaMLP): down(silu(x Wg^T + bg) * (x Wu^T + bu)) + bd, gate/up
/// packed into one GEMM (column-parallel rows of this rank's intermediate slice), down row-parallel.
struct DenseFfnSpec {
  int64_t hidden = 0, intermediate = 0;
  bool bias = false;
  bool reduce = true;       // false: the update stays this rank's partial sum (an MoE's shared experts)
  bool accumulate = false;  // with reduce false: out += the update (out F32: the MoE's routed sum)
};
/// Loads `prefix` {gate,up,down}_proj.{weight,bias}. Throws aerie::Error when tp does not divide the
/// intermediate size, or a tensor is missing or misshapen.
std::unique_ptr<FfnBlock> make_dense_ffn(WeightSource& src, const DenseFfnSpec& spec, const std::string& prefix);

}  // namespace aerie

namespace aerie {

/// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; transformers' DeepseekV3Attention,
/// deepseek-v3.md section 2), tensor parallel by heads (q_b / q_proj and kv_b column-parallel, o_proj
/// row-parallel, q_a / kv_a and both latent norms replicated). Runs in the expanded ("MHA") form:
///   q = q_b(q_norm(q_a(h))) (or q_proj(h)) viewed [n, nh, nope + rope]; [c_kv | k_pe] = kv_a(h);
///   kv = kv_b(kv_norm(c_kv)) viewed [n, nh, nope + v]; interleaved RoPE (YaRN inv_freq, cos/sin times
///   rope_attention_factor) on q_pe and the one shared k_pe; K_h = [k_nope_h | k_pe], softmax scale
///   (nope + rope)^-0.5 mscale(f, mscale_all_dim)^2; out = all_reduce(o_proj(concat_h O_h)).
/// The KV cache holds the latent [kv_norm(c_kv) | roped k_pe] per position (kv_lora + rope values per
/// token and layer, as vLLM's); a forward with a cache expands the cached latents through kv_b again.
/// The most new rows of one sequence with a KV cache that MLA computes in the absorbed form (decoding
/// steps: a token or a draft's few); longer chunks (a prompt's prefill) use the expanded form.
constexpr int64_t kMlaAbsorbedMaxRows = 16;

/// Whether a forward step of two or more cached sequences with one new row each (generate's decoding)
/// attends in one batched call per layer (scatter_rows + attention_decode_batch; MLA: absorbed_batch)
/// instead of one call or more per sequence. AERIE_BATCHED_DECODE in the environment decides when set to
/// 1 (on) or 0 (off); otherwise `cpu_default` on the CPU (GQA: on, the batched call being the per-sequence
/// arithmetic there, bitwise; MLA: off, its batched form rounds differently from forward()'s) and
/// `cuda_default` on CUDA (GQA: on, kernels/cuda/attention_decode.cu being tested on the GPU and faster for
/// generate: docs/performance.md; CUDA's per-sequence path was not
/// batch-invariant bitwise either, its GEMMs' rounding depending on the step's row count; MLA: on, tested in F32
/// and bf16 on the GPU and 2.2-2.7x faster for a tp-8 rank of Kimi-K2.5's generate at batch 64).
/// Read at each call; another value gives the default, with one warning per process.
bool batched_decoding(Device device, bool cpu_default, bool cuda_default);

/// The sequences of `b` that batched decoding takes: every one with a cache and exactly one new row, in
/// batch order, when `on`, no token tree and no direct cache write, and two or more of them (else none).
struct DecodeRows {
  std::vector<int64_t> seq;        // index of each taken sequence in the batch
  std::vector<int64_t> rows;       // its row of the step's packed rows
  std::vector<int64_t> positions;  // its cache position, where the new key goes (p0)
  std::vector<int64_t> lengths;    // the keys it attends, its own included (p0 + 1)
  std::vector<char> taken;         // [B]: 1 for a taken sequence
  bool empty() const { return seq.empty(); }
};
DecodeRows decode_rows(const ForwardBatch& b, bool on);

struct MlaSpec {
  int64_t hidden = 0, heads = 0, q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  std::vector<float> inv_freq;  // [qk_rope / 2]
  float rope_scale = 1.0f;      // rope_attention_factor (cos/sin multiplier)
  float softmax_scale = 0.0f;   // (qk_nope + qk_rope)^-0.5 mscale^2
  float eps = 1e-6f;            // the latent norms' epsilon
};
/// Loads `prefix` {q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
/// kv_b_proj, o_proj}.weight. Throws aerie::Error when tp does not divide the heads or a tensor is
/// missing or misshapen.
std::unique_ptr<AttentionBlock> make_mla_attention(WeightSource& src, const MlaSpec& spec, const std::string& prefix);

}  // namespace aerie

namespace aerie {

/// DeepSeek-V3's MoE FFN (transformers' DeepseekV3MoE, deepseek-v3.md section 3), tensor parallel within
/// every expert (gate/up rows and down columns of this rank's slice of moe_intermediate_size):
///   logits = h W_g^T in fp32 (W_g F32); experts, weights = moe_router_noaux_tc(logits, bias)
///   out = all_reduce(sum_k w_k Expert_k(h) (fp32) + SharedExperts(h)),  Expert(x) = down(silu(gate x) up x)
/// The tokens are sorted by expert (moe_sort_by_expert) and each expert's rows go through one GEMM per
/// projection; the routed sum is moe_combine (fp32).
/// The most bytes of dequantized (compute dtype) expert weights an MoE block holds at once: the
/// quantized experts that got rows are dequantized in chunks of this size (4 GiB: one chunk for
/// Kimi-K2.5's 384 INT4 experts at tp 8, whose bf16 gate/up share is 2.6 GiB; 12 chunks at tp 1).
constexpr int64_t kMoeScratchBytes = int64_t{4} << 30;

struct MoeSpec {
  int64_t hidden = 0, experts = 0, shared_experts = 0, moe_intermediate = 0;
  MoeRouterKind router = MoeRouterKind::SigmoidNoauxTc;
  int64_t n_group = 1, topk_group = 1, top_k = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  // The routed experts' projection names under experts.{e}. (Mixtral's checkpoints: w1, w3, w2).
  std::string gate_proj = "gate_proj", up_proj = "up_proj", down_proj = "down_proj";
};
/// Loads `prefix` gate.weight [E, H] (F32), gate.e_score_correction_bias [E] (F32; the noaux_tc router only),
/// experts.{e}.{gate_proj,up_proj,down_proj}.weight (the spec's names) and, with shared_experts > 0,
/// shared_experts.{gate,up,down}_proj.weight. Routes with kernels/moe_router.h moe_router of spec.router.
/// Throws aerie::Error when tp does not divide moe_intermediate_size or a tensor is missing or misshapen.
std::unique_ptr<FfnBlock> make_moe_ffn(WeightSource& src, const MoeSpec& spec, const std::string& prefix);

}  // namespace aerie
