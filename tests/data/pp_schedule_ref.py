"""pp_schedule_ref.py - Megatron's pipeline schedules and layer placement restated in
Python, to check `cohort schedule --json` against (meson test cli_schedule).

Written from Megatron-LM's source (NVIDIA/Megatron-LM):
  megatron/core/pipeline_parallel/schedules.py    get_forward_backward_func,
      forward_backward_no_pipelining, forward_backward_pipelining_without_interleaving,
      forward_backward_pipelining_with_interleaving, get_pp_rank_microbatches,
      get_schedule_table
  megatron/core/transformer/transformer_block.py  get_num_layers_to_build
  megatron/core/transformer/transformer_layer.py  get_transformer_layer_offset
  megatron/core/transformer/pipeline_parallel_layer_layout.py  PipelineParallelLayerLayout
  megatron/core/transformer/transformer_config.py  __post_init__ (the pipeline checks)
  megatron/training/arguments.py                   validate_args (the pipeline part)
  megatron/core/num_microbatches_calculator.py     global / (micro x dp)
The schedules are replayed the way Megatron's loops run them: the warm-up, steady and
cool-down loops call a forward or backward helper; a forward takes the next micro batch of
its chunk from the table, a backward pops the oldest forward output of its chunk
(output_tensors[chunk].pop(0)). cohort (scheduler/schedule.c) computes the same lists from
a closed form, so the two meet only in their results.

Where Megatron raises an error, the restatement raises Refused; cohort must exit 2. Where
cohort refuses more than Megatron (the rules marked COHORT below), the restatement says so.

    python3 pp_schedule_ref.py COHORT     checks every case, prints a summary line
"""
import json
import random
import re
import subprocess
import sys


class Refused(Exception):
    pass


def require(cond, msg):
    if not cond:
        raise Refused(msg)


# ---------------------------------------------------------------------------------------
# schedules.py

def get_pp_rank_microbatches(m, chunks, group, p, r, vp_size):
    total = m * chunks
    if p > 1:
        if vp_size is None:
            warmup = p - r - 1
        else:
            warmup = (p - r - 1) * 2
            warmup += (chunks - 1) * group
    else:
        warmup = 0
    all_warmup = False
    if warmup >= total:
        warmup = total
        all_warmup = True
    return total, all_warmup, warmup, total - warmup


def get_schedule_table(m, chunks, group):
    table = []
    for lo in range(0, m, group):
        if lo + group >= m:
            table.extend([(mb, c) for c in range(chunks) for mb in range(lo, m)])
        else:
            table.extend([(mb, c) for c in range(chunks) for mb in range(lo, lo + group)])
    return table


def no_pipelining(m):
    ops = []
    for i in range(m):
        ops += [("F", i, 0), ("B", i, 0)]
    return ops, 0


def one_f_one_b(p, r, m):
    warmup = min(p - r - 1, m)
    remaining = m - warmup
    ops, pending, nxt = [], [], 0

    def forward():
        nonlocal nxt
        ops.append(("F", nxt, 0))
        pending.append(nxt)
        nxt += 1

    def backward():
        ops.append(("B", pending.pop(0), 0))

    for _ in range(warmup):
        forward()
    for _ in range(remaining):
        forward()
        backward()
    for _ in range(warmup):
        backward()
    return ops, warmup


def interleaved(p, r, m, v, group):
    require(p <= group <= m, f"microbatch group {group} not in [PP={p}, M={m}]")
    final = m % group
    require(not (0 < final < p), f"final micro batch group {final} < PP {p}")
    total, all_warmup, warmup, remaining = get_pp_rank_microbatches(m, v, group, p, r, v)
    table = get_schedule_table(m, v, group)
    mb_table, chunk_table = zip(*table)

    def get_model_chunk_id(k, forward):
        c = chunk_table[k % total]
        return c if forward else v - c - 1

    ops = []
    output_tensors = [[] for _ in range(v)]

    def forward_helper(k):
        c = get_model_chunk_id(k, True)
        mb = mb_table[k]
        ops.append(("F", mb, c))
        output_tensors[c].append(mb)

    def backward_helper(k):
        c = get_model_chunk_id(k, False)
        ops.append(("B", output_tensors[c].pop(0), c))

    for k in range(warmup):
        forward_helper(k)
    for k in range(remaining):
        forward_helper(k + warmup)
        backward_helper(k)
    for k in range(remaining, total):
        backward_helper(k)
    # Megatron states the same chunk order a second time in closed form
    # (megatron/core/transformer/cuda_graphs.py, convert_schedule_table_to_order: chunk + 1
    # for a forward, -(chunk + 1) for a backward); the two must agree
    assert [c + 1 if k == "F" else -(c + 1) for k, _, c in ops] == convert_schedule_table_to_order(warmup, v, table)
    return ops, warmup


def convert_schedule_table_to_order(num_warmup_microbatches, num_model_chunks, schedule_table):
    _, model_chunk_id_table = zip(*schedule_table)
    forward_order = [chunk_id + 1 for chunk_id in model_chunk_id_table]
    backward_order = [chunk_id - num_model_chunks for chunk_id in model_chunk_id_table]
    order = forward_order[:num_warmup_microbatches]
    for i in range(num_warmup_microbatches, len(forward_order)):
        order.append(forward_order[i])
        order.append(backward_order[i - num_warmup_microbatches])
    if num_warmup_microbatches > 0:
        order.extend(backward_order[-num_warmup_microbatches:])
    return order


def schedule(p, r, m, v, group):
    """get_forward_backward_func and the schedule it picks; v = None: no VPP."""
    if p > 1:
        if v is not None:
            return interleaved(p, r, m, v, group if group else p)
        return one_f_one_b(p, r, m)
    return no_pipelining(m)


# ---------------------------------------------------------------------------------------
# pipeline_parallel_layer_layout.py

def parse_str_to_list(layout_str):
    layout_str = layout_str.replace(",", "")
    for pattern in [r'\(([^)]+)\)\*(\d+)', r'(.)\*(\d+)']:
        layout_str = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), layout_str)
    char2layer = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
    out = []
    for stage in layout_str.split('|'):
        out.append([])
        for ch in stage:
            require(ch in char2layer, f"Invalid layer character: {ch}")
            out[-1].append(char2layer[ch])
    return out


class Layout:
    def __init__(self, layout_str, p):
        flat = parse_str_to_list(layout_str)
        require(len(flat) % p == 0, "layout not divisible by pp")
        v = len(flat) // p
        self.layout = [[flat[vp * p + r] for vp in range(v)] for r in range(p)]
        self.flatten = [x for vp in range(v) for row in self.layout for x in row[vp]]
        self.p, self.v = p, v

    def validate(self, num_layers, mtp_num_layers):
        f = self.flatten
        require(len(f) > 0, "empty layout")  # Megatron: IndexError
        require(f[0] == "embedding", "first layer must be embedding")
        require(f[-1] == "loss", "last layer must be loss")
        require(f.count("embedding") == 1, "embedding once")
        require(f.count("loss") == 1, "loss once")
        require(f.count("decoder") == num_layers, "decoder count")
        require(f.count("mtp") == mtp_num_layers or (mtp_num_layers is None and f.count("mtp") == 0), "mtp count")
        for i in range(len(f)):
            if f[i] == "mtp":
                require(f[i:].count("decoder") == 0, "decoder before mtp")
                break
        for r in range(self.p):
            for vp in range(self.v - 1):
                require("mtp" not in self.layout[r][vp], "mtp only in last vpp stage")
        for r in range(self.p):
            if "mtp" in self.layout[r][-1]:
                require(self.layout[r][-1].count("mtp") == mtp_num_layers, "mtp in one stage")
        for vp in range(self.v - 1):
            require("mtp" not in self.layout[0][vp], "mtp not in first pp rank")
        # COHORT: Megatron builds the embedding on (rank 0, chunk 0) and the loss on
        # (rank p-1, chunk v-1) whatever the layout says; cohort refuses a layout whose E or
        # L is elsewhere (an empty stage before E or after L).
        require("embedding" in self.layout[0][0], "COHORT: E not in stage 0")
        require("loss" in self.layout[self.p - 1][self.v - 1], "COHORT: L not in the last stage")

    def get_num_layers_to_build(self, layer_type, vp_stage, pp_rank):
        return self.layout[pp_rank][vp_stage].count(layer_type)

    def get_layer_offset(self, layer_type, vp_stage, pp_rank):
        offset = 0
        for _vp in range(vp_stage + 1):
            for _pp in range(self.p if _vp < vp_stage else pp_rank):
                offset += self.layout[_pp][_vp].count(layer_type)
        return offset


# ---------------------------------------------------------------------------------------
# arguments.py, transformer_config.py, transformer_block.py, transformer_layer.py

class Cfg:
    """Megatron's argument names; None = not given."""

    def __init__(self, p=1, num_layers=None, num_virtual_stages=None, layers_per_vstage=None, first=None, last=None,
                 acc_e=False, acc_l=False, layout=None, mtp=None):
        self.pipeline_model_parallel_size = p
        self.num_layers = num_layers
        self.num_virtual_stages_per_pipeline_rank = num_virtual_stages
        self.num_layers_per_virtual_pipeline_stage = layers_per_vstage
        self.decoder_first_pipeline_num_layers = first
        self.decoder_last_pipeline_num_layers = last
        self.account_for_embedding_in_pipeline_split = acc_e
        self.account_for_loss_in_pipeline_split = acc_l
        self.pipeline_model_parallel_layout = layout
        self.mtp_num_layers = mtp


def validate_args(a):
    """arguments.py: returns the virtual pipeline size (None = no VPP)."""
    p = a.pipeline_model_parallel_size
    require(int(a.num_layers_per_virtual_pipeline_stage is not None) + int(a.num_virtual_stages_per_pipeline_rank is not None)
            + int(a.pipeline_model_parallel_layout is not None) <= 1, "only one of the VPP arguments")
    vpp = None
    if a.pipeline_model_parallel_layout is not None:
        n = len(parse_str_to_list(a.pipeline_model_parallel_layout))
        require(n % p == 0, "layout length not divisible by pp")
        vpp = n // p
        if vpp == 1:
            vpp = None
    elif a.num_layers_per_virtual_pipeline_stage is not None or a.num_virtual_stages_per_pipeline_rank is not None:
        if a.num_virtual_stages_per_pipeline_rank is None:
            require(a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None,
                    "please use --num-virtual-stages-per-pipeline-rank")
            n = a.num_layers + a.account_for_embedding_in_pipeline_split + a.account_for_loss_in_pipeline_split
            require(n % p == 0, "layers not divisible by pp")
            per = n // p
            require(per % a.num_layers_per_virtual_pipeline_stage == 0, "per stage not divisible by layers per vstage")
            vpp = per // a.num_layers_per_virtual_pipeline_stage
        else:
            vpp = a.num_virtual_stages_per_pipeline_rank
        if vpp == 1:
            vpp = None
    else:
        if a.decoder_first_pipeline_num_layers is None and a.decoder_last_pipeline_num_layers is None:
            n = a.num_layers + a.account_for_embedding_in_pipeline_split + a.account_for_loss_in_pipeline_split
            require(n % p == 0, "Number of layers should be divisible by the pipeline-model-parallel size")
    if vpp is not None:
        require(p > 1, "interleaved schedule needs pp > 1")  # with overlap_p2p_comm (the default)
    return vpp


def transformer_config_post_init(c, vpp):
    first, last = c.decoder_first_pipeline_num_layers, c.decoder_last_pipeline_num_layers
    acc = c.account_for_embedding_in_pipeline_split or c.account_for_loss_in_pipeline_split
    require(not ((first is not None or last is not None) and acc), "uneven with account-for")
    if c.pipeline_model_parallel_layout is not None:
        require(not (first is not None or last is not None or acc), "layout with other layout arguments")
        lay = Layout(c.pipeline_model_parallel_layout, c.pipeline_model_parallel_size)
        if vpp is not None:
            require(vpp == lay.v, "vpp conflicts with layout")
        lay.validate(c.num_layers, c.mtp_num_layers)
        return lay
    if first is not None or last is not None:
        pps, n = c.pipeline_model_parallel_size, c.num_layers
        if first is not None:
            require(first > 0, "first must be larger than 0")
            if vpp is not None:
                require(first % vpp == 0, "first not divisible by vpp")
            n -= first
            pps -= 1
        if last is not None:
            require(last > 0, "last must be larger than 0")
            if vpp is not None:
                require(last % vpp == 0, "last not divisible by vpp")
            n -= last
            pps -= 1
        # COHORT: both counts with p = 1 (no middle ranks, one too few), or counts past
        # --num-layers: Megatron lets some of these through and builds negative counts.
        require(pps >= 0, "COHORT: first and last need pp >= 2")
        require(n >= 0, "COHORT: first + last exceed num layers")
        require(bool(n) == bool(pps), "Mismatch middle layers/stages")
        if pps:
            require(n % pps == 0, "middle not divisible")
        if pps and vpp is not None:
            require((n // pps) % vpp == 0, "middle per rank not divisible by vpp")
    elif acc:
        n = c.num_layers + c.account_for_embedding_in_pipeline_split + c.account_for_loss_in_pipeline_split
        require(n % c.pipeline_model_parallel_size == 0, "account: not divisible by pp")
        if vpp is not None:
            require((n // c.pipeline_model_parallel_size) % vpp == 0, "account: per rank not divisible by vpp")
    return None


def is_vp_first_stage(vp_stage, vp_size):
    if vp_size is None or vp_size <= 1:
        return True
    return vp_stage == 0


def is_vp_last_stage(vp_stage, vp_size):
    if vp_size is None or vp_size <= 1:
        return True
    return vp_stage == vp_size - 1


def get_num_layers_to_build(c, vpp, layout, vp_stage, pp_rank):
    if layout is not None:
        return layout.get_num_layers_to_build("decoder", vp_stage if vpp is not None else 0, pp_rank)
    p = c.pipeline_model_parallel_size
    is_first, is_last = pp_rank == 0, pp_rank == p - 1
    first, last = c.decoder_first_pipeline_num_layers, c.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        left, stages = c.num_layers, p
        if first is not None:
            left -= first
            stages -= 1
        if last is not None:
            left -= last
            stages -= 1
        if stages > 0:
            require(left % stages == 0, "left over layers not divisible by left over stages")
            per = left // stages
        else:
            per = 0
        if is_first and first is not None:
            per = first
        if is_last and last is not None:
            per = last
    else:
        n = c.num_layers + c.account_for_embedding_in_pipeline_split + c.account_for_loss_in_pipeline_split
        require(n % p == 0, "num_layers not divisible by pp")
        per = n // p
    if vpp is not None and p > 1:
        require(per % vpp == 0, "per rank not divisible by vp_size")
        build = per // vpp
    else:
        build = per
    if c.account_for_embedding_in_pipeline_split and is_vp_first_stage(vp_stage, vpp) and is_first:
        build -= 1
        require(build >= 0, "Not enough layers in the first virtual pipeline stage")
    if c.account_for_loss_in_pipeline_split and is_vp_last_stage(vp_stage, vpp) and is_last:
        build -= 1
        require(build >= 0, "Not enough layers in the last virtual pipeline stage")
    return build


def get_transformer_layer_offset(c, vpp, layout, vp_stage, pp_rank):
    p = c.pipeline_model_parallel_size
    is_first = pp_rank == 0
    if p <= 1:
        return 0
    if layout is not None:
        return layout.get_layer_offset("decoder", vp_stage if vpp is not None else 0, pp_rank)
    first, last = c.decoder_first_pipeline_num_layers, c.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        middle_stages = p - sum(1 if x is not None else 0 for x in (first, last))
        f = 0 if first is None else first
        la = 0 if last is None else last
        middle_num_layers = c.num_layers - f - la
        middle_rank = pp_rank if first is None else pp_rank - 1
        if vpp is not None:
            fc = 0 if first is None else first // vpp
            lc = 0 if last is None else last // vpp
            mc = middle_num_layers // vpp
            total = fc + mc + lc
            if pp_rank == 0:
                return vp_stage * total
            # Megatron evaluates mc // middle_stages also when there are no middle stages
            # (p = 2 with both counts: ZeroDivisionError); cohort takes the term as 0.
            return vp_stage * total + fc + (middle_rank * (mc // middle_stages) if middle_stages else 0)
        per = middle_num_layers // middle_stages if middle_stages > 0 else 0
        return 0 if pp_rank == 0 else middle_rank * per + f
    n = c.num_layers + c.account_for_embedding_in_pipeline_split + c.account_for_loss_in_pipeline_split
    per_rank = n // p
    if vpp is not None:
        per_v = per_rank // vpp
        offset = vp_stage * (n // vpp) + pp_rank * per_v
    else:
        offset = pp_rank * per_rank
    if c.account_for_embedding_in_pipeline_split and not (is_vp_first_stage(vp_stage, vpp) and is_first):
        offset -= 1
    return offset


def placement(c):
    """{(rank, chunk): (first_layer, num_layers, mtp, embedding, loss)} and v."""
    vpp = validate_args(c)
    layout = transformer_config_post_init(c, vpp)
    p = c.pipeline_model_parallel_size
    v = vpp or 1
    out = {}
    for r in range(p):
        for vp in range(v):
            n = get_num_layers_to_build(c, vpp, layout, vp, r)
            off = get_transformer_layer_offset(c, vpp, layout, vp, r)
            first_stage, last_stage = r == 0 and vp == 0, r == p - 1 and vp == v - 1
            if layout is not None:
                mtp = layout.get_num_layers_to_build("mtp", vp if vpp is not None else 0, r)
            else:
                mtp = (c.mtp_num_layers or 0) if last_stage else 0
            out[(r, vp)] = (off, n, mtp, first_stage, last_stage)
    return out, v


# ---------------------------------------------------------------------------------------
# the driver

_batch = {}


def run(cohort, args):
    """cohort schedule --json ARGS, through one `cohort schedule --batch` process (a process
    start per configuration would cost far more than the configurations themselves)."""
    p = _batch.get(cohort)
    if p is None:
        p = _batch[cohort] = subprocess.Popen([cohort, "schedule", "--batch"], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True)
    p.stdin.write(json.dumps(["--json"] + [str(a) for a in args]) + "\n")
    p.stdin.flush()
    r = json.loads(p.stdout.readline())
    return r["exit"], r["stdout"], r["stderr"]


def flags_of(c):
    f = ["--pipeline-model-parallel-size", str(c.pipeline_model_parallel_size)]
    for name, val in [("--num-layers", c.num_layers), ("--num-virtual-stages-per-pipeline-rank", c.num_virtual_stages_per_pipeline_rank),
                      ("--num-layers-per-virtual-pipeline-stage", c.num_layers_per_virtual_pipeline_stage),
                      ("--decoder-first-pipeline-num-layers", c.decoder_first_pipeline_num_layers),
                      ("--decoder-last-pipeline-num-layers", c.decoder_last_pipeline_num_layers),
                      ("--pipeline-model-parallel-layout", c.pipeline_model_parallel_layout),
                      ("--mtp-num-layers", c.mtp_num_layers)]:
        if val is not None:
            f += [name, str(val)]
    if c.account_for_embedding_in_pipeline_split:
        f.append("--account-for-embedding-in-pipeline-split")
    if c.account_for_loss_in_pipeline_split:
        f.append("--account-for-loss-in-pipeline-split")
    return f


class Checker:
    """Runs cohort on every configuration Megatron accepts, and on the first PER_REASON of
    those it refuses for each reason (the grids hold thousands of refusals of a few kinds)."""
    PER_REASON = 40

    def __init__(self, cohort):
        self.cohort, self.ok, self.refused, self.fail, self.skipped = cohort, 0, 0, 0, 0
        self.reasons = {}

    def bad(self, what, args, detail):
        self.fail += 1
        if self.fail <= 20:
            print(f"FAIL {what}: cohort schedule --json {' '.join(args)}: {detail}")

    def refusal(self, args, rc, out, err, why):
        lines = err.strip().split("\n")
        if rc != 2 or out or len(lines) != 1 or not lines[0].startswith("cohort schedule: "):
            self.bad("refusal", args, f"Megatron refuses ({why}); cohort exit {rc}, stderr {err!r}, stdout {out[:80]!r}")
        else:
            self.refused += 1

    def case(self, c, m, group=None, extra=None, sample=True):
        """c: Cfg (num_layers None: schedule only, v from num_virtual_stages)."""
        args = flags_of(c) + ["--num-microbatches", str(m)] + (
            ["--microbatch-group-size-per-virtual-pipeline-stage", str(group)] if group is not None else []) + (extra or [])
        p = c.pipeline_model_parallel_size
        try:
            if c.num_layers is not None:
                stages, v = placement(c)
            else:
                stages, v = None, c.num_virtual_stages_per_pipeline_rank or 1
                require(v == 1 or p > 1, "interleaved schedule needs pp > 1")
            require(m >= 1, "no micro batches")
            require(group is None or group >= 1, "group must be positive")
            want = [schedule(p, r, m, v if v > 1 else None, group) for r in range(p)]
        except Refused as e:
            reason = re.sub(r"[0-9]+", "N", str(e))
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            if sample and self.reasons[reason] > self.PER_REASON:
                self.skipped += 1
                return
            rc, out, err = run(self.cohort, args)
            self.refusal(args, rc, out, err, str(e))
            return
        rc, out, err = run(self.cohort, args)
        if rc != 0:
            self.bad("accepted", args, f"Megatron accepts; cohort exit {rc}: {err.strip()}")
            return
        d = json.loads(out)
        got_v = d["virtual_pipeline_model_parallel_size"]
        if (d["pipeline_model_parallel_size"], got_v, d["num_microbatches"]) != (p, v, m):
            self.bad("sizes", args, f"p, v, m = {p, v, m}, cohort {d['pipeline_model_parallel_size'], got_v, d['num_microbatches']}")
            return
        kind = "no-pipelining" if p == 1 else "1f1b" if v == 1 else "interleaved"
        bubble = 0 if p == 1 else (p - 1) / (v * m)
        if d["schedule"] != kind or abs(d["bubble"]["value"] - bubble) > 1e-12:
            self.bad("kind", args, f"{kind} {bubble}, cohort {d['schedule']} {d['bubble']}")
            return
        for r in range(p):
            ops, warm = want[r]
            got = d["ranks"][r]
            if got["rank"] != r or got["warmup"] != warm:
                self.bad("warm-up", args, f"rank {r}: warm-up {warm}, cohort {got['warmup']}")
                return
            w = [f"{k}{mb}.{ch}" for k, mb, ch in ops]
            if got["ops"] != w:
                i = next((i for i in range(min(len(w), len(got["ops"]))) if w[i] != got["ops"][i]), min(len(w), len(got["ops"])))
                self.bad("ops", args, f"rank {r}: first difference at {i}: Megatron {w[i:i + 6]}, cohort {got['ops'][i:i + 6]}")
                return
        if stages is not None:
            if len(d["stages"]) != p * v:
                self.bad("stages", args, f"{p * v} stages, cohort {len(d['stages'])}")
                return
            for s in d["stages"]:
                key = (s["rank"], s["chunk"])
                if s["stage"] != s["chunk"] * p + s["rank"]:
                    self.bad("stage order", args, str(s))
                    return
                got = (s["first_layer"], s["num_layers"], s["mtp_layers"], s["embedding"], s["loss"])
                if got != stages[key]:
                    self.bad("placement", args, f"rank {key[0]} chunk {key[1]}: Megatron (offset, layers, mtp, "
                             f"embedding, loss) {stages[key]}, cohort {got}")
                    return
        elif d["stages"] is not None:
            self.bad("stages", args, "stages without --num-layers")
            return
        self.ok += 1


def main():
    cohort = sys.argv[1]
    ck = Checker(cohort)
    sections = []

    def section(name):
        sections.append((name, ck.ok, ck.refused))

    # schedules: p = 1..8, v = 1..4, many m (below p, not multiples of g), g != p
    for p in range(1, 9):
        for v in range(1, 5):
            ms = sorted({1, 2, 3, p - 1, p, p + 1, p + 2, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p + 2, 4 * p, 13} - {0})
            for m in ms:
                groups = [None] if v == 1 else sorted({None, p - 1, p, p + 1, p + 2, m, m + 1} - {0}, key=lambda x: -1 if x is None else x)
                for g in groups:
                    ck.case(Cfg(p=p, num_virtual_stages=v if v > 1 else None), m, g)
    section("schedules")
    # placement: even split, account-for, uneven first/last, VPP by count and by layers per stage
    for p in range(1, 9):
        for L in [1, 2, 3, 4, 6, 7, 8, 10, 12, 16, 24]:
            for v in [None, 2, 3, 4]:
                for acc_e in (False, True):
                    for acc_l in (False, True):
                        ck.case(Cfg(p=p, num_layers=L, num_virtual_stages=v, acc_e=acc_e, acc_l=acc_l), 2 * p)
            for n in [1, 2, 3]:
                ck.case(Cfg(p=p, num_layers=L, layers_per_vstage=n), 2 * p)
                ck.case(Cfg(p=p, num_layers=L, layers_per_vstage=n, acc_e=True, acc_l=True), 2 * p)
    section("even/account-for/VPP placement")
    for p in range(1, 7):
        for L in [4, 6, 8, 9, 10, 12, 14, 16, 20, 24]:
            for first in [None, 0, 1, 2, 3, 4, 6]:
                for last in [None, 1, 2, 4, 5]:
                    if first is None and last is None:
                        continue
                    for v in [None, 2, 3]:
                        ck.case(Cfg(p=p, num_layers=L, first=first, last=last, num_virtual_stages=v), 2 * p)
    section("uneven first/last placement")
    # refusals mixing the flags
    for extra in [dict(first=2, acc_e=True), dict(last=2, acc_l=True), dict(layers_per_vstage=1, first=2),
                  dict(layers_per_vstage=1, num_virtual_stages=2), dict(first=-1), dict(last=0),
                  dict(layout="Et|tL", first=1), dict(layout="Et|tL", acc_e=True), dict(layout="Et|tL", num_virtual_stages=1)]:
        ck.case(Cfg(**dict(dict(p=2, num_layers=4), **extra)), 4, sample=False)
    ck.case(Cfg(p=4, num_layers=8, mtp=2), 8)
    ck.case(Cfg(p=2, num_layers=8, mtp=1, num_virtual_stages=2), 4)
    section("mixed flags, MTP")
    # layouts, with and without VPP and MTP, and broken ones
    layouts = [
        (1, 2, "EttL"), (1, 2, "E,t,t,L"), (2, 2, "Et|tL"), (2, 4, "Ett|ttL"), (2, 4, "E|tttt|L|"), (4, 4, "E|t*4||L"),
        (2, 4, "Et|t|t|tL"), (2, 6, "Et|(tt|)*2tL"), (4, 8, "Et|(tt|)*2,t|tL"), (4, 8, "Ett|(t|)*3,tttL"),
        (3, 9, "E(t|)*2,ttt|t*4L"), (2, 4, "Et*2|t*2L"), (2, 8, "E(tt|)*3ttL"), (4, 16, "E|(tt|)*7ttL"),
        (2, 4, "Et|t|tm|tmL"), (2, 4, "Ett|ttmL"), (2, 4, "Ett|ttmmL"), (2, 3, "Et|tm|t|L"), (2, 2, "Et|tLm"),
        (2, 2, "Emt|tL"), (2, 2, "Et|t|L"), (2, 3, "|Et|t|tL"), (2, 3, "Et|t|tL|"), (2, 2, "Ett|m||L"), (2, 2, "Etm|mL"), (2, 2, "Et|tmmL"), (2, 2, "tE|tL"), (2, 2, "Et|Lt"),
        (2, 2, "EEt|tL"), (2, 2, "Et|tLL"), (2, 3, "Et|tL"), (2, 2, "Ex|tL"), (2, 2, "E(t)|tL"), (2, 2, "E(t|)*1tL"),
        (2, 2, "Et*1|t*1L"), (2, 2, "Et*0t|tL"), (2, 2, ""), (1, 2, ""), (2, 2, "|"), (2, 2, "Et||tL|"),
        (2, 4, "E((t)*2|)*2L"), (2, 2, "E t|tL"), (2, 2, "Et|tL*1"), (2, 2, "E|*1ttL"), (2, 2, "Et|**2tL"),
        (1, 1, "E(t)*1L"), (3, 3, "Et|t|tL"), (3, 6, "E(t|)*5tL"), (1, 4, "Et|tt|tL"), (2, 4, "(Et|)*1ttt|L"),
    ]
    for p, L, lay in layouts:
        for mtp in ([None, 1, 2] if "m" in lay else [None]):
            ck.case(Cfg(p=p, num_layers=L, layout=lay, mtp=mtp), 2 * p, sample=False)
    # random layouts (fixed seed) built from the syntax's pieces: the expansion against
    # Python's re, which Megatron uses
    rng = random.Random(20240916)
    pieces = ["t", "t", "t", "|", "|", "(", ")", "*2", "*3", "*0", "*1", "*12", ",", "m", "tt|", "(t|)*2", "(tt|)*3",
              "(t|t)*2", ")*2", "(|t)*2", "|*2"]
    for _ in range(400):
        body = "E" + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) + rng.choice(["L", "|L", "tL", "mL"])
        try:
            flat = [x for st in parse_str_to_list(body) for x in st]
            nst = len(parse_str_to_list(body))
            L, mtp = max(flat.count("decoder"), 1), flat.count("mtp") or None
            p = rng.choice([d for d in range(1, 5) if nst % d == 0])
        except Refused:
            L, mtp, p = 4, None, 2
        ck.case(Cfg(p=p, num_layers=L, layout=body, mtp=mtp), 2 * p, sample=False)
    section("layouts")
    # micro batches from the batch sizes
    for gbs, mbs, dp in [(8, 1, 1), (16, 2, 2), (12, 2, 3), (10, 4, 1), (7, 1, 2)]:
        c = Cfg(p=2, num_layers=4)
        args = flags_of(c) + ["--global-batch-size", str(gbs), "--micro-batch-size", str(mbs), "--data-parallel-size", str(dp)]
        rc, out, err = run(cohort, args)
        if gbs % (mbs * dp):
            ck.refusal(args, rc, out, err, "global batch not divisible")
        elif rc or json.loads(out)["num_microbatches"] != gbs // (mbs * dp):
            ck.bad("batch", args, f"exit {rc} {err.strip()} {out[:100]}")
        else:
            ck.ok += 1
    section("batch sizes")
    # flags the command refuses itself
    for args in [["--pipeline-model-parallel-size", "0"], ["--num-microbatches", "0"], ["--pipeline-model-parallel-size", "x"],
                 ["--num-layers", "-1"], ["--bogus"], ["--num-microbatches"], ["--decoder-first-pipeline-num-layers", "2"],
                 ["--num-microbatches", "4", "--global-batch-size", "8"],
                 ["--num-virtual-stages-per-pipeline-rank", "2", "--virtual-pipeline-model-parallel-size", "3",
                  "--pipeline-model-parallel-size", "2", "--num-microbatches", "4"],
                 ["--pipeline-model-parallel-size", "2", "--num-layers", "4", "--pipeline-model-parallel-layout", "E" + "(t)*9999999" * 3 + "L"]]:
        rc, out, err = run(cohort, args)
        ck.refusal(args, rc, out, err, "bad flag")
    section("bad flags")
    prev = (0, 0)
    for name, ok, ref in sections:
        print(f"  {name}: {ok - prev[0]} match, {ref - prev[1]} refused")
        prev = (ok, ref)
    print(f"pp_schedule_ref: {ck.ok} configurations match Megatron, {ck.refused} refused as Megatron refuses them "
          f"({len(ck.reasons)} reasons; {ck.skipped} more refusals not run), {ck.fail} differ")
    return 1 if ck.fail else 0


if __name__ == "__main__":
    sys.exit(main())
