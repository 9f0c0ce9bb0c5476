# tools/engine_eval (the serving check: an export in the user's own vLLM or SGLang against aerie eval's
# --write-prompts), its pure parts and the whole script through its fake engine; standard library only, so it
# runs where no engine is installed.
add_test(NAME engine_eval_tool
         COMMAND python3 -m unittest ${CMAKE_SOURCE_DIR}/tests/tools/test_engine_eval.py -v
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(engine_eval_tool PROPERTIES TIMEOUT 120)
# tools/bench/sglang_bundle.sh's sitecustomize.py (what lets SGLang 0.5.17 start under a newer transformers), with
# stub packages: no SGLang or transformers needed.
add_test(NAME sglang_bundle_sitecustomize
         COMMAND python3 -m unittest ${CMAKE_SOURCE_DIR}/tests/tools/test_sglang_bundle.py -v
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(sglang_bundle_sitecustomize PROPERTIES TIMEOUT 60)
# tools/bench/gpu_paths.sh over fake suites (each setting's own scratch in every TOGETHER mode, a failing suite named,
# a bad TOGETHER refused) and tools/bench/marlin_bundle.sh's refusals of a bad WHEEL: no GPU, no vLLM.
add_test(NAME gpu_tools
         COMMAND python3 -m unittest ${CMAKE_SOURCE_DIR}/tests/tools/test_gpu_tools.py -v
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(gpu_tools PROPERTIES TIMEOUT 120)
# slurm/submit's refusals of a bad count or switch, by key, before anything is submitted (no Slurm needed).
add_test(NAME slurm_submit_refusals
         COMMAND python3 -m unittest ${CMAKE_SOURCE_DIR}/tests/tools/test_slurm_submit.py -v
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(slurm_submit_refusals PROPERTIES TIMEOUT 60)
