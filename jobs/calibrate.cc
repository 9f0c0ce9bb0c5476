// aerie calibrate: measures, on this node's own ranks and devices, what the time plan (aerie plan --calibration,
// train/time_plan.h) needs, and writes it to calibration.json:
//   - the target's forward by layer kind: config.json's model truncated to one and three layers of its first kind
//     and to one of it and two of the other kind (dense, MoE), random weights in the checkpoint's formats, timed at --tokens on the tp
//     group of --tp ranks (its all-reduces included; with --tp-overlap as two sequences of T/2, extract's two
//     micro-batches); base and per-layer seconds follow from the differences;
//     on the same cuts, generate's decoding (BatchDecoder: --gen-batch-size sequences of --gen-prompt-tokens
//     decoding --gen-new-tokens each), summed to the whole target the same way;
//   - the draft's training step (TTT, random weights and hidden states) over one sample of each --train-tokens
//     length, on every rank at once (one rank's share of a data-parallel step; the gradient all-reduce is left out),
//     and on one rank while the others idle (a streaming run's trainers);
//   - the shard writer: every tp group's leader writes --disk-mib of random hidden states as a shard into --work
//     at the same time (the node's aggregate write rate), then deletes it;
//   - extract's own loop beside its forwards and writer: short runs of run_extract on the one-layer cut;
//   - the tp group's all-reduce of [T, H] bf16 (its bus bandwidth, nccl-tests' convention);
//   - the streaming train's messages: one sample's hidden states from world rank 0 to the last rank (MPI).
//   aerie calibrate --model DIR --output calibration.json [--tp N] [--device auto|cpu|cuda] [--tokens 512,2048,8192]
// Rank 0 writes the file and prints a summary. docs/time-plan.md: what is measured and how the plan uses it.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/stop_signals.h"
#include "data/extract.h"
#include "data/shard.h"
#include "data/vocab.h"
#include "jobs/jobs.h"
#include "jobs/plan_time.h"
#include "jobs/target_device.h"
#include "model/draft.h"
#include "model/sampling.h"
#include "model/target.h"
#include "model/target_config.h"
#include "train/target_head.h"
#include "train/time_plan.h"
#include "train/trainer.h"

namespace aerie::jobs {

namespace {

struct CalibrateOptions {
  std::vector<int64_t> tokens, train_tokens;
  int64_t draft_vocab = 32000;  // K of the planned run (vocab --draft-vocab-size), at most the target's V
  int64_t gen_batch = 16, gen_prompt = 0, gen_new = 0;  // generate's batch, prompt and new tokens (0: by device)
  int iters = 3, ttt_steps = 7;
  int64_t train_batch = 8;  // samples of the draft's measured step (train --batch-size)
  double min_seconds = 0.3;
  int64_t disk_bytes = 0;
  std::string work;
};

std::vector<int64_t> parse_counts(const std::string& s, const char* option) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t x = 0;
    size_t used = 0;
    try {
      x = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    AERIE_USAGE_CHECK(used == item.size() && x > 0 && (v.empty() || x > v.back()),
                      "aerie calibrate: --" << option << " '" << s << "' is not ascending positive token counts (e.g. 512,2048)");
    v.push_back(x);
  }
  AERIE_USAGE_CHECK(!v.empty(), "aerie calibrate: --" << option << " is empty");
  return v;
}

/// Seconds of one call of f on every rank of `c` (the slowest rank's: one all-reduce max), the device synchronised
/// around the timed calls: after one untimed call, enough calls for about `min_seconds` (at least `iters`; the ranks
/// agree on the count, so that collectives inside f pair up), and the median of three such runs (a laptop's noise).
/// `c` is an MPI communicator (host buffers) over the ranks that run f, also where f's own collectives go through
/// NCCL: the agreement is a host float, which an NcclCommunicator refuses.
template <typename F>
double timed(MpiCommunicator& c, Device device, int iters, double min_seconds, F&& f) {
  auto sync = [&] {
    if (device == Device::CUDA) cuda::synchronize();
  };
  auto clock = [] { return std::chrono::steady_clock::now(); };
  auto agreed = [&](double x) {
    Tensor t = Tensor::from_vector<float>({static_cast<float>(x)}, {1});
    c.all_reduce_max(t);
    return static_cast<double>(t.to_float_vector()[0]);
  };
  sync();
  auto t0 = clock();
  f();
  sync();
  const double once = agreed(std::chrono::duration<double>(clock() - t0).count());
  const int n = static_cast<int>(std::clamp(min_seconds / std::max(once, 1e-6), static_cast<double>(iters), 1000.0));
  double runs[3];
  for (double& r : runs) {
    c.barrier();
    t0 = clock();
    for (int i = 0; i < n; ++i) f();
    sync();
    r = agreed(std::chrono::duration<double>(clock() - t0).count() / n);
  }
  std::sort(runs, runs + 3);
  return runs[1];
}

/// The modeled seconds of the collectives `tp` issued so far where it is a ModeledCommunicator (calibrate --model-tp:
/// the tp group's collectives move no data and take no time here), else 0.
double modeled_seconds(const Communicator& tp) {
  const auto* modeled = dynamic_cast<const ModeledCommunicator*>(&tp);
  return modeled ? modeled->seconds() : 0.0;
}

/// timed(c, ...) of f plus the modeled seconds of the collectives f issued on `tp`, per call (modeled_seconds).
template <typename F>
double timed_with_links(const Communicator& tp, MpiCommunicator& c, Device device, int iters, double min_seconds,
                        F&& f) {
  const double before = modeled_seconds(tp);
  int64_t calls = 0;
  const double s = timed(c, device, iters, min_seconds, [&] {
    ++calls;
    f();
  });
  return s + (modeled_seconds(tp) - before) / static_cast<double>(calls);
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab));
  return ids;
}

/// `cfg` cut to the layers `moe` says (true: an MoE layer), the rest of the model as it is.
TargetConfig truncated(const TargetConfig& cfg, const std::vector<bool>& moe) {
  TargetConfig t = cfg;
  t.num_hidden_layers = static_cast<int64_t>(moe.size());
  t.moe.layers = cfg.moe.n_routed_experts > 0 ? moe : std::vector<bool>{};
  return t;
}

/// aerie generate's decoding on `model`: opt.gen_batch sequences of opt.gen_prompt random prompt ids, each decoding
/// `new_tokens` greedily with no stop id, through model/sampling.h's BatchDecoder (the job's engine, continuous
/// batching); the seconds of the whole run, prefills included (`links`: the model's tp communicator, whose modeled
/// collectives count; timed_with_links).
double time_generation(TargetModel& model, const TargetConfig& cfg, const Communicator& links, MpiCommunicator& tp,
                       Device device, const CalibrateOptions& opt, int64_t new_tokens) {
  return timed_with_links(links, tp, device, 1, opt.min_seconds, [&] {
    BatchDecoder decoder(model, opt.gen_batch, {}, SamplingParams{});
    for (int64_t i = 0; i < opt.gen_batch; ++i)
      decoder.submit(i, random_ids(opt.gen_prompt, cfg.vocab_size, static_cast<uint32_t>(100 + i)), new_tokens,
                     SampleRng(static_cast<uint64_t>(i)));
    while (!decoder.idle()) decoder.step();
  });
}

/// The forward by layer kind: base and per-layer seconds at each of opt.tokens (see the file comment).
void measure_forward(const TargetConfig& cfg, ParallelGroups& groups, TargetDevice& dev, const CalibrateOptions& opt,
                     Calibration& cal) {
  int64_t n_moe = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) n_moe += cfg.moe.is_moe_layer(l) ? 1 : 0;
  const bool first_moe = cfg.moe.is_moe_layer(0);
  const int64_t n_first = first_moe ? n_moe : cfg.num_hidden_layers - n_moe;
  const bool two_kinds = n_moe > 0 && n_moe < cfg.num_hidden_layers;
  // One and three layers of the first kind, and one of it followed by two of the other: the differences span two
  // layers each (a small model's per-layer time is near its forwards' noise).
  std::vector<std::vector<bool>> shapes = {{first_moe}, {first_moe, first_moe, first_moe}};
  if (two_kinds) shapes.push_back({first_moe, !first_moe, !first_moe});
  std::vector<std::vector<double>> t(shapes.size());  // t[shape][token count]
  std::vector<double> gen(shapes.size()), gen1(shapes.size());  // the generation's seconds; of one new token
  for (size_t s = 0; s < shapes.size(); ++s) {
    TargetModelOptions o = dev.options;  // a cut without MoE layers has nothing to split by expert
    o.expert_parallel = o.expert_parallel && std::find(shapes[s].begin(), shapes[s].end(), true) != shapes[s].end();
    TargetModel model = TargetModel::random(truncated(cfg, shapes[s]), *dev.tp, o, 17);
    const int n = static_cast<int>(shapes[s].size());
    const std::vector<int> aux = {0, n / 2, n - 1};  // three captures, as extract's
    for (const int64_t T : opt.tokens) {
      const std::vector<int32_t> ids = random_ids(T, cfg.vocab_size, static_cast<uint32_t>(T));
      // With --tp-overlap the forward is two sequences of T/2 (its two micro-batches), as extract packs samples.
      std::vector<std::vector<int32_t>> halves;
      if (cal.tp_overlap) halves = {{ids.begin(), ids.begin() + T / 2}, {ids.begin() + T / 2, ids.end()}};
      t[s].push_back(timed_with_links(*dev.tp, *groups.tp, dev.options.device, opt.iters, opt.min_seconds, [&] {
        if (cal.tp_overlap)
          model.forward_batch(halves, {}, aux, TargetModel::Logits::None);
        else
          model.forward(ids, nullptr, aux, false);
      }));
    }
    gen[s] = time_generation(model, cfg, *dev.tp, *groups.tp, dev.options.device, opt, opt.gen_new);
    gen1[s] = time_generation(model, cfg, *dev.tp, *groups.tp, dev.options.device, opt, 1);  // the prefills, one step
  }
  LayerKindTimes first{first_moe ? "moe" : "dense", n_first, {opt.tokens, {}}};
  LayerKindTimes second{first_moe ? "dense" : "moe", cfg.num_hidden_layers - n_first, {opt.tokens, {}}};
  cal.base = {opt.tokens, {}};
  for (size_t i = 0; i < opt.tokens.size(); ++i) {
    const double per_layer = std::max(0.0, (t[1][i] - t[0][i]) / 2);
    first.curve.seconds.push_back(per_layer);
    cal.base.seconds.push_back(std::max(0.0, t[0][i] - per_layer));
    if (two_kinds) second.curve.seconds.push_back(std::max(0.0, (t[2][i] - t[0][i]) / 2));
  }
  cal.layers = {first};
  if (two_kinds) cal.layers.push_back(second);
  // The generation of the whole target: the cut's base and per-layer seconds, as the forward's.
  auto whole = [&](const std::vector<double>& t) {
    const double per_layer = std::max(0.0, (t[1] - t[0]) / 2);
    double s = std::max(0.0, t[0] - per_layer) + static_cast<double>(n_first) * per_layer;
    if (two_kinds) s += static_cast<double>(cfg.num_hidden_layers - n_first) * std::max(0.0, (t[2] - t[0]) / 2);
    return s;
  };
  cal.generate = {opt.gen_batch, opt.gen_prompt, opt.gen_new, whole(gen), std::min(whole(gen1), whole(gen))};
}

/// measure_forward; where the tp group is modeled (--model-tp), an aerie::Error of the model (a tp its shapes do not
/// divide, above all) comes back as an aerie::Error naming --model-tp beside its own message. Only the message
/// changes: the error stays a plain Error (main() ends every rank), as it may be this rank's alone (memory, the GPU);
/// UsageError and CollectiveError pass unchanged.
void measure_forward_named(const TargetConfig& cfg, ParallelGroups& groups, TargetDevice& dev,
                           const CalibrateOptions& opt, Calibration& cal) {
  try {
    measure_forward(cfg, groups, dev, opt, cal);
  } catch (const UsageError&) {
    throw;
  } catch (const CollectiveError&) {
    throw;
  } catch (const Error& e) {
    if (!cal.tp_modeled) throw;
    AERIE_THROW("aerie calibrate --model-tp " << cal.tp << ": " << e.what() << " (one rank of a tp group of " << cal.tp
                                              << " takes that share of every layer: where the message is of a tp the "
                                              << "shapes do not divide, a --model-tp the attention heads and the "
                                              << "experts' widths divide; --expert-parallel keeps the experts whole)");
  }
}

/// The draft's step over opt.train_batch (>= 2) samples of each opt.train_tokens length (a step of one sample at the
/// shortest length beside it gives the step's own cost), made ready as the job makes them, on every rank at
/// once, each its own data-parallel group (SelfCommunicator); with more than one rank also on rank 0 alone.
void measure_train(const TargetConfig& cfg, const TargetDevice& dev, const CalibrateOptions& opt, Calibration& cal) {
  const Device device = dev.options.device;
  const int64_t V = cfg.vocab_size, K = std::min<int64_t>(opt.draft_vocab, V), H = cfg.hidden_size;
  const int N = static_cast<int>(cfg.num_hidden_layers);  // a target of fewer than 3 layers has no default aux layers
  const DraftConfig dc = DraftConfig::from_target(cfg, K, N >= 3 ? default_aux_layers(N) : std::vector<int>{0, N / 2, N});
  const DraftVocab vocab = spread_draft_vocab(V, K);
  const std::vector<int64_t> selected = vocab.selected();
  const DType hidden_dtype = device == Device::CUDA ? DType::BF16 : DType::F32;
  // Uniform values in the hidden states' dtype: on the host (widened to F32 where host_f32), else on the device.
  auto random = [&](Shape shape, float scale, uint32_t seed, bool host_f32 = false) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(gen);
    const Tensor t = Tensor::from_vector(v, shape).to(hidden_dtype);
    return host_f32 ? t.to(DType::F32) : t.to_device(device);
  };
  const Tensor target_lm = random({V, H}, 0.035f, 1), embed = random({V, H}, 0.035f, 2);
  DraftWeights w = init_draft_weights(dc, target_lm.to_device(Device::CPU).to(DType::F32), selected, 3).to_device(device);
  AdamState adam = AdamState::zeros(dc, device);
  StepScratch scratch = StepScratch::zeros(dc, device, device == Device::CUDA ? DType::BF16 : DType::F32);
  SelfCommunicator self;
  cal.ttt_steps = opt.ttt_steps;
  cal.draft_vocab_size = K;
  cal.train_sample = {opt.train_tokens, {}};
  const size_t batch = static_cast<size_t>(opt.train_batch);  // >= 2 (calibrate's check)
  cal.train_batch = static_cast<int64_t>(batch);
  MpiCommunicator world(MPI_COMM_WORLD, false);  // the ranks' times: the slowest counts
  for (const int64_t T : opt.train_tokens) {
    const std::vector<int32_t> ids = random_ids(T, V, static_cast<uint32_t>(T) + 5);
    // The hidden states as the shard reader hands them to the step loop: on the host, F32 on the CPU, BF16 as a
    // shard stores them for a GPU run (train/trainer_run.cc).
    Tensor aux = random({T, 3 * H}, 1.7f, 6, true), z = random({T, H}, 1.7f, 7, true);
    if (device != Device::CPU) {
      aux = aux.to(hidden_dtype);
      z = z.to(hidden_dtype);
    }
    // A step's samples made ready as the step loop makes them (train/target_head.h make_step_samples): their target
    // distribution where W_lm lives (BF16 on a GPU, as a BF16 checkpoint's), their aux hidden states to the device.
    auto ready = [&](size_t n) {
      std::vector<HiddenSample> hs(n);
      for (HiddenSample& h : hs) {
        h.ids = ids;
        h.loss_mask.assign(static_cast<size_t>(T), 1);
        h.aux_hidden = aux;
        h.final_hidden = z;
      }
      return make_step_samples(std::move(hs), target_lm, selected, device);
    };
    // A step of n samples as the job runs it (n > 1: make_step_samples' batched path, one target-distribution call).
    std::vector<TTTSample> local;
    auto step = [&](size_t n) {
      local = ready(n);
      train_step(dc, w, adam, embed, local, vocab, opt.ttt_steps, 1e-5, 0.5, self, scratch);
    };
    const double B = static_cast<double>(batch);
    const double tb = timed(world, device, opt.iters, opt.min_seconds, [&] { step(batch); });
    // A step's own cost s (AdamW's update, the gradient's bookkeeping), paid once per step whatever its samples: with
    // t1 a step of one sample and tb one of B at the shortest length, tb = s + B p and t1 = s + p. Within [0, t1]:
    // on a busy machine the step of B can time below B steps of one.
    if (T == opt.train_tokens.front()) {
      const double t1 = timed(world, device, opt.iters, opt.min_seconds, [&] { step(1); });
      cal.train_step_seconds = std::clamp((B * t1 - tb) / (B - 1), 0.0, t1);
    }
    // Stored as a step of one sample costs (the plan's reading): the step's own cost and one B-th of the rest.
    const double s = cal.train_step_seconds;
    cal.train_sample.seconds.push_back(s + std::max(0.0, tb - s) / B);
    // Rank 0 alone, the others idle: a streaming run's trainers while its target ranks wait (ranks that share a
    // node's cores or memory bandwidth step faster alone).
    if (world.size() > 1) {
      if (cal.train_sample_alone.tokens.empty()) cal.train_sample_alone = {opt.train_tokens, {}};
      const double alone = timed(world, device, opt.iters, opt.min_seconds, [&] {
        if (world.rank() == 0) step(batch);
      });
      cal.train_sample_alone.seconds.push_back(s + std::max(0.0, alone - s) / B);
    }
  }
}

/// Random hidden states of T tokens, aux [T, 3H] and final [T, H], in `dtype` on the host, with ids and a mask.
struct RandomSample {
  Tensor aux, fin;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  RandomSample(int64_t T, int64_t H, int64_t vocab, DType dtype) : ids(random_ids(T, vocab, 12)), mask(T, 1) {
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    auto random = [&](int64_t cols) {
      std::vector<float> v(static_cast<size_t>(T * cols));
      for (auto& x : v) x = u(gen);
      return Tensor::from_vector(v, {T, cols}).to(dtype);
    };
    aux = random(3 * H);
    fin = random(H);
  }
};

ShardMeta test_meta(const TargetConfig& cfg) {
  ShardMeta meta;
  meta.target_model = "calibrate";
  meta.aux_layers = {0, 1, 2};
  meta.hidden_size = cfg.hidden_size;
  meta.num_hidden_layers = cfg.num_hidden_layers;
  return meta;
}

/// A test shard of calibrate in --work (and its .tmp), removed whatever happens: a full disk throws from the writer,
/// and SIGTERM / SIGINT (Ctrl-C, a Slurm time limit) are caught while it exists (StopSignals) and end the writing
/// loops through stop_check, so that nothing of it is left there.
struct TestShardFile {
  std::string path;
  bool on;
  StopSignals signals;
  TestShardFile(std::string p, bool o) : path(std::move(p)), on(o) {}
  ~TestShardFile() {
    if (!on) return;
    std::error_code ec;
    std::filesystem::remove(path, ec);
    std::filesystem::remove(path + ".tmp", ec);
  }
  /// Throws aerie::Error when a stop signal came (the file then goes with the unwinding).
  void stop_check() const {
    if (const int sig = StopSignals::received())
      throw Error("stopped by signal " + std::to_string(sig) + " while writing the test shard " + path +
                  " (removed); nothing was written to --output");
  }
};

/// Every tp group's leader writes opt.disk_bytes of bf16 hidden states as one shard into opt.work at once, synced
/// to the disk: the node's aggregate write rate.
void measure_disk(const TargetConfig& cfg, ParallelGroups& groups, const CalibrateOptions& opt, Calibration& cal) {
  const int64_t H = cfg.hidden_size, T = 2048;
  const int64_t per_sample = T * shard_bytes_per_token(H, false);
  const int64_t samples = std::max<int64_t>(1, opt.disk_bytes / per_sample);
  const bool leader = groups.map.tp_rank == 0;
  const std::string path = opt.work + "/calibrate-disk-" + std::to_string(getpid()) + "-" + std::to_string(groups.map.dp_rank) + ".h5";
  const RandomSample x(T, H, cfg.vocab_size, DType::BF16);
  const TestShardFile test_shard(path, leader);
  groups.world->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (leader) {
    ShardWriter writer(path, test_meta(cfg), std::vector<int64_t>(static_cast<size_t>(samples), T));
    for (int64_t s = 0; s < samples; ++s) {
      test_shard.stop_check();
      writer.add(s, x.ids, x.mask, x.aux, x.fin);
    }
    writer.close();
    // What a job's shard must survive: on the disk, not in the page cache only.
    if (std::FILE* f = std::fopen(path.c_str(), "rb+")) {
      fsync(fileno(f));
      std::fclose(f);
    }
  }
  Tensor s = Tensor::from_vector<float>(
      {static_cast<float>(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())}, {1});
  groups.world->all_reduce_max(s);
  cal.disk_test_bytes = samples * per_sample * groups.map.dp;
  cal.disk_write_bytes_per_s = static_cast<double>(cal.disk_test_bytes) / std::max(1e-9, double(s.to_float_vector()[0]));
}

/// The shard writer's work per sample (the rounding to bf16, the finite check, the HDF5 calls; into the page cache)
/// at 64 and 2048 tokens, with the hidden states as the forward hands them over (F32 on the CPU, BF16 from a GPU).
void measure_writer(const TargetConfig& cfg, ParallelGroups& groups, const TargetDevice& dev, const CalibrateOptions& opt,
                    Calibration& cal) {
  const DType dtype = dev.options.device == Device::CUDA ? DType::BF16 : DType::F32;
  cal.writer_sample = {{64, 2048}, {}};
  for (const int64_t T : cal.writer_sample.tokens) {
    const RandomSample x(T, cfg.hidden_size, cfg.vocab_size, dtype);
    const int64_t samples = T == 64 ? 256 : 16;
    const std::string path = opt.work + "/calibrate-writer-" + std::to_string(getpid()) + "-" + std::to_string(T) + ".h5";
    const TestShardFile test_shard(path, true);
    ShardWriter writer(path, test_meta(cfg), std::vector<int64_t>(static_cast<size_t>(samples), T));
    groups.world->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < samples; ++i) {
      test_shard.stop_check();
      writer.add(i, x.ids, x.mask, x.aux, x.fin);
    }
    Tensor s = Tensor::from_vector<float>(
        {static_cast<float>(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / samples)}, {1});
    groups.world->all_reduce_max(s);
    writer.close();
    std::filesystem::remove(path);
    cal.writer_sample.seconds.push_back(s.to_float_vector()[0]);
  }
}

/// extract's own work beside its forwards and its writer (Calibration::extract_run_seconds, extract_sample_seconds):
/// run_extract, extract's loop, of the one-layer cut (random weights) over random prepared files of 8 and 40 samples
/// of the shortest --tokens count per tp group (one shard each), three times each into --work, packed as extract
/// packs them on this device; what each run took beyond extract_compute_seconds for the cut (its forwards and
/// writer from this calibration) gives seconds per run (the intercept) and per sample (the slope), the medians.
void measure_extract(const TargetConfig& cfg, ParallelGroups& groups, TargetDevice& dev, const CalibrateOptions& opt,
                     Calibration& cal) {
  const bool first_moe = cfg.moe.is_moe_layer(0);
  TargetModelOptions o = dev.options;
  o.expert_parallel = o.expert_parallel && first_moe;
  TargetModel model = TargetModel::random(truncated(cfg, {first_moe}), *dev.tp, o, 17);
  const std::vector<int> aux = {0, 0, 0};
  const TargetForward forward = model.hidden_states_forward(aux);
  ExtractOptions eo;
  int pid = static_cast<int>(getpid());  // rank 0's names the test folder on every rank
  MPI_Bcast(&pid, 1, MPI_INT, 0, groups.world->handle());
  const std::string dir = opt.work + "/calibrate-extract-" + std::to_string(pid);
  eo.prepared = dir + "/prepared.h5";
  eo.output = dir + "/shards";
  eo.meta = test_meta(cfg);
  eo.vocab_size = cfg.vocab_size;
  if (dev.options.device == Device::CUDA || cal.tp_overlap)  // as extract packs samples (jobs/extract.cc)
    eo.forward_batch = model.hidden_states_forward_batch(aux);
  Calibration cut = cal;  // the one-layer cut's forwards, no overhead yet
  cut.layers = {LayerKindTimes{cal.layers.front().kind, 1, cal.layers.front().curve}};
  cut.extract_run_seconds = cut.extract_sample_seconds = 0;
  const bool rank0 = groups.map.world_rank == 0;
  struct Remove {  // the test files go whatever happens
    std::string dir;
    bool on;
    ~Remove() {
      std::error_code ec;
      if (on) std::filesystem::remove_all(dir, ec);
    }
  } remove_dir{dir, rank0};
  const int64_t T = opt.tokens.front(), dp = groups.map.dp;
  // What one run of per_group samples per tp group took beyond the arithmetic.
  auto residual = [&](int64_t per_group, int rep) {
    const int64_t n = per_group * dp;
    if (rank0) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      std::vector<std::vector<int32_t>> ids;
      for (int64_t i = 0; i < n; ++i) ids.push_back(random_ids(T, cfg.vocab_size, static_cast<uint32_t>(1000 * rep + i)));
      write_prepared_file(eo.prepared, ids);
    }
    groups.world->barrier();
    eo.samples_per_shard = per_group;
    ExtractStats stats;
    const double links = modeled_seconds(*dev.tp);
    {
      ScopedLogLevel quiet("warning");  // extract's own lines, a dozen per run, are not calibrate's
      stats = run_extract(eo, groups, forward);
    }
    stats.seconds += modeled_seconds(*dev.tp) - links;  // as the forward's curve counts them
    groups.world->barrier();  // every group's shard closed before rank 0 removes the folder
    Workload w;
    w.samples = n;
    w.mean_tokens = static_cast<double>(T);
    w.lengths.assign(static_cast<size_t>(n), T);
    w.world = groups.map.world_size, w.tp = groups.map.tp;
    w.batch_tokens = eo.forward_batch ? eo.batch_tokens : 0;
    return stats.seconds - extract_compute_seconds(cut, w);
  };
  constexpr int64_t kFew = 8, kMany = 40;
  std::vector<double> slope, intercept;
  for (int rep = 0; rep < 3; ++rep) {
    const double few = residual(kFew, rep), many = residual(kMany, rep);
    slope.push_back((many - few) / static_cast<double>(kMany - kFew));
    intercept.push_back(few - slope.back() * kFew);
  }
  std::sort(slope.begin(), slope.end());
  std::sort(intercept.begin(), intercept.end());
  cal.extract_sample_seconds = std::max(0.0, slope[1]);
  cal.extract_run_seconds = std::max(0.0, intercept[1]);
}

/// The tp group's all-reduce of [T, H] bf16 at the largest --tokens: its bus bandwidth (2 (n-1)/n bytes / s).
void measure_allreduce(const TargetConfig& cfg, ParallelGroups& groups, TargetDevice& dev, const CalibrateOptions& opt,
                       Calibration& cal) {
  const int n = dev.tp->size();
  if (n == 1) return;
  const int64_t T = opt.tokens.back(), H = cfg.hidden_size;
  Tensor x = Tensor::zeros({T, H}, dev.options.dtype, dev.options.device);
  const double s = timed(*groups.tp, dev.options.device, opt.iters, opt.min_seconds, [&] { dev.tp->all_reduce_sum(x); });
  const double bytes = static_cast<double>(T * H) * (dev.options.dtype == DType::BF16 ? 2 : 4);
  cal.allreduce_bus_bytes_per_s = 2.0 * (n - 1) / n * bytes / std::max(1e-9, s);
}

/// The streaming train's messages: world rank 0 sends one sample's hidden states (aux [T, 3H] and final [T, H] in
/// bf16, T the longest --train-tokens, at most 256 MiB) to the last world rank over MPI, as a replica leader sends
/// them to a trainer (host buffers). Needs 2 ranks; the others wait.
void measure_stream(const TargetConfig& cfg, MpiCommunicator& world, Device device, const CalibrateOptions& opt,
                    Calibration& cal) {
  const int n = world.size(), rank = world.rank();
  if (n < 2) return;
  const int64_t bytes = std::min<int64_t>(opt.train_tokens.back() * 8 * cfg.hidden_size, int64_t{256} << 20);
  std::vector<char> buf(static_cast<size_t>(bytes), 1);
  const double s = timed(world, device, opt.iters, opt.min_seconds, [&] {
    if (rank == 0)
      check_mpi(MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, n - 1, 7290, MPI_COMM_WORLD), "MPI_Send");
    else if (rank == n - 1)
      check_mpi(MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 7290, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Recv");
  });
  cal.stream_bytes_per_s = static_cast<double>(bytes) / std::max(1e-9, s);
}

void print_calibration(const Calibration& c) {
  std::printf("aerie calibrate: %s on %s, tp %d%s%s, %d rank(s)\n", c.model.c_str(), c.device.c_str(), c.tp,
              c.tp_modeled ? " (one rank of each group ran here, --model-tp)" : "",
              c.expert_parallel == 1 ? ", --expert-parallel" : "", c.world);
  std::printf("  forward of the whole target (%zu layer kinds%s):\n", c.layers.size(),
              c.tp_overlap ? "; --tp-overlap: two micro-batches of T/2" : "");
  for (size_t i = 0; i < c.base.tokens.size(); ++i) {
    const double T = static_cast<double>(c.base.tokens[i]);
    std::printf("    %6lld tokens: %.4f s (%.0f tokens/s per tp group; base %.4f s", static_cast<long long>(T),
                c.forward_seconds(T), T / std::max(1e-12, c.forward_seconds(T)), c.base.seconds[i]);
    for (const LayerKindTimes& l : c.layers)
      std::printf(", %lld x %s %.5f s", static_cast<long long>(l.count), l.kind.c_str(), l.curve.seconds[i]);
    std::printf(")\n");
  }
  std::printf("  draft step, as a step of one sample costs (measured in steps of %lld), %d TTT steps, draft vocabulary "
              "%lld:",
              static_cast<long long>(c.train_batch), c.ttt_steps, static_cast<long long>(c.draft_vocab_size));
  for (size_t i = 0; i < c.train_sample.tokens.size(); ++i)
    std::printf(" %lld tokens %.4f s;", static_cast<long long>(c.train_sample.tokens[i]), c.train_sample.seconds[i]);
  std::printf("\n  shards written: %.1f MB/s (%.1f MB by every tp group at once); the writer's work per sample: %.2f ms "
              "at 64 tokens, %.2f ms at 2048\n",
              c.disk_write_bytes_per_s / 1e6, static_cast<double>(c.disk_test_bytes) / 1e6,
              c.writer_sample.seconds.at(0) * 1e3, c.writer_sample.seconds.at(1) * 1e3);
  std::printf("  extract's own work beside its forwards and writer: %.3f s a run, %.3f ms a sample (one tp group's)\n",
              c.extract_run_seconds, c.extract_sample_seconds * 1e3);
  if (c.tp_modeled)
    std::printf("  tp all-reduce: modeled, not measured (--model-tp %d: one rank of the group ran here): %.2f GB/s bus "
                "bandwidth, %.1f us each, in the forward and generate times above\n",
                c.tp, c.allreduce_bus_bytes_per_s / 1e9, c.allreduce_latency_s * 1e6);
  else if (c.tp > 1)
    std::printf("  tp all-reduce: %.2f GB/s bus bandwidth\n", c.allreduce_bus_bytes_per_s / 1e9);
  std::printf("  generate: %lld sequences of %lld prompt + %lld new tokens in %.3f s (%.0f new tokens/s per tp group)\n",
              static_cast<long long>(c.generate.batch), static_cast<long long>(c.generate.prompt_tokens),
              static_cast<long long>(c.generate.new_tokens), c.generate.seconds,
              static_cast<double>(c.generate.batch * c.generate.new_tokens) / std::max(1e-12, c.generate.seconds));
  std::printf("  a draft step's own cost (once per step, whatever its samples): %.4f s\n", c.train_step_seconds);
  if (!c.train_sample_alone.tokens.empty()) {
    std::printf("  draft step on one rank alone:");
    for (size_t i = 0; i < c.train_sample_alone.tokens.size(); ++i)
      std::printf(" %lld tokens %.4f s;", static_cast<long long>(c.train_sample_alone.tokens[i]),
                  c.train_sample_alone.seconds[i]);
    std::printf("\n");
  }
  if (c.stream_bytes_per_s > 0)
    std::printf("  streaming messages, rank 0 to rank %d: %.2f GB/s\n", c.world - 1, c.stream_bytes_per_s / 1e9);
  std::printf("  CPU cores per rank: %d (the fewest any rank could run on)\n", c.cpu_cores);
}

}  // namespace

/// --output's folder and the test shards' (--work, default that folder; sets opt.work): each exists and takes a
/// file, and the work folder has room for `groups` test shards of opt.disk_bytes, all checked before minutes of
/// measuring (a full disk failed only at the disk measurement, the last). Throws aerie::UsageError naming the option.
void check_output_folders(const po::variables_map& vm, const std::string& output, int groups, CalibrateOptions& opt) {
  AERIE_USAGE_CHECK(!output.empty() && !std::filesystem::is_directory(output),
                    "aerie calibrate: --output '" << output << "' must name a file (calibration.json), not a folder");
  const std::filesystem::path out_dir = std::filesystem::absolute(output).parent_path();
  AERIE_USAGE_CHECK(std::filesystem::is_directory(out_dir),
                    "aerie calibrate: --output " << output << ": its folder " << out_dir.string() << " does not exist");
  opt.work = vm["work"].as<std::string>().empty() ? out_dir.string() : vm["work"].as<std::string>();
  AERIE_USAGE_CHECK(std::filesystem::is_directory(opt.work),
                    "aerie calibrate: " << opt.work << " (--work, or --output's folder) is not a folder");
  for (const std::string& dir : {out_dir.string(), opt.work}) {
    const std::string probe = dir + "/.aerie-calibrate-" + std::to_string(getpid());
    std::ofstream f(probe);
    AERIE_USAGE_CHECK(f.good(), "aerie calibrate: cannot write into " << dir << " ("
                                    << (dir != opt.work                ? "--output's folder"
                                        : vm["work"].as<std::string>().empty() ? "--output's folder, where the test shards go "
                                                                                 "too without --work"
                                                                               : "--work, the test shards' folder")
                                    << ")");
    f.close();
    std::filesystem::remove(probe);
  }
  // Every tp group's leader writes --disk-mib there at once.
  std::error_code space_ec;
  const std::filesystem::space_info room = std::filesystem::space(opt.work, space_ec);
  const uintmax_t need = static_cast<uintmax_t>(opt.disk_bytes) * static_cast<uintmax_t>(groups) * 11 / 10;
  AERIE_USAGE_CHECK(space_ec || room.available >= need,
                    "aerie calibrate: " << opt.work << " has " << format_bytes(static_cast<double>(room.available))
                                        << " free, the disk measurement writes " << groups << " x --disk-mib "
                                        << vm["disk-mib"].as<int64_t>() << " MiB there: pass a smaller --disk-mib, or "
                                        << "--work on the disk the shards will go to");
}

namespace {

/// calibrate --model-tp: the tp group that the forward is planned for, played by one rank, its collectives modeled.
struct ModeledLinks {
  int ranks = 0;               // 0: off (the tp group's collectives run and are measured)
  double bus_bytes_per_s = 0;  // an all-reduce's bus bandwidth (nccl-tests' busbw) on the planned node
  double latency_s = 0;        // each collective's fixed cost there
};

/// Adds --model-tp, --model-tp-bus-gbps (GB/s) and --model-tp-latency-us (microseconds) to `desc`.
void add_model_tp_options(po::options_description& desc) {
  desc.add_options()(
      "model-tp", po::value<int>()->default_value(0),
      "for a node this one is not: each rank runs rank 0 of a tp group of N ranks (its share of the target) and the "
      "group's all-reduces are modeled, not run, at --model-tp-bus-gbps and --model-tp-latency-us (2 to 64; --tp 1)")(
      "model-tp-bus-gbps", po::value<double>()->default_value(0),
      "with --model-tp: the planned node's all-reduce bus bandwidth, GB/s (nccl-tests' busbw of all_reduce_perf at "
      "the forward's sizes)")(
      "model-tp-latency-us", po::value<double>()->default_value(-1),
      "with --model-tp: the planned node's cost of one small all-reduce, microseconds (nccl-tests' time at 8 KB): "
      "a decoding step's all-reduces are this");
}

/// The --model-tp options of `vm`, checked; tp_option is --tp's value (0: the world size). Throws aerie::UsageError.
ModeledLinks modeled_links(const po::variables_map& vm, int tp_option) {
  ModeledLinks m;
  m.ranks = vm["model-tp"].as<int>();
  const double gbps = vm["model-tp-bus-gbps"].as<double>(), us = vm["model-tp-latency-us"].as<double>();
  if (m.ranks == 0) {
    AERIE_USAGE_CHECK(gbps == 0 && us == -1, "aerie calibrate: --model-tp-bus-gbps and --model-tp-latency-us go with "
                                             "--model-tp N (the tp group whose all-reduces they model)");
    return m;
  }
  AERIE_USAGE_CHECK(m.ranks >= 2 && m.ranks <= 64, "aerie calibrate: --model-tp " << m.ranks << " is not 2 to 64");
  AERIE_USAGE_CHECK(tp_option <= 1, "aerie calibrate: --model-tp runs one rank of each tp group; it takes --tp 1 "
                                    "(or no --tp), not --tp " << tp_option);
  AERIE_USAGE_CHECK(!vm["tp-overlap"].as<bool>(), "aerie calibrate: --tp-overlap with --model-tp: a modeled group's "
                                                  "all-reduces cannot overlap compute (calibrate on the node itself)");
  AERIE_USAGE_CHECK(!vm["model-tp-bus-gbps"].defaulted() && !vm["model-tp-latency-us"].defaulted(),
                    "aerie calibrate: --model-tp needs --model-tp-bus-gbps (> 0, GB/s) and --model-tp-latency-us "
                    "(>= 0, microseconds): the planned node's all-reduce, as nccl-tests' all_reduce_perf reports it "
                    "there (docs/time-plan.md has typical values)");
  // Ranges that catch a unit slip (bytes/s for GB/s, seconds for microseconds): no link moves 10 TB/s, and one
  // all-reduce that takes 0.1 s is a network's failure, not its latency.
  AERIE_USAGE_CHECK(std::isfinite(gbps) && gbps > 0 && gbps <= 10000,
                    "aerie calibrate: --model-tp-bus-gbps " << gbps << " is not a bus bandwidth in GB/s (above 0, at "
                                                            "most 10000: PCIe Gen5 nodes 35-45, NVLink ones 450-800)");
  AERIE_USAGE_CHECK(std::isfinite(us) && (us == 0 || (us >= 0.5 && us <= 100000)),
                    "aerie calibrate: --model-tp-latency-us " << us << " is not a latency in microseconds (0, or 0.5 "
                                                              "to 100000; an all-reduce of a few KB takes 10-50, so a "
                                                              "value below 0.5 is likely seconds)");
  m.bus_bytes_per_s = gbps * 1e9;
  m.latency_s = us * 1e-6;
  return m;
}

}  // namespace

int calibrate(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie calibrate: measure this node for aerie plan --calibration");
  desc.add_options()("model", po::value<std::string>()->required(),
                     "target model directory (config.json only: the weights are random, in its formats)")(
      "output", po::value<std::string>()->required(), "calibration.json to write")(
      "tp", po::value<int>()->default_value(0), "tensor-parallel ranks of the target's forward (0: the world size)")(
      "tokens", po::value<std::string>()->default_value(""),
      "token counts of the forward (default 512,2048,8192 on a GPU, 128,512 on the CPU)")(
      "train-tokens", po::value<std::string>()->default_value(""),
      "sample lengths of the draft's step (default 512,2048,4096 on a GPU, 128,512 on the CPU)")(
      "ttt-steps", po::value<int>()->default_value(7), "TTT steps of the draft's step (train --ttt-steps)")(
      "train-batch-size", po::value<int64_t>()->default_value(8),
      "samples of the draft's measured step, made ready at once as train makes them (train --batch-size; 2 or more)")(
      "gen-batch-size", po::value<int64_t>()->default_value(16), "generate --batch-size of the generation measured")(
      "gen-prompt-tokens", po::value<int64_t>()->default_value(0),
      "prompt tokens of each generated sequence (default 512 on a GPU, 64 on the CPU)")(
      "gen-new-tokens", po::value<int64_t>()->default_value(0),
      "new tokens each sequence decodes (default 256 on a GPU, 32 on the CPU)")(
      "draft-vocab-size", po::value<int64_t>()->default_value(32000),
      "the draft vocabulary of the draft's step (vocab --draft-vocab-size; at most the target's vocabulary): its "
      "lm_head and loss are a large share of the step")(
      "iters", po::value<int>()->default_value(3), "timed repetitions of each measurement at least (after one untimed)")(
      "min-time", po::value<double>()->default_value(0.3, "0.3"),
      "seconds each measurement repeats for at least (the median of three such runs is kept)")(
      "disk-mib", po::value<int64_t>()->default_value(256), "MiB each tp group's leader writes as a test shard")(
      "work", po::value<std::string>()->default_value(""),
      "folder for the test shards: the disk the shards will go to (default: --output's folder)");
  add_target_device_options(desc);
  add_model_tp_options(desc);
  desc.add_options()("tp-overlap", po::bool_switch(),
                     "at --tp 2 or more: measure the forward as extract --tp-overlap runs it, each --tokens count as "
                     "two sequences of T/2 whose all-reduces run while the other computes (recorded; the plan then "
                     "reads it for jobs run with --tp-overlap)");
  po::variables_map vm;
  if (!parse_options("calibrate", args, desc, vm)) return 0;
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  AERIE_USAGE_CHECK(vm["tp"].as<int>() >= 0, "aerie calibrate: --tp " << vm["tp"].as<int>() << " is negative");
  const ModeledLinks links = modeled_links(vm, vm["tp"].as<int>());
  const int tp = links.ranks > 0 ? 1 : vm["tp"].as<int>() > 0 ? vm["tp"].as<int>() : world;
  AERIE_USAGE_CHECK(world % tp == 0, "aerie calibrate: " << world << " ranks do not split into tp groups of " << tp);
  const std::string model_dir = vm["model"].as<std::string>(), output = vm["output"].as<std::string>();
  CalibrateOptions opt;
  opt.iters = vm["iters"].as<int>();
  opt.ttt_steps = vm["ttt-steps"].as<int>();
  opt.train_batch = vm["train-batch-size"].as<int64_t>();
  AERIE_USAGE_CHECK(opt.train_batch >= 2 && opt.train_batch <= 4096,
                    "aerie calibrate: --train-batch-size " << opt.train_batch << " is not 2 to 4096 (a step of one "
                                                           << "sample is timed beside it for the step's own cost)");
  opt.draft_vocab = vm["draft-vocab-size"].as<int64_t>();
  opt.gen_batch = vm["gen-batch-size"].as<int64_t>();
  AERIE_USAGE_CHECK(opt.gen_batch >= 1 && opt.gen_batch <= 4096,
                    "aerie calibrate: --gen-batch-size " << opt.gen_batch << " is not 1 to 4096");
  AERIE_USAGE_CHECK(vm["gen-prompt-tokens"].as<int64_t>() >= 0,
                    "aerie calibrate: --gen-prompt-tokens " << vm["gen-prompt-tokens"].as<int64_t>() << " is negative");
  AERIE_USAGE_CHECK(vm["gen-new-tokens"].as<int64_t>() >= 0 && vm["gen-new-tokens"].as<int64_t>() != 1,
                    "aerie calibrate: --gen-new-tokens " << vm["gen-new-tokens"].as<int64_t>()
                                                         << " must be 0 (the default) or >= 2 (a run of one new token is "
                                                            "timed beside it)");
  AERIE_USAGE_CHECK(opt.draft_vocab >= 2, "aerie calibrate: --draft-vocab-size must be >= 2 (vocab's own limit)");
  opt.min_seconds = vm["min-time"].as<double>();
  AERIE_USAGE_CHECK(std::isfinite(opt.min_seconds) && opt.min_seconds >= 0 && opt.min_seconds <= 60,
                    "aerie calibrate: --min-time must be a number of seconds in [0, 60] (each measurement repeats "
                    "its call for about this long), got " << opt.min_seconds);
  AERIE_USAGE_CHECK(opt.iters >= 1 && opt.ttt_steps >= 1, "aerie calibrate: --iters and --ttt-steps must be >= 1");
  AERIE_USAGE_CHECK(vm["disk-mib"].as<int64_t>() >= 1 && vm["disk-mib"].as<int64_t>() <= 65536,
                    "aerie calibrate: --disk-mib " << vm["disk-mib"].as<int64_t>() << " is not 1 to 65536 (MiB per group)");
  opt.disk_bytes = vm["disk-mib"].as<int64_t>() << 20;
  check_output_folders(vm, output, world / tp, opt);
  const TargetConfig cfg = load_model_option("calibrate", "model", model_dir);

  ParallelGroups groups = ParallelGroups::create(tp);
  TargetDevice dev = resolve_target_device(vm, groups, "calibrate");
  std::unique_ptr<ModeledCommunicator> modeled;  // --model-tp: the target's tp communicator
  if (links.ranks > 0) {
    modeled = std::make_unique<ModeledCommunicator>(links.ranks, 0, links.bus_bytes_per_s, links.latency_s);
    dev.tp = modeled.get();
  }
  const bool gpu = dev.options.device == Device::CUDA;
  opt.tokens = parse_counts(vm["tokens"].as<std::string>().empty() ? (gpu ? "512,2048,8192" : "128,512")
                                                                   : vm["tokens"].as<std::string>(), "tokens");
  opt.train_tokens = parse_counts(vm["train-tokens"].as<std::string>().empty() ? (gpu ? "512,2048,4096" : "128,512")
                                                                               : vm["train-tokens"].as<std::string>(),
                                  "train-tokens");
  opt.gen_prompt = vm["gen-prompt-tokens"].as<int64_t>() > 0 ? vm["gen-prompt-tokens"].as<int64_t>() : (gpu ? 512 : 64);
  opt.gen_new = vm["gen-new-tokens"].as<int64_t>() > 0 ? vm["gen-new-tokens"].as<int64_t>() : (gpu ? 256 : 32);
  const int64_t longest = std::max({opt.tokens.back(), opt.train_tokens.back(), opt.gen_prompt + opt.gen_new});
  AERIE_USAGE_CHECK(cfg.max_position_embeddings <= 0 || longest <= cfg.max_position_embeddings,
                    "aerie calibrate: --tokens / --train-tokens / --gen-prompt-tokens + --gen-new-tokens up to "
                        << longest << " tokens, past " << model_dir
                                                                       << "'s max_position_embeddings "
                                                                       << cfg.max_position_embeddings);
  Calibration cal;
  cal.device = gpu ? cuda::current_device_name() : "cpu";
  cal.model = model_dir + "/config.json";
  cal.world = world;
  cal.tp = links.ranks > 0 ? links.ranks : tp;
  cal.tp_modeled = links.ranks > 0;
  if (cal.tp_modeled) {
    cal.allreduce_bus_bytes_per_s = links.bus_bytes_per_s;
    cal.allreduce_latency_s = links.latency_s;
  }
  cal.hidden_size = cfg.hidden_size;
  cal.target = calibration_target(cfg);
  cal.cpu_cores = cpu_cores_allowed();
  MPI_Allreduce(MPI_IN_PLACE, &cal.cpu_cores, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  cal.tp_overlap = dev.options.tp_overlap && tp > 1 && opt.tokens.front() >= 2;
  cal.expert_parallel = dev.options.expert_parallel ? 1 : 0;
  const bool rank0 = groups.map.world_rank == 0;
  if (rank0 && dev.options.tp_overlap && !cal.tp_overlap)
    AERIE_LOG(warning) << "calibrate: --tp-overlap does nothing at tp 1 or with a --tokens count below 2: the "
                       << "forward is measured without it";
  // The default past a small target's vocabulary is capped as vocab caps its own default: said of a given value only.
  if (rank0 && opt.draft_vocab > cfg.vocab_size && !vm["draft-vocab-size"].defaulted())
    AERIE_LOG(warning) << "calibrate: --draft-vocab-size " << opt.draft_vocab << " is past the target's vocabulary of "
                       << cfg.vocab_size << ": the draft's step is measured at " << cfg.vocab_size
                       << " (vocab caps it alike)";
  if (rank0 && vm["tp"].as<int>() == 0 && tp > 1)
    AERIE_LOG(info) << "calibrate: the forward at tp " << tp << " (the world size; extract and generate default to "
                    << "--tp 1): plan the jobs at the --tp they will run, and calibrate at that tp";
  auto step = [&](const char* what, auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    if (rank0)
      AERIE_LOG(info) << "calibrate: " << what << " measured in "
                      << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  };
  step("the forward by layer kind", [&] { measure_forward_named(cfg, groups, dev, opt, cal); });
  step("the draft's step", [&] { measure_train(cfg, dev, opt, cal); });
  step("the disk", [&] { measure_disk(cfg, groups, opt, cal); });
  step("the shard writer", [&] { measure_writer(cfg, groups, dev, opt, cal); });
  step("extract's own work", [&] { measure_extract(cfg, groups, dev, opt, cal); });
  if (tp > 1) step("the tp all-reduce", [&] { measure_allreduce(cfg, groups, dev, opt, cal); });
  if (world > 1) step("the streaming messages", [&] { measure_stream(cfg, *groups.world, dev.options.device, opt, cal); });
  if (rank0) {
    const std::string tmp = output + ".tmp";
    {
      std::ofstream f(tmp);
      f << to_json(cal).dump(2) << "\n";
      AERIE_CHECK(f.good(), "calibrate: cannot write " << tmp);
    }
    std::filesystem::rename(tmp, output);
    print_calibration(cal);
    std::printf("wrote %s (aerie plan --calibration %s ...)\n", output.c_str(), output.c_str());
  }
  return 0;
}

}  // namespace aerie::jobs
