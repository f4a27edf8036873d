/* test_gpu_nccl.c - the NCCL communicator on one GPU: a 1-rank communicator's collectives
 * (device and host buffers), abort from another thread in the middle of a collective and
 * during an initialisation that can never complete, then a rebuilt communicator that works.
 * Exits 77 without a GPU. */
#include "tests/gpu/gpu_util.h"

#include "comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cm_comm *one_rank(void) {
    uint8_t id[128];
    if (cm_nccl_get_unique_id(id)) {
        fprintf(stderr, "unique id: %s\n", co_err_detail());
        return NULL;
    }
    cm_comm *c = NULL;
    int rc = cm_nccl_new(&c, 0, 1, id, 0, NULL);
    if (rc) fprintf(stderr, "cm_nccl_new: %s (%s)\n", co_err_detail(), co_err_name(rc));
    return c;
}

static void test_collectives(void) {
    cm_comm *c = one_rank();
    REQUIRE(c);
    CHECK(c->rank == 0 && c->size == 1);
    enum { N = 1000 };
    float h[N], *d = NULL;
    for (int i = 0; i < N; i++) h[i] = gu_uniform();
    REQUIRE(cudaMalloc((void **)&d, sizeof h) == cudaSuccess);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    CHECK(c->ops->allreduce_sum(c, d, N, CM_F32, 10000) == 0);
    float back[N];
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    GU_EQUAL("all-reduce (device buffer, 1 rank)", back, h, sizeof h);
    double hd[4] = {1.5, -2.25, 3.0, 1e300};
    double hd0[4];
    memcpy(hd0, hd, sizeof hd);
    CHECK(c->ops->allreduce_sum(c, hd, 4, CM_F64, 10000) == 0); /* host buffer: staged */
    GU_EQUAL("all-reduce (host buffer)", hd, hd0, sizeof hd);
    int64_t hi[3] = {1, -7, 1ll << 40};
    CHECK(c->ops->allreduce_sum(c, hi, 3, CM_I64, 10000) == 0);
    CHECK(hi[0] == 1 && hi[1] == -7 && hi[2] == 1ll << 40);
    CHECK(c->ops->broadcast(c, d, sizeof h, 0, 10000) == 0);
    float g[N];
    CHECK(c->ops->allgather(c, h, g, sizeof h, 10000) == 0);
    GU_EQUAL("all-gather (host)", g, h, sizeof h);
    CHECK(c->ops->reduce_scatter_sum(c, h, g, N, CM_F32, 10000) == 0);
    GU_EQUAL("reduce-scatter (host)", g, h, sizeof h);
    size_t a2a_bytes[1] = {sizeof h};
    memset(g, 0, sizeof g);
    CHECK(c->ops->alltoallv(c, h, a2a_bytes, g, a2a_bytes, 10000) == 0);
    GU_EQUAL("all-to-all (host, own block)", g, h, sizeof h);
    size_t wrong_bytes[1] = {sizeof h - 4};
    CHECK(c->ops->alltoallv(c, h, a2a_bytes, g, wrong_bytes, 10000) == CO_EINVAL);
    CHECK(c->ops->barrier(c, 10000) == 0);
    cm_comm *s = NULL;
    int ranks[1] = {0};
    CHECK(c->ops->split(c, ranks, 1, &s) == 0);
    if (s) {
        CHECK(s->size == 1 && s->rank == 0);
        CHECK(s->ops->allreduce_sum(s, d, N, CM_F32, 10000) == 0);
        cm_destroy(&s);
    }
    CHECK(cm_nccl_split_color(c, 0, 0, &s, 10000) == 0);
    if (s) {
        CHECK(s->ops->barrier(s, 10000) == 0);
        cm_destroy(&s);
    }
    cudaFree(d);
    cm_destroy(&c);
}

/* ---- abort in the middle of a collective ---- */

static atomic_int release_stream;

/* a stream callback that holds the communicator's stream until released: the all-reduce
 * queued behind it cannot finish */
static void CUDART_CB hold_stream(void *arg) {
    (void)arg;
    while (!atomic_load(&release_stream)) usleep(1000);
}

typedef struct aborter {
    cm_comm *c;
    atomic_int *flag; /* or: set this cancel flag */
    int delay_ms;
} aborter;

static void *abort_later(void *p) {
    aborter *a = p;
    usleep((useconds_t)a->delay_ms * 1000);
    if (a->c) a->c->ops->abort(a->c);
    if (a->flag) atomic_store(a->flag, 1);
    return NULL;
}

static void test_abort_collective(void) {
    cm_comm *c = one_rank();
    REQUIRE(c);
    float *d = NULL;
    REQUIRE(cudaMalloc((void **)&d, 4096 * sizeof(float)) == cudaSuccess);
    atomic_store(&release_stream, 0);
    REQUIRE(cudaLaunchHostFunc((cudaStream_t)cm_nccl_stream(c), hold_stream, NULL) == cudaSuccess);
    aborter a = {.c = c, .delay_ms = 300};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    double t0 = now_s();
    int rc = c->ops->allreduce_sum(c, d, 4096, CM_F32, -1); /* no deadline: only the abort ends it */
    double dt = now_s() - t0;
    atomic_store(&release_stream, 1);
    pthread_join(th, NULL);
    CHECK_MSG(rc == CO_EABORTED, "all-reduce returned %d (%s), want CO_EABORTED", rc, co_err_detail());
    CHECK_MSG(dt < 3.0, "the abort took %.2f s", dt);
    CHECK(c->ops->barrier(c, 1000) == CO_EABORTED); /* unusable afterwards */
    cm_destroy(&c);
    /* rebuild and work again */
    c = one_rank();
    REQUIRE(c);
    float h[4096], back[4096];
    for (int i = 0; i < 4096; i++) h[i] = gu_uniform();
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    CHECK(c->ops->allreduce_sum(c, d, 4096, CM_F32, 10000) == 0);
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    GU_EQUAL("all-reduce after the rebuild", back, h, sizeof h);
    cm_destroy(&c);
    cudaFree(d);
}

/* a 2-rank communicator whose second rank never comes: init blocks inside NCCL */
static void test_abort_init(void) {
    uint8_t id[128];
    REQUIRE(cm_nccl_get_unique_id(id) == 0);
    atomic_int cancel;
    atomic_init(&cancel, 0);
    cm_nccl_options o;
    cm_nccl_options_default(&o);
    o.cancel = &cancel;
    o.init_timeout_ms = -1;
    aborter a = {.flag = &cancel, .delay_ms = 500};
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &a);
    cm_comm *c = NULL;
    double t0 = now_s();
    int rc = cm_nccl_new(&c, 0, 2, id, 0, &o);
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    CHECK_MSG(rc == CO_EABORTED && c == NULL, "init returned %d (%s), want CO_EABORTED", rc, co_err_detail());
    CHECK_MSG(dt < 5.0, "the cancelled init took %.2f s", dt);
    /* the same with a deadline */
    REQUIRE(cm_nccl_get_unique_id(id) == 0);
    cm_nccl_options_default(&o);
    o.init_timeout_ms = 700;
    t0 = now_s();
    rc = cm_nccl_new(&c, 0, 2, id, 0, &o);
    dt = now_s() - t0;
    CHECK_MSG(rc == CO_ETIMEOUT && c == NULL, "init returned %d (%s), want CO_ETIMEOUT", rc, co_err_detail());
    CHECK_MSG(dt < 5.0, "the timed-out init took %.2f s", dt);
    /* and a working communicator afterwards */
    c = one_rank();
    CHECK(c != NULL);
    if (c) CHECK(c->ops->barrier(c, 10000) == 0);
    cm_destroy(&c);
}

int main(void) {
    gu_require_gpu();
    RUN(test_collectives);
    RUN(test_abort_collective);
    RUN(test_abort_init);
    return TEST_EXIT();
}
