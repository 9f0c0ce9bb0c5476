#!/usr/bin/env bash
# `aerie export --format speculators` end to end on stories260K: a short run is exported
# in both layouts; the speculators one has the config vLLM's `vllm serve DRAFT_DIR` reads (speculators_model_type,
# transformer_layer_config, speculators_config.verifier = the --model folder or --verifier, speculative_tokens)
# and the default export's tensors byte for byte under the speculators names (midlayer. -> layers.0.), and the
# default export's checkpoint record (aerie_checkpoint, checkpoint_step / checkpoint_selected_by); the
# options are refused where they do not apply; a draft trained with EAGLE-3.1's norm_before_residual, norm_output,
# norm_before_fc or fc_norm exports (fc_norm: refused for SGLang before 0.5.12 and beside norm_before_fc),
# evaluates and refuses a mismatched resume. The names and fields are checked against the loaders' source in
# tests/train/export_speculators_test.cc.
# usage: export_speculators.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 16 \
  || fail prepare
run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  || fail vocab
run extract 1 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --aux-layers 2,3,4 \
  || fail extract
# The plain EAGLE-3 draft (norm_before_residual is on by default); a resume that does not name the option takes
# the checkpoint's setting (a requeued job), and a run without it gets the default (on) in its export.
run train 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-norm-before-residual=false || fail train
run resume_default 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
  --output "$work/run" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 \
  || fail "a resume without --draft-norm-before-residual refused the checkpoint's setting"
grep -q "norm_before_residual off as the checkpoint was trained" "$last" || fail "the resume did not say it kept it off"
run train_default 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
  --output "$work/run_default" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 || fail "train (defaults)"
run export_default 1 export --checkpoint "$work/run_default" --model "$model" --output "$work/default_eagle3" \
  --for vllm || fail "export (defaults)"
grep -q '"norm_before_residual": true' "$work/default_eagle3/config.json" || fail "the default draft is not norm_before_residual"

run export 1 export --checkpoint "$work/run" --model "$model" --output "$work/eagle3" || fail "export (default format)"
run export_eagle3 1 export --checkpoint "$work/run" --model "$model" --output "$work/eagle3_named" --format eagle3 \
  || fail "export --format eagle3"
cmp "$work/eagle3/model.safetensors" "$work/eagle3_named/model.safetensors" || fail "--format eagle3 is not the default"
cmp "$work/eagle3/config.json" "$work/eagle3_named/config.json" || fail "--format eagle3 is not the default"
run export_spec 1 export --checkpoint "$work/run" --model "$model" --output "$work/spec" --format speculators \
  || fail "export --format speculators"
grep -q "speculators format; serve with: vllm serve $work/spec" "$last" || fail "no serve hint"
run export_spec2 1 export --checkpoint "$work/run" --model "$model" --output "$work/spec2" --format speculators \
  --verifier org/target-model --speculative-tokens 5 --for vllm || fail "export --format speculators --verifier"

# Engine releases: the aux ids at the top level (vLLM's capture list, aerie's ids) and in eagle_config
# (SGLang's: it adds 1 to every id of a Llama target, so minus 1), default layers too. A release that would
# not serve the draft as trained is refused, naming the first that does.
run export_sglang 1 export --checkpoint "$work/run" --model "$model" --output "$work/sglang" --for sglang \
  || fail "export --for sglang"
grep -q "served as trained from SGLang 0.4.9 and later" "$last" || fail "--for sglang does not name the first release serving it"
python3 - "$work" <<'PY' || fail "the aux ids per engine"
import json, sys
w = sys.argv[1]
for d in ("sglang", "eagle3", "spec"):
    c = json.load(open(w + "/%s/config.json" % d))
    assert c["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4], (d, c)
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3], (d, c["eagle_config"])
PY
refused export_sglang_048 "SGLang 0.4.8 does not serve aux layers other than the default .*: the first release that does is 0.4.9" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/sglang_048" --for sglang==0.4.8
refused export_vllm_0100 "vLLM 0.10.0 does not serve norm_before_residual .*: the first release that does is 0.10.1" \
  1 export --checkpoint "$work/run_default" --model "$model" --output "$work/vllm_0100" --for vllm==0.10.0
[ ! -e "$work/vllm_0100" ] || fail "a refused export left $work/vllm_0100"
grep -q "the architecture LlamaForCausalLMEagle3: the first release that does is 0.10.2" "$last" \
  || fail "--for vllm==0.10.0 does not name the architecture's first release"
grep -q "aux layers other than the default (2, N/2, N-3): the first release that does is 0.11.1" "$last" \
  || fail "--for vllm==0.10.0 does not name the aux ids' first release"
run export_vllm_0111 1 export --checkpoint "$work/run_default" --model "$model" --output "$work/vllm_0111" \
  --for vllm==0.11.1 || fail "export --for vllm==0.11.1"
refused export_sglang_nbr "no SGLang release aerie checked \(up to [0-9.]+\) serves norm_before_residual" \
  1 export --checkpoint "$work/run_default" --model "$model" --output "$work/sglang_nbr" --for sglang==0.5.23
refused export_for_bad "aerie export: --for vllm==latest: engine release 'latest' is not a release number" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/bad" --for vllm==latest

python3 - "$work" "$model" <<'PY' || fail "the speculators export"
import json, os, struct, sys
work, model = sys.argv[1], os.path.normpath(os.path.abspath(sys.argv[2]))  # the job's absolute --model
def st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h, b[8 + n:]
def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
c = json.load(open(work + "/spec/config.json"))
check("model_type" not in c, "a top-level model_type (vLLM would not take the speculators path)")
check(c["speculators_model_type"] == "eagle3", "speculators_model_type")
check(c["norm_before_residual"] is False, "norm_before_residual")
check(c["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4], "aux ids")
check(c["draft_vocab_size"] == 200, "draft_vocab_size")
s = c["speculators_config"]
check(s["algorithm"] == "eagle3" and s["default_proposal_method"] == "greedy", "algorithm")
check(s["proposal_methods"][0]["proposal_type"] == "greedy", "proposal_type")
check(s["proposal_methods"][0]["speculative_tokens"] == 3, "speculative_tokens default")
check(s["verifier"]["name_or_path"] == model, "verifier %s, want %s" % (s["verifier"]["name_or_path"], model))
check(s["verifier"]["architectures"] == ["LlamaForCausalLM"], "verifier architectures")
l = c["transformer_layer_config"]
check(l["model_type"] == "llama" and l["num_hidden_layers"] == 1 and l["vocab_size"] == 512, "transformer_layer_config")
c2 = json.load(open(work + "/spec2/config.json"))
check(c2["speculators_config"]["verifier"]["name_or_path"] == "org/target-model", "--verifier")
check(c2["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5, "--speculative-tokens")
he, be = st(work + "/eagle3/model.safetensors")
hs, bs = st(work + "/spec/model.safetensors")
check(he["__metadata__"] == hs["__metadata__"], "metadata")
check(hs["__metadata__"]["checkpoint_step"] == "4" and hs["__metadata__"]["checkpoint_selected_by"] == "newest",
      "metadata checkpoint_step / checkpoint_selected_by")
ce = json.load(open(work + "/eagle3/config.json"))
check(c["aerie_checkpoint"] == ce["aerie_checkpoint"] and c["aerie_checkpoint"]["step"] == 4
      and c["aerie_checkpoint"]["selected_by"] == "newest", "aerie_checkpoint %s" % c.get("aerie_checkpoint"))
names = {k for k in he if k != "__metadata__"}
check({k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k for k in names} ==
      {k for k in hs if k != "__metadata__"}, "tensor names")
for k in names:
    n = k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k
    a, b = he[k]["data_offsets"], hs[n]["data_offsets"]
    check(he[k]["dtype"] == hs[n]["dtype"] and he[k]["shape"] == hs[n]["shape"], k + ": dtype or shape")
    check(be[a[0]:a[1]] == bs[b[0]:b[1]], k + ": bytes differ")
check(hs["t2d"]["dtype"] == "BOOL" and hs["d2t"]["dtype"] == "I64", "d2t/t2d dtypes")
PY
echo "speculators export: config and tensors ok"

# An EAGLE-3.1 option: a draft trained with FLAG gets FIELD true in both exports (the fields the serving
# engines read: norm_before_residual vLLM and speculators, norm_output and norm_before_fc vLLM, SGLang and
# speculators) and the plain draft's default export none; norm_before_fc's trained weight input_norm.weight
# (BF16 [3 H_t] = [192]) is in both exports with the same bytes and not in the plain one; eval reads either export and is lossless (aerie's own decoding runs
# the option); a resume of the run trained without it is refused by name.
# usage: eagle31_option TAG FLAG FIELD
eagle31_option() {
  local tag=$1 flag=$2 field=$3
  run "train_$tag" 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
    --output "$work/run_$tag" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 "$flag" || fail "train $flag"
  run "export_$tag" 1 export --checkpoint "$work/run_$tag" --model "$model" --output "$work/${tag}_eagle3" \
    || fail "export ($tag)"
  run "export_${tag}_spec" 1 export --checkpoint "$work/run_$tag" --model "$model" --output "$work/${tag}_spec" \
    --format speculators || fail "export --format speculators ($tag)"
  python3 - "$work" "$tag" "$field" <<'PY' || fail "the $field exports"
import json, sys
w, tag, field = sys.argv[1:]
e, s, p = (json.load(open(w + f)) for f in (f"/{tag}_eagle3/config.json", f"/{tag}_spec/config.json", "/eagle3/config.json"))
if e.get(field) is not True: sys.exit(f"FAIL: the default export lacks {field}: true")
if s.get(field) is not True: sys.exit(f"FAIL: the speculators export lacks {field}: true")
if field in p: sys.exit(f"FAIL: the plain draft's export writes {field}")
norms = {"norm_before_fc": {"input_norm.weight": [192]},
         "fc_norm": {f"fc_norm.{k}.weight": [64] for k in range(3)}}.get(field, {})
if norms:
    import struct
    def st(path):
        b = open(path, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        return json.loads(b[8:8 + n]), b[8 + n:]
    (he, be), (hs, bs), (hp, _) = (st(w + f) for f in (f"/{tag}_eagle3/model.safetensors",
                                                     f"/{tag}_spec/model.safetensors", "/eagle3/model.safetensors"))
    for name, shape in norms.items():
        for h in (he, hs):
            t = h.get(name)
            if not t or t["dtype"] != "BF16" or t["shape"] != shape:
                sys.exit(f"FAIL: {name} {t}, want BF16 {shape}")
        a, b = he[name]["data_offsets"], hs[name]["data_offsets"]
        if be[a[0]:a[1]] != bs[b[0]:b[1]]: sys.exit(f"FAIL: {name} differs between the two exports")
        if name in hp: sys.exit(f"FAIL: the plain draft's export holds {name}")
PY
  for d in "${tag}_eagle3" "${tag}_spec"; do
    run "eval_$d" 1 eval --model "$model" --draft "$work/$d" --prompts "$text" --num-prompts 4 --max-new-tokens 12 \
      --num-draft-tokens 3 --device cpu --dtype f32 --output "$work/eval_$d.json" || fail "eval --draft $d"
    grep -q '"lossless": true' "$work/eval_$d.json" || { cat "$work/eval_$d.json"; fail "eval of $d is not lossless"; }
  done
  refused "resume_$tag" "$flag is on but the checkpoint was trained with it off" \
    1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run" \
    --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 "$flag"
  echo "$field: trained, exported (both formats), evaluated losslessly, resume refused"
}
eagle31_option nbr --draft-norm-before-residual norm_before_residual  # residual base hidden_norm(h)
eagle31_option nout --draft-norm-output norm_output                    # norm(o) handed to the next step
eagle31_option nbf --draft-norm-before-fc norm_before_fc                # fc(input_norm(f)), a trained weight
eagle31_option fcn --draft-fc-norm fc_norm                              # fc(concat_k fc_norm.k(f_k)), three
refused export_fcn_sglang "SGLang 0.5.11 does not serve fc_norm: the first release that does is 0.5.12" \
  1 export --checkpoint "$work/run_fcn" --model "$model" --output "$work/x" --for sglang==0.5.11
# The boolean draft options take a value as --draft-norm-before-residual does: =false is off (so the resume of
# the fc_norm run is refused by name, not by an unparsed argument).
refused fcn_resume_false "--draft-fc-norm is off but the checkpoint was trained with it on" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run_fcn" \
  --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-fc-norm=false
refused fcn_with_nbf "--draft-fc-norm .one norm per aux chunk. and --draft-norm-before-fc .* are both given" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/x" \
  --steps 4 --batch-size 4 --draft-fc-norm --draft-norm-before-fc

# The sliding window: a draft trained with --draft-sliding-window 16 gets layer_types ["sliding_attention"] and
# sliding_window 16 where vLLM reads them (the eagle3 config's top level, the speculators config's
# transformer_layer_config), export --for sglang refuses it (SGLang's Llama layer has no window), eval reads
# either export losslessly, and a resume of the run trained without it is refused by name.
run train_win 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
  --output "$work/run_win" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-sliding-window 16 \
  || fail "train --draft-sliding-window 16"
run export_win 1 export --checkpoint "$work/run_win" --model "$model" --output "$work/win_eagle3" || fail "export (win)"
run export_win_spec 1 export --checkpoint "$work/run_win" --model "$model" --output "$work/win_spec" \
  --format speculators || fail "export --format speculators (win)"
refused export_win_sglang "no SGLang release aerie checked \\(up to [0-9.]+\\) serves a sliding window" \
  1 export --checkpoint "$work/run_win" --model "$model" --output "$work/x" --for sglang
python3 - "$work" <<'PY' || fail "the sliding-window exports"
import json, sys
w = sys.argv[1]
e, s = (json.load(open(w + f)) for f in ("/win_eagle3/config.json", "/win_spec/config.json"))
for name, c in (("eagle3", e), ("speculators", s["transformer_layer_config"])):
    if c.get("layer_types") != ["sliding_attention"] or c.get("sliding_window") != 16:
        sys.exit(f"FAIL: the {name} config has layer_types {c.get('layer_types')}, sliding_window {c.get('sliding_window')}")
PY
for d in win_eagle3 win_spec; do
  run "eval_$d" 1 eval --model "$model" --draft "$work/$d" --prompts "$text" --num-prompts 4 --max-new-tokens 12 \
    --num-draft-tokens 3 --device cpu --dtype f32 --output "$work/eval_$d.json" || fail "eval --draft $d"
  grep -q '"lossless": true' "$work/eval_$d.json" || { cat "$work/eval_$d.json"; fail "eval of $d is not lossless"; }
done
refused resume_win "--draft-sliding-window is 16 but the checkpoint was trained with 0" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-sliding-window 16
refused negative_win "--draft-sliding-window must be >= 0" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/x" \
  --steps 4 --draft-sliding-window -3
refused huge_win "--draft-sliding-window 512 is not below --model" \
  2 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/x" \
  --steps 4 --draft-sliding-window 512
grep -q "MPI_ABORT" "$last" && fail "the window beyond the positions was refused through MPI_Abort"
[ ! -e "$work/x" ] || fail "a refused train wrote files"
# --draft-sliding-window auto: the power of two at or above the training samples' 90th percentile (prepare's
# --max-length 64 caps them), in the log and the export; a resume without the option is refused naming it.
run train_auto 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
  --output "$work/run_auto" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-sliding-window auto \
  || fail "train --draft-sliding-window auto"
picked=$(sed -n 's/.*--draft-sliding-window auto: \([0-9]*\) keys, the power of two at or above the 90th percentile.*/\1/p' "$last")
[ -n "$picked" ] && [ "$picked" -ge 32 ] && [ "$picked" -le 64 ] && [ $((picked & (picked - 1))) -eq 0 ] ||
  fail "auto picked '$picked' (a power of two from 32 to 64 for samples cut to 64 tokens)"
run export_auto 1 export --checkpoint "$work/run_auto" --model "$model" --output "$work/auto_eagle3" || fail "export (auto)"
grep -q "\"sliding_window\": $picked" "$work/auto_eagle3/config.json" || fail "the export lacks sliding_window $picked"
run resume_auto 1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
  --output "$work/run_auto" --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-sliding-window auto \
  || fail "a resume with --draft-sliding-window auto was refused"
refused resume_auto_lost "--draft-sliding-window is 0 but the checkpoint was trained with auto \\($picked keys\\)" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run_auto" \
  --steps 4 --batch-size 4 --checkpoint-every 4 --log-every 4
refused bad_win "--draft-sliding-window 'wide' is not a number of keys or auto" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/x" \
  --steps 4 --draft-sliding-window wide
[ ! -e "$work/x" ] || fail "a refused train wrote files"
echo "sliding window: trained, exported (both formats), refused for SGLang, evaluated losslessly, resume refused;" \
  "auto picked $picked keys"

refused format "aerie export: --format 'gguf' is not eagle3 or speculators" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/x" --format gguf
refused sglang "--format speculators is read by vLLM, not SGLang" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/x" --format speculators --for sglang
refused verifier_default "are options of --format speculators" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/x" --verifier org/x
refused tokens "--speculative-tokens 0 is not >= 1" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/x" --format speculators --speculative-tokens 0
[ ! -e "$work/x" ] || fail "a refused export wrote files"
# An --output holding another run's export is kept unless --force; the same run's is replaced (a rerun); a
# checkpoint whose optimizer state was deleted (to save space) still exports.
before=$(sha256sum "$work/eagle3/model.safetensors")
refused export_other "holds the export of another run .*run_default.*: pass --force" \
  1 export --checkpoint "$work/run" --model "$model" --output "$work/default_eagle3"
run export_again 1 export --checkpoint "$work/run" --model "$model" --output "$work/eagle3" || fail "export of the same run again"
[ "$(sha256sum "$work/eagle3/model.safetensors")" = "$before" ] || fail "the same checkpoint exported other bytes"
run export_force 1 export --checkpoint "$work/run" --model "$model" --output "$work/default_eagle3" --force ||
  fail "export --force over another run's export"
cmp "$work/eagle3/model.safetensors" "$work/default_eagle3/model.safetensors" || fail "--force did not replace it"
ck=$(ls -d "$work"/run/checkpoints/step-* | tail -1)
rm "$ck/optimizer.safetensors"
run export_no_optimizer 1 export --checkpoint "$work/run" --model "$model" --output "$work/eagle3" ||
  fail "export of a checkpoint without optimizer.safetensors"
refused resume_no_optimizer "needs its optimizer state, optimizer.safetensors, which is gone.*--init-draft" \
  1 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 8 --batch-size 4 --checkpoint-every 4 --log-every 4 --draft-norm-before-residual=false
# A token id outside the target's vocabulary in a shard: train names the shard and the sample.
mkdir -p "$work/bad_shards" && cp "$work"/shards/shard-*.h5 "$work/bad_shards/"
python3 - "$work/bad_shards/shard-00000.h5" <<'PY' || { echo "(no h5py: the out-of-vocabulary case is skipped)"; exit 0; }
import sys
import h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["input_ids"][5] = 99999
PY
refused train_bad_id "bad_shards/shard-00000.h5 sample 0 \(prepared sample 0\) holds token id 99999 at position 5" \
  1 train --model "$model" --shards "$work/bad_shards" --vocab "$work/vocab.safetensors" --output "$work/run_bad_id" \
  --steps 2 --batch-size 16 --eval-fraction 0
echo "PASS: export --format speculators"
