#!/usr/bin/env python3
"""mtp_torch_ref.py - cohort's GPT with multi-token prediction (model/gpt_mtp.c) against PyTorch
(Debian's python3-torch), in float64, every gradient from autograd.

tests/unit/model/test_gpt.c (test_mtp_against_torch) writes one directory per configuration:
config.txt (the model's shape and flags, MTP depths D and scaling factor, the batch shape),
tensors.txt (one line per tensor of cohort's table: name, offset, rows, cols), params.bin and
grads.bin (the flat buffers, float32: the weights and cohort's gradient of the objective),
tokens.bin, targets.bin, positions.bin (int32 [B*T]), mask.bin (float32 [B*T]) and losses.txt
(cohort's main masked mean loss, then each depth's).

The reference builds the model from the same weights, written the way Megatron's
GPTModel + MultiTokenPredictionBlock compute it:
  main:    x = wte[tok] + wpe[pos]; L pre-norm layers (attention with rope or learned positions,
           GELU or SwiGLU MLP); h = final_norm(x); loss = sum(CE(h Wlm^T, tgt) mask) / sum(mask)
  depth k: roll_tensor: tokens, positions, labels and the loss mask shifted k+1 places left per
           sequence, zero-filled; e = wte[tok_k] (+ wpe[pos_k]); x = eh_proj([enorm(e) | hnorm(h)]);
           one layer (positions pos_k); h = final_layernorm_k(x); loss_k as above with the rolled
           labels and mask; the next depth's h is this one
  objective = loss + mtp_loss_scaling_factor / D * sum_k loss_k
and compares the losses (relative 1e-5) and every tensor's gradient
(max|cohort - ref| <= 2e-5 * max(max|ref|, 1e-3)): cohort computes in float32.

usage: mtp_torch_ref.py [--rm] ROOT    exit 0 agree, 1 disagree, 77 no torch
"""
import math
import os
import sys

from ref_cases import run_cases

try:
    import torch
    import torch.nn.functional as Fn
except ImportError:
    print("mtp_torch_ref.py: python3-torch is not installed")
    sys.exit(77)
import numpy as np

TOL = 2e-5
torch.set_default_dtype(torch.float64)


def read_kv(path):
    d = {}
    for line in open(path):
        k, v = line.strip().split("=", 1)
        d[k] = float(v) if "." in v or "e" in v else int(v)
    return d


def check(d):
    c = read_kv(os.path.join(d, "config.txt"))
    L, C, NH, NKV, HD, F = c["layers"], c["hidden"], c["heads"], c["kv_groups"], c["head_dim"], c["ffn"]
    V, B, T, D = c["padded_vocab"], c["B"], c["T"], c["mtp"]
    eps, base, scale = c["norm_eps"], c["rotary_base"], c["mtp_scale"]
    P = torch.from_numpy(np.fromfile(os.path.join(d, "params.bin"), np.float32).astype(np.float64))
    G = np.fromfile(os.path.join(d, "grads.bin"), np.float32).astype(np.float64)
    W, shapes = {}, {}
    for line in open(os.path.join(d, "tensors.txt")):
        name, off, rows, cols = line.split()
        off, rows, cols = int(off), int(rows), int(cols)
        n = rows * max(cols, 1)
        W[name] = P[off:off + n].reshape((rows, cols) if cols else (rows,)).clone().requires_grad_(True)
        shapes[name] = (off, n)
    ld = lambda f, t: torch.from_numpy(np.fromfile(os.path.join(d, f), t).astype(np.int64 if t == np.int32 else np.float64))
    tok, tgt, pos, mask = ld("tokens.bin", np.int32), ld("targets.bin", np.int32), ld("positions.bin", np.int32), ld("mask.bin", np.float32)
    tok, tgt, pos, mask = (a.reshape(B, T) for a in (tok, tgt, pos, mask))

    def norm(x, p):
        w = W[p + ".weight"]
        if c["rmsnorm"]:
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w
        return Fn.layer_norm(x, (C,), w, W[p + ".bias"], eps)

    def lin(x, p, bias=True):
        y = x @ W[p + ".weight"].t()
        if bias and c["bias"] and (p + ".bias") in W:
            y = y + W[p + ".bias"]
        return y

    def rope(x, positions):  # x [B, T, heads, HD]: pairs (i, i + HD/2), angle pos * base^(-2i/HD)
        half = HD // 2
        inv = torch.tensor([base ** (-2.0 * i / HD) for i in range(half)])
        a = positions.unsqueeze(-1).double() * inv  # [B, T, half]
        cs, sn = torch.cos(a).unsqueeze(2), torch.sin(a).unsqueeze(2)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cs - x2 * sn, x2 * cs + x1 * sn], -1)

    def layer(x, p, positions):
        h = norm(x, p + "input_norm")
        qkv = lin(h, p + "attention.qkv")
        q = qkv[..., :NH * HD].reshape(B, T, NH, HD)
        k = qkv[..., NH * HD:(NH + NKV) * HD].reshape(B, T, NKV, HD)
        v = qkv[..., (NH + NKV) * HD:].reshape(B, T, NKV, HD)
        if c["rope"]:
            q, k = rope(q, positions), rope(k, positions)
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # [B, NH, T, HD]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        s = s.masked_fill(~causal, float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, NH * HD)
        x = x + lin(a, p + "attention.proj")
        h = norm(x, p + "mlp_norm")
        f = lin(h, p + "mlp.fc1")
        if c["swiglu"]:
            g, u = f[..., :F], f[..., F:]
            act = Fn.silu(g) * u
        else:
            act = Fn.gelu(f, approximate="tanh")
        return x + lin(act, p + "mlp.fc2")

    wte = W["embedding.word_embeddings.weight"]
    wlm = wte if c["tied"] else W["output_layer.weight"]

    def embed(t, positions):
        e = wte[t]
        if not c["rope"]:
            e = e + W["embedding.position_embeddings.weight"][positions]
        return e

    def masked_ce(h, labels, m):
        logits = h @ wlm.t()
        ce = Fn.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none").reshape(B, T)
        n = m.sum()
        return (ce * m).sum() / (n if n > 0 else 1)

    def roll(a):  # one place left per sequence, zero-filled (Megatron's roll_tensor at cp 1)
        r = torch.roll(a, -1, dims=-1).clone()
        r[:, -1] = 0
        return r

    x = embed(tok, pos)
    for l in range(L):
        x = layer(x, "layers.%d." % l, pos)
    h = norm(x, "final_norm")
    loss = masked_ce(h, tgt, mask)
    obj = loss
    mtp_losses = []
    tk, pk, lk, mk = tok, pos, tgt, mask
    for k in range(D):
        tk, pk, lk, mk = roll(tk), roll(pk), roll(lk), roll(mk)
        p = "mtp.layers.%d." % k
        e = norm(embed(tk, pk), p + "enorm")
        hh = norm(h, p + "hnorm")
        x = torch.cat([e, hh], -1) @ W[p + "eh_proj.weight"].t()
        x = layer(x, p + "transformer_layer.", pk)
        h = norm(x, p + "final_layernorm")
        lk_loss = masked_ce(h, lk, mk)
        mtp_losses.append(lk_loss)
        obj = obj + scale / D * lk_loss
    obj.backward()

    got = [float(v) for v in open(os.path.join(d, "losses.txt")).read().split()]
    ref = [float(loss)] + [float(v) for v in mtp_losses]
    fails = []
    worst_l = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    if len(got) != len(ref) or worst_l > 1e-5:
        fails.append("losses %s, reference %s" % (got, ref))
    worst, wname = 0.0, ""
    for name, t in W.items():
        off, n = shapes[name]
        g = G[off:off + n]
        r = t.grad.flatten().numpy() if t.grad is not None else np.zeros(n)
        err = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-3))
        if err > worst:
            worst, wname = err, name
        if not err <= TOL:
            fails.append("%s: relative gradient error %.3g" % (name, err))
    print("%-32s %s  losses %s  worst loss rel %.1e, gradient %.2e (%s), %d tensors" % (
        os.path.basename(d), "ok  " if not fails else "FAIL", " ".join("%.6f" % v for v in ref), worst_l, worst, wname,
        len(W)))
    for f in fails[:10]:
        print("    " + f)
    return not fails


def main():
    return run_cases(__doc__, check, "torch %s: " % torch.__version__, None)


if __name__ == "__main__":
    sys.exit(main())
