// Where the target's weights come from while its layers are built: a Hugging Face checkpoint
// (streamed tensor by tensor, this tp rank's slice only, straight to the device in the compute dtype)
// or random values for benchmarks. Architecture files (model/arch_*.cc) ask a WeightSource for each
// tensor by its Hugging Face name, full shape and tp split, and never see which one it is.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/hf_checkpoint.h"
#include "model/linear.h"
#include "model/quant_config.h"

namespace aerie {

/// What a parameter is: it decides the dtype it is kept in (Norm, Router, RouterBias: F32; the others:
/// the compute dtype) and, for random weights, its values (Linear/Embedding/Router ~ N(0, std^2), Norm 1,
/// Bias and RouterBias 0). Router: an MoE gate weight, kept F32 because the router runs in fp32.
enum class ParamRole { Linear, Embedding, Norm, Bias, Router, RouterBias };

/// What a weight belongs to: the memory plan's categories (model/memory_plan.h; each has one sharding
/// rule per tensor, docs/memory-plan.md). A WeightSource knows it from the ParamRole of a request
/// (Embedding, Norm, Router, RouterBias) and, for Linears and biases, from the block asking (Scope).
enum class WeightCategory {
  Attention,      // MLA: q_a/kv_a replicated, q_b/kv_b by head, o by input; GQA: q/k/v by head, o by input
  DenseMlp,       // gate/up by intermediate (rows), down by intermediate (columns)
  SharedExperts,  // as the dense MLP
  RoutedExperts,  // tp within each expert: every rank holds all experts, 1/tp of each intermediate
                  // (expert_parallel: 1/tp of the experts, whole)
  Router,         // the MoE gate weight and its e_score_correction_bias: replicated
  EmbedLmHead,    // vocab-parallel rows, or replicated (PlanOptions::vocab_parallel_embeddings)
  Norms,          // replicated
  Other,          // a Linear or bias asked for outside any block: replicated
};
constexpr int kWeightCategories = 8;
/// "attention", "dense MLP", ... (the plan's row labels).
const char* category_name(WeightCategory c);

/// One projection of a Linear: its Hugging Face base name (without ".weight", e.g.
/// "model.layers.0.self_attn.q_proj") and the full [N, K] of its weight.
struct LinearTensor {
  std::string name;
  Shape full;
};

class WeightSource {
 public:
  WeightSource(int tp_rank, int tp_size, Device device, DType dtype);
  virtual ~WeightSource() = default;
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  /// Expert parallelism (TargetModelOptions::expert_parallel): an MoE layer gives each tp rank whole
  /// routed experts (rank r of tp: experts [r E / tp, (r + 1) E / tp)) instead of every expert's slice
  /// of moe_intermediate_size; everything else splits as before.
  bool expert_parallel() const { return expert_parallel_; }
  void set_expert_parallel(bool on) { expert_parallel_ = on; }
  Device device() const { return device_; }
  /// The compute dtype (F32 or BF16) of linears, embeddings and biases.
  DType dtype() const { return dtype_; }
  /// The Hugging Face name prefix of the decoder ("model." or a multimodal wrapper's).
  virtual std::string decoder_prefix() const = 0;

  /// What the tensors asked for next belong to: the decoder layer (-1: none) and the block (Other:
  /// none). The layer loop (build_target_weights) and the block factories (make_gqa_attention, ...)
  /// set it through Scope; the memory plan's source (model/plan_source.h) files each tensor under it,
  /// the loaders ignore it.
  struct Context {
    int64_t layer = -1;
    WeightCategory block = WeightCategory::Other;
  };
  const Context& context() const { return context_; }
  /// Within its lifetime the source splits tensors as if tp had `size` ranks and this were rank `rank`
  /// (tp_rank() and tp_size() say so meanwhile): the key/value heads of a GQA layer with fewer kv heads than
  /// tp ranks, replicated over tp / kv_heads ranks, are split over kv_heads "ranks" of rank tp_rank /
  /// (tp / kv_heads) (vLLM's QKVParallelLinear does the same). Throws aerie::Error unless 0 <= rank < size.
  class SplitAs {
   public:
    SplitAs(WeightSource& src, int rank, int size);
    ~SplitAs() { src_.tp_rank_ = rank_, src_.tp_size_ = size_; }
    SplitAs(const SplitAs&) = delete;
    SplitAs& operator=(const SplitAs&) = delete;

   private:
    WeightSource& src_;
    int rank_, size_;
  };
  /// Sets the context's block (or layer) while it lives, and restores the previous context after.
  class Scope {
   public:
    Scope(WeightSource& src, WeightCategory block) : src_(src), saved_(src.context_) { src.context_.block = block; }
    Scope(WeightSource& src, int64_t layer) : src_(src), saved_(src.context_) { src.context_.layer = layer; }
    ~Scope() { src_.context_ = saved_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WeightSource& src_;
    Context saved_;
  };
  /// Writes this rank's slice of `name` (full shape `full`, split `split`) into `dst`, whose shape is
  /// the slice's (a view of a packed tensor is fine: q/k/v rows of one qkv weight), dtype the role's,
  /// on device(). Throws aerie::Error naming the tensor (and file) when it is missing or misshapen.
  virtual void load_into(const std::string& name, const Shape& full, TpSplit split, ParamRole role, Tensor dst) = 0;
  /// A new tensor holding this rank's slice of `name` (load_into into a fresh tensor; the memory plan's
  /// source returns a Tensor::shape_only one instead, allocating nothing).
  virtual Tensor load(const std::string& name, const Shape& full, TpSplit split, ParamRole role);
  /// This rank's slice of the Linear `name` (a base name, full weight [N, K], split None, Rows or
  /// Cols) in the format the source holds it in (load_linear of one part).
  Linear load_linear(const std::string& name, const Shape& full, TpSplit split);
  /// Several projections stacked by rows as one Linear (q/k/v, gate/up: one GEMM): W = this rank's
  /// slices of parts[0], parts[1], ... one under the other, all of the same K and split.
  /// The base class (and the random source) loads dense `<name>.weight` tensors in the compute dtype
  /// through load_into. A checkpoint finds what it holds: `X.weight` BF16/F16/F32 (Dense, converted to
  /// the compute dtype), `X.weight` F8_E4M3 + `X.weight_scale_inv` F32 [ceil(N/128), ceil(K/128)]
  /// (BlockFp8, kept F8E4M3 on the device), or `X.weight_packed` I32 [N, K/8] + `X.weight_scale` BF16
  /// [N, K/32] + `X.weight_shape` I32|I64 [2] = (N, K) (Int4Group, kept I32 on the device); a quantized
  /// weight and its scales are sliced by rows (Rows) or columns (Cols: INT4 needs K/tp to be a
  /// multiple of 32; FP8 slices that do not start on a 128 boundary keep the enclosing blocks, see
  /// QuantPart). Bias tensors are not loaded here. Throws aerie::Error naming the tensor and file when
  /// a part is missing or misshapen, a quantized tensor comes without the config.json
  /// quantization_config of its format, a scale or weight_shape disagrees with its weight, the parts
  /// are in different formats, or tp does not divide the split dimension.
  /// With set_fp8_gemm(true), every Linear is then switched to W8A8 FP8 GEMMs (Linear::use_fp8_gemm).
  Linear load_linear(const std::vector<LinearTensor>& parts, TpSplit split);
  /// W8A8 block-FP8 GEMMs for the Linears loaded from now on (TargetModelOptions::fp8_gemm).
  void set_fp8_gemm(bool on) { fp8_gemm_ = on; }
  /// With set_fp8_gemm: the Linears switched (of them, quantized at load from a dense weight), and those
  /// that keep their own path (INT4; block-FP8 slices starting inside a 128-block).
  struct Fp8GemmCounts {
    int64_t switched = 0, quantized = 0, int4 = 0, misaligned = 0;
  };
  const Fp8GemmCounts& fp8_gemm_counts() const { return fp8_counts_; }
  /// Whether the source has `name` (random weights: always true). For tensors a config may omit.
  virtual bool has(const std::string& name) const = 0;
  /// Marks a tensor the model does not need as accounted for (a tied checkpoint's lm_head copy).
  virtual void skip(const std::string& name, const Shape& full) = 0;
  /// Marks the Linear of `parts` (as load_linear takes them) as another rank's and reads nothing of it
  /// (expert parallelism: the experts this rank does not hold): a checkpoint skips every tensor of it
  /// (`<name>.*`: weight, scales, weight_shape); the random source advances its draws as load_linear
  /// would, so the weights after it (and a held expert on another rank) are those of an unsplit model.
  virtual void skip_linear(const std::vector<LinearTensor>& parts);
  /// Called once every layer is built: a checkpoint throws aerie::Error naming the first language-model
  /// tensor nobody read (another architecture, or a config field missing), as `what` describes it.
  virtual void finish(const std::string& what) = 0;
  /// The shape of this rank's slice of a `full` tensor under `split`. Throws aerie::Error when tp_size
  /// does not divide the split dimension.
  Shape slice_shape(const Shape& full, TpSplit split) const;
  DType dtype_of(ParamRole role) const {
    const bool f32 = role == ParamRole::Norm || role == ParamRole::Router || role == ParamRole::RouterBias;
    return f32 ? DType::F32 : dtype_;
  }
  /// Marks every tensor whose name starts with `prefix` as accounted for without reading it (the MTP
  /// layers after the decoder's); returns how many there were (0 for random weights). `why` says what
  /// they are ("MTP layer: num_nextn_predict_layers"), for the memory plan's list of skipped tensors.
  virtual int64_t skip_prefix(const std::string& prefix, const std::string& why) = 0;

 protected:
  /// load_linear without the FP8 switch: what each source overrides.
  virtual Linear load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split);

  int tp_rank_, tp_size_;
  bool expert_parallel_ = false;
  bool fp8_gemm_ = false;
  Fp8GemmCounts fp8_counts_;
  Device device_;
  DType dtype_;
  Context context_;
};

/// The tensors of a Hugging Face directory (HfCheckpoint), each read alone as this rank's slice,
/// converted on the host to its role's dtype and copied to the device; the host copy is dropped before
/// the next tensor is read.
/// `quant` is the config.json's quantization_config (TargetConfig::quant): quantized tensors of
/// another format than it announces (or any, without one) are errors naming the tensor.
std::unique_ptr<WeightSource> checkpoint_weights(const std::string& dir, int tp_rank, int tp_size, Device device,
                                                 DType dtype, const QuantConfig& quant = {});

/// Random weights for benchmarks: Linear/Embedding ~ N(0, std^2) tiled from a pool of ~4M values
/// drawn on the host (splitmix64 + Box-Muller of `seed`; each tensor starts at its own seed-dependent
/// offset, in the order the tensors are asked for), Norm 1, Bias 0, made on the device. Every tp rank
/// draws each full tensor and keeps its slice, so the ranks of any tp size hold the one model tp 1
/// makes from `seed` (tp runs compare). With a `quant` method the Linears the real checkpoints ship
/// quantized come in that format (RandomSource::load_linear: Kimi-K2.5's INT4 routed experts, DeepSeek-V3's
/// FP8 Linears; drawn per rank, so only one tp size's model), for speed benchmarks of the shipped formats.
std::unique_ptr<WeightSource> random_weights(uint64_t seed, int tp_rank, int tp_size, Device device, DType dtype,
                                             float std = 0.02f, const QuantConfig& quant = {});

}  // namespace aerie
