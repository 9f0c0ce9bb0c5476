# Tensor parallelism of the target (tests/model/target_tp_test.cc): tp = 2 must give what tp = 1 gives.
set(_aerie_model_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
if(TARGET test_model)
  add_test(NAME model_tp2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_model> --gtest_filter=TpTest.*)
  set_tests_properties(model_tp2 PROPERTIES ENVIRONMENT "${_aerie_model_env}" LABELS mpi)
  # tp 4 on fixtures of 2 kv heads: each kv head replicated over 2 ranks.
  add_test(NAME model_tp4_replicated_kv
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 4 $<TARGET_FILE:test_model>
                   --gtest_filter=TpTest.ReplicatedKvHeadsMatchTransformers)
  set_tests_properties(model_tp4_replicated_kv PROPERTIES ENVIRONMENT "${_aerie_model_env}" LABELS mpi)
endif()
# The aerie generate job on stories260K, tp = 1 and tp = 2: from BOS, 256 greedy tokens end with the
# last sentence of llama2.c's greedy sample (stories260K.md; the whole text is checked by
# TargetGenerate.MatchesLlama2cGreedySample).
if(TARGET stories260K_model)
  foreach(tp 1 2)
    add_test(NAME generate_stories260K_tp${tp}
             COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${tp} $<TARGET_FILE:aerie> generate
                     --model ${AERIE_MODEL_DIR} --max-new 256 --tp ${tp})
    set_tests_properties(generate_stories260K_tp${tp} PROPERTIES ENVIRONMENT "${_aerie_model_env}" LABELS mpi
                         PASS_REGULAR_EXPRESSION "Her mom said, .Don't worry, Lily[.] We can help you[.]")
  endforeach()
endif()
# AERIE_NO_SKIP=1 turns a CUDA test that cannot run into a failure (tests/test_util.h): without a GPU the
# test must fail; on a GPU machine (nvidia-smi answers) it runs and passes.
if(TARGET test_kernels)
  add_test(NAME cuda_no_skip_fails_without_gpu
           COMMAND sh -c "! AERIE_NO_SKIP=1 $<TARGET_FILE:test_kernels> --gtest_filter=RopeCuda.MatchesCpu >/dev/null 2>&1 || nvidia-smi >/dev/null 2>&1")
endif()
