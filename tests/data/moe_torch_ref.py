#!/usr/bin/env python3
"""moe_torch_ref.py - cohort's MoE layer (model/moe.c) against PyTorch (Debian's python3-torch):
Megatron core's router and MoE layer restated with torch tensor operations, in float64, and
every gradient from autograd.

It reads the directories tests/unit/model/test_moe.c writes (see tests/data/moe_ref.py for
their files). Where moe_ref.py (numpy) derives the experts' gradients by hand and the
router's by central differences, this script writes only the forward, the way Megatron's
code does it (topk_routing_with_score_function, group_limited_topk,
apply_router_token_dropping, compute_routing_scores_for_aux_loss,
switch_load_balancing_loss_func and its per-sequence form, z_loss_func, permute -> experts
-> unpermute, the shared expert), and takes dx and every parameter's gradient from
torch.autograd of
    L = sum(y * dy) + loss_scale * (aux_loss + z_loss)
which is the objective cohort's moe_backward differentiates (the aux and z losses enter with
the caller's loss_scale, Megatron's MoEAuxLossAutoScaler). Routing decisions (top-k, drops,
the aux counts) are not differentiable, as in torch.

Ties: torch.topk leaves the order of equal values unspecified; cohort (moe.h) takes the
lower index first, so every top-k here is a stable descending sort (torch.sort(stable=True)).

Compared: routing map, tokens per expert, drops and capacity exactly; probs, y, dx, each
parameter tensor's gradient with max|cohort - ref| <= TOL * max(max|ref|, 1e-3), the losses
relatively; TOL = 5e-6 (cohort's fp32 against float64). Prints the errors per configuration.

bf16 cases (config bf16=1, cohort's --bf16): the experts' and the shared expert's products
take bf16-rounded operands with a wide accumulation, forward and backward (din = bf16(g)
bf16(W), dW = bf16(g)^T bf16(in): BF16Linear below, the backend's bf16 linear_backward); the
router stays in full precision (cohort's router is fp32 under bf16). The routing, drops and
aux and z losses are held to TOL as above; probs, y, dx and the gradients to BF16_TOL (measured
2.6e-7): an operand cohort rounds from fp32 and this script from float64 could land on the
neighbouring bf16 value (2^-8 relative) near a rounding boundary. And cohort's y must be
farther than TOL from the full-precision products' (it did compute in bf16).

usage: moe_torch_ref.py [--rm] ROOT    exit 0 agree, 1 disagree, 77 no torch
"""
import math
import os
import sys

from ref_cases import run_cases

try:
    import torch
except ImportError:
    print("moe_torch_ref.py: python3-torch is not installed")
    sys.exit(77)

import numpy as np

TOL = 5e-6
BF16_TOL = 5e-3
torch.set_default_dtype(torch.float64)


def bf(t):
    return t.to(torch.bfloat16).to(torch.float64)


class BF16Linear(torch.autograd.Function):
    """out = bf16(a) bf16(W)^T; backward with bf16(g), as a bf16 backend's product"""

    @staticmethod
    def forward(ctx, a, W):
        ctx.save_for_backward(a, W)
        return bf(a) @ bf(W).t()

    @staticmethod
    def backward(ctx, g):
        a, W = ctx.saved_tensors
        gb = bf(g)
        return gb @ bf(W), gb.t() @ bf(a)


def read_cfg(d):
    cfg = {}
    with open(os.path.join(d, "config.txt")) as f:
        for line in f:
            k, v = line.strip().split("=", 1)
            cfg[k] = v
    for k in ["hidden", "num_experts", "ffn_hidden", "topk", "pre_softmax", "num_groups", "group_topk",
              "expert_bias", "pad_to_capacity", "swiglu", "shared_ffn", "B", "T", "dropped", "capacity"]:
        cfg[k] = int(cfg[k])
    for k in ["scaling_factor", "aux_coeff", "z_coeff", "capacity_factor", "loss_scale", "aux_loss", "z_loss"]:
        cfg[k] = float(cfg[k])
    cfg["bf16"] = int(cfg.get("bf16", "0"))
    return cfg


def load(d, name, dtype=np.float32):
    return torch.from_numpy(np.fromfile(os.path.join(d, name), dtype=dtype).astype(
        np.float64 if dtype == np.float32 else dtype))


def topk(scores, k, dim=-1):
    """torch.topk with ties to the lower index: (values, indices)"""
    idx = torch.sort(scores, dim=dim, descending=True, stable=True).indices.narrow(dim, 0, k)
    return scores.gather(dim, idx), idx


def group_limited_topk(scores, topk_, num_tokens, num_experts, num_groups, group_topk):
    group_scores = topk(scores.view(num_tokens, num_groups, -1), topk_ // group_topk)[0].sum(dim=-1)
    group_idx = topk(group_scores, group_topk)[1]
    group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(num_tokens, num_groups, num_experts // num_groups).reshape(
        num_tokens, -1)
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    return topk(masked, topk_)


def sinkhorn(cost, tol=0.0001):
    """Megatron's moe_utils.sinkhorn"""
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), dtype=cost.dtype)
    d1 = torch.ones(cost.size(1), dtype=cost.dtype)
    eps = 0.00000001
    error = 1e9
    d1_old = d1
    while error > tol:
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + eps)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def sinkhorn_load_balancing(logits, c):
    """Megatron's TopKRouter.sinkhorn_load_balancing: (routing probs [N,E], routing map [N,E])"""
    k = c["topk"]

    def activation(lg):
        return torch.sigmoid(lg) if k == 1 else torch.softmax(lg, dim=-1)

    if c.get("train", "1") == "1":
        with torch.no_grad():
            _, indices = topk(sinkhorn(logits.detach()), k)
        logits = activation(logits)
    else:
        logits = activation(logits)
        _, indices = topk(logits.detach(), k)
    routing_map = torch.zeros_like(logits).int().scatter(1, indices, 1).bool()
    return logits * routing_map, routing_map


def topk_routing_with_score_function(logits, c, bias):
    """Megatron's topk_routing_with_score_function: (routing probs [N,E], routing map [N,E])"""
    N, E = logits.shape
    k = c["topk"]

    def compute_topk(scores):
        if c["num_groups"] > 0:
            return group_limited_topk(scores, k, N, E, c["num_groups"], c["group_topk"])
        return topk(scores, k)

    if c["score"] == "softmax":
        if c["pre_softmax"]:
            scores = torch.softmax(logits, dim=-1)
            probs, top_indices = compute_topk(scores)
        else:
            scores, top_indices = compute_topk(logits)
            probs = torch.softmax(scores, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        if c["expert_bias"]:
            sfr = scores + bias
            _, top_indices = compute_topk(sfr)
            scores = torch.gather(scores, dim=1, index=top_indices)
        else:
            scores, top_indices = compute_topk(scores)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else scores
    if c["scaling_factor"]:
        probs = probs * c["scaling_factor"]
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.int).scatter(1, top_indices, 1).bool()
    return routing_probs, routing_map


def apply_router_token_dropping(routing_probs, routing_map, c):
    N, E = routing_probs.shape
    if not c["capacity_factor"] > 0:
        return routing_probs, routing_map, 0
    cap = min(math.ceil(N * c["topk"] / E * c["capacity_factor"]), N)
    if c["drop"] == "probs":
        _, capacity_indices = topk(routing_probs.detach(), cap, dim=0)
    else:
        _, capacity_indices = topk(routing_map.to(torch.float64), cap, dim=0)
    capacity_mask = torch.zeros(N, E).scatter(0, capacity_indices, 1).bool()
    final_map = capacity_mask if c["pad_to_capacity"] else torch.logical_and(routing_map, capacity_mask)
    return routing_probs * final_map, final_map, cap


def compute_routing_scores_for_aux_loss(logits, c):
    if c["score"] == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    _, top_indices = topk(scores.detach(), c["topk"])
    routing_map = torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    return routing_map, scores


def switch_load_balancing_loss_func(probs, tokens_per_expert, total_num_tokens, topk_, num_experts, coeff):
    aggregated = probs.sum(dim=0)
    return torch.sum(aggregated * tokens_per_expert) * (num_experts * coeff / (topk_ * total_num_tokens ** 2))


def load_balancing_loss(logits, c):
    N, E = logits.shape
    k = c["topk"]
    if c["lb"] in ("none", "sinkhorn"):
        return torch.zeros(())
    rmap, scores = compute_routing_scores_for_aux_loss(logits, c)
    if c["lb"] == "aux_loss":
        return switch_load_balancing_loss_func(scores, rmap.sum(dim=0).to(torch.float64), N, k, E, c["aux_coeff"])
    B, T = c["B"], c["T"]
    # _apply_seq_aux_loss: each sequence its own switch loss, the coefficient divided by B
    total = torch.zeros(())
    for b in range(B):
        s = scores[b * T:(b + 1) * T]
        m = rmap[b * T:(b + 1) * T]
        total = total + switch_load_balancing_loss_func(s, m.sum(dim=0).to(torch.float64), T, k, E,
                                                        c["aux_coeff"] / B)
    return total


def z_loss_func(logits, coeff):
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * coeff


def act_fn(h1, swiglu):
    if swiglu:
        a, g = torch.chunk(h1, 2, dim=-1)
        return torch.nn.functional.silu(a) * g
    return torch.nn.functional.gelu(h1, approximate="tanh")


def check_case(d):
    c = read_cfg(d)
    h, E, F, k = c["hidden"], c["num_experts"], c["ffn_hidden"], c["topk"]
    B, T = c["B"], c["T"]
    N = B * T
    sw = c["swiglu"]
    F1 = 2 * F if sw else F
    Fs = c["shared_ffn"]
    Fs1 = 2 * Fs if sw else Fs
    x = load(d, "x.bin").reshape(N, h).requires_grad_(True)
    dy = load(d, "dy.bin").reshape(N, h)
    P = load(d, "params.bin")
    bias = load(d, "bias.bin")
    o_fc1 = E * h
    o_fc2 = o_fc1 + E * F1 * h
    o_s1 = o_fc2 + E * h * F
    o_s2 = o_s1 + Fs1 * h
    total = o_s2 + h * Fs
    assert P.numel() == total, (P.numel(), total)
    Wr = P[:o_fc1].reshape(E, h).clone().requires_grad_(True)
    W1 = P[o_fc1:o_fc2].reshape(E, F1, h).clone().requires_grad_(True)
    W2 = P[o_fc2:o_s1].reshape(E, h, F).clone().requires_grad_(True)
    Ws1 = P[o_s1:o_s2].reshape(Fs1, h).clone().requires_grad_(True)
    Ws2 = P[o_s2:total].reshape(h, Fs).clone().requires_grad_(True)

    logits = x @ Wr.t()
    z = z_loss_func(logits, c["z_coeff"]) if c["z_coeff"] > 0 else torch.zeros(())
    if c["lb"] == "sinkhorn":
        rprobs, rmap = sinkhorn_load_balancing(logits, c)
    else:
        rprobs, rmap = topk_routing_with_score_function(logits, c, bias)
    probs, fmap, cap = apply_router_token_dropping(rprobs, rmap, c)
    aux = load_balancing_loss(logits, c)
    dropped = int(torch.logical_and(rmap, ~fmap).sum())
    # permute (tokens of each expert in token order), experts, unpermute weighted by probs
    lin = BF16Linear.apply if c.get("bf16") else (lambda a, W: a @ W.t())
    y = torch.zeros(N, h)
    for e in range(E):
        toks = torch.nonzero(fmap[:, e]).flatten()
        if toks.numel() == 0:
            continue
        out = lin(act_fn(lin(x[toks], W1[e]), sw), W2[e])
        y = y.index_add(0, toks, probs[toks, e].unsqueeze(1) * out)
    if Fs:
        y = y + lin(act_fn(lin(x, Ws1), sw), Ws2)
    y_full = None
    if c["bf16"]:
        with torch.no_grad():
            y_full = torch.zeros(N, h)
            for e in range(E):
                toks = torch.nonzero(fmap[:, e]).flatten()
                if toks.numel():
                    out = act_fn(x[toks] @ W1[e].t(), sw) @ W2[e].t()
                    y_full = y_full.index_add(0, toks, probs[toks, e].unsqueeze(1) * out)
            if Fs:
                y_full = y_full + act_fn(x @ Ws1.t(), sw) @ Ws2.t()
    L = (y * dy).sum() + c["loss_scale"] * (aux + z)
    L.backward()
    dP = torch.cat([(w.grad if w.grad is not None else torch.zeros_like(w)).flatten() for w in (Wr, W1, W2, Ws1, Ws2)])

    name = os.path.basename(d)
    fails = []
    cm = load(d, "map.bin", np.uint8).reshape(N, E).bool()
    if not torch.equal(cm, fmap):
        fails.append("routing map differs at %d entries" % int((cm != fmap).sum()))
    tpe = load(d, "tpe.bin", np.int32)
    if not torch.equal(tpe.long(), fmap.sum(dim=0).long()):
        fails.append("tokens per expert %s, reference %s" % (tpe.tolist(), fmap.sum(dim=0).tolist()))
    if c["dropped"] != dropped or c["capacity"] != cap:
        fails.append("dropped %d capacity %d, reference %d %d" % (c["dropped"], c["capacity"], dropped, cap))
    errs = {}
    checks = [("probs", load(d, "probs.bin"), probs.detach().flatten(), [("", 0, N * E)]),
              ("y", load(d, "y.bin"), y.detach().flatten(), [("", 0, N * h)]),
              ("dx", load(d, "dx.bin"), x.grad.flatten(), [("", 0, N * h)]),
              ("dparams", load(d, "dparams.bin"), dP,
               [("router", 0, o_fc1), ("fc1", o_fc1, o_fc2), ("fc2", o_fc2, o_s1), ("shared", o_s1, total)])]
    tol = BF16_TOL if c.get("bf16") else TOL
    for tag, got, ref, parts in checks:
        for sub, lo, hi in parts:
            if hi <= lo:
                continue
            g, r = got[lo:hi], ref[lo:hi]
            err = float((g - r).abs().max() / max(float(r.abs().max()), 1e-3))
            key = tag + ("." + sub if sub else "")
            errs[key] = err
            if not err <= tol:
                fails.append("%s: relative error %.3g > %g" % (key, err, tol))
    if y_full is not None:
        got = load(d, "y.bin")
        e_full = float((got - y_full.flatten()).abs().max() / max(float(y_full.abs().max()), 1e-3))
        if not e_full > TOL:
            fails.append("y within %.3g of the full-precision products: not bf16" % e_full)
    for tag, got, ref in [("aux_loss", c["aux_loss"], float(aux)), ("z_loss", c["z_loss"], float(z))]:
        err = abs(got - ref) / max(abs(ref), 1e-12) if ref != 0 else abs(got)
        errs[tag] = err
        if not err <= TOL:
            fails.append("%s: %.9g, reference %.9g" % (tag, got, ref))
    worst = max(errs, key=errs.get)
    print("%-44s %s  worst %.2e (%s) dropped %d cap %d aux %.6g z %.6g" % (
        name, "ok  " if not fails else "FAIL", errs[worst], worst, dropped, cap, float(aux), float(z)))
    for f in fails:
        print("    " + f)
    return not fails


def main():
    return run_cases(__doc__, check_case, "torch %s: " % torch.__version__, TOL)


if __name__ == "__main__":
    sys.exit(main())
