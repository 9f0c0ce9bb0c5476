// MoE router and expert sort: checks and device dispatch (see moe_router.h).
#include "kernels/moe_router.h"

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "kernels/cuda/moe_router.h"
#include "kernels/dispatch.h"

namespace aerie {
namespace cpu {
// cpu/moe_router.cc; arguments already checked.
void moe_router_noaux_tc(const float* logits /* (T, E) */, const float* bias /* (E) */, int64_t t, int64_t e,
                         const MoeRouterConfig& cfg, int32_t* indices /* (T, k) */, float* weights /* (T, k) */);
void moe_router_softmax_topk(const float* logits /* (T, E) */, int64_t t, int64_t e, const MoeRouterConfig& cfg,
                             int32_t* indices /* (T, k) */, float* weights /* (T, k) */);
// Throws naming the first index outside [0, E).
void moe_sort_by_expert(const int32_t* indices /* (T k) */, int64_t pairs, int64_t e, int32_t* counts /* (E) */,
                        int32_t* offsets /* (E + 1) */, int32_t* perm /* (T k) */);
void moe_combine(const float* y /* (T k, H) */, const float* weights /* (T, k) */, int64_t t, int64_t k, int64_t h,
                 float* out /* (T, H) */);
}  // namespace cpu

using kernels::what;

void moe_router_noaux_tc(const Tensor& logits, const Tensor& bias, const MoeRouterConfig& cfg, Tensor& indices,
                         Tensor& weights) {
  constexpr const char* op = "moe_router_noaux_tc";
  AERIE_CHECK(logits.ndim() == 2, op << ": logits must be [T, E], got " << shape_str(logits.shape()));
  logits.check_dtype(DType::F32, what(op, "logits"));
  const int64_t t = logits.dim(0), e = logits.dim(1);
  bias.check_shape({e}, what(op, "e_score_correction_bias"));
  bias.check_dtype(DType::F32, what(op, "e_score_correction_bias"));
  AERIE_CHECK(cfg.n_group >= 1 && e % cfg.n_group == 0 && e / cfg.n_group >= 2,
              op << ": n_group " << cfg.n_group << " must divide the " << e
                 << " experts into groups of at least 2 (the group score sums each group's top 2)");
  AERIE_CHECK(cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group,
              op << ": topk_group " << cfg.topk_group << " must be in [1, n_group = " << cfg.n_group << "]");
  const int64_t eligible = cfg.topk_group * (e / cfg.n_group);
  AERIE_CHECK(cfg.top_k >= 1 && cfg.top_k <= eligible,
              op << ": top_k " << cfg.top_k << " must be in [1, " << eligible << "] (the experts of topk_group "
                 << cfg.topk_group << " groups)");
  indices.check_shape({t, cfg.top_k}, what(op, "indices"));
  indices.check_dtype(DType::I32, what(op, "indices"));
  weights.check_shape({t, cfg.top_k}, what(op, "weights"));
  weights.check_dtype(DType::F32, what(op, "weights"));
  const Device dev = kernels::common_device(
      op, {{"logits", &logits}, {"e_score_correction_bias", &bias}, {"indices", &indices}, {"weights", &weights}});
  if (t == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::moe_router_noaux_tc(logits.data<float>(), bias.data<float>(), t, e, cfg,
                                                indices.data<int32_t>(), weights.data<float>()));
  cpu::moe_router_noaux_tc(logits.data<float>(), bias.data<float>(), t, e, cfg, indices.data<int32_t>(),
                           weights.data<float>());
}

void moe_router_softmax_topk(const Tensor& logits, const MoeRouterConfig& cfg, Tensor& indices, Tensor& weights) {
  constexpr const char* op = "moe_router_softmax_topk";
  AERIE_CHECK(logits.ndim() == 2, op << ": logits must be [T, E], got " << shape_str(logits.shape()));
  logits.check_dtype(DType::F32, what(op, "logits"));
  const int64_t t = logits.dim(0), e = logits.dim(1);
  AERIE_CHECK(cfg.n_group == 1 && cfg.topk_group == 1,
              op << ": n_group " << cfg.n_group << " / topk_group " << cfg.topk_group
                 << ": the softmax router has no expert groups (both must be 1)");
  AERIE_CHECK(cfg.top_k >= 1 && cfg.top_k <= e, op << ": top_k " << cfg.top_k << " must be in [1, " << e << "]");
  indices.check_shape({t, cfg.top_k}, what(op, "indices"));
  indices.check_dtype(DType::I32, what(op, "indices"));
  weights.check_shape({t, cfg.top_k}, what(op, "weights"));
  weights.check_dtype(DType::F32, what(op, "weights"));
  const Device dev =
      kernels::common_device(op, {{"logits", &logits}, {"indices", &indices}, {"weights", &weights}});
  if (t == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::moe_router_softmax_topk(logits.data<float>(), t, e, cfg, indices.data<int32_t>(),
                                                    weights.data<float>()));
  cpu::moe_router_softmax_topk(logits.data<float>(), t, e, cfg, indices.data<int32_t>(), weights.data<float>());
}

void moe_router(MoeRouterKind kind, const Tensor& logits, const Tensor& bias, const MoeRouterConfig& cfg,
                Tensor& indices, Tensor& weights) {
  if (kind == MoeRouterKind::SoftmaxTopK) return moe_router_softmax_topk(logits, cfg, indices, weights);
  moe_router_noaux_tc(logits, bias, cfg, indices, weights);
}

void moe_sort_by_expert(const Tensor& indices, int64_t num_experts, Tensor& counts, Tensor& offsets, Tensor& perm) {
  constexpr const char* op = "moe_sort_by_expert";
  AERIE_CHECK(indices.ndim() == 2, op << ": indices must be [T, k], got " << shape_str(indices.shape()));
  indices.check_dtype(DType::I32, what(op, "indices"));
  AERIE_CHECK(num_experts >= 1, op << ": num_experts must be >= 1, got " << num_experts);
  const int64_t pairs = indices.numel();
  AERIE_CHECK(pairs <= INT32_MAX, op << ": " << pairs << " pairs do not fit I32 pair ids");
  counts.check_shape({num_experts}, what(op, "counts"));
  counts.check_dtype(DType::I32, what(op, "counts"));
  offsets.check_shape({num_experts + 1}, what(op, "offsets"));
  offsets.check_dtype(DType::I32, what(op, "offsets"));
  perm.check_shape({pairs}, what(op, "perm"));
  perm.check_dtype(DType::I32, what(op, "perm"));
  const Device dev = kernels::common_device(
      op, {{"indices", &indices}, {"counts", &counts}, {"offsets", &offsets}, {"perm", &perm}});
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::moe_sort_by_expert(indices.data<int32_t>(), pairs, num_experts, counts.data<int32_t>(),
                                               offsets.data<int32_t>(), perm.data<int32_t>()));
  cpu::moe_sort_by_expert(indices.data<int32_t>(), pairs, num_experts, counts.data<int32_t>(),
                          offsets.data<int32_t>(), perm.data<int32_t>());
}

void moe_combine(const Tensor& y, const Tensor& weights, Tensor& out) {
  constexpr const char* op = "moe_combine";
  AERIE_CHECK(weights.ndim() == 2 && out.ndim() == 2,
              op << ": weights must be [T, k] and out [T, H], got " << shape_str(weights.shape()) << " and "
                 << shape_str(out.shape()));
  const int64_t t = weights.dim(0), k = weights.dim(1), h = out.dim(1);
  y.check_shape({t * k, h}, what(op, "y"));
  out.check_shape({t, h}, what(op, "out"));
  for (const Tensor* x : {&y, &weights, static_cast<const Tensor*>(&out)}) x->check_dtype(DType::F32, what(op, "y, weights and out"));
  const Device dev = kernels::common_device(op, {{"y", &y}, {"weights", &weights}, {"out", &out}});
  if (t == 0 || h == 0) return;
  AERIE_CUDA_DISPATCH(op, dev, cuda::moe_combine(y.data<float>(), weights.data<float>(), t, k, h, out.data<float>()));
  cpu::moe_combine(y.data<float>(), weights.data<float>(), t, k, h, out.data<float>());
}

namespace {

template <typename T>
float as_f32(T v) {
  return static_cast<float>(v);
}

template <typename T>
void gather_pairs_cpu(const T* h, const int32_t* perm, int64_t pairs, int64_t k, int64_t hd, T* xs, int32_t* row_of) {
  std::vector<char> seen(static_cast<size_t>(pairs), 0);
  for (int64_t r = 0; r < pairs; ++r) {
    const int32_t p = perm[r];
    AERIE_CHECK(p >= 0 && p < pairs && !seen[p], "moe_gather_pairs: perm[" << r << "] = " << p
                                                     << " is not a pair of a permutation of [0, " << pairs << ")");
    seen[p] = 1;
    row_of[p] = static_cast<int32_t>(r);
    if (xs) std::copy(h + (p / k) * hd, h + (p / k + 1) * hd, xs + r * hd);
  }
}

template <typename T>
void combine_rows_cpu(const T* ys, int64_t rows, const int32_t* row_of, const float* w, int64_t t, int64_t k,
                      int64_t hd, float* out) {
  for (int64_t p = 0; p < t * k; ++p)
    AERIE_CHECK(row_of[p] < rows, "moe_combine_rows: row_of[" << p << "] = " << row_of[p] << " is not a row of ys ("
                                                                 << rows << " rows)");
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < hd; ++j) {
      float acc = 0.0f;
      for (int64_t s = 0; s < k; ++s) {
        const int32_t row = row_of[r * k + s];
        if (row >= 0) acc += w[r * k + s] * as_f32(ys[static_cast<int64_t>(row) * hd + j]);
      }
      out[r * hd + j] = acc;
    }
}

}  // namespace

void moe_gather_pairs(const Tensor& h, const Tensor& perm, int64_t k, Tensor& xs, Tensor& row_of) {
  constexpr const char* op = "moe_gather_pairs";
  AERIE_CHECK(h.ndim() == 2 && perm.ndim() == 1 && k >= 1,
              op << ": h must be [T, H], perm [T k] and k >= 1, got " << shape_str(h.shape()) << ", "
                 << shape_str(perm.shape()) << ", k " << k);
  kernels::check_float(h, op, "h");
  const int64_t t = h.dim(0), hd = h.dim(1), pairs = t * k;
  perm.check_shape({pairs}, what(op, "perm"));
  perm.check_dtype(DType::I32, what(op, "perm"));
  const bool gather = xs.defined();
  if (gather) {
    xs.check_shape({pairs, hd}, what(op, "xs"));
    xs.check_dtype(h.dtype(), what(op, "xs"));
  }
  row_of.check_shape({pairs}, what(op, "row_of"));
  row_of.check_dtype(DType::I32, what(op, "row_of"));
  const Device dev = kernels::common_device(op, {{"h", &h}, {"perm", &perm}, {"row_of", &row_of}});
  if (gather) kernels::common_device(op, {{"h", &h}, {"xs", &xs}});
  if (pairs == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::moe_gather_pairs(h.raw(), h.dtype(), perm.data<int32_t>(), pairs, k, hd,
                                             gather ? xs.raw() : nullptr, row_of.data<int32_t>()));
  if (h.dtype() == DType::F32)
    gather_pairs_cpu(h.data<float>(), perm.data<int32_t>(), pairs, k, hd, gather ? xs.data<float>() : nullptr,
                     row_of.data<int32_t>());
  else
    gather_pairs_cpu(h.data<bf16>(), perm.data<int32_t>(), pairs, k, hd, gather ? xs.data<bf16>() : nullptr,
                     row_of.data<int32_t>());
}

void moe_combine_rows(const Tensor& ys, const Tensor& row_of, const Tensor& weights, Tensor& out) {
  constexpr const char* op = "moe_combine_rows";
  AERIE_CHECK(weights.ndim() == 2 && out.ndim() == 2,
              op << ": weights must be [T, k] and out [T, H], got " << shape_str(weights.shape()) << " and "
                 << shape_str(out.shape()));
  const int64_t t = weights.dim(0), k = weights.dim(1), hd = out.dim(1);
  kernels::check_float(ys, op, "ys");
  AERIE_CHECK(ys.ndim() == 2 && ys.dim(1) == hd,
              op << ": ys must be [R, " << hd << "], got " << shape_str(ys.shape()));
  row_of.check_shape({t * k}, what(op, "row_of"));
  row_of.check_dtype(DType::I32, what(op, "row_of"));
  weights.check_dtype(DType::F32, what(op, "weights"));
  out.check_dtype(DType::F32, what(op, "out"));
  const Device dev =
      kernels::common_device(op, {{"ys", &ys}, {"row_of", &row_of}, {"weights", &weights}, {"out", &out}});
  if (t == 0 || hd == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::moe_combine_rows(ys.raw(), ys.dtype(), row_of.data<int32_t>(), weights.data<float>(), t, k,
                                             hd, out.data<float>()));
  if (ys.dtype() == DType::F32)
    combine_rows_cpu(ys.data<float>(), ys.dim(0), row_of.data<int32_t>(), weights.data<float>(), t, k, hd,
                     out.data<float>());
  else
    combine_rows_cpu(ys.data<bf16>(), ys.dim(0), row_of.data<int32_t>(), weights.data<float>(), t, k, hd,
                     out.data<float>());
}

void moe_local_rows(Tensor& row_of, int64_t r0, int64_t r1) {
  constexpr const char* op = "moe_local_rows";
  AERIE_CHECK(row_of.ndim() == 1, op << ": row_of must be [P], got " << shape_str(row_of.shape()));
  row_of.check_dtype(DType::I32, what(op, "row_of"));
  const int64_t pairs = row_of.dim(0);
  AERIE_CHECK(0 <= r0 && r0 <= r1 && r1 <= pairs,
              op << ": rows [" << r0 << ", " << r1 << ") are not a range of the " << pairs << " pairs");
  if (pairs == 0) return;
  AERIE_CUDA_DISPATCH(op, row_of.device(), cuda::moe_local_rows(row_of.data<int32_t>(), pairs, r0, r1));
  int32_t* r = row_of.data<int32_t>();
  for (int64_t p = 0; p < pairs; ++p) r[p] = r[p] >= r0 && r[p] < r1 ? static_cast<int32_t>(r[p] - r0) : -1;
}

}  // namespace aerie
