// Test helpers for the target model: a small random Llama checkpoint in the Hugging Face layout, and a
// naive double-precision reference forward written from transformers' modeling_llama.py (loops, no
// aerie kernels), so that TargetModel is checked against an independent implementation.
#pragma once
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace aerie::testing {

/// Shape of a random test model (GQA 2:1, head_dim != hidden/heads on purpose when head_dim is set).
struct TinyLlama {
  int64_t H = 32, n_heads = 4, n_kv = 2, d = 8, I = 48, V = 64, N = 3;
  bool tied = false;
  DType dtype = DType::BF16;
  double theta = 10000.0;
  uint64_t seed = 7;
};

/// Writes <dir>/config.json and <dir>/model.safetensors of a random Llama (weights ~ U(-0.3, 0.3), norm
/// weights ~ U(0.5, 1.5), stored as `dtype`).
inline void write_tiny_llama(const std::string& dir, const TinyLlama& m) {
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", m.H}, {"intermediate_size", m.I}, {"num_hidden_layers", m.N},
                      {"num_attention_heads", m.n_heads}, {"num_key_value_heads", m.n_kv}, {"head_dim", m.d},
                      {"vocab_size", m.V}, {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-5},
                      {"rope_theta", m.theta}, {"rope_scaling", nullptr}, {"tie_word_embeddings", m.tied},
                      {"bos_token_id", 1}, {"eos_token_id", {2, 3}}, {"torch_dtype", "bfloat16"}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  std::mt19937_64 rng(m.seed);
  auto rand = [&](const Shape& s, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    Tensor t = Tensor::empty(s, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    return m.dtype == DType::F32 ? t : t.to(m.dtype);
  };
  SafetensorsFile f;
  f.tensors["model.embed_tokens.weight"] = rand({m.V, m.H}, -1.0f, 1.0f);
  f.tensors["model.norm.weight"] = rand({m.H}, 0.5f, 1.5f);
  if (!m.tied) f.tensors["lm_head.weight"] = rand({m.V, m.H}, -0.3f, 0.3f);
  for (int64_t l = 0; l < m.N; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    f.tensors[p + "input_layernorm.weight"] = rand({m.H}, 0.5f, 1.5f);
    f.tensors[p + "post_attention_layernorm.weight"] = rand({m.H}, 0.5f, 1.5f);
    f.tensors[p + "self_attn.q_proj.weight"] = rand({m.n_heads * m.d, m.H}, -0.3f, 0.3f);
    f.tensors[p + "self_attn.k_proj.weight"] = rand({m.n_kv * m.d, m.H}, -0.3f, 0.3f);
    f.tensors[p + "self_attn.v_proj.weight"] = rand({m.n_kv * m.d, m.H}, -0.3f, 0.3f);
    f.tensors[p + "self_attn.o_proj.weight"] = rand({m.H, m.n_heads * m.d}, -0.3f, 0.3f);
    f.tensors[p + "mlp.gate_proj.weight"] = rand({m.I, m.H}, -0.3f, 0.3f);
    f.tensors[p + "mlp.up_proj.weight"] = rand({m.I, m.H}, -0.3f, 0.3f);
    f.tensors[p + "mlp.down_proj.weight"] = rand({m.H, m.I}, -0.3f, 0.3f);
  }
  save_safetensors(dir + "/model.safetensors", f);
}

/// Result of the reference forward: residual streams r^0..r^N, z = final_norm(r^N), logits.
struct RefForward {
  std::vector<std::vector<double>> r;  // [N+1][T*H]
  std::vector<double> z;               // [T*H]
  std::vector<double> logits;          // [T*V]
};

/// Naive forward of the checkpoint in `dir` (config fields of TinyLlama `m`, default RoPE) over `ids`
/// at positions 0..T-1, in double precision (weights as stored, widened).
inline RefForward reference_forward(const std::string& dir, const TinyLlama& m, const std::vector<int32_t>& ids,
                                    double eps = 1e-5) {
  SafetensorsFile f = load_safetensors(dir + "/model.safetensors");
  auto W = [&](const std::string& name) { return f.tensors.at(name).to_float_vector(); };
  const int64_t T = static_cast<int64_t>(ids.size()), H = m.H, d = m.d;
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<float>& w) {
    std::vector<double> y(x.size());
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += x[t * H + i] * x[t * H + i];
      double rstd = 1.0 / std::sqrt(ss / H + eps);
      for (int64_t i = 0; i < H; ++i) y[t * H + i] = x[t * H + i] * rstd * w[i];
    }
    return y;
  };
  auto linear = [&](const std::vector<double>& x, const std::vector<float>& w, int64_t in, int64_t out) {
    std::vector<double> y(T * out, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
        y[t * out + o] = s;
      }
    return y;
  };
  // HF rotate_half: dim i pairs with i + d/2, angle = pos * theta^(-2i/d).
  auto rope = [&](std::vector<double>& x, int64_t heads) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          double ang = t * std::pow(m.theta, -2.0 * i / d);
          double* p = &x[(t * heads + h) * d];
          double a = p[i], b = p[i + d / 2];
          p[i] = a * std::cos(ang) - b * std::sin(ang);
          p[i + d / 2] = b * std::cos(ang) + a * std::sin(ang);
        }
  };
  std::vector<float> emb = W("model.embed_tokens.weight");
  RefForward out;
  std::vector<double> r(T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) r[t * H + i] = emb[ids[t] * H + i];
  out.r.push_back(r);
  const int64_t group = m.n_heads / m.n_kv;
  for (int64_t l = 0; l < m.N; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = rmsnorm(r, W(p + "input_layernorm.weight"));
    auto q = linear(h, W(p + "self_attn.q_proj.weight"), H, m.n_heads * d);
    auto k = linear(h, W(p + "self_attn.k_proj.weight"), H, m.n_kv * d);
    auto v = linear(h, W(p + "self_attn.v_proj.weight"), H, m.n_kv * d);
    rope(q, m.n_heads);
    rope(k, m.n_kv);
    std::vector<double> att(T * m.n_heads * d, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hh = 0; hh < m.n_heads; ++hh) {
        int64_t kh = hh / group;
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[(t * m.n_heads + hh) * d + i] * k[(j * m.n_kv + kh) * d + i];
          s[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i) att[(t * m.n_heads + hh) * d + i] += s[j] / sum * v[(j * m.n_kv + kh) * d + i];
      }
    auto o = linear(att, W(p + "self_attn.o_proj.weight"), m.n_heads * d, H);
    for (int64_t i = 0; i < T * H; ++i) r[i] += o[i];
    h = rmsnorm(r, W(p + "post_attention_layernorm.weight"));
    auto g = linear(h, W(p + "mlp.gate_proj.weight"), H, m.I);
    auto u = linear(h, W(p + "mlp.up_proj.weight"), H, m.I);
    for (int64_t i = 0; i < T * m.I; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    auto dn = linear(g, W(p + "mlp.down_proj.weight"), m.I, H);
    for (int64_t i = 0; i < T * H; ++i) r[i] += dn[i];
    out.r.push_back(r);
  }
  out.z = rmsnorm(r, W("model.norm.weight"));
  out.logits = linear(out.z, m.tied ? emb : W("lm_head.weight"), H, m.V);
  return out;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace aerie::testing
