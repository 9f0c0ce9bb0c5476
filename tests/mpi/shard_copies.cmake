# A shard folder with copies of a shard (tests/mpi/shard_copies.sh): train names each copy in a
# warning, skips it, and reads every chunk once.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME shard_copies
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/shard_copies.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/shard_copies)
  set_tests_properties(shard_copies PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
