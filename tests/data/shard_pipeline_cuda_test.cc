// ShardPipeline with GPU tensors (asynchronous copies into pinned buffers on the pipeline's copy stream):
// the shard is byte-identical to the one written from the same values on the host, and the device
// tensors may be dropped (and their memory reused) right after add(). Skipped without a GPU. And, on the
// host, the writer's accounting (the bytes it was handed, its write time, the caller's wait for it).
#include <fstream>
#include <iterator>
#include <random>

#include "core/device.h"
#include "data/shard.h"
#include "data/shard_pipeline.h"
#include "test_util.h"

namespace aerie {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Tensor random_tensor(const Shape& s, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor t = Tensor::empty(s, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(rng);
  return dt == DType::F32 ? t : t.to(dt);
}

// Chunk 0 of a 4-layer target of hidden size H, aux layers 1, 2, 3.
ShardMeta test_meta(int64_t H) {
  ShardMeta meta;
  meta.target_model = "/models/t";
  meta.aux_layers = {1, 2, 3};
  meta.hidden_size = H;
  meta.num_hidden_layers = 4;
  meta.chunk = 0;
  return meta;
}

TEST(ShardPipelineCuda, DeviceTensorsGiveTheHostShard) {
  AERIE_REQUIRE_CUDA();
  const std::string dir = testing::scratch_dir("shard_pipeline_cuda");
  const int64_t H = 64;
  const std::vector<int64_t> lengths = {300, 1, 77, 512};
  const ShardMeta meta = test_meta(H);
  for (DType dt : {DType::BF16, DType::F32}) {
    std::vector<Tensor> aux, fin;
    for (size_t k = 0; k < lengths.size(); ++k) {
      aux.push_back(random_tensor({lengths[k], 3 * H}, dt, static_cast<uint32_t>(2 * k)));
      fin.push_back(random_tensor({lengths[k], H}, dt, static_cast<uint32_t>(2 * k + 1)));
    }
    auto write = [&](const std::string& path, bool on_gpu) {
      ShardPipeline p(2);
      p.open(path, meta, lengths);
      for (size_t k = 0; k < lengths.size(); ++k) {
        std::vector<int32_t> ids(static_cast<size_t>(lengths[k]), static_cast<int32_t>(k));
        std::vector<uint8_t> mask(static_cast<size_t>(lengths[k]), 1);
        if (on_gpu) {
          Tensor a = aux[k].to_device(Device::CUDA), f = fin[k].to_device(Device::CUDA);
          p.add(static_cast<int64_t>(k), ids, mask, a, f);
          // Dropped here, then the memory is reused and overwritten at once: the pipeline must hold it.
          a = Tensor();
          f = Tensor();
          Tensor junk = Tensor::empty({lengths[k], 4 * H}, dt, Device::CUDA);
          junk.fill_zero();
        } else {
          p.add(static_cast<int64_t>(k), ids, mask, aux[k], fin[k]);
        }
      }
      p.close();
      p.finish();
    };
    const std::string host = dir + "/host.h5", gpu = dir + "/gpu.h5";
    write(host, false);
    write(gpu, true);
    const std::string a = read_bytes(host), b = read_bytes(gpu);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "the shard written from GPU tensors differs from the host one (" << dtype_name(dt) << ")";
    ShardReader r(gpu);
    EXPECT_EQ(r.num_samples(), 4);
    EXPECT_EQ(r.read(2).final_hidden.to_float_vector(), fin[2].to(DType::BF16).to_float_vector());
  }
}

// The figures extract logs about the writer: the hidden-state bytes handed to it (aux + final, as added),
// the seconds of its writes, and the caller's wait for room in a full queue (a queue of 1 and several
// samples: the caller must have waited while the writer wrote the previous one).
TEST(ShardPipeline, CountsTheWritersWork) {
  const std::string dir = testing::scratch_dir("shard_pipeline_counts");
  const int64_t H = 256;
  const std::vector<int64_t> lengths = {512, 512, 512, 512, 512, 512};
  const ShardMeta meta = test_meta(H);
  std::vector<Tensor> aux, fin;  // made first, so that the adds follow each other at once
  int64_t bytes = 0;
  for (size_t k = 0; k < lengths.size(); ++k) {
    aux.push_back(random_tensor({lengths[k], 3 * H}, DType::F32, static_cast<uint32_t>(k)));
    fin.push_back(random_tensor({lengths[k], H}, DType::BF16, static_cast<uint32_t>(k + 100)));
    bytes += static_cast<int64_t>(aux.back().nbytes() + fin.back().nbytes());
  }
  ShardPipeline p(1);
  p.open(dir + "/s.h5", meta, lengths);
  for (size_t k = 0; k < lengths.size(); ++k)
    p.add(static_cast<int64_t>(k), std::vector<int32_t>(static_cast<size_t>(lengths[k]), 1),
          std::vector<uint8_t>(static_cast<size_t>(lengths[k]), 1), aux[k], fin[k]);
  p.close();
  p.finish();
  EXPECT_EQ(p.hidden_bytes(), bytes);
  EXPECT_GT(p.write_seconds(), 0.0);
  EXPECT_GT(p.caller_wait_seconds(), 0.0);  // 6 samples through a queue of 1: add() waited at least once
  EXPECT_EQ(ShardReader(dir + "/s.h5").num_samples(), 6);
}

}  // namespace
}  // namespace aerie
