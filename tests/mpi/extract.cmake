# aerie extract with several ranks: tp groups and rank-0 dispatch give the single-rank shards
# (tests/data/extract_test.cc, ExtractMpi.*), and a run killed at a random moment then rerun leaves
# byte-identical shards (tests/mpi/extract_resume.sh; exit 77 = skipped without the converted model).
set(_aerie_extract_env
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
if(TARGET test_data)
  add_test(NAME extract_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_data> --gtest_filter=ExtractMpi.*)
  set_tests_properties(extract_np2 PROPERTIES ENVIRONMENT "${_aerie_extract_env}" LABELS mpi)
  foreach(tp 1 2)
    add_test(NAME extract_resume_np2_tp${tp}
             COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/extract_resume.sh $<TARGET_FILE:aerie>
                     $<TARGET_FILE:test_data> ${AERIE_MODEL_DIR}
                     ${CMAKE_BINARY_DIR}/test-scratch/extract_resume_tp${tp} 2 ${tp})
    set_tests_properties(extract_resume_np2_tp${tp} PROPERTIES ENVIRONMENT "${_aerie_extract_env}" LABELS mpi
                         SKIP_RETURN_CODE 77 TIMEOUT 120)
  endforeach()
endif()
# Non-finite hidden states (issue 17, case 5): an error naming the sample, or --skip-nonfinite skipping and
# counting them, with a target whose embedding row of one token is NaN (tests/mpi/extract_nonfinite.sh).
if(TARGET stories260K_model)
  add_test(NAME extract_nonfinite
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/extract_nonfinite.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/extract_nonfinite)
  set_tests_properties(extract_nonfinite PROPERTIES ENVIRONMENT "${_aerie_extract_env}" LABELS mpi
                       SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
# The target's context length where samples are made and used (tests/mpi/context_length.sh).
if(TARGET stories260K_model)
  add_test(NAME context_length
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/context_length.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${CMAKE_BINARY_DIR}/test-scratch/context_length)
  set_tests_properties(context_length PROPERTIES ENVIRONMENT "${_aerie_extract_env}" LABELS mpi)
endif()
