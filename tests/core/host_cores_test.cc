// The CPU cores a rank may run on (core/memory.h): the affinity mask read as the launcher set it, and the warning a
// GPU rank bound to one core logs.
#include <gtest/gtest.h>
#include <sched.h>

#include "core/memory.h"

namespace aerie {
namespace {

TEST(HostCores, AllowedFollowsTheAffinityMask) {
  cpu_set_t saved;
  CPU_ZERO(&saved);
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(cpu_cores_allowed(), CPU_COUNT(&saved));
  EXPECT_LE(cpu_cores_allowed(), cpu_cores_online());
  // Bound to the first allowed core, as mpirun -np 1 binds a rank: one core.
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int bound = cpu_cores_allowed();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(bound, 1);
}

TEST(HostCores, WarnsOnlyForOneCoreOfSeveral) {
  const std::string w = single_core_warning(1, 16);
  EXPECT_NE(w.find("1 CPU core of the machine's 16"), std::string::npos) << w;
  EXPECT_NE(w.find("--bind-to none"), std::string::npos) << w;
  EXPECT_NE(w.find("--cpus-per-task"), std::string::npos) << w;
  EXPECT_EQ(single_core_warning(2, 16), "");
  EXPECT_EQ(single_core_warning(1, 1), "");  // a one-core machine: nothing to give
}

}  // namespace
}  // namespace aerie
