# Draft training with several ranks: a dp = 2 step equals the dp = 1 step on the same global batch
# (tests/train/trainer_test.cc), and the aerie train job killed at a random moment and rerun gives a final
# draft.safetensors bitwise equal to an uninterrupted run (tests/mpi/train_resume.sh, on stories260K).
set(_aerie_train_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1")
if(TARGET test_train)
  add_test(NAME train_dp2
           COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:test_train> --gtest_filter=TrainStepDp*)
  set_tests_properties(train_dp2 PROPERTIES ENVIRONMENT "${_aerie_train_env}" LABELS mpi)
endif()
if(TARGET stories260K_model)
  add_test(NAME train_resume_np2
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/train_resume.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/train_resume)
  set_tests_properties(train_resume_np2 PROPERTIES ENVIRONMENT "${_aerie_train_env}" LABELS mpi RUN_SERIAL TRUE
                       TIMEOUT 300)
endif()
# Samples without a trainable TTT row make train stop with an error that says why (tests/mpi/train_untrainable.sh).
if(TARGET stories260K_model)
  add_test(NAME train_untrainable_samples
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/train_untrainable.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${CMAKE_BINARY_DIR}/test-scratch/train_untrainable)
  set_tests_properties(train_untrainable_samples PROPERTIES ENVIRONMENT "${_aerie_train_env}" LABELS mpi)
endif()
# Streaming training (1 target rank + 2 trainers and other layouts) equals offline extract + train, resumes
# after SIGKILL and SIGTERM, refuses mixed modes (tests/mpi/train_stream.sh, on stories260K).
if(TARGET stories260K_model)
  add_test(NAME train_stream
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/mpi/train_stream.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/train_stream)
  set_tests_properties(train_stream PROPERTIES ENVIRONMENT "${_aerie_train_env}" LABELS mpi RUN_SERIAL TRUE
                       TIMEOUT 600)
endif()
