# aerie tokenize: stdin (the whole of it, one string) -> one line of ids, and with --offsets a line of
# byte ranges. Llama-3's "Hello world" is [9906, 1917] (Hugging Face tokenizers, add_special_tokens=False).
if(EXISTS "${AERIE_SHARED_DATA}/tokenizers/llama3/tokenizer.json")
  add_test(NAME tokenize_llama3
           COMMAND sh -c "printf 'Hello world' | \"$1\" tokenize --tokenizer \"$2\" --offsets --bos" sh
                   $<TARGET_FILE:aerie> ${AERIE_SHARED_DATA}/tokenizers/llama3)
  set_tests_properties(tokenize_llama3 PROPERTIES LABELS mpi
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "^128000 9906 1917\n0:0 0:5 5:11\n$")
endif()
