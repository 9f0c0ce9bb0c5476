// Helpers shared by the tests: paths of the real data and of a scratch folder, tolerance checks.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/settings.h"
#include "core/error.h"

namespace aerie::testing {

/// ../shared/data beside the checkout (read-only), or $AERIE_DATA when set.
inline std::string data_dir() {
  const char* env = std::getenv("AERIE_DATA");
  return env ? std::string(env) : std::string(AERIE_SHARED_DATA);
}
/// Where the tests write: the build folder's test-scratch, or $AERIE_TEST_SCRATCH when set (two runs of one build
/// at once, as tools/bench/gpu_paths.sh makes them, each need their own).
inline std::string scratch_root() {
  const char* env = std::getenv("AERIE_TEST_SCRATCH");
  return env && *env ? std::string(env) : std::string(AERIE_BINARY_DIR) + "/test-scratch";
}
/// A fresh, empty folder under scratch_root() for one test.
inline std::string scratch_dir(const std::string& name) {
  auto p = std::filesystem::path(scratch_root()) / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}
/// EXPECTs |got - ref| <= atol + rtol |ref| elementwise, reporting the first few failures by index.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                         const std::string& what = "") {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - ref[i]) <= atol + rtol * std::fabs(ref[i]))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << ref[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

/// EXPECTs |got - ref| <= tol (max_i |ref_i|) + tol |ref| elementwise: a tolerance relative to the
/// tensor's scale as well as to each element. A reordered fp32 sum (tp's partial products, another
/// OpenBLAS kernel family such as SkylakeX vs Haswell, another CPU) moves every element by a few ulps of
/// the largest terms it sums, not of itself, so a pure per-element bound fails on small elements (a
/// logit of 1e-2 among logits of 10).
inline void expect_close_scaled(const std::vector<float>& got, const std::vector<float>& ref, float tol,
                                const std::string& what = "") {
  float scale = 0.0f;
  for (float x : ref) scale = std::max(scale, std::fabs(x));
  expect_close(got, ref, tol * scale, tol, what);
}

}  // namespace aerie::testing

namespace aerie::testing {
/// The converted stories260K model (config.json, model.safetensors, tokenizer.json): $AERIE_TEST_MODEL (a
/// staged copy, e.g. on a GPU machine that ran no build), else the one the build makes from ../shared/data
/// in models/stories260K; tests that need it start with AERIE_REQUIRE_MODEL().
inline std::string model_dir() {
  const char* env = std::getenv("AERIE_TEST_MODEL");
  return env && *env ? env : AERIE_MODEL_DIR;
}
inline bool have_model() { return std::filesystem::exists(model_dir() + "/config.json"); }
}  // namespace aerie::testing

namespace aerie::testing {
/// The message of the aerie::Error that f throws, "" when it throws none (for checks that an error
/// names its file, tensor or option).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace aerie::testing

namespace aerie::testing {
/// Sets an environment variable for the enclosing scope (a test that picks a path such as
/// AERIE_BATCHED_DECODE), or unsets it (value nullptr); the previous value, or its absence, comes back at
/// the end of the scope. The library's settings snapshot is reloaded each time. Throws what reload_settings()
/// throws for a value the library does not take (then the variable stays set: use it for valid values).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
    ::aerie::reload_settings();  // the library reads its switches from a snapshot (core/settings.h)
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
    ::aerie::reload_settings();
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};
}  // namespace aerie::testing

#include "core/device.h"
namespace aerie::testing {
/// True when the environment sets AERIE_NO_SKIP=1: on the GPU machine a CUDA test that cannot run
/// (no GPU found, no CUDA backend, no test model) fails instead of skipping, so a run that reports GPU
/// results cannot pass by skipping.
inline bool no_skip() {
  const char* v = std::getenv("AERIE_NO_SKIP");
  return v && std::string(v) == "1";
}
}  // namespace aerie::testing

/// Skips the current test, with the reason printed, when no CUDA device can run it (no GPU, or a build
/// without the CUDA backend); with AERIE_NO_SKIP=1 it fails instead. Use as the first statement of every
/// CUDA test.
#define AERIE_REQUIRE_CUDA()                                                                       \
  do {                                                                                             \
    if (!::aerie::cuda::available()) {                                                             \
      if (::aerie::testing::no_skip())                                                             \
        FAIL() << "CUDA test cannot run (AERIE_NO_SKIP=1): " << ::aerie::cuda::unavailable_reason(); \
      GTEST_SKIP() << "CUDA test skipped: " << ::aerie::cuda::unavailable_reason();                \
    }                                                                                              \
  } while (0)

/// Skips the current test when the converted stories260K model (testing::model_dir()) is absent; with
/// AERIE_NO_SKIP=1 (a GPU run, where the build's models/ folder must travel or AERIE_TEST_MODEL name a copy)
/// it fails instead.
#define AERIE_REQUIRE_MODEL()                                                                          \
  do {                                                                                                 \
    if (!::aerie::testing::have_model()) {                                                             \
      if (::aerie::testing::no_skip())                                                                 \
        FAIL() << "no converted stories260K at " << ::aerie::testing::model_dir() << " (AERIE_NO_SKIP=1)"; \
      GTEST_SKIP() << "no converted stories260K at " << ::aerie::testing::model_dir();                 \
    }                                                                                                  \
  } while (0)
