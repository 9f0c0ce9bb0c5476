// Soft cross-entropy, softmax and argmax over rows, the TTT target distribution: checks and device
// dispatch (see loss.h). The CPU reference is fp32 only: BF16 tensors are widened here first.
#include "kernels/loss.h"

#include <algorithm>

#include "kernels/convert.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/loss.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"

namespace aerie {

using kernels::what;
using kernels::check_float;
using kernels::as_f32;

double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits,
                          float grad_scale, std::vector<int64_t>* argmax) {
  constexpr const char* op = "soft_cross_entropy";
  AERIE_CHECK(logits.ndim() == 2, op << ": logits must be [N, K], got " << shape_str(logits.shape()));
  const int64_t n = logits.dim(0), k = logits.dim(1);
  check_float(logits, op, "logits");
  target.check_shape({n, k}, what(op, "target"));
  target.check_dtype(DType::F32, what(op, "target"));
  weight.check_shape({n}, what(op, "weight"));
  weight.check_dtype(DType::F32, what(op, "weight"));
  if (dlogits) {
    dlogits->check_shape({n, k}, what(op, "dlogits"));
    check_float(*dlogits, op, "dlogits");
    AERIE_CHECK(dlogits->raw() != logits.raw() || dlogits->dtype() == logits.dtype(),
                op << ": dlogits may replace logits in place only in the same dtype");
  }
  AERIE_CHECK(!argmax || k > 0 || n == 0, op << ": an argmax of rows without entries (K = 0)");
  const Device dev =
      kernels::common_device(op, {{"logits", &logits}, {"target", &target}, {"weight", &weight}});
  if (dlogits) kernels::common_device(op, {{"logits", &logits}, {"dlogits", dlogits}});
  if (argmax) argmax->assign(static_cast<size_t>(n), 0);
  AERIE_CUDA_DISPATCH(
      op, dev,
      cuda::soft_cross_entropy(logits, target, weight, dlogits, grad_scale, argmax ? argmax->data() : nullptr));
  // The reference: the steps one by one, in fp32 (a BF16 logits widened once).
  const Tensor z = as_f32(logits);
  if (argmax && n > 0) cpu::argmax_rows(z.data<float>(), n, k, argmax->data());
  const bool direct = dlogits && dlogits->dtype() == DType::F32;  // written in place of its final dtype
  Tensor dz = !dlogits ? Tensor() : direct ? *dlogits : Tensor::empty({n, k}, DType::F32);
  const double loss = cpu::soft_cross_entropy(z.data<float>(), target.data<float>(), weight.data<float>(), n, k,
                                              dlogits ? dz.data<float>() : nullptr);
  if (dlogits) {
    if (grad_scale != 1.0f) {
      float* d = dz.data<float>();
      for (int64_t i = 0; i < n * k; ++i) d[i] *= grad_scale;
    }
    if (!direct) dlogits->copy_from(dz.to(dlogits->dtype()));
  }
  return loss;
}

void softmax_rows(const Tensor& x, Tensor& y) {
  constexpr const char* op = "softmax_rows";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, K], got " << shape_str(x.shape()));
  check_float(x, op, "x");
  y.check_shape(x.shape(), what(op, "y"));
  y.check_dtype(x.dtype(), what(op, "y"));
  const Device dev = kernels::common_device(op, {{"x", &x}, {"y", &y}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::softmax_rows(x, y));
  if (x.dtype() == DType::F32) {
    cpu::softmax_rows(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1));
    return;
  }
  Tensor f = as_f32(x);
  cpu::softmax_rows(f.data<float>(), f.data<float>(), x.dim(0), x.dim(1));
  y.copy_from(f.to(DType::BF16));
}

std::vector<int64_t> argmax_rows(const Tensor& x) {
  constexpr const char* op = "argmax_rows";
  AERIE_CHECK(x.ndim() == 2 && x.dim(1) > 0, op << ": x must be [N, K] with K > 0, got " << shape_str(x.shape()));
  check_float(x, op, "x");
  std::vector<int64_t> out(static_cast<size_t>(x.dim(0)));
  AERIE_CUDA_DISPATCH(op, x.device(), (cuda::argmax_rows(x, out.data()), out));
  const Tensor f = as_f32(x);
  cpu::argmax_rows(f.data<float>(), x.dim(0), x.dim(1), out.data());
  return out;
}

void target_distribution(const Tensor& final_hidden, const Tensor& lm_head, const Tensor& selected,
                         Tensor& target_probs, Tensor& target_argmax, int64_t row_chunk) {
  constexpr const char* op = "target_distribution";
  AERIE_CHECK(final_hidden.ndim() == 2,
              op << ": final_hidden must be [T, H], got " << shape_str(final_hidden.shape()));
  AERIE_CHECK(lm_head.ndim() == 2, op << ": lm_head must be [V, H], got " << shape_str(lm_head.shape()));
  AERIE_CHECK(selected.ndim() == 1, op << ": selected must be [K], got " << shape_str(selected.shape()));
  const int64_t T = final_hidden.dim(0), H = final_hidden.dim(1), V = lm_head.dim(0), K = selected.dim(0);
  check_float(final_hidden, op, "final_hidden");
  check_float(lm_head, op, "lm_head");
  lm_head.check_shape({V, H}, what(op, "lm_head"));
  selected.check_dtype(DType::I64, what(op, "selected"));
  target_probs.check_shape({T, K}, what(op, "target_probs"));
  target_probs.check_dtype(DType::F32, what(op, "target_probs"));
  target_argmax.check_shape({T}, what(op, "target_argmax"));
  target_argmax.check_dtype(DType::I64, what(op, "target_argmax"));
  AERIE_CHECK(row_chunk >= 1, op << ": row_chunk must be >= 1, got " << row_chunk);
  AERIE_CHECK(V >= 1, op << ": lm_head has no rows");
  const Device dev = kernels::common_device(op, {{"final_hidden", &final_hidden},
                                                 {"lm_head", &lm_head},
                                                 {"selected", &selected},
                                                 {"target_probs", &target_probs},
                                                 {"target_argmax", &target_argmax}});
  if (dev == Device::CPU) {
    const int64_t* sel = selected.data<int64_t>();
    for (int64_t i = 0; i < K; ++i)
      AERIE_CHECK(sel[i] >= 0 && sel[i] < V && (i == 0 || sel[i] > sel[i - 1]),
                  op << ": selected ids must ascend inside [0, " << V << "), bad at " << i << " (" << sel[i] << ")");
  }
  kernels::check_backend(op, dev);
  if (T == 0) return;
  // CPU: both widened to fp32 once (a BF16 matmul would widen lm_head again for every chunk).
  // CUDA: the GEMM runs in lm_head's dtype; final_hidden ([T, H], small) is converted if it differs.
  Tensor z = final_hidden, lm = lm_head;
  if (dev == Device::CPU) {
    z = as_f32(final_hidden);
    lm = as_f32(lm_head);
  }
#ifdef AERIE_WITH_CUDA
  Tensor bad_ids;  // [1] I32 on the GPU: 1 when a selected id is outside [0, V), 2 when they do not ascend
  Tensor dindex;   // [V] I32 on the GPU: the draft index of each vocabulary id, or -1
  if (dev == Device::CUDA) {
    if (z.dtype() != lm.dtype()) {
      z = Tensor::empty({T, H}, lm.dtype(), dev);
      convert(final_hidden, z);
    }
    bad_ids = Tensor::zeros({1}, DType::I32, dev);
    dindex = Tensor::empty({V}, DType::I32, dev);
    cuda::draft_index(selected, dindex, bad_ids);
  }
#endif
  const int64_t chunk = std::min(row_chunk, T);
  Tensor logits = Tensor::empty({chunk, V}, DType::F32, dev);  // reused by every chunk
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t r1 = std::min(T, r0 + chunk);
    Tensor l = logits.slice(0, r1 - r0);
    matmul(z.slice(r0, r1), lm, l, false, true);  // l = z W_lm^T
    if (dev == Device::CPU) {
      cpu::target_rows(l.data<float>(), selected.data<int64_t>(), r1 - r0, V, K,
                       target_probs.data<float>() + r0 * K, target_argmax.data<int64_t>() + r0);
    } else {
#ifdef AERIE_WITH_CUDA
      Tensor probs = target_probs.slice(r0, r1), am = target_argmax.slice(r0, r1);
      cuda::target_rows(l, selected, dindex, probs, am);
#endif
    }
  }
#ifdef AERIE_WITH_CUDA
  if (dev == Device::CUDA) {
    const int32_t bad = bad_ids.to_device(Device::CPU).data<int32_t>()[0];
    AERIE_CHECK(bad != 1, op << ": a selected id is outside [0, " << V << ")");
    AERIE_CHECK(bad != 2, op << ": selected ids must ascend");
  }
#endif
}

}  // namespace aerie
