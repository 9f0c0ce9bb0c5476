// The ops of MLA's absorbed decode (kernels/mla.h): checks, the CPU reference, CUDA dispatch.
#include "kernels/mla.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/mla.h"
#include "kernels/dispatch.h"

namespace aerie {
namespace {

float load(const Tensor& t, int64_t i) {
  return t.dtype() == DType::F32 ? t.data<float>()[i] : static_cast<float>(t.data<bf16>()[i]);
}

void check_view(const char* name, const MatrixView& v, int64_t rows, int64_t cols, int64_t batch) {
  AERIE_CHECK(v.t && v.t->defined(), "matmul_strided_batched: " << name << " has no tensor");
  AERIE_CHECK(v.ld >= cols && v.offset >= 0 && v.stride >= 0,
              "matmul_strided_batched: " << name << " has ld " << v.ld << " for rows of " << cols
                                         << " (offset " << v.offset << ", stride " << v.stride << ")");
  const int64_t last = rows == 0 || cols == 0 || batch == 0
                           ? 0
                           : v.offset + (batch - 1) * v.stride + (rows - 1) * v.ld + cols;
  AERIE_CHECK(last <= v.t->numel(), "matmul_strided_batched: " << name << " (" << batch << " x [" << rows << ", "
                                                               << cols << "], offset " << v.offset << ", ld "
                                                               << v.ld << ", stride " << v.stride
                                                               << ") reaches past its tensor "
                                                               << shape_str(v.t->shape()));
}

}  // namespace

void matmul_strided_batched(const MatrixView& a, const MatrixView& b, const MatrixView& c, int64_t m, int64_t n,
                            int64_t k, int64_t batch, bool trans_b) {
  constexpr const char* op = "matmul_strided_batched";
  AERIE_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0, op << ": negative size");
  check_view("a", a, m, k, batch);
  check_view("b", b, trans_b ? n : k, trans_b ? k : n, batch);
  check_view("c", c, m, n, batch);
  const DType ab = a.t->dtype(), cd = c.t->dtype();
  AERIE_CHECK(ab == b.t->dtype() && (ab == DType::F32 || ab == DType::BF16),
              op << ": a is " << dtype_name(ab) << ", b " << dtype_name(b.t->dtype()) << " (want both F32 or BF16)");
  AERIE_CHECK(cd == DType::F32 || cd == ab, op << ": c is " << dtype_name(cd) << " for " << dtype_name(ab) << " inputs");
  const Device dev = kernels::common_device(op, {{"a", a.t}, {"b", b.t}, {"c", c.t}});
  if (m == 0 || n == 0 || batch == 0) return;
  [[maybe_unused]] const size_t ea = dtype_size(ab), ec = dtype_size(cd);  // the GPU call's byte offsets
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::matmul_strided_batched(static_cast<const char*>(a.t->raw()) + a.offset * ea, a.ld, a.stride,
                                                   static_cast<const char*>(b.t->raw()) + b.offset * ea, b.ld, b.stride,
                                                   static_cast<char*>(const_cast<void*>(c.t->raw())) + c.offset * ec,
                                                   c.ld, c.stride, ab, cd, m, n, k, batch, trans_b));
  const int64_t br = trans_b ? n : k, bc = trans_b ? k : n;
  std::vector<float> af(static_cast<size_t>(m * k)), bf(static_cast<size_t>(br * bc)), cf(static_cast<size_t>(m * n));
  Tensor& ct = const_cast<Tensor&>(*c.t);
  for (int64_t t = 0; t < batch; ++t) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) af[i * k + j] = load(*a.t, a.offset + t * a.stride + i * a.ld + j);
    for (int64_t i = 0; i < br; ++i)
      for (int64_t j = 0; j < bc; ++j) bf[i * bc + j] = load(*b.t, b.offset + t * b.stride + i * b.ld + j);
    cpu::sgemm(af.data(), bf.data(), cf.data(), m, n, k, false, trans_b, 1.0f, 0.0f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t o = c.offset + t * c.stride + i * c.ld + j;
        if (cd == DType::F32)
          ct.data<float>()[o] = cf[i * n + j];
        else
          ct.data<bf16>()[o] = bf16(cf[i * n + j]);
      }
  }
}

void causal_softmax_rows(const Tensor& scores, float scale, int64_t group, int64_t first_pos, Tensor& p) {
  constexpr const char* op = "causal_softmax_rows";
  AERIE_CHECK(scores.ndim() == 2, op << ": scores must be [R, L], got " << shape_str(scores.shape()));
  scores.check_dtype(DType::F32, kernels::what(op, "scores"));
  p.check_shape(scores.shape(), kernels::what(op, "p"));
  AERIE_CHECK(p.dtype() == DType::F32 || p.dtype() == DType::BF16, op << ": p must be F32 or BF16");
  const int64_t R = scores.dim(0), L = scores.dim(1);
  AERIE_CHECK(group >= 1 && R % group == 0 && first_pos >= 0 && first_pos + R / group <= L,
              op << ": " << R << " rows in groups of " << group << " from position " << first_pos
                 << " do not fit " << L << " keys");
  const Device dev = kernels::common_device(op, {{"scores", &scores}, {"p", &p}});
  if (R == 0 || L == 0) return;
  AERIE_CUDA_DISPATCH(
      op, dev, cuda::causal_softmax_rows(scores.data<float>(), R, L, scale, group, first_pos, p.raw(), p.dtype()));
  const float* s = scores.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t keys = first_pos + r / group + 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) mx = std::max(mx, scale * s[r * L + j]);
    float sum = 0.0f;
    std::vector<float> e(static_cast<size_t>(keys));
    for (int64_t j = 0; j < keys; ++j) sum += (e[j] = std::exp(scale * s[r * L + j] - mx));
    for (int64_t j = 0; j < L; ++j) {
      const float v = j < keys ? e[j] / sum : 0.0f;
      if (p.dtype() == DType::F32)
        p.data<float>()[r * L + j] = v;
      else
        p.data<bf16>()[r * L + j] = bf16(v);
    }
  }
}

void mla_expand_kv(const Tensor& kv, const Tensor& lat, int64_t nope, int64_t vd, int64_t lora, Tensor& K, Tensor& V) {
  constexpr const char* op = "mla_expand_kv";
  AERIE_CHECK(K.ndim() == 3 && V.ndim() == 3 && kv.ndim() == 2 && lat.ndim() == 2,
              op << ": want kv [L, nh (nope + v)], lat [L, lora + rope], K [L, nh, dk], V [L, nh, dv]");
  const int64_t L = K.dim(0), nh = K.dim(1), dk = K.dim(2), rope = dk - nope, dv = V.dim(2);
  kv.check_shape({L, nh * (nope + vd)}, kernels::what(op, "kv"));
  lat.check_shape({L, lora + rope}, kernels::what(op, "lat"));
  AERIE_CHECK(rope >= 0 && V.dim(0) == L && V.dim(1) == nh && dv >= vd,
              op << ": K " << shape_str(K.shape()) << " / V " << shape_str(V.shape()) << " do not fit nope " << nope
                 << ", v " << vd);
  for (const Tensor* t : {&lat, static_cast<const Tensor*>(&K), static_cast<const Tensor*>(&V)})
    AERIE_CHECK(t->dtype() == kv.dtype(), op << ": kv, lat, K and V must share one dtype");
  const Device dev = kernels::common_device(op, {{"kv", &kv}, {"lat", &lat}, {"K", &K}, {"V", &V}});
  const int es = static_cast<int>(dtype_size(kv.dtype()));
  if (L == 0 || nh == 0) return;
  AERIE_CUDA_DISPATCH(op, dev,
                      cuda::mla_expand_kv(kv.raw(), lat.raw(), L, nh, nope, vd, lora, rope, dv, K.raw(), V.raw(), es));
  const auto* kp = static_cast<const char*>(kv.raw());
  const auto* lp = static_cast<const char*>(lat.raw());
  auto* Kp = static_cast<char*>(K.raw());
  auto* Vp = static_cast<char*>(V.raw());
  std::memset(Vp, 0, V.nbytes());
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < nh; ++h) {
      const char* src = kp + ((l * nh + h) * (nope + vd)) * es;
      std::memcpy(Kp + ((l * nh + h) * dk) * es, src, nope * es);
      std::memcpy(Kp + ((l * nh + h) * dk + nope) * es, lp + (l * (lora + rope) + lora) * es, rope * es);
      std::memcpy(Vp + ((l * nh + h) * dv) * es, src + nope * es, vd * es);
    }
}

}  // namespace aerie
