// The memory plan's weight source: the target's layers built by the loader's own code (the architecture
// table, the blocks, stored_format and load_quantized_linear) over a tensor list of names, dtypes and
// shapes, so that a plan cannot drift from what the loader asks for. Nothing is read or allocated: every
// tensor it returns is Tensor::shape_only. Each tensor asked for is recorded with its category, its layer,
// and its bytes on tp rank 0 as the checkpoint stores it. Internal to model/ (model/memory_plan.cc).
#pragma once
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/hf_checkpoint.h"
#include "model/memory_plan.h"
#include "model/weight_source.h"

namespace aerie {

/// One checkpoint tensor the build asked for (or skipped as another rank's expert).
struct PlannedTensor {
  std::string name;
  WeightCategory category = WeightCategory::Other;
  int64_t layer = -1;           // the decoder layer being built (-1: none)
  Shape shape;                  // as stored
  int64_t element_bytes = 0;    // of the stored dtype
  TpSplit split = TpSplit::None;
  int64_t rank_elements = 0;    // tp rank 0's elements (0: another rank's expert)
  bool undivided = false;       // tp does not divide the split dimension (rank_elements rounded up)
  int linear = -1;              // its Linear in PlanningSource::linears(), -1: a tensor loaded alone
  bool dense_weight = false;    // the weight of a Dense Linear (what --fp8-gemm quantizes at load)
};

/// One Linear the build asked for, as tp rank 0 holds it.
struct PlannedLinear {
  std::string name;  // its module, parts joined: "model.layers.0.mlp.gate_up", "...self_attn.q_k_v"
  WeightCategory category = WeightCategory::Other;
  int64_t layer = -1;
  WeightFormat format = WeightFormat::Dense;  // as stored
  int64_t out = 0, in = 0;  // rank 0's W: what a dequantization writes (out x in compute-dtype elements)
};

/// A WeightSource over `tensors` (a checkpoint's headers or a tensor list) for tp rank 0 of `tp_size`.
/// It checks every request as the checkpoint loader does (model/weight_source.h checkpoint_weights:
/// shapes, dtypes, formats against `quant`, tp splits), with the loader's messages, naming `label` as
/// the file. Two differences, both for planning: a tensor the list lacks is not an error but recorded
/// (missing(); the plan reports it as a blocker), and with `plan_tp` != tp_size (a build at tp 1 for a
/// tp the blocks refuse) rank 0's shares are those of `plan_tp`, each split dimension rounded up.
/// Throws aerie::Error naming the tensor on a dtype the loader does not read, and as the loader does.
class PlanningSource final : public WeightSource {
 public:
  PlanningSource(const std::vector<TensorInfo>& tensors, const std::string& label, int tp_size, int plan_tp,
                 const QuantConfig& quant);

  std::string decoder_prefix() const override { return ck_.decoder_prefix(); }
  bool has(const std::string& name) const override { return ck_.contains(name); }
  Tensor load(const std::string& name, const Shape& full, TpSplit split, ParamRole role) override;
  void load_into(const std::string& name, const Shape& full, TpSplit split, ParamRole role, Tensor dst) override;
  void skip(const std::string& name, const Shape& full) override;
  int64_t skip_prefix(const std::string& prefix, const std::string& why) override;
  void skip_linear(const std::vector<LinearTensor>& parts) override;
  /// Throws aerie::Error, as the loader, naming the first language-model tensor nobody asked for.
  void finish(const std::string& what) override;

  /// The tensors asked for, in the order asked.
  const std::vector<PlannedTensor>& tensors() const { return tensors_; }
  const std::vector<PlannedLinear>& linears() const { return linears_; }
  /// Why the build skipped `name` ("MTP layer: ...", "tie_word_embeddings: ..."), with the prefix it
  /// skipped it under (the name itself for one tensor); {"", ""} when it did not.
  std::pair<std::string, std::string> skipped_as(const std::string& name) const;
  /// Whether `name` is one of tensors().
  bool asked(const std::string& name) const { return asked_.count(name) > 0; }
  /// The loader's message for each tensor the list lacks, with the layer asking (-1: none).
  const std::vector<std::pair<int64_t, std::string>>& missing() const { return missing_; }
  /// The decoder layers of which at least one tensor asked for was found.
  const std::set<int64_t>& layers_found() const { return layers_found_; }

 protected:
  Linear load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split) override;

 private:
  WeightCategory category_of(ParamRole role) const;
  /// rank 0's elements of `name` (stored shape) split as `split`: `slice` (the loader's) at the build's
  /// tp, else each split dimension of plan_tp_ rounded up (`undivided` says whether it was).
  int64_t rank_elements(const Shape& stored, TpSplit split, const Shape& slice, bool& undivided) const;
  void record(const std::string& name, TpSplit split, const Shape& slice, WeightCategory category, int linear,
              bool dense_weight);
  void note_missing(const std::string& message);
  /// A Linear whose weight the list lacks: recorded as missing, returned as a Dense Linear of its shape.
  Linear missing_linear(const std::vector<LinearTensor>& parts, TpSplit split);

  HfCheckpoint ck_;
  QuantConfig quant_;
  int plan_tp_;
  int build_tp_;  // the tp the layers are built at (tp_size() but inside a WeightSource::SplitAs)
  std::vector<PlannedTensor> tensors_;
  std::vector<PlannedLinear> linears_;
  std::unordered_set<std::string> asked_;
  std::vector<std::pair<std::string, std::string>> skipped_;  // prefix (or name) -> why
  std::vector<std::pair<int64_t, std::string>> missing_;
  std::set<int64_t> layers_found_;
};

}  // namespace aerie
