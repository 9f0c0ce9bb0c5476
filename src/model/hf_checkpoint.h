// A Hugging Face checkpoint directory read tensor by tensor: the target's weights stream from the
// safetensors shards one tensor (and one tensor-parallel slice of it) at a time, never the whole model.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace aerie {

/// How a weight is split over the ranks of a tp group (Megatron-LM, Shoeybi et al. 2019, section 3).
///  - None: replicated (norms, embedding, lm_head, a row-parallel linear's bias);
///  - Rows: rank r holds rows [r R/tp, (r+1) R/tp) of dim 0 (a column-parallel linear: q/k/v, gate/up,
///    and their biases);
///  - Cols: rank r holds columns [r C/tp, (r+1) C/tp) of dim 1 of a 2-D weight (a row-parallel linear:
///    o_proj, down_proj).
enum class TpSplit { None, Rows, Cols };

/// The tensors of a Hugging Face checkpoint directory: <dir>/model.safetensors, or the shards named by
/// <dir>/model.safetensors.index.json's weight_map. Only headers are read at construction; tensor data
/// is read on demand. The decoder's names are found under "model." (CausalLM), or under a multimodal
/// wrapper's "model.language_model." (transformers 5) or "language_model.model." (transformers 4).
class HfCheckpoint {
 public:
  /// Throws aerie::Error naming the file on a missing checkpoint, a bad index (no weight_map, a shard
  /// that does not exist, a tensor the index puts in a shard that lacks it, a tensor in two shards) or
  /// when no embed_tokens.weight is found under any known prefix.
  explicit HfCheckpoint(const std::string& dir);
  /// A checkpoint of names, dtypes and shapes only (a tensor list; the memory plan's, model/plan_source.h):
  /// every check of the constructor and the accessors is the same, `label` stands for the file in
  /// messages, and the reads (get, read_slice, read_raw) return Tensor::shape_only tensors of the shape
  /// and dtype a read would give, after the same checks, marking the tensor read.
  HfCheckpoint(const std::string& label, std::map<std::string, SafetensorsEntry> entries);
  const std::string& dir() const { return dir_; }
  /// "model.", "model.language_model." or "language_model.model.": the prefix of embed_tokens.weight,
  /// layers.{i}.* and norm.weight.
  const std::string& decoder_prefix() const { return prefix_; }
  /// "lm_head.weight" or "language_model.lm_head.weight"; empty when the checkpoint has none.
  const std::string& lm_head_name() const { return lm_head_; }
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  /// The file holding `name`, or, for a name the checkpoint lacks, the file(s) that were searched.
  std::string file_of(const std::string& name) const;
  /// Tensor `name` converted to F32 (from F32, BF16 or F16) after checking its full shape against
  /// `shape`; rows [begin, end) of dim 0 only when end >= 0 (a tensor-parallel shard, read alone).
  /// Throws aerie::Error naming the tensor and its file when it is missing or misshapen.
  Tensor get(const std::string& name, const Shape& shape, int64_t begin = 0, int64_t end = -1);
  /// This tp rank's slice of tensor `name` (full shape checked against `shape`; `split` as TpSplit says,
  /// of `tp_size` equal parts, part `tp_rank`), read alone from its shard and converted on the host to
  /// `dtype` (F32, BF16 or F16 from any of them; round to nearest even, exact when the dtype is the
  /// stored one). A CPU tensor: the caller copies it to its device and drops it, so the host holds one
  /// slice at a time. Throws aerie::Error naming the tensor and file when it is missing, misshapen,
  /// stored in another dtype, or when tp_size does not divide the split dimension.
  Tensor read_slice(const std::string& name, const Shape& shape, TpSplit split, int tp_rank, int tp_size,
                    DType dtype);
  /// Marks `name` as accounted for without reading its data (a tied checkpoint's redundant lm_head),
  /// after checking its shape. Throws as get().
  void skip(const std::string& name, const Shape& shape);
  /// Marks every tensor whose name starts with `prefix` as accounted for, unread; returns the count.
  int64_t skip_prefix(const std::string& prefix);
  /// The tensors outside the language model (a multimodal wrapper's vision_tower.*, mm_projector.*),
  /// counted by the first component of their names: {"vision_tower", 12}, ... (never read).
  std::map<std::string, int64_t> other_tensors() const;
  /// Tensors of the language model (under the decoder prefix, and the lm_head) that were neither read
  /// nor skipped; other tensors of a multimodal wrapper (vision tower, projector) are not listed.
  std::vector<std::string> unread_language_model_tensors() const;
  /// Throws aerie::Error naming the first of unread_language_model_tensors(), as not part of `what`
  /// (another architecture, or a config field missing): computing without it would be silently wrong.
  void check_all_read(const std::string& what) const;
  Shape shape_of(const std::string& name) const;
  /// The stored dtype of `name` (any: F8E4M3 and I32 for the quantized formats). Throws aerie::Error
  /// naming the file(s) when the checkpoint lacks it.
  DType dtype_of(const std::string& name) const;
  /// Tensor `name` as stored (any dtype, no conversion), whole when `dim` < 0, else rows (dim 0) or
  /// columns (dim 1, a 2-D tensor) [begin, end); a CPU tensor; marks it read. For the quantized weights
  /// and their scales, whose slices the caller computes. Throws aerie::Error naming the tensor and its
  /// file when it is missing or the range is out of bounds.
  Tensor read_raw(const std::string& name, int dim = -1, int64_t begin = 0, int64_t end = 0);

 private:
  /// Finds the decoder prefix and the lm_head among the tensors (the constructors' last step).
  void find_decoder();
  /// The reader holding `name` after checking its full shape against `shape` (throws as get()).
  const SafetensorsReader& checked(const std::string& name, const Shape& shape) const;
  std::string dir_, prefix_, lm_head_, index_path_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> where_;
  std::set<std::string> read_;
};

}  // namespace aerie
