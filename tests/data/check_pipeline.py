"""Checks of `cohort data` against numpy references: check_pipeline.py COHORT CASE WORKDIR

  preprocess  .bin/.idx byte-identical to preprocess_ref (Megatron's writer) for the byte and
              Null tokenizers (uint16 and int32 by the dtype rule), lists of sentences, empty
              documents, several keys, --append-eod, 1 and 3 workers
  blend       `cohort data order` of weighted blends (--data-path, and per-split paths) equal
              to blend_ref's (dataset, dataset sample, document position, offset), every split
  sft         packed SFT items (tokens, labels, loss mask, positions, seg) equal to blend_ref's
  items       `data order --items` with every combination of --eod-mask-loss,
              --reset-position-ids and --reset-attention-mask: tokens equal to gpt_order_ref's,
              loss mask, positions and attention mask (from seg) equal to Megatron's
Exit 0 pass, 1 fail, 77 skip when numpy is missing (1 under CI=true)."""
import json
import os
import random
import subprocess
import sys

try:
    import numpy
except ImportError:
    print("numpy is not installed for", sys.executable)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blend_ref  # noqa: E402
import gpt_order_ref  # noqa: E402
import indexed_ref  # noqa: E402
import preprocess_ref  # noqa: E402

COHORT, CASE, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)
    return cond


def run(*args):
    p = subprocess.run([COHORT] + [str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("cohort %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr))
    return p.stdout


def same_files(a, b, what):
    for ext in (".bin", ".idx"):
        x = open(a + ext, "rb").read()
        y = open(b + ext, "rb").read()
        check(x == y, "%s%s byte-identical (%d vs %d bytes)" % (what, ext, len(x), len(y)))


def case_preprocess():
    rng = random.Random(5)
    path = os.path.join(WORK, "in.jsonl")
    words = ["alpha", "beta", "γάμμα", "дельта", "😀", "x" * 300, "", " ", "\n\t"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(3000):
            def val():
                r = rng.random()
                if r < 0.1:
                    return ""
                if r < 0.25:
                    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(0, 4))]
                return " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
            f.write(json.dumps({"text": val(), "other": val(), "n": i}, ensure_ascii=rng.random() < 0.5) + "\n")
    byte_tok = lambda s: list(s.encode("utf-8"))  # noqa: E731
    for workers in (1, 3):
        for eod in (False, True):
            out = os.path.join(WORK, "c%d%d" % (workers, eod))
            args = ["data", "preprocess", "--input", path, "--output-prefix", out, "--json-keys", "text", "other",
                    "--tokenizer-type", "ByteLevelTokenizer", "--workers", workers, "--quiet"]
            run(*(args + (["--append-eod"] if eod else [])))
            ref = os.path.join(WORK, "r%d%d" % (workers, eod))
            preprocess_ref.preprocess(path, ref, ["text", "other"], byte_tok, 256, 257, eod)
            for k in ("text", "other"):
                same_files("%s_%s_document" % (out, k), "%s_%s_document" % (ref, k),
                           "byte tokenizer, %d workers, eod %s, key %s" % (workers, eod, k))
    # NullTokenizer around Megatron's dtype rule: uint16 below 65500 entries, else int32
    npath = os.path.join(WORK, "null.jsonl")
    with open(npath, "w") as f:
        for i in range(500):
            f.write(json.dumps({"text": " ".join(str(rng.randrange(65498)) for _ in range(rng.randint(0, 30)))}) + "\n")
    for vocab_arg, code in ((65498, 8), (65499, 4), (70000, 4)):
        # the vocabulary is --vocab-size + 1 (EOD): 65499 entries -> uint16, 65500 -> int32
        out, ref = os.path.join(WORK, "n%d" % vocab_arg), os.path.join(WORK, "nr%d" % vocab_arg)
        run("data", "preprocess", "--input", npath, "--output-prefix", out, "--tokenizer-type", "NullTokenizer",
            "--vocab-size", vocab_arg, "--append-eod", "--workers", 2, "--quiet")
        preprocess_ref.preprocess(npath, ref, ["text"], lambda s: [int(x) for x in s.split()], vocab_arg,
                                  vocab_arg + 1, True)
        same_files(out + "_text_document", ref + "_text_document", "NullTokenizer --vocab-size %d" % vocab_arg)
        check(open(out + "_text_document.idx", "rb").read()[17] == code, "--vocab-size %d gives dtype code %d" %
              (vocab_arg, code))


def make_datasets(n, rng):
    prefixes, sizes = [], []
    for i in range(n):
        docs = [[[rng.randrange(1000) for _ in range(rng.randint(1, 80))]] for _ in range(rng.randint(40, 200))]
        p = os.path.join(WORK, "ds%d" % i)
        indexed_ref.write(p, docs, numpy.uint16)
        prefixes.append(p)
        sizes.append(indexed_ref.read_lengths(p)[0])
    return prefixes, sizes


def order(args, split_name, count):
    out = run("data", "order", "--seq-length", 16, "--seed", 1234, "--global-batch-size", 4, "--train-iters", 60,
              "--eval-interval", 20, "--eval-iters", 3, "--tokenizer-type", "NullTokenizer", "--vocab-size", 1000,
              "--data-cache-path", os.path.join(WORK, "cache"), "--split-name", split_name, "--count", count, *args)
    return [tuple(map(int, l.split())) for l in out.splitlines() if l and not l.startswith("#")]


def case_blend():
    rng = random.Random(11)
    prefixes, sizes = make_datasets(10, rng)
    want = {0: 60 * 4, 1: (60 // 20 + 1) * 3 * 4, 2: 3 * 4}
    # --data-path with three and with ten datasets (numpy's pairwise sum of the weights)
    for k, weights in ((3, [0.3, 0.5, 0.2]), (10, [rng.uniform(0.01, 3) for _ in range(10)])):
        flat = []
        for w, p in zip(weights, prefixes[:k]):
            flat += [repr(w), p]
        for s, name in enumerate(("train", "valid", "test")):
            for rep in range(2):  # the second run reads the index cache
                got = order(["--data-path"] + flat + ["--split", "90,6,4"], name, 10 ** 6)
                ref = blend_ref.blend(sizes[:k], weights, "90,6,4", s, 16, 1234, want[s])
                check(got == ref, "blend of %d, split %s, run %d: %s vs %s" % (k, name, rep, got[:3], ref[:3]))
    # per-split blends: each list's datasets are used whole for their split
    per = {0: ([2.0, 1.0], prefixes[:2]), 1: ([1.0], prefixes[2:3]), 2: ([1.0, 1.0, 3.0], prefixes[3:6])}
    args = []
    for s, flag in enumerate(("--train-data-path", "--valid-data-path", "--test-data-path")):
        ws, ps = per[s]
        args.append(flag)
        for w, p in zip(ws, ps):
            args += [repr(w), p]
    for s, name in enumerate(("train", "valid", "test")):
        ws, ps = per[s]
        got = order(args, name, 10 ** 6)
        idx = [prefixes.index(p) for p in ps]
        spoof = ["1,0,0", "0,1,0", "0,0,1"][s]
        if len(ps) == 1:
            r = blend_ref.gpt_order_ref.build(sizes[idx[0]], spoof, s, 16, 1234, want[s])
            ref = [(i, int(r["sample_index"][r["shuffle_index"][i]][0]), int(r["sample_index"][r["shuffle_index"][i]][1]))
                   for i in range(len(r["shuffle_index"]))]
        else:
            ref = blend_ref.blend([sizes[i] for i in idx], ws, spoof, s, 16, 1234, want[s])
        check(got == ref, "per-split %s: %s vs %s" % (name, got[:3], ref[:3]))


def case_sft():
    rng = random.Random(3)
    path = os.path.join(WORK, "chat.jsonl")
    lines = []
    for i in range(120):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": "be brief"})
        for t in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": "q%d " % i + "é" * rng.randint(0, 20)})
            msgs.append({"role": "assistant", "content": "a%d " % i + "z" * rng.randint(0, 90)})
        if rng.random() < 0.2:
            msgs.append({"role": "user", "content": "thanks"})
        lines.append(json.dumps({"messages": msgs}, ensure_ascii=False))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    L = 96
    for s, name in enumerate(("train", "valid")):
        out = run("data", "order", "--sft", "--data-path", path, "--tokenizer-type", "ByteLevelTokenizer",
                  "--seq-length", L, "--seed", 7, "--global-batch-size", 4, "--train-iters", 30, "--eval-interval", 10,
                  "--eval-iters", 2, "--split", "90,10,0", "--split-name", name, "--count", 10 ** 6, "--items")
        got = parse_items(out)
        want = {0: 30 * 4, 1: (30 // 10 + 1) * 2 * 4}[s]
        ref = blend_ref.sft_items(lines, "90,10,0", s, L, 7, want)
        check(len(got) == len(ref), "SFT %s: %d samples vs %d" % (name, len(got), len(ref)))
        for (seq, it), g in zip(ref, got):
            ok = g["sample"][1] == seq and all(g[k] == it[k] for k in ("tokens", "labels", "mask", "positions", "seg"))
            if not check(ok, "SFT %s sample %d (sequence %d)" % (name, g["sample"][0], seq)):
                for k in ("tokens", "labels", "mask", "positions", "seg"):
                    if g[k] != it[k]:
                        print("  %s got %s\n  %s want %s" % (k, g[k][:40], k, it[k][:40]))
                break
        masked = sum(sum(it["mask"]) for _, it in ref)
        check(0 < masked < sum(len([t for t in it["tokens"]]) for _, it in ref), "SFT masks some but not all tokens")


def parse_items(out):
    got, cur = [], None
    for l in out.splitlines():
        if l.startswith("#"):
            continue
        if not l.startswith("  "):
            cur = {"sample": tuple(map(int, l.split()))}
            got.append(cur)
        else:
            k, *vals = l.split()
            cur[k] = [int(v) for v in vals]
    return got


def megatron_masks(tokens, labels, eod, eod_mask_loss, reset_position_ids, reset_attention_mask):
    """Megatron's _get_ltor_masks_and_position_ids for one sample (gpt_dataset.py), with its
    [T, T] boolean attention mask (True = may attend) in place of the 'masked out' form."""
    T = len(tokens)
    tokens = numpy.array(tokens)
    att = numpy.tril(numpy.ones((T, T), dtype=bool))
    loss_mask = numpy.ones(T, dtype=numpy.int64)
    if eod_mask_loss:
        loss_mask[tokens == eod] = 0
    position_ids = numpy.arange(T, dtype=numpy.int64)
    if reset_position_ids or reset_attention_mask:
        prev = 0
        for i in numpy.nonzero(tokens == eod)[0]:
            if reset_attention_mask:
                att[i + 1:, :i + 1] = False
            if reset_position_ids:
                position_ids[i + 1:] -= i + 1 - prev
                prev = i + 1
    return loss_mask, position_ids, att


def case_items():
    """`cohort data order --items` honours --eod-mask-loss, --reset-position-ids and
    --reset-attention-mask as training does: short documents ending in EOD (NullTokenizer
    1000: EOD = 1000), every combination of the three flags, against Megatron's masks."""
    rng = random.Random(5)
    eod, L = 1000, 32
    docs = [[[rng.randrange(1000) for _ in range(rng.randint(0, 12))] + [eod]] for _ in range(300)]
    p = os.path.join(WORK, "eod")
    indexed_ref.write(p, docs, numpy.uint16)
    sizes = indexed_ref.read_lengths(p)[0]
    flat = [d[0] for d in docs]
    ref = gpt_order_ref.build(sizes, "100,0,0", 0, L, 9, 20 * 4)
    count = 40
    base = ["data", "order", "--data-path", p, "--tokenizer-type", "NullTokenizer", "--vocab-size", 1000,
            "--seq-length", L, "--seed", 9, "--global-batch-size", 4, "--train-iters", 20, "--split", "100,0,0",
            "--data-cache-path", os.path.join(WORK, "cache"), "--count", count, "--items"]
    names = ("--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask")
    seen = [0, 0, 0]
    for combo in range(8):
        on = [bool(combo >> b & 1) for b in range(3)]
        got = parse_items(run(*base, *[n for n, o in zip(names, on) if o]))
        what = "flags %s" % (" ".join(n for n, o in zip(names, on) if o) or "none")
        if not check(len(got) == count, "%s: %d samples, want %d" % (what, len(got), count)):
            continue
        for i, g in enumerate(got):
            text = gpt_order_ref.get_text(ref, lambda d, off, n=None: numpy.array(flat[d][off:None if n is None else off + n]),
                                          i, L)
            tokens, labels = [int(t) for t in text[:L]], [int(t) for t in text[1:L + 1]]
            lm, pos, att = megatron_masks(tokens, labels, eod, *on)
            seg = numpy.array(g["seg"])
            # cohort's seg form of the attention mask: t attends to j iff seg[t] <= j <= t
            att_got = (numpy.arange(L)[None, :] >= seg[:, None]) & numpy.tril(numpy.ones((L, L), dtype=bool))
            ok = (check(g["tokens"] == tokens and g["labels"] == labels, "%s sample %d: tokens/labels" % (what, i)) and
                  check(g["mask"] == lm.tolist(), "%s sample %d: loss mask %s, want %s" % (what, i, g["mask"], lm.tolist())) and
                  check(g["positions"] == pos.tolist(),
                        "%s sample %d: positions %s, want %s" % (what, i, g["positions"], pos.tolist())) and
                  check((att_got == att).all(), "%s sample %d: seg %s gives another attention mask" % (what, i, g["seg"])))
            if not ok:
                break
            # the flags must change something in these samples (EOD before the last position)
            inner = eod in tokens[:L - 1]
            seen[0] += on[0] and 0 in g["mask"]
            seen[1] += on[1] and inner and g["positions"] != list(range(L))
            seen[2] += on[2] and inner and any(g["seg"])
    check(all(s > 0 for s in seen), "each flag changed some samples: %s" % seen)


{"preprocess": case_preprocess, "blend": case_blend, "sft": case_sft, "items": case_items}[CASE]()
print("%s: %s" % (CASE, "ok" if not failures else "%d failures" % failures))
sys.exit(1 if failures else 0)
