#!/usr/bin/env python3
"""soak_report.py - bench/soak.sh's verdict from its two runs: the faults survived by kind, the
steps lost, the measured ETTR, cohort plan's predictions of it, and whether the final states are
bitwise equal. Writes WORK/soak.json and prints one summary line and a markdown table.
    soak_report.py WORK MTTI COHORT SAME ITERATIONS TYPES FAULTY_S CLEAN_S
"""
import collections
import json
import re
import subprocess
import sys

RESTART_KINDS = {"kill", "stop", "hang"}  # the kinds only an in-process restart cures


def median_step(path):
    t = sorted(r["elapsed_ms_per_iteration"] for r in map(json.loads, open(path))
               if "elapsed_ms_per_iteration" in r)
    return t[len(t) // 2] / 1000.0


def plan(cohort, report, seconds, rate_per_gpu_h, step_s):
    """cohort plan's in-process ETTR for 4 GPUs on one node over SECONDS, each failure cured in
    place at the restart cost the report measured, no checkpoints."""
    out = subprocess.run([cohort, "plan", "--gpus", "4", "--gpus-per-node", "4", "--days", repr(seconds / 86400.0),
                          "--failures-per-gpu-hour", repr(max(rate_per_gpu_h, 1e-12)), "--mix", "hw=0,sw=1,sdc=0",
                          "--fallback-share", "0", "--save-seconds", "0", "--checkpoint-interval", "1e9",
                          "--from-report", report, "--step-seconds", repr(step_s), "--runs", "4000", "--json"],
                         capture_output=True, text=True, check=True)
    return [s for s in json.loads(out.stdout)["strategies"] if s["strategy"] == "in-process"][0]["ettr"]


def main():
    work, mtti, cohort, same, n, types = sys.argv[1:7]
    mtti, n, same = float(mtti), int(n), same == "yes"
    faulty_s, clean_s = int(sys.argv[7]), int(sys.argv[8])
    f, c = json.load(open(f"{work}/f.json")), json.load(open(f"{work}/clean.json"))
    inj = [i for i in f.get("injections", {}).get("list", []) if i["source"] == "--fault-injector"]
    injected = collections.Counter(re.match(r"[a-z-]+", i["spec"]).group(0) for i in inj)
    # the faults that landed: those their rank reported firing, and the kills and stops (a rank
    # cannot report those) that a restart for that rank followed
    restarts = [x for x in f["faults"] if x.get("recovered_by") == "in-process restart"]
    def landed(i):
        kind, rank = re.match(r"([a-z-]+)@rank=(\d+)", i["spec"]).groups()
        return i.get("fired") or (kind in ("kill", "stop") and any(
            x["rank"] == int(rank) and x["iteration"] >= i.get("requested_at", 0) for x in restarts))
    fired = sum(1 for i in inj if landed(i))
    # the faults the supervisor saw, less the firing of rank 0's --inject slow (rank 0 is never a target)
    detected = collections.Counter(x["kind"] for x in f["faults"] if not (x["kind"] == "injected" and x["rank"] == 0))
    sf, sc = median_step(f"{work}/f.jsonl"), median_step(f"{work}/clean.jsonl")
    # start-up: the faulty run's own (its report's goodput: up to its first accepted step), else
    # the fault-free run's wall time less its iterations at its median step time
    startup = f.get("goodput", {}).get("lost_seconds", {}).get("startup")
    if startup is None:
        startup = max(0.0, c["wall_seconds"] - n * sc)
    train_s = f["wall_seconds"] - startup
    measured = n * sf / train_s
    # the restarts this run had, per GPU hour; and the injector's rate times the restart kinds' share
    kinds = [t.strip().lower().replace("_", "-") for t in types.split(",")]
    alias = {"sigkill": "kill", "segfault": "kill", "os-abort": "kill", "crash": "kill", "sigstop": "stop",
             "gpu-sleep": "hang", "lock-gil": "hang"}
    share = sum(1 for k in kinds if alias.get(k, k) in RESTART_KINDS) / len(kinds)
    report = f"{work}/f.json"
    pred = plan(cohort, report, train_s, f["restarts"] * 3600.0 / (train_s * 4), sf)
    pred_mtti = plan(cohort, report, train_s, share * 3600.0 / (mtti * 4), sf)
    restart_s = [(x.get("detection_ms", 0) + x["recovery_ms"]) / 1000.0 for x in restarts if "recovery_ms" in x]
    out = {"iterations": n, "wall_seconds": f["wall_seconds"], "clean_wall_seconds": c["wall_seconds"],
           "faulty_run_s": faulty_s, "clean_run_s": clean_s, "injections": len(inj), "injections_fired": fired,
           "injected": dict(injected), "faults_survived": fired, "detected": sum(detected.values()),
           "faults": dict(detected),
           "restarts": f["restarts"], "restart_seconds": round(sum(restart_s) / len(restart_s), 2) if restart_s else 0,
           "replays": f.get("replays", 0), "steps_lost": f["steps_lost"], "startup_seconds": round(startup, 2),
           "step_seconds": sf, "clean_step_seconds": sc, "ettr_measured": round(measured, 4),
           "ettr_predicted": round(pred, 4), "ettr_predicted_mtti": round(pred_mtti, 4), "bitwise_equal": same}
    json.dump(out, open(f"{work}/soak.json", "w"))
    print("soak: %d iterations in %.1f s (fault-free %.1f s); %d injections, %d faults survived (%d detected), "
          "%d restarts, %d steps lost; ETTR measured %.3f, cohort plan predicts %.3f (from the restarts) and %.3f "
          "(from the MTTI); final state bitwise equal to the fault-free run: %s"
          % (n, f["wall_seconds"], c["wall_seconds"], len(inj), fired, sum(detected.values()), f["restarts"],
             f["steps_lost"], measured, pred, pred_mtti, "yes" if same else "no"))
    print("\n| injected | count |\n|---|---|")
    for k, v in sorted(injected.items()):
        print(f"| {k} | {v} |")
    print("\n| fault detected (run report kind) | count |\n|---|---|")
    for k, v in sorted(detected.items()):
        print(f"| {k} | {v} |")
    print("\n| measure | value |\n|---|---|")
    for k in ("iterations", "wall_seconds", "clean_wall_seconds", "faulty_run_s", "clean_run_s", "injections",
              "faults_survived", "detected", "restarts",
              "restart_seconds", "replays", "steps_lost", "startup_seconds", "step_seconds", "clean_step_seconds",
              "ettr_measured", "ettr_predicted", "ettr_predicted_mtti", "bitwise_equal"):
        print(f"| {k} | {out[k]} |")


if __name__ == "__main__":
    main()
