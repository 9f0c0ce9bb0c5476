// CUDA GEMM through cuBLASLt. Row-major c (M, N) = op(a) op(b) is column-major c^T (N, M) =
// op(b)^T op(a)^T, and a row-major buffer read column-major is its transpose, so cuBLASLt gets our b as
// its A and our a as its B with the same transpose flags and no copies.
//
// One cuBLASLt handle per host thread and device, created on first use; a 32 MiB workspace per
// (thread, device, stream), allocated once, so that matmuls on two streams never share one; a plan cache
// (descriptors + the algorithm) keyed by shape, dtypes, transposes and pointer alignments.
//
// The algorithm search (AERIE_GEMM_SEARCH, gemm_search_mode()): a shape's algorithm is by default the
// first of cuBLASLt's heuristic list. With the search on, the first beta = 0 call of a shape of at least
// kSearchMinFlop asks the heuristic for up to kSearchCandidates algorithms, runs each on the call's own
// operands (into the call's own output, which the call overwrites anyway: no extra memory), times
// kSearchReps runs of each with CUDA events after one warm-up, and keeps the fastest when it beats the
// heuristic's first by kSearchMinGain (else the first, so near ties do not flip between runs); the host waits
// for those runs, once per shape. Shapes that differ only in M within one power-of-two bucket share the
// winner (cublasLtMatmulAlgoCheck confirms it fits the new M; otherwise the heuristic's first), so a
// training run over samples of many lengths searches about log2(T) times per weight shape. Calls with
// beta != 0 (accumulations) never search (their output must not be overwritten) and use a winner of
// the same shape when a beta = 0 call found one. The search is PyTorch's TunableOp idea for one GEMM
// library: the chosen algorithm can differ between runs, and with it the last bits of the results.
// All of it is kept for the life of the process on purpose (destroying cuBLASLt handles from
// thread_local destructors at exit races the CUDA runtime's own teardown).
#include "kernels/cuda/gemm.h"
#include "core/settings.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "kernels/cuda/common.cuh"

/// Throws aerie::Error naming `what` when a cuBLAS(Lt) call fails.
#define AERIE_CUBLAS_CHECK(call, what)                                                               \
  do {                                                                                               \
    cublasStatus_t st_ = (call);                                                                     \
    AERIE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, what << ": " << cublasLtGetStatusName(st_) << " ("     \
                                                   << cublasLtGetStatusString(st_) << ")");          \
  } while (0)

namespace aerie::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kSearchCandidates = 16;     // algorithms asked of the heuristic per searched shape
constexpr int kSearchReps = 3;            // timed runs per candidate, after one warm-up
constexpr double kSearchMinFlop = 1e9;    // 2 M N K below this: the heuristic's first (~2 us of work)
constexpr double kSearchMinGain = 0.02;   // another algorithm replaces the heuristic's first only when 2% faster
constexpr bool kSearchDefault = false;    // AERIE_GEMM_SEARCH unset: off

struct PlanKey {
  int64_t m, n, k;
  DType ab, c;
  bool ta, tb;
  uint32_t align_a, align_b, align_c;
  bool operator==(const PlanKey&) const = default;
};
/// Folds v into the hash h (boost::hash_combine's mix), for the plan keys.
void hash_mix(size_t& h, uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

struct PlanKeyHash {
  size_t operator()(const PlanKey& p) const {
    size_t h = std::hash<int64_t>()(p.m);
    auto mix = [&h](uint64_t v) { hash_mix(h, v); };
    mix(static_cast<uint64_t>(p.n));
    mix(static_cast<uint64_t>(p.k));
    mix((static_cast<uint64_t>(p.ab) << 8) | (static_cast<uint64_t>(p.c) << 4) | (p.ta << 1) | p.tb);
    mix((static_cast<uint64_t>(p.align_a) << 40) | (static_cast<uint64_t>(p.align_b) << 20) | p.align_c);
    return h;
  }
};

/// The descriptors and algorithm of one matmul configuration.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our b), B (our a), C = D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;     // false: the heuristic had no algorithm (e.g. for these pointer alignments)
  bool searched = false;  // the algorithm is a search's (this shape's or its M bucket's), not the heuristic's first
};

/// An algorithm: a search candidate, or its winner, shared by the shapes of one M bucket (the key's M
/// rounded up to a power of two).
struct Winner {
  cublasLtMatmulAlgo_t algo{};
};

struct Context {
  cublasLtHandle_t handle = nullptr;
  std::unordered_map<cudaStream_t, void*> workspaces;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;
  std::unordered_map<PlanKey, Winner, PlanKeyHash> winners;  // keyed by the bucketed shape
};

/// Smallest power of two >= m (m >= 1).
int64_t m_bucket(int64_t m) {
  int64_t b = 1;
  while (b < m) b <<= 1;
  return b;
}

/// The searches' record, for gemm_search_report (all threads and devices).
std::mutex g_report_mutex;
std::vector<GemmSearchRecord> g_report;

/// The calling thread's context for its current device.
Context& context() {
  thread_local std::unordered_map<int, Context*> contexts;
  int dev = 0;
  AERIE_CUDA_CHECK(cudaGetDevice(&dev), "matmul: cudaGetDevice");
  Context*& ctx = contexts[dev];
  if (!ctx) {
    auto fresh = std::make_unique<Context>();
    AERIE_CUBLAS_CHECK(cublasLtCreate(&fresh->handle), "matmul: cublasLtCreate on GPU " << dev);
    ctx = fresh.release();
  }
  return *ctx;
}

void* workspace(Context& ctx, cudaStream_t s) {
  void*& ws = ctx.workspaces[s];
  if (!ws) AERIE_CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes), "matmul: cudaMalloc of the 32 MiB cuBLASLt workspace");
  return ws;
}

/// Largest power of two <= 256 dividing the address (cuBLASLt's alignment preferences default to 256).
uint32_t alignment_of(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && addr % a != 0) a >>= 1;
  return a;
}

cudaDataType_t cuda_type(DType d) { return d == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

std::string shape_name(const PlanKey& key) {
  std::ostringstream os;
  os << "matmul M=" << key.m << " N=" << key.n << " K=" << key.k << " " << dtype_name(key.ab) << "->"
     << dtype_name(key.c) << " trans_a=" << key.ta << " trans_b=" << key.tb;
  return os.str();
}

/// Up to `count` (<= kSearchCandidates) algorithms from cuBLASLt's heuristic for plan p's descriptors,
/// key's alignments and the workspace, best first (only those whose state is success). Throws
/// aerie::Error on a cuBLASLt failure. (Returned as Winner, a named struct: nvcc 13.0's front end
/// crashes instantiating std::vector of cuBLASLt's unnamed-struct typedefs.)
std::vector<Winner> heuristic(Context& ctx, const PlanKey& key, const Plan& p, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  AERIE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), shape_name(key) << ": cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al_a = key.align_b, al_b = key.align_a, al_c = key.align_c;  // cuBLASLt's A is our b
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
  cublasLtMatmulHeuristicResult_t results[kSearchCandidates] = {};
  count = std::min(count, kSearchCandidates);
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, p.desc, p.a, p.b, p.c, p.c, pref, count, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  AERIE_CUBLAS_CHECK(st, shape_name(key) << ": cublasLtMatmulAlgoGetHeuristic");
  std::vector<Winner> ok;
  for (int i = 0; i < found && i < count; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) ok.push_back(Winner{results[i].algo});
  return ok;
}

/// key with M replaced by its bucket: the key of the winner that shapes of that bucket share.
PlanKey bucket_key(const PlanKey& key) {
  PlanKey b = key;
  b.m = m_bucket(key.m);
  return b;
}

/// Gives a fresh plan its bucket's search winner when there is one and cuBLASLt confirms it runs this
/// exact shape within the workspace.
void adopt_winner(Context& ctx, const PlanKey& key, Plan& p) {
  auto it = ctx.winners.find(bucket_key(key));
  if (it == ctx.winners.end()) return;
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(ctx.handle, p.desc, p.a, p.b, p.c, p.c, &it->second.algo, &check);
  if (st == CUBLAS_STATUS_SUCCESS && check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes) {
    p.algo = it->second.algo;
    p.searched = true;
  }
}

/// The cached plan of `key`, made on first use (the heuristic's first algorithm, or the M bucket's search
/// winner); nullptr when cuBLASLt has no algorithm for it.
Plan* plan_for(Context& ctx, const PlanKey& key) {
  auto it = ctx.plans.find(key);
  if (it != ctx.plans.end()) return it->second.found ? &it->second : nullptr;
  const std::string shapes = shape_name(key);
  Plan p;
  const cublasOperation_t op_a = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     shapes << ": cublasLtMatmulDescCreate");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
                     shapes << ": TRANSA");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
                     shapes << ": TRANSB");
  const auto m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n), k = static_cast<uint64_t>(key.k);
  // Stored (pre-op) column-major shapes: our b is (N, K) ld N, or (K, N) ld K when trans_b; our a is
  // (K, M) ld K, or (M, K) ld M when trans_a; c is (N, M) ld N.
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, cuda_type(key.ab), key.tb ? k : n, key.tb ? n : k,
                                                key.tb ? key.k : key.n),
                     shapes << ": layout of b");
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, cuda_type(key.ab), key.ta ? m : k, key.ta ? k : m,
                                                key.ta ? key.m : key.k),
                     shapes << ": layout of a");
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cuda_type(key.c), n, m, key.n), shapes << ": layout of c");
  const auto results = heuristic(ctx, key, p, 1);
  p.found = !results.empty();
  if (p.found) p.algo = results[0].algo;
  Plan& stored = ctx.plans.emplace(key, p).first->second;
  if (stored.found) adopt_winner(ctx, key, stored);
  return stored.found ? &stored : nullptr;
}

/// Searches plan p's algorithm as the header comment describes: runs the heuristic's candidates on
/// c = op(a) op(b) (alpha as given, beta 0; c is overwritten, as the caller's call will do again),
/// keeps the fastest in p and as the M bucket's winner, and records the timings for gemm_search_report.
/// Waits for the stream. A candidate that fails to run is skipped; throws aerie::Error only on a CUDA
/// event failure.
void search(Context& ctx, const PlanKey& key, Plan& p, const void* a, const void* b, void* c, float alpha,
            cudaStream_t s) {
  p.searched = true;
  const auto cands = heuristic(ctx, key, p, kSearchCandidates);
  if (cands.size() < 2) return;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  AERIE_CUDA_CHECK(cudaEventCreate(&e0), "matmul search: cudaEventCreate");
  AERIE_CUDA_CHECK(cudaEventCreate(&e1), "matmul search: cudaEventCreate");
  const float beta = 0.0f;
  void* ws = workspace(ctx, s);
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(ctx.handle, p.desc, &alpha, b, p.a, a, p.b, &beta, c, p.c, c, p.c, &algo, ws,
                          kWorkspaceBytes, s);
  };
  GemmSearchRecord rec;
  rec.m = key.m;
  rec.n = key.n;
  rec.k = key.k;
  rec.dtypes = std::string(dtype_name(key.ab)) + "->" + dtype_name(key.c);
  rec.trans_a = key.ta;
  rec.trans_b = key.tb;
  rec.candidates = static_cast<int>(cands.size());
  float best_ms = 0.0f;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (run(cands[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a failing candidate is skipped
    AERIE_CUDA_CHECK(cudaEventRecord(e0, s), "matmul search: cudaEventRecord");
    bool ok = true;
    for (int r = 0; r < kSearchReps && ok; ++r) ok = run(cands[i].algo) == CUBLAS_STATUS_SUCCESS;
    AERIE_CUDA_CHECK(cudaEventRecord(e1, s), "matmul search: cudaEventRecord");
    AERIE_CUDA_CHECK(cudaEventSynchronize(e1), "matmul search: cudaEventSynchronize");
    float ms = 0.0f;
    AERIE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), "matmul search: cudaEventElapsedTime");
    if (!ok) continue;
    ms /= kSearchReps;
    if (i == 0) rec.first_ms = ms;
    if (rec.chosen < 0 || ms < best_ms) {
      best_ms = ms;
      rec.chosen = static_cast<int>(i);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (rec.chosen < 0) return;
  // The heuristic's first stays unless another is clearly faster: timings of near-equal algorithms
  // flip between runs, and each flip changes the results' last bits for nothing.
  if (rec.chosen != 0 && rec.first_ms > 0.0 && best_ms > (1.0 - kSearchMinGain) * rec.first_ms) {
    rec.chosen = 0;
    best_ms = static_cast<float>(rec.first_ms);
  }
  rec.best_ms = best_ms;
  p.algo = cands[static_cast<size_t>(rec.chosen)].algo;
  ctx.winners[bucket_key(key)] = Winner{p.algo};
  std::lock_guard<std::mutex> lock(g_report_mutex);
  g_report.push_back(std::move(rec));
}

template <typename T>
__global__ void scale_kernel(T* c, int64_t n, float beta) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    c[i] = from_f32<T>(beta * to_f32(c[i]));
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& c, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  const cudaStream_t s = stream();
  if (k == 0) {  // c = beta c (as the CPU defines it; BLAS would not touch c)
    if (beta == 0.0f) {
      AERIE_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.nbytes(), s), "matmul (K = 0): cudaMemsetAsync of c");
      return;
    }
    constexpr int threads = 256;
    const unsigned blocks = std::min(blocks_for(m * n, threads), 65535u);
    if (c.dtype() == DType::F32) {
      scale_kernel<<<blocks, threads, 0, s>>>(static_cast<float*>(c.raw()), m * n, beta);
    } else {
      scale_kernel<<<blocks, threads, 0, s>>>(static_cast<__nv_bfloat16*>(c.raw()), m * n, beta);
    }
    AERIE_CUDA_LAUNCHED("matmul scale_kernel (K = 0)");
    return;
  }
  Context& ctx = context();
  const PlanKey key{m, n, k, a.dtype(), c.dtype(), trans_a, trans_b,
                    alignment_of(a.raw()), alignment_of(b.raw()), alignment_of(c.raw())};
  Plan* p = plan_for(ctx, key);
  if (!p) {
    const bool aligned = key.align_a == 256 && key.align_b == 256 && key.align_c == 256;
    AERIE_CHECK(!aligned, "matmul M=" << m << " N=" << n << " K=" << k << " " << dtype_name(a.dtype()) << "->"
                                      << dtype_name(c.dtype()) << ": cuBLASLt has no algorithm");
    // No algorithm for these pointer alignments (views at odd offsets): run on fresh, 256-byte aligned
    // copies from the pool, then copy c back. All stream-ordered on s.
    const Tensor a2 = key.align_a < 256 ? a.clone() : a, b2 = key.align_b < 256 ? b.clone() : b;
    Tensor c2 = key.align_c < 256 ? c.clone() : c;
    AERIE_CHECK(alignment_of(a2.raw()) == 256 && alignment_of(b2.raw()) == 256 && alignment_of(c2.raw()) == 256,
                "matmul: no cuBLASLt algorithm for pointer alignments a " << key.align_a << ", b " << key.align_b
                                                                          << ", c " << key.align_c << " bytes");
    matmul(a2, b2, c2, m, n, k, trans_a, trans_b, alpha, beta);
    if (c2.raw() != c.raw()) c.copy_from(c2);
    return;
  }
  if (!p->searched && beta == 0.0f && gemm_search_mode() &&
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kSearchMinFlop)
    search(ctx, key, *p, a.raw(), b.raw(), c.raw(), alpha, s);
  AERIE_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p->desc, &alpha, b.raw(), p->a, a.raw(), p->b, &beta, c.raw(), p->c,
                                    c.raw(), p->c, &p->algo, workspace(ctx, s), kWorkspaceBytes, s),
                     "matmul M=" << m << " N=" << n << " K=" << k << " (a " << shape_str(a.shape()) << " "
                                 << dtype_name(a.dtype()) << (trans_a ? "^T" : "") << ", b "
                                 << shape_str(b.shape()) << (trans_b ? "^T" : "") << ", c "
                                 << dtype_name(c.dtype()) << "): cublasLtMatmul");
}

namespace {
/// -1: not set (AERIE_GEMM_SEARCH / the default decides), else set_gemm_search_mode's value.
std::atomic<int> g_search_override{-1};
}  // namespace

bool gemm_search_mode() {
  const int o = g_search_override.load();
  if (o >= 0) return o == 1;
  const int s = settings().gemm_search;  // AERIE_GEMM_SEARCH
  return s < 0 ? kSearchDefault : s == 1;
}

void set_gemm_search_mode(bool on) { g_search_override.store(on ? 1 : 0); }

std::vector<GemmSearchRecord> gemm_search_report() {
  std::lock_guard<std::mutex> lock(g_report_mutex);
  return g_report;
}

}  // namespace aerie::cuda

// ---- Grouped GEMM (cuBLAS, not Lt: cuBLASLt 13.0 has no grouped matmul) ----

namespace aerie::cuda {
namespace {

/// The calling thread's cuBLAS handle for its current device (kept for the life of the process, as the
/// cuBLASLt handles above).
cublasHandle_t cublas_handle() {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  int dev = 0;
  AERIE_CUDA_CHECK(cudaGetDevice(&dev), "matmul_grouped: cudaGetDevice");
  cublasHandle_t& h = handles[dev];
  if (!h) {
    AERIE_CUBLAS_CHECK(cublasCreate(&h), "matmul_grouped: cublasCreate on GPU " << dev);
    AERIE_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "matmul_grouped: cublasSetPointerMode");
  }
  return h;
}

}  // namespace

void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& groups, Tensor& c) {
  const int64_t K = a.dim(1), N = c.dim(1);
  const int G = static_cast<int>(groups.size());
  AERIE_CHECK(K <= INT32_MAX && N <= INT32_MAX && a.dim(0) <= INT32_MAX,
              "matmul_grouped: shapes beyond 32-bit cuBLAS dimensions");
  // Row-major c_g (m_g, N) = a_g (m_g, K) w_g^T is column-major c_g^T (N, m_g) = w_g a_g^T: cuBLAS's A
  // is w_g (read column-major: (K, N) ld K, transposed), its B is a_g ((K, m_g) ld K), its C c_g (ld N).
  std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
  std::vector<int> m(G, static_cast<int>(N)), n(G), k(G, static_cast<int>(K)), lda(G, static_cast<int>(K)),
      ldb(G, static_cast<int>(K)), ldc(G, static_cast<int>(N)), size(G, 1);
  std::vector<float> alpha(G, 1.0f), beta(G, 0.0f);
  std::vector<int64_t> ptrs(3 * static_cast<size_t>(G));  // A (w), B (a rows), C (c rows)
  const size_t es = dtype_size(a.dtype());
  for (int i = 0; i < G; ++i) {
    const int64_t g = groups[i], r0 = offsets[g];
    n[i] = static_cast<int>(offsets[g + 1] - r0);
    ptrs[i] = reinterpret_cast<int64_t>(w[g].raw());
    ptrs[G + i] = reinterpret_cast<int64_t>(static_cast<const char*>(a.raw()) + r0 * K * es);
    ptrs[2 * G + i] = reinterpret_cast<int64_t>(static_cast<char*>(c.raw()) + r0 * N * es);
  }
  const Tensor dptrs = Tensor::from_vector(ptrs, {3 * static_cast<int64_t>(G)}).to_device(Device::CUDA);
  const auto* p = static_cast<void* const*>(dptrs.raw());
  const cudaDataType_t t = cuda_type(a.dtype());
  cublasHandle_t h = cublas_handle();
  AERIE_CUBLAS_CHECK(cublasSetStream(h, stream()), "matmul_grouped: cublasSetStream");
  AERIE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
                                                p, t, lda.data(), p + G, t, ldb.data(), beta.data(),
                                                const_cast<void* const*>(p + 2 * G), t, ldc.data(), G, size.data(),
                                                CUBLAS_COMPUTE_32F),
                     "matmul_grouped: cublasGemmGroupedBatchedEx over " << G << " groups, N=" << N << " K=" << K
                                                                        << " " << dtype_name(a.dtype()));
}

}  // namespace aerie::cuda

// ---- Strided batched GEMM of MLA's absorbed decode (kernels/mla.h, declared in cuda/mla.h) ----

#include "kernels/cuda/mla.h"

namespace aerie::cuda {

void matmul_strided_batched(const void* a, int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb, void* c,
                            int64_t ldc, int64_t sc, DType ab, DType cd, int64_t m, int64_t n, int64_t k, int64_t batch,
                            bool trans_b) {
  AERIE_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && batch <= INT32_MAX && lda <= INT32_MAX &&
                  ldb <= INT32_MAX && ldc <= INT32_MAX,
              "matmul_strided_batched: sizes beyond 32-bit cuBLAS dimensions");
  // Row-major C_b (m, n) = A_b (m, k) op(B_b) is column-major C_b^T (n, m) = op(B_b)^T A_b^T: cuBLAS's A is
  // our B (column-major (k, n) ld ldb, transposed, when trans_b; else (n, k) ld ldb), its B our A ((k, m) ld lda).
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = cublas_handle();
  AERIE_CUBLAS_CHECK(cublasSetStream(h, stream()), "matmul_strided_batched: cublasSetStream");
  AERIE_CUBLAS_CHECK(
      cublasGemmStridedBatchedEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n),
                                 static_cast<int>(m), static_cast<int>(k), &one, b, cuda_type(ab),
                                 static_cast<int>(ldb), sb, a, cuda_type(ab), static_cast<int>(lda), sa, &zero, c,
                                 cuda_type(cd), static_cast<int>(ldc), sc, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
      "matmul_strided_batched: cublasGemmStridedBatchedEx m=" << m << " n=" << n << " k=" << k << " batch=" << batch);
}

}  // namespace aerie::cuda

// ---- The W8A8 block-FP8 GEMM (kernels/gemm.h matmul_fp8_block) ----

namespace aerie::cuda {
namespace {

struct Fp8Key {
  int64_t m, n, k, ldy;
  DType y;
  bool beta;
  uint32_t align_x, align_w, align_y;
  bool operator==(const Fp8Key&) const = default;
};
struct Fp8KeyHash {
  size_t operator()(const Fp8Key& p) const {
    size_t h = std::hash<int64_t>()(p.m);
    auto mix = [&h](uint64_t v) { hash_mix(h, v); };
    mix(static_cast<uint64_t>(p.n));
    mix(static_cast<uint64_t>(p.k));
    mix(static_cast<uint64_t>(p.ldy));
    mix((static_cast<uint64_t>(p.y) << 1) | p.beta);
    mix((static_cast<uint64_t>(p.align_x) << 40) | (static_cast<uint64_t>(p.align_w) << 20) | p.align_y);
    return h;
  }
};

/// A cached FP8 plan: descriptors (scale pointers are set per call) and the heuristic's first algorithm.
struct Fp8Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

/// The calling thread's FP8 plans for its current device (kept for the life of the process, as the others).
std::unordered_map<Fp8Key, Fp8Plan, Fp8KeyHash>& fp8_plans() {
  thread_local std::unordered_map<int, std::unordered_map<Fp8Key, Fp8Plan, Fp8KeyHash>*> per_device;
  int dev = 0;
  AERIE_CUDA_CHECK(cudaGetDevice(&dev), "matmul_fp8_block: cudaGetDevice");
  auto*& p = per_device[dev];
  if (!p) p = new std::unordered_map<Fp8Key, Fp8Plan, Fp8KeyHash>();
  return *p;
}

std::string fp8_name(const Fp8Key& key) {
  std::ostringstream os;
  os << "matmul_fp8_block M=" << key.m << " N=" << key.n << " K=" << key.k << " ->" << dtype_name(key.y);
  return os.str();
}

/// Descriptors and the heuristic's algorithm for key (found false when cuBLASLt offers none, e.g. a GPU
/// without block-scaled FP8 or a cuBLAS older than 12.9; `refusal` then says why). The scale pointers
/// are set before the heuristic: cuBLASLt rejects block scale modes without them (INVALID_VALUE).
Fp8Plan& fp8_plan_for(Context& ctx, const Fp8Key& key, const float* xs, const float* ws, std::string& refusal) {
  auto& plans = fp8_plans();
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  const std::string what = fp8_name(key);
  Fp8Plan p;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what << ": DescCreate");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), what);
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), what);
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a),
                     what << ": A_SCALE_MODE");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b),
                     what << ": B_SCALE_MODE");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws),
                     what << ": A_SCALE_POINTER");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs),
                     what << ": B_SCALE_POINTER");
  const auto m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n), k = static_cast<uint64_t>(key.k);
  // cuBLASLt's A is the weight (N, K) row-major = column-major (K, N) ld K, transposed; its B the
  // activations (M, K) row-major = column-major (K, M) ld K; D = y's columns (N, M) ld ldy.
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, k, n, key.k), what << ": layout of w");
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, k, m, key.k), what << ": layout of x");
  AERIE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, cuda_type(key.y), n, m, key.ldy), what << ": layout of y");
  cublasLtMatmulPreference_t pref = nullptr;
  AERIE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), what << ": PreferenceCreate");
  const uint64_t ws_bytes = kWorkspaceBytes;
  cublasStatus_t st =
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_w,
                                              sizeof key.align_w);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_x,
                                              sizeof key.align_x);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_y,
                                              sizeof key.align_y);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_y,
                                              sizeof key.align_y);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED / INVALID_VALUE: no block-scaled FP8 kernel for these operands here (not a Hopper GPU,
  // cuBLAS < 12.9, a shape or alignment it does not take): the caller falls back.
  p.found = st == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
  if (p.found) p.algo = res.algo;
  Fp8Plan& stored = plans.emplace(key, p).first->second;
  if (!stored.found)
    refusal = what + ": cublasLtMatmulAlgoGetHeuristic: " +
              (st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(st)
                                           : found == 0 ? "no algorithm" : cublasLtGetStatusName(res.state));
  return stored;
}

}  // namespace

bool matmul_fp8_block(const void* xq, const float* xs, const void* wq, const float* ws, int64_t m, int64_t n, int64_t k,
                      void* y, DType y_dtype, int64_t ldy, float beta, std::string* why) {
  if (m == 0 || n == 0) return true;
  // cuBLASLt's block-scaled FP8 where the GPU family has it (Hopper, data-center Blackwell), else, or where it
  // refuses the operands, the mma.sync e4m3 kernel (sm_89 on); AERIE_FP8_GEMM_KERNEL=cublas / mma / mma128 picks
  // one (mma128: its 128 x 128 tiles).
  const std::string& choice = settings().fp8_gemm_kernel;
  const GpuLimits l = gpu_limits();
  const bool mma = fp8_mma_ok(xq, wq, k);
  if (choice == "mma" || choice == "mma128" || (fp8_gemm_runs_mma(l, choice) && mma)) {
    if (!mma) {
      if (why) *why = "AERIE_FP8_GEMM_KERNEL=" + choice + ", but the mma.sync e4m3 kernel needs sm_89 or later and K % 16 == 0";
      return false;
    }
    matmul_fp8_block_mma(xq, xs, wq, ws, m, n, k, y, y_dtype, ldy, beta, choice == "mma128");
    return true;
  }
  Context& ctx = context();
  const Fp8Key key{m, n, k, ldy, y_dtype, beta != 0.0f, alignment_of(xq), alignment_of(wq), alignment_of(y)};
  std::string refusal;
  Fp8Plan& p = fp8_plan_for(ctx, key, xs, ws, refusal);
  if (!p.found) {
    if (choice.empty() && mma) {
      matmul_fp8_block_mma(xq, xs, wq, ws, m, n, k, y, y_dtype, ldy, beta);
      return true;
    }
    if (why) *why = refusal.empty() ? fp8_name(key) + ": cuBLASLt has no algorithm (refused before)" : refusal;
    return false;
  }
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws),
                     fp8_name(key) << ": A_SCALE_POINTER");
  AERIE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs),
                     fp8_name(key) << ": B_SCALE_POINTER");
  const float alpha = 1.0f;
  const cudaStream_t s = stream();
  AERIE_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.desc, &alpha, wq, p.a, xq, p.b, &beta, y, p.d, y, p.d, &p.algo,
                                    workspace(ctx, s), kWorkspaceBytes, s),
                     fp8_name(key) << ": cublasLtMatmul");
  return true;
}

}  // namespace aerie::cuda
