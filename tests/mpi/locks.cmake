# Output locks with real processes (tests/mpi/concurrent_outputs.sh, issue 17 cases 1 and 2): a second
# extract or train into one folder is refused naming the first, a killed run's lock is taken over as stale,
# prepare and generate refuse a locked output and another host's record without --force-unlock.
if(TARGET stories260K_model)
  add_test(NAME concurrent_outputs
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/concurrent_outputs.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/concurrent_outputs)
  set_tests_properties(concurrent_outputs PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300 RUN_SERIAL TRUE)
endif()
# prepare, generate and eval refuse an --output of another kind (a model's weights, a prepared file) or a
# folder, before any work, leaving the file as it was (tests/mpi/output_kinds.sh).
if(TARGET stories260K_model)
  add_test(NAME output_kinds
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/output_kinds.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/output_kinds)
  set_tests_properties(output_kinds PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
