# TensorBoard event files read by TensorBoard itself (tests/mpi/tensorboard.sh, issue 13 item 1): a train run
# on 2 ranks, cut back to an early checkpoint and resumed, gives one continuous curve per tag in
# EventAccumulator, with the values of metrics.jsonl and heldout.jsonl. Skipped (exit 77, with the reason)
# when python3 cannot import tensorboard or aerie was built without protobuf; tests/io/event_file_test.cc
# reads the files with aerie's own reader in any build with protobuf.
if(TARGET stories260K_model)
  add_test(NAME tensorboard_events
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/tensorboard.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/tensorboard
                   ${AERIE_TENSORBOARD})
  set_tests_properties(tensorboard_events PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
