// Small helpers shared by the target-model tests (target_batch_test.cc, target_cuda_test.cc,
// target_hf_families_test.cc): a one-rank communicator, the HF fixture folders, random ids, relative L2.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace aerie::testing {

/// A communicator of this rank alone (tp 1), split from MPI_COMM_WORLD.
inline std::unique_ptr<Communicator> self_comm() {
  auto world = MpiCommunicator::world();
  return world->split(world->rank(), 0);
}

/// tests/model/fixtures/hf/<name>: the random-weight models made by tools/reference/make_hf_fixtures.py.
inline std::string hf_fixture(const std::string& name) {
  return std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name;
}

/// n ids uniform in [0, V) from `seed`.
inline std::vector<int32_t> some_ids(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = static_cast<int32_t>(rng() % V);
  return ids;
}

/// ||got - ref|| / ||ref|| over ref's length (double sums; a zero ref counts as 1e-30).
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace aerie::testing
