# The whole pipeline with real text on the Qwen3-MoE and Mixtral fixtures widened to their tokenizers'
# vocabularies (tests/mpi/moe_chat_pipeline.sh: generate, prepare with the qwen3 / mistral-v1 templates, extract,
# vocab, train on 2 ranks, export, eval at tp 1, tp 2 and tp 2 --expert-parallel, lossless; exit 77 = skipped
# without ../shared/data's tokenizers and conversations).
if(TARGET aerie AND TARGET widen_vocab)
  add_test(NAME moe_chat_pipeline
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/moe_chat_pipeline.sh $<TARGET_FILE:aerie>
                   $<TARGET_FILE:widen_vocab> ${CMAKE_SOURCE_DIR} ${AERIE_SHARED_DATA} ${CMAKE_BINARY_DIR}
                   ${CMAKE_BINARY_DIR}/test-scratch/moe_chat_pipeline)
  set_tests_properties(moe_chat_pipeline PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
                       LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 400)
endif()
