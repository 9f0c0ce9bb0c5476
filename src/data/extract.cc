// run_extract: chunk dispatch, forward and shard writing (see extract.h for the protocol).
#include "data/extract.h"

#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "data/chunk_dispatcher.h"
#include "data/shard_pipeline.h"
#include "io/h5.h"
#include "io/output_lock.h"

namespace aerie {

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------ prepared file

struct PreparedFile::Impl {
  h5::File file;
  h5::Dataset ids, mask;
};

PreparedFile::PreparedFile(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  AERIE_CHECK(fs::is_regular_file(path), "prepared file " << path << ": no such file");
  impl_->file = h5::File::open(path);
  const h5::File& f = impl_->file;
  std::string format = f.has_attr("format") ? f.string_attr("format") : "(none)";
  AERIE_CHECK(format == "aerie.prepared", "prepared file " << path << ": format is '" << format
                                                           << "', expected 'aerie.prepared'");
  int64_t version = f.int_attr("format_version");
  AERIE_CHECK(version == 1, "prepared file " << path << ": format_version " << version << ", this build reads 1");
  offsets_ = f.open_dataset("sample_offsets").read_vector<int64_t>();
  AERIE_CHECK(!offsets_.empty() && offsets_.front() == 0, "prepared file " << path
                                                                           << ": sample_offsets must start at 0");
  for (size_t i = 0; i + 1 < offsets_.size(); ++i)
    AERIE_CHECK(offsets_[i] <= offsets_[i + 1], "prepared file " << path << ": sample_offsets decrease at " << i);
  impl_->ids = f.open_dataset("input_ids");
  impl_->mask = f.open_dataset("loss_mask");
  const int64_t T = offsets_.back();
  AERIE_CHECK(impl_->ids.shape() == Shape{T} && impl_->mask.shape() == Shape{T},
              "prepared file " << path << ": input_ids " << shape_str(impl_->ids.shape()) << " and loss_mask "
                               << shape_str(impl_->mask.shape()) << " must both be [" << T
                               << "] (the last sample offset)");
}

PreparedFile::~PreparedFile() = default;
PreparedFile::PreparedFile(PreparedFile&&) noexcept = default;

void PreparedFile::read_tokens(int64_t begin, int64_t end, std::vector<int32_t>& ids,
                               std::vector<uint8_t>& mask) const {
  AERIE_CHECK(0 <= begin && begin <= end && end <= num_samples(),
              "prepared file " << path_ << ": samples [" << begin << ", " << end << ") out of range [0, "
                               << num_samples() << ")");
  const int64_t a = offsets_[begin], b = offsets_[end];
  ids.assign(static_cast<size_t>(b - a), 0);
  mask.assign(static_cast<size_t>(b - a), 0);
  if (b == a) return;
  Tensor ti = Tensor::wrap(ids.data(), {b - a}, DType::I32);
  Tensor tm = Tensor::wrap(mask.data(), {b - a}, DType::U8);
  impl_->ids.read_rows_into(a, ti);
  impl_->mask.read_rows_into(a, tm);
}

// ------------------------------------------------------------------------------------------------ extract

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Checks that an existing shard holds chunk c as this run would write it.
void check_existing_shard(const std::string& path, int64_t c, int64_t num_samples, int64_t num_tokens,
                          const ShardMeta& meta) {
  ShardReader r(path);
  const ShardInfo& i = r.info();
  AERIE_CHECK(i.chunk == c && i.num_samples == num_samples && i.num_tokens == num_tokens &&
                  i.hidden_size == meta.hidden_size && i.aux_layers == meta.aux_layers,
              "extract: " << path << " exists but is not chunk " << c << " of this run (it holds chunk " << i.chunk
                          << ", " << i.num_samples << " samples, " << i.num_tokens << " tokens, hidden size "
                          << i.hidden_size << "; expected " << num_samples << " samples, " << num_tokens
                          << " tokens, hidden size " << meta.hidden_size
                          << "). Remove it or choose another --output.");
}

}  // namespace

void check_extract_inputs(const ExtractOptions& opt) {
  AERIE_CHECK(opt.samples_per_shard > 0, "extract: --samples-per-shard must be > 0, got " << opt.samples_per_shard);
  AERIE_CHECK(!fs::exists(opt.output) || fs::is_directory(opt.output),
              "extract: --output " << opt.output << " exists and is not a folder");
  PreparedFile prepared(opt.prepared);  // throws naming the file when it is missing or not a prepared file
}

ExtractStats run_extract(const ExtractOptions& opt, ParallelGroups& groups, const TargetForward& forward) {
  const double t0 = now_s();
  check_extract_inputs(opt);
  MpiCommunicator& world = *groups.world;
  // The output folder's lock (io/output_lock.h) on rank 0, unless the job holds it already: the stale .tmp
  // files below are removed only under it, so a concurrent run's shard in progress is never taken for one.
  const OutputLock lock = acquire_output_lock(world.handle(), opt.output, LockTarget::Folder, "extract");
  MpiCommunicator& tp = *groups.tp;
  const bool leader = tp.rank() == 0;
  const int num_groups = groups.map.dp;

  PreparedFile prepared(opt.prepared);
  const auto& off = prepared.sample_offsets();
  const int64_t N = prepared.num_samples(), S = opt.samples_per_shard;
  ExtractStats stats;
  stats.chunks = (N + S - 1) / S;
  auto chunk_range = [&](int64_t c) { return std::pair<int64_t, int64_t>{c * S, std::min(N, (c + 1) * S)}; };
  auto shard_path = [&](int64_t c) { return (fs::path(opt.output) / shard_file_name(c)).string(); };

  // Rank 0: clean up after a killed run and find the chunks still to do.
  std::unique_ptr<ChunkDispatcher> dispatcher;
  if (world.rank() == 0) {
    fs::create_directories(opt.output);
    for (const auto& e : fs::directory_iterator(opt.output)) {
      std::string name = e.path().filename().string();
      if (name.rfind("shard-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
        AERIE_LOG(info) << "extract: removing stale " << e.path().string();
        fs::remove(e.path());
      }
    }
    std::deque<int64_t> todo;
    double samples = 0, tokens = 0;
    for (int64_t c = 0; c < stats.chunks; ++c) {
      auto [b, e] = chunk_range(c);
      std::string p = shard_path(c);
      if (fs::exists(p)) {
        check_existing_shard(p, c, e - b, off[e] - off[b], opt.meta);
        ++stats.chunks_skipped;
        continue;
      }
      todo.push_back(c);
      samples += static_cast<double>(e - b);
      tokens += static_cast<double>(off[e] - off[b]);
    }
    AERIE_LOG(info) << "extract: " << N << " samples in " << stats.chunks << " chunks of " << S << "; "
                    << stats.chunks_skipped << " already done, " << todo.size() << " to do by " << num_groups
                    << " group(s) of " << groups.map.tp << " rank(s)";
    dispatcher = std::make_unique<ChunkDispatcher>(
        world, num_groups, std::move(todo), "extract",
        std::vector<ChunkDispatcher::Counter>{{"samples", samples}, {"tokens", tokens}}, kExtractRequestTag,
        kExtractReplyTag);
  }

  // The leader's shard writes run on a background thread, overlapping the next forward (shard_pipeline.h).
  std::unique_ptr<ShardPipeline> pipeline;
  // Queue room for the samples of two forwards: with several samples per forward (forward_batch) a
  // queue of 2 made the next forward wait for the writer (26.8k instead of 33k tokens/s on an H200).
  if (leader) pipeline = std::make_unique<ShardPipeline>(opt.forward_batch ? 16 : 2);

  // One chunk: forward of every sample, the leader writes the shard. Rank 0 serves requests in between.
  auto process = [&](int64_t c) {
    auto [b, e] = chunk_range(c);
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    {
      std::lock_guard<std::mutex> h5(hdf5_mutex());  // the writer thread may be writing the last shard
      prepared.read_tokens(b, e, ids, mask);
    }
    std::vector<int64_t> lengths;
    for (int64_t i = b; i < e; ++i) {
      lengths.push_back(off[i + 1] - off[i]);
      AERIE_CHECK(lengths.back() > 0, "prepared file " << opt.prepared << ": sample " << i << " is empty");
    }
    if (leader) {
      ShardMeta meta = opt.meta;
      meta.chunk = c;
      pipeline->open(shard_path(c), meta, lengths);
    }
    // Samples i .. j-1 in one forward: one sample, or with opt.forward_batch as many consecutive samples
    // as fit in opt.batch_tokens rows (at least one); the outputs are split back per sample.
    for (int64_t i = b, j; i < e; i = j) {
      j = i + 1;
      if (opt.forward_batch)
        while (j < e && off[j + 1] - off[i] <= opt.batch_tokens) ++j;
      std::vector<std::vector<int32_t>> xs;
      for (int64_t k = i; k < j; ++k)
        xs.emplace_back(ids.begin() + (off[k] - off[b]), ids.begin() + (off[k + 1] - off[b]));
      Tensor aux, fin;
      if (opt.forward_batch)
        opt.forward_batch(xs, aux, fin);
      else
        forward(xs[0], aux, fin);
      AERIE_CHECK(aux.dim(0) == off[j] - off[i] && fin.dim(0) == off[j] - off[i],
                  "extract: the forward of samples " << i << ".." << j - 1 << " returned " << aux.dim(0) << " and "
                                                     << fin.dim(0) << " rows for " << off[j] - off[i] << " tokens");
      for (int64_t k = i, row = 0; k < j; ++k) {
        const int64_t s = off[k] - off[b], T = off[k + 1] - off[k];
        if (leader)
          pipeline->add(k, xs[k - i], std::vector<uint8_t>(mask.begin() + s, mask.begin() + s + T),
                        aux.slice(row, row + T), fin.slice(row, row + T));
        row += T;
      }
      if (dispatcher) dispatcher->serve_pending();
    }
    if (leader) pipeline->close();
    ++stats.chunks_done;
    stats.samples += e - b;
    stats.tokens += off[e] - off[b];
    return std::pair<int64_t, int64_t>{e - b, off[e] - off[b]};
  };

  Tensor cmd = Tensor::zeros({1}, DType::I64);
  int64_t done_chunk = -1, done_samples = 0, done_tokens = 0;
  bool stop_seen = false;  // this rank was asked to stop (between chunks; only leaders act on it)
  for (;;) {
    int64_t c = -1;
    if (opt.stop_requested && opt.stop_requested()) stop_seen = true;
    if (leader) {
      if (dispatcher) {
        if (stop_seen) dispatcher->stop();
        dispatcher->serve_pending();
        c = dispatcher->next();
      } else {
        c = ChunkDispatcher::request(world, groups.map.dp_rank, done_chunk, {done_samples, done_tokens}, stop_seen,
                                     kExtractRequestTag, kExtractReplyTag);
      }
      cmd.data<int64_t>()[0] = c;
    }
    tp.broadcast(cmd, 0);
    c = cmd.data<int64_t>()[0];
    if (c < 0) break;
    auto [ns, nt] = process(c);
    if (dispatcher) {
      dispatcher->completed({ns, nt});
      AERIE_LOG(debug) << "extract: group 0 finished chunk " << c;
    }
    done_chunk = c;
    done_samples = ns;
    done_tokens = nt;
  }
  if (pipeline) pipeline->finish();  // every shard of this group renamed (or its error thrown)
  if (dispatcher) dispatcher->drain();
  // World totals (only leaders count their group's work); the all-reduce also waits for every group.
  stats.chunks_this_group = stats.chunks_done;
  const bool stopped_here = stop_seen || (dispatcher && dispatcher->stopped_any());
  Tensor totals = Tensor::from_vector<int64_t>({leader ? stats.chunks_done : 0, leader ? stats.samples : 0,
                                                leader ? stats.tokens : 0, stats.chunks_skipped,
                                                stopped_here ? 1 : 0},
                                               {5});
  world.all_reduce_sum(totals);
  stats.chunks_done = totals.data<int64_t>()[0];
  stats.samples = totals.data<int64_t>()[1];
  stats.tokens = totals.data<int64_t>()[2];
  stats.chunks_skipped = totals.data<int64_t>()[3];
  stats.stopped = totals.data<int64_t>()[4] != 0;
  stats.seconds = now_s() - t0;
  if (dispatcher) {
    dispatcher->finish();
    AERIE_LOG(info) << "extract: wrote " << stats.chunks_done << " shard(s), " << stats.samples << " samples, "
                    << stats.tokens << " tokens in " << stats.seconds << " s ("
                    << (stats.seconds > 0 ? stats.samples / stats.seconds : 0) << " samples/s, "
                    << (stats.seconds > 0 ? stats.tokens / stats.seconds : 0) << " tokens/s) to " << opt.output;
  }
  return stats;
}

}  // namespace aerie
