// Hidden-state shards: the output of `aerie extract` and the input of `aerie train`.
// One HDF5 file per chunk of prepared samples, format "aerie.hidden_states" version 1 (docs/formats.md):
//   aux_hidden_states   [T_total, 3H] uint16 (bf16 bits; dataset attribute dtype="bfloat16"): f_t
//   final_hidden_states [T_total, H]  uint16 (bf16 bits): z_t = final_norm(r^N_t)
// or version 2 (extract --storage fp8): the same two datasets as uint8 e4m3fn codes (attribute
// dtype="float8_e4m3fn") and aux_hidden_scales [T_total, 3] / final_hidden_scales [T_total, 1] F32, one
// scale per H-wide vector: value = code's value x scale;
//   input_ids [T_total] I32, loss_mask [T_total] U8, sample_offsets [n+1] I64, sample_index [n] I64
// plus file attributes (format, format_version, target_model, aux_layers, hidden_size, ...) and the
// provenance (target_config_sha256, target_weights_sha256, prepared_sha256,
// prepared_num_samples, samples_per_shard, num_chunks; readers accept shards without them) and, only in a
// shard that left samples out (extract --skip-nonfinite), skipped_nonfinite: the prepared sample indices of
// the chunk that are not in it (their hidden states held a NaN or an infinity).
// Notation and the meaning of f_t and z_t: /work/shared/docs/eagle3.md section 1.
// Files are written to "<path>.tmp" and renamed on close, so a shard-*.h5 file is always complete, and
// written without timestamps and without compression, so equal inputs give bitwise-equal files.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/fingerprint.h"

namespace aerie {

/// Format name and version stored in (and checked on reading) every shard file.
inline constexpr const char* kShardFormat = "aerie.hidden_states";
inline constexpr int64_t kShardFormatVersion = 1;
/// The version of shards whose hidden states are stored as fp8 (extract --storage fp8): each H-wide
/// vector of a token (the three aux ones and the final one) as float8 e4m3fn codes times one fp32 scale,
/// amax / 448 of the vector (docs/formats.md). Readers take both versions.
inline constexpr int64_t kShardFormatVersionFp8 = 2;
/// The value of the aux_layer_convention attribute.
inline constexpr const char* kAuxLayerConvention =
    "input of decoder layer k (vLLM); SpecForge's output-of-layer ids are these minus 1";

/// What a shard holds, from its file attributes.
struct ShardInfo {
  std::string path;
  int64_t num_samples = 0, num_tokens = 0, hidden_size = 0;
  std::vector<int> aux_layers;   // aerie's (vLLM's) "input of decoder layer k" convention
  std::string target_model;      // the --model path extract was given
  int64_t num_hidden_layers = 0; // N of the target
  int64_t chunk = -1;            // chunk index c: samples [c*S, (c+1)*S) of the prepared file
  // Provenance (io/fingerprint.h, data/extract.h); empty / -1 in shards of an older aerie, which lack them.
  TargetFingerprint target;      // target_config_sha256, target_weights_sha256
  std::string prepared_sha256;   // PreparedFile::fingerprint() of the prepared file
  int64_t prepared_num_samples = -1, samples_per_shard = -1, num_chunks = -1;  // the extract run's chunking
  /// Prepared samples of the chunk left out for non-finite hidden states (extract --skip-nonfinite; the
  /// skipped_nonfinite attribute, absent when none was): the shard holds the chunk's other samples.
  std::vector<int64_t> skipped_nonfinite;
  bool fp8 = false;              // version 2: fp8 hidden states with per-vector scales (else bf16)
  std::string target_gemm;       // ShardMeta::target_gemm ("" when the attribute is absent)
  std::string target_dtype;      // ShardMeta::target_dtype ("" in shards of an earlier aerie)
  bool has_provenance() const { return !target.config_sha256.empty(); }
};

/// One sample of a shard, hidden states converted from bf16 to fp32.
struct HiddenSample {
  int64_t sample_index = -1;      // index of the sample in prepared.h5
  std::vector<int32_t> ids;       // [T] x_t
  std::vector<uint8_t> loss_mask; // [T] m_t (0/1)
  Tensor aux_hidden;              // [T, 3H] F32 (from bf16), or BF16 as stored: f_t = concat(r^{a1}, r^{a2}, r^{a3})
  Tensor final_hidden;            // [T, H] F32 (from bf16), or BF16 as stored: z_t = final_norm(r^N_t)
};

/// Reads one shard file. Opening reads the attributes and the small index datasets (ids, masks,
/// offsets); read(i) reads sample i's hidden-state rows. The file stays open (read-only) for the
/// reader's lifetime; a reader is not thread-safe.
class ShardReader {
 public:
  /// Opens `path` and checks format == "aerie.hidden_states", format_version == 1 and the dataset
  /// shapes. Throws aerie::Error naming the file on a missing file, another format or version, a
  /// missing dataset/attribute or inconsistent shapes.
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(ShardReader&&) noexcept;
  ShardReader& operator=(ShardReader&&) noexcept;

  const ShardInfo& info() const { return info_; }
  int64_t num_samples() const { return info_.num_samples; }
  /// Number of tokens of sample i (no hidden-state I/O).
  int64_t sample_length(int64_t i) const;
  /// input_ids [T_total] I32 and loss_mask [T_total] U8 of every sample in order (read at opening).
  const std::vector<int32_t>& input_ids() const;
  const std::vector<uint8_t>& loss_mask() const;
  /// sample_index [n]: the prepared sample each of the shard's samples comes from (read at opening).
  const std::vector<int64_t>& sample_indices() const;
  /// Sample i (0 <= i < num_samples), its hidden states F32, or with `hidden` BF16 as a bf16 shard stores them
  /// (the same values in half the memory and the bytes a device copy moves; an fp8 shard's are dequantized to
  /// F32 either way). Throws aerie::Error naming the file and the sample on a bad index or a read failure.
  HiddenSample read(int64_t i, DType hidden = DType::F32) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ShardInfo info_;
};

/// Complete shard files of `dir` (full paths), in chunk order (shard-100000.h5 after shard-99999.h5): the
/// files named shard_file_name(c) for a chunk c, as extract writes them; other names ("shard-00003 (copy).h5",
/// "shard-00003-old.h5") and "*.tmp" files are not listed. Throws aerie::Error if `dir` is not a directory.
std::vector<std::string> list_shards(const std::string& dir);

/// A file of a shard folder that is not read as a shard, and why (for a warning).
struct SkippedShardFile {
  std::string path;
  std::string why;
};

/// The shards of a shard folder by what they record (a copy of shard-00003.h5 was trained twice):
/// `shards` are the files of list_shards whose recorded chunk (the "chunk" attribute) is their name's, one per
/// chunk, in chunk order; `skipped` every other "*.h5" file of the folder: a name that is not a shard's (a
/// copy), or a shard file whose recorded chunk differs from its name's (a copy renamed "shard-99999.h5").
/// A file whose attributes cannot be read stays in `shards`: ShardReader then names what is wrong with it.
/// Throws aerie::Error if `dir` is not a directory.
struct ShardFolder {
  std::vector<std::string> shards;
  std::vector<SkippedShardFile> skipped;
};
ShardFolder read_shard_folder(const std::string& dir);

/// The shard file name of chunk c: "shard-%05d.h5".
std::string shard_file_name(int64_t chunk);

/// Metadata a ShardWriter stores as file attributes.
struct ShardMeta {
  std::string target_model;
  std::vector<int> aux_layers;
  int64_t hidden_size = 0, num_hidden_layers = 0;
  int64_t chunk = -1;
  // Provenance, written as attributes when set (target.config_sha256 non-empty, num_chunks > 0).
  TargetFingerprint target;
  std::string prepared_sha256;
  int64_t prepared_num_samples = -1, samples_per_shard = -1, num_chunks = -1;
  /// extract --storage fp8: the hidden states as e4m3fn codes with one fp32 scale per H-wide vector
  /// (format version 2, about half the bytes of bf16); false: bf16 (version 1).
  bool fp8 = false;
  /// How the target's linears ran (attribute target_gemm): fp8_gemm_tag(tp) with extract --fp8-gemm
  /// (TargetModelOptions::fp8_gemm), empty (no attribute) for the compute dtype's GEMMs.
  std::string target_gemm;
  /// The dtype the target computed in ("bf16" or "f32", extract --dtype resolved; attribute target_dtype):
  /// a resume with the other one is refused (hidden states computed two ways in one folder). Empty: none
  /// recorded.
  std::string target_dtype;
};

/// ShardMeta::target_gemm of a W8A8 target (--fp8-gemm) at tensor-parallel size tp: "w8a8-fp8-block, tp N".
/// The tp size is part of it: a BF16 target's weights are quantized per rank slice, so the hidden states
/// of two tp sizes differ unless every slice is a whole number of 128-blocks.
std::string fp8_gemm_tag(int tp);

/// What a ShardWriter does with a sample whose hidden states hold a NaN or an infinity.
enum class NonFinite : uint8_t {
  Error,  // add() throws, naming the shard, the prepared sample, the token and its id
  Skip,   // add() leaves the sample out, with a warning naming it (extract --skip-nonfinite)
};

/// Writes one shard. The constructor creates "<path>.tmp" (a stale one is overwritten) with every
/// dataset sized from `sample_lengths` (the token count of each sample, in order); add() writes one
/// sample's rows (as bf16) straight to the file, so memory stays at one sample; close() writes the index
/// datasets, closes the file and renames it to `path`. Serial HDF5, one writer per shard.
/// Deterministic bytes: no object timestamps, contiguous layout, no compression, no fill values.
/// With NonFinite::Skip a sample left out leaves the datasets longer than the rows written: close() then
/// copies the rows into "<path>.kept.tmp", created as for the kept samples alone, and renames that (the
/// shard holds what a writer told only the kept samples writes, plus the skipped_nonfinite attribute; a
/// chunk whose every sample is skipped gives a shard of 0 samples, so the chunk counts as done).
/// A writer destroyed without close() removes its .tmp files.
class ShardWriter {
 public:
  ShardWriter(std::string path, ShardMeta meta, std::vector<int64_t> sample_lengths,
              NonFinite on_nonfinite = NonFinite::Error);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends the next sample (the k-th call writes sample k of sample_lengths). ids/loss_mask [T];
  /// aux_hidden [T, 3H] and final_hidden [T, H], F32 (rounded to bf16, nearest even) or BF16, on the host.
  /// Returns true when the sample was written, false when it was skipped (NonFinite::Skip and a NaN /
  /// infinity in its hidden states; logged as a warning naming the shard, the prepared sample, the token
  /// and its id). Throws aerie::Error on mismatched lengths, shapes or dtypes, too many samples, or
  /// (NonFinite::Error) a NaN / infinity in the hidden states (naming the shard, the prepared sample, the
  /// token and its id, and --skip-nonfinite).
  bool add(int64_t sample_index, const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
           const Tensor& aux_hidden, const Tensor& final_hidden);
  /// Writes the index datasets, closes the file and renames it to `path`. Throws aerie::Error if fewer
  /// samples than announced were added, or on I/O failure.
  void close();
  /// add() calls so far (written and skipped).
  int64_t num_samples_added() const { return added_; }
  /// The prepared sample indices skipped so far, and their tokens.
  const std::vector<int64_t>& skipped() const { return skipped_; }
  int64_t skipped_tokens() const { return skipped_tokens_; }

 private:
  struct Impl;
  void compact();  // close() with skipped samples: the written rows into a file of their size
  std::unique_ptr<Impl> impl_;
  std::string path_, tmp_;  // tmp_: the file being written ("<path>.tmp", then "<path>.kept.tmp")
  ShardMeta meta_;
  NonFinite on_nonfinite_;
  std::vector<int64_t> lengths_;           // announced, per add() call
  std::vector<int64_t> offsets_{0};        // of the written samples
  std::vector<int64_t> sample_index_, skipped_;
  int64_t added_ = 0, skipped_tokens_ = 0;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> mask_;
};

}  // namespace aerie
