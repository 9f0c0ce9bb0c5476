#include "train/trainer.h"

// TrainOptions, the metrics of a step and train_step (one data-parallel optimizer step).
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>
#include <string>
#include <utility>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/memory.h"
#include "kernels/optim.h"
#include "train/schedule.h"

namespace aerie {

nlohmann::json TrainOptions::to_json() const {
  return {{"model", model_dir},       {"shards", shards_dir},
          {"prepared", prepared_path},
          {"adam_beta1", adam_beta1}, {"adam_beta2", adam_beta2}, {"weight_decay", weight_decay},
          {"lm_head_init", lm_head_init}, {"loss_normalization", loss_normalization},
          {"vocab", vocab_path},      {"output", output_dir},
          {"steps", steps},           {"epochs", epochs},
          {"batch_size", batch_size}, {"lr", lr},
          {"warmup_ratio", warmup_ratio}, {"max_grad_norm", max_grad_norm},
          {"ttt_steps", ttt_steps},   {"checkpoint_every", checkpoint_every},
          {"keep_checkpoints", keep_checkpoints},
          {"log_every", log_every},   {"seed", seed},
          {"eval_fraction", eval_fraction}, {"heldout_samples", heldout_samples}, {"init_draft", init_draft}, {"device", device},
          {"precision", precision},   {"draft_heads", draft_heads},
          {"draft_kv_heads", draft_kv_heads}, {"draft_head_dim", draft_head_dim},
          {"draft_intermediate", draft_intermediate}, {"draft_attention", draft_attention}, {"draft_norm_before_residual", draft_norm_before_residual},
          {"draft_norm_output", draft_norm_output}, {"draft_norm_before_fc", draft_norm_before_fc},
          {"draft_fc_norm", draft_fc_norm}, {"draft_sliding_window", draft_sliding_window},
          {"draft_sliding_window_auto", draft_sliding_window_auto},
          {"allow_missing_shards", allow_missing_shards},
          {"allow_other_target", allow_other_target}};
}

DraftConfig TrainOptions::apply_draft_shape(DraftConfig cfg) const {
  AERIE_CHECK(!cfg.is_mla() || (draft_heads == 0 && draft_kv_heads == 0 && draft_head_dim == 0),
              "train: --draft-heads, --draft-kv-heads and --draft-head-dim shape the Llama draft's attention; the MLA "
              "draft (--draft-attention mla) takes the target's heads, LoRA ranks and head dims");
  if (draft_heads > 0) cfg.num_attention_heads = draft_heads;
  if (draft_kv_heads > 0) cfg.num_key_value_heads = draft_kv_heads;
  else if (draft_heads > 0) cfg.num_key_value_heads = std::min(cfg.num_key_value_heads, draft_heads);
  if (draft_head_dim > 0) cfg.head_dim = draft_head_dim;
  if (draft_intermediate > 0) cfg.intermediate_size = draft_intermediate;
  cfg.norm_before_residual = draft_norm_before_residual;
  cfg.norm_output = draft_norm_output;
  cfg.norm_before_fc = draft_norm_before_fc;
  AERIE_CHECK(!(draft_fc_norm && draft_norm_before_fc),
              "train: --draft-fc-norm (one norm per aux chunk) and --draft-norm-before-fc (one norm over the "
              "concatenation) are both given; choose one");
  AERIE_CHECK(!(draft_fc_norm && cfg.is_mla()),
              "train: --draft-fc-norm with the MLA draft (vLLM's Eagle3DeepseekV2ForCausalLM has fc(f) without norms)");
  cfg.fc_norm = draft_fc_norm;
  AERIE_CHECK(draft_sliding_window >= 0 && !(cfg.is_mla() && draft_sliding_window > 0),
              "train: --draft-sliding-window " << draft_sliding_window
                                               << " (>= 0; the MLA draft has none: vLLM's Eagle3DeepseekV2ForCausalLM)");
  // A window at least as long as any position never limits anything, but would still cost the draft
  // SGLang (and an int32 window in an engine's kernels could overflow).
  AERIE_CHECK(draft_sliding_window == 0 || cfg.max_position_embeddings <= 0 ||
                  draft_sliding_window < cfg.max_position_embeddings,
              "train: --draft-sliding-window " << draft_sliding_window << " is not below the target's "
                                               << "max_position_embeddings " << cfg.max_position_embeddings
                                               << ", so it would never apply; use 0 for no window");
  cfg.sliding_window = draft_sliding_window;
  AERIE_CHECK(cfg.num_attention_heads % cfg.num_key_value_heads == 0,
              "train: --draft-kv-heads " << cfg.num_key_value_heads << " does not divide the draft's "
                                         << cfg.num_attention_heads << " heads (--draft-heads)");
  AERIE_CHECK(cfg.head_dim % 2 == 0, "train: --draft-head-dim " << cfg.head_dim << " must be even (RoPE pairs)");
  check_draft_fits_memory(cfg);
  return cfg;
}

void TrainOptions::check_draft_fits_memory(const DraftConfig& cfg) const {
  // 16 bytes a parameter: the fp32 weights, their gradients and the two AdamW moments (a bf16 compute copy
  // and the activations come on top), checked before any of them is allocated.
  const double params = cfg.num_parameters(), need = 16 * params;
  const int64_t have = host_memory_bytes();
  if (have <= 0 || need <= static_cast<double>(have)) return;
  auto given = [](int64_t option, const char* name) {
    return option > 0 ? std::string(" (") + name + ")" : std::string(" (the target's)");
  };
  std::ostringstream shape;
  shape << cfg.num_attention_heads << " heads" << given(draft_heads, "--draft-heads") << ", "
        << cfg.num_key_value_heads << " kv heads" << given(draft_kv_heads, "--draft-kv-heads") << ", head dim "
        << cfg.head_dim << given(draft_head_dim, "--draft-head-dim") << ", intermediate " << cfg.intermediate_size
        << given(draft_intermediate, "--draft-intermediate") << ", hidden " << cfg.hidden_size << ", draft vocab "
        << cfg.draft_vocab_size;
  AERIE_THROW("train: the draft of " << shape.str() << " has " << params << " parameters: training it needs "
                                     << gib_text(need) << " (16 bytes a parameter: fp32 weights, gradients and two "
                                     << "AdamW moments), more than the " << gib_text(static_cast<double>(have))
                                     << " of memory this machine has available; give the draft smaller sizes");
}

AutoWindow auto_sliding_window(const std::vector<int64_t>& lengths, int64_t max_position_embeddings) {
  AERIE_CHECK(!lengths.empty(), "train: --draft-sliding-window auto: no training sample to take a window from");
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  AERIE_CHECK(sorted.front() >= 1, "train: --draft-sliding-window auto: a training sample of "
                                       << sorted.front() << " tokens");
  AutoWindow w;
  w.count = static_cast<int64_t>(sorted.size());
  // Nearest rank: the ceil(0.9 n)-th smallest, in integers (no rounding of 0.9 n).
  const int64_t rank = (9 * w.count + 9) / 10;
  w.p90 = sorted[static_cast<size_t>(rank - 1)];
  w.longest = sorted.back();
  double sum = 0;
  for (int64_t v : sorted) sum += static_cast<double>(v);
  w.mean = sum / static_cast<double>(w.count);
  int64_t window = 1;
  while (window < w.p90) window *= 2;
  w.window = max_position_embeddings > 0 && window >= max_position_embeddings ? 0 : window;
  return w;
}

std::vector<std::string> TrainOptions::adopt_checkpoint_defaults(const nlohmann::json& c) {
  std::vector<std::string> changed;
  if (!draft_norm_before_residual_given) {
    const bool theirs = c.value("draft_norm_before_residual", false);
    if (theirs != draft_norm_before_residual)
      changed.push_back(std::string("norm_before_residual ") + (theirs ? "on" : "off") +
                        " as the checkpoint was trained (--draft-norm-before-residual not given)");
    draft_norm_before_residual = theirs;
  }
  // A resume given the number an auto run picked is the same draft: its checkpoints keep saying where the
  // window came from.
  if (!draft_sliding_window_auto && c.value("draft_sliding_window_auto", false) && c.contains("draft_sliding_window") &&
      c["draft_sliding_window"] == nlohmann::json(draft_sliding_window))
    draft_sliding_window_auto = true;
  if (!adam_beta2_given) {
    const double theirs =
        c.contains("adam_beta2") && c["adam_beta2"].is_number() ? c["adam_beta2"].get<double>() : kAdamBeta2Unrecorded;
    if (theirs != adam_beta2) {
      std::ostringstream line;
      line << "AdamW beta2 " << theirs << " as the checkpoint was trained (--adam-beta2 not given)";
      changed.push_back(line.str());
    }
    adam_beta2 = theirs;
  }
  return changed;
}

void TrainOptions::check_resumable(const nlohmann::json& c) const {
  const nlohmann::json mine = to_json();
  // Every option that differs, so that one rerun can fix them all.
  std::vector<std::string> diffs;
  const auto option = [](std::string key) {
    std::replace(key.begin(), key.end(), '_', '-');
    return "--" + key;
  };
  const auto differs = [&](const std::string& key, const nlohmann::json& theirs) {
    if (theirs != mine[key])
      diffs.push_back(option(key) + " is " + mine[key].dump() + " but the checkpoint was trained with " + theirs.dump());
  };
  for (const char* key : {"steps", "epochs", "batch_size", "lr", "warmup_ratio", "max_grad_norm", "ttt_steps", "seed",
                          "eval_fraction"}) {
    AERIE_CHECK(c.contains(key), "resume: the checkpoint's options lack '" << key << "'");
    differs(key, c[key]);
  }
  // Offline (shards) against streaming (--prepared): the two modes number the samples alike only when no
  // shard left a sample out, so a checkpoint resumes in its own mode only.
  const std::string their_prepared = c.value("prepared", std::string());
  AERIE_CHECK(their_prepared.empty() == prepared_path.empty(),
              "resume: the checkpoint was trained "
                  << (their_prepared.empty() ? "offline on --shards " + c.value("shards", std::string("?"))
                                             : "streaming from --prepared " + their_prepared)
                  << ", this run " << (prepared_path.empty() ? "reads --shards " + shards_dir
                                                             : "streams from --prepared " + prepared_path)
                  << ": a run resumes in the mode it started in; rerun it that way or use another --output");
  // The recipe (checkpoints older than these options have none: aerie's defaults then, beta2 0.95).
  const nlohmann::json recipe_defaults = {{"adam_beta1", 0.9},
                                          {"adam_beta2", kAdamBeta2Unrecorded},
                                          {"weight_decay", 0.0},
                                          {"lm_head_init", "target"},
                                          {"loss_normalization", "valid"}};
  for (const auto& [key, dflt] : recipe_defaults.items()) differs(key, c.contains(key) ? c[key] : dflt);
  // The draft shape and window (checkpoints older than these options have none: the target's shape, all 0;
  // no window).
  for (const char* key :
       {"draft_heads", "draft_kv_heads", "draft_head_dim", "draft_intermediate"})
    differs(key, c.contains(key) ? c[key] : nlohmann::json(0));
  {  // The window, as given or as auto picked it (the same samples pick the same window).
    const nlohmann::json theirs = c.contains("draft_sliding_window") ? c["draft_sliding_window"] : nlohmann::json(0);
    const bool their_auto = c.value("draft_sliding_window_auto", false);
    const auto window = [](const nlohmann::json& w, bool automatic) {
      if (!automatic) return w.dump();
      return w == nlohmann::json(0) ? std::string("auto (no window)") : "auto (" + w.dump() + " keys)";
    };
    if (theirs != mine["draft_sliding_window"])
      diffs.push_back("--draft-sliding-window is " + window(mine["draft_sliding_window"], draft_sliding_window_auto) +
                      " but the checkpoint was trained with " + window(theirs, their_auto) +
                      (draft_sliding_window_auto && their_auto
                           ? " (auto picks from the training samples: these are not the samples it was trained on, "
                             "or another --eval-fraction holds out others)"
                           : ""));
  }
  {  // The draft's attention (older checkpoints have none: the Llama draft).
    const std::string theirs = c.value("draft_attention", std::string("llama"));
    if (theirs != draft_attention)
      diffs.push_back("--draft-attention is " + draft_attention + " but the checkpoint was trained with " + theirs);
  }
  // The EAGLE-3.1 switches (older checkpoints have none: the original layout and chain, off).
  for (const auto& [key, on] : {std::pair<const char*, bool>{"draft_norm_before_residual", draft_norm_before_residual},
                                {"draft_norm_output", draft_norm_output},
                                {"draft_norm_before_fc", draft_norm_before_fc},
                                {"draft_fc_norm", draft_fc_norm}}) {
    const bool theirs = c.value(key, false);
    if (theirs != on)
      diffs.push_back(option(key) + " is " + (on ? "on" : "off") + " but the checkpoint was trained with it " +
                      (theirs ? "on" : "off"));
  }
  if (diffs.empty()) return;
  std::ostringstream why;
  why << "resume: ";
  for (size_t i = 0; i < diffs.size(); ++i) why << (i ? "; " : "") << diffs[i];
  why << (diffs.size() > 1 ? " (" + std::to_string(diffs.size()) + " options differ)" : std::string())
      << "; rerun with the same options (the same --config, if the run had one), or use another --output (with "
         "--init-draft pointing at this run to start from its weights)";
  AERIE_THROW(why.str());
}

AdamState AdamState::zeros(const DraftConfig& cfg, Device device) {
  return AdamState{DraftWeights::zeros(cfg, device), DraftWeights::zeros(cfg, device), 0};
}

StepScratch StepScratch::zeros(const DraftConfig& cfg, Device device, DType compute) {
  AERIE_CHECK(compute == DType::F32 || compute == DType::BF16,
              "StepScratch: compute dtype must be F32 or BF16, got " << dtype_name(compute));
  StepScratch s;
  s.grads = DraftWeights::zeros(cfg, device);
  // s.sample is made by the first train_step with more than one local sample (a 8B-sized draft's
  // gradient is 1.7 GB that a rank of one sample per step never needs).
  s.compute_dtype = compute;
  if (compute != DType::F32) s.compute = s.grads.compute_copy(compute);  // buffers; refreshed by train_step
  return s;
}

StepScratch StepScratch::zeros(const DraftConfig& cfg, Device device) {
  return zeros(cfg, device, resolve_compute_dtype("auto", device));
}

DType resolve_compute_dtype(const std::string& precision, Device device) {
  if (precision == "f32") return DType::F32;
  if (precision == "bf16") return DType::BF16;
  AERIE_CHECK(precision == "auto", "train: --precision must be auto, bf16 or f32, got '" << precision << "'");
  return device == Device::CUDA ? DType::BF16 : DType::F32;
}

Device resolve_train_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  if (name == "auto") return cuda::available() ? Device::CUDA : Device::CPU;
  AERIE_CHECK(name == "cuda", "train: --device must be cpu, cuda or auto, got '" << name << "'");
  AERIE_CHECK(cuda::available(), "train: --device cuda but no GPU is usable: " << cuda::unavailable_reason());
  return Device::CUDA;
}

void StepMetrics::add(const StepMetrics& o) {
  if (loss_sum.empty()) {
    loss_sum.assign(o.loss_sum.size(), 0.0);
    valid.assign(o.valid.size(), 0);
    correct.assign(o.correct.size(), 0);
    acc_rows.assign(o.acc_rows.size(), 0);
  }
  for (size_t k = 0; k < o.loss_sum.size(); ++k) {
    loss_sum[k] += o.loss_sum[k];
    valid[k] += o.valid[k];
    correct[k] += o.correct[k];
    acc_rows[k] += o.acc_rows[k];
  }
  tokens += o.tokens;
  grad_norm = o.grad_norm;
}

std::vector<double> StepMetrics::loss_k() const {
  std::vector<double> l(loss_sum.size());
  for (size_t k = 0; k < l.size(); ++k) l[k] = loss_sum[k] / static_cast<double>(std::max<int64_t>(1, valid[k]));
  return l;
}

double StepMetrics::loss() const {
  double l = 0, w = 1;
  for (double lk : loss_k()) {
    l += w * lk;
    w *= 0.8;
  }
  return l;
}

std::vector<double> StepMetrics::acc_k() const {
  std::vector<double> a(correct.size());
  for (size_t k = 0; k < a.size(); ++k)
    a[k] = acc_rows[k] > 0 ? static_cast<double>(correct[k]) / static_cast<double>(acc_rows[k]) : 0.0;
  return a;
}

double StepMetrics::tau_sim() const {
  double tau = 1, prod = 1;
  for (double a : acc_k()) {
    prod *= a;
    tau += prod;
  }
  return tau;
}

std::vector<double> ttt_step_weights(const std::vector<int64_t>& valid, int64_t rows, int S, const StepRecipe& recipe) {
  AERIE_CHECK(static_cast<int>(valid.size()) == S, "ttt_step_weights: " << valid.size() << " counts for " << S << " steps");
  std::vector<double> w(static_cast<size_t>(S));
  for (int k = 0; k < S; ++k)
    w[static_cast<size_t>(k)] =
        std::pow(0.8, k) /
        static_cast<double>(std::max<int64_t>(1, recipe.normalize_by_all_rows ? rows : valid[static_cast<size_t>(k)]));
  return w;
}

StepMetrics train_step(const DraftConfig& cfg, DraftWeights& w, AdamState& opt, const Tensor& embed_tokens,
                       const std::vector<TTTSample>& local, const DraftVocab& vocab, int ttt_steps, double lr,
                       double max_grad_norm, Communicator& dp, StepScratch& scratch, Communicator* grad_comm,
                       const StepRecipe& recipe) {
  const int S = ttt_steps;
  AERIE_CHECK(S >= 1, "train_step: ttt_steps must be >= 1, got " << S);
  // 1. The loss denominators: valid_k (and the rows) summed over the whole global batch.
  Tensor valid = Tensor::zeros({S + 1}, DType::I64);
  for (const TTTSample& s : local) {
    std::vector<int64_t> v = ttt_valid_counts(s, vocab.t2d, S);
    for (int k = 0; k < S; ++k) valid.data<int64_t>()[k] += v[static_cast<size_t>(k)];
    valid.data<int64_t>()[S] += static_cast<int64_t>(s.ids.size());
  }
  dp.all_reduce_sum(valid);
  const std::vector<double> step_weight =
      ttt_step_weights(std::vector<int64_t>(valid.data<int64_t>(), valid.data<int64_t>() + S), valid.data<int64_t>()[S],
                       S, recipe);

  // 2. Gradients: each sample's alone, added in sample order, then summed over dp.
  if (local.size() > 1 && !scratch.sample.fc.defined()) scratch.sample = DraftWeights::zeros(cfg, w.device());
  auto grads = scratch.grads.named();
  auto sample = scratch.sample.named();
  for (auto& [n, t] : grads) t->fill_zero();
  // The weights the forward/backward reads: w itself, or its bf16 compute copy made current.
  const DraftWeights* wc = &w;
  if (scratch.compute_dtype != DType::F32) {
    AERIE_CHECK(scratch.compute.fc.defined() && scratch.compute.fc.device() == w.device(),
                "train_step: the scratch's compute copy is missing or on another device than the weights");
    w.refresh_compute_copy(scratch.compute);
    wc = &scratch.compute;
  }
  // Overlapped gradient all-reduce (NCCL on a side stream) during the last local sample's backward.
  Communicator& gc = grad_comm ? *grad_comm : dp;
  auto* nccl = dynamic_cast<NcclCommunicator*>(&gc);
  const bool overlap = nccl != nullptr && gc.size() > 1 && w.device() == Device::CUDA;
  cuda::Stream comm_stream = nullptr;
  if (overlap) {
    if (!scratch.comm_stream) {
      cuda::Stream cs = cuda::create_stream();
      scratch.comm_stream = std::shared_ptr<void>(cs, [](void* p) { cuda::destroy_stream(p); });
    }
    comm_stream = scratch.comm_stream.get();
  }
  size_t launched = 0;  // all-reduces queued, in ttt_gradient_ready_order()
  const std::vector<int>& ready_order = ttt_gradient_ready_order(cfg);
  std::vector<double> loss_sum(static_cast<size_t>(S), 0.0);
  Tensor counts = Tensor::zeros({2 * S + 1}, DType::I64);  // correct [S], acc_rows [S], tokens
  int64_t* c = counts.data<int64_t>();
  for (size_t i = 0; i < local.size(); ++i) {
    // The first sample writes straight into the zeroed sum (0 + g == g exactly).
    DraftWeights* into = i == 0 ? &scratch.grads : &scratch.sample;
    if (i > 0)
      for (auto& [n, t] : sample) t->fill_zero();
    const bool last_overlapped = overlap && i + 1 == local.size();
    GradReadyFn on_ready;
    if (last_overlapped)
      on_ready = [&, i](int j) {
        AERIE_CHECK(launched < ready_order.size() && ready_order[launched] == j,
                    "train_step: gradient " << j << " reported final out of ttt_gradient_ready_order()");
        if (i > 0) add_inplace(*grads[static_cast<size_t>(j)].second, *sample[static_cast<size_t>(j)].second);
        nccl->all_reduce_sum_async(*grads[static_cast<size_t>(j)].second, comm_stream);
        ++launched;
      };
    TTTStats st = ttt_forward_backward(cfg, *wc, embed_tokens, local[i], vocab.d2t, vocab.t2d, S, step_weight, into,
                                       nullptr, on_ready);
    if (i > 0 && !last_overlapped)
      for (size_t j = 0; j < grads.size(); ++j) add_inplace(*grads[j].second, *sample[j].second);
    for (int k = 0; k < S; ++k) {
      loss_sum[static_cast<size_t>(k)] += st.loss_sum[static_cast<size_t>(k)];
      c[k] += st.correct[static_cast<size_t>(k)];
      c[S + k] += st.acc_rows[static_cast<size_t>(k)];
    }
    c[2 * S] += static_cast<int64_t>(local[i].ids.size());
  }
  if (overlap) {
    // Every gradient queued (a rank without samples queues them all now, in the same order), then waited for.
    for (; launched < ready_order.size(); ++launched)
      nccl->all_reduce_sum_async(*grads[static_cast<size_t>(ready_order[launched])].second, comm_stream);
    cuda::synchronize(comm_stream);
  } else if (gc.size() > 1) {
    for (auto& [n, t] : grads) gc.all_reduce_sum(*t);
  }

  // 3. Clipping and AdamW in one call (the grads are scaled as they are read, not in place).
  StepMetrics m;
  AdamWParams p;  // eps 1e-8
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(recipe.adam_beta1);
  p.beta2 = static_cast<float>(recipe.adam_beta2);
  p.weight_decay = static_cast<float>(recipe.weight_decay);
  opt.step += 1;
  auto ws = w.named();
  auto ms = opt.m.named();
  auto vs = opt.v.named();
  std::vector<Tensor*> pw, pm, pv;
  std::vector<const Tensor*> pg;
  for (size_t j = 0; j < ws.size(); ++j) {
    pw.push_back(ws[j].second);
    pg.push_back(grads[j].second);
    pm.push_back(ms[j].second);
    pv.push_back(vs[j].second);
  }
  m.grad_norm = adamw_step_clipped(pw, pg, pm, pv, p, opt.step, max_grad_norm);

  // Metrics over the global batch (the loss sums in fp32: only logged).
  dp.all_reduce_sum(counts);
  Tensor ls = Tensor::empty({S}, DType::F32);
  for (int k = 0; k < S; ++k) ls.data<float>()[k] = static_cast<float>(loss_sum[static_cast<size_t>(k)]);
  dp.all_reduce_sum(ls);
  for (int k = 0; k < S; ++k) {
    m.loss_sum.push_back(ls.data<float>()[k]);
    m.valid.push_back(valid.data<int64_t>()[k]);
    m.correct.push_back(c[k]);
    m.acc_rows.push_back(c[S + k]);
  }
  m.tokens = c[2 * S];
  return m;
}

}  // namespace aerie
