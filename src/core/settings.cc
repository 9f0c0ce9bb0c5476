#include "core/settings.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/gpu_limits.h"

namespace aerie {

namespace {

// `name`'s value, "" when unset, checked against `allowed` (empty: any value).
std::string one_of(const char* (*get)(const char*), const char* name, const std::vector<std::string>& allowed,
                   const std::string& unset = "") {
  const char* v = get(name);
  if (v == nullptr || *v == '\0') return unset;
  const std::string s = v;
  if (allowed.empty()) return s;
  std::string list;
  for (const std::string& a : allowed) {
    if (s == a) return s;
    list += (list.empty() ? "" : ", ") + a;
  }
  AERIE_THROW(name << " must be one of " << list << ", got '" << s << "'");
}

// Every snapshot taken stays alive (a reference from before a reload stays valid); the current one is read without
// a lock at every call.
std::mutex g_mutex;
std::vector<std::unique_ptr<Settings>> g_snapshots;
std::atomic<const Settings*> g_current{nullptr};

const char* from_env(const char* name) { return std::getenv(name); }

const Settings* take_snapshot() {
  auto fresh = std::make_unique<Settings>(parse_settings(from_env));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_snapshots.push_back(std::move(fresh));
  g_current.store(g_snapshots.back().get(), std::memory_order_release);
  return g_snapshots.back().get();
}

}  // namespace

Settings parse_settings(const char* (*get)(const char*)) {
  Settings s;
  s.batched_decode_raw = one_of(get, "AERIE_BATCHED_DECODE", {});
  s.batched_decode = s.batched_decode_raw == "1" ? 1 : s.batched_decode_raw == "0" ? 0 : -1;
  s.moe_gemm = one_of(get, "AERIE_MOE_GEMM", {"cublas", "fused"});
  s.profile = one_of(get, "AERIE_PROFILE", {}) == "1";
  const std::string search = one_of(get, "AERIE_GEMM_SEARCH", {"0", "1"});
  s.gemm_search = search.empty() ? -1 : search == "1";
  s.attention_forward_kernel = one_of(get, "AERIE_ATTENTION_FORWARD_KERNEL", {"wgmma", "mma", "mma64", "fa2", "mma2", "fused64"});
  s.attention_backward_kernel = one_of(get, "AERIE_ATTENTION_BACKWARD_KERNEL", {"wgmma", "mma", "mma64", "fa2", "mma2", "fused64"});
  s.grouped_gemm_bm = one_of(get, "AERIE_GROUPED_GEMM_BM", {"mixed", "64", "128"}, "mixed");
  s.grouped_gemm_kernel = one_of(get, "AERIE_GROUPED_GEMM_KERNEL", {"auto", "ws", "wgmma", "mma", "rs", "rsm"}, "auto");
  s.grouped_gemm_rs_small = one_of(get, "AERIE_GROUPED_GEMM_RS_SMALL", {"0", "1", "2"}, "2")[0] - '0';
  s.grouped_gemm_tail_wgmma = one_of(get, "AERIE_GROUPED_GEMM_TAIL", {}) == "wgmma";
  s.grouped_gemm_four_stages = one_of(get, "AERIE_GROUPED_GEMM_STAGES", {}) == "4";
  s.fp8_gemm_kernel = one_of(get, "AERIE_FP8_GEMM_KERNEL", {"cublas", "mma", "mma128"});
  s.cuda_emulate = one_of(get, "AERIE_CUDA_EMULATE", {});
  cuda::emulated_gpu_limits(s.cuda_emulate.c_str());  // an unknown family is refused here, also in a CPU-only build
  s.template_dir = one_of(get, "AERIE_TEMPLATE_DIR", {});
  const std::string fail = one_of(get, "AERIE_TEST_FAIL_H5_WRITE", {});
  s.test_fail_h5_write = fail.empty() ? -1 : std::atoi(fail.c_str());
  return s;
}

const Settings& settings() {
  const Settings* s = g_current.load(std::memory_order_acquire);
  return s != nullptr ? *s : *take_snapshot();
}

void reload_settings() { take_snapshot(); }

}  // namespace aerie
