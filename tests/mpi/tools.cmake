# The Python tests of tools/ (standard library only, so they run where no engine, GPU or Slurm is installed), each
# `python3 -m unittest FILE -v` from the source folder: aerie_python_test(NAME FILE TIMEOUT_SECONDS).
function(aerie_python_test name file timeout)
  add_test(NAME ${name} COMMAND python3 -m unittest ${CMAKE_SOURCE_DIR}/tests/tools/${file} -v
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout})
endfunction()
# tools/engine_eval (the serving check: an export in the user's own vLLM or SGLang against aerie eval's
# --write-prompts), its pure parts and the whole script through its fake engine.
aerie_python_test(engine_eval_tool test_engine_eval.py 120)
# tools/bench/sglang_bundle.sh's sitecustomize.py (what lets SGLang 0.5.17 start under a newer transformers), with
# stub packages: no SGLang or transformers needed.
aerie_python_test(sglang_bundle_sitecustomize test_sglang_bundle.py 60)
# tools/bench/gpu_paths.sh over fake suites (each setting's own scratch in every TOGETHER mode, a failing suite named,
# a bad TOGETHER refused, a setting's attention kernel) and tools/bench/marlin_bundle.sh's refusals of a bad WHEEL.
aerie_python_test(gpu_tools test_gpu_tools.py 120)
# slurm/submit's refusals of a bad count or switch, by key, before anything is submitted (a fake sbatch).
aerie_python_test(slurm_submit_refusals test_slurm_submit.py 60)
