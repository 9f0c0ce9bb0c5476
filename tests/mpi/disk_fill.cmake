# Disk-fill trials (tools/disk_fill_trials.sh), 2 per job: prepare, extract, train and generate on 2 ranks
# writing into a 24 MiB tmpfs that a dd fills at a random moment end within a minute, non-zero, naming a file
# there, and a rerun after freeing the space finishes (what was complete is kept). About 35 s; skipped (77)
# where no tmpfs can be mounted. docs/design.md (Failures) has a 10-trial table.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME disk_fill_trials
           COMMAND bash ${CMAKE_SOURCE_DIR}/tools/disk_fill_trials.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/disk_fill 2)
  set_tests_properties(disk_fill_trials PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
