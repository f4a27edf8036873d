#!/usr/bin/env bash
# dopt_test.sh - the distributed optimizer (--use-distributed-optimizer) through `cohort
# train`: against the replicated optimizer (data parallel; tensor, pipeline and context
# parallel x data), checkpoints resharded across data-parallel sizes and written as each
# rank's shard of the moments (also of tensor x pipeline slices),
# and (the fault suite) kills of optimizer-shard holders under in-process restart. One case
# per meson test; every comparison is `cohort ckpt diff` of final checkpoints (parameters and
# both Adam moments).
#   dopt_test.sh COHORT CASE
cohort=$1; case_name=$2
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir dopt

tiny_model --global-batch-size 16
D=--use-distributed-optimizer
quick="--inprocess-soft-timeout 2 --inprocess-hard-timeout 4 --inprocess-barrier-timeout 60"
# train NAME NPROC [flags...]: a job (one process for NPROC 1), output in $work/NAME.{out,err}
train() {
    local name=$1 n=$2; shift 2
    local procs=(); [ "$n" -gt 1 ] && procs=(--nproc-per-node "$n" --run-report "$work/$name.report.json")
    "$cohort" train "${tiny[@]}" "${procs[@]}" "$@" \
        >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
}
ok() { [ $rc -eq 0 ] || fail "$1 exited $rc: $(grep -v '^cohort rank' "$work/$1.err" | tail -6)"; }
it_dir() { printf '%s/iter_%07d' "$1" "$2"; }
# same A B IT: bitwise equal checkpoints of iteration IT (every tensor, moments included)
same() { ckpt_same "$(it_dir "$1" "$3")" "$(it_dir "$2" "$3")" "$1 vs $2 at $3"; } # A B ITERATION: bitwise
# close A B IT: within fp32 reduction-order noise (ten times what 2 and 4 uninterrupted
# replicated ranks differ by: parameters 7e-7, exp_avg 5e-9, exp_avg_sq 1e-11 absolute)
close() {
    "$cohort" ckpt diff --json "$(it_dir "$1" "$3")" "$(it_dir "$2" "$3")" >"$work/diff.json" 2>&1
    /usr/bin/python3 - "$work/diff.json" <<'PY' || fail "$1 vs $2 at $3: $(head -c 400 "$work/diff.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["tensors"]) == 84 and all(t["status"] in ("differs", "bitwise equal") for t in d["tensors"]), d["tensors"]
tol = {"optimizer.exp_avg.": 5e-8, "optimizer.exp_avg_sq.": 2e-10, "": 7e-6}
for t in d["tensors"]:
    kind = next(k for k in tol if t["name"].startswith(k))
    assert t["max_abs"] <= tol[kind], t
PY
}

# near A B IT: within what splitting the model's matrix products and the sequence changes
# against one process (5e-5 absolute on parameters and moments, cp_test.sh's bound: fp32
# sums in another order, amplified by 6 Adam steps at lr 1e-3)
near() {
    "$cohort" ckpt diff --json "$(it_dir "$1" "$3")" "$(it_dir "$2" "$3")" >"$work/diff.json" 2>&1
    /usr/bin/python3 - "$work/diff.json" <<'PY' || fail "$1 vs $2 at $3: $(head -c 400 "$work/diff.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["tensors"]) == 84 and all(t["status"] in ("differs", "bitwise equal") for t in d["tensors"]), d["tensors"]
assert all(t["max_abs"] <= 5e-5 for t in d["tensors"]), [t for t in d["tensors"] if t["max_abs"] > 5e-5]
PY
}
# model_parallel NAME FLAGS...: the distributed optimizer at 4 ranks of the layout FLAGS
# against the same layout without it (bitwise: the same gradient sums, norm and AdamW bits;
# the norm's squares are summed over the shards then the model-parallel ranks instead of per
# tensor then over the replica, which could change its last bits, but not the float clipping
# factor here) and against one process (near). --clip-grad 0.3: the norms are about 0.5, so
# every step is clipped by the norm (a replicated tensor counted twice would change it)
model_parallel() {
    local name=$1; shift
    set -- "$@" --clip-grad 0.3
    one+=(--clip-grad 0.3)
    train ${name}r 4 "$@" --train-iters 6 --save "$work/${name}r"; ok ${name}r
    train ${name}d 4 "$@" $D --train-iters 6 --save "$work/${name}d"; ok ${name}d
    same "$work/${name}r" "$work/${name}d" 6
    train ${name}1 1 "${one[@]}" --train-iters 6 --save "$work/${name}1"; ok ${name}1
    near "$work/${name}1" "$work/${name}d" 6
}

# moment_writers CKPT: every one of the 4 ranks wrote optimizer moments into checkpoint CKPT,
# the experts' included, each as a flat shard (the distributed optimizer's, written once)
moment_writers() {
    /usr/bin/python3 - "$1/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
files, writers, experts = m["files"], set(), set()
for t in m["tensors"]:
    if t["kind"] == "optim":
        for s in t["slices"]:
            assert "flat" in s, (t["name"], s)
            writers.add(files[s["file"]]["writer"])
            if ".experts." in t["name"]:
                experts.add(files[s["file"]]["writer"])
assert sorted(writers) == [0, 1, 2, 3] and sorted(experts) == [0, 1, 2, 3], (writers, experts)
PY
}

# mp_layouts CASE: the tiny model and, in lays[], the model-parallel layouts of an overlap case
# (*_tp: tensor 2 with sequence parallelism; *_pp: pipeline 2, and interleaved with two chunks
# of one layer a stage, each chunk's buckets started in its own last micro batch's backward;
# *_cp: context 2)
mp_layouts() {
    tiny_model --global-batch-size 16 --attention-dropout 0
    case $1 in
    *_tp) lays=("--tensor-model-parallel-size 2 --sequence-parallel");;
    *_pp) lays=("--pipeline-model-parallel-size 2"
                "--pipeline-model-parallel-size 2 --num-layers 4 --num-layers-per-virtual-pipeline-stage 1");;
    *_cp) lays=("--context-parallel-size 2");;
    esac
}

case $case_name in
tp)
    # tensor 2 x data 2: each tensor rank shards its slices over its data-parallel group
    # (attention dropout off against one process, as tp_test.sh)
    tiny_model --global-batch-size 16 --attention-dropout 0
    one=()
    model_parallel tp --tensor-model-parallel-size 2
    grep -q "distributed optimizer over 2 data-parallel ranks" "$work/tpd.out" || fail "$(grep optimizer "$work/tpd.out")"
    ;;
pp)
    # pipeline 2 x data 2: each stage its own layout (the last stage's copy of the tied
    # embedding is updated on both stages alike, counted once in the norm)
    tiny_model --global-batch-size 16 --attention-dropout 0
    one=()
    model_parallel pp --pipeline-model-parallel-size 2
    ;;
cp)
    # context 2 x data 2: the shards span data x context (4 ranks), the gradient averaged over
    # the 2 data-parallel replicas
    tiny_model --global-batch-size 16 --attention-dropout 0
    one=(--attention-dropout 0)
    model_parallel cp --context-parallel-size 2
    grep -q "distributed optimizer over 4 data x context-parallel ranks" "$work/cpd.out" ||
        fail "$(grep optimizer "$work/cpd.out")"
    ;;
ckpt_mp)
    # tensor 2 x pipeline 2 x data 2 with the distributed optimizer: each rank writes its
    # shard of its slice of the moments once (flat ranges of the global tensors),
    # the checkpoint is bitwise the replicated optimizer's at the same layout, verifies, and
    # loads without the flag at one process and at tensor 1 x data 4, continuing bitwise as the
    # replicated optimizer's checkpoint does
    mp=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2)
    for x in d r; do
        flag=$D; [ $x = r ] && flag=
        # shellcheck disable=SC2086
        train s$x 8 "${mp[@]}" $flag --train-iters 8 --save "$work/s$x" --save-interval 4 --exit-interval 4; ok s$x
    done
    same "$work/sr" "$work/sd" 4
    "$cohort" ckpt verify "$(it_dir "$work/sd" 4)" >"$work/verify.txt" 2>&1 || fail "verify: $(tail -5 "$work/verify.txt")"
    /usr/bin/python3 - "$(it_dir "$work/sd" 4)/manifest.json" <<'PY' || fail "moment writers"
import json, sys
m = json.load(open(sys.argv[1]))
files = m["files"]
writers = set()
for t in m["tensors"]:
    if t["kind"] == "optim":
        for s in t["slices"]:
            assert "flat" in s, (t["name"], s)
            writers.add(files[s["file"]]["writer"])
# ranks 4 and 5 (stage 1, data-parallel rank 0) own the first half of stage 1's buffer,
# which is the tied embedding's copy (laid out first: the table reversed), never saved
assert sorted(writers) == [0, 1, 2, 3, 6, 7], writers
PY
    for to in 1:1 4:4; do
        n=${to%%:*}
        extra=(); [ "$n" = 4 ] && extra=(--tensor-model-parallel-size 1)
        for x in d r; do
            cp -r "$work/s$x" "$work/c$x$n"
            train c$x$n "$n" "${extra[@]}" --train-iters 8 --load "$work/c$x$n" --save "$work/c$x$n"; ok c$x$n
        done
        same "$work/cr$n" "$work/cd$n" 8
    done
    ;;
overlap)
    # --overlap-grad-reduce: buckets of 1000 elements reduced on a communication thread as
    # their layers' backward ends; bitwise the same run without overlap, with and without the
    # distributed optimizer (and its reduce-scatter path), at data 2 and 4
    b=(--ddp-bucket-size 1000 --train-iters 4)
    for n in 2 4; do
        for opt in r d s; do
            flag=; [ $opt != r ] && flag=$D
            rs=0; [ $opt = s ] && rs=1
            # shellcheck disable=SC2086
            COHORT_TEST_DOPT_REDUCE_SCATTER=$rs train $opt$n $n $flag "${b[@]}" --save "$work/$opt$n"; ok $opt$n
            # shellcheck disable=SC2086
            COHORT_TEST_DOPT_REDUCE_SCATTER=$rs train $opt${n}o $n $flag "${b[@]}" --overlap-grad-reduce \
                --save "$work/$opt${n}o"
            ok $opt${n}o
            same "$work/$opt$n" "$work/$opt${n}o" 4
            grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" \
                "$work/$opt${n}o.out" "$work/$opt${n}o.err" ||
                fail "$opt$n: no bucket started early: $(grep -h overlapped "$work/$opt${n}o".*)"
        done
    done
    ;;
overlap_tp|overlap_pp|overlap_cp)
    # --overlap-grad-reduce with model parallelism: the communication thread reduces over the
    # gradient group's own transport while the backward's collectives (tensor sums, pipeline
    # sends, ring shifts) go over the job's; bitwise the same layout without overlap, with and
    # without the distributed optimizer, buckets started during the backward
    mp_layouts $case_name
    b=(--ddp-bucket-size 1000 --train-iters 4)
    k=0
    for l in "${lays[@]}"; do
        k=$((k + 1))
        for opt in r d; do
            flag=; [ $opt = d ] && flag=$D
            # shellcheck disable=SC2086
            train $opt$k 4 $l $flag "${b[@]}" --save "$work/$opt$k"; ok $opt$k
            # shellcheck disable=SC2086
            train $opt${k}o 4 $l $flag "${b[@]}" --overlap-grad-reduce --save "$work/$opt${k}o"; ok $opt${k}o
            same "$work/$opt$k" "$work/$opt${k}o" 4
            grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" \
                "$work/$opt${k}o.out" "$work/$opt${k}o.err" ||
                fail "$opt$k ($l): no bucket started early: $(grep -h overlapped "$work/$opt${k}o".*)"
            grep -q "no transport of the gradient group's own" "$work/$opt${k}o.err" && fail "$opt$k: reduced inline"
        done
    done
    if [ $case_name = overlap_tp ]; then
        # a trainer given no transport of the gradient group's own (a test knob) reduces the
        # buckets on its training thread after the backward: it says so, and the bits hold
        # shellcheck disable=SC2086
        COHORT_TEST_NO_GRAD_TRANSPORT=1 train d1n 4 $l $D "${b[@]}" --overlap-grad-reduce --save "$work/d1n"; ok d1n
        grep -q "no transport of the gradient group's own; its buckets are reduced after the backward" "$work/d1n.err" ||
            fail "no fallback said: $(grep -h overlap "$work/d1n.err" | head -3)"
        same "$work/d1" "$work/d1n" 4
    fi
    ;;
param_gather)
    # --overlap-param-gather (with --overlap-grad-reduce, as Megatron requires): the updated
    # parameters gathered bucket by bucket on a thread while the next forward runs, each
    # bucket waited for before its first layer; bitwise the same run without either overlap,
    # at data 2 and 4 (and at 4 on the reduce-scatter path), with a save and an evaluation
    # in between (both wait for the gathers first); refused without the distributed
    # optimizer or --overlap-grad-reduce (Megatron's reasons)
    b=(--ddp-bucket-size 1000 --train-iters 6 --save-interval 3 --eval-interval 2 --eval-iters 1)
    for v in 2r 4r 4s; do
        n=${v%?}; rs=0; [ "${v#?}" = s ] && rs=1
        COHORT_TEST_DOPT_REDUCE_SCATTER=$rs train g$v "$n" $D "${b[@]}" --save "$work/g$v"; ok g$v
        COHORT_TEST_DOPT_REDUCE_SCATTER=$rs train g${v}o "$n" $D "${b[@]}" --overlap-grad-reduce \
            --overlap-param-gather --save "$work/g${v}o"
        ok g${v}o
        same "$work/g$v" "$work/g${v}o" 3
        same "$work/g$v" "$work/g${v}o" 6
        grep -q "overlapped parameter all-gather: [1-9][0-9]* buckets, gathered in the order the forward" \
            "$work/g${v}o.out" "$work/g${v}o.err" || fail "$v: no overlapped gather: $(grep -h overlapped "$work/g${v}o".*)"
        [ "$(grep -c "validation loss" "$work/g${v}o.out")" = "$(grep -c "validation loss" "$work/g$v.out")" ] ||
            fail "$v: evaluations differ"
        grep "validation loss" "$work/g$v.out" >"$work/e1"; grep "validation loss" "$work/g${v}o.out" >"$work/e2"
        cmp -s "$work/e1" "$work/e2" || fail "$v: validation losses differ: $(diff "$work/e1" "$work/e2" | head -4)"
    done
    for extra in "--overlap-grad-reduce --overlap-param-gather" "$D --overlap-param-gather"; do
        # shellcheck disable=SC2086
        "$cohort" train "${tiny[@]}" --nproc-per-node 4 --train-iters 1 $extra >"$work/o" 2>&1
        [ $? -eq 2 ] || fail "$extra: not refused: $(tail -3 "$work/o")"
        case $extra in
        --overlap-grad-reduce*) want="--overlap-param-gather only supported with distributed optimizer" ;;
        *) want="Must use --overlap-param-gather with --overlap-grad-reduce" ;;
        esac
        grep -q -- "$want" "$work/o" || fail "$extra: $(cat "$work/o")"
    done
    ;;
param_gather_tp|param_gather_pp|param_gather_cp)
    # --overlap-param-gather with model parallelism: the gather thread all-gathers over the
    # gradient group's own transport (the overlapped reduction's, whose thread is joined by
    # then) while the forward's collectives (tensor sums, pipeline sends, ring shifts) go over
    # the job's; bitwise the same layout with the distributed optimizer and neither overlap,
    # with a save and an evaluation between (both wait for the gathers first); under an
    # interleaved pipeline each chunk's forward waits for its own buckets
    mp_layouts $case_name
    b=(--ddp-bucket-size 1000 --train-iters 4 --save-interval 2 --eval-interval 2 --eval-iters 1)
    k=0
    for l in "${lays[@]}"; do
        k=$((k + 1))
        # shellcheck disable=SC2086
        train g$k 4 $l $D "${b[@]}" --save "$work/g$k"; ok g$k
        # shellcheck disable=SC2086
        train g${k}o 4 $l $D "${b[@]}" --overlap-grad-reduce --overlap-param-gather --save "$work/g${k}o"; ok g${k}o
        same "$work/g$k" "$work/g${k}o" 2
        same "$work/g$k" "$work/g${k}o" 4
        grep -q "overlapped parameter all-gather: [1-9][0-9]* buckets, gathered in the order the forward" \
            "$work/g${k}o.out" "$work/g${k}o.err" || fail "$l: no overlapped gather: $(grep -h overlapped "$work/g${k}o".*)"
        grep -q "no transport of the gradient group's own" "$work/g${k}o.err" && fail "$l: gathered inline"
        grep "validation loss" "$work/g$k.out" >"$work/e1"; grep "validation loss" "$work/g${k}o.out" >"$work/e2"
        [ -s "$work/e1" ] && cmp -s "$work/e1" "$work/e2" ||
            fail "$l: validation losses differ: $(diff "$work/e1" "$work/e2" | head -4)"
    done
    if [ $case_name = param_gather_tp ]; then
        # a trainer given no transport of the gradient group's own (a test knob) gathers the
        # parameters at once after each step: it says so, and the bits hold
        # shellcheck disable=SC2086
        COHORT_TEST_NO_GRAD_TRANSPORT=1 train g1n 4 $l $D "${b[@]}" --overlap-grad-reduce --overlap-param-gather \
            --save "$work/g1n"
        ok g1n
        grep -q -- "--overlap-param-gather: no transport of the gradient group's own; the parameters are gathered after each step" \
            "$work/g1n.err" || fail "no fallback said: $(grep -h overlap "$work/g1n.err" | head -3)"
        same "$work/g1" "$work/g1n" 4
    fi
    ;;
overlap_ep)
    # --overlap-grad-reduce (and --overlap-param-gather) with expert parallelism: the experts'
    # buckets reduced (and gathered) over the expert-data-parallel group's own transport, the
    # rest over the gradient group's, while the layers' token exchange goes over the job's;
    # data 4 x expert 2 (expert-data-parallel pairs) replicated, distributed, distributed with
    # both overlaps, and data 2 x expert 2 (groups of one) with both: every loss and norm and
    # the checkpoint bitwise the same layout without the overlaps, buckets started during the
    # backward
    tiny_model --global-batch-size 16 --num-layers 4 --attention-dropout 0 --disable-bias-linear --num-experts 4 \
        --moe-router-topk 2 --moe-layer-freq 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 \
        --moe-z-loss-coeff 1e-3 --clip-grad 0.3
    b=(--expert-model-parallel-size 2 --ddp-bucket-size 1000 --train-iters 4)
    for v in 4r 4d 4p 2p; do
        n=${v%?} flag=$D ovl=(--overlap-grad-reduce)
        [ "${v#?}" = r ] && flag=
        [ "${v#?}" = p ] && ovl+=(--overlap-param-gather)
        # (the reference of 4d and 4p is the same run)
        [ -d "$work/e$n${flag:+d}" ] ||
            { train e$n${flag:+d} "$n" "${b[@]}" $flag --metrics-file "$work/e$n${flag:+d}.jsonl" --save "$work/e$n${flag:+d}"
              ok e$n${flag:+d}; }
        train o$v "$n" "${b[@]}" $flag "${ovl[@]}" --metrics-file "$work/o$v.jsonl" --save "$work/o$v"; ok o$v
        same "$work/e$n${flag:+d}" "$work/o$v" 4
        [ "$(losses "$work/o$v.jsonl" | wc -w)" -ge 12 ] || fail "$v: $(losses "$work/o$v.jsonl")"
        same_losses e$n${flag:+d} o$v "$v: the overlaps logged other numbers"
        grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" "$work/o$v.err" ||
            fail "$v: no bucket started early: $(grep -h overlapped "$work/o$v.err" | head -3)"
        grep -q "no transport of the" "$work/o$v.err" && fail "$v: reduced or gathered inline"
        if [ "${v#?}" = p ]; then
            grep -q "overlapped parameter all-gather: [1-9][0-9]* buckets" "$work/o$v.err" ||
                fail "$v: no overlapped gather: $(grep -h overlapped "$work/o$v.err" | head -3)"
        fi
    done
    ;;
ep|kill_ep|kill_overlap_ep|ep_ckpt|ep_ckpt_tp|ep_ckpt_cp)
    # expert parallelism: the experts' optimizer shards span the expert-data-parallel group
    # (Megatron's second optimizer instance, their own layout after the rest of the buffer),
    # the rest the data-parallel group; the norm counts every element once. The runs are
    # compared by their metrics (every iteration's loss and gradient norm) and, at tensor
    # size 1, by their checkpoints. --clip-grad 0.3: every step is clipped by the norm
    # (about 0.5), so a wrong norm shows
    tiny_model --global-batch-size 16 --num-layers 4 --attention-dropout 0 --disable-bias-linear --num-experts 4 \
        --moe-router-topk 2 --moe-layer-freq 2 --moe-ffn-hidden-size 48 --moe-aux-loss-coeff 1e-2 \
        --moe-z-loss-coeff 1e-3 --clip-grad 0.3
    ep=(--expert-model-parallel-size 2)
    if [ $case_name = ep_ckpt_tp ] || [ $case_name = ep_ckpt_cp ]; then
        # expert 2 with tensor or context parallelism: the checkpoint bitwise the replicated
        # optimizer's, every rank writing moments of experts (dense shards over each tensor
        # rank's gradient group, the experts' over their expert-data-parallel groups: with
        # the experts whole on each tensor rank an expert rank is one tensor rank, which
        # writes its experts whole; split over the tensor group, each its slices), verified;
        # loaded with the flag at another layout and the same, and without it, each
        # continuing bitwise as the replicated checkpoint does
        sp=(--tensor-model-parallel-size 2 --sequence-parallel)
        if [ $case_name = ep_ckpt_tp ]; then
            # (t: expert tensor size 1, the expert group across the tensor ranks; x: the
            # experts split over the tensor group, expert tensor size 2)
            lays=("t:${sp[*]} --expert-tensor-parallel-size 1" "x:${sp[*]}")
        else
            lays=("c:--context-parallel-size 2")
        fi
        for lay in "${lays[@]}"; do
            n=${lay%%:*} extra=${lay#*:}
            for x in d r; do
                flag=$D; [ $x = r ] && flag=
                # shellcheck disable=SC2086
                train $n$x 4 "${ep[@]}" $extra $flag --train-iters 8 --save "$work/$n$x" --save-interval 4 \
                    --exit-interval 4
                ok $n$x
            done
            same "$work/${n}r" "$work/${n}d" 4
            "$cohort" ckpt verify "$(it_dir "$work/${n}d" 4)" >"$work/verify.txt" 2>&1 ||
                fail "$n: verify: $(tail -5 "$work/verify.txt")"
            moment_writers "$(it_dir "$work/${n}d" 4)" || fail "$n: moment writers"
            # to: the same layout with the flag (t only), data 4 x expert 2 with it, one
            # expert rank without it
            tos="e2d e1r"; [ $n = t ] && tos="same e2d e1r"
            for to in $tos; do
                flag=$D; [ $to = e1r ] && flag=
                lay=(); [ $to = e2d ] && lay=("${ep[@]}")
                # shellcheck disable=SC2206
                [ $to = same ] && lay=("${ep[@]}" $extra)
                for x in d r; do
                    rm -rf "$work/c$x$to"
                    cp -r "$work/$n$x" "$work/c$x$to"
                    # shellcheck disable=SC2086
                    train c$x$to 4 "${lay[@]}" $flag --train-iters 8 --load "$work/c$x$to" --save "$work/c$x$to"
                    ok c$x$to
                done
                same "$work/cr$to" "$work/cd$to" 8
            done
        done
    elif [ $case_name = ep_ckpt ]; then
        # data 4 x expert 2: the checkpoint bitwise the replicated optimizer's, every rank
        # writing moments (dense shards over data 4, the experts' over their pairs), verified;
        # loaded with the flag at expert 2 and at expert 1, and without it at expert 1, each
        # continuing bitwise as the replicated checkpoint does; and pipeline 2 x expert 2
        for x in d r; do
            flag=$D; [ $x = r ] && flag=
            # shellcheck disable=SC2086
            train s$x 4 "${ep[@]}" $flag --train-iters 8 --save "$work/s$x" --save-interval 4 --exit-interval 4
            ok s$x
        done
        same "$work/sr" "$work/sd" 4
        "$cohort" ckpt verify "$(it_dir "$work/sd" 4)" >"$work/verify.txt" 2>&1 || fail "verify: $(tail -5 "$work/verify.txt")"
        moment_writers "$(it_dir "$work/sd" 4)" || fail "moment writers"
        for to in e2d e1d e1r; do
            flag=$D; [ $to = e1r ] && flag=
            lay=(); [ $to = e2d ] && lay=("${ep[@]}")
            for x in d r; do
                cp -r "$work/s$x" "$work/c$x$to"
                # shellcheck disable=SC2086
                train c$x$to 4 "${lay[@]}" $flag --train-iters 8 --load "$work/c$x$to" --save "$work/c$x$to"
                ok c$x$to
            done
            same "$work/cr$to" "$work/cd$to" 8
        done
        for x in d r; do
            flag=$D; [ $x = r ] && flag=
            # shellcheck disable=SC2086
            train p$x 4 "${ep[@]}" --pipeline-model-parallel-size 2 $flag --train-iters 4 --save "$work/p$x"; ok p$x
        done
        same "$work/pr" "$work/pd" 4
    elif [ $case_name = kill_ep ] || [ $case_name = kill_overlap_ep ]; then
        # data 4 x expert 2 (expert-data-parallel groups of 2): a killed rank's dense shard
        # comes from the next data-parallel rank, its experts' from the next
        # expert-data-parallel rank; bitwise the fault-free run (every loss and norm, the
        # final checkpoint), no step lost. kill_overlap_ep: with both overlaps, killed before
        # its last micro batch's backward (after sleeping 2 s there, so the others have
        # started their buckets on the gradient and expert-data-parallel groups' own
        # transports however loaded the machine), which the abort must reach
        inj=(--inject "kill@rank=2,step=6")
        if [ $case_name = kill_overlap_ep ]; then
            ep+=(--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000)
            inj=(--inject "slow@rank=2,step=6,phase=backward,microbatch=1,ms=2000"
                 --inject "kill@rank=2,step=6,phase=backward,microbatch=1")
        fi
        train clean 4 "${ep[@]}" $D --train-iters 10 --metrics-file "$work/clean.jsonl" --save "$work/clean"; ok clean
        train f 4 "${ep[@]}" $D --train-iters 10 --metrics-file "$work/f.jsonl" --save "$work/f" "${inj[@]}" $quick
        ok f
        if [ $case_name = kill_overlap_ep ]; then
            grep -q "cohort rank [013]: overlapped gradient reduction, bucket [0-9]* of [0-9]*: .*aborted" "$work/f.err" ||
                fail "no bucket in flight at the abort: $(grep -h 'overlapped\|aborted' "$work/f.err" | tail -5)"
        fi
        same "$work/clean" "$work/f" 10
        grep -q "in-process restart into generation 2" "$work/f.err" || fail "no restart"
        grep -q "generation 2: 4 rank(s) resume after iteration [0-9]* with the state of ranks\? [0-9, ]* (.*1 replaced" \
            "$work/f.err" || fail "not resumed from memory: $(grep supervisor "$work/f.err")"
        grep -q "lost every holder\|loads the checkpoint\|handover" "$work/f.err" && fail "no handover from memory"
        [ "$(losses "$work/f.jsonl" | wc -w)" -ge 30 ] || fail "f: $(losses "$work/f.jsonl")"
        same_losses clean f "the killed run logged other numbers than the fault-free one"
        grep -q '"steps_lost": 0' "$work/f.report.json" || fail "steps lost: $(grep steps_lost "$work/f.report.json")"
    else
        # data 4 x expert 2 (expert-data-parallel groups of 2), data 2 x expert 2 (groups of
        # one: the experts' gradients still averaged over the data-parallel size) and tensor
        # 2 x expert 2: the same numbers as without the flag, and within 5e-5 of one process
        m=(--train-iters 5)
        train one 1 "${m[@]}" --metrics-file "$work/one.jsonl"; ok one
        for lay in "4:" "2:" "4:--tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1"; do
            n=${lay%%:*} extra=${lay#*:}
            name=e$n; [ -n "$extra" ] && name=t$n
            for x in r d; do
                flag=; [ $x = d ] && flag=$D
                # shellcheck disable=SC2086
                train $name$x "$n" "${ep[@]}" $extra $flag "${m[@]}" --metrics-file "$work/$name$x.jsonl"; ok $name$x
            done
            [ "$(losses "$work/${name}d.jsonl" | wc -w)" -ge 15 ] || fail "$name: $(losses "$work/${name}d.jsonl")"
            same_losses ${name}r ${name}d "$name: the distributed optimizer logged other numbers than the replicated one"
            /usr/bin/python3 - "$work/one.jsonl" "$work/${name}d.jsonl" <<'PY' || fail "$name: losses not near one process's"
import json, sys
a, b = ({r["iteration"]: r["lm_loss"] for r in map(json.loads, open(f)) if "grad_norm" in r} for f in sys.argv[1:])
assert set(a) == set(b) and len(a) == 5, (a, b)
assert all(abs(a[i] - b[i]) <= 5e-5 for i in a), (a, b)
PY
        done
        grep -q "the experts' distributed optimizer over 2 expert-data-parallel ranks" "$work/e4d.out" ||
            fail "$(grep optimizer "$work/e4d.out")"
        grep -q "the experts' distributed optimizer over 1 expert-data-parallel rank:" "$work/e2d.out" ||
            fail "$(grep optimizer "$work/e2d.out")"
    fi
    ;;
matches_replicated)
    # the distributed optimizer against the replicated one after 6 steps. On one host it
    # reduces and gathers with shared-memory all-reduces: bitwise the replicated optimizer's at
    # 1, 2 and 4 ranks. With reduce-scatter and all-gather (the path between hosts, forced by
    # COHORT_TEST_DOPT_REDUCE_SCATTER): bitwise at 2 (a sum of two in any order), within
    # reduction-order noise at 4. Bitwise reproducible at 4 with and without the redundant
    # shard copies (which change no number), on both paths
    for n in 1 2 4; do
        train r$n $n --train-iters 6 --save "$work/r$n"; ok r$n
        train d$n $n $D --train-iters 6 --save "$work/d$n"; ok d$n
    done
    same "$work/r1" "$work/d1" 6
    same "$work/r2" "$work/d2" 6
    same "$work/r4" "$work/d4" 6
    for n in 2 4; do
        COHORT_TEST_DOPT_REDUCE_SCATTER=1 train s$n $n $D --train-iters 6 --save "$work/s$n"; ok s$n
    done
    same "$work/r2" "$work/s2" 6
    close "$work/r4" "$work/s4" 6
    "$cohort" ckpt diff "$(it_dir "$work/r4" 6)" "$(it_dir "$work/s4" 6)" >/dev/null 2>&1 &&
        fail "4 ranks bitwise equal to the replicated optimizer: is the reduce-scatter used at all?"
    COHORT_TEST_DOPT_REDUCE_SCATTER=1 train t4 4 $D --train-iters 6 --save "$work/t4"; ok t4
    same "$work/s4" "$work/t4" 6
    train e4 4 $D --train-iters 6 --save "$work/e4"; ok e4
    same "$work/d4" "$work/e4" 6
    train n4 4 $D --no-dist-opt-redundancy --train-iters 6 --save "$work/n4"; ok n4
    same "$work/d4" "$work/n4" 6
    ;;
ckpt_reshard)
    # a distributed-optimizer checkpoint (each rank's shard of the moments, saved under the
    # replicated optimizer's names) resumes at another data-parallel size: dp2 -> dp4, dp4 ->
    # dp2, dp2 -> one process (with and without the flag); the same size resumes bitwise; and
    # at tensor-parallel size 2
    for n in 2 4; do
        train s$n $n $D --train-iters 8 --save "$work/s$n" --save-interval 4 --exit-interval 4; ok s$n
        train full$n $n $D --train-iters 8 --save "$work/full$n"; ok full$n
    done
    train full1 1 $D --train-iters 8 --save "$work/full1"; ok full1
    for p in 2:2 4:4 2:4 4:2 2:1 2:1r; do
        from=${p%%:*} to=${p#*:} flag=$D
        name=c$from-$to
        [ "$to" = 1r ] && { to=1; flag=; }
        cp -r "$work/s$from" "$work/$name"
        # shellcheck disable=SC2086
        train $name "$to" $flag --train-iters 8 --load "$work/$name" --save "$work/$name"; ok $name
    done
    grep -q "checkpoint written at data-parallel size 2, loaded at 4" "$work/c2-4.out" || fail "no reshard note"
    same "$work/full2" "$work/c2-2" 8
    same "$work/full4" "$work/c4-4" 8
    close "$work/full4" "$work/c2-4" 8
    close "$work/full2" "$work/c4-2" 8
    close "$work/full1" "$work/c2-1" 8
    # one process: the distributed optimizer and the replicated one take the same steps
    "$cohort" ckpt diff "$(it_dir "$work/c2-1" 8)" "$(it_dir "$work/c2-1r" 8)" >/dev/null ||
        fail "the checkpoint loaded without --use-distributed-optimizer continues differently"
    # other tensor-parallel sizes by name: the dp2 checkpoint loads at tensor-parallel size 2
    # (replicated optimizer) and continues exactly as the replicated optimizer's own dp2
    # checkpoint of iteration 4 does
    train rs2 2 --train-iters 8 --save "$work/rs2" --save-interval 4 --exit-interval 4; ok rs2
    same "$work/rs2" "$work/s2" 4
    cp -r "$work/s2" "$work/t2"
    for x in t2 rs2; do
        train $x-tp 2 --tensor-model-parallel-size 2 --train-iters 8 --load "$work/$x" --save "$work/$x"; ok $x-tp
    done
    grep -q "checkpoint written at tensor x pipeline size 1 x 1, loaded at 2 x 1" "$work/t2-tp.out" ||
        fail "tp2 load: $(grep -i checkpoint "$work/t2-tp.out")"
    same "$work/rs2" "$work/t2" 8
    ;;
kill|kill_optimizer|kill_optimizer_peer|shift_ranks|kill_tp|kill_cp|kill_overlap|kill_overlap_tp|kill_param_gather|kill_param_gather_tp)
    # a rank holding an optimizer shard dies (in forward; right after its shard's update,
    # before the parameters' all-gather; with shifted ranks; in tensor 2 x data 2, where
    # each tensor rank's data-parallel pair shards its slices; in context 2 x data 2, where
    # the shards span data x context): its shard comes back from the next rank's copy in its
    # gradient group, and the job ends bitwise at the fault-free result, no step lost
    lay=()
    case $case_name in
    kill) inj=(--inject "kill@rank=2,step=6");;
    kill_optimizer) inj=(--inject "kill@rank=3,step=6,phase=optimizer");;
    kill_optimizer_peer)
        # killed before its update: the others (the last rank, which prints, among them)
        # commit iteration 6 and block in the parameters' all-gather until the abort; the
        # committed iteration's log line is printed all the same
        inj=(--inject "kill@rank=1,step=6,phase=optimizer");;
    kill_tp) inj=(--inject "kill@rank=2,step=6"); lay=(--tensor-model-parallel-size 2);;
    kill_cp) inj=(--inject "kill@rank=1,step=6"); lay=(--context-parallel-size 2 --attention-dropout 0);;
    kill_overlap)
        # killed in its backward, while the others' buckets are in flight on their
        # communication threads (the abort must reach them)
        inj=(--inject "kill@rank=2,step=6,phase=backward")
        lay=(--overlap-grad-reduce --ddp-bucket-size 1000);;
    kill_overlap_tp)
        # the same in tensor 2 x data 2, killed before its last micro batch's backward: its
        # data-parallel peer's first bucket waits for it on the gradient group's own transport,
        # which the abort must reach; the replacement connects it. Rank 2 first sleeps 2 s
        # there, so rank 0 has reached its last backward and started that bucket however
        # loaded the machine is (the death alone raced rank 0's earlier micro batches)
        inj=(--inject "slow@rank=2,step=6,phase=backward,microbatch=3,ms=2000"
             --inject "kill@rank=2,step=6,phase=backward,microbatch=3")
        lay=(--overlap-grad-reduce --ddp-bucket-size 1000 --tensor-model-parallel-size 2);;
    kill_param_gather)
        # killed before its update of step 6: the others commit it and start gathering its
        # parameters on their gather threads, which wait for the dead rank until the abort
        # cancels them
        inj=(--inject "kill@rank=2,step=6,phase=optimizer")
        lay=(--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000);;
    kill_param_gather_tp)
        # the same in tensor 2 x data 2, the gathers on the gradient group's own transport:
        # rank 2 first sleeps 2 s before its update, so its data-parallel peer (rank 0) has
        # committed and started gathering however loaded the machine is, then dies
        inj=(--inject "slow@rank=2,step=6,phase=optimizer,ms=2000" --inject "kill@rank=2,step=6,phase=optimizer")
        lay=(--overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000 --tensor-model-parallel-size 2);;
    *) inj=(--inprocess-rank-assignment shift-ranks --inject "kill@rank=1,step=5");;
    esac
    train clean 4 "${lay[@]}" $D --train-iters 10 --save "$work/clean"; ok clean
    train f 4 "${lay[@]}" $D --train-iters 10 --save "$work/f" "${inj[@]}" $quick; ok f
    grep -q "in-process restart into generation 2" "$work/f.err" || fail "no restart"
    grep -q "generation 2: 4 rank(s) resume after iteration [0-9]* with the state of ranks\? [0-9, ]* (.*1 replaced" \
        "$work/f.err" || fail "not resumed from memory: $(grep supervisor "$work/f.err")"
    grep -q "lost every holder\|loads the checkpoint" "$work/f.err" && fail "fell back to the checkpoint"
    if [ $case_name = shift_ranks ]; then
        grep -q "rank 2 is rank 1 from generation 2" "$work/f.err" && grep -q "rank 3 is rank 2 from generation 2" \
            "$work/f.err" || fail "ranks not shifted: $(grep 'is rank' "$work/f.err")"
    fi
    same "$work/clean" "$work/f" 10
    grep -q '"steps_lost": 0' "$work/f.report.json" || fail "steps lost: $(grep steps_lost "$work/f.report.json")"
    if [ $case_name = kill_optimizer_peer ]; then
        grep -q "generation aborted during iteration 7" "$work/f.err" ||
            fail "the abort did not come after iteration 6's commit: $(grep 'generation aborted' "$work/f.err")"
        got=$(grep -o "iteration *[0-9]*/" "$work/f.out" | tr -dc '0-9\n' | tr '\n' ' ')
        [ "$got" = "1 2 3 4 5 6 7 8 9 10 " ] || fail "log lines of iterations $got, not 1 to 10 once each"
    fi
    if [ $case_name = kill_overlap_tp ]; then
        grep -q "cohort rank 0: overlapped gradient reduction, bucket [0-9]* of [0-9]*: .*aborted" "$work/f.err" ||
            fail "no bucket of rank 0 in flight at the abort: $(grep -h 'rank 0' "$work/f.err" | tail -5)"
    fi
    if [ $case_name = kill_param_gather_tp ]; then
        grep -q "cohort rank 0: overlapped parameter all-gather, bucket [0-9]* of [0-9]*: .*aborted.*not gathered" \
            "$work/f.err" || fail "no gather of rank 0 in flight at the abort: $(grep -h 'rank 0' "$work/f.err" | tail -5)"
    fi
    if [ $case_name = kill_param_gather ]; then
        # a survivor's gather of iteration 6's parameters was in flight and ended by the abort
        grep -q "overlapped parameter all-gather, bucket [0-9]* of [0-9]*: .*not gathered" "$work/f.err" ||
            fail "no gather in flight cancelled: $(grep -i 'gather\|aborted' "$work/f.err" | head -5)"
    fi
    ;;
overlap_mp_kill|overlap_mp_sdc)
    # tensor 2 x pipeline 2 x data 2 with the distributed optimizer, the overlapped reduction,
    # full uniform recomputation and sequence parallelism: a rank killed in its backward (the
    # others' buckets in flight on the gradient groups' own transports), or a mantissa bit of
    # one rank's weights flipped (the two replicas' checksums differ, the step is replayed and
    # the rank repaired from its data-parallel peer); each job ends bitwise equal to the
    # fault-free run, parameters and both moments
    tiny_model --global-batch-size 16 --attention-dropout 0
    lay=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "$D" --overlap-grad-reduce
         --ddp-bucket-size 1000 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
         --train-iters 8)
    train clean 8 "${lay[@]}" --save "$work/clean"; ok clean
    grep -q "overlapped gradient reduction: [0-9]* buckets, [1-9][0-9]* started during the backward" "$work/clean.err" ||
        fail "no bucket started early: $(grep -h overlapped "$work/clean.err" | head -3)"
    if [ $case_name = overlap_mp_kill ]; then
        # (before its last micro batch's backward: its data-parallel peer's buckets wait for it)
        train f 8 "${lay[@]}" --save "$work/f" --inject "kill@rank=5,step=5,phase=backward,microbatch=3" $quick; ok f
        grep -q "in-process restart into generation 2" "$work/f.err" || fail "no restart"
        grep -q "generation 2: 8 rank(s) resume after iteration [0-9]* with the state of ranks\? [0-9, ]* (.*1 replaced" \
            "$work/f.err" || fail "not resumed from memory: $(grep supervisor "$work/f.err")"
        grep -q '"steps_lost": 0' "$work/f.report.json" || fail "steps lost: $(grep steps_lost "$work/f.report.json")"
    else
        train f 8 "${lay[@]}" --save "$work/f" --inject "bitflip-param@rank=5,step=4,bit=22"; ok f
        # (the replica of ranks 0, 1, 4 and 5 repaired from the other's, same coordinates each)
        grep -q "repair (persistent_error): 4 ranks' parameters differ from rank 2's (ranks 0, 1, 4, 5; .*silent data corruption; repaired from rank 2" "$work/f.err" ||
            fail "no repair: $(grep supervisor "$work/f.err" | head -5)"
    fi
    same "$work/clean" "$work/f" 8
    ;;
kill_both|kill_unreplicated)
    # both holders of a shard die in the same iteration (ranks 1 and 2: shard 1 lives on 1
    # and 2), or its only holder without --dist-opt-redundancy: no memory holds it, so every
    # rank reloads the checkpoint of iteration 8, the report counts the steps lost, and the
    # job still ends at the fault-free result. Both die right after the step's verdict, just
    # before their update (the phase every rank reaches within microseconds of the others,
    # well before the abort the first death causes); the survivors committed iteration 10.
    if [ $case_name = kill_both ]; then
        inj=(--inject "kill@rank=1,step=10,phase=optimizer" --inject "kill@rank=2,step=10,phase=optimizer")
        why="the optimizer shard of data-parallel rank 1 (rank 1; .*) lost every holder at iteration 10 (it and the next"
        lost=2
    else
        inj=(--no-dist-opt-redundancy --inject "kill@rank=2,step=10")
        why="the optimizer shard of data-parallel rank 2 (rank 2; .*) lost every holder at iteration 9 (no --dist-opt"
        lost=1
    fi
    train clean 4 $D --train-iters 12 --save "$work/clean" --save-interval 4; ok clean
    train f 4 $D --train-iters 12 --save "$work/f" --save-interval 4 "${inj[@]}" $quick; ok f
    grep -q "$why" "$work/f.err" || fail "$(grep supervisor "$work/f.err")"
    grep -q "loads the checkpoint of iteration 8 from .* ($lost steps lost)" "$work/f.err" ||
        fail "$(grep supervisor "$work/f.err")"
    same "$work/clean" "$work/f" 12
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['steps_lost'] == $lost, r['steps_lost']" \
        "$work/f.report.json" || fail "steps lost: $(grep steps_lost "$work/f.report.json")"
    ;;
ckpt_shards)
    # each rank writes only its shard of the moments: in a dp 4 checkpoint every moment
    # tensor is flat ranges (the manifest's "flat" slices) in the optimizer files of 4
    # different writers, each about a quarter of the moments' bytes; `cohort ckpt verify`
    # passes; it resumes bitwise at dp 4 and within reduction noise at dp 2 and at one
    # process; a replicated checkpoint still loads into a distributed-optimizer run. (Saved
    # with --async-save: the snapshot copies each rank's shard; dopt_ckpt_reshard saves
    # synchronously.)
    train s4 4 $D --train-iters 8 --save "$work/s4" --save-interval 4 --exit-interval 4 --async-save; ok s4
    /usr/bin/python3 - "$(it_dir "$work/s4" 4)/manifest.json" <<'PY' >"$work/writers.txt" ||
import json, sys
m = json.load(open(sys.argv[1]))
files = m["files"]
per = {}
nopt = 0
for t in m["tensors"]:
    if t["kind"] != "optim":
        continue
    nopt += 1
    for s in t["slices"]:
        assert "flat" in s and "offsets" not in s, (t["name"], s)
        f = files[s["file"]]
        assert f["kind"] == "optim", f
        per[f["writer"]] = per.get(f["writer"], 0) + 4 * (s["flat"][1] - s["flat"][0])
assert nopt == 56, nopt
assert sorted(per) == [0, 1, 2, 3], per
total = sum(per.values())
for w, b in sorted(per.items()):
    assert 0.20 <= b / total <= 0.30, (w, b, total)
    print("writer %d: %d moment bytes (%.3f)" % (w, b, b / total))
PY
        fail "moment regions: $(cat "$work/writers.txt")"
    cat "$work/writers.txt"
    "$cohort" ckpt verify "$(it_dir "$work/s4" 4)" >"$work/verify.txt" 2>&1 || fail "verify: $(tail -5 "$work/verify.txt")"
    train full4 4 $D --train-iters 8 --save "$work/full4"; ok full4
    train full2 2 $D --train-iters 8 --save "$work/full2"; ok full2
    train full1 1 $D --train-iters 8 --save "$work/full1"; ok full1
    for to in 4 2 1; do
        cp -r "$work/s4" "$work/c$to"
        train c$to $to $D --train-iters 8 --load "$work/c$to" --save "$work/c$to"; ok c$to
    done
    same "$work/full4" "$work/c4" 8
    close "$work/full2" "$work/c2" 8
    close "$work/full1" "$work/c1" 8
    train r4 4 --train-iters 8 --save "$work/r4" --save-interval 4 --exit-interval 4; ok r4
    train cr4 4 $D --train-iters 8 --load "$work/r4" --save "$work/r4"; ok cr4
    close "$work/full4" "$work/r4" 8
    ;;
refused)
    # a bucket size out of range is refused before any work (both overlaps run in every
    # layout now: nothing of the flags is left refused)
    "$cohort" train "${tiny[@]}" --nproc-per-node 2 --train-iters 1 --ddp-bucket-size -1 >"$work/o" 2>&1
    [ $? -eq 2 ] || fail "--ddp-bucket-size -1: not refused: $(tail -3 "$work/o")"
    grep -q "must not be negative" "$work/o" || fail "--ddp-bucket-size -1: $(cat "$work/o")"
    # --help says what the flags do
    help=$("$cohort" train --help 2>&1)
    grep -q -- "--dist-opt-redundancy" <<<"$help" || fail "--help lacks --dist-opt-redundancy"
    grep -q -- "--ddp-bucket-size" <<<"$help" || fail "--help lacks --ddp-bucket-size"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
