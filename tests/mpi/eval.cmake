# aerie eval's library on 2 ranks (tp = 2 and dp = 2) against single-rank figures (tests/train/eval_test.cc).
if(TARGET test_train AND TARGET stories260K_model)
  add_test(NAME train_eval_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_train>
                   --gtest_filter=EvalTest.ParallelMatchesSingleRank)
  set_tests_properties(train_eval_np2 PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" LABELS mpi TIMEOUT 120)
endif()
