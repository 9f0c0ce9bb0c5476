// The environment switches read in one place (core/settings.h): their defaults, the values each takes, an
// unknown value refused naming the variable, and the snapshot that reload_settings() refreshes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "core/error.h"
#include "core/settings.h"
#include "test_util.h"

namespace aerie {
namespace {

std::map<std::string, std::string> g_env;  // the environment parse_settings sees in these tests
const char* fake_env(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

TEST(Settings, DefaultsWhenNothingIsSet) {
  g_env.clear();
  const Settings s = parse_settings(fake_env);
  EXPECT_EQ(s.batched_decode, -1);
  EXPECT_EQ(s.moe_gemm, "");
  EXPECT_FALSE(s.profile);
  EXPECT_EQ(s.gemm_search, -1);
  EXPECT_EQ(s.grouped_gemm_bm, "mixed");
  EXPECT_EQ(s.grouped_gemm_kernel, "auto");
  EXPECT_EQ(s.grouped_gemm_rs_small, 2);
  EXPECT_FALSE(s.grouped_gemm_tail_wgmma);
  EXPECT_FALSE(s.grouped_gemm_four_stages);
  EXPECT_EQ(s.cuda_emulate, "");
  EXPECT_EQ(s.test_fail_h5_write, -1);
}

TEST(Settings, ValuesAsSet) {
  g_env = {{"AERIE_BATCHED_DECODE", "0"},          {"AERIE_MOE_GEMM", "fused"},
           {"AERIE_PROFILE", "1"},                 {"AERIE_GEMM_SEARCH", "1"},
           {"AERIE_ATTENTION_FORWARD_KERNEL", "mma"}, {"AERIE_GROUPED_GEMM_BM", "64"},
           {"AERIE_GROUPED_GEMM_KERNEL", "rs"},    {"AERIE_GROUPED_GEMM_RS_SMALL", "0"},
           {"AERIE_GROUPED_GEMM_TAIL", "wgmma"},   {"AERIE_GROUPED_GEMM_STAGES", "4"},
           {"AERIE_CUDA_EMULATE", "sm_120"},       {"AERIE_TEST_FAIL_H5_WRITE", "1"}};
  const Settings s = parse_settings(fake_env);
  EXPECT_EQ(s.batched_decode, 0);
  EXPECT_EQ(s.moe_gemm, "fused");
  EXPECT_TRUE(s.profile);
  EXPECT_EQ(s.gemm_search, 1);
  EXPECT_EQ(s.attention_forward_kernel, "mma");
  EXPECT_EQ(s.attention_backward_kernel, "");
  EXPECT_EQ(s.grouped_gemm_bm, "64");
  EXPECT_EQ(s.grouped_gemm_kernel, "rs");
  EXPECT_EQ(s.grouped_gemm_rs_small, 0);
  EXPECT_TRUE(s.grouped_gemm_tail_wgmma);
  EXPECT_TRUE(s.grouped_gemm_four_stages);
  EXPECT_EQ(s.cuda_emulate, "sm_120");
  EXPECT_EQ(s.test_fail_h5_write, 1);
  // A value AERIE_BATCHED_DECODE does not take means the default (the model layer warns once).
  g_env = {{"AERIE_BATCHED_DECODE", "yes"}};
  EXPECT_EQ(parse_settings(fake_env).batched_decode, -1);
  EXPECT_EQ(parse_settings(fake_env).batched_decode_raw, "yes");
  // mma64: the mma.sync attention kernels' 4-warp, 64-wide shapes (for comparing them on an SM of 100 KiB).
  g_env = {{"AERIE_ATTENTION_BACKWARD_KERNEL", "mma64"}};
  EXPECT_EQ(parse_settings(fake_env).attention_backward_kernel, "mma64");
}

// An emulated GPU family is checked when the settings are read, also in a build without the CUDA backend (which never
// asks for the GPU's limits), not at the first kernel launch.
TEST(Settings, UnknownGpuFamilyIsRefusedAtOnce) {
  g_env = {{"AERIE_CUDA_EMULATE", "sm_999"}};
  const std::string e = testing::error_of([] { parse_settings(fake_env); });
  EXPECT_NE(e.find("AERIE_CUDA_EMULATE must name a GPU family"), std::string::npos) << e;
  EXPECT_NE(e.find("'sm_999'"), std::string::npos) << e;
}

TEST(Settings, UnknownValuesNameTheVariable) {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"AERIE_MOE_GEMM", "cutlass"},
                                                                      {"AERIE_GEMM_SEARCH", "yes"},
                                                                      {"AERIE_GROUPED_GEMM_BM", "32"},
                                                                      {"AERIE_GROUPED_GEMM_KERNEL", "tma"},
                                                                      {"AERIE_GROUPED_GEMM_RS_SMALL", "3"},
                                                                      {"AERIE_ATTENTION_BACKWARD_KERNEL", "fa3"}}) {
    g_env = {{name, value}};
    const std::string e = testing::error_of([] { parse_settings(fake_env); });
    EXPECT_NE(e.find(name + " must be one of"), std::string::npos) << e;
    EXPECT_NE(e.find("'" + value + "'"), std::string::npos) << e;
  }
}

TEST(Settings, ReloadTakesAFreshSnapshot) {
  const Settings& before = settings();
  {
    testing::ScopedEnv on("AERIE_GROUPED_GEMM_BM", "128");
    EXPECT_EQ(settings().grouped_gemm_bm, "128");
  }
  EXPECT_EQ(settings().grouped_gemm_bm, before.grouped_gemm_bm);  // the earlier snapshot is still readable
}

}  // namespace
}  // namespace aerie
