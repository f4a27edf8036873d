/* ckpt_layout.c - `cohort ckpt convert --to cohort`: a checkpoint rewritten in the file
 * layout a job of another tensor-parallel and data-parallel size writes (docs/checkpoints.md,
 * "Resharding"). The loader reads any layout at any size, so this is for people who want the
 * files cut as that job would cut them (one writer group per tensor rank, its data-parallel
 * replicas sharing its bytes), or the padded vocabulary of that tensor-parallel size.
 *
 * The global tensors are read once (verified), the vocabulary tensors resized when the
 * padded vocabulary of the new size differs (loader's rule: the checkpoint's last row copied
 * into new rows, rows past the new size dropped), and every tensor rank's slices taken from
 * the model's own tensor table (gpt_tensor_table), so the slices are exactly the ones a
 * training job of that size writes. */
#include "cli/ckpt_layout.h"

#include "checkpoint/ckpt.h"
#include "common/error.h"
#include "model/gpt.h"
#include "model/gpt_check.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *opt_prefix[] = {"optimizer.exp_avg_sq.", "optimizer.exp_avg."};

/* the model tensor a checkpoint tensor belongs to (its own name, or a moment's) */
static const char *model_name(const char *name) {
    for (size_t k = 0; k < sizeof opt_prefix / sizeof opt_prefix[0]; k++)
        if (!strncmp(name, opt_prefix[k], strlen(opt_prefix[k]))) return name + strlen(opt_prefix[k]);
    return name;
}

static int int_flag(const json_t *config, const char *key, int dflt) {
    json_t *v = json_object_get(config, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

int cli_ckpt_relayout(const char *dir, const ck_manifest *m, int tp, int dp, const char *save_dir, char *note,
                      size_t note_len) {
    note[0] = '\0';
    const ck_model_info *mi = &m->model;
    json_t *config = json_object_get(m->doc, "config");
    int divisible = int_flag(config, "make-vocab-size-divisible-by", 128);
    gpt_config g = {.num_layers = mi->num_layers, .hidden = mi->hidden, .heads = mi->heads, .kv_groups = mi->kv_groups,
                    .head_dim = mi->head_dim, .ffn_hidden = mi->ffn_hidden, .vocab = mi->vocab,
                    .padded_vocab = gpt_padded_vocab(mi->vocab, divisible * tp), .max_positions = mi->max_positions,
                    .rope = mi->rope, .rotary_base = (float)mi->rotary_base, .rmsnorm = mi->rmsnorm, .norm_1p = mi->norm_1p,
                    .norm_eps = (float)mi->norm_eps, .swiglu = mi->swiglu, .tied = mi->tied, .bias = mi->bias,
                    .tp = tp, .tp_rank = 0};
    /* mixture of experts: the layers' experts from the run's flags (the manifest's config) */
    int E = int_flag(config, "num-experts", 0);
    if (E > 0) {
        int fm = int_flag(config, "moe-ffn-hidden-size", 0);
        g.moe = (moe_config){.num_experts = E, .ffn_hidden = fm > 0 ? fm : mi->ffn_hidden,
                             .topk = int_flag(config, "moe-router-topk", 2),
                             .shared_ffn = int_flag(config, "moe-shared-expert-intermediate-size", 0)};
        /* (the integer or Megatron's list form, as the run's flags had it) */
        static const char *const only[] = {"moe-layer-freq", NULL};
        co_config *mc = malloc(sizeof *mc);
        if (!mc) return co_err_set(CO_ENOMEM, "ckpt convert: out of memory");
        co_config_defaults(mc);
        int rc = co_config_read_json(mc, config, only, NULL, NULL);
        gpt_moe_layers_of(mc, &g);
        co_config_free(mc);
        free(mc);
        if (rc) return rc;
        /* a MoE job with tensor parallelism runs sequence parallel (docs/moe.md); the tensor
         * table is the same with or without it */
        g.sequence_parallel = tp > 1;
    }
    /* multi-token prediction: the depths' tensors (docs/mtp.md) */
    g.mtp_layers = int_flag(config, "mtp-num-layers", 0);
    int Vc = mi->padded_vocab, Vp = g.padded_vocab;
    int rc = gpt_tp_check(&g, 0);
    if (rc) return rc;
    char out_dir[4400];
    struct stat st;
    ck_iter_dir(out_dir, sizeof out_dir, save_dir, m->iteration);
    if (!stat(out_dir, &st))
        return co_err_set(CO_EINVAL, "--output %s already holds iteration %" PRId64 " (%s); choose another directory",
                          save_dir, m->iteration, out_dir);

    gpt_tensor **tab = calloc((size_t)tp, sizeof *tab);
    int nt = 0;
    float **bufs = NULL;
    ck_tensor_ref *refs = NULL;
    float **cols = NULL; /* copies of column slices (their rows are not contiguous globally) */
    int nrefs = 0, ncols = 0;
    if (!tab) return co_err_set(CO_ENOMEM, "out of memory");
    for (int r = 0; r < tp && !rc; r++) {
        gpt_config c = g;
        c.tp_rank = r;
        int n = 0;
        rc = gpt_tensor_table(&c, &tab[r], &n, NULL);
        if (!rc && r && n != nt) rc = co_err_set(CO_EINTERNAL, "tensor rank %d has %d tensors, rank 0 %d", r, n, nt);
        nt = n;
    }
    if (!rc) rc = ck_read_all(dir, m, 1 << CK_KIND_MODEL | 1 << CK_KIND_OPTIM, &bufs, NULL);
    int cap = m->ntensors * (3 * tp + 1);
    if (!rc && (!(refs = calloc((size_t)cap, sizeof *refs)) || !(cols = calloc((size_t)cap, sizeof *cols))))
        rc = co_err_set(CO_ENOMEM, "out of memory");
    for (int i = 0; i < m->ntensors && !rc; i++) {
        const ck_mtensor *mt = &m->tensors[i];
        const char *mn = model_name(mt->name);
        int ti = -1;
        for (int k = 0; k < nt && ti < 0; k++)
            if (!strcmp(tab[0][k].name, mn)) ti = k;
        if (ti < 0) {
            rc = co_err_set(CO_EINVAL, "%s: tensor %s is not part of the model the manifest describes", dir, mt->name);
            break;
        }
        const gpt_tensor *t0 = &tab[0][ti];
        int64_t rows = t0->gshape[0], C = t0->gshape[1] ? t0->gshape[1] : 1;
        if (gpt_tensor_is_vocab(mn) && Vc != Vp) {
            /* the new padded vocabulary: rows past Vc copy the checkpoint's last row */
            float *v = malloc((size_t)Vp * (size_t)C * sizeof *v);
            if (!v) {
                rc = co_err_set(CO_ENOMEM, "out of memory");
                break;
            }
            for (int64_t row = 0; row < Vp; row++)
                memcpy(v + row * C, bufs[i] + (row < Vc ? row : Vc - 1) * C, (size_t)C * sizeof *v);
            free(bufs[i]);
            bufs[i] = v;
        }
        bool same = mt->ndim == t0->ndim && mt->shape[0] == (gpt_tensor_is_vocab(mn) ? Vc : rows) &&
                    (mt->ndim < 2 || mt->shape[1] == C);
        if (!same) {
            rc = co_err_set(CO_EINVAL, "%s: tensor %s's shape is not the model's", dir, mt->name);
            break;
        }
        ck_tensor_ref base = {.name = mt->name, .kind = mt->kind, .ndim = mt->ndim, .shape = {rows, C},
                              .group = CK_ANY_GROUP};
        if (tp == 1 || t0->split == GPT_TP_REPLICATED) {
            refs[nrefs] = base;
            refs[nrefs++].data = bufs[i];
            continue;
        }
        for (int r = 0; r < tp && !rc; r++) {
            const gpt_tensor *t = &tab[r][ti];
            for (int q = 0; q < t->npieces; q++) {
                const gpt_piece *p = &t->piece[q];
                if (r % p->share) continue; /* a run several ranks hold: listed by the first */
                ck_tensor_ref *ref = &refs[nrefs++];
                *ref = base;
                ref->group = r;
                ref->region = true;
                ref->rshape[0] = rows;
                ref->rshape[1] = C;
                if (t->split == GPT_TP_ROWS) {
                    ref->offsets[0] = p->global;
                    ref->rshape[0] = p->len;
                    ref->data = bufs[i] + (int64_t)p->global * C;
                    continue;
                }
                float *c = malloc((size_t)rows * (size_t)p->len * sizeof *c);
                if (!c) {
                    rc = co_err_set(CO_ENOMEM, "out of memory");
                    break;
                }
                cols[ncols++] = c;
                for (int64_t row = 0; row < rows; row++)
                    memcpy(c + row * p->len, bufs[i] + row * C + p->global, (size_t)p->len * sizeof *c);
                ref->offsets[1] = p->global;
                ref->rshape[1] = p->len;
                ref->data = c;
            }
        }
    }
    if (!rc) {
        ck_meta meta = {.iteration = m->iteration, .progress = m->progress, .seed = m->seed, .model = *mi, .optim = m->optim};
        meta.model.padded_vocab = Vp;
        meta.layout = (ck_layout){tp * dp, tp, 1, 1, dp, false, tp * dp, tp};
        meta.config = config ? json_deep_copy(config) : json_object();
        json_object_set_new(meta.config, "tensor-model-parallel-size", json_integer(tp));
        meta.lr_scheduler = json_object_get(m->doc, "lr_scheduler");
        meta.rng_generators = json_object_get(json_object_get(m->doc, "rng"), "generators");
        meta.rerun_state = json_object_get(m->doc, "rerun_state_machine");
        rc = ck_save(save_dir, &meta, refs, nrefs, tp * dp, 0);
        json_decref(meta.config);
    }
    if (!rc && Vc != Vp)
        snprintf(note, note_len,
                 "the padded vocabulary changed from %d to %d rows (%d x tensor-parallel size %d): %s", Vc, Vp,
                 divisible, tp, Vc < Vp ? "new rows copy the last row" : "rows past the new size dropped");
    for (int k = 0; k < ncols; k++) free(cols[k]);
    free(cols);
    free(refs);
    if (bufs) ck_free_all(m, &bufs);
    for (int r = 0; r < tp; r++) free(tab[r]);
    free(tab);
    return rc;
}
