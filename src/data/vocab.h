// The draft vocabulary of EAGLE-3 (eagle3.md section 2): the K most frequent loss-masked target ids,
// stored as d2t (draft id -> offset to the target id) and t2d (target id -> selected?).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace aerie {

/// The mapping between the draft vocabulary [K] and the target vocabulary [V].
struct DraftVocab {
  std::vector<int64_t> d2t;  // [K] offsets: target id = i + d2t[i] (vLLM/SGLang convention)
  std::vector<uint8_t> t2d;  // [V] 1 iff target id j is selected
  /// The selected target ids s_0 < s_1 < ... < s_{K-1} (s_i = i + d2t[i]).
  std::vector<int64_t> selected() const;
  int64_t draft_vocab_size() const { return static_cast<int64_t>(d2t.size()); }  // K
  int64_t vocab_size() const { return static_cast<int64_t>(t2d.size()); }        // V
};

/// Builds the mapping from `counts` [V] (loss-masked occurrences of each target id), exactly as
/// eagle3.md section 2: the K = min(K, V) most frequent ids (ties: smaller id first); if fewer than K
/// ids occur (count > 0), the smallest ids not yet selected fill the rest (SpecForge #76); the selected
/// ids are sorted ascending. Throws aerie::Error if counts is empty, K <= 0 or a count is negative.
DraftVocab build_draft_vocab(const std::vector<int64_t>& counts, int64_t K);

/// A draft vocabulary of K ids spread evenly over V (id i * V / K for i < K), for benchmarks and aerie calibrate,
/// where no counts exist; a real one comes from build_draft_vocab. Throws aerie::Error unless 0 < K <= V.
DraftVocab spread_draft_vocab(int64_t V, int64_t K);

/// Writes a safetensors file (atomically, through the temporary file `tmp`: see save_safetensors): d2t I64
/// [K], t2d BOOL [V], token_counts I64 [V], metadata {"format": "aerie.draft_vocab", "format_version": "1",
/// "draft_vocab_size": K, "vocab_size": V}. Throws aerie::Error on inconsistent sizes or I/O failure.
void save_draft_vocab(const std::string& path, const DraftVocab& vocab, const std::vector<int64_t>& counts,
                      const std::string& tmp = "");

/// Reads a file written by save_draft_vocab. Throws aerie::Error naming the file if the format or version
/// differs, a tensor is missing or has a wrong dtype/shape, or d2t/t2d disagree (the ids i + d2t[i] must be
/// strictly ascending, inside [0, V), and exactly the ids with t2d = 1).
DraftVocab load_draft_vocab(const std::string& path);

/// Loss-masked token counts [V] of a prepared file ("aerie.prepared", see data/prepare.h): counts[x] =
/// number of tokens t with input_ids[t] = x and loss_mask[t] = 1. Throws aerie::Error naming the file if it
/// is not a prepared file or a token id lies outside [0, V).
std::vector<int64_t> count_loss_tokens(const std::string& prepared_path, int64_t V);

}  // namespace aerie
