// The work of `aerie extract`: run the target over every prepared sample and store its hidden states in
// shards (data/shard.h). Chunk c = prepared samples [c*S, (c+1)*S) -> "<output>/shard-%05d.h5".
//
// Parallelism: the world is split into tp groups (ParallelGroups, consecutive ranks); each group runs the
// target's forward together (tensor parallel) and its leader (tp rank 0) writes the group's shards with
// serial HDF5, so different groups write different shards at the same time. Chunks are handed out
// dynamically by world rank 0, which also works in group 0 (no extra thread: MPI is initialised without
// MPI_THREAD_MULTIPLE):
//   - the leader of group g > 0 sends rank 0 a request [g, finished chunk or -1, its samples, its tokens,
//     stop] (tag kExtractRequestTag) and waits for the reply [next chunk or -1] (tag kExtractReplyTag);
//     stop = 1 (the leader was asked to stop, preemption) makes rank 0 hand out no more chunks to anyone;
//   - rank 0 answers every pending request (MPI_Iprobe) before each chunk of its own and between the
//     samples of that chunk, so a request waits at most one forward of group 0; when the queue is empty it
//     answers -1 and, after its own last chunk, keeps answering until every leader got its -1;
//   - each leader broadcasts the chunk index (or -1 = stop) to its tp group.
// Rank 0 counts the completions it is told about and logs progress (samples/s, tokens/s, ETA).
//
// Restart: shard files are written as "*.tmp" and renamed when complete. At start rank 0 takes the output
// folder's lock (io/output_lock.h: a concurrent extract into the folder is refused), then deletes stale
// "shard-*.h5.tmp" files and skips every chunk whose shard exists, after checking that it holds the
// chunk's samples (their tokens, compared with the prepared file's) with the same aux layers / hidden
// size, and that the provenance it records (the target's fingerprint, the prepared file's, io/fingerprint.h)
// is this run's: shards of another run or another model of the same shape are never mixed in (the error
// names what differs). Shards of an older aerie without provenance are checked by their tokens, with a
// warning. A shard that left samples out (skip_nonfinite) holds the chunk's other samples and records the
// skipped ones; it counts as done on a rerun, and the summary gives how many samples it left out.
// A shard's bytes depend only on the chunk's samples and the forward (not on which group wrote it), so a
// killed and rerun job gives the same files as an uninterrupted one.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "data/shard.h"

namespace aerie {

inline constexpr int kExtractRequestTag = 7101;
inline constexpr int kExtractReplyTag = 7102;

/// The target's forward over one sample: ids [T] -> aux_hidden [T, 3H] (f_t, eagle3.md section 1)
/// and final_hidden [T, H] (z_t), F32 or BF16, on the host or the GPU (stored as bf16). Collective over the
/// caller's tp group: every rank of the group calls it with the same ids; the group leader's outputs are
/// stored, by a writer thread while the next forward runs (data/shard_pipeline.h), so the forward must
/// return new tensors on each call rather than overwrite the previous ones.
using TargetForward = std::function<void(const std::vector<int32_t>& ids, Tensor& aux_hidden, Tensor& final_hidden)>;
/// The target's forward over several samples at once (TargetModel::forward_batch): ids[b] = sample b's
/// ids [T_b]; aux_hidden [sum T_b, 3H] and final_hidden [sum T_b, H] hold the rows of sample 0, then 1, ...
/// Otherwise as TargetForward (collective, new tensors on each call).
using TargetForwardBatch = std::function<void(const std::vector<std::vector<int32_t>>& ids, Tensor& aux_hidden,
                                              Tensor& final_hidden)>;

/// Windows of a prepared file's tokens that PreparedFile::fingerprint() reads, and their length.
inline constexpr int64_t kPreparedWindows = 16;
inline constexpr int64_t kPreparedWindow = 16384;

/// The token index of a prepared file ("aerie.prepared" v1, docs/formats.md): sample_offsets only.
/// Tokens are read per range with read_tokens().
class PreparedFile {
 public:
  /// Opens `path` read-only (serial HDF5) and checks format/version and dataset shapes. Throws
  /// aerie::Error naming the file otherwise.
  explicit PreparedFile(const std::string& path);
  ~PreparedFile();
  PreparedFile(PreparedFile&&) noexcept;
  int64_t num_samples() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  const std::vector<int64_t>& sample_offsets() const { return offsets_; }  // [N+1]
  /// input_ids [end-begin tokens] and loss_mask of samples [begin, end) (flattened, tokens of
  /// samples begin..end-1 in order).
  void read_tokens(int64_t begin, int64_t end, std::vector<int32_t>& ids, std::vector<uint8_t>& mask) const;
  /// The prepared file's provenance fingerprint (64 hex digits of SHA-256): its content, not its path or
  /// attributes: every sample_offsets value and kPreparedWindows windows of kPreparedWindow tokens of
  /// input_ids and loss_mask at evenly spaced offsets (all of them for a smaller file). Cheap (a few MB read
  /// for any size). Throws aerie::Error naming the file on a read error.
  std::string fingerprint() const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::vector<int64_t> offsets_;
};

/// Writes `path` as a prepared file ("aerie.prepared" v1: input_ids, loss_mask, sample_offsets) of the samples
/// `ids`, every token in the loss, without the prepare job's provenance attributes: the random samples of a
/// measurement (calibrate's short extract). Serial HDF5; throws aerie::Error naming the file on a write error.
void write_prepared_file(const std::string& path, const std::vector<std::vector<int32_t>>& ids);

/// The end of the forward that starts at sample i of a chunk ending at sample e (offsets `off`, [N+1]) when
/// consecutive samples share forwards of at most batch_tokens tokens: the first sample past the last one that
/// fits, at least i + 1 (a longer sample goes alone). run_extract's grouping with forward_batch.
int64_t packed_forward_end(const std::vector<int64_t>& off, int64_t i, int64_t e, int64_t batch_tokens);

/// The share (0 to 1) of a prepared file's tokens (offsets `off`) that run_extract with forward_batch puts in
/// forwards of two or more samples (chunks of samples_per_shard, grouped by packed_forward_end): the forwards that
/// --tp-overlap can split into two micro-batches. 0 for an empty file.
double multi_sample_share(const std::vector<int64_t>& off, int64_t samples_per_shard, int64_t batch_tokens);

/// What `job` ("extract", "train") warns when --tp-overlap would split few of its forwards: under half of the
/// tokens of prepared file `prepared` (offsets `off`) in forwards of two or more samples (multi_sample_share with
/// `samples_per_call` samples per packing call: extract's --samples-per-shard, a streaming step's samples per
/// target replica, taken in file order where streaming shuffles them) at `batch_tokens`. Empty when half or more are.
std::string tp_overlap_packing_warning(const std::string& job, const std::string& prepared,
                                       const std::vector<int64_t>& off, int64_t samples_per_call,
                                       int64_t batch_tokens);

struct ExtractOptions {
  std::string prepared;          // prepared.h5
  std::string output;            // shard folder (created)
  int64_t samples_per_shard = 64;
  /// target_model, aux_layers, hidden_size, num_hidden_layers and the target's fingerprint (meta.target:
  /// TargetFingerprint::of_model of --model; empty: the shards record none). run_extract sets the chunk,
  /// the prepared file's fingerprint and the chunking itself.
  ShardMeta meta;
  /// Preemption: polled by every rank before it takes its next chunk (null: never stop). When it returns
  /// true on any rank, every group finishes and closes the shard in hand, no new chunk is handed out, and
  /// run_extract returns with stats.stopped (a rerun does the missing chunks).
  std::function<bool()> stop_requested;
  /// When set, run_extract gives consecutive samples of a chunk to forward_batch in groups of at most
  /// batch_tokens rows (a longer sample goes alone) instead of calling the per-sample forward, and splits
  /// the outputs back per sample (views of the batch's rows). The grouping depends only on the chunk's
  /// samples, so shards stay reproducible. 2048 rows already fill an H200 (GEMMs of 2048 x 4096 x 4096
  /// and more); larger groups were slower on one H200 for an 8B target (docs/performance.md: 33.0k
  /// tokens/s at 8192 and 30.3k at 16384 against 34.7k for one 2048-token sample per forward).
  TargetForwardBatch forward_batch;
  int64_t batch_tokens = 2048;
  /// The target's vocabulary size V: every prepared id must lie in [0, V) (an error naming the prepared file,
  /// the sample and the id, before its forward); 0: not checked.
  int64_t vocab_size = 0;
  /// A sample whose hidden states hold a NaN or an infinity: false: an error naming it (the job stops);
  /// true (extract --skip-nonfinite): left out of its shard, named in a warning by the group leader that
  /// saw it and counted (ExtractStats::skipped_nonfinite; the shard records it, ShardInfo::skipped_nonfinite).
  bool skip_nonfinite = false;
};

/// What run_extract did: totals over the world, the same on every rank, except chunks_this_group.
struct ExtractStats {
  int64_t chunks = 0;          // chunks of the prepared file
  int64_t chunks_skipped = 0;  // already complete at start
  int64_t chunks_done = 0;     // written by this run
  int64_t samples = 0, tokens = 0;  // extracted and written by this run
  int64_t skipped_nonfinite = 0, skipped_nonfinite_tokens = 0;  // left out by this run (skip_nonfinite)
  int64_t skipped_nonfinite_before = 0;  // left out by an earlier run, recorded in the shards complete at start
  int64_t chunks_this_group = 0;    // written by this rank's tp group (the same on its ranks)
  double seconds = 0;
  bool stopped = false;             // stop_requested was true on some rank (the same on every rank)
};

/// The checks of run_extract that need no model: samples_per_shard > 0, the prepared file opens as an
/// aerie prepared file, and the output path is a folder or does not exist yet. Jobs call it before
/// loading the target (minutes for a large checkpoint). Throws aerie::Error naming the option or file.
void check_extract_inputs(const ExtractOptions& options);

/// A shard's bytes per token of a target of hidden size `hidden`: the aux [3H] and final [H] hidden states in bf16
/// (8 H), or in fp8 (4 H e4m3 codes and an fp32 scale per H-wide vector: 4 H + 16), plus input_ids (4) and
/// loss_mask (1). docs/formats.md, the shard format.
int64_t shard_bytes_per_token(int64_t hidden, bool fp8);

/// The bytes of the shards of `samples` samples of `tokens` tokens in all, in `shards` files: per token
/// (shard_bytes_per_token), plus 16 bytes per sample (offsets, index) and 64 KiB of HDF5 overhead per shard.
/// What extract logs before it starts and `aerie plan` prints.
int64_t shard_bytes(int64_t tokens, int64_t samples, int64_t shards, int64_t hidden, bool fp8);

/// The disk space extraction needs (shard_bytes of the prepared file's samples).
struct ShardSpace {
  int64_t tokens = 0, samples = 0, shards = 0;
  int64_t bytes_per_token = 0;  // bf16: 8 H + 5 (four H-wide vectors, the id and the mask); fp8: 4 H + 21
  int64_t bytes_total = 0;      // all shards of the prepared file
  int64_t bytes_existing = 0;   // the complete shards already in the folder (a rerun redoes the others)
  int64_t bytes_needed = 0;     // total - existing, at least 0
  int64_t bytes_available = -1; // free space of the folder's file system for this user; -1: unknown
  std::string where;            // the folder (or its nearest existing parent) that was asked
};
/// Estimates options.output's shards for options.prepared and a target of hidden size `hidden`, and asks
/// the file system for its free space (std::filesystem::space). Throws aerie::Error naming the prepared
/// file when it cannot be read.
ShardSpace estimate_shard_space(const ExtractOptions& options, int64_t hidden);
/// Throws aerie::Error when space.bytes_needed exceeds space.bytes_available (known), naming both, the
/// folder and the override (`extract --no-space-check`).
void check_shard_space(const ShardSpace& space);

/// The check of the existing shards of options.output that run_extract makes at start (counts, hidden size,
/// aux layers, the provenance in options.meta and the prepared file's, the tokens), alone: jobs call it on
/// one rank before loading the target, so that a folder of another run is refused at once. Returns how
/// many chunks are complete already. Throws aerie::Error naming the first shard that is not this run's
/// and what differs, or as check_extract_inputs.
int64_t check_existing_shards(const ExtractOptions& options);

/// Extracts every missing shard (or stops early, see ExtractOptions::stop_requested). Collective over groups.world (all ranks call it with the same options);
/// `forward` is collective over groups.tp. World rank 0 holds the output folder's lock (DIR/.aerie.lock,
/// io/output_lock.h) for the call, unless this process holds it already (the job took it before loading
/// the target). Throws aerie::Error on unreadable input, a shard of another run in the output folder, or
/// I/O failure (the caller aborts the job: peers may be waiting), and aerie::CollectiveError (every rank)
/// when another job holds the lock.
ExtractStats run_extract(const ExtractOptions& options, ParallelGroups& groups, const TargetForward& forward);

}  // namespace aerie
