// The MoE FFN block (model/blocks.h MoeSpec; transformers' DeepseekV3MoE, Qwen3MoeSparseMoeBlock,
// MixtralSparseMoeBlock: the router of MoeSpec::router, routed experts, optional shared experts). Per forward
// (n rows, k = top_k, P = n k pairs, I = this rank's slice of moe_intermediate_size, ct = compute dtype):
//   h32 [n, H] F32 (h in fp32 for the router)   logits [n, E] F32   idx [n, k] I32, w [n, k] F32
//   counts [E], offsets [E + 1] (read on the host), perm [P] (pairs sorted by expert)
//   xs [P, H] ct (h's rows in expert order; the fused path reads h through perm instead), row_of [P]
//   (pair -> row of ys)   gu [P, 2 I] ct
//   act [P, I] ct   ys [P, H] ct   routed [n, H] F32 = sum_k w ys[row_of]   out = all_reduce(routed + shared(h))
//   (the shared experts' down GEMM adds into routed)
// Expert parallelism (WeightSource::expert_parallel): a rank holds whole experts [ex0, ex1) (I = all of
// moe_intermediate_size) and runs the GEMMs on their pairs' rows [off[ex0], off[ex1]) only (gu, act,
// ys of PL = that many rows; moe_local_rows makes row_of point into them, -1 for the other ranks'
// pairs), so the all-reduce that sums tp's partial products sums the ranks' experts instead.
// The experts' GEMMs are grouped, never a launch per expert:
//  - on the GPU in BF16, one fused kernel per projection (kernels/gemm.h matmul_grouped_quant) that
//    reads every expert's weight as stored (BF16, FP8 blocks, INT4 groups) and dequantizes tile by tile
//    in shared memory: no dequantized copy of the experts at all;
//  - otherwise (the CPU, F32, shapes the fused kernel does not take, or AERIE_MOE_GEMM=cublas)
//    matmul_grouped (one cuBLAS grouped GEMM per projection on the GPU), quantized experts first
//    dequantized, only those that got rows, in chunks of at most kMoeScratchBytes of compute-dtype
//    weights: per chunk one dequant_batch launch into the forward's scratch, then the grouped GEMM.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/settings.h"
#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/fused.h"
#include "kernels/gemm.h"
#include "kernels/moe_router.h"
#include "kernels/optim.h"
#include "kernels/quant.h"
#include "kernels/tensor_ops.h"
#include "model/blocks.h"

namespace aerie {

namespace {

class MoeFfn final : public FfnBlock {
 public:
  MoeFfn(WeightSource& src, const MoeSpec& s, const std::string& p) : s_(s) {
    const int tp = src.tp_size();
    const int64_t H = s.hidden, I = s.moe_intermediate, E = s.experts;
    ep_ = src.expert_parallel() && tp > 1;
    if (ep_) {  // whole experts [e0, e1) on this rank
      AERIE_CHECK(E % tp == 0, "expert parallelism: tp " << tp << " does not divide n_routed_experts " << E << " ("
                                                          << p << "experts.*): choose a --tp that divides " << E
                                                          << ", or leave out --expert-parallel");
      ex0_ = src.tp_rank() * (E / tp);
      ex1_ = ex0_ + E / tp;
      inter_ = I;
    } else {
      AERIE_CHECK(s.moe_intermediate % tp == 0,
                  "tp " << tp << " does not divide moe_intermediate_size " << s.moe_intermediate);
      ex0_ = 0;
      ex1_ = E;
      inter_ = I / tp;
    }
    gate_ = src.load(p + "gate.weight", {E, H}, TpSplit::None, ParamRole::Router);
    if (src.device() == Device::CUDA && src.dtype() == DType::BF16) split_router();
    if (s.router == MoeRouterKind::SigmoidNoauxTc)
      bias_ = src.load(p + "gate.e_score_correction_bias", {E}, TpSplit::None, ParamRole::RouterBias);
    const TpSplit rows = ep_ ? TpSplit::None : TpSplit::Rows, cols = ep_ ? TpSplit::None : TpSplit::Cols;
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      if (e < ex0_ || e >= ex1_) {  // another rank's expert (expert parallelism): nothing read
        src.skip_linear({{x + s.gate_proj, {I, H}}, {x + s.up_proj, {I, H}}});
        src.skip_linear({{x + s.down_proj, {H, I}}});
        continue;
      }
      Expert ex;
      ex.gate_up = src.load_linear({{x + s.gate_proj, {I, H}}, {x + s.up_proj, {I, H}}}, rows);
      ex.down = src.load_linear(x + s.down_proj, {H, I}, cols);
      experts_.push_back(std::move(ex));
    }
    if (s.shared_experts > 0)
      shared_ = make_dense_ffn(src, {H, s.moe_intermediate * s.shared_experts, false, false, true},
                               p + "shared_experts.");
    // The experts as matmul_grouped_quant's operands (empty when a part cannot go there as it is: an
    // FP8 slice that does not start on a block boundary).
    const WeightFormat f = experts_.front().down.format;
    format_ = f == WeightFormat::Dense      ? GroupedWeightFormat::Dense
              : f == WeightFormat::BlockFp8 ? GroupedWeightFormat::Fp8Block
                                            : GroupedWeightFormat::Int4Group;
    bool ok = true;
    auto grouped = [&](const Linear& l) {
      GroupedWeight gw;
      if (l.format == WeightFormat::Dense) {
        gw.push_back({l.weight, {}});
        return gw;
      }
      for (const QuantPart& q : l.parts) {
        ok = ok && q.r_off == 0 && q.c_off == 0 && q.weight.dim(0) == q.rows &&
             (l.format == WeightFormat::Int4Group || q.weight.dim(1) == l.in);
        gw.push_back({q.weight, q.scale});
      }
      return gw;
    };
    for (const Expert& ex : experts_) {
      gate_up_w_.push_back(grouped(ex.gate_up));
      down_w_.push_back(grouped(ex.down));
    }
    if (!ok) gate_up_w_.clear(), down_w_.clear();
  }

  void forward(ForwardContext& ctx, const Tensor& h, Tensor& out) override {
    const int64_t n = ctx.batch.n, H = s_.hidden, E = s_.experts, k = s_.top_k, P = n * k;
    const Device dev = ctx.device;
    // Router logits in fp32: on the GPU in BF16 as the sum of bf16 GEMMs against the router weight's
    // bf16 parts (split_router), elsewhere one fp32 GEMM.
    Tensor logits = ctx.buffer("moe.logits", {n, E}, DType::F32);
    if (!gate_parts_.empty() && h.dtype() == DType::BF16) {
      ctx.prof.time(OpKind::Gemm, dev, [&] {
        for (size_t i = 0; i < gate_parts_.size(); ++i) matmul(h, gate_parts_[i], logits, false, true, 1.0f, i ? 1.0f : 0.0f);
      });
    } else {
      AERIE_CHECK(gate_.defined(), "MoE: the fp32 router weight was replaced by its bf16 parts (a BF16 GPU model)");
      Tensor h32 = h;
      if (h.dtype() != DType::F32) {
        h32 = ctx.buffer("moe.h32", {n, H}, DType::F32);
        convert(h, h32);
      }
      ctx.gemm(h32, gate_, logits);
    }
    Tensor idx = ctx.buffer("moe.idx", {n, k}, DType::I32), w = ctx.buffer("moe.w", {n, k}, DType::F32);
    Tensor counts = ctx.buffer("moe.counts", {E}, DType::I32), offsets = ctx.buffer("moe.offsets", {E + 1}, DType::I32);
    Tensor perm = ctx.buffer("moe.perm", {P}, DType::I32);
    ctx.prof.time(OpKind::Other, dev, [&] {
      MoeRouterConfig rc{s_.n_group, s_.topk_group, k, s_.norm_topk_prob, s_.routed_scaling_factor};
      moe_router(s_.router, logits, bias_, rc, idx, w);
      moe_sort_by_expert(idx, E, counts, offsets, perm);
    });
    // The host needs only the expert offsets (to size the GEMMs).
    Tensor off_h = dev == Device::CPU ? offsets : offsets.to_device(Device::CPU);
    std::vector<int64_t> off_all(static_cast<size_t>(E + 1));
    for (int64_t e = 0; e <= E; ++e) off_all[e] = off_h.data<int32_t>()[e];
    // This rank's experts [ex0_, ex1_) own the expert-ordered pair rows [lr0, lr1) (all of them without
    // expert parallelism); the GEMMs run on those rows only, with offsets relative to lr0.
    const int64_t lr0 = off_all[ex0_], lr1 = off_all[ex1_], PL = lr1 - lr0;
    std::vector<int64_t> off(off_all.begin() + ex0_, off_all.begin() + ex1_ + 1);
    for (int64_t& o : off) o -= lr0;
    Tensor hx = h;  // h in the compute dtype
    if (h.dtype() != ctx.dtype) {
      hx = ctx.buffer("moe.hc", {n, H}, ctx.dtype);
      convert(h, hx);
    }
    const int64_t I2 = 2 * inter_;
    Tensor ys = ctx.buffer("moe.ys", {PL, H}, ctx.dtype), row_of = ctx.buffer("moe.row_of", {P}, DType::I32);
    Tensor gu = ctx.buffer("moe.gu", {PL, I2}, ctx.dtype), act = ctx.buffer("moe.act", {PL, inter_}, ctx.dtype);
    // AERIE_MOE_GEMM (benchmarks, tests): "cublas" never takes the fused kernel, "fused" must take it.
    const std::string& mode = settings().moe_gemm;
    std::string why = gate_up_w_.empty() ? "an FP8 expert slice not on a block boundary"
                                         : grouped_quant_fused_unsupported(hx, format_, gate_up_w_, off, gu);
    if (why.empty()) why = grouped_quant_fused_unsupported(act, format_, down_w_, off, ys);
    AERIE_CHECK(!(mode == "fused" && !why.empty()),
                "MoE: AERIE_MOE_GEMM=fused, but the fused grouped GEMM cannot take these experts: " << why);
    const bool fused = why.empty() && mode != "cublas";
    // Where each pair's output lands (row_of; with expert parallelism -1 for another rank's pairs); the
    // other path also gathers the pairs' rows in expert order (xs), which the fused kernel reads from h
    // through perm itself.
    Tensor xs = fused ? Tensor() : ctx.buffer("moe.xs", {P, H}, ctx.dtype);
    ctx.prof.time(OpKind::Other, dev, [&] {
      moe_gather_pairs(hx, perm, k, xs, row_of);
      if (ep_) moe_local_rows(row_of, lr0, lr1);
    });
    if (fused && PL > 0) {  // every expert's weight as stored, one kernel per projection
      const Tensor perm_l = perm.slice(lr0, lr1);
      ctx.prof.time(OpKind::Gemm, dev, [&] { matmul_grouped_quant(hx, format_, gate_up_w_, off, gu, &perm_l, k); });
      ctx.prof.time(OpKind::Activation, dev, [&] { swiglu_packed_forward(gu, act); });
      ctx.prof.time(OpKind::Gemm, dev, [&] { matmul_grouped_quant(act, format_, down_w_, off, ys); });
    }
    // Otherwise the experts that got rows, in chunks whose dequantized weights fit the scratch budget
    // (dense experts need none: one chunk); per chunk one grouped GEMM per projection.
    const bool quant = experts_.front().down.format != WeightFormat::Dense;
    const int64_t per_expert = I2 * H;  // scratch elements of one expert's gate/up (down needs half)
    const int64_t chunk = quant ? std::max<int64_t>(1, kMoeScratchBytes / (per_expert * dtype_size(ctx.dtype))) : E;
    // (Local expert indices, off relative to lr0, xs_l: this rank's rows of xs.)
    std::vector<int64_t> active;
    const int64_t EL = ex1_ - ex0_;
    for (int64_t e = 0; !fused && e < EL; ++e)
      if (off[e + 1] > off[e]) active.push_back(e);
    const Tensor xs_l = fused ? Tensor() : xs.slice(lr0, lr1);
    for (size_t c0 = 0; !fused && c0 < active.size(); c0 += static_cast<size_t>(chunk)) {
      const size_t c1 = std::min(active.size(), c0 + static_cast<size_t>(chunk));
      const int64_t e0 = active[c0], e1 = active[c1 - 1] + 1, r0 = off[e0], r1 = off[e1];
      const std::vector<int64_t> offs(off.begin() + e0, off.begin() + e1 + 1);
      std::vector<Tensor> w(static_cast<size_t>(e1 - e0));
      const Tensor scratch = quant ? ctx.scratch("moe.experts", static_cast<int64_t>(c1 - c0) * per_expert, ctx.dtype)
                                   : Tensor();
      // The chunk's weights of one projection: dense ones as they are, quantized ones dequantized into
      // the scratch in one batch.
      auto weights = [&](Linear Expert::*proj, int64_t rows, int64_t cols) {
        if (!quant) {
          for (size_t i = c0; i < c1; ++i) w[active[i] - e0] = (experts_[active[i]].*proj).weight;
          return;
        }
        std::vector<DequantItem> items;
        for (size_t i = c0; i < c1; ++i) {
          Tensor dst = scratch.slice(static_cast<int64_t>(i - c0) * rows * cols,
                                     static_cast<int64_t>(i - c0 + 1) * rows * cols).reshape({rows, cols});
          (experts_[active[i]].*proj).dequant_items(dst, items);
          w[active[i] - e0] = dst;
        }
        ctx.prof.time(OpKind::Other, dev, [&] { dequant_batch(items); });
      };
      Tensor gu_c = gu, act_c = act.slice(r0, r1), gu_rows = gu.slice(r0, r1);
      weights(&Expert::gate_up, I2, H);
      ctx.prof.time(OpKind::Gemm, dev, [&] { matmul_grouped(xs_l, w, offs, gu_c); });
      ctx.prof.time(OpKind::Activation, dev, [&] { swiglu_packed_forward(gu_rows, act_c); });
      weights(&Expert::down, H, inter_);
      ctx.prof.time(OpKind::Gemm, dev, [&] { matmul_grouped(act, w, offs, ys); });
    }
    ctx.prof.time(OpKind::Other, dev, [&] { moe_combine_rows(ys, row_of, w, out); });  // routed sum, fp32
    // The shared experts' down GEMM adds into the routed sum (beta 1: one fp32 rounding of the sum, as an
    // add of the two would give), partial over tp, no reduction of its own.
    if (shared_) shared_->forward(ctx, h, out);
    ctx.all_reduce(out);  // one all-reduce for routed + shared
  }

 private:
  /// The fp32 router weight W as the sum of up to three bf16 tensors (hi = bf16(W), mid = bf16(W - hi),
  /// lo = bf16(W - hi - mid): 3 x 8 significant bits hold an fp32 value's 24, so the sum is W), the
  /// parts that are all zero dropped: a checkpoint's bf16 router (DeepSeek-V3, Kimi) is one part. A bf16
  /// hidden state times a bf16 part is exact in fp32, so the logits h W^T are the fp32 GEMM's up to the
  /// order of the fp32 sums, at bf16 tensor-core speed (an fp32 GEMM of 8192 x 384 x 7168 takes about
  /// 1 ms on an H200). Replaces the fp32 weight in device memory (a BF16 GPU model never needs it).
  void split_router() {
    const Tensor w = gate_.to_device(Device::CPU);
    const int64_t n = w.numel();
    std::vector<std::vector<float>> parts(3, std::vector<float>(static_cast<size_t>(n)));
    std::vector<bool> nonzero(3, false);
    for (int64_t i = 0; i < n; ++i) {
      float r = w.data<float>()[i];
      for (int k = 0; k < 3; ++k) {
        const float b = static_cast<float>(bf16(r));
        parts[k][i] = b;
        nonzero[k] = nonzero[k] || b != 0.0f;
        r -= b;  // exact: b holds r's leading bits
      }
    }
    int keep = 3;
    while (keep > 1 && !nonzero[keep - 1]) --keep;
    for (int k = 0; k < keep; ++k)
      gate_parts_.push_back(Tensor::from_vector(parts[k], gate_.shape()).to(DType::BF16).to_device(Device::CUDA));
    gate_ = Tensor();
  }

  struct Expert {
    Linear gate_up, down;  // [2 I, H] rows gate, up; [H, I]
  };
  MoeSpec s_;
  int64_t inter_ = 0;             // this rank's slice of moe_intermediate_size (all of it with ep_)
  bool ep_ = false;               // expert parallelism: whole experts [ex0_, ex1_) on this rank
  int64_t ex0_ = 0, ex1_ = 0;     // this rank's routed experts (all without ep_); experts_[e - ex0_]
  Tensor gate_, bias_;            // [E, H] F32 (undefined when split into gate_parts_), [E] F32
  std::vector<Tensor> gate_parts_;  // a BF16 GPU model: the router weight as 1-3 bf16 [E, H] parts
  std::vector<Expert> experts_;
  std::unique_ptr<FfnBlock> shared_;  // reduce = false
  GroupedWeightFormat format_ = GroupedWeightFormat::Dense;
  std::vector<GroupedWeight> gate_up_w_, down_w_;  // per expert, for matmul_grouped_quant (or empty)
};

}  // namespace

std::unique_ptr<FfnBlock> make_moe_ffn(WeightSource& src, const MoeSpec& spec, const std::string& prefix) {
  WeightSource::Scope scope(src, WeightCategory::RoutedExperts);
  return std::make_unique<MoeFfn>(src, spec, prefix);
}

}  // namespace aerie
