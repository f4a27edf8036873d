#!/usr/bin/env python3
"""moe_ref.py - cohort's MoE layer (model/moe.c) against a numpy restatement of Megatron core's
router and MoE layer (megatron/core/transformer/moe/{router.py, moe_utils.py}).

tests/unit/model/test_moe.c writes one directory per configuration: config.txt (the settings,
and cohort's aux loss, z loss, drop count and capacity), the inputs x.bin [N,h], params.bin
(moe.h's flat layout), bias.bin [E] (the expert bias), dy.bin [N,h], and cohort's outputs
y.bin, dx.bin, dparams.bin, map.bin (uint8 [N,E]), probs.bin [N,E], tpe.bin (int32 [E]).

This script recomputes everything in float64 from the same float32 inputs:
  - forward: Megatron's topk_routing_with_score_function, apply_router_token_dropping,
    compute_routing_scores_for_aux_loss, switch/sequence load-balancing losses, z_loss_func,
    permute -> expert MLPs -> unpermute weighted by the probs, plus the shared expert;
  - backward: the experts and the shared expert by hand (matrix calculus), the router's
    logits gradient by central differences in float64 (h = 1e-5) of the differentiable
    function the routing decisions fix (selection, drops and counts held, as autograd sees
    them), so it does not restate cohort's analytic router gradient.
Compared: routing map, tokens per expert, drops and capacity exactly; probs, y, dx,
dparams with max|cohort - ref| <= TOL * max(max|ref|, 1e-3) per tensor, the losses with
relative TOL; TOL = 5e-6 (fp32 products of h <= 64 terms against float64). Prints the
measured errors per configuration.

Ties in every top-k: larger first, then the lower index (a stable argsort), as moe.h says.

usage: moe_ref.py [--rm] ROOT    (--rm: delete ROOT when every configuration passes)
"""
import os
import sys

from ref_cases import run_cases

import numpy as np

TOL = 5e-6


def read_cfg(d):
    cfg = {}
    with open(os.path.join(d, "config.txt")) as f:
        for line in f:
            k, v = line.strip().split("=", 1)
            cfg[k] = v
    ints = ["hidden", "num_experts", "ffn_hidden", "topk", "pre_softmax", "num_groups", "group_topk", "expert_bias",
            "pad_to_capacity", "swiglu", "shared_ffn", "B", "T", "dropped", "capacity"]
    floats = ["scaling_factor", "aux_coeff", "z_coeff", "capacity_factor", "loss_scale", "aux_loss", "z_loss"]
    for k in ints:
        cfg[k] = int(cfg[k])
    for k in floats:
        cfg[k] = float(cfg[k])
    return cfg


def load(d, name, dtype=np.float32):
    return np.fromfile(os.path.join(d, name), dtype=dtype)


def topk(v, k):
    """indices of the k largest of v, larger first, ties to the lower index"""
    return np.argsort(-v, kind="stable")[:k]


def softmax(v):
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def group_limited_topk(scores, k, G, gk):
    """Megatron's group_limited_topk for one token's scores [E]"""
    E = scores.shape[0]
    grp = scores.reshape(G, E // G)
    gscore = np.array([np.sort(g)[::-1][: k // gk].sum() for g in grp])
    keep = np.zeros(G, bool)
    keep[topk(gscore, gk)] = True
    masked = np.where(np.repeat(keep, E // G), scores, -np.inf)
    return topk(masked, k)


def sinkhorn(cost, tol=0.0001):
    """Megatron's moe_utils.sinkhorn"""
    cost = np.exp(cost)
    d0 = np.ones(cost.shape[0])
    d1 = np.ones(cost.shape[1])
    eps = 0.00000001
    error = 1e9
    d1_old = d1
    while error > tol:
        d0 = (1 / d0.shape[0]) * 1 / (np.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.shape[0]) * 1 / (np.sum(d0[:, None] * cost, 0) + eps)
        error = np.mean(np.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0[:, None]


def sinkhorn_activation(logits, k):
    """router.py's _sinkhorn_activation"""
    return sigmoid(logits) if k == 1 else softmax(logits)


def select(logits, bias, c):
    """selection per token (topk_routing_with_score_function's indices) [N,k]"""
    N, E = logits.shape
    k = c["topk"]
    sel = np.zeros((N, k), np.int64)
    if c["lb"] == "sinkhorn":
        # sinkhorn_load_balancing: training chooses by the balanced scores, else by the activation
        v = sinkhorn(logits) if c.get("train", "1") == "1" else sinkhorn_activation(logits, k)
        for n in range(N):
            sel[n] = topk(v[n], k)
        return sel
    for n in range(N):
        l = logits[n]
        if c["score"] == "softmax":
            r = softmax(l) if c["pre_softmax"] else l
        else:
            r = sigmoid(l) + (bias if c["expert_bias"] else 0.0)
        if c["num_groups"] > 0:
            sel[n] = group_limited_topk(r, k, c["num_groups"], c["group_topk"])
        else:
            sel[n] = topk(r, k)
    return sel


def routing_probs(logits, sel, c):
    """the dense routing probs [N,E] for a fixed selection: differentiable in logits"""
    N, E = logits.shape
    k = c["topk"]
    rows = np.arange(N)[:, None]
    if c["lb"] == "sinkhorn":
        p = sinkhorn_activation(logits, k)[rows, sel]
    elif c["score"] == "softmax":
        if c["pre_softmax"]:
            p = softmax(logits)[rows, sel]
        else:
            p = softmax(logits[rows, sel])
    else:
        s = sigmoid(logits[rows, sel])
        p = s / (s.sum(axis=1, keepdims=True) + 1e-20) if k > 1 else s
    if c["scaling_factor"]:
        p = p * c["scaling_factor"]
    out = np.zeros((N, E))
    out[rows, sel] = p
    return out


def token_dropping(rprobs, rmap, c):
    """apply_router_token_dropping: (final map, capacity) ; capacity 0 when dropless"""
    N, E = rprobs.shape
    if not c["capacity_factor"] > 0:
        return rmap.copy(), 0
    cap = int(np.ceil(N * c["topk"] / E * c["capacity_factor"]))
    cap = min(cap, N)  # torch.topk would refuse k > N; cohort clamps
    cmask = np.zeros((N, E), bool)
    for e in range(E):
        v = rprobs[:, e] if c["drop"] == "probs" else rmap[:, e].astype(np.float64)
        cmask[topk(v, cap), e] = True
    final = cmask if c["pad_to_capacity"] else (rmap & cmask)
    return final, cap


def aux_scores(logits, c):
    """compute_routing_scores_for_aux_loss's scores [N,E]"""
    if c["score"] == "softmax":
        return softmax(logits)
    s = sigmoid(logits)
    return s / (s.sum(axis=1, keepdims=True) + 1e-20)


def aux_counts(a, c):
    """its routing map's counts: [nseq, E]"""
    N, E = a.shape
    B, T = c["B"], c["T"]
    amap = np.zeros((N, E), bool)
    for n in range(N):
        amap[n, topk(a[n], c["topk"])] = True
    if c["lb"] == "seq_aux_loss":
        return amap.reshape(B, T, E).sum(axis=1)
    return amap.sum(axis=0, keepdims=True)


def lb_loss(a, cnt, c):
    """switch_load_balancing_loss_func (per sequence for seq_aux_loss, then / B)"""
    N, E = a.shape
    k = c["topk"]
    if c["lb"] in ("none", "sinkhorn"):
        return 0.0
    if c["lb"] == "aux_loss":
        return c["aux_coeff"] * E / (k * N * N) * float((a.sum(axis=0) * cnt[0]).sum())
    B, T = c["B"], c["T"]
    per = a.reshape(B, T, E).sum(axis=1)
    return c["aux_coeff"] * float(sum(E / (k * T * T) * (per[b] * cnt[b]).sum() for b in range(B))) / B


def z_loss(logits, c):
    if not c["z_coeff"] > 0:
        return 0.0
    m = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
    return float(np.mean(lse ** 2) * c["z_coeff"])


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_grad(x):
    c0 = np.sqrt(2.0 / np.pi)
    t = np.tanh(c0 * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c0 * (1.0 + 3 * 0.044715 * x * x)


def mlp_fwd(x, W1, W2, swiglu):
    h1 = x @ W1.T
    if swiglu:
        F = h1.shape[1] // 2
        a, g = h1[:, :F], h1[:, F:]
        act = a * sigmoid(a) * g
    else:
        act = gelu(h1)
    return h1, act, act @ W2.T


def mlp_bwd(dout, x, h1, act, W1, W2, swiglu):
    dW2 = dout.T @ act
    dact = dout @ W2
    if swiglu:
        F = h1.shape[1] // 2
        a, g = h1[:, :F], h1[:, F:]
        s = sigmoid(a)
        dh1 = np.concatenate([dact * g * s * (1.0 + a * (1.0 - s)), dact * a * s], axis=1)
    else:
        dh1 = dact * gelu_grad(h1)
    return dh1 @ W1, dh1.T @ x, dW2


def check_case(d):
    c = read_cfg(d)
    h, E, F, k = c["hidden"], c["num_experts"], c["ffn_hidden"], c["topk"]
    B, T = c["B"], c["T"]
    N = B * T
    sw = c["swiglu"]
    F1 = 2 * F if sw else F
    Fs = c["shared_ffn"]
    Fs1 = 2 * Fs if sw else Fs
    x = load(d, "x.bin").astype(np.float64).reshape(N, h)
    dy = load(d, "dy.bin").astype(np.float64).reshape(N, h)
    P = load(d, "params.bin").astype(np.float64)
    bias = load(d, "bias.bin").astype(np.float64)
    o_router = 0
    o_fc1 = o_router + E * h
    o_fc2 = o_fc1 + E * F1 * h
    o_s1 = o_fc2 + E * h * F
    o_s2 = o_s1 + Fs1 * h
    total = o_s2 + h * Fs
    assert P.size == total, (P.size, total)
    Wr = P[o_router:o_fc1].reshape(E, h)
    W1 = P[o_fc1:o_fc2].reshape(E, F1, h)
    W2 = P[o_fc2:o_s1].reshape(E, h, F)
    Ws1 = P[o_s1:o_s2].reshape(Fs1, h)
    Ws2 = P[o_s2:total].reshape(h, Fs)

    # ---- forward ----
    logits = x @ Wr.T
    sel = select(logits, bias, c)
    rmap = np.zeros((N, E), bool)
    rmap[np.arange(N)[:, None], sel] = True
    rprobs = routing_probs(logits, sel, c)
    fmap, cap = token_dropping(rprobs, rmap, c)
    probs = rprobs * fmap
    dropped = int((rmap & ~fmap).sum())
    a = aux_scores(logits, c)
    cnt = aux_counts(a, c)
    aux = lb_loss(a, cnt, c)
    z = z_loss(logits, c)
    y = np.zeros((N, h))
    saved = []
    for e in range(E):
        toks = np.nonzero(fmap[:, e])[0]  # permute: token order within the expert
        if toks.size == 0:
            continue
        h1, act, out = mlp_fwd(x[toks], W1[e], W2[e], sw)
        y[toks] += probs[toks, e][:, None] * out  # unpermute, weighted
        saved.append((e, toks, h1, act, out))
    if Fs:
        sh1, sact, sout = mlp_fwd(x, Ws1, Ws2, sw)
        y += sout

    # ---- backward ----
    dx = np.zeros((N, h))
    dP = np.zeros(total)
    dprob = np.zeros((N, E))
    for e, toks, h1, act, out in saved:
        dprob[toks, e] = (dy[toks] * out).sum(axis=1)
        dxe, dW1, dW2 = mlp_bwd(probs[toks, e][:, None] * dy[toks], x[toks], h1, act, W1[e], W2[e], sw)
        np.add.at(dx, toks, dxe)
        dP[o_fc1 + e * F1 * h: o_fc1 + (e + 1) * F1 * h] += dW1.ravel()
        dP[o_fc2 + e * h * F: o_fc2 + (e + 1) * h * F] += dW2.ravel()
    if Fs:
        dxs, dWs1, dWs2 = mlp_bwd(dy, x, sh1, sact, Ws1, Ws2, sw)
        dx += dxs
        dP[o_s1:o_s2] += dWs1.ravel()
        dP[o_s2:total] += dWs2.ravel()
    ls = c["loss_scale"]

    def router_objective(lg):
        """the part of the loss that depends on the logits, decisions fixed"""
        v = (dprob * routing_probs(lg, sel, c) * fmap).sum()
        return v + ls * (lb_loss(aux_scores(lg, c), cnt, c) + z_loss(lg, c))

    dlogits = np.zeros((N, E))
    eps = 1e-5
    for n in range(N):
        for e in range(E):
            lp = logits.copy()
            lp[n, e] += eps
            lm = logits.copy()
            lm[n, e] -= eps
            dlogits[n, e] = (router_objective(lp) - router_objective(lm)) / (2 * eps)
    dx += dlogits @ Wr
    dP[o_router:o_fc1] += (dlogits.T @ x).ravel()

    # ---- compare ----
    name = os.path.basename(d)
    fails = []
    cm = load(d, "map.bin", np.uint8).reshape(N, E).astype(bool)
    if not np.array_equal(cm, fmap):
        fails.append("routing map differs at %d entries" % int((cm != fmap).sum()))
    tpe = load(d, "tpe.bin", np.int32)
    if not np.array_equal(tpe, fmap.sum(axis=0)):
        fails.append("tokens per expert %s, reference %s" % (tpe.tolist(), fmap.sum(axis=0).tolist()))
    if c["dropped"] != dropped or c["capacity"] != cap:
        fails.append("dropped %d capacity %d, reference %d %d" % (c["dropped"], c["capacity"], dropped, cap))
    errs = {}
    for tag, got, ref in [("probs", load(d, "probs.bin").reshape(N, E), probs), ("y", load(d, "y.bin").reshape(N, h), y),
                          ("dx", load(d, "dx.bin").reshape(N, h), dx), ("dparams", load(d, "dparams.bin"), dP)]:
        for sub, sl in ([("router", slice(o_router, o_fc1)), ("fc1", slice(o_fc1, o_fc2)), ("fc2", slice(o_fc2, o_s1)),
                         ("shared", slice(o_s1, total))] if tag == "dparams" else [("", slice(None))]):
            g, r = got.reshape(-1)[sl].astype(np.float64), ref.reshape(-1)[sl]
            if r.size == 0:
                continue
            err = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-3))
            errs[tag + ("." + sub if sub else "")] = err
            if not err <= TOL:
                fails.append("%s%s: relative error %.3g > %g" % (tag, "." + sub if sub else "", err, TOL))
    for tag, got, ref in [("aux_loss", c["aux_loss"], aux), ("z_loss", c["z_loss"], z)]:
        err = abs(got - ref) / max(abs(ref), 1e-12) if ref != 0 else abs(got)
        errs[tag] = err
        if not err <= TOL:
            fails.append("%s: %.9g, reference %.9g" % (tag, got, ref))
    worst = max(errs.values()) if errs else 0.0
    print("%-44s %s  worst %.2e (%s) dropped %d cap %d aux %.6g z %.6g" % (
        name, "ok  " if not fails else "FAIL", worst, max(errs, key=errs.get), dropped, cap, aux, z))
    for f in fails:
        print("    " + f)
    return not fails


def main():
    return run_cases(__doc__, check_case, "", TOL)


if __name__ == "__main__":
    sys.exit(main())
