/* trainer_pgather.c - --overlap-param-gather (Megatron's, with --use-distributed-optimizer):
 * the updated parameters are all-gathered bucket by bucket on a communication thread from
 * the moment the iteration is committed, and the next forward waits for each bucket just
 * before it first reads a weight in it, instead of gathering every bucket in the step.
 *
 * Buckets are the distributed optimizer's (optim/dist_opt.h's layout: the table reversed, so
 * the last bucket holds the embedding and the first layers); they are gathered in the order
 * the forward needs them (the embedding's first, then by their lowest decoder layer, then
 * the final norm, head and MTP), each with the collective dopt_gather runs for it, so the
 * parameters are the same bits as without the overlap. The forward hook (model/gpt.h's
 * gpt_set_forward_hook) waits for the buckets a layer needs and refreshes their bf16 copy;
 * once the first forward is done every bucket has been waited for, the thread is joined and
 * the step's weight checksum taken (trainer__dopt_sync). Anything else that reads the
 * parameters or communicates first (evaluation, the replica check, a save, the end of
 * training) calls trainer__dopt_sync, which waits for all of them.
 *
 * Only one thread uses a ZeroMQ transport at a time. The gather thread uses the gradient
 * group's own transport (tr_groups.grad_ovl, the one the overlapped reduction's thread uses:
 * that thread is joined before the step, and this one before the next iteration's last
 * backward, so the two never overlap), while the forward's own collectives (the tensor
 * group's sums, the pipeline's sends, the ring's shifts) go over the job's. With data
 * parallelism alone and no own transport the forward communicates nothing, so the gathers
 * may use the gradient group itself; with model parallelism and none (a trainer given no
 * second transport) the parameters are gathered at once, as without the flag.
 *
 * With expert parallelism the experts' layout's buckets are gathered too, over the
 * expert-data-parallel group's own transport (tr_groups.edp_ovl). On a queued backend (cuda)
 * only a device communicator (the gradient group's own NCCL one, its own stream) may gather
 * beside the forward: the backend is synced once before the thread starts (the update's
 * kernels wrote the shards), the thread calls nothing of the backend and the host never
 * touches the buffers; a bucket's collective has returned with its result in the buffer
 * before the hook lets the forward queue the layer that reads it.
 *
 * Under a pipeline each chunk's forward waits for its own buckets: the hook after a chunk's
 * layers waits only where the chunk holds the final norm, head or MTP (trainer__pgather_chunk),
 * so an interleaved stage's later chunks' buckets go on arriving while its first runs; the
 * thread is joined before the last micro batch's backward (every chunk's forward has run).
 *
 * An abort of the communicator (a dead or hung peer) ends the thread's collective; every
 * wait has the trainer's timeout; an error becomes the backend's sticky status, so the
 * forward's caller sees it, and a restart cancels what is in flight (trainer__pgather_cancel)
 * and gathers again after the shard handover. */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tr_pgather {
    trainer *t;
    int nb;
    size_t *lo, *hi; /* bucket b: [lo, hi) of the parameter buffer */
    int *need;       /* the forward position that first reads bucket b (-1: the embedding) */
    int *order;      /* the buckets in the order they are gathered (by need) */
    bool *synced;    /* bucket b waited for and its bf16 copy refreshed (the training thread's) */
    /* the communication thread (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool running; /* started and not joined */
    bool *done;   /* bucket b gathered */
    int rc;
    char err[512];
    cm_comm *g, *eg; /* the dense buckets' group, the experts' (expert parallelism; else NULL) */
    int waited; /* buckets still in flight when the forward needed them (since the last log) */
    int status; /* the backend status a failed wait set (cleared by the cancel), 0: none */
    int chunk;  /* the pipeline chunk whose forward runs (trainer__pgather_chunk), -1: not known */
};

/* The forward position of a tensor: -1 the embedding, N decoder layer N, else after the
 * decoder layers (final norm, head, MTP). */
static int need_of(const gpt_tensor *x) {
    int l = -1, n = 0;
    if (sscanf(x->name, "layers.%d.%n", &l, &n) == 1 && n > 0) return l;
    if (!strncmp(x->name, "embedding", 9)) return -1;
    return GPT_HOOK_AFTER_LAYERS;
}

static int cmp_need(const void *a, const void *b, void *ctx) {
    const int *need = ctx, x = *(const int *)a, y = *(const int *)b;
    if (need[x] != need[y]) return need[x] < need[y] ? -1 : 1;
    return x > y ? -1 : x < y; /* (the higher bucket first: lower in the table) */
}

/* Insertion sort by need (few buckets; qsort_r is not portable C11). */
static void sort_order(int *order, int n, int *need) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && cmp_need(&order[j - 1], &order[j], need) > 0; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
}

int trainer__pgather_setup(trainer *t) {
    if (!t->cfg.overlap_param_gather || !t->dopt) return 0;
    tr_pgather *p = calloc(1, sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "overlapped parameter all-gather: out of memory");
    p->t = t;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    t->pg = p;
    int nb = p->nb = trainer__dopt_nbuckets(t);
    p->lo = malloc(sizeof *p->lo * (size_t)nb);
    p->hi = malloc(sizeof *p->hi * (size_t)nb);
    p->need = malloc(sizeof *p->need * (size_t)nb);
    p->order = malloc(sizeof *p->order * (size_t)nb);
    p->synced = calloc((size_t)nb, sizeof *p->synced);
    p->done = calloc((size_t)nb, sizeof *p->done);
    if (!p->lo || !p->hi || !p->need || !p->order || !p->synced || !p->done) {
        trainer__pgather_free(t);
        return co_err_set(CO_ENOMEM, "overlapped parameter all-gather: out of memory");
    }
    const gpt_tensor *tab = gpt_tensors(t->model);
    int nt = gpt_num_tensors(t->model);
    for (int b = 0; b < nb; b++) {
        trainer__dopt_bucket(t, b, &p->lo[b], &p->hi[b]);
        p->need[b] = GPT_HOOK_AFTER_LAYERS;
        for (int i = 0; i < nt; i++) {
            const gpt_tensor *x = &tab[i];
            if (x->offset + x->numel <= p->lo[b] || x->offset >= p->hi[b]) continue;
            int n = need_of(x);
            if (n < p->need[b]) p->need[b] = n;
        }
        p->order[b] = b;
    }
    sort_order(p->order, nb, p->need);
    co_log(CO_LOG_INFO, "overlapped parameter all-gather: %d bucket%s, gathered in the order the forward reads them",
           nb, nb > 1 ? "s" : "");
    return 0;
}

static void *comm_main(void *arg) {
    tr_pgather *p = arg;
    for (int k = 0; k < p->nb; k++) {
        int b = p->order[k];
        pthread_mutex_lock(&p->mu);
        bool failed = p->rc != 0;
        pthread_mutex_unlock(&p->mu);
        if (failed) break;
        int rc = trainer__dopt_gather_bucket(p->t, trainer__dopt_bucket_expert(p->t, b) ? p->eg : p->g, b);
        pthread_mutex_lock(&p->mu);
        if (rc) {
            p->rc = rc;
            snprintf(p->err, sizeof p->err, "overlapped parameter all-gather, bucket %d of %d: %s", b, p->nb,
                     co_err_detail());
            co_log(CO_LOG_WARN, "%s; %d bucket%s not gathered", p->err, p->nb - k, p->nb - k > 1 ? "s" : "");
        } else {
            p->done[b] = true;
        }
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

bool trainer__pgather_pending(const trainer *t) { return t->pg && t->pg->running; }

/* Waits until bucket b is gathered (or the thread failed), at most the trainer's timeout. */
static int wait_bucket(tr_pgather *p, int b) {
    struct timespec end;
    clock_gettime(CLOCK_REALTIME, &end);
    end.tv_sec += TRAIN_COMM_TIMEOUT_MS / 1000;
    pthread_mutex_lock(&p->mu);
    bool late = !p->done[b];
    int rc = 0;
    while (!p->done[b] && !p->rc && !rc)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &end) == ETIMEDOUT && !p->done[b] && !p->rc)
            rc = co_err_set(CO_ETIMEOUT, "overlapped parameter all-gather: bucket %d of %d not gathered within %d s",
                            b, p->nb, TRAIN_COMM_TIMEOUT_MS / 1000);
    if (!rc && p->rc) rc = co_err_set(p->rc, "%s", p->err);
    pthread_mutex_unlock(&p->mu);
    if (!rc && late) p->waited++;
    return rc;
}

/* Waits for every bucket the forward reads up to position `upto`, refreshing their bf16 copy. */
static int wait_upto(tr_pgather *p, int upto) {
    for (int k = 0; k < p->nb; k++) {
        int b = p->order[k];
        if (p->need[b] > upto) break;
        if (p->synced[b]) continue;
        int rc = wait_bucket(p, b);
        if (rc) return rc;
        gpt_sync_bf16_range(p->t->model, p->lo[b], p->hi[b] - p->lo[b]);
        p->synced[b] = true;
    }
    return 0;
}

/* (the model's forward hook) */
static void on_layer(void *ctx, int layer) {
    trainer *t = ctx;
    if (layer == GPT_HOOK_AFTER_LAYERS && t->pg->chunk >= 0) {
        /* a chunk with neither the final norm, the head nor MTP reads nothing after its layers */
        const gpt_chunk *d = gpt_chunk_def(t->model, t->pg->chunk);
        if (d && !d->head && !d->mtp) return;
    }
    int rc = wait_upto(t->pg, layer);
    /* the forward goes on over stale weights; its caller sees the status and drops it */
    if (rc && !t->be->status) t->be->status = t->pg->status = rc;
}

void trainer__pgather_chunk(trainer *t, int chunk) {
    if (t->pg) t->pg->chunk = chunk;
}

/* Whether the backend queues its work (CUDA: the host reads and writes its buffers only
 * after a sync); whether c is a device communicator (NCCL: its collectives on its own
 * stream, on device memory; a group of one rank never moves anything). */
static bool queued(trainer *t) { return t->be->ops->stream && t->be->ops->stream(t->be); }
static bool device_comm(const cm_comm *c) { return c->size < 2 || c->ops->allgather_q; }

/* The groups the thread gathers over this time (false: none, gather at once): the gradient
 * group's own transport where it matches, or the group itself where the forward communicates
 * nothing or it has one rank (which never touches its transport); with expert parallelism
 * the experts' buckets likewise over the expert-data-parallel group's. */
static bool thread_groups(trainer *t, cm_comm **g, cm_comm **eg) {
    cm_comm *gg = trainer__dopt_group(t); /* (and this generation's path: all-reduce or all-gather) */
    *g = trainer__grad_own(t);
    if (!*g && (gg->size < 2 || !trainer__forward_communicates(t))) *g = gg;
    *eg = NULL;
    bool experts = t->epn > 1 && t->g.edp;
    if (experts) *eg = trainer__edp_own(t) ? trainer__edp_own(t) : t->g.edp->size < 2 ? t->g.edp : NULL;
    const char *why = !*g ? "no transport of the gradient group's own"
                      : experts && !*eg ? "no transport of the expert-data-parallel group's own"
                                        : NULL;
    /* on a queued backend (cuda) the thread must not touch the buffers from the host: only a
     * device communicator (NCCL, its own stream) gathers there beside the forward */
    if (!why && queued(t) && (!device_comm(*g) || (*eg && !device_comm(*eg))))
        why = "no device communicator of the gradient group's own";
    if (!why) return true;
    static bool said;
    if (!said) co_log(CO_LOG_WARN, "--overlap-param-gather: %s; the parameters are gathered after each step", why);
    said = true;
    return false;
}

int trainer__pgather_start(trainer *t) {
    tr_pgather *p = t->pg;
    trainer__pgather_cancel(t);
    int rc = trainer__dopt_buckets_match(t, p->nb, p->lo, p->hi, "overlapped parameter all-gather");
    if (rc) return rc;
    if (!thread_groups(t, &p->g, &p->eg)) return trainer__dopt_sync(t);
    /* the update's kernels (a queued backend) have written the shards before the thread's
     * collectives read them; the thread calls nothing of the backend */
    t->be->ops->sync(t->be);
    p->chunk = -1;
    memset(p->done, 0, sizeof *p->done * (size_t)p->nb);
    memset(p->synced, 0, sizeof *p->synced * (size_t)p->nb);
    p->rc = 0;
    p->err[0] = '\0';
    if (pthread_create(&p->th, NULL, comm_main, p))
        return co_err_set(CO_ENOMEM, "overlapped parameter all-gather: cannot start a thread");
    p->running = true;
    gpt_set_forward_hook(t->model, on_layer, t);
    return 0;
}

int trainer__pgather_finish(trainer *t) {
    tr_pgather *p = t->pg;
    if (!p->running) return 0;
    int rc = wait_upto(p, GPT_HOOK_AFTER_LAYERS);
    trainer__pgather_cancel(t);
    if (!rc && p->waited) {
        co_log(CO_LOG_DEBUG, "overlapped parameter all-gather: the forward waited for %d of %d buckets", p->waited,
               p->nb);
    }
    p->waited = 0;
    return rc;
}

void trainer__pgather_cancel(trainer *t) {
    tr_pgather *p = t ? t->pg : NULL;
    if (!p) return;
    if (t->model) gpt_set_forward_hook(t->model, NULL, NULL);
    /* (the error is the caller's now: the next generation starts without it) */
    if (p->status && t->be && t->be->status == p->status) kb_backend_clear_status(t->be);
    p->status = 0;
    if (!p->running) return;
    /* (a thread in a collective ends with it: its timeout, or the communicator's abort) */
    pthread_mutex_lock(&p->mu);
    if (!p->rc) {
        p->rc = CO_EABORTED;
        snprintf(p->err, sizeof p->err, "overlapped parameter all-gather: cancelled");
    }
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    p->running = false;
}

void trainer__pgather_free(trainer *t) {
    tr_pgather *p = t->pg;
    if (!p) return;
    trainer__pgather_cancel(t);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->lo);
    free(p->hi);
    free(p->need);
    free(p->order);
    free(p->synced);
    free(p->done);
    free(p);
    t->pg = NULL;
}
