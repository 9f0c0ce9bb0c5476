// Collectives on exact inputs (integers in fp32), so results can be required to be equal
// (the nccl-tests approach). Run with 1 rank by CTest and with 2 and 3 ranks under mpirun
// (tests/mpi/comm.cmake).
#include "comm/communicator.h"

#include <gtest/gtest.h>

namespace aerie {

TEST(Communicator, AllReduceSumIsExact) {
  auto world = MpiCommunicator::world();
  int n = world->size(), r = world->rank();
  Tensor t = Tensor::from_vector<float>({float(r), float(r + 1), 2.0f}, {3});
  world->all_reduce_sum(t);
  float s = n * (n - 1) / 2.0f;
  EXPECT_EQ(t.to_float_vector(), (std::vector<float>{s, s + n, 2.0f * n}));
  Tensor b = Tensor::from_vector<float>({1.0f}, {1}).to(DType::BF16);
  world->all_reduce_sum(b);
  EXPECT_EQ(b.to_float_vector()[0], float(n));
}

// Started sums (the tp overlap's two micro-batches): two in flight at once, completed by wait() in the order
// started, each the sum all_reduce_sum gives; I64 through MPI_Iallreduce, BF16 through the blocking path; a
// handle dropped without wait() completes its sum; SelfCommunicator's default leaves the tensor as it is.
TEST(Communicator, StartedSumsEqualBlockingOnes) {
  auto world = MpiCommunicator::world();
  const int n = world->size(), r = world->rank();
  Tensor a = Tensor::from_vector<float>({float(r), float(r + 1), 2.0f}, {3});
  Tensor b = Tensor::from_vector<int64_t>({int64_t{r} << 40, 7}, {2});
  Tensor c = Tensor::from_vector<float>({1.0f}, {1}).to(DType::BF16);
  auto pa = world->start_all_reduce_sum(a);
  auto pb = world->start_all_reduce_sum(b);
  auto pc = world->start_all_reduce_sum(c);
  pa->wait();
  pb->wait();
  pc->wait();
  const float s = n * (n - 1) / 2.0f;
  EXPECT_EQ(a.to_float_vector(), (std::vector<float>{s, s + n, 2.0f * n}));
  EXPECT_EQ(b.data<int64_t>()[0], (int64_t{n} * (n - 1) / 2) << 40);
  EXPECT_EQ(b.data<int64_t>()[1], 7 * n);
  EXPECT_EQ(c.to_float_vector()[0], float(n));
  Tensor d = Tensor::from_vector<float>({1.0f}, {1});
  world->start_all_reduce_sum(d).reset();  // not waited for: the handle's destruction completes it
  EXPECT_EQ(d.to_float_vector()[0], float(n));
  SelfCommunicator self;
  Tensor e = Tensor::from_vector<float>({3.0f}, {1});
  self.start_all_reduce_sum(e)->wait();
  EXPECT_EQ(e.to_float_vector()[0], 3.0f);
}

// A modeled group (calibrate --model-tp): no data moves, and each collective but barrier adds latency + its bus bytes
// over the bandwidth, with nccl-tests' conventions: all-reduce 2 (n - 1) / n of the tensor, all-gather (n - 1) / n of
// the output, broadcast the tensor.
TEST(Communicator, ModeledGroupAddsEachCollectivesTime) {
  ModeledCommunicator m(4, 0, 1e6, 1e-3);  // 1 MB/s, 1 ms
  EXPECT_EQ(m.size(), 4);
  EXPECT_EQ(m.rank(), 0);
  Tensor t = Tensor::from_vector<float>(std::vector<float>(250, 2.0f), {250});  // 1000 bytes
  m.all_reduce_sum(t);
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(250, 2.0f));  // untouched
  EXPECT_NEAR(m.seconds(), 1e-3 + 1.5 * 1000 / 1e6, 1e-12);
  m.start_all_reduce_sum(t)->wait();  // started ones count alike
  EXPECT_NEAR(m.seconds(), 2 * (1e-3 + 1.5e-3), 1e-12);
  Tensor in = Tensor::from_vector<int32_t>({5, 6}, {2}), out = Tensor::empty({8}, DType::I32);
  m.all_gather(in, out);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out.data<int32_t>()[2 * r], 5);
    EXPECT_EQ(out.data<int32_t>()[2 * r + 1], 6);
  }
  EXPECT_NEAR(m.seconds(), 2 * (1e-3 + 1.5e-3) + 1e-3 + 0.75 * 32 / 1e6, 1e-12);
  EXPECT_EQ(m.collectives(), 3);
  const double before = m.seconds();
  m.broadcast(t, 0);  // a decoding step's token choice: the tensor's bytes
  EXPECT_NEAR(m.seconds() - before, 1e-3 + 1000 / 1e6, 1e-12);
  m.all_reduce_max(t);
  EXPECT_NEAR(m.seconds() - before, 2e-3 + 1000 / 1e6 + 1.5e-3, 1e-12);
  EXPECT_EQ(t.to_float_vector(), std::vector<float>(250, 2.0f));
  m.barrier();
  EXPECT_EQ(m.collectives(), 5);
  Tensor bad = Tensor::empty({7}, DType::I32);
  EXPECT_THROW(m.all_gather(in, bad), Error);
  EXPECT_THROW(ModeledCommunicator(1, 0, 1e9, 0), Error);   // a group of one is not modeled
  EXPECT_THROW(ModeledCommunicator(8, 8, 1e9, 0), Error);   // rank past the group
  EXPECT_THROW(ModeledCommunicator(8, 0, 0, 0), Error);     // no bandwidth
  EXPECT_THROW(ModeledCommunicator(8, 0, 1e9, -1), Error);  // negative latency
}

TEST(Communicator, AllGatherConcatenatesInRankOrder) {
  auto world = MpiCommunicator::world();
  int n = world->size(), r = world->rank();
  Tensor in = Tensor::from_vector<int64_t>({r * 10, r * 10 + 1}, {2});
  Tensor out = Tensor::empty({2 * n}, DType::I64);
  world->all_gather(in, out);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out.data<int64_t>()[2 * i], i * 10);
    EXPECT_EQ(out.data<int64_t>()[2 * i + 1], i * 10 + 1);
  }
  Tensor bad = Tensor::empty({2 * n + 1}, DType::I64);
  EXPECT_THROW(world->all_gather(in, bad), Error);
}

TEST(Communicator, BroadcastAndMax) {
  auto world = MpiCommunicator::world();
  Tensor t = Tensor::from_vector<int32_t>({world->rank() == 0 ? 7 : -1}, {1});
  world->broadcast(t, 0);
  EXPECT_EQ(t.data<int32_t>()[0], 7);
  Tensor m = Tensor::from_vector<float>({float(world->rank())}, {1});
  world->all_reduce_max(m);
  EXPECT_EQ(m.data<float>()[0], float(world->size() - 1));
}

TEST(Mapping, TensorAndDataParallelRanks) {
  Mapping m(5, 8, 2);
  EXPECT_EQ(m.tp_rank, 1);
  EXPECT_EQ(m.dp_rank, 2);
  EXPECT_EQ(m.dp, 4);
  EXPECT_THROW(Mapping(0, 6, 4), Error);
  EXPECT_THROW(Mapping(0, 4, 0), Error);
}

TEST(ParallelGroups, SplitsWorldIntoTpAndDpGroups) {
  auto world = MpiCommunicator::world();
  int tp = world->size() % 2 == 0 ? 2 : 1;
  ParallelGroups g = ParallelGroups::create(tp);
  EXPECT_EQ(g.tp->size(), tp);
  EXPECT_EQ(g.dp->size(), world->size() / tp);
  EXPECT_EQ(g.tp->rank(), g.map.tp_rank);
  EXPECT_EQ(g.dp->rank(), g.map.dp_rank);
  // Sum of world ranks inside the tp group: consecutive ranks dp_rank*tp .. +tp-1.
  Tensor t = Tensor::from_vector<int64_t>({world->rank()}, {1});
  g.tp->all_reduce_sum(t);
  int64_t first = int64_t(g.map.dp_rank) * tp, want = 0;
  for (int i = 0; i < tp; ++i) want += first + i;
  EXPECT_EQ(t.data<int64_t>()[0], want);
}

}  // namespace aerie
