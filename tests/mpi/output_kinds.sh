#!/usr/bin/env bash
# prepare, generate and eval refuse an --output that holds another kind of file (a model's weights, a
# prepared file, a JSONL dataset, a checkpoint table) or names a folder, before any work, and leave the file
# as it was; they replace their own kind of output (a rerun) as before, and an empty file (jobs.h
# check_output_replaceable); prepare keeps an up-to-date prepared file and replaces one of other settings
# or older inputs only with --overwrite. vocab --force replaces a draft vocabulary only; extract does not write shards
# into a model's folder.
# usage: output_kinds.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work/folder" "$work/fake_export"
cd "$work"
cp "$model/model.safetensors" weights.safetensors
: > fake_export/config.json; : > fake_export/model.safetensors
echo '{"conversations":[{"from":"human","value":"Tell me a story."}]}' > prompts.jsonl
echo '{"conversations":[{"from":"human","value":"Hi"},{"from":"gpt","value":"Hello."}]}' > dataset.jsonl
echo '{"format": "aerie.checkpoint_eval", "aerie_version": "x", "checkpoints": []}' > table.json
mkdir -p model_copy && cp "$model"/* model_copy/
printf 'Once upon a time there was a cat. What did the cat do next?\n' > prompts.txt
fail() { echo "FAIL: $*"; tail -5 last.log; exit 1; }
refused() {  # refused NEEDLE FILE CMD...: fails naming NEEDLE, FILE unchanged
  local needle=$1 file=$2; shift 2
  local before; before=$(sha256sum "$file" 2>/dev/null || echo folder)
  if mpirun -np 1 "$aerie" "$@" >last.log 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$needle" last.log || fail "the refusal of '$*' names no '$needle'"
  grep -q MPI_ABORT last.log && fail "the refusal of '$*' went through MPI_Abort"
  [ "$(sha256sum "$file" 2>/dev/null || echo folder)" = "$before" ] || fail "$file changed"
  return 0
}
prep() { mpirun -np 1 "$aerie" prepare --input "$text" --tokenizer "$model" --max-length 64 --max-samples 4 "$@"; }
prep --output prepared.h5 >last.log 2>&1 || fail "prepare"
prep --output prepared.h5 >last.log 2>&1 || fail "prepare again over its own output"
grep -q "prepared.h5 is up to date" last.log || fail "a rerun with the same settings did not keep prepared.h5"
# Other settings: refused, naming the option, the file kept; --overwrite replaces it (then up to date again).
refused "was prepared with other settings or from older files: --max-length 32 (the file: 64)" prepared.h5 \
  prepare --input "$text" --tokenizer "$model" --max-length 32 --max-samples 4 --output prepared.h5
mpirun -np 1 "$aerie" prepare --input "$text" --tokenizer "$model" --max-length 32 --max-samples 4 --output prepared.h5 \
  --overwrite >last.log 2>&1 || fail "prepare --overwrite"
grep -q "replacing prepared.h5 (--overwrite): --max-length 32 (the file: 64)" last.log || fail "--overwrite did not say why"
prep --output prepared.h5 --overwrite >last.log 2>&1 || fail "prepare back to --max-length 64"
cp "$text" input_copy.txt
mpirun -np 1 "$aerie" prepare --input input_copy.txt --tokenizer "$model" --max-length 64 --max-samples 4 \
  --output from_copy.h5 >last.log 2>&1 || fail "prepare from a copy"
# A fresh copy of the same text (a newer time: the README's block pasted again) is up to date; other text is not.
cp "$text" input_copy.txt && touch -d "now + 1 minute" input_copy.txt
mpirun -np 1 "$aerie" prepare --input input_copy.txt --tokenizer "$model" --max-length 64 --max-samples 4 \
  --output from_copy.h5 >last.log 2>&1 || fail "prepare over a fresh copy of the same input"
grep -q "from_copy.h5 is up to date" last.log || fail "a fresh copy of the same input was not up to date"
sed -i '1s/a/A/' input_copy.txt  # the same size, other text
refused "input's contents (sha256)" from_copy.h5 \
  prepare --input input_copy.txt --tokenizer "$model" --max-length 64 --max-samples 4 --output from_copy.h5
: > empty.h5
prep --output empty.h5 >last.log 2>&1 || fail "prepare over an empty file"
refused "exists and is not a prepared file of aerie prepare (it is a safetensors file)" weights.safetensors \
  prepare --input "$text" --tokenizer "$model" --output weights.safetensors --max-samples 4
refused "is a folder; name a file" folder prepare --input "$text" --tokenizer "$model" --output folder --max-samples 4
[ -z "$(ls folder)" ] || fail "prepare wrote into the folder"
refused "exists and is not an output of aerie generate (answers with aerie_response_ids) (it is an HDF5 file)" prepared.h5 \
  generate --model "$model" --input prompts.jsonl --output prepared.h5 --max-new 4
refused "exists and is not an output of aerie generate" dataset.jsonl \
  generate --model "$model" --input prompts.jsonl --output dataset.jsonl --max-new 4
mpirun -np 1 "$aerie" generate --model "$model" --input prompts.jsonl --output gen.jsonl --max-new 4 >last.log 2>&1 \
  || fail "generate"
rm -rf gen.jsonl.parts
mpirun -np 1 "$aerie" generate --model "$model" --input prompts.jsonl --output gen.jsonl --max-new 4 >last.log 2>&1 \
  || fail "generate again over its own output"
refused "is not a draft vocabulary of aerie vocab, so it is not replaced, not even with --force" weights.safetensors \
  vocab --prepared prepared.h5 --model "$model" --output weights.safetensors --force
refused "exists and is not an eval.json of aerie eval" table.json \
  eval --model "$model" --draft fake_export --prompts prompts.txt --output table.json
refused "holds config.json (a model's folder, or a draft export), not shards" model_copy/model.safetensors \
  extract --model "$model" --prepared prepared.h5 --output model_copy
[ "$(ls model_copy | grep -c shard)" = 0 ] || fail "extract wrote shards into the model folder"
# train refuses a model's folder (or an export) as its run folder: eval --draft and export --checkpoint would
# read two different drafts from it.
mpirun -np 1 "$aerie" extract --model "$model" --prepared prepared.h5 --output shards >last.log 2>&1 || fail "extract"
mpirun -np 1 "$aerie" vocab --model "$model" --prepared prepared.h5 --output vocab.safetensors --draft-vocab-size 64 \
  >last.log 2>&1 || fail "vocab"
refused "holds config.json (a model's folder or a draft export of aerie export), not a run folder" \
  model_copy/model.safetensors train --model "$model" --shards shards --vocab vocab.safetensors --output model_copy --steps 1
[ ! -e model_copy/checkpoints ] || fail "train wrote into the model folder"
# Option values a helper found accepted or mis-reported (2026-12-04).
refused "vocab: --vocab-size must be in \[1, 2^31\], got 4294967301" prompts.txt \
  vocab --prepared prepared.h5 --output v2.safetensors --vocab-size 4294967301
refused "give one of them" prompts.txt vocab --prepared prepared.h5 --model "$model" --output v2.safetensors --vocab-size 100
refused "stop-id 99999 is not a token id" prompts.txt generate --model "$model" --prompt "Once" --stop-id 99999
refused "top-p acts only with --temperature > 0" prompts.txt generate --model "$model" --prompt "Once" --top-p 0.5
refused "is the --input file" prompts.jsonl generate --model "$model" --input prompts.jsonl --output prompts.jsonl --max-new 4
refused "exists and is not an eval.json of aerie eval (it is an HDF5 file)" prepared.h5 \
  eval --model "$model" --draft fake_export --prompts prompts.txt --output prepared.h5
refused "exists and is not an eval.json of aerie eval (it is a JSON or JSONL file)" prompts.jsonl \
  eval --model "$model" --draft fake_export --prompts prompts.txt --output prompts.jsonl
# An --output that is a symbolic link: the job writes the link's target and the link stays (it used to be
# replaced by a regular file in the link's folder, the target left stale).
mkdir -p linked
ln -s ../prepared.h5 linked/prep_link.h5
mpirun -np 1 "$aerie" prepare --input "$text" --tokenizer "$model" --max-length 48 --max-samples 4 \
  --output linked/prep_link.h5 --overwrite >last.log 2>&1 || fail "prepare --overwrite through a link"
grep -q "is a symbolic link: writing" last.log || fail "prepare did not say it follows the link"
[ -L linked/prep_link.h5 ] || fail "prepare replaced the symbolic link"
mpirun -np 1 "$aerie" prepare --input "$text" --tokenizer "$model" --max-length 48 --max-samples 4 \
  --output prepared.h5 >last.log 2>&1 || fail "prepare over the link's target"
grep -q "prepared.h5 is up to date" last.log || fail "the link's target was not rewritten (--max-length 48)"
ln -s ../vocab.safetensors linked/vocab_link.safetensors
mpirun -np 1 "$aerie" vocab --model "$model" --prepared prepared.h5 --output linked/vocab_link.safetensors \
  --draft-vocab-size 32 --force >last.log 2>&1 || fail "vocab --force through a link"
[ -L linked/vocab_link.safetensors ] || fail "vocab replaced the symbolic link"
python3 -c 'import json, struct, sys; f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
sys.exit(0 if json.loads(f.read(n))["d2t"]["shape"] == [32] else 1)' vocab.safetensors ||
  fail "the link's target was not rewritten (--draft-vocab-size 32)"
ln -s ../gen.jsonl linked/gen_link.jsonl
rm -rf gen.jsonl.parts
mpirun -np 1 "$aerie" generate --model "$model" --input prompts.jsonl --output linked/gen_link.jsonl --max-new 4 \
  >last.log 2>&1 || fail "generate through a link"
[ -L linked/gen_link.jsonl ] || fail "generate replaced the symbolic link"
[ ! -e linked/gen_link.jsonl.parts ] || fail "generate kept its parts beside the link, not beside the target"
echo "output kinds: prepare, generate, eval and train refuse other kinds of files and folders, rerun over their own"
