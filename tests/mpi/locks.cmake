# Outputs with real processes on stories260K, one environment:
# - tests/mpi/concurrent_outputs.sh (issue 17 cases 1 and 2): a second extract or train into one folder is
#   refused naming the first, a killed run's lock is taken over as stale, prepare and generate refuse a locked
#   output and another host's record without --force-unlock;
# - tests/mpi/output_kinds.sh: prepare, generate and eval refuse an --output of another kind (a model's
#   weights, a prepared file) or a folder, before any work, leaving the file as it was.
# - tests/mpi/locked_outputs.sh: vocab and eval refuse an output whose lock another job holds,
#   naming the lock; vocab and generate write through temporary files of their own.
if(TARGET stories260K_model)
  set(_aerie_locks_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
  foreach(_t concurrent_outputs output_kinds locked_outputs)
    add_test(NAME ${_t}
             COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/${_t}.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                     ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/${_t})
    set_tests_properties(${_t} PROPERTIES ENVIRONMENT "${_aerie_locks_env}" LABELS mpi SKIP_RETURN_CODE 77)
  endforeach()
  set_tests_properties(concurrent_outputs PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
  set_tests_properties(output_kinds locked_outputs PROPERTIES TIMEOUT 120)
endif()
