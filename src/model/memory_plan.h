// The GPU memory plan of a target before any weight is read: from config.json and the tensor list of the
// safetensors headers (name, dtype, shape), the bytes each tensor-parallel rank holds for the weights (by
// category, quantized tensors as stored), a per-layer bf16 dequantization scratch, the activations of one
// forward, and whether that fits a GPU. The sharding rules and the arithmetic: docs/memory-plan.md
// (shared/docs/deepseek-v3.md, sections 3 and 7).
//
// Only the header fields are read (8-byte length + JSON of each shard; the file's size is checked against
// them as the loader does): a checkpoint of 600 GB plans in a second. All sizes are bytes.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weight_source.h"  // WeightCategory

namespace aerie {

/// One tensor as a safetensors header lists it. dtype is the header's string ("BF16", "F8_E4M3", "I32";
/// lower case accepted).
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

/// The job a plan is for. Extract: one forward of tokens_per_forward rows and the aux captures. Generate
/// (`aerie generate`, continuous batching, model/sampling.h BatchDecoder): `sequences` KV caches of
/// max_length positions each (a turn's prompt + response), a step of up to max(kGenerateStepRows,
/// max_length) rows (the decoder admits no further prompt past kGenerateStepRows rows), no captures, F32
/// logits of one row per sequence over the whole vocabulary. A max_length past the config's
/// max_position_embeddings is a blocker for Generate (generate refuses it).
enum class PlanJob { Extract, Generate };
/// BatchDecoder's max_step_rows as `aerie generate` builds it (model/sampling.h).
constexpr int64_t kGenerateStepRows = 8192;
/// The largest lengths (max_length, batch_tokens) and batches (batch_size, sequences) plan_memory takes: far
/// beyond any model, small enough that no product of the plan wraps around int64.
constexpr int64_t kMaxPlanLength = int64_t{1} << 24, kMaxPlanBatch = int64_t{1} << 20;

struct PlanOptions {
  PlanJob job = PlanJob::Extract;
  int64_t sequences = 16;         // Generate: sequences decoded at once (generate --batch-size)
  int tp = 1;                     // tensor-parallel ranks per target replica
  int64_t max_length = 8192;      // tokens of the longest sample
  int64_t batch_tokens = 2048;    // extract --batch-tokens: samples share a forward up to this many tokens
  int64_t batch_size = 0;         // > 0: batch_size samples of max_length per forward (overrides batch_tokens)
  int aux_layers = 3;             // captured aux hidden states (EAGLE-3: 3), plus the final one
  int64_t activation_bytes = 2;   // compute dtype of activations and the scratch: bf16
  bool vocab_parallel_embeddings = true;  // embed_tokens / lm_head split by vocab rows (vLLM, SGLang)
  bool expert_parallel = false;   // routed experts split by expert (TargetModelOptions::expert_parallel)
  /// W8A8 (TargetModelOptions::fp8_gemm): BF16/F16/F32 Linear weights held as block FP8 (1 byte an
  /// element + an F32 scale per 128 x 128 block), and the FP8 Linears outside the routed experts need no
  /// dequantization scratch (their GEMM reads them as stored).
  bool fp8_gemm = false;
  int64_t gpu_memory = int64_t{80} << 30;  // bytes per GPU
  int64_t reserve = int64_t{2} << 30;      // CUDA context, NCCL buffers, cuBLAS workspaces
};

struct CategoryBytes {
  int64_t tensors = 0;
  int64_t checkpoint = 0;  // all ranks' copy: the bytes stored in the checkpoint
  int64_t per_rank = 0;    // rank 0's share (ranks differ only by rounding)
};

/// Tensors the plan does not load (vision tower, projector, an MTP layer, rotary tables), by group.
struct SkippedGroup {
  std::string what;  // "vision_tower.*", "model.layers.61.* (MTP layer, num_nextn_predict_layers)"
  int64_t tensors = 0;
  int64_t bytes = 0;
};

struct ActivationItem {
  std::string what;    // "residual stream (fp32) + normed input"
  std::string detail;  // the arithmetic, "8192 x 7168 x (4 + 2)"
  int64_t bytes = 0;
};

struct MemoryPlan {
  std::string model;        // "deepseek_v3", "kimi_k25 (text_config: deepseek_v3)"
  std::string architecture; // "MLA + MoE (61 layers, 384 routed experts top-8, 1 shared)"
  std::string quantization; // "int4 pack-quantized (routed experts)", "fp8 e4m3", "none"
  int tp = 1;
  bool expert_parallel = false;  // the routed experts planned split by expert (asked for, tp > 1, an MoE target)
  std::array<CategoryBytes, kWeightCategories> weights{};
  int64_t weight_tensors = 0, weights_checkpoint = 0, weights_per_rank = 0;
  int64_t replicated_embedding_delta = 0;  // per-rank bytes the other embed/lm_head rule would add (or save: < 0)
  std::vector<SkippedGroup> skipped;
  // bf16 dequantization buffer: the largest quantized Linear's share outside the routed experts, or a
  // layer's routed experts (at most kMoeScratchBytes) when the fused grouped GEMM cannot read them as
  // stored; 0 if none
  int64_t scratch_per_rank = 0;
  std::string scratch_layer;  // what sets it ("" without a scratch)
  int64_t tokens_per_forward = 0;
  std::vector<ActivationItem> activations;
  int64_t activations_per_rank = 0;
  // Generate: the KV caches of PlanOptions::sequences sequences of max_length positions in the activation
  // dtype (GQA: layers x 2 x this rank's kv heads x head_dim; MLA: layers x (kv_lora_rank + qk_rope_head_dim),
  // the latent, whole on every rank); 0 for extract
  int64_t kv_cache_per_rank = 0;
  std::string kv_cache_detail;  // the arithmetic
  int64_t reserve = 0, gpu_memory = 0;
  int64_t total_per_rank = 0;  // weights + scratch + activations + KV caches + reserve
  int64_t margin = 0;          // gpu_memory - total_per_rank (negative: does not fit)
  bool fits = false;            // margin >= 0 and nothing in `blockers`
  /// Why aerie cannot run this layout at all, whatever the memory (tp not dividing the attention heads or
  /// the dense MLP's intermediate size, which aerie splits whole: gqa_attention.cc, mla_attention.cc,
  /// dense_ffn.cc refuse it at load). Empty: it runs.
  std::vector<std::string> blockers;
  bool beyond_context = false;  // Generate: max_length past max_position_embeddings (one of the blockers)
  std::vector<std::string> notes;  // tp not dividing a dimension, unknown tensors: the plan is approximate
};

/// The plan of a model from its config.json object (read by target_config_from_json, as the loader reads
/// it) and its tensor list, for tensor-parallel rank 0 of opt.tp: the layers are built by the loader's
/// own code (build_target_weights over a PlanningSource, model/plan_source.h) from the tensors' names,
/// dtypes and shapes, so every architecture of the table (model/arch.h) is planned as it loads.
/// `source` names the config in messages. What the loader would refuse for this layout alone (a tp that
/// does not divide the heads or an intermediate size, a tensor the list lacks) is a blocker of the plan;
/// what makes the list another model's or a broken checkpoint throws. Throws aerie::Error naming `source`
/// (and the field or tensor) on a config the loader refuses, a model_type aerie does not build, tp < 1, an
/// unknown dtype, a tensor list of another model (decoder layers or routed experts past the config's, an
/// embedding of another shape) or quantization, a tensor the loader refuses (misshapen, another dtype, a
/// language-model tensor no block reads), --expert-parallel with a tp that does not divide the experts,
/// or lengths and batches past kMaxPlanLength / kMaxPlanBatch.
MemoryPlan plan_memory(const nlohmann::json& config, const std::vector<TensorInfo>& tensors,
                       const PlanOptions& opt, const std::string& source = "config.json");

/// config.json of `path` (a file, or a directory holding config.json). Throws aerie::Error naming the
/// file when it is missing or not a JSON object.
nlohmann::json read_model_config(const std::string& path);

/// The tensors of a checkpoint directory from its safetensors headers only: <dir>/model.safetensors, or
/// every shard of <dir>/model.safetensors.index.json's weight_map. The data is not read, but each header is
/// checked as the loader checks it (io/safetensors.h's SafetensorsReader), so a checkpoint the loader would
/// refuse is refused here. Throws aerie::Error naming the file (and the tensor) on a missing checkpoint or
/// shard, a truncated file or header, a header that is not JSON or lacks dtype/shape/data_offsets, a dtype
/// the loader does not read (I8, F64, ...), data_offsets outside the data buffer, or an index entry whose
/// shard lacks the tensor. A tensor list without data: read_tensor_list.
std::vector<TensorInfo> read_checkpoint_tensors(const std::string& dir);

/// A tensor list of one JSON object per line, {"name", "shape", "dtype"} (the shared data's
/// *.tensors.expanded.jsonl.gz), gzip-compressed or plain. Throws aerie::Error naming the file and line.
std::vector<TensorInfo> read_tensor_list(const std::string& path);

/// "96GB", "80GiB", "1.5 TB", "512MiB" or plain bytes: GB = 1e9 bytes, GiB = 2^30 (K/M/G/T, case-insensitive).
/// Throws aerie::Error on anything else.
int64_t parse_memory_size(const std::string& s);

/// Bytes per element of a safetensors dtype string (F64 .. F8_E4M3, BOOL; case-insensitive); 0 if unknown.
int64_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace aerie
