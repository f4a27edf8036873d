"""megatron_groups_ref.py - Megatron's parallel groups restated with numpy, to check
`cohort topology --json` against (tests/integration/cli_test.sh, case topology).

Megatron (megatron/core/parallel_state.py, RankGenerator and
generate_masked_orthogonal_rank_groups; shared/reference/parallelism-facts.md section 1):
ranks are laid out along an order string, its first dimension varying fastest; the groups
of a set of dimensions are the ranks that differ only along those, numbered by the other
dimensions (first fastest), members ordered by the group's own dimensions (first fastest).
Here that is a numpy array of rank ids shaped by the order reversed (C order: the last axis
fastest), its axes permuted to (other dimensions, group dimensions), both reversed, and
reshaped to (groups, members): a different route to the same numbers.

    python3 megatron_groups_ref.py COHORT     checks many layouts, prints one line each
"""
import itertools
import json
import subprocess
import sys

import numpy as np


def groups(sizes, order, dims):
    """sizes: {name: size}; order: names, first fastest; dims: the group's names."""
    rev = order[::-1]
    grid = np.arange(int(np.prod([sizes[n] for n in order]))).reshape([sizes[n] for n in rev])
    other = [rev.index(n) for n in rev if n not in dims]
    mine = [rev.index(n) for n in rev if n in dims]
    size = int(np.prod([sizes[n] for n in dims])) if dims else 1
    return grid.transpose(other + mine).reshape(-1, size).tolist()


def expected(world, tp, cp, pp, ep, etp, tp_pp_dp):
    order = ["tp", "cp", "ep", "pp", "dp"] if tp_pp_dp else ["tp", "cp", "ep", "dp", "pp"]
    dense = {"tp": tp, "cp": cp, "ep": 1, "pp": pp, "dp": world // (tp * cp * pp)}
    expert = {"tp": etp, "cp": 1, "ep": ep, "pp": pp, "dp": world // (etp * ep * pp)}
    g = {
        "tp": groups(dense, order, ["tp"]),
        "cp": groups(dense, order, ["cp"]),
        "dp": groups(dense, order, ["dp"]),
        "dp-cp": groups(dense, order, ["dp", "cp"]),
        "pp": groups(dense, order, ["pp"]),
        "tp-pp": groups(dense, order, ["tp", "pp"]),
        "tp-cp": groups(dense, order, ["tp", "cp"]),
        "tp-dp-cp": groups(dense, order, ["tp", "dp", "cp"]),
        "tp-dp": groups(dense, order, ["tp", "dp"]),
        "ep": groups(expert, order, ["ep"]),
        "expert-tp": groups(expert, order, ["tp"]),
        "expert-tp-ep": groups(expert, order, ["tp", "ep"]),
        "expert-tp-ep-pp": groups(expert, order, ["tp", "ep", "pp"]),
        "expert-dp": groups(expert, order, ["dp"]),
    }
    # get_embedding_ranks / get_position_embedding_ranks of pretrain_gpt.py
    g["embedding"] = [[p[0], p[-1]] if len(p) > 1 else [p[0]] for p in g["pp"]]
    g["position-embedding"] = [[p[0]] for p in g["pp"]]
    # Megatron asserts the expert generator's pipeline groups are the dense ones
    assert groups(expert, order, ["pp"]) == g["pp"]
    return g, dense, expert


def check(cohort, world, tp, cp, pp, ep, etp, tp_pp_dp):
    args = [cohort, "topology", "--json", "--world-size", str(world), "--tensor-model-parallel-size", str(tp),
            "--context-parallel-size", str(cp), "--pipeline-model-parallel-size", str(pp),
            "--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(etp)]
    if tp_pp_dp:
        args.append("--use-tp-pp-dp-mapping")
    got = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    want, dense, expert = expected(world, tp, cp, pp, ep, etp, tp_pp_dp)
    assert set(got["groups"]) == set(want), sorted(got["groups"])
    for k in want:
        assert got["groups"][k] == want[k], (k, got["groups"][k], want[k])
    # coordinates: the place along each dimension, from the same grid
    order = ["tp", "cp", "ep", "pp", "dp"] if tp_pp_dp else ["tp", "cp", "ep", "dp", "pp"]
    for r in got["ranks"]:
        rest = r["rank"]
        for n in order:
            if n != "ep":
                assert r[n] == rest % dense[n], (r, n)
            rest //= dense[n]
        rest = r["rank"]
        for n in order:
            key = {"tp": "etp", "ep": "ep", "dp": "edp"}.get(n)
            if key:
                assert r[key] == rest % expert[n], (r, key)
            rest //= expert[n]
    return len(want)


def refused(cohort, world, tp, cp, pp, ep, etp):
    """Megatron asserts that the expert layout's pipeline groups are the dense layout's: under
    tp-cp-ep-pp-dp with pp > 1 they differ unless tp*cp = etp*ep, and cohort refuses such a layout."""
    order = ["tp", "cp", "ep", "pp", "dp"]
    dense = {"tp": tp, "cp": cp, "ep": 1, "pp": pp, "dp": world // (tp * cp * pp)}
    expert = {"tp": etp, "cp": 1, "ep": ep, "pp": pp, "dp": world // (etp * ep * pp)}
    assert groups(dense, order, ["pp"]) != groups(expert, order, ["pp"])
    r = subprocess.run([cohort, "topology", "--world-size", str(world), "--tensor-model-parallel-size", str(tp),
                        "--context-parallel-size", str(cp), "--pipeline-model-parallel-size", str(pp),
                        "--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(etp),
                        "--use-tp-pp-dp-mapping"], capture_output=True, text=True)
    assert r.returncode == 2 and "pipeline groups differ" in r.stderr, (world, tp, cp, pp, ep, etp, r.stderr)


def main():
    cohort = sys.argv[1]
    n = 0
    for world in (1, 2, 6, 8, 12, 16, 32):
        for tp, cp, pp in itertools.product((1, 2, 3, 4), (1, 2), (1, 2, 4)):
            if world % (tp * cp * pp):
                continue
            for ep, etp in itertools.product((1, 2), (1, 2)):
                if world % (etp * ep * pp):
                    continue
                for tp_pp_dp in (False, True):
                    if tp_pp_dp and pp > 1 and tp * cp != etp * ep:
                        refused(cohort, world, tp, cp, pp, ep, etp)
                        continue
                    check(cohort, world, tp, cp, pp, ep, etp, tp_pp_dp)
                    n += 1
    print(f"megatron_groups_ref: {n} layouts, every group and coordinate as Megatron's")
    # a layout the world does not fit is refused with the sizes
    r = subprocess.run([cohort, "topology", "--world-size", "6", "--tensor-model-parallel-size", "4"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a multiple of tensor 4" in r.stderr, (r.returncode, r.stderr)


if __name__ == "__main__":
    main()
