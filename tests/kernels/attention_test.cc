// Causal GQA attention against an explicit double-precision softmax(scale Q K^T + mask) V, and its
// backward against central finite differences, both for the plain causal case and for the TTT case where
// the out/lse passed to the backward merge one extra "diagonal" key per row (eagle3.md section 3).
#include "kernels/attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

struct Case {
  int64_t tq, tk, nh, nkv, d, q_offset;
  int64_t window = 0;  // sliding window (0: none)
};

/// Reference: out [Tq, nh, d] and lse [Tq, nh] in double, from the explicit masked score matrix.
void ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Case& c, double scale,
                   std::vector<float>& out, std::vector<float>& lse) {
  const auto qv = q.to_float_vector(), kv = k.to_float_vector(), vv = v.to_float_vector();
  out.assign(c.tq * c.nh * c.d, 0.0f);
  lse.assign(c.tq * c.nh, 0.0f);
  for (int64_t i = 0; i < c.tq; ++i)
    for (int64_t h = 0; h < c.nh; ++h) {
      const int64_t g = h / (c.nh / c.nkv);
      std::vector<double> s(c.tk, -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < c.tk; ++j) {
        if (j > i + c.q_offset) continue;                                 // the causal mask
        if (c.window > 0 && j <= i + c.q_offset - c.window) continue;  // the sliding window
        double dot = 0.0;
        for (int64_t e = 0; e < c.d; ++e) dot += double(qv[(i * c.nh + h) * c.d + e]) * kv[(j * c.nkv + g) * c.d + e];
        s[j] = scale * dot;
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < c.tk; ++j) sum += std::exp(s[j] - mx);
      lse[i * c.nh + h] = float(mx + std::log(sum));
      for (int64_t e = 0; e < c.d; ++e) {
        double o = 0.0;
        for (int64_t j = 0; j < c.tk; ++j) o += std::exp(s[j] - mx) / sum * vv[(j * c.nkv + g) * c.d + e];
        out[(i * c.nh + h) * c.d + e] = float(o);
      }
    }
}

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, ForwardMatchesExplicitSoftmax) {
  const Case c = GetParam();
  const float scale = 1.0f / std::sqrt(float(c.d));
  Tensor q = random_tensor({c.tq, c.nh, c.d}, 1, -2.0f, 2.0f);
  Tensor k = random_tensor({c.tk, c.nkv, c.d}, 2, -2.0f, 2.0f), v = random_tensor({c.tk, c.nkv, c.d}, 3);
  Tensor out = Tensor::empty({c.tq, c.nh, c.d}, DType::F32), lse = Tensor::empty({c.tq, c.nh}, DType::F32);
  attention_forward(q, k, v, c.q_offset, scale, out, &lse, c.window);
  std::vector<float> oref, lref;
  ref_attention(q, k, v, c, scale, oref, lref);
  testing::expect_close(out.to_float_vector(), oref, 1e-5f, 1e-5f, "out");
  testing::expect_close(lse.to_float_vector(), lref, 1e-5f, 1e-5f, "lse");
  Tensor out2 = Tensor::empty({c.tq, c.nh, c.d}, DType::F32);
  attention_forward(q, k, v, c.q_offset, scale, out2, nullptr, c.window);  // lse not wanted: same out
  EXPECT_EQ(out2.to_float_vector(), out.to_float_vector());
}

TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Case c = GetParam();
  const float scale = 1.0f / std::sqrt(float(c.d));
  Tensor q = random_tensor({c.tq, c.nh, c.d}, 4), k = random_tensor({c.tk, c.nkv, c.d}, 5);
  Tensor v = random_tensor({c.tk, c.nkv, c.d}, 6), r = random_tensor({c.tq, c.nh, c.d}, 7);
  Tensor out = Tensor::empty({c.tq, c.nh, c.d}, DType::F32), lse = Tensor::empty({c.tq, c.nh}, DType::F32);
  auto loss = [&] {
    attention_forward(q, k, v, c.q_offset, scale, out, nullptr, c.window);
    return testing::dot_double(out, r);
  };
  const auto gq = testing::numeric_grad(q, loss), gk = testing::numeric_grad(k, loss);
  const auto gv = testing::numeric_grad(v, loss);

  attention_forward(q, k, v, c.q_offset, scale, out, &lse, c.window);
  Tensor dq = random_tensor(q.shape(), 8);  // overwritten
  Tensor dk = Tensor::from_vector(std::vector<float>(k.numel(), 0.5f), k.shape());  // added to
  Tensor dv = Tensor::from_vector(std::vector<float>(v.numel(), -0.5f), v.shape());
  attention_backward(r, q, k, v, out, lse, c.q_offset, scale, dq, dk, dv, c.window);
  auto minus = [](std::vector<float> x, float c0) {
    for (auto& e : x) e -= c0;
    return x;
  };
  testing::expect_close(dq.to_float_vector(), gq, testing::kFdAtol, testing::kFdRtol, "dq");
  testing::expect_close(minus(dk.to_float_vector(), 0.5f), gk, testing::kFdAtol, testing::kFdRtol, "dk");
  testing::expect_close(minus(dv.to_float_vector(), -0.5f), gv, testing::kFdAtol, testing::kFdRtol, "dv");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(Case{5, 5, 4, 2, 8, 0},    // prefill, GQA (2 query heads per kv head)
                      Case{3, 7, 4, 2, 8, 4},    // decode with a KV cache: q_offset = Tk - Tq
                      Case{1, 6, 2, 2, 4, 5},    // one decoded token, plain multi-head
                      Case{4, 4, 4, 1, 6, 0},    // multi-query (one kv head)
                      Case{9, 9, 4, 2, 8, 0, 3},  // sliding window of 3 keys
                      Case{3, 10, 4, 2, 8, 7, 4},  // decoding under a window of 4 (keys 0..3 never seen)
                      Case{6, 6, 2, 1, 4, 0, 1}),  // window 1: each row sees only its own key
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "Tq" + std::to_string(c.tq) + "_Tk" + std::to_string(c.tk) + "_nh" + std::to_string(c.nh) + "_nkv" +
             std::to_string(c.nkv) + "_d" + std::to_string(c.d) + "_off" + std::to_string(c.q_offset) +
             (c.window > 0 ? "_win" + std::to_string(c.window) : "");
    });

// q_offset < 0: row 0 attends no key (the empty softmax): out 0, lse -inf, no gradient anywhere from it.
TEST(Attention, RowWithoutKeysGivesZeroAndMinusInfinity) {
  const int64_t tq = 2, tk = 2, nh = 2, d = 4;
  Tensor q = random_tensor({tq, nh, d}, 1), k = random_tensor({tk, 1, d}, 2), v = random_tensor({tk, 1, d}, 3);
  Tensor out = Tensor::empty({tq, nh, d}, DType::F32), lse = Tensor::empty({tq, nh}, DType::F32);
  attention_forward(q, k, v, -1, 0.5f, out, &lse);
  for (int64_t e = 0; e < nh * d; ++e) EXPECT_EQ(out.data<float>()[e], 0.0f);
  EXPECT_TRUE(std::isinf(lse.data<float>()[0]) && lse.data<float>()[0] < 0);
  // Row 1 attends key 0 only: out = v_0 exactly, lse = 0.5 q_1 . k_0.
  for (int64_t h = 0; h < nh; ++h)
    for (int64_t e = 0; e < d; ++e) EXPECT_FLOAT_EQ(out.data<float>()[(nh + h) * d + e], v.data<float>()[e]);
  Tensor dq = random_tensor(q.shape(), 4), dk = Tensor::zeros(k.shape(), DType::F32);
  Tensor dv = Tensor::zeros(v.shape(), DType::F32);
  Tensor dout = Tensor::zeros(q.shape(), DType::F32);
  for (int64_t e = 0; e < nh * d; ++e) dout.data<float>()[e] = 1.0f;  // gradient only on the empty row
  attention_backward(dout, q, k, v, out, lse, -1, 0.5f, dq, dk, dv);
  for (float x : dq.to_float_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : dk.to_float_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : dv.to_float_vector()) EXPECT_EQ(x, 0.0f);
}

// TTT step k (eagle3.md section 3): row i attends the causal step-0 keys k[0..i] and one extra key kd_i
// of its own. The causal part runs through attention_forward; the test merges the diagonal in double:
// lse = logaddexp(lse_c, s_d), out = exp(lse_c - lse) out_c + exp(s_d - lse) vd_i. attention_backward fed
// the MERGED out/lse must give exactly the causal keys' dk, dv, and the causal part of dq (the diagonal
// adds scale p_d (dout.vd - D) kd to dq, added here by the test).
TEST(Attention, BackwardWithMergedDiagonalMatchesFiniteDifferences) {
  const int64_t t = 4, nh = 4, nkv = 2, d = 6, group = nh / nkv;
  const float scale = 1.0f / std::sqrt(float(d));
  Tensor q = random_tensor({t, nh, d}, 11), k = random_tensor({t, nkv, d}, 12), v = random_tensor({t, nkv, d}, 13);
  Tensor kd = random_tensor({t, nkv, d}, 14), vd = random_tensor({t, nkv, d}, 15), r = random_tensor({t, nh, d}, 16);
  Tensor oc = Tensor::empty({t, nh, d}, DType::F32), lc = Tensor::empty({t, nh}, DType::F32);
  Tensor out = Tensor::empty({t, nh, d}, DType::F32), lse = Tensor::empty({t, nh}, DType::F32);
  std::vector<float> pd(t * nh);  // softmax weight of the diagonal key
  auto merged = [&] {
    attention_forward(q, k, v, 0, scale, oc, &lc);
    const float *qp = q.data<float>(), *kdp = kd.data<float>(), *vdp = vd.data<float>();
    const float *ocp = oc.data<float>(), *lcp = lc.data<float>();
    float *op = out.data<float>(), *lp = lse.data<float>();
    for (int64_t i = 0; i < t; ++i)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t row = i * nh + h, kv = (i * nkv + h / group) * d;
        double sd = 0.0;
        for (int64_t e = 0; e < d; ++e) sd += double(qp[row * d + e]) * kdp[kv + e];
        sd *= scale;
        const double l = std::max<double>(lcp[row], sd) +
                         std::log(std::exp(lcp[row] - std::max<double>(lcp[row], sd)) +
                                  std::exp(sd - std::max<double>(lcp[row], sd)));
        lp[row] = float(l);
        pd[row] = float(std::exp(sd - l));
        for (int64_t e = 0; e < d; ++e)
          op[row * d + e] = float(std::exp(lcp[row] - l) * ocp[row * d + e] + std::exp(sd - l) * vdp[kv + e]);
      }
  };
  auto loss = [&] {
    merged();
    return testing::dot_double(out, r);
  };
  const auto gq = testing::numeric_grad(q, loss), gk = testing::numeric_grad(k, loss);
  const auto gv = testing::numeric_grad(v, loss);

  merged();
  Tensor dq = Tensor::empty({t, nh, d}, DType::F32);
  Tensor dk = Tensor::zeros({t, nkv, d}, DType::F32), dv = Tensor::zeros({t, nkv, d}, DType::F32);
  attention_backward(r, q, k, v, out, lse, 0, scale, dq, dk, dv);
  std::vector<float> dq_total = dq.to_float_vector();
  {
    const auto rv = r.to_float_vector(), ov = out.to_float_vector(), kdv = kd.to_float_vector();
    const auto vdv = vd.to_float_vector();
    for (int64_t i = 0; i < t; ++i)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t row = i * nh + h, kv = (i * nkv + h / group) * d;
        double dd = 0.0, dpv = 0.0;
        for (int64_t e = 0; e < d; ++e) {
          dd += double(rv[row * d + e]) * ov[row * d + e];
          dpv += double(rv[row * d + e]) * vdv[kv + e];
        }
        for (int64_t e = 0; e < d; ++e) dq_total[row * d + e] += float(scale * pd[row] * (dpv - dd) * kdv[kv + e]);
      }
  }
  testing::expect_close(dq_total, gq, testing::kFdAtol, testing::kFdRtol, "dq");
  testing::expect_close(dk.to_float_vector(), gk, testing::kFdAtol, testing::kFdRtol, "dk");
  testing::expect_close(dv.to_float_vector(), gv, testing::kFdAtol, testing::kFdRtol, "dv");
}

TEST(Attention, ErrorsNameTheTensor) {
  Tensor q = random_tensor({3, 4, 8}, 1), k = random_tensor({3, 2, 8}, 2), v = random_tensor({3, 2, 8}, 3);
  Tensor out = Tensor::empty({3, 4, 8}, DType::F32);
  Tensor v_bad = random_tensor({3, 2, 9}, 3);  // wider than q's head (a narrower one is MLA's value head)
  testing::expect_error([&] { attention_forward(q, k, v_bad, 0, 1.0f, out, nullptr); }, "attention_forward: v");
  testing::expect_error([&] { attention_backward(out, q, k, random_tensor({3, 2, 7}, 3), out, Tensor::empty({3, 4}, DType::F32), 0, 1.0f, out, v, v); },
                        "attention_backward: v");  // the backward takes equal head dims only
  Tensor k3 = random_tensor({3, 3, 8}, 2), v3 = random_tensor({3, 3, 8}, 3);
  testing::expect_error([&] { attention_forward(q, k3, v3, 0, 1.0f, out, nullptr); }, "multiple of n_kv");
  Tensor lse_bad = Tensor::empty({3, 2}, DType::F32);
  testing::expect_error([&] { attention_forward(q, k, v, 0, 1.0f, out, &lse_bad); }, "lse");
  Tensor lse = Tensor::empty({3, 4}, DType::F32), dq = Tensor::empty({3, 4, 8}, DType::F32);
  Tensor dk = Tensor::empty({3, 2, 8}, DType::F32), dv_bad = Tensor::empty({3, 4, 8}, DType::F32);
  testing::expect_error([&] { attention_backward(out, q, k, v, out, lse, 0, 1.0f, dq, dk, dv_bad); },
                        "attention_backward: dv");
}

// A value head narrower than the query/key head (MLA: 128 against 192): the first dv columns of the
// attention with V zero-padded to d, bitwise (the same fp32 loops), F32 and BF16, with a cache offset;
// plain and varlen; a v wider than q, or an out of the wrong width, is refused naming it.
TEST(Attention, ValueHeadNarrowerThanQueryHead) {
  const int64_t tq = 9, tk = 14, nh = 4, nkv = 2, d = 12, dv = 8, off = 5;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = random_tensor({tq, nh, d}, 1, -2.0f, 2.0f).to(dt), k = random_tensor({tk, nkv, d}, 2).to(dt);
    const Tensor v = random_tensor({tk, nkv, dv}, 3).to(dt);
    Tensor vpad = Tensor::zeros({tk, nkv, d}, DType::F32);
    const auto vv = v.to_float_vector();
    for (int64_t r = 0; r < tk * nkv; ++r)
      for (int64_t c = 0; c < dv; ++c) vpad.data<float>()[r * d + c] = vv[r * dv + c];
    Tensor out = Tensor::empty({tq, nh, dv}, dt), wide = Tensor::empty({tq, nh, d}, dt);
    Tensor lse = Tensor::empty({tq, nh}, DType::F32), lse_w = Tensor::empty({tq, nh}, DType::F32);
    attention_forward(q, k, v, off, 0.3f, out, &lse);
    attention_forward(q, k, vpad.to(dt), off, 0.3f, wide, &lse_w);
    const auto o = out.to_float_vector(), w = wide.to_float_vector();
    for (int64_t r = 0; r < tq * nh; ++r)
      for (int64_t c = 0; c < dv; ++c) ASSERT_EQ(o[r * dv + c], w[r * d + c]) << "row " << r << " col " << c;
    EXPECT_EQ(lse.to_float_vector(), lse_w.to_float_vector());
    // varlen: two samples of 6 and 8 rows.
    const Tensor kq = random_tensor({tk, nh, d}, 4).to(dt);
    const Tensor cu = Tensor::from_vector<int32_t>({0, 6, 14}, {3});
    Tensor vo = Tensor::empty({tk, nh, dv}, dt), vw = Tensor::empty({tk, nh, d}, dt);
    attention_forward_varlen(kq, k.reshape({tk, nkv, d}), v, cu, 0.3f, vo, nullptr);
    attention_forward_varlen(kq, k, vpad.to(dt), cu, 0.3f, vw, nullptr);
    const auto a = vo.to_float_vector(), b = vw.to_float_vector();
    for (int64_t r = 0; r < tk * nh; ++r)
      for (int64_t c = 0; c < dv; ++c) ASSERT_EQ(a[r * dv + c], b[r * d + c]) << "varlen row " << r;
  }
  const Tensor q = random_tensor({tq, nh, d}, 1), k = random_tensor({tk, nkv, d}, 2);
  Tensor out = Tensor::empty({tq, nh, dv}, DType::F32);
  testing::expect_error([&] { attention_forward(q, k, random_tensor({tk, nkv, d + 1}, 3), off, 0.3f, out, nullptr); },
                        "v (head dim 1 .. q's)");
  testing::expect_error([&] { attention_forward(q, k, random_tensor({tk, nkv, dv}, 3), off, 0.3f, out = Tensor::empty({tq, nh, d}, DType::F32), nullptr); },
                        "out");
}

}  // namespace
}  // namespace aerie
