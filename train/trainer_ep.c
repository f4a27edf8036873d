/* trainer_ep.c - expert parallelism in the trainer (--expert-model-parallel-size ep > 1,
 * docs/moe.md): the MoE layers' experts split over the expert group, everything else as
 * data parallelism.
 *
 * Groups (Megatron's expert layout, scheduler/groups.h): in the order tp-cp-ep-dp-pp, at
 * expert tensor size 1 the expert group `ep` is ep consecutive ranks of a stage: ep/tp tensor
 * groups (ep a multiple of tp); at expert tensor size = tp (the experts split over the tensor
 * group) `ep` is the expert-tensor x expert group, tp x ep consecutive ranks: ep whole
 * data-parallel replicas. The expert layout has no context dimension: with context
 * parallelism the expert group holds whole tensor x context groups (etp x ep a multiple of
 * tp x cp), ep x etp / (tp x cp) data-parallel replicas, each context rank routing its own
 * tokens; the dense gradients are then reduced over data x context. The expert-data-
 * parallel group `edp` is the ranks at the same place in every expert group (they hold the
 * same experts and the same tensor slices), and `erep` the expert group times the pipeline.
 * Each data-parallel replica reads its own micro batches; a MoE layer sends the tokens its
 * router gives (under tensor parallelism, this rank's sequence-parallel share) to another
 * rank's experts there and back (model/moe_ep.c, --moe-token-dispatcher-type).
 *
 * After the backward (Megatron's DistributedDataParallel with expert parallelism):
 *   - the gradients of every tensor but the experts' are summed over the data-parallel
 *     (x context) group, the experts' over the expert-data-parallel group only (an
 *     expert's owner has already accumulated the gradient of every token its expert group
 *     sent it), and both scaled by 1/dp (Megatron's expert_gradient_scaling_factor
 *     without averaging in the collective): the replicated run's average over every rank's
 *     micro batches;
 *   - the gradient norm: the dense tensors' over the replica's tensor and pipeline ranks
 *     (gpt_tp_grad_sumsq_split, each slice once) plus every expert once, summed over erep.
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
    t->etpn = c->num_experts > 0 && m->moe.etp_size > 1 ? m->moe.etp_size : 1;
    if (t->epn == 1) return 0;
    int dp = t->g.dp ? t->g.dp->size : 1, tp = t->tp_size, etp = t->etpn, cp = t->cpn;
    /* the expert-tensor x expert group: etp x ep consecutive ranks of a stage, whole tensor x
     * context groups (ep a multiple of tp at etp 1; ep data-parallel replicas at etp = tp; the
     * context ranks folded in, Megatron's expert layout) */
    if ((t->epn * etp) % (tp * cp) || dp % (t->epn * etp / (tp * cp)))
        return co_err_set(CO_EINVAL, "--expert-model-parallel-size %d does not divide the %d data-parallel x %d "
                                     "tensor-parallel x %d context-parallel ranks of a stage in whole tensor x context "
                                     "groups (each expert group is ep consecutive ranks)", t->epn, dp, tp, cp);
    /* (the expert-data-parallel size: the stage's ranks over the expert group's) */
    int edp = dp / (t->epn * etp / (tp * cp));
    const tr_groups *g = &data->groups;
    if (!g->ep || g->ep->size != t->epn * etp || !g->edp || g->edp->size != edp || !g->erep)
        return co_err_set(CO_EINVAL, "an expert group of %d ranks (and the expert-data-parallel group of %d) for "
                                     "--expert-model-parallel-size %d x expert tensor size %d",
                          g->ep ? g->ep->size : 0, edp, t->epn, etp);
    t->g.ep = g->ep;
    t->g.edp = g->edp;
    t->g.erep = g->erep;
    t->g.edp_ovl = c->overlap_grad_reduce ? g->edp_ovl : NULL;
    t->epr = t->g.ep->rank / etp;
    m->moe.ep_size = t->epn;
    m->ep_rank = t->epr;
    return 0;
}

/* Experts split over the tensor group without expert parallelism: the tensor group is their
 * exchange group (moe_set_expert_group's expert-tensor x expert group at ep 1). */
void trainer__etp_tensor_group(trainer *t) {
    if (t->epn > 1 || t->etpn == 1 || !t->g.tp) return;
    int rc = gpt_set_expert_group(t->model, t->g.tp, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
    if (rc && !t->be->status) t->be->status = rc;
}

int trainer__ep_model_ready(trainer *t) {
    if (t->epn == 1) {
        if (t->etpn == 1) return 0;
        if (!t->g.tp) return co_err_set(CO_EINVAL, "experts split over the tensor group: no tensor group");
        return gpt_set_expert_group(t->model, t->g.tp, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
    }
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
    t->nep_runs = n;
    return gpt_set_expert_group(t->model, t->g.ep, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
}

void trainer__ep_free(trainer *t) {
    free(t->ep_runs);
    t->ep_runs = NULL;
    t->nep_runs = 0;
}

void trainer__ep_set_groups(trainer *t, const tr_groups *g) {
    if (t->epn == 1) return;
    t->g.ep = g->ep;
    t->g.edp = g->edp;
    t->g.erep = g->erep;
    t->g.edp_ovl = t->cfg.overlap_grad_reduce ? g->edp_ovl : NULL;
    /* the layers keep their layout between generations (nothing runs then); the new
     * generation's group replaces the old one */
    if (!g->ep) return;
    /* an exchange the last generation's abort failed left the sticky status: cleared first,
     * since the backend allocates nothing while it is set (the allgather dispatcher's
     * buffers are the new group's); a group that does not fit the layers, or buffers that
     * cannot be had, leave it set for the first step to report */
    kb_backend_clear_status(t->be);
    t->be->status = gpt_set_expert_group(t->model, g->ep, dispatcher_of(&t->cfg), TRAIN_COMM_TIMEOUT_MS);
}

int trainer__ep_reduce_grads(trainer *t) {
    float *g = gpt_grads(t->model);
    for (int i = 0; i < t->nep_runs; i++) {
        const struct tr_ep_run *r = &t->ep_runs[i];
        /* (the dense tensors' over data x context: each context rank's part of its replica's) */
        cm_comm *c = r->expert ? t->g.edp : tr_groups_grad(&t->g);
        if (!r->len || c->size == 1) continue;
        int rc = c->ops->allreduce_sum(c, g + r->off, r->len, CM_F32, TRAIN_COMM_TIMEOUT_MS);
        if (rc) return rc;
    }
    t->be->ops->scale(t->be, g, 1.0f / (float)t->g.dp->size, gpt_num_params(t->model));
    return kb_backend_status(t->be);
}

int trainer__ep_nruns(const trainer *t) { return t->nep_runs; }

bool trainer__ep_run_at(const trainer *t, size_t at, size_t *start) {
    for (int i = 0; i < t->nep_runs; i++) {
        const struct tr_ep_run *r = &t->ep_runs[i];
        if (at >= r->off && at < r->off + r->len) {
            *start = r->off;
            return r->expert;
        }
    }
    *start = 0; /* (not in any run: the buffer before the first, dense) */
    return false;
}

int trainer__ep_grad_norm(trainer *t, double *out) {
    /* the dense tensors' over the replica (after the reduction the step's gradient, equal on
     * every replica; before it, a report to the validator: this replica's own), the experts'
     * over the expert group x pipeline (before the reduction each rank's own experts hold its
     * expert group's tokens' share: the same on a check round's counterparts) */
    double sq[2];
    sq[0] = gpt_tp_grad_sumsq_split(t->model, &sq[1]);
    int rc = kb_backend_status(t->be);
    cm_comm *rg = tr_groups_replica(&t->g);
    if (!rc && rg) rc = rg->ops->allreduce_sum(rg, &sq[0], 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (!rc) rc = t->g.erep->ops->allreduce_sum(t->g.erep, &sq[1], 1, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    *out = sqrt(sq[0] + sq[1]);
    return rc;
}

/* ---- the validator's view: an expert group is one replica ---- */

/* data-parallel ranks per expert group (the expert-tensor x expert group: whole tensor x
 * context groups) */
static int dp_per_group(const trainer *t) { return t->epn * t->etpn / (t->tp_size * t->cpn); }

int trainer__ep_replica_of(const trainer *t, int world_rank) {
    topo_coord co;
    if (!t->have_layout || world_rank < 0 || topo_coords(&t->layout, world_rank, &co)) return world_rank;
    return co.dp / dp_per_group(t);
}

int trainer__ep_check_share(const trainer *t, int helper, int suspect) {
    int q = dp_per_group(t);
    if (trainer__ep_replica_of(t, helper) != t->topo.dp_rank / q) return -1;
    /* this rank's counterpart in the suspect's expert group */
    return trainer__ep_replica_of(t, suspect) * q + t->topo.dp_rank % q;
}
