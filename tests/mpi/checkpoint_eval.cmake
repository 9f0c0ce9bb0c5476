# Checkpoint choice with the aerie binary (tests/mpi/checkpoint_eval.sh, issue 13 item 2): eval --run gives a
# row of the checkpoint table for every checkpoint of a run (on 2 ranks), a rerun evaluates nothing, --every
# and --steps select, other settings are refused; export --best exports the highest acceptance length (ties to
# the later step), records the step (--format speculators too), and refuses a missing table, another target's,
# a checkpoint gone.
if(TARGET stories260K_model)
  add_test(NAME checkpoint_eval
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/checkpoint_eval.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/checkpoint_eval)
  set_tests_properties(checkpoint_eval PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
