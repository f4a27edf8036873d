"""cohort data-layer checks against numpy: check_data.py TOOL {nprng|writer|order} [TMPDIR]

TOOL is the data_tool test executable (tests/unit/data/data_tool.c). Exits 0 when every check
passes, 1 on a mismatch, 77 (meson: skipped) when numpy is not importable -- except under
CI=true, where the setup script installs numpy and its absence is a failure."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy
except ImportError:
    print("numpy is not installed for", sys.executable)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_order_ref  # noqa: E402
import indexed_ref  # noqa: E402

TOOL = sys.argv[1]
failures = 0
seen = set()


def run(*args, stdin=None):
    p = subprocess.run([TOOL] + [str(a) for a in args], input=stdin, capture_output=True)
    if p.returncode != 0:
        raise SystemExit("data_tool %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode,
                                                           p.stderr.decode(errors="replace")))
    return p.stdout


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)
    return cond


def check_nprng():
    for seed in (0, 1, 1234, 42, 2**32 - 1):
        for n in (0, 1, 2, 10, 1000, 70000, 200003):
            for kind, dt in (("i32", numpy.int32), ("u32", numpy.uint32), ("i64", numpy.int64)):
                if n > 1000 and kind != "i32" and seed not in (1234,):
                    continue
                got = numpy.frombuffer(run("mt-shuffle", seed, n, kind), dtype=dt)
                want = numpy.arange(n, dtype=dt)
                numpy.random.RandomState(seed).shuffle(want)
                check(numpy.array_equal(got, want), "RandomState(%d).shuffle(arange(%d, %s))" % (seed, n, kind))
    for seed in (0, 7, 1234):
        for mx in (1, 5, 2**16, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 123, 2**62 + 1):
            got = numpy.frombuffer(run("mt-interval", seed, mx, 300), dtype=numpy.int64)
            want = numpy.random.RandomState(seed).randint(0, mx + 1, size=300, dtype=numpy.int64)
            check(numpy.array_equal(got, want), "random_interval(%d) seed %d" % (mx, seed))
    for seed in (0, 1, 1234, 2**32 + 17, 2**63 + 5):
        for low, high, n in ((1, 4096, 100000), (0, 2, 1001), (-5, 7, 333), (0, 2**31 - 1, 5000),
                             (-2**31, 2**31 - 1, 777), (3, 4, 10), (0, 65537, 70001)):
            got = numpy.frombuffer(run("pcg-integers", seed, low, high, n), dtype=numpy.int32)
            want = numpy.random.default_rng(seed).integers(low, high, size=n, dtype=numpy.int32)
            check(numpy.array_equal(got, want), "default_rng(%d).integers(%d, %d, %d)" % (seed, low, high, n))


def random_docs(rs, ndocs, maxlen, vocab, multi=False, empty=False):
    docs = []
    for _ in range(ndocs):
        nseq = int(rs.randint(1, 4)) if multi else 1
        doc = []
        for _ in range(nseq):
            n = int(rs.randint(0 if empty else 1, maxlen + 1))
            doc.append(rs.randint(0, vocab, size=n).tolist())
        docs.append(doc)
    return docs


def write_both(tmp, name, docs, code):
    lines = []
    for doc in docs:
        lines.append("|".join(" ".join(map(str, s)) if s else "-999" for s in doc))
    run("write", os.path.join(tmp, name + "_c"), code, stdin=("".join(x + "\n" for x in lines)).encode())
    indexed_ref.write(os.path.join(tmp, name + "_py"), docs, indexed_ref.DTYPES[code])
    for ext in (".bin", ".idx"):
        a = open(os.path.join(tmp, name + "_c" + ext), "rb").read()
        b = open(os.path.join(tmp, name + "_py" + ext), "rb").read()
        check(a == b, "writer %s%s bytes identical (%d vs %d bytes)" % (name, ext, len(a), len(b)))
    check(not any(f.endswith(".tmp") for f in os.listdir(tmp)), "no .tmp files left")


def check_writer(tmp):
    rs = numpy.random.RandomState(5)
    write_both(tmp, "u16", random_docs(rs, 200, 50, 65500), 8)
    write_both(tmp, "u16multi", random_docs(rs, 100, 30, 257, multi=True, empty=True), 8)
    write_both(tmp, "i32", random_docs(rs, 100, 40, 2**31 - 1), 4)
    write_both(tmp, "u8", random_docs(rs, 50, 20, 256), 1)
    write_both(tmp, "i64", random_docs(rs, 30, 20, 2**31 - 1), 5)
    write_both(tmp, "empty", [], 8)


def order_case(tmp, data, sizes, get, split, index, seq, seed, num_samples, vocab=1000, eod=999, k=40,
               cache=None, expect_loaded=None):
    tag = "%s split=%s[%d] L=%d seed=%d n=%d" % (os.path.basename(data), split, index, seq, seed, num_samples)
    out = tempfile.mkdtemp(dir=tmp)
    stdout = run("order", data, split, index, seq, seed, num_samples, cache or "-", out, k, vocab, eod).decode()
    ref = gpt_order_ref.build(sizes, split, index, seq, seed, num_samples)
    if ref is None:
        check(stdout.strip() == "empty", tag + ": zero-width split gives no dataset")
        return None
    f = stdout.split()
    info = dict(zip(f[0::2], f[1::2]))
    check(int(info["epochs"]) == ref["num_epochs"], tag + ": num_epochs")
    seen.add((ref["num_epochs"] > 1, bool(ref["separate_final_epoch"])))
    check(int(info["separate"]) == int(ref["separate_final_epoch"]), tag + ": separate_final_epoch")
    if expect_loaded is not None:
        check(int(info["loaded"]) == expect_loaded, tag + ": loaded from cache == %d" % expect_loaded)
    doc = numpy.fromfile(os.path.join(out, "doc.bin"), dtype=numpy.int32)
    sample = numpy.fromfile(os.path.join(out, "sample.bin"), dtype=numpy.int64).reshape(-1, 2)
    shuf = numpy.fromfile(os.path.join(out, "shuffle.bin"), dtype=numpy.int64)
    check(numpy.array_equal(doc, ref["document_index"]), tag + ": document index")
    check(numpy.array_equal(sample, ref["sample_index"]), tag + ": sample index")
    check(numpy.array_equal(shuf, ref["shuffle_index"]), tag + ": shuffle index")
    kk = min(k, len(ref["shuffle_index"]))
    pairs = numpy.fromfile(os.path.join(out, "pairs.bin"), dtype=numpy.int64).reshape(-1, 2)
    check(numpy.array_equal(pairs, ref["sample_index"][ref["shuffle_index"][:kk]]), tag + ": first pairs")
    items = numpy.fromfile(os.path.join(out, "items.bin"), dtype=numpy.int32).reshape(kk, 2, seq)
    ok = True
    for i in range(kk):
        text = gpt_order_ref.get_text(ref, get, i, seq)
        text = numpy.where(text == -1, 0, text)
        ok = ok and numpy.array_equal(items[i, 0], text[:-1]) and numpy.array_equal(items[i, 1], text[1:])
    check(ok, tag + ": item tokens/labels")
    if cache and info["cache"] != "-":
        pfx = info["cache"]
        check(os.path.basename(pfx).endswith("-GPTDataset-%s-" % ("train", "valid", "test")[index]), tag + ": cache name")
        h = os.path.basename(pfx).split("-")[0]
        check(len(h) == 32 and all(c in "0123456789abcdef" for c in h), tag + ": md5 hex in cache name")
        for name in ("document_index", "sample_index", "shuffle_index"):
            arr = numpy.load(pfx + name + ".npy")
            check(arr.dtype == ref[name].dtype, tag + ": cached %s dtype %s vs %s" % (name, arr.dtype, ref[name].dtype))
            check(numpy.array_equal(arr, ref[name]), tag + ": cached %s equals the reference" % name)
        check(os.path.exists(pfx + "description.txt"), tag + ": description written")
    return info


def check_order(tmp):
    rs = numpy.random.RandomState(11)
    prefix = os.path.join(tmp, "corpus")
    docs = random_docs(rs, 901, 40, 1000)
    indexed_ref.write(prefix, docs, numpy.uint16)
    sizes, dt = indexed_ref.read_lengths(prefix)
    flat = numpy.fromfile(prefix + ".bin", dtype=dt).astype(numpy.int64)
    starts = numpy.concatenate([[0], numpy.cumsum(sizes)])

    def get(d, off, length=None):
        n = int(sizes[d]) - off if length is None else length
        return flat[starts[d] + off:starts[d] + off + n]

    T = int(sizes.sum())
    for seed in (1234, 0, 7):
        for split, index in (("98,1,1", 0), ("98,1,1", 1), ("949,50,1", 2), ("1,0,0", 0), ("1,1", 0),
                             ("1,1", 1), ("1,0,0", 1), ("0,1", 0)):
            order_case(tmp, prefix, sizes, get, split, index, 16, seed, 50)
    # multiple epochs, separate and not separate final epoch, several seq lengths
    for seq in (7, 32, 128):
        t0 = int(sizes[:int(round(0.98 * 901))].sum())
        per_epoch = (t0 - 1) // seq
        sans = (2 * t0 - 1) // seq
        for extra in (1, 3, int(0.80 * per_epoch) - 1, int(0.80 * per_epoch), per_epoch):
            order_case(tmp, prefix, sizes, get, "98,1,1", 0, seq, 1234, sans + extra)
        order_case(tmp, prefix, sizes, get, "98,1,1", 0, seq, 99, 10 * T // seq)
    # zero-length documents in the data
    zp = os.path.join(tmp, "zeros")
    zdocs = random_docs(rs, 300, 12, 50, empty=True)
    indexed_ref.write(zp, zdocs, numpy.uint16)
    zs, _ = indexed_ref.read_lengths(zp)
    zflat = numpy.fromfile(zp + ".bin", dtype=numpy.uint16).astype(numpy.int64)
    zst = numpy.concatenate([[0], numpy.cumsum(zs)])

    def zget(d, off, length=None):
        n = int(zs[d]) - off if length is None else length
        return zflat[zst[d] + off:zst[d] + off + n]

    for n in (10, 400, 3000):
        order_case(tmp, zp, zs, zget, "90,10", 0, 5, 3, n)
    # cache: written, loadable by numpy, reloaded, a corrupted file rebuilt
    cdir = os.path.join(tmp, "cachedir")
    order_case(tmp, prefix, sizes, get, "98,1,1", 0, 16, 1234, 700, cache=cdir, expect_loaded=0)
    info = order_case(tmp, prefix, sizes, get, "98,1,1", 0, 16, 1234, 700, cache=cdir, expect_loaded=1)
    pfx = info["cache"]
    with open(pfx + "shuffle_index.npy", "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    order_case(tmp, prefix, sizes, get, "98,1,1", 0, 16, 1234, 700, cache=cdir, expect_loaded=0)
    with open(pfx + "sample_index.npy", "r+b") as f:
        f.truncate(100)
    order_case(tmp, prefix, sizes, get, "98,1,1", 0, 16, 1234, 700, cache=cdir, expect_loaded=0)
    order_case(tmp, prefix, sizes, get, "98,1,1", 0, 16, 1234, 700, cache=cdir, expect_loaded=1)
    # default cache location: PREFIX/cache/GPTDataset_indices
    info = order_case(tmp, prefix, sizes, get, "98,1,1", 1, 16, 1234, 20)
    check(info["cache"].startswith(prefix + "/cache/GPTDataset_indices/"), "default cache directory")
    # mock data
    ml = gpt_order_ref.mock_lengths()
    vocab, eod = 50257, 50256
    mget = lambda d, off, length=None: gpt_order_ref.mock_get(ml, vocab, eod, d, off, length)  # noqa: E731
    check((True, True) in seen and (True, False) in seen and (False, False) in seen,
          "cases cover one epoch, several epochs, and a separate final epoch: %s" % seen)
    order_case(tmp, "mock", ml, mget, "98,1,1", 0, 1024, 1234, 100, vocab=vocab, eod=eod, k=8)
    order_case(tmp, "mock", ml, mget, "949,50,1", 2, 512, 5, 40, vocab=vocab, eod=eod, k=8)
    mget2 = lambda d, off, length=None: gpt_order_ref.mock_get(ml, 300, 299, d, off, length)  # noqa: E731
    order_case(tmp, "mock", ml, mget2, "1,1", 1, 4096, 0, 20000, vocab=300, eod=299, k=8,
               cache=os.path.join(tmp, "mockcache"), expect_loaded=0)


def main():
    what = sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="cohort-data-")
    {"nprng": lambda: check_nprng(), "writer": lambda: check_writer(tmp), "order": lambda: check_order(tmp)}[what]()
    if failures:
        print("%d checks failed" % failures)
        sys.exit(1)
    print("all %s checks passed" % what)
    subprocess.run(["rm", "-rf", tmp])


main()
