#!/usr/bin/env bash
# mtp_test.sh - `cohort train --mtp-num-layers` (multi-token prediction), one case per meson test.
#   mtp_test.sh COHORT CASE
# Cases:
#   train     2 depths: the log line carries Megatron's " mtp_1 loss: X | mtp_2 loss: X |"
#             after lm loss, the metrics mtp_1_loss and mtp_2_loss; every loss falls; a second
#             run is bitwise the same; the MTP tensors change the main loss's trajectory (the
#             shared layers learn from them) but not its first step
#   resume    stopped at iteration 3 and resumed: the uninterrupted run's checkpoint bitwise;
#             `ckpt inspect` lists the depths' tensors under Megatron's names
#   layouts   dp 2, pp 2 with the depths on the last stage (tied embeddings, rope), and pp 2 with
#             the layout "Ettt|tmmL" (the layout's m: the depths beside the loss), train
#             the one-rank job's numbers within fp32 reduction tolerance (losses, gradient
#             norms, validation; parameters and moments within 1e-5)
#   tp        tp 2, tp 2 with --sequence-parallel and tp 2 x pp 2 (SP, the depths on the last
#             stage) against one rank: losses, gradient norms, validation and each depth's
#             mtp_K_loss within fp32 reduction tolerance; the tp 2 checkpoint's MTP slices
#             (eh_proj's rows split, the norms whole) cover each tensor once; the checkpoints'
#             parameters and moments within 1e-5 (`ckpt diff`); a tp 2 checkpoint resumed at
#             tp 1 and a tp 1 one at tp 2 with SP: the one-rank run's numbers and final
#             checkpoint; `ckpt convert` between tp 1 and tp 2 keeps every tensor bitwise
#   stages    the depths on a stage before the loss's (the layout's m before L, Megatron's MTP
#             stage: it sends the main and each depth's hidden state on): pp 3 "Ett|ttmm|L" tied
#             and untied, pp 4 "Ett|ttmm||L" (through a stage without layers), interleaved
#             "Et|t|t|t|mm|L", tp 2 x pp 3 with SP, and resumes between that placement and one
#             rank: losses, gradient norms, validation and mtp_K_loss within fp32 reduction
#             tolerance of one rank's, parameters and moments within 1e-5; with dp 2 the MTP
#             stage's rank killed and rebuilt from its peer: the undisturbed checkpoint bitwise
#   cp        context parallelism (the depths roll across the context ranks' chunks from the
#             whole micro batch, each rank's loss its tokens' part): cp 2, cp 2 x dp 2 and
#             cp 2 x tp 2 (SP) against one rank: losses, gradient norms, validation and
#             mtp_K_loss within fp32 reduction tolerance, parameters and moments within 1e-5
#   cp_pp     context parallelism with a pipeline: cp 2 x pp 2 with the depths on the last
#             stage and cp 2 x pp 3 with the MTP stage before the loss's ("Ett|ttmm|L") against
#             one rank, as cp above; cp 2 x pp 2 twice bitwise the same
#   bf16      --bf16 (the products in bf16 as the dense layers', eh_proj's too; skipped, 77,
#             without the CPU's bf16 instructions): one rank within 1e-3 relative of the fp32
#             run's losses (lm and each depth's, every iteration; measured 1.6e-5), its
#             gradient norms within 1e-2 (measured 9e-4); pp 2 with the depths on the
#             last stage and tp 2 (SP) within 1e-3 of the bf16 one-rank run (losses, norms;
#             measured 2.5e-4: an fp32 sum in another order can move a weight's bf16 copy
#             by one bf16 step); twice bitwise the same
#   per_token --calculate-per-token-loss (Megatron's: the depths' sums rescaled by the micro
#             batch's loss tokens over the depth's, the whole divided by the step's tokens): with
#             --eod-mask-loss (micro batches of unequal loss tokens) dp 2, pp 2, pp 3 with the
#             MTP stage ("Ett|ttmm|L") and cp 2 (the counts the whole sequences', where
#             Megatron's are each context rank's) train the one-rank job's numbers (losses, norms,
#             mtp_K_loss, parameters and moments within 1e-5); with no token masked the weights
#             are the per micro batch ones: the job without the flag's numbers
#   refused   context parallelism with packed sequences, a pipeline with learned positions, document masks, more
#             than 8 depths, the MTP layers m on pipeline rank 0: exit 2 before any work
cohort=$1; case_name=$2
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir mtp

tiny_model --num-layers 4 --attention-dropout 0 --eval-iters 2 --position-embedding-type rope \
    --mtp-num-layers 2
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"

run() { train_ok "$1" --train-iters "$2" "${@:3}"; } # NAME ITERS ARGS...
compare_mtp() { # REF RUN:FROM...: each depth's mtp_K_loss of every run from iteration FROM on as REF's
    /usr/bin/python3 - "$work" "$@" <<'PY' || fail "mtp_K_loss differs from $1's"
import json, sys
w, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def mtp(n):
    return {r["iteration"]: (r["mtp_1_loss"], r["mtp_2_loss"]) for r in map(json.loads, open(f"{w}/{n}.jsonl"))
            if "grad_norm" in r}
one, worst = mtp(ref), 0
for nf in runs:
    n, first = nf.split(":")
    got = mtp(n)
    assert sorted(got) == [i for i in sorted(one) if i >= int(first)], (n, sorted(got))
    for i in got:
        for x, y in zip(one[i], got[i]):
            rel = abs(x - y) / abs(x)
            worst = max(worst, rel)
            assert rel <= 1e-6, (n, i, x, y)
print(f"ok: mtp_K_loss as {ref}'s (worst relative difference {worst:.1e})")
PY
}
params_close() { # REF RUN...: every run's final checkpoint (RUN.ck) holds REF's tensors, the MTP depths'
    local ref=$1 n; shift     # among them, parameters and moments within 1e-5
    for n in "$@"; do
        "$cohort" ckpt diff "$work/$ref.ck" "$work/$n.ck" --json >"$work/d.json"; [ $? -le 1 ] || fail "$n: diff"
        /usr/bin/python3 -c "
import json
rows = json.load(open('$work/d.json'))['tensors']
assert any(r['name'].startswith('mtp.layers.1.eh_proj') for r in rows), [r['name'] for r in rows][:30]
assert any(r['name'].startswith('mtp.layers.1.transformer_layer.attention.qkv') for r in rows)
assert all(r['status'] in ('bitwise equal', 'differs') for r in rows), rows[:3]
bad = [r for r in rows if r['status'] == 'differs' and r['max_abs'] > 1e-5]
assert not bad, bad[:3]
" || fail "$n: parameters differ from $ref's: $(head -c 400 "$work/d.json")"
    done
}
case $case_name in
train)
    run a 30 --lr 3e-3 --tensorboard-dir "$work/tb"
    run b 30 --lr 3e-3
    run off 30 --lr 3e-3 --mtp-num-layers 0
    grep -q ' lm loss: [0-9.E+-]* | mtp_1 loss: [0-9.E+-]* | mtp_2 loss: [0-9.E+-]* | loss scale:' "$work/a.out" ||
        fail "the log line lacks the MTP items: $(grep -m1 iteration "$work/a.out")"
    /usr/bin/python3 - "$work/a.jsonl" "$work/off.jsonl" <<'PY' || fail "metrics: $(head -c 600 "$work/a.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"grad_norm"' in l]
off = [json.loads(l) for l in open(sys.argv[2]) if '"grad_norm"' in l]
assert len(rows) == 30 and all("mtp_1_loss" in r and "mtp_2_loss" in r for r in rows), rows[0]
assert not any("mtp_1_loss" in r for r in off)
for k in ("lm_loss", "mtp_1_loss", "mtp_2_loss"):
    first = sum(r[k] for r in rows[:5]) / 5
    last = sum(r[k] for r in rows[-5:]) / 5
    assert last < first - 0.05, (k, first, last)
# the first step's main loss does not depend on the MTP depths; later ones do
assert rows[0]["lm_loss"] == off[0]["lm_loss"], (rows[0]["lm_loss"], off[0]["lm_loss"])
assert rows[-1]["lm_loss"] != off[-1]["lm_loss"]
print("ok: lm %.4f mtp_1 %.4f mtp_2 %.4f at the end" % (rows[-1]["lm_loss"], rows[-1]["mtp_1_loss"], rows[-1]["mtp_2_loss"]))
PY
    same_losses a b "two runs differ"
    # TensorBoard: Megatron's "mtp_K loss" tags, the metrics' values
    tb_has "$work/a.jsonl" "mtp_2 loss"
    ;;
resume)
    resume_exact 6 3
    "$cohort" ckpt inspect "$work/s" >"$work/inspect.out" 2>&1 || fail "inspect: $(tail -3 "$work/inspect.out")"
    for t in mtp.layers.0.enorm.weight mtp.layers.1.hnorm.weight mtp.layers.1.eh_proj.weight \
             mtp.layers.0.final_layernorm.weight mtp.layers.1.transformer_layer.attention.qkv.weight; do
        grep -q "$t" "$work/inspect.out" || fail "inspect lacks $t: $(grep -m5 mtp "$work/inspect.out")"
    done
    ;;
layouts)
    run one 5 --nproc-per-node 1 --save "$work/one.ck"
    run dp2 5 --nproc-per-node 2 --save "$work/dp2.ck"
    run pp2 5 --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    # the layout's m: the two depths in the last stage, with an uneven split of the decoder
    run ppm 5 --nproc-per-node 2 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "Ettt|tmmL" \
        --save "$work/ppm.ck"
    compare 1 one dp2 pp2 ppm
    compare_mtp one dp2:1 pp2:1 ppm:1
    params_close one dp2 pp2 ppm
    ;;
stages)
    # the MTP depths on a stage before the loss's (Megatron's MTP stage): 1 + D streams to the
    # loss's stage; tied and untied, through an empty stage, interleaved, with tp 2 and SP
    g=(--global-batch-size 12)
    run one 5 "${g[@]}" --save "$work/one.ck"
    run oneu 5 "${g[@]}" --untie-embeddings-and-output-weights --save "$work/oneu.ck"
    p3=(--nproc-per-node 3 --pipeline-model-parallel-size 3 --pipeline-model-parallel-layout "Ett|ttmm|L")
    run p3 5 "${g[@]}" "${p3[@]}" --save "$work/p3.ck"
    run p3u 5 "${g[@]}" "${p3[@]}" --untie-embeddings-and-output-weights --save "$work/p3u.ck"
    run p4 5 "${g[@]}" --nproc-per-node 4 --pipeline-model-parallel-size 4 \
        --pipeline-model-parallel-layout "Ett|ttmm||L" --save "$work/p4.ck"
    run vpp 5 "${g[@]}" "${p3[@]:0:4}" --pipeline-model-parallel-layout "Et|t|t|t|mm|L" --save "$work/vpp.ck"
    run tp2p3 5 "${g[@]}" --nproc-per-node 6 --tensor-model-parallel-size 2 --sequence-parallel \
        --pipeline-model-parallel-size 3 --pipeline-model-parallel-layout "Ett|ttmm|L" --save "$work/tp2p3.ck"
    # resumes across the placements: stopped at iteration 2 with the depths on their own stage,
    # resumed on one rank; and the other way
    run h3 5 "${g[@]}" "${p3[@]}" --exit-interval 2 --save "$work/r1.ck"
    run r1 5 "${g[@]}" --load "$work/r1.ck" --save "$work/r1.ck"
    run h1 5 "${g[@]}" --exit-interval 2 --save "$work/r3.ck"
    run r3 5 "${g[@]}" "${p3[@]}" --load "$work/r3.ck" --save "$work/r3.ck"
    compare 1 one p3 p4 vpp tp2p3
    compare 3 one r1 r3
    compare 1 oneu p3u
    compare_mtp one p3:1 p4:1 vpp:1 tp2p3:1 r1:3 r3:3
    compare_mtp oneu p3u:1
    params_close one p3 p4 vpp tp2p3 r1 r3
    params_close oneu p3u
    grep -q ' lm loss: [0-9.E+-]* | mtp_1 loss: [0-9.E+-]* | mtp_2 loss: [0-9.E+-]* |' "$work/p3.out" ||
        fail "the log line lacks the MTP items: $(grep -m1 iteration "$work/p3.out")"
    # dp 2 x pp 3: the MTP stage's rank of replica 1 (rank 3) killed and rebuilt from its
    # data-parallel peer's memory: the undisturbed run's final checkpoint bitwise
    d6=("${g[@]}" "${p3[@]:2}" --nproc-per-node 6)
    run kc 5 "${d6[@]}" --save "$work/kc"
    run kf 5 "${d6[@]}" --inject "kill@rank=3,step=3" --save "$work/kf"
    grep -q "in-process restart into generation 2" "$work/kf.out" || fail "no restart: $(grep supervisor "$work/kf.out")"
    ckpt_same "$work/kc" "$work/kf" "the rebuilt MTP stage"
    ;;
tp)
    t2=(--nproc-per-node 2 --tensor-model-parallel-size 2)
    run one 5 --nproc-per-node 1 --save "$work/one.ck"
    run tp2 5 "${t2[@]}" --save "$work/tp2.ck"
    run sp2 5 "${t2[@]}" --sequence-parallel --save "$work/sp2.ck"
    run tp2pp2 5 --nproc-per-node 4 --tensor-model-parallel-size 2 --sequence-parallel \
        --pipeline-model-parallel-size 2 --save "$work/tp2pp2.ck"
    # resharded resumes: stopped at iteration 3 at tp 2, resumed at tp 1; and back
    run h2 5 "${t2[@]}" --exit-interval 3 --save "$work/r1.ck"
    run r1 5 --nproc-per-node 1 --load "$work/r1.ck" --save "$work/r1.ck"
    grep -q "checkpoint written at tensor x pipeline size 2 x 1, loaded at 1 x 1" "$work/r1.out" ||
        fail "no reshard note: $(grep -i checkpoint "$work/r1.out" | head -3)"
    run h1 5 --nproc-per-node 1 --exit-interval 3 --save "$work/r2.ck"
    run r2 5 "${t2[@]}" --sequence-parallel --load "$work/r2.ck" --save "$work/r2.ck"
    grep -q "\[ t 2/2, p 1/1 \] at iteration 3" "$work/r2.out" || fail "tp 2: $(grep -i 'loaded' "$work/r2.out")"
    compare 1 one tp2 sp2 tp2pp2
    compare 4 one r1 r2
    # the tp 2 checkpoint: every MTP tensor's slices cover it once; eh_proj's rows [16 r, 16 r + 16)
    # and the depths' layers' q, k, v rows split by tensor rank, the norms whole in one slice
    /usr/bin/python3 - "$work/tp2.ck/iter_0000005" <<'PY' || fail "the tp 2 checkpoint's MTP slices"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
seen = 0
for t in m["tensors"]:
    if not t["name"].startswith("mtp.layers."): continue
    shape = t["shape"] + [1] * (2 - len(t["shape"]))
    count = [[0] * shape[1] for _ in range(shape[0])]
    for sl in t["slices"]:
        o, k = sl["offsets"] + [0] * (2 - len(sl["offsets"])), sl["shape"] + [1] * (2 - len(sl["shape"]))
        for i in range(o[0], o[0] + k[0]):
            for j in range(o[1], o[1] + k[1]): count[i][j] += 1
    assert all(c == 1 for row in count for c in row), (t["name"], t["slices"])
    rows = sorted((s["offsets"][0], s["shape"][0]) for s in t["slices"])
    if t["name"].endswith("eh_proj.weight"):
        assert t["shape"] == [32, 64] and rows == [(0, 16), (16, 16)], (t["name"], rows)
        seen += 1
    if t["name"].endswith("enorm.weight") or t["name"].endswith("final_layernorm.weight"):
        assert len(rows) == 1, (t["name"], rows)
    if t["name"].endswith("transformer_layer.attention.qkv.weight"):
        assert len(rows) == 6, (t["name"], rows)  # q, k, v rows of each tensor rank
assert seen == 2, seen
print("ok: MTP slices")
PY
    convert_roundtrip one.ck tp2.ck
    grep -q ' lm loss: [0-9.E+-]* | mtp_1 loss: [0-9.E+-]* | mtp_2 loss: [0-9.E+-]* |' "$work/sp2.out" ||
        fail "the tp log line lacks the MTP items: $(grep -m1 iteration "$work/sp2.out")"
    compare_mtp one tp2:1 sp2:1 tp2pp2:1 r1:4 r2:4
    params_close one tp2 sp2 tp2pp2 r1 r2
    ;;
cp)
    # context parallelism: each context rank's depths roll across the chunks from the whole
    # micro batch, its loss is its tokens' part over the whole sequences' count
    run one 5 --save "$work/one.ck"
    run cp2 5 --nproc-per-node 2 --context-parallel-size 2 --save "$work/cp2.ck"
    run cp2dp2 5 --nproc-per-node 4 --context-parallel-size 2 --save "$work/cp2dp2.ck"
    run cp2tp2 5 --nproc-per-node 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
        --save "$work/cp2tp2.ck"
    compare 1 one cp2 cp2dp2 cp2tp2
    compare_mtp one cp2:1 cp2dp2:1 cp2tp2:1
    params_close one cp2 cp2dp2 cp2tp2
    ;;
cp_pp)
    run one 5 --save "$work/one.ck"
    run cp2pp2 5 --nproc-per-node 4 --context-parallel-size 2 --pipeline-model-parallel-size 2 --save "$work/cp2pp2.ck"
    run cp2pp2b 5 --nproc-per-node 4 --context-parallel-size 2 --pipeline-model-parallel-size 2 --save "$work/cp2pp2b.ck"
    run cp2pp3 5 --nproc-per-node 6 --context-parallel-size 2 --pipeline-model-parallel-size 3 \
        --pipeline-model-parallel-layout "Ett|ttmm|L" --save "$work/cp2pp3.ck"
    compare 1 one cp2pp2 cp2pp3
    compare_mtp one cp2pp2:1 cp2pp3:1
    params_close one cp2pp2 cp2pp3
    ckpt_same "$work/cp2pp2.ck" "$work/cp2pp2b.ck"
    ;;
bf16)
    grep -qwE "avx512_bf16|amx_bf16" /proc/cpuinfo && [ -z "${ONEDNN_MAX_CPU_ISA:-}" ] || exit 77
    run f32 5
    run one 5 --bf16 --save "$work/one.ck"
    run oneb 5 --bf16 --save "$work/oneb.ck"
    run pp2 5 --bf16 --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    run tp2 5 --bf16 --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel --save "$work/tp2.ck"
    grep -q "cpu: oneDNN .*, bf16, " "$work/one.out" || fail "bf16 not in use: $(grep -m1 'cohort: model' "$work/one.out")"
    ckpt_same "$work/one.ck" "$work/oneb.ck"
    # the layouts against the bf16 one-rank run: their fp32 sums in another order move a
    # weight by an ulp, which can move its bf16 copy by one bf16 step (2^-8 relative)
    /usr/bin/python3 - "$work" one pp2 tp2 <<'PY' || fail "the bf16 layouts disagree"
import json, sys
w, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(n):
    return {r["iteration"]: r for r in map(json.loads, open(f"{w}/{n}.jsonl")) if "grad_norm" in r}
a, worst = load(ref), 0
for n in runs:
    b = load(n)
    assert sorted(b) == sorted(a), (n, sorted(b))
    for i in a:
        for k in ("lm_loss", "grad_norm", "mtp_1_loss", "mtp_2_loss"):
            rel = abs(a[i][k] - b[i][k]) / abs(a[i][k])
            worst = max(worst, rel)
            assert rel < 1e-3, (n, i, k, a[i][k], b[i][k])
print(f"ok: {runs} within {worst:.1e} of {ref}")
PY
    # bf16 products against fp32: a few parts in a thousand on this tiny model
    /usr/bin/python3 - "$work" <<'PY' || fail "bf16 too far from fp32"
import json, sys
w = sys.argv[1]
def load(n):
    return {r["iteration"]: r for r in map(json.loads, open(f"{w}/{n}.jsonl")) if "grad_norm" in r}
a, b = load("f32"), load("one")
assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5], (sorted(a), sorted(b))
worst, differ = 0, False
for i in a:
    for k in ("lm_loss", "mtp_1_loss", "mtp_2_loss"):
        rel = abs(a[i][k] - b[i][k]) / abs(a[i][k])
        worst, differ = max(worst, rel), differ or a[i][k] != b[i][k]
        assert rel < 1e-3, (i, k, a[i][k], b[i][k])
    rel = abs(a[i]["grad_norm"] - b[i]["grad_norm"]) / a[i]["grad_norm"]
    assert rel < 1e-2, (i, "grad_norm", a[i]["grad_norm"], b[i]["grad_norm"])
assert differ, "bf16 gave fp32's numbers exactly: not bf16 products"
print(f"ok: bf16 within {worst:.1e} of fp32")
PY
    ;;
per_token)
    p=(--calculate-per-token-loss --eod-mask-loss --global-batch-size 12)
    run one 5 "${p[@]}" --save "$work/one.ck"
    run dp2 5 "${p[@]}" --nproc-per-node 2 --save "$work/dp2.ck"
    run pp2 5 "${p[@]}" --nproc-per-node 2 --pipeline-model-parallel-size 2 --save "$work/pp2.ck"
    run p3 5 "${p[@]}" --nproc-per-node 3 --pipeline-model-parallel-size 3 --pipeline-model-parallel-layout \
        "Ett|ttmm|L" --save "$work/p3.ck"
    run cp2 5 "${p[@]}" --nproc-per-node 2 --context-parallel-size 2 --save "$work/cp2.ck"
    compare 1 one dp2 pp2 p3 cp2
    compare_mtp one dp2:1 pp2:1 p3:1 cp2:1
    params_close one dp2 pp2 p3 cp2
    # no token masked: each micro batch's depth k weighs its tokens' sum / (its loss tokens x M)
    # either way (a depth's rolled tokens are fewer than the main loss's: without the rescale
    # its gradient would be a few per cent smaller)
    run flag 5 --calculate-per-token-loss --save "$work/flag.ck"
    run noflag 5 --save "$work/noflag.ck"
    compare 1 noflag flag
    compare_mtp noflag flag:1
    params_close noflag flag
    ;;
refused)
    expect() { # PATTERN ARGS...
        local pat=$1; shift
        "$cohort" train "${tiny[@]}" --train-iters 2 "$@" >"$work/r.out" 2>&1; local rc=$?
        [ $rc -eq 2 ] || fail "$*: exit $rc, expected 2: $(tail -3 "$work/r.out")"
        grep -q -- "$pat" "$work/r.out" || fail "$*: no '$pat' in: $(tail -3 "$work/r.out")"
    }
    expect "multi-token prediction with context parallelism and packed sequences (THD) is not supported yet" \
        --context-parallel-size 2 --nproc-per-node 2 --cp-packed-sequences
    expect "needs --position-embedding-type rope" --pipeline-model-parallel-size 2 --nproc-per-node 2 \
        --position-embedding-type learned_absolute
    expect "with --reset-attention-mask is not supported yet" --reset-attention-mask
    expect "--mtp-num-layers 9 is out of range" --mtp-num-layers 9
    expect "places the MTP layers m on pipeline rank 0: they must be on a later rank" \
        --pipeline-model-parallel-size 2 --nproc-per-node 2 --pipeline-model-parallel-layout "Et|tt|tmm|L"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
