// The time plan's arithmetic (train/time_plan.h): measured curves read between and beyond their points,
// calibration.json read back as written and refused by name when malformed, and extract / train predicted from a
// calibration whose numbers make the expected hours easy to state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "data/extract.h"
#include "test_util.h"
#include "train/time_plan.h"

namespace aerie {
namespace {

Calibration example() {
  Calibration c;
  c.device = "NVIDIA H100 80GB HBM3";
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
  const TimeCurve three{{1, 2, 4}, {1.0, 2.0, 8.0}};  // t, then t^2: the power law through each pair
  EXPECT_NEAR(three.at(3), 2.0 * 1.5 * 1.5, 1e-12);
  EXPECT_NEAR(three.at(5), 8.0 * 1.25 * 1.25, 1e-12);
  EXPECT_NEAR(three.at(1.5), 1.5, 1e-12);
  // Below the first point of a curve growing slower than the tokens (a GPU's launch-bound short steps): its straight
  // line, the fixed cost kept (the power law through the segment would give 6 x 0.5^0.65 = 3.8).
  const TimeCurve launch_bound{{512, 2048}, {6.0, 15.0}};
  EXPECT_NEAR(launch_bound.at(256), 6.0 - 256 * 9.0 / 1536, 1e-12);
  EXPECT_NEAR(launch_bound.at(1024), 6.0 * std::pow(2.0, std::log(2.5) / std::log(4.0)), 1e-12);  // between: power law
  const TimeCurve flat{{1, 2}, {0.0, 2.0}};  // a zero: the straight line
  EXPECT_DOUBLE_EQ(flat.at(1.5), 1.0);
  EXPECT_THROW(TimeCurve{}.at(1), Error);
}

// The fixed + linear + quadratic fit of a curve (coefficients >= 0, no more terms than points).
TEST(TimePlan, CurvesFitFixedLinearAndQuadraticTerms) {
  auto f = [](double t) { return 0.1 + 0.01 * t + 1e-4 * t * t; };
  const TimeCurve three{{100, 1000, 4000}, {f(100), f(1000), f(4000)}};
  const TimeCurve::Fit q = three.fit();
  EXPECT_NEAR(q.fixed, 0.1, 1e-9);
  EXPECT_NEAR(q.linear, 0.01, 1e-12);
  EXPECT_NEAR(q.quadratic, 1e-4, 1e-15);
  EXPECT_NEAR(q.packed(1000, 2 * 500.0 * 500.0), 0.1 + 10 + 1e-4 * 5e5, 1e-9);  // two samples of 500
  // Two points growing less than linearly: fixed + linear; faster: linear + quadratic.
  const TimeCurve::Fit sub = TimeCurve{{128, 512}, {1.0, 2.0}}.fit();
  EXPECT_NEAR(sub.fixed, 2.0 / 3, 1e-12);
  EXPECT_NEAR(sub.linear, 1.0 / 384, 1e-15);
  EXPECT_EQ(sub.quadratic, 0.0);
  const TimeCurve::Fit super = TimeCurve{{128, 512}, {1.0, 5.0}}.fit();
  EXPECT_EQ(super.fixed, 0.0);
  EXPECT_NEAR(super.linear * 128 + super.quadratic * 128 * 128, 1.0, 1e-12);
  EXPECT_NEAR(super.linear * 512 + super.quadratic * 512 * 512, 5.0, 1e-12);
  EXPECT_GT(super.quadratic, 0.0);
  // One point: proportional, as TimeCurve::at reads it. A curve of zeros: zero.
  const TimeCurve::Fit one = TimeCurve{{512}, {2.0}}.fit();
  EXPECT_EQ(one.fixed, 0.0);
  EXPECT_NEAR(one.linear, 2.0 / 512, 1e-15);
  const TimeCurve::Fit zero = TimeCurve{{1, 2}, {0.0, 0.0}}.fit();
  EXPECT_EQ(zero.packed(100, 1e4), 0.0);
  // Points that no non-negative fit passes through: still no negative term.
  const TimeCurve::Fit noisy = TimeCurve{{100, 200, 400}, {3.0, 1.0, 2.0}}.fit();
  EXPECT_GE(noisy.fixed, 0.0);
  EXPECT_GE(noisy.linear, 0.0);
  EXPECT_GE(noisy.quadratic, 0.0);
  EXPECT_THROW(TimeCurve{}.fit(), Error);
}

// extract's forwards pack the samples of a chunk up to --batch-tokens, each attending within itself: a packed
// forward costs the fit's fixed and per-token terms once and its attention term per sample, not a sequence of all.
TEST(TimePlan, PackedForwardsCostAttentionPerSample) {
  Calibration c = example();
  auto f = [](double t) { return 0.01 + 1e-3 * t + 1e-6 * t * t; };
  c.base = {{100, 1000, 4000}, {0.0, 0.0, 0.0}};
  c.layers = {{"dense", 2, {{100, 1000, 4000}, {f(100), f(1000), f(4000)}}}};
  Workload w;
  w.lengths = {100, 100, 100, 400, 100};
  w.batch_tokens = 300;  // chunk 1: [100 100 100] [400] [100]
  w.samples_per_shard = 4;
  w.world = 1;
  const double packed = 2 * (0.01 + 1e-3 * 300 + 1e-6 * 3 * 100 * 100);
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, packed + c.forward_seconds(400) + c.forward_seconds(100), 1e-9);
  EXPECT_LT(packed, c.forward_seconds(300));  // one sequence of 300 attends over all 300
  // The lengths unknown: forwards of as many samples of the mean as fit (2 of 150 in 300).
  Workload m = w;
  m.lengths.clear();
  m.samples = 4;
  m.mean_tokens = 150;
  EXPECT_NEAR(plan_time(c, m)[0].compute_seconds, 2 * 2 * (0.01 + 1e-3 * 300 + 1e-6 * 2 * 150 * 150), 1e-9);
  // --tp-overlap's curves are of two sequences of T/2: their attention term is half a sequence of T's.
  c.tp_overlap = true;
  EXPECT_NEAR(c.packed_forward_fit().quadratic, 2 * 2 * 1e-6, 1e-15);
}

TEST(TimePlan, ForwardIsBasePlusLayers) {
  const Calibration c = example();
  EXPECT_NEAR(c.forward_seconds(1000), 0.1 + 3 * 0.2 + 2 * 0.5, 1e-12);
  EXPECT_NEAR(c.forward_seconds(550), 0.055 + 3 * 0.11 + 2 * 0.275, 1e-12);
}

TEST(TimePlan, CalibrationJsonRoundTrips) {
  const Calibration c = example();
  const Calibration d = calibration_from_json(to_json(c), "cal.json");
  EXPECT_EQ(d.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.layers[1].kind, "moe");
  EXPECT_EQ(d.layers[1].count, 2);
  EXPECT_DOUBLE_EQ(d.forward_seconds(777), c.forward_seconds(777));
  EXPECT_DOUBLE_EQ(d.train_sample.at(300), c.train_sample.at(300));
  EXPECT_DOUBLE_EQ(d.disk_write_bytes_per_s, 1e9);
}

// calibrate --model-tp: a group of 8 of which one rank ran (world 1 < tp 8), its all-reduce modeled; read back as such,
// and refused where the file says modeled at tp 1 or without a bandwidth.
TEST(TimePlan, ModeledTpCalibrationRoundTrips) {
  Calibration c = example();
  c.world = 1;
  c.tp = 8;
  c.tp_modeled = true;
  c.allreduce_bus_bytes_per_s = 40e9;
  c.allreduce_latency_s = 30e-6;
  const Calibration d = calibration_from_json(to_json(c), "cal.json");
  EXPECT_TRUE(d.tp_modeled);
  EXPECT_EQ(d.tp, 8);
  EXPECT_DOUBLE_EQ(d.allreduce_latency_s, 30e-6);
  nlohmann::json old = to_json(example());  // an older aerie's file: none of the fields below
  old["allreduce"].erase("modeled");
  old["allreduce"].erase("latency_s");
  old["forward"].erase("expert_parallel");
  const Calibration o = calibration_from_json(old, "old.json");
  EXPECT_FALSE(o.tp_modeled);
  EXPECT_EQ(o.allreduce_latency_s, 0.0);
  EXPECT_EQ(o.expert_parallel, -1);  // not recorded
  c.expert_parallel = 1;
  EXPECT_EQ(calibration_from_json(to_json(c), "cal.json").expert_parallel, 1);
  nlohmann::json j = to_json(c);
  j["forward"]["expert_parallel"] = 2;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("forward.expert_parallel is 2"),
            std::string::npos);
  j = to_json(c);
  j["allreduce"]["bus_bytes_per_s"] = 0.0;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); })
                .find("x/cal.json: allreduce.modeled at tp 8 and bus bandwidth 0 B/s"),
            std::string::npos);
  j = to_json(c);
  j["allreduce"]["modeled"] = false;  // world 1 < tp 8 is a modeled group's only
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("tp 8, world 1"), std::string::npos);
  j = to_json(c);
  j["allreduce"]["latency_s"] = -1.0;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("allreduce.latency_s is -1"),
            std::string::npos);
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
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: train.per_sample is missing"),
            std::string::npos);
  j = to_json(example());
  j["tp"] = "2";
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: tp must be an integer, got \"2\""),
            std::string::npos);
  j = to_json(example());
  j["forward"] = 3;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: forward.base is missing"),
            std::string::npos);
  j = to_json(example());
  j["forward"]["layers"][0].erase("kind");
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("forward.layers[0]: kind is missing"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { calibration_from_json({{"format", "other"}}, "y.json"); })
                .find("y.json: not an aerie calibration (its format is \"other\""),
            std::string::npos);
  j = to_json(example());
  j["forward"]["layers"][0]["per_layer"]["seconds"] = "fast";
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); })
                .find("x/cal.json: forward.layers[dense].per_layer.seconds must be an array of numbers, not \"fast\""),
            std::string::npos)
      << testing::error_of([&] { calibration_from_json(j, "x/cal.json"); });
  j = to_json(example());
  j["forward"]["base"]["tokens"] = {100.5, 1000};
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); })
                .find("forward.base.tokens must be an array of integers, not [100.5,1000]"),
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
  j = to_json(example());
  j["device"] = "";
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: device is empty"),
            std::string::npos);
  // A layer kind calibrate does not measure, a time of a day or more, no TTT step: an edited or corrupt file.
  j = to_json(example());
  j["forward"]["layers"][0]["kind"] = "banana";
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); })
                .find("x/cal.json: forward.layers[].kind is 'banana', not dense or moe"),
            std::string::npos);
  j = to_json(example());
  j["forward"]["layers"][0]["per_layer"]["seconds"][0] = 1e300;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); })
                .find("forward.layers[dense].per_layer.seconds holds 1e+300 (seconds, 0 to a day)"),
            std::string::npos);
  j = to_json(example());
  j["train"]["ttt_steps"] = 0;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "x/cal.json"); }).find("x/cal.json: train.ttt_steps is 0"),
            std::string::npos);
}

TEST(TimePlan, ShardBytesAsExtractEstimatesThem) {
  EXPECT_EQ(shard_bytes_per_token(64, false), 8 * 64 + 5);  // extract --storage bf16: 8 H + 5 per token
  EXPECT_EQ(shard_bytes_per_token(64, true), 4 * 64 + 21);   // fp8: codes, 4 fp32 scales, ids, mask
  // 3 samples in 2 shards: 16 bytes a sample and 64 KiB a shard besides the tokens'.
  EXPECT_EQ(shard_bytes(10, 3, 2, 64, false), 10 * (8 * 64 + 5) + 3 * 16 + 2 * 65536);
}

TEST(TimePlan, ExtractAndTrain) {
  const Calibration c = example();
  Workload w;
  w.samples = 1000;
  w.mean_tokens = 500;
  w.batch_tokens = 1000;  // two samples per forward
  w.samples_per_shard = 100;  // 10 chunks, 5 to each group
  w.world = 2;
  w.tp = 1;
  const std::vector<JobTime> t = plan_time(c, w);
  ASSERT_EQ(t.size(), 2u);
  // 500 forwards of 1000 tokens (1.7 s each) over 2 groups.
  EXPECT_EQ(t[0].job, "extract");
  EXPECT_NEAR(t[0].compute_seconds, 500 * 1.7 / 2, 1e-9);
  EXPECT_EQ(t[0].bytes, shard_bytes(500000, 1000, 10, 64, false));
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
  // A step's own cost (0.1 s of the 0.5 s measured for a step of one sample) is paid once per step: 25 steps of 4
  // samples, each rank 50 samples.
  Calibration stepped = c;
  stepped.train_step_seconds = 0.1;
  w.train_batch_size = 4;
  EXPECT_NEAR(plan_time(stepped, w)[1].seconds, 25 * 0.1 + 50 * (0.5 - 0.1), 1e-9);
  EXPECT_DOUBLE_EQ(calibration_from_json(to_json(stepped), "c.json").train_step_seconds, 0.1);
  // Fewer samples a step than ranks: the busiest rank steps one sample of each of the 25 steps (12 ranks idle),
  // not 100 / 16 of them.
  w.world = 16;
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 25 * 0.5, 1e-9);
  w.world = 2;
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

// extract's chunks go to the group free first: with 3 chunks for 2 groups one group does two of them; and what
// calibrate measured of extract's own work (per run, per sample of the busiest group) adds to the forwards.
TEST(TimePlan, ExtractWaitsForItsBusiestGroup) {
  Calibration c = example();
  Workload w;
  w.samples = 300;
  w.mean_tokens = 500;
  w.batch_tokens = 0;
  w.samples_per_shard = 100;
  w.world = 2;
  const double per_sample = c.forward_seconds(500);
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 200 * per_sample, 1e-9);
  w.samples_per_shard = 1;  // 300 chunks: an even split
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 150 * per_sample, 1e-9);
  // Known lengths: chunk 0 holds the long samples, so it is the busiest group's alone.
  w.lengths = {1000, 1000, 100, 100};
  w.samples_per_shard = 2;
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 2 * c.forward_seconds(1000), 1e-9);
  w.lengths.clear();
  c.extract_run_seconds = 2.0, c.extract_sample_seconds = 0.01;
  w.samples_per_shard = 100;
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 200 * per_sample + 2.0 + 200 * 0.01, 1e-9);
  const Calibration d = calibration_from_json(to_json(c), "c.json");
  EXPECT_DOUBLE_EQ(d.extract_run_seconds, 2.0);
  EXPECT_DOUBLE_EQ(d.extract_sample_seconds, 0.01);
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
  w.lengths = {100, 100, 100, 300};  // mean 150 again; 300 tokens: along the last segment's power law
  const double at300 = 3.0 * std::pow(1.5, std::log(3.0) / std::log(2.0));
  EXPECT_NEAR(plan_time(c, w)[0].compute_seconds, 1 + 1 + 1 + at300, 1e-9);
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 3 + at300, 1e-9);
  w.train_samples = 2;  // two draws: the mean step of the dataset
  EXPECT_NEAR(plan_time(c, w)[1].seconds, 2 * (3 + at300) / 4, 1e-9);
}

// train --prepared: the target replicas' forwards of the samples drawn, the trainers' steps and the messages; the
// longest side bounds it, or the target's and the draft's compute add up where they share devices.
TEST(TimePlan, StreamingTrain) {
  Calibration c = example();
  c.stream_bytes_per_s = 64 * 8 * 500 * 1000.0 / 10;  // 1000 samples' messages (8 H bytes per token) in 10 s
  Workload w;
  w.samples = 1000;
  w.mean_tokens = 500;
  w.batch_tokens = 0;  // one forward per sample (the CPU backend)
  w.world = 2;
  w.tp = 1;
  w.stream_target_ranks = 1;
  w.train_batch_size = 4;
  const std::vector<JobTime> t = plan_time(c, w);
  ASSERT_EQ(t.size(), 3u);
  const JobTime& st = t[2];
  EXPECT_EQ(st.job, "train --prepared");
  EXPECT_NEAR(st.target_seconds, 1000 * c.forward_seconds(500), 1e-9);  // one replica, every sample once
  EXPECT_NEAR(st.draft_seconds, 1000 * 0.5, 1e-9);                       // one trainer
  EXPECT_NEAR(st.message_seconds, 10.0, 1e-9);
  EXPECT_NEAR(st.seconds, std::max(st.target_seconds, st.draft_seconds + 10.0), 1e-9);
  EXPECT_EQ(st.bound, "target");
  EXPECT_EQ(st.queue_bytes, int64_t{3} * 4 * 500 * 8 * 64);  // 3 steps of 4 samples
  EXPECT_EQ(st.bytes, 0);
  // Sharing devices: the two sides' compute adds up, the messages after it.
  w.stream_colocated = true;
  EXPECT_NEAR(plan_time(c, w)[2].seconds, st.target_seconds + st.draft_seconds + 10.0, 1e-9);
  w.stream_colocated = false;
  // 3 epochs' draws over 4 ranks: 2 replicas and 2 trainers split both sides; messages over 2 links.
  w.world = 4;
  w.stream_target_ranks = 2;
  w.epochs = 3;
  const JobTime s4 = plan_time(c, w)[2];
  EXPECT_NEAR(s4.target_seconds, 3 * 1000 * c.forward_seconds(500) / 2, 1e-9);
  EXPECT_NEAR(s4.draft_seconds, 3 * 1000 * 0.5 / 2, 1e-9);
  EXPECT_NEAR(s4.message_seconds, 3 * 10.0 / 2, 1e-9);
  // The draft step measured on one rank alone as well (0.3 s at 500 tokens against 0.5 s with every rank busy):
  // 2 trainers and 2 target ranks busy for a share of 3 x 1000 x 1.7 / 2 over 3 x 1000 x 0.3 / 2 (capped at 1):
  // all 4 busy, the all-busy rate; with 1 target rank of 3 busy 60% of the time the rate lies between.
  Calibration a = c;
  a.train_sample_alone = {{100, 1000}, {0.06, 0.6}};
  EXPECT_NEAR(plan_time(a, w)[2].draft_seconds, 3 * 1000 * 0.5 / 2, 1e-9);
  a.layers = {{"dense", 1, {{100, 1000}, {0.0, 0.0}}}};
  a.base = {{100, 1000}, {0.009, 0.09}};  // 0.045 s per forward of 500 tokens
  w.world = 3;
  w.stream_target_ranks = 1;
  const double target = 3 * 1000 * 0.045, alone = 3 * 1000 * 0.3 / 2, share = target / alone;
  const double f = (2 + share - 1) / 2;
  EXPECT_NEAR(plan_time(a, w)[2].draft_seconds, 3 * 1000 * (0.3 + (0.5 - 0.3) * f) / 2, 1e-9);
  EXPECT_NEAR(calibration_from_json(to_json(a), "c.json").train_sample_alone.at(500), 0.3, 1e-12);
  w.world = 4;
  w.stream_target_ranks = 2;
  // Not measured (a calibration of one rank): no message time; no trainer left: refused.
  c.stream_bytes_per_s = 0;
  EXPECT_DOUBLE_EQ(plan_time(c, w)[2].message_seconds, 0.0);
  w.stream_target_ranks = 4;
  EXPECT_NE(testing::error_of([&] { plan_time(c, w); }).find("leave trainer ranks"), std::string::npos);
  // calibration.json carries the rate; a file without it (an older aerie) reads as not measured.
  c.stream_bytes_per_s = 2.5e9;
  EXPECT_DOUBLE_EQ(calibration_from_json(to_json(c), "c.json").stream_bytes_per_s, 2.5e9);
  nlohmann::json j = to_json(c);
  j.erase("stream");
  EXPECT_DOUBLE_EQ(calibration_from_json(j, "c.json").stream_bytes_per_s, 0.0);
  j["stream"] = {{"bytes_per_s", -1}};
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "c.json"); }).find("stream.bytes_per_s"), std::string::npos);
}

// host.cpu_cores (the fewest cores a calibration rank could run on) round-trips; an older file reads 0; a negative
// count or another type is refused naming the field.
TEST(TimePlan, CalibrationRecordsTheCpuCores) {
  Calibration c = example();
  c.cpu_cores = 1;
  EXPECT_EQ(calibration_from_json(to_json(c), "c.json").cpu_cores, 1);
  nlohmann::json j = to_json(c);
  j.erase("host");
  EXPECT_EQ(calibration_from_json(j, "c.json").cpu_cores, 0);
  j["host"] = {{"cpu_cores", -2}};
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "c.json"); }).find("host.cpu_cores"), std::string::npos);
  j["host"] = {{"cpu_cores", "four"}};
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "c.json"); }).find("host.cpu_cores"), std::string::npos);
}

// forward.tp_overlap (calibrate --tp-overlap) round-trips; an older file without it reads as false; another type,
// or true at tp 1, is refused naming the field.
TEST(TimePlan, CalibrationRecordsTheTpOverlap) {
  Calibration c = example();
  EXPECT_FALSE(calibration_from_json(to_json(c), "c.json").tp_overlap);
  c.tp_overlap = true;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(to_json(c), "c.json"); }).find("forward.tp_overlap is true at tp 1"),
            std::string::npos);
  c.tp = 2;
  nlohmann::json j = to_json(c);
  EXPECT_TRUE(calibration_from_json(j, "c.json").tp_overlap);
  j["forward"].erase("tp_overlap");
  EXPECT_FALSE(calibration_from_json(j, "c.json").tp_overlap);
  j["forward"]["tp_overlap"] = 1;
  EXPECT_NE(testing::error_of([&] { calibration_from_json(j, "c.json"); }).find("forward.tp_overlap must be true or false"),
            std::string::npos);
}

// Data parallel: a step waits for its slowest rank. Samples of 100 and 1000 tokens (0.1 and 1.0 s) dealt one to
// each of 2 ranks: the step takes 1.0 s unless both drew 100 tokens (a quarter of the steps), 0.775 s on average,
// where the mean alone gives 0.55 s.
TEST(TimePlan, DataParallelStepsWaitForTheSlowestRank) {
  const Calibration c = example();
  Workload w;
  w.lengths = {100, 1000};
  w.batch_tokens = 0;
  w.world = 2;
  w.train_batch_size = 2;
  w.train_samples = 2000;  // 1000 steps
  EXPECT_NEAR(plan_time(c, w)[1].seconds / 1000, 0.775, 0.03);
  w.world = 1;  // one rank: every step the sum of its samples, 1.1 s on average
  EXPECT_NEAR(plan_time(c, w)[1].seconds / 1000, 1.1, 1e-9);
  w.world = 2;
  w.lengths.clear();  // the mean length alone: no spread to wait for
  w.samples = 2;
  w.mean_tokens = 550;
  EXPECT_NEAR(plan_time(c, w)[1].seconds / 1000, 0.55, 1e-9);
}

// generate: the prompts' prefills as forwards, each new token at the measured run's cost beyond its prefills.
TEST(TimePlan, Generate) {
  Calibration c = example();
  // 10 sequences of 100 prompt tokens decoding 50 each in 3.7 s: 10 prefills of 0.1 + 3 x 0.02 + 2 x 0.05 = 0.17 s,
  // so 2.0 s for 500 new tokens: 4 ms a token.
  c.generate = {10, 100, 50, 3.7};
  Workload w;
  w.samples = 1000;
  w.mean_tokens = 500;
  w.world = 2;
  w.gen_responses = 1000;
  w.gen_prompt_tokens = 1000;  // forward 1.7 s each
  w.gen_new_tokens = 200;
  const std::vector<JobTime> t = plan_time(c, w);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].job, "generate");
  EXPECT_NEAR(t[0].seconds, (1000 * 1.7 + 1000 * 200 * 0.004) / 2, 1e-6);
  EXPECT_EQ(t[1].job, "extract");
  const Calibration d = calibration_from_json(to_json(c), "c.json");
  EXPECT_EQ(d.generate.batch, 10);
  EXPECT_DOUBLE_EQ(d.generate.seconds, 3.7);
  // With the run of one new token measured (its prefills and one step, 1.7 s), the other 50 steps of the 51 are
  // the decoding: the same 4 ms a token.
  c.generate = {10, 100, 51, 3.7, 1.7};
  EXPECT_NEAR(plan_time(c, w)[0].seconds, (1000 * 1.7 + 1000 * 200 * 0.004) / 2, 1e-6);
  EXPECT_DOUBLE_EQ(calibration_from_json(to_json(c), "c.json").generate.first_seconds, 1.7);
  // A run no longer than its prefills cannot be timed per token: refused, not planned at 0 s a token.
  c.generate = {10, 100, 50, 1.0};
  EXPECT_NE(testing::error_of([&] { plan_time(c, w); }).find("too short to time"), std::string::npos);
  c.generate = {};
  EXPECT_NE(testing::error_of([&] { plan_time(c, w); }).find("no generate measurement"), std::string::npos);
}

// The fields version 1 gained later: named when mistyped or out of range.
TEST(TimePlan, LaterFieldsAreCheckedByName) {
  Calibration c = example();
  c.generate = {10, 100, 51, 3.7, 1.7};
  auto refused = [](nlohmann::json j, const std::string& want) {
    const std::string e = testing::error_of([&] { calibration_from_json(j, "x/c.json"); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  nlohmann::json j = to_json(c);
  j["generate"]["batch"] = "ten";
  refused(j, "x/c.json: generate.batch must be an integer");
  j = to_json(c);
  j["stream"]["bytes_per_s"] = nullptr;
  refused(j, "stream.bytes_per_s must be a number");
  j = to_json(c);
  j["generate"]["prompt_tokens"] = 0;
  refused(j, "generate.batch 10, prompt_tokens 0");
  j = to_json(c);
  j["generate"]["first_seconds"] = 5.0;
  refused(j, "the run of one new token shorter");
  j = to_json(c);
  j["train"]["draft_vocab_size"] = -1;
  refused(j, "train.draft_vocab_size is -1");
  j = to_json(c);
  j["train"]["step_seconds"] = 0.5;  // above the step of one sample at the shortest length (0.1 s)
  refused(j, "train.step_seconds is 0.5");
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
