# The command line: a usage error ends every rank normally (exit 2, message once, no MPI_Abort banner),
# and an unknown subcommand prints the list of subcommands.
set(_aerie_cli_env "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
add_test(NAME cli_usage_error_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe -np 2 $<TARGET_FILE:aerie> train --no-such-option 1)
set_tests_properties(cli_usage_error_np2 PROPERTIES ENVIRONMENT "${_aerie_cli_env}" LABELS mpi
  PASS_REGULAR_EXPRESSION "aerie train: unrecognised option '--no-such-option' \\(see aerie train --help\\)"
  FAIL_REGULAR_EXPRESSION "MPI_ABORT")
# A mistyped option gets the closest real one.
add_test(NAME cli_option_typo COMMAND $<TARGET_FILE:aerie> train --stpes 10)
set_tests_properties(cli_option_typo PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "unrecognised option '--stpes' \\(did you mean --steps\\?\\) \\(see aerie train --help\\)")
# An option's prefix is not taken for the option ("--step 10" is not --steps 10).
add_test(NAME cli_option_prefix_refused COMMAND $<TARGET_FILE:aerie> train --step 10)
set_tests_properties(cli_option_prefix_refused PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "unrecognised option '--step' \\(did you mean --steps\\?\\)")
# A stray word (Boost ignores positional tokens): "--fp8-gemm false" turned the option on.
add_test(NAME cli_stray_argument_refused COMMAND $<TARGET_FILE:aerie> extract --fp8-gemm false)
set_tests_properties(cli_stray_argument_refused PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "aerie extract: unexpected argument 'false' \\(options are --name VALUE")
# aerie_cli_config_test(NAME FILE CONTENT REGEX): `aerie train --config FILE` with FILE holding CONTENT must
# print REGEX.
function(aerie_cli_config_test name file content regex)
  file(WRITE ${CMAKE_BINARY_DIR}/test-scratch/cli/${file} "${content}")
  add_test(NAME ${name} COMMAND $<TARGET_FILE:aerie> train --config ${CMAKE_BINARY_DIR}/test-scratch/cli/${file})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${_aerie_cli_env}" PASS_REGULAR_EXPRESSION "${regex}")
endfunction()
# A bad INI value or an unknown key: the file and line (Boost names neither line), the suggestion as a key.
aerie_cli_config_test(cli_config_bad_value_line bad_value.ini "steps = 2\n# a comment\nbatch-size = x\n"
  "config file .*/bad_value.ini:3: the argument \\('x'\\) for option 'batch-size' is invalid")
aerie_cli_config_test(cli_config_unknown_key_line unknown_key.ini "steps = 2\n\nstepz = 3\n"
  "config file .*/unknown_key.ini:3: unrecognised option 'stepz' \\(did you mean steps\\?\\)")
add_test(NAME cli_missing_config COMMAND $<TARGET_FILE:aerie> vocab --config /nonexistent/vocab.ini)
set_tests_properties(cli_missing_config PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "aerie vocab: cannot open config file /nonexistent/vocab.ini" FAIL_REGULAR_EXPRESSION "MPI_ABORT")
# An INI value in quotes (Boost keeps the quotes: a folder named '"runs' would be written) and a key written
# as an option are refused naming the line.
aerie_cli_config_test(cli_config_quoted_value quoted.ini "steps = 2\noutput = \"runs/x\"\n"
  "quoted.ini:2: the value of output is in quotes, which an INI value keeps as part of it; write 'output = runs/x'")
aerie_cli_config_test(cli_config_dashed_key dashes.ini "--steps = 2\n" "dashes.ini:1: write the key without dashes: 'steps = 2'")
aerie_cli_config_test(cli_config_no_equals noequals.ini "seed = 1\nsteps 400\n"
  "aerie [a-z]+: config file [^ ]*noequals.ini:2: 'steps 400' is not a 'key = value' line")
add_test(NAME cli_unknown_subcommand COMMAND $<TARGET_FILE:aerie> trian)
set_tests_properties(cli_unknown_subcommand PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "unknown subcommand .trian. \\(did you mean train\\?\\).*extract")
# A bad option value is reported before the target model is loaded (the model directory does not exist).
add_test(NAME cli_extract_bad_batch_tokens
         COMMAND $<TARGET_FILE:aerie> extract --model /nonexistent --prepared /nonexistent/p.h5 --output /nonexistent/o
                 --batch-tokens -3)
set_tests_properties(cli_extract_bad_batch_tokens PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "--batch-tokens -3 is negative")
# A missing prepared file is named before the target model is read (the model directory does not exist).
add_test(NAME cli_extract_missing_prepared
         COMMAND $<TARGET_FILE:aerie> extract --model /nonexistent --prepared /nonexistent/p.h5 --output /nonexistent/o)
set_tests_properties(cli_extract_missing_prepared PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "prepared file /nonexistent/p.h5: no such file")
# train, eval and generate check their option values and input paths before the target model is read (the
# model directory does not exist: a late check would report its config.json instead).
add_test(NAME cli_train_bad_precision
         COMMAND $<TARGET_FILE:aerie> train --model /nonexistent --shards /nonexistent/s --output /nonexistent/o
                 --precision f16)
set_tests_properties(cli_train_bad_precision PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "aerie train: --precision 'f16' is not auto, bf16 or f32")
add_test(NAME cli_train_missing_shards
         COMMAND $<TARGET_FILE:aerie> train --model /nonexistent --shards /nonexistent/s --output /nonexistent/o
                 --vocab /nonexistent/v.safetensors)
set_tests_properties(cli_train_missing_shards PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "train: --shards /nonexistent/s: no such folder")
add_test(NAME cli_eval_missing_prompts
         COMMAND $<TARGET_FILE:aerie> eval --model /nonexistent --draft /nonexistent/d --prompts /nonexistent/p.txt)
set_tests_properties(cli_eval_missing_prompts PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "eval: --prompts /nonexistent/p.txt: no such file")
add_test(NAME cli_generate_missing_input
         COMMAND $<TARGET_FILE:aerie> generate --model /nonexistent --input /nonexistent/c.jsonl
                 --output /nonexistent/o.jsonl)
set_tests_properties(cli_generate_missing_input PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "generate: --input /nonexistent/c.jsonl: no such file")
add_test(NAME cli_prepare_missing_input
         COMMAND $<TARGET_FILE:aerie> prepare --input /nonexistent/s.txt --tokenizer /nonexistent/t --output /nonexistent/p.h5)
set_tests_properties(cli_prepare_missing_input PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "prepare: --input /nonexistent/s.txt: no such file")
# A missing model folder is named with the option that gave it (jobs.h load_model_option; train, extract,
# vocab, export and eval do the same).
add_test(NAME cli_generate_missing_model COMMAND $<TARGET_FILE:aerie> generate --model /nonexistent/m --prompt hi)
set_tests_properties(cli_generate_missing_model PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "generate: --model /nonexistent/m: model folder /nonexistent/m does not exist"
  FAIL_REGULAR_EXPRESSION "MPI_ABORT")
# aerie --version names the version and the git commit of the build (issue 13 item 5; every output records
# the same string as aerie_version); aerie help JOB is JOB --help.
add_test(NAME cli_version COMMAND $<TARGET_FILE:aerie> --version)
set_tests_properties(cli_version PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "^aerie ${PROJECT_VERSION}\\+[0-9a-z.-]+   \\(version ${PROJECT_VERSION}, git [0-9a-z.-]+;[^\n]*\\)\nbackends: CPU")
add_test(NAME cli_help_job COMMAND $<TARGET_FILE:aerie> help vocab)
set_tests_properties(cli_help_job PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
  PASS_REGULAR_EXPRESSION "aerie vocab")
# Every shipped per-job config (configs/runs/RUN/JOB.ini) parses for its job: no unknown key, no bad value
# (`aerie JOB --config FILE --help` reads the file before it prints the help).
file(GLOB _aerie_run_configs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/configs/runs/*/*.ini)
foreach(_f ${_aerie_run_configs})
  get_filename_component(_job ${_f} NAME_WE)
  get_filename_component(_run ${_f} DIRECTORY)
  get_filename_component(_run ${_run} NAME)
  add_test(NAME cli_run_config_${_run}_${_job} COMMAND $<TARGET_FILE:aerie> ${_job} --config ${_f} --help)
  set_tests_properties(cli_run_config_${_run}_${_job} PROPERTIES ENVIRONMENT "${_aerie_cli_env}"
    PASS_REGULAR_EXPRESSION "usage: aerie ${_job} \\[options\\]")
endforeach()
