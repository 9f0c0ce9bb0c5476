#!/usr/bin/env bash
# extract and non-finite hidden states with the aerie binary (issue 17, case 5), 2 ranks: a target whose
# embedding row of one token is NaN (stories260K with row 388 set to NaN: every sample holding that token
# gets NaN hidden states from there on, 9 of these 24 samples)
#  - without --skip-nonfinite: extract fails, naming the prepared sample and --skip-nonfinite;
#  - with it: exit 0, one warning per skipped sample, the total in rank 0's summary, and train reads the shards
#    (with the clean target: the NaN row would poison the target's head in train too);
#  - a rerun after a shard is lost redoes it byte for byte, counting its skips and those the kept shards
#    record; a rerun without the option accepts the complete folder and reports the skips.
# usage: extract_nonfinite.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, fail; the empty work folder

cp -r "$model" "$work/model_nan"
python3 - "$model/model.safetensors" "$work/model_nan/model.safetensors" 388 <<'EOF'
import array, json, struct, sys
src, dst, row = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
t = json.loads(data[8:8 + n])["model.embed_tokens.weight"]
cols = t["shape"][1]
start = 8 + n + t["data_offsets"][0] + row * cols * 4
data[start:start + cols * 4] = array.array("f", [float("nan")] * cols).tobytes()
open(dst, "wb").write(bytes(data))
EOF

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 24 \
  || fail prepare
x() { echo extract --model "$work/model_nan" --prepared "$work/prepared.h5" --samples-per-shard 8 --aux-layers 1,2,4 \
  --output "$work/$1"; }

# shellcheck disable=SC2046
if run strict 2 $(x strict); then fail "extract without --skip-nonfinite exited 0 on NaN hidden states"; fi
grep -Eq "prepared sample [0-9]+ has a non-finite (final|aux)_hidden_states .* at token [0-9]+ \(id [0-9]+\).*--skip-nonfinite" \
  "$last" || fail "the error names no sample or not --skip-nonfinite"

# shellcheck disable=SC2046
run skip 2 $(x shards) --skip-nonfinite || fail "extract --skip-nonfinite"
k=$(grep -c "warning extract: skipping prepared sample" "$last" || true)
[ "$k" -gt 0 ] && [ "$k" -lt 24 ] || fail "expected some of 24 samples skipped, got $k warnings"
grep -q "\[r0\] warning extract: skipped $k prepared sample(s)" "$last" || fail "rank 0's summary does not say $k"
grep -q "$k of 24 prepared samples are not in" "$last" || fail "the summary does not give the total $k of 24"
[ "$(ls "$work/shards" | grep -c '^shard-.*\.h5$')" -eq 3 ] || fail "expected 3 shards"
if ls "$work/shards" | grep -q '\.tmp$'; then fail ".tmp files left"; fi

run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" \
  --draft-vocab-size 200 || fail vocab
run train 2 train --shards "$work/shards" --model "$model" --allow-other-target --vocab "$work/vocab.safetensors" \
  --output "$work/run" --steps 8 --batch-size 4 --checkpoint-every 4 --log-every 4 || fail "train on the shards"
grep -q "step 8/8" "$last" || fail "train did not reach step 8"
if grep -q "non-finite" "$last"; then fail "train saw non-finite samples"; fi

# A lost shard that had left samples out: the rerun redoes it (the same bytes) and counts its skips and
# those the kept shards record.
lost=$(grep -m1 -o "not written to .*/shard-[0-9]*\.h5" "$work/skip.log" | grep -o "shard-[0-9]*\.h5")
cp "$work/shards/$lost" "$work/lost.ref"
rm "$work/shards/$lost"
# shellcheck disable=SC2046
run rerun 2 $(x shards) --skip-nonfinite || fail "rerun"
grep -q "2 already done" "$last" || fail "the rerun did not keep 2 shards"
k1=$(grep -c "warning extract: skipping prepared sample" "$last" || true)
[ "$k1" -gt 0 ] && [ "$k1" -lt "$k" ] || fail "expected the rerun of $lost to skip some of the $k samples, got $k1"
grep -Eq "skipped $k1 prepared sample\(s\) .*, and the 2 shard\(s\) already done left out $((k - k1)) more: $k of 24" "$last" \
  || fail "the rerun's summary does not count $k1 + $((k - k1))"
cmp "$work/lost.ref" "$work/shards/$lost" || fail "the redone $lost differs"
# Without the option the complete folder is accepted and its skips reported.
# shellcheck disable=SC2046
run done 2 $(x shards) || fail "a rerun of the complete folder without --skip-nonfinite"
grep -q "3 already done" "$last" || fail "the complete folder was not kept"
grep -q "the 3 shard(s) already done left out $k prepared sample(s) .*: $k of 24" "$last" \
  || fail "the skips of the complete folder are not reported"
echo "OK: without --skip-nonfinite refused naming the sample; with it $k of 24 samples skipped and counted, train" \
  "reads the shards, a rerun redoes the lost $lost byte for byte and counts $k1 + $((k - k1)) skips"
