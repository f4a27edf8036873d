#!/usr/bin/env python3
"""gpu_torch.py - PyTorch baseline for bench/gpu_bench.c on the GPU: the same GPT (GPT-2 124M
shapes by default: learned positions, pre-LayerNorm, tanh-GELU MLP, tied LM head, biases,
dropout off), the same step (forward, backward, clip, AdamW on one micro batch of random
tokens), bf16 autocast with fp32 master weights, eager and then torch.compile in the same
call. Prints one JSON line per mode, each with the host CPU (bench/cpuinfo.py: model name and
ISA flags). Without torch (or CUDA in torch) it says so and exits 0.

    python3 bench/gpu_torch.py [--layers 12] [--hidden 768] [--heads 12] [--seq 1024]
        [--micro 16] [--vocab 50257] [--steps 10] [--warmup 3] [--modes eager,compile]"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpuinfo  # noqa: E402

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means no baseline
    print(json.dumps({"engine": "pytorch", "skipped": "torch is not importable: %s" % e, "cpu": cpuinfo.cpu()}))
    sys.exit(0)


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

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def run(a, mode):
    torch.manual_seed(0)
    V = (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.hidden, a.heads, a.seq, V).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    idx = torch.randint(0, a.vocab, (a.micro, a.seq), device="cuda")
    tgt = torch.randint(0, a.vocab, (a.micro, a.seq), device="cuda")
    total, loss = 0.0, None
    torch.cuda.reset_peak_memory_stats()
    for s in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        if s >= a.warmup:
            total += time.perf_counter() - t0
    C, L, T, B = a.hidden, a.layers, a.seq, a.micro
    step = total / a.steps
    flops = 12 * B * T * L * C * C * ((1 + 1 + T / C) + 4 + V / (2 * L * C))
    return dict(engine="pytorch", mode=mode, torch=torch.__version__, layers=L, hidden=C, seq=T, micro=B,
                ms_per_step=round(1e3 * step, 2), tokens_per_s=round(B * T / step), model_tflops=round(flops / step / 1e12, 2),
                gpu_mem_peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=round(loss.item(), 4),
                gpu=torch.cuda.get_device_name(), cpu=cpuinfo.cpu())


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=12, hidden=768, heads=12, seq=1024, micro=16, vocab=50257, steps=10, warmup=3).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--modes", default="eager,compile")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"engine": "pytorch", "skipped": "torch %s has no usable CUDA device" % torch.__version__,
                          "cpu": cpuinfo.cpu()}))
        return
    for mode in a.modes.split(","):
        try:
            print(json.dumps(run(a, mode)), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on to the next mode
            print(json.dumps({"engine": "pytorch", "mode": mode, "failed": repr(e)[:300]}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
