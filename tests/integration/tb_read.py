#!/usr/bin/env python3
"""tb_read.py - an independent reader of TensorBoard event files, for cohort's tests.

It shares nothing with cohort's writer (observe/): its own CRC32C (bitwise), its own
framing parser, and TensorBoard's Event/Summary schema built at run time with
google.protobuf's descriptor_pb2 and message_factory (tensorboard/compat/proto/event.proto,
summary.proto: the fields a scalar file uses, same numbers).

  tb_read.py dump DIR                     every scalar: tag, step, value
  tb_read.py check DIR METRICS [FLAG...]  the tags of DIR against the metrics JSONL of the
                                          same run (FLAG: timers memory world=N ppl
                                          no-loss-scale interval=N)
  tb_read.py intact DIR [MIN]             every record complete with good CRCs, the first
                                          the file version; at least MIN scalar events
Exits 1 with a message on the first problem.
"""
import glob
import json
import math
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def schema():
    fp = descriptor_pb2.FileDescriptorProto(name="tb_read_event.proto", package="tbread", syntax="proto2")
    summary = fp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tbread.Summary.Value")
    event = fp.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tbread.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    desc = pool.FindMessageTypeByName("tbread.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = schema()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def die(msg):
    print("tb_read: " + msg, file=sys.stderr)
    sys.exit(1)


def records(path):
    """The payloads of path's records; every CRC checked, no trailing bytes allowed."""
    data = open(path, "rb").read()
    off, out = 0, []
    while off < len(data):
        if len(data) - off < 12:
            die(f"{path}: {len(data) - off} trailing bytes at offset {off}: a torn record header")
        hdr = data[off:off + 8]
        (n,) = struct.unpack("<Q", hdr)
        (hcrc,) = struct.unpack("<I", data[off + 8:off + 12])
        if hcrc != masked(crc32c(hdr)):
            die(f"{path}: record at offset {off}: length CRC {hcrc:#x} != {masked(crc32c(hdr)):#x}")
        if off + 12 + n + 4 > len(data):
            die(f"{path}: record at offset {off}: {n} payload bytes announced, the file ends first")
        payload = data[off + 12:off + 12 + n]
        (pcrc,) = struct.unpack("<I", data[off + 12 + n:off + 16 + n])
        if pcrc != masked(crc32c(payload)):
            die(f"{path}: record at offset {off}: payload CRC {pcrc:#x} != {masked(crc32c(payload)):#x}")
        out.append(payload)
        off += 16 + n
    return out


def read_dir(d):
    """(file, first event, {tag: [(step, value)]}) of the one event file in d."""
    files = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))
    if len(files) != 1:
        die(f"{d}: {len(files)} event files, want 1: {files}")
    name = os.path.basename(files[0]).split(".")
    # events.out.tfevents.<%010d time>.<host>.<pid>.<counter>
    if len(name) < 7 or len(name[3]) != 10 or not name[3].isdigit() or not name[-1].isdigit() \
            or not name[-2].isdigit():
        die(f"{files[0]}: not named events.out.tfevents.<%010d time>.<host>.<pid>.<counter>")
    recs = records(files[0])
    if not recs:
        die(f"{files[0]}: no records")
    first = Event()
    first.ParseFromString(recs[0])
    if first.file_version != "brain.Event:2" or not first.wall_time > 0:
        die(f"{files[0]}: first event {first} is not the file version brain.Event:2 with a wall time")
    tags = {}
    for p in recs[1:]:
        e = Event()
        e.ParseFromString(p)
        if not e.HasField("summary") or not e.wall_time > 0:
            die(f"{files[0]}: an event without summary or wall time: {e}")
        for v in e.summary.value:
            if not v.HasField("simple_value"):
                die(f"{files[0]}: a value without simple_value: {v}")
            tags.setdefault(v.tag, []).append((e.step, v.simple_value))
    return files[0], first, tags


def f32(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def expected(metrics, flags):
    """The tags Megatron's training_log/evaluate write, from cohort's metrics records."""
    opt = dict(f.split("=", 1) if "=" in f else (f, "1") for f in flags)
    interval = int(opt.get("interval", 1))
    want = {}

    def add(tag, step, v, samples=None):
        want.setdefault(tag, []).append((step, f32(v)))
        if samples is not None:
            want.setdefault(tag + " vs samples", []).append((samples, f32(v)))

    samples = 0
    faults = restarts = 0
    for line in open(metrics):
        r = json.loads(line)
        if "event" in r:
            k, it = r["event"], max(r.get("iteration", 0), 0)
            if k == "straggler":
                add(f"cohort/straggler-score/rank-{r['rank']}", it, r["score"])
            elif k == "straggler_stage":
                add(f"cohort/straggler-score/stage-{r['stage']}", it, r["score"])
            elif k == "fault" and r["recover_ms"] < 0:
                faults += 1
                add("cohort/faults", it, faults)
            elif k == "fault":
                add("cohort/fault-recovery-seconds", it, r["recover_ms"] / 1000)
            elif k == "restart":
                restarts += 1
                add("cohort/restarts", it, restarts)
                if r["recover_ms"] >= 0:
                    add("cohort/restart-seconds", it, r["recover_ms"] / 1000)
            elif k == "replay":
                add("cohort/replays", it, r["replays"])
            elif k == "checkpoint":
                add("cohort/checkpoint-commit-seconds", it, r["commit_ms"] / 1000)
            elif k == "goodput":
                add("cohort/goodput/ettr", it, r["ettr"])
                for cause, v in r["lost_seconds"].items():
                    add("cohort/goodput/lost-seconds/" + cause, it, v)
            continue
        it = r["iteration"]
        if "evaluation" in r:
            if r["evaluation"] != "valid":
                continue
            s = r.get("consumed_samples", samples)
            add("lm loss validation", it, r["lm_loss"], s)
            if "ppl" in opt:
                add("lm loss validation ppl", it, r["lm_loss_ppl"], s)
            continue
        samples = r["consumed_samples"]
        if it % interval:
            continue
        add("learning-rate", it, r["learning_rate"], samples)
        if r["skipped_iterations"] > 0:
            add("skipped-train-samples", it, r["skipped_iterations"] * r["global_batch_size"], samples)
        add("batch-size", it, r["global_batch_size"], samples)
        add("lm loss", it, r["lm_loss"], samples)
        if "no-loss-scale" not in opt:
            add("loss-scale", it, r["loss_scale"], samples)
        if "world" in opt:
            add("world-size", it, int(opt["world"]), samples)
        add("grad-norm", it, r["grad_norm"], samples)
        # mixture of experts and multi-token prediction: Megatron's names, by iteration
        for k in ("load_balancing_loss", "z_loss"):
            if k in r:
                add(k, it, r[k])
        for d in range(1, 9):
            if "mtp_%d_loss" % d not in r:
                break
            add("mtp_%d loss" % d, it, r["mtp_%d_loss" % d])
        if "memory" in opt:
            add("mem-resident-bytes", it, r["rss_bytes"])
            add("mem-max-resident-bytes", it, r["max_rss_bytes"])
        if "timers" in opt:
            add("iteration-time", it, r["elapsed_ms_per_iteration"] / 1000)
            add("throughput", it, r["tflops_per_rank"])
            for k, t in (("validation_ms_per_iteration", "rerun-validation-time"),
                         ("weight_checksum_ms_per_iteration", "weight-checksum-time"),
                         ("weight_hash_ms_per_iteration", "weight-hash-time"),
                         ("tensor_comm_ms_per_iteration", "tensor-comm-time")):
                if k in r:
                    add(t, it, r[k] / 1000)
        add("cohort/tokens-per-second", it, r["tokens_per_second"])
        add("cohort/skipped-iterations", it, r["skipped_iterations"])
        add("cohort/nan-iterations", it, r["nan_iterations"])
    return want


def main():
    if len(sys.argv) < 3:
        die(__doc__)
    mode, d = sys.argv[1], sys.argv[2]
    path, first, tags = read_dir(d)
    if mode == "dump":
        for t in sorted(tags):
            for s, v in tags[t]:
                print(f"{t}\t{s}\t{v!r}")
    elif mode == "intact":
        n = sum(len(v) for v in tags.values())
        need = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        if n < need:
            die(f"{path}: {n} scalar events, want at least {need}")
        print(f"ok: {path}: {n} scalar events, every record whole")
    elif mode == "check":
        want = expected(sys.argv[3], sys.argv[4:])
        if set(want) != set(tags):
            die(f"tags differ: missing {sorted(set(want) - set(tags))}, unexpected {sorted(set(tags) - set(want))}")
        for t in sorted(want):
            if len(want[t]) != len(tags[t]):
                die(f"{t}: {len(tags[t])} events, the metrics give {len(want[t])}")
            for (ws, wv), (gs, gv) in zip(want[t], tags[t]):
                same = wv == gv or (math.isnan(wv) and math.isnan(gv))
                if ws != gs or not same:
                    die(f"{t}: (step {gs}, {gv!r}) in the event file, (step {ws}, {wv!r}) from the metrics")
        print(f"ok: {path}: {len(tags)} tags, {sum(len(v) for v in tags.values())} scalars match {sys.argv[3]}")
    else:
        die(f"unknown mode {mode}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # `dump | head`: the reader of the output had enough
        sys.exit(0)
