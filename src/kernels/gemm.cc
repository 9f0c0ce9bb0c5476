// matmul: checks and device dispatch (see gemm.h).
#include "kernels/gemm.h"

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dispatch.h"

namespace aerie {

void matmul(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha, float beta) {
  constexpr const char* op = "matmul";
  AERIE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
              op << ": a, b, c must be 2-D, got a " << shape_str(a.shape()) << ", b " << shape_str(b.shape())
                 << ", c " << shape_str(c.shape()));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  AERIE_CHECK(k == kb, op << ": inner dimensions differ: a " << shape_str(a.shape()) << (trans_a ? "^T" : "")
                          << " vs b " << shape_str(b.shape()) << (trans_b ? "^T" : ""));
  c.check_shape({m, n}, kernels::what(op, "c"));
  AERIE_CHECK(a.dtype() == b.dtype(), op << ": a is " << dtype_name(a.dtype()) << ", b is "
                                         << dtype_name(b.dtype()));
  AERIE_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16,
              op << ": a, b must be F32 or BF16, got " << dtype_name(a.dtype()));
  if (a.dtype() == DType::F32) c.check_dtype(DType::F32, kernels::what(op, "c (a, b are F32)"));
  AERIE_CHECK(c.dtype() == DType::F32 || c.dtype() == DType::BF16,
              op << ": c must be F32 or BF16, got " << dtype_name(c.dtype()));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"b", &b}, {"c", &c}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::matmul(a, b, c, m, n, k, trans_a, trans_b, alpha, beta));
  if (c.dtype() == DType::BF16) {  // fp32 result, rounded to bf16 once (bf16 a, b checked above)
    bf16* cb = c.data<bf16>();
    std::vector<float> cf(static_cast<size_t>(m * n));
    for (size_t i = 0; i < cf.size(); ++i) cf[i] = beta == 0.0f ? 0.0f : static_cast<float>(cb[i]);
    cpu::bgemm(a.data<bf16>(), b.data<bf16>(), cf.data(), m, n, k, trans_a, trans_b, alpha, beta);
    for (size_t i = 0; i < cf.size(); ++i) cb[i] = bf16(cf[i]);
    return;
  }
  if (a.dtype() == DType::F32)
    cpu::sgemm(a.data<float>(), b.data<float>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
  else
    cpu::bgemm(a.data<bf16>(), b.data<bf16>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
}

}  // namespace aerie

namespace aerie {

namespace {

/// Checks that group g's rows [offsets[g], offsets[g + 1]) lie within [0, P) after the group before
/// (matmul_grouped, matmul_grouped_quant); returns whether the group has rows.
bool group_has_rows(const char* op, const std::vector<int64_t>& offsets, int64_t g, int64_t P) {
  const int64_t r0 = offsets[g], r1 = offsets[g + 1];
  AERIE_CHECK(0 <= r0 && r0 <= r1 && r1 <= P, op << ": group " << g << " has rows [" << r0 << ", " << r1
                                                 << "), not within [0, " << P << ") or not after the group before");
  return r0 < r1;
}

}  // namespace

void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets, Tensor& c) {
  constexpr const char* op = "matmul_grouped";
  AERIE_CHECK(a.ndim() == 2 && c.ndim() == 2, op << ": a and c must be 2-D, got a " << shape_str(a.shape())
                                                 << ", c " << shape_str(c.shape()));
  const int64_t P = a.dim(0), K = a.dim(1), N = c.dim(1), G = static_cast<int64_t>(w.size());
  AERIE_CHECK(c.dim(0) == P, op << ": c " << shape_str(c.shape()) << " has not a's " << P << " rows");
  AERIE_CHECK(static_cast<int64_t>(offsets.size()) == G + 1,
              op << ": " << offsets.size() << " offsets for " << G << " groups (want G + 1)");
  AERIE_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16,
              op << ": a must be F32 or BF16, got " << dtype_name(a.dtype()));
  c.check_dtype(a.dtype(), kernels::what(op, "c"));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"c", &c}});
  std::vector<int64_t> groups;  // the non-empty ones
  for (int64_t g = 0; g < G; ++g) {
    if (!group_has_rows(op, offsets, g, P)) continue;
    const Tensor& wg = w[g];
    AERIE_CHECK(wg.defined() && wg.ndim() == 2 && wg.dim(0) == N && wg.dim(1) == K,
                op << ": group " << g << "'s weight is " << (wg.defined() ? shape_str(wg.shape()) : "undefined")
                   << ", want [" << N << ", " << K << "]");
    AERIE_CHECK(wg.dtype() == a.dtype(), op << ": group " << g << "'s weight is " << dtype_name(wg.dtype())
                                            << ", a is " << dtype_name(a.dtype()));
    AERIE_CHECK(wg.device() == dev, op << ": group " << g << "'s weight is on another device than a");
    groups.push_back(g);
  }
  if (groups.empty() || N == 0) return;
  AERIE_CUDA_DISPATCH(op, dev, cuda::matmul_grouped(a, w, offsets, groups, c));
  for (const int64_t g : groups) {
    const Tensor ag = a.slice(offsets[g], offsets[g + 1]);
    Tensor cg = c.slice(offsets[g], offsets[g + 1]);
    matmul(ag, w[g], cg, false, true);
  }
}

}  // namespace aerie

#include "kernels/embedding.h"
#include "kernels/quant.h"

namespace aerie {

namespace {

/// Checks group g's parts against format, K, N, a's dtype and device (naming group and part).
void check_grouped_weight(const char* op, GroupedWeightFormat format, const GroupedWeight& parts, int64_t g,
                          int64_t N, int64_t K, DType dt, Device dev) {
  int64_t rows = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Tensor& wt = parts[p].weight;
    const Tensor& sc = parts[p].scale;
    auto name = [&] { return std::string(op) + ": group " + std::to_string(g) + " part " + std::to_string(p); };
    AERIE_CHECK(wt.defined() && wt.ndim() == 2, name() << ": the weight is "
                                                       << (wt.defined() ? shape_str(wt.shape()) : "undefined"));
    AERIE_CHECK(wt.device() == dev, name() << ": the weight is on another device than a");
    const int64_t R = wt.dim(0);
    switch (format) {
      case GroupedWeightFormat::Dense:
        AERIE_CHECK(wt.dim(1) == K && wt.dtype() == dt,
                    name() << ": a Dense weight must be [rows, " << K << "] " << dtype_name(dt) << ", got "
                           << shape_str(wt.shape()) << " " << dtype_name(wt.dtype()));
        break;
      case GroupedWeightFormat::Fp8Block:
        AERIE_CHECK(wt.dim(1) == K && (wt.dtype() == DType::F8E4M3 || wt.dtype() == DType::U8),
                    name() << ": an FP8 weight must be [rows, " << K << "] F8E4M3, got " << shape_str(wt.shape()) << " "
                           << dtype_name(wt.dtype()));
        AERIE_CHECK(sc.defined() && sc.dtype() == DType::F32 && sc.device() == dev &&
                        sc.shape() == (Shape{(R + kFp8BlockSize - 1) / kFp8BlockSize,
                                             (K + kFp8BlockSize - 1) / kFp8BlockSize}),
                    name() << ": weight_scale_inv " << (sc.defined() ? shape_str(sc.shape()) : "undefined")
                           << " does not match the weight " << shape_str(wt.shape()) << " (want F32 ["
                           << (R + 127) / 128 << ", " << (K + 127) / 128 << "] on a's device)");
        break;
      case GroupedWeightFormat::Int4Group:
        AERIE_CHECK(K % kInt4GroupSize == 0 && wt.dim(1) == (K + 7) / 8 && wt.dtype() == DType::I32,
                    name() << ": an INT4 weight_packed must be [rows, " << (K + 7) / 8 << "] I32 (K " << K
                           << " a multiple of " << kInt4GroupSize << "), got " << shape_str(wt.shape()) << " "
                           << dtype_name(wt.dtype()));
        AERIE_CHECK(sc.defined() && (sc.dtype() == DType::BF16 || sc.dtype() == DType::F32) && sc.device() == dev &&
                        sc.shape() == (Shape{R, K / kInt4GroupSize}),
                    name() << ": weight_scale " << (sc.defined() ? shape_str(sc.shape()) : "undefined")
                           << " does not match weight_packed " << shape_str(wt.shape()) << " (want BF16 [" << R
                           << ", " << K / kInt4GroupSize << "] on a's device)");
        break;
    }
    rows += R;
  }
  AERIE_CHECK(rows == N, op << ": group " << g << "'s parts have " << rows << " rows, c has " << N << " columns");
}

/// W_g dequantized (or copied) into dst [N, K] (a's dtype, on a's device).
void dequant_grouped_weight(GroupedWeightFormat format, const GroupedWeight& parts, int64_t K, Tensor& dst) {
  int64_t r0 = 0;
  for (const GroupedWeightPart& p : parts) {
    const int64_t R = p.weight.dim(0);
    Tensor rows = dst.slice(r0, r0 + R);
    if (format == GroupedWeightFormat::Dense)
      rows.copy_from(p.weight);
    else if (format == GroupedWeightFormat::Fp8Block)
      dequant_fp8_block(p.weight, p.scale, rows);
    else
      dequant_int4_packed(p.weight, p.scale, K, kInt4GroupSize, rows);
    r0 += R;
  }
}

}  // namespace

std::string grouped_quant_fused_unsupported(const Tensor& a, GroupedWeightFormat format,
                                            const std::vector<GroupedWeight>& w, const std::vector<int64_t>& offsets,
                                            const Tensor& c) {
  if (a.device() != Device::CUDA) return "a is not on the GPU";
  if (a.dtype() != DType::BF16 || c.dtype() != DType::BF16) return "a and c are not BF16";
  const int64_t K = a.dim(1), N = c.dim(1);
  if (K == 0 || K % 64 != 0) return "K " + std::to_string(K) + " is not a positive multiple of 64";
  if (N % 128 != 0) return "N " + std::to_string(N) + " is not a multiple of 128";
  if (a.dim(0) > INT32_MAX / 2 || c.dim(0) > INT32_MAX / 2 || K > INT32_MAX / 2 || N > INT32_MAX / 2)
    return "sizes beyond 32 bits";
  // 16-byte cp.async of a's and the weights' rows, 4-byte ones of INT4 scales and 4-byte stores of c.
  auto aligned = [](const Tensor& t, uintptr_t n) { return reinterpret_cast<uintptr_t>(t.raw()) % n == 0; };
  if (!aligned(a, 16) || !aligned(c, 4)) return "a not 16-byte or c not 4-byte aligned";
  for (size_t g = 0; g + 1 < offsets.size() && g < w.size(); ++g) {
    if (offsets[g + 1] == offsets[g]) continue;
    if (w[g].size() > 4) return "more than 4 parts per group";
    for (const GroupedWeightPart& p : w[g]) {
      if (!p.weight.defined()) return "an undefined part";
      if (!aligned(p.weight, 16) || (p.scale.defined() && !aligned(p.scale, 4))) return "a part not aligned";
      if (p.weight.dim(0) % 128 != 0) return "a part of " + std::to_string(p.weight.dim(0)) + " rows (not a multiple of 128)";
      if (format == GroupedWeightFormat::Int4Group && p.scale.dtype() != DType::BF16) return "INT4 scales not BF16";
    }
    break;
  }
  return {};
}

void matmul_grouped_quant(const Tensor& a, GroupedWeightFormat format, const std::vector<GroupedWeight>& w,
                          const std::vector<int64_t>& offsets, Tensor& c, const Tensor* a_rows, int64_t row_div) {
  constexpr const char* op = "matmul_grouped_quant";
  AERIE_CHECK(a.ndim() == 2 && c.ndim() == 2, op << ": a and c must be 2-D, got a " << shape_str(a.shape())
                                                 << ", c " << shape_str(c.shape()));
  const int64_t P = c.dim(0), K = a.dim(1), N = c.dim(1), G = static_cast<int64_t>(w.size());
  if (a_rows) {
    AERIE_CHECK(a_rows->ndim() == 1 && a_rows->dim(0) == P && a_rows->dtype() == DType::I32 && row_div >= 1 &&
                    a_rows->device() == a.device(),
                op << ": a_rows must be [" << P << "] I32 on a's device and row_div >= 1, got "
                   << shape_str(a_rows->shape()) << " " << dtype_name(a_rows->dtype()) << ", row_div " << row_div);
  } else {
    AERIE_CHECK(a.dim(0) == P, op << ": c " << shape_str(c.shape()) << " has not a's " << a.dim(0) << " rows");
  }
  AERIE_CHECK(static_cast<int64_t>(offsets.size()) == G + 1,
              op << ": " << offsets.size() << " offsets for " << G << " groups (want G + 1)");
  kernels::check_float(a, op, "a");
  c.check_dtype(a.dtype(), kernels::what(op, "c"));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"c", &c}});
  std::vector<int64_t> groups;  // the non-empty ones
  const GroupedWeight* first = nullptr;
  for (int64_t g = 0; g < G; ++g) {
    if (!group_has_rows(op, offsets, g, P)) continue;
    check_grouped_weight(op, format, w[g], g, N, K, a.dtype(), dev);
    if (!first) {
      first = &w[g];
    } else {
      // The fused kernel reads every group with the first one's part layout.
      AERIE_CHECK(w[g].size() == first->size(), op << ": group " << g << " has " << w[g].size() << " parts, group "
                                                   << groups.front() << " has " << first->size());
      for (size_t p = 0; p < first->size(); ++p)
        AERIE_CHECK(w[g][p].weight.dim(0) == (*first)[p].weight.dim(0) &&
                        (!w[g][p].scale.defined() || w[g][p].scale.dtype() == (*first)[p].scale.dtype()),
                    op << ": group " << g << " part " << p << " differs in rows or scale dtype from group "
                       << groups.front() << "'s");
    }
    groups.push_back(g);
  }
  if (groups.empty() || N == 0) return;
  // On the GPU the fused kernel where it takes the formats and shapes, else the reference below (on the GPU too).
  if (dev != Device::CUDA || grouped_quant_fused_unsupported(a, format, w, offsets, c).empty())
    AERIE_CUDA_DISPATCH(
        op, dev,
        cuda::matmul_grouped_quant(a, static_cast<int>(format), w, offsets, groups, c,
                                   a_rows ? a_rows->data<int32_t>() : nullptr, static_cast<int>(row_div)));
  Tensor ga;  // a_rows: the gathered rows (the reference; the fused kernel reads them in place)
  if (a_rows) {
    const Tensor idx = a_rows->device() == Device::CPU ? *a_rows : a_rows->to_device(Device::CPU);
    std::vector<int32_t> src(static_cast<size_t>(P), 0);
    for (const int64_t g : groups)
      for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
        const int64_t s = idx.data<int32_t>()[r] / row_div;
        AERIE_CHECK(idx.data<int32_t>()[r] >= 0 && s < a.dim(0),
                    op << ": a_rows[" << r << "] = " << idx.data<int32_t>()[r] << " is not a row of a (" << a.dim(0)
                       << " rows, row_div " << row_div << ")");
        src[r] = static_cast<int32_t>(s);
      }
    ga = Tensor::empty({P, K}, a.dtype(), dev);
    embedding_forward(Tensor::from_vector(src, {P}).to_device(dev), a, ga);
  }
  const Tensor& av = a_rows ? ga : a;
  Tensor wg = Tensor::empty({N, K}, a.dtype(), dev);
  for (const int64_t g : groups) {
    dequant_grouped_weight(format, w[g], K, wg);
    const Tensor ag = av.slice(offsets[g], offsets[g + 1]);
    Tensor cg = c.slice(offsets[g], offsets[g + 1]);
    matmul(ag, wg, cg, false, true);
  }
}

std::string gemm_search_summary() {
#ifdef AERIE_WITH_CUDA
  const auto recs = cuda::gemm_search_report();
  if (recs.empty()) return "";
  double first = 0.0, best = 0.0;
  int changed = 0;
  for (const auto& r : recs) {
    first += r.first_ms;
    best += r.best_ms;
    changed += r.chosen != 0;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "GEMM algorithm search: %zu shapes, %d took another algorithm than the heuristic's first; one run "
                "of each: %.3f ms with the heuristic's first, %.3f ms with the kept ones (%.3fx)",
                recs.size(), changed, first, best, best > 0.0 ? first / best : 1.0);
  return buf;
#else
  return "";
#endif
}

}  // namespace aerie

namespace aerie {
namespace cpu {
// cpu/quant.cc: the reference of matmul_fp8_block, arguments checked below.
void matmul_fp8_block(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int64_t ldws,
                      int64_t m, int64_t n, int64_t k, void* y, DType y_dtype, int64_t ldy, int64_t c0, float beta);
}  // namespace cpu

int64_t fp8_weight_scale_ld(int64_t k) { return ((k + 127) / 128 + 3) / 4 * 4; }

Tensor fp8_gemm_weight_scale(const Tensor& scale_inv, int64_t k) {
  AERIE_CHECK(scale_inv.ndim() == 2 && scale_inv.dim(1) == (k + 127) / 128 && scale_inv.dtype() == DType::F32,
              "fp8_gemm_weight_scale: scale_inv " << shape_str(scale_inv.shape()) << " " << dtype_name(scale_inv.dtype())
                                                  << " is not [ceil(N/128), " << (k + 127) / 128 << "] F32");
  const int64_t ld = fp8_weight_scale_ld(k), cols = scale_inv.dim(1), rows = scale_inv.dim(0);
  if (ld == cols) return scale_inv;
  const Tensor host = scale_inv.to_device(Device::CPU);
  std::vector<float> padded(static_cast<size_t>(rows * ld), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) padded[static_cast<size_t>(r * ld + c)] = host.data<float>()[r * cols + c];
  const Tensor t = Tensor::from_vector(padded, {rows, ld});
  return scale_inv.device() == Device::CPU ? t : t.to_device(scale_inv.device());
}

bool matmul_fp8_block(const Tensor& xq, const Tensor& xs, const Tensor& wq, const Tensor& ws, Tensor& y, int64_t c0,
                      float beta, std::string* why) {
  constexpr const char* op = "matmul_fp8_block";
  auto fp8 = [](const Tensor& t) { return t.dtype() == DType::F8E4M3 || t.dtype() == DType::U8; };
  AERIE_CHECK(xq.ndim() == 2 && wq.ndim() == 2 && y.ndim() == 2 && fp8(xq) && fp8(wq),
              op << ": xq [M, K] and wq [N, K] must be 2-D F8_E4M3, y 2-D; got xq " << shape_str(xq.shape()) << " "
                 << dtype_name(xq.dtype()) << ", wq " << shape_str(wq.shape()) << " " << dtype_name(wq.dtype())
                 << ", y " << shape_str(y.shape()));
  const int64_t m = xq.dim(0), k = xq.dim(1), n = wq.dim(0);
  AERIE_CHECK(wq.dim(1) == k, op << ": inner dimensions differ: xq " << shape_str(xq.shape()) << ", wq "
                                 << shape_str(wq.shape()));
  xs.check_shape({(k + 127) / 128, m}, kernels::what(op, "xs"));
  xs.check_dtype(DType::F32, kernels::what(op, "xs"));
  ws.check_shape({(n + 127) / 128, fp8_weight_scale_ld(k)}, kernels::what(op, "ws"));
  ws.check_dtype(DType::F32, kernels::what(op, "ws"));
  AERIE_CHECK(y.dtype() == DType::F32 || y.dtype() == DType::BF16,
              op << ": y must be F32 or BF16, got " << dtype_name(y.dtype()));
  AERIE_CHECK(y.dim(0) == m && c0 >= 0 && c0 + n <= y.dim(1),
              op << ": y " << shape_str(y.shape()) << " has no columns [" << c0 << ", " << c0 + n << ") for " << m
                 << " rows");
  const Device dev = kernels::common_device(op, {{"xq", &xq}, {"xs", &xs}, {"wq", &wq}, {"ws", &ws}, {"y", &y}});
  [[maybe_unused]] char* y0 = static_cast<char*>(y.raw()) + c0 * static_cast<int64_t>(dtype_size(y.dtype()));  // col c0
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::matmul_fp8_block(xq.raw(), xs.data<float>(), wq.raw(), ws.data<float>(), m, n, k, y0,
                                             y.dtype(), y.dim(1), beta, why));
  cpu::matmul_fp8_block(static_cast<const uint8_t*>(xq.raw()), xs.data<float>(), static_cast<const uint8_t*>(wq.raw()),
                        ws.data<float>(), ws.dim(1), m, n, k, y.raw(), y.dtype(), y.dim(1), c0, beta);
  return true;
}

}  // namespace aerie
