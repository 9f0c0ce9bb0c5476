#!/usr/bin/env bash
# Sizes checked against the memory they need before anything is allocated (train --draft-heads
# 1000000 grew to 24 GB before the OOM killer; a config.json of num_hidden_layers 10**12 ended extract and plan
# in std::bad_alloc naming nothing):
#  1. train --draft-heads 100000000 (2 TiB of training state) is refused naming --draft-heads and the memory;
#  2. plan and extract over a config.json of 10**12 layers are refused naming num_hidden_layers and the file.
# usage: absurd_sizes.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail, small_shards; the empty work folder

small_shards 16 8
refused train_heads "train: the draft of 100000000 heads \(--draft-heads\).* parameters: training it needs .* GiB.* more than the .* GiB of memory this machine has available" \
  2 train --model "$model" --shards "$work/s" --vocab "$work/vocab.safetensors" --output "$work/run" --steps 2 \
  --draft-heads 100000000
grep -q bad_alloc "$last" && fail "train_heads: std::bad_alloc"
echo "1. train refuses --draft-heads 100000000 before allocating"

cp -r "$model" "$work/big"
python3 - "$work/big/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 10**12; json.dump(c, open(sys.argv[1], "w"))
PY
pattern="$work/big/config.json: num_hidden_layers 1000000000000 needs .* GiB for aerie's per-layer state"
refused plan_layers "$pattern" 1 plan --model "$work/big" --tp 1
refused extract_layers "$pattern" 2 extract --model "$work/big" --prepared "$work/prepared.h5" --aux-layers 1,2,4 \
  --output "$work/s_big"
echo "2. plan and extract refuse num_hidden_layers 10**12, naming the field and the file"
echo PASS
