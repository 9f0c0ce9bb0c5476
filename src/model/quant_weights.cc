// Quantized Linears from a Hugging Face checkpoint (model/quant_weights.h): block FP8 and INT4
// pack-quantized weights and their scales, sliced for this tp rank and kept as stored on the device.
#include "model/quant_weights.h"

#include "core/error.h"
#include "kernels/quant.h"

namespace aerie {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void expect_shape(const HfCheckpoint& ck, const std::string& name, const Shape& want, const std::string& why) {
  const Shape got = ck.shape_of(name);
  AERIE_CHECK(got == want, ck.file_of(name) << ": tensor \"" << name << "\" is " << shape_str(got) << ", expected "
                                            << shape_str(want) << " (" << why << ")");
}

Tensor on(Device d, const Tensor& host) { return d == Device::CPU ? host : host.to_device(d); }

/// This rank's [begin, end) of `n` items split `tp` ways.
void range_of(int64_t n, int tp_rank, int tp_size, int64_t& b, int64_t& e) {
  b = tp_rank * (n / tp_size);
  e = b + n / tp_size;
}

QuantPart fp8_part(HfCheckpoint& ck, const LinearTensor& t, TpSplit split, int rank, int tp, Device d) {
  constexpr int64_t B = kFp8BlockSize;
  const std::string wn = t.name + ".weight", sn = t.name + ".weight_scale_inv";
  const int64_t N = t.full[0], K = t.full[1];
  expect_shape(ck, wn, t.full, "the Linear's [out, in]");
  AERIE_CHECK(ck.contains(sn), ck.file_of(wn) << ": F8_E4M3 tensor \"" << wn << "\" has no \"" << sn << "\"");
  AERIE_CHECK(ck.dtype_of(sn) == DType::F32,
              ck.file_of(sn) << ": tensor \"" << sn << "\" is " << dtype_name(ck.dtype_of(sn)) << ", not F32");
  expect_shape(ck, sn, {cdiv(N, B), cdiv(K, B)}, "one scale per 128 x 128 block of " + shape_str(t.full));
  QuantPart p;
  int64_t r0 = 0, r1 = N, c0 = 0, c1 = K;
  if (split == TpSplit::Rows && tp > 1) range_of(N, rank, tp, r0, r1);
  if (split == TpSplit::Cols && tp > 1) range_of(K, rank, tp, c0, c1);
  // A slice that starts inside a block is stored from that block's first row/column: every stored
  // block is whole (or the tensor's own partial edge block) and keeps its scale, so the dequantized
  // slice is exact; r_off/c_off say where the slice starts.
  const int64_t r0a = r0 / B * B, c0a = c0 / B * B;
  if (r0 > 0 || r1 < N) {
    p.weight = ck.read_raw(wn, 0, r0a, r1);
    p.scale = ck.read_raw(sn, 0, r0a / B, cdiv(r1, B));
  } else if (c0 > 0 || c1 < K) {
    p.weight = ck.read_raw(wn, 1, c0a, c1);
    p.scale = ck.read_raw(sn, 1, c0a / B, cdiv(c1, B));
  } else {
    p.weight = ck.read_raw(wn);
    p.scale = ck.read_raw(sn);
  }
  p.weight = on(d, p.weight);
  p.scale = on(d, p.scale);
  p.rows = r1 - r0;
  p.r_off = r0 - r0a;
  p.c_off = c0 - c0a;
  return p;
}

QuantPart int4_part(HfCheckpoint& ck, const LinearTensor& t, TpSplit split, int rank, int tp, Device d) {
  constexpr int64_t G = kInt4GroupSize;
  const std::string pn = t.name + ".weight_packed", sn = t.name + ".weight_scale", hn = t.name + ".weight_shape";
  const int64_t N = t.full[0], K = t.full[1];
  AERIE_CHECK(ck.contains(sn), ck.file_of(pn) << ": tensor \"" << pn << "\" has no \"" << sn << "\"");
  AERIE_CHECK(ck.contains(hn), ck.file_of(pn) << ": tensor \"" << pn << "\" has no \"" << hn << "\"");
  AERIE_CHECK(ck.dtype_of(pn) == DType::I32,
              ck.file_of(pn) << ": tensor \"" << pn << "\" is " << dtype_name(ck.dtype_of(pn)) << ", not I32");
  const Tensor shape_t = ck.read_raw(hn);
  AERIE_CHECK((shape_t.dtype() == DType::I32 || shape_t.dtype() == DType::I64) && shape_t.numel() == 2,
              ck.file_of(hn) << ": tensor \"" << hn << "\" is " << shape_str(shape_t.shape()) << " "
                             << dtype_name(shape_t.dtype()) << ", not [2] I32 or I64");
  // Its values (N, K); a tensor list (the memory plan's checkpoint) has none to compare: the shapes below
  // still are.
  int64_t n = N, k = K;
  if (!shape_t.is_shape_only()) {
    n = shape_t.dtype() == DType::I32 ? shape_t.data<int32_t>()[0] : shape_t.data<int64_t>()[0];
    k = shape_t.dtype() == DType::I32 ? shape_t.data<int32_t>()[1] : shape_t.data<int64_t>()[1];
  }
  AERIE_CHECK(n == N && k == K, ck.file_of(hn) << ": tensor \"" << hn << "\" says (" << n << ", " << k
                                               << "), expected the Linear's " << shape_str(t.full));
  AERIE_CHECK(K % G == 0, ck.file_of(pn) << ": tensor \"" << pn << "\": in_features " << K
                                         << " is not a multiple of the group size " << G);
  expect_shape(ck, pn, {N, K / 8}, "8 INT4 values per I32 of weight_shape (" + std::to_string(n) + ", " +
                                       std::to_string(k) + ")");
  expect_shape(ck, sn, {N, K / G}, "one scale per 32 columns of " + shape_str(t.full));
  const DType st = ck.dtype_of(sn);
  AERIE_CHECK(st == DType::BF16 || st == DType::F32,
              ck.file_of(sn) << ": tensor \"" << sn << "\" is " << dtype_name(st) << ", not BF16 or F32");
  QuantPart p;
  p.rows = N;
  if (split == TpSplit::Rows && tp > 1) {
    int64_t r0, r1;
    range_of(N, rank, tp, r0, r1);
    p.weight = ck.read_raw(pn, 0, r0, r1);
    p.scale = ck.read_raw(sn, 0, r0, r1);
    p.rows = r1 - r0;
  } else if (split == TpSplit::Cols && tp > 1) {
    AERIE_CHECK((K / tp) % G == 0, ck.file_of(pn) << ": tensor \"" << pn << "\" " << shape_str(t.full) << ": "
                                                  << K / tp << " columns per rank at tp " << tp
                                                  << " are not a whole number of INT4 groups of " << G);
    int64_t c0, c1;
    range_of(K, rank, tp, c0, c1);
    p.weight = ck.read_raw(pn, 1, c0 / 8, c1 / 8);
    p.scale = ck.read_raw(sn, 1, c0 / G, c1 / G);
  } else {
    p.weight = ck.read_raw(pn);
    p.scale = ck.read_raw(sn);
  }
  p.weight = on(d, p.weight);
  p.scale = on(d, p.scale);
  return p;
}

}  // namespace

namespace {

// What the config announces, for a tensor that contradicts it: "<file> has no quantization_config" or
// "<file>'s text_config.quantization_config is block FP8 (quant_method fp8)".
std::string announced(const QuantConfig& quant) {
  if (quant.method == QuantConfig::Method::None) return quant.path + " has no quantization_config";
  return quant.path + "'s " + quant.where + " is " + describe(quant.method) +
         (quant.shadows ? " (the top level's, read before text_config's other one, as vLLM reads them)" : "");
}

}  // namespace

WeightFormat stored_format(const HfCheckpoint& ck, const QuantConfig& quant, const std::string& base) {
  const std::string w = base + ".weight", packed = base + ".weight_packed";
  const bool has_w = ck.contains(w), has_p = ck.contains(packed);
  AERIE_CHECK(has_w || has_p, ck.file_of(w) << ": no tensor \"" << w << "\" (nor \"" << packed << "\")");
  AERIE_CHECK(!(has_w && has_p), ck.file_of(w) << ": both \"" << w << "\" and \"" << packed << "\" exist");
  if (has_p) {
    AERIE_CHECK(quant.method == QuantConfig::Method::Int4Group,
                ck.file_of(packed) << ": tensor \"" << packed << "\" is INT4 pack-quantized, but " << announced(quant)
                                   << " (INT4 weights need quant_method \"compressed-tensors\")");
    return WeightFormat::Int4Group;
  }
  if (ck.dtype_of(w) == DType::F8E4M3) {
    AERIE_CHECK(quant.method == QuantConfig::Method::Fp8Block,
                ck.file_of(w) << ": tensor \"" << w << "\" is F8_E4M3, but " << announced(quant)
                              << " (F8_E4M3 weights need quant_method \"fp8\")");
    return WeightFormat::BlockFp8;
  }
  AERIE_CHECK(!ck.contains(base + ".weight_scale_inv"),
              ck.file_of(w) << ": tensor \"" << w << "\" is " << dtype_name(ck.dtype_of(w)) << " but has a \""
                            << base << ".weight_scale_inv\" (block FP8 weights are F8_E4M3)");
  return WeightFormat::Dense;
}

WeightFormat stored_format(const HfCheckpoint& ck, const QuantConfig& quant, const std::vector<LinearTensor>& parts) {
  AERIE_CHECK(!parts.empty(), "load_linear: no parts");
  const WeightFormat f = stored_format(ck, quant, parts[0].name);
  for (const LinearTensor& t : parts) {
    const WeightFormat g = stored_format(ck, quant, t.name);
    AERIE_CHECK(g == f, ck.file_of(t.name + ".weight") << ": \"" << t.name << "\" is " << weight_format_name(g)
                                                       << " but \"" << parts[0].name << "\", packed with it into one "
                                                       << "Linear, is " << weight_format_name(f));
  }
  return f;
}

Linear load_quantized_linear(HfCheckpoint& ck, WeightFormat format, const std::vector<LinearTensor>& parts,
                             TpSplit split, int tp_rank, int tp_size, Device device) {
  AERIE_CHECK(format == WeightFormat::BlockFp8 || format == WeightFormat::Int4Group,
              "load_quantized_linear: format " << weight_format_name(format) << " is not quantized");
  Linear L;
  L.format = format;
  for (const LinearTensor& t : parts) {
    AERIE_CHECK(t.full.size() == 2, "load_quantized_linear: \"" << t.name << "\": shape " << shape_str(t.full)
                                                                << " is not [out, in]");
    QuantPart p = format == WeightFormat::BlockFp8 ? fp8_part(ck, t, split, tp_rank, tp_size, device)
                                                   : int4_part(ck, t, split, tp_rank, tp_size, device);
    p.row0 = L.out;
    L.out += p.rows;
    L.in = split == TpSplit::Cols ? t.full[1] / tp_size : t.full[1];
    L.parts.push_back(std::move(p));
  }
  return L;
}

}  // namespace aerie
