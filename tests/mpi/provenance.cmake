# Provenance with the aerie binary (tests/mpi/provenance.sh, issue 17 cases 3, 4 and 6): an extract rerun
# with another model of the same shape or another prepared file, train over shards of another target or a
# mixed folder, a resume with another --model or --shards, a shard missing in the middle, and an export
# with a target of another layer count are refused naming the difference.
if(TARGET stories260K_model)
  add_test(NAME provenance
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/provenance.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/provenance)
  set_tests_properties(provenance PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
