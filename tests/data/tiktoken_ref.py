"""tiktoken_ref.py - tiktoken's encoding restated in Python with the `regex` module, and
Megatron's TikTokenizer ids on top of it, to check cohort's TikTokenizer (data/tiktoken.c).

    tiktoken_ref.py ranks GPT2_DIR OUT
        GPT-2's encoder.json as a tiktoken ranks file OUT ("BASE64 RANK" lines, rank = GPT-2's
        id, <|endoftext|> left out), as tiktoken's own gpt2 encoding holds it
    tiktoken_ref.py byte_ordered RANKS OUT
        the same BPE with ranks 0..255 the single bytes in order, as OUT.tiktoken and as
        Megatron's JSON OUT.json
    tiktoken_ref.py subset CORPUS.jsonl OUT.jsonl
        tests/data/make_corpus.py's documents cut short (its non-ASCII ones among them), and one
        of special tokens' texts
    tiktoken_ref.py check RANKS PATTERN NUM_SPECIAL CORPUS.jsonl PREFIX
        encodes every document's "text" (encode_ordinary, ranks offset by NUM_SPECIAL, as
        Megatron's CustomTikTokenizer) and compares with PREFIX.bin/.idx (cohort data preprocess,
        without --append-eod). PATTERN: v1 or v2 (Megatron's PATTERN_TIKTOKEN, _V2) or gpt2
        (GPT-2's pattern with JavaScript's \\s, as GPT2BPETokenizer: with NUM_SPECIAL 0 the ids
        must be GPT2BPETokenizer's, which checks this restatement against GPT-2's BPE; documents
        with code points this regex module does not know are left out there)

tiktoken (src/lib.rs): a regex match that is a token is that token; any other is merged from
its bytes by _byte_pair_merge: the ranks of adjacent part pairs, the lowest (leftmost on ties)
merged, its neighbours' pair ranks recomputed, until no pair is a token."""
import base64
import json
import struct
import sys

import regex

V1 = r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
V2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
      r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
      r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
JS_S = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^%s\p{L}\p{N}]+|[%s]+(?![^%s])|[%s]+"
        % (JS_S, JS_S, JS_S, JS_S))
PATTERNS = {"v1": V1, "v2": V2, "gpt2": GPT2}


def byte_pair_merge(ranks, piece):
    """tiktoken's _byte_pair_merge: the part boundaries of piece."""
    big = 1 << 62

    def rank(parts, i):  # rank of parts i and i+1 together
        if i + 2 < len(parts):
            return ranks.get(piece[parts[i]:parts[i + 2]], big)
        return big

    parts = list(range(len(piece) + 1))
    pair = [rank(parts, i) for i in range(len(parts))]
    while True:
        best = min(range(len(parts) - 1), key=lambda i: (pair[i], i)) if len(parts) > 1 else None
        if best is None or pair[best] == big:
            return parts
        del parts[best + 1]
        del pair[best + 1]
        if best > 0:
            pair[best - 1] = rank(parts, best - 1)
        pair[best] = rank(parts, best)


def encode_ordinary(ranks, pattern, text, offset):
    ids = []
    for m in regex.finditer(pattern, text):
        piece = m.group(0).encode("utf-8")
        if piece in ranks:
            ids.append(ranks[piece] + offset)
            continue
        parts = byte_pair_merge(ranks, piece)
        ids.extend(ranks[piece[a:b]] + offset for a, b in zip(parts, parts[1:]))
    return ids


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, r = line.split()
                ranks[base64.b64decode(tok)] = int(r)
    return ranks


def gpt2_ranks(gpt2_dir, out):
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    enc = json.load(open(gpt2_dir + "/encoder.json", encoding="utf-8"))
    with open(out, "w") as f:
        for tok, i in sorted(enc.items(), key=lambda kv: kv[1]):
            if tok != "<|endoftext|>":
                f.write("%s %d\n" % (base64.b64encode(bytes(chars[c] for c in tok)).decode(), i))


def byte_ordered(gpt2_ranks_path, out):
    """The same BPE with ranks 0..255 the bytes 0..255 in order (Megatron's JSON wants that):
    OUT.tiktoken and OUT.json (Megatron's list of {"rank", "token_bytes", "token_str"})."""
    ranks = load_ranks(gpt2_ranks_path)
    toks = [bytes([b]) for b in range(256)] + [t for t, r in sorted(ranks.items(), key=lambda kv: kv[1]) if len(t) > 1]
    with open(out + ".tiktoken", "w") as f:
        f.write("".join("%s %d\n" % (base64.b64encode(t).decode(), r) for r, t in enumerate(toks)))
    with open(out + ".json", "w") as f:
        json.dump([{"rank": r, "token_bytes": base64.b64encode(t).decode(), "token_str": t.decode("utf-8", "replace")}
                   for r, t in enumerate(toks)], f)


def read_documents(prefix):
    """Megatron's .idx/.bin: each document's ids (its sequences joined; [] for an empty one)."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    code = idx[17]
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    sizes = struct.unpack_from("<%di" % nseq, idx, 34)
    ptrs = struct.unpack_from("<%dq" % nseq, idx, 34 + 4 * nseq)
    docs = struct.unpack_from("<%dq" % ndoc, idx, 34 + 12 * nseq)
    fmt = {8: "H", 4: "i", 1: "B"}[code]
    data = open(prefix + ".bin", "rb").read()
    seqs = [list(struct.unpack_from("<%d%s" % (n, fmt), data, p)) for n, p in zip(sizes, ptrs)]
    return [sum(seqs[a:b], []) for a, b in zip(docs, docs[1:])]


def subset(src, out):
    """Every document cut to its first 800 characters (the generated, non-ASCII ones among
    them), and one of special tokens' texts."""
    docs = [json.loads(d)["text"][:800] for d in open(src, encoding="utf-8", newline="").read().split("\n") if d]
    docs.append("<s>x</s> <unk> <pad> <EOD><CLS>y<SEP> <MASK>z<PAD><BOS><EOS> <|endoftext|> <SPECIAL_7> end")
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))


def check(ranks_path, pattern, num_special, corpus, prefix):
    ranks = load_ranks(ranks_path)
    texts = [json.loads(d)["text"] for d in open(corpus, encoding="utf-8", newline="").read().split("\n") if d]
    got = read_documents(prefix)
    if len(got) != len(texts):
        sys.exit("%d documents in %s, %d in %s" % (len(got), prefix, len(texts), corpus))
    bad = skipped = 0
    for i, text in enumerate(texts):
        # GPT2BPETokenizer's letter and number classes are of a newer Unicode than this regex
        # module's (data/unicode_tables.c): a code point unassigned here may be a letter there
        if pattern == "gpt2" and regex.search(r"\p{Cn}", text):
            skipped += 1
            continue
        want = encode_ordinary(ranks, PATTERNS[pattern], text, num_special)
        if want != got[i]:
            k = next((j for j, (a, b) in enumerate(zip(want, got[i])) if a != b), min(len(want), len(got[i])))
            print("document %d: ids differ at %d: reference %s, cohort %s" % (i, k, want[k:k + 8], got[i][k:k + 8]))
            bad += 1
    if bad:
        sys.exit("%d of %d documents differ" % (bad, len(texts)))
    print("%d documents, %d ids: equal (pattern %s, %d documents with code points unassigned in the regex module "
          "skipped)" % (len(texts) - skipped, sum(map(len, got)), pattern, skipped))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "ranks":
        gpt2_ranks(sys.argv[2], sys.argv[3])
    elif mode == "byte_ordered":
        byte_ordered(sys.argv[2], sys.argv[3])
    elif mode == "subset":
        subset(sys.argv[2], sys.argv[3])
    else:
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
