// ForwardContext and Linear (model/blocks.h).
#include "model/blocks.h"
#include "core/settings.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "kernels/tensor_ops.h"

namespace aerie {

bool batched_decoding(Device device, bool cpu_default, bool cuda_default) {
  const Settings& s = settings();
  if (s.batched_decode >= 0) return s.batched_decode == 1;
  static std::atomic<bool> warned{false};
  const bool on = device == Device::CPU ? cpu_default : cuda_default;
  if (!s.batched_decode_raw.empty() && !warned.exchange(true))
    AERIE_LOG(warning) << "AERIE_BATCHED_DECODE='" << s.batched_decode_raw
                       << "' is neither 1 nor 0: the default (batched decoding " << (on ? "on" : "off") << " here)";
  return on;
}

DecodeRows decode_rows(const ForwardBatch& b, bool on) {
  DecodeRows d;
  d.taken.assign(static_cast<size_t>(b.B), 0);
  if (!on || b.B < 2 || b.direct_cache || !b.tree_parent.empty()) return d;
  for (int64_t i = 0; i < b.B; ++i)
    if (b.cache[i] && b.start[i + 1] - b.start[i] == 1) {
      d.seq.push_back(i);
      d.rows.push_back(b.start[i]);
      d.positions.push_back(b.p0[i]);
      d.lengths.push_back(b.p0[i] + 1);
    }
  if (d.seq.size() < 2) return DecodeRows{{}, {}, {}, {}, std::vector<char>(static_cast<size_t>(b.B), 0)};
  for (int64_t i : d.seq) d.taken[static_cast<size_t>(i)] = 1;
  return d;
}

Tensor ForwardContext::buffer(const std::string& name, const Shape& shape, DType dt) {
  auto it = buffers_.find(name);
  if (it != buffers_.end() && it->second.shape() == shape && it->second.dtype() == dt) return it->second;
  Tensor t = Tensor::empty(shape, dt, device);
  buffers_[name] = t;
  return t;
}

Tensor ForwardContext::scratch(const std::string& name, int64_t numel, DType dt) {
  Tensor& t = (*scratch_)[name];
  if (!t.defined() || t.dtype() != dt || t.numel() < numel) t = Tensor::empty({numel}, dt, device);
  return t.slice(0, numel);
}

void ForwardContext::gemm(const Tensor& x, const Tensor& W, Tensor& y, float beta) {
  prof.time(OpKind::Gemm, device, [&] { matmul(x, W, y, false, true, 1.0f, beta); });
}

void ForwardContext::add_bias(Tensor& y, const Tensor& b) {
  if (!b.defined()) return;
  prof.time(OpKind::Other, device, [&] {
    const int64_t n = y.dim(0);
    if (!ones_.defined() || ones_.dim(0) != n) {
      Tensor ones_f = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f), {n, 1});
      if (dtype != DType::F32) ones_f = ones_f.to(dtype);
      ones_ = device == Device::CPU ? ones_f : ones_f.to_device(device);
    }
    matmul(ones_, b.reshape({1, b.dim(0)}), y, false, false, 1.0f, 1.0f);
  });
}

void ForwardContext::all_reduce(Tensor& y, const Tensor& bias) {
  AERIE_CHECK(!pending_, "ForwardContext::all_reduce: the previous reduction was not finished");
  if (tp.size() > 1 && defer_reduction) {
    prof.time(OpKind::AllReduce, device, [&] { pending_ = tp.start_all_reduce_sum(y); });
    pending_y_ = y;
    pending_bias_ = bias;
    return;
  }
  if (tp.size() > 1) prof.time(OpKind::AllReduce, device, [&] { tp.all_reduce_sum(y); });
  add_bias(y, bias);
}

void ForwardContext::finish_reduction() {
  if (!pending_) return;
  prof.time(OpKind::AllReduce, device, [&] { pending_->wait(); });
  pending_.reset();
  add_bias(pending_y_, pending_bias_);
  pending_y_ = Tensor();
  pending_bias_ = Tensor();
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::BlockFp8: return "block FP8";
    case WeightFormat::Int4Group: return "INT4 pack-quantized";
  }
  return "?";
}

Linear stack_linear_rows(Linear a, Linear b) {
  AERIE_CHECK(a.format == b.format && a.in == b.in && a.bias.defined() == b.bias.defined() &&
                  a.fp8_gemm.empty() == b.fp8_gemm.empty(),
              "stack_linear_rows: a " << weight_format_name(a.format) << " [" << a.out << ", " << a.in << "] and a "
                                      << weight_format_name(b.format) << " [" << b.out << ", " << b.in
                                      << "] (bias, W8A8) do not stack");
  auto stack = [](const Tensor& x, const Tensor& y) {
    Shape s = x.shape();
    s[0] += y.dim(0);
    if (x.is_shape_only()) return Tensor::shape_only(s, x.dtype());
    Tensor t = Tensor::empty(s, x.dtype(), x.device());
    t.slice(0, x.dim(0)).copy_from(x);
    t.slice(x.dim(0), s[0]).copy_from(y);
    return t;
  };
  Linear L = a;
  if (a.format == WeightFormat::Dense && a.weight.defined()) L.weight = stack(a.weight, b.weight);
  for (QuantPart q : b.parts) {
    q.row0 += a.out;
    L.parts.push_back(std::move(q));
  }
  for (Linear::Fp8GemmPart f : b.fp8_gemm) {
    f.row0 += a.out;
    L.fp8_gemm.push_back(std::move(f));
  }
  if (a.bias.defined()) L.bias = stack(a.bias, b.bias);
  L.out = a.out + b.out;
  return L;
}

int64_t Linear::weight_bytes() const {
  size_t b = weight.defined() ? weight.nbytes() : 0;
  for (const QuantPart& p : parts) b += p.weight.nbytes() + p.scale.nbytes();
  return static_cast<int64_t>(b);
}

void Linear::dequantize(Tensor& dst) const {
  AERIE_CHECK(dst.shape() == (Shape{out, in}) && (dst.dtype() == DType::F32 || dst.dtype() == DType::BF16),
              "Linear::dequantize: dst " << shape_str(dst.shape()) << " " << dtype_name(dst.dtype()) << " for a "
                                         << weight_format_name(format) << " weight [" << out << ", " << in << "]");
  if (format == WeightFormat::Dense) {
    if (weight.dtype() == dst.dtype())
      dst.copy_from(weight);
    else
      convert(weight, dst);
    return;
  }
  // One dequant_batch launch for the parts (its vectorised kernel on the GPU; the same values as the
  // single dequantizations, bit for bit).
  std::vector<DequantItem> items;
  dequant_items(dst, items);
  dequant_batch(items);
}

void Linear::dequant_items(Tensor& dst, std::vector<DequantItem>& items) const {
  AERIE_CHECK(format != WeightFormat::Dense && dst.shape() == (Shape{out, in}),
              "Linear::dequant_items: dst " << shape_str(dst.shape()) << " for a " << weight_format_name(format)
                                            << " weight [" << out << ", " << in << "]");
  for (const QuantPart& p : parts) {
    Tensor rows = dst.slice(p.row0, p.row0 + p.rows);
    if (format == WeightFormat::Int4Group) {
      items.push_back({true, p.weight, p.scale, in, 0, p.rows, rows, {}});
    } else if (p.c_off == 0 && p.weight.dim(1) == in) {
      items.push_back({false, p.weight, p.scale, 0, p.r_off, p.r_off + p.rows, rows, {}});
    } else {
      Tensor wide = Tensor::empty({p.rows, p.weight.dim(1)}, dst.dtype(), dst.device());
      dequant_fp8_block(p.weight, p.scale, p.r_off, p.r_off + p.rows, wide);
      copy_columns(wide, p.c_off, rows, 0, in);
    }
  }
}

void Linear::matmul(ForwardContext& ctx, const Tensor& x, Tensor& y, float beta) const {
  if (format == WeightFormat::Dense) {
    ctx.gemm(x, weight, y, beta);
    return;
  }
  if (!fp8_gemm.empty() && !fp8_gemm_unsupported && x.dim(0) > 0) {
    // cuBLASLt's block-scaled FP8 GEMM takes a row count that is a multiple of 4 (measured on an H200,
    // cuBLAS 13.1: M = 1 and 37 are NOT_SUPPORTED): other counts run on zero-padded copies of x and y.
    const int64_t n = x.dim(0), n4 = (n + 3) / 4 * 4, blocks = (in + kFp8BlockSize - 1) / kFp8BlockSize;
    Tensor xin = x, yout = y;
    if (n4 != n) {
      xin = ctx.scratch("linear.fp8.xpad", n4 * in, x.dtype()).reshape({n4, in});
      Tensor head = xin.slice(0, n), pad = xin.slice(n, n4);
      head.copy_from(x);
      pad.fill_zero();
      yout = ctx.scratch("linear.fp8.ypad", n4 * out, y.dtype()).reshape({n4, out});
      if (beta != 0.0f) {
        Tensor yh = yout.slice(0, n);
        yh.copy_from(y);
      }
    }
    Tensor xq = ctx.scratch("linear.fp8.x", n4 * in, DType::U8).reshape({n4, in});
    Tensor xs = ctx.scratch("linear.fp8.scale", blocks * n4, DType::F32).reshape({blocks, n4});
    ctx.prof.time(OpKind::Other, ctx.device, [&] { quantize_fp8_rows(xin, xq, xs); });
    bool queued = true;
    std::string why;
    ctx.prof.time(OpKind::Gemm, ctx.device, [&] {
      for (size_t i = 0; i < fp8_gemm.size() && queued; ++i) {
        const Fp8GemmPart& p = fp8_gemm[i];
        queued = matmul_fp8_block(xq, xs, p.weight, p.scale, yout, p.row0, beta, &why);
        // cuBLASLt decides per shape; the parts of one Linear share K, so a refusal comes at the first.
        AERIE_CHECK(queued || i == 0, "Linear: the FP8 GEMM of part " << i << " of a [" << out << ", " << in
                                                                      << "] weight has no cuBLASLt algorithm");
      }
    });
    if (queued) {
      if (n4 != n) y.copy_from(yout.slice(0, n));
      return;
    }
    fp8_gemm_unsupported = true;
    static std::atomic<bool> warned{false};  // once per process, not once per Linear
    if (!warned.exchange(true))
      AERIE_LOG(warning) << "--fp8-gemm: no block-scaled FP8 GEMM for a [" << out << ", " << in << "] weight and " << n
                         << " rows (" << why << "; a GPU other than Hopper, or cuBLAS < 12.9?): such linears "
                         << "dequantize their weights instead";
  }
  // The dequantized weight is rounded to the compute dtype: in BF16 mode to bf16, as DeepSeek's
  // weight_dequant, transformers' FP8 dequantization and compressed-tensors' decompress do (the goldens
  // of reference.safetensors); in F32 mode it keeps the exact fp32 product (the goldens of
  // reference_f32_dequant.safetensors), as an FP8 GEMM that scales its fp32 accumulators would.
  Tensor w = ctx.scratch("linear.dequant", out * in, ctx.dtype).reshape({out, in});  // [out, in]
  ctx.prof.time(OpKind::Other, ctx.device, [&] { dequantize(w); });
  ctx.gemm(x, w, y, beta);
}

bool Linear::use_fp8_gemm() {
  if (format == WeightFormat::Int4Group) return false;
  if (format == WeightFormat::BlockFp8)
    for (const QuantPart& p : parts)
      if (p.r_off != 0 || p.c_off != 0 || p.weight.dim(1) != in || p.weight.dim(0) != p.rows) return false;
  if (format == WeightFormat::Dense) {
    QuantPart p;
    p.weight = Tensor::empty({out, in}, DType::F8E4M3, weight.device());
    p.scale = Tensor::empty({(out + kFp8BlockSize - 1) / kFp8BlockSize, (in + kFp8BlockSize - 1) / kFp8BlockSize},
                            DType::F32, weight.device());
    quantize_fp8_block(weight, p.weight, p.scale);
    p.rows = out;
    parts = {p};
    format = WeightFormat::BlockFp8;
    weight = Tensor();
  }
  fp8_gemm.clear();
  for (const QuantPart& p : parts) fp8_gemm.push_back({p.weight, fp8_gemm_weight_scale(p.scale, in), p.row0, p.rows});
  return true;
}

void Linear::add_bias(ForwardContext& ctx, Tensor& y) const { ctx.add_bias(y, bias); }

}  // namespace aerie
