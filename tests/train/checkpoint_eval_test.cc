// Checkpoint choice (train/checkpoint_eval.h): which checkpoints eval --run selects, the best row of a
// table (the highest acceptance length, ties to the later step), the table file, and run_checkpoint_eval on
// the stories260K target over a run folder of three checkpoints: every checkpoint gets a row equal to
// run_eval's figures, a rerun skips the rows it has, other settings and a changed checkpoint are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "eval_testing.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_eval.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

/// A table of rows (step, acceptance length).
CheckpointEvalTable table_of(const std::vector<std::pair<int64_t, double>>& rows) {
  CheckpointEvalTable t;
  t.run_dir = "/runs/x";
  t.settings = {{"num_prompts", 16}};
  for (auto [step, a] : rows) {
    CheckpointEvalRow r;
    r.step = step;
    r.checkpoint = checkpoint_dir(t.run_dir, step);
    r.fingerprint = std::string("f").append(std::to_string(step));
    r.figures = {{"acceptance_length", a}, {"tau_sim", a - 0.5}, {"lossless", true}};
    t.put(r);
  }
  return t;
}

TEST(CheckpointChoice, SelectsAllEveryOrTheListedSteps) {
  const std::vector<int64_t> avail{100, 200, 300, 400, 450};
  EXPECT_EQ(select_checkpoint_steps(avail, 0, {}), avail);
  // Multiples of --every, and the newest (the final draft) though 450 is not one.
  EXPECT_EQ(select_checkpoint_steps(avail, 200, {}), (std::vector<int64_t>{200, 400, 450}));
  EXPECT_EQ(select_checkpoint_steps(avail, 150, {}), (std::vector<int64_t>{300, 450}));
  EXPECT_EQ(select_checkpoint_steps({100, 200}, 100, {}), (std::vector<int64_t>{100, 200}));  // no repeat
  EXPECT_EQ(select_checkpoint_steps(avail, 1000, {}), (std::vector<int64_t>{450}));
  // --steps: exactly those, ascending, once.
  EXPECT_EQ(select_checkpoint_steps(avail, 0, {400, 100, 400}), (std::vector<int64_t>{100, 400}));
  const std::string missing = testing::error_of([&] { select_checkpoint_steps(avail, 0, {100, 250}); });
  EXPECT_NE(missing.find("no complete checkpoint of step 250"), std::string::npos) << missing;
  EXPECT_NE(missing.find("100, 200, 300, 400, 450"), std::string::npos) << missing;
  EXPECT_NE(testing::error_of([&] { select_checkpoint_steps({}, 0, {}); }).find("no complete checkpoint"),
            std::string::npos);
  EXPECT_THROW(select_checkpoint_steps(avail, -1, {}), Error);
  EXPECT_THROW(select_checkpoint_steps(avail, 0, {0}), Error);
}

TEST(CheckpointChoice, BestIsTheHighestAcceptanceLengthTiesToTheLaterStep) {
  EXPECT_EQ(best_checkpoint(table_of({{100, 1.9}, {200, 2.4}, {300, 2.2}}), "t.json").step, 200);
  // Equal acceptance lengths: the later step, wherever the tie lies.
  EXPECT_EQ(best_checkpoint(table_of({{100, 2.4}, {200, 2.4}, {300, 2.2}}), "t.json").step, 200);
  EXPECT_EQ(best_checkpoint(table_of({{100, 2.0}, {200, 2.0}, {300, 2.0}}), "t.json").step, 300);
  EXPECT_EQ(best_checkpoint(table_of({{300, 2.5}, {100, 2.5}, {200, 1.0}}), "t.json").step, 300);  // put sorts
  EXPECT_EQ(best_checkpoint(table_of({{100, 3.0}, {200, 2.99999}}), "t.json").step, 100);
  const std::string empty = testing::error_of([] { best_checkpoint(table_of({}), "/runs/x/checkpoint_eval.json"); });
  EXPECT_NE(empty.find("/runs/x/checkpoint_eval.json"), std::string::npos) << empty;
  EXPECT_NE(empty.find("no row"), std::string::npos) << empty;
  // The printed table marks that row.
  const std::string text = format_checkpoint_table(table_of({{100, 2.0}, {200, 2.0}}));
  const std::string line100 = "       100              2.000    1.500  yes     \n";
  const std::string line200 = "       200              2.000    1.500  yes       * best\n";
  EXPECT_NE(text.find(line100), std::string::npos) << text;
  EXPECT_NE(text.find(line200), std::string::npos) << text;
}

TEST(CheckpointChoice, TableFileRoundTripAndErrors) {
  const std::string dir = testing::scratch_dir("checkpoint_eval_file");
  CheckpointEvalTable t = table_of({{200, 2.1}, {100, 1.5}});
  t.untrained = {{"seed", 0}, {"acceptance_length", 1.2}};
  t.put(table_of({{100, 1.7}}).rows[0]);  // replaces step 100
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0].step, 100);
  EXPECT_DOUBLE_EQ(t.rows[0].acceptance_length(), 1.7);
  const std::string path = dir + "/checkpoint_eval.json";
  write_file_atomic(path, t.to_json().dump(2));
  const nlohmann::json j = nlohmann::json::parse(read_file(path));
  EXPECT_EQ(j["format"], kCheckpointEvalFormat);
  EXPECT_TRUE(j.contains("aerie_version"));
  EXPECT_EQ(j["checkpoints"][1]["step"], 200);
  const CheckpointEvalTable back = read_checkpoint_eval(path);
  EXPECT_EQ(back.to_json(), t.to_json());
  EXPECT_EQ(back.find(200)->fingerprint, "f200");
  EXPECT_EQ(back.find(300), nullptr);

  const std::string none = testing::error_of([&] { read_checkpoint_eval(dir + "/absent.json"); });
  EXPECT_NE(none.find("no checkpoint table " + dir + "/absent.json"), std::string::npos) << none;
  EXPECT_NE(none.find("aerie eval --run"), std::string::npos) << none;
  nlohmann::json other = j;
  other["format"] = "aerie.eval";
  write_file_atomic(dir + "/other.json", other.dump());
  EXPECT_NE(testing::error_of([&] { read_checkpoint_eval(dir + "/other.json"); }).find("not a checkpoint table"),
            std::string::npos);
  other = j;
  other["format_version"] = 2;
  write_file_atomic(dir + "/v2.json", other.dump());
  EXPECT_NE(testing::error_of([&] { read_checkpoint_eval(dir + "/v2.json"); }).find("format version 2"),
            std::string::npos);
  other = j;
  other["checkpoints"][0].erase("acceptance_length");
  write_file_atomic(dir + "/noacc.json", other.dump());
  EXPECT_NE(testing::error_of([&] { read_checkpoint_eval(dir + "/noacc.json"); }).find("has no acceptance_length"),
            std::string::npos);
}

TEST(CheckpointChoice, SettingsDifferenceNamesTheKeys) {
  const nlohmann::json a = {{"num_prompts", 16}, {"dtype", "f32"}, {"prompts", "/p.txt"}};
  nlohmann::json b = a;
  EXPECT_EQ(settings_difference(a, b), "");
  b["num_prompts"] = 32;
  b["dtype"] = "bf16";
  EXPECT_EQ(settings_difference(a, b), "dtype: \"f32\" -> \"bf16\"; num_prompts: 16 -> 32");
  EXPECT_EQ(settings_difference(a, b, {"dtype"}), "num_prompts: 16 -> 32");
  b.erase("prompts");
  EXPECT_NE(settings_difference(a, b).find("prompts: \"/p.txt\" -> \"(none)\""), std::string::npos);
}

TEST(CheckpointChoice, FingerprintFollowsTheWeightsAndStep) {
  const std::string dir = testing::scratch_dir("checkpoint_eval_fingerprint");
  auto write = [](const std::string& d, const std::string& weights, int step) {
    fs::create_directories(d);
    std::ofstream(d + "/draft.safetensors", std::ios::binary) << weights;
    std::ofstream(d + "/state.json") << nlohmann::json{{"step", step}}.dump();
  };
  write(dir + "/a", std::string(100000, 'x'), 5);
  write(dir + "/b", std::string(100000, 'x'), 5);  // a copy elsewhere
  write(dir + "/c", std::string(100000, 'x'), 6);
  std::string other(100000, 'x');
  other[0] = 'y';
  write(dir + "/d", other, 5);
  const std::string a = checkpoint_fingerprint(dir + "/a");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(checkpoint_fingerprint(dir + "/b"), a);
  EXPECT_NE(checkpoint_fingerprint(dir + "/c"), a);
  EXPECT_NE(checkpoint_fingerprint(dir + "/d"), a);
  EXPECT_NE(testing::error_of([&] { checkpoint_fingerprint(dir + "/none"); }).find("draft.safetensors"),
            std::string::npos);
}

/// A run folder of stories260K drafts: checkpoints at `steps`, each full_vocab_draft(seed = step).
class CheckpointEvalRunTest : public testing::StoriesTargetTest {
 protected:
  void save(const std::string& run, int64_t step, uint64_t seed) {
    LoadedDraft d = testing::full_vocab_draft(*model_, seed);
    const std::string vocab = run + "/draft_vocab.safetensors";
    if (!fs::exists(vocab))
      save_draft_vocab(vocab, d.vocab, std::vector<int64_t>(static_cast<size_t>(model_->config().vocab_size), 1));
    Checkpoint ck;
    ck.config = d.cfg;
    ck.train_options = nlohmann::json::object();
    ck.weights = d.weights;
    ck.adam_m = DraftWeights::zeros(d.cfg);
    ck.adam_v = DraftWeights::zeros(d.cfg);
    ck.state.step = step;
    ck.state.total_steps = 300;
    ck.state.batch_size = 1;
    ck.state.steps_per_epoch = 300;
    ck.state.split = make_data_split({"/x/shard-00000.h5"}, {10}, 0.1);
    save_checkpoint(run, ck, vocab, *self_);
  }
  /// 3 prompts of 16 new tokens, chains of 3, 2 TTT steps on the greedy answers.
  EvalOptions options() const {
    EvalOptions o;
    o.model_dir = testing::model_dir();
    o.prompts_path = testing::data_dir() + "/tinystories/tinystories_val.txt";
    o.output_path = "";
    o.num_prompts = 3;
    o.max_new_tokens = 16;
    o.num_draft_tokens = 3;
    o.ttt_steps = 2;
    return o;
  }
};

TEST_F(CheckpointEvalRunTest, EveryCheckpointRerunSkipsAndRefusals) {
  const std::string run = testing::scratch_dir("checkpoint_eval_run");
  for (int64_t step : {100, 200, 300}) save(run, step, static_cast<uint64_t>(step));
  const EvalOptions o = options();
  CheckpointEvalOptions c;
  c.run_dir = run;
  const CheckpointEvalTable t = run_checkpoint_eval(o, c);
  const std::string path = run + "/checkpoint_eval.json";
  ASSERT_TRUE(fs::exists(path));
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(read_checkpoint_eval(path).to_json(), t.to_json());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.rows[i].step, 100 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(t.rows[i].checkpoint, checkpoint_dir(run, t.rows[i].step));
    EXPECT_EQ(t.rows[i].fingerprint, checkpoint_fingerprint(t.rows[i].checkpoint));
    EXPECT_GE(t.rows[i].acceptance_length(), 1.0);
    EXPECT_TRUE(t.rows[i].figures["lossless"].get<bool>());
  }
  EXPECT_EQ(t.settings["num_prompts"], 3);
  EXPECT_EQ(t.settings["dtype"], "f32");
  EXPECT_EQ(t.settings["model"], fs::weakly_canonical(testing::model_dir()).string());
  // A row holds the figures run_eval gives for that checkpoint alone.
  EvalOptions one = o;
  one.draft_path = checkpoint_dir(run, 200);
  const nlohmann::json alone = run_eval(one);
  for (const char* k : {"acceptance_length", "tau_sim", "verify_passes", "acc_k", "acceptance_rate_per_position"})
    EXPECT_EQ(t.find(200)->figures[k], alone[k]) << k;

  // A rerun evaluates nothing it has: a row edited in the file stays as it is (and becomes the best).
  nlohmann::json j = nlohmann::json::parse(read_file(path));
  j["checkpoints"][1]["acceptance_length"] = 99.0;
  write_file_atomic(path, j.dump(2));
  const CheckpointEvalTable again = run_checkpoint_eval(o, c);
  EXPECT_DOUBLE_EQ(again.find(200)->acceptance_length(), 99.0);
  EXPECT_EQ(best_checkpoint(again, path).step, 200);
  const std::string kept = read_file(path);

  // The same prompts at another path (a run moved with its files): compared by content, nothing to do.
  const std::string moved_prompts = run + "/prompts.txt";
  write_file_atomic(moved_prompts, read_file(o.prompts_path));
  EvalOptions moved = o;
  moved.prompts_path = moved_prompts;
  EXPECT_DOUBLE_EQ(run_checkpoint_eval(moved, c).find(200)->acceptance_length(), 99.0);
  EXPECT_EQ(read_file(path), kept) << "the rows stay (the prompts' path is not a setting that differs)";
  // Other prompts at that path are other settings.
  write_file_atomic(moved_prompts, read_file(o.prompts_path) + "\nA new story.\n");
  EXPECT_NE(testing::error_of([&] { run_checkpoint_eval(moved, c); }).find("prompts_sha256"), std::string::npos);

  // Other settings: refused naming the file and the setting; the file is untouched.
  EvalOptions other = o;
  other.max_new_tokens = 8;
  const std::string diff = testing::error_of([&] { run_checkpoint_eval(other, c); });
  EXPECT_NE(diff.find(path + " was made with other eval settings"), std::string::npos) << diff;
  EXPECT_NE(diff.find("max_new_tokens: 16 -> 8"), std::string::npos) << diff;
  EXPECT_EQ(read_file(path), kept);

  // --every 200 into another table: 200 and the newest, 300; with the untrained draft once.
  CheckpointEvalOptions every = c;
  every.every = 200;
  every.table_path = run + "/every.json";
  EvalOptions with_untrained = o;
  with_untrained.untrained = true;
  const CheckpointEvalTable e = run_checkpoint_eval(with_untrained, every);
  ASSERT_EQ(e.rows.size(), 2u);
  EXPECT_EQ(e.rows[0].step, 200);
  EXPECT_EQ(e.rows[1].step, 300);
  EXPECT_EQ(e.rows[0].figures["acceptance_length"], t.find(200)->figures["acceptance_length"]);  // not the edit
  EXPECT_EQ(e.rows[1].figures["acceptance_length"], t.find(300)->figures["acceptance_length"]);
  ASSERT_TRUE(e.untrained.is_object());
  EXPECT_EQ(e.untrained["seed"], 0);
  EXPECT_GE(e.untrained["acceptance_length"].get<double>(), 1.0);
  // --steps 100 into the same table adds the row of step 100, keeping the others.
  CheckpointEvalOptions listed = every;
  listed.every = 0;
  listed.steps = {100};
  const CheckpointEvalTable l = run_checkpoint_eval(with_untrained, listed);
  ASSERT_EQ(l.rows.size(), 3u);
  EXPECT_EQ(l.find(100)->figures["acceptance_length"], t.find(100)->figures["acceptance_length"]);
  EXPECT_EQ(l.untrained, e.untrained);
  listed.steps = {150};
  EXPECT_NE(testing::error_of([&] { run_checkpoint_eval(o, listed); }).find("no complete checkpoint of step 150"),
            std::string::npos);

  // The run trained again into the same folder: its step 300 is another checkpoint now.
  save(run, 300, 7);
  const std::string changed = testing::error_of([&] { run_checkpoint_eval(o, c); });
  EXPECT_NE(changed.find(path + " holds step 300 of another checkpoint"), std::string::npos) << changed;
  EXPECT_EQ(read_file(path), kept);
}

}  // namespace
}  // namespace aerie
