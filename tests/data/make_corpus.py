"""Builds the tokenizer test and benchmark corpus as JSONL ({"text": ...} per line):

    make_corpus.py OUT.jsonl [MEGABYTES]   (default 4)

Deterministic for a given machine: the licence texts of /usr/share/common-licenses (one
document per paragraph group), C headers from /usr/include (sorted, one document per
file chunk), then generated text (fixed seed): words in many scripts, numbers of every
Unicode number class, emoji (ZWJ sequences, skin tones, flags, variation selectors),
combining marks, contractions, punctuation runs, code, random code points from the whole
range, and whitespace runs of every JavaScript \\s character (plus non-\\s look-alikes such
as U+0085 and U+200B) up to thousands long. Any python3 works (no numpy)."""
import glob
import json
import os
import random
import sys

out_path = sys.argv[1]
target = int(float(sys.argv[2] if len(sys.argv) > 2 else 4) * 1e6)
docs = []
size = 0


def add(text):
    global size
    docs.append(text)
    size += len(text.encode("utf-8", "surrogatepass"))


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


# 1. licence texts, grouped paragraphs of about 3 KB
for path in sorted(glob.glob("/usr/share/common-licenses/*")):
    if os.path.isfile(path):
        text = read(path)
        paras = text.split("\n\n")
        cur = ""
        for p in paras:
            cur += p + "\n\n"
            if len(cur) > 3000:
                add(cur)
                cur = ""
        if cur:
            add(cur)

# 2. C headers, chunks of about 8 KB, up to 40% of the target
for path in sorted(glob.glob("/usr/include/**/*.h", recursive=True)):
    if size > 0.4 * target:
        break
    text = read(path)
    for i in range(0, len(text), 8000):
        add(text[i:i + 8000])

# 3. generated text
rng = random.Random(20240601)
scripts = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x410, 0x44F),
           (0x5D0, 0x5EA), (0x627, 0x64A), (0x905, 0x939), (0xE01, 0xE2E), (0x3041, 0x3096), (0x30A1, 0x30FA),
           (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x10A0, 0x10FF), (0x1E00, 0x1EFF), (0x20000, 0x200FF),
           (0x1D400, 0x1D4FF)]
numbers = [(0x30, 0x39), (0x660, 0x669), (0x6F0, 0x6F9), (0x966, 0x96F), (0xFF10, 0xFF19), (0x2160, 0x2188),
           (0xB2, 0xB3), (0xB9, 0xB9), (0xBC, 0xBE), (0x2070, 0x2079), (0x2460, 0x249B), (0x3007, 0x3007),
           (0x1D7CE, 0x1D7FF), (0x10107, 0x10133)]
marks = [(0x300, 0x36F), (0x483, 0x489), (0x591, 0x5BD), (0x93C, 0x94D), (0x20D0, 0x20F0), (0xFE00, 0xFE0F)]
emoji = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F1EB\U0001F1F7", "\u2764\uFE0F", "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F9D1\u200D\U0001F4BB",
         "\u263A", "\U0001F4A9", "\U0001F914", "#\uFE0F\u20E3", "\U0001FAE0", "\u00A9\uFE0F", "\U0001F3F4\U000E0067"
         "\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"]
spaces = [" ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\r", "\u00A0", "\u1680", "\u2000", "\u2005", "\u200A",
          "\u2028", "\u2029", "\u202F", "\u205F", "\u3000", "\uFEFF"]
lookalikes = ["\u0085", "\u200B", "\u180E", "\x1c", "\x1f", "\u2060"]
punct = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["\u2019", "\u201C", "\u201D", "\u2014", "\u2026", "\u00BF",
                                                       "\u00AB", "\u00BB", "\u3001", "\u3002", "\u00B7"]
contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'x", "''s", "'", " 's", "\u2019s"]
code = ["int main(void) {", "return 0;", "}", "for (i = 0; i < n; i++)", "x->y = &z[0x1F];", "#include <stdio.h>",
        "def f(a, b=None):", "    pass", "if (!p) goto fail;", "s += \"\\n\";", "// TODO: fix", "/* c */",
        "0xDEADBEEF", "3.14159e-10", "a_b_c", "fooBar123baz", "λx.x", "=>", "!==", "::", "...", "$(VAR)"]


def rchar(ranges):
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def word(ranges, n):
    return "".join(rchar(ranges) for _ in range(n))


def random_cp():
    while True:
        cp = rng.randint(0, 0x10FFFF) if rng.random() < 0.3 else rng.randint(0, 0x2FFFF)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def space_run():
    r = rng.random()
    if r < 0.5:
        return rng.choice(spaces) * rng.randint(1, 6)
    if r < 0.8:
        return "".join(rng.choice(spaces + lookalikes) for _ in range(rng.randint(1, 12)))
    return rng.choice([" ", "\n", "\t", " \n"]) * rng.randint(20, 3000)


def piece():
    r = rng.random()
    if r < 0.30:
        return word(scripts, rng.randint(1, 12))
    if r < 0.38:
        return word(numbers, rng.randint(1, 8))
    if r < 0.46:
        return rng.choice(emoji) * rng.randint(1, 3)
    if r < 0.52:
        return word(scripts, 2) + rchar(marks) + rchar(marks)
    if r < 0.60:
        return "".join(rng.choice(punct) for _ in range(rng.randint(1, 5)))
    if r < 0.68:
        return rng.choice(contractions)
    if r < 0.78:
        return rng.choice(code)
    if r < 0.85:
        return "".join(random_cp() for _ in range(rng.randint(1, 6)))
    return space_run()


while size < target:
    parts = []
    for _ in range(rng.randint(20, 400)):
        parts.append(piece())
        if rng.random() < 0.6:
            parts.append(" ")
    text = "".join(parts)
    if rng.random() < 0.2:
        text = space_run() + text + space_run()
    add(text)

with open(out_path, "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}, ensure_ascii=rng.random() < 0.1) + "\n")
print("%d documents, %.2f MB of text" % (len(docs), size / 1e6))
