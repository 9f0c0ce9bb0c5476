// The limits the CUDA kernels plan for (core/gpu_limits.h): the table of GPU families that AERIE_CUDA_EMULATE
// names and how an emulated family caps the real GPU. CPU-only; the kernels under the setting are tested by the
// CUDA suites run with AERIE_CUDA_EMULATE=sm_120 (tools/bench/gpu_paths.sh).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "core/gpu_limits.h"
#include "test_util.h"

namespace aerie::cuda {
namespace {

TEST(GpuLimits, UnsetMeansTheRealGpu) {
  EXPECT_FALSE(emulated_gpu_limits(nullptr));
  EXPECT_FALSE(emulated_gpu_limits(""));
  const GpuLimits h100{9, 0, 227 * 1024, true, ""};
  const GpuLimits l = apply_emulation(h100, std::nullopt);
  EXPECT_EQ(l.smem_per_block, 227 * 1024);
  EXPECT_TRUE(l.wgmma);
  EXPECT_EQ(l.emulated, "");
}

TEST(GpuLimits, FamiliesAsCudaReportsThem) {
  for (const char* name : {"sm_120", "120", "12.0"}) {
    const auto l = emulated_gpu_limits(name);
    ASSERT_TRUE(l) << name;
    EXPECT_EQ(l->major, 12);
    EXPECT_EQ(l->smem_per_block, 101376) << "RTX PRO 6000 / RTX 5090: 99 KiB per block";
    EXPECT_FALSE(l->wgmma);
    EXPECT_EQ(l->emulated, "sm_120");
  }
  const auto b200 = emulated_gpu_limits("sm_100a");
  ASSERT_TRUE(b200);
  EXPECT_EQ(b200->major, 10);
  EXPECT_EQ(b200->smem_per_block, 232448);
  EXPECT_FALSE(b200->wgmma) << "sm_100 has tcgen05, not wgmma";
  EXPECT_EQ(emulated_gpu_limits("sm_80")->smem_per_block, 166912);
  EXPECT_EQ(emulated_gpu_limits("sm_89")->smem_per_block, 101376);
  EXPECT_TRUE(emulated_gpu_limits("sm_90a")->wgmma);
}

TEST(GpuLimits, EmulationCapsTheRealGpu) {
  const GpuLimits h100{9, 0, 232448, true, ""};
  const GpuLimits as120 = apply_emulation(h100, emulated_gpu_limits("sm_120"));
  EXPECT_EQ(as120.smem_per_block, 101376);
  EXPECT_FALSE(as120.wgmma);
  EXPECT_EQ(as120.major, 12);
  EXPECT_EQ(as120.emulated, "sm_120");
  // An A100 cannot lend an sm_90's shared memory or its wgmma.
  const GpuLimits a100{8, 0, 166912, false, ""};
  const GpuLimits as90 = apply_emulation(a100, emulated_gpu_limits("sm_90"));
  EXPECT_EQ(as90.smem_per_block, 166912);
  EXPECT_FALSE(as90.wgmma);
}

// The SM's shared memory: an H100's 228 KiB capped at an RTX PRO 6000's 100 KiB by a carveout of 44% (100.4 KiB:
// the driver rounds to a configuration that holds it), so that one 96 KiB block runs per SM as there, not two.
TEST(GpuLimits, EmulationCapsTheSmAsWellAsTheBlock) {
  const GpuLimits h100{9, 0, 232448, true, "", 233472};
  EXPECT_EQ(apply_emulation(h100, std::nullopt).carveout_percent, -1) << "nothing emulated: the driver's default";
  const GpuLimits as120 = apply_emulation(h100, emulated_gpu_limits("sm_120"));
  EXPECT_EQ(as120.smem_per_sm, 102400);
  EXPECT_EQ(as120.carveout_percent, 44);
  EXPECT_GE(as120.carveout_percent * h100.smem_per_sm, 100 * as120.smem_per_sm) << "rounded up, never below";
  const GpuLimits as80 = apply_emulation(h100, emulated_gpu_limits("sm_80"));
  EXPECT_EQ(as80.smem_per_sm, 164 * 1024);
  EXPECT_EQ(as80.carveout_percent, 72);
  // An sm_100's SM is as large as the H100's: no carveout; nor where the real SM's size is unknown.
  EXPECT_EQ(apply_emulation(h100, emulated_gpu_limits("sm_100")).carveout_percent, -1);
  const GpuLimits unknown{9, 0, 232448, true, ""};
  EXPECT_EQ(apply_emulation(unknown, emulated_gpu_limits("sm_120")).carveout_percent, -1);
  EXPECT_EQ(apply_emulation(unknown, emulated_gpu_limits("sm_120")).smem_per_sm, 102400);
}

// Which W8A8 GEMM --fp8-gemm takes: cuBLASLt's block-scaled FP8 on sm_90 / sm_100 (and as emulated there), aerie's
// mma.sync e4m3 kernel on sm_89 and sm_120 (and under AERIE_FP8_GEMM_KERNEL=mma), neither below sm_89.
TEST(GpuLimits, Fp8GemmKernelByFamily) {
  EXPECT_FALSE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_90"), ""));
  EXPECT_FALSE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_100"), ""));
  EXPECT_TRUE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_120"), ""));
  EXPECT_TRUE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_89"), ""));
  EXPECT_FALSE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_86"), "")) << "no e4m3 mma.sync before sm_89";
  EXPECT_TRUE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_90"), "mma"));
  EXPECT_FALSE(fp8_gemm_runs_mma(*emulated_gpu_limits("sm_120"), "cublas"));
  const GpuLimits h100{9, 0, 232448, true, "", 233472};
  EXPECT_TRUE(fp8_gemm_runs_mma(apply_emulation(h100, emulated_gpu_limits("sm_120")), ""));
}

TEST(GpuLimits, UnknownFamilyNamesTheSetting) {
  EXPECT_NE(testing::error_of([] { emulated_gpu_limits("sm_75"); }).find("AERIE_CUDA_EMULATE"), std::string::npos);
  const std::string e = testing::error_of([] { emulated_gpu_limits("rtx6000"); });
  EXPECT_NE(e.find("sm_120"), std::string::npos) << e;
  EXPECT_NE(e.find("'rtx6000'"), std::string::npos) << e;
}

// On a GPU: the limits the kernels plan for are the device's, or, under AERIE_CUDA_EMULATE (as
// tools/bench/gpu_paths.sh runs every suite), the emulated family's, so that a run of the suites "as sm_120"
// shows in its own output that the setting reached the kernels' planning.
TEST(GpuLimitsCuda, TheKernelsPlanForTheDeviceOrItsEmulation) {
  AERIE_REQUIRE_CUDA();
  const GpuLimits l = gpu_limits();
  std::printf("[ gpu limits ] %s: sm_%d%d, %ld bytes of shared memory per block, wgmma %s, emulated '%s'\n",
              current_device_name().c_str(), l.major, l.minor, static_cast<long>(l.smem_per_block), l.wgmma ? "yes" : "no",
              l.emulated.c_str());
  const auto want = emulated_gpu_limits(std::getenv("AERIE_CUDA_EMULATE"));
  if (!want) {
    EXPECT_EQ(l.emulated, "");
    EXPECT_GE(l.smem_per_block, 48 * 1024);
    return;
  }
  EXPECT_EQ(l.emulated, want->emulated);
  EXPECT_LE(l.smem_per_block, want->smem_per_block);
  if (!want->wgmma) {
    EXPECT_FALSE(l.wgmma);
  }
}

}  // namespace
}  // namespace aerie::cuda
