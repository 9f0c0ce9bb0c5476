// CPU GEMM: OpenBLAS cblas_sgemm (row-major). Deterministic run-to-run for a fixed OPENBLAS_NUM_THREADS.
#include <cblas.h>

#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

void sgemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
           bool trans_b, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS would not touch c with lda 0; define it as c = beta c
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  const int64_t lda = trans_a ? m : k;  // a is (K, M) when transposed
  const int64_t ldb = trans_b ? k : n;  // b is (N, K) when transposed
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(n));
}

void bgemm(const bf16* a, const bf16* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
           bool trans_b, float alpha, float beta) {
  std::vector<float> af(static_cast<size_t>(m * k)), bf(static_cast<size_t>(k * n));
  for (size_t i = 0; i < af.size(); ++i) af[i] = static_cast<float>(a[i]);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = static_cast<float>(b[i]);
  sgemm(af.data(), bf.data(), c, m, n, k, trans_a, trans_b, alpha, beta);
}

}  // namespace aerie::cpu
