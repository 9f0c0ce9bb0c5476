// The CPU references of the newer attention ops: the packed variable-length prefill (against explicit
// per-sample facts), the TTT diagonal merge (against an explicit double-precision softmax over the
// causal + diagonal keys, and its backward against central finite differences), and the BF16 path
// (widened to fp32, rounded back once).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/attention.h"

namespace aerie {
namespace {

using testing::random_tensor;

TEST(AttentionVarlen, EachSampleAttendsOnlyItself) {
  const int64_t nh = 4, nkv = 2, d = 8, group = nh / nkv;
  const std::vector<int32_t> cu{0, 1, 38, 38, 238};  // lengths 1, 37, 0 (empty), 200
  const int64_t n = cu.back();
  const float scale = 0.4f;
  Tensor q = random_tensor({n, nh, d}, 1, -2.0f, 2.0f), k = random_tensor({n, nkv, d}, 2, -2.0f, 2.0f);
  Tensor v = random_tensor({n, nkv, d}, 3);
  Tensor cs = Tensor::from_vector(cu, {5});
  Tensor out = Tensor::empty({n, nh, d}, DType::F32), lse = Tensor::empty({n, nh}, DType::F32);
  attention_forward_varlen(q, k, v, cs, scale, out, &lse);
  // The first row of each sample attends only itself: out = its v, lse = scale q.k.
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{38}})
    for (int64_t h = 0; h < nh; ++h) {
      const float* qr = q.data<float>() + (r * nh + h) * d;
      const float* kr = k.data<float>() + (r * nkv + h / group) * d;
      const float* vr = v.data<float>() + (r * nkv + h / group) * d;
      double s = 0.0;
      for (int64_t e = 0; e < d; ++e) {
        EXPECT_FLOAT_EQ(out.data<float>()[(r * nh + h) * d + e], vr[e]) << "row " << r;
        s += double(qr[e]) * kr[e];
      }
      EXPECT_NEAR(lse.data<float>()[r * nh + h], scale * s, 1e-5) << "row " << r;
    }
  // Every sample equals a causal attention over its own rows only.
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b] == cu[b + 1]) continue;
    const int64_t t = cu[b + 1] - cu[b];
    Tensor os = Tensor::empty({t, nh, d}, DType::F32), ls = Tensor::empty({t, nh}, DType::F32);
    attention_forward(q.slice(cu[b], cu[b + 1]).clone(), k.slice(cu[b], cu[b + 1]).clone(),
                      v.slice(cu[b], cu[b + 1]).clone(), 0, scale, os, &ls);
    EXPECT_EQ(out.slice(cu[b], cu[b + 1]).to_float_vector(), os.to_float_vector()) << "sample " << b;
    EXPECT_EQ(lse.slice(cu[b], cu[b + 1]).to_float_vector(), ls.to_float_vector()) << "sample " << b;
  }
  // Packing matters: the unpacked causal attention of the last sample's rows differs.
  Tensor all = Tensor::empty({n, nh, d}, DType::F32);
  attention_forward(q, k, v, 0, scale, all, nullptr);
  EXPECT_NE(all.slice(38, n).to_float_vector(), out.slice(38, n).to_float_vector());
  // lse is optional.
  Tensor out2 = Tensor::empty({n, nh, d}, DType::F32);
  attention_forward_varlen(q, k, v, cs, scale, out2, nullptr);
  EXPECT_EQ(out2.to_float_vector(), out.to_float_vector());
}

TEST(AttentionVarlen, BadCuSeqlensNameTheTable) {
  Tensor q = random_tensor({6, 2, 4}, 1), k = random_tensor({6, 1, 4}, 2), v = random_tensor({6, 1, 4}, 3);
  Tensor out = Tensor::empty({6, 2, 4}, DType::F32);
  for (const std::vector<int32_t>& cu : {std::vector<int32_t>{1, 6}, {0, 5}, {0, 4, 3, 6}}) {
    Tensor cs = Tensor::from_vector(cu, {static_cast<int64_t>(cu.size())});
    testing::expect_error([&] { attention_forward_varlen(q, k, v, cs, 1.0f, out, nullptr); }, "cu_seqlens");
  }
  Tensor cs64 = Tensor::zeros({2}, DType::I64);
  testing::expect_error([&] { attention_forward_varlen(q, k, v, cs64, 1.0f, out, nullptr); }, "cu_seqlens");
}

/// Rows n, heads nh/nkv, head dim d, J diagonal tensors of n + 1 rows (longer than q, as in TTT).
struct Ttt {
  int64_t n = 5, nh = 4, nkv = 2, d = 6;
  int J;
  float scale = 1.0f / std::sqrt(6.0f);
  Tensor q, k0, v0;
  std::vector<Tensor> dk, dv;
  std::vector<const Tensor*> pk() const {
    std::vector<const Tensor*> p;
    for (const auto& t : dk) p.push_back(&t);
    return p;
  }
  std::vector<const Tensor*> pv() const {
    std::vector<const Tensor*> p;
    for (const auto& t : dv) p.push_back(&t);
    return p;
  }
  explicit Ttt(int j) : J(j) {
    q = random_tensor({n, nh, d}, 11, -2.0f, 2.0f);
    k0 = random_tensor({n, nkv, d}, 12, -2.0f, 2.0f);
    v0 = random_tensor({n, nkv, d}, 13);
    for (int i = 0; i < J; ++i) {
      dk.push_back(random_tensor({n + 1, nkv, d}, 20 + i, -2.0f, 2.0f));
      dv.push_back(random_tensor({n + 1, nkv, d}, 30 + i));
    }
  }
  void forward(Tensor& out, Tensor& lse) const {
    attention_forward(q, k0, v0, 0, scale, out, &lse);
    attention_merge_diagonal_forward(q, pk(), pv(), scale, out, lse);
  }
};

TEST(AttentionMergeDiagonal, MatchesExplicitSoftmaxOverAllKeys) {
  for (int J : {0, 1, 3}) {
    SCOPED_TRACE("J = " + std::to_string(J));
    const Ttt t(J);
    Tensor out = Tensor::empty({t.n, t.nh, t.d}, DType::F32), lse = Tensor::empty({t.n, t.nh}, DType::F32);
    t.forward(out, lse);
    std::vector<float> oref, lref;
    for (int64_t i = 0; i < t.n; ++i)
      for (int64_t h = 0; h < t.nh; ++h) {
        const int64_t g = h / (t.nh / t.nkv);
        std::vector<const float*> keys, vals;  // causal keys 0..i, then row i of each diagonal tensor
        for (int64_t j = 0; j <= i; ++j) {
          keys.push_back(t.k0.data<float>() + (j * t.nkv + g) * t.d);
          vals.push_back(t.v0.data<float>() + (j * t.nkv + g) * t.d);
        }
        for (int j = 0; j < J; ++j) {
          keys.push_back(t.dk[j].data<float>() + (i * t.nkv + g) * t.d);
          vals.push_back(t.dv[j].data<float>() + (i * t.nkv + g) * t.d);
        }
        const float* qi = t.q.data<float>() + (i * t.nh + h) * t.d;
        std::vector<double> s;
        double mx = -std::numeric_limits<double>::infinity(), z = 0.0;
        for (const float* kj : keys) {
          double dot = 0.0;
          for (int64_t e = 0; e < t.d; ++e) dot += double(qi[e]) * kj[e];
          s.push_back(t.scale * dot);
          mx = std::max(mx, s.back());
        }
        for (double x : s) z += std::exp(x - mx);
        lref.push_back(float(mx + std::log(z)));
        for (int64_t e = 0; e < t.d; ++e) {
          double o = 0.0;
          for (size_t j = 0; j < keys.size(); ++j) o += std::exp(s[j] - mx) / z * vals[j][e];
          oref.push_back(float(o));
        }
      }
    testing::expect_close(out.to_float_vector(), oref, 1e-5f, 1e-5f, "out");
    testing::expect_close(lse.to_float_vector(), lref, 1e-5f, 1e-5f, "lse");
  }
}

TEST(AttentionMergeDiagonal, BackwardMatchesFiniteDifferences) {
  Ttt t(2);
  const Tensor r = random_tensor({t.n, t.nh, t.d}, 40);
  Tensor out = Tensor::empty({t.n, t.nh, t.d}, DType::F32), lse = Tensor::empty({t.n, t.nh}, DType::F32);
  auto loss = [&] {
    t.forward(out, lse);
    return testing::dot_double(out, r);
  };
  const auto gq = testing::numeric_grad(t.q, loss), gk0 = testing::numeric_grad(t.k0, loss);
  const auto gk1 = testing::numeric_grad(t.dk[1], loss), gv0 = testing::numeric_grad(t.dv[0], loss);

  t.forward(out, lse);
  Tensor dq = Tensor::empty(t.q.shape(), DType::F32);
  Tensor dk0 = Tensor::zeros(t.k0.shape(), DType::F32), dv0 = Tensor::zeros(t.v0.shape(), DType::F32);
  std::vector<Tensor> gdk, gdv;
  for (int j = 0; j < t.J; ++j) {  // added to: start from 0.5
    gdk.push_back(Tensor::from_vector(std::vector<float>(t.dk[j].numel(), 0.5f), t.dk[j].shape()));
    gdv.push_back(Tensor::from_vector(std::vector<float>(t.dv[j].numel(), 0.5f), t.dv[j].shape()));
  }
  attention_backward(r, t.q, t.k0, t.v0, out, lse, 0, t.scale, dq, dk0, dv0);
  attention_merge_diagonal_backward(r, t.q, t.pk(), t.pv(), out, lse, t.scale, dq, {&gdk[0], &gdk[1]},
                                    {&gdv[0], &gdv[1]});
  auto minus_half = [](std::vector<float> x) {
    for (auto& e : x) e -= 0.5f;
    return x;
  };
  testing::expect_close(dq.to_float_vector(), gq, testing::kFdAtol, testing::kFdRtol, "dq");
  testing::expect_close(dk0.to_float_vector(), gk0, testing::kFdAtol, testing::kFdRtol, "dk0");
  testing::expect_close(minus_half(gdk[1].to_float_vector()), gk1, testing::kFdAtol, testing::kFdRtol, "ddiag_k 1");
  testing::expect_close(minus_half(gdv[0].to_float_vector()), gv0, testing::kFdAtol, testing::kFdRtol, "ddiag_v 0");
}

TEST(AttentionMergeDiagonal, ErrorsNameTheTensor) {
  const Ttt t(1);
  Tensor out = Tensor::empty({t.n, t.nh, t.d}, DType::F32), lse = Tensor::empty({t.n, t.nh}, DType::F32);
  Tensor short_k = random_tensor({t.n - 1, t.nkv, t.d}, 1);
  testing::expect_error([&] { attention_merge_diagonal_forward(t.q, {&short_k}, {&short_k}, 1.0f, out, lse); },
                        "diagonal key 0");
  testing::expect_error([&] { attention_merge_diagonal_forward(t.q, {&t.dk[0]}, {}, 1.0f, out, lse); },
                        "1 diagonal keys, 0 values");
  Tensor dq = Tensor::empty(t.q.shape(), DType::F32);
  testing::expect_error(
      [&] { attention_merge_diagonal_backward(out, t.q, t.pk(), t.pv(), out, lse, 1.0f, dq, {}, {}); },
      "diagonal gradients");
}

// BF16 on the CPU: the F32 reference on the widened values, each output rounded once.
TEST(AttentionBf16Cpu, EqualsF32OnRoundedValues) {
  const int64_t tq = 7, tk = 9, nh = 4, nkv = 2, d = 8;
  auto rounded = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  const Tensor q = rounded(random_tensor({tq, nh, d}, 1)), k = rounded(random_tensor({tk, nkv, d}, 2));
  const Tensor v = rounded(random_tensor({tk, nkv, d}, 3)), dout = rounded(random_tensor({tq, nh, d}, 4));
  Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({tq, nh}, DType::F32);
  attention_forward(q, k, v, 2, 0.3f, out, &lse);
  Tensor bout = Tensor::empty(q.shape(), DType::BF16), blse = Tensor::empty({tq, nh}, DType::F32);
  attention_forward(q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16), 2, 0.3f, bout, &blse);
  EXPECT_EQ(bout.to_float_vector(), rounded(out).to_float_vector());
  EXPECT_EQ(blse.to_float_vector(), lse.to_float_vector());

  const Tensor outr = rounded(out);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = rounded(random_tensor(k.shape(), 5)), dv = dk.clone();
  Tensor bdq = Tensor::empty(q.shape(), DType::BF16), bdk = dk.to(DType::BF16), bdv = dv.to(DType::BF16);
  attention_backward(dout, q, k, v, outr, lse, 2, 0.3f, dq, dk, dv);
  attention_backward(dout.to(DType::BF16), q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16),
                     outr.to(DType::BF16), lse, 2, 0.3f, bdq, bdk, bdv);
  EXPECT_EQ(bdq.to_float_vector(), rounded(dq).to_float_vector());
  EXPECT_EQ(bdk.to_float_vector(), rounded(dk).to_float_vector());
  EXPECT_EQ(bdv.to_float_vector(), rounded(dv).to_float_vector());
  // F32 key gradients of BF16 inputs are allowed too; a BF16 q with F32 k is not.
  Tensor fdk = Tensor::zeros(k.shape(), DType::F32), fdv = Tensor::zeros(k.shape(), DType::F32);
  attention_backward(dout.to(DType::BF16), q.to(DType::BF16), k.to(DType::BF16), v.to(DType::BF16),
                     outr.to(DType::BF16), lse, 2, 0.3f, bdq, fdk, fdv);
  testing::expect_error([&] { attention_forward(q.to(DType::BF16), k, v, 0, 1.0f, bout, nullptr); },
                        "attention_forward: k");
}

}  // namespace
}  // namespace aerie
