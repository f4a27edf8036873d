#!/usr/bin/env python3
"""dist_opt_ref.py - the distributed optimizer's layout restated from Megatron-LM
(megatron/core/distributed/param_and_grad_buffer.py, _ParamAndGradBuffer.__init__ with
use_distributed_optimizer, and distrib_optimizer.py's _build_model_gbuf_param_range_map)
in numpy, compared with optim/dist_opt.c through tests/unit/optim/dopt_tool.

Usage: dist_opt_ref.py DOPT_TOOL. Exits 0 when every case matches, 1 otherwise, 77 (skip)
without numpy."""
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy missing: skipped")
    sys.exit(77)


def pad(x, d):
    return int(-(-x // d) * d)


def megatron_layout(numel, dp, bucket_size):
    if bucket_size == 0:
        bucket_size = max(40000000, 1000000 * dp)
    bdiv = int(np.lcm(dp, 128))
    n = len(numel)
    param_start = [0] * n
    param_bucket = [0] * n
    buckets = []  # (start, end, unpadded)
    pstart = bstart = pend = 0
    in_bucket = 0
    for i in reversed(range(n)):  # params[::-1]
        pstart = pad(pstart, 64)  # _pad_start_of_param_if_needed
        pend = pstart + numel[i]
        param_start[i] = pstart
        param_bucket[i] = len(buckets)
        in_bucket += 1
        if pend - bstart >= bucket_size:  # _update_bucket_metadata
            bend = pad(pend, bdiv)  # _pad_end_of_bucket_if_needed
            buckets.append((bstart, bend, pend - bstart))
            bstart = pstart = bend
            in_bucket = 0
        else:
            pstart = pend
    if in_bucket:
        buckets.append((bstart, pad(pend, bdiv), pend - bstart))
    lines = []
    shard_base = []
    base = 0
    for (s, e, u) in buckets:
        shard_base.append(base)
        base += (e - s) // dp
    lines.append("case %d %d %d %d" % (buckets[-1][1], base, len(buckets), bucket_size))
    for b, (s, e, u) in enumerate(buckets):
        lines.append("B %d %d %d %d %d" % (s, e, u, (e - s) // dp, shard_base[b]))
    for i in range(n):
        lines.append("P %d %d" % (param_start[i], param_bucket[i]))
    # each rank's shard of each bucket, and the parameters' intersections with it
    # (distrib_optimizer._build_model_gbuf_param_range_map), in buffer order
    starts = np.array(param_start, dtype=np.int64)
    ends = starts + np.array(numel, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    for r in range(dp):
        for i in order:
            s, e, _ = buckets[param_bucket[i]]
            sh = (e - s) // dp
            lo, hi = s + r * sh, s + (r + 1) * sh
            x, y = max(int(starts[i]), lo), min(int(ends[i]), hi)
            if x >= y:
                continue
            lines.append("R %d %d %d %d %d %d" % (r, i, x - starts[i], y - starts[i],
                                                   shard_base[param_bucket[i]] + x - lo, x))
    lines.append("end")
    return lines


def cases():
    rng = np.random.default_rng(17)
    out = []
    # hand-picked: tiny parameters, one spanning every shard, dp not a power of two
    out.append((2, 0, [1]))
    out.append((3, 0, [1, 1, 1]))
    out.append((3, 100, [1000, 3, 5, 700]))
    out.append((4, 128, [64, 64, 64, 64]))
    out.append((5, 0, [10000, 1, 2, 3, 12345]))
    out.append((7, 1000, [999, 1000, 1001, 1, 63, 65, 129]))
    out.append((6, 1, [5, 5, 5]))          # every parameter closes a bucket
    out.append((1, 0, [17, 33]))
    out.append((8, 40000000, [40000000]))  # exactly one bucket's worth
    out.append((2, 0, [30000000, 30000000]))  # the default cut: one parameter per bucket
    for _ in range(300):
        dp = int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 64]))
        n = int(rng.integers(1, 40))
        kind = rng.integers(0, 3)
        if kind == 0:
            numel = rng.integers(1, 200, n)
        elif kind == 1:
            numel = rng.integers(1, 100000, n)
        else:
            numel = np.where(rng.random(n) < 0.5, rng.integers(1, 16, n), rng.integers(1000, 50000, n))
        bs = int(rng.choice([0, 1, 64, 500, 4096, 100000, int(rng.integers(1, 300000))]))
        out.append((dp, bs, [int(x) for x in numel]))
    return out


def main():
    tool = sys.argv[1]
    cs = cases()
    inp = "".join("%d %d %d %s\n" % (dp, bs, len(nm), " ".join(map(str, nm))) for dp, bs, nm in cs)
    res = subprocess.run([tool], input=inp, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        print("dopt_tool failed: %d %s" % (res.returncode, res.stderr))
        return 1
    got = res.stdout.split("\n")
    pos = 0
    bad = 0
    pieces = 0
    for (dp, bs, nm) in cs:
        want = megatron_layout(nm, dp, bs)
        have = got[pos:pos + len(want)]
        pos += len(want)
        pieces += sum(1 for w in want if w.startswith("R "))
        if have != want:
            bad += 1
            if bad <= 3:
                for k, (a, b) in enumerate(zip(have, want)):
                    if a != b:
                        print("case dp=%d bucket=%d numel=%s: line %d: C %r, reference %r" % (dp, bs, nm[:8], k, a, b))
                        break
                else:
                    print("case dp=%d bucket=%d: %d lines, reference %d" % (dp, bs, len(have), len(want)))
                # resynchronise on the next case
                while pos < len(got) and got[pos - 1] != "end":
                    pos += 1
    print("%d layouts (%d pieces) compared with the reference, %d differ" % (len(cs), pieces, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
