# A write that fails under a collective job ends it (tests/mpi/write_failure.sh): prepare on 2 ranks
# with a write failing on one rank (the test hook, and a full tmpfs where the test may mount one) ends within
# a minute, non-zero, naming the file.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME write_failure
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/write_failure.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/write_failure)
  set_tests_properties(write_failure PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 240)
endif()
