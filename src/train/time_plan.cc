#include "train/time_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace aerie {

namespace {

constexpr const char* kFormat = "aerie.calibration";
constexpr int kVersion = 1;

nlohmann::json curve_json(const TimeCurve& c) { return {{"tokens", c.tokens}, {"seconds", c.seconds}}; }

TimeCurve curve_from(const nlohmann::json& j, const std::string& path, const std::string& field) {
  AERIE_CHECK(j.is_object() && j.contains("tokens") && j.contains("seconds"),
              path << ": " << field << " must be an object with tokens and seconds");
  TimeCurve c;
  try {
    c.tokens = j.at("tokens").get<std::vector<int64_t>>();
    c.seconds = j.at("seconds").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": " << field << ": " << e.what());
  }
  AERIE_CHECK(!c.tokens.empty() && c.tokens.size() == c.seconds.size(),
              path << ": " << field << " has " << c.tokens.size() << " token counts and " << c.seconds.size()
                   << " times (one each, at least one)");
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    AERIE_CHECK(c.tokens[i] > 0 && (i == 0 || c.tokens[i] > c.tokens[i - 1]),
                path << ": " << field << ".tokens must be positive and ascending");
    AERIE_CHECK(std::isfinite(c.seconds[i]), path << ": " << field << ".seconds[" << i << "] is not finite");
  }
  return c;
}

}  // namespace

double TimeCurve::at(double t) const {
  AERIE_CHECK(!tokens.empty() && tokens.size() == seconds.size(), "TimeCurve: no measured points");
  AERIE_CHECK(t >= 0, "TimeCurve: " << t << " tokens");
  if (tokens.size() == 1) return std::max(0.0, seconds[0] * t / static_cast<double>(tokens[0]));
  size_t i = 1;  // the segment [i-1, i] that holds t, or the nearest one
  while (i + 1 < tokens.size() && t > static_cast<double>(tokens[i])) ++i;
  const double t0 = static_cast<double>(tokens[i - 1]), t1 = static_cast<double>(tokens[i]);
  const double s = seconds[i - 1] + (seconds[i] - seconds[i - 1]) * (t - t0) / (t1 - t0);
  return std::max(0.0, s);
}

double Calibration::forward_seconds(double t) const {
  double s = base.at(t);
  for (const LayerKindTimes& l : layers) s += static_cast<double>(l.count) * l.curve.at(t);
  return s;
}

nlohmann::json to_json(const Calibration& c) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerKindTimes& l : c.layers) layers.push_back({{"kind", l.kind}, {"count", l.count}, {"per_layer", curve_json(l.curve)}});
  return {{"format", kFormat},
          {"version", kVersion},
          {"device", c.device},
          {"model", c.model},
          {"world", c.world},
          {"tp", c.tp},
          {"hidden_size", c.hidden_size},
          {"forward", {{"base", curve_json(c.base)}, {"layers", layers}}},
          {"train", {{"ttt_steps", c.ttt_steps}, {"per_sample", curve_json(c.train_sample)}}},
          {"disk", {{"write_bytes_per_s", c.disk_write_bytes_per_s}, {"test_bytes", c.disk_test_bytes},
                    {"writer_per_sample", curve_json(c.writer_sample)}}},
          {"allreduce", {{"bus_bytes_per_s", c.allreduce_bus_bytes_per_s}}}};
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& path) {
  AERIE_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() && j["format"] == kFormat,
              path << ": not an aerie calibration (format '" << kFormat << "'; `aerie calibrate` writes one)");
  AERIE_CHECK(j.contains("version") && j["version"].is_number_integer() && j["version"] == kVersion,
              path << ": calibration version " << j.value("version", nlohmann::json()).dump() << ", this aerie reads "
                   << kVersion);
  Calibration c;
  try {
    c.device = j.at("device").get<std::string>();
    c.model = j.at("model").get<std::string>();
    c.world = j.at("world").get<int>();
    c.tp = j.at("tp").get<int>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    const auto& fwd = j.at("forward");
    c.base = curve_from(fwd.at("base"), path, "forward.base");
    for (const auto& l : fwd.at("layers")) {
      LayerKindTimes k;
      k.kind = l.at("kind").get<std::string>();
      k.count = l.at("count").get<int64_t>();
      k.curve = curve_from(l.at("per_layer"), path, "forward.layers[" + k.kind + "]");
      c.layers.push_back(std::move(k));
    }
    c.ttt_steps = j.at("train").at("ttt_steps").get<int>();
    c.train_sample = curve_from(j.at("train").at("per_sample"), path, "train.per_sample");
    c.disk_write_bytes_per_s = j.at("disk").at("write_bytes_per_s").get<double>();
    c.disk_test_bytes = j.at("disk").at("test_bytes").get<int64_t>();
    c.writer_sample = curve_from(j.at("disk").at("writer_per_sample"), path, "disk.writer_per_sample");
    c.allreduce_bus_bytes_per_s = j.at("allreduce").at("bus_bytes_per_s").get<double>();
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": " << e.what());
  }
  AERIE_CHECK(c.tp >= 1 && c.world >= c.tp && c.hidden_size > 0 && !c.layers.empty(),
              path << ": tp " << c.tp << ", world " << c.world << ", hidden_size " << c.hidden_size << ", "
                   << c.layers.size() << " layer kinds: not a calibration of a target");
  auto check_curve = [&](const TimeCurve& t, const std::string& field) {
    for (double x : t.seconds) AERIE_CHECK(x >= 0, path << ": " << field << ".seconds holds " << x << " (negative)");
  };
  check_curve(c.base, "forward.base");
  for (const LayerKindTimes& l : c.layers) {
    AERIE_CHECK(l.count >= 0, path << ": forward.layers[" << l.kind << "].count is " << l.count);
    check_curve(l.curve, "forward.layers[" + l.kind + "].per_layer");
  }
  check_curve(c.train_sample, "train.per_sample");
  check_curve(c.writer_sample, "disk.writer_per_sample");
  AERIE_CHECK(c.disk_write_bytes_per_s > 0 && std::isfinite(c.disk_write_bytes_per_s),
              path << ": disk.write_bytes_per_s is " << c.disk_write_bytes_per_s << " (a rate above 0)");
  return c;
}

int64_t shard_bytes(int64_t tokens, int64_t h, bool fp8) {
  const int64_t values = 4 * h;  // aux 3H + final H
  const int64_t per_token = fp8 ? values + 4 * 4 : 2 * values;
  return tokens * (per_token + 4 + 1);
}

std::vector<JobTime> plan_time(const Calibration& c, const Workload& w_in) {
  Workload w = w_in;
  if (!w.lengths.empty()) {
    w.samples = static_cast<int64_t>(w.lengths.size());
    double sum = 0;
    for (int64_t l : w.lengths) sum += static_cast<double>(l);
    w.mean_tokens = sum / static_cast<double>(w.samples);
  }
  // Beyond any dataset: 10^12 samples, 10^7 tokens each (and so no int64 overflow in the bytes).
  AERIE_CHECK(w.samples > 0 && w.samples <= 1000000000000 && w.mean_tokens >= 1 && w.mean_tokens <= 1e7,
              "plan: the workload needs 1 to 10^12 samples (got " << w.samples << ") of 1 to 10^7 tokens on average (got "
                                                                 << w.mean_tokens << ")");
  AERIE_CHECK(w.tp >= 1 && w.world >= w.tp && w.world % w.tp == 0,
              "plan: " << w.world << " ranks do not split into tp groups of " << w.tp);
  AERIE_CHECK(w.tp == c.tp, "plan: the calibration measured the forward at tp " << c.tp << ", the plan asks tp " << w.tp
                                                                                << ": calibrate with --tp " << w.tp << ", or plan with --tp " << c.tp);
  const double tokens = static_cast<double>(w.samples) * w.mean_tokens;
  const int64_t bytes = shard_bytes(static_cast<int64_t>(std::llround(tokens)), c.hidden_size, w.fp8_storage);
  const int groups = w.world / w.tp;
  // Sum of f(length) over the samples: each at its own length where known, else all at the mean.
  auto over_samples = [&](const std::function<double(double)>& f) {
    if (w.lengths.empty()) return static_cast<double>(w.samples) * f(w.mean_tokens);
    double s = 0;
    for (int64_t l : w.lengths) s += f(static_cast<double>(l));
    return s;
  };
  std::vector<JobTime> out;

  // extract: forwards of about batch_tokens tokens (costed per token) spread over the tp groups, or of one sample
  // each. A GPU's writer thread works while the next forward runs (the longer of the two counts); on the CPU backend
  // the ranks take the cores and the writer's work adds to the forward's.
  JobTime ex;
  ex.job = "extract";
  const double writer = c.writer_sample.tokens.empty() ? 0 : over_samples([&](double l) { return c.writer_sample.at(l); });
  if (w.batch_tokens > 0) {
    const double per_forward = std::max(static_cast<double>(w.batch_tokens), w.mean_tokens);
    ex.compute_seconds = std::max(tokens / per_forward * c.forward_seconds(per_forward), writer) / groups;
  } else {
    ex.compute_seconds = (over_samples([&](double l) { return c.forward_seconds(l); }) + writer) / groups;
  }
  ex.disk_seconds = c.disk_write_bytes_per_s > 0 ? static_cast<double>(bytes) / c.disk_write_bytes_per_s : 0;
  ex.seconds = std::max(ex.compute_seconds, ex.disk_seconds);
  ex.bound = ex.disk_seconds > ex.compute_seconds ? "disk" : "compute";
  ex.bytes = bytes;
  out.push_back(ex);

  // train: every rank trains on its share of the samples drawn (data parallel over the world), one sample's step
  // each; the draws follow the dataset's lengths.
  JobTime tr;
  tr.job = "train";
  const double drawn = w.train_samples > 0 ? static_cast<double>(w.train_samples)
                                           : static_cast<double>(w.epochs) * static_cast<double>(w.samples);
  const double per_sample = over_samples([&](double l) { return c.train_sample.at(l); }) / static_cast<double>(w.samples);
  tr.compute_seconds = drawn * per_sample / static_cast<double>(w.world);
  tr.seconds = tr.compute_seconds;
  tr.bound = "compute";
  out.push_back(tr);
  return out;
}

}  // namespace aerie
