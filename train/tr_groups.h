/* tr_groups.h - the communicators a trainer works over, as one object (Megatron-core's
 * process groups travelling together), and which of them each kind of collective goes over.
 *
 * A worker builds it from its generation's communicators in one place (worker/comms.c,
 * wk_comms_trainer_groups) and hands it whole to trainer_new, and again to trainer_set_groups
 * at every in-process restart (NULL between generations: the old groups are destroyed). A
 * group is NULL where its kind of parallelism is off; the trainer keeps only the groups its
 * configuration uses, so the resolvers below can tell what is on from what is set. */
#ifndef COHORT_TRAIN_TR_GROUPS_H
#define COHORT_TRAIN_TR_GROUPS_H

#include <stddef.h>

struct cm_comm;

typedef struct tr_groups {
    /* the data-parallel group (NULL: one process); with it each rank takes its share of every
     * global batch, and rank 0 builds the data index caches before the others */
    struct cm_comm *dp;
    /* the tensor-parallel group: the model is split over it, only its rank 0 reads batches,
     * which it broadcasts (Megatron's get_batch_on_this_tp_rank) */
    struct cm_comm *tp;
    /* the pipeline group (activations forward, the losses' sum), its second channel (the
     * gradients'), the embedding group (NULL off the stages holding a copy of the word
     * embedding) and the model-parallel group (tensor x pipeline: one replica) */
    struct cm_comm *pp, *pp_bwd, *emb, *mp;
    /* the pipeline's two channels on the device (NCCL, --device cuda; NULL otherwise): the
     * activations and their gradients, sent and received in stream order (train/pipeline.c);
     * pp and pp_bwd still carry the micro batches' positions and the losses, on the host */
    struct cm_comm *pp_dev, *pp_dev_bwd;
    /* the context group, the data x context group (gradients and loss reports are summed over
     * it) and the tensor x context group (the MoE layers' token group under tensor
     * parallelism) (train/trainer_cp.c) */
    struct cm_comm *cp, *dpcp, *tpcp;
    /* expert parallelism (train/trainer_ep.c): the expert-tensor x expert group (the layers'
     * exchange), the expert-data-parallel group, the expert group x pipeline (one whole model) */
    struct cm_comm *ep, *edp, *erep;
    /* --overlap-grad-reduce: the gradient group (tr_groups_grad's ranks, in its order) over a
     * transport of its own (with NCCL an NCCL communicator of its own), used only by the
     * communication threads (train/trainer_overlap.c, trainer_pgather.c); NULL where the
     * worker opened none */
    struct cm_comm *grad_ovl;
    /* the same for the expert-data-parallel group under expert parallelism (the experts'
     * gradients and parameters); NULL where the worker opened none */
    struct cm_comm *edp_ovl;
} tr_groups;

/* The ranks holding one replica of the model between them: the model-parallel group with a
 * pipeline, the tensor group without (NULL: this rank alone). */
static inline struct cm_comm *tr_groups_replica(const tr_groups *g) { return g->pp ? g->mp : g->tp; }

/* The group gradients and loss reports are summed over: data x context with context
 * parallelism, data parallel without. */
static inline struct cm_comm *tr_groups_grad(const tr_groups *g) { return g->cp ? g->dpcp : g->dp; }

/* The ranks holding the same state, over which a replica's state is taken (a repair, a
 * replacement, the replica check): expert data parallel with expert parallelism, else data
 * parallel. */
static inline struct cm_comm *tr_groups_state(const tr_groups *g) { return g->ep ? g->edp : g->dp; }

/* The ranks the validator sees as one replica (checksums combined, a check round run by all
 * of them): the expert group x pipeline with expert parallelism, else the replica group, or
 * with context parallelism alone the context group (its ranks hold the same weights). */
static inline struct cm_comm *tr_groups_validation(const tr_groups *g) {
    if (g->ep) return g->erep;
    struct cm_comm *rg = tr_groups_replica(g);
    return rg ? rg : g->cp;
}

#endif
