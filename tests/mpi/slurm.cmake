# The pipeline through slurm/ on a real one-node Slurm cluster (slurmctld + slurmd started by the test,
# Debian's slurm-wlm): extract and train are requeued while they run and the export must be bitwise equal
# to an uninterrupted mpirun run (tests/slurm/slurm_pipeline.sh; exit 77 = skipped: no model, not root).
find_program(SLURMCTLD slurmctld PATHS /usr/sbin /usr/local/sbin)
if(NOT SLURMCTLD)
  message(STATUS "slurmctld not found: the Slurm pipeline test (slurm_pipeline) is not registered")
elseif(TARGET stories260K_model)
  add_test(NAME slurm_pipeline
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/slurm/slurm_pipeline.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/slurm_pipeline)
  set_tests_properties(slurm_pipeline PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
                       LABELS "mpi;slurm" RUN_SERIAL TRUE SKIP_RETURN_CODE 77 TIMEOUT 240)
endif()

# Moving a run to another number of GPUs: extract half done on 2 ranks is finished on 4 ranks (tp 2) and on 1
# with identical shards; a 2-rank train checkpoint resumes on 1 and 4 ranks with the same samples per step
# and the same loss (tests/slurm/regroup.sh says how it is checked). No Slurm needed.
if(TARGET stories260K_model)
  add_test(NAME resume_regroup
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/slurm/regroup.sh $<TARGET_FILE:aerie> ${AERIE_MODEL_DIR}
                   ${AERIE_SHARED_DATA}/tinystories/tinystories_val.txt ${CMAKE_BINARY_DIR}/test-scratch/resume_regroup)
  set_tests_properties(resume_regroup PROPERTIES
                       ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OPENBLAS_NUM_THREADS=1"
                       LABELS mpi SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
