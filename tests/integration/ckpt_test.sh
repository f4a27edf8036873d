#!/usr/bin/env bash
# ckpt_test.sh - integration tests of checkpoints through the `cohort` binary, one case
# per meson test: exact resume (2N steps == N + save + resume N, bitwise, sync and async),
# a SIGKILL at each phase of the commit, failing writes (ENOSPC, EIO), save on SIGTERM,
# corrupt/truncated fallback and refusal, the load flags, the `cohort ckpt` tools' exit
# codes, safetensors files read by a 20-line numpy reader, and the Hugging Face export's
# loss from an independent numpy GPT-2 (hf_loss) against cohort's evaluation loss, the tools
# that write never damaging a checkpoint or a live job (tools_*: refused outputs, prune beside
# a job stopped mid-save, signals during convert, verify's model check, a garbage tracker). The dp_*
# cases run several ranks under the supervisor: every rank writes its share of the files and
# the supervisor commits (layout, tools and export on such checkpoints, a kill of a rank or of the
# supervisor at each phase, a failing write on one rank).
#   ckpt_test.sh COHORT PYTHON CASE
cohort=$1; py=$2; case_name=$3
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir ckpt
S=$work/save

tiny_model --global-batch-size 4 --log-interval 3 --eval-interval 3 --threads 2
train() { "$cohort" train "${tiny[@]}" "$@"; }
# several ranks: a global batch that 1, 2 and 4 ranks divide, one thread each
dp=(--global-batch-size 8 --threads 1)
tracker() { cat "$S/latest_checkpointed_iteration.txt" 2>/dev/null; }
# the lines that must match between runs: training log lines without time and speed, and
# the in-loop validation lines
loglines() {
    grep -hE '^ \[.*\] iteration +[0-9]+/|^ validation loss at iteration [0-9]+ \|' "$@" |
        sed -E 's/^ \[[^]]*\]//; s/elapsed time per iteration \(ms\): [0-9.]+ \| throughput per GPU \(TFLOP\/s\/GPU\): [0-9.]+ \|//'
}

# A tiny safetensors reader (format: u64 little-endian header length, JSON header with
# dtype/shape/data_offsets per tensor, raw little-endian data).
cat >"$work/st.py" <<'EOF'
import json, struct, sys
import numpy as np
DT = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1"}
def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = buf[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=DT[t["dtype"]]).reshape(t["shape"])
    return out, meta
EOF

case $case_name in
resume|resume_async)
    async=(); [ "$case_name" = resume_async ] && async=(--async-save)
    drop=(--hidden-dropout 0.1 --attention-dropout 0.1)
    # uninterrupted: 8 iterations (saving only at the end)
    train "${drop[@]}" --train-iters 8 --save "$work/full" --metrics-file "$work/m_full.jsonl" >"$work/full.out" 2>&1 ||
        fail "full run: $(tail -3 "$work/full.out")"
    # 4 iterations, save, exit; then a new process resumes for 4 more
    train "${drop[@]}" "${async[@]}" --train-iters 8 --exit-interval 4 --save "$S" --metrics-file "$work/m_a.jsonl" \
        >"$work/a.out" 2>&1 || fail "first half: $(tail -3 "$work/a.out")"
    [ "$(tracker)" = 4 ] || fail "tracker after the first half: $(tracker)"
    train "${drop[@]}" "${async[@]}" --train-iters 8 --load "$S" --save "$S" --metrics-file "$work/m_b.jsonl" \
        >"$work/b.out" 2>&1 || fail "second half: $(tail -3 "$work/b.out")"
    grep -q "successfully loaded checkpoint from $S .* at iteration 4" "$work/b.out" || fail "no load line: $(head "$work/b.out")"
    loglines "$work/full.out" >"$work/l_full"
    loglines "$work/a.out" "$work/b.out" >"$work/l_split"
    [ "$(grep -c 'lm loss:' "$work/l_full")" -eq 2 ] || fail "expected 2 log lines (iterations 3, 6)"
    diff "$work/l_full" "$work/l_split" >&2 || fail "log lines differ between 8 and 4+4"
    # the final evaluation of the resumed run equals the uninterrupted one
    [ "$(grep 'on validation set' "$work/full.out")" = "$(grep 'on validation set' "$work/b.out")" ] || fail "final validation differs"
    # parameters and optimizer state bitwise equal
    ckpt_same "$work/full" "$S" "checkpoints differ"
    grep -q '"equal": 84,' "$work/ckpt_same.json" || fail "$(head -8 "$work/ckpt_same.json")"
    # the metrics' loss values too
    grep -v '"evaluation"' "$work/m_full.jsonl" | grep -o '"iteration":[0-9]*,.*"lm_loss":[^,]*' | sed -E 's/"elapsed[^,]*,"tokens[^,]*,"tflops[^,]*,//' >"$work/x1"
    cat "$work/m_a.jsonl" "$work/m_b.jsonl" | grep -v '"evaluation"' | grep -o '"iteration":[0-9]*,.*"lm_loss":[^,]*' |
        sed -E 's/"elapsed[^,]*,"tokens[^,]*,"tflops[^,]*,//' >"$work/x2"
    diff "$work/x1" "$work/x2" >&2 || fail "metrics differ"
    if [ "$case_name" = resume_async ]; then
        grep -q "saving checkpoint at iteration .* (async)" "$work/a.out" || fail "not async"
        grep -q "async-save blocked training" "$work/a.out" || fail "no stall report"
    fi
    ;;
crash_*)
    phase=${case_name#crash_}
    train --train-iters 2 --save "$S" >"$work/1.out" 2>&1 || fail "first run: $(tail -3 "$work/1.out")"
    COHORT_CKPT_CRASH_AT=$phase train --train-iters 4 --load "$S" --save "$S" --save-interval 2 --most-recent-k 1 \
        >"$work/2.out" 2>&1; rc=$?
    [ $rc -eq 137 ] || fail "run with COHORT_CKPT_CRASH_AT=$phase exited $rc, not killed: $(tail -3 "$work/2.out")"
    case $phase in
    start|shard|shards|manifest|renamed|committed) want=2 ;;
    tracker|prune) want=4 ;;
    esac
    [ "$(tracker)" = "$want" ] || fail "after a kill at $phase the tracker says '$(tracker)', want $want"
    "$cohort" ckpt verify "$S" >"$work/v.out" 2>&1 || fail "the tracker's checkpoint does not verify: $(cat "$work/v.out")"
    if [ "$phase" = renamed ] || [ "$phase" = committed ]; then
        "$cohort" ckpt verify "$S/iter_0000004" >/dev/null || fail "iter_4 renamed but incomplete"
    fi
    # resuming works and finishes the job; leftovers are cleaned
    train --train-iters 6 --load "$S" --save "$S" --save-interval 2 --most-recent-k 1 >"$work/3.out" 2>&1 ||
        fail "resume after a kill at $phase: $(tail -3 "$work/3.out")"
    grep -q "successfully loaded checkpoint .* at iteration $want" "$work/3.out" || fail "resumed from the wrong place"
    [ "$(tracker)" = 6 ] || fail "final tracker $(tracker)"
    ! ls -d "$S"/iter_*.tmp-* "$S"/iter_*.del-* 2>/dev/null | grep . >/dev/null || fail "leftovers: $(ls "$S")"
    [ "$(ls -d "$S"/iter_* | wc -l)" -eq 1 ] || fail "--most-recent-k 1 kept: $(ls "$S")"
    ;;
enospc|eio|enospc_async)
    train --train-iters 2 --save "$S" >"$work/1.out" 2>&1 || fail "first run"
    spec=3; msg="No space left on device"; extra=()
    [ "$case_name" = eio ] && { spec=2:5; msg="Input/output error"; }
    [ "$case_name" = enospc_async ] && extra=(--async-save)
    COHORT_CKPT_FAIL_WRITE=$spec train --train-iters 4 --load "$S" --save "$S" "${extra[@]}" >"$work/2.out" 2>"$work/2.err"; rc=$?
    [ $rc -eq 1 ] || fail "failing write: exit $rc, want 1"
    grep -q "$msg" "$work/2.err" || fail "error does not say '$msg': $(cat "$work/2.err")"
    grep -q "safetensors\|manifest" "$work/2.err" || fail "error does not name the file: $(cat "$work/2.err")"
    [ "$(tracker)" = 2 ] || fail "tracker moved: $(tracker)"
    [ ! -e "$S/iter_0000004" ] || fail "a failed save left iter_4"
    ! ls -d "$S"/iter_*.tmp-* 2>/dev/null | grep . >/dev/null || fail "temporary directory left: $(ls "$S")"
    "$cohort" ckpt verify "$S" >/dev/null || fail "previous checkpoint damaged"
    ;;
sigterm)
    train_bg out 3 --train-iters 3000 --save "$S"
    pid=$job
    kill -TERM $pid
    wait $pid; rc=$?
    [ $rc -eq 0 ] || fail "exit $rc after SIGTERM"
    it=$(sed -n 's/.*stopped by signal after iteration \([0-9]*\).*/\1/p' "$work/out")
    [ -n "$it" ] && [ "$(tracker)" = "$it" ] || fail "no checkpoint at the stop (iteration '$it', tracker '$(tracker)')"
    "$cohort" ckpt verify "$S" >/dev/null || fail "checkpoint saved on SIGTERM does not verify"
    ;;
corrupt)
    train --train-iters 4 --save "$S" --save-interval 2 >"$work/1.out" 2>&1 || fail "first run"
    "$py" -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=0x40; open(p,'wb').write(b)" "$S/iter_0000004/model.safetensors"
    "$cohort" ckpt verify "$S" >/dev/null 2>&1; rc=$?
    [ $rc -eq 5 ] || fail "verify of a corrupt checkpoint exited $rc, want 5"
    train --train-iters 6 --load "$S" --refuse-corrupt-checkpoint >"$work/r.out" 2>"$work/r.err"; rc=$?
    [ $rc -eq 1 ] || fail "--refuse-corrupt-checkpoint: exit $rc"
    grep -q "is corrupt: .*checksum mismatch.*refused" "$work/r.err" || fail "refusal unclear: $(cat "$work/r.err")"
    train --train-iters 6 --load "$S" --save "$S" --save-interval 2 >"$work/2.out" 2>&1 || fail "fallback run: $(tail -3 "$work/2.out")"
    grep -q "WARNING: checkpoint at iteration 4 is corrupt: .*model.safetensors: checksum mismatch" "$work/2.out" ||
        fail "corruption not reported: $(head "$work/2.out")"
    grep -q "successfully loaded checkpoint .* at iteration 2" "$work/2.out" || fail "did not fall back to 2"
    "$cohort" ckpt verify "$S/iter_0000004" >/dev/null || fail "the re-saved iteration 4 does not verify"
    # truncated
    truncate -s 1000 "$S/iter_0000006/optim.safetensors"
    "$cohort" ckpt verify "$S" >/dev/null 2>&1; rc=$?
    [ $rc -eq 4 ] || fail "verify of a truncated checkpoint exited $rc, want 4"
    train --train-iters 8 --load "$S" >"$work/3.out" 2>&1 || fail "truncated fallback run"
    grep -q "iteration 6 is incomplete or truncated: .*optim.safetensors: .* (truncated)" "$work/3.out" ||
        fail "truncation not reported: $(head "$work/3.out")"
    grep -q "successfully loaded checkpoint .* at iteration 4" "$work/3.out" || fail "did not fall back to 4"
    # a tracker pointing at a directory that is gone
    rm -rf "$S/iter_0000006"
    train --train-iters 8 --load "$S" >"$work/4.out" 2>&1 || fail "missing directory fallback"
    grep -q "successfully loaded checkpoint .* at iteration 4" "$work/4.out" || fail "$(head "$work/4.out")"
    ;;
flags)
    train --train-iters 2 --save "$S" --no-save-optim >"$work/1.out" 2>&1 || fail "no-save-optim"
    [ ! -e "$S/iter_0000002/optim.safetensors" ] || fail "--no-save-optim wrote the optimizer"
    train --train-iters 4 --load "$S" >"$work/2.out" 2>"$work/2.err"; rc=$?
    [ $rc -eq 2 ] && grep -q "no optimizer state.*--no-load-optim" "$work/2.err" || fail "missing optimizer: $rc $(cat "$work/2.err")"
    train --train-iters 4 --load "$S" --no-load-optim >"$work/3.out" 2>&1 || fail "--no-load-optim: $(tail -2 "$work/3.out")"
    grep -q "iteration        3/" "$work/3.out" && ! grep -q "iteration        1/" "$work/3.out" || fail "did not resume at 2"
    train --train-iters 2 --load "$S" --finetune --log-interval 1 >"$work/4.out" 2>&1 || fail "--finetune"
    grep -q "iteration        1/" "$work/4.out" && grep -q "(--finetune: weights only)" "$work/4.out" || fail "--finetune did not restart at 0"
    # model flags from the checkpoint
    train --train-iters 4 --load "$S" --no-load-optim --hidden-size 64 >"$work/5.out" 2>"$work/5.err"; rc=$?
    [ $rc -eq 2 ] && grep -q "checkpoint has hidden size 32, --hidden-size is 64" "$work/5.err" || fail "shape mismatch: $rc $(cat "$work/5.err")"
    train --train-iters 4 --load "$S" --no-load-optim --hidden-size 64 --use-checkpoint-args >"$work/6.out" 2>&1 ||
        fail "--use-checkpoint-args: $(tail -3 "$work/6.out")"
    grep -q -- "--hidden-size 32 from the checkpoint" "$work/6.out" || fail "$(head -5 "$work/6.out")"
    # seed: the checkpoint's unless --no-load-rng
    train --train-iters 3 --load "$S" --no-load-optim --seed 77 >"$work/7.out" 2>&1 || fail "seed run"
    grep -q -- "--seed 77 replaced by the checkpoint's seed 1234" "$work/7.out" || fail "seed not taken"
    train --train-iters 3 --load "$S" --no-load-optim --no-load-rng --seed 77 >"$work/8.out" 2>&1 || fail "no-load-rng"
    ! grep -q "replaced by" "$work/8.out" || fail "--no-load-rng took the seed"
    # --ckpt-step and missing checkpoints
    train --train-iters 4 --save "$work/s2" --save-interval 2 >/dev/null 2>&1 || fail "s2"
    train --train-iters 6 --load "$work/s2" --ckpt-step 2 >"$work/9.out" 2>&1 || fail "--ckpt-step"
    grep -q "successfully loaded checkpoint .* at iteration 2" "$work/9.out" || fail "--ckpt-step ignored"
    mkdir -p "$work/empty"
    train --train-iters 1 --load "$work/empty" --exit-on-missing-checkpoint >/dev/null 2>"$work/10.err"; rc=$?
    [ $rc -eq 1 ] && grep -q "exit-on-missing-checkpoint" "$work/10.err" || fail "--exit-on-missing-checkpoint: $rc"
    train --train-iters 1 --load "$work/empty" >"$work/11.out" 2>&1 || fail "missing checkpoint without the flag"
    grep -q "WARNING: .*no checkpoint.*starting from random" "$work/11.out" || fail "$(head -3 "$work/11.out")"
    ;;
tools)
    train --train-iters 6 --save "$S" --save-interval 2 >/dev/null 2>&1 || fail "training"
    for t in ls inspect verify diff convert prune; do
        "$cohort" ckpt $t --help >"$work/h" || fail "$t --help"
        grep -q "usage: cohort ckpt $t" "$work/h" || fail "$t --help text"
    done
    "$cohort" ckpt bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown tool"
    "$cohort" ckpt ls "$S" | grep "^6 .*complete .*latest" >/dev/null || fail "ls: $("$cohort" ckpt ls "$S")"
    "$cohort" ckpt ls "$S" --json | "$py" -c "
import json,sys; d=json.load(sys.stdin); c=d['checkpoints']
assert [x['iteration'] for x in c]==[2,4,6] and d['tracker']==6 and all(x['status']=='complete' for x in c), d" || fail "ls --json"
    "$cohort" ckpt inspect "$S" --json | "$py" -c "
import json,sys; d=json.load(sys.stdin); m=d['manifest']
assert m['iteration']==6 and m['progress']['consumed_samples']['train']==24 and len(d['tensors'])==84, m['iteration']
assert all(t['norm']>0 for t in d['tensors'] if t['kind']=='model')" || fail "inspect --json"
    "$cohort" ckpt inspect "$S" --iteration 2 | grep "iteration 2, consumed samples train 8" >/dev/null || fail "inspect --iteration"
    "$cohort" ckpt verify "$S" --json | "$py" -c "import json,sys; d=json.load(sys.stdin); assert d['code']==0" || fail "verify --json"
    "$cohort" ckpt diff "$S/iter_0000006" "$S" >/dev/null; [ $? -eq 0 ] || fail "diff of a checkpoint with itself"
    "$cohort" ckpt diff "$S/iter_0000002" "$S/iter_0000004" >"$work/d"; [ $? -eq 1 ] || fail "diff of different checkpoints"
    grep -q "embedding.word_embeddings.weight .*differs: max abs" "$work/d" || fail "$(head -3 "$work/d")"
    "$cohort" ckpt diff "$S/iter_0000002" "$work/nothing" >/dev/null 2>&1; [ $? -eq 2 ] || fail "diff of a missing checkpoint"
    # verify's codes: malformed 3, incomplete 4, checksum 5
    cp -r "$S/iter_0000004" "$work/c3"; echo '{"format": 1' >"$work/c3/manifest.json"
    "$cohort" ckpt verify "$work/c3" >/dev/null 2>&1; [ $? -eq 3 ] || fail "verify: malformed manifest"
    cp -r "$S/iter_0000004" "$work/c4"; rm "$work/c4/optim.safetensors"
    "$cohort" ckpt verify "$work/c4" >/dev/null 2>&1; [ $? -eq 4 ] || fail "verify: missing file"
    cp -r "$S/iter_0000004" "$work/c5"; truncate -s -4 "$work/c5/model.safetensors"; printf 'abcd' >>"$work/c5/model.safetensors"
    "$cohort" ckpt verify "$work/c5" >/dev/null 2>&1; [ $? -eq 5 ] || fail "verify: flipped byte"
    # prune: keep 1, never the tracker's
    echo 4 >"$S/latest_checkpointed_iteration.txt"
    "$cohort" ckpt prune "$S" --keep 1 --dry-run | grep "would remove iteration 2" >/dev/null || fail "prune --dry-run"
    "$cohort" ckpt prune "$S" --keep 1 --json | grep '"removed": \[2\]' >/dev/null || fail "prune"
    [ -d "$S/iter_0000004" ] && [ -d "$S/iter_0000006" ] && [ ! -e "$S/iter_0000002" ] || fail "prune removed the wrong ones"
    "$cohort" ckpt prune "$S" >/dev/null 2>&1; [ $? -eq 2 ] || fail "prune without --keep"
    # convert: unsupported models and targets
    "$cohort" ckpt convert "$S" --to tp=2 --output "$work/x" 2>/dev/null; [ $? -eq 3 ] || fail "convert to tp"
    train --train-iters 1 --save "$work/rope" --position-embedding-type rope >/dev/null 2>&1 || fail "rope run"
    "$cohort" ckpt convert "$work/rope" --to hf-gpt2 --output "$work/x" 2>"$work/e"; [ $? -eq 3 ] || fail "convert rope"
    grep -q "rotary" "$work/e" || fail "$(cat "$work/e")"
    ;;
safetensors)
    train --train-iters 3 --save "$S" >/dev/null 2>&1 || fail "training"
    "$cohort" ckpt inspect "$S" --json >"$work/inspect.json" || fail "inspect"
    "$py" - "$work/st.py" "$S/iter_0000003" "$work/inspect.json" <<'EOF' || fail "checkpoint shards unreadable by a plain safetensors reader"
import json, sys
import numpy as np
exec(open(sys.argv[1]).read())
d = sys.argv[2]
model, meta = read_safetensors(d + "/model.safetensors")
optim, _ = read_safetensors(d + "/optim.safetensors")
assert meta.get("format") == "pt", meta
ins = json.load(open(sys.argv[3]))
man = json.load(open(d + "/manifest.json"))
for t in ins["tensors"]:
    src = model if t["kind"] == "model" else optim
    a = src[t["name"]]
    assert list(a.shape) == t["shape"], t["name"]
    assert abs(float(np.linalg.norm(a.astype(np.float64))) - t["norm"]) <= 1e-6 * max(1, t["norm"]), t["name"]
assert set(model) == {t["name"] for t in man["tensors"] if t["kind"] == "model"}
assert model["embedding.word_embeddings.weight"].shape == (512, 32)
EOF
    "$cohort" ckpt convert "$S" --to hf-gpt2 --output "$work/hf" >/dev/null || fail "convert"
    "$py" - "$work/st.py" "$S/iter_0000003" "$work/hf" <<'EOF' || fail "Hugging Face export wrong"
import json, sys
import numpy as np
exec(open(sys.argv[1]).read())
ours, _ = read_safetensors(sys.argv[2] + "/model.safetensors")
hf, meta = read_safetensors(sys.argv[3] + "/model.safetensors")
cfg = json.load(open(sys.argv[3] + "/config.json"))
assert meta["format"] == "pt" and cfg["model_type"] == "gpt2" and cfg["n_layer"] == 2 and cfg["n_embd"] == 32
# the padded vocabulary (500 + EOD -> 512) is kept: the softmax runs over cohort's logits
assert cfg["vocab_size"] == 512 and cfg["n_head"] == 4 and cfg["activation_function"] == "gelu_new"
assert cfg["eos_token_id"] == 500, cfg.get("eos_token_id")
p = "transformer."
assert hf[p + "wte.weight"].shape == (512, 32)
assert np.array_equal(hf[p + "wte.weight"], ours["embedding.word_embeddings.weight"])
assert np.array_equal(hf[p + "wpe.weight"], ours["embedding.position_embeddings.weight"])
for l in range(2):
    h, o = p + "h.%d." % l, "layers.%d." % l
    assert hf[h + "attn.c_attn.weight"].shape == (32, 96)
    assert np.array_equal(hf[h + "attn.c_attn.weight"], ours[o + "attention.qkv.weight"].T)
    assert np.array_equal(hf[h + "attn.c_attn.bias"], ours[o + "attention.qkv.bias"])
    assert np.array_equal(hf[h + "attn.c_proj.weight"], ours[o + "attention.proj.weight"].T)
    assert np.array_equal(hf[h + "mlp.c_fc.weight"], ours[o + "mlp.fc1.weight"].T)
    assert np.array_equal(hf[h + "mlp.c_proj.weight"], ours[o + "mlp.fc2.weight"].T)
    assert np.array_equal(hf[h + "ln_1.weight"], ours[o + "input_norm.weight"])
    assert np.array_equal(hf[h + "ln_2.bias"], ours[o + "mlp_norm.bias"])
assert np.array_equal(hf[p + "ln_f.weight"], ours["final_norm.weight"])
assert len(hf) == 2 + 12 * 2 + 2 and "lm_head.weight" not in hf
EOF
    ;;
hf_loss)
    # The Hugging Face export computes cohort's loss: a 30-step model whose vocabulary is
    # padded (NullTokenizer 500 + EOD = 501 -> 512), exported, and its mean loss on the
    # validation samples of the final evaluation computed by an independent numpy GPT-2
    # (tests/data/hf_gpt2_ref.py) from the HF tensor names, against cohort's evaluation loss.
    # The samples come from `cohort data order --items` with the very flags of the run: with
    # --eval-interval past --train-iters the final evaluation reads valid samples 0..7
    # (--eval-iters 2 x global batch 4).
    run=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 2 --hidden-size 32
         --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --lr 1e-3
         --train-iters 30 --eval-interval 1000 --eval-iters 2 --log-interval 10 --threads 2
         --data-cache-path "$work/cache")
    "$cohort" train "${run[@]}" --save "$S" --metrics-file "$work/m.jsonl" >"$work/t.out" 2>&1 ||
        fail "training: $(tail -3 "$work/t.out")"
    "$cohort" data order "${run[@]}" --split-name valid --count 8 --items >"$work/items" 2>&1 ||
        fail "data order: $(cat "$work/items")"
    "$cohort" ckpt convert "$S" --to hf-gpt2 --output "$work/hf" >/dev/null || fail "convert"
    "$cohort" ckpt convert "$S" --to hf-gpt2 --output "$work/hft" --trim-vocab >/dev/null || fail "convert --trim-vocab"
    "$cohort" ckpt convert --help | grep -q -- "--trim-vocab .*drop the padded rows" || fail "--trim-vocab not in --help"
    "$cohort" ckpt inspect "$S" --trim-vocab >/dev/null 2>&1; [ $? -eq 2 ] || fail "--trim-vocab accepted by inspect"
    PYTHONPATH="$src/tests/data" "$py" - "$work" <<'EOF' || fail "exported model's loss differs from cohort's"
import json, sys
import hf_gpt2_ref as R
w = sys.argv[1]
ev = [json.loads(l) for l in open(w + "/m.jsonl") if '"evaluation":"valid"' in l]
assert len(ev) == 1 and ev[0]["iteration"] == 30, ev
ours = ev[0]["lm_loss"]
items = R.read_items(w + "/items")
assert [it["sample"] for it in items] == list(range(8)), [it["sample"] for it in items]
assert all(len(it["tokens"]) == 32 and it["mask"].sum() == 32 for it in items)
cfg, wt = R.load(w + "/hf")
assert cfg["vocab_size"] == 512 and wt["wte.weight"].shape == (512, 32), cfg["vocab_size"]
full, n = R.mean_loss(cfg, wt, items)
assert n == 8 * 32, n
cfg_t, wt_t = R.load(w + "/hft")
assert cfg_t["vocab_size"] == 501 and wt_t["wte.weight"].shape == (501, 32), cfg_t["vocab_size"]
assert (wt_t["wte.weight"] == wt["wte.weight"][:501]).all()
trim, _ = R.mean_loss(cfg_t, wt_t, items)
print("cohort %.9e  numpy (padded vocabulary) %.9e  numpy (--trim-vocab) %.9e" % (ours, full, trim))
assert abs(full - ours) <= 1e-4 * abs(ours), "padded export: %.9e vs cohort %.9e" % (full, ours)
# the test sees the difference the padding makes: trimming removes terms from the softmax
# denominator, so the loss is lower, by far more than the tolerance
assert trim < ours - 1e-3 * abs(ours), "trimmed export: %.9e vs cohort %.9e" % (trim, ours)
EOF
    ;;
lock)
    # one job per save directory (checkpoint/lock.h): a 2-rank supervised job holds one lock
    # (the supervisor's; its workers share it and do not conflict), a second job on the same
    # --save is refused (exit 2) naming the holder, the lock goes at the end
    host=$(hostname)
    # (the binary itself in the background, not the train function: $! is then its pid)
    "$cohort" train "${tiny[@]}" "${dp[@]}" --nproc-per-node 2 --train-iters 600 --log-interval 100 --eval-interval 1000 --save "$S" \
        >"$work/a.out" 2>&1 &
    a=$!
    wait_until 15 grep -q '^started=' "$S/.cohort.lock"
    [ -s "$S/.cohort.lock" ] || fail "no lock file while the job runs: $(tail -3 "$work/a.out")"
    grep -qx "pid=$a" "$S/.cohort.lock" && grep -qx "host=$host" "$S/.cohort.lock" ||
        fail "the lock does not name the supervisor (pid $a on $host): $(cat "$S/.cohort.lock")"
    job=$(sed -n 's/^job=\([0-9a-f]\{16\}\)$/\1/p' "$S/.cohort.lock")
    [ -n "$job" ] || fail "no job id in the lock: $(cat "$S/.cohort.lock")"
    train --train-iters 2 --save "$S" >"$work/b.out" 2>"$work/b.err"; rc=$?
    [ $rc -eq 2 ] || fail "second job: exit $rc, want 2: $(cat "$work/b.err")"
    grep -q -- "--save $S is in use: locked by job $job (pid $a on $host, since " "$work/b.err" ||
        fail "the refusal does not name the holder: $(cat "$work/b.err")"
    ! grep -q "iteration" "$work/b.out" || fail "the second job trained"
    kill -0 $a 2>/dev/null || fail "the first job died: $(tail -5 "$work/a.out")"
    wait $a || fail "the 2-rank job failed: $(tail -5 "$work/a.out")"
    grep -q "successfully saved checkpoint from iteration *600" "$work/a.out" && [ "$(tracker)" = 600 ] ||
        fail "no final save: $(tail -5 "$work/a.out")"
    [ ! -e "$S/.cohort.lock" ] || fail "the lock outlived its job"
    # a stale lock: its holder killed (SIGKILL leaves the file); the next job takes it over
    "$cohort" train "${tiny[@]}" --train-iters 100000 --save "$work/s2" --save-interval 100000 >/dev/null 2>&1 &
    k=$!
    wait_until 15 grep -q '^started=' "$work/s2/.cohort.lock"
    grep -qx "pid=$k" "$work/s2/.cohort.lock" || fail "no lock of pid $k"
    kill -9 $k; wait $k 2>/dev/null
    old=$(sed -n 's/^job=//p' "$work/s2/.cohort.lock")
    train --train-iters 3 --save "$work/s2" >"$work/c.out" 2>"$work/c.err" || fail "stale lock: $(cat "$work/c.err")"
    grep -q -- "--save $work/s2: taking over the stale lock of job $old (pid $k on $host, since .*): that process is gone" \
        "$work/c.err" || fail "no takeover line: $(cat "$work/c.err")"
    grep -q "iteration        3/" "$work/c.out" || fail "did not train after the takeover"
    [ ! -e "$work/s2/.cohort.lock" ] || fail "the lock outlived the job that took it over"
    # a lock file of another host is not taken over: this host cannot tell whether it runs
    printf 'job=far\npid=1\nhost=elsewhere.invalid\nstarted=1\n' >"$work/s2/.cohort.lock"
    train --train-iters 2 --save "$work/s2" >"$work/d.out" 2>"$work/d.err"; rc=$?
    [ $rc -eq 2 ] && grep -q "names job far (pid 1 on elsewhere.invalid.*another host.*remove $work/s2/.cohort.lock" \
        "$work/d.err" || fail "another host's lock: exit $rc: $(cat "$work/d.err")"
    ;;
mismatch)
    # --load against a model the flags describe differently: refused (exit 2) naming what
    # differs, nothing trained; --use-checkpoint-args loads it
    train --train-iters 2 --save "$S" >"$work/0.out" 2>&1 || fail "first run: $(tail -3 "$work/0.out")"
    refused() { # what, expected message, flags
        local what=$1 msg=$2; shift 2
        train --train-iters 4 --load "$S" "$@" >"$work/r.out" 2>"$work/r.err"; local rc=$?
        [ $rc -eq 2 ] || fail "$what: exit $rc, want 2: $(cat "$work/r.err")"
        grep -qF -- "$msg" "$work/r.err" || fail "$what: the difference is not named: $(cat "$work/r.err")"
        ! grep -q "iteration  *[0-9]*/" "$work/r.out" || fail "$what: trained"
        train --train-iters 4 --load "$S" "$@" --use-checkpoint-args >"$work/u.out" 2>&1 ||
            fail "$what --use-checkpoint-args: $(tail -3 "$work/u.out")"
        grep -q "successfully loaded checkpoint .* at iteration 2" "$work/u.out" && grep -q "iteration        3/" "$work/u.out" ||
            fail "$what --use-checkpoint-args did not resume: $(tail -3 "$work/u.out")"
    }
    refused "fewer layers" "checkpoint has 2 layers, --num-layers is 1" --num-layers 1
    refused "more layers" "checkpoint has 2 layers, --num-layers is 3" --num-layers 3
    refused "heads" "checkpoint has 4 attention heads, --num-attention-heads is 2" --num-attention-heads 2
    refused "hidden" "checkpoint has hidden size 32, --hidden-size is 64" --hidden-size 64
    refused "vocabulary" "checkpoint has a vocabulary of 501, the tokenizer's (--tokenizer-type/--vocab-size/--vocab-file) is 301" --vocab-size 300
    # a tensor the model does not have (a manifest that claims 1 layer but holds 2)
    cp -r "$S" "$work/x"
    "$py" -c "
import json,sys; p=sys.argv[1]; m=json.load(open(p)); m['model']['num_layers']=1; json.dump(m,open(p,'w'))" \
        "$work/x/iter_0000002/manifest.json" || fail "editing the manifest"
    train --train-iters 4 --load "$work/x" --num-layers 1 >"$work/e.out" 2>"$work/e.err"; rc=$?
    [ $rc -eq 2 ] && grep -q "the checkpoint has tensor layers.1.[a-z_.]*, which the model does not have" "$work/e.err" ||
        fail "extra tensor: exit $rc: $(cat "$work/e.err")"
    ;;
ckpt_step_missing)
    train --train-iters 10 --save "$S" --save-interval 5 >/dev/null 2>&1 || fail "first run"
    for extra in "" "--use-checkpoint-args"; do
        train --train-iters 20 --load "$S" --ckpt-step 15 $extra >"$work/1.out" 2>"$work/1.err"; rc=$?
        [ $rc -eq 2 ] || fail "--ckpt-step 15 $extra: exit $rc, want 2: $(tail -3 "$work/1.out")"
        grep -q -- "--ckpt-step 15: $S has no checkpoint at iteration 15 (it has 5, 10)" "$work/1.err" ||
            fail "--ckpt-step 15 $extra: $(cat "$work/1.err")"
        ! grep -q "successfully loaded\|iteration  *1[1-9]/" "$work/1.out" || fail "--ckpt-step 15 $extra loaded or trained"
    done
    train --train-iters 8 --load "$S" --ckpt-step 5 >"$work/2.out" 2>&1 || fail "--ckpt-step 5: $(tail -3 "$work/2.out")"
    grep -q "successfully loaded checkpoint .* at iteration 5" "$work/2.out" || fail "--ckpt-step 5 did not load 5"
    ;;
save_unusable)
    # found before the first step (a probe file created and removed), exit 2
    unusable() { # what, save path, expected message
        train --train-iters 2 --save "$2" >"$work/u.out" 2>"$work/u.err"; local rc=$?
        [ $rc -eq 2 ] || fail "$1: exit $rc, want 2: $(cat "$work/u.err")"
        grep -qF -- "$3" "$work/u.err" || fail "$1: $(cat "$work/u.err")"
        ! grep -q "iteration\|cohort: model" "$work/u.out" || fail "$1: work started: $(head -3 "$work/u.out")"
    }
    : >"$work/file"
    unusable "a file" "$work/file" "--save $work/file: not a directory"
    unusable "under a file" "$work/file/s" "--save $work/file/s: cannot create the directory"
    # sysfs takes no new files, not even from root
    unusable "sysfs" /sys "--save /sys: cannot create a file there"
    if [ "$(id -u)" -ne 0 ]; then
        mkdir "$work/ro"; chmod 555 "$work/ro"
        unusable "read-only directory" "$work/ro" "--save $work/ro: cannot create a file there: Permission denied"
    fi
    # a usable one is made and left with its checkpoint, and no probe or lock behind
    train --train-iters 2 --save "$work/new/deep" >/dev/null 2>&1 || fail "a new --save"
    [ -d "$work/new/deep/iter_0000002" ] || fail "no checkpoint in the new --save"
    [ -z "$(ls -A "$work/new/deep" | grep '^\.cohort')" ] || fail "left: $(ls -A "$work/new/deep")"
    ;;
dp_layout)
    # 2 and 4 ranks: each rank writes its own files (the manifest says which), the checkpoint
    # verifies, the tools read it, numpy reads every shard, and the weights and the Hugging
    # Face export agree with one process's
    train "${dp[@]}" --train-iters 3 --save "$work/one" >"$work/one.out" 2>&1 || fail "1 rank: $(tail -3 "$work/one.out")"
    "$cohort" ckpt convert "$work/one" --to hf-gpt2 --output "$work/hf1" >/dev/null || fail "1 rank: convert"
    for n in 2 4; do
        train "${dp[@]}" --nproc-per-node $n --train-iters 3 --save "$work/s$n" >"$work/o$n" 2>&1 ||
            fail "$n ranks: $(tail -5 "$work/o$n")"
        d=$work/s$n/iter_0000003
        "$cohort" ckpt verify "$work/s$n" >"$work/v$n" 2>&1 || fail "$n ranks: verify: $(cat "$work/v$n")"
        "$py" - "$d" $n <<'PY' || fail "$n ranks: layout"
import json, os, sys
d, n = sys.argv[1], int(sys.argv[2])
m = json.load(open(d + "/manifest.json"))
assert m["parallel"]["writers"] == n and m["parallel"]["data"] == n, m["parallel"]
files = m["files"]
assert sorted(f["writer"] for f in files) == sorted(list(range(n)) * 2), files
for f in files:
    want = "%s-%05d-of-%05d.safetensors" % (f["kind"], f["writer"] + 1, n)
    assert f["name"] == want, (f["name"], want)
    assert os.path.getsize(d + "/" + f["name"]) == f["size"]
assert sorted(os.listdir(d)) == sorted(["manifest.json"] + [f["name"] for f in files]), os.listdir(d)
PY
        grep -q "successfully saved checkpoint from iteration        3" "$work/o$n" || fail "$n ranks: no save line: $(tail -5 "$work/o$n")"
        ! ls -d "$work/s$n"/iter_*.tmp-* 2>/dev/null | grep . >/dev/null || fail "$n ranks: leftovers: $(ls "$work/s$n")"
        "$cohort" ckpt ls "$work/s$n" | grep "^3 .*complete .*latest" >/dev/null || fail "ls: $("$cohort" ckpt ls "$work/s$n")"
        "$cohort" ckpt inspect "$work/s$n" --json | "$py" -c "
import json,sys; d=json.load(sys.stdin); assert len(d['tensors'])==84 and all(t['norm']>0 for t in d['tensors'] if t['kind']=='model')" ||
            fail "$n ranks: inspect"
        # the same tensors as one process's, within fp32 rounding of the data-parallel sums
        "$cohort" ckpt diff "$work/one" "$work/s$n" --json >"$work/d$n" 2>&1; rc=$?
        [ $rc -le 1 ] || fail "$n ranks: diff: $(head -3 "$work/d$n")"
        "$py" - "$work/d$n" <<'PY' || fail "$n ranks: tensors differ from one process's: $(head -c 600 "$work/d$n")"
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["tensors"]
assert len(rows) == 84, len(rows)
for r in rows:
    assert r["status"] in ("bitwise equal", "differs"), r
    assert r["status"] == "bitwise equal" or r["max_abs"] < 1e-4, r
PY
        # every shard read by the 20-line reader; together they hold each tensor exactly once
        "$py" - "$work/st.py" "$d" <<'PY' || fail "$n ranks: shards unreadable by a plain safetensors reader"
import json, sys
import numpy as np
exec(open(sys.argv[1]).read())
d = sys.argv[2]
m = json.load(open(d + "/manifest.json"))
parts = [read_safetensors(d + "/" + f["name"])[0] for f in m["files"]]
for t in m["tensors"]:
    full = np.full(t["shape"], np.nan, dtype=np.float32)
    for s in t["slices"]:
        a = parts[s["file"]][s["key"]]
        sl = tuple(slice(o, o + k) for o, k in zip(s["offsets"], s["shape"]))
        assert np.isnan(full[sl]).all(), t["name"]
        full[sl] = a
    assert not np.isnan(full).any(), t["name"]
PY
        "$cohort" ckpt convert "$work/s$n" --to hf-gpt2 --output "$work/hf$n" >/dev/null || fail "$n ranks: convert"
        cmp -s "$work/hf1/config.json" "$work/hf$n/config.json" || fail "$n ranks: config.json differs"
        [ "$(wc -c <"$work/hf$n/model.safetensors")" = "$(wc -c <"$work/hf1/model.safetensors")" ] || fail "$n ranks: export size"
    done
    ;;
dp_crash_*)
    # a kill at one phase of a multi-rank save: the case is dp_crash_PHASE@WHO (WHO: a rank,
    # or sv for the supervisor)
    spec=${case_name#dp_crash_}; phase=${spec%@*}; who=${spec#*@}
    train "${dp[@]}" --nproc-per-node 2 --train-iters 2 --save "$S" >"$work/1.out" 2>&1 || fail "first run: $(tail -3 "$work/1.out")"
    # (without in-process restart: a replacement would inherit the crash point and die again;
    # the fault suite covers kills under restart)
    COHORT_CKPT_CRASH_AT="$phase@$who" train "${dp[@]}" --nproc-per-node 2 --train-iters 4 --load "$S" --save "$S" \
        --save-interval 2 --most-recent-k 1 --no-inprocess-restart >"$work/2.out" 2>&1; rc=$?
    grep -q "COHORT_CKPT_CRASH_AT=$phase: killing the process" "$work/2.out" || fail "no kill at $phase: $(tail -5 "$work/2.out")"
    if [ "$who" = sv ]; then want_rc=137; else want_rc=4; fi
    [ $rc -eq $want_rc ] || fail "kill at $phase@$who: exit $rc, want $want_rc: $(tail -5 "$work/2.out")"
    # the orphaned workers of a killed supervisor notice and end
    for _ in $(seq 300); do
        left=$(grep -l -- "${S%save}[s]ave" /proc/[0-9]*/cmdline 2>/dev/null | wc -l) # ([s]: not grep itself)
        [ "$left" -eq 0 ] && break; sleep 0.1
    done
    [ "$left" -eq 0 ] || fail "workers still running 30 s after the supervisor was killed"
    case $phase in
    tracker|prune) want=4 ;;
    acked) want=$(tracker); [ "$want" = 2 ] || [ "$want" = 4 ] || fail "tracker '$want'" ;;
    *) want=2 ;;
    esac
    [ "$(tracker)" = "$want" ] || fail "after a kill at $phase@$who the tracker says '$(tracker)', want $want"
    "$cohort" ckpt verify "$S" >"$work/v.out" 2>&1 || fail "the tracker's checkpoint does not verify: $(cat "$work/v.out")"
    if [ "$phase" = renamed ] || [ "$phase" = committed ]; then
        "$cohort" ckpt verify "$S/iter_0000004" >/dev/null || fail "iter_4 renamed but incomplete"
    fi
    # a killed worker's save is aborted by the supervisor, which removes the directory
    [ "$who" = sv ] || ! ls -d "$S"/iter_*.tmp-* 2>/dev/null | grep . >/dev/null || fail "temporary directory left: $(ls "$S")"
    # resuming loads the tracker's checkpoint and finishes; leftovers are cleaned
    train "${dp[@]}" --nproc-per-node 2 --train-iters 6 --load "$S" --save "$S" --save-interval 2 --most-recent-k 1 \
        >"$work/3.out" 2>&1 || fail "resume after a kill at $phase@$who: $(tail -5 "$work/3.out")"
    grep -q "successfully loaded checkpoint .* at iteration $want" "$work/3.out" || fail "resumed from the wrong place: $(grep -i load "$work/3.out")"
    [ "$(tracker)" = 6 ] || fail "final tracker $(tracker)"
    ! ls -d "$S"/iter_*.tmp-* "$S"/iter_*.del-* 2>/dev/null | grep . >/dev/null || fail "leftovers: $(ls "$S")"
    [ "$(ls -d "$S"/iter_* | wc -l)" -eq 1 ] || fail "--most-recent-k 1 kept: $(ls "$S")"
    "$cohort" ckpt verify "$S" >/dev/null || fail "final checkpoint does not verify"
    ;;
dp_enospc|dp_eio_async)
    # one rank's write fails: the supervisor aborts that checkpoint, removes its temporary
    # directory, says why, and the job stops (as one process stops on a failing save): at
    # once with 1 on a full disk (no restart cures it), with 4 after the restarts on EIO
    train "${dp[@]}" --nproc-per-node 2 --train-iters 2 --save "$S" >"$work/1.out" 2>&1 || fail "first run"
    # rank 1's second write: its optimizer file (each small file is one write)
    spec=2@1; msg="No space left on device"; extra=(); want=1
    [ "$case_name" = dp_eio_async ] && { spec=2:5@0; msg="Input/output error"; extra=(--async-save); want=4; }
    COHORT_CKPT_FAIL_WRITE=$spec train "${dp[@]}" --nproc-per-node 2 --train-iters 4 --load "$S" --save "$S" \
        "${extra[@]}" >"$work/2.out" 2>&1; rc=$?
    [ $rc -eq $want ] || fail "failing write on rank ${spec#*@}: exit $rc, want $want: $(tail -5 "$work/2.out")"
    grep -q "checkpoint at iteration 4 aborted: rank ${spec#*@} failed to write its part: .*safetensors.*$msg" "$work/2.out" ||
        fail "no clear message: $(cat "$work/2.out")"
    grep -q "removed .*iter_0000004.tmp-" "$work/2.out" || fail "temporary directory not reported removed"
    [ "$(tracker)" = 2 ] || fail "tracker moved: $(tracker)"
    [ ! -e "$S/iter_0000004" ] || fail "a failed save left iter_4"
    ! ls -d "$S"/iter_*.tmp-* 2>/dev/null | grep . >/dev/null || fail "temporary directory left: $(ls "$S")"
    "$cohort" ckpt verify "$S" >/dev/null || fail "previous checkpoint damaged"
    ;;
tools_output)
    # convert never writes into a checkpoint or save directory it would damage, nor moves a
    # tracker back, nor writes into a save directory a live job holds
    train --train-iters 4 --save "$S" --save-interval 2 >/dev/null 2>&1 || fail "training"
    cp "$S/iter_0000004/model.safetensors" "$work/model.orig"
    refused() { # what, expected message, convert arguments
        local what=$1 msg=$2; shift 2
        "$cohort" ckpt convert "$@" >"$work/r.out" 2>"$work/r.err"; local rc=$?
        [ $rc -eq 2 ] || fail "$what: exit $rc, want 2: $(cat "$work/r.err")"
        grep -qF -- "$msg" "$work/r.err" || fail "$what: unclear refusal: $(cat "$work/r.err")"
    }
    refused "the source itself" "--output $S/iter_0000004 is the checkpoint directory $(realpath "$S")/iter_0000004" \
        "$S/iter_0000004" --to hf-gpt2 --output "$S/iter_0000004"
    refused "the save directory" "--output $S is the save directory" "$S" --to hf-gpt2 --output "$S"
    refused "inside a save directory" "--output $S/hf lies inside the save directory" "$S" --to hf-gpt2 --output "$S/hf"
    refused "inside a checkpoint" "lies inside the checkpoint directory" "$S" --to cohort --tensor-model-parallel-size 1 \
        --output "$S/iter_0000002/x"
    cmp -s "$work/model.orig" "$S/iter_0000004/model.safetensors" || fail "the checkpoint's model.safetensors was overwritten"
    [ ! -e "$S/hf" ] && [ ! -e "$S/iter_0000002/x" ] || fail "a refused convert created its output: $(ls -R "$S")"
    "$cohort" ckpt verify "$S" >/dev/null || fail "the checkpoint does not verify after the refusals"
    # the tracker never moves back: iteration 2 into a save directory at 4
    refused "an older iteration" "--output $S holds iteration 4 (its tracker's), later than iteration 2" \
        "$S" --iteration 2 --to cohort --tensor-model-parallel-size 1 --output "$S"
    [ "$(tracker)" = 4 ] || fail "the tracker moved to $(tracker)"
    "$cohort" ckpt convert "$S" --to cohort --tensor-model-parallel-size 2 --output "$work/s2" >/dev/null ||
        fail "convert of iteration 4"
    refused "an older iteration, newest checkpoint without a tracker" "--output $work/s2 holds iteration 4" \
        "$S" --iteration 2 --to cohort --tensor-model-parallel-size 1 --output "$work/s2"
    [ "$(cat "$work/s2/latest_checkpointed_iteration.txt")" = 4 ] || fail "s2's tracker moved"
    [ ! -e "$work/s2/iter_0000002" ] || fail "iteration 2 written behind the newer one"
    # a save directory a live job holds
    "$cohort" train "${tiny[@]}" --train-iters 100000 --save "$work/live" --save-interval 100000 >"$work/live.out" 2>&1 &
    k=$!
    wait_until 15 grep -q '^started=' "$work/live/.cohort.lock"
    grep -qx "pid=$k" "$work/live/.cohort.lock" || fail "no lock of pid $k: $(tail -3 "$work/live.out")"
    refused "a live job's save directory" "--output $work/live is in use: locked by job" \
        "$S" --to cohort --tensor-model-parallel-size 1 --output "$work/live"
    [ -z "$(ls "$work/live")" ] || fail "convert wrote into a live job's save directory: $(ls "$work/live")"
    kill -0 $k || fail "the live job died"
    kill -9 $k; wait $k 2>/dev/null
    ;;
tools_prune_live)
    # prune beside a job stopped in the middle of a save (COHORT_CKPT_STOP_AT): its
    # temporary directory, and a supervised job's token-named one, are kept while it holds
    # the lock; the job then finishes; stale leftovers are removed and listed apart
    train --train-iters 4 --save "$S" --save-interval 2 >/dev/null 2>&1 || fail "training"
    COHORT_CKPT_STOP_AT=1 "$cohort" train "${tiny[@]}" --train-iters 8 --load "$S" --save "$S" --save-interval 2 \
        >"$work/job.out" 2>&1 &
    k=$!
    for _ in $(seq 300); do [ "$(awk '{print $3}' /proc/$k/stat 2>/dev/null)" = T ] && break; sleep 0.05; done
    [ "$(awk '{print $3}' /proc/$k/stat)" = T ] || fail "the job did not stop in its save: $(tail -3 "$work/job.out")"
    live=$(basename "$S"/iter_0000006.tmp-$k)
    [ -d "$S/$live" ] || fail "no temporary directory of the job: $(ls "$S")"
    true & dead=$!; wait $dead
    mkdir "$S/iter_0000006.tmp-job00000000000000ab" "$S/iter_0000003.tmp-$dead"
    "$cohort" ckpt prune "$S" --keep 1 >"$work/p1" 2>&1 || fail "prune beside the job: $(cat "$work/p1")"
    [ -d "$S/$live" ] && [ -d "$S/iter_0000006.tmp-job00000000000000ab" ] && [ -d "$S/iter_0000003.tmp-$dead" ] ||
        fail "prune removed a temporary directory while the job holds the lock: $(cat "$work/p1")"
    grep -q "kept temporary directory $live: the save directory is locked by job .*(pid $k " "$work/p1" ||
        fail "the live directory is not reported kept: $(cat "$work/p1")"
    grep -q "^removed iteration 2$" "$work/p1" && grep -q "^1 checkpoint removed; 0 stale temporary directories removed, 3 kept" \
        "$work/p1" || fail "prune's report: $(cat "$work/p1")"
    kill -CONT $k
    wait $k || fail "the job died after the prune: $(tail -5 "$work/job.out")"
    [ "$(tracker)" = 8 ] || fail "the job's saves did not complete: tracker $(tracker)"
    # the job gone: its leftovers are stale; a running process's is kept
    mkdir "$S/iter_0000009.tmp-$$"
    "$cohort" ckpt prune "$S" --keep 2 --dry-run >"$work/p2" 2>&1 || fail "prune --dry-run: $(cat "$work/p2")"
    grep -q "would remove stale temporary directory iter_0000003.tmp-$dead" "$work/p2" && [ -d "$S/iter_0000003.tmp-$dead" ] ||
        fail "prune --dry-run: $(cat "$work/p2")"
    "$cohort" ckpt prune "$S" --keep 2 --json >"$work/p3" 2>&1 || fail "prune after the job: $(cat "$work/p3")"
    "$py" - "$work/p3" "$dead" $$ <<'PY' || fail "prune's report after the job: $(cat "$work/p3")"
import json, sys
d = json.load(open(sys.argv[1]))
dead, me = sys.argv[2], sys.argv[3]
assert d["removed"] == [4], d
assert sorted(d["temporary_removed"]) == sorted(["iter_0000003.tmp-" + dead, "iter_0000006.tmp-job00000000000000ab"]), d
assert d["temporary_removed_count"] == 2 and d["temporary_kept_count"] == 1, d
assert d["temporary_kept"][0]["name"] == "iter_0000009.tmp-" + me and "running" in d["temporary_kept"][0]["why"], d
PY
    [ ! -e "$S/iter_0000003.tmp-$dead" ] && [ ! -e "$S/iter_0000006.tmp-job00000000000000ab" ] && [ -d "$S/iter_0000009.tmp-$$" ] ||
        fail "after prune: $(ls "$S")"
    [ ! -e "$S/.cohort.lock" ] || fail "prune left its lock"
    ;;
tools_signal)
    # SIGINT/SIGTERM in the middle of a convert (stopped at its 3rd write by
    # COHORT_CKPT_STOP_AT) remove its temporary files; a SIGKILL's leftovers are removed and
    # reported by the next convert into that output
    train --train-iters 2 --save "$S" >/dev/null 2>&1 || fail "training"
    stopped_convert() { # output, convert arguments...; sets $k
        COHORT_CKPT_STOP_AT=3 "$cohort" ckpt convert "$S" --output "$@" >"$work/c.out" 2>"$work/c.err" &
        k=$!
        for _ in $(seq 300); do [ "$(awk '{print $3}' /proc/$k/stat 2>/dev/null)" = T ] && break; sleep 0.05; done
        [ "$(awk '{print $3}' /proc/$k/stat)" = T ] || fail "convert did not stop: $(cat "$work/c.err")"
    }
    hf=(--to hf-gpt2); co=(--to cohort --tensor-model-parallel-size 2)
    stopped_convert "$work/hf" "${hf[@]}"
    ls "$work/hf"/model.safetensors.tmp-$k >/dev/null || fail "no temporary file while converting: $(ls "$work/hf")"
    kill -INT $k; kill -CONT $k; wait $k; rc=$?
    [ $rc -eq 130 ] || fail "convert after SIGINT: exit $rc, want 130: $(cat "$work/c.err")"
    grep -q "interrupted by SIGINT" "$work/c.err" || fail "$(cat "$work/c.err")"
    [ -z "$(ls "$work/hf")" ] || fail "SIGINT left: $(ls "$work/hf")"
    stopped_convert "$work/s2" "${co[@]}"
    [ -d "$work/s2/iter_0000002.tmp-$k" ] || fail "no temporary directory while converting: $(ls -a "$work/s2")"
    kill -TERM $k; kill -CONT $k; wait $k; rc=$?
    [ $rc -eq 143 ] || fail "convert after SIGTERM: exit $rc, want 143: $(cat "$work/c.err")"
    [ ! -e "$work/s2" ] || fail "SIGTERM left: $(ls -a "$work/s2")"
    # killed: the next run removes the dead process's files and says so
    for t in hf co; do
        out=$work/k_$t; eval "args=(\"\${$t[@]}\")"
        stopped_convert "$out" "${args[@]}"
        kill -9 $k; wait $k 2>/dev/null
        left=$(cd "$out" && ls -d *.tmp-$k) || fail "$t: nothing left by the killed convert"
        "$cohort" ckpt convert "$S" --output "$out" "${args[@]}" >"$work/c2.out" 2>"$work/c2.err" ||
            fail "$t: convert after a kill: $(cat "$work/c2.err")"
        grep -q "removed $out/$left, left by an interrupted process that is no longer running" "$work/c2.err" ||
            fail "$t: stale leftover not reported: $(cat "$work/c2.err")"
        ! ls -d "$out"/*.tmp-* 2>/dev/null | grep . >/dev/null || fail "$t: leftovers: $(ls -a "$out")"
    done
    grep -q "taking over the stale lock of job ckpt-convert" "$work/c2.err" || fail "stale lock: $(cat "$work/c2.err")"
    "$cohort" ckpt verify "$work/k_co" >/dev/null || fail "the convert after the kill does not verify"
    [ -s "$work/k_hf/model.safetensors" ] && [ -s "$work/k_hf/config.json" ] || fail "export after the kill: $(ls "$work/k_hf")"
    ;;
tools_model_tracker)
    # verify checks the manifest's model description against the tensors; a garbage tracker
    # is named with what it holds (ls, inspect, verify, the loader)
    train --train-iters 2 --save "$S" >/dev/null 2>&1 || fail "training"
    edited() { # field value: a copy of the checkpoint whose manifest says model.field = value
        rm -rf "$work/e"; cp -r "$S/iter_0000002" "$work/e"
        "$py" -c "
import json,sys; p=sys.argv[1]; m=json.load(open(p)); m['model'][sys.argv[2]]=int(sys.argv[3]); json.dump(m,open(p,'w'))" \
            "$work/e/manifest.json" "$1" "$2" || fail "editing the manifest"
    }
    for spec in "hidden 128|hidden = 128 but tensor embedding.word_embeddings.weight has shape [512, 32]" \
                "num_layers 3|num_layers = 3 but the tensors hold 2 layers" \
                "ffn_hidden 64|ffn_hidden = 64 but tensor layers.0.mlp.fc1.weight has shape [128, 32]" \
                "head_dim 16|(heads + 2 x kv_groups) x head_dim = 192 but tensor layers.0.attention.qkv.weight has shape [96, 32]"; do
        field=${spec%%|*}; msg=${spec#*|}
        edited $field
        "$cohort" ckpt verify "$work/e" >"$work/v" 2>&1; rc=$?
        [ $rc -eq 3 ] || fail "verify with model.$field: exit $rc, want 3: $(cat "$work/v")"
        grep -qF "manifest.json                            malformed: the model description says $msg" "$work/v" ||
            fail "verify with model.$field: the mismatch is not named: $(cat "$work/v")"
    done
    "$cohort" ckpt verify "$work/e" --json >"$work/v.json"; [ $? -eq 3 ] || fail "verify --json: exit status"
    "$py" -c "
import json,sys; d=json.load(open(sys.argv[1])); f=d['files'][0]
assert d['code']==3 and f['file']=='manifest.json' and 'head_dim' in f['detail'] and len(d['files'])==3, d" "$work/v.json" ||
        fail "verify --json: $(cat "$work/v.json")"
    "$cohort" ckpt verify "$S" >/dev/null || fail "the unedited checkpoint does not verify"
    echo abc >"$S/latest_checkpointed_iteration.txt"
    msg="$S/latest_checkpointed_iteration.txt holds 'abc', not an iteration number"
    "$cohort" ckpt ls "$S" >"$work/ls" 2>&1 || fail "ls: $(cat "$work/ls")"
    grep -qF "tracker unreadable: $msg" "$work/ls" && ! grep -q "(no latest" "$work/ls" || fail "ls: $(cat "$work/ls")"
    for t in inspect verify; do
        "$cohort" ckpt $t "$S" >/dev/null 2>"$work/t"; rc=$?
        [ $rc -eq 3 ] && grep -qF "$msg" "$work/t" || fail "$t with a garbage tracker: exit $rc: $(cat "$work/t")"
    done
    train --train-iters 3 --load "$S" >"$work/l.out" 2>&1 || fail "load: $(tail -3 "$work/l.out")"
    grep -qF "WARNING: $msg" "$work/l.out" || fail "the loader does not name the garbage: $(grep -i warn "$work/l.out")"
    ;;
*) fail "unknown case $case_name" ;;
esac
exit 0
