// GoogleTest main for every test executable: initialises MPI (a single-rank world unless started under
// mpirun) and logging, so library code that uses communicators runs in tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include "core/log.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  aerie::init_logging(rank, "warning");
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
