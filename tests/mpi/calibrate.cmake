# aerie calibrate and aerie plan --calibration (train/time_plan.h): tests/mpi/calibrate.sh.
add_test(NAME calibrate_and_time_plan
         COMMAND ${CMAKE_SOURCE_DIR}/tests/mpi/calibrate.sh $<TARGET_FILE:aerie> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR}/test-scratch/calibrate)
set_tests_properties(calibrate_and_time_plan PROPERTIES LABELS mpi TIMEOUT 300 PASS_REGULAR_EXPRESSION "calibrate.sh: ok")
