// Shared by the draft tests: a tiny random draft + sample, and an independent double-precision
// reference of the whole TTT loss that materialises the attention masks of eagle3.md section 4.
#pragma once
#include <cmath>
#include <random>
#include <vector>

#include "model/draft.h"

namespace aerie::testing {

struct TinyDraft {
  DraftConfig cfg;
  DraftWeights w;
  Tensor embed;                   // [V, H]
  Tensor target_lm;               // [V, H_t]
  std::vector<int64_t> selected;  // K ascending ids
  std::vector<int64_t> d2t;
  std::vector<uint8_t> t2d;
};

inline Tensor random_tensor(const Shape& s, std::mt19937_64& rng, double scale) {
  Tensor t = Tensor::empty(s, DType::F32);
  std::normal_distribution<double> nd(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(nd(rng));
  return t;
}

/// H=8, n_h=2, n_kv=1, d=4, I=12, V=16, K=10, H_t=6 (fc reads 18 != 3H to catch mixed-up widths).
inline TinyDraft make_tiny_draft(uint64_t seed) {
  TinyDraft m;
  DraftConfig& c = m.cfg;
  c.hidden_size = 8;
  c.target_hidden_size = 6;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 12;
  c.vocab_size = 16;
  c.draft_vocab_size = 10;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope.theta = 10000.0;
  m.selected = {0, 1, 2, 4, 5, 7, 9, 10, 12, 15};
  m.t2d.assign(16, 0);
  for (size_t i = 0; i < m.selected.size(); ++i) {
    m.d2t.push_back(m.selected[i] - static_cast<int64_t>(i));
    m.t2d[m.selected[i]] = 1;
  }
  std::mt19937_64 rng(seed);
  m.embed = random_tensor({16, 8}, rng, 1.0);
  m.target_lm = random_tensor({16, 8}, rng, 1.0);
  m.w = init_draft_weights(c, m.target_lm, m.selected, seed + 1);
  // Norm weights away from 1 and a larger lm_head so that every gradient is non-trivial.
  for (Tensor* t : {&m.w.input_layernorm, &m.w.hidden_norm, &m.w.post_attention_layernorm, &m.w.norm}) {
    Tensor r = random_tensor({8}, rng, 0.3);
    for (int i = 0; i < 8; ++i) t->data<float>()[i] += r.data<float>()[i];
  }
  return m;
}

/// Turns EAGLE-3.1's norm_before_fc on for a test draft made without it: cfg.norm_before_fc and the
/// weight input_norm [3 H_t], initialised as init_draft_weights does (ones) plus N(0, 0.3^2) noise from
/// `seed` (as make_tiny_draft moves the other norms away from 1), so that its gradient is not trivial.
inline void enable_norm_before_fc(TinyDraft& m, uint64_t seed) {
  m.cfg.norm_before_fc = true;
  const int64_t n = 3 * m.cfg.target_hidden_size;
  m.w.input_norm = Tensor::empty({n}, DType::F32);
  std::mt19937_64 rng(seed);
  Tensor r = random_tensor({n}, rng, 0.3);
  for (int64_t i = 0; i < n; ++i) m.w.input_norm.data<float>()[i] = 1.0f + r.data<float>()[i];
}

/// Turns EAGLE-3.1's fc_norm on for a test draft made without it: cfg.fc_norm and the weights
/// fc_norm[0..2] [H_t], ones plus N(0, 0.3^2) noise from `seed` (as enable_norm_before_fc does).
inline void enable_fc_norm(TinyDraft& m, uint64_t seed) {
  m.cfg.fc_norm = true;
  const int64_t n = m.cfg.target_hidden_size;
  std::mt19937_64 rng(seed);
  for (Tensor& t : m.w.fc_norm) {
    t = Tensor::empty({n}, DType::F32);
    Tensor r = random_tensor({n}, rng, 0.3);
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = 1.0f + r.data<float>()[i];
  }
}

/// Turns a test draft into the MLA draft (DraftConfig::is_mla) of the given sizes with a YaRN rope
/// (factor 4, mscale 1 / mscale_all_dim 0.5: the rope's attention factor and the softmax scale are both
/// away from 1): new weights from init_draft_weights(seed), every norm weight (the latent norms too) moved
/// away from 1 by N(0, 0.3^2).
inline void make_mla(TinyDraft& m, int64_t q_lora, int64_t kv_lora, int64_t nope, int64_t rope, int64_t v,
                     uint64_t seed) {
  DraftConfig& c = m.cfg;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = kv_lora;
  c.qk_nope_head_dim = nope;
  c.qk_rope_head_dim = rope;
  c.v_head_dim = v;
  c.head_dim = rope;
  c.num_key_value_heads = c.num_attention_heads;
  c.rope.type = "yarn";
  c.rope.factor = 4.0;
  c.rope.original_max_position_embeddings = 16;
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 0.5;
  c.rope_scaling = {{"rope_type", "yarn"},  {"factor", 4.0}, {"original_max_position_embeddings", 16},
                    {"mscale", 1.0},        {"mscale_all_dim", 0.5}};  // what the export writes: the same rope
  m.w = init_draft_weights(c, m.target_lm, m.selected, seed);
  std::mt19937_64 rng(seed + 1);
  for (auto& [name, t] : m.w.named()) {
    if (t->ndim() != 1) continue;
    Tensor r = random_tensor(t->shape(), rng, 0.3);
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] += r.data<float>()[i];
  }
}

/// make_tiny_draft's sizes with the MLA draft's attention: n_h=2, q_lora_rank `q_lora` (0: q_proj),
/// kv_lora_rank 4, qk_nope 4, qk_rope 4 (query/key head 8), v_head_dim 3 (narrower than both, so that a
/// mixed-up width shows).
inline TinyDraft make_tiny_mla_draft(uint64_t seed, int64_t q_lora) {
  TinyDraft m = make_tiny_draft(seed);
  make_mla(m, q_lora, 4, 4, 4, 3, seed + 1);
  return m;
}

/// A draft larger than make_tiny_draft's: H=48, n_h=4, n_kv=2 (several heads per kv head), head dim
/// `head_dim`, I=72, V=97, K=37 (ids i * 97 / 37), H_t=40, widths that are not powers of two.
/// `bf16_embed`: the embedding table rounded to bf16 (as a bf16 checkpoint's is), so that an F32 and a
/// BF16 path see the same values.
inline TinyDraft make_medium_draft(uint64_t seed, int64_t head_dim, int64_t max_positions, bool bf16_embed) {
  TinyDraft m;
  DraftConfig& c = m.cfg;
  c.hidden_size = 48;
  c.target_hidden_size = 40;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = head_dim;
  c.intermediate_size = 72;
  c.vocab_size = 97;
  c.draft_vocab_size = 37;
  c.max_position_embeddings = max_positions;
  c.rms_norm_eps = 1e-5;
  c.rope.theta = 10000.0;
  m.t2d.assign(97, 0);
  for (int64_t i = 0; i < 37; ++i) m.selected.push_back(i * 97 / 37);
  for (size_t i = 0; i < m.selected.size(); ++i) {
    m.d2t.push_back(m.selected[i] - static_cast<int64_t>(i));
    m.t2d[m.selected[i]] = 1;
  }
  std::mt19937_64 rng(seed);
  m.embed = random_tensor({97, 48}, rng, 1.0);
  if (bf16_embed) m.embed = m.embed.to(DType::BF16).to(DType::F32);
  m.target_lm = random_tensor({97, 48}, rng, 1.0);
  m.w = init_draft_weights(c, m.target_lm, m.selected, seed + 1);
  return m;
}

/// A random sample of length T for any draft (ids below its V, a quarter of the rows out of the loss):
/// aux ~ N(0, 1) [T, 3 H_t] (rounded to bf16 when `bf16_aux`, as extraction stores it), final hidden
/// states ~ N(0, z_scale^2) [T, H] through make_ttt_sample.
inline TTTSample make_random_sample(const TinyDraft& m, int64_t T, uint64_t seed, double z_scale, bool bf16_aux) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(T);
  std::vector<uint8_t> mask(T);
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = static_cast<int32_t>(rng() % static_cast<uint64_t>(m.cfg.vocab_size));
    mask[t] = (rng() % 4) != 0;
  }
  Tensor aux = random_tensor({T, 3 * m.cfg.target_hidden_size}, rng, 1.0);
  if (bf16_aux) aux = aux.to(DType::BF16);
  Tensor z = random_tensor({T, m.cfg.hidden_size}, rng, z_scale);
  return make_ttt_sample(ids, mask, aux, z, m.target_lm, m.selected);
}

/// A random sample of length T with the draft's H_t; target from random final hidden states through
/// make_ttt_sample (so some argmaxes fall outside the draft vocabulary).
inline TTTSample make_tiny_sample(const TinyDraft& m, int64_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(T);
  std::vector<uint8_t> mask(T);
  for (int64_t t = 0; t < T; ++t) {
    ids[t] = static_cast<int32_t>(rng() % 16);
    mask[t] = (rng() % 4) != 0;
  }
  Tensor aux = random_tensor({T, 3 * m.cfg.target_hidden_size}, rng, 1.0);
  Tensor z = random_tensor({T, 8}, rng, 1.0);
  return make_ttt_sample(ids, mask, aux, z, m.target_lm, m.selected);
}

/// Weights in named() order as doubles.
inline std::vector<std::vector<double>> to_double(const DraftWeights& w) {
  std::vector<std::vector<double>> out;
  for (auto& [n, t] : w.named()) {
    std::vector<float> f = t->to_float_vector();
    out.emplace_back(f.begin(), f.end());
  }
  return out;
}

struct RefResult {
  double total = 0;                             // sum_k step_weight[k] * sum_t valid CE
  std::vector<double> loss_sum;                 // [S]
  std::vector<std::vector<std::vector<double>>> logits;  // [S][rows][K]
};

/// Independent double reference of eagle3.md sections 3-4, written from the text: every (step, row)
/// computed with its input token, the attention over an explicitly materialised mask
/// allowed(k,t; j,s) = (j == 0 && s <= t) || (1 <= j <= k && s == t) over all computed keys; with
/// c.sliding_window W > 0 the step-0 keys also need s > t - W (speculators' create_combined_mask_mod).
inline RefResult reference_ttt(const DraftConfig& c, const std::vector<std::vector<double>>& W, const Tensor& embed,
                               const TTTSample& s, const std::vector<uint8_t>& t2d, int S,
                               const std::vector<double>& sw) {
  // INPUT_NORM: norm_before_fc only; under fc_norm the three per-chunk norms take its place and the next two.
  enum { FC, Q, KP, VP, O, G, U, D, IN, HN, POST, NORM, LM, INPUT_NORM };
  const int64_t H = c.hidden_size, Ht3 = 3 * c.target_hidden_size, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, d = c.head_dim, I = c.intermediate_size, K = c.draft_vocab_size;
  const int64_t T = static_cast<int64_t>(s.ids.size());
  using Vec = std::vector<double>;
  auto lin = [](const Vec& w, const Vec& x, int64_t out) {
    Vec y(out, 0.0);
    const int64_t in = static_cast<int64_t>(x.size());
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
    return y;
  };
  auto rms = [&](const Vec& x, const Vec& w) {
    double ms = 0;
    for (double v : x) ms += v * v;
    double r = 1.0 / std::sqrt(ms / x.size() + c.rms_norm_eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  };
  auto rope = [&](Vec& x, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d / 2; ++i) {
        double inv = 1.0 / std::pow(c.rope.theta, 2.0 * i / d), ang = pos * inv;
        double x1 = x[h * d + i], x2 = x[h * d + i + d / 2];
        x[h * d + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
        x[h * d + i + d / 2] = x2 * std::cos(ang) + x1 * std::sin(ang);
      }
  };
  std::vector<float> emb = embed.to_float_vector(), aux = s.aux_hidden.to_float_vector(),
                     tp = s.target_probs.to_float_vector();
  // keys[j][s], vals[j][s]: computed (step j, row s); empty when the row has no input token.
  std::vector<std::vector<Vec>> keys(S, std::vector<Vec>(T)), vals(S, std::vector<Vec>(T)), outs(S, std::vector<Vec>(T));
  RefResult r;
  r.loss_sum.assign(S, 0.0);
  r.logits.assign(S, {});
  for (int k = 0; k < S; ++k) {
    std::vector<Vec> qs(T), hs(T), hns(T);
    for (int64_t t = 0; t + k + 1 <= T - 1; ++t) {
      const int64_t u = s.ids[t + k + 1];
      Vec e(emb.begin() + u * H, emb.begin() + (u + 1) * H);
      Vec h;
      if (k == 0) {
        Vec f(aux.begin() + t * Ht3, aux.begin() + (t + 1) * Ht3);
        if (c.norm_before_fc) f = rms(f, W[INPUT_NORM]);  // EAGLE-3.1: one RMSNorm over the concatenation
        if (c.fc_norm) {  // EAGLE-3.1: one RMSNorm per aux chunk of H_t values (SpecForge's fc_norm)
          const int64_t Ht = Ht3 / 3;
          Vec g;
          for (int ch = 0; ch < 3; ++ch) {
            Vec part = rms(Vec(f.begin() + ch * Ht, f.begin() + (ch + 1) * Ht), W[INPUT_NORM + ch]);
            g.insert(g.end(), part.begin(), part.end());
          }
          f = g;
        }
        h = lin(W[FC], f, H);
      } else {
        h = outs[k - 1][t];
      }
      Vec a = rms(e, W[IN]), hn = rms(h, W[HN]);
      a.insert(a.end(), hn.begin(), hn.end());
      hns[t] = hn;
      Vec q = lin(W[Q], a, nh * d), kk = lin(W[KP], a, nkv * d), vv = lin(W[VP], a, nkv * d);
      rope(q, nh, t + k);
      rope(kk, nkv, t + k);
      qs[t] = q;
      hs[t] = h;
      keys[k][t] = kk;
      vals[k][t] = vv;
    }
    for (int64_t t = 0; t + k + 1 <= T - 1; ++t) {
      Vec attn(nh * d, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kh = h / (nh / nkv);
        std::vector<double> sc;
        std::vector<const Vec*> vs;
        for (int j = 0; j <= k; ++j)
          for (int64_t s2 = 0; s2 < T; ++s2) {
            bool allowed = (j == 0 && s2 <= t && (c.sliding_window <= 0 || s2 > t - c.sliding_window)) ||
                           (j >= 1 && j <= k && s2 == t);
            if (!allowed) continue;
            EXPECT_FALSE(keys[j][s2].empty()) << "mask allows a key that was never computed";
            double dd = 0;
            for (int64_t x = 0; x < d; ++x) dd += qs[t][h * d + x] * keys[j][s2][kh * d + x];
            sc.push_back(dd / std::sqrt(static_cast<double>(d)));
            vs.push_back(&vals[j][s2]);
          }
        double m = -1e300, z = 0;
        for (double v : sc) m = std::max(m, v);
        for (double v : sc) z += std::exp(v - m);
        for (size_t i = 0; i < sc.size(); ++i)
          for (int64_t x = 0; x < d; ++x) attn[h * d + x] += std::exp(sc[i] - m) / z * (*vs[i])[kh * d + x];
      }
      // The residual base: h, or hidden_norm(h) under norm_before_residual (EAGLE-3.1).
      Vec y = c.norm_before_residual ? hns[t] : hs[t], ao = lin(W[O], attn, H);
      for (int64_t i = 0; i < H; ++i) y[i] += ao[i];
      Vec n2 = rms(y, W[POST]), g = lin(W[G], n2, I), up = lin(W[U], n2, I), act(I);
      for (int64_t i = 0; i < I; ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * up[i];
      Vec o = y, dn = lin(W[D], act, H);
      for (int64_t i = 0; i < H; ++i) o[i] += dn[i];
      const Vec no = rms(o, W[NORM]);
      outs[k][t] = c.norm_output ? no : o;  // the next step's hidden: norm(o) under norm_output (EAGLE-3.1)
      Vec logits = lin(W[LM], no, K);
      r.logits[k].push_back(logits);
      bool valid = t + k + 2 <= T - 1 && s.loss_mask[t + k + 2] && t2d[s.target_argmax[t + k + 1]];
      if (!valid) continue;
      double m = -1e300, z = 0;
      for (double v : logits) m = std::max(m, v);
      for (double v : logits) z += std::exp(v - m);
      double ce = 0;
      for (int64_t i = 0; i < K; ++i) ce -= tp[(t + k + 1) * K + i] * (logits[i] - m - std::log(z));
      r.loss_sum[k] += ce;
    }
    r.total += sw[k] * r.loss_sum[k];
  }
  return r;
}

}  // namespace aerie::testing
