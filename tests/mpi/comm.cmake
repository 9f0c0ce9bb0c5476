# Collectives with several ranks (oversubscribed on the 2-core CI machine).
foreach(np 2 3 4)
  add_test(NAME comm_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:test_comm>)
  set_tests_properties(comm_np${np} PROPERTIES
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1"
    LABELS mpi RUN_SERIAL TRUE)
endforeach()
