# aerie plan: the memory plan from config.json and safetensors headers (src/model/memory_plan.h), printed
# by rank 0; --tp defaults to the world size.
set(_aerie_plan_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
# A real (tiny) checkpoint's header under mpirun -np 2: tp 2, the plan printed once, and it fits.
add_test(NAME plan_qwen2_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:aerie> plan
                 --model ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen2 --gpu-memory 80GiB --max-length 128)
set_tests_properties(plan_qwen2_np2 PROPERTIES ENVIRONMENT "${_aerie_plan_env}" LABELS mpi
  PASS_REGULAR_EXPRESSION "^aerie plan: qwen2\n.*per rank of tp 2:.*\nfits: [^\n]*margin 7[0-9]\\.[0-9][0-9] GiB[^\n]*\n$"
  FAIL_REGULAR_EXPRESSION "aerie plan: qwen2.*aerie plan: qwen2")
# Kimi-K2.5 from the shared tensor list at tp 8 on 96 GB GPUs: 70.95 GiB of weights per rank with embed_tokens /
# lm_head split by vocabulary (deepseek-v3.md section 7), and it fits; the verdict for aerie's own layout follows.
set(_k25 "${AERIE_SHARED_DATA}/kimi-deepseek-configs/config-kimi-k25")
if(EXISTS "${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz")
  add_test(NAME plan_kimi_k25_tp8
           COMMAND $<TARGET_FILE:aerie> plan --model-config ${_k25}/config.transformers-5.7.0-redump.json
                   --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB --embed-split vocab)
  set_tests_properties(plan_kimi_k25_tp8 PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
    PASS_REGULAR_EXPRESSION "total +208215 +553\\.40 GiB +70\\.95 GiB +76\\.18 GB.*vision_tower\\.\\* +329 .*\nfits: [^\n]*\naerie extract today [^\n]*78\\.61 GiB per rank, margin 10\\.79 GiB [^\n]*: fits")
endif()
# docs/time-plan.md's Kimi-K2.5 worked example: 500K samples of 1.5K tokens on 8 GPUs of 96 GB at tp 8, from the two
# calibrations of docs/calibrations (a tp-8 rank on an H100, the node's all-reduces modeled): the hours the document
# gives, so that a change of the plan's arithmetic changes the document too.
if(EXISTS "${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz")
  foreach(_cal IN ITEMS "pcie-sm120;140\\.60 h;53\\.74 h;3\\.85 h;8\\.3 days"
                        "nvlink;101\\.25 h;18\\.70 h;3\\.65 h;123\\.60 h")
    list(GET _cal 0 _name)
    list(GET _cal 1 _gen)
    list(GET _cal 2 _ext)
    list(GET _cal 3 _train)
    list(GET _cal 4 _total)
    add_test(NAME plan_kimi_k25_worked_example_${_name}
             COMMAND $<TARGET_FILE:aerie> plan --model-config ${_k25}/config.transformers-5.7.0-redump.json
                     --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB --embed-split vocab
                     --calibration ${CMAKE_SOURCE_DIR}/docs/calibrations/kimi-k25-tp8-${_name}.h100.json --world 8
                     --samples 500000 --mean-tokens 1500 --train-batch-size 64 --storage fp8
                     --generate-responses 500000 --generate-prompt-tokens 1000 --generate-new-tokens 500
                     --gpu-hour-cost 2.5)
    set_tests_properties(plan_kimi_k25_worked_example_${_name} PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
      PASS_REGULAR_EXPRESSION "\n  generate +${_gen} [^\n]*\n  extract +${_ext} [^\n]*shards 19\\.57 TiB \\(fp8\\)[^\n]*\n  train +${_train} [^\n]*\n  total +${_total} ")
  endforeach()
  # The committed calibrations record the target they measured (its fingerprint): Kimi-K2 (block FP8, the same hidden
  # size and layers) is refused with them, naming both targets.
  set(_k2 "${AERIE_SHARED_DATA}/kimi-deepseek-configs/config-kimi-k2-instruct")
  if(EXISTS "${_k2}/kimi-k2-instruct.tensors.expanded.jsonl.gz")
    add_test(NAME plan_kimi_k2_refuses_k25_calibration
             COMMAND $<TARGET_FILE:aerie> plan --model-config ${_k2}/config.json
                     --tensors ${_k2}/kimi-k2-instruct.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB
                     --calibration ${CMAKE_SOURCE_DIR}/docs/calibrations/kimi-k25-tp8-nvlink.h100.json --world 8
                     --samples 500000 --mean-tokens 1500)
    set_tests_properties(plan_kimi_k2_refuses_k25_calibration PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
      PASS_REGULAR_EXPRESSION "measured a target of [^\n]*INT4[^\n]*; this one is of [^\n]*block FP8[^\n]*: calibrate this model")
  endif()
  # --epochs and --train-steps both given: refused, not one silently ignored.
  add_test(NAME plan_epochs_and_train_steps
           COMMAND $<TARGET_FILE:aerie> plan --model-config ${_k25}/config.transformers-5.7.0-redump.json
                   --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB
                   --calibration ${CMAKE_SOURCE_DIR}/docs/calibrations/kimi-k25-tp8-nvlink.h100.json --samples 1000
                   --mean-tokens 1500 --epochs 3 --train-steps 100)
  set_tests_properties(plan_epochs_and_train_steps PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
    PASS_REGULAR_EXPRESSION "aerie plan: --epochs and --train-steps both say how much train draws: give one")
  # plan --job generate --batch-size 32 with a calibration that decoded 64 at once: said, with the calibrate option.
  add_test(NAME plan_generate_batch_not_the_calibrations
           COMMAND $<TARGET_FILE:aerie> plan --job generate --model-config ${_k25}/config.transformers-5.7.0-redump.json
                   --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB --embed-split vocab
                   --batch-size 32 --max-length 2048
                   --calibration ${CMAKE_SOURCE_DIR}/docs/calibrations/kimi-k25-tp8-nvlink.h100.json --samples 1000
                   --mean-tokens 1500 --generate-responses 1000 --generate-prompt-tokens 1000 --generate-new-tokens 500)
  set_tests_properties(plan_generate_batch_not_the_calibrations PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
    PASS_REGULAR_EXPRESSION "\\(generate is costed at the calibration's decoding of 64 sequences at once, not --batch-size 32's: calibrate --gen-batch-size 32 for its own\\)")
endif()
# The time plan's options without --calibration: refused, not ignored.
add_test(NAME plan_time_options_need_calibration
         COMMAND $<TARGET_FILE:aerie> plan --model ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen2 --gpu-memory 80GiB
                 --samples 100 --mean-tokens 40)
set_tests_properties(plan_time_options_need_calibration PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "aerie plan: --samples describes the time and disk plan, which needs --calibration FILE")
add_test(NAME plan_missing_config COMMAND $<TARGET_FILE:aerie> plan --model /nonexistent)
set_tests_properties(plan_missing_config PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "plan: --model /nonexistent: model folder /nonexistent does not exist")
# A draft's config (an export given as the target) is refused, not planned as a one-layer target.
file(WRITE ${CMAKE_BINARY_DIR}/test-scratch/plan/draft_config.json
     "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"hidden_size\": 64, \"num_hidden_layers\": 1}\n")
add_test(NAME plan_draft_config COMMAND $<TARGET_FILE:aerie> plan --model-config
         ${CMAKE_BINARY_DIR}/test-scratch/plan/draft_config.json --tensors ${CMAKE_BINARY_DIR}/test-scratch/plan/none.txt)
set_tests_properties(plan_draft_config PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "draft_config.json: an EAGLE draft's config \\(architecture LlamaForCausalLMEagle3\\), not a target model's")
# tp 3 does not divide Qwen2's 4 heads: the target would refuse to load, so the plan says it does not run (exit 1).
add_test(NAME plan_tp_not_dividing_heads
         COMMAND $<TARGET_FILE:aerie> plan --model ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen2 --tp 3 --gpu-memory 96GB)
set_tests_properties(plan_tp_not_dividing_heads PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "does not run: tp 3 does not divide num_attention_heads 4 / num_key_value_heads 2.*does NOT run")
add_test(NAME plan_no_model COMMAND $<TARGET_FILE:aerie> plan --tp 8)
set_tests_properties(plan_no_model PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "aerie plan: give --model DIR, or --model-config FILE and --tensors FILE")
add_test(NAME plan_size_without_unit
         COMMAND $<TARGET_FILE:aerie> plan --model ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen2 --gpu-memory 96)
set_tests_properties(plan_size_without_unit PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "aerie plan: --gpu-memory '96' needs a unit \\(e.g. 96GB, 80GiB\\)")
# A GPU size that is a typo (0GB, 96TB) is refused.
add_test(NAME plan_gpu_memory_typo
         COMMAND $<TARGET_FILE:aerie> plan --model ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen2 --gpu-memory 96TB)
set_tests_properties(plan_gpu_memory_typo PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
  PASS_REGULAR_EXPRESSION "aerie plan: --gpu-memory 96TB is not one GPU's memory \\(1 GiB to 4 TiB")
# A plan that does not fit is printed and exits 1 (Kimi-K2.5 at tp 1 on 80 GiB).
if(EXISTS "${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz")
  add_test(NAME plan_kimi_k25_tp1_does_not_fit
           COMMAND bash -c "out=$($0 plan --model-config $1 --tensors $2 --tp 1 --gpu-memory 80GiB); rc=$?; echo \"$out\" | tail -1; [ $rc = 1 ] && echo \"$out\" | grep -q 'does NOT fit'"
                   $<TARGET_FILE:aerie> ${_k25}/config.transformers-5.7.0-redump.json ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz)
  set_tests_properties(plan_kimi_k25_tp1_does_not_fit PROPERTIES ENVIRONMENT "${_aerie_plan_env}")
  # What would fit (aerie's layout, the default): the smallest larger tp, and the longest --max-length at this tp.
  add_test(NAME plan_kimi_k25_suggests
           COMMAND $<TARGET_FILE:aerie> plan --model-config ${_k25}/config.transformers-5.7.0-redump.json
                   --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB --max-length 131072)
  set_tests_properties(plan_kimi_k25_suggests PROPERTIES ENVIRONMENT "${_aerie_plan_env}" WILL_FAIL FALSE
    PASS_REGULAR_EXPRESSION "does NOT fit.*\nfits at --tp 16: [^\n]*\nfits at tp 8 with --max-length 32768: ")
  # generate (docs/memory-plan.md): 64 sequences of 4096 tokens do not fit tp 8 on 96 GB; the larger tp, and the
  # most sequences that fit at tp 8 (the bisection: 41 fit, 42 do not), with the replicated embeddings also when
  # the plan's headline splits them by vocabulary.
  foreach(_split replicated vocab)
    add_test(NAME plan_kimi_k25_generate_suggests_${_split}
             COMMAND $<TARGET_FILE:aerie> plan --job generate --model-config ${_k25}/config.transformers-5.7.0-redump.json
                     --tensors ${_k25}/kimi-k2.5.tensors.expanded.jsonl.gz --tp 8 --gpu-memory 96GB --batch-size 64
                     --max-length 4096 --embed-split ${_split})
    set_tests_properties(plan_kimi_k25_generate_suggests_${_split} PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
      PASS_REGULAR_EXPRESSION "KV caches \\(bf16\\) +17\\.16 GiB.*\nfits at --tp 16[^\n]*\nfits at tp 8 with --batch-size 41 \\(the most that fit\\)")
  endforeach()
endif()
# Qwen3-235B-A22B at tp 8 on 96 GB GPUs: its released config.json (tests/model/fixtures/configs) and the tensor
# list of its layout written by tools/reference/moe_tensor_list.py (the tool's names and shapes are those of
# the checkpoints transformers saves: moe_tensor_list_matches_fixtures). 94 MoE layers, 128 experts; the 4 kv
# heads replicated over 2 ranks each; 56.94 GiB of weights per rank, and it fits.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME moe_tensor_list_matches_fixtures
           COMMAND sh -c "${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/reference/moe_tensor_list.py --check ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/qwen3_moe && ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/reference/moe_tensor_list.py --check ${CMAKE_SOURCE_DIR}/tests/model/fixtures/hf/mixtral")
  set_tests_properties(moe_tensor_list_matches_fixtures PROPERTIES
    PASS_REGULAR_EXPRESSION "qwen3_moe: 80 tensors, names and shapes as the checkpoint's\n.*mixtral: 41 tensors")
  set(_q235 "${CMAKE_BINARY_DIR}/test-scratch/plan/qwen3-235b-a22b.tensors.jsonl.gz")
  add_test(NAME plan_qwen3_235b_tp8
           COMMAND sh -c "mkdir -p ${CMAKE_BINARY_DIR}/test-scratch/plan && ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/reference/moe_tensor_list.py ${CMAKE_SOURCE_DIR}/tests/model/fixtures/configs/qwen3-235b-a22b.config.json ${_q235} && $<TARGET_FILE:aerie> plan --model-config ${CMAKE_SOURCE_DIR}/tests/model/fixtures/configs/qwen3-235b-a22b.config.json --tensors ${_q235} --tp 8 --gpu-memory 96GB")
  set_tests_properties(plan_qwen3_235b_tp8 PROPERTIES ENVIRONMENT "${_aerie_plan_env}"
    PASS_REGULAR_EXPRESSION "94 layers \\(0 dense, 94 MoE\\), 128 routed experts top-8.*total +36945 +437\\.90 GiB +56\\.94 GiB.*\nfits: 59\\.96 GiB per rank of 89\\.41 GiB")
endif()
