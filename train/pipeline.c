/* pipeline.c - a pipeline stage's share of a training step and of an evaluation
 * (docs/pipeline.md).
 *
 * The rank runs its list of operations (scheduler/schedule.h: Megatron's 1F1B or interleaved
 * order) over its model chunks:
 *   forward of micro batch mb through chunk c: its input is the data (the chunk with the
 *     embedding: tensor rank 0 of the first stage reads the micro batch and broadcasts it to
 *     its tensor group) or the previous stage's output, received on the activation channel
 *     with the micro batch's positions and document starts (the stages between first and
 *     last read no data); the chunk with the head reads the micro batch too (labels, loss
 *     mask) and computes the loss, and so does the one running the MTP depths (their rolled
 *     tokens); any other chunk sends its output on (in training after the MTP stage 1 + D
 *     streams: the main hidden state and each depth's, docs/mtp.md);
 *   backward: the chunk with the head starts from its loss, the others receive their output's
 *     gradient on the gradient channel; every chunk but the embedding's sends its input's
 *     gradient back.
 * Sends never wait (ZeroMQ queues them); a receive waits at most TRAIN_COMM_TIMEOUT_MS or
 * until the generation is aborted. Megatron's order makes every rank receive in the order
 * its peer sent, on each channel.
 *
 * On the device (--device cuda with NCCL groups: t->g.pp_dev and pp_dev_bwd), activations and
 * gradients go over NCCL in stream order, device buffer to device buffer: a receive is
 * queued on the backend's stream ahead of the kernels that read it, a send behind those that
 * wrote it, and the host never waits for either. The list runs in Megatron's steps of the
 * exchange (scheduler/schedule.h's pp_exchange_step): each step begins with one NCCL group of
 * the previous step's sends and this step's receives, as Megatron's batched
 * send_forward_recv_backward, send_backward_recv_forward (1F1B) and
 * send_forward_backward_recv_forward_backward (interleaved: a steady forward and backward
 * are one step, the backward's receive posted with the forward's) do, so that two stages
 * that each send to and receive from the other never wait on each other's send. (Holding
 * each send for the next operation's receive deadlocks the interleaved schedule: a send
 * waits in a group for a receive its peer posts after a group that waits for this rank's
 * next.) On the interleaved schedule's wrap-around link (the last rank's outputs into rank
 * 0's next chunk, rank 0's input gradients into the last rank's previous chunk) the receive
 * is aligned with its sender (pp_exchange_recvs, Megatron's recv_tensor_from_previous_stage):
 * with a micro batch group larger than the pipeline it comes several steps before the
 * operation that reads it, so it goes into a queued buffer of its own (pp_q; Megatron's
 * lists), which that operation copies from in stream order. A backward's gradient is received into a buffer of its own
 * (pp_grecv) and copied into the model's, whose previous contents a held send still reads.
 * Nothing is held across a wait of the host, so no peer's stream waits on a send this rank
 * has not posted. The positions and document starts, which the host needs, still go on the
 * host channels, and so do the losses.
 *
 * After the list: the losses of the micro batches (known on the last stage) are summed over
 * the pipeline group so that every rank reports them, the partial gradients of the tensor
 * group are summed, the copies of the word embedding (first stage; last when tied; the MTP
 * stage) get their summed gradient over the embedding group, and the gradient norm is the whole model's:
 * each rank's slices over the model-parallel group, the tied copy counted once. */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This rank waits for a message from pipeline rank `stage` (-1: no longer): told to whoever
 * watches (the supervisor, through the worker's heartbeats: it names where a hung pipeline
 * is stuck). */
static void waiting(trainer *t, int stage) {
    if (t->wait_fn) t->wait_fn(t->wait_ctx, stage);
}

/* The batch of micro batch mb as this rank knows it: read from the data (first and last
 * stage), or its positions and document starts received with the activations. */
static void describe(trainer *t, int mb, gpt_batch *b) {
    const co_config *c = &t->cfg;
    tr_batch *x = &t->mbuf[mb];
    *b = (gpt_batch){.B = c->micro_batch_size, .T = x->T, .tokens = x->tokens, .targets = x->targets,
                     .positions = x->positions, .seg = c->reset_attention_mask || c->sft ? x->seg : NULL,
                     .loss_mask = x->mask, .rows = x->rows};
    if (x->full) { /* (context parallelism with MTP: the whole sequences the depths roll) */
        size_t N = (size_t)c->micro_batch_size * c->seq_length;
        b->full_tokens = x->full, b->full_targets = x->full + N, b->full_positions = x->full + 2 * N;
        b->full_mask = x->full_mask;
        b->full_T = c->seq_length;
    }
}

/* The activations' floats of one stream: the rank's tokens (its share of the sequences under
 * context parallelism, the most a micro batch may hold there; its shard of them under
 * sequence parallelism) x hidden. */
static size_t act_floats(const trainer *t) {
    const co_config *c = &t->cfg;
    size_t N = (size_t)c->micro_batch_size * (size_t)t->local_T;
    return (t->g.tp && c->sequence_parallel ? N / (size_t)t->tp_size : N) * (size_t)c->hidden_size;
}

/* ---- the device channels (see the top of the file) ---- */

/* The schedule's configuration (scheduler/schedule.h) of this rank's list. */
static pp_sched_cfg sched_cfg(const trainer *t) {
    return (pp_sched_cfg){.p = t->pp_size, .rank = t->pp_rank, .m = t->M, .v = gpt_num_chunks(t->model),
                          .group = t->cfg.microbatch_group_size_per_vp_stage};
}

static bool on_device(const trainer *t) {
    if (!(t->g.pp_dev && t->g.pp_dev_bwd && t->g.pp_dev->ops->p2p_q && t->g.pp_dev->ops->queued_error &&
          t->be->ops->stream && t->be->ops->stream(t->be)))
        return false;
    return true;
}

/* Once: which channels the activations take (the tests read it). */
static void say_channels(trainer *t) {
    if (t->pp_said || !t->g.pp_dev) return;
    t->pp_said = true;
    pp_sched_cfg sc = sched_cfg(t);
    if (on_device(t))
        co_log(CO_LOG_INFO, "pipeline: activations and gradients over NCCL on the device, in stream order%s%s",
               sc.v > 1 ? " (the interleaved schedule, Megatron's batched steps" : "",
               sc.v == 1                     ? ""
               : pp_sched_group(&sc) > sc.p ? "; the wrap-around link's tensors received ahead into queued buffers: "
                                               "micro batch group larger than the pipeline)"
                                             : ")");
    else
        co_log(CO_LOG_INFO, "pipeline: activations and gradients go over the host (ZeroMQ, managed memory), not "
                            "NCCL: the backend has no stream or the pipeline group no stream-ordered send/recv");
}

/* Operation op's receive on the device into *r; false where it receives nothing (the
 * embedding's forward, the head's backward). */
static bool dev_recv_of(trainer *t, const pp_op *op, bool train, cm_p2p *r) {
    const gpt_chunk *d = gpt_chunk_def(t->model, op->chunk);
    size_t act = act_floats(t) * sizeof(float);
    if (op->kind == PP_FORWARD) {
        if (d->embedding) return false;
        *r = (cm_p2p){.c = t->g.pp_dev, .buf = gpt_chunk_input(t->model, op->chunk, op->mb % d->slots),
                      .bytes = act * (size_t)gpt_chunk_streams(t->model, op->chunk, false, train),
                      .peer = (t->pp_rank + t->pp_size - 1) % t->pp_size};
    } else {
        if (d->head) return false;
        *r = (cm_p2p){.c = t->g.pp_dev_bwd, .buf = t->pp_grecv,
                      .bytes = act * (size_t)gpt_chunk_streams(t->model, op->chunk, true, true),
                      .peer = (t->pp_rank + 1) % t->pp_size};
    }
    return true;
}

/* The backend memory the gradients are received into (once: the most streams a chunk's
 * output has). */
static int dev_grecv(trainer *t) {
    if (t->pp_grecv) return 0;
    int most = 1;
    for (int ci = 0; ci < gpt_num_chunks(t->model); ci++)
        if (gpt_chunk_streams(t->model, ci, true, true) > most) most = gpt_chunk_streams(t->model, ci, true, true);
    size_t bytes = act_floats(t) * sizeof(float) * (size_t)most;
    t->pp_grecv = t->be->ops->alloc(t->be, bytes);
    if (!t->pp_grecv) return co_err_set(CO_ENOMEM, "pipeline: %zu bytes of device memory for the received gradients", bytes);
    return 0;
}

/* A buffer of its own for what the wrap-around link receives ahead of operation op (a free
 * one of the queue, or a new one: the most streams a chunk's input or output has), marked
 * as op's. */
static int dev_queue(trainer *t, const pp_op *op, void **buf) {
    int i = 0;
    while (i < t->pp_nq && t->pp_q[i].busy) i++;
    if (i == t->pp_nq) {
        struct tr_pp_queued *q = realloc(t->pp_q, sizeof *q * (size_t)(t->pp_nq + 1));
        if (!q) return co_err_set(CO_ENOMEM, "pipeline: the queue of received tensors");
        t->pp_q = q;
        int most = 1;
        for (int ci = 0; ci < gpt_num_chunks(t->model); ci++)
            for (int out = 0; out < 2; out++) {
                int k = gpt_chunk_streams(t->model, ci, out, true);
                most = k > most ? k : most;
            }
        size_t bytes = act_floats(t) * sizeof(float) * (size_t)most;
        if (!(q[i].buf = t->be->ops->alloc(t->be, bytes)))
            return co_err_set(CO_ENOMEM, "pipeline: %zu bytes of device memory for a tensor received ahead", bytes);
        t->pp_nq++;
    }
    t->pp_q[i].op = *op;
    t->pp_q[i].busy = true;
    *buf = t->pp_q[i].buf;
    return 0;
}

/* The queued buffer operation (kind, mb, chunk) reads, given back to the queue (the copy out
 * of it is queued before any later receive into it); NULL where its input was received in
 * its own step. */
static void *dev_take(trainer *t, pp_kind kind, int mb, int chunk) {
    for (int i = 0; i < t->pp_nq; i++) {
        struct tr_pp_queued *q = &t->pp_q[i];
        if (q->busy && q->op.kind == kind && q->op.mb == mb && q->op.chunk == chunk) {
            q->busy = false;
            return q->buf;
        }
    }
    return NULL;
}

/* A step of the exchange on the device: the held sends and the receives of ops[0..n)
 * (into into[i] where into and into[i] are given, else the operation's own buffer) posted
 * as one group on the backend's stream. */
static int dev_post(trainer *t, const pp_op *ops, void *const *into, int nops, bool train) {
    cm_p2p g[6];
    int n = 0;
    for (int i = 0; i < t->pp_nheld; i++) g[n++] = t->pp_held[i];
    t->pp_nheld = 0;
    for (int i = 0; i < nops; i++) {
        if (n == (int)(sizeof g / sizeof g[0]))
            return co_err_set(CO_EINTERNAL, "pipeline: more than %d sends and receives in a step", n);
        if (!dev_recv_of(t, &ops[i], train, &g[n])) continue;
        if (into && into[i]) g[n].buf = into[i];
        t->pp_last_from = g[n++].peer;
    }
    if (!n) return 0;
    double tl0 = tl_now();
    int rc = g[0].c->ops->p2p_q(g, n, t->be->ops->stream(t->be));
    trainer__tl(t, TL_SEND, -1, -1, tl0);
    return rc;
}

/* Before operation i of the list on the device: where a step of the exchange begins, its
 * group (pp_exchange_recvs: the step's operations' receives, up to the next step's first,
 * and the wrap-around link's aligned with its sender; one for a later operation goes into a
 * buffer of the queue, which that operation takes). */
static int dev_step(trainer *t, const pp_sched_cfg *sc, int i) {
    if (!pp_exchange_step(sc, i)) return 0;
    int j = i + 1;
    while (j < t->nops && !pp_exchange_step(sc, j)) j++;
    pp_op rv[4];
    void *into[4];
    int n = pp_exchange_recvs(sc, t->ops, t->nops, i, rv, 4);
    if (n < 0) return n;
    for (int k = 0; k < n; k++) {
        bool own = false;
        for (int o = i; o < j; o++)
            own |= t->ops[o].kind == rv[k].kind && t->ops[o].mb == rv[k].mb && t->ops[o].chunk == rv[k].chunk;
        into[k] = NULL;
        int rc = own ? 0 : dev_queue(t, &rv[k], &into[k]);
        if (rc) return rc;
    }
    return dev_post(t, rv, into, n, true);
}

/* A send held for the next step of the exchange (at most one per operation). */
static int dev_hold(trainer *t, cm_comm *ch, const void *buf, size_t bytes, int peer) {
    if (t->pp_nheld == (int)(sizeof t->pp_held / sizeof t->pp_held[0]))
        return co_err_set(CO_EINTERNAL, "pipeline: more than %d sends held", t->pp_nheld);
    t->pp_held[t->pp_nheld++] = (cm_p2p){.c = ch, .buf = (void *)buf, .bytes = bytes, .peer = peer, .send = 1};
    return 0;
}

/* Syncs the backend where it waits for what the device channels receive, telling whoever
 * watches that it waits for pipeline rank `stage` (the supervisor's hang detection of a
 * pipeline reads these waits: no host receive says it any more). */
static void dev_wait(trainer *t, int stage) {
    double tw = now_s(), tl0 = tl_now();
    waiting(t, stage);
    t->be->ops->sync(t->be);
    waiting(t, -1);
    trainer__tl(t, TL_RECV_WAIT, -1, -1, tl0);
    t->recv_s += now_s() - tw;
}

/* The backend's sticky status, then a failure of the device channels' queued operations. */
static int dev_status(trainer *t) {
    int rc = kb_backend_status(t->be);
    if (!rc && on_device(t)) rc = t->g.pp_dev->ops->queued_error(t->g.pp_dev);
    if (!rc && on_device(t)) rc = t->g.pp_dev_bwd->ops->queued_error(t->g.pp_dev_bwd);
    return rc;
}

/* The metadata sent with a micro batch's activations: its positions and document starts
 * (the local ones under context parallelism, with each local token's row in the whole micro
 * batch and the local tokens per sequence, which the packed split varies); its ints. Not on
 * the interleaved schedule's link from the last pipeline rank back to the first
 * (meta_sent): the first rank read the micro batch for its first chunk, whose forward comes
 * before any other of the micro batch, so its host never waits for a peer's in the list
 * (on the device its queued work then never waits for a host that waits for it). */
static bool meta_sent(const trainer *t, bool to_next) {
    return to_next ? t->pp_rank != t->pp_size - 1 : t->pp_rank != 0;
}

static size_t meta_ints(const trainer *t) {
    size_t N = (size_t)t->cfg.micro_batch_size * (size_t)t->cfg.seq_length;
    return t->cpn > 1 ? 3 * N + 1 : 2 * N;
}

static void meta_pack(trainer *t, const tr_batch *x) {
    size_t N = (size_t)t->cfg.micro_batch_size * (size_t)t->cfg.seq_length;
    memcpy(t->meta, x->positions, N * sizeof(int32_t));
    memcpy(t->meta + N, x->seg, N * sizeof(int32_t));
    if (t->cpn <= 1) return;
    memcpy(t->meta + 2 * N, x->rows, N * sizeof(int32_t));
    t->meta[3 * N] = x->T;
}

static void meta_unpack(trainer *t, tr_batch *x) {
    size_t N = (size_t)t->cfg.micro_batch_size * (size_t)t->cfg.seq_length;
    memcpy(x->positions, t->meta, N * sizeof(int32_t));
    memcpy(x->seg, t->meta + N, N * sizeof(int32_t));
    if (t->cpn <= 1) return;
    memcpy(x->rows, t->meta + 2 * N, N * sizeof(int32_t));
    x->T = t->meta[3 * N];
}

/* Micro batch mb's arrays from the data (once per step): samples of its place in the
 * global batch, and its gradient weights mask / (tokens x M) (--calculate-per-token-loss:
 * mask x the step's token weight). */
static int read_batch(trainer *t, int split, int mb, int64_t first_sample, bool train) {
    int data_rank = t->share_of;
    const co_config *c = &t->cfg;
    if (t->have_batch[mb] == 2) return 0;
    int B = c->micro_batch_size, N = B * c->seq_length;
    int64_t gmb = (int64_t)mb * t->topo.dp + data_rank;
    tr_batch *x = &t->mbuf[mb];
    gpt_batch b;
    double tl0 = tl_now();
    int rc = trainer__load_batch(t, split, first_sample + gmb * B, x, &b);
    if (rc) return rc;
    trainer__tl(t, TL_DATA, mb, -1, tl0);
    x->T = b.T;
    N = b.B * b.T; /* this rank's tokens (its share under context parallelism) */
    if (t->cpn > 1) memcpy(x->rows, b.rows, (size_t)N * sizeof(int32_t));
    double ntok = 0;
    for (int i = 0; i < N; i++) ntok += x->mask[i];
    /* normalised by the whole sequences' loss tokens (all context ranks' together) */
    x->ntok_all = t->cpn > 1 ? t->cp_ntok : ntok;
    float w = !train                         ? 0.0f
              : c->calculate_per_token_loss ? t->tok_w * trainer__loss_scale(t) /* (the step's, counted first) */
              : x->ntok_all > 0             ? (float)trainer__mb_weight(t, x->ntok_all) * trainer__loss_scale(t)
                                            : 0.0f;
    /* (--elastic's sample check: the last stage's, whose dp group reports to the supervisor) */
    if (train && t->pp_rank == t->pp_size - 1) trainer__count_samples(t, first_sample + gmb * B);
    for (int i = 0; i < N; i++) x->dscale[i] = x->mask[i] * w;
    t->mb_tok_local[mb] = ntok;
    t->have_batch[mb] = 2;
    return 0;
}

/* The forward of (mb, chunk c) in slot s, its input received or read, its output sent;
 * the loss into t->mb_loss_local[mb] on the head chunk. */
static int stage_forward(trainer *t, int split, int64_t first_sample, int mb, int ci, bool train, uint64_t seed) {
    const co_config *c = &t->cfg;
    const gpt_chunk *d = gpt_chunk_def(t->model, ci);
    int s = mb % d->slots;
    size_t act = act_floats(t);
    /* (1 + D streams on either side of the MTP stage in training) */
    size_t act_in = act * (size_t)gpt_chunk_streams(t->model, ci, false, train);
    size_t act_out = act * (size_t)gpt_chunk_streams(t->model, ci, true, train);
    tr_batch *x = &t->mbuf[mb];
    int rc = 0;
    int prev = (t->pp_rank + t->pp_size - 1) % t->pp_size, next = (t->pp_rank + 1) % t->pp_size;
    bool dev = on_device(t); /* (the input's receive was posted with its step: dev_step) */
    double t0 = now_s();
    /* the data: tokens for the embedding and the MTP depths, labels and mask for the loss */
    if (d->embedding || d->head || d->mtp) rc = read_batch(t, split, mb, first_sample, train);
    t->phase_ms[TR_PH_DATA] += 1000 * (now_s() - t0); /* (a wait for the previous stage is no phase) */
    if (!rc && !d->embedding) {
        /* the previous stage's output, with the micro batch's positions and document starts */
        cm_comm *ch = t->g.pp;
        bool meta = meta_sent(t, false);
        double tw = now_s(), tl0 = tl_now();
        waiting(t, prev);
        if (meta) rc = ch->ops->recv(ch, t->meta, meta_ints(t) * sizeof(int32_t), prev, TRAIN_COMM_TIMEOUT_MS);
        if (!rc && !dev)
            rc = ch->ops->recv(ch, gpt_chunk_input(t->model, ci, s), act_in * sizeof(float), prev, TRAIN_COMM_TIMEOUT_MS);
        waiting(t, -1);
        trainer__tl(t, TL_RECV_WAIT, mb, ci, tl0);
        t->recv_s += now_s() - tw;
        if (!rc && meta && !t->have_batch[mb]) {
            meta_unpack(t, x);
            t->have_batch[mb] = 1;
        }
    }
    if (rc) return rc;
    void *queued = dev && !d->embedding ? dev_take(t, PP_FORWARD, mb, ci) : NULL;
    if (queued) t->be->ops->copy(t->be, gpt_chunk_input(t->model, ci, s), queued, act_in * sizeof(float));
    double t1 = now_s();
    gpt_batch b;
    describe(t, mb, &b);
    double loss = 0, tl0 = tl_now();
    if (train) {
        if (on_device(t) && t->inj && t->inj->n > 0) dev_wait(t, t->pp_last_from); /* (a fault may write weights from the host) */
        trainer__inject_forward(t, t->iteration + 1, mb, c->micro_batch_size * x->T);
        /* (on the device the head's loss read waits for the received input: said as a wait
         * for the previous stage, its compute included) */
        bool said = dev && d->head;
        if (said) waiting(t, prev);
        tl0 = tl_now();
        trainer__pgather_chunk(t, ci); /* (--overlap-param-gather: the buckets this chunk reads) */
        loss = gpt_chunk_forward(t->model, ci, s, &b, true, seed, d->head ? x->dscale : NULL, NULL);
        if (said) waiting(t, -1);
        trainer__tl(t, TL_FORWARD, mb, ci, tl0);
        if (d->head) t->poison[mb] = trainer__inject_loss(t, t->iteration + 1, mb, t->share_of, &loss);
    } else {
        loss = gpt_chunk_forward(t->model, ci, s, &b, false, 0, d->head ? t->zeros : NULL, NULL);
    }
    if ((rc = dev_status(t))) return rc;
    if (d->head) t->mb_loss_local[mb] = loss;
    t->phase_ms[TR_PH_FORWARD] += 1000 * (now_s() - t1);
    if (!d->head) {
        cm_comm *ch = t->g.pp;
        meta_pack(t, x);
        tl0 = tl_now();
        if (meta_sent(t, true)) rc = ch->ops->send(ch, t->meta, meta_ints(t) * sizeof(int32_t), next, TRAIN_COMM_TIMEOUT_MS);
        if (!rc && dev) rc = dev_hold(t, t->g.pp_dev, gpt_chunk_output(t->model, ci, s), act_out * sizeof(float), next);
        else if (!rc)
            rc = ch->ops->send(ch, gpt_chunk_output(t->model, ci, s), act_out * sizeof(float), next, TRAIN_COMM_TIMEOUT_MS);
        trainer__tl(t, TL_SEND, mb, ci, tl0);
    }
    return rc;
}

static int stage_backward(trainer *t, int mb, int ci, uint64_t seed) {
    const gpt_chunk *d = gpt_chunk_def(t->model, ci);
    int s = mb % d->slots;
    size_t act = act_floats(t);
    size_t act_in = act * (size_t)gpt_chunk_streams(t->model, ci, false, true);
    size_t act_out = act * (size_t)gpt_chunk_streams(t->model, ci, true, true);
    int rc = 0;
    int prev = (t->pp_rank + t->pp_size - 1) % t->pp_size, next = (t->pp_rank + 1) % t->pp_size;
    if (on_device(t)) {
        /* the output gradient, received with its step (dev_step) into pp_grecv or earlier
         * into a queued buffer: nothing for the host to wait for */
        void *queued = d->head ? NULL : dev_take(t, PP_BACKWARD, mb, ci);
        if (!d->head)
            t->be->ops->copy(t->be, gpt_chunk_output_grad(t->model), queued ? queued : t->pp_grecv,
                             act_out * sizeof(float));
    } else if (!d->head) {
        cm_comm *ch = t->g.pp_bwd;
        double tw = now_s(), tl0 = tl_now();
        waiting(t, next);
        rc = ch->ops->recv(ch, gpt_chunk_output_grad(t->model), act_out * sizeof(float), next, TRAIN_COMM_TIMEOUT_MS);
        waiting(t, -1);
        trainer__tl(t, TL_RECV_WAIT, mb, ci, tl0);
        t->recv_s += now_s() - tw;
        if (rc) return rc;
    }
    double t0 = now_s();
    trainer__fire_process_faults(t, t->iteration + 1, mb, FI_PH_BACKWARD);
    gpt_batch b;
    describe(t, mb, &b);
    /* (--overlap-param-gather: every chunk's forward has run, so every bucket was waited for;
     * the gather thread joins before the reduction's thread may take the same transport) */
    if (t->pg && mb == t->M - 1 && (rc = trainer__dopt_sync(t))) return rc;
    double tl0 = tl_now();
    /* (the chunk's last micro batch: its layers' buckets start as their backward ends) */
    trainer__overlap_last(t, mb == t->M - 1, !d->head || !t->poison[mb]);
    gpt_chunk_backward(t->model, ci, s, &b, seed);
    trainer__tl(t, TL_BACKWARD, mb, ci, tl0);
    if (d->head) {
        /* (an injected fault writes gradients from the host: the backward must have run) */
        if (on_device(t) && (t->poison[mb] >= 0 || (t->inj && t->inj->n > 0))) dev_wait(t, t->pp_last_from);
        trainer__inject_grads(t, t->iteration + 1, mb, t->poison[mb]);
    }
    if ((rc = dev_status(t))) return rc;
    t->phase_ms[TR_PH_BACKWARD] += 1000 * (now_s() - t0);
    if (!d->embedding && on_device(t)) {
        rc = dev_hold(t, t->g.pp_dev_bwd, gpt_chunk_input_grad(t->model), act_in * sizeof(float), prev);
    } else if (!d->embedding) {
        cm_comm *ch = t->g.pp_bwd;
        tl0 = tl_now();
        rc = ch->ops->send(ch, gpt_chunk_input_grad(t->model), act_in * sizeof(float), prev, TRAIN_COMM_TIMEOUT_MS);
        trainer__tl(t, TL_SEND, mb, ci, tl0);
    }
    return rc;
}

/* The losses and token counts of the micro batches, known on the last stage, summed over
 * the pipeline group and folded into t->mbs (every rank reports them); *loss, *tok
 * their sums. */
static int share_losses(trainer *t, double *loss, double *tok) {
    int M = t->M;
    bool last = t->pp_rank == t->pp_size - 1;
    for (int mb = 0; mb < M; mb++) {
        t->lbuf[mb] = last ? t->mb_loss_local[mb] : 0;
        t->lbuf[M + mb] = last ? t->mb_tok_local[mb] : 0;
    }
    int rc = t->g.pp->ops->allreduce_sum(t->g.pp, t->lbuf, 2 * (size_t)M, CM_F64, TRAIN_COMM_TIMEOUT_MS);
    if (rc) return rc;
    *loss = *tok = 0;
    rr_mbs_reset(&t->mbs);
    for (int mb = 0; mb < M; mb++) {
        rr_mbs_add(&t->mbs, mb, t->lbuf[mb], t->lbuf[M + mb]);
        *loss += t->lbuf[mb];
        *tok += t->lbuf[M + mb];
    }
    return 0;
}

/* The copies of the word embedding (the first stage's, the last stage's when tied, the MTP
 * stage's) get their summed gradient (Megatron's embedding group all-reduce in
 * finalize_model_grads). */
static int sum_tied_embedding(trainer *t) {
    int ti = gpt_tied_embedding(t->model);
    if (ti < 0) return 0;
    if (!t->g.emb) return co_err_set(CO_EINVAL, "a copy of the word embedding on pipeline rank %d without an embedding group", t->pp_rank);
    const gpt_tensor *e = &gpt_tensors(t->model)[ti];
    return t->g.emb->ops->allreduce_sum(t->g.emb, gpt_grads(t->model) + e->offset, e->numel, CM_F32, TRAIN_COMM_TIMEOUT_MS);
}

int trainer__pipeline_share(trainer *t, int data_rank, int64_t step, double *loss_out, double *tok_out,
                            double *grad_norm) {
    /* data_rank: this replica's own share, or (a check round of the rerun state machine) the
     * suspect replica's, which this whole pipeline recomputes */
    t->share_of = data_rank;
    /* --elastic: a check round's share may hold one micro batch more or fewer than this
     * rank's own; the schedule is this share's until the next one's */
    int rc = t->cfg.elastic ? trainer__use_m(t, trainer__share(t, t->gbs, data_rank)) : 0;
    if (rc) return rc;
    memset(t->smp_step, 0, sizeof t->smp_step);
    float wtok;
    if (t->cfg.calculate_per_token_loss) {
        rc = trainer__per_token_weight(t, data_rank, step, &wtok);
        if (rc) return rc;
    }
    say_channels(t);
    gpt_set_device_pipeline(t->model, on_device(t));
    trainer__overlap_arm(t);
    gpt_zero_grad(t->model);
    memset(t->have_batch, 0, sizeof *t->have_batch * (size_t)t->M);
    t->pp_nheld = 0;
    for (int i = 0; i < t->pp_nq; i++) t->pp_q[i].busy = false; /* (a failed list's leftovers) */
    t->pp_last_from = (t->pp_rank + 1) % t->pp_size;
    pp_sched_cfg sc = sched_cfg(t);
    rc = on_device(t) ? dev_grecv(t) : 0;
    for (int i = 0; i < t->nops && !rc; i++) {
        const pp_op *op = &t->ops[i];
        int64_t gmb = (int64_t)op->mb * t->topo.dp + data_rank;
        uint64_t seed = trainer__dropout_seed(t, gmb);
        if (on_device(t) && (rc = dev_step(t, &sc, i))) break;
            if (op->kind == PP_FORWARD) {
            rc = stage_forward(t, 0, t->consumed[0], op->mb, op->chunk, true, seed);
        } else {
            rc = stage_backward(t, op->mb, op->chunk, seed);
        }
    }
    /* on the device: the last sends (before the losses' wait), then the one wait of the
     * list, for the gradients the host reads next, and the failures of what was queued */
    if (!rc && on_device(t)) rc = dev_post(t, NULL, NULL, 0, true);
    if (!rc && on_device(t)) {
        dev_wait(t, t->pp_last_from);
        rc = dev_status(t);
    }
    if (!rc) rc = share_losses(t, loss_out, tok_out);
    /* a failed list leaves nothing queued that the host's next writes (a reload, a peer's
     * state) would race: what is queued on aborted communicators ends at once */
    if (rc && on_device(t)) t->be->ops->sync(t->be);
    if (!rc && t->g.tp) rc = gpt_tp_finalize_grads(t->model);
    double tl0 = tl_now();
    if (!rc) rc = sum_tied_embedding(t);
    if (!rc && gpt_tied_embedding(t->model) >= 0) trainer__tl(t, TL_EMBED_REDUCE, -1, -1, tl0);
    *grad_norm = 0;
    if (!rc && t->ovl) return trainer__overlap_flush(t, grad_norm);
    if (!rc && t->have_val) rc = trainer__grad_norm(t, grad_norm);
    return rc;
}

int trainer__pipeline_evaluate(trainer *t, int split, double *loss_out, double *tok_out) {
    const co_config *c = &t->cfg;
    t->share_of = t->topo.dp_rank;
    gpt_set_device_pipeline(t->model, on_device(t));
    double loss = 0, tok = 0;
    int rc = 0;
    for (int64_t it = 0; it < c->eval_iters && !rc; it++) {
        memset(t->have_batch, 0, sizeof *t->have_batch * (size_t)t->M);
        t->pp_nheld = 0;
        t->pp_last_from = (t->pp_rank + t->pp_size - 1) % t->pp_size;
        /* each micro batch through the chunks in pipeline order (forwards only: no bubble to fill) */
        for (int mb = 0; mb < t->M && !rc; mb++)
            for (int ci = 0; ci < gpt_num_chunks(t->model) && !rc; ci++) {
                pp_op op = {PP_FORWARD, mb, ci}; /* (each its own step: its receive with the last sends) */
                if (on_device(t)) rc = dev_post(t, &op, NULL, 1, false);
                if (!rc) rc = stage_forward(t, split, t->consumed[split], mb, ci, false, 0);
            }
        if (!rc && on_device(t)) rc = dev_post(t, NULL, NULL, 0, false);
        if (!rc && on_device(t)) { /* (what the host does next may read the weights) */
            t->be->ops->sync(t->be);
            rc = dev_status(t);
        }
        if (rc && on_device(t)) t->be->ops->sync(t->be); /* (as after a failed step) */
        double l = 0, k = 0;
        if (!rc) rc = share_losses(t, &l, &k);
        loss += l;
        tok += k;
        t->consumed[split] += c->global_batch_size;
    }
    *loss_out = loss;
    *tok_out = tok;
    return rc;
}
