# Multi-rank tests of the HDF5 layer and the data jobs (prepare): 2 ranks must give what 1 rank gives.
set(_aerie_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
if(TARGET test_io)
  add_test(NAME io_h5_parallel_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_io> --gtest_filter=H5Test.ParallelRows)
  set_tests_properties(io_h5_parallel_np2 PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi)
endif()
if(TARGET test_data)
  # prepare on 2 and 3 ranks must write exactly what 1 rank writes (the test compares inside).
  foreach(np 2 3)
    add_test(NAME data_prepare_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:test_data>
                     --gtest_filter=PrepareParallelTest.*)
    set_tests_properties(data_prepare_np${np} PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi)
  endforeach()
endif()
