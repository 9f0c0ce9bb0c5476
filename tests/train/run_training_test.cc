// run_training in process on a tiny target and tiny shards: checkpoints, data_split.json, metrics.jsonl,
// heldout.jsonl and the TensorBoard event files (continuous across a resume), an in-process resume that ends bitwise equal to the uninterrupted run, and refusals to resume with
// options that would change the weights; provenance (issue 17): shards of another target, a mixed folder,
// missing shards, and a resume with another --model or --shards are refused.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include "comm/communicator.h"
#include "core/error.h"
#include "data/shard.h"
#include "io/event_file.h"
#include "io/fingerprint.h"
#include "io/h5.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/train_testing.h"
#include "train/trainer.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

// Target files (config.json from make_tiny_setup, model.safetensors with embedding and lm_head), two shards
// of 5 and 4 samples of 6..14 tokens, and the draft vocabulary file.
// `edit` (optional) changes each shard's metadata (provenance) before it is written; `shards` names the folder.
// `poison(shard, sample)` (optional): that sample's aux hidden states get a NaN at their last token.
testing::TinyTrainSetup write_inputs(const std::string& dir, const std::function<void(ShardMeta&)>& edit = nullptr,
                                     const std::string& shards = "shards",
                                     const std::function<bool(int, int)>& poison = nullptr) {
  auto s = testing::make_tiny_setup(dir);
  SafetensorsFile m;
  m.tensors["model.embed_tokens.weight"] = s.embed;
  m.tensors["lm_head.weight"] = s.lm_head;
  save_safetensors(dir + "/model.safetensors", m);
  save_draft_vocab(dir + "/vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  fs::create_directories(dir + "/" + shards);
  std::mt19937_64 rng(99);
  int64_t index = 0;
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<int64_t> lens;
    for (int i = 0; i < 5 - shard; ++i) lens.push_back(6 + static_cast<int64_t>(rng() % 9));
    ShardMeta meta;
    meta.target_model = dir;
    meta.aux_layers = s.cfg.aux_layers;
    meta.hidden_size = 8;
    meta.num_hidden_layers = 6;
    meta.chunk = shard;
    if (edit) edit(meta);
    ShardWriter w(dir + "/" + shards + "/" + shard_file_name(shard), meta, lens);
    std::vector<int64_t> poisoned;  // rows to overwrite with NaN
    int64_t offset = 0;
    for (int64_t T : lens) {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      std::vector<uint8_t> mask(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        ids[static_cast<size_t>(t)] = static_cast<int32_t>(rng() % 16);
        mask[static_cast<size_t>(t)] = t > 1;
      }
      if (poison && poison(shard, static_cast<int>(w.num_samples_added()))) poisoned.push_back(offset + T - 1);
      offset += T;
      w.add(index++, ids, mask, testing::random_f32({T, 24}, rng, 1.0), testing::random_f32({T, 8}, rng, 2.0));
    }
    w.close();
    // A damaged shard (ShardWriter refuses NaN): one bf16 NaN written over row `r` of aux_hidden_states.
    if (!poisoned.empty()) {
      h5::File f = h5::File::open(dir + "/" + shards + "/" + shard_file_name(shard), h5::Access::ReadWrite);
      h5::Dataset d = f.open_dataset("aux_hidden_states");
      for (int64_t r : poisoned) {
        std::vector<uint16_t> row(24, 0x7FC0);  // bf16 quiet NaN
        d.write_rows(r, Tensor::wrap(row.data(), {1, 24}, DType::BF16));
      }
    }
  }
  return s;
}

TrainOptions options(const std::string& dir, const std::string& out) {
  TrainOptions o;
  o.model_dir = dir;
  o.shards_dir = dir + "/shards";
  o.vocab_path = dir + "/vocab.safetensors";
  o.output_dir = out;
  o.steps = 7;
  o.batch_size = 3;
  o.lr = 1e-2;
  o.ttt_steps = 3;
  o.checkpoint_every = 2;
  o.log_every = 2;
  o.seed = 4;
  o.eval_fraction = 0.2;
  return o;
}

TEST(RunTrainingTest, WritesCheckpointsAndResumesBitwise) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = testing::scratch_dir("train_run_r" + std::to_string(rank));
  write_inputs(dir);
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);

  TrainResult a = run_training(options(dir, dir + "/a"), *self);
  EXPECT_EQ(a.step, 7);
  EXPECT_EQ(a.stop_signal, 0);
  EXPECT_EQ(a.checkpoint, checkpoint_dir(dir + "/a", 7));
  for (int step : {2, 4, 6, 7}) EXPECT_TRUE(fs::exists(checkpoint_dir(dir + "/a", step) + "/DONE")) << step;
  // 9 samples, floor(9 * 0.2) = 1 held out: the last one (shard 1, row 3).
  auto split = nlohmann::json::parse(read_file(dir + "/a/data_split.json"));
  EXPECT_EQ(split["eval"].size(), 1u);
  EXPECT_EQ(split["eval"][0]["global"], 8);
  EXPECT_EQ(split["eval"][0]["shard"], 1);
  EXPECT_EQ(split["eval"][0]["index"], 3);
  std::ifstream metrics(dir + "/a/metrics.jsonl");
  std::vector<int64_t> logged;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    logged.push_back(j["step"].get<int64_t>());
    EXPECT_TRUE(j.contains("loss") && j.contains("acc_k") && j.contains("tau_sim") && j.contains("lr") &&
                j.contains("tokens_per_s"));
    EXPECT_EQ(j["loss_k"].size(), 3u);
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 4, 6, 7}));
  Checkpoint last = load_checkpoint(a.checkpoint);
  EXPECT_EQ(last.state.steps_per_epoch, 2);  // 8 training samples / 3
  EXPECT_EQ(last.state.epoch, 3);
  EXPECT_EQ(last.state.position, 3);

  // Run b: a copy of a's step-4 checkpoint (and a DONE-less step 6) resumed in process.
  fs::create_directories(dir + "/b/checkpoints");
  fs::copy(checkpoint_dir(dir + "/a", 4), checkpoint_dir(dir + "/b", 4), fs::copy_options::recursive);
  fs::copy(checkpoint_dir(dir + "/a", 6), checkpoint_dir(dir + "/b", 6), fs::copy_options::recursive);
  fs::remove(checkpoint_dir(dir + "/b", 6) + "/DONE");
  TrainResult b = run_training(options(dir, dir + "/b"), *self);
  EXPECT_EQ(b.step, 7);
  EXPECT_EQ(read_file(b.checkpoint + "/draft.safetensors"), read_file(a.checkpoint + "/draft.safetensors"));
  EXPECT_EQ(read_file(b.checkpoint + "/optimizer.safetensors"), read_file(a.checkpoint + "/optimizer.safetensors"));
  EXPECT_EQ(read_file(b.checkpoint + "/draft_vocab.safetensors"), read_file(dir + "/vocab.safetensors"));
  // A finished run is not trained again.
  EXPECT_EQ(run_training(options(dir, dir + "/b"), *self).checkpoint, b.checkpoint);

  // Options that change the weights are refused on resume.
  fs::remove_all(checkpoint_dir(dir + "/b", 7));
  TrainOptions other = options(dir, dir + "/b");
  other.batch_size = 2;
  EXPECT_THROW(run_training(other, *self), Error);
  other = options(dir, dir + "/b");
  other.steps = 9;
  EXPECT_THROW(run_training(other, *self), Error);
  other = options(dir, dir + "/b");
  other.lr = 2e-2;
  EXPECT_THROW(run_training(other, *self), Error);
}

// --init-draft: a fresh run starts from a checkpoint's draft weights (a run folder: its newest complete checkpoint;
// or one checkpoint folder). With lr 0 the weights never move, so the warm run's last checkpoint holds exactly the
// weights it started from; a cold run with lr 0 holds eagle3.md's initialisation instead (the check can fail).
// A draft of other options, another draft vocabulary, a folder without a checkpoint, an --output inside the init
// run and a random lm_head on top are refused by name.
TEST(RunTrainingTest, InitDraftStartsFromACheckpointsWeights) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = testing::scratch_dir("train_init_draft_r" + std::to_string(rank));
  auto s = write_inputs(dir);
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  const TrainResult a = run_training(options(dir, dir + "/a"), *self);
  auto frozen = [&](const std::string& out, const std::string& init) {
    TrainOptions o = options(dir, out);
    o.lr = 0.0;
    o.init_draft = init;
    return load_checkpoint(run_training(o, *self).checkpoint).weights;
  };
  EXPECT_EQ(testing::count_bit_differences(frozen(dir + "/warm", dir + "/a"), load_checkpoint(a.checkpoint).weights), 0);
  EXPECT_EQ(testing::count_bit_differences(frozen(dir + "/warm4", checkpoint_dir(dir + "/a", 4)),
                                           load_checkpoint(checkpoint_dir(dir + "/a", 4)).weights),
            0);
  EXPECT_GT(testing::count_bit_differences(frozen(dir + "/cold", ""), load_checkpoint(a.checkpoint).weights), 0);

  TrainOptions o = options(dir, dir + "/other_options");
  o.init_draft = dir + "/a";
  o.draft_norm_output = true;
  std::string e = testing::error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("--init-draft " + a.checkpoint + ": its draft has norm_output = (absent: off), this run's true"),
            std::string::npos)
      << e;
  o = options(dir, dir + "/other_vocab");
  o.init_draft = dir + "/a";
  DraftVocab v = s.vocab;  // ids 3 and 4 swapped: the same sizes, another selection
  v.t2d[3] = 1;
  v.t2d[4] = 0;
  v.d2t = {0, 0, 0, 0, 1, 2, 3, 3, 4, 6};
  save_draft_vocab(dir + "/other_vocab.safetensors", v, std::vector<int64_t>(16, 1));
  o.vocab_path = dir + "/other_vocab.safetensors";
  e = testing::error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("its draft vocabulary differs from --vocab"), std::string::npos) << e;
  o = options(dir, dir + "/a/checkpoints/step-00000009");  // a fresh folder inside the run it starts from
  o.init_draft = dir + "/a";
  e = testing::error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("lies inside --init-draft " + dir + "/a"), std::string::npos) << e;
  o = options(dir, dir + "/random_head");
  o.init_draft = dir + "/a";
  o.lm_head_init = "random";
  EXPECT_NE(testing::error_of([&] { run_training(o, *self); }).find("--lm-head-init random with --init-draft"),
            std::string::npos);
  o = options(dir, dir + "/no_checkpoint");
  o.init_draft = dir + "/shards";
  e = testing::error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("--init-draft " + dir + "/shards is neither a checkpoint folder"), std::string::npos) << e;
}

// The JSON lines of a file.
std::vector<nlohmann::json> json_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// (step, value) of `tag` over the event files of `dir`, in file order.
std::vector<std::pair<int64_t, float>> scalar_series(const std::string& dir, const std::string& tag) {
  std::vector<std::pair<int64_t, float>> out;
  for (const std::string& f : list_event_files(dir))
    for (const EventRecord& e : read_event_file(f))
      for (const auto& [t, v] : e.scalars)
        if (t == tag) out.emplace_back(e.step, v);
  return out;
}

// heldout.jsonl and the event files: every logged interval's scalars and the held-out figures of every
// checkpoint, with the values of metrics.jsonl; a resume from step 4 of a folder holding the whole run's
// logs (a run killed after logging past its checkpoint) drops the later lines and events, writes a second
// event file, and every curve holds each step once.
TEST(RunTrainingTest, WritesHeldOutFiguresAndTensorBoardEventsThatContinueOnResume) {
  const std::string dir = testing::scratch_dir("train_run_events");
  write_inputs(dir);
  auto self = MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0);
  const TrainResult a = run_training(options(dir, dir + "/a"), *self);
  ASSERT_EQ(a.step, 7);
  const std::vector<nlohmann::json> heldout = json_lines(dir + "/a/heldout.jsonl");
  ASSERT_EQ(heldout.size(), 4u);  // checkpoints 2, 4, 6, 7; one held-out sample
  for (size_t i = 0; i < heldout.size(); ++i) {
    EXPECT_EQ(heldout[i]["step"], std::vector<int64_t>({2, 4, 6, 7})[i]);
    EXPECT_EQ(heldout[i]["samples"], 1);
    EXPECT_EQ(heldout[i]["acc_k"].size(), 3u);
    EXPECT_GE(heldout[i]["tau_sim"].get<double>(), 1.0);
  }
  if (!event_files_supported()) GTEST_SKIP() << "event files not checked: " << event_files_unsupported_reason();
  const std::vector<std::string> files = list_event_files(dir + "/a");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(read_event_file(files[0]).front().file_version, "brain.Event:2");
  const std::vector<nlohmann::json> metrics = json_lines(dir + "/a/metrics.jsonl");
  const auto loss = scalar_series(dir + "/a", "train/loss");
  ASSERT_EQ(loss.size(), metrics.size());
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_EQ(loss[i].first, metrics[i]["step"].get<int64_t>());
    EXPECT_EQ(loss[i].second, static_cast<float>(metrics[i]["loss"].get<double>()));
  }
  for (const std::string tag : {"train/tau_sim", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/loss_k/0",
                                "train/loss_k/2", "train/acc_k/0", "train/acc_k/2"})
    EXPECT_EQ(scalar_series(dir + "/a", tag).size(), 4u) << tag;
  EXPECT_TRUE(scalar_series(dir + "/a", "train/loss_k/3").empty());  // ttt_steps 3
  EXPECT_EQ(scalar_series(dir + "/a", "train/acc_k/1").back().second,
            static_cast<float>(metrics.back()["acc_k"][1].get<double>()));
  const auto tau = scalar_series(dir + "/a", "heldout/tau_sim");
  ASSERT_EQ(tau.size(), 4u);
  EXPECT_EQ(tau[3].first, 7);
  EXPECT_EQ(tau[3].second, static_cast<float>(heldout[3]["tau_sim"].get<double>()));
  EXPECT_EQ(scalar_series(dir + "/a", "heldout/acc_k/2").size(), 4u);

  // b: the whole of a's logs beside its step-4 checkpoint, resumed.
  fs::create_directories(dir + "/b/checkpoints");
  fs::copy(checkpoint_dir(dir + "/a", 4), checkpoint_dir(dir + "/b", 4), fs::copy_options::recursive);
  for (const std::string f : {"metrics.jsonl", "heldout.jsonl"}) fs::copy(dir + "/a/" + f, dir + "/b/" + f);
  fs::copy(files[0], dir + "/b/" + fs::path(files[0]).filename().string());
  ASSERT_EQ(run_training(options(dir, dir + "/b"), *self).step, 7);
  const std::vector<std::string> b_files = list_event_files(dir + "/b");
  ASSERT_EQ(b_files.size(), 2u);
  EXPECT_EQ(read_event_file(b_files[0]).back().step, 4);  // the copy of a's file, cut after step 4
  const auto b_loss = scalar_series(dir + "/b", "train/loss");
  EXPECT_EQ(b_loss, loss);  // steps 2, 4 from the first file, 6, 7 from the second: the same values (bitwise resume)
  EXPECT_EQ(scalar_series(dir + "/b", "heldout/tau_sim"), tau);
  EXPECT_EQ(json_lines(dir + "/b/metrics.jsonl").size(), 4u);
  EXPECT_EQ(json_lines(dir + "/b/heldout.jsonl"), heldout);
}

using testing::error_of;  // tests/test_util.h

// Provenance of the tiny target folder's own model, as extract would record it, and the chunking of 2 shards.
std::function<void(ShardMeta&)> recorded(const std::string& dir, const std::string& prepared = std::string(64, 'p'),
                                         int64_t num_chunks = 2) {
  return [=](ShardMeta& m) {
    m.target = TargetFingerprint::of_model(dir);
    m.prepared_sha256 = prepared;
    m.num_chunks = num_chunks;
    m.samples_per_shard = 5;
    m.prepared_num_samples = 9;
  };
}

// Issue 17, case 3: shards of another target than --model, or a folder mixing two targets, are refused.
TEST(RunTrainingProvenance, RefusesShardsOfAnotherTargetOrAMixedFolder) {
  const std::string dir = testing::scratch_dir("train_provenance_target");
  write_inputs(dir);
  write_inputs(dir, [&](ShardMeta& m) {
    recorded(dir)(m);
    m.target.weights_sha256 = std::string(64, 'f');  // another model of the same shape
  }, "other_weights");
  auto self = MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0);
  TrainOptions o = options(dir, dir + "/a");
  o.shards_dir = dir + "/other_weights";
  std::string e = error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("train: the shards in " + dir + "/other_weights were extracted from another target than --model " +
                   dir + ": the weights differ (the same config.json: another checkpoint of the same shape)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--allow-other-target"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir + "/a/checkpoints"));
  o.allow_other_target = true;
  EXPECT_EQ(run_training(o, *self).step, 7);

  // One shard of the target, one of another: a mixed folder.
  write_inputs(dir, [&](ShardMeta& m) {
    recorded(dir)(m);
    if (m.chunk == 1) m.target.config_sha256 = std::string(64, 'e');
  }, "mixed");
  o = options(dir, dir + "/b");
  o.shards_dir = dir + "/mixed";
  e = error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("mixes the shards of two targets: " + dir + "/mixed/shard-00001.h5 and " + dir +
                   "/mixed/shard-00000.h5: config.json differs"),
            std::string::npos)
      << e;
  // One shard of another prepared file: mixed as well.
  write_inputs(dir, [&](ShardMeta& m) { recorded(dir, std::string(64, m.chunk == 0 ? 'p' : 'q'))(m); }, "mixed2");
  o.shards_dir = dir + "/mixed2";
  EXPECT_NE(error_of([&] { run_training(o, *self); }).find("come from different prepared files"), std::string::npos);
}

// Issue 17, case 4: a shard folder with chunks missing is refused unless --allow-missing-shards.
TEST(RunTrainingProvenance, RefusesMissingShardsUnlessAllowed) {
  const std::string dir = testing::scratch_dir("train_provenance_missing");
  write_inputs(dir, recorded(dir, std::string(64, 'p'), 3));  // chunks 0 and 1 of 3: the last one missing
  auto self = MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0);
  TrainOptions o = options(dir, dir + "/a");
  std::string e = error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("--shards " + dir + "/shards holds 2 of 3 shards of its extraction: chunk(s) 2 missing"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--allow-missing-shards"), std::string::npos) << e;
  o.allow_missing_shards = true;
  EXPECT_EQ(run_training(o, *self).step, 7);

  // Shards of an older aerie (no num_chunks): a gap below the last chunk is found from the chunk indices.
  write_inputs(dir, nullptr, "old");
  fs::rename(dir + "/old/shard-00000.h5", dir + "/old/shard-00007.h5");  // holds chunk 0: only chunk 1 named
  fs::remove(dir + "/old/shard-00007.h5");
  o = options(dir, dir + "/b");
  o.shards_dir = dir + "/old";
  EXPECT_NE(error_of([&] { run_training(o, *self); }).find("holds 1 of 2 shards of its extraction: chunk(s) 0 missing"),
            std::string::npos);
}

// Issue 17, case 3: a resumed run checks --model and --shards against its checkpoint's provenance; a
// checkpoint of an older aerie (no provenance) resumes with a warning.
TEST(RunTrainingProvenance, ResumeChecksModelAndShards) {
  const std::string dir = testing::scratch_dir("train_provenance_resume");
  write_inputs(dir);  // shards without provenance: only the checkpoint's records tell the targets apart
  auto self = MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0);
  TrainOptions o = options(dir, dir + "/a");
  o.steps = 4;
  run_training(o, *self);
  const std::string ck = checkpoint_dir(dir + "/a", 4);
  const Checkpoint c = load_checkpoint(ck);
  ASSERT_TRUE(c.provenance.is_object());
  EXPECT_EQ(c.provenance["target"]["config_sha256"], TargetFingerprint::of_model(dir).config_sha256);
  EXPECT_EQ(c.provenance["target"]["num_hidden_layers"], 6);
  EXPECT_EQ(c.provenance["vocab_sha256"], sha256_hex(read_file(dir + "/vocab.safetensors")));
  fs::remove_all(ck);  // resume from step 2

  // Another model of the same shape (another lm_head).
  const std::string other = dir + "/other_model";
  fs::create_directories(other);
  auto s2 = testing::make_tiny_setup(other);
  SafetensorsFile m;
  m.tensors["model.embed_tokens.weight"] = s2.embed;
  std::mt19937_64 rng(5);
  m.tensors["lm_head.weight"] = testing::random_f32({16, 8}, rng, 1.0);
  save_safetensors(other + "/model.safetensors", m);
  TrainOptions r = o;
  r.model_dir = other;
  std::string e = error_of([&] { run_training(r, *self); });
  EXPECT_NE(e.find("resume: --model " + other + " is not the target " + checkpoint_dir(dir + "/a", 2) +
                   " was trained with (" + dir + "): the weights differ"),
            std::string::npos)
      << e;

  // Shards of another extraction (they record another prepared file than the checkpoint's shards did).
  const std::string d2 = dir + "/recorded";
  fs::create_directories(d2);
  write_inputs(d2, recorded(d2, std::string(64, 'p')));
  TrainOptions a2 = options(d2, d2 + "/a");
  a2.steps = 4;
  run_training(a2, *self);
  fs::remove_all(checkpoint_dir(d2 + "/a", 4));
  write_inputs(d2, recorded(d2, std::string(64, 'q')), "shards_q");
  a2.shards_dir = d2 + "/shards_q";
  e = error_of([&] { run_training(a2, *self); });
  EXPECT_NE(e.find("resume: --shards " + d2 + "/shards_q are not the shards " + checkpoint_dir(d2 + "/a", 2) +
                   " was trained on (" + d2 + "/shards): they were extracted from another prepared file"),
            std::string::npos)
      << e;

  // A checkpoint without provenance (an older aerie) resumes, with a warning.
  const std::string cfg = checkpoint_dir(dir + "/a", 2) + "/config.json";
  nlohmann::json j = nlohmann::json::parse(read_file(cfg));
  j.erase("provenance");
  write_file_atomic(cfg, j.dump(2));
  EXPECT_EQ(run_training(o, *self).step, 4);
}

// Issue 17, case 5: a sample with a NaN in its hidden states is skipped and counted, the run ends with
// finite weights; a step none of whose samples is finite stops the run naming them.
TEST(RunTrainingNonFinite, SkipsANonFiniteSampleAndStopsOnAWholeNonFiniteStep) {
  const std::string dir = testing::scratch_dir("train_nonfinite");
  write_inputs(dir, nullptr, "shards", [](int shard, int sample) { return shard == 0 && sample == 2; });
  auto self = MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0);
  TrainOptions o = options(dir, dir + "/a");
  o.steps = 12;
  TrainResult r = run_training(o, *self);
  EXPECT_EQ(r.step, 12);
  EXPECT_GT(r.skipped_nonfinite, 0);
  Checkpoint c = load_checkpoint(r.checkpoint);
  for (auto& [name, t] : c.weights.named())
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_TRUE(std::isfinite(t->data<float>()[i])) << name;
  int64_t logged = 0;
  std::ifstream metrics(dir + "/a/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    logged += nlohmann::json::parse(line).value("skipped_nonfinite", int64_t{0});
  EXPECT_EQ(logged, r.skipped_nonfinite);

  write_inputs(dir, nullptr, "all_nan", [](int, int) { return true; });
  o = options(dir, dir + "/b");
  o.shards_dir = dir + "/all_nan";
  const std::string e = error_of([&] { run_training(o, *self); });
  EXPECT_NE(e.find("train: every sample of step 1 has non-finite hidden states (this rank's: " + dir + "/all_nan/shard-"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find(" sample "), std::string::npos) << e;
}

}  // namespace
}  // namespace aerie
