# The edges of the second reliability round (tests/mpi/reliability_edges.sh): generate with nothing to
# generate, its dropped records named, a NUL byte in a JSONL line, an INI file with a byte order mark and ';'
# comments, a lock file of random bytes, empty assistant turns, prepare with no usable sample on 2 ranks, eval
# into a read-only folder.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME reliability_edges
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/reliability_edges.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/reliability_edges)
  set_tests_properties(reliability_edges PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
