// DeepSeek-V3's MoE FFN block (model/blocks.h MoeSpec; transformers' DeepseekV3MoE). Per forward
// (n rows, k = top_k, P = n k pairs, I = this rank's slice of moe_intermediate_size):
//   h32 [n, H] F32 (h in fp32 for the router)   logits [n, E] F32   idx [n, k] I32, w [n, k] F32
//   counts [E], offsets [E + 1], perm [P] (pairs sorted by expert; offsets/counts read on the host)
//   xs [P, H] (h's rows in expert order)   gu [c_e, 2 I], act [c_e, I] per expert   ys [P, H] F32
//   y [P, H] F32 (pair order)   routed [n, H] F32 = sum_k w y   out = all_reduce(routed + shared(h))
// Every expert's rows go through one gate/up GEMM and one down GEMM (a loop over the experts that got
// rows; a grouped GEMM is the GPU's next step).
#include <vector>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/moe_router.h"
#include "kernels/optim.h"
#include "kernels/tensor_ops.h"
#include "model/blocks.h"

namespace aerie {

namespace {

class MoeFfn final : public FfnBlock {
 public:
  MoeFfn(WeightSource& src, const MoeSpec& s, const std::string& p) : s_(s) {
    const int tp = src.tp_size();
    AERIE_CHECK(s.moe_intermediate % tp == 0,
                "tp " << tp << " does not divide moe_intermediate_size " << s.moe_intermediate);
    inter_ = s.moe_intermediate / tp;
    const int64_t H = s.hidden, I = s.moe_intermediate, E = s.experts;
    gate_ = src.load(p + "gate.weight", {E, H}, TpSplit::None, ParamRole::Router);
    bias_ = src.load(p + "gate.e_score_correction_bias", {E}, TpSplit::None, ParamRole::RouterBias);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      Expert ex;
      ex.gate_up = src.load_linear({{x + "gate_proj", {I, H}}, {x + "up_proj", {I, H}}}, TpSplit::Rows);
      ex.down = src.load_linear(x + "down_proj", {H, I}, TpSplit::Cols);
      experts_.push_back(std::move(ex));
    }
    if (s.shared_experts > 0)
      shared_ = make_dense_ffn(src, {H, s.moe_intermediate * s.shared_experts, false, false}, p + "shared_experts.");
  }

  void forward(ForwardContext& ctx, const Tensor& h, Tensor& out) override {
    const int64_t n = ctx.batch.n, H = s_.hidden, E = s_.experts, k = s_.top_k, P = n * k;
    const Device dev = ctx.device;
    // Router, in fp32.
    Tensor h32 = h;
    if (h.dtype() != DType::F32) {
      h32 = ctx.buffer("moe.h32", {n, H}, DType::F32);
      convert(h, h32);
    }
    Tensor logits = ctx.buffer("moe.logits", {n, E}, DType::F32);
    ctx.gemm(h32, gate_, logits);
    Tensor idx = ctx.buffer("moe.idx", {n, k}, DType::I32), w = ctx.buffer("moe.w", {n, k}, DType::F32);
    Tensor counts = ctx.buffer("moe.counts", {E}, DType::I32), offsets = ctx.buffer("moe.offsets", {E + 1}, DType::I32);
    Tensor perm = ctx.buffer("moe.perm", {P}, DType::I32);
    ctx.prof.time(OpKind::Other, dev, [&] {
      MoeRouterConfig rc{s_.n_group, s_.topk_group, k, s_.norm_topk_prob, s_.routed_scaling_factor};
      moe_router_noaux_tc(logits, bias_, rc, idx, w);
      moe_sort_by_expert(idx, E, counts, offsets, perm);
    });
    // The pairs' rows in expert order, and where each pair's row lands (the host needs the offsets
    // to size the expert GEMMs).
    Tensor off_h = dev == Device::CPU ? offsets : offsets.to_device(Device::CPU);
    Tensor perm_h = dev == Device::CPU ? perm : perm.to_device(Device::CPU);
    std::vector<int32_t> token_of(static_cast<size_t>(P)), row_of(static_cast<size_t>(P));
    for (int64_t r = 0; r < P; ++r) {
      const int32_t pair = perm_h.data<int32_t>()[r];
      token_of[r] = static_cast<int32_t>(pair / k);
      row_of[pair] = static_cast<int32_t>(r);
    }
    auto on_device = [dev](Tensor t) { return dev == Device::CPU ? t : t.to_device(dev); };
    Tensor xs = ctx.buffer("moe.xs", {P, H}, ctx.dtype), ys = ctx.buffer("moe.ys", {P, H}, DType::F32);
    ctx.prof.time(OpKind::Other, dev,
                  [&] { embedding_forward(on_device(Tensor::from_vector(token_of, {P})), h, xs); });
    const int32_t* off = off_h.data<int32_t>();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t b = off[e], c = off[e + 1] - off[e];
      if (c == 0) continue;
      Tensor gu = Tensor::empty({c, 2 * inter_}, ctx.dtype, dev), act = Tensor::empty({c, inter_}, ctx.dtype, dev);
      Tensor y_e = ys.slice(b, b + c);
      experts_[e].gate_up.matmul(ctx, xs.slice(b, b + c), gu);
      ctx.prof.time(OpKind::Activation, dev, [&] { swiglu_packed_forward(gu, act); });
      experts_[e].down.matmul(ctx, act, y_e);
    }
    Tensor y = ctx.buffer("moe.y", {P, H}, DType::F32);
    ctx.prof.time(OpKind::Other, dev, [&] {
      embedding_forward(on_device(Tensor::from_vector(row_of, {P})), ys, y);  // back to pair order
      moe_combine(y, w, out);                                                  // routed sum, fp32
    });
    if (shared_) {
      Tensor sh = ctx.buffer("moe.shared", {n, H}, DType::F32);
      shared_->forward(ctx, h, sh);  // partial over tp, no reduction
      ctx.prof.time(OpKind::Other, dev, [&] { add_inplace(out, sh); });
    }
    ctx.all_reduce(out);  // one all-reduce for routed + shared
  }

 private:
  struct Expert {
    Linear gate_up, down;  // [2 I, H] rows gate, up; [H, I]
  };
  MoeSpec s_;
  int64_t inter_ = 0;             // this rank's slice of moe_intermediate_size
  Tensor gate_, bias_;            // [E, H] F32, [E] F32
  std::vector<Expert> experts_;
  std::unique_ptr<FfnBlock> shared_;  // reduce = false
};

}  // namespace

std::unique_ptr<FfnBlock> make_moe_ffn(WeightSource& src, const MoeSpec& spec, const std::string& prefix) {
  return std::make_unique<MoeFfn>(src, spec, prefix);
}

}  // namespace aerie
