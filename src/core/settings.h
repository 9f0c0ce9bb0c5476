// The environment switches aerie's library reads (AERIE_*), read and checked in one place: a snapshot taken at
// the first settings() call, so that a kernel launch or a forward reads a field instead of the environment. Each is
// for benchmarks, tests or a workaround, never needed for a correct run; docs/performance.md says where each was
// measured. A test that sets one calls reload_settings() (testing::ScopedEnv does).
#pragma once
#include <string>

namespace aerie {

struct Settings {
  /// AERIE_BATCHED_DECODE: 1 forces the batched decoding step (one forward over every running sequence), 0 the
  /// per-sequence one, unset the device's default; any other value is warned about and means unset.
  int batched_decode = -1;
  std::string batched_decode_raw;  // the value as set ("" when unset), for that warning
  /// AERIE_MOE_GEMM: "" (the fused grouped GEMM where it takes the experts), "cublas" (never), "fused" (must).
  std::string moe_gemm;
  /// AERIE_PROFILE=1: per-op timings of the forward (model/op_profile.h).
  bool profile = false;
  /// AERIE_GEMM_SEARCH: 1 searches cuBLASLt's algorithms per shape, 0 takes its heuristic, -1 (unset) the build's
  /// default (kernels/cuda/gemm.cu).
  int gemm_search = -1;
  /// AERIE_ATTENTION_FORWARD_KERNEL / AERIE_ATTENTION_BACKWARD_KERNEL: "" (auto), "wgmma" (also where auto would not
  /// take it), "mma" (the mma.sync kernels on an sm_90a GPU too), "mma64" (the mma.sync kernels with 4 warps and
  /// 64-wide tiles also where an SM of 100 KiB takes 8 warps or 32-key tiles: for comparing the two), "fa2" (the
  /// forward's mma.sync kernel in FlashAttention-2's shape at head dims 64, 128 and 192 / 128: 32 rows per warp, 128
  /// per block; opt-in, slower at T 2048, docs/performance.md; the backward takes it as "mma"), "mma2" (the backward's
  /// two mma.sync passes, dq and dk/dv, where its one-pass kernel is the mma.sync default at head dims 64 and 128;
  /// the forward takes it as "mma"), "fused64" (the one-pass backward with blocks of 64 keys also where the GPU holds
  /// its 128-key blocks; the forward takes it as "mma").
  std::string attention_forward_kernel, attention_backward_kernel;
  /// AERIE_GROUPED_GEMM_BM: the grouped GEMM's row tiles, "mixed" (default), "64" or "128".
  std::string grouped_gemm_bm = "mixed";
  /// AERIE_GROUPED_GEMM_KERNEL: "auto" (default), "ws", "wgmma", "mma", "rs" or "rsm" (kernels/cuda/grouped_gemm.cu).
  std::string grouped_gemm_kernel = "auto";
  /// AERIE_GROUPED_GEMM_RS_SMALL: the register-sourced kernel's tiles of up to 128 rows, 2 CTAs per SM (2, default),
  /// 1, or the 256-row kernel (0).
  int grouped_gemm_rs_small = 2;
  /// AERIE_GROUPED_GEMM_TAIL=wgmma: the warp-specialized kernel's 64-row tiles by variant 2.
  bool grouped_gemm_tail_wgmma = false;
  /// AERIE_GROUPED_GEMM_STAGES=4: four pipeline stages instead of three.
  bool grouped_gemm_four_stages = false;
  /// AERIE_FP8_GEMM_KERNEL: the W8A8 block-FP8 GEMM by "" (auto: cuBLASLt on sm_90 / sm_100, else mma.sync),
  /// "cublas", "mma" (kernels/cuda/gemm_fp8_mma.cu) or "mma128" (its 128 x 128 kernel: opt-in, level with the
  /// 64 x 64 one on an H100, where mma.sync e4m3's rate bounds both; not yet measured on an sm_120: docs/performance.md).
  std::string fp8_gemm_kernel;
  /// AERIE_CUDA_EMULATE: plan the kernels as on that GPU family ("sm_120", ...; "" the GPU's own; core/gpu_limits.h).
  std::string cuda_emulate;
  /// AERIE_TEMPLATE_DIR: one more folder of chat templates, searched first ("" none).
  std::string template_dir;
  /// AERIE_TEST_FAIL_H5_WRITE: the world rank whose HDF5 writes fail (-1 none; tests of the disk-full path).
  int test_fail_h5_write = -1;
};

/// The switches as the environment set them at the first call (or the last reload_settings()). Throws
/// aerie::Error naming the variable and the values it takes when one holds another value.
const Settings& settings();

/// Reads the environment again (tests that set a switch; not while another thread runs aerie's work). Throws as
/// settings() does.
void reload_settings();

/// The switches of an environment given by `get` (name -> value or nullptr): settings()' parser, for tests.
Settings parse_settings(const char* (*get)(const char*));

}  // namespace aerie
