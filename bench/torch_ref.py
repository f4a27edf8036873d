#!/usr/bin/env python3
"""torch_ref.py - PyTorch baseline for bench/bench_train.c: the same GPT (learned positions,
pre-LayerNorm, tanh-GELU MLP, tied LM head, biases, dropout off), the same step (forward,
backward, AdamW on one micro batch of random tokens), the same report.

    python3 bench/torch_ref.py --layers 12 --hidden 768 --heads 12 \
        --seq 256 --micro 4 --vocab 50257 [--steps 6] [--warmup 2] [--threads 2] [--json]

bench/run.sh sets OPENBLAS_CORETYPE only where OpenBLAS falls back to kernels without AVX2
(bench/cpuinfo.py --openblas-coretype). Peak memory is the process's peak resident set
(ru_maxrss), as for cohort. The result records the CPU (model name, ISA flags) and the
OpenBLAS core the products ran on."""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpuinfo  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc1 = nn.Linear(C, 4 * C)
        self.fc2 = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, H, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x, self.mask)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    V = (a.vocab + 127) // 128 * 128  # padded like cohort/Megatron
    model = GPT(a.layers, a.hidden, a.heads, a.seq, V)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    idx = torch.randint(0, a.vocab, (a.micro, a.seq))
    tgt = torch.randint(0, a.vocab, (a.micro, a.seq))
    total = 0.0
    loss = None
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            total += dt
    N = a.micro * a.seq
    ms = 1000 * total / a.steps
    C, L, T = a.hidden, a.layers, a.seq
    flops = 12 * a.micro * T * L * C * C * ((1 + 1 + T / C) + 4 + V / (2 * L * C))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    r = dict(layers=L, hidden=C, seq=T, micro=a.micro, vocab=a.vocab, ms_per_step=round(ms, 1),
             tokens_per_s=round(N / (total / a.steps), 1), model_gflops=round(flops / (total / a.steps) / 1e9, 1),
             peak_rss_mb=rss, loss=round(loss.item(), 4), torch=torch.__version__, threads=torch.get_num_threads())
    ob = cpuinfo.openblas()
    r["blas"] = dict(ob or {"library": "not OpenBLAS"}, coretype_env=os.environ.get("OPENBLAS_CORETYPE"))
    r["cpu"] = cpuinfo.cpu()
    if a.json:
        print(json.dumps(r))
    else:
        print(cpuinfo.line())
        print("blas: %s, core %s%s" % (r["blas"]["library"], r["blas"].get("core", "-"),
                                       " (OPENBLAS_CORETYPE=%s)" % r["blas"]["coretype_env"] if r["blas"]["coretype_env"] else ""))
        print("pytorch %s L=%d C=%d T=%d B=%d: %.1f ms/step, %.1f tokens/s, model %.1f GFLOP/s, peak RSS %d MB"
              % (torch.__version__, L, C, T, a.micro, ms, r["tokens_per_s"], r["model_gflops"], rss))


if __name__ == "__main__":
    main()
