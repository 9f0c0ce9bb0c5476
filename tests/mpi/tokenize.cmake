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
# Kimi-K2's tiktoken folder (tiktoken.model, no tokenizer.json): "Hello, world!" is [19180, 11, 2695, 0]
# (tiktoken), BOS [BOS] = 163584.
if(EXISTS "${AERIE_SHARED_DATA}/tokenizers/kimi-k2/tiktoken.model")
  add_test(NAME tokenize_kimi_k2
           COMMAND sh -c "printf 'Hello, world!' | \"$1\" tokenize --tokenizer \"$2\" --offsets --bos" sh
                   $<TARGET_FILE:aerie> ${AERIE_SHARED_DATA}/tokenizers/kimi-k2)
  set_tests_properties(tokenize_kimi_k2 PROPERTIES LABELS mpi
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    PASS_REGULAR_EXPRESSION "^163584 19180 11 2695 0\n0:0 0:5 5:6 6:12 12:13\n$")
endif()
