/* mailbox_bench.c - the actor mailbox against raw ZeroMQ, same socket types (DEALER client,
 * ROUTER server), same transport, same run: round-trip latency (p50, p99) of a ping echoed
 * by the server, and one-way messages per second (client -> server; the median of 5 runs,
 * raw and mailbox alternating, since the machines are shared). Prints a markdown table.
 *
 *   bench/mailbox_bench [--size BYTES] [--roundtrips N] [--messages N]
 *
 * Target: the mailbox's message rate is at least half of raw ZeroMQ's. The output
 * starts with the CPU (bench_cpu.h: model name, ISA flags). */
#include "actors/actor.h"
#include "bench/bench_cpu.h"
#include "common/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static size_t g_size = 64;
static int g_rt = 20000, g_msgs = 200000;
enum { REPS = 5 };

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double p50, p99, rate;
} result;

static void percentiles(double *v, int n, result *r) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    r->p50 = v[n / 2];
    r->p99 = v[(int)(n * 0.99)];
}

/* ---- bounded waiting ----------------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static void notify(void) {
    pthread_mutex_lock(&g_mu);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static int wait_flag(atomic_int *f, int secs) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += secs;
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    while (!atomic_load(f) && rc == 0) rc = pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    int ok = atomic_load(f);
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* ---- raw ZeroMQ ---------------------------------------------------------------------- */

typedef struct {
    void *ctx;
    char endpoint[512];
    int mode; /* 0 echo g_rt + warmup messages, 1 count g_msgs */
    atomic_int bound;
    double t_last;
} raw_server;

static void *raw_server_thread(void *p) {
    raw_server *s = p;
    void *r = zmq_socket(s->ctx, ZMQ_ROUTER);
    int zero = 0, one = 1, tmo = 10000;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(r, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(r, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_bind(r, s->endpoint);
    size_t sz = sizeof s->endpoint;
    zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, s->endpoint, &sz);
    atomic_store(&s->bound, 1);
    notify();
    char id[256], buf[65536];
    int n = s->mode == 0 ? g_rt + 1000 : g_msgs;
    for (int i = 0; i < n; i++) {
        int il = zmq_recv(r, id, sizeof id, 0);
        if (il < 0) break;
        int bl = zmq_recv(r, buf, sizeof buf, 0);
        if (bl < 0) break;
        if (s->mode == 0) {
            zmq_send(r, id, (size_t)il, ZMQ_SNDMORE);
            zmq_send(r, buf, (size_t)bl, 0);
        }
    }
    s->t_last = now_us();
    zmq_close(r);
    return NULL;
}

static void run_raw(const char *endpoint, result *res, int only) {
    void *ctx = zmq_ctx_new();
    char *msg = calloc(1, g_size);
    char *buf = malloc(g_size + 16);
    double *lat = malloc(sizeof(double) * (size_t)g_rt);
    for (int mode = only; mode <= only; mode++) {
        raw_server s = {.ctx = ctx, .mode = mode};
        snprintf(s.endpoint, sizeof s.endpoint, "%s", endpoint);
        pthread_t t;
        pthread_create(&t, NULL, raw_server_thread, &s);
        wait_flag(&s.bound, 10);
        void *d = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0, tmo = 10000;
        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
        zmq_setsockopt(d, ZMQ_ROUTING_ID, "client", 6);
        zmq_connect(d, s.endpoint);
        if (mode == 0) {
            for (int i = 0; i < g_rt + 1000; i++) {
                double t0 = now_us();
                zmq_send(d, msg, g_size, 0);
                if (zmq_recv(d, buf, g_size + 16, 0) < 0) break;
                if (i >= 1000) lat[i - 1000] = now_us() - t0;
            }
            percentiles(lat, g_rt, res);
        } else {
            double t0 = now_us();
            for (int i = 0; i < g_msgs; i++) zmq_send(d, msg, g_size, 0);
            pthread_join(t, NULL);
            res->rate = g_msgs / ((s.t_last - t0) / 1e6);
        }
        if (mode == 0) pthread_join(t, NULL);
        zmq_close(d);
    }
    zmq_ctx_term(ctx);
    free(msg);
    free(buf);
    free(lat);
}

/* ---- mailboxes ----------------------------------------------------------------------- */

typedef struct {
    char endpoint[512];
    ac_mailbox *srv, *cli;
    int mode;
    /* server */
    int count;
    double t_last;
    atomic_int done;
    /* client */
    char *msg;
    int i, sent;
    double t0, *lat;
    int failed;
} mb_bench;

static void srv_msg(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    mb_bench *b = ctx;
    if (b->mode == 0) {
        ac_send(mb, m->peer, m->data, m->len);
        return;
    }
    if (++b->count == g_msgs) {
        b->t_last = now_us();
        atomic_store(&b->done, 1);
        notify();
    }
}

static void ping(mb_bench *b) {
    b->t0 = now_us();
    if (ac_send(b->cli, NULL, b->msg, g_size)) b->failed = 1;
}

static void cli_msg(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    (void)mb;
    (void)m;
    mb_bench *b = ctx;
    if (b->i >= 1000) b->lat[b->i - 1000] = now_us() - b->t0;
    if (++b->i == g_rt + 1000) {
        atomic_store(&b->done, 1);
        notify();
        return;
    }
    ping(b);
}

static int srv_open(ac_actor *a, void *ctx) {
    mb_bench *b = ctx;
    ac_mailbox_opts o = {.on_message = srv_msg, .ctx = b};
    int rc = ac_mailbox_bind(a, b->endpoint, &o, &b->srv);
    if (!rc) snprintf(b->endpoint, sizeof b->endpoint, "%s", ac_mailbox_endpoint(b->srv));
    return rc;
}

static void cli_drained(ac_mailbox *mb, void *ctx);
static int cli_open(ac_actor *a, void *ctx) {
    mb_bench *b = ctx;
    ac_mailbox_opts o = {.on_message = cli_msg, .on_drained = cli_drained, .ctx = b};
    return ac_mailbox_connect(a, b->endpoint, "client", &o, &b->cli);
}

static void start_ping(ac_actor *a, void *ctx) {
    (void)a;
    ping(ctx);
}

/* Sends while ZeroMQ takes messages; when a message had to wait in the mailbox's own queue,
 * returns to the loop and resumes from on_drained once the queue has gone out. */
static void pump(ac_actor *a, void *ctx) {
    (void)a;
    mb_bench *b = ctx;
    while (b->sent < g_msgs && ac_mailbox_queued(b->cli) == 0) {
        if (ac_send(b->cli, NULL, b->msg, g_size)) {
            b->failed = 1;
            return;
        }
        b->sent++;
    }
}
static void cli_drained(ac_mailbox *mb, void *ctx) {
    (void)mb;
    pump(NULL, ctx);
}

typedef struct {
    int (*fn)(ac_actor *, void *);
    void *ctx;
    int rc;
    atomic_int done;
} call;
static void call_tramp(ac_actor *a, void *p) {
    call *c = p;
    c->rc = c->fn(a, c->ctx);
    atomic_store(&c->done, 1);
    notify();
}
static int on_actor(ac_actor *a, int (*fn)(ac_actor *, void *), void *ctx) {
    call c = {.fn = fn, .ctx = ctx};
    int rc = ac_post(a, call_tramp, &c);
    if (rc) return rc;
    if (!wait_flag(&c.done, 10)) {
        fprintf(stderr, "mailbox_bench: actor did not answer\n");
        exit(1);
    }
    return c.rc;
}

static int run_mailbox(const char *endpoint, result *res, int only) {
    double *lat = malloc(sizeof(double) * (size_t)g_rt);
    char *msg = calloc(1, g_size);
    for (int mode = only; mode <= only; mode++) {
        mb_bench b = {.mode = mode, .msg = msg, .lat = lat};
        snprintf(b.endpoint, sizeof b.endpoint, "%s", endpoint);
        ac_actor_opts so = {.name = "bench-server"}, co = {.name = "bench-client"};
        ac_actor *sa = NULL, *ca = NULL;
        int rc = ac_actor_start(&so, &sa);
        if (!rc) rc = ac_actor_start(&co, &ca);
        if (!rc) rc = on_actor(sa, srv_open, &b);
        if (!rc) rc = on_actor(ca, cli_open, &b);
        if (rc) {
            fprintf(stderr, "mailbox_bench: %s: %s\n", co_err_name(rc), co_err_detail());
            return rc;
        }
        double t0 = now_us();
        ac_post(ca, mode == 0 ? start_ping : pump, &b);
        int ok = wait_flag(&b.done, 60) && !b.failed;
        ac_actor_stop(&ca);
        ac_actor_stop(&sa);
        if (!ok) {
            fprintf(stderr, "mailbox_bench: mode %d did not finish (sent %d, received %d)\n",
                    mode, b.sent, b.count);
            return CO_ETIMEOUT;
        }
        if (mode == 0) percentiles(lat, g_rt, res);
        else res->rate = g_msgs / ((b.t_last - t0) / 1e6);
    }
    free(lat);
    free(msg);
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--size")) g_size = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--roundtrips")) g_rt = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--messages")) g_msgs = atoi(argv[i + 1]);
    }
    if (g_rt < 100 || g_msgs < 1000 || g_size > 60000) {
        fprintf(stderr, "usage: mailbox_bench [--size B<=60000] [--roundtrips N>=100] "
                        "[--messages N>=1000]\n");
        return 2;
    }
    char dir[256], ipc_raw[320], ipc_mb[320];
    if (ac_ipc_dir_create(dir, sizeof dir) || ac_ipc_endpoint(dir, "raw", ipc_raw, sizeof ipc_raw) ||
        ac_ipc_endpoint(dir, "mailbox", ipc_mb, sizeof ipc_mb)) {
        fprintf(stderr, "mailbox_bench: %s\n", co_err_detail());
        return 1;
    }
    bench_cpu_print(stdout);
    printf("message %zu bytes, %d round trips (after 1000 warm-up); rate: median of %d "
           "alternating runs of %d one-way messages\n\n",
           g_size, g_rt, REPS, g_msgs);
    printf("| transport | API | RTT p50 (us) | RTT p99 (us) | messages/s | rate vs raw |\n");
    printf("|---|---|---:|---:|---:|---:|\n");
    const char *names[2] = {"ipc", "tcp"};
    const char *raw_ep[2] = {ipc_raw, "tcp://127.0.0.1:*"};
    const char *mb_ep[2] = {ipc_mb, "tcp://127.0.0.1:*"};
    int status = 0;
    for (int t = 0; t < 2; t++) {
        result raw = {0}, mb = {0};
        run_raw(raw_ep[t], &raw, 0);
        if (run_mailbox(mb_ep[t], &mb, 0)) status = 1;
        /* Message rate: REPS alternating runs each, the median reported (shared machines). */
        double rr[REPS], mr[REPS];
        for (int r = 0; r < REPS; r++) {
            run_raw(raw_ep[t], &raw, 1);
            rr[r] = raw.rate;
            if (run_mailbox(mb_ep[t], &mb, 1)) status = 1;
            mr[r] = mb.rate;
        }
        qsort(rr, REPS, sizeof *rr, cmp_d);
        qsort(mr, REPS, sizeof *mr, cmp_d);
        raw.rate = rr[REPS / 2];
        mb.rate = mr[REPS / 2];
        printf("| %s | raw ZeroMQ | %.1f | %.1f | %.0f | 1.00 |\n", names[t], raw.p50, raw.p99,
               raw.rate);
        printf("| %s | mailbox | %.1f | %.1f | %.0f | %.2f |\n", names[t], mb.p50, mb.p99,
               mb.rate, mb.rate / raw.rate);
        fflush(stdout);
    }
    ac_ipc_dir_remove(dir);
    return status;
}
