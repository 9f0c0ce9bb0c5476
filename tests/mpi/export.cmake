# aerie export --format speculators on stories260K (tests/mpi/export_speculators.sh): the config vLLM's
# `vllm serve DRAFT_DIR` reads and the default export's tensors under the speculators names; the loaders'
# names and fields are checked in tests/train/export_speculators_test.cc. An unknown --format is a usage
# error before anything is read (the paths do not exist).
set(_aerie_export_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
add_test(NAME export_unknown_format
         COMMAND $<TARGET_FILE:aerie> export --checkpoint /nonexistent/run --model /nonexistent --output /nonexistent/o
                 --format safetensors)
set_tests_properties(export_unknown_format PROPERTIES ENVIRONMENT "${_aerie_export_env}"
  PASS_REGULAR_EXPRESSION "aerie export: --format 'safetensors' is not eagle3 or speculators"
  FAIL_REGULAR_EXPRESSION "MPI_ABORT")
if(TARGET stories260K_model)
  add_test(NAME export_speculators
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/export_speculators.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/export_speculators)
  set_tests_properties(export_speculators PROPERTIES ENVIRONMENT "${_aerie_export_env}"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
