// Checkpoint choice: the acceptance length of every checkpoint of a training run, and
// the checkpoint to export. Loss keeps falling after acceptance length peaks, so the last checkpoint is
// not always the best draft.
//
// `aerie eval --run RUN_DIR` evaluates the run's complete checkpoints (all, `--every N` or `--steps LIST`)
// with one EvalSession (the target loaded and the prompts decoded greedily once) and writes the checkpoint
// table, RUN_DIR/checkpoint_eval.json by default:
//   {"format": "aerie.checkpoint_eval", "format_version": 1, "aerie_version": "0.1.0+<commit>",
//    "run": RUN_DIR, "selected_by": "acceptance_length",
//    "settings": {the eval settings every row was measured under, checkpoint_eval_settings()},
//    "checkpoints": [{"step", "checkpoint": its folder, "fingerprint": checkpoint_fingerprint(),
//                     the figures of EvalSession::evaluate: "acceptance_length", "tau_sim", "acc_k", ...}, ...],
//    "untrained": {"seed", the same figures} (with --untrained only)}
// rows ascending by step, rewritten atomically after each checkpoint. A rerun evaluates only the
// selected checkpoints the table lacks; one with other settings, or over a checkpoint that changed since
// (the run trained again into the same folder), is refused naming the file, so nothing written is lost.
// `aerie export --best` exports best_checkpoint() of that table.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/eval.h"

namespace aerie {

inline constexpr const char* kCheckpointEvalFormat = "aerie.checkpoint_eval";
inline constexpr int64_t kCheckpointEvalFormatVersion = 1;

/// One evaluated checkpoint: a row of the table.
struct CheckpointEvalRow {
  int64_t step = 0;
  std::string checkpoint;   // the step-%08d folder evaluated
  std::string fingerprint;  // checkpoint_fingerprint(checkpoint) when it was evaluated
  nlohmann::json figures;   // EvalSession::evaluate's object (acceptance_length, tau_sim, acc_k, lossless, ...)

  /// figures["acceptance_length"]: new tokens per verification pass on the held-out prompts. Throws
  /// aerie::Error when the row has none.
  double acceptance_length() const;
};

/// The checkpoint table of one run under one set of eval settings (the file format above).
struct CheckpointEvalTable {
  std::string run_dir;
  nlohmann::json settings;             // checkpoint_eval_settings()
  std::vector<CheckpointEvalRow> rows;  // ascending step, one per step
  nlohmann::json untrained;            // {"seed", figures} of the untrained draft, or null

  /// The row of `step`, or nullptr.
  const CheckpointEvalRow* find(int64_t step) const;
  /// Adds `row`, or replaces the row of its step; keeps the rows ascending by step.
  void put(CheckpointEvalRow row);

  nlohmann::json to_json() const;
  /// Reads the object of the file `path` (named in errors). Throws aerie::Error on another format name or
  /// version, or a missing or mistyped field.
  static CheckpointEvalTable from_json(const nlohmann::json& j, const std::string& path);
};

/// RUN_DIR/checkpoint_eval.json: where `eval --run` writes the table and `export --best` reads it by default.
std::string checkpoint_eval_path(const std::string& run_dir);

/// Reads the table file `path`. Throws aerie::Error naming the file when it does not exist (saying that
/// `aerie eval --run` writes it), is not JSON, or is not a checkpoint table.
CheckpointEvalTable read_checkpoint_eval(const std::string& path);

/// The settings that define a row's figures, as the table records them: the target (model folder and its
/// TargetFingerprint: target_config_sha256, target_weights_sha256), the prompts (path, prompts_sha256 of
/// the file, num_prompts, max_prompt_tokens, chat_template), the decoding (max_new_tokens,
/// num_draft_tokens), the teacher-forced samples (data_split and data_split_sha256, shards,
/// num_eval_samples, ttt_steps) and the target's compute dtype `dtype` ("f32" or "bf16", as resolved by
/// the EvalSession; "" before it is known). Not the device, tp or the number of ranks (they do not change
/// what is measured). Paths are absolute. Throws aerie::Error naming a file that cannot be read.
nlohmann::json checkpoint_eval_settings(const EvalOptions& opts, const std::string& dtype);

/// What differs between the settings `was` (the table's) and `now`, as "key: was -> now" items joined by
/// "; ", or "" when they agree. Keys in `ignore` are not compared.
std::string settings_difference(const nlohmann::json& was, const nlohmann::json& now,
                                const std::vector<std::string>& ignore = {});

/// A cheap identity of the checkpoint folder `dir`: SHA-256 of its step and of draft.safetensors (whole when
/// small, else sampled blocks and its size, as io/fingerprint.h's weights fingerprint). Another training
/// run into the same folder gives another fingerprint. Throws aerie::Error naming the file.
std::string checkpoint_fingerprint(const std::string& dir);

/// The steps `eval --run` evaluates among `available` (the run's complete checkpoints, ascending):
///   - `steps` not empty: exactly those, ascending, without repeats (aerie::Error naming the first step
///     that has no complete checkpoint, and the available steps);
///   - else `every` > 0: the steps that are multiples of `every`, and the newest (the run's final draft,
///     which train writes at its last step whatever --checkpoint-every);
///   - else all of them.
/// Throws aerie::Error when `available` is empty, `every` is negative or a step is not positive.
std::vector<int64_t> select_checkpoint_steps(const std::vector<int64_t>& available, int64_t every,
                                             const std::vector<int64_t>& steps);

/// The row to export: the highest acceptance length; among rows of equal acceptance length the later step.
/// Throws aerie::Error naming `path` when the table has no row.
const CheckpointEvalRow& best_checkpoint(const CheckpointEvalTable& table, const std::string& path);

/// The table as text, one line per row: step | acceptance length | tau_sim | lossless, the best row marked
/// with "*" (and the untrained draft's line when the table has it).
std::string format_checkpoint_table(const CheckpointEvalTable& table);

/// Options of `aerie eval --run` (jobs/eval.cc) beside EvalOptions.
struct CheckpointEvalOptions {
  std::string run_dir;
  std::string table_path;      // "": checkpoint_eval_path(run_dir)
  int64_t every = 0;           // select_checkpoint_steps
  std::vector<int64_t> steps;
};

/// `aerie eval --run`: collective over the world. Selects the checkpoints (select_checkpoint_steps), reads
/// the table file when it exists and checks, before the target is loaded, that it was made with the same
/// settings (apart from the dtype, checked once the session has resolved it) and that every selected
/// checkpoint it holds is still the one evaluated (checkpoint_fingerprint); then evaluates the others in
/// one EvalSession (eval.draft_path, eval.output_path are not read; eval.untrained: also the untrained
/// draft, once per table, with eval.seed), world rank 0 rewriting the table after each checkpoint and
/// logging progress, and printing format_checkpoint_table at the end. Returns the table. Throws
/// aerie::Error naming the file on a settings difference or a changed checkpoint, as run_eval otherwise.
CheckpointEvalTable run_checkpoint_eval(const EvalOptions& eval, const CheckpointEvalOptions& opts);

}  // namespace aerie
