// run_extract: shards hold exactly the forward's outputs (bf16-rounded), chunks are skipped on rerun,
// stale .tmp files are removed, shards of another run are refused; the real stories260K target matches
// TargetModel::forward; non-finite hidden states are an error naming the sample, or skipped and counted
// (skip_nonfinite); under mpirun (tests/mpi/extract.cmake) several groups and tp=2 give the same shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <thread>

#include "comm/communicator.h"
#include "data/extract.h"
#include "data/shard.h"
#include "io/h5.h"
#include "model/target.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

struct Prepared {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<uint8_t>> mask;
};

// Deterministic samples of lengths 3..3+len_spread-1 with ids in [0, vocab).
Prepared make_prepared(int64_t n, int64_t vocab, int64_t len_spread = 9) {
  Prepared p;
  uint64_t x = 12345;
  auto next = [&] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int64_t i = 0; i < n; ++i) {
    int64_t T = 3 + static_cast<int64_t>(next() % static_cast<uint64_t>(len_spread));
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    for (int64_t t = 0; t < T; ++t) {
      ids.push_back(static_cast<int32_t>(next() % static_cast<uint64_t>(vocab)));
      mask.push_back(static_cast<uint8_t>(t >= T / 2));
    }
    p.ids.push_back(ids);
    p.mask.push_back(mask);
  }
  return p;
}

// Writes a prepared file ("aerie.prepared" v1, docs/formats.md) directly, without the prepare job.
void write_prepared(const std::string& path, const Prepared& p) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets{0};
  for (size_t i = 0; i < p.ids.size(); ++i) {
    ids.insert(ids.end(), p.ids[i].begin(), p.ids[i].end());
    mask.insert(mask.end(), p.mask[i].begin(), p.mask[i].end());
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  h5::File f = h5::File::create(path);
  const int64_t T = static_cast<int64_t>(ids.size()), N = static_cast<int64_t>(p.ids.size());
  f.write_dataset("input_ids", Tensor::from_vector(ids, {T}));
  f.write_dataset("loss_mask", Tensor::from_vector(mask, {T}));
  f.write_dataset("sample_offsets", Tensor::from_vector(offsets, {N + 1}));
  f.set_string_attr("format", "aerie.prepared");
  f.set_int_attr("format_version", 1);
  f.close();
}

// A stand-in target: values that depend on the token, its position and the column, not bf16-exact.
constexpr int64_t kFakeH = 4;
void fake_forward(const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
  const int64_t T = static_cast<int64_t>(ids.size()), H = kFakeH;
  aux = Tensor::empty({T, 3 * H}, DType::F32);
  fin = Tensor::empty({T, H}, DType::F32);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < 3 * H; ++j)
      aux.data<float>()[t * 3 * H + j] = std::sin(0.1f * static_cast<float>(ids[t]) + 0.013f * t + j) * (1 + j);
    for (int64_t j = 0; j < H; ++j)
      fin.data<float>()[t * H + j] = std::cos(0.1f * static_cast<float>(ids[t]) - 0.017f * t + j);
  }
}

ExtractOptions fake_options(const std::string& dir, int64_t samples_per_shard) {
  ExtractOptions o;
  o.prepared = dir + "/prepared.h5";
  o.output = dir + "/shards";
  o.samples_per_shard = samples_per_shard;
  o.meta.target_model = "fake";
  o.meta.aux_layers = {1, 2, 3};
  o.meta.hidden_size = kFakeH;
  o.meta.num_hidden_layers = 4;
  return o;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> rounded(const Tensor& t) {
  std::vector<float> v = t.to_float_vector();
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Every sample of the prepared data is in the shards, in order, with the forward's values in bf16.
void expect_shards_hold(const std::string& shard_dir, const Prepared& p, int64_t samples_per_shard,
                        const TargetForward& forward) {
  auto shards = list_shards(shard_dir);
  const int64_t N = static_cast<int64_t>(p.ids.size());
  ASSERT_EQ(static_cast<int64_t>(shards.size()), (N + samples_per_shard - 1) / samples_per_shard);
  int64_t next = 0;
  for (size_t c = 0; c < shards.size(); ++c) {
    EXPECT_EQ(fs::path(shards[c]).filename().string(), shard_file_name(static_cast<int64_t>(c)));
    ShardReader r(shards[c]);
    EXPECT_EQ(r.info().chunk, static_cast<int64_t>(c));
    for (int64_t i = 0; i < r.num_samples(); ++i, ++next) {
      HiddenSample s = r.read(i);
      ASSERT_EQ(s.sample_index, next);
      EXPECT_EQ(s.ids, p.ids[next]);
      EXPECT_EQ(s.loss_mask, p.mask[next]);
      Tensor aux, fin;
      forward(s.ids, aux, fin);
      // Same forward, same inputs: the stored values are exactly the bf16 rounding of its output.
      EXPECT_EQ(s.aux_hidden.to_float_vector(), rounded(aux)) << shards[c] << " sample " << i;
      EXPECT_EQ(s.final_hidden.to_float_vector(), rounded(fin)) << shards[c] << " sample " << i;
    }
  }
  EXPECT_EQ(next, N);
}

TEST(Extract, ShardsHoldEverySampleAndRerunSkipsThem) {
  const std::string dir = testing::scratch_dir("extract_fake");
  Prepared p = make_prepared(10, 100);
  write_prepared(dir + "/prepared.h5", p);
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  ExtractOptions o = fake_options(dir, 4);

  ExtractStats st = run_extract(o, g, fake_forward);
  EXPECT_EQ(st.chunks, 3);
  EXPECT_EQ(st.chunks_done, 3);
  EXPECT_EQ(st.chunks_skipped, 0);
  EXPECT_EQ(st.samples, 10);
  expect_shards_hold(o.output, p, 4, fake_forward);
  ShardReader last(o.output + "/shard-00002.h5");
  EXPECT_EQ(last.num_samples(), 2);  // 10 = 4 + 4 + 2
  EXPECT_EQ(last.info().aux_layers, (std::vector<int>{1, 2, 3}));
  const std::string shard1 = read_bytes(o.output + "/shard-00001.h5");

  // Rerun: nothing to do.
  st = run_extract(o, g, fake_forward);
  EXPECT_EQ(st.chunks_skipped, 3);
  EXPECT_EQ(st.chunks_done, 0);

  // A killed run: shard 1 missing, its .tmp half written. The rerun redoes exactly shard 1, byte for byte.
  fs::remove(o.output + "/shard-00001.h5");
  std::ofstream(o.output + "/shard-00001.h5.tmp") << "half a shard";
  std::ofstream(o.output + "/shard-00007.h5.tmp") << "stale";
  st = run_extract(o, g, fake_forward);
  EXPECT_EQ(st.chunks_skipped, 2);
  EXPECT_EQ(st.chunks_done, 1);
  EXPECT_EQ(st.samples, 4);
  EXPECT_FALSE(fs::exists(o.output + "/shard-00001.h5.tmp"));
  EXPECT_FALSE(fs::exists(o.output + "/shard-00007.h5.tmp"));
  EXPECT_TRUE(read_bytes(o.output + "/shard-00001.h5") == shard1);
}

// Issue 17, case 8: the shards' size is estimated from the prepared file (tokens x (8 H + 5) bytes, plus
// per-sample and per-shard overhead), less what the folder's complete shards hold, and a shortfall of free
// space is an error naming both sizes, the folder and the override.
TEST(Extract, ShardSpaceEstimateAndCheck) {
  const std::string dir = testing::scratch_dir("extract_space");
  Prepared p = make_prepared(10, 100);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o = fake_options(dir, 4);
  int64_t tokens = 0;
  for (const auto& ids : p.ids) tokens += static_cast<int64_t>(ids.size());
  ShardSpace s = estimate_shard_space(o, 4096);
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_EQ(s.shards, 3);
  EXPECT_EQ(s.bytes_total, tokens * (8 * 4096 + 5) + 16 * 10 + 3 * 65536);
  EXPECT_EQ(s.bytes_existing, 0);
  EXPECT_EQ(s.bytes_needed, s.bytes_total);
  EXPECT_GT(s.bytes_available, 0);
  EXPECT_NO_THROW(check_shard_space(s));
  ShardSpace full = s;
  full.bytes_available = s.bytes_needed - 1;
  try {
    check_shard_space(full);
    ADD_FAILURE() << "a shortfall of free space was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the shards need about"), std::string::npos) << m;
    EXPECT_NE(m.find(full.where + " has"), std::string::npos) << m;
    EXPECT_NE(m.find("--no-space-check"), std::string::npos) << m;
  }
  // DeepSeek-V3's H = 7168: 57,349 bytes per token (56 KiB), 42 TB for 500,000 samples of 1,500 tokens.
  EXPECT_EQ(8 * 7168 + 5, 57349);
  // --storage fp8: codes and four fp32 scales per token (4 H + 21 bytes), about half.
  ExtractOptions o8 = o;
  o8.meta.fp8 = true;
  EXPECT_EQ(estimate_shard_space(o8, 4096).bytes_per_token, 4 * 4096 + 21);
  EXPECT_EQ(estimate_shard_space(o8, 4096).bytes_total, tokens * (4 * 4096 + 21) + 16 * 10 + 3 * 65536);
  // Shards already written count as done.
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  run_extract(o, g, fake_forward);
  s = estimate_shard_space(o, 4);
  EXPECT_GT(s.bytes_existing, 0);
  EXPECT_EQ(s.bytes_needed, std::max<int64_t>(0, s.bytes_total - s.bytes_existing));
}

// A training run folder given as --output is refused before anything is written (new-user trial).
TEST(Extract, RefusesARunFolderAsOutput) {
  const std::string dir = testing::scratch_dir("extract_run_folder");
  Prepared p = make_prepared(2, 100);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o = fake_options(dir, 4);
  fs::create_directories(o.output + "/checkpoints");
  try {
    check_extract_inputs(o);
    ADD_FAILURE() << "a run folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a training run"), std::string::npos) << e.what();
  }
}

TEST(Extract, RefusesShardsOfAnotherRun) {
  const std::string dir = testing::scratch_dir("extract_other_run");
  Prepared p = make_prepared(6, 100);
  write_prepared(dir + "/prepared.h5", p);
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  run_extract(fake_options(dir, 3), g, fake_forward);
  // Same folder, another chunk size: shard-00000.h5 holds 3 samples, this run wants 2.
  try {
    run_extract(fake_options(dir, 2), g, fake_forward);
    FAIL() << "mixed shards of two runs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard-00000.h5"), std::string::npos) << e.what();
  }
  ExtractOptions o = fake_options(dir, 3);
  o.meta.aux_layers = {0, 1, 2};
  EXPECT_THROW(run_extract(o, g, fake_forward), Error);
}

using testing::error_of;  // tests/test_util.h

// Issue 17, case 3: shards record the target's and the prepared file's fingerprints; a rerun into a folder
// of other provenance (another model of the same shape, another config, another prepared file of the same
// shape) is refused naming what differs, and an older shard without provenance is checked by its tokens.
TEST(Extract, RerunRefusesShardsOfOtherProvenance) {
  const std::string dir = testing::scratch_dir("extract_provenance");
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  Prepared p = make_prepared(6, 100);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o = fake_options(dir, 2);
  o.meta.target.config_sha256 = std::string(64, 'c');
  o.meta.target.weights_sha256 = std::string(64, 'a');
  run_extract(o, g, fake_forward);
  ShardReader r(o.output + "/shard-00001.h5");
  EXPECT_TRUE(r.info().has_provenance());
  EXPECT_EQ(r.info().target.config_sha256, o.meta.target.config_sha256);
  EXPECT_EQ(r.info().target.weights_sha256, o.meta.target.weights_sha256);
  EXPECT_EQ(r.info().prepared_sha256, PreparedFile(o.prepared).fingerprint());
  EXPECT_EQ(r.info().prepared_num_samples, 6);
  EXPECT_EQ(r.info().samples_per_shard, 2);
  EXPECT_EQ(r.info().num_chunks, 3);

  fs::remove(o.output + "/shard-00001.h5");  // a rerun has work to do
  ExtractOptions other = o;
  other.meta.target.weights_sha256 = std::string(64, 'b');  // another model of the same shape
  std::string e = error_of([&] { run_extract(other, g, fake_forward); });
  EXPECT_NE(e.find("shard-00000.h5 exists but is not chunk 0 of this run: it was extracted from another target: "
                   "the weights differ (the same config.json: another checkpoint of the same shape)"),
            std::string::npos)
      << e;
  other = o;
  other.meta.target.config_sha256 = std::string(64, 'd');
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); }).find("config.json differs"), std::string::npos);
  other = o;
  other.meta.aux_layers = {0, 1, 2};
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); }).find("aux layers 1,2,3, this run's are 0,1,2"),
            std::string::npos);
  other = o;
  other.meta.fp8 = true;  // --storage fp8 into bf16 shards: one folder holds one storage
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); })
                .find("stores its hidden states as bf16, this run as fp8 (--storage): rerun with --storage bf16 to "
                      "resume these shards"),
            std::string::npos);
  other = o;
  other.meta.target_gemm = "w8a8-fp8-block";  // extract --fp8-gemm into shards of the compute dtype's GEMMs
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); })
                .find("was extracted with the compute dtype's GEMMs, this run uses w8a8-fp8-block: rerun without "
                      "--fp8-gemm to resume these shards"),
            std::string::npos);
  EXPECT_TRUE(r.info().target_gemm.empty());
  other.output = dir + "/shards_w8a8";  // a fresh folder records it
  run_extract(other, g, fake_forward);
  EXPECT_EQ(ShardReader(other.output + "/shard-00000.h5").info().target_gemm, "w8a8-fp8-block");
  // The compute dtype (--dtype resolved) is recorded; a resume in the other one is refused (a helper mixed
  // f32 and bf16 hidden states in one folder by resuming on another kind of machine).
  other = o;
  other.meta.target_dtype = "f32";
  other.output = dir + "/shards_dtype";
  run_extract(other, g, fake_forward);
  EXPECT_EQ(ShardReader(other.output + "/shard-00000.h5").info().target_dtype, "f32");
  fs::remove(other.output + "/shard-00001.h5");
  other.meta.target_dtype = "bf16";
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); })
                .find("was extracted with the target in f32, this run computes in bf16 (--dtype; auto is bf16 on a "
                      "GPU, f32 on the CPU): rerun with --dtype f32"),
            std::string::npos);
  other.meta.target_dtype = "f32";
  run_extract(other, g, fake_forward);  // the same dtype resumes
  // Another prepared file of the same shape (one token changed).
  Prepared q = p;
  q.ids[3][1] = (q.ids[3][1] + 1) % 100;
  write_prepared(dir + "/prepared2.h5", q);
  other = o;
  other.prepared = dir + "/prepared2.h5";
  EXPECT_NE(error_of([&] { run_extract(other, g, fake_forward); }).find("from another prepared file"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(o.output + "/shard-00001.h5"));  // nothing written by the refused runs
  // The same provenance: the missing shard is redone.
  ExtractStats st = run_extract(o, g, fake_forward);
  EXPECT_EQ(st.chunks_skipped, 2);
  EXPECT_EQ(st.chunks_done, 1);

  // A shard of an older aerie (no provenance attributes) is checked by its tokens: those of chunk 1 of
  // prepared2.h5 are not prepared.h5's.
  const std::string old_dir = dir + "/old";
  fs::create_directories(old_dir);
  {
    ShardMeta m = fake_options(dir, 2).meta;
    m.chunk = 1;
    ShardWriter w(old_dir + "/shard-00001.h5", m, {static_cast<int64_t>(q.ids[2].size()),
                                                  static_cast<int64_t>(q.ids[3].size())});
    for (int k : {2, 3}) {
      Tensor aux, fin;
      fake_forward(q.ids[k], aux, fin);
      w.add(k, q.ids[k], q.mask[k], aux, fin);
    }
    w.close();
  }
  other = o;
  other.output = old_dir;
  e = error_of([&] { run_extract(other, g, fake_forward); });
  EXPECT_NE(e.find("shard-00001.h5 exists but is not chunk 1 of this run: its tokens differ from those of "
                   "--prepared " + o.prepared + " (first at sample 3): another prepared file"),
            std::string::npos)
      << e;
  other.prepared = dir + "/prepared2.h5";  // its own prepared file: accepted (with a warning), the rest done
  st = run_extract(other, g, fake_forward);
  EXPECT_EQ(st.chunks_skipped, 1);
  EXPECT_EQ(st.chunks_done, 2);
}

// Issue 17, case 5: an id outside the target's vocabulary names the prepared file, the sample and the id;
// a non-finite hidden state names the shard, the prepared sample, the token and its id (no shard written).
TEST(Extract, OutOfRangeIdsAndNonFiniteStatesNameTheSample) {
  const std::string dir = testing::scratch_dir("extract_bad_values");
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  Prepared p = make_prepared(6, 100);
  p.ids[4][2] = 100;
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o = fake_options(dir, 2);
  o.vocab_size = 100;
  std::string e = error_of([&] { run_extract(o, g, fake_forward); });
  EXPECT_NE(e.find("extract: prepared file " + o.prepared + ": sample 4 holds token id 100 at position 2, outside the "
                   "target's vocabulary [0, 100)"),
            std::string::npos)
      << e;
  EXPECT_TRUE(fs::exists(o.output + "/shard-00000.h5"));  // chunks before it are complete
  EXPECT_FALSE(fs::exists(o.output + "/shard-00002.h5"));

  p.ids[4][2] = 7;
  write_prepared(dir + "/prepared2.h5", p);
  o = fake_options(dir, 2);
  o.prepared = dir + "/prepared2.h5";
  o.output = dir + "/nan";
  const int32_t bad_id = p.ids[3][1];
  auto nan_forward = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    fake_forward(ids, aux, fin);
    for (size_t t = 0; t < ids.size(); ++t)
      if (ids == p.ids[3] && t == 1) fin.data<float>()[t * kFakeH] = std::numeric_limits<float>::quiet_NaN();
  };
  e = error_of([&] { run_extract(o, g, nan_forward); });
  EXPECT_NE(e.find("shard-00001.h5: prepared sample 3 has a non-finite final_hidden_states (z_t) at token 1 (id " +
                   std::to_string(bad_id) + ")"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--skip-nonfinite"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(o.output + "/shard-00001.h5"));
  EXPECT_FALSE(fs::exists(o.output + "/shard-00001.h5.tmp"));
}

// A forward that gives NaN in the last row's z_t of the samples in `bad` (their ids compared) and infinity
// in the first row's f_t of those in `inf`.
TargetForward nonfinite_forward(const Prepared& p, std::vector<int64_t> bad, std::vector<int64_t> inf) {
  return [&p, bad, inf](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    fake_forward(ids, aux, fin);
    for (int64_t k : bad)
      if (ids == p.ids[static_cast<size_t>(k)])
        fin.data<float>()[(ids.size() - 1) * kFakeH] = std::numeric_limits<float>::quiet_NaN();
    for (int64_t k : inf)
      if (ids == p.ids[static_cast<size_t>(k)]) aux.data<float>()[1] = std::numeric_limits<float>::infinity();
  };
}

// The shards hold every sample of `p` except `skipped`, in order, and list the skipped ones per chunk.
void expect_shards_hold_all_but(const std::string& shard_dir, const Prepared& p, int64_t S,
                                const std::vector<int64_t>& skipped) {
  const auto shards = list_shards(shard_dir);
  const int64_t N = static_cast<int64_t>(p.ids.size());
  ASSERT_EQ(static_cast<int64_t>(shards.size()), (N + S - 1) / S);
  for (size_t c = 0; c < shards.size(); ++c) {
    ShardReader r(shards[c]);
    std::vector<int64_t> want, want_skipped;
    for (int64_t k = static_cast<int64_t>(c) * S; k < std::min(N, static_cast<int64_t>(c + 1) * S); ++k)
      (std::find(skipped.begin(), skipped.end(), k) == skipped.end() ? want : want_skipped).push_back(k);
    EXPECT_EQ(r.sample_indices(), want) << shards[c];
    EXPECT_EQ(r.info().skipped_nonfinite, want_skipped) << shards[c];
    for (int64_t i = 0; i < r.num_samples(); ++i) {
      HiddenSample h = r.read(i);
      EXPECT_EQ(h.ids, p.ids[static_cast<size_t>(h.sample_index)]);
      Tensor aux, fin;
      fake_forward(h.ids, aux, fin);
      EXPECT_EQ(h.final_hidden.to_float_vector(), rounded(fin)) << shards[c] << " sample " << i;
    }
  }
}

// Issue 17, case 5: with skip_nonfinite (extract --skip-nonfinite) a sample with non-finite hidden states is
// left out of its shard, counted (this run's, and on a rerun those the kept shards record), and the rest is
// written; a chunk whose every sample is skipped is a shard of 0 samples; a rerun, with or without the
// option, accepts the shards and redoes only the missing ones.
TEST(Extract, SkipNonFiniteLeavesSamplesOutAndCountsThem) {
  const std::string dir = testing::scratch_dir("extract_skip_nonfinite");
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  Prepared p = make_prepared(9, 100);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o = fake_options(dir, 2);
  o.skip_nonfinite = true;
  const std::vector<int64_t> skipped = {1, 4, 5, 8};  // chunk 2 (samples 4, 5) wholly, chunk 4 (sample 8) wholly
  const TargetForward bad = nonfinite_forward(p, {1, 4, 8}, {5});
  ExtractStats st = run_extract(o, g, bad);
  EXPECT_EQ(st.chunks_done, 5);
  EXPECT_EQ(st.skipped_nonfinite, 4);
  int64_t skipped_tokens = 0, kept_tokens = 0;
  for (int64_t k = 0; k < 9; ++k)
    (std::find(skipped.begin(), skipped.end(), k) != skipped.end() ? skipped_tokens : kept_tokens) +=
        static_cast<int64_t>(p.ids[static_cast<size_t>(k)].size());
  EXPECT_EQ(st.skipped_nonfinite_tokens, skipped_tokens);
  EXPECT_EQ(st.samples, 5);
  EXPECT_EQ(st.tokens, kept_tokens);
  EXPECT_EQ(st.skipped_nonfinite_before, 0);
  expect_shards_hold_all_but(o.output, p, 2, skipped);
  EXPECT_EQ(ShardReader(o.output + "/shard-00002.h5").num_samples(), 0);

  // A rerun with two shards lost (one that skipped a sample, one that did not): redone, the other shards'
  // skips counted as before; the same shards.
  fs::remove(o.output + "/shard-00000.h5");
  fs::remove(o.output + "/shard-00003.h5");
  st = run_extract(o, g, bad);
  EXPECT_EQ(st.chunks_skipped, 3);
  EXPECT_EQ(st.chunks_done, 2);
  EXPECT_EQ(st.skipped_nonfinite, 1);         // sample 1, of chunk 0
  EXPECT_EQ(st.skipped_nonfinite_before, 3);  // samples 4, 5 and 8, recorded by shards 2 and 4
  expect_shards_hold_all_but(o.output, p, 2, skipped);
  // Without the option: the complete shards are accepted (nothing left to do).
  ExtractOptions strict = o;
  strict.skip_nonfinite = false;
  st = run_extract(strict, g, bad);
  EXPECT_EQ(st.chunks_skipped, 5);
  EXPECT_EQ(st.skipped_nonfinite_before, 4);
  EXPECT_EQ(check_existing_shards(strict), 5);
  // A shard whose kept and skipped samples are not its chunk's is refused.
  {
    ShardMeta m = o.meta;
    m.chunk = 0;
    ShardWriter w(o.output + "/shard-00000.h5", m,
                  {static_cast<int64_t>(p.ids[0].size()), static_cast<int64_t>(p.ids[1].size())}, NonFinite::Skip);
    for (int k : {0, 1}) {
      Tensor aux, fin;
      bad(p.ids[k], aux, fin);
      w.add(k == 0 ? 0 : 7, p.ids[k], p.mask[k], aux, fin);  // sample 1 recorded as 7
    }
    w.close();
  }
  const std::string e = error_of([&] { run_extract(o, g, bad); });
  EXPECT_NE(e.find("shard-00000.h5 exists but is not chunk 0 of this run: its 1 samples and 1 skipped ones are not "
                   "the chunk's samples 0..1"),
            std::string::npos)
      << e;
}

TEST(Extract, BadPreparedFileNamesIt) {
  const std::string dir = testing::scratch_dir("extract_bad_prepared");
  {
    h5::File f = h5::File::create(dir + "/prepared.h5");
    f.set_string_attr("format", "something.else");
    f.set_int_attr("format_version", 1);
  }
  try {
    PreparedFile pf(dir + "/prepared.h5");
    FAIL() << "accepted another format";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/prepared.h5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PreparedFile(dir + "/missing.h5"), Error);
}

// The real target: what the shards hold is TargetModel::forward of each sample, rounded to bf16.
TEST(Extract, Stories260KMatchesForward) {
  AERIE_REQUIRE_MODEL();
  const std::string dir = testing::scratch_dir("extract_stories");
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  TargetModel model(testing::model_dir(), *g.tp);
  Prepared p = make_prepared(5, model.config().vocab_size, 40);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o;
  o.prepared = dir + "/prepared.h5";
  o.output = dir + "/shards";
  o.samples_per_shard = 2;
  o.meta.target_model = testing::model_dir();
  o.meta.aux_layers = {1, 2, 4};
  o.meta.hidden_size = model.config().hidden_size;
  o.meta.num_hidden_layers = model.config().num_hidden_layers;
  TargetForward fwd = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    TargetOutput out = model.forward(ids, nullptr, o.meta.aux_layers, false);
    aux = out.aux_hidden;
    fin = out.final_hidden;
  };
  ExtractStats st = run_extract(o, g, fwd);
  EXPECT_EQ(st.chunks_done, 3);
  expect_shards_hold(o.output, p, 2, fwd);
  ShardReader r(o.output + "/shard-00001.h5");
  EXPECT_EQ(r.info().hidden_size, 64);
  EXPECT_EQ(r.info().target_model, testing::model_dir());
  // Sanity of the stored features themselves: z_t is RMS-normalised times final_norm's weight, so not 0.
  HiddenSample s = r.read(0);
  double sq = 0;
  for (float v : s.final_hidden.to_float_vector()) sq += v * v;
  EXPECT_GT(sq, 0.0);
}

// Several samples per forward (ExtractOptions::forward_batch): groups of consecutive samples up to the
// token budget, split back per sample; the shards are byte for byte those of one forward per sample.
TEST(Extract, BatchedForwardGivesTheSameShards) {
  const std::string dir = testing::scratch_dir("extract_batched");
  Prepared p = make_prepared(11, 100);
  write_prepared(dir + "/prepared.h5", p);
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  ExtractOptions single = fake_options(dir, 5);
  single.output = dir + "/single";
  run_extract(single, g, fake_forward);

  ExtractOptions batched = fake_options(dir, 5);
  batched.output = dir + "/batched";
  batched.batch_tokens = 20;
  std::vector<std::pair<size_t, int64_t>> calls;  // (samples, rows) per call
  batched.forward_batch = [&](const std::vector<std::vector<int32_t>>& ids, Tensor& aux, Tensor& fin) {
    int64_t rows = 0;
    for (const auto& x : ids) rows += static_cast<int64_t>(x.size());
    calls.emplace_back(ids.size(), rows);
    aux = Tensor::empty({rows, 3 * kFakeH}, DType::F32);
    fin = Tensor::empty({rows, kFakeH}, DType::F32);
    int64_t r = 0;
    for (const auto& x : ids) {
      Tensor a, f;
      fake_forward(x, a, f);
      const int64_t T = static_cast<int64_t>(x.size());
      aux.slice(r, r + T).copy_from(a);
      fin.slice(r, r + T).copy_from(f);
      r += T;
    }
  };
  TargetForward unused = [](const std::vector<int32_t>&, Tensor&, Tensor&) { FAIL() << "per-sample forward called"; };
  ExtractStats st = run_extract(batched, g, unused);
  EXPECT_EQ(st.samples, 11);
  size_t samples = 0, multi = 0;
  for (auto [n, rows] : calls) {
    samples += n;
    if (n > 1) {
      ++multi;
      EXPECT_LE(rows, 20);
    }
  }
  EXPECT_EQ(samples, 11u);
  EXPECT_GT(multi, 0u);       // the budget did group samples
  EXPECT_LT(calls.size(), 11u);
  for (int64_t c = 0; c < 3; ++c)
    EXPECT_TRUE(read_bytes(single.output + "/" + shard_file_name(c)) ==
                read_bytes(batched.output + "/" + shard_file_name(c)))
        << shard_file_name(c);
}

// The same with the real target's batched forward (TargetModel::forward_batch on the Qwen3 fixture): the
// stored bf16 values equal the one-sample forwards' up to fp32 summation order, i.e. a flipped bf16
// rounding at most (one bf16 ulp, 2^-8 relative).
TEST(Extract, ModelForwardBatchMatchesOneSampleForwards) {
  const std::string dir = testing::scratch_dir("extract_model_batched");
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  TargetModel model(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/qwen3", *g.tp);
  Prepared p = make_prepared(7, model.config().vocab_size, 12);
  write_prepared(dir + "/prepared.h5", p);
  ExtractOptions o;
  o.prepared = dir + "/prepared.h5";
  o.samples_per_shard = 4;
  o.meta.target_model = "qwen3";
  o.meta.aux_layers = {0, 1, 2};
  o.meta.hidden_size = model.config().hidden_size;
  o.meta.num_hidden_layers = model.config().num_hidden_layers;
  TargetForward fwd = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    TargetOutput out = model.forward(ids, nullptr, o.meta.aux_layers, false);
    aux = out.aux_hidden;
    fin = out.final_hidden;
  };
  o.output = dir + "/single";
  run_extract(o, g, fwd);
  o.output = dir + "/batched";
  o.batch_tokens = 30;
  o.forward_batch = [&](const std::vector<std::vector<int32_t>>& ids, Tensor& aux, Tensor& fin) {
    TargetOutput out = model.forward_batch(ids, {}, o.meta.aux_layers, TargetModel::Logits::None);
    aux = out.aux_hidden;
    fin = out.final_hidden;
  };
  run_extract(o, g, fwd);
  for (int64_t c = 0; c < 2; ++c) {
    ShardReader a(dir + "/single/" + shard_file_name(c)), b(dir + "/batched/" + shard_file_name(c));
    ASSERT_EQ(a.num_samples(), b.num_samples());
    for (int64_t i = 0; i < a.num_samples(); ++i) {
      HiddenSample sa = a.read(i), sb = b.read(i);
      EXPECT_EQ(sa.ids, sb.ids);
      testing::expect_close(sb.aux_hidden.to_float_vector(), sa.aux_hidden.to_float_vector(), 1e-3f, 8e-3f,
                            "aux, shard " + std::to_string(c) + " sample " + std::to_string(i));
      testing::expect_close(sb.final_hidden.to_float_vector(), sa.final_hidden.to_float_vector(), 1e-3f, 8e-3f,
                            "final, shard " + std::to_string(c) + " sample " + std::to_string(i));
    }
  }
}

// The input of tests/mpi/extract_resume.sh: with $AERIE_EXTRACT_PREPARED set, writes a prepared file of
// 36 samples of 32..159 tokens there (ids < 512, stories260K's vocabulary); otherwise into scratch.
TEST(ExtractFixture, WritePrepared) {
  const char* env = std::getenv("AERIE_EXTRACT_PREPARED");
  std::string path = env ? std::string(env) : testing::scratch_dir("extract_fixture") + "/prepared.h5";
  Prepared p = make_prepared(36, 512, 128);
  for (auto& ids : p.ids) ids.insert(ids.end(), 29, 7);  // lengths 32..159
  for (auto& m : p.mask) m.insert(m.end(), 29, 1);
  write_prepared(path, p);
  PreparedFile f(path);
  EXPECT_EQ(f.num_samples(), 36);
  EXPECT_EQ(f.sample_offsets()[1], static_cast<int64_t>(p.ids[0].size()));
}

// ---------------------------------------------------------------- multi-rank (mpirun -np 2, tests/mpi)

// A scratch folder made once by rank 0 and then used by every rank.
std::string shared_scratch(const std::string& name) {
  auto world = MpiCommunicator::world();
  std::string dir = testing::scratch_root() + "/" + name;
  if (world->rank() == 0) testing::scratch_dir(name);
  world->barrier();
  return dir;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// --skip-nonfinite under two groups: each leader skips (and names) the samples of its chunks; the world
// totals are the same on every rank and the shards are those of one process.
TEST(ExtractMpi, SkipNonFiniteCountsOverTheGroups) {
  if (world_size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (tests/mpi/extract.cmake)";
  const std::string dir = shared_scratch("extract_mpi_skip_nonfinite");
  ParallelGroups g = ParallelGroups::create(1);
  Prepared p = make_prepared(13, 100);
  if (g.map.world_rank == 0) write_prepared(dir + "/prepared.h5", p);
  g.world->barrier();
  ExtractOptions o = fake_options(dir, 2);
  o.skip_nonfinite = true;
  const TargetForward bad = nonfinite_forward(p, {0, 6, 7, 12}, {9});
  TargetForward slow0 = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    if (g.map.world_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    bad(ids, aux, fin);
  };
  ExtractStats st = run_extract(o, g, slow0);
  EXPECT_GT(st.chunks_this_group, 0) << "group " << g.map.dp_rank << " got no chunk";
  EXPECT_EQ(st.chunks_done, 7);
  EXPECT_EQ(st.skipped_nonfinite, 5);  // world totals, on every rank
  EXPECT_EQ(st.samples, 8);
  if (g.map.world_rank == 0) expect_shards_hold_all_but(o.output, p, 2, {0, 6, 7, 9, 12});
  g.world->barrier();
  if (g.map.world_rank == 0) fs::remove(o.output + "/shard-00003.h5");  // samples 6 and 7, both skipped
  g.world->barrier();
  st = run_extract(o, g, bad);
  EXPECT_EQ(st.chunks_done, 1);
  EXPECT_EQ(st.skipped_nonfinite, 2);
  EXPECT_EQ(st.skipped_nonfinite_before, 3);
  if (g.map.world_rank == 0) expect_shards_hold_all_but(o.output, p, 2, {0, 6, 7, 9, 12});
}

// Two groups of one rank: rank 0 hands out chunks and works; the shards are those of one process.
TEST(ExtractMpi, GroupsShareTheChunks) {
  if (world_size() < 2) GTEST_SKIP() << "run under mpirun -np 2 (tests/mpi/extract.cmake)";
  const std::string dir = shared_scratch("extract_mpi_groups");
  ParallelGroups g = ParallelGroups::create(1);
  Prepared p = make_prepared(21, 100);
  if (g.map.world_rank == 0) write_prepared(dir + "/prepared.h5", p);
  g.world->barrier();
  ExtractOptions o = fake_options(dir, 2);
  // Rank 0 is slowed down (20 ms a sample, 0.4 s for all) so that group 1 surely asks for work meanwhile.
  TargetForward slow0 = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    if (g.map.world_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fake_forward(ids, aux, fin);
  };
  ExtractStats st = run_extract(o, g, slow0);
  EXPECT_GT(st.chunks_this_group, 0) << "group " << g.map.dp_rank << " got no chunk";
  Tensor mine = Tensor::from_vector<int64_t>({st.chunks_this_group}, {1});
  g.world->all_reduce_sum(mine);
  EXPECT_EQ(mine.data<int64_t>()[0], 11);  // every chunk written by exactly one group
  EXPECT_EQ(st.chunks, 11);
  EXPECT_EQ(st.chunks_done, 11);  // world totals, on every rank
  EXPECT_EQ(st.samples, 21);
  if (g.map.world_rank == 0) expect_shards_hold(o.output, p, 2, fake_forward);
  // Rerun with a missing shard: done once, by whichever group asks first.
  g.world->barrier();
  if (g.map.world_rank == 0) fs::remove(o.output + "/shard-00004.h5");
  g.world->barrier();
  st = run_extract(o, g, fake_forward);
  EXPECT_EQ(st.chunks_done, 1);
  EXPECT_EQ(st.chunks_skipped, 10);
  if (g.map.world_rank == 0) expect_shards_hold(o.output, p, 2, fake_forward);
}

// stories260K split over a tp group of 2 against the same target on one rank.
TEST(ExtractMpi, Tp2MatchesTp1) {
  if (world_size() != 2) GTEST_SKIP() << "run under mpirun -np 2 (tests/mpi/extract.cmake)";
  AERIE_REQUIRE_MODEL();
  const std::string dir = shared_scratch("extract_mpi_tp");
  std::unique_ptr<TargetModel> one;  // rank 0's single-rank reference
  MpiCommunicator self(MPI_COMM_SELF, false);
  Prepared p = make_prepared(7, 512, 40);
  auto world = MpiCommunicator::world();
  if (world->rank() == 0) write_prepared(dir + "/prepared.h5", p);
  world->barrier();

  auto run = [&](int tp, const std::string& out) {
    ParallelGroups g = ParallelGroups::create(tp);
    TargetModel model(testing::model_dir(), *g.tp);
    ExtractOptions o;
    o.prepared = dir + "/prepared.h5";
    o.output = out;
    o.samples_per_shard = 3;
    o.meta.target_model = testing::model_dir();
    o.meta.aux_layers = {1, 2, 4};
    o.meta.hidden_size = model.config().hidden_size;
    o.meta.num_hidden_layers = model.config().num_hidden_layers;
    return run_extract(o, g, [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
      TargetOutput r = model.forward(ids, nullptr, o.meta.aux_layers, false);
      aux = r.aux_hidden;
      fin = r.final_hidden;
    });
  };
  EXPECT_EQ(run(2, dir + "/tp2").chunks_done, 3);
  EXPECT_EQ(run(1, dir + "/tp1").chunks_done, 3);
  if (world->rank() != 0) return;

  // tp=1 groups compute exactly what one process computes.
  TargetModel ref(testing::model_dir(), self);
  TargetForward ref_fwd = [&](const std::vector<int32_t>& ids, Tensor& aux, Tensor& fin) {
    TargetOutput r = ref.forward(ids, nullptr, {1, 2, 4}, false);
    aux = r.aux_hidden;
    fin = r.final_hidden;
  };
  expect_shards_hold(dir + "/tp1", p, 3, ref_fwd);

  // tp=2 sums partial products in another order (all-reduce after o_proj/down_proj), so its fp32 values
  // differ from tp=1 by rounding (~1e-6 relative); after rounding both to bf16 a value next to a rounding
  // boundary lands on the neighbouring bf16: |diff| <= 1 bf16 ulp <= 2^-7 |x| (rtol), plus a small atol
  // for values near 0, where an fp32 difference of ~1e-6 absolute spans many tiny bf16 ulps.
  auto a = list_shards(dir + "/tp2"), b = list_shards(dir + "/tp1");
  ASSERT_EQ(a.size(), b.size());
  int64_t differing = 0, total = 0;
  for (size_t c = 0; c < a.size(); ++c) {
    ShardReader ra(a[c]), rb(b[c]);
    ASSERT_EQ(ra.num_samples(), rb.num_samples());
    for (int64_t i = 0; i < ra.num_samples(); ++i) {
      HiddenSample x = ra.read(i), y = rb.read(i);
      EXPECT_EQ(x.ids, y.ids);
      EXPECT_EQ(x.sample_index, y.sample_index);
      auto xa = x.aux_hidden.to_float_vector(), ya = y.aux_hidden.to_float_vector();
      auto xf = x.final_hidden.to_float_vector(), yf = y.final_hidden.to_float_vector();
      testing::expect_close(xa, ya, 1e-4f, 1.0f / 128, a[c] + " aux");
      testing::expect_close(xf, yf, 1e-4f, 1.0f / 128, a[c] + " final");
      for (size_t j = 0; j < xa.size(); ++j) differing += xa[j] != ya[j];
      total += static_cast<int64_t>(xa.size());
    }
  }
  std::cout << "[   info   ] tp=2 vs tp=1: " << differing << " of " << total << " aux values differ (by 1 bf16 ulp)\n";
  // Almost all values are equal after bf16 rounding; a wrong split (e.g. a missing all-reduce) is not.
  EXPECT_LT(differing, total / 20) << differing << " of " << total << " aux values differ";
}

}  // namespace
}  // namespace aerie

namespace aerie {
namespace {

// What --tp-overlap can split: forwards of two or more samples, grouped as run_extract groups them.
TEST(Extract, MultiSampleShareFollowsThePacking) {
  const std::vector<int64_t> off = {0, 3, 6, 16, 19};  // lengths 3, 3, 10, 3
  EXPECT_EQ(packed_forward_end(off, 0, 4, 6), 2);
  EXPECT_EQ(packed_forward_end(off, 2, 4, 6), 3);  // 10 tokens: alone
  EXPECT_DOUBLE_EQ(multi_sample_share(off, 64, 6), 6.0 / 19);
  EXPECT_DOUBLE_EQ(multi_sample_share(off, 64, 16), 16.0 / 19);  // 3+3+10, then 3 alone
  EXPECT_DOUBLE_EQ(multi_sample_share(off, 1, 1000), 0.0);        // a chunk of one sample: never two
  EXPECT_DOUBLE_EQ(multi_sample_share({0}, 64, 6), 0.0);
}

// extract's and streaming train's --tp-overlap warning: under half the tokens in multi-sample forwards.
TEST(Extract, TpOverlapPackingWarningBelowHalf) {
  const std::vector<int64_t> off = {0, 3, 6, 16, 19};  // lengths 3, 3, 10, 3
  EXPECT_EQ(tp_overlap_packing_warning("train", "p.h5", off, 64, 16), "");  // 84%
  EXPECT_EQ(tp_overlap_packing_warning("train", "p.h5", off, 64, 6),
            "train: --tp-overlap splits forwards of two or more samples only, and 32% of the tokens are in such "
            "forwards at --batch-tokens 6: raise --batch-tokens (the samples' lengths: p.h5)");
  EXPECT_NE(tp_overlap_packing_warning("extract", "p.h5", off, 1, 1000), "");  // one sample per call: never two
}

// calibrate's random prepared files: read back as extract reads a prepared file.
TEST(Extract, WritePreparedFileReadsBack) {
  const std::string dir = testing::scratch_dir("extract_write_prepared");
  write_prepared_file(dir + "/p.h5", {{5, 6, 7}, {8}});
  const PreparedFile p(dir + "/p.h5");
  EXPECT_EQ(p.sample_offsets(), (std::vector<int64_t>{0, 3, 4}));
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  p.read_tokens(0, 2, ids, mask);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 1, 1}));
}

}  // namespace
}  // namespace aerie
