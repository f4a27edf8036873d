#!/usr/bin/env python3
"""matrix.py - the layouts x features matrix: each cell trains a tiny model in one parallel
layout with a set of features, and the same model in one process on the same batches, and
compares their final parameters and Adam moments (`cohort ckpt diff`) within a stated
tolerance; the layout is run twice and must end bitwise the same.

    matrix.py cells [--trimmed | --full]   the cell names, one a line (meson registers them)
    matrix.py refusals                     the combinations left out: the ones Megatron itself
                                           refuses (its argument checks), with the reason
    matrix.py run COHORT CELL              one cell: exit 0 it matched, 1 it did not, 77 cohort
                                           refuses the cell today (the refusal printed)
    matrix.py list COHORT                  every cell with what cohort says of it today: trains,
                                           or its exit-2 refusal lines (`cohort train` checks
                                           the configuration before any work, so this is cheap)

A cell that cohort refuses is not left out of the list: it runs, is refused with exit 2 before
any work and reports skipped (77) with the refusal, so that when the feature lands the cell
trains and is checked with no change here.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The layouts: processes and the parallel flags. Every layout is 2 processes except tp2pp2.
LAYOUTS = {
    "dp2": (2, []),
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "vpp2": (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]),
    "cp2": (2, ["--context-parallel-size", "2"]),
    # context parallelism over documents: the per-document (THD) split
    "cp2thd": (2, ["--context-parallel-size", "2", "--cp-packed-sequences"]),
    "ep2": (2, ["--expert-model-parallel-size", "2"]),
    "tp2pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
}
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-layer-freq", "2", "--moe-ffn-hidden-size", "48",
       "--moe-aux-loss-coeff", "1e-2", "--disable-bias-linear"]
# The features: (flags, whether the one-process reference has them too). The parallel ones
# (sp, distopt, overlap) are left out of the reference: it is one process's plain job.
FEATURES = {
    "sp": (["--sequence-parallel"], False),
    "distopt": (["--use-distributed-optimizer"], False),
    "overlap": (["--overlap-grad-reduce", "--ddp-bucket-size", "1000"], False),
    "recompute": (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
                  True),
    "bf16": (["--bf16"], True),
    "moe": (MOE, True),
    "mtp": (["--mtp-num-layers", "1"], True),
    # zero-centred norms (Megatron's --apply-layernorm-1p) and the loss per token of the step
    # (--calculate-per-token-loss; its micro batches' token counts differ under cp2thd's
    # --eod-mask-loss): model and loss features, the one-process run has them too
    "1p": (["--apply-layernorm-1p"], True),
    "pertoken": (["--calculate-per-token-loss"], True),
}
# documents in every sequence (mock data's EOD tokens): what the THD split cuts by
DOCS = ["--reset-attention-mask", "--reset-position-ids", "--eod-mask-loss"]
ITERS = 4
# Final parameters and Adam moments, absolute: Adam's update is about lr whatever the
# gradient's size, so where a gradient is near 0 a sum in another order can change the
# update's sign: two runs can drift apart by up to 2 lr per iteration there (8e-3 over 4
# iterations at lr 1e-3). fp32 (fp32 sums in another order): 1e-4, measured up to 4.6e-5
# (tp2-mtp); bf16 (a product in another order moves a weight's bf16 copy by a bf16 step):
# 5e-3, measured up to 2.0e-3 (cp2-bf16).
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-3}
# Every iteration's loss, relative: fp32 1e-6 (as tests/integration/compare_runs.sh), bf16 1e-3 (as
# mtp_test.sh)
LOSS_TOLERANCE = {"fp32": 1e-6, "bf16": 1e-3}

# The trimmed set (suite integration, in CI): every layout and every feature at least once, a
# few seconds each.
TRIMMED = ["tp2-sp-moe", "vpp2-recompute", "cp2thd-recompute-pertoken", "cp2-mtp", "ep2", "dp2-distopt-overlap", "dp2-bf16",
           "tp2pp2-mtp-1p"]


def megatron_refuses(layout, feats):
    """Why Megatron's argument checks refuse (or void) the combination, or None."""
    nproc, flags = LAYOUTS[layout]
    tp = "--tensor-model-parallel-size" in flags
    if "sp" in feats and not tp:
        return "--sequence-parallel at tensor-parallel size 1: Megatron's validate_args turns it off"
    moe = "moe" in feats or layout == "ep2"
    if moe and tp and "sp" not in feats:
        return "MoE with tensor parallelism: Megatron asserts 'sequence parallelism must be used'"
    if layout == "ep2" and "moe" in feats:
        return "ep2 is a MoE layout already"
    if layout == "cp2thd" and "mtp" in feats:
        return "MTP with document masks (--reset-attention-mask): Megatron's MTP takes causal masks only"
    return None


def all_cells():
    """(name, layout, features): every layout alone, with each feature alone, and the
    trimmed set's combinations."""
    out = []
    for layout in LAYOUTS:
        for f in [None] + list(FEATURES):
            feats = [f] if f else []
            if layout.startswith("tp") and f == "moe":
                feats = ["sp", "moe"]
            if megatron_refuses(layout, feats) is None:
                out.append("-".join([layout] + feats))
    for c in TRIMMED:
        if c not in out:
            out.append(c)
    return out


def parse(cell):
    parts = cell.split("-")
    layout, feats = parts[0], parts[1:]
    if layout not in LAYOUTS or any(f not in FEATURES for f in feats):
        raise SystemExit(f"unknown cell {cell}: layouts {', '.join(LAYOUTS)}; features {', '.join(FEATURES)}")
    return layout, feats


def base_flags(work, layout, feats):
    """the tiny model (tests/lib.sh's, 4 layers for the virtual pipeline and MoE's every second
    layer, RoPE for MTP under a pipeline) with the features every run of the cell shares"""
    f = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "500", "--num-layers", "4",
         "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2",
         "--global-batch-size", "8", "--lr", "1e-3", "--data-cache-path", f"{work}/cache", "--log-interval", "1",
         "--eval-interval", "1000", "--eval-iters", "1", "--threads", "1", "--attention-dropout", "0",
         "--position-embedding-type", "rope", "--train-iters", str(ITERS)]
    if layout == "ep2":
        f += MOE
    if layout == "cp2thd":
        f += DOCS
    for x in feats:
        flags, shared = FEATURES[x]
        if shared:
            f += flags
    return f


def layout_flags(layout, feats):
    nproc, flags = LAYOUTS[layout]
    f = ["--nproc-per-node", str(nproc)] + flags
    for x in feats:
        flags, shared = FEATURES[x]
        if not shared:
            f += flags
    return f


def train(cohort, work, name, args):
    """`cohort train` on the CPU: (exit status, stdout + stderr)"""
    p = subprocess.run([cohort, "train", "--device", "cpu"] + args + ["--save", f"{work}/{name}.ck",
                       "--metrics-file", f"{work}/{name}.jsonl"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    with open(f"{work}/{name}.out", "w") as o:
        o.write(p.stdout)
    return p.returncode, p.stdout


def diff(cohort, a, b):
    p = subprocess.run([cohort, "ckpt", "diff", "--json", a, b], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    if p.returncode > 1:
        raise SystemExit(f"FAIL: cohort ckpt diff {a} {b}: exit {p.returncode}: {p.stderr[-400:]}")
    return json.loads(p.stdout)


def refusal(rc, out):
    """exit 2 before any work: the refusal's lines, else None"""
    if rc != 2:
        return None
    return [l.strip() for l in out.splitlines() if l.startswith("  ")] or [out.strip()[-300:]]


def run_cell(cohort, cell):
    layout, feats = parse(cell)
    why = megatron_refuses(layout, feats)
    if why:
        print(f"{cell}: left out: {why}")
        return 77
    if "bf16" in feats and not bf16_cpu():
        print(f"{cell}: skipped: this CPU has no bf16 matrix instructions (--bf16 is refused for that alone)")
        return 77
    work = tempfile.mkdtemp(prefix=f"cohort-matrix-{cell}.")
    try:
        base = base_flags(work, layout, feats)
        rc, out = train(cohort, work, "layout", base + layout_flags(layout, feats))
        r = refusal(rc, out)
        if r:
            print(f"{cell}: refused by cohort today (exit 2):\n  " + "\n  ".join(r))
            return 77
        if rc:
            print(f"FAIL: {cell}: the layout's run exited {rc}:\n{out[-1500:]}")
            return 1
        rc, out = train(cohort, work, "one", base + ["--nproc-per-node", "1"])
        if rc:
            print(f"FAIL: {cell}: the one-process run exited {rc}:\n{out[-1500:]}")
            return 1
        rc, out = train(cohort, work, "again", base + layout_flags(layout, feats))
        if rc:
            print(f"FAIL: {cell}: the layout's second run exited {rc}:\n{out[-1500:]}")
            return 1
        return check(cohort, work, cell, "bf16" if "bf16" in feats else "fp32")
    finally:
        if os.environ.get("KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def losses(path):
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(path)) if "grad_norm" in r}


def check(cohort, work, cell, kind):
    tol, ltol = TOLERANCE[kind], LOSS_TOLERANCE[kind]
    a, b = losses(f"{work}/one.jsonl"), losses(f"{work}/layout.jsonl")
    if sorted(a) != list(range(1, ITERS + 1)) or sorted(b) != sorted(a):
        print(f"FAIL: {cell}: iterations logged: one process {sorted(a)}, the layout {sorted(b)}")
        return 1
    lworst = max(abs(a[i] - b[i]) / abs(a[i]) for i in a)
    if lworst > ltol:
        print(f"FAIL: {cell}: the losses differ from one process's by {lworst:.2e} (relative) > {ltol:g}: "
              f"{[b[i] for i in sorted(b)]} vs {[a[i] for i in sorted(a)]}")
        return 1
    d = diff(cohort, f"{work}/one.ck", f"{work}/layout.ck")
    rows = d["tensors"]
    names = [r["name"] for r in rows]
    params = [n for n in names if not n.startswith("optimizer.")]
    if not params or not all(f"optimizer.exp_avg.{n}" in names for n in params):
        print(f"FAIL: {cell}: the checkpoints do not hold the same tensors: {names[:6]}")
        return 1
    odd = [r for r in rows if r["status"] not in ("bitwise equal", "differs")]
    if odd:
        print(f"FAIL: {cell}: tensors in one checkpoint only or of other shapes: {odd[:4]}")
        return 1
    worst = max(rows, key=lambda r: r["max_abs"])
    if worst["max_abs"] > tol:
        bad = sorted((r for r in rows if r["max_abs"] > tol), key=lambda r: -r["max_abs"])
        print(f"FAIL: {cell}: {len(bad)} of {len(rows)} tensors differ from one process's by more than {tol:g}: "
              + "; ".join(f"{r['name']} {r['max_abs']:.2e}" for r in bad[:5]))
        return 1
    again = diff(cohort, f"{work}/layout.ck", f"{work}/again.ck")
    if not again["bitwise_equal"]:
        bad = [r for r in again["tensors"] if r["status"] != "bitwise equal"]
        print(f"FAIL: {cell}: the layout run twice is not bitwise the same: {len(bad)} tensors, "
              + "; ".join(f"{r['name']} {r.get('max_abs', 0):.2e}" for r in bad[:5]))
        return 1
    print(f"ok: {cell}: the {ITERS} losses within {ltol:g} of one process's (worst {lworst:.1e} relative), "
          f"{len(rows)} tensors (parameters and Adam moments) within {tol:g} (worst {worst['max_abs']:.1e}, "
          f"{worst['name']}); twice bitwise the same")
    return 0


def bf16_cpu():
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        return False
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def list_cells(cohort):
    """each cell and what cohort says of it today (the checks refuse before any work)"""
    work = tempfile.mkdtemp(prefix="cohort-matrix-list.")
    try:
        for cell in all_cells():
            layout, feats = parse(cell)
            args = base_flags(work, layout, feats) + layout_flags(layout, feats)
            args[args.index("--train-iters") + 1] = "0"
            p = subprocess.run([cohort, "train", "--device", "cpu"] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            # --train-iters 0 is out of range: every check runs and none of the work starts
            r = [l for l in refusal(p.returncode, p.stdout) or [] if not l.startswith("--train-iters 0 ")]
            tag = "trimmed" if cell in TRIMMED else "full"
            print(f"{cell:24} {tag:8} " + ("refused: " + " | ".join(r) if r else "trains"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv):
    # the first 1000 mock documents, as tests/lib.sh's scripts (set it empty for the whole set)
    os.environ.setdefault("COHORT_TEST_MOCK_SEQUENCES", "1000")
    if len(argv) >= 1 and argv[0] == "cells":
        cells = all_cells()
        if "--trimmed" in argv:
            cells = [c for c in cells if c in TRIMMED]
        elif "--full" in argv:
            cells = [c for c in cells if c not in TRIMMED]
        print("\n".join(cells))
        return 0
    if len(argv) == 1 and argv[0] == "refusals":
        for layout in LAYOUTS:
            for f in FEATURES:
                why = megatron_refuses(layout, [f])
                if why:
                    print(f"{layout}-{f}: {why}")
        return 0
    if len(argv) == 3 and argv[0] == "run":
        return run_cell(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "list":
        list_cells(argv[1])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
