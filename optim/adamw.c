/* adamw.c - the optimizer step: clip by global norm, AdamW per tensor. */
#include "optim/adamw.h"

#include "common/error.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int opt_adamw_init(opt_adamw *o, gpt_model *model, float beta1, float beta2, float eps, float wd, float clip) {
    kb_backend *be = gpt_backend(model);
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = wd;
    o->clip_grad = clip;
    o->inv_loss_scale = 0;
    o->n = gpt_num_params(model);
    o->step = 0;
    o->sums = NULL;
    o->nsums = 0;
    o->lr_decoupled = -1;
    o->m = be->ops->alloc(be, o->n * sizeof(float));
    o->v = be->ops->alloc(be, o->n * sizeof(float));
    if (!o->m || !o->v) {
        opt_adamw_free(o, model);
        return co_err_set(CO_ENOMEM, "optimizer: cannot allocate Adam moments (%zu parameters)", o->n);
    }
    return 0;
}

void opt_adamw_free(opt_adamw *o, gpt_model *model) {
    kb_backend *be = gpt_backend(model);
    if (o->m) be->ops->free(be, o->m);
    if (o->v) be->ops->free(be, o->v);
    o->m = o->v = NULL;
    free(o->sums);
    o->sums = NULL;
    o->nsums = 0;
}

double opt_grad_norm(gpt_model *model) {
    kb_backend *be = gpt_backend(model);
    /* the flat buffer has alignment padding that stays zero, so one reduction covers all */
    return sqrt(be->ops->sumsq(be, gpt_grads(model), gpt_num_params(model)));
}

float opt_clip_scale(float clip_grad, double grad_norm) {
    float gscale = 1.0f;
    if (clip_grad > 0) {
        double coeff = clip_grad / (grad_norm + 1e-6); /* Megatron's clip_grad_norm */
        if (coeff < 1.0) gscale = (float)coeff;
    }
    return gscale;
}

float opt_step_scale(float clip_grad, double grad_norm, float inv_loss_scale) {
    float g = opt_clip_scale(clip_grad, grad_norm);
    return inv_loss_scale > 0 ? g * inv_loss_scale : g;
}

/* room for each tensor's fused checksum; false (the caller hashes afterwards) without memory */
static bool sums_room(opt_adamw *o, int nt) {
    if (o->nsums >= nt) return true;
    uint64_t *s = realloc(o->sums, (size_t)nt * sizeof *s);
    if (!s) return false;
    o->sums = s;
    o->nsums = nt;
    return true;
}

bool opt_decoupled_tensor(const gpt_tensor *t) {
    return !strcmp(t->name, "embedding.word_embeddings.weight") || !strcmp(t->name, "output_layer.weight");
}

void opt_adamw_step_checksum(opt_adamw *o, gpt_model *model, double lr, double grad_norm, uint64_t *sum) {
    kb_backend *be = gpt_backend(model);
    float gscale = opt_step_scale(o->clip_grad, grad_norm, o->inv_loss_scale);
    o->step++;
    const gpt_tensor *t = gpt_tensors(model);
    float *p = gpt_params(model), *g = gpt_grads(model);
    int nt = gpt_num_tensors(model);
    bool fused = sum && be->ops->adamw_checksum && sums_room(o, nt);
    for (int i = 0; i < nt; i++) {
        size_t off = t[i].offset;
        float wd = t[i].decay ? o->weight_decay : 0.0f;
        float r = (float)(o->lr_decoupled >= 0 && opt_decoupled_tensor(&t[i]) ? o->lr_decoupled : lr);
        if (fused)
            be->ops->adamw_checksum(be, p + off, g + off, o->m + off, o->v + off, t[i].numel, r, o->beta1,
                                    o->beta2, o->eps, wd, gscale, o->step, GPT_SUM_SEED(i), &o->sums[i]);
        else
            be->ops->adamw(be, p + off, g + off, o->m + off, o->v + off, t[i].numel, r, o->beta1, o->beta2,
                           o->eps, wd, gscale, o->step);
    }
    gpt_sync_bf16(model);
    /* queued backends (CUDA): the step is done before the host reads parameters or moments
     * (checkpoints) and before an asynchronous failure could go unnoticed; the fused
     * checksums reach o->sums at this sync */
    be->ops->sync(be);
    uint64_t h = 0;
    for (int i = 0; fused && i < nt; i++) h ^= o->sums[i];
    if (sum) *sum = (fused ? h : gpt_weights_checksum32(model)) ^ gpt_weights_checksum16(model);
}

void opt_adamw_step(opt_adamw *o, gpt_model *model, double lr, double grad_norm) {
    opt_adamw_step_checksum(o, model, lr, grad_norm, NULL);
}
