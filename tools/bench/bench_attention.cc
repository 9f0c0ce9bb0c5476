// bench_attention: aerie's causal GQA attention forward and backward (kernels/attention.h) on one GPU, bf16, at
// the shapes tools/bench/bench_attention.sh gives torch's FlashAttention-2 backend in the same call.
//
// For each --head-dims d and --tokens T: q [T, heads, d], k and v [T, kv-heads, d] (uniform in [-1, 1]), one
// sequence, scale 1/sqrt(d); the forward writes out and lse, the backward dq (bf16) and adds into bf16 dk / dv, as
// the draft's training step calls them. Which kernel runs is aerie's own choice on this GPU, so run it under
// AERIE_CUDA_EMULATE=sm_120 for the path an RTX PRO 6000 takes (mma.sync, 99 KiB of shared memory per block, as many
// blocks per SM as its 100 KiB hold), or
// AERIE_ATTENTION_FORWARD_KERNEL / AERIE_ATTENTION_BACKWARD_KERNEL to force one (core/settings.h).
//
// Prints one JSON line per shape: {"bench": "attention", "impl": "aerie", "path": AERIE_CUDA_EMULATE or
// "native", then "+" and the kernel settings where set (e.g. "sm_120+mma64"), "gpu", "d", "tokens", "heads",
// "kv_heads", "fwd_ms", "bwd_ms", "fwd_tflops", "bwd_tflops"}.
// FLOPs count the causal half, as FlashAttention's benchmarks do: forward 4 T^2 / 2 heads d, backward 2.5 times
// that (its five products against the forward's two).
//
// Usage: bench_attention [--head-dims 64,128] [--tokens 2048,8192] [--heads 32] [--kv-heads 8] [--iters 20]
//                        [--warmup 3]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/device.h"
#include "core/error.h"
#include "core/settings.h"
#include "kernels/attention.h"

namespace aerie {
namespace {

using bench::RandomFill;
using bench::timed;

struct Args {
  std::vector<int64_t> head_dims{64, 128};
  std::vector<int64_t> tokens{2048, 8192};
  int64_t heads = 32, kv_heads = 8;
  int iters = 20, warmup = 3;
};

/// `text` as an integer of at least `min`, the whole of it; throws aerie::Error naming `what`.
int64_t integer(const std::string& text, const std::string& what, int64_t min = 1) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  AERIE_CHECK(used == text.size() && !text.empty() && v >= min,
              what << " must be an integer of at least " << min << ", got '" << text << "'");
  return v;
}

std::vector<int64_t> int_list(const std::string& s, const std::string& what) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    AERIE_CHECK(!item.empty(), what << ": empty item in the list '" << s << "'");
    v.push_back(integer(item, what));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

constexpr const char* kUsage =
    "usage: bench_attention [--head-dims 64,128] [--tokens 2048,8192] [--heads 32] [--kv-heads 8] [--iters 20] "
    "[--warmup 3]; tools/bench/bench_attention.cc's header says what it prints";

/// The options; nullopt for --help.
std::optional<Args> parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") return std::nullopt;
    auto next = [&]() -> std::string {
      AERIE_CHECK(i + 1 < argc, k << " needs a value");
      return argv[++i];
    };
    if (k == "--head-dims") a.head_dims = int_list(next(), k);
    else if (k == "--tokens") a.tokens = int_list(next(), k);
    else if (k == "--heads") a.heads = integer(next(), k);
    else if (k == "--kv-heads") a.kv_heads = integer(next(), k);
    else if (k == "--iters") a.iters = static_cast<int>(integer(next(), k));
    else if (k == "--warmup") a.warmup = static_cast<int>(integer(next(), k, 0));
    else AERIE_THROW("unknown option " << k << " (" << kUsage << ")");
  }
  AERIE_CHECK(a.heads % a.kv_heads == 0, "--heads must be a multiple of --kv-heads");
  return a;
}

int run(int argc, char** argv) {
  const std::optional<Args> parsed = parse(argc, argv);
  if (!parsed) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  const Args& a = *parsed;
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, 0);
  AERIE_CHECK(e == cudaSuccess, "no usable GPU: " << cudaGetErrorString(e));
  const char* emu = std::getenv("AERIE_CUDA_EMULATE");
  std::string path = emu && *emu ? emu : "native";
  const Settings& set = settings();
  if (!set.attention_forward_kernel.empty() || !set.attention_backward_kernel.empty())
    path += "+" + set.attention_forward_kernel + (set.attention_backward_kernel == set.attention_forward_kernel
                                                      ? ""
                                                      : "/" + set.attention_backward_kernel);
  RandomFill rnd;
  for (const int64_t d : a.head_dims) {
    for (const int64_t t : a.tokens) {
      Tensor q = Tensor::empty({t, a.heads, d}, DType::BF16, Device::CUDA);
      Tensor k = Tensor::empty({t, a.kv_heads, d}, DType::BF16, Device::CUDA);
      Tensor v = Tensor::empty({t, a.kv_heads, d}, DType::BF16, Device::CUDA);
      Tensor dout = Tensor::empty({t, a.heads, d}, DType::BF16, Device::CUDA);
      for (Tensor* x : {&q, &k, &v, &dout}) rnd.fill(*x, 1.0f);
      Tensor out = Tensor::empty({t, a.heads, d}, DType::BF16, Device::CUDA);
      Tensor lse = Tensor::empty({t, a.heads}, DType::F32, Device::CUDA);
      Tensor dq = Tensor::empty({t, a.heads, d}, DType::BF16, Device::CUDA);
      Tensor dk = Tensor::zeros({t, a.kv_heads, d}, DType::BF16, Device::CUDA);
      Tensor dv = Tensor::zeros({t, a.kv_heads, d}, DType::BF16, Device::CUDA);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
      const double fwd_s = timed(a.warmup, a.iters, [&] { attention_forward(q, k, v, 0, scale, out, &lse); });
      const double bwd_s = timed(a.warmup, a.iters, [&] {
        attention_backward(dout, q, k, v, out, lse, 0, scale, dq, dk, dv);
      });
      const double flop = 4.0 * static_cast<double>(t) * static_cast<double>(t) / 2.0 *
                          static_cast<double>(a.heads) * static_cast<double>(d);
      std::printf("{\"bench\": \"attention\", \"impl\": \"aerie\", \"path\": \"%s\", \"gpu\": \"%s\", \"d\": %lld, "
                  "\"tokens\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, "
                  "\"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f}\n",
                  bench::json_escape(path).c_str(), bench::json_escape(prop.name).c_str(), static_cast<long long>(d),
                  static_cast<long long>(t), static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads),
                  fwd_s * 1e3, bwd_s * 1e3, flop / fwd_s * 1e-12, 2.5 * flop / bwd_s * 1e-12);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace aerie

int main(int argc, char** argv) {
  try {
    return aerie::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}
