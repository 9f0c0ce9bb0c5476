// ForwardContext's workspaces (model/blocks.h): a scratch that only grows and is shared by the micro-batches of
// one forward, buffers that stay each context's own.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "model/blocks.h"
#include "model/op_profile.h"
#include "model_testing.h"

namespace aerie {
namespace {

TEST(ForwardContext, MicroBatchesShareOneScratchPoolAndKeepTheirBuffers) {
  auto comm = testing::self_comm();
  OpProfile prof;
  ForwardBatch batch;
  batch.B = 1, batch.n = 4, batch.longest = 4, batch.start = {0, 4}, batch.p0 = {0};
  std::map<std::string, Tensor> pool;
  ForwardContext a(Device::CPU, DType::F32, *comm, prof, batch, &pool), b(Device::CPU, DType::F32, *comm, prof, batch, &pool);
  ForwardContext alone(Device::CPU, DType::F32, *comm, prof, batch);

  // --tp-overlap's two micro-batches: one dequantized weight's storage, grown to the larger request.
  const Tensor wa = a.scratch("linear.dequant", 96, DType::F32);
  const Tensor wb = b.scratch("linear.dequant", 128, DType::F32);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool.at("linear.dequant").numel(), 128);
  EXPECT_EQ(a.scratch("linear.dequant", 64, DType::F32).raw(), wb.raw()) << "a after b's larger request";
  EXPECT_NE(alone.scratch("linear.dequant", 64, DType::F32).raw(), wb.raw()) << "a context without the pool";
  EXPECT_EQ(wa.numel(), 96);

  // Activation buffers may be live across the other micro-batch's stage: never shared.
  EXPECT_NE(a.buffer("gqa.qkv", {4, 8}, DType::F32).raw(), b.buffer("gqa.qkv", {4, 8}, DType::F32).raw());
  EXPECT_EQ(a.buffer("gqa.qkv", {4, 8}, DType::F32).raw(), a.buffer("gqa.qkv", {4, 8}, DType::F32).raw());
}

}  // namespace
}  // namespace aerie
