#!/usr/bin/env python3
"""timeline_ref.py - `cohort timeline` against a known schedule.

Writes the files a job's recorders would write (train/timeline.h's format) for Megatron's
1F1B and interleaved 1F1B schedules simulated with known durations (forward 1 ms, backward
2 ms per micro batch and stage, no communication cost: the ideal timing), runs
`cohort timeline --json` and checks:
  - the measured bubble of every rank equals the analytic (p-1)/(v*m), and Megatron's
    formula the command prints, within 1e-6;
  - with one slow stage, every rank's bubble equals this script's own computation of the
    definition (span - busy) / busy over the same records;
  - the default iteration is the last one every rank's file holds complete (one rank's last
    block is torn), --iteration picks another, an iteration not recorded is refused;
  - the trace JSON parses, has one complete ("X") event per record with its duration and a
    named thread per rank;
  - the SVG is well-formed XML with one <rect class="ev"> per record, rows ordered by
    pipeline, tensor and data rank, forward and backward and neighbouring micro batches in
    different colours;
  - errors: no files, a malformed header, usage.

usage: timeline_ref.py COHORT [WORKDIR]   (default: a temporary directory, removed after a pass)
Also imported by timeline_browser.py (write_job).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

TF, TB = 0.001, 0.002  # seconds
BASE = 1.7e9           # a CLOCK_REALTIME of 2023
SVG_NS = "{http://www.w3.org/2000/svg}"


def schedule(p, m, v, tf, tb):
    """Megatron's 1F1B on p stages with m micro batches (v = 1), or its interleaved 1F1B with v
    model chunks per stage (m a multiple of p); tf[s], tb[s]: a micro batch's forward and
    backward time through stage s's layers (a chunk takes 1/v of it). Every operation starts
    when its stage is free and its input has arrived (no communication time). Returns per
    stage the operations (kind, mb, chunk, t0, t1) in the stage's order, and per stage the
    waits ("recv_wait", -1, -1, t0, t1) before an operation whose input was late."""
    total = m * v

    def fwd(k):  # Megatron's micro batch and chunk of the k-th forward of a stage
        if v == 1:
            return k, 0
        g = k % (p * v)
        return (k // (p * v)) * p + g % p, g // p

    def bwd(k):
        mb, c = fwd(k)
        return mb, v - 1 - c

    order = []
    for s in range(p):
        w = min(p - s - 1 if v == 1 else (p - s - 1) * 2 + (v - 1) * p, total)
        ops = [("forward",) + fwd(k) for k in range(w)]
        for i in range(total - w):
            ops += [("forward",) + fwd(w + i), ("backward",) + bwd(i)]
        ops += [("backward",) + bwd(k) for k in range(total - w, total)]
        order.append(ops)
    done = {}  # (kind, stage, mb, chunk) -> end time
    free = [0.0] * p
    pos = [0] * p
    out = [[] for _ in range(p)]
    waits = [[] for _ in range(p)]
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(order[s]):
                kind, j, c = order[s][pos[s]]
                if kind == "forward":  # from the previous stage, or the last stage's previous chunk
                    dep = done.get(("forward", s - 1, j, c)) if s > 0 else (
                        done.get(("forward", p - 1, j, c - 1)) if c > 0 else 0.0)
                else:  # from the next stage, or the first stage's next chunk, or the loss
                    dep = done.get(("backward", s + 1, j, c)) if s < p - 1 else (
                        done.get(("backward", 0, j, c + 1)) if c < v - 1 else done.get(("forward", s, j, c)))
                if dep is None:
                    break
                t0 = max(free[s], dep)
                if t0 > free[s] and pos[s] > 0:
                    waits[s].append(("recv_wait", -1, -1, free[s], t0))
                t1 = t0 + (tf[s] if kind == "forward" else tb[s]) / v
                out[s].append((kind, j, c, t0, t1))
                done[(kind, s, j, c)] = t1
                free[s] = t1
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")
    return out, waits


def rank_of(tp, dp, t, d, s):
    """Megatron's default order tp-cp-ep-dp-pp (tp fastest)."""
    return t + tp * (d + dp * s)


def write_job(dirname, p, m, tp=1, dp=1, iterations=(2, 3), slow=None, extras=True, v=1):
    """Writes every rank's file for the given iterations; slow = (stage, factor) scales
    that stage's durations. Returns {iteration: {rank: [records]}} with records as
    (kind, mb, chunk, t0, t1) in absolute seconds."""
    os.makedirs(dirname, exist_ok=True)
    tf = [TF * (slow[1] if slow and s == slow[0] else 1) for s in range(p)]
    tb = [TB * (slow[1] if slow and s == slow[0] else 1) for s in range(p)]
    sched, waits = schedule(p, m, v, tf, tb)
    end = max(op[4] for st in sched for op in st)
    world = tp * p * dp
    records = {}
    lines = {r: [] for r in range(world)}
    for s in range(p):
        for d in range(dp):
            for t in range(tp):
                r = rank_of(tp, dp, t, d, s)
                lines[r].append(json.dumps({"timeline": 1, "rank": r, "world": world, "tp": tp, "pp": p, "dp": dp,
                                            "tp_rank": t, "pp_rank": s, "dp_rank": d, "v": v, "m": m,
                                            "clock": "realtime_us", "pid": 1000 + r, "host": "ref"}))
    for it in iterations:
        base = BASE + 10.0 * it
        records[it] = {}
        for s in range(p):
            for d in range(dp):
                for t in range(tp):
                    r = rank_of(tp, dp, t, d, s)
                    rec = [(k, j, c, base + t0, base + t1) for k, j, c, t0, t1 in sched[s]]
                    if extras:
                        rec += [(k, j, c, base + t0, base + t1) for k, j, c, t0, t1 in waits[s]]
                        if s == 0:  # reading each micro batch before its first forward
                            rec += [("data", j, -1, base + t0 - 0.0001, base + t0) for k, j, c, t0, t1 in sched[s]
                                    if k == "forward" and c == 0]
                        if tp > 1:  # a tensor-parallel all-reduce inside each forward
                            rec += [("tp_comm", j, c, base + t0 + 0.0002, base + t0 + 0.0003)
                                    for k, j, c, t0, t1 in sched[s] if k == "forward"]
                        rec += [("dp_reduce", -1, -1, base + end, base + end + 0.0005),
                                ("optimizer", -1, -1, base + end + 0.0005, base + end + 0.0012)]
                    records[it][r] = rec
                    for k, j, c, t0, t1 in rec:  # integer microseconds
                        lines[r].append('{"k":"%s","it":%d,"mb":%d,"c":%d,"t0":%d,"t1":%d}' %
                                        (k, it, j, c, round(t0 * 1e6), round(t1 * 1e6)))
                    lines[r].append('{"end":%d,"events":%d,"dropped":0}' % (it, len(rec)))
    for r in range(world):
        with open(os.path.join(dirname, "timeline-rank-%05d.jsonl" % r), "w") as f:
            f.write("\n".join(lines[r]) + "\n")
    # times as the file holds them (integer microseconds)
    for it in records:
        for r in records[it]:
            records[it][r] = [(k, j, c, round(t0 * 1e6), round(t1 * 1e6)) for k, j, c, t0, t1 in records[it][r]]
    return records


def expected_bubbles(records, p, tp, dp):
    """The definition, computed here: per rank (span - busy) / busy, span over its pipeline."""
    out = {}
    pipelines = {}
    for t in range(tp):
        for d in range(dp):
            ranks = [rank_of(tp, dp, t, d, s) for s in range(p)]
            lo = min(t0 for r in ranks for k, j, c, t0, t1 in records[r] if k == "forward")
            hi = max(t1 for r in ranks for k, j, c, t0, t1 in records[r] if k == "backward")
            for r in ranks:
                pipelines[r] = hi - lo
    for r, rec in records.items():
        busy = sum(t1 - t0 for k, j, c, t0, t1 in rec if k in ("forward", "backward"))
        out[r] = (pipelines[r] - busy) / busy
    return out


def run(cohort, *args, want=0):
    p = subprocess.run([cohort, "timeline", *args], capture_output=True, text=True, timeout=60)
    if p.returncode != want:
        raise AssertionError("cohort timeline %s: exit %d, want %d\n%s%s" % (" ".join(args), p.returncode, want,
                                                                              p.stdout, p.stderr))
    return p


def check_outputs(res, records, p, tp, dp, m):
    it = res["iteration"]
    recs = records[it]
    n = sum(len(v) for v in recs.values())
    assert res["events"] == n, (res["events"], n)
    # trace: one complete event per record, a named thread per rank
    with open(res["trace"]) as f:
        trace = json.load(f)
    ev = trace["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == n, (len(xs), n)
    for e in xs:
        for key in ("name", "cat", "ts", "dur", "pid", "tid", "args"):
            assert key in e, (key, e)
        assert e["args"]["iteration"] == it
    names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names) == sorted(recs), (sorted(names), sorted(recs))
    durs = sorted(e["dur"] for e in xs)
    want = sorted(t1 - t0 for rec in recs.values() for k, j, c, t0, t1 in rec)
    assert durs == want, "trace durations differ from the records"
    per_tid = {}
    for e in xs:
        per_tid[e["tid"]] = per_tid.get(e["tid"], 0) + 1
    assert per_tid == {r: len(v) for r, v in recs.items()}, per_tid
    # svg: well-formed, one rect per record, rows in (pp, tp, dp) order
    root = ET.parse(res["svg"]).getroot()
    assert root.tag == SVG_NS + "svg" and root.get("version") == "1.1"
    assert not list(root.iter(SVG_NS + "script")), "no scripts"
    rects = [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "ev"]
    assert len(rects) == n, (len(rects), n)
    assert all(r.find(SVG_NS + "title") is not None for r in rects)
    labels = [t.text.split()[1] for t in root.iter(SVG_NS + "text") if t.text and t.text.startswith("rank ")
              and len(t.text.split()) == 2]
    order = sorted(recs, key=lambda r: (r // (tp * dp), r % tp, (r // tp) % dp))
    assert [int(x) for x in labels] == order, (labels, order)
    fills = {}
    for rct in rects:
        title = rct.find(SVG_NS + "title").text  # "rank R: forward mb 3, ..."
        kind = title.split(": ")[1].split(" ")[0].rstrip(",")
        if kind in ("forward", "backward"):
            mb = int(title.split(" mb ")[1].split(",")[0].split(" ")[0])
            fills.setdefault((kind, mb), set()).add(rct.get("fill"))
    for key, f in fills.items():
        assert len(f) == 1, ("one colour per micro batch and direction", key, f)
    for j in range(min(m, 10)):
        assert fills[("forward", j)] != fills[("backward", j)], j
        if j + 1 < min(m, 10):
            assert fills[("forward", j)] != fills[("forward", j + 1)], j
            assert fills[("backward", j)] != fills[("backward", j + 1)], j


def main():
    cohort = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cohort-timeline_ref-")
    os.makedirs(work, exist_ok=True)
    # (p, m, tp, dp, v): 1F1B, and interleaved 1F1B with v chunks per stage
    cases = [(2, 4, 1, 1, 1), (4, 8, 1, 1, 1), (4, 8, 2, 2, 1), (4, 4, 1, 1, 1), (8, 16, 1, 1, 1), (1, 4, 1, 1, 1),
             (2, 4, 1, 1, 2), (4, 8, 1, 2, 2), (4, 8, 1, 1, 4), (2, 8, 1, 1, 3)]
    for p, m, tp, dp, v in cases:
        d = os.path.join(work, "ideal-p%d-m%d-tp%d-dp%d-v%d" % (p, m, tp, dp, v))
        records = write_job(d, p, m, tp, dp, v=v)
        res = json.loads(run(cohort, d, "--json").stdout)
        assert res["iteration"] == 3, res["iteration"]
        analytic = (p - 1) / (v * m)
        assert abs(res["formula"] - analytic) < 1e-12, res["formula"]
        assert len(res["ranks"]) == p * tp * dp
        for rr in res["ranks"]:
            assert abs(rr["bubble"] - analytic) < 1e-6, (p, m, rr)
            assert abs(rr["busy_ms"] - m * (TF + TB) * 1e3) < 1e-3, rr
        assert abs(res["mean_bubble"] - analytic) < 1e-6, res
        assert res["worst"]["bubble"] - analytic < 1e-6
        check_outputs(res, records, p, tp, dp, m)
        if v > 1:  # boxes say their chunk: in the tooltip, and as mb.chunk where the label fits
            root = ET.parse(res["svg"]).getroot()
            fb = [r for r in root.iter(SVG_NS + "rect") if r.get("class") == "ev" and
                  r.find(SVG_NS + "title").text.split(": ")[1].startswith(("forward", "backward"))]
            assert all(" chunk " in r.find(SVG_NS + "title").text for r in fb)
            labels = {t.text for t in root.iter(SVG_NS + "text") if t.text and re.fullmatch(r"\d+\.\d+", t.text)}
            if any(float(r.get("width")) >= 22 for r in fb):
                assert "0.%d" % (v - 1) in labels and "1.0" in labels, sorted(labels)
        print("ideal %s p=%d m=%d tp=%d dp=%d v=%d: measured %.6f, (p-1)/(v*m) %.6f, %d events" %
              ("interleaved 1F1B" if v > 1 else "1F1B", p, m, tp, dp, v, res["mean_bubble"], analytic,
               res["events"]))

    # one slow stage: the bubble differs per rank; it matches the definition computed here
    p, m, tp, dp = 4, 8, 1, 2
    d = os.path.join(work, "slow")
    records = write_job(d, p, m, tp, dp, iterations=(5,), slow=(2, 1.5))
    res = json.loads(run(cohort, d, "--json", "--svg", os.path.join(work, "slow.svg"),
                         "--trace", os.path.join(work, "slow.json")).stdout)
    assert res["svg"] == os.path.join(work, "slow.svg") and os.path.exists(res["svg"])
    assert res["trace"] == os.path.join(work, "slow.json") and os.path.exists(res["trace"])
    want = expected_bubbles(records[5], p, tp, dp)
    got = {rr["rank"]: rr["bubble"] for rr in res["ranks"]}
    for r in want:
        assert abs(got[r] - want[r]) < 1e-6, (r, got[r], want[r])
    worst = max(want, key=lambda r: want[r])
    assert abs(res["worst"]["bubble"] - want[worst]) < 1e-9
    assert abs(res["mean_bubble"] - sum(want.values()) / len(want)) < 1e-6
    assert len(set(round(b, 6) for b in want.values())) > 1, "the slow stage should make the bubbles differ"
    check_outputs(res, records, p, tp, dp, m)
    print("one slow stage: bubbles %s" % ", ".join("%.4f" % got[r] for r in sorted(got)))

    # the last complete iteration; a torn last block on one rank; --iteration; not recorded
    d = os.path.join(work, "torn")
    records = write_job(d, 2, 4, iterations=(2, 3, 4))
    path = os.path.join(d, "timeline-rank-00001.jsonl")
    with open(path) as f:
        text = f.read()
    cut = text.rindex('{"end":4')
    with open(path, "w") as f:
        f.write(text[:cut] + '{"k":"backw')  # killed while writing iteration 4
    r = run(cohort, d, "--json")
    res = json.loads(r.stdout)
    assert res["iteration"] == 3, res
    assert "did not finish writing" in r.stderr, r.stderr
    r = run(cohort, d, "--json", "--iteration", "4")
    res = json.loads(r.stdout)
    assert res["iteration"] == 4 and res["missing_ranks"] == [1] and len(res["ranks"]) == 1, res
    assert "no record of iteration 4: 1" in r.stderr, r.stderr
    r = run(cohort, d, "--iteration", "9", want=1)
    assert "iteration 9 is not recorded" in r.stderr and "recorded: 2-4" in r.stderr, r.stderr
    # the text report
    r = run(cohort, d)
    assert "mean bubble 0.2500 (formula 0.2500)" in r.stdout, r.stdout
    assert "worst rank" in r.stdout and "svg: " in r.stdout, r.stdout
    assert os.path.exists(os.path.join(d, "timeline-iter-3.svg"))
    assert os.path.exists(os.path.join(d, "timeline-iter-3.trace.json"))

    # errors
    empty = os.path.join(work, "empty")
    os.makedirs(empty, exist_ok=True)
    r = run(cohort, empty, want=1)
    assert "no timeline-rank-*.jsonl files" in r.stderr, r.stderr
    r = run(cohort, os.path.join(work, "absent"), want=1)
    assert "cannot open directory" in r.stderr, r.stderr
    bad = os.path.join(work, "badheader")
    write_job(bad, 2, 4)
    with open(os.path.join(bad, "timeline-rank-00000.jsonl"), "r+") as f:
        text = f.read().replace('"world": 2', '"world": 3', 1)
        f.seek(0)
        f.truncate()
        f.write(text)
    r = run(cohort, bad, want=1)
    assert "malformed header" in r.stderr, r.stderr
    r = run(cohort, d, "--svg", os.path.join(work, "absent", "x.svg"), want=1)
    assert "writing the picture" in r.stderr, r.stderr
    r = run(cohort, want=2)
    assert "needs the directory" in r.stderr, r.stderr
    r = run(cohort, empty, "--frobnicate", want=2)
    assert "unknown flag" in r.stderr, r.stderr
    r = run(cohort, empty, "--iteration", "x", want=2)
    r = run(cohort, "--help")
    assert "(span - busy) / busy" in r.stdout, r.stdout
    print("timeline_ref: ok")
    if len(sys.argv) <= 2:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
