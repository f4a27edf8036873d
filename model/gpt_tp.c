/* gpt_tp.c - the model's tensor group (gpt.h, "Tensor parallelism"): the collectives over
 * it where Megatron's mappings put them, their time and analytic volume, the column- and
 * row-parallel layers' products around them, the input-gradient sum overlapped with the
 * weight gradient, the gradient norm over the group and the partial gradients summed after
 * the last micro batch. A collective that fails records its error in the backend's sticky
 * status; once it is set the rest of the pass communicates no more. With bf16 activations
 * (gpt_internal.h act16) the layers' inputs that are activation buffers hold bf16 elements:
 * the *_act forms take them so, and gpt__tp_allgather_act gathers their 2-byte elements
 * (sums stay fp32: outputs and gradients are).
 *
 * On CUDA with an NCCL tensor group the collectives are queued on the backend's stream
 * (comm.h's stream-ordered operations), between the kernels that write their input and
 * those that read their output, as Megatron's run on PyTorch's current stream: no sync
 * before them and no wait after (tp_stream). Where the group has no such operations
 * (ZeroMQ over managed memory) the stream is synced before each and the call waits. */
#include "model/gpt_internal.h"

#include "comm/comm.h"
#include "common/error.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void gpt__moe_token_group(gpt_model *m, struct cm_comm *grp, int shards, int timeout_ms) {
    for (int k = 0; k < m->nmoes; k++) {
        int rc = moe_set_token_group(m->moes[k], grp, shards, timeout_ms);
        if (rc && !m->be->status) m->be->status = rc;
    }
}

void gpt_set_tensor_group(gpt_model *m, struct cm_comm *tp, int timeout_ms) {
    m->tpc = tp;
    m->tp_timeout = timeout_ms;
    const cm_ops *q = tp ? tp->ops : NULL;
    bool ordered = q && q->allreduce_sum_q && q->allgather_q && q->reduce_scatter_sum_q && q->queued_error;
    m->tp_stream = ordered && !m->host_batch && m->ops->stream ? m->ops->stream(m->be) : NULL;
    /* the MoE layers route and compute this rank's token shard (moe_set_sequence_group) */
    if (m->sp) gpt__moe_token_group(m, tp, tp ? tp->size : 1, timeout_ms);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void gpt_tp_stats_take(gpt_model *m, gpt_tp_stats *out) {
    *out = m->stats;
    memset(&m->stats, 0, sizeof m->stats);
}

/* one collective's time and its bandwidth-optimal volume per rank (ring algorithms):
 * all-reduce 2 (p-1)/p n, all-gather and reduce-scatter (p-1) x the shard */
static void tp_count(gpt_model *m, double t0, double bytes) {
    m->stats.comm_s += mono_s() - t0;
    m->stats.analytic_bytes += (uint64_t)bytes;
    m->stats.calls++;
}

/* Whether a collective may run: the group is set and nothing failed. Where the backend
 * queues its operations (CUDA), the ones queued so far must have written the buffers the
 * collective reads: the caller syncs first (queued = true; async_start does it on the
 * training thread before its helper thread communicates). */
static bool tp_ok(gpt_model *m, const char *what, bool queued) {
    if (m->be->status) return false;
    if (!m->tpc || m->tpc->size != m->tp || m->tpc->rank != m->tpr) {
        m->be->status = co_err_set(CO_EINVAL, "%s: the tensor group is not set (gpt_set_tensor_group)", what);
        return false;
    }
    if (m->tp_stream) { /* stream-ordered: an earlier queued collective's failure stops the pass */
        int rc = m->tpc->ops->queued_error(m->tpc);
        if (rc) m->be->status = rc;
        return !rc;
    }
    if (queued && !m->host_batch) {
        m->ops->sync(m->be);
        if (m->be->status) return false;
    }
    return true;
}

/* x[n] summed over the group (reduce_from_tensor_region) */
static void tp_allreduce_q(gpt_model *m, float *x, size_t n, bool queued) {
    if (!tp_ok(m, "tensor-parallel all-reduce", queued)) return;
    double t0 = mono_s();
    int rc = m->tp_stream ? m->tpc->ops->allreduce_sum_q(m->tpc, x, n, CM_F32, m->tp_stream)
                          : m->tpc->ops->allreduce_sum(m->tpc, x, n, CM_F32, m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, 2.0 * (m->tp - 1) / m->tp * (double)n * sizeof(float));
}
void gpt__tp_allreduce(gpt_model *m, float *x, size_t n) { tp_allreduce_q(m, x, n, true); }

/* full[N,C] (every rank's) summed, this rank's rows [r N/tp, (r+1) N/tp) into shard */
static void tp_reduce_scatter_q(gpt_model *m, float *shard, const float *full, size_t shard_n, bool queued) {
    if (!tp_ok(m, "tensor-parallel reduce-scatter", queued)) return;
    double t0 = mono_s();
    int rc = m->tp_stream ? m->tpc->ops->reduce_scatter_sum_q(m->tpc, full, shard, shard_n, CM_F32, m->tp_stream)
                          : m->tpc->ops->reduce_scatter_sum(m->tpc, full, shard, shard_n, CM_F32, m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, (double)(m->tp - 1) * (double)shard_n * sizeof(float));
}
void gpt__tp_reduce_scatter(gpt_model *m, float *shard, const float *full, size_t shard_n) {
    tp_reduce_scatter_q(m, shard, full, shard_n, true);
}

/* full = every rank's shard of shard_n elements of `size` bytes, in rank order: a byte
 * all-gather (queued on the stream with an NCCL group: no host staging) */
static void tp_allgather_bytes(gpt_model *m, void *full, const void *shard, size_t shard_n, size_t size) {
    if (!tp_ok(m, "tensor-parallel all-gather", true)) return;
    double t0 = mono_s();
    size_t bytes = shard_n * size;
    int rc = m->tp_stream ? m->tpc->ops->allgather_q(m->tpc, shard, full, bytes, m->tp_stream)
                          : m->tpc->ops->allgather(m->tpc, shard, full, bytes, m->tp_timeout);
    if (rc) m->be->status = rc;
    tp_count(m, t0, (double)(m->tp - 1) * (double)bytes);
}

/* full = every rank's shard, in rank order */
void gpt__tp_allgather(gpt_model *m, float *full, const float *shard, size_t shard_n) {
    tp_allgather_bytes(m, full, shard, shard_n, sizeof(float));
}

/* the same of an activation buffer: its kb_bf16 elements (2 bytes each) when a16 */
void gpt__tp_allgather_act(gpt_model *m, float *full, const float *shard, size_t shard_n, bool a16) {
    tp_allgather_bytes(m, full, shard, shard_n, a16 ? sizeof(kb_bf16) : sizeof(float));
}

void gpt_tp_set_overlap(gpt_model *m, bool on) { m->overlap = on; }

void gpt_set_device_pipeline(gpt_model *m, bool on) { m->dev_pp = on && !m->host_batch; }

double gpt_tp_grad_sumsq(gpt_model *m) { return gpt_tp_grad_sumsq_split(m, NULL); }

/* The runs gpt_tp_grad_sumsq_split counts, in its order: each tensor's gradient whole, or
 * under tensor parallelism a row-split or replicated tensor's runs of rows counted by the
 * first of the ranks that hold them; group 1 (the experts, when asked apart) or 0. Calls
 * add(x, n, group, arg) for each. */
static void grad_runs(gpt_model *m, bool apart, void (*add)(const float *, size_t, int, void *), void *arg) {
    for (int i = 0; i < m->ntensors; i++) {
        const gpt_tensor *t = &m->tensors[i];
        const float *g = m->grads + t->offset;
        if (t->emb_copy) continue; /* the first stage counts the tied embedding */
        if (apart && t->expert) {
            add(g, t->numel, 1, arg);
            continue;
        }
        if (t->split == GPT_TP_COLS || m->tp == 1) {
            add(g, t->numel, 0, arg);
            continue;
        }
        size_t cols = (size_t)(t->shape[1] ? t->shape[1] : 1);
        for (int k = 0; k < t->npieces; k++)
            if (m->tpr % t->piece[k].share == 0)
                add(g + (size_t)t->piece[k].local * cols, (size_t)t->piece[k].len * cols, 0, arg);
    }
}

typedef struct grad_list {
    const float **x;
    size_t *n;
    int count, cap, group; /* the group being collected; count with x == NULL: just counting */
} grad_list;

static void list_add(const float *x, size_t n, int group, void *arg) {
    grad_list *l = arg;
    if (group != l->group) return;
    if (l->x && l->count < l->cap) l->x[l->count] = x, l->n[l->count] = n;
    l->count++;
}

/* The sums in one pass with one wait (kb_ops.sumsq_runs: on CUDA the runs' sums stay on the
 * device), group 0's runs then group 1's, each in the loop's order: the same bits as one
 * sumsq per run summed on the host. */
double gpt_tp_grad_sumsq_split(gpt_model *m, double *experts) {
    grad_list l = {0};
    for (l.group = 0; l.group < 2; l.group++) grad_runs(m, experts != NULL, list_add, &l);
    l.cap = l.count;
    l.x = malloc((size_t)(l.cap ? l.cap : 1) * sizeof *l.x);
    l.n = malloc((size_t)(l.cap ? l.cap : 1) * sizeof *l.n);
    double out[2] = {0, 0};
    if (!l.x || !l.n) {
        free(l.x), free(l.n);
        m->be->status = co_err_set(CO_ENOMEM, "gradient norm: cannot list %d gradient runs", l.cap);
        return NAN;
    }
    l.count = 0;
    l.group = 0;
    grad_runs(m, experts != NULL, list_add, &l);
    int end[2] = {l.count, 0};
    l.group = 1;
    grad_runs(m, experts != NULL, list_add, &l);
    end[1] = l.count;
    m->ops->sumsq_runs(m->be, l.x, l.n, end, 2, out);
    free(l.x), free(l.n);
    if (experts) *experts = out[1];
    return out[0];
}

/* The sum of a column-parallel layer's input gradient over the group, on a helper thread
 * while this one computes the weight gradient (Megatron's async all-reduce of dgrad,
 * reduce-scatter under SP); the communicator is used by that thread alone meanwhile. */
typedef struct tp_async {
    gpt_model *m;
    size_t n; /* elements of this rank's part of the sum: its tokens' rows x C */
    pthread_t th;
    bool running;
} tp_async;

/* (the training thread synced the backend: the input gradient is written) */
static void input_grad_sum(gpt_model *m, size_t n) {
    if (m->sp) tp_reduce_scatter_q(m, m->dh, m->dfull, n, false);
    else tp_allreduce_q(m, m->dh, n, false);
}

static void *async_main(void *p) {
    tp_async *a = p;
    input_grad_sum(a->m, a->n);
    return NULL;
}

/* N tokens' input gradient [N, C] */
static void async_start(tp_async *a, gpt_model *m, int N) {
    a->m = m;
    a->n = (size_t)(m->sp ? N / m->tp : N) * (size_t)m->cfg.hidden;
    if (m->tp_stream) { /* queued on the stream between the input and the weight gradient */
        a->running = false;
        input_grad_sum(m, a->n);
        return;
    }
    if (!m->host_batch) m->ops->sync(m->be); /* the input gradient the helper sums is written */
    a->running = m->overlap && !pthread_create(&a->th, NULL, async_main, a);
    if (!a->running) input_grad_sum(m, a->n);
}

static void async_wait(tp_async *a) {
    if (a->running) pthread_join(a->th, NULL);
    a->running = false;
}

/* A product's backward whose input is an activation buffer: bf16 elements when a16
 * (gpt_internal.h act16; the gradients fp32 either way) */
static void lin_bwd_act(gpt_model *m, bool a16, float *din, float *dW, float *dbias, const float *dout,
                        const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    if (a16)
        m->ops->linear_backward_bf16(m->be, din, dW, dbias, dout, (const kb_bf16 *)(const void *)in, W, W16, N, IC,
                                     OC);
    else m->ops->linear_backward(m->be, din, dW, dbias, dout, in, W, W16, N, IC, OC);
}

/* din (summed over the group into dh) and dW of a column-parallel layer (qkv, fc1, the
 * output layer): the input gradient first, its sum started, the weight gradient meanwhile.
 * At tp 1 the one-rank product into dh. in holds bf16 elements when a16. */
void gpt__column_parallel_backward_act(gpt_model *m, bool a16, float *dW, float *dbias, const float *dout,
                                       const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    if (m->tp == 1) {
        lin_bwd_act(m, a16, m->dh, dW, dbias, dout, in, W, W16, N, IC, OC);
        return;
    }
    float *din = m->sp ? m->dfull : m->dh;
    lin_bwd_act(m, a16, din, NULL, dbias, dout, in, W, W16, N, IC, OC);
    tp_async a;
    async_start(&a, m, N);
    lin_bwd_act(m, a16, NULL, dW, NULL, dout, in, W, W16, N, IC, OC);
    async_wait(&a);
}

void gpt__column_parallel_backward(gpt_model *m, float *dW, float *dbias, const float *dout, const float *in,
                                   const float *W, const kb_bf16 *W16, int N, int IC, int OC) {
    gpt__column_parallel_backward_act(m, false, dW, dbias, dout, in, W, W16, N, IC, OC);
}

int gpt_tp_finalize_grads(gpt_model *m) {
    if (m->tp == 1 || !m->tp_buf_n) return kb_backend_status(m->be);
    const gpt_config *c = &m->cfg;
    int HD = c->head_dim;
    size_t k = 0;
    /* pack: partial replicated gradients whole; shared key/value rows at their place in the
     * global span [NH HD, (NH + 2 NKV) HD) of rows, zeros where this rank holds none */
    memset(m->tp_buf, 0, m->tp_buf_n * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        k = 0;
        for (int i = 0; i < m->ntensors; i++) {
            const gpt_tensor *t = &m->tensors[i];
            float *g = m->grads + t->offset;
            if (t->partial_grad) {
                if (pass == 0) memcpy(m->tp_buf + k, g, t->numel * sizeof(float));
                else memcpy(g, m->tp_buf + k, t->numel * sizeof(float));
                k += t->numel;
            }
            if (t->split == GPT_TP_ROWS && t->npieces == 3 && t->piece[1].share > 1) {
                size_t cols = (size_t)(t->shape[1] ? t->shape[1] : 1), base = (size_t)c->heads * HD;
                for (int q = 1; q < 3; q++) {
                    const gpt_piece *p = &t->piece[q];
                    float *span = m->tp_buf + k + ((size_t)p->global - base) * cols;
                    float *loc = g + (size_t)p->local * cols;
                    if (pass == 0) memcpy(span, loc, (size_t)p->len * cols * sizeof(float));
                    else memcpy(loc, span, (size_t)p->len * cols * sizeof(float));
                }
                k += (size_t)2 * c->kv_groups * HD * cols;
            }
        }
        if (pass == 0) gpt__tp_allreduce(m, m->tp_buf, k);
        if (pass == 0 && m->tp_stream) m->ops->sync(m->be); /* (queued) the host unpacks the sums next */
        if (kb_backend_status(m->be)) return kb_backend_status(m->be);
    }
    return 0;
}

/* The seed of dropout inside the tensor region (this rank's attention heads): Megatron's
 * seed + 2718 + tp_rank under tensor parallelism; the plain seed at tp 1. */
uint64_t gpt__tp_seed(const gpt_model *m, uint64_t seed) { return m->tp > 1 ? seed + 2718u + (uint64_t)m->tpr : seed; }

/* A row-parallel layer (proj, fc2) forward: out[Nl,C] = (in[N,IC] W^T summed over the
 * group, reduce-scattered to this rank's tokens under SP) + bias. At tp 1 one fused product.
 * in holds bf16 elements when a16 (attention's or the GELU's output: gpt_internal.h act16). */
void gpt__row_parallel_forward_act(gpt_model *m, bool a16, float *out, const float *in, const float *W,
                                   const kb_bf16 *W16, const float *bias, int N, int IC, int Nl) {
    const kb_ops *o = m->ops;
    int C = m->cfg.hidden;
    if (m->tp == 1) {
        gpt__linear_act(m, out, in, a16, W, W16, bias, N, IC, C);
        return;
    }
    gpt__linear_act(m, m->sp ? m->dfull : out, in, a16, W, W16, NULL, N, IC, C);
    if (m->sp) gpt__tp_reduce_scatter(m, out, m->dfull, (size_t)Nl * C);
    else gpt__tp_allreduce(m, out, (size_t)Nl * C);
    if (bias) o->bias_add(m->be, out, bias, Nl, C);
}

void gpt__row_parallel_forward(gpt_model *m, float *out, const float *in, const float *W, const kb_bf16 *W16,
                               const float *bias, int N, int IC, int Nl) {
    gpt__row_parallel_forward_act(m, false, out, in, W, W16, bias, N, IC, Nl);
}

/* Its backward: dbias from this rank's tokens' dout[Nl,C], then (SP: all-gathered) the
 * input gradient din[N,IC] and dW. */
void gpt__row_parallel_backward_act(gpt_model *m, bool a16, float *din, float *dW, float *dbias, const float *dout,
                                    const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int Nl) {
    int C = m->cfg.hidden;
    if (m->tp == 1) {
        lin_bwd_act(m, a16, din, dW, dbias, dout, in, W, W16, N, IC, C);
        return;
    }
    if (dbias) m->ops->bias_grad(m->be, dbias, dout, Nl, C);
    if (m->sp) gpt__tp_allgather(m, m->dfull, dout, (size_t)Nl * C), dout = m->dfull;
    lin_bwd_act(m, a16, din, dW, NULL, dout, in, W, W16, N, IC, C);
}

void gpt__row_parallel_backward(gpt_model *m, float *din, float *dW, float *dbias, const float *dout,
                                const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int Nl) {
    gpt__row_parallel_backward_act(m, false, din, dW, dbias, dout, in, W, W16, N, IC, Nl);
}
