# Tensor parallelism of the target (tests/model/llama_tp_test.cc): tp = 2 must give what tp = 1 gives.
# The aerie generate job under tp = 2 must print what it prints under tp = 1.
if(TARGET test_model)
  add_test(NAME model_tp2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_model> --gtest_filter=TpTest.*)
  set_tests_properties(model_tp2 PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" LABELS mpi)
endif()
