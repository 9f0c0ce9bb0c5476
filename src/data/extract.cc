// run_extract: chunk dispatch, forward and shard writing (see extract.h for the protocol).
#include "data/extract.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <iomanip>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/chunk_dispatcher.h"
#include "data/prepare.h"
#include "data/shard_pipeline.h"
#include "io/fingerprint.h"
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

void write_prepared_file(const std::string& path, const std::vector<std::vector<int32_t>>& ids) {
  std::vector<int32_t> all;
  std::vector<int64_t> offsets{0};
  for (const auto& s : ids) {
    all.insert(all.end(), s.begin(), s.end());
    offsets.push_back(static_cast<int64_t>(all.size()));
  }
  const int64_t T = static_cast<int64_t>(all.size()), N = static_cast<int64_t>(ids.size());
  h5::File f = h5::File::create(path);
  f.write_dataset("input_ids", Tensor::from_vector(all, {T}));
  f.write_dataset("loss_mask", Tensor::from_vector(std::vector<uint8_t>(static_cast<size_t>(T), 1), {T}));
  f.write_dataset("sample_offsets", Tensor::from_vector(offsets, {N + 1}));
  f.set_string_attr("format", kPreparedFormat);
  f.set_int_attr("format_version", kPreparedVersion);
  f.close();
}

int64_t packed_forward_end(const std::vector<int64_t>& off, int64_t i, int64_t e, int64_t batch_tokens) {
  int64_t j = i + 1;
  while (j < e && off[j + 1] - off[i] <= batch_tokens) ++j;
  return j;
}

double multi_sample_share(const std::vector<int64_t>& off, int64_t samples_per_shard, int64_t batch_tokens) {
  const int64_t N = static_cast<int64_t>(off.size()) - 1;
  if (N <= 0 || off.back() <= off.front()) return 0;
  int64_t packed = 0;
  for (int64_t b = 0; b < N; b += samples_per_shard) {
    const int64_t e = std::min(N, b + samples_per_shard);
    for (int64_t i = b, j; i < e; i = j) {
      j = packed_forward_end(off, i, e, batch_tokens);
      if (j - i >= 2) packed += off[j] - off[i];
    }
  }
  return static_cast<double>(packed) / static_cast<double>(off.back() - off.front());
}

std::string tp_overlap_packing_warning(const std::string& job, const std::string& prepared,
                                       const std::vector<int64_t>& off, int64_t samples_per_call,
                                       int64_t batch_tokens) {
  const double share = multi_sample_share(off, samples_per_call, batch_tokens);
  if (share >= 0.5) return {};
  std::ostringstream m;
  m << job << ": --tp-overlap splits forwards of two or more samples only, and " << format_fixed(100 * share, 0)
    << "% of the tokens are in such forwards at --batch-tokens " << batch_tokens
    << ": raise --batch-tokens (the samples' lengths: " << prepared << ")";
  return m.str();
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

std::string PreparedFile::fingerprint() const {
  Sha256 h;
  h.update(std::string("aerie.prepared v1"));
  h.update(offsets_.data(), offsets_.size() * sizeof(int64_t));
  const int64_t T = offsets_.back();
  std::vector<int64_t> starts;
  if (T <= kPreparedWindows * kPreparedWindow) {
    for (int64_t a = 0; a < T; a += kPreparedWindow) starts.push_back(a);
  } else {
    for (int64_t i = 0; i < kPreparedWindows; ++i) starts.push_back((T - kPreparedWindow) * i / (kPreparedWindows - 1));
  }
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  try {
    for (int64_t a : starts) {
      const int64_t n = std::min(kPreparedWindow, T - a);
      ids.assign(static_cast<size_t>(n), 0);
      mask.assign(static_cast<size_t>(n), 0);
      Tensor ti = Tensor::wrap(ids.data(), {n}, DType::I32);
      Tensor tm = Tensor::wrap(mask.data(), {n}, DType::U8);
      impl_->ids.read_rows_into(a, ti);
      impl_->mask.read_rows_into(a, tm);
      h.update(ids.data(), ids.size() * sizeof(int32_t));
      h.update(mask.data(), mask.size());
    }
  } catch (const Error& e) {
    AERIE_THROW("prepared file " << path_ << ": cannot read it for its fingerprint: " << e.what());
  }
  return h.hex();
}

// ------------------------------------------------------------------------------------------------ extract

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += std::string(i ? "," : "") + std::to_string(v[i]);
  return out;
}

// Checks that the existing shard `path` holds chunk c (prepared samples [b, e)) as this run would write it:
// chunk, counts, hidden size, aux layers, the provenance it records (target, prepared file) and its tokens
// (compared with the prepared file's, so shards of an older aerie without provenance are checked too).
// Returns whether the shard records its target (false: written by an older aerie). Throws aerie::Error
// naming the shard and what differs.
bool check_existing_shard(const std::string& path, int64_t c, int64_t b, int64_t e, const PreparedFile& prepared,
                          const ShardMeta& meta) {
  ShardReader r(path);
  const ShardInfo& i = r.info();
  const auto& off = prepared.sample_offsets();
  int64_t ns = e - b, nt = off[e] - off[b];
  auto fail = [&](const std::string& why) {
    AERIE_THROW("extract: " << path << " exists but is not chunk " << c << " of this run: " << why
                            << ". Remove the other run's shards or choose another --output.");
  };
  if (i.chunk != c) fail("it holds chunk " + std::to_string(i.chunk));
  // A shard of extract --skip-nonfinite holds the chunk's samples less those it records as skipped.
  std::vector<int64_t> kept;  // the prepared samples it holds, if it skipped some
  if (!i.skipped_nonfinite.empty()) {
    std::vector<int64_t> all = r.sample_indices();
    all.insert(all.end(), i.skipped_nonfinite.begin(), i.skipped_nonfinite.end());
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(static_cast<size_t>(ns));
    for (int64_t k = 0; k < ns; ++k) want[static_cast<size_t>(k)] = b + k;
    if (all != want || !std::is_sorted(r.sample_indices().begin(), r.sample_indices().end()))
      fail("its " + std::to_string(i.num_samples) + " samples and " + std::to_string(i.skipped_nonfinite.size()) +
           " skipped ones are not the chunk's samples " + std::to_string(b) + ".." + std::to_string(e - 1));
    kept = r.sample_indices();
    nt = 0;
    for (int64_t k : kept) nt += off[k + 1] - off[k];
    ns = static_cast<int64_t>(kept.size());
  }
  if (i.num_samples != ns || i.num_tokens != nt)
    fail("it holds " + std::to_string(i.num_samples) + " samples and " + std::to_string(i.num_tokens) +
         " tokens, this run's chunk " + std::to_string(ns) + " and " + std::to_string(nt) +
         " (another --samples-per-shard or --prepared)");
  if (i.hidden_size != meta.hidden_size)
    fail("hidden size " + std::to_string(i.hidden_size) + ", the target's is " + std::to_string(meta.hidden_size));
  if (i.aux_layers != meta.aux_layers)
    fail("aux layers " + join_ints(i.aux_layers) + ", this run's are " + join_ints(meta.aux_layers));
  if (i.fp8 != meta.fp8)
    AERIE_THROW("extract: " << path << " stores its hidden states as " << (i.fp8 ? "fp8" : "bf16")
                            << ", this run as " << (meta.fp8 ? "fp8" : "bf16") << " (--storage): rerun with --storage "
                            << (i.fp8 ? "fp8" : "bf16") << " to resume these shards, or choose another --output");
  if (i.target_gemm != meta.target_gemm) {
    auto name = [](const std::string& g) { return g.empty() ? std::string("the compute dtype's GEMMs") : g; };
    AERIE_THROW("extract: " << path << " was extracted with " << name(i.target_gemm) << ", this run uses "
                            << name(meta.target_gemm) << ": rerun " << (i.target_gemm.empty() ? "without" : "with")
                            << " --fp8-gemm to resume these shards, or choose another --output");
  }
  if (!i.target_dtype.empty() && !meta.target_dtype.empty() && i.target_dtype != meta.target_dtype)
    AERIE_THROW("extract: " << path << " was extracted with the target in " << i.target_dtype << ", this run computes in "
                            << meta.target_dtype << " (--dtype; auto is bf16 on a GPU, f32 on the CPU): rerun with --dtype "
                            << i.target_dtype << " to resume these shards, or choose another --output");
  if (i.has_provenance() && !meta.target.config_sha256.empty()) {
    const std::string diff = i.target.difference(meta.target);
    if (!diff.empty())
      fail("it was extracted from another target: " + diff + " (the shard: " + i.target.describe() + ", from " +
           i.target_model + "; --model " + meta.target_model + ": " + meta.target.describe() + ")");
  }
  if (!i.prepared_sha256.empty() && !meta.prepared_sha256.empty() && i.prepared_sha256 != meta.prepared_sha256)
    fail("it was extracted from another prepared file (sha256 " + i.prepared_sha256.substr(0, 12) + "..; --prepared " +
         prepared.path() + " has " + meta.prepared_sha256.substr(0, 12) + "..)");
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  prepared.read_tokens(b, e, ids, mask);
  if (!i.skipped_nonfinite.empty()) {  // the kept samples' tokens only
    std::vector<int32_t> kids;
    std::vector<uint8_t> kmask;
    for (int64_t k : kept) {
      const size_t x = static_cast<size_t>(off[k] - off[b]), y = static_cast<size_t>(off[k + 1] - off[b]);
      kids.insert(kids.end(), ids.begin() + x, ids.begin() + y);
      kmask.insert(kmask.end(), mask.begin() + x, mask.begin() + y);
    }
    if (kids != r.input_ids() || kmask != r.loss_mask())
      fail("its tokens differ from those of --prepared " + prepared.path() + ": another prepared file");
    return i.has_provenance();
  }
  if (ids != r.input_ids() || mask != r.loss_mask()) {
    int64_t k = b;
    for (; k < e; ++k) {
      const size_t x = static_cast<size_t>(off[k] - off[b]), y = static_cast<size_t>(off[k + 1] - off[b]);
      if (!std::equal(ids.begin() + x, ids.begin() + y, r.input_ids().begin() + x) ||
          !std::equal(mask.begin() + x, mask.begin() + y, r.loss_mask().begin() + x))
        break;
    }
    fail("its tokens differ from those of --prepared " + prepared.path() + " (first at sample " + std::to_string(k) +
         "): another prepared file");
  }
  return i.has_provenance();
}

// The metadata of this run's shards: the caller's (target, aux layers, ...) plus the prepared file's
// fingerprint and the chunking.
ShardMeta run_meta(const ExtractOptions& opt, const PreparedFile& prepared) {
  ShardMeta meta = opt.meta;
  meta.prepared_sha256 = prepared.fingerprint();
  meta.prepared_num_samples = prepared.num_samples();
  meta.samples_per_shard = opt.samples_per_shard;
  meta.num_chunks = (prepared.num_samples() + opt.samples_per_shard - 1) / opt.samples_per_shard;
  return meta;
}

// Checks every existing shard of opt.output (check_existing_shard) and returns which chunks exist; warns
// once about shards without provenance. *skipped (if given): the samples the existing shards left out
// (extract --skip-nonfinite).
std::vector<bool> existing_chunks(const ExtractOptions& opt, const PreparedFile& prepared, const ShardMeta& meta,
                                  int64_t* skipped = nullptr) {
  const int64_t N = prepared.num_samples(), S = opt.samples_per_shard;
  std::vector<bool> done(static_cast<size_t>(meta.num_chunks), false);
  int64_t unrecorded = 0;  // existing shards of an older aerie (no provenance: tokens checked only)
  for (int64_t c = 0; c < meta.num_chunks; ++c) {
    const std::string p = (fs::path(opt.output) / shard_file_name(c)).string();
    if (!fs::exists(p)) continue;
    if (!check_existing_shard(p, c, c * S, std::min(N, (c + 1) * S), prepared, meta)) ++unrecorded;
    done[static_cast<size_t>(c)] = true;
    if (skipped) *skipped += static_cast<int64_t>(ShardReader(p).info().skipped_nonfinite.size());
  }
  if (unrecorded > 0 && !meta.target.config_sha256.empty())
    AERIE_LOG(warning) << "extract: " << unrecorded << " existing shard(s) in " << opt.output
                       << " record no target fingerprint (written by an older aerie): their tokens match, but "
                          "that they come from --model " << meta.target_model << " cannot be checked";
  return done;
}

// Rank 0 of a run: removes the stale .tmp shards of a killed run, finds the chunks still to do (the
// complete ones counted in stats) and returns the dispatcher that hands them to the tp groups.
std::unique_ptr<ChunkDispatcher> dispatch_chunks(const ExtractOptions& opt, const PreparedFile& prepared,
                                                 const ShardMeta& meta, ParallelGroups& groups, ExtractStats& stats) {
  MpiCommunicator& world = *groups.world;
  const int num_groups = groups.map.dp;
  const auto& off = prepared.sample_offsets();
  const int64_t N = prepared.num_samples(), S = opt.samples_per_shard;
  auto chunk_range = [&](int64_t c) { return std::pair<int64_t, int64_t>{c * S, std::min(N, (c + 1) * S)}; };
  std::unique_ptr<ChunkDispatcher> dispatcher;
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
  const std::vector<bool> done = existing_chunks(opt, prepared, meta, &stats.skipped_nonfinite_before);
  for (int64_t c = 0; c < stats.chunks; ++c) {
    auto [b, e] = chunk_range(c);
    if (done[static_cast<size_t>(c)]) {
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
  return dispatcher;
}

// The token counts of samples [b, e) of `prepared` (offsets `off`), whose ids (from sample b on) are `ids`:
// every sample non-empty and, with opt.vocab_size > 0, every id in the target's vocabulary (aerie::Error
// naming the sample otherwise).
std::vector<int64_t> chunk_lengths(const ExtractOptions& opt, const std::vector<int64_t>& off, int64_t b, int64_t e,
                                   const std::vector<int32_t>& ids) {
  std::vector<int64_t> lengths;
  for (int64_t i = b; i < e; ++i) {
    lengths.push_back(off[i + 1] - off[i]);
    AERIE_CHECK(lengths.back() > 0, "prepared file " << opt.prepared << ": sample " << i << " is empty");
    if (opt.vocab_size <= 0) continue;
    for (int64_t t = off[i] - off[b]; t < off[i + 1] - off[b]; ++t) {
      const int32_t id = ids[static_cast<size_t>(t)];
      AERIE_CHECK(id >= 0 && id < opt.vocab_size,
                  "extract: prepared file " << opt.prepared << ": sample " << i << " holds token id " << id
                                            << " at position " << t - (off[i] - off[b])
                                            << ", outside the target's vocabulary [0, " << opt.vocab_size
                                            << ") (a prepared file of another tokenizer than --model's?)");
    }
  }
  return lengths;
}

// Rank 0's group: what its shard writer did, to tell a run bounded by the disk from one bounded by the
// forward (two H200 calls wrote at 0.8-1 GB/s, which capped the extraction). `run_s`: the run so far.
void log_shard_writer(const ShardPipeline& pipeline, const ExtractOptions& opt, double run_s) {
  const double gb = static_cast<double>(pipeline.hidden_bytes()) / 1e9, ws = pipeline.write_seconds(),
               wait = pipeline.caller_wait_seconds();
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "extract: group 0's shard writer took " << gb << std::setprecision(1)
     << " GB of hidden states in " << ws << " s of writes (" << std::setprecision(2) << (ws > 0 ? gb / ws : 0.0)
     << " GB/s); its forwards waited " << std::setprecision(1) << wait << " s for the writer ("
     << (run_s > 0 ? 100.0 * wait / run_s : 0.0) << "% of the run)";
  if (run_s > 0 && wait > 0.1 * run_s)
    os << ": the shard writes (the disk or the page cache) bound this extraction, not the target's forward"
       << (opt.meta.fp8 ? "" : "; --storage fp8 halves the bytes");
  AERIE_LOG(info) << os.str();
}

// Rank 0: the run's totals, and the samples left out for non-finite hidden states (this run's and those of
// the shards complete at start) of the N prepared samples.
void log_extract_totals(const ExtractStats& stats, const ExtractOptions& opt, int64_t N) {
  if (stats.chunks_done == 0 && stats.chunks_skipped > 0)
    AERIE_LOG(info) << "extract: nothing left to write: the " << stats.chunks_skipped << " shard(s) in " << opt.output
                    << " were complete already (a rerun of a finished extraction keeps them)";
  else
    AERIE_LOG(info) << "extract: wrote " << stats.chunks_done << " shard(s), " << stats.samples << " samples, "
                    << stats.tokens << " tokens in " << stats.seconds << " s ("
                    << (stats.seconds > 0 ? stats.samples / stats.seconds : 0) << " samples/s, "
                    << (stats.seconds > 0 ? stats.tokens / stats.seconds : 0) << " tokens/s) to " << opt.output
                    << (stats.chunks_skipped > 0 ? " (" + std::to_string(stats.chunks_skipped) +
                                                       " shard(s) complete already were kept)"
                                                 : std::string());
  if (stats.skipped_nonfinite > 0 || stats.skipped_nonfinite_before > 0) {
    std::ostringstream os;
    os << "extract: ";
    if (stats.skipped_nonfinite > 0)
      os << "skipped " << stats.skipped_nonfinite << " prepared sample(s) (" << stats.skipped_nonfinite_tokens
         << " tokens) whose hidden states hold a NaN or an infinity (--skip-nonfinite; each named in a warning "
            "above by the rank that saw it)"
         << (stats.skipped_nonfinite_before > 0 ? ", and " : "");
    if (stats.skipped_nonfinite_before > 0)
      os << "the " << stats.chunks_skipped << " shard(s) already done left out " << stats.skipped_nonfinite_before
         << (stats.skipped_nonfinite > 0 ? " more" : " prepared sample(s) with non-finite hidden states (an "
                                                      "earlier run with --skip-nonfinite)");
    os << ": " << stats.skipped_nonfinite + stats.skipped_nonfinite_before << " of " << N
       << " prepared samples are not in " << opt.output
       << " (each shard lists its own in the attribute skipped_nonfinite)";
    AERIE_LOG(warning) << os.str();
  }
}

}  // namespace

int64_t check_existing_shards(const ExtractOptions& opt) {
  check_extract_inputs(opt);
  if (!fs::is_directory(opt.output)) return 0;
  PreparedFile prepared(opt.prepared);
  const std::vector<bool> done = existing_chunks(opt, prepared, run_meta(opt, prepared));
  return std::count(done.begin(), done.end(), true);
}

void check_extract_inputs(const ExtractOptions& opt) {
  AERIE_CHECK(opt.samples_per_shard > 0, "extract: --samples-per-shard must be > 0, got " << opt.samples_per_shard);
  AERIE_CHECK(!fs::exists(opt.output) || fs::is_directory(opt.output),
              "extract: --output " << opt.output << " exists and is not a folder");
  // A train run folder given as the shard folder would mix the two.
  AERIE_CHECK(!fs::exists(fs::path(opt.output) / "config.json"),
              "extract: --output " << opt.output << " holds config.json (a model's folder, or a draft export), not "
                                   << "shards; choose another --output");
  AERIE_CHECK(!fs::exists(fs::path(opt.output) / "checkpoints") && !fs::exists(fs::path(opt.output) / "metrics.jsonl"),
              "extract: --output " << opt.output << " holds a training run (checkpoints/, metrics.jsonl), not shards; "
                                   << "choose another --output");
  PreparedFile prepared(opt.prepared);  // throws naming the file when it is missing or not a prepared file
}

int64_t shard_bytes_per_token(int64_t hidden, bool fp8) { return fp8 ? 4 * hidden + 16 + 5 : 8 * hidden + 5; }

int64_t shard_bytes(int64_t tokens, int64_t samples, int64_t shards, int64_t hidden, bool fp8) {
  return tokens * shard_bytes_per_token(hidden, fp8) + 16 * samples + (int64_t{64} << 10) * shards;
}

ShardSpace estimate_shard_space(const ExtractOptions& opt, int64_t hidden) {
  PreparedFile prepared(opt.prepared);
  ShardSpace s;
  s.samples = prepared.num_samples();
  s.tokens = prepared.sample_offsets().back();
  s.shards = opt.samples_per_shard > 0 ? (s.samples + opt.samples_per_shard - 1) / opt.samples_per_shard : 0;
  s.bytes_per_token = shard_bytes_per_token(hidden, opt.meta.fp8);
  s.bytes_total = shard_bytes(s.tokens, s.samples, s.shards, hidden, opt.meta.fp8);
  std::error_code ec;
  if (fs::is_directory(opt.output, ec))
    for (const auto& e : fs::directory_iterator(opt.output, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("shard-", 0) == 0 && n.size() > 3 && n.compare(n.size() - 3, 3, ".h5") == 0)
        s.bytes_existing += static_cast<int64_t>(e.file_size(ec));
    }
  s.bytes_needed = std::max<int64_t>(0, s.bytes_total - s.bytes_existing);
  fs::path where = fs::absolute(opt.output, ec);
  while (!where.empty() && !fs::exists(where, ec) && where != where.parent_path()) where = where.parent_path();
  s.where = where.string();
  const fs::space_info si = fs::space(where, ec);
  if (!ec) s.bytes_available = static_cast<int64_t>(si.available);
  return s;
}

void check_shard_space(const ShardSpace& s) {
  if (s.bytes_available < 0 || s.bytes_needed <= s.bytes_available) return;
  auto gib = [](int64_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0) << " GiB";
    return os.str();
  };
  AERIE_THROW("extract: the shards need about " << gib(s.bytes_needed) << " more (" << s.tokens << " tokens x "
                                                << s.bytes_per_token << " bytes, " << gib(s.bytes_existing)
                                                << " already written) but " << s.where << " has "
                                                << gib(s.bytes_available)
                                                << " free: free space, extract fewer samples, or pass "
                                                   "--no-space-check to start anyway");
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

  PreparedFile prepared(opt.prepared);
  const auto& off = prepared.sample_offsets();
  const int64_t N = prepared.num_samples(), S = opt.samples_per_shard;
  ExtractStats stats;
  stats.chunks = (N + S - 1) / S;
  auto chunk_range = [&](int64_t c) { return std::pair<int64_t, int64_t>{c * S, std::min(N, (c + 1) * S)}; };
  // Every shard records where it comes from (the caller's target fingerprint in opt.meta, the prepared
  // file's and the chunking), so that a rerun and train can refuse a folder of mixed provenance.
  const ShardMeta meta = run_meta(opt, prepared);
  auto shard_path = [&](int64_t c) { return (fs::path(opt.output) / shard_file_name(c)).string(); };

  // Rank 0: clean up after a killed run and find the chunks still to do.
  std::unique_ptr<ChunkDispatcher> dispatcher;
  if (world.rank() == 0) dispatcher = dispatch_chunks(opt, prepared, meta, groups, stats);

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
    const std::vector<int64_t> lengths = chunk_lengths(opt, off, b, e, ids);
    if (leader) {
      ShardMeta m = meta;
      m.chunk = c;
      pipeline->open(shard_path(c), m, lengths, opt.skip_nonfinite ? NonFinite::Skip : NonFinite::Error);
    }
    // Samples i .. j-1 in one forward: one sample, or with opt.forward_batch as many consecutive samples
    // as fit in opt.batch_tokens rows (at least one); the outputs are split back per sample.
    for (int64_t i = b, j; i < e; i = j) {
      j = opt.forward_batch ? packed_forward_end(off, i, e, opt.batch_tokens) : i + 1;
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
  if (pipeline) {
    pipeline->finish();  // every shard of this group renamed (or its error thrown)
    if (dispatcher && pipeline->hidden_bytes() > 0) log_shard_writer(*pipeline, opt, now_s() - t0);
    // Samples left out (skip_nonfinite; each named in a warning of this rank): not written.
    stats.skipped_nonfinite = pipeline->skipped_samples();
    stats.skipped_nonfinite_tokens = pipeline->skipped_tokens();
    stats.samples -= stats.skipped_nonfinite;
    stats.tokens -= stats.skipped_nonfinite_tokens;
  }
  if (dispatcher) dispatcher->drain();
  // World totals (only leaders count their group's work); the all-reduce also waits for every group.
  stats.chunks_this_group = stats.chunks_done;
  const bool stopped_here = stop_seen || (dispatcher && dispatcher->stopped_any());
  Tensor totals = Tensor::from_vector<int64_t>(
      {leader ? stats.chunks_done : 0, leader ? stats.samples : 0, leader ? stats.tokens : 0, stats.chunks_skipped,
       stopped_here ? 1 : 0, stats.skipped_nonfinite, stats.skipped_nonfinite_tokens, stats.skipped_nonfinite_before},
      {8});
  world.all_reduce_sum(totals);
  const int64_t* t = totals.data<int64_t>();
  stats.chunks_done = t[0];
  stats.samples = t[1];
  stats.tokens = t[2];
  stats.chunks_skipped = t[3];
  stats.stopped = t[4] != 0;
  stats.skipped_nonfinite = t[5];
  stats.skipped_nonfinite_tokens = t[6];
  stats.skipped_nonfinite_before = t[7];  // counted on rank 0 only
  stats.seconds = now_s() - t0;
  if (dispatcher) {
    dispatcher->finish();
    log_extract_totals(stats, opt, N);
  }
  return stats;
}

}  // namespace aerie
