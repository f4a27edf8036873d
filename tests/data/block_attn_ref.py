"""numpy (float64) reference for the CPU block attention kernels (kb_ops.block_attention_*,
kernels/cpu/block_attention.c): block_attn_ref.py TOOL

TOOL is tests/unit/kernels/block_attn_tool. Random small shapes: GQA/MQA/MHA, mask none and
causal, with and without document ids (including rows that see no key: out 0, lse -inf,
no gradient), Tq != Tk. Prints the measured errors; exits 0 when every case is within
|err| <= 1e-5 + 1e-4 |ref|, 1 otherwise, 77 (skip) without numpy (1 under CI=true)."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is not installed for", sys.executable)
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

TOOL = sys.argv[1]
ATOL, RTOL = 1e-5, 1e-4


def reference(q, k, v, dout, mask, qdoc, kdoc, nh, nkv):
    """q[B,Tq,nh,hd], k/v[B,Tk,nkv,hd], dout like q -> out, lse[B,nh,Tq], dq, dk, dv"""
    B, Tq, _, hd = q.shape
    Tk = k.shape[1]
    rep = nh // nkv
    kk = np.repeat(k, rep, axis=2)  # [B,Tk,nh,hd], head h uses group h // rep
    vv = np.repeat(v, rep, axis=2)
    s = np.einsum("bthd,bjhd->bhtj", q, kk) / np.sqrt(hd)
    vis = np.ones((B, 1, Tq, Tk), bool)
    if mask == 1:
        vis &= np.tril(np.ones((Tq, Tk), bool))[None, None]
    if qdoc is not None:
        vis &= (qdoc[:, :, None] == kdoc[:, None, :])[:, None]
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    seen = np.isfinite(m)
    m = np.where(seen, m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    z = e.sum(-1, keepdims=True)
    p = np.where(seen, e / np.where(seen, z, 1.0), 0.0)
    lse = np.where(seen[..., 0], (m + np.log(np.where(seen, z, 1.0)))[..., 0], -np.inf)
    out = np.einsum("bhtj,bjhd->bthd", p, vv)
    dp = np.einsum("bthd,bjhd->bhtj", dout, vv)
    D = np.einsum("bthd,bthd->bht", dout, out)[..., None]
    ds = p * (dp - D) / np.sqrt(hd)
    dq = np.einsum("bhtj,bjhd->bthd", ds, kk)
    dkk = np.einsum("bhtj,bthd->bjhd", ds, q)
    dvv = np.einsum("bhtj,bthd->bjhd", p, dout)
    dk = dkk.reshape(B, Tk, nkv, rep, hd).sum(3)
    dv = dvv.reshape(B, Tk, nkv, rep, hd).sum(3)
    return out, lse, dq, dk, dv


def case(rng, tmp, B, Tq, Tk, nh, nkv, hd, mask, docs):
    q = rng.uniform(-1, 1, (B, Tq, nh, hd)).astype(np.float32)
    k = rng.uniform(-1, 1, (B, Tk, nkv, hd)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Tk, nkv, hd)).astype(np.float32)
    dout = rng.uniform(-1, 1, (B, Tq, nh, hd)).astype(np.float32)
    qdoc = kdoc = None
    if docs:
        # ids 0..3; key ids include 7, which no query has (keys nobody sees), and with the
        # causal mask row 0 may see nothing
        qdoc = rng.integers(0, 4, (B, Tq)).astype(np.int32)
        kdoc = rng.choice(np.array([0, 1, 2, 3, 7], np.int32), (B, Tk)).astype(np.int32)
        if mask == 1:
            kdoc = qdoc.copy()
            kdoc[:, 0] = 7  # query 0 sees only key 0: a row that sees nothing
    inp = os.path.join(tmp, "in.bin")
    outp = os.path.join(tmp, "out.bin")
    with open(inp, "wb") as f:
        f.write(np.array([B, Tq, Tk, nh, nkv, hd, mask, 1 if docs else 0], np.int32).tobytes())
        for a in (q, k, v, dout):
            f.write(a.tobytes())
        if docs:
            f.write(qdoc.tobytes())
            f.write(kdoc.tobytes())
    r = subprocess.run([TOOL, inp, outp], capture_output=True)
    if r.returncode != 0:
        raise SystemExit("block_attn_tool failed: " + r.stderr.decode(errors="replace"))
    got = np.fromfile(outp, np.float32)
    nq, nk = B * Tq * nh * hd, B * Tk * nkv * hd
    sizes = [nq, B * nh * Tq, nq, nk, nk]
    parts, o = [], 0
    for n in sizes:
        parts.append(got[o:o + n].astype(np.float64))
        o += n
    ref = reference(*(a.astype(np.float64) for a in (q, k, v, dout)), mask, qdoc, kdoc, nh, nkv)
    names = ["out", "lse", "dq", "dk", "dv"]
    ok = True
    desc = "B %d Tq %d Tk %d nh %d nkv %d hd %d mask %d docs %d" % (B, Tq, Tk, nh, nkv, hd, mask, docs)
    worst_abs = 0.0
    for name, g, rf in zip(names, parts, ref):
        rf = rf.reshape(-1)
        if name != "out" and name != "lse":
            rf = rf + 0.5  # the tool's gradient buffers start at 0.5: backward accumulates
        if name == "lse":
            inf_ok = np.array_equal(np.isneginf(g), np.isneginf(rf))
            fin = np.isfinite(rf)
            g, rf = g[fin], rf[fin]
            if not inf_ok:
                print("FAIL", desc, "lse: -inf rows differ")
                ok = False
        err = np.abs(g - rf)
        worst_abs = max(worst_abs, float(err.max(initial=0)))
        if not np.all(err <= ATOL + RTOL * np.abs(rf)):
            print("FAIL", desc, name, "max abs err", err.max())
            ok = False
    print("%s  %s: max abs err %.3g" % ("ok  " if ok else "FAIL", desc, worst_abs))
    return ok


def main():
    rng = np.random.default_rng(17)
    good = True
    with tempfile.TemporaryDirectory() as tmp:
        for (B, Tq, Tk, nh, nkv, hd) in [(1, 5, 7, 2, 1, 4), (2, 9, 9, 4, 2, 8), (2, 16, 8, 3, 3, 5),
                                         (1, 13, 13, 4, 1, 16), (1, 8, 20, 2, 2, 3),
                                         # several 64-row tiles, partial last tiles, hd 64
                                         (1, 150, 150, 4, 2, 64), (2, 70, 200, 2, 1, 16)]:
            for mask in (0, 1):
                if mask == 1 and Tq != Tk:
                    continue
                for docs in (0, 1):
                    good &= case(rng, tmp, B, Tq, Tk, nh, nkv, hd, mask, docs)
    sys.exit(0 if good else 1)


main()
