/* sim_coll.c - the NCCL stand-in's operations: collectives in rounds over the ranks' slots,
 * point-to-point messages over per-pair channels, groups, and ncclCommSplit.
 *
 * Every call checks its arguments and queues a task on its CUDA stream (cudasim_enqueue);
 * between ncclGroupStart and ncclGroupEnd the calls collect in a per-thread list that
 * ncclGroupEnd queues as one task (on the first call's stream). A task runs its collectives
 * in call order, then moves all of its sends and receives forward together, so a ring of
 * sends and receives in one group cannot deadlock; a send and a receive of one group on
 * overlapping memory are refused (a race on a GPU).
 *
 * A collective round (R = 1, 2, ...): wait until every rank read round R-1 (acks), copy this
 * rank's chunk into its slot and post seq = R, wait until every rank posted R, compute from
 * the slots, ack R. Reductions always run over ranks 0, 1, 2, ... in order, on every rank,
 * so results are bitwise the same everywhere and from run to run. */
#include "tests/cudasim/nccl/sim_nccl.h"

#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_REDUCESCATTER, OP_SEND, OP_RECV } op_kind;

typedef struct sim_op {
    op_kind kind;
    sim_comm *c;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank for all-gather and reduce-scatter */
    ncclDataType_t dt;
    ncclRedOp_t red;
    int peer; /* root or peer */
    cudaStream_t stream;
    size_t done; /* point-to-point bytes moved so far */
    bool finished, failed;
} sim_op;

typedef struct sim_task {
    int n;
    sim_op ops[];
} sim_task;

static const char *op_name[] = {"all-reduce", "broadcast", "all-gather", "reduce-scatter", "send", "recv"};

static char *slot(sim_comm *c, int j) { return c->slots + (size_t)j * SIM_SLOT_BYTES; }
static sim_chan *chan(sim_comm *c, int src, int dst) { return &c->chans[(size_t)src * c->nranks + dst]; }
static char *chan_buf(sim_comm *c, int src, int dst) {
    return c->bufs + ((size_t)src * c->nranks + dst) * SIM_CHAN_BYTES;
}

/* waits until every rank's counter (seq or ack) reached r */
static ncclResult_t wait_all(sim_comm *c, bool ack, uint64_t r, const char *what) {
    int64_t deadline = sim_now_ms() + sim_timeout_ms();
    for (;;) {
        uint32_t f = atomic_load(&c->seg->futex);
        int lacking = -1; /* a rank that left is a failure only while it is waited on */
        for (int j = 0; j < c->nranks && lacking < 0; j++)
            if ((ack ? atomic_load(&c->ranks[j].ack) : atomic_load(&c->ranks[j].seq)) < r) lacking = j;
        if (lacking < 0) return ncclSuccess;
        ncclResult_t e = sim_wait(c, f, deadline, what, lacking);
        if (e != ncclSuccess) return e;
    }
}

ncclResult_t sim_round(sim_comm *c, const void *mine, size_t bytes, void (*use)(sim_comm *, void *), void *arg) {
    uint64_t r = c->round + 1;
    ncclResult_t e = wait_all(c, true, r - 1, "collective");
    if (e != ncclSuccess) return e;
    if (bytes) memcpy(slot(c, c->rank), mine, bytes);
    atomic_store(&c->ranks[c->rank].seq, r);
    sim_wake(c);
    if ((e = wait_all(c, false, r, "collective")) != ncclSuccess) return e;
    use(c, arg);
    atomic_store(&c->ranks[c->rank].ack, r);
    sim_wake(c);
    c->round = r;
    return ncclSuccess;
}

/* ---- collectives ---- */

typedef struct chunk {
    const sim_op *o;
    size_t off, n; /* elements of this round */
} chunk;

static void reduce_slots(sim_comm *c, char *dst, size_t at, size_t n, const sim_op *o) {
    size_t es = sim_type_size(o->dt);
    memcpy(dst, slot(c, 0) + at * es, n * es);
    for (int j = 1; j < c->nranks; j++) sim_reduce(dst, slot(c, j) + at * es, n, o->dt, o->red);
    if (o->red == ncclAvg) sim_finish_avg(dst, n, o->dt, c->nranks);
}

static void use_allreduce(sim_comm *c, void *a) {
    chunk *k = a;
    reduce_slots(c, (char *)k->o->recv + k->off * sim_type_size(k->o->dt), 0, k->n, k->o);
}

static void use_broadcast(sim_comm *c, void *a) {
    chunk *k = a;
    size_t es = sim_type_size(k->o->dt);
    memcpy((char *)k->o->recv + k->off * es, slot(c, k->o->peer), k->n * es);
}

static void use_allgather(sim_comm *c, void *a) {
    chunk *k = a;
    size_t es = sim_type_size(k->o->dt);
    for (int j = 0; j < c->nranks; j++)
        memcpy((char *)k->o->recv + ((size_t)j * k->o->count + k->off) * es, slot(c, j), k->n * es);
}

static void use_reducescatter(sim_comm *c, void *a) {
    chunk *k = a;
    const sim_op *o = k->o;
    size_t mine0 = (size_t)c->rank * o->count, lo = k->off > mine0 ? k->off : mine0;
    size_t hi = k->off + k->n < mine0 + o->count ? k->off + k->n : mine0 + o->count;
    if (lo < hi) reduce_slots(c, (char *)o->recv + (lo - mine0) * sim_type_size(o->dt), lo - k->off, hi - lo, o);
}

static ncclResult_t run_coll(sim_op *o) {
    sim_comm *c = o->c;
    size_t es = sim_type_size(o->dt), per = SIM_SLOT_BYTES / es;
    size_t total = o->kind == OP_REDUCESCATTER ? o->count * (size_t)c->nranks : o->count;
    void (*use)(sim_comm *, void *) = o->kind == OP_ALLREDUCE   ? use_allreduce
                                      : o->kind == OP_BROADCAST ? use_broadcast
                                      : o->kind == OP_ALLGATHER ? use_allgather
                                                                : use_reducescatter;
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&c->exec_lk);
    for (size_t off = 0; off < total && r == ncclSuccess; off += per) {
        chunk k = {o, off, total - off < per ? total - off : per};
        bool post = o->kind != OP_BROADCAST || c->rank == o->peer;
        r = sim_round(c, (const char *)o->send + off * es, post ? k.n * es : 0, use, &k);
    }
    pthread_mutex_unlock(&c->exec_lk);
    return r;
}

/* ---- point to point ---- */

/* COHORT_SIM_NCCL_RENDEZVOUS=1: a send finishes only once the receiver has taken its last
 * chunk, not when that chunk is posted (a pair's channel holds one), as a large message on
 * real NCCL does; so a schedule that needs NCCL to buffer a send deadlocks here too. */
static bool rendezvous(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("COHORT_SIM_NCCL_RENDEZVOUS");
        on = e && *e == '1';
    }
    return on;
}

/* Moves one chunk of a send or receive if its channel allows; *moved says whether it did. */
static ncclResult_t p2p_step(sim_op *o, bool *moved) {
    sim_comm *c = o->c;
    size_t total = o->count * sim_type_size(o->dt);
    bool send = o->kind == OP_SEND;
    sim_chan *ch = send ? chan(c, c->rank, o->peer) : chan(c, o->peer, c->rank);
    char *buf = send ? chan_buf(c, c->rank, o->peer) : chan_buf(c, o->peer, c->rank);
    uint64_t sent = atomic_load(&ch->sent), taken = atomic_load(&ch->taken);
    if (send) {
        if (sent != taken) return ncclSuccess; /* the receiver has not taken the last chunk */
        if (o->done == total) { /* (rendezvous) the receiver took the last chunk */
            o->finished = *moved = true;
            return ncclSuccess;
        }
        size_t len = total - o->done < SIM_CHAN_BYTES ? total - o->done : SIM_CHAN_BYTES;
        memcpy(buf, (const char *)o->send + o->done, len);
        ch->total = total;
        ch->len = len;
        atomic_store(&ch->sent, sent + 1);
        o->done += len;
    } else {
        if (sent == taken) return ncclSuccess;
        if (o->done == 0 && ch->total != total)
            return sim_error(ncclInvalidUsage, "%s: rank %d sends %llu bytes to rank %d, which receives %zu", c->name,
                             o->peer, (unsigned long long)ch->total, c->rank, total);
        memcpy((char *)o->recv + o->done, buf, ch->len);
        o->done += ch->len;
        atomic_store(&ch->taken, taken + 1);
    }
    sim_wake(c);
    *moved = true;
    o->finished = o->done == total && (!send || !rendezvous());
    return ncclSuccess;
}

static ncclResult_t op_usable(sim_op *o) {
    if (atomic_load(&o->c->aborted))
        return sim_error(ncclSystemError, "%s: %s: the communicator was aborted", o->c->name, op_name[o->kind]);
    return (ncclResult_t)atomic_load(&o->c->async_err);
}

static void fail_op(sim_op *o, ncclResult_t r) {
    o->failed = true;
    sim_fail(o->c, r);
}

/* whether an earlier send (receive) of the task to (from) the same peer is still going:
 * messages between two ranks go in call order, one at a time */
static bool queued_behind(const sim_task *t, int i) {
    const sim_op *o = &t->ops[i];
    for (int j = 0; j < i; j++) {
        const sim_op *e = &t->ops[j];
        if (e->kind == o->kind && e->c == o->c && e->peer == o->peer && !e->finished && !e->failed) return true;
    }
    return false;
}

/* every send and receive of a task, moved forward together until all are done */
static void run_p2p(sim_task *t) {
    int64_t deadline = sim_now_ms() + sim_timeout_ms();
    for (;;) {
        sim_op *first = NULL;
        for (int i = 0; i < t->n && !first; i++)
            if (t->ops[i].kind >= OP_SEND && !t->ops[i].finished && !t->ops[i].failed) first = &t->ops[i];
        if (!first) return;
        uint32_t f = atomic_load(&first->c->seg->futex);
        bool moved = false;
        for (int i = 0; i < t->n; i++) {
            sim_op *o = &t->ops[i];
            if (o->kind < OP_SEND || o->finished || o->failed || queued_behind(t, i)) continue;
            ncclResult_t r = op_usable(o);
            if (r == ncclSuccess) r = p2p_step(o, &moved);
            if (r != ncclSuccess) fail_op(o, r);
        }
        if (moved) deadline = sim_now_ms() + sim_timeout_ms();
        if (moved || first->finished || first->failed) continue; /* the first error's message stays the last */
        ncclResult_t r = sim_wait(first->c, f, deadline, op_name[first->kind], first->peer);
        if (r != ncclSuccess) fail_op(first, r);
    }
}

/* the stream's work: runs on the runtime's stream (or at once with the weak hook) */
static void run_task(void *arg) {
    sim_task *t = arg;
    for (int i = 0; i < t->n; i++) atomic_fetch_add(&t->ops[i].c->running, 1);
    for (int i = 0; i < t->n; i++) {
        sim_op *o = &t->ops[i];
        if (o->kind >= OP_SEND) continue;
        ncclResult_t r = op_usable(o);
        if (r == ncclSuccess && o->count) r = run_coll(o);
        if (r != ncclSuccess) fail_op(o, r);
    }
    run_p2p(t);
    for (int i = 0; i < t->n; i++) {
        sim_comm *c = t->ops[i].c;
        atomic_fetch_sub(&c->running, 1);
        atomic_fetch_sub(&c->pending, 1);
        sim_comm_unref(c);
    }
    free(t);
}

/* ---- queuing and groups ---- */

static _Thread_local int group_depth;
static _Thread_local sim_op *group_ops;
static _Thread_local int group_n, group_cap;
static _Thread_local ncclResult_t group_err;

/* A send and a receive of one group whose buffers overlap: on a GPU both move at once, chunk
 * by chunk, so the receive may overwrite what the send has not read yet (here a send's
 * chunks are copied before a receive's arrive, which would hide it): refused. */
static ncclResult_t check_overlap(const sim_op *ops, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n && ops[i].kind == OP_SEND; j++) {
            if (ops[j].kind != OP_RECV || !ops[i].count || !ops[j].count) continue;
            const char *s = ops[i].send, *r = ops[j].recv;
            size_t sb = ops[i].count * sim_type_size(ops[i].dt), rb = ops[j].count * sim_type_size(ops[j].dt);
            if (s < r + rb && r < s + sb)
                return sim_error(ncclInvalidUsage, "a group's send (%zu bytes at %p) and receive (%zu bytes at %p) "
                                 "share memory", sb, (const void *)s, rb, (const void *)r);
        }
    return ncclSuccess;
}

/* Queues ops[0..n) as one task; returns the first communicator error seen afterwards (the
 * weak hook runs the task at once) or ncclSuccess. */
static ncclResult_t issue(const sim_op *ops, int n) {
    if (n < 1) return ncclSuccess;
    sim_task *t = malloc(sizeof *t + (size_t)n * sizeof(sim_op));
    if (!t) return sim_error(ncclSystemError, "out of memory");
    t->n = n;
    memcpy(t->ops, ops, (size_t)n * sizeof(sim_op));
    for (int i = 0; i < n; i++) {
        sim_comm_ref(ops[i].c); /* the task's */
        sim_comm_ref(ops[i].c); /* this call's, to read the error afterwards */
        atomic_fetch_add(&ops[i].c->pending, 1);
    }
    cudaError_t e = cudasim_enqueue_async(ops[0].stream, run_task, t);
    ncclResult_t r = ncclSuccess;
    if (e != cudaSuccess) {
        r = sim_error(ncclUnhandledCudaError, "cannot queue %s on its stream: CUDA error %d", op_name[ops[0].kind],
                      (int)e);
        for (int i = 0; i < n; i++) {
            atomic_fetch_sub(&ops[i].c->pending, 1);
            sim_comm_unref(ops[i].c);
        }
        free(t);
    }
    for (int i = 0; i < n; i++) {
        int ae = atomic_load(&ops[i].c->async_err);
        if (r == ncclSuccess && ae != ncclSuccess) r = (ncclResult_t)ae;
        sim_comm_unref(ops[i].c);
    }
    return r;
}

static ncclResult_t check_comm(ncclComm_t comm, const char *what) {
    if (!comm) return sim_error(ncclInvalidArgument, "%s: comm is NULL", what);
    sim_comm *c = &comm->c;
    if (atomic_load(&c->aborted)) return sim_error(ncclInvalidUsage, "%s: the communicator was destroyed", what);
    int ae = atomic_load(&c->async_err);
    if (ae != ncclSuccess) return (ncclResult_t)ae;
    if (atomic_load(&c->init_state) == ncclInProgress || atomic_load(&c->busy))
        return sim_error(ncclInvalidUsage, "%s: %s is still being initialised", what, c->name);
    return ncclSuccess;
}

static ncclResult_t submit(sim_op *o) {
    ncclResult_t r = check_comm((ncclComm_t)o->c, op_name[o->kind]);
    if (r == ncclSuccess && sim_type_size(o->dt) == 0)
        r = sim_error(ncclInvalidArgument, "%s: data type %d is not modelled", op_name[o->kind], (int)o->dt);
    if (r == ncclSuccess && (o->kind <= OP_REDUCESCATTER && o->kind != OP_BROADCAST && o->kind != OP_ALLGATHER) &&
        ((int)o->red < 0 || o->red >= ncclNumOps))
        r = sim_error(ncclInvalidArgument, "%s: reduction %d is not modelled", op_name[o->kind], (int)o->red);
    if (r == ncclSuccess && (o->kind == OP_BROADCAST || o->kind >= OP_SEND) && (o->peer < 0 || o->peer >= o->c->nranks))
        r = sim_error(ncclInvalidArgument, "%s: rank %d out of range (%d ranks)", op_name[o->kind], o->peer,
                      o->c->nranks);
    if (r == ncclSuccess && o->kind >= OP_SEND && o->peer == o->c->rank)
        r = sim_error(ncclInvalidUsage, "%s: rank %d to itself is not modelled", op_name[o->kind], o->peer);
    if (r == ncclSuccess && o->count && ((o->kind != OP_RECV && !o->send) || (o->kind != OP_SEND && !o->recv)))
        r = sim_error(ncclInvalidArgument, "%s: NULL buffer", op_name[o->kind]);
    if (group_depth == 0) return r != ncclSuccess ? r : issue(o, 1);
    if (r != ncclSuccess) {
        if (group_err == ncclSuccess) group_err = r;
        return r;
    }
    if (group_n == group_cap) {
        int cap = group_cap ? 2 * group_cap : 16;
        sim_op *p = realloc(group_ops, (size_t)cap * sizeof *p);
        if (!p) return sim_error(ncclSystemError, "out of memory");
        group_ops = p;
        group_cap = cap;
    }
    group_ops[group_n++] = *o;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return sim_error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = group_err;
    int n = group_n;
    group_err = ncclSuccess;
    group_n = 0;
    if (r != ncclSuccess || n == 0) return r;
    if ((r = check_overlap(group_ops, n)) != ncclSuccess) return r;
    return issue(group_ops, n);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    sim_op o = {.kind = OP_ALLREDUCE, .c = &comm->c, .send = sendbuff, .recv = recvbuff, .count = count,
                .dt = datatype, .red = op, .stream = stream};
    return submit(&o);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    sim_op o = {.kind = OP_BROADCAST, .c = &comm->c, .send = sendbuff, .recv = recvbuff, .count = count,
                .dt = datatype, .peer = root, .stream = stream};
    if (comm && root != comm->c.rank) o.send = recvbuff; /* only the root's send buffer is read */
    return submit(&o);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    sim_op o = {.kind = OP_ALLGATHER, .c = &comm->c, .send = sendbuff, .recv = recvbuff, .count = sendcount,
                .dt = datatype, .stream = stream};
    return submit(&o);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    sim_op o = {.kind = OP_REDUCESCATTER, .c = &comm->c, .send = sendbuff, .recv = recvbuff, .count = recvcount,
                .dt = datatype, .red = op, .stream = stream};
    return submit(&o);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    sim_op o = {.kind = OP_SEND, .c = &comm->c, .send = sendbuff, .count = count, .dt = datatype, .peer = peer,
                .stream = stream, .finished = count == 0};
    return submit(&o);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    sim_op o = {.kind = OP_RECV, .c = &comm->c, .recv = recvbuff, .count = count, .dt = datatype, .peer = peer,
                .stream = stream, .finished = count == 0};
    return submit(&o);
}

/* ---- split ---- */

typedef struct split_job {
    sim_comm *parent, *child; /* child NULL for NCCL_SPLIT_NOCOLOR */
    int color, key;
    int nranks, rank; /* the child's, from the exchange */
} split_job;

static void use_split(sim_comm *c, void *a) {
    split_job *j = a;
    int n = 0, below = 0;
    for (int p = 0; p < c->nranks; p++) {
        const int *ck = (const int *)(void *)slot(c, p);
        if (ck[0] != j->color) continue;
        n++;
        if (ck[1] < j->key || (ck[1] == j->key && p < c->rank)) below++;
    }
    j->nranks = n;
    j->rank = below;
}

static ncclResult_t split_run(split_job *j) {
    sim_comm *p = j->parent;
    int ck[2] = {j->color, j->key};
    pthread_mutex_lock(&p->exec_lk);
    ncclResult_t r = sim_round(p, ck, sizeof ck, use_split, j);
    pthread_mutex_unlock(&p->exec_lk);
    if (r != ncclSuccess) sim_fail(p, r);
    atomic_store(&p->busy, 0);
    if (!j->child) return r;
    if (r == ncclSuccess) {
        j->child->nranks = j->nranks;
        j->child->rank = j->rank;
        r = sim_comm_attach(j->child);
    }
    atomic_store(&j->child->init_state, (int)r);
    if (r != ncclSuccess) sim_fail(j->child, r);
    return r;
}

static void *split_thread(void *arg) {
    split_job *j = arg;
    split_run(j);
    if (j->child) sim_comm_unref(j->child);
    sim_comm_unref(j->parent);
    free(j);
    return NULL;
}

/* the child's segment name: the parent's up to its pid (of the process that made the first
 * unique id, so that a test finds every segment of its worlds), then a hash of the parent's
 * name, the split's number and the color */
static void child_name(char *out, const sim_comm *p, uint64_t idx, int color) {
    uint64_t h = 1469598103934665603ull;
    char buf[SIM_NAME_MAX + 48];
    int n = snprintf(buf, sizeof buf, "%s/%llu/%d", p->name, (unsigned long long)idx, color);
    for (int i = 0; i < n; i++) h = (h ^ (uint8_t)buf[i]) * 1099511628211ull;
    const char *pid = p->name + strlen("/cohort-nccl-"), *end = strchr(pid, '-');
    int len = end ? (int)(end - pid) : 0;
    snprintf(out, SIM_NAME_MAX, "/cohort-nccl-%.*s-s%016llx", len, pid, (unsigned long long)h);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    ncclResult_t r = check_comm(comm, "split");
    if (r != ncclSuccess) return r;
    if (!newcomm) return sim_error(ncclInvalidArgument, "split: newcomm is NULL");
    *newcomm = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return sim_error(ncclInvalidArgument, "split: color %d", color);
    sim_comm *p = &comm->c;
    bool blocking = config && config->blocking != NCCL_CONFIG_UNDEF_INT ? config->blocking != 0 : p->blocking;
    split_job *j = calloc(1, sizeof *j);
    if (!j) return sim_error(ncclSystemError, "out of memory");
    j->parent = p;
    j->color = color;
    j->key = key;
    uint64_t idx = p->splits++;
    if (color != NCCL_SPLIT_NOCOLOR) {
        char name[SIM_NAME_MAX];
        child_name(name, p, idx, color);
        if (!(j->child = sim_comm_alloc(name, 0, 0, blocking))) {
            free(j);
            return sim_error(ncclSystemError, "out of memory");
        }
    }
    if (blocking) {
        r = split_run(j);
        if (r == ncclSuccess) *newcomm = (ncclComm_t)j->child;
        else if (j->child) sim_comm_unref(j->child);
        free(j);
        return r;
    }
    atomic_store(&p->busy, 1);
    sim_comm_ref(p);
    if (j->child) sim_comm_ref(j->child); /* the thread's; the user holds the first */
    sim_comm *child = j->child; /* j belongs to the thread once it runs */
    pthread_t th;
    if (pthread_create(&th, NULL, split_thread, j) != 0) {
        atomic_store(&p->busy, 0);
        if (j->child) {
            sim_comm_unref(j->child);
            sim_comm_unref(j->child);
        }
        sim_comm_unref(p);
        free(j);
        return sim_error(ncclSystemError, "cannot start the split thread");
    }
    pthread_detach(th);
    *newcomm = (ncclComm_t)child;
    return ncclInProgress;
}
