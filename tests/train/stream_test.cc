// Streaming training's pieces that need no MPI job (the protocol itself: tests/mpi/train_stream.sh): the
// rank layout, the plan's wire form, and the premise of its equality with offline training, that a split
// over extract's shards and one over the prepared file give the same batches.
#include <functional>
#include <string>

#include "core/error.h"
#include "test_util.h"
#include "train/data_order.h"
#include "train/stream.h"

namespace aerie {
namespace {

// The message of the aerie::Error `f` throws contains `text`.
void expect_error(const std::function<void()>& f, const std::string& text) {
  const std::string e = testing::error_of(f);
  EXPECT_NE(e.find(text), std::string::npos) << "error: '" << e << "', expected one containing: " << text;
}

TEST(StreamLayoutTest, SplitsTheWorldIntoTargetReplicasAndTrainers) {
  const StreamLayout l(6, 4, 2);  // ranks 0-3: 2 replicas of tp 2; ranks 4-5 train
  EXPECT_EQ(l.replicas(), 2);
  EXPECT_EQ(l.trainers(), 2);
  EXPECT_EQ(l.leader(1), 2);
  EXPECT_EQ(l.trainer(1), 5);
  EXPECT_TRUE(l.is_target(3));
  EXPECT_FALSE(l.is_target(4));
}

TEST(StreamLayoutTest, RefusesLayoutsWithoutTrainersOrWithABadTp) {
  expect_error([] { StreamLayout(2, 2, 1); }, "streaming needs more ranks than --target-ranks 2");
  expect_error([] { StreamLayout(4, 3, 2); }, "--tp 2 must divide --target-ranks 3");
  expect_error([] { StreamLayout(4, 0, 1); }, "--target-ranks must be >= 1");
}

TEST(StreamPlanTest, RoundTripsThroughItsWireForm) {
  StreamPlan p;
  p.start_step = 12;
  p.total_steps = 90;
  p.batch_size = 4;
  p.seed = 3;
  p.num_samples = 48;
  p.num_train = 46;
  p.num_heldout = 2;
  p.queue = 5;
  p.trainers = 2;
  const StreamPlan q = StreamPlan::from_vector(p.to_vector());
  EXPECT_EQ(q.to_vector(), p.to_vector());
  EXPECT_EQ(q.seed, 3u);
  expect_error([] { StreamPlan::from_vector({1, 2, 3}); }, "a plan of 3 values, expected 9");
}

// The premise of streaming = offline: global sample g counts over the shards in order, and extract's shard c
// holds prepared samples [c S, (c+1) S), so a split over shards of 16 + 16 + 16 samples and one over the
// prepared file's 48 hold out the same samples and draw the same batches.
TEST(StreamPlanTest, ShardsAndThePreparedFileGiveTheSameBatches) {
  const DataSplit shards = make_data_split({"s0", "s1", "s2"}, {16, 16, 16}, 0.05);
  const DataSplit prepared = make_data_split({"prepared.h5"}, {48}, 0.05);
  EXPECT_EQ(shards.train, prepared.train);
  EXPECT_EQ(shards.eval, prepared.eval);
  BatchOrder a(shards, 4, 3), b(prepared, 4, 3);
  for (int64_t step = 0; step < 40; ++step) EXPECT_EQ(a.batch(step), b.batch(step)) << "step " << step;
}

}  // namespace
}  // namespace aerie
