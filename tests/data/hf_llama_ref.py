"""Independent Llama forward pass in numpy over a Hugging Face Llama export (model.safetensors
+ config.json), to check that `cohort ckpt convert --to hf-llama` writes a model computing the
loss cohort computes. It knows nothing of cohort: it reads the file by the safetensors format
and runs LlamaForCausalLM's forward from the HF tensor names and config.json keys as
transformers' modeling_llama.py does:
  x = embed_tokens[tokens]
  per layer: h = rmsnorm(x, input_layernorm); q, k, v = h @ q_proj^T, k_proj^T, v_proj^T
             q, k = rope(q), rope(k)      (rotate_half: pairs (i, i + head_dim/2),
                                           inv_freq = rope_theta^(-2i/head_dim))
             x += o_proj(softmax(q k^T / sqrt(head_dim), causal) v)   (key/value head
                                           h // (num_attention_heads / num_key_value_heads))
             h = rmsnorm(x, post_attention_layernorm)
             x += down_proj(silu(gate_proj(h)) * up_proj(h))
  logits = rmsnorm(x, model.norm) @ lm_head^T (embed_tokens when tie_word_embeddings)
rmsnorm(x, w) = w * x / sqrt(mean(x^2) + rms_norm_eps). Linear weights are [out, in]
(nn.Linear). head_dim is config.json's, else hidden_size / num_attention_heads. All in float64.

  hf_llama_ref.py MODEL_DIR ITEMS
ITEMS is the output of `cohort data order --items`; prints "loss L tokens N", the mean of
-log softmax(logits)[label] over the positions with mask 1, as cohort's evaluation averages it.
The token positions are each sample's own (0..T-1), as HF's default position_ids."""
import json
import sys

import numpy as np

import hf_gpt2_ref as G  # the safetensors reader and the --items reader only


def load(model_dir):
    cfg = json.load(open(model_dir + "/config.json"))
    w = G.read_safetensors(model_dir + "/model.safetensors")
    assert cfg["model_type"] == "llama", cfg["model_type"]
    assert cfg.get("rope_scaling") is None, cfg["rope_scaling"]
    assert cfg.get("hidden_act", "silu") == "silu", cfg["hidden_act"]
    assert w["model.embed_tokens.weight"].shape[0] == cfg["vocab_size"]
    return cfg, w


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope(x, theta):
    """x [heads, T, hd]: HF's apply_rotary_pos_emb with position_ids 0..T-1."""
    T, hd = x.shape[1], x.shape[2]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    emb = np.concatenate([ang, ang], axis=-1)
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def silu(x):
    return x / (1.0 + np.exp(-x))


def logits(cfg, w, tokens):
    T = len(tokens)
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or C // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd).transpose(1, 0, 2)
        q, k = rope(q, theta), rope(k, theta)
        rep = H // KV  # repeat_kv: query head i uses key/value head i // rep
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, H * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        f = silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + f @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


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
    items = G.read_items(sys.argv[2])
    assert items, "no samples in " + sys.argv[2]
    loss, n = mean_loss(cfg, w, items)
    print("loss %.9e tokens %d" % (loss, n))
