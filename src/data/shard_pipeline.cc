#include "data/shard_pipeline.h"

#include "core/device.h"
#include "core/device_event.h"
#include "core/error.h"
#include "core/pinned_memory.h"

#include <algorithm>
#include <chrono>

namespace aerie {

namespace {

/// Page-locked host buffers, reused. Shared with the buffers' owners so that a buffer held by a queued
/// task returns here whenever the task is dropped.
struct PinnedPool {
  std::mutex mu;
  std::vector<cuda::PinnedBuffer> free;
};

/// A host tensor of `shape`/`dtype` on a pinned buffer of `pool`; `owner` returns the buffer to the pool
/// when its last copy is dropped (the tensor itself is a non-owning view: keep `owner` with it).
Tensor pinned_tensor(const std::shared_ptr<PinnedPool>& pool, const Shape& shape, DType dtype,
                     std::shared_ptr<void>& owner) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * dtype_size(dtype));
  cuda::PinnedBuffer buf;
  {
    std::lock_guard<std::mutex> lk(pool->mu);
    // Best fit: the smallest free buffer that holds `bytes`, so that a small final-hidden-state copy
    // does not take a large aux buffer and make the next aux copy allocate (cudaHostAlloc is slow).
    size_t best = pool->free.size();
    for (size_t i = 0; i < pool->free.size(); ++i) {
      const size_t size = pool->free[i].size();
      if (size >= bytes && (best == pool->free.size() || size < pool->free[best].size())) best = i;
    }
    if (best < pool->free.size()) {
      buf = std::move(pool->free[best]);
      pool->free.erase(pool->free.begin() + static_cast<std::ptrdiff_t>(best));
    }
  }
  if (!buf.data()) buf = cuda::PinnedBuffer(bytes);
  void* data = buf.data();
  owner = std::shared_ptr<cuda::PinnedBuffer>(new cuda::PinnedBuffer(std::move(buf)), [pool](cuda::PinnedBuffer* b) {
    {
      std::lock_guard<std::mutex> lk(pool->mu);
      pool->free.push_back(std::move(*b));
    }
    delete b;
  });
  return Tensor::wrap(data, shape, dtype);
}

}  // namespace

struct ShardPipeline::DeviceCopies {
  struct InFlight {
    std::shared_ptr<cuda::Event> done;  // recorded on `stream` after the sample's copies
    Tensor aux, fin;                    // the device tensors, alive until their copy is done
  };
  int device = cuda::current_device();
  std::deque<InFlight> in_flight;
  std::shared_ptr<PinnedPool> pool = std::make_shared<PinnedPool>();
  // Declared last, so destroyed first: its destructor waits for the copies before `in_flight` drops the
  // device tensors they read.
  cuda::OwnedStream stream;

  /// Drops the device tensors whose copy is done (all of them when `wait`; stops at a copy the runtime
  /// reports an error for, which the writer thread's wait reports).
  void release(bool wait) {
    while (!in_flight.empty() && (wait ? in_flight.front().done->wait() : in_flight.front().done->query()))
      in_flight.pop_front();
  }
};

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

ShardPipeline::ShardPipeline(int max_pending) : max_pending_(max_pending) {
  AERIE_CHECK(max_pending >= 1, "ShardPipeline: max_pending must be >= 1, got " << max_pending);
  thread_ = std::thread([this] { run(); });
}

ShardPipeline::~ShardPipeline() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return tasks_.empty() && !busy_; });
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ShardPipeline::run() {
  for (;;) {
    std::pair<std::function<void()>, bool> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return quit_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    std::exception_ptr err;
    if (!error_) {  // error_ is written by this thread only
      try {
        std::lock_guard<std::mutex> h5(hdf5_mutex());
        task.first();
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      if (task.second) --pending_samples_;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void ShardPipeline::push(std::function<void()> task, bool is_sample) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (is_sample && pending_samples_ >= max_pending_ && !error_) {
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait(lk, [&] { return pending_samples_ < max_pending_ || error_; });
      caller_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (error_) std::rethrow_exception(error_);
    tasks_.emplace_back(std::move(task), is_sample);
    if (is_sample) ++pending_samples_;
  }
  cv_.notify_all();
}

void ShardPipeline::open(const std::string& path, const ShardMeta& meta, const std::vector<int64_t>& sample_lengths,
                         NonFinite on_nonfinite) {
  push([this, path, meta, sample_lengths,
        on_nonfinite] { writer_ = std::make_unique<ShardWriter>(path, meta, sample_lengths, on_nonfinite); },
       false);
}

void ShardPipeline::add(int64_t sample_index, std::vector<int32_t> ids, std::vector<uint8_t> loss_mask,
                        const Tensor& aux_hidden, const Tensor& final_hidden) {
  hidden_bytes_ += static_cast<int64_t>(aux_hidden.nbytes() + final_hidden.nbytes());
  if (aux_hidden.device() == Device::CUDA && final_hidden.device() == Device::CUDA) {
    if (!dev_) dev_ = std::make_unique<DeviceCopies>();
    DeviceCopies& d = *dev_;
    d.release(false);
    d.stream.wait_for(cuda::current_stream());  // the copies start after the work that wrote the tensors
    auto done = std::make_shared<cuda::Event>();
    // Pinned host buffers (from the pool) and their owners.
    auto host_copy = [&](const Tensor& src, std::shared_ptr<void>& owner) {
      Tensor h = pinned_tensor(d.pool, src.shape(), src.dtype(), owner);
      cuda::copy_to_host_async(h.raw(), src.raw(), src.nbytes(), d.stream.get());
      return h;
    };
    std::shared_ptr<void> aux_owner, fin_owner;
    Tensor aux = host_copy(aux_hidden, aux_owner), fin = host_copy(final_hidden, fin_owner);
    done->record(d.stream.get());
    d.in_flight.push_back({done, aux_hidden, final_hidden});
    const int device = d.device;
    push(
        [this, sample_index, ids = std::move(ids), mask = std::move(loss_mask), aux, fin, aux_owner, fin_owner,
         done, device] {
          AERIE_CHECK(writer_, "ShardPipeline: add without an open shard");
          cuda::set_thread_device(device);  // no context on GPU 0 for this thread
          done->synchronize("ShardPipeline: device-to-host copy of the hidden states");
          const auto t0 = std::chrono::steady_clock::now();
          writer_->add(sample_index, ids, mask, aux, fin);
          write_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        },
        true);
    return;
  }
  Tensor aux = aux_hidden.device() == Device::CPU ? aux_hidden : aux_hidden.to_device(Device::CPU);
  Tensor fin = final_hidden.device() == Device::CPU ? final_hidden : final_hidden.to_device(Device::CPU);
  push(
      [this, sample_index, ids = std::move(ids), mask = std::move(loss_mask), aux, fin] {
        AERIE_CHECK(writer_, "ShardPipeline: add without an open shard");
        const auto t0 = std::chrono::steady_clock::now();
        writer_->add(sample_index, ids, mask, aux, fin);
        write_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      true);
}

void ShardPipeline::close() {
  push(
      [this] {
        AERIE_CHECK(writer_, "ShardPipeline: close without an open shard");
        writer_->close();
        skipped_samples_ += static_cast<int64_t>(writer_->skipped().size());
        skipped_tokens_ += writer_->skipped_tokens();
        writer_.reset();
      },
      false);
}

void ShardPipeline::finish() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return tasks_.empty() && !busy_; });
  if (dev_) dev_->release(true);  // every copy is done: free the device tensors
  if (error_) std::rethrow_exception(error_);
}

}  // namespace aerie
