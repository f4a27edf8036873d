/* trainer_mtp.c - the trainer's side of multi-token prediction (docs/mtp.md): the model's
 * MTP settings from the flags, and Megatron's log items " mtp_K loss: X |" (each depth's
 * masked mean loss, averaged over micro batches, data-parallel replicas and the iterations of
 * the log interval, as MTPLossLoggingHelper does) with the metrics record's "mtp_K_loss". The
 * depths' gradient weight is the model's auxiliary-loss weight (trainer_moe.c's setup sets it
 * for both). The rerun state machine validates the main loss only, as Megatron's. Under
 * tensor parallelism every tensor rank computes the whole losses (vocabulary-parallel
 * cross-entropy); under context parallelism each context rank its tokens' part. */
#include "train/trainer_internal.h"

#include "common/error.h"

#include <stdio.h>
#include <string.h>

void trainer__mtp_config(trainer *t, gpt_config *m) {
    const co_config *c = &t->cfg;
    m->mtp_layers = c->mtp_num_layers;
    m->mtp_loss_scaling = (float)c->mtp_loss_scaling_factor;
}

void trainer__mtp_step(trainer *t) {
    int D = t->cfg.mtp_num_layers;
    if (D <= 0) return;
    double s[GPT_MAX_MTP];
    int64_t n;
    gpt_mtp_stats_take(t->model, s, &n);
    for (int k = 0; k < D; k++) t->mtp_sum[k] += s[k];
    t->mtp_count += (double)n;
}

int trainer__mtp_log(trainer *t, char *text, size_t tn, char *json, size_t jn) {
    int D = t->cfg.mtp_num_layers;
    text[0] = json[0] = '\0';
    if (D <= 0) return 0;
    /* every replica's last stage holds the depths: sums over the data-parallel group, and
     * over the pipeline (the other stages add zeros; of the last stage's tensor ranks, which
     * hold the same losses, tensor rank 0 alone) */
    double v[GPT_MAX_MTP + 1];
    for (int k = 0; k < D; k++) v[k] = t->mtp_sum[k];
    v[D] = t->mtp_count;
    int rc = t->g.dp ? t->g.dp->ops->allreduce_sum(t->g.dp, v, (size_t)D + 1, CM_F64, TRAIN_COMM_TIMEOUT_MS) : 0;
    /* each context rank's loss is its tokens' part (over the whole sequences' count): summed
     * over the context group, the count not */
    if (!rc && t->cpn > 1) rc = t->g.cp->ops->allreduce_sum(t->g.cp, v, (size_t)D, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (!rc && t->g.pp && t->g.mp) {
        if (t->g.tp && t->g.tp->rank != 0) memset(v, 0, sizeof v);
        rc = t->g.mp->ops->allreduce_sum(t->g.mp, v, (size_t)D + 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    }
    if (rc) return rc;
    int len = 0, jl = 0;
    for (int k = 0; k < D; k++) {
        double l = v[D] > 0 ? v[k] / v[D] : 0;
        if ((size_t)len < tn) len += snprintf(text + len, tn - (size_t)len, " mtp_%d loss: %.6E |", k + 1, l);
        if ((size_t)jl < jn) jl += snprintf(json + jl, jn - (size_t)jl, ",\"mtp_%d_loss\":%.9e", k + 1, l);
        t->mtp_sum[k] = 0;
    }
    t->mtp_count = 0;
    return 0;
}
