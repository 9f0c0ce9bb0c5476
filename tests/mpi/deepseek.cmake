# The pipeline after prepare (extract tp 1 / tp 2, vocab, train on 2 ranks, export) on the tiny DeepSeek-V3
# (bf16, block-FP8) and Kimi-K2.5 (INT4 experts) fixtures (tests/mpi/deepseek_pipeline.sh; exit 77 =
# skipped without the converted stories260K, whose tokenizer prepare borrows).
if(TARGET aerie)
  add_test(NAME deepseek_pipeline
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/deepseek_pipeline.sh $<TARGET_FILE:aerie> ${CMAKE_SOURCE_DIR}
                   ${AERIE_MODEL_DIR} ${CMAKE_BINARY_DIR}/test-scratch/deepseek_pipeline)
  set_tests_properties(deepseek_pipeline PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
                       LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
  # tests/tools/widen_vocab.cc: a fixture widened to a real tokenizer's vocabulary, for the pipeline with real text.
  add_executable(widen_vocab ${CMAKE_SOURCE_DIR}/tests/tools/widen_vocab.cc)
  target_link_libraries(widen_vocab PRIVATE aerie_io aerie_tokenizer)
endif()
