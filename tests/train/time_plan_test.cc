// The time plan's arithmetic (train/time_plan.h): measured curves read between and beyond their points,
// calibration.json read back as written and refused by name when malformed, and extract / train predicted from a
// calibration whose numbers make the expected hours easy to state.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "train/time_plan.h"

namespace aerie {
namespace {

Calibration example() {
  Calibration c;
  c.device = "test";
  c.model = "m/config.json";
  c.world = 2;
  c.tp = 1;
  c.hidden_size = 64;
  c.base = {{100, 1000}, {0.01, 0.1}};
  c.layers = {{"dense", 3, {{100, 1000}, {0.02, 0.2}}}, {"moe", 2, {{100, 1000}, {0.05, 0.5}}}};
  c.train_sample = {{100, 1000}, {0.1, 1.0}};
  c.ttt_steps = 7;
  c.writer_sample = {{64, 2048}, {0.0, 0.0}};  // the tests below add their own
  c.disk_write_bytes_per_s = 1e9;
  c.disk_test_bytes = 1 << 20;
  return c;
}

TEST(TimePlan, CurvesInterpolateAndExtrapolate) {
  const TimeCurve c{{100, 1000}, {1.0, 10.0}};
  EXPECT_DOUBLE_EQ(c.at(100), 1.0);
  EXPECT_DOUBLE_EQ(c.at(550), 5.5);
  EXPECT_DOUBLE_EQ(c.at(2000), 20.0);  // beyond: along the last segment
  EXPECT_DOUBLE_EQ(c.at(0), 0.0);      // before: the first segment, never below 0
  const TimeCurve one{{512}, {2.0}};
  EXPECT_DOUBLE_EQ(one.at(1024), 4.0);
  const TimeCurve three{{1, 2, 4}, {1.0, 2.0, 8.0}};
  EXPECT_DOUBLE_EQ(three.at(3), 5.0);
  EXPECT_DOUBLE_EQ(three.at(5), 11.0);
  EXPECT_THROW(TimeCurve{}.at(1), Error);
}

TEST(TimePlan, ForwardIsBasePlusLayers) {
  const Calibration c = example();
  EXPECT_NEAR(c.forward_seconds(1000), 0.1 + 3 * 0.2 + 2 * 0.5, 1e-12);
  EXPECT_NEAR(c.forward_seconds(550), 0.055 + 3 * 0.11 + 2 * 0.275, 1e-12);
}

TEST(TimePlan, CalibrationJsonRoundTrips) {
  const Calibration c = example();
  const Calibration d = calibration_from_json(to_json(c), "cal.json");
  EXPECT_EQ(d.device, "test");
  EXPECT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.layers[1].kind, "moe");
  EXPECT_EQ(d.layers[1].count, 2);
  EXPECT_DOUBLE_EQ(d.forward_seconds(777), c.forward_seconds(777));
  EXPECT_DOUBLE_EQ(d.train_sample.at(300), c.train_sample.at(300));
  EXPECT_DOUBLE_EQ(d.disk_write_bytes_per_s, 1e9);
}

TEST(TimePlan, MalformedCalibrationIsNamed) {
  nlohmann::json j = to_json(example());
  j["version"] = 9;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: calibration version 9"),
            std::string::npos);
  j = to_json(example());
  j["forward"]["base"]["tokens"] = {1000, 100};
  const std::string e = testing::error_of([&] { calibration_from_json(j, "x/cal.json"); });
  EXPECT_NE(e.find("forward.base.tokens must be positive and ascending"), std::string::npos) << e;
  j = to_json(example());
  j["train"].erase("per_sample");
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json"), std::string::npos);
  EXPECT_NE(testing::error_of([] { calibration_from_json({{"format", "other"}}, "y.json"); }).find("aerie calibrate"),
            std::string::npos);
  j = to_json(example());
  j["forward"]["layers"][0]["count"] = -5;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("forward.layers[dense].count is -5"),
            std::string::npos);
  j = to_json(example());
  j["disk"]["write_bytes_per_s"] = 0;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("disk.write_bytes_per_s is 0"),
            std::string::npos);
  j = to_json(example());
  j["version"] = "1";
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: calibration version \"1\""),
            std::string::npos);
}

TEST(TimePlan, ShardBytesAsExtractEstimatesThem) {
  EXPECT_EQ(shard_bytes(10, 64, false), 10 * (8 * 64 + 5));  // extract --storage bf16: 8 H + 5 per token
  EXPECT_EQ(shard_bytes(10, 64, true), 10 * (4 * 64 + 21));  // fp8: codes, 4 fp32 scales, ids, mask
}

TEST(TimePlan, ExtractAndTrain) {
  const Calibration c = example();
  Workload w;
  w.samples = 1000;
  w.mean_tokens = 500;
  w.batch_tokens = 1000;  // two samples per forward
  w.world = 2;
  w.tp = 1;
  const std::vector<JobTime> t = plan_time(c, w);
  ASSERT_EQ(t.size(), 2u);
  // 500 forwards of 1000 tokens (1.7 s each) over 2 groups.
  EXPECT_EQ(t[0].job, "extract");
  EXPECT_NEAR(t[0].compute_seconds, 500 * 1.7 / 2, 1e-9);
  EXPECT_EQ(t[0].bytes, shard_bytes(500000, 64, false));
  EXPECT_NEAR(t[0].disk_seconds, static_cast<double>(t[0].bytes) / 1e9, 1e-12);
  EXPECT_EQ(t[0].bound, "compute");
  EXPECT_DOUBLE_EQ(t[0].seconds, t[0].compute_seconds);
  // 1000 samples of 500 tokens (0.5 s each) over 2 ranks.
  EXPECT_EQ(t[1].job, "train");
  EXPECT_NEAR(t[1].seconds, 1000 * 0.5 / 2, 1e-9);
  w.epochs = 3;
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 3 * 250.0, 1e-9);
  w.train_samples = 100;  // train --steps 25 --batch-size 4
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 100 * 0.5 / 2, 1e-9);
  w.train_samples = 0;
  // One sample per forward (batch_tokens 0, the CPU backend), and a slow disk that bounds extract.
  w.batch_tokens = 0;
  Calibration slow = c;
  slow.disk_write_bytes_per_s = 1e5;
  const JobTime e = plan_time(slow, w)[0];
  EXPECT_NEAR(e.compute_seconds, 1000 * c.forward_seconds(500) / 2, 1e-9);
  // The writer's work per sample: added to the forwards' with one sample per forward (the CPU backend), the
  // longer of the two with batched forwards (a GPU's writer thread).
  Calibration wr = c;
  wr.writer_sample = {{100, 1000}, {0.001, 0.01}};
  EXPECT_NEAR(plan_time(wr, w)[0].compute_seconds, (1000 * c.forward_seconds(500) + 1000 * 0.005) / 2, 1e-9);
  w.batch_tokens = 1000;
  EXPECT_NEAR(plan_time(wr, w)[0].compute_seconds, 500 * 1.7 / 2, 1e-9);
  wr.writer_sample = {{100, 1000}, {1.0, 1.0}};
  EXPECT_NEAR(plan_time(wr, w)[0].compute_seconds, 1000 * 1.0 / 2, 1e-9);
  w.batch_tokens = 0;
  EXPECT_EQ(e.bound, "disk");
  EXPECT_DOUBLE_EQ(e.seconds, e.disk_seconds);
}

TEST(TimePlan, EachSampleAtItsLength) {
  Calibration c = example();
  c.base = {{100, 200}, {0.0, 0.0}};
  c.layers = {{"dense", 1, {{100, 200}, {1.0, 3.0}}}};  // convex: 200 tokens cost 3x 100
  c.train_sample = {{100, 200}, {1.0, 3.0}};
  Workload w;
  w.lengths = {100, 200, 100, 200};  // mean 150: 2.0 s each at the mean, 1 and 3 s at their lengths ... the same
  w.batch_tokens = 0;
  w.world = 1;
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 8.0, 1e-9);
  w.lengths = {100, 100, 100, 300};  // mean 150 again; 300 tokens: 5 s along the last segment
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 1 + 1 + 1 + 5, 1e-9);
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 8.0, 1e-9);
  w.train_samples = 2;  // two draws: the mean step of the dataset
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 4.0, 1e-9);
}

TEST(TimePlan, RefusesWhatTheCalibrationDidNotMeasure) {
  Workload w;
  w.samples = 10;
  w.mean_tokens = 100;
  w.world = 4;
  w.tp = 2;
  EXPECT_NE(testing::error_of([&] { plan_time(example(), w); }).find("calibrate with --tp 2"), std::string::npos);
  w.tp = 3;
  EXPECT_NE(testing::error_of([&] { plan_time(example(), w); }).find("do not split"), std::string::npos);
  w.tp = 1;
  w.samples = 0;
  EXPECT_THROW(plan_time(example(), w), Error);
}

}  // namespace
}  // namespace aerie
