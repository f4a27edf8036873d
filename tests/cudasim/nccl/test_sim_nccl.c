/* test_sim_nccl.c - the NCCL stand-in (tests/cudasim/nccl) on its own, with the weak stream
 * hook (every operation runs in the call): forked ranks meet through a unique id made by the
 * parent, and every operation is checked bitwise against a direct computation in rank order
 * (odd counts, counts past one round's slot, several types and reductions); a group of sends
 * and receives around a ring (and one whose send and receive share memory, refused); a split into two colors and one with NCCL_SPLIT_NOCOLOR; an
 * abort from another thread ending a collective in progress on every rank; a rank killed in
 * the middle of an operation; non-blocking init; and no segment left in /dev/shm. */
#include "tests/test.h"

#include "tests/fork_ranks.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#define ID_NAME(id) ((id)->internal + 16) /* the segment name after the stand-in's magic */

static ncclComm_t join(int rank, int n, const ncclUniqueId *id) {
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, n, *id, rank);
    if (r != ncclSuccess) fprintf(stderr, "rank %d: init: %s: %s\n", rank, ncclGetErrorString(r), ncclGetLastError(NULL));
    return c;
}

/* the segment an id names is gone from /dev/shm */
static bool seg_gone(const ncclUniqueId *id) {
    int fd = shm_open(ID_NAME(id), O_RDONLY, 0);
    if (fd >= 0) close(fd);
    return fd < 0 && errno == ENOENT;
}

static int fork_ranks(const char *name, int n, t_rank_fn fn, const ncclUniqueId *id, int expect_kill) {
    return t_fork_ranks(name, "sim-nccl", n, fn, id, expect_kill, 20000);
}

/* ---- collectives against a direct computation ---- */

/* the value rank r holds at i: small integers in [1, 3] (exact in every type, also as
 * products over 4 ranks) or, for f32/f64, fractions whose sums round */
static double val(int r, size_t i, bool frac) {
    uint64_t h = t_mix((uint64_t)r * 1000003u + i);
    return frac ? (double)(h % 2001) / 7.0 - 140.0 : (double)(1 + h % 3);
}

static uint16_t to_bf16(float f) { /* exact values only */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f) { /* exact normal values only */
    if (f == 0) return 0;
    int e;
    float m = frexpf(fabsf(f), &e); /* |f| = m * 2^e, m in [0.5, 1) */
    uint16_t bits = (uint16_t)((e - 1 + 15) << 10 | (uint16_t)((m * 2 - 1) * 1024));
    return f < 0 ? (uint16_t)(bits | 0x8000) : bits;
}

/* fills buf (count elements of t) with rank r's values */
static void fill(void *buf, ncclDataType_t t, int r, size_t count, size_t at) {
    for (size_t i = 0; i < count; i++) {
        bool frac = t == ncclFloat32 || t == ncclFloat64;
        double v = val(r, at + i, frac);
        switch (t) {
        case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)(v * 37); break;
        case ncclInt32: ((int32_t *)buf)[i] = (int32_t)(v * 1000) - 1999; break;
        case ncclInt64: ((int64_t *)buf)[i] = ((int64_t)v << 40) - 3; break;
        case ncclFloat32: ((float *)buf)[i] = (float)v; break;
        case ncclFloat64: ((double *)buf)[i] = v; break;
        case ncclBfloat16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
        case ncclFloat16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
        default: break;
        }
    }
}

/* U: integer sums and products wrap (in the unsigned type of the same width), as on a GPU */
#define COMBINE(a, v, op, U)                                                                       \
    ((op) == ncclProd  ? (U)(a) * (U)(v)                                                           \
     : (op) == ncclMax ? (U)((v) > (a) ? (v) : (a))                                                \
     : (op) == ncclMin ? (U)((v) < (a) ? (v) : (a))                                                \
                       : (U)(a) + (U)(v))

/* element i of the reduction over n ranks, in rank order (as the stand-in promises) */
static void expect(void *out, ncclDataType_t t, ncclRedOp_t op, int n, size_t i) {
    uint8_t raw[8];
#define RED(T, U)                                                                                  \
    do {                                                                                           \
        T a = 0;                                                                                   \
        for (int r = 0; r < n; r++) {                                                              \
            fill(raw, t, r, 1, i);                                                                 \
            T v;                                                                                   \
            memcpy(&v, raw, sizeof v);                                                             \
            a = r == 0 ? v : (T)COMBINE(a, v, op, U);                                              \
        }                                                                                          \
        if (op == ncclAvg) a = (T)(a / (T)n);                                                      \
        memcpy(out, &a, sizeof a);                                                                 \
    } while (0)
    switch (t) {
    case ncclUint8: RED(uint8_t, uint32_t); break;
    case ncclInt32: RED(int32_t, uint32_t); break;
    case ncclInt64: RED(int64_t, uint64_t); break;
    case ncclFloat32: RED(float, float); break;
    case ncclFloat64: RED(double, double); break;
    case ncclBfloat16:
    case ncclFloat16: {
        float a = 0; /* exact in float and in the 16-bit type at every step */
        for (int r = 0; r < n; r++)
            a = r == 0 ? (float)val(r, i, false) : COMBINE(a, (float)val(r, i, false), op, float);
        if (op == ncclAvg) a /= (float)n;
        uint16_t h = t == ncclBfloat16 ? to_bf16(a) : to_f16(a);
        memcpy(out, &h, 2);
        break;
    }
    default: break;
    }
#undef RED
}

static size_t tsize(ncclDataType_t t) {
    return t == ncclUint8 ? 1 : t == ncclBfloat16 || t == ncclFloat16 ? 2 : t == ncclInt32 || t == ncclFloat32 ? 4 : 8;
}

static const ncclDataType_t types[] = {ncclUint8, ncclInt32, ncclInt64, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16};
static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

/* an all-reduce of count elements of type t with op (in place or not), every element checked */
static void allreduce_case(ncclComm_t c, int rank, int n, ncclDataType_t t, ncclRedOp_t op, size_t count, bool inplace) {
    size_t es = tsize(t);
    uint8_t *in = malloc(count * es), *out = malloc(count * es), want[8] = {0};
    fill(in, t, rank, count, 0);
    ncclResult_t r = ncclAllReduce(in, inplace ? in : out, count, t, op, c, NULL);
    CHECK_MSG(r == ncclSuccess, "all-reduce type %d op %d: %s", (int)t, (int)op, ncclGetLastError(c));
    const uint8_t *res = inplace ? in : out;
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        expect(want, t, op, n, i);
        if (memcmp(res + i * es, want, es)) bad++;
    }
    CHECK_MSG(bad == 0, "all-reduce type %d op %d count %zu: %zu elements differ", (int)t, (int)op, count, bad);
    free(in);
    free(out);
}

/* broadcast, all-gather and reduce-scatter (in place and not, past one round), and
 * arguments refused at the call */
static void other_collectives(ncclComm_t c, int rank, int n) {
    size_t bad = 0;
    /* broadcast from rank 2: in place and out of place, past one round */
    size_t bn = 100003;
    float *b = malloc(bn * sizeof *b), *b2 = malloc(bn * sizeof *b2);
    for (size_t i = 0; i < bn; i++) b[i] = rank == 2 ? (float)val(2, i, true) : -1.0f;
    CHECK(ncclBroadcast(b, b, bn, ncclFloat32, 2, c, NULL) == ncclSuccess);
    CHECK(ncclBroadcast(b, b2, bn, ncclFloat32, 2, c, NULL) == ncclSuccess);
    for (size_t i = 0; i < bn; i++) bad += b[i] != (float)val(2, i, true) || b2[i] != b[i];
    CHECK_MSG(bad == 0, "broadcast: %zu elements differ", bad);
    /* all-gather: 33333 int32 per rank, and an in-place one of 5 */
    size_t gn = 33333;
    int32_t *g = malloc(gn * sizeof *g), *ga = malloc((size_t)n * gn * sizeof *ga);
    fill(g, ncclInt32, rank, gn, 0);
    CHECK(ncclAllGather(g, ga, gn, ncclInt32, c, NULL) == ncclSuccess);
    bad = 0;
    for (int r = 0; r < n; r++) {
        fill(g, ncclInt32, r, gn, 0);
        bad += memcmp(ga + (size_t)r * gn, g, gn * sizeof *g) != 0;
    }
    CHECK_MSG(bad == 0, "all-gather: %zu blocks differ", bad);
    double gd[4 * 5];
    fill(gd + rank * 5, ncclFloat64, rank, 5, 100);
    CHECK(ncclAllGather(gd + rank * 5, gd, 5, ncclFloat64, c, NULL) == ncclSuccess);
    for (int r = 0; r < n; r++) CHECK(gd[r * 5 + 4] == val(r, 104, true));
    /* reduce-scatter: 40000 floats per rank (rounds cross the ranks' blocks), 9 doubles in place */
    size_t rn = 40000;
    float *rs = malloc((size_t)n * rn * sizeof *rs), *rr = malloc(rn * sizeof *rr);
    fill(rs, ncclFloat32, rank, (size_t)n * rn, 0);
    CHECK(ncclReduceScatter(rs, rr, rn, ncclFloat32, ncclSum, c, NULL) == ncclSuccess);
    bad = 0;
    for (size_t i = 0; i < rn; i++) {
        float want;
        expect(&want, ncclFloat32, ncclSum, n, (size_t)rank * rn + i);
        bad += memcmp(&want, &rr[i], 4) != 0;
    }
    CHECK_MSG(bad == 0, "reduce-scatter: %zu elements differ", bad);
    double rd[4 * 9];
    fill(rd, ncclFloat64, rank, (size_t)n * 9, 0);
    CHECK(ncclReduceScatter(rd, rd + rank * 9, 9, ncclFloat64, ncclMax, c, NULL) == ncclSuccess);
    for (int i = 0; i < 9; i++) {
        double want;
        expect(&want, ncclFloat64, ncclMax, n, (size_t)rank * 9 + (size_t)i);
        CHECK(rd[rank * 9 + i] == want);
    }
    /* bad arguments are refused at the call */
    CHECK(ncclAllReduce(g, g, 1, ncclFloat8e4m3, ncclSum, c, NULL) == ncclInvalidArgument);
    CHECK(ncclBroadcast(g, g, 1, ncclInt32, n, c, NULL) == ncclInvalidArgument);
    free(b), free(b2), free(g), free(ga), free(rs), free(rr);
}

static void rank_collectives(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclComm_t c = join(rank, n, arg);
    REQUIRE(c);
    int cnt = -1, me = -1;
    CHECK(ncclCommCount(c, &cnt) == ncclSuccess && cnt == n);
    CHECK(ncclCommUserRank(c, &me) == ncclSuccess && me == rank);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t oi = 0; oi < sizeof ops / sizeof *ops; oi++) allreduce_case(c, rank, n, types[ti], ops[oi], 7, oi % 2);
    allreduce_case(c, rank, n, ncclFloat32, ncclSum, 70001, false); /* two rounds of the slot */
    allreduce_case(c, rank, n, ncclBfloat16, ncclAvg, 150001, true);
    other_collectives(c, rank, n);
    CHECK(ncclCommFinalize(c) == ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
}

static void test_collectives(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("collectives", 4, rank_collectives, &id, -1) == 0);
    CHECK(seg_gone(&id));
}

/* ---- a ring of sends and receives in one group ---- */

static void rank_ring(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclComm_t c = join(rank, n, arg);
    REQUIRE(c);
    size_t len = 200001; /* several channel chunks */
    uint8_t *s = malloc(len), *r = malloc(len), small = (uint8_t)(rank + 100), got = 0;
    for (size_t i = 0; i < len; i++) s[i] = (uint8_t)(t_mix((uint64_t)rank * 7919 + i));
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(s, len, ncclUint8, next, c, NULL) == ncclSuccess);
    CHECK(ncclSend(&small, 1, ncclUint8, next, c, NULL) == ncclSuccess); /* arrives second */
    CHECK(ncclRecv(r, len, ncclUint8, prev, c, NULL) == ncclSuccess);
    CHECK(ncclRecv(&got, 1, ncclUint8, prev, c, NULL) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < len; i++) bad += r[i] != (uint8_t)(t_mix((uint64_t)prev * 7919 + i));
    CHECK_MSG(bad == 0, "ring: %zu bytes differ", bad);
    CHECK(got == (uint8_t)(prev + 100));
    /* a send and a receive of one group on overlapping memory: refused, nothing queued */
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(s, 64, ncclUint8, next, c, NULL) == ncclSuccess);
    CHECK(ncclRecv(s + 32, 64, ncclUint8, prev, c, NULL) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(NULL), "share memory") != NULL);
    /* sizes that do not match: the receiver is told */
    if (rank < 2) {
        uint8_t buf[12] = {0};
        ncclResult_t e = rank == 0 ? ncclSend(buf, 10, ncclUint8, 1, c, NULL) : ncclRecv(buf, 12, ncclUint8, 0, c, NULL);
        CHECK_MSG(rank == 0 ? e == ncclSuccess : e == ncclInvalidUsage, "rank %d: %s", rank, ncclGetErrorString(e));
    }
    free(s), free(r);
    ncclCommDestroy(c);
}

static void test_group_ring(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("ring", 3, rank_ring, &id, -1) == 0);
    CHECK(seg_gone(&id));
}

/* ---- split ---- */

static void rank_split(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclComm_t c = join(rank, n, arg), s = NULL;
    REQUIRE(c);
    /* two colors, each ordered by a key that reverses the parent's order */
    CHECK(ncclCommSplit(c, rank % 2, -rank, &s, NULL) == ncclSuccess);
    REQUIRE(s);
    int sn = 0, sr = -1;
    ncclCommCount(s, &sn);
    ncclCommUserRank(s, &sr);
    CHECK(sn == 2 && sr == (rank < 2 ? 1 : 0));
    int64_t v = 1 << rank, sum = 0;
    CHECK(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, s, NULL) == ncclSuccess);
    CHECK_MSG(sum == (rank % 2 ? 2 + 8 : 1 + 4), "rank %d: split sum %lld", rank, (long long)sum);
    ncclCommDestroy(s);
    /* rank 3 stays out; the others form one communicator in the parent's order */
    s = (ncclComm_t)&s; /* must be set to NULL */
    CHECK(ncclCommSplit(c, rank == 3 ? NCCL_SPLIT_NOCOLOR : 7, 0, &s, NULL) == ncclSuccess);
    if (rank == 3) CHECK(s == NULL);
    else {
        REQUIRE(s);
        ncclCommCount(s, &sn);
        ncclCommUserRank(s, &sr);
        CHECK(sn == 3 && sr == rank);
        float f = (float)rank, m = 0;
        ncclResult_t r = ncclAllReduce(&f, &m, 1, ncclFloat32, ncclMax, s, NULL);
        CHECK_MSG(r == ncclSuccess && m == 2.0f, "rank %d: %s (%s), max %g", rank, ncclGetErrorString(r),
                  ncclGetLastError(s), (double)m);
        ncclCommDestroy(s);
    }
    /* the parent still works after its splits */
    int32_t one = 1, all = 0;
    CHECK(ncclAllReduce(&one, &all, 1, ncclInt32, ncclSum, c, NULL) == ncclSuccess && all == n);
    ncclCommDestroy(c);
}

static void test_split(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("split", 4, rank_split, &id, -1) == 0);
    CHECK(seg_gone(&id));
}

/* ---- abort of a collective in progress ---- */

typedef struct later {
    ncclComm_t c;
    int ms;
} later;

static void *abort_later(void *p) {
    later *l = p;
    t_sleep_ms(l->ms);
    ncclCommAbort(l->c);
    return NULL;
}

static void *kill_later(void *p) {
    t_sleep_ms(((later *)p)->ms);
    raise(SIGKILL);
    return NULL;
}

/* rank 0 aborts from a thread 200 ms into an all-reduce that rank 2 never joins (it waits
 * on a receive from rank 0 instead): every rank's call ends in an error within 3 s */
static void rank_abort(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclComm_t c = join(rank, n, arg);
    REQUIRE(c);
    float x[5] = {1, 2, 3, 4, 5};
    pthread_t th;
    later l = {c, 200};
    if (rank == 0) pthread_create(&th, NULL, abort_later, &l);
    int64_t t0 = t_now_ms();
    ncclResult_t r = rank == 2 ? ncclRecv(x, 5, ncclFloat32, 0, c, NULL) : ncclAllReduce(x, x, 5, ncclFloat32, ncclSum, c, NULL);
    int64_t dt = t_now_ms() - t0;
    CHECK_MSG(r != ncclSuccess, "rank %d: the operation succeeded", rank);
    CHECK_MSG(dt < 3000, "rank %d: the abort took %lld ms", rank, (long long)dt);
    if (rank == 0) {
        pthread_join(th, NULL);
        CHECK(r == ncclSystemError); /* its own abort */
        return;
    }
    ncclResult_t st = ncclSuccess;
    CHECK(ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclRemoteError);
    CHECK(r == ncclRemoteError);
    CHECK(ncclAllReduce(x, x, 5, ncclFloat32, ncclSum, c, NULL) == ncclRemoteError); /* sticky */
    ncclCommAbort(c);
}

static void test_abort(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("abort", 3, rank_abort, &id, -1) == 0);
    CHECK(seg_gone(&id));
}

/* rank 2 is killed (SIGKILL) 150 ms into a receive that never completes; the others'
 * all-reduce waits on it and ends in ncclRemoteError, not a hang */
static void rank_killed(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclComm_t c = join(rank, n, arg);
    REQUIRE(c);
    double x[3] = {1, 2, 3};
    if (rank == 2) {
        pthread_t th;
        later l = {c, 150};
        pthread_create(&th, NULL, kill_later, &l);
        ncclRecv(x, 3, ncclFloat64, 0, c, NULL);
        CHECK_MSG(false, "rank 2 survived its SIGKILL");
        return;
    }
    int64_t t0 = t_now_ms();
    ncclResult_t r = ncclAllReduce(x, x, 3, ncclFloat64, ncclSum, c, NULL);
    int64_t dt = t_now_ms() - t0;
    CHECK_MSG(r == ncclRemoteError, "rank %d: %s", rank, ncclGetErrorString(r));
    CHECK_MSG(dt < 3000, "rank %d: noticing the death took %lld ms", rank, (long long)dt);
    CHECK(strstr(ncclGetLastError(c), "died") != NULL);
    ncclCommAbort(c);
}

static void test_killed_peer(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("killed", 3, rank_killed, &id, 2) == 0);
    CHECK(seg_gone(&id));
}

/* ---- non-blocking init ---- */

static ncclResult_t settle(ncclComm_t c, int ms) {
    ncclResult_t st = ncclInProgress;
    int64_t dl = t_now_ms() + ms;
    while (ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclInProgress && t_now_ms() < dl) t_sleep_ms(1);
    return st;
}

static void rank_nonblocking(int rank, int n, const char *dir, const void *arg) {
    (void)dir;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = NULL;
    CHECK(ncclCommInitRankConfig(&c, n, *(const ncclUniqueId *)arg, rank, &cfg) == ncclInProgress);
    REQUIRE(c);
    CHECK(settle(c, 5000) == ncclSuccess);
    int32_t v = rank + 1, s = 0;
    CHECK(ncclAllReduce(&v, &s, 1, ncclInt32, ncclSum, c, NULL) == ncclSuccess);
    CHECK(s == n * (n + 1) / 2);
    /* a non-blocking split reports through both communicators */
    ncclComm_t k = NULL;
    ncclResult_t r = ncclCommSplit(c, 0, rank, &k, NULL);
    CHECK(r == ncclInProgress);
    CHECK(settle(c, 5000) == ncclSuccess);
    REQUIRE(k);
    CHECK(settle(k, 5000) == ncclSuccess);
    r = ncclAllReduce(&v, &s, 1, ncclInt32, ncclMax, k, NULL);
    CHECK_MSG(r == ncclSuccess && s == n, "rank %d: %s (%s), max %d", rank, ncclGetErrorString(r), ncclGetLastError(k),
              (int)s);
    ncclCommDestroy(k);
    r = ncclCommFinalize(c);
    CHECK(r == ncclSuccess || r == ncclInProgress);
    CHECK(settle(c, 5000) == ncclSuccess);
    ncclCommDestroy(c);
}

static void test_nonblocking_init(void) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    CHECK(fork_ranks("nonblocking", 3, rank_nonblocking, &id, -1) == 0);
    CHECK(seg_gone(&id));
    /* a world whose second rank never comes: in progress until aborted, then gone */
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = NULL;
    CHECK(ncclCommInitRankConfig(&c, 2, id, 0, &cfg) == ncclInProgress);
    REQUIRE(c);
    CHECK(settle(c, 150) == ncclInProgress);
    CHECK(!seg_gone(&id)); /* the segment exists while it waits */
    int64_t t0 = t_now_ms();
    CHECK(ncclCommAbort(c) == ncclSuccess);
    CHECK(t_now_ms() - t0 < 1000);
    int64_t dl = t_now_ms() + 2000; /* the init thread lets go of it within a few ms */
    while (!seg_gone(&id) && t_now_ms() < dl) t_sleep_ms(2);
    CHECK(seg_gone(&id));
    /* and an id from elsewhere is refused */
    ncclUniqueId junk;
    memset(&junk, 7, sizeof junk);
    CHECK(ncclCommInitRank(&c, 1, junk, 0) == ncclInvalidArgument);
}

int main(void) {
    setenv("COHORT_SIM_NCCL_TIMEOUT_MS", "10000", 1);
    RUN(test_collectives);
    RUN(test_group_ring);
    RUN(test_split);
    RUN(test_abort);
    RUN(test_killed_peer);
    RUN(test_nonblocking_init);
    return TEST_EXIT();
}
