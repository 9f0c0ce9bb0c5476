# Multi-rank tests of the HDF5 layer and the data jobs (prepare): 2 ranks must give what 1 rank gives.
set(_aerie_mpi_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
if(TARGET test_io)
  add_test(NAME io_h5_parallel_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_io> --gtest_filter=H5Test.Parallel*)
  set_tests_properties(io_h5_parallel_np2 PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi TIMEOUT 120)
endif()
if(TARGET test_data)
  # prepare on 2 and 3 ranks must write exactly what 1 rank writes (the test compares inside).
  foreach(np 2 3)
    add_test(NAME data_prepare_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np ${np} $<TARGET_FILE:test_data>
                     --gtest_filter=PrepareParallelTest.*)
    set_tests_properties(data_prepare_np${np} PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi TIMEOUT 120)
  endforeach()
endif()

# The jobs end to end on the real data: prepare (2 ranks) -> vocab; vocab refuses to overwrite without --force.
# prepare --overwrite: a build folder's earlier file would be refused once the input is newer (a refreshed copy).
if(TARGET stories260K_model AND EXISTS "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt")
  set(_d "${CMAKE_BINARY_DIR}/test-scratch/jobs_prepare_vocab")
  add_test(NAME jobs_prepare_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:aerie> prepare
                   --input "${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt" --tokenizer "${AERIE_MODEL_DIR}"
                   --output "${_d}/prepared.h5" --max-length 256 --overlong drop --overwrite)
  add_test(NAME jobs_vocab
           COMMAND $<TARGET_FILE:aerie> vocab --prepared "${_d}/prepared.h5" --model "${AERIE_MODEL_DIR}"
                   --draft-vocab-size 128 --output "${_d}/draft_vocab.safetensors" --force)
  add_test(NAME jobs_vocab_refuses_overwrite
           COMMAND $<TARGET_FILE:aerie> vocab --prepared "${_d}/prepared.h5" --model "${AERIE_MODEL_DIR}"
                   --draft-vocab-size 128 --output "${_d}/draft_vocab.safetensors")
  set_tests_properties(jobs_prepare_np2 PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi TIMEOUT 120
                       FIXTURES_SETUP prepared_tinystories)
  set_tests_properties(jobs_vocab PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi TIMEOUT 120
                       FIXTURES_REQUIRED prepared_tinystories FIXTURES_SETUP draft_vocab_tinystories)
  set_tests_properties(jobs_vocab_refuses_overwrite PROPERTIES ENVIRONMENT "${_aerie_mpi_env}" LABELS mpi TIMEOUT 120
                       FIXTURES_REQUIRED draft_vocab_tinystories
                       PASS_REGULAR_EXPRESSION "exists; the draft vocabulary belongs to the draft")
endif()
