#!/usr/bin/env bash
# A shard folder is read by what its shards record, not by a glob (`cp shard-00003.h5
# "shard-00003 (copy).h5"` made train report 14 shards and train chunk 3 twice): copies of shard-00003.h5
# named "shard-00003 (copy).h5", shard-00003-old.h5 and shard-99999.h5 (a shard name, but it records chunk 3)
# are each named in a warning and skipped; train reads the extraction's 12 shards, each once.
# usage: shard_copies.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, fail, small_shards; the empty work folder

small_shards 48 4
[ "$(ls "$work/s" | grep -c '^shard-.*\.h5$')" -eq 12 ] || fail "extract did not write 12 shards"
cp "$work/s/shard-00003.h5" "$work/s/shard-00003 (copy).h5"
cp "$work/s/shard-00003.h5" "$work/s/shard-00003-old.h5"
cp "$work/s/shard-00003.h5" "$work/s/shard-99999.h5"
run train 2 train --model "$model" --shards "$work/s" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 2 --batch-size 4 --checkpoint-every 2 --eval-fraction 0 || fail train
grep -q "train: 12 shards" "$last" || fail "train did not read 12 shards: $(grep -o 'train: [0-9]* shards' "$last")"
for f in "shard-00003 (copy).h5" shard-00003-old.h5; do
  grep -Fq "skipping $work/s/$f: its name is not a shard's" "$last" || fail "no warning naming $f"
done
grep -Fq "skipping $work/s/shard-99999.h5: it records chunk 3 (a copy of shard-00003.h5?), not chunk 99999" "$last" \
  || fail "no warning naming shard-99999.h5 as a copy of chunk 3"
python3 - "$work/run/data_split.json" <<'PY' || fail "data_split.json does not list the 12 shards once each"
import json, os, sys
names = [os.path.basename(s["path"]) for s in json.load(open(sys.argv[1]))["shards"]]
assert names == ["shard-%05d.h5" % c for c in range(12)], names
PY
echo PASS
