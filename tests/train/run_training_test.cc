// run_training in process on a tiny target and tiny shards: checkpoints, data_split.json, metrics.jsonl,
// an in-process resume that ends bitwise equal to the uninterrupted run, and refusals to resume with
// options that would change the weights.
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "data/shard.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/train_testing.h"
#include "train/trainer.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

// Target files (config.json from make_tiny_setup, model.safetensors with embedding and lm_head), two shards
// of 5 and 4 samples of 6..14 tokens, and the draft vocabulary file.
testing::TinyTrainSetup write_inputs(const std::string& dir) {
  auto s = testing::make_tiny_setup(dir);
  SafetensorsFile m;
  m.tensors["model.embed_tokens.weight"] = s.embed;
  m.tensors["lm_head.weight"] = s.lm_head;
  save_safetensors(dir + "/model.safetensors", m);
  save_draft_vocab(dir + "/vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  fs::create_directories(dir + "/shards");
  std::mt19937_64 rng(99);
  int64_t index = 0;
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<int64_t> lens;
    for (int i = 0; i < 5 - shard; ++i) lens.push_back(6 + static_cast<int64_t>(rng() % 9));
    ShardMeta meta{dir, s.cfg.aux_layers, 8, 6, shard};
    ShardWriter w(dir + "/shards/" + shard_file_name(shard), meta, lens);
    for (int64_t T : lens) {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      std::vector<uint8_t> mask(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        ids[static_cast<size_t>(t)] = static_cast<int32_t>(rng() % 16);
        mask[static_cast<size_t>(t)] = t > 1;
      }
      w.add(index++, ids, mask, testing::random_f32({T, 24}, rng, 1.0), testing::random_f32({T, 8}, rng, 2.0));
    }
    w.close();
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

}  // namespace
}  // namespace aerie
