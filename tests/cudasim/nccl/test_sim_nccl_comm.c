/* test_sim_nccl_comm.c - comm/nccl_comm.c itself, unchanged, across forked ranks on the NCCL
 * stand-in and the test runtime stub: what comm.h promises of every communicator, checked
 * bitwise against a direct computation in rank order (device and host buffers, every
 * operation, both splits), and its failure paths: a deadline ends a collective a peer never
 * joins (CO_ETIMEOUT there, CO_EREMOTE at the peer), cm_abort from another thread ends one
 * in progress (CO_EABORTED there, CO_EREMOTE elsewhere), a peer killed by SIGKILL gives
 * CO_EREMOTE, all-to-all sizes that do not match fail every rank (CO_EPROTOCOL), and a
 * split whose parent fails leaves no communicator behind, each within a bounded time; the
 * stream-ordered operations (comm.h's *_q) on a stream of the caller's, a batch of sends and
 * receives over two communicators with rendezvous sends, a host buffer refused, an abort
 * reported by queued_error; and no shared-memory segment is left behind. */
#include "tests/test.h"

#include "comm/nccl_comm.h"
#include "common/error.h"
#include "tests/cudasim/nccl/sim_nccl.h"
#include "tests/fork_ranks.h"

#include <cuda_runtime.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>

enum { N = 3, NIDS = 6 };

typedef struct ids {
    uint8_t id[NIDS][128]; /* one communicator per case, as the supervisor hands them out */
} ids;

static cm_comm *join(int rank, int n, const uint8_t *id) {
    cm_comm *c = NULL;
    int rc = cm_nccl_new(&c, rank, n, id, 0, NULL);
    if (rc) fprintf(stderr, "rank %d: cm_nccl_new: %s (%s)\n", rank, co_err_detail(), co_err_name(rc));
    return c;
}

/* segments of this process's worlds (and their splits) still in /dev/shm */
static int leftover_segments(void) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "cohort-nccl-%d-", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            fprintf(stderr, "left in /dev/shm: %s\n", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static float fval(int r, size_t i) { return (float)(t_mix((uint64_t)r * 65537 + i) % 4001) / 13.0f - 150.0f; }

/* ---- every operation ---- */

/* all-to-all, barrier, send/recv, and both splits, on c */
static void ops_p2p_splits(cm_comm *c, int rank, int n) {
    /* all-to-all with uneven blocks: rank i sends j + i + 1 bytes of value 16 i + j to rank j */
    size_t sb[N], rb[N], so = 0, ro = 0;
    uint8_t sbuf[64], rbuf[64];
    for (int j = 0; j < n; j++) {
        sb[j] = (size_t)(j + rank + 1);
        rb[j] = (size_t)(rank + j + 1);
        memset(sbuf + so, 16 * rank + j, sb[j]);
        so += sb[j];
    }
    CHECK(c->ops->alltoallv(c, sbuf, sb, rbuf, rb, 10000) == 0);
    for (int j = 0; j < n; j++) {
        CHECK(rbuf[ro] == 16 * j + rank && rbuf[ro + rb[j] - 1] == 16 * j + rank);
        ro += rb[j];
    }
    CHECK(c->ops->barrier(c, 10000) == 0);
    /* send/recv: even ranks send first, odd ones receive first */
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int64_t out = 1000 + rank, in = -1;
    if (rank % 2 == 0) {
        CHECK(c->ops->send(c, &out, sizeof out, next, 10000) == 0);
        CHECK(c->ops->recv(c, &in, sizeof in, prev, 10000) == 0);
    } else {
        CHECK(c->ops->recv(c, &in, sizeof in, prev, 10000) == 0);
        CHECK(c->ops->send(c, &out, sizeof out, next, 10000) == 0);
    }
    CHECK(in == 1000 + prev);
    /* comm.h's split: only ranks 0 and 2 call it */
    if (rank != 1) {
        int ranks[2] = {2, 0};
        cm_comm *s = NULL;
        CHECK(c->ops->split(c, ranks, 2, &s) == 0);
        if (s) {
            CHECK(s->size == 2 && s->rank == (rank == 2 ? 0 : 1));
            int64_t v = rank + 1;
            CHECK(s->ops->allreduce_sum(s, &v, 1, CM_I64, 10000) == 0 && v == 1 + 3);
            cm_destroy(&s);
        }
    }
    /* ncclCommSplit by color: every rank calls it, rank 1 stays out */
    cm_comm *s = NULL;
    CHECK(cm_nccl_split_color(c, rank == 1 ? -1 : 5, -rank, &s, 10000) == 0);
    CHECK((s == NULL) == (rank == 1));
    if (s) {
        CHECK(s->size == 2 && s->rank == (rank == 2 ? 0 : 1));
        CHECK(s->ops->barrier(s, 10000) == 0);
        cm_destroy(&s);
    }
    CHECK(c->ops->barrier(c, 10000) == 0); /* the parent after the splits */
}

static void rank_ops(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    const ids *ids = arg;
    cm_comm *c = join(rank, n, ids->id[0]);
    REQUIRE(c);
    CHECK(c->rank == rank && c->size == n);
    /* all-reduce of device memory, past one round of the stand-in's slot */
    size_t cnt = 70001;
    float *h = malloc(cnt * sizeof *h), *d = NULL;
    for (size_t i = 0; i < cnt; i++) h[i] = fval(rank, i);
    REQUIRE(cudaMalloc((void **)&d, cnt * sizeof *d) == cudaSuccess);
    cudaMemcpy(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice);
    CHECK(c->ops->allreduce_sum(c, d, cnt, CM_F32, 10000) == 0);
    cudaMemcpy(h, d, cnt * sizeof *h, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = fval(0, i);
        for (int r = 1; r < n; r++) want += fval(r, i);
        bad += memcmp(&want, &h[i], 4) != 0;
    }
    CHECK_MSG(bad == 0, "all-reduce (device): %zu elements differ", bad);
    /* host buffers: staged */
    double hd[3] = {0.5 * rank, -1.25, 1e300 / 4};
    CHECK(c->ops->allreduce_sum(c, hd, 3, CM_F64, 10000) == 0);
    CHECK(hd[0] == 0.5 * (0 + 1 + 2) && hd[1] == -3.75 && hd[2] == 3 * (1e300 / 4));
    int64_t hi[2] = {rank, (int64_t)1 << 50};
    CHECK(c->ops->allreduce_sum(c, hi, 2, CM_I64, 10000) == 0);
    CHECK(hi[0] == 3 && hi[1] == (int64_t)3 << 50);
    /* broadcast from rank 1 (an odd byte count) */
    char bb[1001];
    memset(bb, rank == 1 ? 'x' : 0, sizeof bb);
    CHECK(c->ops->broadcast(c, bb, sizeof bb, 1, 10000) == 0);
    CHECK(bb[0] == 'x' && bb[1000] == 'x');
    /* all-gather and reduce-scatter */
    int32_t mine[5], all[N * 5];
    for (int i = 0; i < 5; i++) mine[i] = rank * 100 + i;
    CHECK(c->ops->allgather(c, mine, all, sizeof mine, 10000) == 0);
    for (int r = 0; r < n; r++) CHECK(all[r * 5 + 4] == r * 100 + 4);
    float rs[N * 7], rr[7];
    for (int i = 0; i < n * 7; i++) rs[i] = fval(rank, (size_t)i);
    CHECK(c->ops->reduce_scatter_sum(c, rs, rr, 7, CM_F32, 10000) == 0);
    for (int i = 0; i < 7; i++) {
        float want = fval(0, (size_t)(rank * 7 + i));
        for (int r = 1; r < n; r++) want += fval(r, (size_t)(rank * 7 + i));
        CHECK(memcmp(&want, &rr[i], 4) == 0);
    }
    free(h);
    cudaFree(d);
    ops_p2p_splits(c, rank, n);
    cm_destroy(&c);
}

static void test_ops(void) {
    ids ids;
    for (int i = 0; i < NIDS; i++) REQUIRE(cm_nccl_get_unique_id(ids.id[i]) == 0);
    CHECK(t_fork_ranks("ops", "sim-nccl-comm", N, rank_ops, &ids, -1, 20000) == 0);
    CHECK(leftover_segments() == 0);
}

/* ---- the stream-ordered operations (comm.h's *_q): queued on the caller's stream ---- */

static void rank_queued(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    const ids *ids = arg;
    /* a send finishes only when its receiver took it: a batch must not need a buffered send */
    setenv("COHORT_SIM_NCCL_RENDEZVOUS", "1", 1);
    cm_comm *c = join(rank, n, ids->id[1]), *c2 = join(rank, n, ids->id[2]);
    REQUIRE(c && c2);
    REQUIRE(c->ops->allreduce_sum_q && c->ops->allgather_q && c->ops->reduce_scatter_sum_q && c->ops->p2p_q &&
            c->ops->queued_error);
    cudaStream_t st;
    REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    size_t cnt = 70001; /* several stand-in rounds and channel chunks */
    float *h = malloc(cnt * sizeof *h), *d = NULL, *out = NULL, *back = NULL;
    REQUIRE(cudaMalloc((void **)&d, cnt * sizeof *d) == cudaSuccess && cudaMalloc((void **)&out, cnt * sizeof *out) == cudaSuccess &&
            cudaMalloc((void **)&back, cnt * sizeof *back) == cudaSuccess);
    for (size_t i = 0; i < cnt; i++) h[i] = fval(rank, i);
    cudaMemcpy(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice);
    CHECK(c->ops->allreduce_sum_q(c, d, cnt, CM_F32, st) == 0);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    cudaMemcpy(h, d, cnt * sizeof *h, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        float want = fval(0, i);
        for (int r = 1; r < n; r++) want += fval(r, i);
        bad += memcmp(&want, &h[i], 4) != 0;
    }
    CHECK_MSG(bad == 0, "queued all-reduce: %zu elements differ", bad);
    /* one batch over two communicators: the ring forward on c, backward on c2 (every rank
     * sends before it receives, which a rendezvous send outside a group would deadlock) */
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (size_t i = 0; i < cnt; i++) h[i] = fval(rank + 10, i);
    cudaMemcpy(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice);
    cm_p2p ring[4] = {{c, d, cnt * sizeof(float), next, 1},
                      {c2, d, cnt * sizeof(float), prev, 1},
                      {c, out, cnt * sizeof(float), prev, 0},
                      {c2, back, cnt * sizeof(float), next, 0}};
    CHECK(c->ops->p2p_q(ring, 4, st) == 0);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(c->ops->queued_error(c) == 0 && c2->ops->queued_error(c2) == 0);
    size_t bad_out = 0, bad_back = 0;
    cudaMemcpy(h, out, cnt * sizeof *h, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < cnt; i++) bad_out += h[i] != fval(prev + 10, i);
    cudaMemcpy(h, back, cnt * sizeof *h, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < cnt; i++) bad_back += h[i] != fval(next + 10, i);
    CHECK_MSG(bad_out == 0 && bad_back == 0, "queued ring: %zu and %zu elements differ", bad_out, bad_back);
    /* all-gather and reduce-scatter (device memory) */
    float *g = NULL;
    REQUIRE(cudaMalloc((void **)&g, (size_t)n * 7 * sizeof *g) == cudaSuccess);
    float mine[7], all[N * 7];
    for (int i = 0; i < 7; i++) mine[i] = fval(rank, (size_t)i);
    cudaMemcpy(d, mine, sizeof mine, cudaMemcpyHostToDevice);
    CHECK(c->ops->allgather_q(c, d, g, sizeof mine, st) == 0);
    CHECK(c->ops->reduce_scatter_sum_q(c, g, out, 7, CM_F32, st) == 0); /* rank r: n x rank r's row */
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    cudaMemcpy(all, g, (size_t)n * sizeof mine, cudaMemcpyDeviceToHost);
    for (int r = 0; r < n; r++) CHECK(all[r * 7 + 6] == fval(r, 6));
    float rr[7];
    cudaMemcpy(rr, out, sizeof rr, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 7; i++) {
        float want = fval(rank, (size_t)i);
        for (int r = 1; r < n; r++) want += fval(rank, (size_t)i);
        CHECK(memcmp(&want, &rr[i], 4) == 0);
    }
    /* a host buffer is refused (staging would wait for the device) */
    double hd = 1;
    CHECK(c->ops->allreduce_sum_q(c, &hd, 1, CM_F64, st) == CO_EINVAL);
    /* after an abort: the queued error and every later call say so */
    c2->ops->abort(c2);
    CHECK(c2->ops->queued_error(c2) == CO_EABORTED);
    cm_p2p one = {c2, d, 4, next, 1};
    CHECK(c2->ops->p2p_q(&one, 1, st) == CO_EABORTED);
    CHECK(c->ops->barrier(c, 10000) == 0);
    free(h);
    cudaFree(d), cudaFree(out), cudaFree(back), cudaFree(g);
    cudaStreamDestroy(st);
    cm_destroy(&c2);
    cm_destroy(&c);
}

static void test_queued(void) {
    ids ids;
    for (int i = 0; i < NIDS; i++) REQUIRE(cm_nccl_get_unique_id(ids.id[i]) == 0);
    CHECK(t_fork_ranks("queued", "sim-nccl-comm", N, rank_queued, &ids, -1, 20000) == 0);
    CHECK(leftover_segments() == 0);
}

/* ---- failures ---- */

typedef struct later {
    cm_comm *c;
    int ms;
    bool kill;
} later;

static void *act_later(void *p) {
    later *l = p;
    t_sleep_ms(l->ms);
    if (l->kill) raise(SIGKILL);
    l->c->ops->abort(l->c);
    return NULL;
}

/* rank 2 never joins the all-reduce: it waits on a receive from rank 0 instead. id 1: rank 0
 * has a 300 ms deadline (the others 10 s); id 2: rank 0 aborts from a thread after 200 ms;
 * id 3: rank 2 is killed after 150 ms. */
static void rank_fail(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    const ids *ids = arg;
    for (int k = 1; k <= 3; k++) {
        cm_comm *c = join(rank, n, ids->id[k]);
        REQUIRE(c);
        float x[4] = {1, 2, 3, 4};
        later l = {c, k == 2 ? 200 : 150, k == 3};
        pthread_t th;
        bool acts = (k == 2 && rank == 0) || (k == 3 && rank == 2);
        if (acts) pthread_create(&th, NULL, act_later, &l);
        int64_t t0 = t_now_ms();
        int rc = rank == 2 ? c->ops->recv(c, x, sizeof x, 0, 10000)
                           : c->ops->allreduce_sum(c, x, 4, CM_F32, k == 1 && rank == 0 ? 300 : 10000);
        int64_t dt = t_now_ms() - t0;
        int want = rank != 0 || k == 3 ? CO_EREMOTE : k == 1 ? CO_ETIMEOUT : CO_EABORTED;
        CHECK_MSG(rc == want, "case %d rank %d: %s (%s), want %s", k, rank, co_err_name(rc), co_err_detail(),
                  co_err_name(want));
        CHECK_MSG(dt < 3000, "case %d rank %d: the failure took %lld ms", k, rank, (long long)dt);
        CHECK(c->ops->barrier(c, 1000) != 0); /* unusable afterwards */
        if (acts) pthread_join(th, NULL);
        cm_destroy(&c);
    }
}

/* all-to-all sizes that do not match (rank 0 sends rank 1 four bytes, rank 1 expects six):
 * comm.h promises CO_EPROTOCOL on both sides, naming both sizes; nccl_comm.c checks every
 * rank's sizes first, so every rank (rank 2 too) gives the same verdict, and none waits for
 * the deadline. The communicator is unusable afterwards. */
static void rank_a2a_mismatch(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    const ids *ids = arg;
    cm_comm *c = join(rank, n, ids->id[4]);
    REQUIRE(c);
    size_t sb[N] = {4, 4, 4}, rb[N] = {4, 4, 4};
    if (rank == 1) rb[0] = 6;
    uint8_t sbuf[16] = {0}, rbuf[16];
    int64_t t0 = t_now_ms();
    int rc = c->ops->alltoallv(c, sbuf, sb, rbuf, rb, 5000);
    int64_t dt = t_now_ms() - t0;
    CHECK_MSG(dt < 3000, "rank %d: the all-to-all took %lld ms", rank, (long long)dt);
    CHECK_MSG(rc == CO_EPROTOCOL && strstr(co_err_detail(), "rank 0 sends 4 bytes to rank 1") &&
                  strstr(co_err_detail(), "receives 6"),
              "rank %d: %s (%s)", rank, co_err_name(rc), co_err_detail());
    CHECK(c->ops->barrier(c, 1000) == CO_EPROTOCOL);
    cm_destroy(&c);
}

/* a split by color whose parent fails (ranks 0 and 1 split with a 300 ms deadline, rank 2
 * never joins the split: it waits on a receive from rank 0): the split fails, the parent is
 * unusable, and once the parent is destroyed no NCCL communicator of the process is left
 * (the half-made child must be aborted, not leaked). */
static void rank_split_fail(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    const ids *ids = arg;
    cm_comm *c = join(rank, n, ids->id[5]);
    REQUIRE(c);
    int rc;
    if (rank == 2) {
        uint8_t b[4];
        rc = c->ops->recv(c, b, sizeof b, 0, 5000);
        CHECK_MSG(rc == CO_EREMOTE, "rank 2: %s (%s)", co_err_name(rc), co_err_detail());
    } else {
        cm_comm *s = NULL;
        rc = cm_nccl_split_color(c, 0, rank, &s, 300);
        /* the first to time out aborts: the other may see that first */
        CHECK_MSG((rc == CO_ETIMEOUT || rc == CO_EREMOTE) && !s, "rank %d: %s (%s)", rank, co_err_name(rc),
                  co_err_detail());
        cm_destroy(&s);
    }
    cm_destroy(&c);
    int64_t t0 = t_now_ms(); /* the stand-in's own threads drop their references as they end */
    while (sim_nccl_live_comms() > 0 && t_now_ms() - t0 < 3000) t_sleep_ms(10);
    CHECK_MSG(sim_nccl_live_comms() == 0, "rank %d: %d NCCL communicators left after a failed split", rank,
              sim_nccl_live_comms());
}

static void test_failures(void) {
    ids ids;
    for (int i = 0; i < NIDS; i++) REQUIRE(cm_nccl_get_unique_id(ids.id[i]) == 0);
    CHECK(t_fork_ranks("failures", "sim-nccl-comm", N, rank_fail, &ids, 2, 20000) == 0);
    CHECK(t_fork_ranks("a2a mismatch", "sim-nccl-comm", N, rank_a2a_mismatch, &ids, -1, 20000) == 0);
    CHECK(t_fork_ranks("split fails", "sim-nccl-comm", N, rank_split_fail, &ids, -1, 20000) == 0);
    CHECK(leftover_segments() == 0); /* the killed rank's world too */
}

/* argument "ops": the operations only (on a runtime whose streams cannot run concurrently) */
int main(int argc, char **argv) {
    setenv("COHORT_SIM_NCCL_TIMEOUT_MS", "10000", 1);
    RUN(test_ops);
    RUN(test_queued);
    if (argc > 1 && !strcmp(argv[1], "ops")) return TEST_EXIT();
    RUN(test_failures);
    return TEST_EXIT();
}
