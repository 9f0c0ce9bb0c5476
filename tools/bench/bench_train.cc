// bench_train: one draft training step (train_step: TTT forward + backward + clipped AdamW) on a
// Llama-3.1-8B-shaped target with random weights, on one GPU (issue: the CUDA backend, item 5).
//
// Shapes (as tools/bench/hf_reference.py train): H 4096, 32 heads / 8 kv heads of 128, MLP 14336,
// target vocabulary 128256, draft vocabulary 32000, one sample of --seq tokens (loss mask all ones),
// --ttt-steps TTT steps. Draft weights random on the GPU (F32 masters; linears U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)), norms 1); the frozen embed_tokens [V, H], the target's lm_head [V, H] (for the target
// distribution, made once by make_ttt_sample as aerie train does per sample), the aux hidden states
// f [T, 3H] and the final hidden states z [T, H] random bf16 on the GPU.
//
// Prints JSON lines:
//   {"bench": "train", seq, ttt_steps, precision, step_s, tokens_per_s, peak_gib (the stream-ordered
//    pool's high-water mark: every aerie tensor comes from it), device_used_gib (cudaMemGetInfo), mfu,
//    step_with_target_s / tokens_per_s_with_target / peak_with_target_gib: the step with the sample's
//    target distribution made inside it (make_ttt_sample, as aerie train does per sample; what
//    SpecForge's step, tools/bench/specforge_step.py, also does)}
//   {"bench": "gemm_search", ...}: with AERIE_GEMM_SEARCH=1, one line per GEMM shape whose cuBLASLt
//    algorithm was searched (kernels/cuda/gemm.h GemmSearchRecord), then a "# GEMM algorithm search" sum;
//   {"bench": "train_breakdown", ...}: the target distribution (make_ttt_sample) alone, forward-only and forward+backward time of ttt_forward_backward,
//    the rest of the step (gradient zeroing, compute-copy refresh, clipping + AdamW), and one causal
//    attention forward / backward call of the step-0 shape, for finding what dominates the step.
// MFU: model FLOPs as hf_reference.py counts them (3 x forward; per step the layer and lm_head on T
// tokens, fc once, causal attention over T/2 + S keys per row) / step time / --peak-tflops.
// A run that does not fit prints {"bench": "train", ..., "error": "..."} and exits with status 1.
//
// Usage: bench_train [--seq 2048] [--ttt-steps 7] [--iters 5] [--warmup 2] [--precision bf16|f32]
//                    [--draft-vocab 32000] [--peak-tflops 989] [--no-breakdown] [--mla] [--window 0]
// --mla: the MLA draft (train --draft-attention mla) with DeepSeek-V3 / Kimi-K2 widths (q_lora 1536, kv_lora
// 512, head dims 128 + 64 / 128) and the same 32 heads, H and MLP; no breakdown.
// --window N: the draft's sliding window (train --draft-sliding-window N; 0 none); the MFU counts the keys
// each row attends under it.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "data/vocab.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/cuda/gemm.h"
#include "kernels/gemm.h"
#include "kernels/optim.h"
#include "model/draft.h"
#include "train/trainer.h"

namespace aerie {
namespace {

using bench::device_used_gib;
using bench::pool_high_gib;
using bench::RandomFill;
using bench::SoloComm;
using bench::sync;
using bench::timed;

constexpr int64_t kH = 4096, kHeads = 32, kKv = 8, kHeadDim = 128, kMlp = 14336, kVocab = 128256;

struct Args {
  int64_t seq = 2048, draft_vocab = 32000;
  int ttt_steps = 7, iters = 5, warmup = 2;
  std::string precision = "bf16";
  double peak_tflops = 989.0;
  bool breakdown = true;
  bool mla = false;  // the MLA draft (--draft-attention mla) at DeepSeek-V3's widths
  int64_t window = 0;  // the draft's sliding window (0: none)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      AERIE_CHECK(i + 1 < argc, "bench_train: " << k << " needs a value");
      return argv[++i];
    };
    if (k == "--seq") a.seq = std::stoll(next());
    else if (k == "--ttt-steps") a.ttt_steps = std::stoi(next());
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--precision") a.precision = next();
    else if (k == "--draft-vocab") a.draft_vocab = std::stoll(next());
    else if (k == "--peak-tflops") a.peak_tflops = std::stod(next());
    else if (k == "--no-breakdown") a.breakdown = false;
    else if (k == "--mla") a.mla = true;
    else if (k == "--window") a.window = std::stoll(next());
    else AERIE_THROW("bench_train: unknown argument " << k << " (see the header of tools/bench/bench_train.cc)");
  }
  AERIE_CHECK(a.seq >= 3 && a.ttt_steps >= 1 && a.iters >= 1 && a.warmup >= 0, "bench_train: bad sizes");
  AERIE_CHECK(a.precision == "bf16" || a.precision == "f32", "bench_train: --precision bf16 or f32");
  return a;
}

int run(const Args& a) {
  AERIE_CHECK(cuda::available(), "bench_train: no usable GPU: " << cuda::unavailable_reason());
  cuda::select_device(0);
  const int64_t T = a.seq, K = a.draft_vocab;
  const int S = a.ttt_steps;
  DraftConfig cfg;
  cfg.hidden_size = cfg.target_hidden_size = kH;
  cfg.num_attention_heads = kHeads;
  cfg.num_key_value_heads = kKv;
  cfg.head_dim = kHeadDim;
  cfg.intermediate_size = kMlp;
  cfg.vocab_size = kVocab;
  cfg.draft_vocab_size = K;
  cfg.max_position_embeddings = 131072;
  cfg.rms_norm_eps = 1e-5;
  cfg.rope.theta = 500000.0;
  cfg.rope.type = "llama3";
  cfg.rope.factor = 8.0;
  cfg.rope.low_freq_factor = 1.0;
  cfg.rope.high_freq_factor = 4.0;
  cfg.rope.original_max_position_embeddings = 8192;
  cfg.aux_layers = {2, 16, 29};
  cfg.target_num_hidden_layers = 32;
  cfg.sliding_window = a.window;
  if (a.mla) {  // the MLA draft with DeepSeek-V3's / Kimi-K2's LoRA ranks and head dims, the same heads
    cfg.q_lora_rank = 1536;
    cfg.kv_lora_rank = 512;
    cfg.qk_nope_head_dim = 128;
    cfg.qk_rope_head_dim = 64;
    cfg.v_head_dim = 128;
    cfg.head_dim = 64;
    cfg.num_key_value_heads = kHeads;
  }

  // The draft vocabulary: K ids spread over V.
  const DraftVocab vocab = spread_draft_vocab(kVocab, K);
  const std::vector<int64_t> selected = vocab.selected();

  RandomFill rnd;
  DraftWeights w = DraftWeights::zeros(cfg, Device::CUDA);
  for (auto& [name, t] : w.named()) {
    if (t->ndim() == 2) {
      rnd.fill(*t, static_cast<float>(1.0 / std::sqrt(static_cast<double>(t->dim(1)))));
    } else {
      t->copy_from(Tensor::from_vector(std::vector<float>(static_cast<size_t>(t->numel()), 1.0f), t->shape()));
    }
  }
  Tensor embed = Tensor::empty({kVocab, kH}, DType::BF16, Device::CUDA);
  rnd.fill(embed, 0.02f * 1.7f);  // ~N(0, 0.02^2)-sized (U(-b, b) has std b / sqrt(3))
  std::vector<TTTSample> local;
  Tensor target_lm = Tensor::empty({kVocab, kH}, DType::BF16, Device::CUDA);
  rnd.fill(target_lm, 0.02f * 1.7f);
  Tensor aux = Tensor::empty({T, 3 * kH}, DType::BF16, Device::CUDA);
  rnd.fill(aux, 1.7f);
  Tensor z = Tensor::empty({T, kH}, DType::BF16, Device::CUDA);
  rnd.fill(z, 1.7f);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  uint64_t x = 12345;
  for (auto& id : ids) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(kVocab));
  }
  const std::vector<uint8_t> all(static_cast<size_t>(T), 1);
  local.push_back(make_ttt_sample(ids, all, aux, z, target_lm, selected));
  AdamState opt = AdamState::zeros(cfg, Device::CUDA);
  const DType compute = a.precision == "bf16" ? DType::BF16 : DType::F32;
  StepScratch scratch = StepScratch::zeros(cfg, Device::CUDA, compute);
  SoloComm solo;
  sync();

  StepMetrics m;
  const double step_s = timed(a.warmup, a.iters, [&] {
    m = train_step(cfg, w, opt, embed, local, vocab, S, 1e-4, 0.5, solo, scratch);
  });
  const double peak = pool_high_gib(), used = device_used_gib();
  // The same step with the sample's target distribution made inside it (make_ttt_sample: the target's
  // lm_head over the final hidden states, softmax on the draft vocabulary), as aerie train does per
  // sample and SpecForge's step does with its TargetHead: the line to compare with specforge_step.py.
  const double step_t_s = timed(a.warmup, a.iters, [&] {
    local[0] = make_ttt_sample(ids, all, aux, z, target_lm, selected);
    m = train_step(cfg, w, opt, embed, local, vocab, S, 1e-4, 0.5, solo, scratch);
  });
  const double peak_t = pool_high_gib();
  // The GEMM algorithm searches (AERIE_GEMM_SEARCH=1) of this run: one line per searched shape.
  for (const auto& r : cuda::gemm_search_report())
    std::printf("{\"bench\": \"gemm_search\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"dtypes\": \"%s\", "
                "\"trans_a\": %d, \"trans_b\": %d, \"candidates\": %d, \"chosen\": %d, \"first_ms\": %.4f, "
                "\"best_ms\": %.4f}\n",
                static_cast<long long>(r.m), static_cast<long long>(r.n), static_cast<long long>(r.k), r.dtypes.c_str(),
                r.trans_a, r.trans_b, r.candidates, r.chosen, r.first_ms, r.best_ms);
  if (!gemm_search_summary().empty()) std::printf("# %s\n", gemm_search_summary().c_str());

  // Model FLOPs as hf_reference.py train counts them.
  int64_t params = 0;
  for (auto& [name, t] : w.named()) params += t->numel();
  const double fc = 3.0 * static_cast<double>(kH) * kH, lm = static_cast<double>(K) * kH;
  const double layer = static_cast<double>(params) - fc - lm, Td = static_cast<double>(T);
  // Step-0 keys per row on average: (T + 1) / 2 causal (counted T / 2), fewer under a window.
  const double W = a.window > 0 && a.window < T ? static_cast<double>(a.window) : 0.0;
  const double keys0 = W > 0 ? (W * (W + 1) / 2 + (Td - W) * W) / Td : Td / 2.0;
  const double flops =
      3.0 * (2.0 * fc * Td + S * (2.0 * (layer + lm) * Td +
                                  2.0 * kHeads * (cfg.attn_qk_dim() + cfg.attn_v_dim()) * Td * (keys0 + S)));
  std::printf(
      "{\"bench\": \"train\", \"impl\": \"aerie (%s compute, fp32 master weights%s)\", \"seq\": %lld, \"ttt_steps\": %d, "
      "\"draft_vocab\": %lld, \"precision\": \"%s\", \"step_s\": %.5f, \"tokens_per_s\": %.1f, \"peak_gib\": %.3f, "
      "\"device_used_gib\": %.3f, \"mfu\": %.4f, \"loss\": %.5f, \"grad_norm\": %.4g, \"step_with_target_s\": %.5f, "
      "\"tokens_per_s_with_target\": %.1f, \"peak_with_target_gib\": %.3f, \"sliding_window\": %lld}\n",
      a.precision.c_str(), a.mla ? ", MLA draft" : "", static_cast<long long>(T), S, static_cast<long long>(K), a.precision.c_str(), step_s,
      static_cast<double>(T) / step_s, peak, used, flops / step_s / (a.peak_tflops * 1e12), m.loss(), m.grad_norm,
      step_t_s, static_cast<double>(T) / step_t_s, peak_t, static_cast<long long>(a.window));
  std::fflush(stdout);
  if (!a.breakdown || a.mla) return 0;  // the breakdown's attention call has the Llama draft's shape

  // Breakdown: the TTT pass without / with the backward (on the compute copy the step used), and one
  // causal attention call of the step-0 shape (bf16 or f32 q/k/v as the step has them).
  const DraftWeights& wc = compute == DType::F32 ? w : scratch.compute;
  std::vector<double> sw(static_cast<size_t>(S));
  for (int k = 0; k < S; ++k) sw[static_cast<size_t>(k)] = std::pow(0.8, k) / static_cast<double>(T);
  const int it = std::max(1, a.iters / 2);
  const double fwd_s = timed(1, it, [&] {
    ttt_forward_backward(cfg, wc, embed, local[0], vocab.d2t, vocab.t2d, S, sw, nullptr);
  });
  const double target_s = timed(1, it, [&] { local[0] = make_ttt_sample(ids, all, aux, z, target_lm, selected); });
  const double fwdbwd_s = timed(1, it, [&] {
    for (auto& [n, t] : scratch.grads.named()) t->fill_zero();
    ttt_forward_backward(cfg, wc, embed, local[0], vocab.d2t, vocab.t2d, S, sw, &scratch.grads);
  });
  Tensor q = Tensor::empty({T - 1, kHeads, kHeadDim}, compute, Device::CUDA);
  Tensor k = Tensor::empty({T - 1, kKv, kHeadDim}, compute, Device::CUDA);
  Tensor v = Tensor::empty({T - 1, kKv, kHeadDim}, compute, Device::CUDA);
  Tensor out = Tensor::empty(q.shape(), compute, Device::CUDA), dout = Tensor::empty(q.shape(), compute, Device::CUDA);
  Tensor dq = Tensor::empty(q.shape(), compute, Device::CUDA);
  Tensor dk = Tensor::zeros(k.shape(), DType::F32, Device::CUDA), dv = Tensor::zeros(k.shape(), DType::F32, Device::CUDA);
  Tensor lse = Tensor::empty({T - 1, kHeads}, DType::F32, Device::CUDA);
  for (Tensor* t : {&q, &k, &v, &dout}) rnd.fill(*t, 1.0f);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  const double attn_fwd_s = timed(1, a.iters, [&] { attention_forward(q, k, v, 0, scale, out, &lse, a.window); });
  const double attn_bwd_s =
      timed(1, a.iters, [&] { attention_backward(dout, q, k, v, out, lse, 0, scale, dq, dk, dv, a.window); });
  std::printf(
      "{\"bench\": \"train_breakdown\", \"seq\": %lld, \"ttt_steps\": %d, \"precision\": \"%s\", \"step_s\": %.5f, "
      "\"target_distribution_s\": %.5f, \"ttt_forward_s\": %.5f, \"ttt_forward_backward_s\": %.5f, \"rest_of_step_s\": %.5f, "
      "\"attention_forward_call_s\": %.5f, \"attention_backward_call_s\": %.5f, "
      "\"attention_calls_per_step\": %d, \"attention_share_of_step\": %.3f}\n",
      static_cast<long long>(T), S, a.precision.c_str(), step_s, target_s, fwd_s, fwdbwd_s, step_s - fwdbwd_s, attn_fwd_s,
      attn_bwd_s, S, S * (attn_fwd_s + attn_bwd_s) / step_s);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace aerie

int main(int argc, char** argv) {
  aerie::Args a;
  try {
    a = aerie::parse(argc, argv);
    return aerie::run(a);
  } catch (const std::exception& e) {
    std::printf("{\"bench\": \"train\", \"seq\": %lld, \"ttt_steps\": %d, \"precision\": \"%s\", \"error\": \"%s\"}\n",
                static_cast<long long>(a.seq), a.ttt_steps, a.precision.c_str(), aerie::bench::json_escape(e.what()).c_str());
    return 1;
  }
}
