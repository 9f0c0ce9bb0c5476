// Provenance fingerprints: cheap SHA-256 digests that tell whether two runs used the same target model (and,
// in data/extract.h, the same prepared file), so that shards of another model never mix into a shard folder
// and train never trains on shards of another target than its --model.
//
// A target's fingerprint has two parts, compared separately so that a refusal can say what differs:
//   - config: SHA-256 of config.json parsed and dumped canonically (keys sorted, no whitespace), without
//     "_name_or_path" and "transformers_version" (a re-saved copy of one model keeps its fingerprint);
//   - weights: SHA-256 over the safetensors files (model.safetensors, or the shards that
//     model.safetensors.index.json names, by name): per file its name, size, the whole JSON header
//     (tensor names, dtypes, shapes, offsets) and kSampledBlocks blocks of kBlockBytes at evenly spaced
//     offsets of the data (all of it when smaller). Another checkpoint of the same shape (a fine-tune, a
//     random draw) differs in nearly every value, so in the sampled blocks; reading 64 KiB per file keeps a
//     1 TB checkpoint's fingerprint at a fraction of a second. Not a guarantee against a deliberate edit
//     of unsampled bytes.
// The path is not part of the fingerprint: a copy of the model elsewhere matches.
#pragma once
#include <cstdint>
#include <string>

namespace aerie {

/// Incremental SHA-256 (OpenSSL's EVP). Movable only through pointers; one digest per object.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  /// The digest as 64 lowercase hex digits; the object takes no more updates afterwards.
  std::string hex();

 private:
  void* ctx_;
};

/// SHA-256 of `bytes`, 64 lowercase hex digits.
std::string sha256_hex(const std::string& bytes);

/// SHA-256 of the whole file `path` (64 lowercase hex digits), read in 1 MiB pieces: for inputs whose every
/// byte matters (a conversation file a resumed job continues). Throws aerie::Error naming the file when it
/// cannot be read.
std::string sha256_file(const std::string& path);

/// Blocks of a file's data sampled by the weights fingerprint, and their size.
inline constexpr int kSampledBlocks = 16;
inline constexpr int64_t kBlockBytes = 4096;

/// Updates `h` with the bytes [begin, end) of the open file `path` (whole when end - begin <= blocks *
/// block bytes, else `blocks` blocks of `block` bytes at evenly spaced offsets, the first at begin and the
/// last ending at end). Throws aerie::Error naming the file on a read error.
void hash_sampled_range(Sha256& h, const std::string& path, int64_t begin, int64_t end, int blocks = kSampledBlocks,
                        int64_t block = kBlockBytes);

struct TargetFingerprint {
  std::string config_sha256;   // canonical config.json (see above)
  std::string weights_sha256;  // the safetensors files; "random-weights:SEED" for extract --random-weights;
                               // empty: the folder has no weights (only config.json)
  int64_t files = 0, bytes = 0;  // safetensors files and their total size

  /// The fingerprint of the Hugging Face folder `dir` (config.json, model.safetensors or an index and its
  /// shards; a folder without either gets an empty weights_sha256). Throws aerie::Error naming the file
  /// when config.json is missing or not JSON, the index has no weight_map, or a file cannot be read.
  static TargetFingerprint of_model(const std::string& dir);
  /// The model of `extract --random-weights SEED` with the config.json of `dir` (no weights read).
  static TargetFingerprint of_random(const std::string& dir, uint64_t seed);

  bool random() const { return weights_sha256.rfind("random-weights:", 0) == 0; }
  /// What differs from `other`, "" when nothing that both record: "config.json differs" (and the weights
  /// then too, as a rule), or "the weights differ (the same config.json: another checkpoint of the same
  /// shape)". Empty weights on either side are not compared; random weights are compared by seed.
  std::string difference(const TargetFingerprint& other) const;
  /// "config sha256 1a2b3c4d.., weights sha256 5e6f7a8b.. (3 files, 1.2 GB)" for messages.
  std::string describe() const;
};

}  // namespace aerie
