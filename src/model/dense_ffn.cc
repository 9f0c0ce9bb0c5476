// The dense SwiGLU FFN block (transformers' LlamaMLP), tensor parallel by the intermediate dimension:
//   out = all_reduce_sum((silu(h Wg^T + bg) * (h Wu^T + bu)) Wd^T) + bd
// with gate/up packed into one GEMM ([n, 2 I/tp]) and swiglu_packed_forward on its output.
#include "core/error.h"
#include "kernels/fused.h"
#include "model/blocks.h"

namespace aerie {

namespace {

class DenseFfn final : public FfnBlock {
 public:
  DenseFfn(WeightSource& src, const DenseFfnSpec& s, const std::string& p)
      : reduce_(s.reduce), accumulate_(s.accumulate) {
    const int tp = src.tp_size();
    AERIE_CHECK(!(s.accumulate && s.reduce), "a dense FFN that accumulates into its output does not reduce it");
    AERIE_CHECK(s.intermediate % tp == 0, "tp " << tp << " does not divide intermediate_size " << s.intermediate);
    inter_ = s.intermediate / tp;
    const int64_t H = s.hidden, I = s.intermediate;
    gate_up_ = src.load_linear({{p + "gate_proj", {I, H}}, {p + "up_proj", {I, H}}}, TpSplit::Rows);  // rows: gate, up
    down_ = src.load_linear(p + "down_proj", {H, I}, TpSplit::Cols);
    if (s.bias) {
      gate_up_.bias = Tensor::empty({2 * inter_}, src.dtype(), src.device());
      src.load_into(p + "gate_proj.bias", {I}, TpSplit::Rows, ParamRole::Bias, gate_up_.bias.slice(0, inter_));
      src.load_into(p + "up_proj.bias", {I}, TpSplit::Rows, ParamRole::Bias, gate_up_.bias.slice(inter_, 2 * inter_));
      down_.bias = src.load(p + "down_proj.bias", {H}, TpSplit::None, ParamRole::Bias);
    }
  }

  void forward(ForwardContext& ctx, const Tensor& h, Tensor& out) override {
    const int64_t n = ctx.batch.n;
    Tensor gu = ctx.buffer("ffn.gate_up", {n, 2 * inter_}, ctx.dtype);  // packed gate/up GEMM output
    Tensor act = ctx.buffer("ffn.act", {n, inter_}, ctx.dtype);         // silu(g) * u
    gate_up_.forward(ctx, h, gu);
    ctx.prof.time(OpKind::Activation, ctx.device, [&] { swiglu_packed_forward(gu, act); });
    down_.matmul(ctx, act, out, accumulate_ ? 1.0f : 0.0f);  // [n, H], partial sum over tp ranks
    if (!reduce_) return;  // a partial sum that the caller reduces (with its bias: none for shared experts)
    ctx.all_reduce(out, down_.bias);  // the bias once, after the reduction
  }

 private:
  bool reduce_ = true, accumulate_ = false;
  int64_t inter_ = 0;      // this rank's intermediate slice I/tp
  Linear gate_up_, down_;  // [2 I/tp, H] rows gate, up; [H, I/tp]
};

}  // namespace

std::unique_ptr<FfnBlock> make_dense_ffn(WeightSource& src, const DenseFfnSpec& spec, const std::string& prefix) {
  // A dense FFN built inside an MoE block is its shared experts.
  const bool shared = src.context().block == WeightCategory::RoutedExperts;
  WeightSource::Scope scope(src, shared ? WeightCategory::SharedExperts : WeightCategory::DenseMlp);
  return std::make_unique<DenseFfn>(src, spec, prefix);
}

}  // namespace aerie
