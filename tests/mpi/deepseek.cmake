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
  # The whole pipeline with real text on the FP8 and INT4 fixtures widened to a real tokenizer's vocabulary
  # (tests/tools/widen_vocab.cc, at test time): generate, prepare with the deepseek-v3 / kimi-k2 templates,
  # extract, vocab, train, export, eval at tp 1, tp 2 and tp 2 --expert-parallel with its lossless check
  # (tests/mpi/deepseek_chat_pipeline.sh; exit 77 = skipped without ../shared/data's tokenizers and
  # conversations).
  add_executable(widen_vocab ${CMAKE_SOURCE_DIR}/tests/tools/widen_vocab.cc)
  target_link_libraries(widen_vocab PRIVATE aerie_io aerie_tokenizer)
  add_test(NAME deepseek_chat_pipeline
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/deepseek_chat_pipeline.sh $<TARGET_FILE:aerie>
                   $<TARGET_FILE:widen_vocab> ${CMAKE_SOURCE_DIR} ${AERIE_SHARED_DATA}
                   ${CMAKE_BINARY_DIR}/test-scratch/deepseek_chat_pipeline)
  set_tests_properties(deepseek_chat_pipeline PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
                       LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 400)
endif()
