// Embedding: checks (including every id's range) and device dispatch (see embedding.h).
#include "kernels/embedding.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/embedding.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;
using kernels::check_float;

namespace {

/// Checks ids ([N] I32, any device: GPU ids are copied to the host) against the table's v rows.
void check_ids(const char* op, const Tensor& ids, int64_t v, int64_t row_offset) {
  const Tensor host = ids.device() == Device::CPU ? ids : ids.to_device(Device::CPU);
  const int32_t* id = host.data<int32_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    const int64_t row = static_cast<int64_t>(id[i]) - row_offset;
    AERIE_CHECK(row >= 0 && row < v, op << ": ids[" << i << "] = " << id[i] << " (row offset " << row_offset
                                        << ") is outside the table's " << v << " rows");
  }
}

/// embedding_forward's body; check_on_cuda: copy CUDA ids to the host and range-check them first.
void embedding_forward_impl(const char* op, const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset,
                            bool check_on_cuda) {
  AERIE_CHECK(ids.ndim() == 1, op << ": ids must be [N], got " << shape_str(ids.shape()));
  ids.check_dtype(DType::I32, what(op, "ids"));
  AERIE_CHECK(table.ndim() == 2, op << ": table must be [V, H], got " << shape_str(table.shape()));
  check_float(table, op, "table");
  const int64_t n = ids.dim(0), v = table.dim(0), h = table.dim(1);
  out.check_shape({n, h}, what(op, "out"));
  check_float(out, op, "out");
  const Device dev = kernels::common_device(op, {{"ids", &ids}, {"table", &table}, {"out", &out}});
  kernels::check_backend(op, dev);  // before check_ids reads the ids
  if (dev == Device::CPU || check_on_cuda) check_ids(op, ids, v, row_offset);
  AERIE_CUDA_DISPATCH(op, dev, cuda::embedding_forward(ids, table, out, row_offset));
  const int32_t* id = ids.data<int32_t>();
  Tensor of = out.dtype() == DType::F32 ? out : Tensor::empty({n, h}, DType::F32);
  if (table.dtype() == DType::F32)
    cpu::embedding_forward(id, table.data<float>(), of.data<float>(), n, h, row_offset);
  else
    cpu::embedding_forward(id, table.data<bf16>(), of.data<float>(), n, h, row_offset);
  if (out.dtype() != DType::F32) out.copy_from(of.to(out.dtype()));
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset) {
  embedding_forward_impl("embedding_forward", ids, table, out, row_offset, true);
}

void embedding_forward_in_range(const Tensor& ids, const Tensor& table, Tensor& out, int64_t id_bound) {
  constexpr const char* op = "embedding_forward_in_range";
  AERIE_CHECK(table.ndim() == 2, op << ": table must be [V, H], got " << shape_str(table.shape()));
  AERIE_CHECK(id_bound > 0 && id_bound <= table.dim(0),
              op << ": id bound " << id_bound << " is outside (0, " << table.dim(0) << "] (the table's rows)");
  embedding_forward_impl(op, ids, table.slice(0, id_bound), out, 0, false);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t row_offset) {
  constexpr const char* op = "embedding_backward";
  AERIE_CHECK(ids.ndim() == 1, op << ": ids must be [N], got " << shape_str(ids.shape()));
  ids.check_dtype(DType::I32, what(op, "ids"));
  AERIE_CHECK(dtable.ndim() == 2, op << ": dtable must be [V, H], got " << shape_str(dtable.shape()));
  dtable.check_dtype(DType::F32, what(op, "dtable"));
  const int64_t n = ids.dim(0), v = dtable.dim(0), h = dtable.dim(1);
  dout.check_shape({n, h}, what(op, "dout"));
  check_float(dout, op, "dout");
  const Device dev = kernels::common_device(op, {{"ids", &ids}, {"dout", &dout}, {"dtable", &dtable}});
  kernels::check_backend(op, dev);  // before check_ids reads the ids
  check_ids(op, ids, v, row_offset);
  AERIE_CUDA_DISPATCH(op, dev, cuda::embedding_backward(ids, dout, dtable, row_offset));
  const Tensor df = dout.dtype() == DType::F32 ? dout : dout.to(DType::F32);
  cpu::embedding_backward(ids.data<int32_t>(), df.data<float>(), dtable.data<float>(), n, h, row_offset);
}

}  // namespace aerie
