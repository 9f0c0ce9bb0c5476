# aerie generate's regeneration mode with several ranks: two data-parallel groups write the output that one
# rank computes (tests/data/regenerate_test.cc, RegenerateMpi.*); and the aerie binary on 1 rank, on 2 ranks
# and after a SIGTERM + rerun writes byte-identical JSONL (tests/mpi/generate_regen.sh; exit 77 = skipped
# without the converted stories260K).
set(_aerie_generate_env
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
if(TARGET test_data)
  add_test(NAME regenerate_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_data> --gtest_filter=RegenerateMpi.*)
  set_tests_properties(regenerate_np2 PROPERTIES ENVIRONMENT "${_aerie_generate_env}" LABELS mpi TIMEOUT 120)
endif()
if(TARGET aerie)
  add_test(NAME generate_regen_np2
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/generate_regen.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${CMAKE_BINARY_DIR}/test-scratch/generate_regen)
  set_tests_properties(generate_regen_np2 PROPERTIES ENVIRONMENT "${_aerie_generate_env}" LABELS mpi
                       SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
