// Overlap of shard writing with the target's forward (the extraction throughput item of the CUDA issue):
// a background thread runs the HDF5 work of the shard writers (data/shard.h) while the main thread runs
// the next sample's forward. Tasks run in the order they were queued, so the files are byte-identical to
// a synchronous run. At most `max_pending` samples wait in the queue (memory bound: each holds its host
// copy of the hidden states); a push blocks while the queue is full.
//
// GPU tensors (add) are copied to page-locked host buffers by cudaMemcpyAsync on a copy stream of the
// pipeline, after an event of the caller's stream, so the copy overlaps the next forward too; the
// writer thread waits for the copy's event before the HDF5 write. The buffers are reused (a pool), and
// the device tensors are kept alive by the pipeline until their copy is done.
//
// HDF5 as Debian builds it (parallel) is not thread-safe: every HDF5 call of the process must hold
// hdf5_mutex() while the pipeline lives (the writer thread holds it for each task).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/shard.h"

namespace aerie {

/// The process-wide lock around HDF5 calls made while a ShardPipeline runs.
std::mutex& hdf5_mutex();

class ShardPipeline {
 public:
  /// Starts the writer thread. max_pending >= 1 samples may be queued.
  explicit ShardPipeline(int max_pending = 2);
  /// Waits for the queued work (errors are dropped: call finish() to see them) and joins the thread.
  ~ShardPipeline();
  ShardPipeline(const ShardPipeline&) = delete;
  ShardPipeline& operator=(const ShardPipeline&) = delete;

  /// Queues: create the shard "<path>.tmp" (ShardWriter's constructor).
  void open(const std::string& path, const ShardMeta& meta, const std::vector<int64_t>& sample_lengths,
            NonFinite on_nonfinite = NonFinite::Error);
  /// Queues one sample of the open shard. aux_hidden [T, 3H] / final_hidden [T, H], F32 or BF16, on any
  /// device: GPU tensors are copied to pinned host buffers asynchronously (queued after the work on the
  /// caller's current stream; the caller may drop them at once but must not overwrite them), host
  /// tensors are kept by reference (the caller must not modify them afterwards).
  void add(int64_t sample_index, std::vector<int32_t> ids, std::vector<uint8_t> loss_mask, const Tensor& aux_hidden,
           const Tensor& final_hidden);
  /// Queues: write the index, close and rename the shard.
  void close();
  /// Waits until everything queued is done; rethrows the first error of a task (aerie::Error naming the
  /// shard). After an error every later task is skipped, so no shard is renamed after a failed write.
  void finish();
  /// Samples the closed shards left out (NonFinite::Skip) and their tokens, summed; read after finish().
  int64_t skipped_samples() const { return skipped_samples_; }
  int64_t skipped_tokens() const { return skipped_tokens_; }
  /// Where an extraction's time goes, read after finish(): seconds the writer thread spent in the shard
  /// writes of samples (the HDF5 writes, the finite scan, an fp8 quantization; not the wait for a GPU
  /// copy), the hidden-state bytes it was handed (aux + final, as added: bf16 or f32), and seconds the
  /// caller's add() waited for room in the queue (the writer behind the forwards: the disk or the page
  /// cache bounds the run).
  double write_seconds() const { return write_s_; }
  int64_t hidden_bytes() const { return hidden_bytes_; }
  double caller_wait_seconds() const { return caller_wait_s_; }

 private:
  void push(std::function<void()> task, bool is_sample);
  void run();
  struct DeviceCopies;  // the copy stream, pinned buffer pool and in-flight device tensors (CUDA only)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, bool>> tasks_;
  int max_pending_, pending_samples_ = 0;
  bool busy_ = false, quit_ = false;
  std::exception_ptr error_;
  std::unique_ptr<ShardWriter> writer_;  // touched by the writer thread only
  int64_t skipped_samples_ = 0, skipped_tokens_ = 0;  // written by the writer thread (close tasks)
  double write_s_ = 0;                                 // written by the writer thread (sample tasks)
  int64_t hidden_bytes_ = 0;                           // written by the caller's thread (add)
  double caller_wait_s_ = 0;                           // written by the caller's thread (push)
  std::unique_ptr<DeviceCopies> dev_;     // touched by the caller's thread only (created on the first GPU add)
  std::thread thread_;
};

}  // namespace aerie
