#include "train/time_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <type_traits>

#include "core/error.h"
#include "data/extract.h"

namespace aerie {

namespace {

constexpr const char* kFormat = "aerie.calibration";
constexpr int kVersion = 1;

nlohmann::json curve_json(const TimeCurve& c) { return {{"tokens", c.tokens}, {"seconds", c.seconds}}; }

TimeCurve curve_from(const nlohmann::json& j, const std::string& path, const std::string& field) {
  AERIE_CHECK(j.is_object() && j.contains("tokens") && j.contains("seconds"),
              path << ": " << field << " must be an object with tokens and seconds");
  // Arrays of integers and of numbers, checked by element so that the error names the field and what it holds.
  for (const char* key : {"tokens", "seconds"}) {
    const nlohmann::json& v = j.at(key);
    const bool integers = std::string(key) == "tokens";
    bool ok = v.is_array();
    if (ok)
      for (const nlohmann::json& x : v) ok = ok && (integers ? x.is_number_integer() : x.is_number());
    AERIE_CHECK(ok, path << ": " << field << "." << key << " must be an array of " << (integers ? "integers" : "numbers")
                         << ", not " << v.dump().substr(0, 60));
  }
  TimeCurve c;
  c.tokens = j.at("tokens").get<std::vector<int64_t>>();
  c.seconds = j.at("seconds").get<std::vector<double>>();
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

// What a field of type T must be, as an error says it; whether `v` is one.
template <typename T>
bool is_a(const nlohmann::json& v, const char** what) {
  if constexpr (std::is_same_v<T, bool>) {
    *what = "true or false";
    return v.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    *what = "a string";
    return v.is_string();
  } else if constexpr (std::is_integral_v<T>) {
    *what = "an integer";
    return v.is_number_integer();
  } else {
    *what = "a number";
    return v.is_number();
  }
}

// The field at the dotted `name` of `j` ("train.ttt_steps"), named in the error when it is missing.
const nlohmann::json& field(const nlohmann::json& j, const std::string& name, const std::string& path) {
  const nlohmann::json* cur = &j;
  for (size_t b = 0, e; b <= name.size(); b = e + 1) {
    e = std::min(name.find('.', b), name.size());
    const std::string key = name.substr(b, e - b);
    AERIE_CHECK(cur->is_object() && cur->contains(key), path << ": " << name << " is missing");
    cur = &(*cur)[key];
  }
  return *cur;
}

// The `T` at the dotted `name` of `j`, named in the error when it is missing or not a `T`.
template <typename T>
T required(const nlohmann::json& j, const std::string& name, const std::string& path) {
  const nlohmann::json& v = field(j, name, path);
  const char* what = nullptr;
  AERIE_CHECK(is_a<T>(v, &what), path << ": " << name << " must be " << what << ", got " << v.dump());
  return v.get<T>();
}

// `j`[a][b] (absent: `absent`), named `a.b` in the error when it is not a `T`.
template <typename T>
T optional_field(const nlohmann::json& j, const char* a, const char* b, T absent, const std::string& path) {
  if (!j.contains(a) || !j[a].is_object() || !j[a].contains(b)) return absent;
  return required<T>(j, std::string(a) + "." + b, path);
}

// The fields version 1 gained later (an older aerie's file reads without them), each checked by name.
void read_optional_fields(const nlohmann::json& j, const std::string& path, Calibration& c) {
  c.tp_overlap = optional_field(j, "forward", "tp_overlap", false, path);
  c.expert_parallel = optional_field(j, "forward", "expert_parallel", -1, path);
  AERIE_CHECK(c.expert_parallel >= -1 && c.expert_parallel <= 1,
              path << ": forward.expert_parallel is " << c.expert_parallel << " (1, 0, or -1 when not recorded)");
  c.train_step_seconds = optional_field(j, "train", "step_seconds", 0.0, path);
  c.draft_vocab_size = optional_field(j, "train", "draft_vocab_size", int64_t{0}, path);
  c.train_batch = optional_field(j, "train", "batch_size", int64_t{0}, path);
  c.target = optional_field(j, "target", "fingerprint", std::string(), path);
  AERIE_CHECK(c.train_batch >= 0, path << ": train.batch_size is " << c.train_batch << " (samples, 0 when not recorded)");
  c.stream_bytes_per_s = optional_field(j, "stream", "bytes_per_s", 0.0, path);
  c.tp_modeled = optional_field(j, "allreduce", "modeled", false, path);
  c.allreduce_latency_s = optional_field(j, "allreduce", "latency_s", 0.0, path);
  AERIE_CHECK(std::isfinite(c.allreduce_latency_s) && c.allreduce_latency_s >= 0,
              path << ": allreduce.latency_s is " << c.allreduce_latency_s << " (seconds, 0 when not modeled)");
  AERIE_CHECK(!c.tp_modeled || (c.tp >= 2 && c.allreduce_bus_bytes_per_s > 0),
              path << ": allreduce.modeled at tp " << c.tp << " and bus bandwidth " << c.allreduce_bus_bytes_per_s
                   << " B/s (calibrate --model-tp records tp >= 2 and a bandwidth > 0)");
  c.cpu_cores = optional_field(j, "host", "cpu_cores", 0, path);
  AERIE_CHECK(c.cpu_cores >= 0, path << ": host.cpu_cores is " << c.cpu_cores << " (a count, 0 when not recorded)");
  Calibration::Generation& g = c.generate;
  g.batch = optional_field(j, "generate", "batch", int64_t{0}, path);
  g.prompt_tokens = optional_field(j, "generate", "prompt_tokens", int64_t{0}, path);
  g.new_tokens = optional_field(j, "generate", "new_tokens", int64_t{0}, path);
  g.seconds = optional_field(j, "generate", "seconds", 0.0, path);
  g.first_seconds = optional_field(j, "generate", "first_seconds", 0.0, path);
  c.extract_run_seconds = optional_field(j, "extract", "run_seconds", 0.0, path);
  c.extract_sample_seconds = optional_field(j, "extract", "per_sample_seconds", 0.0, path);
  AERIE_CHECK(std::isfinite(c.extract_run_seconds) && c.extract_run_seconds >= 0 &&
                  std::isfinite(c.extract_sample_seconds) && c.extract_sample_seconds >= 0,
              path << ": extract.run_seconds " << c.extract_run_seconds << " and per_sample_seconds "
                   << c.extract_sample_seconds << " (seconds, finite, >= 0)");
  AERIE_CHECK(c.draft_vocab_size >= 0 && c.draft_vocab_size <= 100000000,
              path << ": train.draft_vocab_size is " << c.draft_vocab_size << " (0 to 10^8)");
  if (g.seconds == 0) return;  // not measured
  AERIE_CHECK(g.batch >= 1 && g.batch <= 1000000 && g.prompt_tokens >= 1 && g.prompt_tokens <= 10000000 &&
                  g.new_tokens >= 2 && g.new_tokens <= 10000000,
              path << ": generate.batch " << g.batch << ", prompt_tokens " << g.prompt_tokens << ", new_tokens "
                   << g.new_tokens << " (1 to 10^6 sequences, 1 to 10^7 prompt and 2 to 10^7 new tokens)");
  AERIE_CHECK(std::isfinite(g.seconds) && g.seconds > 0 && std::isfinite(g.first_seconds) && g.first_seconds >= 0 &&
                  g.first_seconds <= g.seconds,
              path << ": generate.seconds " << g.seconds << " and first_seconds " << g.first_seconds
                   << " (finite; the run of one new token shorter than the whole run, or as long where noise made it: "
                   << "plan then refuses the run as too short to time)");
}

nlohmann::json train_json(const Calibration& c) {
  nlohmann::json j = {{"ttt_steps", c.ttt_steps}, {"draft_vocab_size", c.draft_vocab_size},
                      {"per_sample", curve_json(c.train_sample)}, {"step_seconds", c.train_step_seconds},
                      {"batch_size", c.train_batch}};
  if (!c.train_sample_alone.tokens.empty()) j["per_sample_alone"] = curve_json(c.train_sample_alone);
  return j;
}

}  // namespace

double TimeCurve::at(double t) const {
  AERIE_CHECK(!tokens.empty() && tokens.size() == seconds.size(), "TimeCurve: no measured points");
  AERIE_CHECK(t >= 0, "TimeCurve: " << t << " tokens");
  if (tokens.size() == 1) return std::max(0.0, seconds[0] * t / static_cast<double>(tokens[0]));
  size_t i = 1;  // the segment [i-1, i] that holds t, or the nearest one
  while (i + 1 < tokens.size() && t > static_cast<double>(tokens[i])) ++i;
  const double t0 = static_cast<double>(tokens[i - 1]), t1 = static_cast<double>(tokens[i]);
  const double s0 = seconds[i - 1], s1 = seconds[i];
  // Below the first point, where the cost grows no faster than the tokens (a GPU's launch-bound short forwards and
  // steps): the straight line, whose intercept is the fixed cost that the power law would take to 0.
  if (t < t0 && s1 * t0 <= s0 * t1) return std::max(0.0, s0 + (s1 - s0) * (t - t0) / (t1 - t0));
  // A power law through the two points (a straight line in log-log: the attention's share makes the cost grow
  // faster than the tokens, and a chord between two points of a convex curve overestimates the middle), where both
  // times are positive and grow; else the straight line.
  if (s0 > 0 && s1 > s0 && t > 0) return s0 * std::pow(t / t0, std::log(s1 / s0) / std::log(t1 / t0));
  return std::max(0.0, s0 + (s1 - s0) * (t - t0) / (t1 - t0));
}

TimeCurve::Fit TimeCurve::fit() const {
  AERIE_CHECK(!tokens.empty() && tokens.size() == seconds.size(), "TimeCurve: no measured points");
  const size_t n = tokens.size();
  const double top = *std::max_element(seconds.begin(), seconds.end());
  if (top <= 0) return {};
  // Relative errors (points of 100x different times weigh alike), a point at or below 0 weighed as 0.1% of the
  // largest; tokens scaled to the largest count so that the normal equations stay well conditioned.
  const double t_max = static_cast<double>(tokens.back());
  std::vector<std::array<double, 3>> x(n);
  std::vector<double> weight(n);
  for (size_t j = 0; j < n; ++j) {
    const double u = static_cast<double>(tokens[j]) / t_max;
    x[j] = {1.0, u, u * u};
    weight[j] = 1.0 / std::max(seconds[j], 1e-3 * top);
  }
  // Every subset of the three terms, no more terms than points, in the order a tie prefers; the feasible one
  // (coefficients >= 0) of the least error.
  static constexpr std::array<std::array<bool, 3>, 7> kSubsets = {
      {{true, true, true}, {true, true, false}, {false, true, true}, {true, false, true}, {false, true, false},
       {true, false, false}, {false, false, true}}};
  std::array<double, 3> best{};
  double best_err = std::numeric_limits<double>::infinity();
  for (const auto& use : kSubsets) {
    std::vector<int> terms;
    for (int k = 0; k < 3; ++k)
      if (use[k]) terms.push_back(k);
    const size_t m = terms.size();
    if (m > n) continue;
    // The weighted normal equations over the subset's terms, solved by Gaussian elimination with pivoting.
    double a[3][4] = {};
    for (size_t j = 0; j < n; ++j) {
      const double w2 = weight[j] * weight[j];
      for (size_t r = 0; r < m; ++r) {
        for (size_t q = 0; q < m; ++q) a[r][q] += w2 * x[j][terms[r]] * x[j][terms[q]];
        a[r][m] += w2 * x[j][terms[r]] * seconds[j];
      }
    }
    bool singular = false;
    for (size_t r = 0; r < m && !singular; ++r) {
      size_t p = r;
      for (size_t q = r + 1; q < m; ++q)
        if (std::abs(a[q][r]) > std::abs(a[p][r])) p = q;
      if (std::abs(a[p][r]) < 1e-300) singular = true;
      for (size_t q = 0; q <= m && !singular; ++q) std::swap(a[r][q], a[p][q]);
      for (size_t q = 0; q < m && !singular; ++q) {
        if (q == r) continue;
        const double f = a[q][r] / a[r][r];
        for (size_t k = r; k <= m; ++k) a[q][k] -= f * a[r][k];
      }
    }
    if (singular) continue;
    std::array<double, 3> coef{};
    bool feasible = true;
    for (size_t r = 0; r < m; ++r) {
      coef[terms[r]] = a[r][m] / a[r][r];
      if (coef[terms[r]] < -1e-12 * top) feasible = false;
      coef[terms[r]] = std::max(0.0, coef[terms[r]]);
    }
    if (!feasible) continue;
    double err = 0;
    for (size_t j = 0; j < n; ++j) {
      const double e = weight[j] * (coef[0] * x[j][0] + coef[1] * x[j][1] + coef[2] * x[j][2] - seconds[j]);
      err += e * e;
    }
    if (err < best_err * (1 - 1e-9) - 1e-24) {
      best_err = err;
      best = coef;
    }
  }
  return {best[0], best[1] / t_max, best[2] / (t_max * t_max)};
}

TimeCurve::Fit Calibration::packed_forward_fit() const {
  TimeCurve::Fit s = base.fit();
  for (const LayerKindTimes& l : layers) {
    const TimeCurve::Fit f = l.curve.fit();
    const double k = static_cast<double>(l.count);
    s.fixed += k * f.fixed;
    s.linear += k * f.linear;
    s.quadratic += k * f.quadratic;
  }
  if (tp_overlap) s.quadratic *= 2;
  return s;
}

std::vector<int64_t> Workload::offsets() const {
  std::vector<int64_t> off(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) off[i + 1] = off[i] + lengths[i];
  return off;
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
          {"target", {{"fingerprint", c.target}}},
          {"world", c.world},
          {"tp", c.tp},
          {"hidden_size", c.hidden_size},
          {"forward", {{"base", curve_json(c.base)}, {"layers", layers}, {"tp_overlap", c.tp_overlap},
                       {"expert_parallel", c.expert_parallel}}},
          {"train", train_json(c)},
          {"disk", {{"write_bytes_per_s", c.disk_write_bytes_per_s}, {"test_bytes", c.disk_test_bytes},
                    {"writer_per_sample", curve_json(c.writer_sample)}}},
          {"allreduce", {{"bus_bytes_per_s", c.allreduce_bus_bytes_per_s}, {"modeled", c.tp_modeled},
                         {"latency_s", c.allreduce_latency_s}}},
          {"stream", {{"bytes_per_s", c.stream_bytes_per_s}}},
          {"host", {{"cpu_cores", c.cpu_cores}}},
          {"extract", {{"run_seconds", c.extract_run_seconds}, {"per_sample_seconds", c.extract_sample_seconds}}},
          {"generate", {{"batch", c.generate.batch}, {"prompt_tokens", c.generate.prompt_tokens},
                        {"new_tokens", c.generate.new_tokens}, {"seconds", c.generate.seconds},
                        {"first_seconds", c.generate.first_seconds}}}};
}

Calibration calibration_from_json(const nlohmann::json& j, const std::string& path) {
  AERIE_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() && j["format"] == kFormat,
              path << ": not an aerie calibration (its format is "
                   << (j.is_object() && j.contains("format") ? j["format"].dump() : std::string("missing"))
                   << ", a calibration's '" << kFormat << "'; `aerie calibrate` writes one)");
  AERIE_CHECK(j.contains("version") && j["version"].is_number_integer() && j["version"] == kVersion,
              path << ": calibration version " << j.value("version", nlohmann::json()).dump() << ", this aerie reads "
                   << kVersion);
  Calibration c;
  c.device = required<std::string>(j, "device", path);
  c.model = required<std::string>(j, "model", path);
  c.world = required<int>(j, "world", path);
  c.tp = required<int>(j, "tp", path);
  c.hidden_size = required<int64_t>(j, "hidden_size", path);
  c.base = curve_from(field(j, "forward.base", path), path, "forward.base");
  const nlohmann::json& layers = field(j, "forward.layers", path);
  AERIE_CHECK(layers.is_array(), path << ": forward.layers must be an array, got " << layers.dump());
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = "forward.layers[" + std::to_string(i) + "]";
    LayerKindTimes k;
    k.kind = required<std::string>(layers[i], "kind", path + ": " + at);
    k.count = required<int64_t>(layers[i], "count", path + ": " + at);
    k.curve = curve_from(field(layers[i], "per_layer", path + ": " + at), path, "forward.layers[" + k.kind + "].per_layer");
    c.layers.push_back(std::move(k));
  }
  c.ttt_steps = required<int>(j, "train.ttt_steps", path);
  c.train_sample = curve_from(field(j, "train.per_sample", path), path, "train.per_sample");
  if (j["train"].contains("per_sample_alone"))  // optional in v1: a calibration of more than one rank
    c.train_sample_alone = curve_from(j["train"]["per_sample_alone"], path, "train.per_sample_alone");
  c.disk_write_bytes_per_s = required<double>(j, "disk.write_bytes_per_s", path);
  c.disk_test_bytes = required<int64_t>(j, "disk.test_bytes", path);
  c.writer_sample = curve_from(field(j, "disk.writer_per_sample", path), path, "disk.writer_per_sample");
  c.allreduce_bus_bytes_per_s = required<double>(j, "allreduce.bus_bytes_per_s", path);
  read_optional_fields(j, path, c);
  AERIE_CHECK(!c.tp_overlap || c.tp >= 2, path << ": forward.tp_overlap is true at tp " << c.tp
                                                << " (calibrate records it at tp 2 or more only)");
  AERIE_CHECK(!c.device.empty(), path << ": device is empty (\"cpu\", or the GPU's name as calibrate records it)");
  AERIE_CHECK(c.tp >= 1 && (c.world >= c.tp || c.tp_modeled) && c.hidden_size > 0 && !c.layers.empty(),
              path << ": tp " << c.tp << ", world " << c.world << ", hidden_size " << c.hidden_size << ", "
                   << c.layers.size() << " layer kinds: not a calibration of a target");
  // A time of a day or more for one measured forward, step or sample is no measurement (a unit slip, an edited file).
  auto check_curve = [&](const TimeCurve& t, const std::string& field) {
    for (double x : t.seconds)
      AERIE_CHECK(x >= 0 && x < 86400, path << ": " << field << ".seconds holds " << x << " (seconds, 0 to a day)");
  };
  check_curve(c.base, "forward.base");
  for (const LayerKindTimes& l : c.layers) {
    AERIE_CHECK(l.kind == "dense" || l.kind == "moe",
                path << ": forward.layers[].kind is '" << l.kind << "', not dense or moe (the layer kinds calibrate measures)");
    AERIE_CHECK(l.count >= 0, path << ": forward.layers[" << l.kind << "].count is " << l.count);
    check_curve(l.curve, "forward.layers[" + l.kind + "].per_layer");
  }
  AERIE_CHECK(c.ttt_steps >= 1, path << ": train.ttt_steps is " << c.ttt_steps << " (the draft's step has 1 or more)");
  check_curve(c.train_sample, "train.per_sample");
  check_curve(c.train_sample_alone, "train.per_sample_alone");
  AERIE_CHECK(c.train_step_seconds >= 0 && std::isfinite(c.train_step_seconds) &&
                  c.train_step_seconds <= c.train_sample.seconds.front(),
              path << ": train.step_seconds is " << c.train_step_seconds << " (seconds, >= 0, and part of a step of one "
                   << "sample: at most train.per_sample's first time " << c.train_sample.seconds.front() << ")");
  check_curve(c.writer_sample, "disk.writer_per_sample");
  AERIE_CHECK(c.disk_write_bytes_per_s > 0 && std::isfinite(c.disk_write_bytes_per_s),
              path << ": disk.write_bytes_per_s is " << c.disk_write_bytes_per_s << " (a rate above 0)");
  AERIE_CHECK(c.stream_bytes_per_s >= 0 && std::isfinite(c.stream_bytes_per_s),
              path << ": stream.bytes_per_s is " << c.stream_bytes_per_s << " (a rate, 0 when not measured)");
  return c;
}

namespace {

// The summed cost of f(length) over the samples: each at its own length where known, else all at the mean.
double over_samples(const Workload& w, const std::function<double(double)>& f) {
  if (w.lengths.empty()) return static_cast<double>(w.samples) * f(w.mean_tokens);
  double s = 0;
  for (int64_t l : w.lengths) s += f(static_cast<double>(l));
  return s;
}

// The target's forwards over every sample once, on one tp group: one per sample (batch_tokens 0), else each chunk of
// `chunk` consecutive samples packed into forwards of up to batch_tokens tokens as extract and the streaming target
// pack them (data/extract.h's packed_forward_end), a forward of one sample costed along the forward's curve, one of
// several by Calibration::packed_forward_fit (attention within each sample). Where the lengths are unknown, forwards
// of as many samples of the mean length as fit.
double forwards_once(const Calibration& c, const Workload& w, int64_t chunk) {
  if (w.batch_tokens <= 0) return over_samples(w, [&](double l) { return c.forward_seconds(l); });
  const TimeCurve::Fit packed = c.packed_forward_fit();
  const double B = static_cast<double>(w.batch_tokens);
  chunk = std::max<int64_t>(1, chunk);
  if (w.lengths.empty()) {
    const double m = w.mean_tokens;
    const double k = std::min(static_cast<double>(chunk), std::max(1.0, std::floor(B / m)));
    const double forwards = static_cast<double>(w.samples) / k;
    return k == 1 ? forwards * c.forward_seconds(m) : forwards * packed.packed(k * m, k * m * m);
  }
  const std::vector<int64_t> off = w.offsets();
  const int64_t N = static_cast<int64_t>(w.lengths.size());
  double s = 0;
  for (int64_t b = 0; b < N; b += chunk) {
    const int64_t e = std::min(N, b + chunk);
    for (int64_t i = b, j; i < e; i = j) {
      j = packed_forward_end(off, i, e, w.batch_tokens);
      if (j - i == 1) {
        s += c.forward_seconds(static_cast<double>(w.lengths[i]));
        continue;
      }
      double sum_sq = 0;
      for (int64_t k = i; k < j; ++k) sum_sq += static_cast<double>(w.lengths[k]) * static_cast<double>(w.lengths[k]);
      s += packed.packed(static_cast<double>(off[j] - off[i]), sum_sq);
    }
  }
  return s;
}

// The busiest tp group of a job whose chunks of w.samples_per_shard samples rank 0 hands out in order, each to the
// group that is free first (data/chunk_dispatcher.h): its share of the summed work and its samples, a sample of
// length l weighing weight(l) (every sample at the mean where the lengths are unknown). Past 10^6 chunks the
// groups' shares are equal to well within the plan's accuracy: 1 / groups.
struct BusiestGroup {
  double share = 1, samples = 0;
};
BusiestGroup busiest_group(const Workload& w, const std::function<double(double)>& weight, int groups) {
  const int64_t per_chunk = std::max<int64_t>(1, w.samples_per_shard);
  const int64_t chunks = (w.samples + per_chunk - 1) / per_chunk;
  if (groups <= 1) return {1.0, static_cast<double>(w.samples)};
  if (chunks > 1000000) return {1.0 / groups, static_cast<double>(w.samples) / groups};
  std::vector<double> cost(static_cast<size_t>(chunks), 0.0);
  for (int64_t i = 0; i < w.samples; ++i) {
    const double l = w.lengths.empty() ? w.mean_tokens : static_cast<double>(w.lengths[static_cast<size_t>(i)]);
    cost[static_cast<size_t>(i / per_chunk)] += weight(l);
  }
  double sum = 0;
  for (double x : cost) sum += x;
  std::vector<double> busy(static_cast<size_t>(groups), 0.0), taken(static_cast<size_t>(groups), 0.0);
  for (size_t k = 0; k < cost.size(); ++k) {
    const size_t g = static_cast<size_t>(std::min_element(busy.begin(), busy.end()) - busy.begin());
    busy[g] += cost[k];
    taken[g] += static_cast<double>(std::min(per_chunk, w.samples - static_cast<int64_t>(k) * per_chunk));
  }
  const size_t g = static_cast<size_t>(std::max_element(busy.begin(), busy.end()) - busy.begin());
  return {sum > 0 ? busy[g] / sum : 1.0 / groups, taken[g]};
}

// The draft's training over `drawn` samples on `ranks` data-parallel ranks, a sample of length l costing
// `per_sample(l)` (measured as a step of one sample, so it holds the step's own cost once). Each step pays its own
// cost once and waits for its slowest rank: with the dataset's lengths known, steps of train_batch_size samples drawn
// at random (a fixed seed) are dealt to the ranks as the trainer deals them (position i to rank i % ranks), and the
// mean of the slowest rank's sum is the step's time; with the mean length alone every rank's share costs the same.
double draft_seconds(const Calibration& c, const Workload& w, double drawn, const std::function<double(double)>& per_sample,
                     int ranks) {
  const int64_t batch = std::max<int64_t>(1, w.train_batch_size);
  const double steps = std::ceil(drawn / static_cast<double>(batch));
  const double step_cost = std::min(c.train_step_seconds, per_sample(w.mean_tokens));
  auto net = [&](double l) { return std::max(0.0, per_sample(l) - step_cost); };
  // The busiest rank takes ceil(batch / ranks) of a full step's samples (ranks beyond the batch idle), and
  // ceil(rest / ranks) of the last step's rest.
  const double full = std::floor(drawn / static_cast<double>(batch)), rest = drawn - full * static_cast<double>(batch);
  const double busiest = full * std::ceil(static_cast<double>(batch) / ranks) + std::ceil(rest / ranks);
  if (w.lengths.empty() || ranks == 1)
    return steps * step_cost + busiest * over_samples(w, net) / static_cast<double>(w.samples);
  std::mt19937_64 gen(1234);
  std::uniform_int_distribution<size_t> pick(0, w.lengths.size() - 1);
  const int trials = static_cast<int>(std::min<double>(steps, 1000));
  std::vector<double> share(static_cast<size_t>(ranks));
  double slowest = 0;
  for (int s = 0; s < trials; ++s) {
    std::fill(share.begin(), share.end(), 0.0);
    for (int64_t i = 0; i < batch; ++i) share[static_cast<size_t>(i % ranks)] += net(static_cast<double>(w.lengths[pick(gen)]));
    slowest += *std::max_element(share.begin(), share.end());
  }
  return steps * (step_cost + slowest / trials);
}

// train --prepared: the target replicas compute the samples drawn while the trainers train on them.
JobTime plan_stream(const Calibration& c, const Workload& w, double drawn) {
  AERIE_CHECK(w.stream_target_ranks % w.tp == 0 && w.stream_target_ranks < w.world,
              "plan: --stream-target-ranks " << w.stream_target_ranks << " must be a multiple of tp " << w.tp
                                             << " and leave trainer ranks among the " << w.world);
  const int replicas = w.stream_target_ranks / w.tp, trainers = w.world - w.stream_target_ranks;
  const double per_pass = drawn / static_cast<double>(w.samples);  // passes over the dataset the draws make
  JobTime st;
  st.job = "train --prepared";
  // A step's samples are packed per replica: ceil(batch / replicas) at a time (in file order here; the steps
  // shuffle them, which packs alike unless the file is sorted by length).
  const int64_t per_call = (w.train_batch_size + replicas - 1) / replicas;
  st.target_seconds = per_pass * forwards_once(c, w, per_call) / replicas;
  // The trainers step at the rate measured with every rank busy, or faster where the calibration measured one
  // rank alone and the target ranks idle part of the time: between the two, by the ranks busy on average (the
  // trainers, and the target ranks for the share of the time they compute).
  std::function<double(double)> per_sample = [&c](double l) { return c.train_sample.at(l); };
  if (!c.train_sample_alone.tokens.empty() && c.world > 1 && !w.stream_colocated) {
    auto alone = [&](double l) { return c.train_sample_alone.at(l); };
    const double share = std::min(1.0, st.target_seconds / std::max(1e-12, draft_seconds(c, w, drawn, alone, trainers)));
    const double busy = trainers + w.stream_target_ranks * share;
    const double f = std::clamp((busy - 1) / static_cast<double>(w.world - 1), 0.0, 1.0);
    per_sample = [&c, f](double l) { return c.train_sample_alone.at(l) + (c.train_sample.at(l) - c.train_sample_alone.at(l)) * f; };
  }
  st.draft_seconds = draft_seconds(c, w, drawn, per_sample, trainers);
  const double bytes = drawn * w.mean_tokens * 8.0 * static_cast<double>(c.hidden_size);  // aux [3H] + final [H], bf16
  st.message_seconds = c.stream_bytes_per_s > 0 ? bytes / (c.stream_bytes_per_s * std::min(replicas, trainers)) : 0;
  // The queue: a leader runs up to stream-queue + 1 = 3 steps ahead; a step is batch / replicas of its samples.
  const double batch = static_cast<double>(std::max<int64_t>(1, w.train_batch_size));
  st.queue_bytes = static_cast<int64_t>(3 * std::ceil(batch / replicas) * w.mean_tokens * 8.0 * static_cast<double>(c.hidden_size));
  st.compute_seconds = w.stream_colocated ? st.target_seconds + st.draft_seconds : std::max(st.target_seconds, st.draft_seconds);
  st.seconds = w.stream_colocated ? st.compute_seconds + st.message_seconds
                                  : std::max(st.target_seconds, st.draft_seconds + st.message_seconds);
  st.bound = st.target_seconds >= st.draft_seconds && st.target_seconds >= st.message_seconds ? "target"
             : st.draft_seconds >= st.message_seconds                                        ? "draft"
                                                                                              : "messages";
  return st;
}

// generate: each response's prompt is prefilled and its new tokens decoded, gen_batch at a time per tp group. From
// the calibration's two runs: the run of one new token is the prefills (and one step), scaled to the plan's prompt
// length along the forward's curve; the rest of the whole run, per new token, is the decoding.
JobTime plan_generate(const Calibration& c, const Workload& w) {
  const Calibration::Generation& g = c.generate;
  AERIE_CHECK(g.seconds > 0, "plan: the calibration holds no generate measurement (an older aerie's): calibrate again");
  AERIE_CHECK(w.gen_prompt_tokens >= 1 && w.gen_new_tokens >= 1 && w.gen_prompt_tokens <= 1e7 && w.gen_new_tokens <= 1e7,
              "plan: generate needs 1 to 10^7 prompt and new tokens per response (got " << w.gen_prompt_tokens << ", "
                                                                                         << w.gen_new_tokens << ")");
  // An older file has no first_seconds: its prefills estimated from the forward's curve.
  const double prefills = g.first_seconds > 0 ? g.first_seconds
                                              : static_cast<double>(g.batch) * c.forward_seconds(static_cast<double>(g.prompt_tokens));
  const double per_new_token = (g.seconds - prefills) / static_cast<double>(g.batch * (g.new_tokens - (g.first_seconds > 0)));
  AERIE_CHECK(per_new_token > 0, "plan: the calibration's generate run of " << g.new_tokens << " new tokens took "
                                     << g.seconds << " s, no longer than its prefills (" << prefills
                                     << " s): too short to time; calibrate with more --gen-new-tokens or --min-time");
  const double fwd_cal = c.forward_seconds(static_cast<double>(g.prompt_tokens));
  const double prefill = prefills / static_cast<double>(g.batch) *
                         (fwd_cal > 0 ? c.forward_seconds(w.gen_prompt_tokens) / fwd_cal : w.gen_prompt_tokens / g.prompt_tokens);
  const double responses = static_cast<double>(w.gen_responses);
  JobTime j;
  j.job = "generate";
  j.compute_seconds = responses * (prefill + w.gen_new_tokens * per_new_token) / (w.world / w.tp);
  j.seconds = j.compute_seconds;
  j.bound = "compute";
  return j;
}

}  // namespace

double extract_compute_seconds(const Calibration& c, const Workload& w) {
  const int groups = w.world / w.tp;
  auto writer_at = [&](double l) { return c.writer_sample.tokens.empty() ? 0.0 : c.writer_sample.at(l); };
  const double writer = over_samples(w, writer_at);
  const double fwd = forwards_once(c, w, w.samples_per_shard);
  // A GPU's writer thread works beside the forwards; on the CPU backend it takes a core the ranks compute on.
  const double total = w.batch_tokens > 0 && c.device != "cpu" ? std::max(fwd, writer) : fwd + writer;
  // A sample's share of the work: its tokens where forwards pack samples, else its own forward and writer's work.
  std::function<double(double)> weight = [](double l) { return l; };
  if (w.batch_tokens <= 0) weight = [&](double l) { return c.forward_seconds(l) + writer_at(l); };
  const BusiestGroup b = busiest_group(w, weight, groups);
  return total * b.share + c.extract_run_seconds + c.extract_sample_seconds * b.samples;
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
  // generate, extract and the offline train run one rank a device (Workload::devices: a colocated streamed train's
  // world counts a target and a trainer rank a GPU). A streamed train's ranks need not split into tp groups, only
  // its target's: devices that do not split so plan it alone.
  Workload off = w;
  off.world = w.devices();
  const bool offline = off.world % std::max(1, w.tp) == 0;
  AERIE_CHECK(w.tp >= 1 && w.world >= w.tp && (offline || w.stream_target_ranks > 0),
              "plan: " << w.world << " ranks do not split into tp groups of " << w.tp);
  AERIE_CHECK(w.tp == c.tp, "plan: the calibration measured the forward at tp " << c.tp << ", the plan asks tp " << w.tp
                                                                                << ": calibrate with --tp " << w.tp << ", or plan with --tp " << c.tp);
  const double tokens = static_cast<double>(w.samples) * w.mean_tokens;
  // As extract logs it (data/extract.h): its shards of samples_per_shard samples.
  const int64_t shards = (w.samples + w.samples_per_shard - 1) / std::max<int64_t>(1, w.samples_per_shard);
  const int64_t bytes = shard_bytes(static_cast<int64_t>(std::llround(tokens)), w.samples, shards, c.hidden_size,
                                    w.fp8_storage);
  const double drawn = w.train_samples > 0 ? static_cast<double>(w.train_samples)
                                           : static_cast<double>(w.epochs) * static_cast<double>(w.samples);
  std::vector<JobTime> out;
  if (!offline) return {plan_stream(c, w, drawn)};
  if (w.gen_responses > 0) out.push_back(plan_generate(c, off));

  // extract: the forwards spread over the tp groups (chunks are handed out dynamically). A GPU's writer thread works
  // while the next forward runs (the longer of the two counts); on the CPU backend the ranks take the cores and the
  // writer's work adds to the forward's.
  JobTime ex;
  ex.job = "extract";
  ex.compute_seconds = extract_compute_seconds(c, off);
  ex.disk_seconds = c.disk_write_bytes_per_s > 0 ? static_cast<double>(bytes) / c.disk_write_bytes_per_s : 0;
  ex.seconds = std::max(ex.compute_seconds, ex.disk_seconds);
  ex.bound = ex.disk_seconds > ex.compute_seconds ? "disk" : "compute";
  ex.bytes = bytes;
  out.push_back(ex);

  // train: every rank trains on its share of the samples drawn (data parallel over the world), one sample's step
  // each; the draws follow the dataset's lengths.
  JobTime tr;
  tr.job = "train";
  tr.compute_seconds = draft_seconds(c, off, drawn, [&c](double l) { return c.train_sample.at(l); }, off.world);
  tr.seconds = tr.compute_seconds;
  tr.bound = "compute";
  out.push_back(tr);
  if (w.stream_target_ranks > 0) out.push_back(plan_stream(c, w, drawn));
  return out;
}

}  // namespace aerie
