#!/usr/bin/env bash
# tp_test.sh - `cohort train` with tensor (and sequence) parallelism against one rank, one case
# per meson test.
#   tp_test.sh COHORT CASE
# Cases:
#   matches_one_rank  tp 2, tp 2 with SP, tp 2 x dp 2 and tp 4 with SP train the one-rank job's
#                     numbers (losses and gradient norms of every iteration, the validation
#                     loss; hidden dropout on) within fp32 reduction tolerance; a tp run repeated
#                     is bitwise the same
#   gqa_swiglu        the same for query groups below and above tp, SwiGLU, RoPE, RMSNorm,
#                     untied head, biases off
#   killed            a rank killed in a tp 2 x dp 2 job is replaced in process with its data-
#                     parallel peer's state (same tensor coordinate) and the job trains the
#                     fault-free run's numbers bitwise, ending with the same checkpoint bitwise
#   killed_reload     a rank of a tp 2 job with no data-parallel replica killed: every rank, the
#                     survivor too, reloads the last checkpoint's slices in process, and the job
#                     ends with the fault-free run's checkpoint bitwise
#   sdc               a flipped weight bit in one rank of a tp 2 x dp 2 job: diagnosed per
#                     replica, repaired from the other replica, the clean run's numbers and final
#                     checkpoint bitwise
#   bad_layouts       heads not divisible by tp, a sequence not divisible by tp under SP, a
#                     world not divisible by tp: refused before any work (exit 2)
#   ckpt_reshard      a tp 2 x dp 2 checkpoint: each rank writes its slices (the manifest and a
#                     plain numpy reader see every tensor once, with its global shape); resumed
#                     at tp 2 x dp 2 it ends bitwise where the uninterrupted run ends; resumed at
#                     tp 1, at tp 4 with SP and (saved at tp 4) at tp 1 x dp 2 it trains the
#                     uninterrupted run's numbers within the fp32 tolerance of matches_one_rank
#   ckpt_convert      `cohort ckpt convert --to cohort` writes a tp 4 x dp 2 and a tp 1 layout
#                     with the same tensors bitwise; the Hugging Face export of the tp 2
#                     checkpoint is bitwise the export of its tp 1 conversion; inspect shows
#                     global shapes
#   ckpt_padded_vocab the padded vocabulary differs between tp sizes (--make-vocab-size-
#                     divisible-by 100: 600 rows at tp 2, 800 at tp 4): loading and converting
#                     copy the last row into the new rows (weights and moments) and drop rows
#                     past the smaller size; both paths train the same numbers
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir tp

# vocabulary 500 pads to 512 at tp 1, 2 and 4 (a multiple of 128 x tp): the same model.
# Attention dropout is keyed per tensor rank (Megatron's seed + 2718 + tp_rank), so it is off
# here; hidden dropout draws one rank's masks and stays on.
tiny_model --attention-dropout 0 --eval-iters 2
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"

run() { train_ok "$1" --train-iters 5 "${@:2}"; } # NAME ARGS...: 5 iterations, metrics in $work/NAME.jsonl
case $case_name in
matches_one_rank)
    run one --nproc-per-node 1
    run tp2 --nproc-per-node 2 --tensor-model-parallel-size 2
    run tp2b --nproc-per-node 2 --tensor-model-parallel-size 2
    run tp2sp --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel
    run tp2dp2 --nproc-per-node 4 --tensor-model-parallel-size 2
    run tp4sp --nproc-per-node 4 --tensor-model-parallel-size 4 --sequence-parallel
    compare 1 one tp2 tp2sp tp2dp2 tp4sp
    same_losses tp2 tp2b "two tp 2 runs differ"
    grep -q "data-parallel size 2" "$work/tp2dp2.out" || fail "tp2 x dp2: $(head -3 "$work/tp2dp2.out")"
    ;;
gqa_swiglu)
    g=(--group-query-attention --swiglu --position-embedding-type rope --normalization RMSNorm
       --untie-embeddings-and-output-weights --disable-bias-linear --num-attention-heads 8 --hidden-size 64)
    run one "${g[@]}" --num-query-groups 2 --nproc-per-node 1
    run tp4 "${g[@]}" --num-query-groups 2 --nproc-per-node 4 --tensor-model-parallel-size 4
    run tp2sp "${g[@]}" --num-query-groups 2 --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel
    compare 1 one tp4 tp2sp
    ;;
killed)
    run clean --nproc-per-node 4 --tensor-model-parallel-size 2 --train-iters 8 --save "$work/cs"
    run f --nproc-per-node 4 --tensor-model-parallel-size 2 --train-iters 8 --inject "kill@rank=3,step=4" --save "$work/fs"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "with the state of ranks 0, 1 (one per model shard)" "$work/f.out" ||
        fail "not resumed from its shard's replica: $(grep 'resume after' "$work/f.out")"
    grep -q "state of iteration [0-9]* taken from rank 1's memory" "$work/f.out" ||
        fail "rank 3 did not take rank 1's state: $(grep 'replaced in process' "$work/f.out")"
    # every iteration the killed run logged (the printing rank, 3, lost its unsent line of the
    # iteration it died after) bitwise as the clean run's, the last ones among them
    /usr/bin/python3 - "$work" <<'PY' || fail "the killed run trained other numbers"
import json, sys
w = sys.argv[1]
def rows(n):
    return {r["iteration"]: (r["lm_loss"], r["grad_norm"]) for r in map(json.loads, open(f"{w}/{n}.jsonl")) if "grad_norm" in r}
c, f = rows("clean"), rows("f")
assert len(c) == 8 and len(f) >= 7 and 8 in f and 5 in f, (sorted(c), sorted(f))
bad = [i for i in f if f[i] != c[i]]
assert not bad, [(i, f[i], c[i]) for i in bad]
print(f"ok: iterations {sorted(f)} equal")
PY
    grep '"evaluation"' "$work/clean.jsonl" >"$work/cv"; grep '"evaluation"' "$work/f.jsonl" >"$work/fv"
    cmp -s "$work/cv" "$work/fv" || fail "validation differs: $(cat "$work/fv") vs $(cat "$work/cv")"
    # the final parameters and optimizer state, every tensor-parallel slice
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    ;;
killed_reload)
    t2=(--nproc-per-node 2 --tensor-model-parallel-size 2 --train-iters 8 --save-interval 2)
    run clean "${t2[@]}" --save "$work/cs"
    run f "${t2[@]}" --save "$work/fs" --inject "kill@rank=1,step=5"
    grep -q "in-process restart into generation 2" "$work/f.out" || fail "no restart: $(grep supervisor "$work/f.out")"
    grep -q "successfully loaded checkpoint from $work/fs \[ t 2/2, p 1/1 \] at iteration 4" "$work/f.out" ||
        fail "no reload of iteration 4: $(grep -i 'checkpoint' "$work/f.out" | head -5)"
    ckpt_same "$work/cs" "$work/fs" "the final checkpoints differ"
    [ "$(losses "$work/clean.jsonl" | grep -o '"iteration":8 .*')" = "$(losses "$work/f.jsonl" | grep -o '"iteration":8 .*')" ] ||
        fail "iteration 8 differs"
    ;;
sdc)
    # a flipped weight bit on one rank of a replica: the replicas' checksums (each the hash
    # of its tensor group's) differ, the corrupt replica is repaired from the other's
    # ranks, same tensor coordinate each, and the job trains the clean run's numbers
    sdc_repaired 2 0 --nproc-per-node 4 --tensor-model-parallel-size 2
    ;;
bad_layouts)
    train_refused "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3" --nproc-per-node 3 \
        --tensor-model-parallel-size 3
    train_refused "--seq-length 30 is not divisible by --tensor-model-parallel-size 4" --nproc-per-node 4 \
        --tensor-model-parallel-size 4 --sequence-parallel --seq-length 30
    train_refused "is not a multiple of tensor x context x pipeline = 2" --nproc-per-node 3 --tensor-model-parallel-size 2
    ;;
ckpt_reshard)
    t22=(--nproc-per-node 4 --tensor-model-parallel-size 2)
    run full "${t22[@]}" --train-iters 6 --save "$work/full"
    run half "${t22[@]}" --train-iters 6 --exit-interval 3 --save "$work/s" --async-save
    # the layout: 4 writers in 2 groups (tensor ranks), every tensor's slices cover it once
    /usr/bin/python3 - "$work/s/iter_0000003" <<'PY' || fail "the tp 2 x dp 2 checkpoint's layout"
import json, struct, sys
import numpy as np
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
p = m["parallel"]
assert (p["world_size"], p["tensor"], p["data"], p["writers"], p["writer_groups"]) == (4, 2, 2, 4, 2), p
assert sorted(f["writer"] for f in m["files"]) == [0, 0, 1, 1, 2, 2, 3, 3], m["files"]
def read(path):
    buf = open(path, "rb").read()
    (n,) = struct.unpack("<Q", buf[:8])
    h = json.loads(buf[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in h.items()}
parts = [read(d + "/" + f["name"]) for f in m["files"]]
shapes = {t["name"]: t["shape"] for t in m["tensors"]}
assert shapes["embedding.word_embeddings.weight"] == [512, 32] and shapes["layers.0.attention.qkv.weight"] == [96, 32]
assert shapes["layers.1.attention.proj.weight"] == [32, 32] and shapes["layers.1.mlp.fc2.weight"] == [32, 128]
split = 0
for t in m["tensors"]:
    full = np.full(t["shape"], np.nan, np.float32)
    for s in t["slices"]:
        sl = tuple(slice(o, o + k) for o, k in zip(s["offsets"], s["shape"]))
        assert np.isnan(full[sl]).all(), t["name"]
        full[sl] = parts[s["file"]][s["key"]]
    assert not np.isnan(full).any(), t["name"]
    # a column-parallel tensor: the two tensor ranks' halves in files of writers 0/2 and 1/3
    if t["name"] == "layers.0.attention.proj.weight":
        for s in t["slices"]:
            w = m["files"][s["file"]]["writer"]
            assert s["offsets"][1] == 16 * (w % 2) and s["shape"][1] == 16, (s, w)
        split += 1
assert split == 1
print("ok: layout")
PY
    "$cohort" ckpt verify "$work/s" >/dev/null || fail "verify"
    # the same layout resumed: bitwise the uninterrupted run (logged numbers and the checkpoint)
    run same "${t22[@]}" --train-iters 6 --load "$work/s" --save "$work/s"
    grep -q "successfully loaded checkpoint from $work/s \[ t 2/2, p 1/1 \] at iteration 3" "$work/same.out" ||
        fail "no load line: $(grep -i checkpoint "$work/same.out" | head -3)"
    ckpt_same "$work/full" "$work/s" "resumed at tp 2 x dp 2"
    grep -q '"equal": 84,' "$work/ckpt_same.json" || fail "$(head -8 "$work/ckpt_same.json")"
    [ "$(grep -v '"evaluation"' "$work/same.jsonl" | losses /dev/stdin)" = \
      "$(grep -v '"evaluation"' "$work/full.jsonl" | grep -v '"iteration":[123],' | losses /dev/stdin)" ] ||
        fail "resumed at tp 2 x dp 2: other numbers"
    # other tensor sizes (and data-parallel sizes), from iteration 3 (s now holds 6 too)
    run tp1 --nproc-per-node 1 --train-iters 6 --load "$work/s" --ckpt-step 3
    grep -q "checkpoint written at tensor x pipeline size 2 x 1, loaded at 1 x 1" "$work/tp1.out" || fail "no reshard note"
    run tp4 --nproc-per-node 4 --tensor-model-parallel-size 4 --sequence-parallel --train-iters 6 --load "$work/s" \
        --ckpt-step 3
    grep -q "\[ t 4/4, p 1/1 \] at iteration 3" "$work/tp4.out" || fail "tp 4: $(grep -i 'loaded' "$work/tp4.out")"
    run half4 --nproc-per-node 4 --tensor-model-parallel-size 4 --train-iters 6 --exit-interval 3 --save "$work/s4"
    run tp1dp2 --nproc-per-node 2 --train-iters 6 --load "$work/s4"
    compare 4 full tp1 tp4 tp1dp2
    ;;
ckpt_convert)
    run half --nproc-per-node 4 --tensor-model-parallel-size 2 --train-iters 3 --save "$work/s"
    "$cohort" ckpt convert "$work/s" --to cohort --tensor-model-parallel-size 4 --data-parallel-size 2 \
        --output "$work/c42" >"$work/c42.out" 2>&1 || fail "convert to tp 4 x dp 2: $(cat "$work/c42.out")"
    "$cohort" ckpt convert "$work/s" --to cohort --tensor-model-parallel-size 1 --output "$work/c1" >/dev/null 2>&1 ||
        fail "convert to tp 1"
    for c in c42 c1; do
        "$cohort" ckpt verify "$work/$c" >/dev/null || fail "$c: verify"
        "$cohort" ckpt diff "$work/s" "$work/$c" >"$work/d" || fail "$c: tensors differ: $(tail -3 "$work/d")"
    done
    /usr/bin/python3 - "$work" <<'PY' || fail "converted layouts"
import json, sys
w = sys.argv[1]
a = json.load(open(w + "/c42/iter_0000003/manifest.json"))
p = a["parallel"]
assert (p["tensor"], p["data"], p["writers"], p["writer_groups"]) == (4, 2, 8, 4), p
assert a["config"]["tensor-model-parallel-size"] == 4
qkv = [t for t in a["tensors"] if t["name"] == "layers.0.attention.qkv.weight"][0]
# 4 tensor ranks x (q, k, v rows), each cut over its 2 replicas where the bytes fall
assert len(qkv["slices"]) >= 12, len(qkv["slices"])
for s in qkv["slices"]:
    assert a["files"][s["file"]]["writer"] % 4 == (s["offsets"][0] % 32) // 8, s
b = json.load(open(w + "/c1/iter_0000003/manifest.json"))
assert b["parallel"]["writers"] == 1 and all(len(t["slices"]) == 1 for t in b["tensors"])
print("ok: converted layouts")
PY
    # loadable: the tp 4 x dp 2 conversion resumes at that layout
    run r42 --nproc-per-node 4 --tensor-model-parallel-size 4 --train-iters 4 --load "$work/c42"
    # the Hugging Face export joins the slices: the tp 2 checkpoint's export is its tp 1 conversion's
    "$cohort" ckpt convert "$work/s" --to hf-gpt2 --output "$work/hf2" >/dev/null || fail "export from tp 2"
    "$cohort" ckpt convert "$work/c1" --to hf-gpt2 --output "$work/hf1" >/dev/null || fail "export from tp 1"
    cmp "$work/hf1/model.safetensors" "$work/hf2/model.safetensors" || fail "the exports differ"
    cmp "$work/hf1/config.json" "$work/hf2/config.json" || fail "the exports' configs differ"
    # inspect: global shapes and the pieces on disk
    "$cohort" ckpt inspect "$work/s" --json | /usr/bin/python3 -c "
import json, sys
d = json.load(sys.stdin)
t = {x['name']: x for x in d['tensors']}
assert t['embedding.word_embeddings.weight']['shape'] == [512, 32], t['embedding.word_embeddings.weight']
assert t['layers.0.mlp.fc1.weight']['shape'] == [128, 32] and t['layers.0.mlp.fc1.weight']['pieces'] >= 2
" || fail "inspect"
    # a layout the model does not split into, and an occupied output
    "$cohort" ckpt convert "$work/s" --to cohort --tensor-model-parallel-size 3 --output "$work/c3" 2>"$work/err"
    [ $? -eq 2 ] && grep -q "not divisible by --tensor-model-parallel-size 3" "$work/err" || fail "tp 3: $(cat "$work/err")"
    "$cohort" ckpt convert "$work/s" --to cohort --tensor-model-parallel-size 1 --output "$work/c1" 2>"$work/err"
    [ $? -eq 2 ] && grep -q "already holds iteration 3" "$work/err" || fail "occupied output: $(cat "$work/err")"
    ;;
ckpt_padded_vocab)
    pv=(--make-vocab-size-divisible-by 100)
    run half "${pv[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --train-iters 6 --exit-interval 3 --save "$work/s"
    run tp4 "${pv[@]}" --nproc-per-node 4 --tensor-model-parallel-size 4 --train-iters 6 --load "$work/s" --save "$work/s4"
    grep -q "padded vocabulary has 600 rows, this run's 800 (100 x tensor-parallel size 4): the new rows are copies" \
        "$work/tp4.out" || fail "no note: $(grep -i vocab "$work/tp4.out")"
    "$cohort" ckpt convert "$work/s" --to cohort --tensor-model-parallel-size 4 --output "$work/c4" >"$work/c4.out" ||
        fail "convert: $(cat "$work/c4.out")"
    grep -q "padded vocabulary changed from 600 to 800 rows" "$work/c4.out" || fail "convert note: $(cat "$work/c4.out")"
    run tp4c "${pv[@]}" --nproc-per-node 4 --tensor-model-parallel-size 4 --train-iters 6 --load "$work/c4"
    same_losses tp4 tp4c "loading and converting differ"
    # the converted rows: 600..799 copy row 599, for the weights and both moments
    /usr/bin/python3 - "$work" <<'PY' || fail "the padded rows"
import json, struct, sys
import numpy as np
w = sys.argv[1]
def tensors(d):  # every global tensor, assembled from its slices
    m = json.load(open(d + "/manifest.json"))
    parts = []
    for f in m["files"]:
        buf = open(d + "/" + f["name"], "rb").read()
        (n,) = struct.unpack("<Q", buf[:8]); h = json.loads(buf[8:8 + n]); h.pop("__metadata__", None)
        parts.append({k: np.frombuffer(buf[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").reshape(v["shape"])
                      for k, v in h.items()})
    out = {}
    for t in m["tensors"]:
        full = np.zeros(t["shape"], np.float32)
        for s in t["slices"]:
            full[tuple(slice(o, o + k) for o, k in zip(s["offsets"], s["shape"]))] = parts[s["file"]][s["key"]]
        out[t["name"]] = full
    return out
a, b = tensors(w + "/s/iter_0000003"), tensors(w + "/c4/iter_0000003")
for pre in ("", "optimizer.exp_avg.", "optimizer.exp_avg_sq."):
    n = pre + "embedding.word_embeddings.weight"
    assert a[n].shape == (600, 32) and b[n].shape == (800, 32), (a[n].shape, b[n].shape)
    assert (b[n][:600] == a[n]).all() and (b[n][600:] == a[n][599]).all(), n
print("ok: rows 600..799 copy row 599")
PY
    # and back: tp 4's 800 rows loaded at tp 2 (600): the rows past 600 dropped
    run tp2 "${pv[@]}" --nproc-per-node 2 --tensor-model-parallel-size 2 --train-iters 8 --load "$work/s4"
    grep -q "padded vocabulary has 800 rows, this run's 600 .*rows past the new size are dropped" "$work/tp2.out" ||
        fail "no note: $(grep -i vocab "$work/tp2.out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
