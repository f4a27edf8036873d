/* test_grad_transport.c - the gradient group's own transport of --overlap-grad-reduce
 * (worker/comms.c wk_comms_open_grad) on forked ranks over ipc: a data-parallel group of 2
 * (tensor 2 x data 2, 4 ranks) opened again beside the world, the trainer's groups naming it,
 * all-reduces on it from a second thread while the main thread all-reduces on the tensor group
 * of the world's transport (each transport used by one thread), the sums exact; the link's
 * abort (wk_comms_abort) failing a collective blocked on it; the worker's cancel flag
 * ending its connection wait when a peer never connects; and with expert parallelism (data 4
 * x expert 2) the expert-data-parallel group's own transport (wk_comms_open_expert_grad)
 * beside the gradient group's and the expert group's, the same way. */
#include "common/error.h"
#include "tests/test.h"
#include "tests/fork_ranks.h"
#include "worker/comms.h"

#include <pthread.h>
#include <signal.h>

#define T_MS 20000
#define N 4096

const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "called_from_lib:libzmq.so.5\nrace:libzmq.so.5\n"; }

/* The assignment of rank r in a tensor 2 x data 2 world with endpoints in dir. */
static void assignment(sv_assignment *a, char (*eps)[128], char **ep, int r, const char *dir) {
    memset(a, 0, sizeof *a);
    a->rank = r;
    a->world = 4;
    a->tp = 2;
    a->pp = a->cp = a->ep = 1;
    a->etp = 2;
    a->dp = 2;
    for (int i = 0; i < 4; i++) {
        snprintf(eps[i], 128, "ipc://%s/r%d", dir, i);
        ep[i] = eps[i];
    }
    a->endpoints = ep;
}

static void options(cm_zmq_options *zo, const volatile sig_atomic_t *cancel) {
    cm_zmq_options_default(zo);
    zo->connect_timeout_ms = T_MS;
    zo->linger_ms = 500;
    zo->cancel = cancel;
}

typedef struct sums {
    cm_comm *g;
    float *buf;
    int rc;
} sums;

static void *sum_many(void *arg) {
    sums *s = arg;
    for (int k = 0; k < 20 && !s->rc; k++) s->rc = s->g->ops->allreduce_sum(s->g, s->buf, N, CM_F32, T_MS);
    return NULL;
}

/* Both transports at once, from two threads; then the abort reaches the second one. */
static void concurrent(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    (void)arg;
    sv_assignment a;
    char eps[4][128], *ep[4];
    assignment(&a, eps, ep, rank, dir);
    cm_zmq_options zo;
    options(&zo, NULL);
    wk_comms *cs = NULL;
    int rc = wk_comms_new(&cs, &a, &zo);
    REQUIRE_MSG(rc == 0, "rank %d: %s", rank, co_err_detail());
    rc = wk_comms_open_grad(cs, &a, &zo, TOPO_G_DP, 0);
    REQUIRE_MSG(rc == 0, "rank %d: %s", rank, co_err_detail());
    co_config c;
    co_config_defaults(&c);
    c.tensor_model_parallel_size = 2;
    tr_groups g;
    wk_comms_trainer_groups(cs, &c, &g);
    cm_comm *dp = wk_comms_group(cs, TOPO_G_DP), *tp = g.tp;
    REQUIRE(g.grad_ovl && dp && tp);
    CHECK(g.grad_ovl != dp && g.grad_ovl->size == 2 && g.grad_ovl->rank == dp->rank);
    /* the data-parallel sum on the own transport beside the tensor group's on the world's */
    static float gb[N], tb[N];
    for (int i = 0; i < N; i++) gb[i] = tb[i] = 1.0f;
    sums s = {.g = g.grad_ovl, .buf = gb};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, sum_many, &s) == 0);
    for (int k = 0; k < 20 && !rc; k++) rc = tp->ops->allreduce_sum(tp, tb, N, CM_F32, T_MS);
    pthread_join(th, NULL);
    CHECK_MSG(rc == 0 && s.rc == 0, "rank %d: %d %d: %s", rank, rc, s.rc, co_err_detail());
    CHECK(gb[0] == 1048576.0f && gb[N - 1] == 1048576.0f && tb[7] == 1048576.0f); /* 2^20 each */
    /* rank 0's link aborts its set: its blocked sum on the own transport fails, and so does
     * its peer's (told, or waiting for it) */
    if (rank == 0) {
        t_sleep_ms(200);
        wk_comms_abort(cs);
    }
    int64_t t0 = t_now_ms();
    rc = g.grad_ovl->ops->allreduce_sum(g.grad_ovl, gb, N, CM_F32, rank == 0 ? T_MS : 3000);
    if (rank == 0) CHECK_MSG(rc == CO_EABORTED, "rank 0 after the abort: %s", co_err_name(rc));
    if (rank == 2) CHECK_MSG(rc != 0, "rank 2: its peer aborted, yet the sum returned 0");
    CHECK_MSG(t_now_ms() - t0 < 5000, "rank %d: the abort took %lld ms", rank, (long long)(t_now_ms() - t0));
    wk_comms_destroy(&cs);
}

static volatile sig_atomic_t cancel_flag;
static void *raise_cancel(void *arg) {
    (void)arg;
    t_sleep_ms(300);
    __atomic_store_n(&cancel_flag, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Rank 2 never opens the second transport: rank 0's connection wait ends on the cancel
 * flag, long before its timeout. */
static void cancelled(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    (void)arg;
    sv_assignment a;
    char eps[4][128], *ep[4];
    assignment(&a, eps, ep, rank, dir);
    cm_zmq_options zo;
    options(&zo, &cancel_flag);
    wk_comms *cs = NULL;
    int rc = wk_comms_new(&cs, &a, &zo);
    REQUIRE_MSG(rc == 0, "rank %d: %s", rank, co_err_detail());
    if (rank == 0) {
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, raise_cancel, NULL) == 0);
        int64_t t0 = t_now_ms();
        rc = wk_comms_open_grad(cs, &a, &zo, TOPO_G_DP, 0);
        pthread_join(th, NULL);
        CHECK_MSG(rc == CO_EABORTED, "rank 0: %s (%s)", co_err_name(rc), co_err_detail());
        CHECK_MSG(strstr(co_err_detail(), "own transport (--overlap-grad-reduce)"), "%s", co_err_detail());
        CHECK_MSG(t_now_ms() - t0 < 5000, "the cancel took %lld ms", (long long)(t_now_ms() - t0));
    }
    /* (rank 2, in rank 0's data-parallel group, opens nothing; ranks 1 and 3 neither) */
    wk_comms_destroy(&cs);
}

/* Data 4 x expert 2: the expert-data-parallel pairs over a transport of their own, used from
 * a second thread while the main thread sums over the expert group on the world's. */
static void experts(int rank, int n, const char *dir, const void *arg) {
    (void)n;
    (void)arg;
    sv_assignment a;
    char eps[4][128], *ep[4];
    assignment(&a, eps, ep, rank, dir);
    a.tp = a.etp = 1;
    a.ep = 2;
    a.dp = 4;
    cm_zmq_options zo;
    options(&zo, NULL);
    wk_comms *cs = NULL;
    int rc = wk_comms_new(&cs, &a, &zo);
    REQUIRE_MSG(rc == 0, "rank %d: %s", rank, co_err_detail());
    rc = wk_comms_open_grad(cs, &a, &zo, TOPO_G_DP, 4);
    if (!rc) rc = wk_comms_open_expert_grad(cs, &a, &zo, 4);
    REQUIRE_MSG(rc == 0, "rank %d: %s", rank, co_err_detail());
    co_config c;
    co_config_defaults(&c);
    c.num_experts = 2;
    c.expert_model_parallel_size = 2;
    tr_groups g;
    wk_comms_trainer_groups(cs, &c, &g);
    REQUIRE(g.grad_ovl && g.edp_ovl && g.edp && g.ep);
    CHECK(g.edp_ovl != g.edp && g.edp_ovl != g.grad_ovl && g.edp_ovl->size == 2 && g.edp_ovl->rank == g.edp->rank);
    CHECK(g.grad_ovl->size == 4);
    static float eb[N], xb[N];
    for (int i = 0; i < N; i++) eb[i] = xb[i] = 1.0f;
    sums s = {.g = g.edp_ovl, .buf = eb};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, sum_many, &s) == 0);
    for (int k = 0; k < 20 && !rc; k++) rc = g.ep->ops->allreduce_sum(g.ep, xb, N, CM_F32, T_MS);
    pthread_join(th, NULL);
    CHECK_MSG(rc == 0 && s.rc == 0, "rank %d: %d %d: %s", rank, rc, s.rc, co_err_detail());
    CHECK(eb[0] == 1048576.0f && eb[N - 1] == 1048576.0f && xb[7] == 1048576.0f); /* 2^20 each */
    /* the link's abort reaches it too */
    if (rank == 0) {
        t_sleep_ms(200);
        wk_comms_abort(cs);
    }
    int64_t t0 = t_now_ms();
    rc = g.edp_ovl->ops->allreduce_sum(g.edp_ovl, eb, N, CM_F32, rank == 0 ? T_MS : 3000);
    if (rank == 0) CHECK_MSG(rc == CO_EABORTED, "rank 0 after the abort: %s", co_err_name(rc));
    CHECK_MSG(t_now_ms() - t0 < 5000, "rank %d: the abort took %lld ms", rank, (long long)(t_now_ms() - t0));
    wk_comms_destroy(&cs);
}

static void grad_transport(void) { CHECK(t_fork_ranks("concurrent", "gradtp", 4, concurrent, NULL, -1, 60000) == 0); }
static void grad_transport_cancel(void) {
    CHECK(t_fork_ranks("cancelled", "gradtp", 4, cancelled, NULL, -1, 60000) == 0);
}

static void grad_transport_experts(void) {
    CHECK(t_fork_ranks("experts", "gradtp", 4, experts, NULL, -1, 60000) == 0);
}

int main(void) {
    RUN(grad_transport);
    RUN(grad_transport_cancel);
    RUN(grad_transport_experts);
    return TEST_EXIT();
}
