/* trainer_overlap.c - --overlap-grad-reduce (Megatron's): the gradient buckets are reduced
 * (all-reduced, or reduce-scattered with the distributed optimizer) on a communication
 * thread as soon as their gradients are final during the backward of the last micro batch,
 * and the step waits only for what is still in flight.
 *
 * Buckets: the distributed optimizer's (optim/dist_opt.h's layout); without it, runs of the
 * model's flat buffer cut the same way (tensors in reverse table order, a bucket closed once
 * it holds --ddp-bucket-size elements), covering the whole buffer. A bucket is final after the
 * backward of the lowest decoder layer it holds (gpt_set_backward_hook) in its chunk's last
 * micro batch; buckets holding anything else (embeddings, the final norm, the head, MTP,
 * gradients the tensor group sums afterwards, a chunk boundary) start at the flush, after
 * those sums. Every rank of the group starts the same buckets in the same order (its layers'
 * backwards come in the same order), and each bucket's collective is the one the step runs
 * without overlap, over the same elements, so the result is the same bits (on one host:
 * element-wise sums in rank order; the average and the norm follow after all of them).
 *
 * The validator wants each rank's gradient norm before the reduction: each bucket's sum of
 * squares is taken just before it starts (over the norm runs, as gpt_tp_grad_sumsq counts).
 * With a fault injected into gradients, losses or activations configured, no bucket starts
 * before the flush (an injected gradient must reach the reduction); process faults (a kill in
 * the backward meets the others' buckets in flight) and parameter bits leave them early. An
 * abort of the communicator ends the thread's collective (every one has the trainer's
 * timeout); a thread left behind by an error is joined before the next round and before the
 * groups change.
 *
 * Transports: a ZeroMQ transport is used by one thread at a time, and under tensor, pipeline,
 * context or expert parallelism the backward itself communicates (the tensor group's sums,
 * the pipeline's sends and receives, the ring's shifts, the experts' token exchange, the
 * replica's norm at the flush). The thread then reduces over the gradient group's own
 * transport (tr_groups.grad_ovl, opened by the worker: worker/comms.h wk_comms_open_grad, or
 * with NCCL wk_comms_open_grad_nccl), the same ranks in the same order choosing the same
 * algorithm (shared memory on one host), so the same bits; with expert parallelism the
 * experts' buckets over the expert-data-parallel group's (tr_groups.edp_ovl,
 * wk_comms_open_expert_grad). With data parallelism alone the training thread communicates
 * nothing while the thread runs, which may then use the gradient group itself. Without
 * either (a trainer given no second transport) the buckets are reduced on the training
 * thread at the flush (no overlap, the same bits). */
#include "train/trainer_internal.h"

#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/log.h"
#include "optim/dist_opt.h"
#include "resilience/inject.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tr_overlap {
    trainer *t;
    int nb;
    size_t *lo, *hi; /* bucket b: [lo, hi) of the gradient buffer */
    bool *expert;    /* bucket b holds experts' gradients (expert parallelism: the expert-data-parallel group's) */
    int *ready;      /* the layer whose last backward makes bucket b final; -1: at the flush */
    bool *posted;
    size_t *runs;    /* the norm runs (trainer__norm_runs) */
    int nruns;
    double *sq;      /* [nb] each bucket's sum of squares as it started (the validator's) */
    bool last, early; /* the running backward is its chunk's last micro batch's; buckets may start in it */
    /* the communication thread and its queue (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool running, closed;
    int *queue, qn, qhead;
    int rc;
    char err[512];
    cm_comm *g, *eg; /* the groups of this round: the dense buckets', the experts' (NULL: no experts) */
    bool inline_; /* this round reduces each bucket on the training thread (no transport of its own) */
};

/* The layer of a decoder layer's tensor ("layers.N."), -1 for anything else. */
static int layer_of(const gpt_tensor *x) {
    int l = -1, n = 0;
    if (sscanf(x->name, "layers.%d.%n", &l, &n) != 1 || n == 0) return -1;
    return l;
}

/* Whether tensor x's gradient is final when its layer's backward returns (not summed over
 * the tensor group afterwards: sequence-parallel parts, shared key/value rows). */
static bool final_at_layer(const gpt_tensor *x) {
    if (x->partial_grad || x->emb_copy) return false;
    for (int q = 0; q < x->npieces; q++)
        if (x->split != GPT_TP_REPLICATED && x->piece[q].share > 1) return false;
    return true;
}

static int chunk_of_layer(const trainer *t, int l) {
    const gpt_config *m = &t->mcfg;
    for (int c = 0; c < m->nchunks; c++)
        if (l >= m->chunks[c].layer0 && l < m->chunks[c].layer0 + m->chunks[c].nlayers) return c;
    return 0;
}

/* Without the distributed optimizer: runs of the model's buffer, tensors from the highest
 * offset down, a bucket closed once it holds bucket_size elements. */
static int native_buckets(tr_overlap *o, const gpt_tensor *tab, int nt, size_t total, size_t bucket_size) {
    int *order = malloc(sizeof *order * (size_t)(nt ? nt : 1));
    o->lo = malloc(sizeof *o->lo * (size_t)(nt + 1));
    o->hi = malloc(sizeof *o->hi * (size_t)(nt + 1));
    if (!order || !o->lo || !o->hi) {
        free(order);
        return co_err_set(CO_ENOMEM, "overlap: out of memory");
    }
    for (int i = 0; i < nt; i++) order[i] = i;
    for (int i = 1; i < nt; i++)
        for (int j = i; j > 0 && tab[order[j - 1]].offset < tab[order[j]].offset; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    size_t hi = total, held = 0;
    int nb = 0;
    for (int k = 0; k < nt; k++) {
        const gpt_tensor *x = &tab[order[k]];
        held += x->numel;
        if (held >= bucket_size && x->offset > 0 && !x->packed) {
            o->lo[nb] = x->offset;
            o->hi[nb++] = hi;
            hi = x->offset;
            held = 0;
        }
    }
    if (hi > 0 || nb == 0) {
        o->lo[nb] = 0;
        o->hi[nb++] = hi;
    }
    o->nb = nb;
    free(order);
    return 0;
}

/* With expert parallelism without the distributed optimizer: each bucket cut where the
 * gradients change kind (the experts' are summed over the expert-data-parallel group, the
 * rest over the gradient group: trainer__ep_reduce_grads's runs), the pieces in the buckets'
 * order, each from its highest offset down. */
static int split_by_kind(tr_overlap *o, const trainer *t) {
    int cap = o->nb + trainer__ep_nruns(t) + 1, nb = 0;
    size_t *lo = malloc(sizeof *lo * (size_t)cap), *hi = malloc(sizeof *hi * (size_t)cap);
    o->expert = calloc((size_t)cap, sizeof *o->expert);
    if (!lo || !hi || !o->expert) {
        free(lo);
        free(hi);
        return co_err_set(CO_ENOMEM, "overlap: out of memory");
    }
    for (int b = 0; b < o->nb; b++)
        for (size_t at = o->hi[b]; at > o->lo[b] && nb < cap;) {
            size_t start;
            bool ex = trainer__ep_run_at(t, at - 1, &start);
            lo[nb] = start > o->lo[b] ? start : o->lo[b];
            hi[nb] = at;
            o->expert[nb++] = ex;
            at = lo[nb - 1];
        }
    free(o->lo);
    free(o->hi);
    o->lo = lo;
    o->hi = hi;
    o->nb = nb;
    return 0;
}

/* Each bucket's ready layer: the lowest layer it holds, -1 where it holds anything not final
 * at its layer's backward or layers of two chunks. */
static void ready_layers(tr_overlap *o, const trainer *t, const gpt_tensor *tab, int nt) {
    for (int b = 0; b < o->nb; b++) {
        int low = -1, chunk = -1;
        bool ok = true;
        for (int i = 0; i < nt && ok; i++) {
            const gpt_tensor *x = &tab[i];
            if (x->offset + x->numel <= o->lo[b] || x->offset >= o->hi[b]) continue;
            int l = layer_of(x);
            if (l < 0 || !final_at_layer(x) || (chunk >= 0 && chunk_of_layer(t, l) != chunk)) ok = false;
            chunk = l >= 0 ? chunk_of_layer(t, l) : chunk;
            if (low < 0 || l < low) low = l;
        }
        o->ready[b] = ok ? low : -1;
    }
}

int trainer__overlap_setup(trainer *t) {
    const co_config *c = &t->cfg;
    if (!c->overlap_grad_reduce) return 0;
    tr_overlap *o = calloc(1, sizeof *o);
    if (!o) return co_err_set(CO_ENOMEM, "overlap: out of memory");
    o->t = t;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    t->ovl = o;
    gpt_model *m = t->model;
    int nt = gpt_num_tensors(m), rc = 0;
    const gpt_tensor *tab = gpt_tensors(m);
    if (t->dopt) {
        o->nb = trainer__dopt_nbuckets(t);
        o->lo = malloc(sizeof *o->lo * (size_t)o->nb);
        o->hi = malloc(sizeof *o->hi * (size_t)o->nb);
        if (!o->lo || !o->hi) rc = co_err_set(CO_ENOMEM, "overlap: out of memory");
        o->expert = calloc((size_t)o->nb, sizeof *o->expert);
        if (!o->expert) rc = co_err_set(CO_ENOMEM, "overlap: out of memory");
        for (int b = 0; b < o->nb && !rc; b++) {
            trainer__dopt_bucket(t, b, &o->lo[b], &o->hi[b]);
            o->expert[b] = trainer__dopt_bucket_expert(t, b);
        }
    } else {
        cm_comm *g = tr_groups_grad(&t->g);
        size_t bs = c->ddp_bucket_size > 0 ? (size_t)c->ddp_bucket_size : dopt_default_bucket_size(g ? g->size : 1);
        rc = native_buckets(o, tab, nt, gpt_num_params(m), bs);
        if (!rc && t->epn > 1) rc = split_by_kind(o, t);
        else if (!rc && !(o->expert = calloc((size_t)o->nb, sizeof *o->expert)))
            rc = co_err_set(CO_ENOMEM, "overlap: out of memory");
    }
    if (!rc) {
        o->ready = malloc(sizeof *o->ready * (size_t)o->nb);
        o->posted = calloc((size_t)o->nb, sizeof *o->posted);
        o->queue = malloc(sizeof *o->queue * (size_t)o->nb);
        o->sq = calloc((size_t)o->nb, sizeof *o->sq);
        if (!o->ready || !o->posted || !o->queue || !o->sq) rc = co_err_set(CO_ENOMEM, "overlap: out of memory");
    }
    if (!rc) rc = trainer__norm_runs(t, &o->runs, &o->nruns);
    if (rc) {
        trainer__overlap_free(t);
        return rc;
    }
    ready_layers(o, t, tab, nt);
    int early = 0;
    for (int b = 0; b < o->nb; b++) early += o->ready[b] >= 0;
    gpt_set_backward_hook(m, NULL, NULL);
    co_log(CO_LOG_INFO, "overlapped gradient reduction: %d bucket%s, %d started during the backward", o->nb,
           o->nb > 1 ? "s" : "", early);
    return 0;
}

/* ---- the communication thread ---- */

static int reduce_bucket(tr_overlap *o, int b) {
    trainer *t = o->t;
    cm_comm *g = o->expert[b] ? o->eg : o->g;
    if (t->dopt) return trainer__dopt_reduce_bucket(t, g, b);
    if (g->size < 2) return 0; /* (one rank's sum is its own) */
    return g->ops->allreduce_sum(g, gpt_grads(t->model) + o->lo[b], o->hi[b] - o->lo[b], CM_F32,
                                 TRAIN_COMM_TIMEOUT_MS);
}

static void *comm_main(void *arg) {
    tr_overlap *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (o->qhead == o->qn && !o->closed) {
            /* (an idle wait for the next bucket, re-checked every second) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&o->cv, &o->mu, &ts);
        }
        if (o->qhead == o->qn) break;
        int b = o->queue[o->qhead++];
        bool failed = o->rc != 0;
        pthread_mutex_unlock(&o->mu);
        int rc = failed ? 0 : reduce_bucket(o, b);
        pthread_mutex_lock(&o->mu);
        if (rc && !o->rc) {
            o->rc = rc;
            snprintf(o->err, sizeof o->err, "overlapped gradient reduction, bucket %d of %d: %s", b, o->nb,
                     co_err_detail());
        }
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* The sum of squares of bucket b where this rank counts it (an expert bucket whole: every
 * rank counts its experts, gpt_tp_grad_sumsq_split's second group). */
static double counted_sq(const tr_overlap *o, int b) {
    kb_backend *be = o->t->be;
    const float *g = gpt_grads(o->t->model);
    size_t lo = o->lo[b], hi = o->hi[b];
    if (o->expert[b]) return be->ops->sumsq(be, g + lo, hi - lo);
    double sq = 0;
    for (int i = 0; i < o->nruns; i++) {
        size_t a = o->runs[2 * i], e = o->runs[2 * i + 1];
        a = a > lo ? a : lo;
        e = e < hi ? e : hi;
        if (a < e) sq += be->ops->sumsq(be, g + a, e - a);
    }
    return sq;
}

static int post(tr_overlap *o, int b) {
    o->posted[b] = true;
    /* a queued backend (CUDA): the bucket's gradients are final once the backward's kernels
     * so far have run; the thread's collective reads them beside the next ones (with a
     * validator the bucket's sumsq below waits as well) */
    o->t->be->ops->sync(o->t->be);
    if (o->t->have_val) o->sq[b] = counted_sq(o, b);
    if (o->inline_) {
        int rc = o->rc ? 0 : reduce_bucket(o, b);
        if (rc && !o->rc) {
            o->rc = rc;
            snprintf(o->err, sizeof o->err, "gradient reduction, bucket %d of %d: %s", b, o->nb, co_err_detail());
        }
        return 0;
    }
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    if (!o->running) {
        o->closed = false;
        o->qn = o->qhead = 0;
        o->rc = 0;
        if (pthread_create(&o->th, NULL, comm_main, o)) rc = co_err_set(CO_ENOMEM, "overlap: cannot start a thread");
        else o->running = true;
    }
    if (!rc) {
        o->queue[o->qn++] = b;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* (the model's backward hook) */
static void on_layer(void *ctx, int layer) {
    trainer *t = ctx;
    tr_overlap *o = t->ovl;
    if (!o->last || !o->early || !o->g) return;
    for (int b = 0; b < o->nb; b++)
        if (!o->posted[b] && o->ready[b] == layer && post(o, b)) {
            /* (could not start the thread: the flush reduces it) */
            o->posted[b] = false;
            o->early = false;
        }
}

void trainer__overlap_drain(trainer *t) {
    tr_overlap *o = t ? t->ovl : NULL;
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    bool running = o->running;
    o->closed = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (running) pthread_join(o->th, NULL);
    o->running = false;
}

cm_comm *trainer__grad_own(const trainer *t) {
    cm_comm *gg = tr_groups_grad(&t->g), *own = t->g.grad_ovl;
    if (own && gg && own->size == gg->size && own->rank == gg->rank &&
        cm_zmq_shared_memory(own) == cm_zmq_shared_memory(gg))
        return own;
    return NULL;
}

cm_comm *trainer__edp_own(const trainer *t) {
    cm_comm *eg = t->g.edp, *own = t->g.edp_ovl;
    if (own && eg && own->size == eg->size && own->rank == eg->rank &&
        cm_zmq_shared_memory(own) == cm_zmq_shared_memory(eg))
        return own;
    return NULL;
}

bool trainer__forward_communicates(const trainer *t) { return t->g.tp || t->g.pp || t->g.cp || t->g.ep; }

/* The group the communication thread reduces over this round: the gradient group's own
 * transport where the worker opened one; the gradient group itself where the training thread
 * communicates nothing meanwhile (data parallelism alone, or a group of one rank, which never
 * touches its transport); NULL: neither (reduce on the training thread). With the distributed
 * optimizer the own transport must take the path the step's group takes (shared memory or
 * sockets: dist_opt.h), or the sums could differ in their last bits. */
static cm_comm *thread_group(tr_overlap *o) {
    trainer *t = o->t;
    cm_comm *gg = tr_groups_grad(&t->g), *own = trainer__grad_own(t);
    if (own) return own;
    if (gg->size < 2 || !trainer__forward_communicates(t)) return gg;
    static bool said;
    if (!said)
        co_log(CO_LOG_WARN, "--overlap-grad-reduce: no transport of the gradient group's own%s; its buckets are "
                            "reduced after the backward", t->g.grad_ovl ? " that matches it" : "");
    said = true;
    return NULL;
}

/* The experts' group for the communication thread (expert parallelism): the expert-data-
 * parallel group's own transport, or the group itself where it has one rank (which never
 * touches its transport); NULL: neither (reduce on the training thread). */
static cm_comm *thread_egroup(tr_overlap *o) {
    trainer *t = o->t;
    cm_comm *own = trainer__edp_own(t);
    if (own || t->g.edp->size < 2) return own ? own : t->g.edp;
    static bool said;
    if (!said)
        co_log(CO_LOG_WARN, "--overlap-grad-reduce: no transport of the expert-data-parallel group's own%s; its "
                            "buckets are reduced after the backward", t->g.edp_ovl ? " that matches it" : "");
    said = true;
    return NULL;
}

void trainer__overlap_arm(trainer *t) {
    tr_overlap *o = t->ovl;
    if (!o) return;
    trainer__overlap_drain(t);
    memset(o->posted, 0, sizeof *o->posted * (size_t)o->nb);
    o->last = false;
    o->rc = 0;
    /* (a check round of the validator computes without the reduction) */
    o->g = t->ovl_reduce ? tr_groups_grad(&t->g) : NULL;
    if (t->dopt && o->g) o->g = trainer__dopt_group(t); /* (and the path of this generation) */
    o->eg = o->g && t->epn > 1 ? t->g.edp : NULL;
    o->inline_ = false;
    cm_comm *tg = o->g ? thread_group(o) : NULL, *te = o->eg ? thread_egroup(o) : NULL;
    if (o->g && (!tg || (o->eg && !te))) {
        o->inline_ = true;
        return; /* (no hook: every bucket at the flush, on this thread) */
    }
    if (o->g) o->g = tg;
    if (o->eg) o->eg = te;
    gpt_set_backward_hook(t->model, o->g ? on_layer : NULL, t);
}

/* Whether the injector holds a fault that writes into the gradients after a backward (a
 * process's kill, stop, hang or delay, a parameter's bit and a control message do not: the
 * buckets may start early under them, so that a kill meets buckets in flight). */
static bool inj_writes_grads(const trainer *t) {
    const fi_schedule *s = t->inj;
    for (int i = 0; s && i < s->n; i++)
        switch (s->f[i].kind) {
        case FI_KILL: case FI_STOP: case FI_HANG: case FI_SLOW: case FI_BITFLIP_PARAM:
        case FI_MSG_DELAY: case FI_MSG_DROP: case FI_MSG_DUP: case FI_KILL_SUPERVISOR: break;
        default: return true;
        }
    return false;
}

void trainer__overlap_last(trainer *t, bool last, bool early) {
    if (!t->ovl) return;
    t->ovl->last = last;
    t->ovl->early = early && !inj_writes_grads(t);
}

int trainer__overlap_flush(trainer *t, double *local_norm) {
    tr_overlap *o = t->ovl;
    o->last = false;
    /* (the buckets are the layout's, re-partitioned or not: --elastic lays them out anew) */
    int rc = t->dopt ? trainer__dopt_buckets_match(t, o->nb, o->lo, o->hi, "overlapped gradient reduction") : 0;
    for (int b = 0; b < o->nb && !rc && o->g; b++)
        if (!o->posted[b]) rc = post(o, b);
    if (!rc && o->inline_ && o->rc) rc = co_err_set(o->rc, "%s", o->err);
    *local_norm = 0;
    if (rc || !t->have_val) return rc;
    /* the buckets' sums in bucket order, whenever each started (the same bits in any round);
     * the experts' apart, over the expert group x pipeline (as trainer__ep_grad_norm) */
    double sq = 0, xsq = 0;
    for (int b = 0; b < o->nb; b++) {
        double v = o->g ? o->sq[b] : counted_sq(o, b);
        if (o->expert[b]) xsq += v;
        else sq += v;
    }
    cm_comm *rg = tr_groups_replica(&t->g);
    if (rg && (rc = rg->ops->allreduce_sum(rg, &sq, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS))) return rc;
    if (t->epn > 1 && (rc = t->g.erep->ops->allreduce_sum(t->g.erep, &xsq, 1, CM_F64, TRAIN_COMM_TIMEOUT_MS)))
        return rc;
    *local_norm = sqrt(sq + xsq);
    return kb_backend_status(t->be);
}

int trainer__overlap_wait(trainer *t) {
    tr_overlap *o = t->ovl;
    trainer__overlap_drain(t);
    int rc = o->rc;
    o->rc = 0;
    gpt_set_backward_hook(t->model, NULL, NULL);
    if (rc) {
        co_log(CO_LOG_INFO, "%s", o->err); /* (which bucket an abort or a dead peer met) */
        return co_err_set(rc, "%s", o->err);
    }
    for (int b = 0; b < o->nb && o->g; b++)
        if (!o->posted[b]) return co_err_set(CO_EINTERNAL, "overlap: bucket %d of %d was never reduced", b, o->nb);
    return 0;
}

void trainer__overlap_free(trainer *t) {
    tr_overlap *o = t->ovl;
    if (!o) return;
    trainer__overlap_drain(t);
    if (t->model) gpt_set_backward_hook(t->model, NULL, NULL);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->lo);
    free(o->hi);
    free(o->expert);
    free(o->ready);
    free(o->posted);
    free(o->queue);
    free(o->runs);
    free(o->sq);
    free(o);
    t->ovl = NULL;
}
