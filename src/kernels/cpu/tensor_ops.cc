// CPU reference of the layout ops (kernels/tensor_ops.h).
#include <cstdint>
#include <cstring>

namespace aerie::cpu {

// Copies `rows` rows of `width` bytes; row i starts at src + i * src_pitch and dst + i * dst_pitch (bytes).
void copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows, int64_t width) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(d + i * dst_pitch, s + i * src_pitch, static_cast<size_t>(width));
}

}  // namespace aerie::cpu
