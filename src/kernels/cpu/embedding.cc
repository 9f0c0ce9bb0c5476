// CPU embedding lookup (rows widened to fp32) and its backward (rows added in id order, fp32).
#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

template <typename T>
void embedding_forward(const int32_t* ids, const T* table, float* out, int64_t n, int64_t h, int64_t row_offset) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = table + (static_cast<int64_t>(ids[i]) - row_offset) * h;
    for (int64_t j = 0; j < h; ++j) out[i * h + j] = static_cast<float>(row[j]);
  }
}

template void embedding_forward<float>(const int32_t*, const float*, float*, int64_t, int64_t, int64_t);
template void embedding_forward<bf16>(const int32_t*, const bf16*, float*, int64_t, int64_t, int64_t);

void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t h,
                        int64_t row_offset) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = dtable + (static_cast<int64_t>(ids[i]) - row_offset) * h;
    for (int64_t j = 0; j < h; ++j) row[j] += dout[i * h + j];
  }
}

}  // namespace aerie::cpu
