"""Reference (numpy) implementation of Megatron-LM's dataset blending and of the SFT packing
cohort documents (data/sft.h), used by check_pipeline.py.

Blending restates megatron/core/datasets/blended_megatron_dataset_builder.py,
blended_dataset.py and helpers.cpp (build_blending_indices) as described in
shared/reference/megatron-facts.md section 3."""
import json
import math

import numpy

import gpt_order_ref


def normalize(weights):
    w = numpy.array(weights, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def blending_indices(weights, size):
    weights = numpy.array(weights, dtype=numpy.float64)
    n = len(weights)
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
    current = [0] * n
    for s in range(size):
        sd = max(float(s), 1.0)
        best = 0
        err = weights[0] * sd - float(current[0])
        for i in range(1, n):
            e = weights[i] * sd - float(current[i])
            if e > err:
                err = e
                best = i
        dataset_index[s] = best
        dataset_sample_index[s] = current[best]
        current[best] += 1
    return dataset_index, dataset_sample_index, current


def blend(sizes_list, weights, split, index, seq_length, seed, target):
    """Returns the list of (sample, dataset, dataset_sample, doc_pos, offset) of the blended
    split, or raises ValueError on an over-request."""
    w = normalize(weights)
    builds = []
    for sizes, wi in zip(sizes_list, w):
        ask = int(math.ceil(math.ceil(target * wi) * 1.005))
        builds.append(gpt_order_ref.build(sizes, split, index, seq_length, seed, ask))
    if any(b is None for b in builds):
        return None
    di, dsi, counts = blending_indices(w, target)
    for i, b in enumerate(builds):
        if counts[i] > len(b["shuffle_index"]):
            raise ValueError("dataset %d over-requested" % i)
    out = []
    for s in range(target):
        b = builds[di[s]]
        j = b["shuffle_index"][dsi[s]]
        out.append((s, int(di[s]), int(dsi[s]), int(b["sample_index"][j][0]), int(b["sample_index"][j][1])))
    return out


# ---- SFT (ByteLevelTokenizer: tokens are UTF-8 bytes, EOD = 256) ----

def sft_conversation(obj, eod=256):
    toks, mask = [], []
    last_assistant = False
    for m in obj["messages"]:
        role, content = m["role"], m["content"]
        last_assistant = role == "assistant"
        for text, counted in (("<|%s|>\n" % role, False), (content, last_assistant), ("\n", False)):
            b = list(text.encode("utf-8"))
            toks += b
            mask += [1 if counted else 0] * len(b)
    toks.append(eod)
    mask.append(1 if last_assistant else 0)
    return toks, mask


def sft_items(lines, split, index, seq_length, seed, num_samples):
    """Packed items in training order: list of dicts tokens/labels/mask/positions/seg."""
    convs = [sft_conversation(json.loads(l)) for l in lines]
    beg, end = gpt_order_ref.split_range(split, index, len(convs))
    kept = []
    for toks, mask in convs[beg:end]:
        if len(toks) < 2:
            continue
        kept.append((toks[:seq_length + 1], mask[:seq_length + 1]))
    seqs, cur, used = [], [], 0
    for c in kept:
        n = len(c[0]) - 1
        if cur and used + n > seq_length:
            seqs.append(cur)
            cur, used = [], 0
        cur.append(c)
        used += n
    seqs.append(cur)
    S = len(seqs)
    epochs = max(1, -(-num_samples // S))
    rs = numpy.random.RandomState(seed)
    order = []
    for _ in range(epochs):
        o = numpy.arange(S, dtype=numpy.int64)
        rs.shuffle(o)
        order += o.tolist()
    items = []
    for s in order:
        it = dict(tokens=[], labels=[], mask=[], positions=[], seg=[])
        for toks, mask in seqs[s]:
            start = len(it["tokens"])
            for k in range(len(toks) - 1):
                it["tokens"].append(toks[k])
                it["labels"].append(toks[k + 1])
                it["mask"].append(mask[k + 1])
                it["positions"].append(k)
                it["seg"].append(start)
        start = len(it["tokens"])
        while len(it["tokens"]) < seq_length:
            p = len(it["tokens"])
            it["tokens"].append(0)
            it["labels"].append(0)
            it["mask"].append(0)
            it["positions"].append(p - start)
            it["seg"].append(start)
        items.append((s, it))
    return items
