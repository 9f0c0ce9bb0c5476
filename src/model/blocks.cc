// ForwardContext and Linear (model/blocks.h).
#include "model/blocks.h"

#include "core/error.h"
#include "kernels/gemm.h"

namespace aerie {

Tensor ForwardContext::buffer(const std::string& name, const Shape& shape, DType dt) {
  auto it = buffers_.find(name);
  if (it != buffers_.end() && it->second.shape() == shape && it->second.dtype() == dt) return it->second;
  Tensor t = Tensor::empty(shape, dt, device);
  buffers_[name] = t;
  return t;
}

void ForwardContext::gemm(const Tensor& x, const Tensor& W, Tensor& y) {
  prof.time(OpKind::Gemm, device, [&] { matmul(x, W, y, false, true); });
}

void ForwardContext::add_bias(Tensor& y, const Tensor& b) {
  if (!b.defined()) return;
  prof.time(OpKind::Other, device, [&] {
    const int64_t n = y.dim(0);
    if (!ones_.defined() || ones_.dim(0) != n) {
      Tensor ones_f = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f), {n, 1});
      if (dtype != DType::F32) ones_f = ones_f.to(dtype);
      ones_ = device == Device::CPU ? ones_f : ones_f.to_device(device);
    }
    matmul(ones_, b.reshape({1, b.dim(0)}), y, false, false, 1.0f, 1.0f);
  });
}

void ForwardContext::all_reduce(Tensor& y) {
  if (tp.size() > 1) prof.time(OpKind::AllReduce, device, [&] { tp.all_reduce_sum(y); });
}

void Linear::matmul(ForwardContext& ctx, const Tensor& x, Tensor& y) const { ctx.gemm(x, weight, y); }

void Linear::add_bias(ForwardContext& ctx, Tensor& y) const { ctx.add_bias(y, bias); }

}  // namespace aerie
