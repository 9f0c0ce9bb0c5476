# NcclCommunicator on 2 ranks, one GPU each (the Nccl* tests of test_comm). Without CUDA or with fewer
# GPUs than ranks the tests skip, so on the CPU-only CI machine this passes as skipped.
if(AERIE_CUDA)
  add_test(NAME nccl_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_comm> --gtest_filter=Nccl*)
  set_tests_properties(nccl_np2 PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;NCCL_NVLS_ENABLE=0"
    LABELS "mpi;cuda" RUN_SERIAL TRUE TIMEOUT 300)
endif()
