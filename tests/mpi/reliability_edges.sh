#!/usr/bin/env bash
# The edges of the second reliability round, one case each (all on stories260K, most on 2 ranks):
#  1. generate with an empty --input, an empty JSON array, or --max-conversations 0 fails naming the file / option;
#  2. generate names its first dropped records by file:line and why (not only a count);
#  3. one NUL byte in a JSONL line drops that record (named by file:line and column), not the whole file;
#     a binary file is still refused as one (eval's reading: tests/data/prompt_input_test.cc);
#  4. an INI file with a UTF-8 byte order mark and ';' comment lines is read (no invisible character);
#  5. a lock file of random bytes (no record, no flock) is taken over with a warning naming it;
#  6. an empty assistant turn is not trained as a [BOS, EOS] sample: prepare skips it, counted, with file:line;
#  7. prepare with no usable sample on 2 ranks ends cleanly on every rank (exit 1, no MPI_Abort / ORTE noise);
#  8. eval --output into a folder it cannot write is refused before the evaluation, by its output lock (a read-only bind mount,
#     where this process may mount one).
# usage: reliability_edges.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder
no_abort() { ! grep -Eq "MPI_ABORT|MPI_Abort|ORTE|PRTE" "$last" || fail "$1: ended through MPI_Abort"; }

# 1. nothing to generate
: >"$work/empty.jsonl"
refused gen_empty "aerie generate: --input $work/empty.jsonl is empty: no record to generate" 2 \
  generate --model "$model" --input "$work/empty.jsonl" --output "$work/g.jsonl"
echo "[]" >"$work/none.json"
refused gen_no_record "generate: --input $work/none.json holds no record" 2 \
  generate --model "$model" --input "$work/none.json" --output "$work/g.jsonl"
printf '{"conversations": [{"from": "human", "value": "Tom had a red ball."}]}\n' >"$work/one.jsonl"
refused gen_max0 "aerie generate: --max-conversations 0 leaves no record to generate" 2 \
  generate --model "$model" --input "$work/one.jsonl" --output "$work/g.jsonl" --max-conversations 0
refused gen_new0 "aerie generate: --max-new must be >= 1" 2 \
  generate --model "$model" --input "$work/one.jsonl" --output "$work/g.jsonl" --max-new-tokens 0
no_abort gen_new0
[ ! -e "$work/g.jsonl" ] || fail "generate wrote $work/g.jsonl although it failed"
echo "1. generate: an empty --input, an empty array, --max-conversations 0 and --max-new-tokens 0 fail naming the file / option"

# 2. + 3. dropped records named; a NUL byte drops its record only
{
  printf '{"conversations": [{"from": "human", "value": "Tom had a red ball."}]}\n'
  printf '{"conversations": "no list"}\n'
  printf '{"conversations": [{"from": "human", "value": "The sun\0 was hot."}]}\n'
  printf 'not json\n'
  printf '{"conversations": [{"from": "human", "value": "Lily saw a big dog."}]}\n'
} >"$work/mixed.jsonl"
run gen_mixed 2 generate --model "$model" --input "$work/mixed.jsonl" --output "$work/mixed.out.jsonl" \
  --max-new-tokens 20 || fail "generate on a file with a NUL byte and bad records failed"
[ "$(wc -l <"$work/mixed.out.jsonl")" -eq 2 ] || fail "gen_mixed: $(wc -l <"$work/mixed.out.jsonl") records written, want 2"
for want in "dropped $work/mixed.jsonl:3: bad JSON \(a NUL byte at column 55" "dropped $work/mixed.jsonl:4: bad JSON" \
            "dropped $work/mixed.jsonl:2: wrong keys or types"; do
  grep -Eq -- "$want" "$last" || fail "gen_mixed: no warning matching: $want"
done
printf 'SAFE\0\0\0\0{"x": 1}\n' >"$work/binary.jsonl"
refused gen_binary "is a binary file \(NUL bytes from byte offset 4 on\)" 1 \
  generate --model "$model" --input "$work/binary.jsonl" --output "$work/g.jsonl"
echo "2. generate names dropped records by file:line; 3. a NUL byte drops its record, a binary file is refused"

# 4. an INI file with a byte order mark and ';' comments
printf '\xEF\xBB\xBFmax-length = 64\n; a comment\n  ; an indented one\nmax-samples = 8\n' >"$work/bom.ini"
run ini 1 prepare --config "$work/bom.ini" --input "$text" --tokenizer "$model" --output "$work/ini.h5" ||
  fail "an INI file with a BOM and ';' comments was refused"
grep -q "max_length 64, .*max_samples 8" "$last" || fail "ini: the INI values were not taken"
printf '\xEF\xBB\xBFmax-lenght = 64\n' >"$work/bom_typo.ini"
refused ini_typo "config file $work/bom_typo.ini:1: unrecognised option 'max-lenght'" 1 \
  prepare --config "$work/bom_typo.ini" --input "$text" --tokenizer "$model" --output "$work/ini2.h5"
! grep -q $'\xEF\xBB\xBF' "$last" || fail "ini_typo: the byte order mark is in the message"
echo "4. an INI file with a UTF-8 BOM and ';' comment lines is read; its errors name the key without the BOM"

# 5. a lock file of random bytes
head -c 200 /dev/urandom >"$work/lk.h5.lock"
run lock_garbage 1 prepare --input "$text" --tokenizer "$model" --output "$work/lk.h5" --max-length 64 --max-samples 8 ||
  fail "a lock file of random bytes blocked prepare"
grep -q "taking over the lock $work/lk.h5.lock, which holds no readable aerie lock record (200 bytes)" "$last" ||
  fail "lock_garbage: no warning naming the lock file"
echo "5. a lock file of random bytes is taken over with a warning naming it"

# 6. empty assistant turns
{
  printf '{"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello there, Tom."}]}\n'
  printf '{"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": ""}]}\n'
  printf '{"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "  "}]}\n'
} >"$work/answers.jsonl"
run empty_answer 2 prepare --input "$work/answers.jsonl" --tokenizer "$model" --output "$work/answers.h5" ||
  fail "prepare of a file with empty answers failed"
grep -q "1 samples kept, 2 skipped (empty answer 2)" "$last" || fail "empty_answer: not counted in the summary"
grep -q "skipped answers.jsonl:2: empty answer (every assistant turn is empty" "$last" ||
  fail "empty_answer: the first record is not named"
echo "6. empty assistant turns are skipped, counted, the first named"

# 7. no usable sample on 2 ranks
{
  printf '{"conversations": [{"from": "human", "value": "Hi."}]}\n'
  printf '{"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": ""}]}\n'
} >"$work/unusable.jsonl"
refused no_sample "prepare: no usable sample in $work/unusable.jsonl \(2 records, 2 skipped" 2 \
  prepare --input "$work/unusable.jsonl" --tokenizer "$model" --output "$work/unusable.h5"
no_abort no_sample
rc=0; run no_sample_rc 2 prepare --input "$work/unusable.jsonl" --tokenizer "$model" --output "$work/unusable.h5" || rc=$?
[ "$rc" -eq 1 ] || fail "no_sample: exit $rc, want 1"
[ ! -e "$work/unusable.h5.lock" ] || fail "no_sample: the lock is left"
echo "7. prepare with no usable sample ends on every rank without MPI_Abort (exit 1)"

# 8. eval into a read-only folder
ro="$work/ro"
mkdir -p "$ro"
if mount --bind "$ro" "$ro" 2>/dev/null && mount -o remount,bind,ro "$ro" 2>/dev/null; then
  trap 'umount "$ro" 2>/dev/null || true' EXIT
  # A draft to evaluate: 2 training steps on 16 samples.
  run d_prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/d.h5" --max-length 64 --max-samples 16 &&
    run d_extract 1 extract --model "$model" --prepared "$work/d.h5" --aux-layers 2,3,4 --output "$work/d_shards" &&
    run d_vocab 1 vocab --model "$model" --prepared "$work/d.h5" --draft-vocab-size 64 --output "$work/d_vocab.safetensors" &&
    run d_train 1 train --model "$model" --shards "$work/d_shards" --vocab "$work/d_vocab.safetensors" --steps 2 \
      --batch-size 2 --output "$work/d_run" &&
    run d_export 1 export --model "$model" --checkpoint "$work/d_run" --output "$work/d_export" || fail "making a draft"
  printf 'Once upon a time there was a cat. It sat.\n\nTom had a ball. He played.\n' >"$work/p.txt"
  start=$(date +%s)
  refused eval_ro "eval: --output $ro/x.json: cannot open the lock file $ro/x.json.lock: Read-only file system" 1 eval --model "$model" \
    --draft "$work/d_export" --prompts "$work/p.txt" --output "$ro/x.json" --max-new-tokens 8
  ! grep -q "acceptance" "$last" || fail "eval_ro: the evaluation ran before the refusal"
  umount "$ro"
  echo "8. eval into a read-only folder is refused before the evaluation ($(( $(date +%s) - start )) s)"
else
  echo "8. skipped: cannot mount a read-only bind mount here (not root?)"
fi
echo PASS
