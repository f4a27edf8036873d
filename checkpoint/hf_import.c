/* hf_import.c - a cohort checkpoint from a Hugging Face model directory (GPT-2 or Llama):
 * config.json and model.safetensors, or the shards model.safetensors.index.json names. The
 * reverse of convert.c's exports: GPT-2's Conv1D weights [in, out] transposed back, Llama's
 * q/k/v and gate/up joined into qkv and fc1 (both rotate the halves of a head, HF's
 * rotate_half, so nothing is permuted). F16, BF16 and F64 tensors become fp32.
 *
 * Everything read is hostile input: each safetensors header is validated (format.c), every
 * tensor's shape is checked against what config.json implies, config keys of the wrong type
 * and tensors nobody asked for are refused, each by name. The checkpoint written is
 * iteration 0 at tensor-parallel size 1 with no optimizer state (what `--finetune` loads),
 * its "config" holding the model flags so that `--use-checkpoint-args` restores them. */
#include "checkpoint/ckpt.h"

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILES 256

typedef struct st_file {
    char name[CK_NAME_MAX];
    const uint8_t *map;
    size_t size;
    ck_st_header *h;
} st_file;

typedef struct imp {
    const char *dir;
    json_t *cfg;                 /* config.json */
    json_t *wmap;                /* the index's weight_map, or NULL: one file */
    st_file files[MAX_FILES];
    int nfiles;
    bool *used[MAX_FILES];       /* [file][entry]: taken or knowingly skipped */
    ck_tensor_ref *refs;
    int nrefs, cap;
} imp;

/* ---- files ------------------------------------------------------------------------------ */

static int open_st(imp *m, const char *name) {
    if (m->nfiles == MAX_FILES) return co_err_set(CO_EFORMAT, "%s: more than %d safetensors files", m->dir, MAX_FILES);
    if (!ck_name_ok(name, true))
        return co_err_set(CO_EFORMAT, "%s: the index names a file '%s' (not a plain file name)", m->dir, name);
    st_file *f = &m->files[m->nfiles];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", m->dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int rc = co_err_set(CO_ENOENT, "%s: cannot open: %m", path);
        if (fd >= 0) close(fd);
        return rc;
    }
    f->size = (size_t)st.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->size && f->map == MAP_FAILED) {
        f->map = NULL;
        return co_err_set(CO_EIO, "%s: cannot map: %m", path);
    }
    m->nfiles++;
    uint64_t jl = 0;
    int rc = ck_st_header_len(f->map ? f->map : (const uint8_t *)"", f->size, f->size, &jl);
    if (rc) return co_err_set(rc, "%s: not a safetensors file (truncated?): %s", path, co_err_detail());
    rc = ck_st_parse(f->map, f->size, f->size, path, &f->h);
    if (rc) return rc;
    m->used[m->nfiles - 1] = calloc((size_t)f->h->n + 1, sizeof(bool));
    return m->used[m->nfiles - 1] ? 0 : co_err_set(CO_ENOMEM, "import: out of memory");
}

/* The files: the index's (each once), or model.safetensors. */
static int open_files(imp *m) {
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", m->dir);
    struct stat st;
    if (stat(path, &st)) return open_st(m, "model.safetensors");
    json_error_t je;
    json_t *idx = json_load_file(path, 0, &je);
    if (!idx) return co_err_set(CO_EFORMAT, "%s: not JSON: %s (line %d)", path, je.text, je.line);
    m->wmap = json_incref(json_object_get(idx, "weight_map"));
    json_decref(idx);
    if (!json_is_object(m->wmap)) return co_err_set(CO_EFORMAT, "%s: no \"weight_map\" object", path);
    const char *k;
    json_t *v;
    json_object_foreach(m->wmap, k, v) {
        if (!json_is_string(v)) return co_err_set(CO_EFORMAT, "%s: weight_map[\"%s\"] is not a file name", path, k);
        bool seen = false;
        for (int i = 0; i < m->nfiles && !seen; i++) seen = !strcmp(m->files[i].name, json_string_value(v));
        int rc = seen ? 0 : open_st(m, json_string_value(v));
        if (rc) return rc;
    }
    return 0;
}

static void close_files(imp *m) {
    for (int i = 0; i < m->nfiles; i++) {
        if (m->files[i].map) munmap((void *)m->files[i].map, m->files[i].size);
        ck_st_header_free(&m->files[i].h);
        free(m->used[i]);
    }
    json_decref(m->wmap);
}

/* Where tensor name is: 1 with *fi and *ei, 0 when absent, or an error (the index names a
 * file without it). */
static int locate(imp *m, const char *name, int *fi, int *ei) {
    for (int i = 0; i < m->nfiles; i++) {
        if (m->wmap) {
            json_t *v = json_object_get(m->wmap, name);
            if (!v) return 0;
            if (strcmp(json_string_value(v), m->files[i].name)) continue;
        }
        const ck_st_entry *e = ck_st_find(m->files[i].h, name);
        if (e) {
            *fi = i, *ei = (int)(e - m->files[i].h->e);
            return 1;
        }
        if (m->wmap)
            return co_err_set(CO_EFORMAT, "%s: the index puts tensor %s in %s, which has no such tensor", m->dir, name,
                              m->files[i].name);
    }
    return 0;
}

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, f = h & 1023;
    float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Tensor name as fp32 of the given shape (malloc'ed into *out), or an error naming it. */
static int fetch(imp *m, const char *name, int ndim, int64_t r, int64_t c, float **out) {
    int fi = 0, ei = 0, rc = locate(m, name, &fi, &ei);
    if (rc < 0) return rc;
    if (!rc) return co_err_set(CO_EFORMAT, "%s: tensor %s is missing", m->dir, name);
    const ck_st_entry *e = &m->files[fi].h->e[ei];
    m->used[fi][ei] = true;
    int64_t want[2] = {r, c};
    bool ok = e->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = e->shape[d] == want[d];
    if (!ok) {
        char have[96] = "";
        for (int d = 0; d < e->ndim && d < CK_MAX_DIMS; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "", (long long)e->shape[d]);
        char want_s[64];
        if (ndim > 1) snprintf(want_s, sizeof want_s, "%lld, %lld", (long long)r, (long long)c);
        else snprintf(want_s, sizeof want_s, "%lld", (long long)r);
        return co_err_set(CO_EFORMAT, "%s: tensor %s has shape [%s], config.json implies [%s]", m->dir, name, have,
                          want_s);
    }
    if (e->dtype != CK_DT_F32 && e->dtype != CK_DT_F16 && e->dtype != CK_DT_BF16 && e->dtype != CK_DT_F64)
        return co_err_set(CO_EUNSUPPORTED, "%s: tensor %s is %s; F32, F16, BF16 or F64 can be imported", m->dir, name,
                          ck_dtype_name(e->dtype));
    size_t ne = (size_t)r * (size_t)(ndim > 1 ? c : 1);
    float *d = malloc(ne * sizeof *d + 1);
    if (!d) return co_err_set(CO_ENOMEM, "import: out of memory for %s", name);
    const uint8_t *p = m->files[fi].map + m->files[fi].h->data_start + e->begin;
    for (size_t i = 0; i < ne; i++) {
        if (e->dtype == CK_DT_F32) memcpy(&d[i], p + 4 * i, 4);
        else if (e->dtype == CK_DT_F64) {
            double x;
            memcpy(&x, p + 8 * i, 8);
            d[i] = (float)x;
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if (e->dtype == CK_DT_F16) d[i] = half_to_float(h);
            else {
                uint32_t u = (uint32_t)h << 16;
                memcpy(&d[i], &u, 4);
            }
        }
    }
    *out = d;
    return 0;
}

/* A tensor cohort does not need (a buffer the file may carry), marked as seen. */
static void skip(imp *m, const char *name) {
    int fi, ei;
    if (locate(m, name, &fi, &ei) == 1) m->used[fi][ei] = true;
}

/* ours := the HF tensor hf ([r, c], or [r] with c 0), transposed ([c, r] stored) with t. */
static int take(imp *m, const char *ours, const char *hf, int64_t r, int64_t c, bool t) {
    float *d = NULL;
    int rc = fetch(m, hf, c ? 2 : 1, r, c, &d);
    if (rc) return rc;
    if (t) {
        float *u = malloc((size_t)(r * c) * sizeof *u);
        if (!u) {
            free(d);
            return co_err_set(CO_ENOMEM, "import: out of memory for %s", hf);
        }
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++) u[j * r + i] = d[i * c + j];
        free(d);
        d = u;
    }
    ck_tensor_ref *x = &m->refs[m->nrefs++];
    memset(x, 0, sizeof *x);
    x->name = strdup(ours);
    x->kind = CK_KIND_MODEL;
    x->ndim = c ? 2 : 1;
    x->shape[0] = t ? c : r;
    x->shape[1] = t ? r : c;
    x->data = d;
    x->group = CK_ANY_GROUP;
    return x->name ? 0 : co_err_set(CO_ENOMEM, "import: out of memory");
}

/* ours := the HF tensors hf[0..k) ([rows[i], c] each, k <= 3) stacked by rows. Each is read
 * (and its shape checked against the file) before the whole is allocated. */
static int stack(imp *m, const char *ours, const char *const *hf, const int64_t *rows, int k, int64_t c) {
    float *p[3] = {NULL, NULL, NULL}, *d = NULL;
    int64_t total = 0;
    int rc = 0;
    for (int i = 0; i < k && !rc; i++) {
        rc = fetch(m, hf[i], 2, rows[i], c, &p[i]);
        total += rows[i];
    }
    if (!rc && !(d = malloc((size_t)(total * c) * sizeof *d + 1)))
        rc = co_err_set(CO_ENOMEM, "import: out of memory for %s", ours);
    int64_t at = 0;
    for (int i = 0; i < k && !rc; at += rows[i], i++) memcpy(d + at * c, p[i], (size_t)(rows[i] * c) * sizeof *d);
    for (int i = 0; i < k; i++) free(p[i]);
    if (rc) {
        free(d);
        return rc;
    }
    ck_tensor_ref *x = &m->refs[m->nrefs++];
    memset(x, 0, sizeof *x);
    x->name = strdup(ours);
    x->kind = CK_KIND_MODEL;
    x->ndim = 2;
    x->shape[0] = total;
    x->shape[1] = c;
    x->data = d;
    x->group = CK_ANY_GROUP;
    return x->name ? 0 : co_err_set(CO_ENOMEM, "import: out of memory");
}

/* ---- config.json ------------------------------------------------------------------------ */

/* config key (the first of keys present) as an integer in [1, max], else def (< 0:
 * required); max is cohort's limit on the flag it becomes (common/config.h). */
static int cfg_int(imp *m, const char *const *keys, long long def, int max, int *out) {
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(m->cfg, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return co_err_set(CO_EFORMAT, "%s/config.json: \"%s\" must be a positive integer", m->dir, keys[i]);
        if (json_integer_value(v) > max)
            return co_err_set(CO_EUNSUPPORTED, "%s/config.json: \"%s\" is %lld, beyond cohort's limit %d", m->dir,
                              keys[i], (long long)json_integer_value(v), max);
        *out = (int)json_integer_value(v);
        return 0;
    }
    if (def < 0) return co_err_set(CO_EFORMAT, "%s/config.json: \"%s\" is missing", m->dir, keys[0]);
    *out = (int)def;
    return 0;
}

static int cfg_num(imp *m, const char *key, double def, double *out) {
    json_t *v = json_object_get(m->cfg, key);
    if (!v || json_is_null(v)) *out = def;
    else if (!json_is_number(v) || !(json_number_value(v) > 0))
        return co_err_set(CO_EFORMAT, "%s/config.json: \"%s\" must be a positive number", m->dir, key);
    else *out = json_number_value(v);
    return 0;
}

/* A boolean key (absent or null: def). */
static int cfg_bool(imp *m, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(m->cfg, key);
    if (!v || json_is_null(v)) *out = def;
    else if (!json_is_boolean(v)) return co_err_set(CO_EFORMAT, "%s/config.json: \"%s\" must be true or false", m->dir, key);
    else *out = json_is_true(v);
    return 0;
}

/* A string key that must be one of the words in ok ("a|b"), absent: fine. */
static int cfg_word(imp *m, const char *key, const char *ok) {
    json_t *v = json_object_get(m->cfg, key);
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    size_t n = s ? strlen(s) : 0;
    for (const char *p = ok; s && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, s, n)) return 0;
        p += len + (bar ? 1 : 0);
    }
    return co_err_set(CO_EUNSUPPORTED, "%s/config.json: \"%s\" is %s; cohort's model has %s", m->dir, key,
                      s ? s : "not a string", ok);
}

/* ---- the two families ------------------------------------------------------------------- */

static int gpt2_model(imp *m, ck_model_info *mi) {
    static const char *const kE[] = {"n_embd", NULL}, *const kL[] = {"n_layer", NULL}, *const kH[] = {"n_head", NULL},
                             *const kP[] = {"n_positions", "n_ctx", NULL}, *const kV[] = {"vocab_size", NULL},
                             *const kF[] = {"n_inner", NULL};
    int rc = cfg_int(m, kE, -1, CO_MAX_HIDDEN, &mi->hidden);
    if (!rc) rc = cfg_int(m, kL, -1, CO_MAX_LAYERS, &mi->num_layers);
    if (!rc) rc = cfg_int(m, kH, -1, CO_MAX_HIDDEN, &mi->heads);
    if (!rc) rc = cfg_int(m, kP, -1, CO_MAX_SEQ_LENGTH, &mi->max_positions);
    if (!rc) rc = cfg_int(m, kV, -1, CO_MAX_VOCAB, &mi->padded_vocab);
    if (!rc) rc = cfg_int(m, kF, 4LL * mi->hidden, CO_MAX_FFN_HIDDEN, &mi->ffn_hidden);
    if (!rc) rc = cfg_num(m, "layer_norm_epsilon", 1e-5, &mi->norm_eps);
    if (!rc) rc = cfg_word(m, "activation_function", "gelu_new|gelu_pytorch_tanh");
    bool scaled = true, by_layer = false;
    if (!rc) rc = cfg_bool(m, "scale_attn_weights", true, &scaled);
    if (!rc) rc = cfg_bool(m, "scale_attn_by_inverse_layer_idx", false, &by_layer);
    if (!rc && (!scaled || by_layer))
        rc = co_err_set(CO_EUNSUPPORTED, "%s/config.json: attention scaled otherwise than by 1/sqrt(head dim) "
                                         "(scale_attn_weights, scale_attn_by_inverse_layer_idx)", m->dir);
    if (!rc) rc = cfg_bool(m, "tie_word_embeddings", true, &mi->tied);
    if (!rc && mi->hidden % mi->heads)
        rc = co_err_set(CO_EFORMAT, "%s/config.json: n_embd %d is not divisible by n_head %d", m->dir, mi->hidden, mi->heads);
    mi->kv_groups = mi->heads;
    mi->head_dim = mi->hidden / (mi->heads ? mi->heads : 1);
    mi->bias = true;
    return rc;
}

static int gpt2_tensors(imp *m, const ck_model_info *mi) {
    const char *p = "transformer.";
    int fi, ei;
    if (locate(m, "transformer.wte.weight", &fi, &ei) != 1 && locate(m, "wte.weight", &fi, &ei) == 1) p = "";
    int64_t C = mi->hidden, F = mi->ffn_hidden, V = mi->padded_vocab;
    char hf[CK_NAME_MAX], ours[CK_NAME_MAX];
#define HF(...) (snprintf(hf, sizeof hf, __VA_ARGS__), hf)
#define OURS(...) (snprintf(ours, sizeof ours, __VA_ARGS__), ours)
    int rc = take(m, "embedding.word_embeddings.weight", HF("%swte.weight", p), V, C, false);
    if (!rc) rc = take(m, "embedding.position_embeddings.weight", HF("%swpe.weight", p), mi->max_positions, C, false);
    static const struct {
        const char *ours, *hf;
        int r, c; /* 1 C, 2 F, 3 3C; c 0: a vector */
        bool t;
    } map[] = {
        {"input_norm.weight", "ln_1.weight", 1, 0, false},       {"input_norm.bias", "ln_1.bias", 1, 0, false},
        {"attention.qkv.weight", "attn.c_attn.weight", 1, 3, true}, {"attention.qkv.bias", "attn.c_attn.bias", 3, 0, false},
        {"attention.proj.weight", "attn.c_proj.weight", 1, 1, true}, {"attention.proj.bias", "attn.c_proj.bias", 1, 0, false},
        {"mlp_norm.weight", "ln_2.weight", 1, 0, false},         {"mlp_norm.bias", "ln_2.bias", 1, 0, false},
        {"mlp.fc1.weight", "mlp.c_fc.weight", 1, 2, true},       {"mlp.fc1.bias", "mlp.c_fc.bias", 2, 0, false},
        {"mlp.fc2.weight", "mlp.c_proj.weight", 2, 1, true},     {"mlp.fc2.bias", "mlp.c_proj.bias", 1, 0, false},
    };
    int64_t dim[] = {0, C, F, 3 * C};
    for (int l = 0; l < mi->num_layers && !rc; l++) {
        for (size_t k = 0; k < sizeof map / sizeof map[0] && !rc; k++)
            rc = take(m, OURS("layers.%d.%s", l, map[k].ours), HF("%sh.%d.%s", p, l, map[k].hf), dim[map[k].r],
                      dim[map[k].c], map[k].t);
        skip(m, HF("%sh.%d.attn.bias", p, l)); /* the causal mask buffer of older exports */
        skip(m, HF("%sh.%d.attn.masked_bias", p, l));
    }
    if (!rc) rc = take(m, "final_norm.weight", HF("%sln_f.weight", p), C, 0, false);
    if (!rc) rc = take(m, "final_norm.bias", HF("%sln_f.bias", p), C, 0, false);
    if (!rc && !mi->tied) rc = take(m, "output_layer.weight", "lm_head.weight", V, C, false);
    else skip(m, "lm_head.weight"); /* tied: a copy of wte */
    return rc;
}

static int llama_model(imp *m, ck_model_info *mi) {
    static const char *const kE[] = {"hidden_size", NULL}, *const kL[] = {"num_hidden_layers", NULL},
                             *const kH[] = {"num_attention_heads", NULL}, *const kP[] = {"max_position_embeddings", NULL},
                             *const kV[] = {"vocab_size", NULL}, *const kF[] = {"intermediate_size", NULL},
                             *const kK[] = {"num_key_value_heads", NULL}, *const kD[] = {"head_dim", NULL};
    int rc = cfg_int(m, kE, -1, CO_MAX_HIDDEN, &mi->hidden);
    if (!rc) rc = cfg_int(m, kL, -1, CO_MAX_LAYERS, &mi->num_layers);
    if (!rc) rc = cfg_int(m, kH, -1, CO_MAX_HIDDEN, &mi->heads);
    if (!rc) rc = cfg_int(m, kP, -1, CO_MAX_SEQ_LENGTH, &mi->max_positions);
    if (!rc) rc = cfg_int(m, kV, -1, CO_MAX_VOCAB, &mi->padded_vocab);
    if (!rc) rc = cfg_int(m, kF, -1, CO_MAX_FFN_HIDDEN, &mi->ffn_hidden);
    if (!rc) rc = cfg_int(m, kK, mi->heads, CO_MAX_HIDDEN, &mi->kv_groups);
    if (!rc) rc = cfg_int(m, kD, mi->hidden / mi->heads, CO_MAX_KV_CHANNELS, &mi->head_dim);
    if (!rc) rc = cfg_num(m, "rms_norm_eps", 1e-6, &mi->norm_eps);
    if (!rc) rc = cfg_num(m, "rope_theta", 10000, &mi->rotary_base);
    if (!rc) rc = cfg_word(m, "hidden_act", "silu");
    bool ab = false, mb = false;
    if (!rc) rc = cfg_bool(m, "attention_bias", false, &ab);
    if (!rc) rc = cfg_bool(m, "mlp_bias", false, &mb);
    if (!rc && (ab || mb))
        rc = co_err_set(CO_EUNSUPPORTED, "%s/config.json: \"%s\" is true; cohort's rotary models have no biases", m->dir,
                        ab ? "attention_bias" : "mlp_bias");
    json_t *rs = json_object_get(m->cfg, "rope_scaling");
    if (!rc && rs && !json_is_null(rs))
        rc = co_err_set(CO_EUNSUPPORTED, "%s/config.json: \"rope_scaling\" is set; cohort's rotary embedding has no "
                                         "scaling (remove it only if the model was trained without)", m->dir);
    json_t *pr = json_object_get(m->cfg, "partial_rotary_factor");
    if (!rc && pr && !json_is_null(pr) && json_number_value(pr) != 1.0)
        rc = co_err_set(CO_EUNSUPPORTED, "%s/config.json: \"partial_rotary_factor\" is not 1; cohort rotates whole heads",
                        m->dir);
    if (!rc) rc = cfg_bool(m, "tie_word_embeddings", false, &mi->tied);
    if (!rc && (mi->heads % mi->kv_groups || mi->head_dim % 2))
        rc = co_err_set(CO_EFORMAT, "%s/config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d, "
                                    "or head_dim %d is odd", m->dir, mi->heads, mi->kv_groups, mi->head_dim);
    mi->rope = mi->rmsnorm = mi->swiglu = true;
    return rc;
}

static int llama_tensors(imp *m, const ck_model_info *mi) {
    int64_t C = mi->hidden, F = mi->ffn_hidden, V = mi->padded_vocab, hd = mi->head_dim;
    char hf[CK_NAME_MAX], ours[CK_NAME_MAX], n3[3][CK_NAME_MAX];
    const char *names[3] = {n3[0], n3[1], n3[2]};
    int rc = take(m, "embedding.word_embeddings.weight", "model.embed_tokens.weight", V, C, false);
    for (int l = 0; l < mi->num_layers && !rc; l++) {
        const char *pf = "model.layers.";
        rc = take(m, OURS("layers.%d.input_norm.weight", l), HF("%s%d.input_layernorm.weight", pf, l), C, 0, false);
        static const char *const qkv[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) snprintf(n3[i], sizeof n3[i], "%s%d.self_attn.%s_proj.weight", pf, l, qkv[i]);
        int64_t rq[3] = {mi->heads * hd, mi->kv_groups * hd, mi->kv_groups * hd}, rf[2] = {F, F};
        if (!rc) rc = stack(m, OURS("layers.%d.attention.qkv.weight", l), names, rq, 3, C);
        if (!rc)
            rc = take(m, OURS("layers.%d.attention.proj.weight", l), HF("%s%d.self_attn.o_proj.weight", pf, l), C,
                      mi->heads * hd, false);
        if (!rc)
            rc = take(m, OURS("layers.%d.mlp_norm.weight", l), HF("%s%d.post_attention_layernorm.weight", pf, l), C, 0,
                      false);
        snprintf(n3[0], sizeof n3[0], "%s%d.mlp.gate_proj.weight", pf, l);
        snprintf(n3[1], sizeof n3[1], "%s%d.mlp.up_proj.weight", pf, l);
        if (!rc) rc = stack(m, OURS("layers.%d.mlp.fc1.weight", l), names, rf, 2, C);
        if (!rc) rc = take(m, OURS("layers.%d.mlp.fc2.weight", l), HF("%s%d.mlp.down_proj.weight", pf, l), C, F, false);
        skip(m, HF("%s%d.self_attn.rotary_emb.inv_freq", pf, l)); /* a buffer older exports carry */
    }
    if (!rc) rc = take(m, "final_norm.weight", "model.norm.weight", C, 0, false);
    if (!rc && !mi->tied) rc = take(m, "output_layer.weight", "lm_head.weight", V, C, false);
    else skip(m, "lm_head.weight");
    return rc;
#undef HF
#undef OURS
}

/* ---- the checkpoint ----------------------------------------------------------------------- */

/* The tokenizer and the real vocabulary: config.json's "cohort" object (cohort's exports
 * write it), else GPT-2's BPE for a GPT-2 of 50257 rows, else the NullTokenizer over every
 * row (vocab-size rows - 1: it adds the end-of-document token). The padding rule: the
 * object's, else the largest power of two up to 128 that pads the vocabulary to the rows. */
static int vocabulary(imp *m, bool gpt2, ck_model_info *mi, json_t *flags) {
    json_t *o = json_object_get(m->cfg, "cohort");
    json_t *tt = json_object_get(o, "tokenizer-type"), *vs = json_object_get(o, "vocab-size"),
           *vv = json_object_get(o, "vocab"), *dv = json_object_get(o, "make-vocab-size-divisible-by");
    int rows = mi->padded_vocab;
    if (json_is_string(tt) && json_is_integer(vv)) {
        if (json_integer_value(vv) < 1 || json_integer_value(vv) > rows)
            return co_err_set(CO_EFORMAT, "%s/config.json: cohort.vocab %lld is not within the %d rows of vocab_size",
                              m->dir, (long long)json_integer_value(vv), rows);
        mi->vocab = (int)json_integer_value(vv);
        json_object_set(flags, "tokenizer-type", tt);
        if (json_is_integer(vs)) json_object_set(flags, "vocab-size", vs);
    } else if (gpt2 && rows == 50257) {
        mi->vocab = rows;
        json_object_set_new(flags, "tokenizer-type", json_string("GPT2BPETokenizer"));
    } else {
        mi->vocab = rows;
        json_object_set_new(flags, "tokenizer-type", json_string("NullTokenizer"));
        json_object_set_new(flags, "vocab-size", json_integer(rows - 1));
    }
    int div = 1;
    if (json_is_integer(dv) && json_integer_value(dv) >= 1 && json_integer_value(dv) <= (1 << 20))
        div = (int)json_integer_value(dv);
    else
        for (int d = 128; d > 1 && div == 1; d /= 2)
            if (rows % d == 0 && (mi->vocab + d - 1) / d * d == rows) div = d;
    json_object_set_new(flags, "make-vocab-size-divisible-by", json_integer(div));
    return 0;
}

/* The model flags a run with this model would have written (those --use-checkpoint-args
 * takes; not --seq-length, which is the run's). */
static void model_flags(const ck_model_info *mi, json_t *f) {
    bool gqa = mi->kv_groups != mi->heads;
    json_object_set_new(f, "num-layers", json_integer(mi->num_layers));
    json_object_set_new(f, "hidden-size", json_integer(mi->hidden));
    json_object_set_new(f, "ffn-hidden-size", json_integer(mi->ffn_hidden));
    json_object_set_new(f, "num-attention-heads", json_integer(mi->heads));
    json_object_set_new(f, "group-query-attention", json_boolean(gqa));
    json_object_set_new(f, "num-query-groups", json_integer(gqa ? mi->kv_groups : 1));
    json_object_set_new(f, "kv-channels", json_integer(mi->head_dim));
    json_object_set_new(f, "max-position-embeddings", json_integer(mi->max_positions));
    json_object_set_new(f, "position-embedding-type", json_string(mi->rope ? "rope" : "learned_absolute"));
    json_object_set_new(f, "rotary-base", json_real(mi->rotary_base));
    json_object_set_new(f, "normalization", json_string(mi->rmsnorm ? "RMSNorm" : "LayerNorm"));
    json_object_set_new(f, "norm-epsilon", json_real(mi->norm_eps));
    json_object_set_new(f, "swiglu", json_boolean(mi->swiglu));
    json_object_set_new(f, "untie-embeddings-and-output-weights", json_boolean(!mi->tied));
    json_object_set_new(f, "disable-bias-linear", json_boolean(!mi->bias));
    json_object_set_new(f, "num-experts", json_integer(0));
    json_object_set_new(f, "mtp-num-layers", json_integer(0));
}

/* Every tensor of the files was taken or knowingly skipped; else the first other one, named. */
static int check_unused(imp *m, const char *family) {
    for (int i = 0; i < m->nfiles; i++)
        for (int k = 0; k < m->files[i].h->n; k++)
            if (!m->used[i][k])
                return co_err_set(CO_EUNSUPPORTED, "%s: tensor %s (in %s) is no part of the %s model config.json "
                                                   "describes; refusing to drop it", m->dir, m->files[i].h->e[k].name,
                                  m->files[i].name, family);
    return 0;
}

static int read_model(imp *m, bool gpt2, ck_meta *meta) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", m->dir);
    struct stat st;
    if (stat(path, &st))
        return co_err_set(CO_ENOENT, "%s: %m (a Hugging Face model directory holds config.json and its tensors)", path);
    json_error_t je;
    m->cfg = json_load_file(path, 0, &je);
    if (!m->cfg) return co_err_set(CO_EFORMAT, "%s: not JSON: %s (line %d)", path, je.text, je.line);
    if (!json_is_object(m->cfg)) return co_err_set(CO_EFORMAT, "%s: not a JSON object", path);
    json_t *mt = json_object_get(m->cfg, "model_type");
    const char *want = gpt2 ? "gpt2" : "llama";
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), want)))
        return co_err_set(CO_EUNSUPPORTED, "%s: \"model_type\" is %s, not %s (--from hf-%s)", path,
                          json_is_string(mt) ? json_string_value(mt) : "not a string", want, gpt2 ? "gpt2" : "llama");
    ck_model_info *mi = &meta->model;
    int rc = gpt2 ? gpt2_model(m, mi) : llama_model(m, mi);
    if (!rc) rc = open_files(m);
    if (rc) return rc;
    int cap = 8 + 16 * mi->num_layers;
    m->refs = calloc((size_t)cap, sizeof *m->refs);
    if (!m->refs) return co_err_set(CO_ENOMEM, "import: out of memory");
    m->cap = cap;
    rc = gpt2 ? gpt2_tensors(m, mi) : llama_tensors(m, mi);
    if (!rc) rc = check_unused(m, gpt2 ? "GPT-2" : "Llama");
    meta->config = json_object();
    if (!rc) rc = vocabulary(m, gpt2, mi, meta->config);
    if (!rc) model_flags(mi, meta->config);
    return rc;
}

int ck_import_hf(const char *hf_dir, bool gpt2, const char *save_dir) {
    imp m = {.dir = hf_dir};
    ck_meta meta = {.iteration = 0, .seed = 1234, .layout = {1, 1, 1, 1, 1, false, 1, 1}};
    int rc = read_model(&m, gpt2, &meta);
    /* (the manifest's model info holds what the trainer's float config does) */
    meta.model.norm_eps = (float)meta.model.norm_eps;
    meta.model.rotary_base = (float)meta.model.rotary_base;
    if (!rc) {
        co_log(CO_LOG_INFO, "importing %s: %d layers, hidden %d, %d heads (%d kv groups), ffn %d, %d vocabulary rows",
               hf_dir, meta.model.num_layers, meta.model.hidden, meta.model.heads, meta.model.kv_groups,
               meta.model.ffn_hidden, meta.model.padded_vocab);
        rc = ck_save(save_dir, &meta, m.refs, m.nrefs, 1, 0);
    }
    for (int i = 0; i < m.nrefs; i++) {
        free((void *)m.refs[i].name);
        free((void *)m.refs[i].data);
    }
    free(m.refs);
    json_decref(meta.config);
    json_decref(m.cfg);
    close_files(&m);
    return rc;
}
