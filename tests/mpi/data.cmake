# Multi-rank tests of the HDF5 layer and the data jobs (prepare): 2 ranks must give what 1 rank gives.
set(_aerie_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
if(TARGET test_io)
  add_test(NAME io_h5_parallel_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_io> --gtest_filter=H5Test.ParallelRows)
  set_tests_properties(io_h5_parallel_np2 PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi)
endif()
