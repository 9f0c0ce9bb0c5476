// Batched decoding attention (kernels/attention.h attention_decode_batch) and the cache append beside it
// (kernels/tensor_ops.h scatter_rows). CPU: attention_decode_batch is attention_forward per sequence
// (bitwise), with the value columns cut for MLA's latent layout; scatter_rows copies rows. CUDA: both
// against the CPU on the same inputs (F32 and BF16; GQA head dims 8, 64 and 128, 192 with values of 128 read
// from rows of 192 per kv head, MLA's latent 576 / 512,
// windows, more sequences than one launch takes), and the rows no sequence names stay as they were.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/tensor_ops.h"

namespace aerie {
namespace {

using testing::expect_error;
using testing::random_tensor;

/// A decoding batch: q [N, nh, d], one cache per sequence ([cap_i, nkv, d] keys, [cap_i, nkv, dvv] values),
/// the rows and lengths, out [N, nh, dv] filled with a sentinel.
struct DecodeCase {
  int64_t N, nh, nkv, d, dv, dvv, B, max_len, window;
  DType dt;
};

struct DecodeData {
  Tensor q, out;
  std::vector<Tensor> k, v;
  std::vector<int64_t> rows, lengths;
};

DecodeData make_case(const DecodeCase& c, uint32_t seed) {
  DecodeData x;
  auto as = [&](Tensor t) { return c.dt == DType::F32 ? t : t.to(c.dt); };
  x.q = as(random_tensor({c.N, c.nh, c.d}, seed, -2.0f, 2.0f));
  {
    Tensor s = Tensor::empty({c.N, c.nh, c.dv}, DType::F32);
    std::fill(s.data<float>(), s.data<float>() + s.numel(), 7.0f);  // rows no sequence names must keep it
    x.out = as(s);
  }
  std::mt19937 gen(seed + 1);
  std::vector<int64_t> perm(static_cast<size_t>(c.N));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  for (int64_t i = 0; i < c.B; ++i) {
    const int64_t len = i == 0 ? 1 : 1 + static_cast<int64_t>(gen() % static_cast<uint32_t>(c.max_len));
    const int64_t cap = len + static_cast<int64_t>(gen() % 5);  // caches hold more rows than are filled
    x.k.push_back(as(random_tensor({cap, c.nkv, c.d}, seed + 10 + 2 * static_cast<uint32_t>(i), -2.0f, 2.0f)));
    x.v.push_back(as(random_tensor({cap, c.nkv, c.dvv}, seed + 11 + 2 * static_cast<uint32_t>(i))));
    x.rows.push_back(perm[static_cast<size_t>(i)]);
    x.lengths.push_back(len);
  }
  return x;
}

std::vector<const Tensor*> ptrs(const std::vector<Tensor>& t) {
  std::vector<const Tensor*> p;
  for (const Tensor& x : t) p.push_back(&x);
  return p;
}

/// The per-sequence reference: attention_forward of each row against its cache (values cut to dv).
Tensor reference(const DecodeCase& c, const DecodeData& x, float scale) {
  Tensor out = x.out.clone();
  for (int64_t i = 0; i < c.B; ++i) {
    const int64_t L = x.lengths[i], r = x.rows[i];
    Tensor vals = Tensor::empty({L, c.nkv, c.dv}, x.v[i].dtype());
    Tensor src = x.v[i].slice(0, L).reshape({L * c.nkv, c.dvv}), dst = vals.reshape({L * c.nkv, c.dv});
    copy_columns(src, 0, dst, 0, c.dv);
    Tensor o = out.slice(r, r + 1);
    attention_forward(x.q.slice(r, r + 1), x.k[i].slice(0, L), vals, L - 1, scale, o, nullptr, c.window);
  }
  return out;
}

TEST(AttentionDecodeBatch, CpuIsAttentionForwardPerSequence) {
  // GQA (group 3), a window, MLA's layout (one latent head as keys and, its first dv columns, values).
  for (const DecodeCase& c : {DecodeCase{9, 6, 2, 16, 16, 16, 5, 40, 0, DType::F32},
                              DecodeCase{9, 6, 2, 16, 16, 16, 5, 40, 7, DType::BF16},
                              DecodeCase{6, 4, 1, 24, 16, 24, 4, 30, 0, DType::F32},
                              DecodeCase{7, 6, 2, 12, 8, 12, 5, 30, 0, DType::F32}}) {
    DecodeData x = make_case(c, 3);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    Tensor ref = reference(c, x, scale);
    attention_decode_batch(x.q, x.rows, ptrs(x.k), ptrs(x.v), x.lengths, scale, x.out, c.window);
    const std::vector<float> got = x.out.to_float_vector(), want = ref.to_float_vector();
    EXPECT_EQ(got, want) << "d " << c.d << " dv " << c.dv << " window " << c.window;
    int64_t untouched = 0;  // rows that no sequence names keep the sentinel
    for (int64_t r = 0; r < c.N; ++r)
      if (std::find(x.rows.begin(), x.rows.end(), r) == x.rows.end()) {
        ++untouched;
        for (int64_t e = 0; e < c.nh * c.dv; ++e) EXPECT_EQ(got[r * c.nh * c.dv + e], 7.0f) << "row " << r;
      }
    EXPECT_EQ(untouched, c.N - c.B);
  }
}

TEST(AttentionDecodeBatch, MatchesAnExplicitSoftmax) {
  // One sequence by hand in double: softmax(scale q.k_j) over keys j < L (the last `window` of them).
  const DecodeCase c{3, 4, 2, 8, 8, 8, 2, 12, 5, DType::F32};
  DecodeData x = make_case(c, 11);
  const float scale = 0.4f;
  attention_decode_batch(x.q, x.rows, ptrs(x.k), ptrs(x.v), x.lengths, scale, x.out, c.window);
  const auto qv = x.q.to_float_vector(), out = x.out.to_float_vector();
  for (int64_t i = 0; i < c.B; ++i) {
    const auto kv = x.k[i].to_float_vector(), vv = x.v[i].to_float_vector();
    const int64_t L = x.lengths[i], r = x.rows[i], j0 = std::max<int64_t>(0, L - c.window);
    for (int64_t h = 0; h < c.nh; ++h) {
      const int64_t g = h / (c.nh / c.nkv);
      std::vector<double> s;
      double mx = -INFINITY;
      for (int64_t j = j0; j < L; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < c.d; ++e) dot += double(qv[(r * c.nh + h) * c.d + e]) * kv[(j * c.nkv + g) * c.d + e];
        s.push_back(scale * dot);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double v : s) sum += std::exp(v - mx);
      for (int64_t e = 0; e < c.dv; ++e) {
        double o = 0;
        for (int64_t j = j0; j < L; ++j) o += std::exp(s[j - j0] - mx) / sum * vv[(j * c.nkv + g) * c.dvv + e];
        EXPECT_NEAR(out[(r * c.nh + h) * c.dv + e], o, 1e-5) << "sequence " << i << " head " << h << " e " << e;
      }
    }
  }
}

TEST(AttentionDecodeBatch, RejectsBadInput) {
  const DecodeCase c{6, 4, 2, 8, 8, 8, 3, 10, 0, DType::F32};
  DecodeData x = make_case(c, 5);
  auto run = [&](std::vector<int64_t> rows, std::vector<int64_t> lens, int64_t window = 0) {
    attention_decode_batch(x.q, rows, ptrs(x.k), ptrs(x.v), lens, 1.0f, x.out, window);
  };
  expect_error([&] { run({x.rows[0], x.rows[0], x.rows[2]}, x.lengths); }, "twice");
  expect_error([&] { run({x.rows[0], x.rows[1], 6}, x.lengths); }, "outside q's 6 rows");
  expect_error([&] { run(x.rows, {0, x.lengths[1], x.lengths[2]}); }, "sequence 0's length 0");
  expect_error([&] { run(x.rows, {x.lengths[0], x.lengths[1], x.k[2].dim(0) + 1}); }, "sequence 2's length");
  expect_error([&] { run(x.rows, x.lengths, -1); }, "sliding window");
  expect_error([&] { run({x.rows[0]}, x.lengths); }, "one each per sequence");
  Tensor wrong = Tensor::zeros({5, 3, 8}, DType::F32);  // 3 kv heads do not divide 4 heads
  std::vector<const Tensor*> k = ptrs(x.k);
  k[1] = &wrong;
  expect_error([&] { attention_decode_batch(x.q, x.rows, k, ptrs(x.v), x.lengths, 1.0f, x.out); }, "sequence 1's keys");
  Tensor wide = Tensor::zeros({6, 4, 16}, DType::F32);  // dv above d
  expect_error([&] { attention_decode_batch(x.q, x.rows, ptrs(x.k), ptrs(x.v), x.lengths, 1.0f, wide); }, "out must be");
}

TEST(ScatterRows, CopiesEachRowAndChecks) {
  Tensor src = random_tensor({5, 2, 3}, 1);
  Tensor a = Tensor::zeros({4, 2, 3}, DType::F32), b = Tensor::zeros({2, 6}, DType::F32);
  scatter_rows(src, {3, 0, 4}, {&a, &b, &a}, {1, 1, 3});
  const auto s = src.to_float_vector(), av = a.to_float_vector(), bv = b.to_float_vector();
  for (int e = 0; e < 6; ++e) {
    EXPECT_EQ(av[1 * 6 + e], s[3 * 6 + e]);
    EXPECT_EQ(av[3 * 6 + e], s[4 * 6 + e]);
    EXPECT_EQ(bv[1 * 6 + e], s[0 * 6 + e]);
    EXPECT_EQ(av[0 * 6 + e], 0.0f);
    EXPECT_EQ(bv[0 * 6 + e], 0.0f);
  }
  Tensor narrow = Tensor::zeros({4, 5}, DType::F32), half = Tensor::zeros({4, 6}, DType::BF16);
  expect_error([&] { scatter_rows(src, {0}, {&narrow}, {0}); }, "entry 0's destination");
  expect_error([&] { scatter_rows(src, {0}, {&half}, {0}); }, "entry 0's destination is BF16");
  expect_error([&] { scatter_rows(src, {5}, {&a}, {0}); }, "source row 5");
  expect_error([&] { scatter_rows(src, {0, 1}, {&a, &a}, {0, 4}); }, "entry 1's destination row 4");
  expect_error([&] { scatter_rows(src, {0}, {&a, &b}, {0, 0}); }, "one each per entry");
}

// ---- CUDA (skipped without a GPU) ----

Tensor to_gpu(const Tensor& t) { return t.to_device(Device::CUDA); }

TEST(AttentionDecodeBatchCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  // head dims 8 / 64 / 128 (SmolLM2, Llama), 192 / 128 with two kv heads, MLA's latent 576 with values its
  // first 512; 70 sequences take two launches; windows.
  for (DType dt : {DType::F32, DType::BF16})
    for (const DecodeCase& c0 : {DecodeCase{80, 9, 3, 64, 64, 64, 70, 300, 0, dt},
                                 DecodeCase{80, 9, 3, 64, 64, 64, 70, 300, 50, dt},
                                 DecodeCase{20, 32, 8, 128, 128, 128, 12, 700, 0, dt},
                                 DecodeCase{10, 4, 2, 8, 8, 8, 6, 40, 0, dt},
                                 DecodeCase{10, 8, 2, 192, 128, 192, 7, 300, 0, dt},
                                 DecodeCase{12, 8, 1, 576, 512, 576, 9, 400, 0, dt}}) {
      const DecodeCase c = c0;
      DecodeData x = make_case(c, 21);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      Tensor ref = reference(c, x, scale);
      std::vector<Tensor> gk, gv;
      for (const Tensor& t : x.k) gk.push_back(to_gpu(t));
      for (const Tensor& t : x.v) gv.push_back(to_gpu(t));
      Tensor gq = to_gpu(x.q), gout = to_gpu(x.out);
      attention_decode_batch(gq, x.rows, ptrs(gk), ptrs(gv), x.lengths, scale, gout, c.window);
      const std::string what = std::string(dtype_name(dt)) + " d " + std::to_string(c.d) + " dv " +
                               std::to_string(c.dv) + " window " + std::to_string(c.window);
      // F32: the same fp32 formulas summed in another order over up to 700 keys; BF16: one bf16 rounding of
      // fp32 values that differ in their last bits (one bf16 step, 2^-8 relative), as attention_cuda_test.
      const float atol = dt == DType::F32 ? 2e-5f : 1e-2f, rtol = dt == DType::F32 ? 1e-4f : 1e-2f;
      testing::expect_close(gout.to_float_vector(), ref.to_float_vector(), atol, rtol, what);
    }
}

TEST(ScatterRowsCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  // Rows of 384 bytes (16-byte copies), 20 bytes (4-byte copies) and 6 bytes (byte copies); 70 rows take
  // two launches.
  for (const auto& [shape, dt] : std::vector<std::pair<Shape, DType>>{
           {{3, 64}, DType::BF16}, {{5}, DType::F32}, {{3}, DType::BF16}}) {
    Shape s{80};
    s.insert(s.end(), shape.begin(), shape.end());
    Tensor src = random_tensor(s, 4);
    if (dt != DType::F32) src = src.to(dt);
    std::vector<Tensor> dst;
    for (int i = 0; i < 70; ++i) {
      Shape d{3 + i % 4};
      d.insert(d.end(), shape.begin(), shape.end());
      dst.push_back(Tensor::zeros(d, DType::F32).to(dt));
    }
    std::vector<int64_t> from, to;
    for (int i = 0; i < 70; ++i) {
      from.push_back((i * 7) % 80);
      to.push_back(i % (3 + i % 4));
    }
    std::vector<Tensor> gdst;
    for (const Tensor& t : dst) gdst.push_back(to_gpu(t));
    std::vector<Tensor*> cp, gp;
    for (Tensor& t : dst) cp.push_back(&t);
    for (Tensor& t : gdst) gp.push_back(&t);
    scatter_rows(src, from, cp, to);
    scatter_rows(to_gpu(src), from, gp, to);
    for (int i = 0; i < 70; ++i)
      EXPECT_EQ(gdst[i].to_float_vector(), dst[i].to_float_vector()) << "entry " << i << " of " << dtype_name(dt);
  }
}

}  // namespace
}  // namespace aerie
