# Broken weights named, not passed on (tests/mpi/nonfinite_weights.sh): export refuses a draft with a
# NaN weight, train a target whose embedding holds a NaN, each naming the tensor and the element.
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  add_test(NAME nonfinite_weights
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/nonfinite_weights.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/nonfinite_weights)
  set_tests_properties(nonfinite_weights PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
    LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 180)
endif()
