"""Independent GPT-2 forward pass in numpy over a Hugging Face GPT-2 export (model.safetensors
+ config.json), to check that `cohort ckpt convert --to hf-gpt2` writes a model computing the
loss cohort computes. It knows nothing of cohort: it reads the file by the safetensors format
(u64 little-endian header length, JSON header, raw little-endian data) and runs
GPT2LMHeadModel's forward from the HF tensor names as transformers' modeling_gpt2.py does:
  x = wte[tokens] + wpe[arange(T)]
  per block: x += c_proj(attn(c_attn(ln_1(x))));  x += mlp.c_proj(act(mlp.c_fc(ln_2(x))))
  logits = ln_f(x) @ wte^T (lm_head tied), over config.json's vocab_size rows
Conv1D weights are [in, out] (y = x @ W + b); c_attn's output columns are [q | k | v], each
split into n_head heads of n_embd/n_head; causal attention scaled by 1/sqrt(head_dim);
LayerNorm with layer_norm_epsilon; activation_function gelu_new (tanh form) or gelu (erf).
All arithmetic in float64.

  hf_gpt2_ref.py MODEL_DIR ITEMS
ITEMS is the output of `cohort data order --items` (sample lines followed by tokens, labels,
positions, seg and mask rows); prints "loss L tokens N": the mean of -log softmax(logits)[label]
over the positions with mask 1, as cohort's evaluation averages it."""
import json
import math
import struct
import sys

import numpy as np

DT = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BF16": None, "I64": "<i8", "I32": "<i4", "U8": "u1"}


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    data = buf[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        dt = DT[t["dtype"]]
        if dt is None:
            raise SystemExit("dtype %s not handled by this reader" % t["dtype"])
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(t["shape"]).astype(np.float64)
    return out


def load(model_dir):
    cfg = json.load(open(model_dir + "/config.json"))
    w = read_safetensors(model_dir + "/model.safetensors")
    # transformers accepts names with or without the "transformer." prefix
    w = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in w.items()}
    assert cfg["model_type"] == "gpt2", cfg["model_type"]
    assert w["wte.weight"].shape[0] == cfg["vocab_size"], (w["wte.weight"].shape, cfg["vocab_size"])
    return cfg, w


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def act(x, name):
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    raise SystemExit("activation %s not handled" % name)


def logits(cfg, w, tokens):
    T = len(tokens)
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = C // H
    x = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(T)]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(cfg["n_layer"]):
        p = "h.%d." % l
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, hd).transpose(1, 0, 2) for i in range(3))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        f = act(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], cfg.get("activation_function", "gelu_new"))
        x = x + f @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w.get("lm_head.weight", w["wte.weight"])
    return x @ head.T


def read_items(path):
    """The samples of `cohort data order --items`: a list of dicts of int arrays."""
    items, cur = [], None
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        if not line.startswith("  "):
            cur = {"sample": int(line.split()[0])}
            items.append(cur)
            continue
        f = line.split()
        cur[f[0]] = np.array([int(v) for v in f[1:]], dtype=np.int64)
    return items


def mean_loss(cfg, w, items):
    total, count = 0.0, 0.0
    for it in items:
        z = logits(cfg, w, it["tokens"])
        m = z.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
        ce = lse - z[np.arange(len(it["labels"])), it["labels"]]
        total += float((ce * it["mask"]).sum())
        count += float(it["mask"].sum())
    return total / count, count


if __name__ == "__main__":
    cfg, w = load(sys.argv[1])
    items = read_items(sys.argv[2])
    assert items, "no samples in " + sys.argv[2]
    loss, n = mean_loss(cfg, w, items)
    print("loss %.9e tokens %d" % (loss, n))
