#!/usr/bin/env bash
# hf_test.sh - Hugging Face export and import through `cohort ckpt convert`, one case per meson
# test (docs/checkpoints.md "Hugging Face"):
#   llama_loss       --to hf-llama: the export's loss from an independent numpy Llama
#                    (tests/data/hf_llama_ref.py, HF names and config.json only) equals cohort's
#                    evaluation loss; the same export with q/k in Meta's interleaved rotary
#                    layout does not (the reference sees a rotary layout mistake)
#   llama_refused    models Llama's layout cannot hold are refused, each with its reason
#   roundtrip_gpt2   export -> --from hf-gpt2 -> bitwise the same parameters; --finetune from the
#                    import trains and evaluates as from the original
#   roundtrip_llama  the same for a Llama model (tied, head dim != hidden/heads), loaded at
#                    tensor-parallel size 2 with --use-checkpoint-args; a sharded BF16 copy of
#                    the export imports as the BF16 values
#   import_refused   malformed inputs refused, naming the tensor, key or file
#   hf_test.sh COHORT PYTHON CASE
cohort=$1; py=$2; case_name=$3
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir hf

# Llama's options: rotary positions, RMSNorm, SwiGLU, no biases
llama=(--position-embedding-type rope --rotary-base 500 --normalization RMSNorm --swiglu --disable-bias-linear
       --ffn-hidden-size 48)
tiny_model --global-batch-size 4 --eval-iters 2 --threads 2
train() { "$cohort" train "${tiny[@]}" "$@"; }
# $1 exits with status $2 and says $3 on stderr; the rest are convert's arguments
refused() {
    local want=$1 msg=$2; shift 2
    "$cohort" ckpt convert "$@" >"$work/r.out" 2>"$work/r.err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "convert $*: exit $rc, not $want: $(cat "$work/r.err")"
    grep -qF -- "$msg" "$work/r.err" || fail "convert $*: no '$msg' in: $(cat "$work/r.err")"
}
# --finetune runs from checkpoints $2 and $3 (names $1a, $1b) log the same training losses
# and gradient norms and the same evaluation losses; the rest are train's flags
same_finetune() {
    local n=$1 a=$2 b=$3; shift 3
    train --train-iters 2 --eval-interval 2 "$@" --load "$a" --finetune --metrics-file "$work/${n}a.jsonl" \
        >"$work/${n}a.out" 2>&1 || fail "$n: --finetune from $a: $(tail -3 "$work/${n}a.out")"
    train --train-iters 2 --eval-interval 2 "$@" --load "$b" --finetune --use-checkpoint-args \
        --metrics-file "$work/${n}b.jsonl" >"$work/${n}b.out" 2>&1 ||
        fail "$n: --finetune from $b: $(tail -3 "$work/${n}b.out")"
    grep -q "successfully loaded checkpoint from $b .*--finetune" "$work/${n}b.out" || fail "$n: no load line"
    same_losses "${n}a" "${n}b" "$n: --finetune from the import trains otherwise than from the original"
    grep '"evaluation"' "$work/${n}a.jsonl" >"$work/ea"; grep '"evaluation"' "$work/${n}b.jsonl" >"$work/eb"
    [ -s "$work/ea" ] && diff "$work/ea" "$work/eb" >&2 || fail "$n: evaluation losses differ"
}

case $case_name in
llama_loss)
    # GQA (4 heads, 2 groups), untied, a padded vocabulary (501 -> 512); weights drawn wide
    # enough (std 0.2) that attention is not uniform, so the rotary layout moves the loss
    run=("${llama[@]}" --group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights
         --init-method-std 0.2 --train-iters 10 --eval-interval 1000 --log-interval 5)
    train "${run[@]}" --save "$work/s" --metrics-file "$work/m.jsonl" >"$work/t.out" 2>&1 ||
        fail "training: $(tail -3 "$work/t.out")"
    "$cohort" data order "${tiny[@]}" "${run[@]}" --split-name valid --count 8 --items >"$work/items" 2>&1 ||
        fail "data order: $(cat "$work/items")"
    "$cohort" ckpt convert "$work/s" --to hf-llama --output "$work/hf" >"$work/c.out" || fail "convert"
    grep -q "Hugging Face Llama, padded vocabulary kept" "$work/c.out" || fail "$(cat "$work/c.out")"
    "$cohort" ckpt convert "$work/s" --to hf-llama --output "$work/hft" --trim-vocab >/dev/null || fail "--trim-vocab"
    "$cohort" ckpt convert --help | grep -q "hf-llama: the same in the Hugging Face Llama layout" || fail "--help"
    PYTHONPATH="$src/tests/data" "$py" - "$work" <<'EOF' || fail "the Llama export's loss differs from cohort's"
import json, sys
import numpy as np
import hf_gpt2_ref as G, hf_llama_ref as R
w = sys.argv[1]
ev = [json.loads(l) for l in open(w + "/m.jsonl") if '"evaluation":"valid"' in l]
assert len(ev) == 1 and ev[0]["iteration"] == 10, ev
ours = ev[0]["lm_loss"]
items = G.read_items(w + "/items")
assert [it["sample"] for it in items] == list(range(8))
assert all((it["positions"] == np.arange(32)).all() and it["mask"].sum() == 32 for it in items)
cfg, wt = R.load(w + "/hf")
want = {"architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 32, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500.0,
        "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "torch_dtype": "float32", "eos_token_id": 500}
assert all(cfg[k] == v for k, v in want.items()), {k: cfg.get(k) for k in want}
assert cfg["cohort"] == {"tokenizer-type": "NullTokenizer", "vocab-size": 500, "make-vocab-size-divisible-by": 128,
                         "vocab": 501}, cfg["cohort"]
names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} | {
    "model.layers.%d.%s.weight" % (l, n) for l in range(2) for n in
    ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]}
assert set(wt) == names, set(wt) ^ names
assert wt["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)
assert wt["model.layers.0.mlp.gate_proj.weight"].shape == (48, 32) and wt["lm_head.weight"].shape == (512, 32)
full, n = R.mean_loss(cfg, wt, items)
assert n == 8 * 32, n
# q and k in Meta's interleaved rotary order (pairs (2i, 2i+1)) instead of HF's halves
hd = 8
inter = np.stack([np.arange(hd // 2), np.arange(hd // 2) + hd // 2], 1).reshape(-1)
wm = dict(wt)
for l in range(2):
    for x in "qk":
        k = "model.layers.%d.self_attn.%s_proj.weight" % (l, x)
        wm[k] = wt[k].reshape(-1, hd, 32)[:, inter].reshape(-1, 32)
meta, _ = R.mean_loss(cfg, wm, items)
cfg_t, wt_t = R.load(w + "/hft")
assert cfg_t["vocab_size"] == 501 and (wt_t["lm_head.weight"] == wt["lm_head.weight"][:501]).all()
trim, _ = R.mean_loss(cfg_t, wt_t, items)
print("cohort %.9e  numpy %.9e  interleaved q/k %.9e  --trim-vocab %.9e" % (ours, full, meta, trim))
assert abs(full - ours) <= 1e-4 * abs(ours), "export: %.9e vs cohort %.9e" % (full, ours)
assert abs(meta - ours) > 1e-3 * abs(ours), "the reference cannot tell the rotary layouts apart"
assert trim < ours - 1e-3 * abs(ours), "trimmed export: %.9e vs cohort %.9e" % (trim, ours)
EOF
    ;;
llama_refused)
    # one iteration of each model; the export says what Llama lacks (exit 3)
    train --train-iters 1 --save "$work/gpt" >/dev/null 2>&1 || fail "GPT-2 run"
    refused 3 "the model has learned absolute position embeddings" "$work/gpt" --to hf-llama --output "$work/x"
    train --train-iters 1 --save "$work/ln" "${llama[@]}" --normalization LayerNorm >/dev/null 2>&1 || fail "LayerNorm run"
    refused 3 "the model has LayerNorm" "$work/ln" --to hf-llama --output "$work/x"
    train --train-iters 1 --save "$work/bias" --position-embedding-type rope --normalization RMSNorm --swiglu \
        >/dev/null 2>&1 || fail "bias run"
    refused 3 "the model has linear biases" "$work/bias" --to hf-llama --output "$work/x"
    train --train-iters 1 --save "$work/moe" "${llama[@]}" --num-experts 2 --moe-router-topk 1 >"$work/moe.out" 2>&1 ||
        fail "MoE run: $(tail -3 "$work/moe.out")"
    refused 3 "the model has a mixture of experts" "$work/moe" --to hf-llama --output "$work/x"
    [ ! -e "$work/x" ] || fail "a refused export wrote $work/x"
    refused 3 "--to hf-bert: unknown target; hf-gpt2, hf-llama or cohort" "$work/gpt" --to hf-bert --output "$work/x"
    ;;
roundtrip_gpt2)
    train --train-iters 3 --save "$work/s" >"$work/t.out" 2>&1 || fail "training: $(tail -3 "$work/t.out")"
    "$cohort" ckpt convert "$work/s" --to hf-gpt2 --output "$work/hf" >/dev/null || fail "export"
    "$cohort" ckpt convert "$work/hf" --from hf-gpt2 --output "$work/imp" >"$work/i.out" 2>&1 ||
        fail "import: $(cat "$work/i.out")"
    grep -q "wrote $work/imp iteration 0 from $work/hf (Hugging Face GPT-2" "$work/i.out" || fail "$(cat "$work/i.out")"
    "$cohort" ckpt verify "$work/imp" >/dev/null || fail "the import does not verify"
    "$cohort" ckpt diff "$work/s" "$work/imp" --model-only >"$work/d" || fail "parameters differ: $(head "$work/d")"
    grep -q "bitwise equal: 28 tensors" "$work/d" || fail "$(tail -2 "$work/d")"
    # (without --model-only the original's optimizer state is "only in A")
    "$cohort" ckpt diff "$work/s" "$work/imp" >/dev/null; [ $? -eq 1 ] || fail "diff without --model-only"
    "$py" - "$work/imp/iter_0000000/manifest.json" <<'EOF' || fail "the import's manifest"
import json, sys
m = json.load(open(sys.argv[1]))
c, mo = m["config"], m["model"]
assert m["iteration"] == 0 and m["parallel"]["tensor"] == 1 and m["optimizer"] is None, m["optimizer"]
assert (c["num-layers"], c["hidden-size"], c["num-attention-heads"], c["ffn-hidden-size"]) == (2, 32, 4, 128), c
assert c["position-embedding-type"] == "learned_absolute" and c["normalization"] == "LayerNorm" and not c["swiglu"]
assert c["tokenizer-type"] == "NullTokenizer" and c["vocab-size"] == 500 and c["make-vocab-size-divisible-by"] == 128
assert (mo["vocab"], mo["padded_vocab"], mo["tied"], mo["bias"]) == (501, 512, True, True), mo
EOF
    # training from the import: flags from the checkpoint, the same numbers as from the original
    same_finetune ft "$work/s" "$work/imp"
    # as the Hugging Face hub keeps GPT-2: no "transformer." prefix, the causal-mask buffers,
    # lm_head beside the tied wte, no "cohort" object (the NullTokenizer over all 512 rows)
    "$py" - "$work/hf" "$work/hub" <<'EOF' || fail "writing the hub-style copy"
import json, os, struct, sys
import numpy as np
sys.path.insert(0, os.environ["COHORT_SOURCE_ROOT"] + "/tests/data")
import hf_gpt2_ref as G
src, dst = sys.argv[1:3]
os.makedirs(dst)
c = json.load(open(src + "/config.json")); del c["cohort"]; json.dump(c, open(dst + "/config.json", "w"))
w = {k[len("transformer."):]: v.astype(np.float32) for k, v in G.read_safetensors(src + "/model.safetensors").items()}
w["lm_head.weight"] = w["wte.weight"]
for l in range(2):
    w["h.%d.attn.bias" % l] = np.tril(np.ones((1, 1, 32, 32), dtype=np.float32))
hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
for n in sorted(w):
    b = w[n].tobytes()
    hdr[n] = {"dtype": "F32", "shape": list(w[n].shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
EOF
    "$cohort" ckpt convert "$work/hub" --from hf-gpt2 --output "$work/imph" >"$work/ih.out" 2>&1 ||
        fail "hub-style import: $(cat "$work/ih.out")"
    "$cohort" ckpt diff "$work/s" "$work/imph" --model-only >"$work/d" || fail "hub-style: $(head "$work/d")"
    "$py" -c "
import json; m = json.load(open('$work/imph/iter_0000000/manifest.json')); c = m['config']
assert (c['tokenizer-type'], c['vocab-size'], c['make-vocab-size-divisible-by']) == ('NullTokenizer', 511, 128), c
assert (m['model']['vocab'], m['model']['padded_vocab']) == (512, 512), m['model']" || fail "hub-style tokenizer"
    ;;
roundtrip_llama)
    # tied, head dimension 16 with hidden 32 and 4 heads (kv channels), 2 query groups
    run=("${llama[@]}" --group-query-attention --num-query-groups 2 --kv-channels 16)
    train "${run[@]}" --train-iters 3 --save "$work/s" >"$work/t.out" 2>&1 || fail "training: $(tail -3 "$work/t.out")"
    "$cohort" ckpt convert "$work/s" --to hf-llama --output "$work/hf" >/dev/null || fail "export"
    "$cohort" ckpt convert "$work/hf" --from hf-llama --output "$work/imp" >"$work/i.out" 2>&1 ||
        fail "import: $(cat "$work/i.out")"
    "$cohort" ckpt diff "$work/s" "$work/imp" --model-only >"$work/d" || fail "parameters differ: $(head "$work/d")"
    grep -q "bitwise equal: 14 tensors" "$work/d" || fail "$(tail -2 "$work/d")"
    # at tensor-parallel size 2, the model's flags from the import (none given here)
    tp2=(--nproc-per-node 2 --tensor-model-parallel-size 2 --threads 1)
    same_finetune tp "$work/s" "$work/imp" "${tp2[@]}" "${run[@]}"
    train --train-iters 2 "${tp2[@]}" --load "$work/imp" --finetune --use-checkpoint-args >"$work/args.out" 2>&1 ||
        fail "--use-checkpoint-args alone: $(tail -3 "$work/args.out")"
    for l in "--kv-channels 16 from the checkpoint" "--num-query-groups 2 from the checkpoint" \
             "--position-embedding-type rope from the checkpoint" "--rotary-base 500 from the checkpoint" \
             "--swiglu on from the checkpoint" "--disable-bias-linear on from the checkpoint"; do
        grep -q -- "$l" "$work/args.out" || fail "--use-checkpoint-args: no '$l'"
    done
    # any layout exports: the tp 2 run's checkpoint as its tp 1 conversion
    train --train-iters 2 "${tp2[@]}" "${run[@]}" --load "$work/imp" --finetune --save "$work/t2" >"$work/t2.out" 2>&1 ||
        fail "tp 2 run: $(tail -3 "$work/t2.out")"
    "$cohort" ckpt convert "$work/t2" --to cohort --tensor-model-parallel-size 1 --output "$work/t1" >/dev/null ||
        fail "to tp 1"
    "$cohort" ckpt convert "$work/t2" --to hf-llama --output "$work/hf2" >/dev/null || fail "export from tp 2"
    "$cohort" ckpt convert "$work/t1" --to hf-llama --output "$work/hf1" >/dev/null || fail "export from tp 1"
    cmp "$work/hf1/model.safetensors" "$work/hf2/model.safetensors" || fail "the tp 2 and tp 1 exports differ"
    # the export in two shards with an index, as large Hugging Face models come: BF16, then F16
    "$py" - "$work/hf" "$work/hfb" <<'EOF' || fail "writing the BF16 shards"
import json, os, shutil, struct, sys
import numpy as np
sys.path.insert(0, os.environ["COHORT_SOURCE_ROOT"] + "/tests/data")
import hf_gpt2_ref as G
src, dst = sys.argv[1:3]
os.makedirs(dst)
shutil.copy(src + "/config.json", dst)
w = G.read_safetensors(src + "/model.safetensors")
def bf16(a):  # round to nearest even, as torch does
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
names = sorted(w)
wmap = {}
for i, part in enumerate([names[: len(names) // 2], names[len(names) // 2:]]):
    fn = "model-%05d-of-00002.safetensors" % (i + 1)
    hdr, blobs, off = {}, [], 0
    for n in part:
        b = (bf16(w[n]) if i == 0 else w[n].astype(np.float16)).tobytes()
        hdr[n] = {"dtype": "BF16" if i == 0 else "F16", "shape": list(w[n].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b); wmap[n] = fn
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(dst + "/" + fn, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
json.dump({"metadata": {}, "weight_map": wmap}, open(dst + "/model.safetensors.index.json", "w"))
EOF
    "$cohort" ckpt convert "$work/hfb" --from hf-llama --output "$work/impb" >"$work/ib.out" 2>&1 ||
        fail "sharded BF16/F16 import: $(cat "$work/ib.out")"
    "$py" - "$work/impb/iter_0000000/model.safetensors" "$work/s/iter_0000003/model.safetensors" "$work/hf" <<'EOF' ||
import os, sys
import numpy as np
sys.path.insert(0, os.environ["COHORT_SOURCE_ROOT"] + "/tests/data")
import hf_gpt2_ref as G
b, o = G.read_safetensors(sys.argv[1]), G.read_safetensors(sys.argv[2])
assert set(b) == set(o), set(b) ^ set(o)
# the shards: the first half of the HF names sorted in BF16, the rest in F16; the tensors
# that are one HF tensor each are compared (qkv and fc1 mix both shards)
hf = G.read_safetensors(sys.argv[3] + "/model.safetensors")
first = set(sorted(hf)[: len(hf) // 2])
ours = {"model.embed_tokens.weight": "embedding.word_embeddings.weight", "model.norm.weight": "final_norm.weight"}
for l in range(2):
    for h, c in [("input_layernorm", "input_norm"), ("post_attention_layernorm", "mlp_norm"),
                 ("self_attn.o_proj", "attention.proj"), ("mlp.down_proj", "mlp.fc2")]:
        ours["model.layers.%d.%s.weight" % (l, h)] = "layers.%d.%s.weight" % (l, c)
kinds = set()
for h, n in ours.items():
    x = o[n].astype(np.float32)
    if h in first:
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    else:
        r = x.astype(np.float16).astype(np.float32)
    kinds.add(h in first)
    assert (b[n].astype(np.float32) == r).all(), n
    assert (b[n] != o[n]).any(), n + ": the 16-bit copy rounded nothing"
assert kinds == {True, False}, kinds
print("ok: %d tensors imported as their BF16 or F16 values" % len(ours))
EOF
        fail "the BF16/F16 import is not the rounded original"
    ;;
import_refused)
    train "${llama[@]}" --train-iters 1 --save "$work/s" >/dev/null 2>&1 || fail "training"
    "$cohort" ckpt convert "$work/s" --to hf-llama --output "$work/hf" >/dev/null || fail "export"
    # variants of the export, each broken in one way
    "$py" - "$work" <<'EOF' || fail "writing the broken copies"
import json, os, shutil, struct, sys
w = sys.argv[1]
def copy(name, cfg=None, drop=None, reshape=None, i32=None):
    d = w + "/" + name
    shutil.copytree(w + "/hf", d)
    if cfg:
        c = json.load(open(d + "/config.json")); c.update(cfg); json.dump(c, open(d + "/config.json", "w"))
    if drop or reshape or i32:
        buf = open(d + "/model.safetensors", "rb").read()
        (n,) = struct.unpack("<Q", buf[:8]); hdr = json.loads(buf[8:8 + n]); data = buf[8 + n:]
        meta = hdr.pop("__metadata__", None)
        out, blobs, off = {}, [], 0
        for k, t in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            if k == drop: continue
            b = data[t["data_offsets"][0]:t["data_offsets"][1]]
            shape = t["shape"]
            if k == reshape: shape = [shape[1], shape[0]]
            out[k] = {"dtype": "I32" if k == i32 else t["dtype"], "shape": shape, "data_offsets": [off, off + len(b)]}
            blobs.append(b); off += len(b)
        if meta: out["__metadata__"] = meta
        h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
        open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
copy("missing", drop="model.layers.1.mlp.up_proj.weight")
copy("shape", reshape="model.layers.0.mlp.gate_proj.weight")
copy("disagree", cfg={"intermediate_size": 64})
copy("scaling", cfg={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
copy("act", cfg={"hidden_act": "gelu"})
copy("kind", cfg={"model_type": "mistral"})
copy("truncated")
p = w + "/truncated/model.safetensors"
os.truncate(p, os.path.getsize(p) - 100)
copy("nocfg"); os.remove(w + "/nocfg/config.json")
copy("i32", i32="model.norm.weight")
copy("layers", cfg={"num_hidden_layers": 4096})
copy("escape")
json.dump({"weight_map": {"model.embed_tokens.weight": "../hf/model.safetensors"}},
          open(w + "/escape/model.safetensors.index.json", "w"))
EOF
    refused 1 "tensor model.layers.1.mlp.up_proj.weight is missing" "$work/missing" --from hf-llama --output "$work/o1"
    refused 1 "tensor model.layers.0.mlp.gate_proj.weight has shape [32, 48], config.json implies [48, 32]" \
        "$work/shape" --from hf-llama \
        --output "$work/o2"
    # the key's value disagrees with the tensors: the first tensor it shapes is named
    refused 1 "tensor model.layers.0.mlp.gate_proj.weight has shape [48, 32], config.json implies [64, 32]" \
        "$work/disagree" --from hf-llama --output "$work/o3"
    refused 3 '"rope_scaling" is set' "$work/scaling" --from hf-llama --output "$work/o4"
    refused 3 '"hidden_act" is gelu' "$work/act" --from hf-llama --output "$work/o5"
    refused 3 '"model_type" is mistral, not llama' "$work/kind" --from hf-llama --output "$work/o6"
    refused 1 "$work/truncated/model.safetensors" "$work/truncated" --from hf-llama --output "$work/o7"
    grep -q "beyond the end\|truncated\|data section" "$work/r.err" || fail "truncated: $(cat "$work/r.err")"
    refused 1 "$work/nocfg/config.json" "$work/nocfg" --from hf-llama --output "$work/o8"
    refused 3 "tensor model.norm.weight is I32; F32, F16, BF16 or F64 can be imported" "$work/i32" --from hf-llama \
        --output "$work/o11"
    refused 3 '"num_hidden_layers" is 4096, beyond cohort'"'"'s limit 1024' "$work/layers" --from hf-llama --output "$work/o12"
    refused 1 "the index names a file '../hf/model.safetensors' (not a plain file name)" "$work/escape" --from hf-llama \
        --output "$work/o13"
    refused 3 "--from hf-bert: unknown source; hf-gpt2 or hf-llama" "$work/hf" --from hf-bert --output "$work/o9"
    "$cohort" ckpt convert --help | grep -q -- "--from hf-gpt2|hf-llama: imports the Hugging Face model" || fail "--help"
    # a GPT-2 import of a Llama directory names what it misses
    refused 3 '"model_type" is llama, not gpt2' "$work/hf" --from hf-gpt2 --output "$work/o10"
    for o in o1 o2 o3 o4 o5 o6 o7 o8 o9 o10 o11 o12 o13; do
        [ ! -e "$work/$o/iter_0000000" ] || fail "a refused import wrote $work/$o/iter_0000000"
    done
    # an output that holds a checkpoint already
    refused 2 "--output $work/s already holds a checkpoint" "$work/hf" --from hf-llama --output "$work/s"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
