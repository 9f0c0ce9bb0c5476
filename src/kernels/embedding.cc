// Embedding: checks (including every id's range) and device dispatch (see embedding.h).
#include "kernels/embedding.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset) {
  constexpr const char* op = "embedding_forward";
  AERIE_CHECK(ids.ndim() == 1, op << ": ids must be [N], got " << shape_str(ids.shape()));
  ids.check_dtype(DType::I32, what(op, "ids"));
  AERIE_CHECK(table.ndim() == 2, op << ": table must be [V, H], got " << shape_str(table.shape()));
  AERIE_CHECK(table.dtype() == DType::F32 || table.dtype() == DType::BF16,
              op << ": table must be F32 or BF16, got " << dtype_name(table.dtype()));
  const int64_t n = ids.dim(0), v = table.dim(0), h = table.dim(1);
  out.check_shape({n, h}, what(op, "out"));
  out.check_dtype(DType::F32, what(op, "out"));
  const Device dev = kernels::common_device(op, {{"ids", &ids}, {"table", &table}, {"out", &out}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(id[i]) - row_offset;
    AERIE_CHECK(row >= 0 && row < v, op << ": ids[" << i << "] = " << id[i] << " (row offset " << row_offset
                                        << ") is outside the table's " << v << " rows");
  }
  if (table.dtype() == DType::F32)
    cpu::embedding_forward(id, table.data<float>(), out.data<float>(), n, h, row_offset);
  else
    cpu::embedding_forward(id, table.data<bf16>(), out.data<float>(), n, h, row_offset);
}

}  // namespace aerie
