// One whole draft training step (train_step): finite metrics, the loss falls over a few steps, lr 0 leaves
// the weights alone, and data parallelism: a dp step equals the dp = 1 step on the same global batch
// (run under mpirun -np 2 by tests/mpi/train.cmake; on one rank the dp side is trivially dp = 1).
#include <cmath>
#include <memory>

#include "comm/communicator.h"
#include "train/data_order.h"
#include "train/train_testing.h"
#include "train/trainer.h"

namespace aerie {
namespace {

std::vector<TTTSample> make_batch(const testing::TinyTrainSetup& s, int n, uint64_t seed) {
  std::vector<TTTSample> b;
  for (int i = 0; i < n; ++i) b.push_back(testing::make_random_sample(s, 9 + 3 * i, seed + static_cast<uint64_t>(i)));
  return b;
}

std::string rank_scratch(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return testing::scratch_dir(name + "_r" + std::to_string(rank));
}

/// One rank training alone on a batch of 3 samples of s (seed 100): the state of the single-rank step tests.
struct SoloTraining {
  explicit SoloTraining(const testing::TinyTrainSetup& setup)
      : self(MpiCommunicator::world()->split(MpiCommunicator::world()->rank(), 0)),
        batch(make_batch(setup, 3, 100)),
        w(testing::clone_weights(setup.w)),
        opt(AdamState::zeros(setup.cfg)),
        scratch(StepScratch::zeros(setup.cfg)) {}
  std::unique_ptr<MpiCommunicator> self;
  std::vector<TTTSample> batch;
  DraftWeights w;
  AdamState opt;
  StepScratch scratch;
};

TEST(TrainStepTest, OneStepIsFiniteAndTheLossFalls) {
  auto s = testing::make_tiny_setup(rank_scratch("train_step_finite"));
  SoloTraining solo(s);
  auto& [self, batch, w, opt, scratch] = solo;
  StepMetrics first = train_step(s.cfg, w, opt, s.embed, batch, s.vocab, 3, 1e-2, 0.5, *self, scratch);
  EXPECT_EQ(opt.step, 1);
  EXPECT_TRUE(std::isfinite(first.loss()) && first.loss() > 0) << first.loss();
  EXPECT_TRUE(std::isfinite(first.grad_norm) && first.grad_norm > 0);
  EXPECT_GT(first.tokens, 0);
  for (auto& [n, t] : w.named())
    for (float v : t->to_float_vector()) ASSERT_TRUE(std::isfinite(v)) << n;
  EXPECT_GT(testing::count_bit_differences(w, s.w), 0);
  // valid_k of the batch = the sum of ttt_valid_counts.
  for (int k = 0; k < 3; ++k) {
    int64_t v = 0;
    for (const auto& b : batch) v += ttt_valid_counts(b, s.vocab.t2d, 3)[static_cast<size_t>(k)];
    EXPECT_EQ(first.valid[static_cast<size_t>(k)], v);
  }
  StepMetrics last;
  for (int i = 0; i < 15; ++i) last = train_step(s.cfg, w, opt, s.embed, batch, s.vocab, 3, 1e-2, 0.5, *self, scratch);
  EXPECT_LT(last.loss(), 0.9 * first.loss()) << "16 AdamW steps on one batch should fit it";
  EXPECT_GE(last.tau_sim(), 1.0);

  // lr 0: AdamW moves nothing (the moments still update).
  DraftWeights before = testing::clone_weights(w);
  train_step(s.cfg, w, opt, s.embed, batch, s.vocab, 3, 0.0, 0.5, *self, scratch);
  EXPECT_EQ(testing::count_bit_differences(w, before), 0);
}

TEST(TrainStepTest, MetricsFormulas) {
  StepMetrics m;
  m.loss_sum = {4.0, 3.0, 0.0};
  m.valid = {2, 1, 0};
  m.correct = {1, 1, 0};
  m.acc_rows = {2, 4, 0};
  EXPECT_DOUBLE_EQ(m.loss(), 2.0 + 0.8 * 3.0);  // L_k / max(1, valid_k), weights 0.8^k
  EXPECT_EQ(m.acc_k(), (std::vector<double>{0.5, 0.25, 0.0}));
  EXPECT_DOUBLE_EQ(m.tau_sim(), 1.0 + 0.5 + 0.5 * 0.25);
}

// Two steps of a global batch of B on the world's dp ranks (rank r gets entries r, r + dp, ...) against
// the same two steps on one rank with the whole batch.
void dp_matches_single_rank(int B, bool bitwise, bool norm_before_fc = false) {
  auto s = testing::make_tiny_setup(rank_scratch("train_step_dp_B" + std::to_string(B)));
  if (norm_before_fc) testing::enable_norm_before_fc(s, 41);
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  std::vector<TTTSample> batch = make_batch(s, B, 7);
  std::vector<TTTSample> mine;
  for (size_t i = static_cast<size_t>(world->rank()); i < batch.size(); i += static_cast<size_t>(world->size()))
    mine.push_back(batch[i]);

  DraftWeights wd = testing::clone_weights(s.w), w1 = testing::clone_weights(s.w);
  AdamState od = AdamState::zeros(s.cfg), o1 = AdamState::zeros(s.cfg);
  StepScratch sd = StepScratch::zeros(s.cfg), s1 = StepScratch::zeros(s.cfg);
  for (int step = 0; step < 2; ++step) {
    StepMetrics md = train_step(s.cfg, wd, od, s.embed, mine, s.vocab, 4, 1e-3, 0.5, *world, sd);
    StepMetrics m1 = train_step(s.cfg, w1, o1, s.embed, batch, s.vocab, 4, 1e-3, 0.5, *self, s1);
    EXPECT_EQ(md.valid, m1.valid);
    EXPECT_EQ(md.correct, m1.correct);
    EXPECT_EQ(md.tokens, m1.tokens);
    EXPECT_NEAR(md.loss(), m1.loss(), 1e-4 * m1.loss());  // loss sums travel in fp32 (logging only)
  }
  if (bitwise) {
    EXPECT_EQ(testing::count_bit_differences(wd, w1), 0);
    EXPECT_EQ(testing::count_bit_differences(od.m, o1.m), 0);
    EXPECT_EQ(testing::count_bit_differences(od.v, o1.v), 0);
  } else {
    // Other summation order of the per-sample gradients: fp32 rounding (~1e-7 relative) in the gradient;
    // AdamW's update is lr * m_hat / (sqrt(v_hat) + eps), bounded by ~lr per element, and moves by a tiny
    // fraction of lr under such a perturbation. 1e-3 * lr is far above that and far below one update.
    auto a = wd.named();
    auto b = w1.named();
    for (size_t i = 0; i < a.size(); ++i)
      testing::expect_close(a[i].second->to_float_vector(), b[i].second->to_float_vector(), 1e-6f, 0.0f, a[i].first);
  }
  // Every rank holds the same weights.
  Tensor sum = wd.fc.clone();
  world->all_reduce_sum(sum);
  std::vector<float> f = wd.fc.to_float_vector(), g = sum.to_float_vector();
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(g[i], f[i] * static_cast<float>(world->size())) << i;
}

TEST(TrainStepDpTest, OneSamplePerRankIsBitwiseEqualToOneRank) {
  auto world = MpiCommunicator::world();
  // B = dp: each rank has one sample. With 2 ranks both runs compute g0 + g1 (commutative); with more,
  // MPI's summation order is not promised, so only the tolerance holds.
  dp_matches_single_rank(world->size(), world->size() <= 2);
  dp_matches_single_rank(world->size(), world->size() <= 2, true);  // input_norm's gradient summed over dp too
}

TEST(TrainStepDpTest, SeveralSamplesPerRankMatchOneRankWithinFp32Rounding) {
  auto world = MpiCommunicator::world();
  dp_matches_single_rank(2 * world->size() + 1, world->size() == 1);
  dp_matches_single_rank(2 * world->size() + 1, world->size() == 1, true);
}

// EAGLE-3.1's norm_before_fc in a training step: input_norm [3 H_t] has a gradient, AdamW moments and moves
// like the other weights; the loss falls as without the option.
TEST(TrainStepTest, NormBeforeFcTrainsInputNorm) {
  auto s = testing::make_tiny_setup(rank_scratch("train_step_norm_before_fc"));
  testing::enable_norm_before_fc(s, 43);
  SoloTraining solo(s);
  auto& [self, batch, w, opt, scratch] = solo;
  ASSERT_TRUE(opt.m.input_norm.defined() && opt.v.input_norm.defined() && scratch.grads.input_norm.defined());
  const std::vector<float> before = w.input_norm.to_float_vector();
  StepMetrics first = train_step(s.cfg, w, opt, s.embed, batch, s.vocab, 3, 1e-2, 0.5, *self, scratch);
  const std::vector<float> after = w.input_norm.to_float_vector();
  size_t moved = 0;
  for (size_t i = 0; i < after.size(); ++i) moved += after[i] != before[i];
  EXPECT_EQ(moved, after.size()) << "every input_norm entry gets an AdamW update";
  for (float v : opt.v.input_norm.to_float_vector()) EXPECT_GT(v, 0.0f);
  StepMetrics last;
  for (int i = 0; i < 15; ++i) last = train_step(s.cfg, w, opt, s.embed, batch, s.vocab, 3, 1e-2, 0.5, *self, scratch);
  EXPECT_LT(last.loss(), 0.9 * first.loss());
}

// The EAGLE-3.1 switches are resume options, each refused by its own name when it differs (and an older
// checkpoint without the key counts as off); apply_draft_shape carries them into the draft config.
TEST(TrainOptionsTest, EagleOneSwitchesAreResumeOptions) {
  TrainOptions o;
  nlohmann::json ck = o.to_json();
  EXPECT_EQ(ck["draft_norm_before_fc"], false);
  o.check_resumable(ck);
  ck.erase("draft_norm_before_fc");
  o.check_resumable(ck);  // older checkpoints: off
  o.draft_norm_before_fc = true;
  const std::string e = testing::error_of([&] { o.check_resumable(ck); });
  EXPECT_NE(e.find("--draft-norm-before-fc is on but the checkpoint was trained with it off"), std::string::npos) << e;
  o.check_resumable(o.to_json());
  DraftConfig c;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  EXPECT_TRUE(o.apply_draft_shape(c).norm_before_fc);
  o.draft_norm_before_fc = false;
  EXPECT_FALSE(o.apply_draft_shape(c).norm_before_fc);
}

// The recipe options of issue 15 item 4. The loss weights: 0.8^k over each step's trained rows, or over
// all rows of the global batch; beta2 changes the update; resume refuses another recipe by the option's name
// (an older checkpoint without the keys counts as aerie's defaults).
TEST(TrainRecipeTest, StepWeightsOverTrainedOrAllRows) {
  const std::vector<double> v = ttt_step_weights({10, 8, 0}, 40, 3, StepRecipe{});
  EXPECT_DOUBLE_EQ(v[0], 1.0 / 10);
  EXPECT_DOUBLE_EQ(v[1], 0.8 / 8);
  EXPECT_DOUBLE_EQ(v[2], 0.64 / 1);  // no trained row: max(1, 0)
  StepRecipe all;
  all.normalize_by_all_rows = true;
  const std::vector<double> a = ttt_step_weights({10, 8, 0}, 40, 3, all);
  EXPECT_DOUBLE_EQ(a[0], 1.0 / 40);
  EXPECT_DOUBLE_EQ(a[1], 0.8 / 40);
  EXPECT_DOUBLE_EQ(a[2], 0.64 / 40);
  EXPECT_NE(testing::error_of([&] { ttt_step_weights({1, 2}, 4, 3, all); }).find("2 counts for 3 steps"),
            std::string::npos);
}

TEST(TrainRecipeTest, Beta2AndAllRowsChangeTheStep) {
  auto s = testing::make_tiny_setup(rank_scratch("train_recipe"));
  SoloTraining a(s), b(s), c(s);
  train_step(s.cfg, a.w, a.opt, s.embed, a.batch, s.vocab, 3, 1e-2, 0.5, *a.self, a.scratch);
  EXPECT_EQ(StepRecipe{}.adam_beta2, TrainOptions{}.adam_beta2) << "train_step's default is train's";
  StepRecipe beta;
  beta.adam_beta2 = 0.95;  // the default before 2026-12-03
  train_step(s.cfg, b.w, b.opt, s.embed, b.batch, s.vocab, 3, 1e-2, 0.5, *b.self, b.scratch, nullptr, beta);
  StepRecipe all;
  all.normalize_by_all_rows = true;
  const StepMetrics mc =
      train_step(s.cfg, c.w, c.opt, s.embed, c.batch, s.vocab, 3, 1e-2, 0.5, *c.self, c.scratch, nullptr, all);
  EXPECT_GT(testing::count_bit_differences(a.w, b.w), 0) << "beta2 0.95 gave the update of 0.999";
  EXPECT_GT(testing::count_bit_differences(a.opt.v, b.opt.v), 0);
  EXPECT_GT(testing::count_bit_differences(a.opt.m, c.opt.m), 0) << "all-rows normalization left the gradient unchanged";
  EXPECT_TRUE(std::isfinite(mc.grad_norm) && mc.grad_norm > 0);
}

// --weight-decay: AdamW's decoupled decay (kernels/optim.h). A step with decay wd moves every weight w by
// -lr wd w more than the same step without it (to fp32 rounding: the update term is the same, as decay does
// not change the gradient or the moments), and the moments are bitwise those of the step without decay.
TEST(TrainRecipeTest, WeightDecayShrinksEveryWeightByLrTimesDecay) {
  auto s = testing::make_tiny_setup(rank_scratch("train_recipe_wd"));
  SoloTraining a(s), b(s);
  const std::vector<float> w0 = a.w.lm_head.to_float_vector();
  const double lr = 1e-2, wd = 0.1;
  train_step(s.cfg, a.w, a.opt, s.embed, a.batch, s.vocab, 3, lr, 0.5, *a.self, a.scratch);
  StepRecipe decay;
  decay.weight_decay = wd;
  train_step(s.cfg, b.w, b.opt, s.embed, b.batch, s.vocab, 3, lr, 0.5, *b.self, b.scratch, nullptr, decay);
  EXPECT_EQ(testing::count_bit_differences(a.opt.m, b.opt.m), 0) << "decay changed the gradient";
  EXPECT_EQ(testing::count_bit_differences(a.opt.v, b.opt.v), 0);
  const std::vector<float> wa = a.w.lm_head.to_float_vector(), wb = b.w.lm_head.to_float_vector();
  double worst = 0, scale = 0;
  size_t moved = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    // torch: p *= 1 - lr wd, then p -= lr m_hat / (sqrt(v_hat) + eps): wb = w0 (1 - lr wd) - u, wa = w0 - u
    worst = std::max(worst, std::fabs((wb[i] - wa[i]) - (-lr * wd * w0[i])));
    scale = std::max(scale, std::fabs(lr * wd * w0[i]));
    moved += wb[i] != wa[i];
  }
  EXPECT_GT(moved, w0.size() / 2) << "decay left most lm_head weights where the plain step put them";
  EXPECT_LT(worst, 1e-3 * scale + 1e-7) << "the difference is not -lr wd w";
  TrainOptions o;
  EXPECT_EQ(o.weight_decay, 0.0) << "EAGLE's and SpecForge's default";
  EXPECT_EQ(StepRecipe{}.weight_decay, o.weight_decay);
}

TEST(TrainRecipeTest, RandomLmHeadKeepsTheOtherDraws) {
  auto s = testing::make_tiny_setup(rank_scratch("train_recipe_init"));
  const std::vector<int64_t> sel = s.vocab.selected();
  const DraftWeights t = init_draft_weights(s.cfg, s.lm_head, sel, 5);
  const DraftWeights r = init_draft_weights(s.cfg, s.lm_head, sel, 5, true);
  EXPECT_EQ(testing::count_bit_differences(init_draft_weights(s.cfg, s.lm_head, sel, 5, true), r), 0);
  const std::vector<float> lt = t.lm_head.to_float_vector(), lr = r.lm_head.to_float_vector();
  size_t same = 0;
  const float bound = 1.0f / std::sqrt(static_cast<float>(s.cfg.hidden_size));
  for (size_t i = 0; i < lr.size(); ++i) {
    same += lr[i] == lt[i];
    EXPECT_LE(std::fabs(lr[i]), bound);
  }
  EXPECT_EQ(same, 0u) << "the random lm_head kept target rows";
  EXPECT_EQ(testing::count_bit_differences(t, r), static_cast<int64_t>(lr.size()))
      << "only the lm_head may differ: the other linears are the same draws";
}

// A resume with several changed options names them all at once (one rerun fixes them), in the form each
// had alone.
TEST(TrainRecipeTest, ResumeNamesEveryChangedOption) {
  TrainOptions o;
  const nlohmann::json ck = o.to_json();
  o.check_resumable(ck);
  o.batch_size += 4;
  o.lr *= 2;
  o.draft_fc_norm = !o.draft_fc_norm;
  const std::string e = testing::error_of([&] { o.check_resumable(ck); });
  EXPECT_NE(e.find("--batch-size is " + std::to_string(o.batch_size) + " but the checkpoint was trained with " +
                   std::to_string(o.batch_size - 4)), std::string::npos) << e;
  EXPECT_NE(e.find("--lr is "), std::string::npos) << e;
  EXPECT_NE(e.find("--draft-fc-norm is on but the checkpoint was trained with it off"), std::string::npos) << e;
  EXPECT_NE(e.find("(3 options differ)"), std::string::npos) << e;
  EXPECT_NE(e.find("--init-draft"), std::string::npos) << e;
}

TEST(TrainRecipeTest, RecipeIsAResumeOption) {
  TrainOptions o;
  EXPECT_EQ(o.adam_beta2, 0.999);  // the default since 2026-12-03 (docs/design.md, the recipe)
  nlohmann::json ck = o.to_json();
  for (const char* k : {"adam_beta1", "adam_beta2", "lm_head_init", "loss_normalization"}) ck.erase(k);
  // An older checkpoint, without the keys: trained with beta2 0.95, which a resume takes when --adam-beta2
  // is not given, and refuses by name when 0.999 is given.
  o.adam_beta2_given = true;
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); }).find("--adam-beta2 is 0.999 but the checkpoint was trained with 0.95"),
            std::string::npos);
  o.adam_beta2_given = false;
  const std::vector<std::string> lines = o.adopt_checkpoint_defaults(ck);
  EXPECT_EQ(o.adam_beta2, 0.95);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("AdamW beta2 0.95 as the checkpoint was trained"), std::string::npos) << lines.back();
  o.check_resumable(ck);
  TrainOptions today;  // a checkpoint of today's defaults resumes with them, and nothing is logged
  EXPECT_TRUE(today.adopt_checkpoint_defaults(TrainOptions{}.to_json()).empty());
  EXPECT_EQ(today.adam_beta2, 0.999);
  o.lm_head_init = "random";
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); }).find("--lm-head-init is \"random\""), std::string::npos);
  o.lm_head_init = "target";
  o.loss_normalization = "all";
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); }).find("--loss-normalization"), std::string::npos);
  o.loss_normalization = "valid";
  // weight decay: a checkpoint without the key was trained without decay
  o.weight_decay = 0.01;
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); }).find("--weight-decay is 0.01 but the checkpoint was trained with 0.0"),
            std::string::npos)
      << testing::error_of([&] { o.check_resumable(ck); });
  o.weight_decay = 0;
  o.check_resumable(ck);
}


TEST(AutoSlidingWindowTest, PowerOfTwoAtOrAboveTheNinetiethPercentile) {
  // 10 samples: the nearest-rank 90th percentile is the 9th smallest (ceil(0.9 * 10) = 9), here 137.
  std::vector<int64_t> lengths = {93, 20, 470, 137, 50, 60, 70, 80, 90, 100};
  AutoWindow w = auto_sliding_window(lengths, 2048);
  EXPECT_EQ(w.p90, 137);
  EXPECT_EQ(w.window, 256);
  EXPECT_EQ(w.longest, 470);
  EXPECT_EQ(w.count, 10);
  EXPECT_NEAR(w.mean, 117.0, 1e-12);
  // A percentile that is a power of two is its own window; 11 samples: the 10th smallest (ceil(9.9) = 10).
  EXPECT_EQ(auto_sliding_window({128, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 0).window, 1);
  EXPECT_EQ(auto_sliding_window({128, 128, 1, 1, 1, 1, 1, 1, 1, 1}, 0).window, 128);
  EXPECT_EQ(auto_sliding_window({129, 128, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 0).p90, 128);
  EXPECT_EQ(auto_sliding_window({7}, 0).window, 8);
  // A window that reaches the target's positions would never apply: none.
  EXPECT_EQ(auto_sliding_window({300}, 512).window, 0);
  EXPECT_EQ(auto_sliding_window({300}, 513).window, 512);
  EXPECT_NE(testing::error_of([] { auto_sliding_window({}, 0); }).find("no training sample"), std::string::npos);
  EXPECT_NE(testing::error_of([] { auto_sliding_window({5, 0}, 0); }).find("a training sample of 0 tokens"),
            std::string::npos);
}

TEST(AutoSlidingWindowTest, ResumeComparesThePickedWindow) {
  TrainOptions o;
  o.draft_sliding_window_auto = true;
  o.draft_sliding_window = 256;  // as run_training resolves it
  const nlohmann::json ck = o.to_json();
  EXPECT_EQ(ck["draft_sliding_window_auto"], true);
  o.check_resumable(ck);  // the same samples pick the same window
  TrainOptions given;     // the window given as a number: the same draft, still recorded as auto's
  given.draft_sliding_window = 256;
  given.check_resumable(ck);
  EXPECT_TRUE(given.adopt_checkpoint_defaults(ck).empty());
  EXPECT_TRUE(given.draft_sliding_window_auto);
  TrainOptions other;  // another number stays that number, and is refused
  other.draft_sliding_window = 128;
  other.adopt_checkpoint_defaults(ck);
  EXPECT_FALSE(other.draft_sliding_window_auto);
  TrainOptions none;  // a requeued job that lost the option
  EXPECT_NE(testing::error_of([&] { none.check_resumable(ck); })
                .find("--draft-sliding-window is 0 but the checkpoint was trained with auto (256 keys)"),
            std::string::npos);
  o.draft_sliding_window = 128;  // other samples
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); })
                .find("--draft-sliding-window is auto (128 keys) but the checkpoint was trained with auto (256 keys) "
                      "(auto picks from the training samples: these are not the samples it was trained on"),
            std::string::npos);
  o.draft_sliding_window = 0;  // a pick that reached the target's positions
  EXPECT_NE(testing::error_of([&] { o.check_resumable(ck); }).find("is auto (no window) but"), std::string::npos);
}

}  // namespace
}  // namespace aerie
