// The two WeightSources: a Hugging Face checkpoint, streamed tensor by tensor, and random weights.
#include "model/weight_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/convert.h"
#include "kernels/tensor_ops.h"
#include "model/quant_weights.h"

namespace aerie {

WeightSource::WeightSource(int tp_rank, int tp_size, Device device, DType dtype)
    : tp_rank_(tp_rank), tp_size_(tp_size), device_(device), dtype_(dtype) {
  AERIE_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size,
              "WeightSource: tp rank " << tp_rank << " of " << tp_size);
  AERIE_CHECK(dtype == DType::F32 || dtype == DType::BF16,
              "the target's compute dtype must be F32 or BF16, got " << dtype_name(dtype));
}

const char* category_name(WeightCategory c) {
  static const char* names[kWeightCategories] = {"attention", "dense MLP", "shared experts", "routed experts",
                                                 "router",    "embedding + lm_head", "norms", "other"};
  return names[static_cast<int>(c)];
}

WeightSource::SplitAs::SplitAs(WeightSource& src, int rank, int size)
    : src_(src), rank_(src.tp_rank_), size_(src.tp_size_) {
  AERIE_CHECK(size >= 1 && rank >= 0 && rank < size, "WeightSource::SplitAs: rank " << rank << " of " << size);
  src.tp_rank_ = rank;
  src.tp_size_ = size;
}

Shape WeightSource::slice_shape(const Shape& full, TpSplit split) const {
  Shape s = full;
  const size_t dim = split == TpSplit::Rows ? 0 : 1;
  if (split == TpSplit::None || tp_size_ == 1) return s;
  AERIE_CHECK(s.size() > dim && s[dim] % tp_size_ == 0,
              "shape " << shape_str(full) << ": dim " << dim << " does not split over tp " << tp_size_);
  s[dim] /= tp_size_;
  return s;
}

Tensor WeightSource::load(const std::string& name, const Shape& full, TpSplit split, ParamRole role) {
  Tensor t = Tensor::empty(slice_shape(full, split), dtype_of(role), device_);
  load_into(name, full, split, role, t);
  return t;
}

Linear WeightSource::load_linear(const std::string& name, const Shape& full, TpSplit split) {
  return load_linear(std::vector<LinearTensor>{{name, full}}, split);
}

Linear WeightSource::load_linear(const std::vector<LinearTensor>& parts, TpSplit split) {
  Linear L = load_linear_parts(parts, split);
  if (fp8_gemm_) {
    const bool dense = L.format == WeightFormat::Dense, int4 = L.format == WeightFormat::Int4Group;
    if (L.use_fp8_gemm()) {
      ++fp8_counts_.switched;
      fp8_counts_.quantized += dense;
    } else {
      ++(int4 ? fp8_counts_.int4 : fp8_counts_.misaligned);
    }
  }
  return L;
}

Linear WeightSource::load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split) {
  AERIE_CHECK(!parts.empty(), "load_linear: no parts");
  Linear L;
  for (const LinearTensor& t : parts) {
    AERIE_CHECK(t.full.size() == 2 && t.full[1] == parts[0].full[1],
                "load_linear: \"" << t.name << "\" " << shape_str(t.full) << " is not [out, "
                                   << parts[0].full[1] << "]");
    const Shape s = slice_shape(t.full, split);  // throws when tp does not divide the split dimension
    L.out += s[0];
    L.in = s[1];
  }
  L.weight = Tensor::empty({L.out, L.in}, dtype_, device_);
  int64_t row = 0;
  for (const LinearTensor& t : parts) {
    const int64_t r = slice_shape(t.full, split)[0];
    load_into(t.name + ".weight", t.full, split, ParamRole::Linear, L.weight.slice(row, row + r));
    row += r;
  }
  return L;
}

void WeightSource::skip_linear(const std::vector<LinearTensor>& parts) {
  for (const LinearTensor& t : parts) skip_prefix(t.name + ".", "another rank's expert");
}

namespace {

class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const std::string& dir, int r, int s, Device d, DType t, const QuantConfig& q)
      : WeightSource(r, s, d, t), ck_(dir), quant_(q) {
    if (quant_.path.empty()) quant_.path = dir + "/config.json";
  }
  using WeightSource::load_linear;
  Linear load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split) override {
    AERIE_CHECK(!parts.empty(), "load_linear: no parts");
    for (const LinearTensor& t : parts) slice_shape(t.full, split);  // throws when tp does not divide it
    const WeightFormat f = stored_format(ck_, quant_, parts);
    if (f == WeightFormat::Dense) return WeightSource::load_linear_parts(parts, split);
    return load_quantized_linear(ck_, f, parts, split, tp_rank_, tp_size_, device_);
  }
  std::string decoder_prefix() const override { return ck_.decoder_prefix(); }
  bool has(const std::string& name) const override { return ck_.contains(name); }
  void skip(const std::string& name, const Shape& full) override { ck_.skip(name, full); }
  int64_t skip_prefix(const std::string& prefix, const std::string&) override { return ck_.skip_prefix(prefix); }
  void load_into(const std::string& name, const Shape& full, TpSplit split, ParamRole role, Tensor dst) override {
    Tensor host = ck_.read_slice(name, full, split, tp_rank_, tp_size_, dtype_of(role));
    AERIE_CHECK(host.shape() == dst.shape() && host.dtype() == dst.dtype(),
                ck_.file_of(name) << ": tensor \"" << name << "\": slice " << shape_str(host.shape()) << " "
                                  << dtype_name(host.dtype()) << " for a parameter of " << shape_str(dst.shape())
                                  << " " << dtype_name(dst.dtype()));
    dst.copy_from(host);  // host -> device (or host) copy; `host` is dropped here
  }
  void finish(const std::string& what) override {
    // A language-model tensor this implementation does not read (a bias or q_norm the config does not
    // announce, extra layers) means another architecture.
    ck_.check_all_read(what);
    std::ostringstream others;
    for (const auto& [group, count] : ck_.other_tensors())
      others << (others.tellp() > 0 ? ", " : "") << group << ".* (" << count << ")";
    if (others.tellp() > 0)
      AERIE_LOG(info) << ck_.dir() << ": skipped the tensors outside the language model: " << others.str();
  }

 private:
  HfCheckpoint ck_;
  QuantConfig quant_;
};

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class RandomSource final : public WeightSource {
 public:
  RandomSource(uint64_t seed, int r, int s, Device d, DType t, float std, const QuantConfig& quant)
      : WeightSource(r, s, d, t), std_(std), quant_(quant) {
    // The pool: 2P normal values (P odd-sized so that rows of a tensor do not repeat in step), uploaded
    // once; a tensor of n values is the windows [o, o + P) of the pool repeated, o per tensor.
    s_ = seed * 0x2545F4914F6CDD1Dull + 1;
    std::vector<float> pool(2 * kPool);
    for (int64_t i = 0; i < 2 * kPool; i += 2) {  // Box-Muller: two normals from two uniforms in (0, 1]
      const double u1 = (static_cast<double>(splitmix64(s_) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(splitmix64(s_) >> 11) * 0x1.0p-53;
      const double rr = std::sqrt(-2.0 * std::log(u1)) * std;
      pool[i] = static_cast<float>(rr * std::cos(2.0 * M_PI * u2));
      pool[i + 1] = static_cast<float>(rr * std::sin(2.0 * M_PI * u2));
    }
    pool_ = Tensor::from_vector(pool, {2 * kPool});
    if (t != DType::F32) pool_ = pool_.to(t);
    if (d != Device::CPU) pool_ = pool_.to_device(d);
  }
  ~RandomSource() override {
    if (device_ != Device::CPU) cuda::synchronize();  // no copy from the pool may still be queued
  }
  std::string decoder_prefix() const override { return "model."; }
  using WeightSource::load_linear;
  /// Dense as the base class; in the shipped formats where `quant` says the checkpoint holds them: INT4
  /// groups for the routed experts (".mlp.experts." in the name; Kimi-K2.5), block FP8 for every Linear
  /// (DeepSeek-V3, Kimi-K2). A quantized weight is drawn as this rank's slice only (not tp-consistent:
  /// benchmarks of one tp size), from a pool of random bytes: INT4 nibbles uniform in [-8, 7] with
  /// scale std / 4.6; FP8 codes of magnitude 1/8 .. 15/4 with scale_inv std / 1.5 (std about `std`).
  Linear load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split) override {
    const bool int4 = int4_linear(parts), fp8 = quant_.method == QuantConfig::Method::Fp8Block;
    if (!int4 && !fp8) return WeightSource::load_linear_parts(parts, split);
    Linear L;
    L.format = int4 ? WeightFormat::Int4Group : WeightFormat::BlockFp8;
    for (const LinearTensor& t : parts) {
      const Shape sl = slice_shape(t.full, split);
      AERIE_CHECK(!int4 || sl[1] % kInt4GroupSize == 0,
                  "random INT4 weight \"" << t.name << "\": in_features " << sl[1] << " is not a multiple of 32");
      QuantPart q;
      q.row0 = L.out;
      q.rows = sl[0];
      const int64_t scale_cols = int4 ? sl[1] / kInt4GroupSize : (sl[1] + kFp8BlockSize - 1) / kFp8BlockSize;
      const int64_t scale_rows = int4 ? sl[0] : (sl[0] + kFp8BlockSize - 1) / kFp8BlockSize;
      q.weight = Tensor::empty(int4 ? Shape{sl[0], sl[1] / 8} : Shape{sl[0], sl[1]}, int4 ? DType::I32 : DType::F8E4M3,
                               device_);
      fill_bytes(q.weight);
      const std::vector<float> sv(static_cast<size_t>(scale_rows * scale_cols), std_ / (int4 ? 4.6f : 1.5f));
      Tensor sc = Tensor::from_vector(sv, {scale_rows, scale_cols});
      if (int4) sc = sc.to(DType::BF16);
      q.scale = device_ == Device::CPU ? sc : sc.to_device(device_);
      L.out += sl[0];
      L.in = sl[1];
      L.parts.push_back(std::move(q));
    }
    return L;
  }
  bool has(const std::string&) const override { return true; }
  void skip(const std::string&, const Shape&) override {}
  int64_t skip_prefix(const std::string&, const std::string&) override { return 0; }
  /// The draws load_linear would make: one window offset per part, and the byte pool at its first use
  /// (quantized parts), so a skipped expert leaves the stream where loading it would.
  void skip_linear(const std::vector<LinearTensor>& parts) override {
    const bool quantized = int4_linear(parts) || quant_.method == QuantConfig::Method::Fp8Block;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (quantized) make_byte_pool();
      splitmix64(s_);
    }
  }
  void finish(const std::string&) override {
    if (device_ != Device::CPU) cuda::synchronize();
  }
  void load_into(const std::string&, const Shape& full, TpSplit split, ParamRole role, Tensor dst) override {
    if (role == ParamRole::Norm) {
      Tensor ones = Tensor::from_vector(std::vector<float>(static_cast<size_t>(dst.numel()), 1.0f), {dst.numel()});
      dst.reshape({dst.numel()}).copy_from(device_ == Device::CPU ? ones : ones.to_device(device_));
      return;
    }
    if (role == ParamRole::Bias || role == ParamRole::RouterBias) {
      dst.fill_zero();
      return;
    }
    if (dst.dtype() != pool_.dtype()) {  // an F32 router weight in the BF16 mode: draw bf16, widen
      Tensor drawn = Tensor::empty(dst.shape(), pool_.dtype(), device_);
      load_into("", full, split, ParamRole::Linear, drawn);
      convert(drawn, dst);
      return;
    }
    if (split == TpSplit::None || tp_size_ == 1 || full.size() != 2) {
      fill(dst);
      return;
    }
    // Every rank draws the FULL tensor (same offsets in the same order on every rank) and keeps its
    // slice: rows of a column-parallel weight, columns of a row-parallel one.
    Tensor whole = Tensor::empty(full, dst.dtype(), dst.device());
    fill(whole);
    if (split == TpSplit::Rows)
      dst.copy_from(whole.slice(tp_rank_ * dst.dim(0), (tp_rank_ + 1) * dst.dim(0)));
    else
      copy_columns(whole, tp_rank_ * dst.dim(1), dst, 0, dst.dim(1));
  }

 private:
  static constexpr int64_t kPool = (int64_t{1} << 22) + 4099;
  /// Whether `quant` stores this Linear as INT4 groups (Kimi-K2.5's routed experts).
  bool int4_linear(const std::vector<LinearTensor>& parts) const {
    return quant_.method == QuantConfig::Method::Int4Group && parts[0].name.find(".mlp.experts.") != std::string::npos;
  }
  void fill(Tensor& t) {
    Tensor flat = t.reshape({t.numel()});
    int64_t o = static_cast<int64_t>(splitmix64(s_) % static_cast<uint64_t>(kPool));
    for (int64_t i = 0; i < t.numel(); i += kPool) {
      const int64_t n = std::min(kPool, t.numel() - i);
      flat.slice(i, i + n).copy_from(pool_.slice(o, o + n));
      o = (o + 7919) % kPool;  // the next window starts elsewhere
    }
  }
  /// t's bytes tiled from the byte pool (made at first use: sign random, exponent 4..8, mantissa random,
  /// i.e. e4m3fn values of magnitude 1/8 .. 15/4 and never NaN; as INT4 words any nibbles).
  void make_byte_pool() {
    if (bytes_.defined()) return;
    std::vector<uint8_t> b(static_cast<size_t>(kPool));
    for (auto& x : b) {
      const uint64_t r = splitmix64(s_);
      x = static_cast<uint8_t>(((r & 1) << 7) | ((4 + (r >> 1) % 5) << 3) | ((r >> 8) & 7));
    }
    bytes_ = Tensor::from_vector(b, {kPool});
    if (device_ != Device::CPU) bytes_ = bytes_.to_device(device_);
  }
  void fill_bytes(Tensor& t) {
    make_byte_pool();
    const int64_t n = static_cast<int64_t>(t.nbytes());
    auto* dst = static_cast<uint8_t*>(t.raw());
    const auto* src = static_cast<const uint8_t*>(bytes_.raw());
    int64_t o = static_cast<int64_t>(splitmix64(s_) % static_cast<uint64_t>(kPool / 2));
    for (int64_t i = 0; i < n; i += kPool / 2) {
      const int64_t c = std::min(kPool / 2, n - i);
      if (device_ == Device::CPU)
        std::memcpy(dst + i, src + o, static_cast<size_t>(c));
      else
        cuda::memcpy(dst + i, src + o, static_cast<size_t>(c));
      o = (o + 7919) % (kPool / 2);
    }
  }
  uint64_t s_ = 0;
  float std_ = 0.02f;
  QuantConfig quant_;
  Tensor pool_, bytes_;
};

}  // namespace

std::unique_ptr<WeightSource> checkpoint_weights(const std::string& dir, int tp_rank, int tp_size, Device device,
                                                 DType dtype, const QuantConfig& quant) {
  return std::make_unique<CheckpointSource>(dir, tp_rank, tp_size, device, dtype, quant);
}

std::unique_ptr<WeightSource> random_weights(uint64_t seed, int tp_rank, int tp_size, Device device, DType dtype,
                                             float std, const QuantConfig& quant) {
  return std::make_unique<RandomSource>(seed, tp_rank, tp_size, device, dtype, std, quant);
}

}  // namespace aerie
