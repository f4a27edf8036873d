/* trainer_ep.c - expert parallelism in the trainer (--expert-model-parallel-size ep > 1,
 * docs/moe.md): the MoE layers' experts split over the expert group, everything else as
 * data parallelism.
 *
 * Groups (Megatron's expert layout, scheduler/groups.h; tensor and context size 1): the
 * expert group `ep` is ep consecutive data-parallel ranks, the expert-data-parallel group
 * `edp` the ranks at the same place in every expert group (they hold the same experts), and
 * `erep` the expert group times the pipeline: the ranks that hold one whole model between
 * them. Each rank reads its own micro batches as a data-parallel rank does; a MoE layer
 * sends the tokens its router gives to another rank's experts there and back
 * (model/moe_ep.c, --moe-token-dispatcher-type).
 *
 * After the backward (Megatron's DistributedDataParallel with expert parallelism):
 *   - the gradients of every tensor but the experts' are summed over the data-parallel
 *     group, the experts' over the expert-data-parallel group only (an expert's owner has
 *     already accumulated the gradient of every token its expert group sent it), and both
 *     scaled by 1/dp (Megatron's expert_gradient_scaling_factor without averaging in the
 *     collective): the replicated run's average over every rank's micro batches;
 *   - the gradient norm counts the dense tensors once (expert rank 0's) and every expert
 *     once (its expert rank's), summed over erep.
 *
 * For the rerun state machine an expert group is one replica: a rank's results depend on
 * its expert group's data, so a check round recomputes a suspect's micro batches on the
 * whole expert group of the next expert-data-parallel replica, each rank taking its
 * counterpart's share; checksums are combined over erep; a replica's state (a repair, a
 * replacement) is taken over the expert-data-parallel group, where every rank holds the
 * same experts. */
#include "train/trainer_internal.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One run of consecutive tensors of the same kind (expert or not) in the flat buffers. */
struct tr_ep_run {
    size_t off, len;
    bool expert;
};

static moe_dispatcher dispatcher_of(const co_config *c) {
    return strcmp(c->moe_token_dispatcher_type, "allgather") ? MOE_DISPATCH_ALLTOALL : MOE_DISPATCH_ALLGATHER;
}

int trainer__ep_setup(trainer *t, const trainer_data *data, gpt_config *m) {
    const co_config *c = &t->cfg;
    t->epn = c->num_experts > 0 && c->expert_model_parallel_size > 1 ? c->expert_model_parallel_size : 1;
    t->epr = 0;
    if (t->epn == 1) return 0;
    int dp = t->dp ? t->dp->size : 1;
    if (dp % t->epn)
        return co_err_set(CO_EINVAL, "--expert-model-parallel-size %d does not divide the %d data-parallel ranks "
                                     "(each expert group is ep data-parallel ranks)", t->epn, dp);
    if (!data->ep || data->ep->size != t->epn || !data->edp || data->edp->size != dp / t->epn || !data->erep)
        return co_err_set(CO_EINVAL, "an expert group of %d ranks (and the expert-data-parallel group of %d) for "
                                     "--expert-model-parallel-size %d", data->ep ? data->ep->size : 0, dp / t->epn,
                          t->epn);
    t->ep = data->ep;
    t->edp = data->edp;
    t->erep = data->erep;
    t->epr = t->ep->rank;
    m->moe.ep_size = t->epn;
    m->ep_rank = t->epr;
    return 0;
}

int trainer__ep_model_ready(trainer *t) {
    if (t->epn == 1) return 0;
    const gpt_tensor *tab = gpt_tensors(t->model);
    int nt = gpt_num_tensors(t->model);
    t->ep_runs = calloc((size_t)nt + 1, sizeof *t->ep_runs);
    if (!t->ep_runs) return co_err_set(CO_ENOMEM, "trainer: the expert-parallel gradient runs");
    /* consecutive tensors of one kind make one run; the padding between tensors goes with
     * the run before it (zero in every buffer) and the tail after the last tensor with it */
    size_t total = gpt_num_params(t->model);
    int n = 0;
    for (int i = 0; i < nt; i++) {
        bool ex = tab[i].expert;
        if (n && t->ep_runs[n - 1].expert == ex) continue;
        if (n) t->ep_runs[n - 1].len = tab[i].offset - t->ep_runs[n - 1].off;
        t->ep_runs[n++] = (struct tr_ep_run){tab[i].offset, 0, ex};
    }
    if (n) t->ep_runs[n - 1].len = total - t->ep_runs[n - 1].off;
    if (n && t->ep_runs[0].off) t->ep_runs[0].len += t->ep_runs[0].off, t->ep_runs[0].off = 0;
    t->nep_runs = n;
    return gpt_set_expert_group(t->model, t->ep, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
}

void trainer__ep_free(trainer *t) {
    free(t->ep_runs);
    t->ep_runs = NULL;
    t->nep_runs = 0;
}

void trainer_set_expert_groups(trainer *t, cm_comm *ep, cm_comm *edp, cm_comm *erep) {
    if (t->epn == 1) return;
    t->ep = ep;
    t->edp = edp;
    t->erep = erep;
    /* the layers keep their layout between generations (nothing runs then); the new
     * generation's group replaces the old one */
    if (!ep) return;
    int rc = gpt_set_expert_group(t->model, ep, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
    /* an exchange the last generation's abort failed left the sticky status; a group that
     * does not fit the layers leaves it set for the first step to report */
    t->be->status = rc;
}

int trainer__ep_reduce_grads(trainer *t) {
    float *g = gpt_grads(t->model);
    for (int i = 0; i < t->nep_runs; i++) {
        const struct tr_ep_run *r = &t->ep_runs[i];
        cm_comm *c = r->expert ? t->edp : t->dp;
        if (!r->len || c->size == 1) continue;
        int rc = c->ops->allreduce_sum(c, g + r->off, r->len, CM_F32, TRAIN_COMM_TIMEOUT_MS);
        if (rc) return rc;
    }
    t->be->ops->scale(t->be, g, 1.0f / (float)t->dp->size, gpt_num_params(t->model));
    return kb_backend_status(t->be);
}

int trainer__ep_grad_norm(trainer *t, bool reduced, double *out) {
    /* reduced: the step's gradient, the dense tensors equal on every expert rank (counted on
     * expert rank 0); before the reduction (a report to the validator): every rank's own */
    const gpt_tensor *tab = gpt_tensors(t->model);
    int nt = gpt_num_tensors(t->model);
    const float *g = gpt_grads(t->model);
    double sq = 0;
    for (int i = 0; i < nt; i++) {
        if (tab[i].emb_copy) continue; /* (the first stage counts the tied embedding) */
        if (tab[i].expert || !reduced || t->epr == 0) sq += t->be->ops->sumsq(t->be, g + tab[i].offset, tab[i].numel);
    }
    int rc = kb_backend_status(t->be);
    if (!rc) rc = t->erep->ops->allreduce_sum(t->erep, &sq, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    *out = sqrt(sq);
    return rc;
}

/* ---- the validator's view: an expert group is one replica ---- */

int trainer__ep_replica_of(const trainer *t, int world_rank) {
    topo_coord co;
    if (!t->have_layout || world_rank < 0 || topo_coords(&t->layout, world_rank, &co)) return world_rank;
    return co.dp / t->epn;
}

int trainer__ep_check_share(const trainer *t, int helper, int suspect) {
    if (trainer__ep_replica_of(t, helper) != t->topo.dp_rank / t->epn) return -1;
    /* this rank's counterpart in the suspect's expert group */
    return trainer__ep_replica_of(t, suspect) * t->epn + t->epr;
}
