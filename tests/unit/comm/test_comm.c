/* test_comm.c - the ZeroMQ collectives (comm/zmq_*.c) across forked ranks on ipc.
 *
 * Each case forks N rank processes with endpoints in a private temporary directory; every
 * rank runs the same scenario and exits 0 when its checks pass. The parent bounds each
 * case in time (a hang is a failure, the children are killed). Covered: every collective
 * against a serial reference on odd sizes (including fewer elements than ranks, several
 * chunks, both the direct and the ring algorithms, in-place variants), sub-groups split
 * off the world, send/recv, f32 results bitwise identical across ranks and across two
 * runs, abort from another thread in the middle of a collective, a peer SIGKILLed during
 * collectives, timeouts, connection timeouts, a connect cancelled from another thread (the
 * options' cancel flag), mismatched options and mismatched calls, and the uneven
 * all-to-all (sizes learned from an all-to-all of the counts; a size mismatch).
 * The all-reduce cases run both ways: over ZeroMQ only (shm_block_bytes 0) and through the
 * shared memory of ranks on one host (small blocks, so that slots are reused many times);
 * which pairs share memory is checked on a world that mixes ipc and tcp endpoints. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/zmq_comm.h"
#include "common/error.h"
#include "tests/test.h"
#include "tests/fork_ranks.h"

/* Under ThreadSanitizer: libzmq is not instrumented and hands buffers between its threads
 * through atomics TSan cannot see (see tests/tsan.supp); races in cohort's code still count. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) {
    return "called_from_lib:libzmq.so.5\nrace:libzmq.so.5\n";
}

#define T_MS 20000 /* per-call timeout where nothing should time out */

typedef void (*scenario)(int rank, int n, const char *dir, const void *arg);

/* Values whose sums over <= 4 ranks are exact in every dtype (multiples of 1/64). */
static double val(int rank, size_t i, int salt) {
    return (double)((int)(t_mix((uint64_t)rank * 1000003u + i * 7u + (uint64_t)salt * 77u) % 2001) - 1000) /
           64.0;
}
static unsigned char pat(int rank, size_t i, int salt) {
    return (unsigned char)t_mix((uint64_t)rank * 1000003u + i + (uint64_t)salt * 1000u);
}

static void put(void *buf, cm_dtype dt, size_t i, double v) {
    if (dt == CM_F32) ((float *)buf)[i] = (float)v;
    if (dt == CM_F64) ((double *)buf)[i] = v;
    if (dt == CM_I64) ((int64_t *)buf)[i] = (int64_t)(v * 64.0) * 1000003; /* big integers */
}
static double get(const void *buf, cm_dtype dt, size_t i) {
    if (dt == CM_F32) return ((const float *)buf)[i];
    if (dt == CM_F64) return ((const double *)buf)[i];
    return (double)(((const int64_t *)buf)[i] / 1000003) / 64.0;
}
static size_t dsz(cm_dtype dt) { return dt == CM_F32 ? 4 : 8; }

/* Runs fn on n forked ranks; expect_kill: the rank expected to die by SIGKILL (-1: none). */
static int run_group(const char *name, int n, scenario fn, const void *arg, int expect_kill,
                     int limit_ms) {
    return t_fork_ranks(name, "cmtest", n, fn, arg, expect_kill, limit_ms);
}

typedef struct opts {
    size_t chunk, small;
    int connect_ms;
    long shm; /* shared-memory block bytes: 0 = the default, -1 = ZeroMQ only */
} opts;

#define NO_SHM -1

static cm_comm *mk(int rank, int n, const char *dir, const opts *o) {
    char eps[8][128];
    const char *ep[8];
    for (int r = 0; r < n; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.chunk_bytes = o && o->chunk ? o->chunk : 4096;
    zo.small_bytes = o ? o->small : 256;
    zo.connect_timeout_ms = o && o->connect_ms ? o->connect_ms : 20000;
    zo.linger_ms = 1000;
    if (o && o->shm) zo.shm_block_bytes = o->shm < 0 ? 0 : (size_t)o->shm;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &zo);
    CHECK_MSG(rc == 0, "rank %d: cm_zmq_new: %s: %s", rank, co_err_name(rc), co_err_detail());
    return c;
}

/* ------------------------------------------------------------ every collective, odd sizes */

static void check_allreduce(cm_comm *c, const int *members, size_t count, cm_dtype dt, int salt) {
    int n = c->size;
    void *buf = malloc(count * dsz(dt) + 1);
    for (size_t i = 0; i < count; i++) put(buf, dt, i, val(members[c->rank], i, salt));
    int rc = c->ops->allreduce_sum(c, buf, count, dt, T_MS);
    CHECK_MSG(rc == 0, "allreduce %zu dt %d: %s", count, (int)dt, co_err_detail());
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double ref = 0;
        for (int r = 0; r < n; r++) ref += val(members[r], i, salt);
        if (get(buf, dt, i) != ref) wrong++;
    }
    CHECK_MSG(wrong == 0, "allreduce count %zu dtype %d on %d ranks: %zu elements wrong", count,
              (int)dt, n, wrong);
    free(buf);
}

static void check_reduce_scatter(cm_comm *c, const int *members, size_t count, cm_dtype dt,
                                 bool inplace) {
    int n = c->size, me = c->rank;
    size_t es = dsz(dt);
    unsigned char *send = malloc((size_t)n * count * es);
    for (size_t i = 0; i < (size_t)n * count; i++) put(send, dt, i, val(members[me], i, 5));
    unsigned char *recv = inplace ? send + (size_t)me * count * es : malloc(count * es);
    int rc = c->ops->reduce_scatter_sum(c, send, recv, count, dt, T_MS);
    CHECK_MSG(rc == 0, "reduce_scatter %zu: %s", count, co_err_detail());
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double ref = 0;
        for (int r = 0; r < n; r++) ref += val(members[r], (size_t)me * count + i, 5);
        if (get(recv, dt, i) != ref) wrong++;
    }
    CHECK_MSG(wrong == 0, "reduce_scatter count %zu dtype %d%s on %d ranks: %zu wrong", count,
              (int)dt, inplace ? " in place" : "", n, wrong);
    if (!inplace) free(recv);
    free(send);
}

static void check_allgather(cm_comm *c, const int *members, size_t bytes, bool inplace) {
    int n = c->size, me = c->rank;
    unsigned char *recv = malloc((size_t)n * bytes);
    memset(recv, 0xEE, (size_t)n * bytes);
    unsigned char *send = inplace ? recv + (size_t)me * bytes : malloc(bytes);
    for (size_t i = 0; i < bytes; i++) send[i] = pat(members[me], i, 3);
    int rc = c->ops->allgather(c, send, recv, bytes, T_MS);
    CHECK_MSG(rc == 0, "allgather %zu: %s", bytes, co_err_detail());
    size_t wrong = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < bytes; i++) wrong += recv[(size_t)r * bytes + i] != pat(members[r], i, 3);
    CHECK_MSG(wrong == 0, "allgather %zu bytes%s on %d ranks: %zu wrong", bytes,
              inplace ? " in place" : "", n, wrong);
    if (!inplace) free(send);
    free(recv);
}

static void check_broadcast(cm_comm *c, const int *members, size_t bytes, int root) {
    unsigned char *buf = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) buf[i] = c->rank == root ? pat(members[root], i, 9) : 0xEE;
    int rc = c->ops->broadcast(c, buf, bytes, root, T_MS);
    CHECK_MSG(rc == 0, "broadcast %zu: %s", bytes, co_err_detail());
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i++) wrong += buf[i] != pat(members[root], i, 9);
    CHECK_MSG(wrong == 0, "broadcast %zu bytes from %d on %d ranks: %zu wrong", bytes, root,
              c->size, wrong);
    free(buf);
}

static void check_sendrecv_ring(cm_comm *c, const int *members, size_t bytes) {
    int n = c->size, me = c->rank, nxt = (me + 1) % n, prv = (me + n - 1) % n;
    unsigned char *out = malloc(bytes + 1), *in = malloc(bytes + 1);
    for (size_t i = 0; i < bytes; i++) out[i] = pat(members[me], i, (int)bytes);
    memset(in, 0xEE, bytes + 1);
    int rc = c->ops->send(c, out, bytes, nxt, T_MS);
    CHECK_MSG(rc == 0, "send %zu: %s", bytes, co_err_detail());
    rc = c->ops->recv(c, in, bytes, prv, T_MS);
    CHECK_MSG(rc == 0, "recv %zu: %s", bytes, co_err_detail());
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i++) wrong += in[i] != pat(members[prv], i, (int)bytes);
    CHECK_MSG(wrong == 0 && in[bytes] == 0xEE, "send/recv %zu bytes: %zu wrong", bytes, wrong);
    free(out);
    free(in);
}

/* Uneven all-to-all: rank s sends a2a_len(s, d) bytes to rank d (zero for some pairs, some
 * blocks several chunks); the receivers first learn their sizes from an all-to-all of the
 * counts, as the MoE token dispatcher does. */
static size_t a2a_len(int s, int d, size_t scale) { return (size_t)((s * 7 + d * 3) % 5) * scale + (size_t)(s == d); }

static void check_alltoallv(cm_comm *c, const int *members, size_t scale) {
    int n = c->size, me = c->rank;
    size_t sb[8], rb[8], eight[8], stot = 0, rtot = 0;
    uint64_t cnt_out[8], cnt_in[8];
    for (int d = 0; d < n; d++) {
        sb[d] = a2a_len(members[me], members[d], scale);
        cnt_out[d] = sb[d];
        eight[d] = 8;
        stot += sb[d];
    }
    int rc = c->ops->alltoallv(c, cnt_out, eight, cnt_in, eight, T_MS);
    CHECK_MSG(rc == 0, "alltoall of counts: %s", co_err_detail());
    for (int r = 0; r < n; r++) {
        rb[r] = (size_t)cnt_in[r];
        CHECK_MSG(rb[r] == a2a_len(members[r], members[me], scale), "count from %d: %zu", r, rb[r]);
        rtot += rb[r];
    }
    unsigned char *send = malloc(stot + 1), *recv = malloc(rtot + 1);
    for (int d = 0, o = 0; d < n; o += (int)sb[d], d++)
        for (size_t i = 0; i < sb[d]; i++) send[(size_t)o + i] = pat(members[me] * 16 + members[d], i, 5);
    memset(recv, 0xEE, rtot + 1);
    rc = c->ops->alltoallv(c, send, sb, recv, rb, T_MS);
    CHECK_MSG(rc == 0, "alltoallv scale %zu: %s", scale, co_err_detail());
    size_t wrong = 0, o = 0;
    for (int r = 0; r < n; o += rb[r], r++)
        for (size_t i = 0; i < rb[r]; i++) wrong += recv[o + i] != pat(members[r] * 16 + members[me], i, 5);
    CHECK_MSG(wrong == 0 && recv[rtot] == 0xEE, "alltoallv scale %zu on %d ranks: %zu wrong", scale, n, wrong);
    free(send);
    free(recv);
}

static void sc_collectives(int rank, int n, const char *dir, const void *arg) {
    if (rank == n - 1) t_sleep_ms(150); /* peers start in any order */
    cm_comm *c = mk(rank, n, dir, arg);
    if (!c) return;
    int world[8];
    for (int r = 0; r < n; r++) world[r] = r;
    static const size_t counts[] = {1, 2, 3, 7, 1023, 100003};
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
        for (int dt = 0; dt < 3; dt++) check_allreduce(c, world, counts[k], (cm_dtype)dt, (int)k);
    static const size_t rs[] = {1, 3, 1023, 25001};
    for (size_t k = 0; k < sizeof rs / sizeof *rs; k++) {
        check_reduce_scatter(c, world, rs[k], CM_F32, false);
        check_reduce_scatter(c, world, rs[k], CM_I64, k == 2);
    }
    check_reduce_scatter(c, world, 7, CM_F64, true);
    static const size_t ag[] = {1, 13, 4097, 30001};
    for (size_t k = 0; k < sizeof ag / sizeof *ag; k++) check_allgather(c, world, ag[k], k == 1);
    for (int root = 0; root < n; root++) {
        check_broadcast(c, world, 1, root);
        check_broadcast(c, world, 9001, root);
    }
    check_broadcast(c, world, 100003, n - 1);
    for (int i = 0; i < 3; i++) CHECK(c->ops->barrier(c, T_MS) == 0);
    static const size_t p2p[] = {0, 1, 4096, 10007};
    for (size_t k = 0; k < sizeof p2p / sizeof *p2p; k++) check_sendrecv_ring(c, world, p2p[k]);
    static const size_t a2a[] = {1, 100, 3001};
    for (size_t k = 0; k < sizeof a2a / sizeof *a2a; k++) check_alltoallv(c, world, a2a[k]);
    /* argument errors leave the communicator usable */
    CHECK(c->ops->broadcast(c, world, 4, n, T_MS) == CO_EINVAL);
    CHECK(c->ops->send(c, world, 4, rank, T_MS) == CO_EINVAL);
    CHECK(c->ops->allreduce_sum(c, world, 1, (cm_dtype)7, T_MS) == CO_EINVAL);
    CHECK(c->ops->barrier(c, T_MS) == 0);
    cm_destroy(&c);
}

/* ZeroMQ only: the direct exchange and the ring */
static void test_collectives_2(void) {
    opts o = {4096, 256, 0, NO_SHM};
    CHECK(run_group("collectives-2", 2, sc_collectives, &o, -1, 60000) == 0);
}
static void test_collectives_3_ring_only(void) {
    opts o = {4096, 0, 0, NO_SHM}; /* ring even for 1 element: segments smaller than the rank count */
    CHECK(run_group("collectives-3", 3, sc_collectives, &o, -1, 60000) == 0);
}
static void test_collectives_4(void) {
    opts o = {2048, 64, 0, NO_SHM};
    CHECK(run_group("collectives-4", 4, sc_collectives, &o, -1, 60000) == 0);
}

/* Shared memory: small blocks, so that large buffers take hundreds of blocks and every slot
 * is reused many times; direct (one block within small_bytes) and blocked paths. */
static void test_collectives_2_shm(void) {
    opts o = {4096, 256, 0, 1024};
    CHECK(run_group("collectives-2-shm", 2, sc_collectives, &o, -1, 60000) == 0);
}
static void test_collectives_3_shm_blocked_only(void) {
    opts o = {4096, 0, 0, 256}; /* pieces smaller than the rank count, empty pieces */
    CHECK(run_group("collectives-3-shm", 3, sc_collectives, &o, -1, 60000) == 0);
}
static void test_collectives_4_shm(void) {
    opts o = {2048, 64, 0, 4096};
    CHECK(run_group("collectives-4-shm", 4, sc_collectives, &o, -1, 60000) == 0);
}

/* ------------------------------------------------------------ sub-groups */

static void sc_subgroups(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    cm_comm *w = mk(rank, 4, dir, arg);
    if (!w) return;
    int world[4] = {0, 1, 2, 3};
    int pair[2] = {rank % 2, rank % 2 + 2}; /* {0,2} and {1,3} */
    cm_comm *g = NULL;
    int rc = w->ops->split(w, pair, 2, &g);
    CHECK_MSG(rc == 0, "split: %s", co_err_detail());
    if (!g) return;
    CHECK(g->size == 2 && g->rank == rank / 2);
    check_allreduce(g, pair, 1023, CM_F32, 1);
    check_allreduce(w, world, 1023, CM_F32, 2); /* interleaved with the world */
    check_allreduce(g, pair, 5, CM_I64, 3);
    check_allgather(g, pair, 777, false);
    check_alltoallv(g, pair, 50);
    check_sendrecv_ring(g, pair, 5000);
    cm_comm *t = NULL;
    int three[3] = {3, 1, 0}; /* listed out of order: group ranks follow the list */
    if (rank != 2) {
        rc = w->ops->split(w, three, 3, &t);
        CHECK_MSG(rc == 0, "split 3: %s", co_err_detail());
        if (t) {
            CHECK(t->rank == (rank == 3 ? 0 : rank == 1 ? 1 : 2));
            check_broadcast(t, three, 10000, 0);
            check_reduce_scatter(t, three, 1001, CM_F64, false);
            check_allreduce(t, three, 2, CM_F32, 4);
        }
    } else {
        check_allreduce(g, pair, 100, CM_F64, 6); /* rank 2 alone with rank 0 meanwhile */
    }
    if (rank == 0) check_allreduce(g, pair, 100, CM_F64, 6);
    CHECK(w->ops->barrier(w, T_MS) == 0);
    /* the world can go first: sub-groups keep the sockets alive */
    cm_destroy(&w);
    CHECK(g->ops->barrier(g, T_MS) == 0);
    if (t) CHECK(t->ops->barrier(t, T_MS) == 0);
    cm_destroy(&t);
    cm_destroy(&g);
}

static void test_subgroups(void) {
    opts o = {4096, 128, 0, 512};
    CHECK(run_group("subgroups", 4, sc_subgroups, &o, -1, 60000) == 0);
    opts z = {4096, 128, 0, NO_SHM};
    CHECK(run_group("subgroups-zmq", 4, sc_subgroups, &z, -1, 60000) == 0);
}

/* ------------------------------------------------------------ determinism */

typedef struct det_arg {
    opts o;
    const char *out; /* file prefix for each rank's result hash */
} det_arg;

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static void sc_determinism(int rank, int n, const char *dir, const void *argv) {
    const det_arg *a = argv;
    cm_comm *c = mk(rank, n, dir, &a->o);
    if (!c) return;
    size_t count = 100003;
    float *x = malloc(count * 4), *y = malloc(count * 4), *z = malloc(count * 4);
    for (size_t i = 0; i < count; i++) x[i] = (float)(sin((double)(i * 13 + (size_t)rank * 7919)) * 1e3);
    memcpy(y, x, count * 4);
    memcpy(z, x, count * 4);
    CHECK(c->ops->allreduce_sum(c, y, count, CM_F32, T_MS) == 0);
    CHECK(c->ops->allreduce_sum(c, z, count, CM_F32, T_MS) == 0);
    CHECK_MSG(memcmp(y, z, count * 4) == 0, "two all-reduces of the same data differ");
    size_t far = 0;
    for (size_t i = 0; i < count; i++) {
        double ref = 0;
        for (int r = 0; r < n; r++) ref += (double)(float)(sin((double)(i * 13 + (size_t)r * 7919)) * 1e3);
        if (fabs(y[i] - ref) > 1e-3 + 1e-6 * fabs(ref)) far++;
    }
    CHECK_MSG(far == 0, "%zu elements outside the fp32 tolerance", far);
    uint64_t h[2] = {fnv(y, count * 4), 0}, all[8][2];
    float small[3] = {0.1f * (float)rank, 1e-8f, 3.3f}; /* the direct path as well */
    CHECK(c->ops->allreduce_sum(c, small, 3, CM_F32, T_MS) == 0);
    h[1] = fnv(small, sizeof small);
    CHECK(c->ops->allgather(c, h, all, sizeof h, T_MS) == 0);
    for (int r = 0; r < n; r++)
        CHECK_MSG(all[r][0] == h[0] && all[r][1] == h[1], "rank %d has other bits than rank %d", r, rank);
    char path[256];
    snprintf(path, sizeof path, "%s-%d", a->out, rank);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%016llx %016llx\n", (unsigned long long)h[0], (unsigned long long)h[1]);
        fclose(f);
    }
    free(x);
    free(y);
    free(z);
    cm_destroy(&c);
}

static void test_determinism_across_runs(void) {
    char base[] = "/tmp/cmdet-XXXXXX";
    REQUIRE(mkdtemp(base));
    char out1[64], out2[64];
    snprintf(out1, sizeof out1, "%s/a", base);
    snprintf(out2, sizeof out2, "%s/b", base);
    det_arg a1 = {{4096, 64, 0, 1024}, out1}, a2 = {{4096, 64, 0, 1024}, out2};
    CHECK(run_group("determinism-1", 3, sc_determinism, &a1, -1, 60000) == 0);
    CHECK(run_group("determinism-2", 3, sc_determinism, &a2, -1, 60000) == 0);
    for (int r = 0; r < 3; r++) {
        char p1[80], p2[80], l1[64] = "", l2[64] = "x";
        snprintf(p1, sizeof p1, "%s-%d", out1, r);
        snprintf(p2, sizeof p2, "%s-%d", out2, r);
        FILE *f1 = fopen(p1, "r"), *f2 = fopen(p2, "r");
        if (f1 && fgets(l1, sizeof l1, f1)) {
        }
        if (f2 && fgets(l2, sizeof l2, f2)) {
        }
        if (f1) fclose(f1);
        if (f2) fclose(f2);
        CHECK_MSG(strcmp(l1, l2) == 0, "rank %d: run 1 %s vs run 2 %s", r, l1, l2);
        remove(p1);
        remove(p2);
    }
    rmdir(base);
}

/* ------------------------------------------------------------ abort, death, timeouts */

typedef struct abort_ctx {
    cm_comm *c;
    int after_ms;
} abort_ctx;

static void *abort_thread(void *p) {
    abort_ctx *a = p;
    t_sleep_ms(a->after_ms);
    a->c->ops->abort(a->c);
    return NULL;
}

static void sc_abort(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    cm_comm *c = mk(rank, 3, dir, arg);
    if (!c) return;
    size_t count = (size_t)1 << 20;
    float *buf = calloc(count, 4);
    if (rank == 2) t_sleep_ms(600); /* the others block inside the all-reduce meanwhile */
    pthread_t th;
    abort_ctx a = {c, 150};
    if (rank == 0) pthread_create(&th, NULL, abort_thread, &a);
    int64_t t0 = t_now_ms();
    int rc = c->ops->allreduce_sum(c, buf, count, CM_F32, T_MS);
    int64_t dt = t_now_ms() - t0;
    if (rank == 0) {
        pthread_join(th, NULL);
        CHECK_MSG(rc == CO_EABORTED, "rank 0: %s: %s", co_err_name(rc), co_err_detail());
        CHECK_MSG(dt < 2000, "abort took %lld ms", (long long)dt);
    } else {
        /* the aborting rank tells its peers */
        CHECK_MSG(rc == CO_EREMOTE && strstr(co_err_detail(), "world rank 0") &&
                      strstr(co_err_detail(), "aborted"),
                  "rank %d: %s: %s", rank, co_err_name(rc), co_err_detail());
        CHECK_MSG(dt < 5000, "rank %d learnt of the abort after %lld ms", rank, (long long)dt);
    }
    /* the communicator stays failed, promptly */
    t0 = t_now_ms();
    rc = c->ops->barrier(c, T_MS);
    CHECK(rc == (rank == 0 ? CO_EABORTED : CO_EREMOTE));
    CHECK(t_now_ms() - t0 < 100);
    free(buf);
    cm_destroy(&c);
}

static void test_abort_mid_collective(void) {
    opts o = {65536, 1024, 0, 0}; /* shared memory, 4 blocks of 1 MiB */
    CHECK(run_group("abort", 3, sc_abort, &o, -1, 30000) == 0);
    opts z = {65536, 1024, 0, NO_SHM};
    CHECK(run_group("abort-zmq", 3, sc_abort, &z, -1, 30000) == 0);
}

static void *kill_thread(void *p) {
    t_sleep_ms(*(const int *)p);
    raise(SIGKILL);
    return NULL;
}

static void sc_killed_peer(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    cm_comm *c = mk(rank, 3, dir, arg);
    if (!c) return;
    size_t count = (size_t)1 << 20;
    float *buf = calloc(count, 4);
    static const int after = 40;
    pthread_t th;
    if (rank == 2) pthread_create(&th, NULL, kill_thread, (void *)&after);
    int rc = 0;
    int64_t t0 = 0, dt = 0;
    for (int i = 0; i < 100000 && rc == 0; i++) {
        t0 = t_now_ms();
        rc = c->ops->allreduce_sum(c, buf, count, CM_F32, 10000);
        dt = t_now_ms() - t0;
    }
    /* rank 2 never gets here */
    CHECK_MSG(rc == CO_EREMOTE && strstr(co_err_detail(), "world rank 2"), "rank %d: %s: %s", rank,
              co_err_name(rc), co_err_detail());
    CHECK_MSG(dt < 5000, "rank %d: the failing call took %lld ms", rank, (long long)dt);
    free(buf);
    cm_destroy(&c);
}

static void test_killed_peer(void) {
    opts o = {65536, 1024, 0, 0};
    CHECK(run_group("killed-peer", 3, sc_killed_peer, &o, 2, 30000) == 0);
    opts z = {65536, 1024, 0, NO_SHM};
    CHECK(run_group("killed-peer-zmq", 3, sc_killed_peer, &z, 2, 30000) == 0);
}

static void sc_timeout(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    cm_comm *c = mk(rank, 2, dir, arg);
    if (!c) return;
    double x[100] = {0};
    if (rank == 0) {
        int64_t t0 = t_now_ms();
        int rc = c->ops->allreduce_sum(c, x, 100, CM_F64, 300);
        int64_t dt = t_now_ms() - t0;
        CHECK_MSG(rc == CO_ETIMEOUT && strstr(co_err_detail(), "timed out"), "%s: %s",
                  co_err_name(rc), co_err_detail());
        CHECK_MSG(dt >= 290 && dt < 1500, "timed out after %lld ms", (long long)dt);
    } else {
        t_sleep_ms(800);
        /* rank 0's contribution is already here, so this may still succeed; the next call
         * reports rank 0's failure rather than waiting for it */
        int rc = c->ops->allreduce_sum(c, x, 100, CM_F64, T_MS);
        CHECK_MSG(rc == 0 || rc == CO_EREMOTE, "%s: %s", co_err_name(rc), co_err_detail());
        rc = c->ops->barrier(c, T_MS);
        CHECK_MSG(rc == CO_EREMOTE && strstr(co_err_detail(), "timed out"), "%s: %s",
                  co_err_name(rc), co_err_detail());
    }
    cm_destroy(&c);
}

static void test_timeout(void) {
    opts o = {4096, 1024, 0, 0};
    CHECK(run_group("timeout", 2, sc_timeout, &o, -1, 30000) == 0);
    opts z = {4096, 1024, 0, NO_SHM};
    CHECK(run_group("timeout-zmq", 2, sc_timeout, &z, -1, 30000) == 0);
}

static void sc_connect_timeout(int rank, int n, const char *dir, const void *arg) {
    (void)arg;
    if (rank != 0) return; /* rank 1 never comes */
    char e0[128], e1[128];
    snprintf(e0, sizeof e0, "ipc://%s/r0", dir);
    snprintf(e1, sizeof e1, "ipc://%s/r1", dir);
    const char *ep[2] = {e0, e1};
    cm_zmq_options o;
    cm_zmq_options_default(&o);
    o.connect_timeout_ms = 400;
    cm_comm *c = NULL;
    int64_t t0 = t_now_ms();
    int rc = cm_zmq_new(&c, 0, n, ep, &o);
    CHECK_MSG(rc == CO_ETIMEOUT && c == NULL && strstr(co_err_detail(), "ranks 1"), "%s: %s",
              co_err_name(rc), co_err_detail());
    CHECK(t_now_ms() - t0 < 2000);
    o.chunk_bytes = 100; /* not a multiple of 8 */
    CHECK(cm_zmq_new(&c, 0, n, ep, &o) == CO_EINVAL);
}

static void test_connect_timeout(void) {
    CHECK(run_group("connect-timeout", 2, sc_connect_timeout, NULL, -1, 20000) == 0);
}

/* A rank waiting in cm_zmq_new for a peer that never comes gives up once its cancel flag is
 * raised from another thread (a worker whose generation is aborted while it connects), long
 * before its connect timeout; a raised flag also refuses a new communicator at once. */
static volatile sig_atomic_t g_cancel;
static void *raise_cancel(void *arg) {
    (void)arg;
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    __atomic_store_n(&g_cancel, 1, __ATOMIC_RELEASE); /* as the worker's link raises its abort flag */
    return NULL;
}
static void sc_connect_cancel(int rank, int n, const char *dir, const void *arg) {
    (void)arg;
    if (rank != 0) return; /* rank 1 never comes */
    char e0[128], e1[128];
    snprintf(e0, sizeof e0, "ipc://%s/r0", dir);
    snprintf(e1, sizeof e1, "ipc://%s/r1", dir);
    const char *ep[2] = {e0, e1};
    cm_zmq_options o;
    cm_zmq_options_default(&o);
    o.connect_timeout_ms = 15000;
    o.cancel = &g_cancel;
    cm_comm *c = NULL;
    g_cancel = 0;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, raise_cancel, NULL) == 0);
    int64_t t0 = t_now_ms();
    int rc = cm_zmq_new(&c, 0, n, ep, &o);
    int64_t took = t_now_ms() - t0;
    pthread_join(th, NULL);
    CHECK_MSG(rc == CO_EABORTED && c == NULL, "%s: %s", co_err_name(rc), co_err_detail());
    CHECK_MSG(took >= 250 && took < 5000, "cancelled after %lld ms", (long long)took);
    t0 = t_now_ms();
    CHECK(cm_zmq_new(&c, 0, n, ep, &o) == CO_EABORTED && c == NULL); /* still raised */
    CHECK(t_now_ms() - t0 < 5000);
}

static void test_connect_cancel(void) {
    CHECK(run_group("connect-cancel", 2, sc_connect_cancel, NULL, -1, 30000) == 0);
}

static void sc_mismatch(int rank, int n, const char *dir, const void *arg) {
    (void)arg;
    /* other options on rank 1: refused at HELLO */
    char sub[200];
    snprintf(sub, sizeof sub, "%s/a", dir);
    mkdir(sub, 0700); /* whoever comes first */
    opts o = {rank == 1 ? 8192 : 4096, 64, 3000, 0};
    char eps[2][256];
    const char *ep[2];
    for (int r = 0; r < 2; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", sub, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.chunk_bytes = o.chunk;
    zo.small_bytes = o.small;
    zo.connect_timeout_ms = o.connect_ms;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &zo);
    CHECK_MSG(rc == CO_EPROTOCOL || rc == CO_EREMOTE, "options: %s: %s", co_err_name(rc), co_err_detail());
    cm_destroy(&c);
    /* mismatched calls: counts differ */
    opts same = {4096, 64, 0, 0};
    char sub2[200];
    snprintf(sub2, sizeof sub2, "%s/b", dir);
    mkdir(sub2, 0700); /* whoever comes first */
    c = mk(rank, n, sub2, &same);
    if (!c) return;
    float x[11] = {0};
    rc = c->ops->allreduce_sum(c, x, rank == 0 ? 10 : 11, CM_F32, 5000);
    CHECK_MSG(rc == CO_EPROTOCOL || rc == CO_EREMOTE, "calls: %s: %s", co_err_name(rc), co_err_detail());
    CHECK(strstr(co_err_detail(), "allreduce") != NULL);
    cm_destroy(&c);
    /* an all-to-all whose receiver expects another size than its sender sends */
    snprintf(sub2, sizeof sub2, "%s/d", dir);
    mkdir(sub2, 0700); /* whoever comes first */
    c = mk(rank, n, sub2, &same);
    if (!c) return;
    /* rank 1 sends rank 0 24 bytes, rank 0 expects 30 */
    size_t sb[2] = {4, 40}, rb[2] = {4, 30};
    if (rank == 1) sb[0] = 24, sb[1] = 4, rb[0] = 40, rb[1] = 4;
    unsigned char a2a_in[80], a2a_out[80] = {0};
    rc = c->ops->alltoallv(c, a2a_out, sb, a2a_in, rb, 5000);
    if (rank == 0)
        CHECK_MSG(rc == CO_EPROTOCOL && strstr(co_err_detail(), "alltoall") && strstr(co_err_detail(), "24"),
                  "alltoall sizes: %s: %s", co_err_name(rc), co_err_detail());
    else
        CHECK_MSG(rc == 0 || rc == CO_EREMOTE, "alltoall sizes, rank 1: %s: %s", co_err_name(rc), co_err_detail());
    cm_destroy(&c);
    /* another operation: an all-reduce through shared memory on rank 0 meets a broadcast
     * from rank 1 over ZeroMQ; rank 0 reports it at once, rank 1 learns it from rank 0 */
    snprintf(sub2, sizeof sub2, "%s/c", dir);
    mkdir(sub2, 0700); /* whoever comes first */
    c = mk(rank, n, sub2, &same);
    if (!c) return;
    int64_t t0 = t_now_ms();
    if (rank == 0) {
        rc = c->ops->allreduce_sum(c, x, 11, CM_F32, 5000);
        CHECK_MSG(rc == CO_EPROTOCOL && strstr(co_err_detail(), "broadcast") &&
                      strstr(co_err_detail(), "mismatched"),
                  "op mismatch: %s: %s", co_err_name(rc), co_err_detail());
    } else {
        rc = c->ops->broadcast(c, x, sizeof x, 1, 5000);
        CHECK(rc == 0 || rc == CO_EREMOTE);
        rc = c->ops->barrier(c, 5000);
        CHECK_MSG(rc == CO_EREMOTE && strstr(co_err_detail(), "mismatched"), "op mismatch, rank 1: %s: %s",
                  co_err_name(rc), co_err_detail());
    }
    CHECK_MSG(t_now_ms() - t0 < 3000, "op mismatch took %lld ms", (long long)(t_now_ms() - t0));
    cm_destroy(&c);
}

/* ------------------------------------------------------------ which pairs share memory */

/* Segments this process has mapped (its own and its peers'). */
static int mapped_segments(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int k = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "memfd:cohort-comm")) k++;
    fclose(f);
    return k;
}

static int leftover_shm_files(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '[.]shm$' >/dev/null", dir);
    return system(cmd) == 0;
}

static void sc_shm_all(int rank, int n, const char *dir, const void *arg) {
    cm_comm *c = mk(rank, n, dir, arg);
    if (!c) return;
    CHECK_MSG(mapped_segments() == n, "rank %d maps %d segments, want %d", rank, mapped_segments(), n);
    CHECK(c->ops->barrier(c, T_MS) == 0); /* everyone is past cm_zmq_new */
    CHECK_MSG(!leftover_shm_files(dir), "descriptor sockets left in %s", dir);
    cm_destroy(&c);
    CHECK(mapped_segments() == 0);
    opts z = {4096, 64, 0, NO_SHM};
    char sub[200];
    snprintf(sub, sizeof sub, "%s/z", dir);
    mkdir(sub, 0700); /* whoever comes first */
    c = mk(rank, n, sub, &z);
    if (!c) return;
    CHECK(mapped_segments() == 0);
    int world[4] = {0, 1, 2, 3};
    check_allreduce(c, world, 1000, CM_F32, 1);
    cm_destroy(&c);
}

/* Ranks 0 and 1 on ipc, rank 2 on tcp: only 0 and 1 share memory. The world's all-reduce
 * goes round the ring, the {0, 1} sub-group's through shared memory; both are right. */
static void sc_mixed(int rank, int n, const char *dir, const void *arg) {
    const int *port = arg;
    char eps[3][128];
    const char *ep[3];
    snprintf(eps[0], sizeof eps[0], "ipc://%s/r0", dir);
    snprintf(eps[1], sizeof eps[1], "ipc://%s/r1", dir);
    snprintf(eps[2], sizeof eps[2], "tcp://127.0.0.1:%d", *port);
    for (int r = 0; r < 3; r++) ep[r] = eps[r];
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.chunk_bytes = 4096;
    zo.small_bytes = 64;
    zo.shm_block_bytes = 1024;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &zo);
    CHECK_MSG(rc == 0, "rank %d: cm_zmq_new: %s: %s", rank, co_err_name(rc), co_err_detail());
    if (!c) return;
    CHECK_MSG(mapped_segments() == (rank < 2 ? 2 : 0), "rank %d maps %d segments", rank, mapped_segments());
    int world[3] = {0, 1, 2}, pair[2] = {0, 1};
    check_allreduce(c, world, 100003, CM_F32, 1);
    check_allreduce(c, world, 7, CM_F64, 2);
    if (rank < 2) {
        cm_comm *g = NULL;
        rc = c->ops->split(c, pair, 2, &g);
        CHECK_MSG(rc == 0, "split: %s", co_err_detail());
        if (g) {
            check_allreduce(g, pair, 100003, CM_F32, 3);
            check_allreduce(g, pair, 5, CM_I64, 4);
            cm_destroy(&g);
        }
    }
    CHECK(c->ops->barrier(c, T_MS) == 0);
    cm_destroy(&c);
}

static void test_shm_pairs(void) {
    opts o = {4096, 64, 0, 1024};
    CHECK(run_group("shm-all", 4, sc_shm_all, &o, -1, 30000) == 0);
    int s = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    REQUIRE(port > 0);
    CHECK(run_group("shm-mixed", 3, sc_mixed, &port, -1, 30000) == 0);
}

static void test_mismatch(void) {
    CHECK(run_group("mismatch", 2, sc_mismatch, NULL, -1, 30000) == 0);
}

/* cm_zmq_traffic counts what this rank sent: over ZeroMQ an all-gather of K bytes per rank
 * sends K to each of the n-1 others at least once; through shared memory a 2-rank
 * all-reduce of n floats writes the half the peer reduces plus the sums of its own half. */
static void sc_traffic(int rank, int n, const char *dir, const void *arg) {
    const opts *o = arg;
    cm_comm *c = mk(rank, n, dir, o);
    if (!c) return;
    enum { K = 40000, NF = 1 << 16 };
    static unsigned char send[K], recv[4 * K];
    static float buf[NF];
    memset(send, rank, sizeof send);
    uint64_t z0, s0, z1, s1;
    CHECK(c->ops->barrier(c, T_MS) == 0);
    cm_zmq_traffic(c, &z0, &s0);
    CHECK(c->ops->allgather(c, send, recv, K, T_MS) == 0);
    cm_zmq_traffic(c, &z1, &s1);
    uint64_t want = (uint64_t)K * (uint64_t)(n - 1);
    CHECK_MSG(z1 - z0 >= want && z1 - z0 <= want + 4096, "rank %d: all-gather sent %llu bytes over ZeroMQ, want %llu",
              rank, (unsigned long long)(z1 - z0), (unsigned long long)want);
    CHECK(recv[(size_t)((rank + 1) % n) * K] == (unsigned char)((rank + 1) % n));
    if (o->shm != NO_SHM) {
        for (int i = 0; i < NF; i++) buf[i] = (float)(i % 5);
        CHECK(c->ops->allreduce_sum(c, buf, NF, CM_F32, T_MS) == 0);
        uint64_t z2, s2;
        cm_zmq_traffic(c, &z2, &s2);
        CHECK_MSG(s2 - s1 == (uint64_t)NF * sizeof(float), "rank %d: shared-memory all-reduce wrote %llu bytes, want %zu",
                  rank, (unsigned long long)(s2 - s1), (size_t)NF * sizeof(float));
        CHECK(buf[7] == (float)(7 % 5) * n);
    }
    cm_destroy(&c);
}

static void test_traffic(void) {
    opts z = {4096, 256, 0, NO_SHM}, m = {4096, 256, 0, 0};
    CHECK(run_group("traffic-zmq", 3, sc_traffic, &z, -1, 60000) == 0);
    CHECK(run_group("traffic-shm", 2, sc_traffic, &m, -1, 60000) == 0);
}

int main(void) {
    RUN(test_traffic);
    RUN(test_collectives_2);
    RUN(test_collectives_3_ring_only);
    RUN(test_collectives_4);
    RUN(test_collectives_2_shm);
    RUN(test_collectives_3_shm_blocked_only);
    RUN(test_collectives_4_shm);
    RUN(test_subgroups);
    RUN(test_shm_pairs);
    RUN(test_determinism_across_runs);
    RUN(test_abort_mid_collective);
    RUN(test_killed_peer);
    RUN(test_timeout);
    RUN(test_connect_timeout);
    RUN(test_connect_cancel);
    RUN(test_mismatch);
    return TEST_EXIT();
}
