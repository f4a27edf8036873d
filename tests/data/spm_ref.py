"""spm_ref.py - Megatron's SentencePiece tokenizers (megatron/training/tokenizer/tokenizer.py:
_SentencePieceTokenizer, _GPTSentencePieceTokenizer, _Llama2Tokenizer) restated over
python3-sentencepiece, to check cohort's (data/tokenizer.c over data/spm.cc).

    spm_ref.py check MODEL TYPE CORPUS.jsonl PREFIX
        tokenizes every document's "text" as Megatron's TYPE and compares with PREFIX.bin/.idx
        (cohort data preprocess --append-eod: each document ends with the tokenizer's eod)
    spm_ref.py decode MODEL TYPE IDS TEXT
        IDS (int32 little-endian, `cohort data tokenize --binary`) detokenized as Megatron's TYPE
        must be the bytes of TEXT (`cohort data tokenize --decode`)
    spm_ref.py vocab MODEL TYPE
        prints "VOCAB EOD" as Megatron's tokenizer has them"""
import json
import os
import struct
import sys

import sentencepiece

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiktoken_ref import read_documents  # noqa: E402


class Megatron:
    def __init__(self, model, kind):
        self.sp = sentencepiece.SentencePieceProcessor(model_file=model)
        self.kind = kind
        self.vocab = {self.sp.id_to_piece(i): i for i in range(len(self.sp))}
        self.special = {}
        if kind == "SentencePieceTokenizer":
            for t in ["<CLS>", "<SEP>", "<EOD>", "<MASK>"]:
                self.add(t)
            self.eod = self.vocab["<EOD>"]
            for get, fallback in [(self.sp.pad_id, "<PAD>"), (self.sp.bos_id, "<BOS>"), (self.sp.eos_id, "<EOS>")]:
                try:
                    self.add(self.sp.id_to_piece(get()))
                except IndexError:
                    self.add(fallback)
        else:
            self.eod = self.sp.eos_id()
        self.inv_special = {v: k for k, v in self.special.items()}

    def add(self, t):
        if t not in self.vocab:
            self.vocab[t] = len(self.vocab)
        self.special[t] = self.vocab[t]

    def tokenize(self, text):
        if self.kind == "GPTSentencePieceTokenizer":
            return self.sp.encode_as_ids(text)
        if self.kind == "Llama2Tokenizer":
            return [self.sp.bos_id()] + self.sp.encode(text)
        ids, idx = [], 0
        while True:
            indices = {}
            for token in self.special:
                try:
                    indices[token] = text[idx:].index(token)
                except ValueError:
                    continue
            if not indices:
                break
            nxt = min(indices, key=indices.get)
            at = idx + indices[nxt]
            ids.extend(self.sp.encode_as_ids(text[idx:at]))
            ids.append(self.special[nxt])
            idx = at + len(nxt)
        ids.extend(self.sp.encode_as_ids(text[idx:]))
        return ids

    def detokenize(self, ids):
        if self.kind != "SentencePieceTokenizer":
            return self.sp.decode_ids(ids)
        text, last = "", 0
        for i, t in enumerate(ids):
            if t in self.inv_special:
                text += self.sp.decode_ids(ids[last:i]) + " " + self.inv_special[t] + " "
                last = i + 1
        return text + self.sp.decode_ids(ids[last:])


def check(model, kind, corpus, prefix):
    tok = Megatron(model, kind)
    texts = [json.loads(d)["text"] for d in open(corpus, encoding="utf-8", newline="").read().split("\n") if d]
    got = read_documents(prefix)
    if len(got) != len(texts):
        sys.exit("%d documents in %s, %d in %s" % (len(got), prefix, len(texts), corpus))
    bad = 0
    for i, text in enumerate(texts):
        want = tok.tokenize(text)
        want += [tok.eod] if want else []  # preprocess_data.py: no eod for a document of no ids
        if want != got[i]:
            k = next((j for j, (a, b) in enumerate(zip(want, got[i])) if a != b), min(len(want), len(got[i])))
            print("document %d: ids differ at %d: Megatron %s, cohort %s" % (i, k, want[k:k + 8], got[i][k:k + 8]))
            bad += 1
    if bad:
        sys.exit("%s: %d of %d documents differ" % (kind, bad, len(texts)))
    print("%s: %d documents, %d ids: equal" % (kind, len(texts), sum(map(len, got))))


def decode(model, kind, ids_path, text_path):
    data = open(ids_path, "rb").read()
    ids = list(struct.unpack("<%di" % (len(data) // 4), data))
    want = Megatron(model, kind).detokenize(ids).encode("utf-8")
    got = open(text_path, "rb").read()
    if want != got:
        k = next((j for j, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        sys.exit("%s: decoded text differs at byte %d: Megatron %r, cohort %r" % (kind, k, want[k:k + 40], got[k:k + 40]))
    print("%s: %d ids decode to the same %d bytes" % (kind, len(ids), len(got)))


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(*sys.argv[2:6])
    elif sys.argv[1] == "decode":
        decode(*sys.argv[2:6])
    else:
        t = Megatron(sys.argv[2], sys.argv[3])
        print(len(t.vocab), t.eod)
