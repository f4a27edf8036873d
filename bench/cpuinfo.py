#!/usr/bin/env python3
"""cpuinfo.py - the CPU every benchmark result names, and the OpenBLAS core PyTorch runs on.

    python3 bench/cpuinfo.py                      the CPU line (as bench/bench_cpu.h prints it)
    python3 bench/cpuinfo.py --json               the same as a JSON object
    python3 bench/cpuinfo.py --openblas-coretype  imports torch, asks the OpenBLAS it loaded which
                                                  core it detected (openblas_get_corename), and
                                                  prints the OPENBLAS_CORETYPE to force, or
                                                  nothing (the reason goes to stderr)

The CPU: /proc/cpuinfo's 'model name' and the ISA flags cohort's kernels choose by (avx2,
avx512f, avx512_bf16, amx_bf16).

OpenBLAS (a DYNAMIC_ARCH build, as Debian's) picks its kernels by the CPU it detects. Where
it knows the CPU (Zen, Haswell, SkylakeX, ...) it is left alone. Where it does not recognise
the model -- a recent Xeon, or a virtual machine's generic "Intel Xeon Processor" -- it
falls back to kernels without AVX2 (it names the core Prescott, Core2, Nehalem, Sandybridge
or similar); only then a core type is forced, chosen by the CPU's flags: SkylakeX with
avx512f, Haswell with avx2, none without AVX2 (the fallback is then what the CPU can run).
An OPENBLAS_CORETYPE already in the environment is the caller's choice and is kept."""
import ctypes
import json
import os
import sys

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# OpenBLAS cores (driver/others/dynamic.c's names) whose kernels use AVX2 or AVX-512: a CPU
# detected as one of these is not on a fallback
AVX2_CORES = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"}


def cpu():
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and model == "unknown":
                    model = " ".join(v.split())
                elif k == "flags" and not flags:
                    flags = set(v.split())
    except OSError:
        pass
    d = {"model": model}
    d.update({f: f in flags for f in FLAGS})
    return d


def line(c=None):
    c = c or cpu()
    return "cpu: %s; %s" % (c["model"], ", ".join("%s %s" % (f, "yes" if c[f] else "no") for f in FLAGS))


def openblas():
    """The OpenBLAS loaded in this process (after importing torch or numpy): its file, the
    core it runs (openblas_get_corename) and its build configuration; None without one."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({l.split()[-1] for l in f if ".so" in l and ("blas" in l or "lapack" in l)})
    except OSError:
        return None
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            get = lib.openblas_get_corename
        except (OSError, AttributeError):
            continue
        get.restype = ctypes.c_char_p
        r = {"library": os.path.realpath(path), "core": get().decode()}
        try:
            cfg = lib.openblas_get_config
            cfg.restype = ctypes.c_char_p
            r["config"] = cfg().decode().strip()
        except AttributeError:
            pass
        return r
    return None


def choose_coretype(detected, c):
    """The OPENBLAS_CORETYPE to force, or None, and why."""
    if detected.lower() in AVX2_CORES:
        return None, "OpenBLAS detected %s by itself: left alone" % detected
    if c["avx512f"]:
        return "SkylakeX", "OpenBLAS fell back to %s kernels on a CPU with avx512f: forcing SkylakeX" % detected
    if c["avx2"]:
        return "Haswell", "OpenBLAS fell back to %s kernels on a CPU with avx2: forcing Haswell" % detected
    return None, "OpenBLAS runs %s kernels and the CPU has no AVX2: left alone" % detected


def main():
    if "--json" in sys.argv[1:]:
        print(json.dumps(cpu()))
        return 0
    if "--openblas-coretype" not in sys.argv[1:]:
        print(line())
        return 0
    env = os.environ.get("OPENBLAS_CORETYPE")
    if env:
        print("openblas: OPENBLAS_CORETYPE=%s set by the caller: kept" % env, file=sys.stderr)
        print(env)
        return 0
    try:
        import torch  # noqa: F401  (loads the BLAS PyTorch uses)
    except ImportError as e:
        print("openblas: torch is not importable (%s): nothing forced" % e, file=sys.stderr)
        return 0
    ob = openblas()
    if not ob:
        print("openblas: PyTorch's BLAS is not OpenBLAS: nothing forced", file=sys.stderr)
        return 0
    forced, why = choose_coretype(ob["core"], cpu())
    print("openblas: %s (%s)" % (why, ob["library"]), file=sys.stderr)
    if forced:
        print(forced)
    return 0


if __name__ == "__main__":
    sys.exit(main())
