// Training-time test (eagle3.md section 4): S unrolled steps of the draft on one sample, the loss, the
// acc_k metrics and the backward through all steps (the hidden passed from step k to k+1 is not
// detached, as in SpecForge's OnlineEagle3Model/OfflineEagle3Model: hidden_states = hidden_states_out).
//
// Rows: step k computes rows t = 0 .. n_k - 1, n_k = T - 1 - k (those whose input token x_{t+k+1}
// exists). Row t of step k reads row t of step k-1 (its hidden and, through the diagonal, its own
// keys of steps 1..k) and the step-0 keys of rows 0..t; since n_k < n_{k-1}, every row it reads was
// computed. The skipped rows t >= n_k would be dead: never valid nor counted by acc_k (both need
// t + k + 2 <= T - 1, i.e. t <= n_k - 2), never read by a later step (n_{k+1} < n_k), and their
// step-0 keys are attended only by rows >= t, themselves skipped or dead.
//
// Devices: everything runs where the weights live (w.fc's device: CPU or CUDA) through kernel ops. The
// sample's host parts (ids, the per-row loss weights, positions) and, when they are elsewhere, its
// aux_hidden / target_probs are copied there once per call; per step only the argmax of the draft logits
// (for acc_k) and the loss come back to the host.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "model/draft.h"
#include "model/draft_layer.h"

namespace aerie {

using draft_detail::LayerActs;
using draft_detail::LayerCtx;

namespace {

void check_inputs(const DraftConfig& cfg, const DraftWeights& w, const TTTSample& s, const std::vector<int64_t>& d2t,
                  const std::vector<uint8_t>& t2d, int num_steps, const std::vector<double>& step_weight) {
  const int64_t T = static_cast<int64_t>(s.ids.size()), K = cfg.draft_vocab_size;
  AERIE_CHECK(num_steps >= 1, "ttt: num_steps " << num_steps << " must be >= 1");
  AERIE_CHECK(static_cast<int>(step_weight.size()) >= num_steps,
              "ttt: " << step_weight.size() << " step weights for " << num_steps << " steps");
  AERIE_CHECK(static_cast<int64_t>(s.loss_mask.size()) == T && static_cast<int64_t>(s.target_argmax.size()) == T,
              "ttt: sample has " << T << " ids, " << s.loss_mask.size() << " mask entries, " << s.target_argmax.size()
                                 << " target argmaxes");
  s.aux_hidden.check_shape({T, 3 * cfg.target_hidden_size}, "ttt: aux_hidden");
  AERIE_CHECK(s.aux_hidden.dtype() == DType::F32 || s.aux_hidden.dtype() == DType::BF16,
              "ttt: aux_hidden must be F32 or BF16, got " << dtype_name(s.aux_hidden.dtype()));
  s.target_probs.check_shape({T, K}, "ttt: target_probs");
  AERIE_CHECK(static_cast<int64_t>(d2t.size()) == K, "ttt: d2t has " << d2t.size() << " entries, K = " << K);
  AERIE_CHECK(static_cast<int64_t>(t2d.size()) == cfg.vocab_size,
              "ttt: t2d has " << t2d.size() << " entries, V = " << cfg.vocab_size);
  w.lm_head.check_shape({K, cfg.hidden_size}, "ttt: lm_head");
  w.fc.check_shape({cfg.hidden_size, 3 * cfg.target_hidden_size}, "ttt: fc");
  for (int64_t t = 0; t < T; ++t)
    AERIE_CHECK(s.target_argmax[t] >= 0 && s.target_argmax[t] < cfg.vocab_size,
                "ttt: target_argmax[" << t << "] = " << s.target_argmax[t] << " outside [0, " << cfg.vocab_size << ")");
}

constexpr size_t kAll = std::numeric_limits<size_t>::max();  // mark_ready(kAll): every parameter left

}  // namespace

std::vector<int> ttt_gradient_ready_order(const DraftConfig& cfg) {
  // lm_head: all its terms come from the forward (layer_head_backward per step); then the step-0
  // layer_out_backward finishes norm and the MLP and o_proj, the step-0 layer_qkv_backward the attention's
  // input projections (q/k/v_proj, or the MLA weights) and the two input norms, and the last GEMM fc;
  // under norm_before_fc input_norm's backward follows fc's.
  const std::vector<std::string> named = DraftWeights::names(cfg);
  auto index = [&](const std::string& name) {
    for (size_t i = 0; i < named.size(); ++i)
      if (named[i] == name) return static_cast<int>(i);
    AERIE_THROW("ttt_gradient_ready_order: no parameter " << name);
  };
  std::vector<int> order;
  for (const char* n : {"lm_head.weight", "norm.weight", "midlayer.mlp.down_proj.weight", "midlayer.mlp.gate_proj.weight",
                        "midlayer.mlp.up_proj.weight", "midlayer.post_attention_layernorm.weight",
                        "midlayer.self_attn.o_proj.weight"})
    order.push_back(index(n));
  for (size_t i = 0; i < named.size(); ++i)  // the attention's input projections (and MLA's latent norms)
    if (named[i].rfind("midlayer.self_attn.", 0) == 0 && named[i] != "midlayer.self_attn.o_proj.weight")
      order.push_back(static_cast<int>(i));
  for (const char* n : {"midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "fc.weight"})
    order.push_back(index(n));
  if (cfg.norm_before_fc) order.push_back(index("input_norm.weight"));
  if (cfg.fc_norm)
    for (const char* n : {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}) order.push_back(index(n));
  return order;
}

namespace {
// Step k's acc_k and valid-row counts into st from its rows' draft argmaxes `am` (draft ids; row t's target is
// target_probs[t+k+1]): row t is valid iff t+k+2 <= T-1, m_{t+k+2} = 1 and argmax l_{t+k+1} is selected
// (loss_w[t+k+1]); acc rows: t+k+2 <= T-1 and m_{t+k+2} = 1, correct when am[t] + d2t[am[t]] is the argmax.
void count_step_metrics(const TTTSample& s, int k, const std::vector<int64_t>& am, const std::vector<int64_t>& d2t,
                        const std::vector<float>& loss_w, TTTStats& st) {
  const int64_t T = static_cast<int64_t>(s.ids.size()), n = static_cast<int64_t>(am.size());
  for (int64_t t = 0; t < n; ++t) {
    if (t + k + 2 > T - 1 || !s.loss_mask[t + k + 2]) continue;
    const int64_t want = s.target_argmax[t + k + 1];
    ++st.acc_rows[k];
    if (am[t] + d2t[am[t]] == want) ++st.correct[k];
    if (loss_w[t + k + 1] != 0.0f) ++st.valid[k];
  }
}
}  // namespace

TTTStats ttt_forward_backward(const DraftConfig& cfg, const DraftWeights& w, const Tensor& embed_tokens,
                              const TTTSample& s, const std::vector<int64_t>& d2t, const std::vector<uint8_t>& t2d,
                              int num_steps, const std::vector<double>& step_weight, DraftWeights* grads,
                              std::vector<Tensor>* step_logits, const GradReadyFn& on_grad_ready) {
  check_inputs(cfg, w, s, d2t, t2d, num_steps, step_weight);
  if (grads)
    for (auto& [name, t] : grads->named())
      AERIE_CHECK(t->dtype() == DType::F32 && t->device() == w.fc.device(),
                  "ttt: gradient " << name << " must be F32 on the weights' device, got " << dtype_name(t->dtype())
                                   << " on " << device_name(t->device()));
  // Tells the caller that parameters' gradients are final, in ttt_gradient_ready_order().
  size_t ready = 0;
  const std::vector<int> order = grads && on_grad_ready ? ttt_gradient_ready_order(cfg) : std::vector<int>();
  auto mark_ready = [&](size_t upto) {
    for (; ready < upto && ready < order.size(); ++ready) on_grad_ready(order[ready]);
  };
  // Entries of `order` final after the step-0 attention backward: all but fc (and input_norm).
  const size_t after_qkv = order.size() - (cfg.norm_before_fc ? 2 : cfg.fc_norm ? 4 : 1);
  const int64_t T = static_cast<int64_t>(s.ids.size()), K = cfg.draft_vocab_size;
  const int S = num_steps;
  TTTStats st;
  st.loss_sum.assign(S, 0.0);
  st.valid.assign(S, 0);
  st.correct.assign(S, 0);
  st.acc_rows.assign(S, 0);
  const Device dev = w.fc.device();
  if (step_logits) step_logits->assign(S, Tensor::zeros({0, K}, DType::F32, dev));
  auto rows = [&](int k) { return std::max<int64_t>(0, T - 1 - k); };  // n_k
  int steps = 0;                                                      // steps with at least one row
  while (steps < S && rows(steps) > 0) ++steps;
  if (steps == 0) {
    mark_ready(kAll);  // no term at all
    return st;
  }

  LayerCtx ctx(cfg, w, embed_tokens);
  // The sample on the weights' device, once: ids, positions 0..T-1, f, the targets and the loss weights.
  // loss_w[p] = 1 iff position p's target counts: p+1 <= T-1, m_{p+1} = 1 and argmax l_p is selected
  // (row t of step k reads p = t+k+1).
  std::vector<float> loss_w(static_cast<size_t>(T), 0.0f);
  for (int64_t p = 0; p + 1 <= T - 1; ++p)
    if (s.loss_mask[p + 1] && t2d[s.target_argmax[p]]) loss_w[p] = 1.0f;
  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t p = 0; p < T; ++p) positions[p] = static_cast<int32_t>(p);
  auto on_dev = [&](const Tensor& t) { return t.device() == dev ? t : t.to_device(dev); };
  const Tensor ids = on_dev(Tensor::from_vector(s.ids, {T}));
  const Tensor weights = on_dev(Tensor::from_vector(loss_w, {T}));
  const Tensor probs = on_dev(s.target_probs);
  // f in the compute dtype (the fc GEMM's input): converted once per call when the sample's differs.
  Tensor aux = on_dev(s.aux_hidden);
  if (aux.dtype() != ctx.compute) {
    Tensor c = Tensor::empty(aux.shape(), ctx.compute, dev);
    convert(aux, c);
    aux = c;
  }
  ctx.arange = on_dev(Tensor::from_vector(positions, {T}));
  std::vector<LayerActs> acts(steps);
  std::vector<Tensor> dno(steps);  // gradient w.r.t. norm(o) of each step ([n_k, H]; the [n_k, K] ones never outlive their step)

  // g = fc(f), or fc(input_norm(f)) under norm_before_fc, on the rows that step 0 computes.
  const int64_t n0 = rows(0);
  draft_detail::FcActs fc_acts;
  Tensor g = draft_detail::layer_fc(ctx, aux.slice(0, n0), grads ? &fc_acts : nullptr);

  for (int k = 0; k < steps; ++k) {
    const int64_t n = rows(k);
    LayerActs& a = acts[k];
    const Tensor h = k == 0 ? g : draft_detail::next_hidden(acts[k - 1]).slice(0, n);
    draft_detail::layer_qkv(ctx, ids.slice(k + 1, k + 1 + n), h, k, a);  // u_{t,k} = x_{t+k+1}, position t+k
    std::vector<const Tensor*> dk, dv;
    for (int j = 1; j <= k; ++j) {
      dk.push_back(&acts[j].k);
      dv.push_back(&acts[j].v);
    }
    a.attn = Tensor::empty({n, cfg.num_attention_heads, cfg.attn_qk_dim()}, ctx.compute, dev);
    a.lse = Tensor::empty({n, cfg.num_attention_heads}, DType::F32, dev);
    draft_detail::ttt_attention_forward(a.q, acts[0].k.slice(0, n), acts[0].v.slice(0, n), dk, dv, 0, ctx.scale,
                                        cfg.sliding_window, a.attn, a.lse);
    draft_detail::layer_out(ctx, a);

    // Loss, acc_k's argmaxes and the lm_head's gradient in one pass over the logits: dlogits is the
    // step-weighted gradient in the compute dtype (the GEMMs' input), in place of the F32 logits under
    // F32 compute unless the caller wants the logits back.
    const Tensor weight = weights.slice(k + 1, k + 1 + n);
    Tensor target = probs.slice(k + 1, k + 1 + n);
    Tensor dlogits = !grads                                          ? Tensor()
                     : (step_logits || ctx.compute != DType::F32) ? Tensor::empty({n, K}, ctx.compute, dev)
                                                                     : a.logits;
    std::vector<int64_t> am;
    st.loss_sum[k] = soft_cross_entropy(a.logits, target, weight, grads ? &dlogits : nullptr,
                                        static_cast<float>(step_weight[k]), &am);
    count_step_metrics(s, k, am, d2t, loss_w, st);
    if (step_logits) (*step_logits)[k] = a.logits;
    a.logits = Tensor();  // [n, K]: dropped as soon as possible
    if (grads) {
      // lm_head's backward needs nothing from later steps: do it now, keep only dno [n, H].
      dno[k] = draft_detail::layer_head_backward(ctx, a, dlogits, *grads);
      a.no = Tensor();
    }
  }
  if (!grads) return st;
  mark_ready(1);  // lm_head: every term came from the forward loop

  // Backward, last step first. dO: gradient into o of step k from step k+1's hidden input.
  const int64_t nkv = cfg.attn_kv_heads(), d = cfg.attn_qk_dim();
  Tensor dk0 = Tensor::zeros({n0, nkv, d}, DType::F32, dev), dv0 = Tensor::zeros({n0, nkv, d}, DType::F32, dev);
  std::vector<Tensor> ddk(steps), ddv(steps);  // diagonal keys/values of steps >= 1: accumulated over later steps
  for (int j = 1; j < steps; ++j) {
    ddk[j] = Tensor::zeros({rows(j), nkv, d}, DType::F32, dev);
    ddv[j] = Tensor::zeros({rows(j), nkv, d}, DType::F32, dev);
  }
  Tensor dO;  // undefined for the last step
  for (int k = steps - 1; k >= 0; --k) {
    const int64_t n = rows(k);
    const LayerActs& a = acts[k];
    Tensor dattn, dh;
    draft_detail::layer_out_backward(ctx, a, dno[k], dO, *grads, dattn, dh);
    dno[k] = Tensor();
    if (k == 0) mark_ready(7);  // norm, down, gate, up, post_attention_layernorm, o_proj
    std::vector<const Tensor*> dk, dv;
    std::vector<Tensor*> gdk, gdv;
    for (int j = 1; j <= k; ++j) {
      dk.push_back(&acts[j].k);
      dv.push_back(&acts[j].v);
      gdk.push_back(&ddk[j]);
      gdv.push_back(&ddv[j]);
    }
    Tensor dq = Tensor::empty({n, cfg.num_attention_heads, d}, ctx.compute, dev);  // attention_backward: q's dtype
    Tensor dk0s = dk0.slice(0, n), dv0s = dv0.slice(0, n);
    draft_detail::ttt_attention_backward(dattn, a.q, acts[0].k.slice(0, n), acts[0].v.slice(0, n), dk, dv, a.attn,
                                         a.lse, ctx.scale, cfg.sliding_window, dq, dk0s, dv0s, gdk, gdv);
    // Step k's own keys/values are complete now: step 0's are dk0/dv0 (all steps added to them),
    // step k's diagonal ones got their last contribution (from step k itself) just above.
    Tensor& own_dk = k == 0 ? dk0 : ddk[k];
    Tensor& own_dv = k == 0 ? dv0 : ddv[k];
    draft_detail::layer_qkv_backward(ctx, a, dq, own_dk, own_dv, *grads, dh);
    if (k == 0) mark_ready(after_qkv);  // q, k, v (or the MLA weights), input_layernorm, hidden_norm
    dO = dh;  // h_{t,k} = o_{t,k-1} (norm(o_{t,k-1}) under norm_output; rows 0..n_k-1), or g for k = 0
  }
  // g = fc(f) (or fc(input_norm(f))): dfc += dg^T (input_norm(f) or f), then input_norm's gradient.
  draft_detail::layer_fc_backward(ctx, aux.slice(0, n0), fc_acts, dO, *grads, [&] { mark_ready(after_qkv + 1); });
  mark_ready(kAll);
  return st;
}

}  // namespace aerie
