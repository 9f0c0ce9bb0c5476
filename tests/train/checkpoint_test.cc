// Checkpoints: the save/load round trip is bitwise; the newest complete checkpoint is picked and folders
// without DONE (killed mid-write) or with the .tmp suffix are ignored.
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/version.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/train_testing.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

Checkpoint make_checkpoint(const testing::TinyTrainSetup& s, int64_t step) {
  Checkpoint ck;
  ck.config = s.cfg;
  ck.train_options = {{"batch_size", 2}, {"seed", 3}};
  ck.weights = testing::clone_weights(s.w);
  std::mt19937_64 rng(static_cast<uint64_t>(step));
  ck.adam_m = DraftWeights::zeros(s.cfg);
  ck.adam_v = DraftWeights::zeros(s.cfg);
  for (auto& [n, t] : ck.adam_m.named()) *t = testing::random_f32(t->shape(), rng, 1e-3);
  for (auto& [n, t] : ck.adam_v.named()) *t = testing::random_f32(t->shape(), rng, 1e-6);
  ck.state.step = step;
  ck.state.total_steps = 100;
  ck.state.batch_size = 2;
  ck.state.steps_per_epoch = 9;
  ck.state.epoch = step / 9;
  ck.state.position = (step % 9) * 2;
  ck.state.seed = 3;
  ck.state.split = make_data_split({"/x/shard-00000.h5", "/x/shard-00001.h5"}, {10, 9}, 0.05);
  return ck;
}

TEST(CheckpointTest, SaveLoadRoundTripIsBitwise) {
  const std::string dir = testing::scratch_dir("train_checkpoint_roundtrip");
  auto s = testing::make_tiny_setup(dir);
  save_draft_vocab(dir + "/draft_vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  Checkpoint ck = make_checkpoint(s, 3);
  const std::string run = dir + "/run";
  const std::string out = save_checkpoint(run, ck, dir + "/draft_vocab.safetensors", *self);
  EXPECT_EQ(out, run + "/checkpoints/step-00000003");
  for (const char* f : {"draft.safetensors", "optimizer.safetensors", "draft_vocab.safetensors", "config.json",
                        "state.json", "DONE"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  // The vocabulary file is a byte copy (d2t/t2d travel with the draft; never recomputed).
  EXPECT_EQ(read_file(out + "/draft_vocab.safetensors"), read_file(dir + "/draft_vocab.safetensors"));

  Checkpoint back = load_checkpoint(out);
  EXPECT_EQ(testing::count_bit_differences(back.weights, ck.weights), 0);
  EXPECT_EQ(testing::count_bit_differences(back.adam_m, ck.adam_m), 0);
  EXPECT_EQ(testing::count_bit_differences(back.adam_v, ck.adam_v), 0);
  EXPECT_EQ(back.vocab.d2t, s.vocab.d2t);
  EXPECT_EQ(back.vocab.t2d, s.vocab.t2d);
  EXPECT_EQ(back.config.to_json(), s.cfg.to_json());
  EXPECT_EQ(back.train_options, ck.train_options);
  EXPECT_EQ(back.state.to_json(), ck.state.to_json());
  EXPECT_EQ(back.state.split.eval, (std::vector<int64_t>{18}));
  // Who wrote it: the aerie_version string in config.json and state.json (issue 13 item 5).
  for (const char* f : {"config.json", "state.json"})
    EXPECT_EQ(nlohmann::json::parse(read_file(out + "/" + f)).value("aerie_version", ""), aerie_version_string()) << f;
}

// EAGLE-3.1's norm_before_fc: input_norm.weight [3 H_t] travels in draft.safetensors and its AdamW moments
// m./v.input_norm.weight in optimizer.safetensors, bitwise; the config says norm_before_fc. A checkpoint
// whose config says so but whose tensors lack the weight is refused naming it.
TEST(CheckpointTest, NormBeforeFcRoundTripIsBitwise) {
  const std::string dir = testing::scratch_dir("train_checkpoint_norm_before_fc");
  auto s = testing::make_tiny_setup(dir);
  testing::enable_norm_before_fc(s, 51);
  save_draft_vocab(dir + "/draft_vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  Checkpoint ck = make_checkpoint(s, 4);
  ASSERT_TRUE(ck.adam_m.input_norm.defined());
  const std::string out = save_checkpoint(dir + "/run", ck, dir + "/draft_vocab.safetensors", *self);
  const SafetensorsFile w = load_safetensors(out + "/draft.safetensors");
  const SafetensorsFile o = load_safetensors(out + "/optimizer.safetensors");
  EXPECT_EQ(w.tensors.size(), 14u);
  EXPECT_EQ(w.tensors.at("input_norm.weight").shape(), (Shape{24}));
  EXPECT_TRUE(o.tensors.count("m.input_norm.weight") && o.tensors.count("v.input_norm.weight"));
  Checkpoint back = load_checkpoint(out);
  EXPECT_TRUE(back.config.norm_before_fc);
  EXPECT_EQ(testing::count_bit_differences(back.weights, ck.weights), 0);
  EXPECT_EQ(testing::count_bit_differences(back.adam_m, ck.adam_m), 0);
  EXPECT_EQ(testing::count_bit_differences(back.adam_v, ck.adam_v), 0);
  // The config says norm_before_fc, the tensors lack input_norm.weight: refused by name.
  Checkpoint plain = make_checkpoint(testing::make_tiny_setup(dir), 5);
  const std::string out2 = save_checkpoint(dir + "/run2", plain, dir + "/draft_vocab.safetensors", *self);
  nlohmann::json cfg = nlohmann::json::parse(read_file(out2 + "/config.json"));
  cfg["draft"]["norm_before_fc"] = true;
  write_file_atomic(out2 + "/config.json", cfg.dump());
  EXPECT_NE(testing::error_of([&] { load_checkpoint(out2); }).find("input_norm.weight missing"), std::string::npos);
  // The tensors hold input_norm.weight, the config was edited to lose norm_before_fc: refused by name (the
  // trained norm would be dropped silently).
  cfg = nlohmann::json::parse(read_file(out + "/config.json"));
  cfg["draft"]["norm_before_fc"] = false;
  write_file_atomic(out + "/config.json", cfg.dump());
  const std::string err = testing::error_of([&] { load_checkpoint(out); });
  EXPECT_NE(err.find("holds input_norm.weight"), std::string::npos) << err;
}

TEST(CheckpointTest, LatestSkipsIncompleteAndTmpFolders) {
  const std::string dir = testing::scratch_dir("train_checkpoint_latest");
  auto s = testing::make_tiny_setup(dir);
  save_draft_vocab(dir + "/draft_vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  const std::string run = dir + "/run";
  EXPECT_FALSE(latest_checkpoint(run).has_value());
  EXPECT_THROW(resolve_checkpoint(run), Error);
  for (int64_t step : {5, 20, 7, 9})
    save_checkpoint(run, make_checkpoint(s, step), dir + "/draft_vocab.safetensors", *self);
  EXPECT_EQ(latest_checkpoint(run).value(), checkpoint_dir(run, 20));  // numeric, not creation order
  // Killed while writing step 20: no DONE. And a half-written step 30 still named .tmp.
  fs::remove(checkpoint_dir(run, 20) + "/DONE");
  fs::create_directories(checkpoint_dir(run, 30) + ".tmp");
  fs::copy(checkpoint_dir(run, 9), checkpoint_dir(run, 40) + ".tmp");  // complete files, not renamed
  EXPECT_EQ(latest_checkpoint(run).value(), checkpoint_dir(run, 9));
  EXPECT_EQ(resolve_checkpoint(run), checkpoint_dir(run, 9));
  EXPECT_EQ(resolve_checkpoint(checkpoint_dir(run, 7)), checkpoint_dir(run, 7));
  EXPECT_THROW(load_checkpoint(checkpoint_dir(run, 20)), Error);
  EXPECT_EQ(load_checkpoint(*latest_checkpoint(run)).state.step, 9);
  // Saving step 20 again replaces the DONE-less folder.
  save_checkpoint(run, make_checkpoint(s, 20), dir + "/draft_vocab.safetensors", *self);
  EXPECT_EQ(latest_checkpoint(run).value(), checkpoint_dir(run, 20));
  // Retention: the newest two complete ones stay; incomplete folders are not touched.
  EXPECT_EQ(remove_old_checkpoints(run, 0), 0);
  EXPECT_EQ(remove_old_checkpoints(run, 2), 2);
  EXPECT_FALSE(fs::exists(checkpoint_dir(run, 5)));
  EXPECT_FALSE(fs::exists(checkpoint_dir(run, 7)));
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 9) + "/DONE"));
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 20) + "/DONE"));
  EXPECT_TRUE(fs::exists(checkpoint_dir(run, 30) + ".tmp"));
}

TEST(CheckpointTest, DamagedStateIsRejected) {
  const std::string dir = testing::scratch_dir("train_checkpoint_damaged");
  auto s = testing::make_tiny_setup(dir);
  save_draft_vocab(dir + "/draft_vocab.safetensors", s.vocab, std::vector<int64_t>(16, 1));
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  const std::string out = save_checkpoint(dir + "/run", make_checkpoint(s, 4), dir + "/draft_vocab.safetensors", *self);
  auto state = nlohmann::json::parse(read_file(out + "/state.json"));
  state["step"] = 5;  // tensors say step 4
  write_file_atomic(out + "/state.json", state.dump());
  EXPECT_THROW(load_checkpoint(out), Error);
  state["format_version"] = 2;
  write_file_atomic(out + "/state.json", state.dump());
  EXPECT_THROW(load_checkpoint(out), Error);
}

}  // namespace
}  // namespace aerie
