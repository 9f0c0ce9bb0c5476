# Absurd sizes refused before allocating (tests/mpi/absurd_sizes.sh): train --draft-heads 10^8,
# a config.json of 10^12 layers under plan and extract.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME absurd_sizes
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/absurd_sizes.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/absurd_sizes)
  set_tests_properties(absurd_sizes PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
