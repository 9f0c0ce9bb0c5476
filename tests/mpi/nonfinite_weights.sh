#!/usr/bin/env bash
# Broken weights are named, not passed on:
#  1. export of a checkpoint whose draft holds a NaN (midlayer.mlp.down_proj.weight[1, 2]) is refused, naming
#     the weight and the element; nothing is written;
#  2. train with a target whose embedding row 388 is NaN is refused at start naming model.embed_tokens.weight
#     [388, 0] and its file, instead of a non-finite gradient norm with the advice "lower --lr".
# usage: nonfinite_weights.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail, small_shards; the empty work folder

# set_nan FILE TENSOR INDEX: element INDEX (flat) of the F32 tensor TENSOR of the safetensors FILE set to NaN.
set_nan() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, name, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
t = json.loads(data[8:8 + n])[name]
assert t["dtype"] == "F32", t
at = 8 + n + t["data_offsets"][0] + 4 * index
data[at:at + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(bytes(data))
PY
}

small_shards 16 8
run train 2 train --model "$model" --shards "$work/s" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 2 --batch-size 4 --checkpoint-every 2 || fail train

# 1. export of a NaN draft weight
ck="$work/run/checkpoints/step-00000002"
cols=$(python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); print(json.loads(b[8:8+struct.unpack('<Q',b[:8])[0]])['midlayer.mlp.down_proj.weight']['shape'][1])" "$ck/draft.safetensors")
set_nan "$ck/draft.safetensors" midlayer.mlp.down_proj.weight $((cols + 2))
refused export_nan "export: --checkpoint $ck: the draft's weight midlayer.mlp.down_proj.weight is not finite at \[1, 2\] = nan" \
  1 export --model "$model" --checkpoint "$ck" --output "$work/export"
[ ! -e "$work/export/model.safetensors" ] || fail "export_nan: the broken draft was exported"
echo "1. export refuses a checkpoint with a NaN weight, naming it"

# 2. train with a NaN in the target's embedding
cp -r "$model" "$work/model_nan"
H=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['hidden_size'])" "$model/config.json")
set_nan "$work/model_nan/model.safetensors" model.embed_tokens.weight $((388 * H))
refused train_nan "model_nan/model.safetensors: the target's weight model.embed_tokens.weight is not finite at \[388, 0\] = nan" \
  2 train --model "$work/model_nan" --shards "$work/s" --vocab "$work/vocab.safetensors" --output "$work/run_nan" \
  --steps 2 --batch-size 4 --allow-other-target
grep -q "lower --lr" "$last" && fail "train_nan: still advises lowering --lr"
echo "2. train names the target's NaN embedding weight"
echo PASS
