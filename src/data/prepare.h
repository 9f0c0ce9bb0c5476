// `aerie prepare`: conversations -> one HDF5 file of tokens and loss masks.
//
// Output format "aerie.prepared" version 1 (read by extract and vocab):
//   input_ids      I32 [N_tok]          the tokens of all samples, concatenated in input order
//   loss_mask      U8  [N_tok]          1 on assistant content tokens and the EOS closing an assistant turn
//   sample_offsets I64 [N_samples + 1]  sample i = tokens [off[i], off[i+1]); off[0] = 0, off[N] = N_tok
//   attributes: format = "aerie.prepared", format_version = 1, tokenizer (path), tokenizer_probe
//   (tokenizer_probe() below), template, max_length,
//   overlong ("truncate" | "drop"), num_samples, num_tokens, num_loss_tokens, source (input path),
//   input_format, bos_id, eos_id, vocab_size, num_skipped, num_truncated.
// Every sample has 1..max_length tokens and at least one loss token.
//
// Parallel: every rank reads and tokenizes a contiguous byte range of the input (boundaries at record
// starts), counts are exchanged (MPI_Exscan), and all ranks write their parts of "<output>.tmp" collectively
// through MPI-IO; rank 0 renames it to <output> after the file is closed.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/prepare_input.h"
#include "data/prepare_template.h"
#include "tokenizer/tokenizer.h"

namespace aerie {

inline constexpr const char* kPreparedFormat = "aerie.prepared";
inline constexpr int64_t kPreparedVersion = 1;

enum class Overlong : uint8_t { Truncate, Drop };
/// "truncate" or "drop"; throws aerie::Error otherwise.
Overlong overlong_from_name(const std::string& name);
const char* overlong_name(Overlong o);

struct PrepareOptions {
  std::string input;                     // .jsonl or .txt
  InputFormat format = InputFormat::Auto;  // Auto: Text for ".txt", per-line detection otherwise
  std::string tokenizer;                 // directory with tokenizer.json or tiktoken.model, or the file
  std::string chat_template = "plain";
  std::string output;                    // prepared.h5
  int64_t max_length = 2048;             // tokens per sample
  Overlong overlong = Overlong::Truncate;
  int64_t max_samples = -1;              // keep the first N usable samples (< 0: all)
  int max_reported = 10;                 // skipped records reported with file:line in the log
  bool space_check = true;               // refuse an output whose file system lacks the space for it
};

/// What a prepare run did (totals over all ranks; identical on every rank).
struct PrepareStats {
  int64_t records = 0;          // input records seen (JSONL lines / stories)
  int64_t samples = 0;          // written
  int64_t tokens = 0;           // written
  int64_t loss_tokens = 0;      // written, loss_mask = 1
  int64_t truncated = 0;        // written after truncation to max_length
  int64_t skipped = 0;          // sum of skipped_by
  std::array<int64_t, static_cast<size_t>(SkipReason::Count_)> skipped_by{};  // per SkipReason
  std::vector<std::string> examples;  // "file:line: reason (detail)", the first max_reported skips, rank 0
};

/// Applies the overlong policy to `s` (max_length > 0): Truncate keeps the first max_length tokens (returns
/// true, *truncated set), Drop returns false for a longer sample. Shorter samples are unchanged.
bool apply_overlong(TokenizedSample& s, int64_t max_length, Overlong policy, bool* truncated);

/// The `tokenizer_probe` attribute of a prepared file: the first 16 hex digits of the SHA-256 of the ids
/// `tok` gives a fixed probe text (English, code, digits, accents, CJK, emoji; encode(), no special tokens).
/// Two tokenizers that give it the same ids agree on ordinary text; a different probe means the prepared ids
/// would be other tokens to the other tokenizer's model (extract warns). Throws what tok.encode() throws.
std::string tokenizer_probe(const Tokenizer& tok);

/// The `settings` attribute of a prepared file: what decides its content, as JSON {"input", "input_bytes",
/// "input_sha256" (every byte of the input), "template_sha256" (the template's .ini, "" for plain),
/// "format", "tokenizer", "template", "max_length", "overlong", "max_samples"} (paths made canonical;
/// "format" and "template" as requested, "template" a canonical path when it names a file). Reads the whole
/// input. Throws aerie::Error when the input cannot be read.
std::string prepare_settings(const PrepareOptions& options);

/// What a rerun of prepare finds at options.output, an existing prepared file (prepared_file_state).
struct PreparedFileState {
  enum Kind {
    UpToDate,  // its settings equal the run's and it is newer than every input file: nothing to do
    Outdated,  // other settings or a newer input file; `why` names the first difference
    Legacy,    // written by an aerie without the settings attribute, and what it records agrees with the run
  } kind = Outdated;
  std::string why;
};

/// Compares the existing prepared file options.output with what run_prepare(options) would write now, for a
/// rerun (a Slurm requeue, a script run twice) to skip an up-to-date file and to refuse replacing another
/// run's. UpToDate: its `settings` attribute equals prepare_settings(options) (the input's and the
/// template's contents included, so a copy of the same input with a new time is the same) and the tokenizer
/// gives the recorded tokenizer_probe ids. Outdated, with `why` naming the first difference as the option
/// that sets it: "--max-length 4096 (the file: 2048)", "--input's contents (sha256) ...". A file whose
/// settings hold no contents hashes, or of an older aerie (no settings: compared by what it records,
/// source, tokenizer, template, max_length, overlong; Legacy when they agree), is checked against the times
/// of the input, tokenizer and template files instead (make's rule). Throws aerie::Error when the file is
/// not a readable prepared file.
PreparedFileState prepared_file_state(const PrepareOptions& options);

/// Runs prepare collectively over `comm` (every rank calls it with the same options): reads, tokenizes,
/// writes options.output (see the format above) and logs counts on rank 0. Rank 0 holds the output's lock
/// (OUTPUT.lock, io/output_lock.h) while the ranks write, unless this process holds it already (the job).
/// Throws aerie::Error on an unreadable input, unknown template/format, an unloadable tokenizer or an I/O
/// failure, aerie::CollectiveError (on every rank) when another job holds the output's lock; bad records
/// are skipped, never thrown.
PrepareStats run_prepare(const PrepareOptions& options, MPI_Comm comm);

}  // namespace aerie
