/* convert.c - export of a checkpoint to the Hugging Face GPT-2 and Llama layouts
 * (model.safetensors + config.json).
 *
 * GPT-2 (ck_export_hf_gpt2), for models with GPT-2's options: learned positions, LayerNorm,
 * GELU (tanh, HF "gelu_new"), tied embeddings, biases, no grouped-query attention. cohort
 * keeps linear weights PyTorch-style [out, in] with qkv rows [q heads | k heads | v heads];
 * HF GPT-2's Conv1D keeps [in, out] with c_attn columns [q | k | v], so every linear weight
 * is transposed and nothing else moves.
 *
 * Llama (ck_export_hf_llama), for rotary positions, RMSNorm, SwiGLU, no biases: nn.Linear
 * weights are [out, in] as cohort's; qkv's row blocks become q/k/v_proj and fc1's halves
 * gate/up_proj. cohort's rotary embedding rotates the halves of a head (pairs (i, i + hd/2),
 * Megatron's non-interleaved rope), which is HF's rotate_half, so q and k are not permuted.
 *
 * The vocabulary keeps its padded rows by default (config.json's vocab_size = the padded
 * size): cohort's softmax, like Megatron's, runs over all padded_vocab logits, so only then
 * does the exported model compute the loss cohort computes. trim_vocab cuts the rows to the
 * tokenizer's vocabulary; the softmax then runs over those only and the losses differ. */
#include "checkpoint/ckpt.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct out_t {
    char name[CK_NAME_MAX];
    int ndim;
    int64_t shape[CK_MAX_DIMS];
    float *data;  /* owned */
} out_t;

static const float *get(const ck_manifest *m, float **bufs, const char *name, int64_t *r, int64_t *c) {
    const ck_mtensor *t = ck_manifest_find(m, name);
    if (!t || !bufs[t - m->tensors]) return NULL;
    *r = t->shape[0];
    *c = t->ndim > 1 ? t->shape[1] : 1;
    return bufs[t - m->tensors];
}

static int add(out_t *o, int *n, const char *name, const float *src, int64_t rows, int64_t cols, bool vec,
               bool transpose, int64_t keep_rows) {
    out_t *t = &o[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    int64_t r = keep_rows >= 0 ? keep_rows : rows;
    t->data = malloc((size_t)(r * cols) * sizeof(float));
    if (!t->data) return co_err_set(CO_ENOMEM, "convert: out of memory for %s", name);
    if (transpose) {
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < cols; j++) t->data[j * r + i] = src[i * cols + j];
        t->ndim = 2;
        t->shape[0] = cols;
        t->shape[1] = r;
    } else {
        memcpy(t->data, src, (size_t)(r * cols) * sizeof(float));
        t->ndim = vec ? 1 : 2;
        t->shape[0] = vec ? r * cols : r;
        t->shape[1] = cols;
    }
    return 0;
}

/* Ends a file written through tmp: finished (fsync'ed) and renamed to path when rc is 0,
 * else abandoned; tmp never stays behind. Returns the first failure. */
static int commit_file(ck_file *f, int rc, const char *tmp, const char *path) {
    uint8_t h[16];
    if (!rc) rc = ck_file_finish(f, h);
    else ck_file_abort(f);
    if (!rc && rename(tmp, path)) rc = co_err_set(CO_EIO, "convert: renaming %s: %m", tmp);
    if (!rc) rc = fs_fsync_parent(path);
    if (rc) unlink(tmp);
    return rc;
}

/* path := text + "\n" through path.tmp-PID (removed on failure; a dead process's is
 * removed by the next export into the directory, ck_clean_dead_files). */
static int write_replace(const char *path, const char *text, size_t len) {
    char tmp[4500];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    ck_file f;
    int rc = ck_file_create(&f, tmp);
    if (rc) return rc;
    rc = ck_file_write(&f, text, len);
    if (!rc) rc = ck_file_write(&f, "\n", 1);
    return commit_file(&f, rc, tmp, path);
}

/* out_dir/config.json := cfg (consumed), crash-safely. */
static int write_config(const char *out_dir, json_t *cfg) {
    char *text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(cfg);
    if (!text) return co_err_set(CO_ENOMEM, "convert: out of memory");
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    int rc = write_replace(path, text, strlen(text));
    free(text);
    return rc;
}

/* out_dir/model.safetensors := the n tensors (fp32, in order), crash-safely. */
static int write_model(const char *out_dir, const out_t *o, int n) {
    int rc = fs_mkdirs(out_dir);
    char path[4400], tmp[4500];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    if (!rc) {
        const char **names = calloc((size_t)n, sizeof *names);
        int *dts = calloc((size_t)n, sizeof *dts), *nds = calloc((size_t)n, sizeof *nds);
        int64_t(*shapes)[CK_MAX_DIMS] = calloc((size_t)n, sizeof *shapes);
        char *hdr = NULL;
        size_t hlen = 0;
        if (!names || !dts || !nds || !shapes) rc = co_err_set(CO_ENOMEM, "convert: out of memory");
        for (int i = 0; i < n && !rc; i++) {
            names[i] = o[i].name;
            dts[i] = CK_DT_F32;
            nds[i] = o[i].ndim;
            memcpy(shapes[i], o[i].shape, sizeof shapes[i]);
        }
        json_t *meta = json_pack("{ss}", "format", "pt");
        if (!rc) rc = ck_st_build_header(names, dts, nds, (const int64_t(*)[CK_MAX_DIMS])shapes, n, meta, &hdr, &hlen);
        json_decref(meta);
        ck_file f;
        if (!rc) rc = ck_file_create(&f, tmp);
        if (!rc) {
            rc = ck_file_write(&f, hdr, hlen);
            for (int i = 0; i < n && !rc; i++) {
                int64_t ne = o[i].ndim == 1 ? o[i].shape[0] : o[i].shape[0] * o[i].shape[1];
                rc = ck_file_write(&f, o[i].data, (size_t)ne * sizeof(float));
            }
            rc = commit_file(&f, rc, tmp, path);
        }
        free(hdr);
        free(names), free(dts), free(nds), free(shapes);
    }
    return rc;
}

/* The keys both exports add to config.json: the end-of-document token as bos/eos for the
 * tokenizers whose last id it is, and the "cohort" object: what a Hugging Face config cannot
 * say and an import (ck_import_hf) needs to give the model cohort's vocabulary back, the
 * tokenizer's flags, its vocabulary (rows below it are real tokens, the rest padding) and
 * the padding rule. */
static void add_common_keys(json_t *cfg, const ck_manifest *m) {
    json_t *conf = json_object_get(m->doc, "config"), *o = json_object();
    json_t *tt = conf ? json_object_get(conf, "tokenizer-type") : NULL;
    if (json_is_string(tt) && (!strcmp(json_string_value(tt), "GPT2BPETokenizer") ||
                               !strcmp(json_string_value(tt), "NullTokenizer"))) {
        json_object_set_new(cfg, "bos_token_id", json_integer(m->model.vocab - 1));
        json_object_set_new(cfg, "eos_token_id", json_integer(m->model.vocab - 1));
    }
    static const char *const keys[] = {"tokenizer-type", "vocab-size", "make-vocab-size-divisible-by"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = conf ? json_object_get(conf, keys[i]) : NULL;
        if (v) json_object_set(o, keys[i], v);
    }
    json_object_set_new(o, "vocab", json_integer(m->model.vocab));
    json_object_set_new(cfg, "cohort", o);
}

int ck_export_hf_gpt2(const char *dir, const ck_manifest *m, const char *out_dir, bool trim_vocab) {
    const ck_model_info *mi = &m->model;
    const char *why = mi->rope ? "rotary position embeddings (GPT-2 learns absolute positions)"
                      : mi->rmsnorm ? "RMSNorm (GPT-2 uses LayerNorm)"
                      : mi->swiglu ? "SwiGLU (GPT-2 uses GELU)"
                      : !mi->tied ? "untied output weights (GPT-2 ties them to the embedding)"
                      : !mi->bias ? "no biases (GPT-2 has them)"
                      : mi->norm_1p ? "norm weights stored as w - 1 (--apply-layernorm-1p; not converted yet)"
                      : mi->kv_groups != mi->heads ? "grouped-query attention"
                      : mi->head_dim * mi->heads != mi->hidden ? "a head dimension other than hidden/heads"
                                                                : NULL;
    if (why) return co_err_set(CO_EUNSUPPORTED, "convert to hf-gpt2: the model has %s", why);
    float **bufs = NULL;
    ck_bad bad;
    int rc = ck_read_all(dir, m, 1 << CK_KIND_MODEL, &bufs, &bad);
    if (rc) return rc;
    int L = mi->num_layers, cap = 4 + 12 * L, n = 0;
    out_t *o = calloc((size_t)cap, sizeof *o);
    if (!o) {
        ck_free_all(m, &bufs);
        return co_err_set(CO_ENOMEM, "convert: out of memory");
    }
    int64_t r = 0, c = 0;
    const float *p = NULL;
#define NEED(name)                                                                                  \
    if (!rc && !(p = get(m, bufs, name, &r, &c)))                                                   \
        rc = co_err_set(CO_EFORMAT, "convert: %s: the checkpoint has no tensor %s", dir, name);
    NEED("embedding.word_embeddings.weight");
    if (!rc && (r != mi->padded_vocab || mi->vocab > mi->padded_vocab))
        rc = co_err_set(CO_EFORMAT, "convert: %s: the embedding has %lld rows, the manifest says vocab %d padded to %d",
                        dir, (long long)r, mi->vocab, mi->padded_vocab);
    int out_vocab = trim_vocab ? mi->vocab : mi->padded_vocab;
    if (!rc) rc = add(o, &n, "transformer.wte.weight", p, r, c, false, false, out_vocab);
    NEED("embedding.position_embeddings.weight");
    if (!rc) rc = add(o, &n, "transformer.wpe.weight", p, r, c, false, false, -1);
    static const struct {
        const char *ours, *hf;
        bool vec, transpose;
    } map[] = {
        {"input_norm.weight", "ln_1.weight", true, false},      {"input_norm.bias", "ln_1.bias", true, false},
        {"attention.qkv.weight", "attn.c_attn.weight", false, true}, {"attention.qkv.bias", "attn.c_attn.bias", true, false},
        {"attention.proj.weight", "attn.c_proj.weight", false, true}, {"attention.proj.bias", "attn.c_proj.bias", true, false},
        {"mlp_norm.weight", "ln_2.weight", true, false},        {"mlp_norm.bias", "ln_2.bias", true, false},
        {"mlp.fc1.weight", "mlp.c_fc.weight", false, true},     {"mlp.fc1.bias", "mlp.c_fc.bias", true, false},
        {"mlp.fc2.weight", "mlp.c_proj.weight", false, true},   {"mlp.fc2.bias", "mlp.c_proj.bias", true, false},
    };
    for (int l = 0; l < L && !rc; l++)
        for (size_t k = 0; k < sizeof map / sizeof map[0] && !rc; k++) {
            char ours[CK_NAME_MAX], hf[CK_NAME_MAX];
            snprintf(ours, sizeof ours, "layers.%d.%s", l, map[k].ours);
            snprintf(hf, sizeof hf, "transformer.h.%d.%s", l, map[k].hf);
            NEED(ours);
            if (!rc) rc = add(o, &n, hf, p, r, c, map[k].vec, map[k].transpose, -1);
        }
    NEED("final_norm.weight");
    if (!rc) rc = add(o, &n, "transformer.ln_f.weight", p, r, c, true, false, -1);
    NEED("final_norm.bias");
    if (!rc) rc = add(o, &n, "transformer.ln_f.bias", p, r, c, true, false, -1);
#undef NEED
    ck_free_all(m, &bufs);

    if (!rc) rc = write_model(out_dir, o, n);
    for (int i = 0; i < n; i++) free(o[i].data);
    free(o);
    if (rc) return rc;

    json_t *cfg = json_pack("{s[s]sssisisisisisisisssfsfsfsfsfsbsbsbss}", "architectures", "GPT2LMHeadModel", "model_type",
                            "gpt2", "vocab_size", out_vocab, "n_positions", mi->max_positions, "n_ctx", mi->max_positions,
                            "n_embd", mi->hidden, "n_layer", mi->num_layers, "n_head", mi->heads, "n_inner",
                            mi->ffn_hidden, "activation_function", "gelu_new", "layer_norm_epsilon", mi->norm_eps,
                            "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0, "initializer_range", 0.02,
                            "scale_attn_weights", 1, "tie_word_embeddings", 1, "use_cache", 1, "torch_dtype", "float32");
    add_common_keys(cfg, m);
    return write_config(out_dir, cfg);
}

/* ---- Hugging Face Llama --------------------------------------------------------------- */

/* The run's flag `name` (a number) from the manifest's config, else fallback: the flag as
 * given (1e-5), where the model info holds it rounded to float. */
static double flag_num(const ck_manifest *m, const char *name, double fallback) {
    json_t *v = json_object_get(json_object_get(m->doc, "config"), name);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

/* Why Llama's layout cannot hold the model, or NULL. */
static const char *llama_refusal(const ck_manifest *m) {
    const ck_model_info *mi = &m->model;
    json_t *conf = json_object_get(m->doc, "config");
    json_int_t experts = json_integer_value(json_object_get(conf, "num-experts"));
    json_int_t mtp = json_integer_value(json_object_get(conf, "mtp-num-layers"));
    return !mi->rope ? "learned absolute position embeddings (Llama uses rotary ones: --position-embedding-type rope)"
           : !mi->rmsnorm ? "LayerNorm (Llama uses RMSNorm: --normalization RMSNorm)"
           : !mi->swiglu ? "a GELU MLP (Llama's is SwiGLU: --swiglu)"
           : mi->bias ? "linear biases (Llama has none: --disable-bias-linear)"
           : mi->norm_1p ? "norm weights stored as w - 1 (--apply-layernorm-1p; not converted yet)"
           : experts > 0 ? "a mixture of experts (Llama's MLP is dense)"
           : mtp > 0 ? "multi-token prediction layers (Llama has none)"
           : mi->head_dim % 2 ? "an odd head dimension (rotary embeddings pair its halves)"
                              : NULL;
}

/* The tensors of layer l in Llama's names, appended to o: q, k and v are the row blocks of
 * cohort's qkv ([q heads | k groups | v groups]; both rotate the halves of a head, HF's
 * rotate_half, so no permutation), gate and up the halves of fc1 ([gate | up]). */
static int llama_layer(const char *dir, const ck_manifest *m, float **bufs, bool *used, out_t *o, int *n, int l) {
    const ck_model_info *mi = &m->model;
    int64_t hd = mi->head_dim, q = (int64_t)mi->heads * hd, kv = (int64_t)mi->kv_groups * hd, F = mi->ffn_hidden;
    static const struct {
        const char *ours, *hf;
        int64_t part; /* 0 whole; 1..3 q, k, v of qkv; 4, 5 gate, up of fc1 */
    } map[] = {
        {"input_norm.weight", "input_layernorm.weight", 0}, {"attention.qkv.weight", "self_attn.q_proj.weight", 1},
        {"attention.qkv.weight", "self_attn.k_proj.weight", 2}, {"attention.qkv.weight", "self_attn.v_proj.weight", 3},
        {"attention.proj.weight", "self_attn.o_proj.weight", 0}, {"mlp_norm.weight", "post_attention_layernorm.weight", 0},
        {"mlp.fc1.weight", "mlp.gate_proj.weight", 4}, {"mlp.fc1.weight", "mlp.up_proj.weight", 5},
        {"mlp.fc2.weight", "mlp.down_proj.weight", 0},
    };
    int rc = 0;
    for (size_t k = 0; k < sizeof map / sizeof map[0] && !rc; k++) {
        char ours[CK_NAME_MAX], hf[CK_NAME_MAX];
        snprintf(ours, sizeof ours, "layers.%d.%s", l, map[k].ours);
        snprintf(hf, sizeof hf, "model.layers.%d.%s", l, map[k].hf);
        int64_t r = 0, c = 0;
        const float *p = get(m, bufs, ours, &r, &c);
        if (!p) return co_err_set(CO_EFORMAT, "convert: %s: the checkpoint has no tensor %s", dir, ours);
        used[ck_manifest_find(m, ours) - m->tensors] = true;
        int64_t at[] = {0, 0, q, q + kv, 0, F}, len[] = {r, q, kv, kv, F, F};
        int64_t want = map[k].part == 0 ? r : map[k].part <= 3 ? q + 2 * kv : 2 * F;
        if (r != want)
            return co_err_set(CO_EFORMAT, "convert: %s: %s has %lld rows, the manifest's model %lld", dir, ours,
                              (long long)r, (long long)want);
        bool vec = strstr(map[k].ours, "norm") != NULL;
        rc = add(o, n, hf, p + at[map[k].part] * c, len[map[k].part], c, vec, false, -1);
    }
    return rc;
}

/* Llama's config.json (transformers' LlamaConfig keys), rms_norm_eps and rope_theta as the
 * run's flags gave them. */
static json_t *llama_config(const ck_manifest *m, int out_vocab) {
    const ck_model_info *mi = &m->model;
    return json_pack("{s[s]sssisisisisisisisisssisfsfsnsbsbsfsfsbsbss}", "architectures", "LlamaForCausalLM",
                            "model_type", "llama", "vocab_size", out_vocab, "hidden_size", mi->hidden,
                            "intermediate_size", mi->ffn_hidden, "num_hidden_layers", mi->num_layers,
                            "num_attention_heads", mi->heads, "num_key_value_heads", mi->kv_groups, "head_dim",
                            mi->head_dim, "max_position_embeddings", mi->max_positions, "hidden_act", "silu",
                            "pretraining_tp", 1, "rms_norm_eps", flag_num(m, "norm-epsilon", mi->norm_eps), "rope_theta",
                            flag_num(m, "rotary-base", mi->rotary_base),
                            "rope_scaling", "attention_bias", 0, "mlp_bias", 0, "attention_dropout", 0.0,
                            "initializer_range", 0.02, "tie_word_embeddings", mi->tied, "use_cache", 1, "torch_dtype",
                            "float32");
}

int ck_export_hf_llama(const char *dir, const ck_manifest *m, const char *out_dir, bool trim_vocab) {
    const ck_model_info *mi = &m->model;
    const char *why = llama_refusal(m);
    if (why) return co_err_set(CO_EUNSUPPORTED, "convert to hf-llama: the model has %s", why);
    if (mi->vocab > mi->padded_vocab)
        return co_err_set(CO_EFORMAT, "convert: %s: the manifest says vocab %d padded to %d", dir, mi->vocab,
                          mi->padded_vocab);
    float **bufs = NULL;
    ck_bad bad;
    int rc = ck_read_all(dir, m, 1 << CK_KIND_MODEL, &bufs, &bad);
    if (rc) return rc;
    int L = mi->num_layers, n = 0, out_vocab = trim_vocab ? mi->vocab : mi->padded_vocab;
    out_t *o = calloc((size_t)(3 + 9 * L), sizeof *o);
    bool *used = calloc((size_t)m->ntensors + 1, sizeof *used);
    if (!o || !used) rc = co_err_set(CO_ENOMEM, "convert: out of memory");
    static const struct {
        const char *ours, *hf;
        bool vocab;
    } top[] = {{"embedding.word_embeddings.weight", "model.embed_tokens.weight", true},
               {"final_norm.weight", "model.norm.weight", false},
               {"output_layer.weight", "lm_head.weight", true}};
    for (size_t k = 0; k < 3 && !rc; k++) {
        if (k == 2 && mi->tied) break;
        int64_t r = 0, c = 0;
        const float *p = get(m, bufs, top[k].ours, &r, &c);
        if (!p) rc = co_err_set(CO_EFORMAT, "convert: %s: the checkpoint has no tensor %s", dir, top[k].ours);
        else if (top[k].vocab && r != mi->padded_vocab)
            rc = co_err_set(CO_EFORMAT, "convert: %s: %s has %lld rows, the manifest says vocab padded to %d", dir,
                            top[k].ours, (long long)r, mi->padded_vocab);
        if (rc) break;
        used[ck_manifest_find(m, top[k].ours) - m->tensors] = true;
        rc = add(o, &n, top[k].hf, p, r, c, !top[k].vocab, false, top[k].vocab ? out_vocab : -1);
    }
    for (int l = 0; l < L && !rc; l++) rc = llama_layer(dir, m, bufs, used, o, &n, l);
    /* anything else the model has (a tensor of a feature Llama lacks) is refused by name */
    for (int i = 0; i < m->ntensors && !rc; i++)
        if (m->tensors[i].kind == CK_KIND_MODEL && !used[i])
            rc = co_err_set(CO_EUNSUPPORTED, "convert to hf-llama: the model has tensor %s, which Llama's layout "
                                             "cannot hold", m->tensors[i].name);
    ck_free_all(m, &bufs);
    free(used);
    if (!rc) rc = write_model(out_dir, o, n);
    for (int i = 0; i < n; i++) free(o[i].data);
    free(o);
    if (rc) return rc;
    json_t *cfg = llama_config(m, out_vocab);
    if (!cfg) return co_err_set(CO_ENOMEM, "convert: out of memory");
    add_common_keys(cfg, m);
    return write_config(out_dir, cfg);
}
