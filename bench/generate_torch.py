#!/usr/bin/env python3
"""generate_torch.py - GPT-2 text generation with a KV cache in PyTorch, the reference that
bench/generate_bench.sh times `cohort generate` against.

    generate_torch.py MODEL_DIR --prompt-ids I,J,... --new-tokens N [--threads T] [--bf16] [--runs R]

MODEL_DIR is a Hugging Face GPT-2 export (`cohort ckpt convert CKPT --to hf-gpt2`):
model.safetensors, read here by the safetensors format by hand (u64 little-endian header
length, JSON header, raw data), and config.json. The model is transformers' GPT2LMHeadModel
written out: learned positions, pre-LayerNorm, tanh GELU, tied head; Conv1D weights [in, out].
Generation as `cohort generate --greedy`: the prompt prefilled in one forward, then one
position per new token, each layer's keys and values appended to a cache (preallocated, as
cohort's), the next token the argmax of the real vocabulary's logits. --bf16 runs the matrix
products in bfloat16 (weights and activations cast, as torch.autocast does on the CPU).

Prints one JSON line: the generated ids, the seconds (best of --runs, prefill included),
tokens per second and the library's details."""
import argparse
import json
import math
import struct
import time

import numpy as np
import torch

DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=DT[t["dtype"]]).reshape(t["shape"])
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        out[key] = torch.from_numpy(a.astype(np.float32))
    return out


class GPT2:
    def __init__(self, model_dir, bf16, cap):
        self.cfg = json.load(open(model_dir + "/config.json"))
        self.w = read_safetensors(model_dir + "/model.safetensors")
        self.dt = torch.bfloat16 if bf16 else torch.float32
        c = self.cfg
        self.L, self.C, self.H = c["n_layer"], c["n_embd"], c["n_head"]
        self.hd = self.C // self.H
        self.eps = c["layer_norm_epsilon"]
        # matrices in the products' type (Conv1D [in, out]); the head is wte^T
        for k in list(self.w):
            if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                self.w[k] = self.w[k].to(self.dt).contiguous()
        self.head = self.w["wte.weight"].t().to(self.dt).contiguous()
        self.k = torch.zeros(self.L, self.H, cap, self.hd)
        self.v = torch.zeros(self.L, self.H, cap, self.hd)
        self.len = 0

    def mm(self, x, W, b=None):
        y = (x.to(self.dt) @ W).float()
        return y + b if b is not None else y

    def step(self, tokens):
        w, T, p0 = self.w, len(tokens), self.len
        ids = torch.tensor(tokens)
        x = w["wte.weight"][ids] + w["wpe.weight"][p0:p0 + T]
        mask = torch.ones(T, p0 + T, dtype=torch.bool).tril(p0)
        for l in range(self.L):
            p = "h.%d." % l
            h = torch.nn.functional.layer_norm(x, (self.C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], self.eps)
            qkv = self.mm(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
            q, k, v = (qkv[:, i * self.C:(i + 1) * self.C].view(T, self.H, self.hd).transpose(0, 1) for i in range(3))
            self.k[l, :, p0:p0 + T] = k
            self.v[l, :, p0:p0 + T] = v
            K, V = self.k[l, :, :p0 + T], self.v[l, :, :p0 + T]
            s = (q @ K.transpose(1, 2)) / math.sqrt(self.hd)
            s = s.masked_fill(~mask, float("-inf")).softmax(-1)
            a = (s @ V).transpose(0, 1).reshape(T, self.C)
            x = x + self.mm(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
            h = torch.nn.functional.layer_norm(x, (self.C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], self.eps)
            f = torch.nn.functional.gelu(self.mm(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]),
                                         approximate="tanh")
            x = x + self.mm(f, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
        self.len = p0 + T
        h = torch.nn.functional.layer_norm(x[-1:], (self.C,), w["ln_f.weight"], w["ln_f.bias"], self.eps)
        return self.mm(h, self.head)[0]


def generate(m, prompt, n, vocab):
    m.len = 0
    logits = m.step(prompt)
    out = []
    for i in range(n):
        t = int(logits[:vocab].argmax())
        out.append(t)
        if i + 1 < n:
            logits = m.step([t])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--prompt-ids", required=True, help="the prompt's ids, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=50257, help="the real vocabulary (greedy over it)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompt = [int(t) for t in a.prompt_ids.split(",")]
    m = GPT2(a.model_dir, a.bf16, len(prompt) + a.new_tokens)
    best, ids = None, None
    with torch.no_grad():
        for _ in range(a.runs):
            t0 = time.perf_counter()
            ids = generate(m, prompt, a.new_tokens, a.vocab)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
    print(json.dumps({"impl": "pytorch", "precision": "bf16" if a.bf16 else "fp32", "torch": torch.__version__,
                      "threads": a.threads, "prompt_tokens": len(prompt), "new_tokens": a.new_tokens,
                      "seconds": round(best, 4), "tokens_per_s": round(a.new_tokens / best, 2), "ids": ids}))


if __name__ == "__main__":
    main()
