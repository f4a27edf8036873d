/* dist_opt.h - the distributed optimizer (ZeRO-1, Megatron's --use-distributed-optimizer):
 * the bucketed parameter/gradient layout, the sharded AdamW step over the data-parallel
 * group, and an optional second copy of every shard on the next data-parallel rank.
 * docs/distributed-optimizer.md describes it; train/trainer_dopt.c wires it
 * into the trainer (--use-distributed-optimizer).
 *
 * Layout (Megatron's param_and_grad_buffer.py with use_distributed_optimizer): parameters
 * in reverse table order, each start padded to a multiple of 64 elements; a bucket is
 * closed once it holds >= bucket_size elements (default max(40M, 1M*dp)) and its end is
 * padded to lcm(dp, 128); bucket b of n elements is split into dp equal contiguous shards,
 * rank k owning [start + k*n/dp, start + (k+1)*n/dp). Padding is never a parameter; its
 * gradient must be zero (dopt_grads_clear keeps it so).
 *
 * Step (dopt_step): per bucket a reduce-scatter of the gradient buffer over the group, in
 * place (the rank's shard of the gradient buffer receives the sum), scaled by 1/dp as the
 * trainer averages; the global norm from the shards (sum of squares all-reduced in f64);
 * clipping and AdamW with optim/adamw.c's coefficient and the backend's AdamW kernel on
 * the rank's pieces of each parameter (fp32 parameters are the main parameters: the
 * update writes the rank's shard of the parameter buffer, moments are shard-sized); then
 * per bucket an in-place all-gather of the parameter buffer. Every call has the timeout
 * given; errors of the communicator (timeout, abort, a dead peer) are returned with the
 * step named; after one, the state is undefined (rebuild the communicator, restore).
 *
 * Redundancy (opt.redundant): rank (k+1) mod dp also holds shard k's parameters and
 * moments: after the reduce-scatter rank k sends its reduced, averaged shard gradient to
 * k+1, which applies the same update to its copy, so both copies stay bitwise equal and a
 * dead rank's shard is restored from its neighbour without a disk read (dopt_shard_view_get,
 * dopt_shard_restore).
 *
 * Buffers come from the backend. The step's copies (the copy's initial parameters and its
 * gradient in the all-reduce form, dopt_init_shards, dopt_copy_refresh) are backend copies in
 * stream order; pack, unpack, the views and restores are memcpy after a sync (on cuda the
 * buffers are managed memory). Where the backend has a stream and the group stream-ordered
 * operations (CUDA with NCCL), the copy's gradient exchange and dopt_gather are queued on the
 * backend's stream with no wait: the host syncs before it reads the parameters. */
#ifndef COHORT_OPTIM_DIST_OPT_H
#define COHORT_OPTIM_DIST_OPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"

#define DOPT_PARAM_ALIGN 64
#define DOPT_BUCKET_ALIGN 128

/* One rank's piece of one parameter: elements [param_lo, param_hi) of parameter `param`
 * (its index in the table) lie at [shard_off, shard_off + param_hi - param_lo) of the
 * rank's shard storage (the concatenation of its shard of every bucket, in bucket order),
 * which is [buf_off, ...) of the full buffer. */
typedef struct dopt_piece {
    int param, bucket;
    size_t param_lo, param_hi;
    size_t shard_off, buf_off;
} dopt_piece;

typedef struct dopt_bucket {
    size_t start, end;     /* [start, end) of the buffer; end padded */
    size_t numel_unpadded; /* last parameter's end - start */
    size_t shard;          /* (end - start) / dp */
    size_t shard_base;     /* offset of this bucket's shard in a rank's shard storage */
} dopt_bucket;

typedef struct dopt_layout {
    int dp, nparams, nbuckets;
    size_t bucket_size; /* the cut used */
    size_t total;       /* buffer elements, padding included */
    size_t shard_total; /* elements of one rank's shard storage (sum of bucket shards) */
    size_t *param_start; /* [nparams] start of each parameter in the buffer */
    size_t *param_numel; /* [nparams] */
    int *param_bucket;   /* [nparams] */
    dopt_bucket *buckets;
    int *npieces;        /* [dp] */
    dopt_piece **pieces; /* [dp][npieces[r]], in buffer order */
} dopt_layout;

/* Megatron's default bucket size: max(40,000,000, 1,000,000 * dp). */
size_t dopt_default_bucket_size(int dp);

/* The layout of nparams parameters of numel[i] elements (table order; laid out reversed)
 * over dp ranks; bucket_size 0 = the default. Pure. CO_EINVAL on a bad argument. */
int dopt_layout_build(dopt_layout *L, const size_t *numel, int nparams, int dp, size_t bucket_size);
void dopt_layout_free(dopt_layout *L);

/* Bytes per parameter held on one rank for fp32 parameters and gradients: full parameter
 * and gradient buffers, shards of both moments, with redundancy the copy of a neighbour's
 * shard (parameters, both moments) and its received gradient; padding counted. */
double dopt_bytes_per_param(const dopt_layout *L, size_t nparams_total, bool redundant);

typedef struct dopt_options {
    float beta1, beta2, eps, weight_decay, clip_grad;
    float inv_loss_scale; /* --fp16: as opt_adamw's (0: the gradients are not scaled) */
    bool redundant; /* keep a copy of shard (rank-1) mod dp */
    /* reduce and gather with all-reduces instead of reduce-scatter and all-gather: where the
     * group's all-reduce goes through shared memory (cm_zmq_shared_memory: every rank on one
     * host) and its reduce-scatter and all-gather through sockets, this is cheaper. The
     * gradient buckets are all-reduced (every rank gets every shard's sum, in rank order: the
     * replicated optimizer's bits; the redundant copy's gradient is then read locally, not
     * sent); the parameters are gathered by an all-reduce of their bits (64-bit integer
     * sums of each rank's own shard and zeros elsewhere: an exact copy). */
    bool allreduce;
    int timeout_ms; /* every collective's timeout (< 0: none, still abortable) */
    /* the reduced gradient is divided by this (0: the group's size); with context parallelism
     * the group is data x context but the replicas averaged are the data-parallel ones */
    int average_over;
} dopt_options;

/* A shard's optimizer state: both moments and the steps taken (its parameters are copied
 * out separately by dopt_shard_view_get: the own shard's live inside the full buffer).
 * Dense shard storage: bucket b's part at L.buckets[b].shard_base; padding included. */
typedef struct dopt_shard_view {
    int shard;   /* the data-parallel rank that owns it */
    size_t n;    /* L.shard_total elements */
    const float *m, *v;
    int64_t step;
} dopt_shard_view;

typedef struct dopt_state {
    dopt_layout L;
    dopt_options opt;
    kb_backend *be;
    int rank;       /* data-parallel rank */
    float *params;  /* [L.total] the full parameters, in the layout */
    float *grads;   /* [L.total] the gradient buffer, in the layout */
    bool borrowed;  /* params and grads are the caller's (dopt_init_borrowed): not freed here */
    float *m, *v;   /* [L.shard_total] this rank's shard of the moments */
    /* redundancy: shard (rank-1) mod dp's parameters, moments and received gradient */
    float *rparams, *rm, *rv, *rgrad;
    int64_t step;
    /* the norm's runs: [lo, hi) pairs of the buffer, sorted, whose gradient this rank counts
     * in the global norm (NULL: all of it). With tensor or pipeline parallelism a replicated
     * tensor's gradient lives on several model-parallel ranks and must count once
     * (dopt_set_norm_runs). */
    size_t *norm_runs;
    int nnorm_runs;
    double norm_sq; /* the last reduction's global sum of squares (the norm before its root) */
    /* --decoupled-lr (Megatron's embedding and output layer parameter groups): the layout's
     * parameters flagged here [L.nparams] take lr_decoupled instead of the step's rate, as
     * optim/adamw.c's; NULL (dopt_init's) or lr_decoupled < 0: one rate. The caller's array. */
    const bool *decoupled;
    double lr_decoupled;
} dopt_state;

/* State for data-parallel rank `rank` of L.dp (the layout is copied); buffers from the
 * backend, zeroed. Fill params (dopt_pack), then call dopt_init_shards once. */
int dopt_init(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be);
/* The same over the caller's parameter and gradient buffers of L.total elements each (the
 * model's flat buffers laid out as L: gpt_relayout), so that no second full copy exists;
 * dopt_free leaves them. */
int dopt_init_borrowed(dopt_state *s, const dopt_layout *L, int rank, const dopt_options *opt, kb_backend *be,
                       float *params, float *grads);
void dopt_free(dopt_state *s);
/* After params hold the initial weights (the same on every rank): copies the neighbour's
 * shard of them for the redundant copy. Moments start at zero. */
void dopt_init_shards(dopt_state *s);
/* After the caller changed params [lo, hi) itself on every rank alike (a parameter without a
 * gradient that the trainer moves, the MoE router's expert bias): the redundant copy of the
 * neighbour's shard takes the new values, so that a handover restores them. */
void dopt_copy_refresh(dopt_state *s, size_t lo, size_t hi);
/* Zeroes the gradient buffer (padding included). */
void dopt_grads_clear(dopt_state *s);

/* Model order <-> layout: src holds parameter i at offsets[i] (e.g. gpt_tensor offsets);
 * dst gets it at L->param_start[i]. unpack is the reverse. Padding of dst untouched. */
void dopt_pack(const dopt_layout *L, const float *src, const size_t *offsets, float *dst);
void dopt_unpack(const dopt_layout *L, const float *src, const size_t *offsets, float *dst);

/* One optimizer step at learning rate lr over the data-parallel group dp (size L.dp, this
 * process rank s->rank): reduce-scatter, norm, clip, AdamW on the shard, all-gather. decay[i]:
 * weight decay applies to parameter i. *grad_norm_out (may be NULL): the global norm of the
 * averaged gradient. Returns 0 or the communicator's error, with the step named. */
int dopt_step(dopt_state *s, cm_comm *dp, const bool *decay, double lr, double *grad_norm_out);
/* dopt_step in its two halves (the trainer checks the norm and awaits its validator's verdict
 * in between): dopt_reduce (reduce-scatter, average, the norm, the redundant copy's gradient)
 * and dopt_update (clip with that norm, AdamW on the shard and the copy, all-gather). */
int dopt_reduce(dopt_state *s, cm_comm *dp, double *grad_norm_out);
/* dopt_reduce with the sum of squares also summed over mp (the model-parallel ranks of one
 * replica: tensor x pipeline; NULL: none), each rank counting its norm runs' part of its
 * shard: the norm of the whole model's averaged gradient. */
int dopt_reduce_mp(dopt_state *s, cm_comm *dp, cm_comm *mp, double *grad_norm_out);
/* dopt_reduce_mp in parts, for a reduction overlapped with the backward: the collective of
 * bucket b alone (each bucket once, in the same order on every rank; from any one thread at
 * a time: no backend call), then, once all are done, dopt_reduce_finish (the average, the
 * norm, the redundant copy's gradient). The bits are dopt_reduce_mp's. */
int dopt_reduce_bucket(dopt_state *s, cm_comm *dp, int b);
int dopt_reduce_finish(dopt_state *s, cm_comm *dp, cm_comm *mp, double *grad_norm_out);
/* The runs of the buffer this rank counts in the norm (n pairs [lo, hi), sorted, not
 * overlapping; copied). CO_ENOMEM. */
int dopt_set_norm_runs(dopt_state *s, const size_t *runs, int n);
int dopt_update(dopt_state *s, cm_comm *dp, const bool *decay, double lr, double grad_norm);
/* dopt_update in its two halves: the update of the shard and of the copy (local: no
 * communication, so an abort cannot interrupt it), and the all-gather of the parameters
 * (what an in-process restart redoes after the handover when an abort interrupted it). */
int dopt_update_shards(dopt_state *s, const bool *decay, double lr, double grad_norm);
int dopt_gather(dopt_state *s, cm_comm *dp);
/* dopt_gather in parts, for a gather overlapped with the next forward: the all-gather of
 * bucket b alone (each bucket once, in the same order on every rank; from any one thread at
 * a time: no backend call, so the caller syncs the backend after the update first (a queued
 * backend, CUDA, may still be writing the shard); the bucket's parameters are undefined
 * until it returns). */
int dopt_gather_bucket(dopt_state *s, cm_comm *dp, int b);

/* This rank's state of shard `shard`: its own (shard == rank) or, with redundancy, its copy
 * of shard (rank-1) mod dp. CO_ENOENT when this rank holds no copy of it. The parameters of
 * the shard are copied into params[n] (the own shard's lives inside the full buffer). */
int dopt_shard_view_get(const dopt_state *s, int shard, dopt_shard_view *out, float *params);

/* A restart's handover: installs shard v->shard's state (as dopt_shard_view_get returned
 * it on the rank holding the other copy, sent over; params[v->n]) as this rank's own shard
 * (v->shard == rank: the parameter buffer's shard, both moments, the step) or as its copy
 * (v->shard == rank-1 with redundancy). CO_ENOENT for any other shard, CO_EINVAL on a size
 * that is not this layout's. The rest of the parameter buffer comes from an all-gather or
 * any replica (every rank holds all parameters). */
int dopt_shard_restore(dopt_state *s, const dopt_shard_view *v, const float *params);

#endif
