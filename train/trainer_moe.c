/* trainer_moe.c - the trainer's side of the mixture of experts (docs/moe.md): the model's
 * MoE configuration from the flags, the aux losses' gradient weight, Megatron's log items
 * ("load_balancing_loss", "z_loss": each loss over its coefficient, averaged over the MoE
 * layers, micro batches, data-parallel replicas and the iterations of the log interval), and
 * the router-collapse health check: one expert getting more than --moe-router-collapse-share
 * of a layer's tokens on this rank for --moe-router-collapse-iters iterations in a row is a
 * training-health event (the event sink: the run report and the log), once per episode. With
 * --moe-router-enable-expert-bias each MoE layer's bias moves before every optimizer step
 * toward the even load (the step's tokens per expert summed over the data-parallel group,
 * the tensor group and the context group: each of their ranks routes its own tokens).
 * The statistics of an attempt the rerun state machine replays are discarded. */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "model/gpt_check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trainer__moe_config(trainer *t, gpt_config *m) {
    const co_config *c = &t->cfg;
    if (c->num_experts <= 0) return;
    gpt_moe_of(c, c->ffn_hidden_size, &m->moe);
    /* --expert-tensor-parallel-size: unset means the tensor size (Megatron's default) */
    if (!m->moe.etp_size) m->moe.etp_size = t->tp_size;
    gpt_moe_layers_of(c, m);
}

int trainer__moe_setup(trainer *t) {
    const co_config *c = &t->cfg;
    /* Megatron's MoEAuxLossAutoScaler and MTPLossAutoScaler: the auxiliary losses' gradient
     * weighs as the main loss's, 1 / micro batches (under --elastic dp / the batch's) */
    gpt_set_aux_loss_scale(t->model, (float)trainer__mb_weight(t, 0));
    if (c->num_experts <= 0) return 0;
    size_t n = (size_t)c->num_layers * (size_t)c->num_experts;
    t->moe_tpe = calloc(n, sizeof *t->moe_tpe);
    t->moe_streak = calloc((size_t)c->num_layers, sizeof *t->moe_streak);
    t->moe_cnt = malloc(sizeof *t->moe_cnt * (size_t)c->num_experts);
    if (!t->moe_tpe || !t->moe_streak || !t->moe_cnt) return co_err_set(CO_ENOMEM, "trainer: the MoE statistics");
    return 0;
}

void trainer__moe_free(trainer *t) {
    free(t->moe_tpe);
    free(t->moe_streak);
    free(t->moe_cnt);
    t->moe_tpe = NULL;
    t->moe_streak = NULL;
    t->moe_cnt = NULL;
}

void trainer__aux_attempt(trainer *t) {
    const co_config *c = &t->cfg;
    gpt_moe_stats st;
    if (c->num_experts > 0) {
        /* global_aux_loss: this generation's data-parallel group, the step's running sums
         * cleared (Megatron resets them in finalize_model_grads, once per step; a replayed
         * attempt starts over) */
        if (!strcmp(c->moe_router_load_balancing_type, "global_aux_loss")) {
            gpt_set_moe_global_group(t->model, t->g.dp, TRAIN_COMM_TIMEOUT_MS);
            gpt_moe_global_reset(t->model);
        }
        gpt_moe_stats_take(t->model, &st, NULL);
        memset(t->moe_tpe, 0, sizeof(int64_t) * (size_t)c->num_layers * (size_t)c->num_experts);
    }
    if (c->mtp_num_layers > 0) {
        double s[GPT_MAX_MTP];
        int64_t n;
        gpt_mtp_stats_take(t->model, s, &n);
    }
}

void trainer__aux_report(trainer *t, rr_report *r) {
    const co_config *c = &t->cfg;
    r->naux = 0;
    /* this attempt's means so far, as the log line computes them (over its MoE layers' and
     * micro batches' forwards; the MTP depths' over the head chunk's forwards) */
    if (c->num_experts > 0) {
        gpt_moe_stats st;
        gpt_moe_stats_peek(t->model, &st);
        if (st.forwards > 0) {
            if (c->moe_aux_loss_coeff > 0 && strcmp(c->moe_router_load_balancing_type, "none")) {
                snprintf(r->aux_key[r->naux], sizeof r->aux_key[0], "load_balancing_loss");
                r->aux[r->naux++] = st.lb_loss / (double)st.forwards;
            }
            if (c->moe_z_loss_coeff > 0) {
                snprintf(r->aux_key[r->naux], sizeof r->aux_key[0], "z_loss");
                r->aux[r->naux++] = st.z_loss / (double)st.forwards;
            }
        }
    }
    if (c->mtp_num_layers > 0) {
        double s[GPT_MAX_MTP];
        int64_t n;
        gpt_mtp_stats_peek(t->model, s, &n);
        for (int k = 0; n > 0 && k < c->mtp_num_layers && r->naux < RR_MAX_AUX; k++) {
            snprintf(r->aux_key[r->naux], sizeof r->aux_key[0], "mtp_%d loss", k + 1);
            r->aux[r->naux++] = s[k] / (double)n;
        }
    }
}

int trainer__moe_pre_step(trainer *t) {
    const co_config *c = &t->cfg;
    if (c->num_experts <= 0 || !t->moe_tpe) return 0;
    gpt_moe_stats st;
    gpt_moe_stats_take(t->model, &st, t->moe_tpe);
    t->moe_lb_sum += st.lb_loss;
    t->moe_z_sum += st.z_loss;
    t->moe_forwards += (double)st.forwards;
    t->moe_dropped += (double)st.dropped;
    if (!c->moe_router_enable_expert_bias) return 0;
    /* Megatron's _update_router_expert_bias (in finalize_model_grads, before the step): the
     * step's tokens per expert summed over the data-parallel replicas, each MoE layer's bias
     * moved by rate toward the even load. Every replica applies the same update. */
    size_t n = (size_t)c->num_layers * (size_t)c->num_experts;
    int rc = t->g.dp ? t->g.dp->ops->allreduce_sum(t->g.dp, t->moe_tpe, n, CM_I64, TRAIN_COMM_TIMEOUT_MS) : 0;
    if (!rc && t->g.tp) rc = t->g.tp->ops->allreduce_sum(t->g.tp, t->moe_tpe, n, CM_I64, TRAIN_COMM_TIMEOUT_MS);
    if (!rc && t->cpn > 1) rc = t->g.cp->ops->allreduce_sum(t->g.cp, t->moe_tpe, n, CM_I64, TRAIN_COMM_TIMEOUT_MS);
    if (rc) return rc;
    int32_t *cnt = t->moe_cnt;
    for (int l = 0; l < c->num_layers; l++) {
        float *bias = gpt_moe_expert_bias(t->model, l);
        if (!bias) continue;
        for (int e = 0; e < c->num_experts; e++) {
            int64_t v = t->moe_tpe[(size_t)l * c->num_experts + e];
            cnt[e] = v > INT32_MAX ? INT32_MAX : (int32_t)v;
        }
        moe_expert_bias_update(bias, cnt, c->num_experts, (float)c->moe_router_bias_update_rate);
        trainer__dopt_params_moved(t, bias, (size_t)c->num_experts); /* (its copy of a peer's shard too) */
    }
    return 0;
}

void trainer__moe_step(trainer *t) {
    const co_config *c = &t->cfg;
    if (c->num_experts <= 0 || !t->moe_tpe || c->moe_router_collapse_iters <= 0) return;
    int E = c->num_experts, k = c->moe_router_topk;
    for (int l = 0; l < c->num_layers; l++) {
        const int64_t *tpe = t->moe_tpe + (size_t)l * E;
        int64_t sum = 0, mx = 0;
        int arg = 0;
        for (int e = 0; e < E; e++) {
            sum += tpe[e];
            if (tpe[e] > mx) mx = tpe[e], arg = e;
        }
        if (!sum) continue; /* not a MoE layer of this stage */
        /* the share of the layer's tokens the busiest expert computed (k rows per token) */
        double share = (double)mx * k / (double)sum;
        if (share > c->moe_router_collapse_share) {
            if (++t->moe_streak[l] == c->moe_router_collapse_iters) {
                char line[300];
                snprintf(line, sizeof line,
                         "training health: router collapse in layer %d at iteration %lld: expert %d got %.0f%% of the "
                         "layer's tokens for %d iterations in a row (a balanced router gives each %.0f%%)",
                         l, (long long)t->iteration, arg, 100.0 * share, c->moe_router_collapse_iters, 100.0 * k / E);
                trainer__emit(t, line);
                t->moe_collapses++;
            }
        } else {
            t->moe_streak[l] = 0;
        }
    }
}

int trainer__moe_log(trainer *t, char *text, size_t tn, char *json, size_t jn) {
    const co_config *c = &t->cfg;
    text[0] = json[0] = '\0';
    if (c->num_experts <= 0) return 0;
    /* the sums of this interval over every rank's layers and micro batches: the data-parallel
     * replicas, and one replica's ranks (the model-parallel group with a pipeline, else the
     * tensor group). Under sequence parallelism each tensor rank's load-balancing loss is its
     * part (summed, Megatron's tracker over the tensor-and-context group) and its z loss the
     * mean over its tokens (averaged, Megatron's over tensor x data): the z sum and the forwards,
     * which every tensor rank counts, enter over tp. Context ranks likewise (their sums over
     * the context group). */
    double tp = (t->tp_size > 1 ? (double)t->tp_size : 1.0) * (t->cpn > 1 ? (double)t->cpn : 1.0);
    double v[4] = {t->moe_lb_sum, t->moe_z_sum / tp, t->moe_forwards / tp, t->moe_dropped};
    int rc = t->g.dp ? t->g.dp->ops->allreduce_sum(t->g.dp, v, 4, CM_F64, TRAIN_COMM_TIMEOUT_MS) : 0;
    if (!rc && t->cpn > 1) rc = t->g.cp->ops->allreduce_sum(t->g.cp, v, 4, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    cm_comm *rg = tr_groups_replica(&t->g);
    if (!rc && rg) rc = rg->ops->allreduce_sum(rg, v, 4, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (rc) return rc;
    double lb = v[2] > 0 ? v[0] / v[2] : 0, z = v[2] > 0 ? v[1] / v[2] : 0;
    /* global_aux_loss: each replica's loss is its tokens' part of the global batch's, summed
     * over the replicas as Megatron's "global_load_balancing_loss" (needs_dp_avg=False) */
    bool global = !strcmp(c->moe_router_load_balancing_type, "global_aux_loss");
    if (global && t->g.dp) lb *= (double)t->g.dp->size;
    const char *lbkey = global ? "global_load_balancing_loss" : "load_balancing_loss";
    int len = 0;
    if (c->moe_aux_loss_coeff > 0 && strcmp(c->moe_router_load_balancing_type, "none"))
        len += snprintf(text + len, tn - (size_t)len, " %s: %.6E |", lbkey, lb);
    if (c->moe_z_loss_coeff > 0 && (size_t)len < tn) snprintf(text + len, tn - (size_t)len, " z_loss: %.6E |", z);
    int jl = snprintf(json, jn, ",\"%s\":%.9e,\"z_loss\":%.9e,\"moe_dropped_tokens\":%.0f,"
                      "\"moe_router_collapses\":%lld",
                      lbkey, lb, z, v[3], (long long)t->moe_collapses);
    if ((t->epn > 1 || t->etpn > 1) && jl > 0 && (size_t)jl < jn) {
        /* this (the logging) rank's exchange since the last log line: bytes it sent to its
         * expert group (the expert-tensor x expert group), seconds in dispatch and combine */
        uint64_t bytes;
        double secs;
        gpt_moe_ep_counters(t->model, &bytes, &secs);
        snprintf(json + jl, jn - (size_t)jl, ",\"moe_ep_bytes_sent\":%llu,\"moe_ep_dispatch_s\":%.6f",
                 (unsigned long long)(bytes - t->ep_bytes_logged), secs - t->ep_secs_logged);
        t->ep_bytes_logged = bytes;
        t->ep_secs_logged = secs;
    }
    t->moe_lb_sum = t->moe_z_sum = t->moe_forwards = t->moe_dropped = 0;
    return 0;
}
