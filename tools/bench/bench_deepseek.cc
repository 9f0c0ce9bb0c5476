// The DeepSeek-V3-architecture extraction benchmark (issue 12, item 9), on one GPU: a target of a
// config.json's shape (tools/bench/bench_deepseek.sh writes Kimi-K2.5's and DeepSeek-V3's, truncated to
// 4 layers: layer 0 dense, 1-3 MoE) with random weights in the formats the config announces
// (model/weight_source.h random_weights: Kimi-K2.5's INT4 routed experts, DeepSeek-V3's block-FP8
// Linears; none: bf16), bf16 compute. For each --tokens T (one sequence of T tokens per forward):
//   {"bench": "deepseek_block", "block": "moe" | "mla", ...}: one MoE FFN block (layer 1's shape) and one
//     MLA attention block on [T, H] inputs, mean time, TFLOP/s of the active parameters (MoE: top_k +
//     shared experts' 3 H I each and the router per token; MLA: its projections per token plus the causal
//     QK^T over qk_head_dim and PV over v_head_dim), and for the MoE block a profiled run's split
//     (AERIE_PROFILE's categories: grouped GEMMs, dequantization and routing in "other", SwiGLU);
//   {"bench": "deepseek_forward", ...}: the whole target's forward (extraction: aux layers 1, 2, 3, no
//     logits) in tokens/s and its FLOP utilisation against --peak-tflops (active-parameter FLOPs of every
//     layer, embedding gather excluded);
//   {"bench": "deepseek_decode", ...}: one decoding step (with logits) of 1, 16 and 17 new rows against a
//     cache of T positions: MLA's absorbed form (<= kMlaAbsorbedMaxRows rows) against the expanded one.
// Peak memory: the stream-ordered pool's high-water mark (every aerie tensor comes from it).
//
// Usage: bench_deepseek --config DIR [--tokens 2048,8192] [--iters 5] [--warmup 2] [--peak-tflops 989]
//                       [--label NAME] [--no-forward] [--rank-of N [--expert-parallel]]
// --rank-of N: the blocks as rank 0 of a tp group of N computes them (its heads and intermediate slices,
// or with --expert-parallel its E/N whole experts and the pairs routed to them), no all-reduce (one
// GPU), TFLOP/s of the rank's 1/N share; no forward line.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/settings.h"
#include "bench_common.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/target.h"
#include "model/target_config.h"
#include "model/weight_source.h"

namespace aerie {
namespace {

using bench::pool_high_gib;
using bench::SoloComm;
using bench::sync;
using bench::timed;

struct Args {
  std::string config, label;
  std::vector<int64_t> tokens = {2048, 8192};
  int iters = 5, warmup = 2;
  double peak_tflops = 989.0;
  bool forward = true;
  int rank_of = 1;               // > 1: the blocks as rank 0 of a tp group of this size computes them
  bool expert_parallel = false;  // with rank_of: routed experts split by expert (--expert-parallel)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      AERIE_CHECK(i + 1 < argc, "bench_deepseek: " << k << " needs a value");
      return argv[++i];
    };
    if (k == "--config") a.config = next();
    else if (k == "--label") a.label = next();
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--peak-tflops") a.peak_tflops = std::stod(next());
    else if (k == "--no-forward") a.forward = false;
    else if (k == "--rank-of") a.rank_of = std::stoi(next());
    else if (k == "--expert-parallel") a.expert_parallel = true;
    else if (k == "--tokens") {
      a.tokens.clear();
      std::stringstream ss(next());
      for (std::string t; std::getline(ss, t, ',');) a.tokens.push_back(std::stoll(t));
    } else {
      AERIE_THROW("bench_deepseek: unknown option " << k);
    }
  }
  AERIE_CHECK(!a.config.empty(), "bench_deepseek: --config DIR is required");
  return a;
}

/// FLOPs per token of one layer's MLA projections, and of its causal attention over T tokens in total.
double mla_proj_flops(const TargetConfig& c) {
  const double H = c.hidden_size, nh = c.num_attention_heads, dk = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  const double q = c.mla.q_lora_rank > 0 ? H * c.mla.q_lora_rank + c.mla.q_lora_rank * nh * dk : H * nh * dk;
  const double kv = H * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) +
                    c.mla.kv_lora_rank * nh * (c.mla.qk_nope_head_dim + c.mla.v_head_dim);
  return 2.0 * (q + kv + nh * c.mla.v_head_dim * H);
}
double mla_attn_flops(const TargetConfig& c, double T) {
  const double nh = c.num_attention_heads, dk = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim;
  return 2.0 * T * T / 2.0 * nh * (dk + c.mla.v_head_dim);
}
double moe_flops(const TargetConfig& c) {
  const double H = c.hidden_size, I = c.moe.moe_intermediate_size;
  return 2.0 * ((c.moe.num_experts_per_tok + c.moe.n_shared_experts) * 3.0 * H * I + H * c.moe.n_routed_experts);
}

Tensor random_rows(int64_t n, int64_t h, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n * h));
  for (float& x : v) x = d(gen);
  return Tensor::from_vector(v, {n, h}).to(DType::BF16).to_device(Device::CUDA);
}

std::string quant_name(const TargetConfig& c) {
  switch (c.quant.method) {
    case QuantConfig::Method::Int4Group: return "int4 routed experts";
    case QuantConfig::Method::Fp8Block: return "block fp8";
    default: return "bf16";
  }
}

void bench_blocks(const Args& a, const TargetConfig& cfg, Communicator& comm) {
  // Rank 0 of a tp group of rank_of (its heads, intermediate slices or, with expert_parallel, its whole
  // experts), the all-reduce left out (one GPU): the compute of one rank of a real tp group.
  auto src = random_weights(1, 0, a.rank_of, Device::CUDA, DType::BF16, 0.02f, cfg.quant);
  src->set_expert_parallel(a.expert_parallel);
  const int64_t layer = cfg.moe.first_k_dense_replace;  // the first MoE layer
  DecoderLayer L = find_architecture(cfg.model_type, "bench_deepseek").build_layer(*src, cfg, layer);
  src->finish("bench");
  const int64_t H = cfg.hidden_size;
  for (const int64_t T : a.tokens) {
    ForwardBatch b;
    b.B = 1;
    b.n = b.longest = T;
    b.start = {0, T};
    b.p0 = {0};
    b.cache = {nullptr};
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(i);
    b.positions = Tensor::from_vector(pos, {T}).to_device(Device::CUDA);
    OpProfile prof;
    ForwardContext ctx(Device::CUDA, DType::BF16, comm, prof, b);
    const Tensor h = random_rows(T, H, 7);
    Tensor out = Tensor::empty({T, H}, DType::F32, Device::CUDA);
    const double moe_s = timed(a.warmup, a.iters, [&] { L.ffn->forward(ctx, h, out); });
    prof.enable(true);
    prof.count_forward(T);
    L.ffn->forward(ctx, h, out);
    sync();
    const std::string split = prof.summary();
    prof.enable(false);
    const double moe_tf = moe_flops(cfg) / a.rank_of * T / moe_s / 1e12;  // a rank's share of the active FLOPs
    // The block's output against the dequantize-then-cuBLAS path (AERIE_MOE_GEMM=cublas), relative L2:
    // the fused grouped GEMM checked at the real shape (0 when this run is the cuBLAS path itself).
    const char* mode_env = std::getenv("AERIE_MOE_GEMM");
    const std::string mode = mode_env ? mode_env : "auto";
    double check = 0;
    if (mode != "cublas") {
      const std::vector<float> got = out.to_device(Device::CPU).to_float_vector();
      setenv("AERIE_MOE_GEMM", "cublas", 1);
      aerie::reload_settings();
      L.ffn->forward(ctx, h, out);
      if (mode_env) setenv("AERIE_MOE_GEMM", mode.c_str(), 1); else unsetenv("AERIE_MOE_GEMM");
      aerie::reload_settings();
      const std::vector<float> ref = out.to_device(Device::CPU).to_float_vector();
      double num = 0, den = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
        den += static_cast<double>(ref[i]) * ref[i];
      }
      check = den > 0 ? std::sqrt(num / den) : -1;
    }
    std::printf("{\"bench\": \"deepseek_block\", \"label\": \"%s\", \"block\": \"moe\", \"experts\": \"%s\", "
                "\"expert_gemm\": \"%s\", \"n_routed_experts\": %lld, \"rank_of\": %d, \"expert_parallel\": %s, \"tokens\": %lld, \"ms\": %.3f, "
                "\"active_tflops\": %.1f, \"mfu\": %.3f, \"peak_gib\": %.2f, \"rel_l2_vs_cublas_path\": %.2e, "
                "\"profiled_split\": \"%s\"}\n",
                a.label.c_str(), quant_name(cfg).c_str(), mode.c_str(),
                static_cast<long long>(cfg.moe.n_routed_experts), a.rank_of, a.expert_parallel ? "true" : "false",
                static_cast<long long>(T), moe_s * 1e3, moe_tf,
                moe_tf / a.peak_tflops, pool_high_gib(), check, split.c_str());
    std::fflush(stdout);
    const double mla_s = timed(a.warmup, a.iters, [&] { L.attn->forward(ctx, layer, h, out); });
    const double mla_tf = (mla_proj_flops(cfg) * T + mla_attn_flops(cfg, T)) / a.rank_of / mla_s / 1e12;
    OpProfile mprof;
    mprof.enable(true);
    mprof.count_forward(T);
    ForwardContext mctx(Device::CUDA, DType::BF16, comm, mprof, b);
    L.attn->forward(mctx, layer, h, out);
    sync();
    std::printf("{\"bench\": \"deepseek_block\", \"label\": \"%s\", \"block\": \"mla\", \"heads\": %lld, "
                "\"tokens\": %lld, \"ms\": %.3f, \"tflops\": %.1f, \"mfu\": %.3f, \"profiled_split\": \"%s\"}\n",
                a.label.c_str(), static_cast<long long>(cfg.num_attention_heads), static_cast<long long>(T),
                mla_s * 1e3, mla_tf, mla_tf / a.peak_tflops, mprof.summary().c_str());
    std::fflush(stdout);
  }
}

void bench_forward(const Args& a, const TargetConfig& cfg, Communicator& comm) {
  TargetModel model = TargetModel::random(cfg, comm, {Device::CUDA, DType::BF16}, 0);
  const int64_t N = cfg.num_hidden_layers;
  std::vector<int> aux = {1, static_cast<int>(N / 2), static_cast<int>(N - 1)};
  for (const int64_t T : a.tokens) {
    std::mt19937 gen(3);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& x : ids) x = static_cast<int32_t>(gen() % static_cast<uint32_t>(cfg.vocab_size));
    const double s = timed(a.warmup, a.iters, [&] { model.forward(ids, nullptr, aux, false); });
    double flops = 0;
    for (int64_t l = 0; l < N; ++l) {
      flops += mla_proj_flops(cfg) * T + mla_attn_flops(cfg, T);
      flops += (cfg.moe.is_moe_layer(l) ? moe_flops(cfg) : 2.0 * 3.0 * cfg.hidden_size * cfg.intermediate_size) * T;
    }
    std::printf("{\"bench\": \"deepseek_forward\", \"label\": \"%s\", \"experts\": \"%s\", \"layers\": %lld, "
                "\"tokens\": %lld, \"seconds\": %.4f, \"tokens_per_s\": %.0f, \"tflops\": %.1f, \"mfu\": %.3f, "
                "\"peak_gib\": %.2f}\n",
                a.label.c_str(), quant_name(cfg).c_str(), static_cast<long long>(N), static_cast<long long>(T), s,
                T / s, flops / s / 1e12, flops / s / 1e12 / a.peak_tflops, pool_high_gib());
    std::fflush(stdout);
    // Decoding against a cache of T positions: one step of 1 and of 16 new rows (MLA's absorbed form,
    // kMlaAbsorbedMaxRows) and of 17 rows (the expanded form, which expands the whole cache through kv_b).
    KVCache cache = model.make_cache(T + 32);
    model.forward(ids, &cache, {}, false);
    for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{17}}) {
      const std::vector<int32_t> step(ids.begin(), ids.begin() + rows);
      const double ds = timed(a.warmup, a.iters, [&] {
        cache.truncate(T);
        model.forward(step, &cache, {}, true);
      });
      std::printf("{\"bench\": \"deepseek_decode\", \"label\": \"%s\", \"cache\": %lld, \"rows\": %lld, "
                  "\"form\": \"%s\", \"ms\": %.3f}\n",
                  a.label.c_str(), static_cast<long long>(T), static_cast<long long>(rows),
                  rows <= kMlaAbsorbedMaxRows ? "absorbed" : "expanded", ds * 1e3);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace aerie

int main(int argc, char** argv) {
  using namespace aerie;
  try {
    const Args a = parse(argc, argv);
    const TargetConfig cfg = load_target_config(a.config);
    AERIE_CHECK(cfg.mla.enabled() && cfg.moe.n_routed_experts > 0,
                "bench_deepseek: " << a.config << "/config.json is not an MLA + MoE target");
    SoloComm comm;
    bench_blocks(a, cfg, comm);
    bench::sync();
    if (a.forward && a.rank_of == 1) bench_forward(a, cfg, comm);
    return 0;
  } catch (const std::exception& e) {
    std::printf("{\"bench\": \"deepseek\", \"error\": \"%s\"}\n", bench::json_escape(e.what()).c_str());
    return 1;
  }
}
