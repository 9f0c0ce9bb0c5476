// One application of the draft decoder layer (eagle3.md section 3), forward and backward, split
// around the attention. Linear y = x W^T is matmul(x, W, y, false, true); its backward is
// dx = dy W and dW += dy^T x. Device-agnostic: every tensor lives on the weights' device (LayerCtx::device)
// and all work is kernel ops (no host loops over activations), so the same code runs on CPU and CUDA.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/activation.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"
#include "kernels/tensor_ops.h"
#include "model/draft_layer.h"

namespace aerie::draft_detail {

namespace {

Tensor f32(const LayerCtx& c, const Shape& s) { return Tensor::empty(s, DType::F32, c.device); }
// A GEMM input: the compute dtype (F32, or BF16 under bf16 compute).
Tensor cmp(const LayerCtx& c, const Shape& s) { return Tensor::empty(s, c.compute, c.device); }
// x as a GEMM input: x itself when it has the compute dtype, else a converted copy (an F32 gradient
// rounded to bf16 once before it enters a bf16 GEMM).
Tensor as_compute(const LayerCtx& c, const Tensor& x) {
  if (x.dtype() == c.compute) return x;
  Tensor y = Tensor::empty(x.shape(), c.compute, x.device());
  convert(x, y);
  return y;
}

// y = x W^T
void linear(const Tensor& x, const Tensor& w, Tensor& y) { matmul(x, w, y, false, true); }
// dW += dy^T x (dW F32: the gradients accumulate in fp32 whatever the compute dtype)
void add_weight_grad(const Tensor& dy, const Tensor& x, Tensor& dw) { matmul(dy, x, dw, true, false, 1.0f, 1.0f); }

}  // namespace

LayerCtx::LayerCtx(const DraftConfig& c, const DraftWeights& w_, const Tensor& embed_)
    : cfg(c),
      w(w_),
      embed(embed_),
      inv_freq(rope_inv_freq(c.rope, c.is_mla() ? c.qk_rope_head_dim : c.head_dim)),
      scale(c.softmax_scale()),
      device(w_.fc.device()),
      compute(w_.fc.dtype()) {
  if (c.is_mla()) {
    rope_scale = static_cast<float>(rope_attention_factor(c.rope));
    for (float f : inv_freq) neg_inv_freq.push_back(-f);
    head_ones = Tensor::from_vector(std::vector<float>(static_cast<size_t>(c.num_attention_heads), 1.0f),
                                    {c.num_attention_heads});
    if (device != Device::CPU) head_ones = head_ones.to_device(device);
  }
  AERIE_CHECK(w.kv_a_proj_with_mqa.defined() == c.is_mla() &&
                  (!c.is_mla() || w.q_a_proj.defined() == (c.q_lora_rank > 0)) &&
                  (c.is_mla() || (w.k_proj.defined() && w.v_proj.defined())),
              "draft: the weights are " << (w.kv_a_proj_with_mqa.defined() ? "an MLA draft's" : "a Llama draft's")
                                        << (w.q_a_proj.defined() ? " with a query LoRA" : "") << ", the config "
                                        << (c.is_mla() ? "an MLA draft's" : "a Llama draft's")
                                        << (c.q_lora_rank > 0 ? " with q_lora_rank " + std::to_string(c.q_lora_rank) : "")
                                        << " (a checkpoint or export of another draft?)");
  embed.check_shape({c.vocab_size, c.hidden_size}, "draft: embed_tokens");
  AERIE_CHECK(embed.device() == device,
              "draft: embed_tokens is on " << device_name(embed.device()) << ", the draft weights on "
                                           << device_name(device));
  AERIE_CHECK(compute == DType::F32 || compute == DType::BF16,
              "draft: the weight matrices must be F32 or BF16, fc.weight is " << dtype_name(compute));
  for (const auto& [name, m] : w.named())
    AERIE_CHECK(m->ndim() != 2 || (m->dtype() == compute && m->device() == device),
                "draft: " << name << " is " << dtype_name(m->dtype()) << " on " << device_name(m->device())
                          << ", fc.weight " << dtype_name(compute) << " on " << device_name(device)
                          << " (all matrices share dtype and device)");
  if (c.norm_before_fc) {
    AERIE_CHECK(w.input_norm.defined(), "draft: norm_before_fc is on but the weights have no input_norm");
    w.input_norm.check_shape({3 * c.target_hidden_size}, "draft: input_norm.weight");
    AERIE_CHECK(w.input_norm.device() == device, "draft: input_norm.weight is on " << device_name(w.input_norm.device())
                                                                                    << ", fc.weight on "
                                                                                    << device_name(device));
  } else {
    AERIE_CHECK(!w.input_norm.defined(),
                "draft: the weights have input_norm.weight but norm_before_fc is off (a config of another draft?)");
  }
  for (int k = 0; k < 3; ++k) {
    const std::string name = "draft: fc_norm." + std::to_string(k) + ".weight";
    if (!c.fc_norm) {
      AERIE_CHECK(!w.fc_norm[k].defined(), name << " is there but fc_norm is off (a config of another draft?)");
      continue;
    }
    AERIE_CHECK(w.fc_norm[k].defined(), "draft: fc_norm is on but the weights have no " << name.substr(7));
    w.fc_norm[k].check_shape({c.target_hidden_size}, name);
    AERIE_CHECK(w.fc_norm[k].device() == device,
                name << " is on " << device_name(w.fc_norm[k].device()) << ", fc.weight on " << device_name(device));
  }
}

Tensor layer_fc(const LayerCtx& c, const Tensor& f, FcActs* acts) {
  const int64_t n = f.ndim() == 2 ? f.dim(0) : -1;
  f.check_shape({n, 3 * c.cfg.target_hidden_size}, "draft: the fused feature f");
  Tensor g = f32(c, {n, c.cfg.hidden_size});
  if (c.cfg.fc_norm) {
    // g = fc(concat_k fc_norm.k(f_k)): one RMSNorm per aux chunk of H_t columns (SpecForge's
    // project_hidden_states), each chunk copied out, normed and copied into its place in fn.
    const int64_t Ht = c.cfg.target_hidden_size;
    Tensor fn = cmp(c, f.shape()), rstd = f32(c, {3, n}), chunk = Tensor::empty({n, Ht}, f.dtype(), f.device()),
           normed = cmp(c, {n, Ht});
    for (int k = 0; k < 3; ++k) {
      copy_columns(f, k * Ht, chunk, 0, Ht);
      Tensor rk = rstd.slice(k, k + 1).reshape({n});
      rmsnorm_forward(chunk, c.w.fc_norm[k], static_cast<float>(c.cfg.rms_norm_eps), normed, &rk);
      copy_columns(normed, 0, fn, k * Ht, Ht);
    }
    linear(fn, c.w.fc, g);
    if (acts) *acts = FcActs{fn, rstd};
    return g;
  }
  if (!c.cfg.norm_before_fc) {
    linear(f, c.w.fc, g);
    return g;
  }
  // g = fc(input_norm(f)): one RMSNorm over the whole concatenation (vLLM, SGLang, speculators).
  Tensor fn = cmp(c, f.shape()), rstd = f32(c, {n});
  rmsnorm_forward(f, c.w.input_norm, static_cast<float>(c.cfg.rms_norm_eps), fn, &rstd);
  linear(fn, c.w.fc, g);
  if (acts) *acts = FcActs{fn, rstd};
  return g;
}

void layer_fc_backward(const LayerCtx& c, const Tensor& f, const FcActs& acts, const Tensor& dg, DraftWeights& g,
                       const std::function<void()>& on_fc_ready) {
  const int64_t n = f.dim(0);
  dg.check_shape({n, c.cfg.hidden_size}, "draft: dg");
  const Tensor dg_c = as_compute(c, dg);  // F32 gradient, read by the GEMMs in the compute dtype
  const bool norm = c.cfg.norm_before_fc || c.cfg.fc_norm;
  if (c.cfg.norm_before_fc)
    AERIE_CHECK(acts.fn.defined() && acts.rstd.defined() && g.input_norm.defined(),
                "draft: layer_fc_backward under norm_before_fc needs layer_fc's acts and an input_norm gradient");
  if (c.cfg.fc_norm)
    AERIE_CHECK(acts.fn.defined() && acts.rstd.defined() && g.fc_norm[0].defined() && g.fc_norm[1].defined() &&
                    g.fc_norm[2].defined(),
                "draft: layer_fc_backward under fc_norm needs layer_fc's acts and the fc_norm gradients");
  add_weight_grad(dg_c, norm ? acts.fn : f, g.fc);  // dfc += dg^T fc's input
  if (on_fc_ready) on_fc_ready();
  if (!norm) return;
  // d fn = dg fc [n, 3 H_t] F32, then the norm's backward; its dx (d f) is not needed but written over d fn.
  Tensor dfn = f32(c, f.shape());
  matmul(dg_c, c.w.fc, dfn, false, false);
  if (c.cfg.norm_before_fc) {
    rmsnorm_backward(dfn, f, c.w.input_norm, acts.rstd, dfn, &g.input_norm);
    return;
  }
  // fc_norm: each chunk's norm backward on its columns of d fn and f (the weight gradients; dx dropped).
  const int64_t Ht = c.cfg.target_hidden_size;
  Tensor dk = f32(c, {n, Ht}), xk = Tensor::empty({n, Ht}, f.dtype(), f.device());
  for (int k = 0; k < 3; ++k) {
    copy_columns(dfn, k * Ht, dk, 0, Ht);
    copy_columns(f, k * Ht, xk, 0, Ht);
    rmsnorm_backward(dk, xk, c.w.fc_norm[k], acts.rstd.slice(k, k + 1).reshape({n}), dk, &g.fc_norm[k]);
  }
}

namespace {
// MLA: rotates (inverse: back) the last qk_rope columns of every head of x [n, n_h, qk_nope + qk_rope] in
// place, DeepSeek's interleaved pairs times rope_scale (the backward of y = s R x is s R^T dy: the same
// op with -inv_freq).
void rope_head_tails(const LayerCtx& c, Tensor& x, const Tensor& positions, bool inverse) {
  const int64_t n = x.dim(0), nh = x.dim(1), dq = x.dim(2), nope = c.cfg.qk_nope_head_dim, rope = c.cfg.qk_rope_head_dim;
  Tensor rows = x.reshape({n * nh, dq});
  Tensor pe = Tensor::empty({n, nh, rope}, x.dtype(), x.device());
  Tensor pe2 = pe.reshape({n * nh, rope});
  copy_columns(rows, nope, pe2, 0, rope);
  rope_apply_interleaved(pe, positions, inverse ? c.neg_inv_freq : c.inv_freq, c.rope_scale);
  copy_columns(pe2, 0, rows, nope, rope);
}

// The MLA draft's q, k, v from a.a (vLLM's DeepseekV2MLAAttention in its expanded, prefill form; the
// target's MLA in mla_attention.cc):
//   q = q_b(q_a_layernorm(q_a(a))) (or q_proj(a)) [n, n_h, nope + rope], rope on each head's last columns;
//   [c | k_pe] = kv_a_proj_with_mqa(a); cn = kv_a_layernorm(c); k_pe roped (one key shared by the heads);
//   [k_nope | v] per head = kv_b(cn); k = [k_nope | k_pe], v = [v | 0] (zero-padded to nope + rope).
void mla_qkv(const LayerCtx& c, LayerActs& a) {
  const DraftConfig& cf = c.cfg;
  const int64_t n = a.n, nh = cf.num_attention_heads, dq = cf.attn_qk_dim(), nope = cf.qk_nope_head_dim,
                rope = cf.qk_rope_head_dim, lora = cf.kv_lora_rank, vd = cf.v_head_dim, ql = cf.q_lora_rank;
  const float eps = static_cast<float>(cf.rms_norm_eps);
  a.q = cmp(c, {n, nh, dq});
  Tensor q2 = a.q.reshape({n, nh * dq});
  if (ql > 0) {
    a.qa = cmp(c, {n, ql});
    linear(a.a, c.w.q_a_proj, a.qa);
    a.qan = cmp(c, {n, ql});
    a.rstd_qa = f32(c, {n});
    rmsnorm_forward(a.qa, c.w.q_a_layernorm, eps, a.qan, &a.rstd_qa);
    linear(a.qan, c.w.q_b_proj, q2);
  } else {
    linear(a.a, c.w.q_proj, q2);
  }
  rope_head_tails(c, a.q, a.positions, false);
  Tensor ckv = cmp(c, {n, lora + rope});
  linear(a.a, c.w.kv_a_proj_with_mqa, ckv);
  a.c_lat = cmp(c, {n, lora});
  copy_columns(ckv, 0, a.c_lat, 0, lora);
  a.cn = cmp(c, {n, lora});
  a.rstd_c = f32(c, {n});
  rmsnorm_forward(a.c_lat, c.w.kv_a_layernorm, eps, a.cn, &a.rstd_c);
  Tensor latent = cmp(c, {n, lora + rope});
  copy_columns(a.cn, 0, latent, 0, lora);
  Tensor kpe = cmp(c, {n, 1, rope});
  Tensor kpe2 = kpe.reshape({n, rope});
  copy_columns(ckv, lora, kpe2, 0, rope);
  rope_apply_interleaved(kpe, a.positions, c.inv_freq, c.rope_scale);
  copy_columns(kpe2, 0, latent, lora, rope);
  Tensor kv = cmp(c, {n, nh * (nope + vd)});
  linear(a.cn, c.w.kv_b_proj, kv);
  a.k = cmp(c, {n, nh, dq});
  a.v = cmp(c, {n, nh, dq});
  mla_expand_kv(kv, latent, nope, vd, lora, a.k, a.v);
}

// layer_qkv with ids checked against the table already (host_checked: the host overload's ids, so the
// CUDA gather needs no host copy of them and no stream synchronisation) or by the gather itself.
void layer_qkv_impl(const LayerCtx& c, const Tensor& id_t, const Tensor& h, int64_t pos0, LayerActs& a,
                    bool host_checked);
}  // namespace

void layer_qkv(const LayerCtx& c, const int32_t* ids, int64_t n, const Tensor& h, int64_t pos0, LayerActs& a) {
  const int64_t V = c.embed.dim(0);
  for (int64_t i = 0; i < n; ++i)
    AERIE_CHECK(ids[i] >= 0 && ids[i] < V, "draft layer: token id " << ids[i] << " is outside the embedding's " << V
                                                                     << " rows");
  Tensor id_t = Tensor::wrap(const_cast<int32_t*>(ids), {n}, DType::I32);
  if (c.device != Device::CPU) id_t = id_t.to_device(c.device);
  layer_qkv_impl(c, id_t, h, pos0, a, true);
}

void layer_qkv(const LayerCtx& c, const Tensor& id_t, const Tensor& h, int64_t pos0, LayerActs& a) {
  layer_qkv_impl(c, id_t, h, pos0, a, false);
}

namespace {
void layer_qkv_impl(const LayerCtx& c, const Tensor& id_t, const Tensor& h, int64_t pos0, LayerActs& a,
                    bool host_checked) {
  const int64_t n = id_t.numel();
  const int64_t H = c.cfg.hidden_size, nh = c.cfg.num_attention_heads, nkv = c.cfg.num_key_value_heads,
                d = c.cfg.head_dim;
  h.check_shape({n, H}, "draft layer: input hidden");
  a.n = n;
  a.pos0 = pos0;
  if (c.arange.defined() && c.arange.numel() >= pos0 + n) {
    a.positions = c.arange.slice(pos0, pos0 + n);
  } else {
    a.positions = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) a.positions.data<int32_t>()[i] = static_cast<int32_t>(pos0 + i);
    if (c.device != Device::CPU) a.positions = a.positions.to_device(c.device);
  }
  const float eps = static_cast<float>(c.cfg.rms_norm_eps);
  a.e_raw = cmp(c, {n, H});
  if (host_checked)
    embedding_forward_in_range(id_t, c.embed, a.e_raw, c.embed.dim(0));
  else
    embedding_forward(id_t, c.embed, a.e_raw);
  Tensor e = cmp(c, {n, H}), hn = cmp(c, {n, H});
  a.rstd_e = f32(c, {n});
  rmsnorm_forward(a.e_raw, c.w.input_layernorm, eps, e, &a.rstd_e);
  a.h = h;
  a.rstd_h = f32(c, {n});
  if (c.cfg.norm_before_residual && hn.dtype() != DType::F32) {
    // The residual base hidden_norm(h) in the F32 residual stream; the GEMM input is its one rounding to
    // the compute dtype (what a norm written straight to bf16 gives).
    a.hn_res = f32(c, {n, H});
    rmsnorm_forward(h, c.w.hidden_norm, eps, a.hn_res, &a.rstd_h);
    convert(a.hn_res, hn);
  } else {
    rmsnorm_forward(h, c.w.hidden_norm, eps, hn, &a.rstd_h);
    if (c.cfg.norm_before_residual) a.hn_res = hn;  // F32 compute: hn itself
  }
  // a = concat(e, hn): embedding first, hidden second (eagle3.md section 3).
  a.a = cmp(c, {n, 2 * H});
  copy_columns(e, 0, a.a, 0, H);
  copy_columns(hn, 0, a.a, H, H);
  if (c.cfg.is_mla()) {
    mla_qkv(c, a);
    return;
  }
  a.q = cmp(c, {n, nh, d});
  a.k = cmp(c, {n, nkv, d});
  a.v = cmp(c, {n, nkv, d});
  Tensor q2 = a.q.reshape({n, nh * d}), k2 = a.k.reshape({n, nkv * d}), v2 = a.v.reshape({n, nkv * d});
  linear(a.a, c.w.q_proj, q2);
  linear(a.a, c.w.k_proj, k2);
  linear(a.a, c.w.v_proj, v2);
  rope_apply(a.q, a.positions, c.inv_freq, false);
  rope_apply(a.k, a.positions, c.inv_freq, false);
}
}  // namespace

void layer_out(const LayerCtx& c, LayerActs& a) {
  const int64_t n = a.n, H = c.cfg.hidden_size, I = c.cfg.intermediate_size, K = c.cfg.draft_vocab_size;
  const float eps = static_cast<float>(c.cfg.rms_norm_eps);
  const int64_t nh = c.cfg.num_attention_heads, hd = c.cfg.attn_qk_dim(), vd = c.cfg.attn_v_dim(), qd = nh * vd;
  a.attn.check_shape({n, nh, hd}, "draft layer: attention output");
  Tensor o_in;
  if (c.cfg.is_mla()) {  // o_proj reads each head's v_head_dim columns (the rest is the values' zero padding)
    a.o_in = Tensor::empty({n, qd}, a.attn.dtype(), c.device);
    Tensor dst = a.o_in.reshape({n * nh, vd});
    copy_columns(a.attn.reshape({n * nh, hd}), 0, dst, 0, vd);
    o_in = a.o_in;
  } else {
    o_in = a.attn.reshape({n, qd});
  }
  // The residual stream (y, o) stays F32: the GEMMs that add into it write F32 (beta 1).
  a.y = (c.cfg.norm_before_residual ? a.hn_res : a.h).clone();
  matmul(o_in, c.w.o_proj, a.y, false, true, 1.0f, 1.0f);  // y = h (or hn) + o_proj(attn)
  a.n2 = cmp(c, {n, H});
  a.rstd_y = f32(c, {n});
  rmsnorm_forward(a.y, c.w.post_attention_layernorm, eps, a.n2, &a.rstd_y);
  a.gate = cmp(c, {n, I});
  a.up = cmp(c, {n, I});
  a.act = cmp(c, {n, I});
  linear(a.n2, c.w.gate_proj, a.gate);
  linear(a.n2, c.w.up_proj, a.up);
  swiglu_forward(a.gate, a.up, a.act);
  a.o = a.y.clone();
  matmul(a.act, c.w.down_proj, a.o, false, true, 1.0f, 1.0f);  // o = y + down_proj(act)
  a.no = cmp(c, {n, H});
  a.rstd_o = f32(c, {n});
  if (c.cfg.norm_output && a.no.dtype() != DType::F32) {
    // The next step's hidden norm(o) in the F32 residual stream; the lm_head's input is its one rounding.
    a.no_out = f32(c, {n, H});
    rmsnorm_forward(a.o, c.w.norm, eps, a.no_out, &a.rstd_o);
    convert(a.no_out, a.no);
  } else {
    rmsnorm_forward(a.o, c.w.norm, eps, a.no, &a.rstd_o);
    if (c.cfg.norm_output) a.no_out = a.no;  // F32 compute: no itself
  }
  a.logits = f32(c, {n, K});  // F32 output (fp32 accumulation) for the fp32 softmax / cross-entropy
  linear(a.no, c.w.lm_head, a.logits);
}

Tensor layer_head_backward(const LayerCtx& c, const LayerActs& a, const Tensor& dlogits, DraftWeights& g) {
  dlogits.check_shape({a.n, c.cfg.draft_vocab_size}, "draft layer backward: dlogits");
  const Tensor dl = as_compute(c, dlogits);
  Tensor dno = f32(c, {a.n, c.cfg.hidden_size});
  matmul(dl, c.w.lm_head, dno, false, false);
  add_weight_grad(dl, a.no, g.lm_head);
  return dno;
}

void layer_out_backward(const LayerCtx& c, const LayerActs& a, const Tensor& dno, const Tensor& do_extra,
                        DraftWeights& g, Tensor& dattn, Tensor& dh) {
  const int64_t n = a.n, H = c.cfg.hidden_size, I = c.cfg.intermediate_size;
  const int64_t nh = c.cfg.num_attention_heads, hd = c.cfg.attn_qk_dim(), vd = c.cfg.attn_v_dim(), qd = nh * vd;
  dno.check_shape({n, H}, "draft layer backward: dno");
  const bool extra = do_extra.defined() && do_extra.numel() > 0;
  if (extra)
    AERIE_CHECK(do_extra.dim(0) <= n && do_extra.dim(1) == H,
                "draft layer backward: do_extra " << shape_str(do_extra.shape()) << " for " << n << " rows");
  if (extra && c.cfg.norm_output) {  // the next step read norm(o): its gradient joins the lm_head's
    Tensor rows = dno.slice(0, do_extra.dim(0));
    add_inplace(rows, do_extra);
  }
  Tensor dout = f32(c, {n, H});
  rmsnorm_backward(dno, a.o, c.w.norm, a.rstd_o, dout, &g.norm);
  if (extra && !c.cfg.norm_output) {
    Tensor rows = dout.slice(0, do_extra.dim(0));
    add_inplace(rows, do_extra);
  }
  // MLP: o = y + down(silu(gate n2) * up n2). dout is F32 (a residual gradient sum); its GEMMs read it in
  // the compute dtype.
  const Tensor dout_c = as_compute(c, dout);
  Tensor dact = cmp(c, {n, I});
  matmul(dout_c, c.w.down_proj, dact, false, false);
  add_weight_grad(dout_c, a.act, g.down_proj);
  Tensor dgate = cmp(c, {n, I}), dup = cmp(c, {n, I});
  swiglu_backward(dact, a.gate, a.up, dgate, dup);
  dact = Tensor();
  add_weight_grad(dgate, a.n2, g.gate_proj);
  add_weight_grad(dup, a.n2, g.up_proj);
  Tensor dn2 = f32(c, {n, H});  // a sum of two GEMMs: F32
  matmul(dgate, c.w.gate_proj, dn2, false, false);
  matmul(dup, c.w.up_proj, dn2, false, false, 1.0f, 1.0f);
  dgate = Tensor();
  dup = Tensor();
  Tensor dy = f32(c, {n, H});
  rmsnorm_backward(dn2, a.y, c.w.post_attention_layernorm, a.rstd_y, dy, &g.post_attention_layernorm);
  add_inplace(dy, dout);
  // y = h (or hidden_norm(h)) + o_proj(attn)
  const Tensor dy_c = as_compute(c, dy);
  if (c.cfg.is_mla()) {  // d attn: o_proj's gradient in each head's first v_head_dim columns, 0 in the padding
    Tensor din = cmp(c, {n, qd});
    matmul(dy_c, c.w.o_proj, din, false, false);
    add_weight_grad(dy_c, a.o_in, g.o_proj);
    dattn = Tensor::zeros({n, nh, hd}, c.compute, c.device);
    Tensor dst = dattn.reshape({n * nh, hd});
    copy_columns(din.reshape({n * nh, vd}), 0, dst, 0, vd);
  } else {
    dattn = cmp(c, {n, nh, hd});
    Tensor dattn2 = dattn.reshape({n, qd});
    matmul(dy_c, c.w.o_proj, dattn2, false, false);
    add_weight_grad(dy_c, a.attn.reshape({n, qd}), g.o_proj);
  }
  dh = dy;
}

namespace {
// The MLA draft's backward of mla_qkv from the gradients w.r.t. its q, k, v: adds the attention's weight
// gradients to g and returns da [n, 2H] F32 (w.r.t. the layer's concat(e, hn) input).
Tensor mla_qkv_backward(const LayerCtx& c, const LayerActs& a, Tensor& dq, Tensor& dk, const Tensor& dv,
                        DraftWeights& g) {
  const DraftConfig& cf = c.cfg;
  const int64_t n = a.n, H = cf.hidden_size, nh = cf.num_attention_heads, dqd = cf.attn_qk_dim(),
                nope = cf.qk_nope_head_dim, rope = cf.qk_rope_head_dim, lora = cf.kv_lora_rank, vd = cf.v_head_dim,
                ql = cf.q_lora_rank;
  rope_head_tails(c, dq, a.positions, true);
  // kv = kv_b(cn): d kv per head = [dk's nope columns | dv's first vd columns].
  Tensor dkv = f32(c, {n, nh * (nope + vd)});
  Tensor dkv_r = dkv.reshape({n * nh, nope + vd});
  auto as_f32 = [&](const Tensor& x) {
    if (x.dtype() == DType::F32) return x;
    Tensor y = f32(c, x.shape());
    convert(x, y);
    return y;
  };
  const Tensor dk_f = as_f32(dk), dv_f = as_f32(dv);
  copy_columns(dk_f.reshape({n * nh, dqd}), 0, dkv_r, 0, nope);
  copy_columns(dv_f.reshape({n * nh, dqd}), 0, dkv_r, nope, vd);
  // The shared k_pe: the sum over the heads of dk's rope columns, one [1, n_h] x [n_h, rope] GEMM per row
  // (the ones vector read with stride 0), then the inverse rotation.
  Tensor dkpe = f32(c, {n, 1, rope});
  matmul_strided_batched({&c.head_ones, 0, nh, 0}, {&dk_f, nope, dqd, nh * dqd}, {&dkpe, 0, rope, rope}, 1, rope, nh, n, false);
  rope_apply_interleaved(dkpe, a.positions, c.neg_inv_freq, c.rope_scale);
  const Tensor dkv_c = as_compute(c, dkv);
  add_weight_grad(dkv_c, a.cn, g.kv_b_proj);
  Tensor dcn = f32(c, {n, lora});
  matmul(dkv_c, c.w.kv_b_proj, dcn, false, false);
  Tensor dckv = f32(c, {n, lora + rope});
  Tensor dc = f32(c, {n, lora});
  rmsnorm_backward(dcn, a.c_lat, c.w.kv_a_layernorm, a.rstd_c, dc, &g.kv_a_layernorm);
  copy_columns(dc, 0, dckv, 0, lora);
  copy_columns(dkpe.reshape({n, rope}), 0, dckv, lora, rope);
  const Tensor dckv_c = as_compute(c, dckv);
  add_weight_grad(dckv_c, a.a, g.kv_a_proj_with_mqa);
  Tensor da = f32(c, {n, 2 * H});  // a sum of two GEMMs: F32
  matmul(dckv_c, c.w.kv_a_proj_with_mqa, da, false, false);
  const Tensor dq2 = as_compute(c, dq.reshape({n, nh * dqd}));
  if (ql > 0) {
    add_weight_grad(dq2, a.qan, g.q_b_proj);
    Tensor dqan = f32(c, {n, ql}), dqa = f32(c, {n, ql});
    matmul(dq2, c.w.q_b_proj, dqan, false, false);
    rmsnorm_backward(dqan, a.qa, c.w.q_a_layernorm, a.rstd_qa, dqa, &g.q_a_layernorm);
    const Tensor dqa_c = as_compute(c, dqa);
    add_weight_grad(dqa_c, a.a, g.q_a_proj);
    matmul(dqa_c, c.w.q_a_proj, da, false, false, 1.0f, 1.0f);
  } else {
    add_weight_grad(dq2, a.a, g.q_proj);
    matmul(dq2, c.w.q_proj, da, false, false, 1.0f, 1.0f);
  }
  return da;
}
// The Llama draft's: q/k/v_proj's weight gradients, da [n, 2H] F32.
Tensor gqa_qkv_backward(const LayerCtx& c, const LayerActs& a, Tensor& dq, Tensor& dk, const Tensor& dv,
                        DraftWeights& g) {
  const int64_t n = a.n, H = c.cfg.hidden_size, nh = c.cfg.num_attention_heads, nkv = c.cfg.num_key_value_heads,
                d = c.cfg.head_dim;
  // RoPE is a rotation: its backward is the inverse rotation (in each tensor's own dtype).
  rope_apply(dq, a.positions, c.inv_freq, true);
  rope_apply(dk, a.positions, c.inv_freq, true);
  const Tensor dq2 = as_compute(c, dq.reshape({n, nh * d})), dk2 = as_compute(c, dk.reshape({n, nkv * d})),
               dv2 = as_compute(c, dv.reshape({n, nkv * d}));
  add_weight_grad(dq2, a.a, g.q_proj);
  add_weight_grad(dk2, a.a, g.k_proj);
  add_weight_grad(dv2, a.a, g.v_proj);
  Tensor da = f32(c, {n, 2 * H});  // a sum of three GEMMs: F32
  matmul(dq2, c.w.q_proj, da, false, false);
  matmul(dk2, c.w.k_proj, da, false, false, 1.0f, 1.0f);
  matmul(dv2, c.w.v_proj, da, false, false, 1.0f, 1.0f);
  return da;
}
}  // namespace

void layer_qkv_backward(const LayerCtx& c, const LayerActs& a, Tensor& dq, Tensor& dk, const Tensor& dv,
                        DraftWeights& g, Tensor& dh) {
  const int64_t n = a.n, H = c.cfg.hidden_size, nh = c.cfg.num_attention_heads, nkv = c.cfg.attn_kv_heads(),
                d = c.cfg.attn_qk_dim();
  dq.check_shape({n, nh, d}, "draft layer backward: dq");
  dk.check_shape({n, nkv, d}, "draft layer backward: dk");
  dv.check_shape({n, nkv, d}, "draft layer backward: dv");
  dh.check_shape({n, H}, "draft layer backward: dh");
  const Tensor da = c.cfg.is_mla() ? mla_qkv_backward(c, a, dq, dk, dv, g) : gqa_qkv_backward(c, a, dq, dk, dv, g);
  Tensor de = f32(c, {n, H}), dhn = f32(c, {n, H});
  copy_columns(da, 0, de, 0, H);
  copy_columns(da, H, dhn, 0, H);
  Tensor scratch = f32(c, {n, H});
  // The embedding is frozen: only input_layernorm's weight gets a gradient.
  rmsnorm_backward(de, a.e_raw, c.w.input_layernorm, a.rstd_e, scratch, &g.input_layernorm);
  if (c.cfg.norm_before_residual) {  // dh holds dL/d hidden_norm(h) of the residual: one norm backward of both
    add_inplace(dhn, dh);
    rmsnorm_backward(dhn, a.h, c.w.hidden_norm, a.rstd_h, dh, &g.hidden_norm);
    return;
  }
  rmsnorm_backward(dhn, a.h, c.w.hidden_norm, a.rstd_h, scratch, &g.hidden_norm);
  add_inplace(dh, scratch);
}

}  // namespace aerie::draft_detail
