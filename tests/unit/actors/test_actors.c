/* test_actors.c - the actor runtime: READY/STOP lifecycle, message ordering, request/reply
 * with timeouts and abort, cross-thread posts, timers, the same over ipc and tcp, CURVE with a
 * ZAP handler (a client without the job's key is refused; malformed ZAP requests are answered
 * "400" and the handler keeps working), ZMQ_MAXMSGSIZE (an oversized frame disconnects its
 * sender, the mailbox serves the others), the secret file's permissions. Every wait is
 * bounded. */
#include "actors/actor.h"
#include "actors/internal.h" /* the process's ZeroMQ context, to reach the ZAP handler */
#include "common/error.h"
#include "tests/test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* ---- helpers ------------------------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void notify(void) {
    pthread_mutex_lock(&g_mu);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Waits until *v >= want or ms pass; returns whether it got there. */
static int wait_for(atomic_int *v, int want, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    while (atomic_load(v) < want && rc == 0) rc = pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    int ok = atomic_load(v) >= want;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* Runs fn on the actor's loop and waits (bounded) for its result. */
typedef struct {
    int (*fn)(ac_actor *a, void *ctx);
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
    call *c = calloc(1, sizeof *c); /* leaked if the actor never runs it */
    c->fn = fn;
    c->ctx = ctx;
    int rc = ac_post(a, call_tramp, c);
    if (rc) {
        free(c);
        return rc;
    }
    if (!wait_for(&c->done, 1, 5000)) return CO_ETIMEOUT;
    rc = c->rc;
    free(c);
    return rc;
}

static ac_actor *start_actor(const char *name) {
    ac_actor_opts o = {.name = name};
    ac_actor *a = NULL;
    int rc = ac_actor_start(&o, &a);
    if (rc) fprintf(stderr, "start %s: %s: %s\n", name, co_err_name(rc), co_err_detail());
    return a;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

typedef struct {
    atomic_int started, stopped;
    int fail;
} life;

static int life_start(ac_actor *a, void *ctx) {
    (void)a;
    life *l = ctx;
    usleep(20000); /* READY must wait for this */
    atomic_store(&l->started, 1);
    return l->fail ? co_err_set(CO_EIO, "asked to fail") : 0;
}
static void life_stop(ac_actor *a, void *ctx) {
    (void)a;
    atomic_store(&((life *)ctx)->stopped, 1);
}

static void test_lifecycle(void) {
    life l = {0};
    ac_actor_opts o = {.name = "life", .on_start = life_start, .on_stop = life_stop, .ctx = &l};
    ac_actor *a = NULL;
    REQUIRE(ac_actor_start(&o, &a) == 0);
    CHECK(atomic_load(&l.started) == 1); /* READY came after on_start */
    CHECK(ac_actor_loop(a) != NULL);
    CHECK(!strcmp(ac_actor_name(a), "life"));
    CHECK(atomic_load(&l.stopped) == 0);
    CHECK(ac_actor_stop(&a) == 0);
    CHECK(a == NULL);
    CHECK(atomic_load(&l.stopped) == 1);
    CHECK(ac_actor_stop(&a) == 0); /* NULL-safe */

    life f = {.fail = 1};
    o.ctx = &f;
    a = NULL;
    CHECK(ac_actor_start(&o, &a) == CO_EIO);
    CHECK(a == NULL);
    CHECK(atomic_load(&f.stopped) == 0);
}

static int slow_start(ac_actor *a, void *ctx) {
    (void)a;
    (void)ctx;
    usleep(300000);
    return 0;
}

static void test_start_timeout(void) {
    ac_actor_opts o = {.name = "slow", .on_start = slow_start, .start_timeout_ms = 50};
    ac_actor *a = NULL;
    double t0 = now_ms();
    CHECK(ac_actor_start(&o, &a) == CO_ETIMEOUT);
    CHECK(a == NULL);
    CHECK(now_ms() - t0 < 250);
    usleep(500000); /* the abandoned actor stops and frees itself */
}

static void *stop_later(void *p) {
    usleep(50000);
    ac_actor_request_stop(p);
    return NULL;
}

static void test_run_on_calling_thread(void) {
    life l = {0};
    ac_actor_opts o = {.name = "main", .on_start = life_start, .on_stop = life_stop, .ctx = &l};
    ac_actor *a = NULL;
    REQUIRE(ac_actor_new(&o, &a) == 0);
    pthread_t t;
    pthread_create(&t, NULL, stop_later, a);
    double t0 = now_ms();
    CHECK(ac_actor_run(a) == 0);
    CHECK(now_ms() - t0 < 5000);
    pthread_join(t, NULL);
    CHECK(atomic_load(&l.started) == 1 && atomic_load(&l.stopped) == 1);
    CHECK(ac_post(a, (void (*)(ac_actor *, void *))NULL, NULL) == CO_EINVAL);
    ac_actor_destroy(&a);
    CHECK(a == NULL);
}

/* ---- posts and timers ---------------------------------------------------------------- */

enum { POSTERS = 4, POSTS = 2000 };
typedef struct {
    ac_actor *a;
    int id;
    int last[POSTERS]; /* touched only on the actor's thread */
    int order_ok;
    atomic_int count;
} postctx;

typedef struct {
    postctx *pc;
    int from, seq;
} postmsg;

static void on_post(ac_actor *a, void *p) {
    (void)a;
    postmsg *m = p;
    if (m->seq != m->pc->last[m->from] + 1) m->pc->order_ok = 0;
    m->pc->last[m->from] = m->seq;
    if (atomic_fetch_add(&m->pc->count, 1) + 1 == POSTERS * POSTS) notify();
    free(m);
}

typedef struct {
    postctx *pc;
    int from;
} poster_arg;

static void *poster(void *p) {
    poster_arg *pa = p;
    for (int i = 1; i <= POSTS; i++) {
        postmsg *m = malloc(sizeof *m);
        *m = (postmsg){pa->pc, pa->from, i};
        if (ac_post(pa->pc->a, on_post, m)) free(m);
    }
    return NULL;
}

static void test_post_from_threads(void) {
    postctx pc = {.order_ok = 1};
    for (int i = 0; i < POSTERS; i++) pc.last[i] = 0;
    pc.a = start_actor("post");
    REQUIRE(pc.a);
    pthread_t t[POSTERS];
    poster_arg pa[POSTERS];
    for (int i = 0; i < POSTERS; i++) {
        pa[i] = (poster_arg){&pc, i};
        pthread_create(&t[i], NULL, poster, &pa[i]);
    }
    for (int i = 0; i < POSTERS; i++) pthread_join(t[i], NULL);
    CHECK(wait_for(&pc.count, POSTERS * POSTS, 5000));
    CHECK(ac_actor_stop(&pc.a) == 0);
    CHECK(pc.order_ok);
    CHECK(atomic_load(&pc.count) == POSTERS * POSTS);
}

typedef struct {
    atomic_int once, rep, self_stopped;
    ac_timer *t;
} timerctx;

static void on_once(ac_timer *t, void *ctx) {
    (void)t;
    atomic_fetch_add(&((timerctx *)ctx)->once, 1);
    notify();
}
static void on_rep(ac_timer *t, void *ctx) {
    timerctx *tc = ctx;
    (void)t;
    if (atomic_fetch_add(&tc->rep, 1) + 1 == 5) {
        ac_timer_stop(&tc->t); /* from inside its own callback */
        atomic_store(&tc->self_stopped, 1);
        notify();
    }
}
static int start_timers(ac_actor *a, void *ctx) {
    timerctx *tc = ctx;
    int rc = ac_timer_start(a, 10, 0, on_once, tc, NULL);
    if (!rc) rc = ac_timer_start(a, 1, 2, on_rep, tc, &tc->t);
    return rc;
}

static void test_timers(void) {
    timerctx tc = {0};
    ac_actor *a = start_actor("timers");
    REQUIRE(a);
    double t0 = now_ms();
    CHECK(on_actor(a, start_timers, &tc) == 0);
    CHECK(wait_for(&tc.once, 1, 3000));
    CHECK(now_ms() - t0 >= 9);
    CHECK(wait_for(&tc.self_stopped, 1, 3000));
    usleep(30000);
    CHECK(atomic_load(&tc.once) == 1);
    CHECK(atomic_load(&tc.rep) == 5);
    CHECK(ac_actor_stop(&a) == 0);
}

/* ---- mailboxes ----------------------------------------------------------------------- */

enum { NMSG = 20000 };

typedef struct {
    /* server side */
    ac_mailbox *srv;
    ac_mailbox_opts sopts;
    char endpoint[512];
    atomic_int received;
    int next_seq, order_ok;
    atomic_int reply_requests; /* answer requests (else ignore them) */
    char last_peer[64];
    /* client side */
    ac_mailbox *cli;
    ac_mailbox_opts copts;
    const char *identity;
    atomic_int replies, timeouts, aborts, auth_failed, connected, client_got;
    int reply_ok;
    double t_req;
    double timeout_ms_seen;
} pair;

/* Server-side fields are written under g_mu: ZeroMQ's hand-over between threads is invisible
 * to ThreadSanitizer, so the test's own reads need a lock it can see. */
static void srv_on_message(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    pair *p = ctx;
    pthread_mutex_lock(&g_mu);
    snprintf(p->last_peer, sizeof p->last_peer, "%s", m->peer ? m->peer : "");
    if (m->request_id) {
        if (atomic_load(&p->reply_requests)) {
            char buf[64];
            int n = snprintf(buf, sizeof buf, "re:%.*s", (int)m->len, (const char *)m->data);
            ac_reply(mb, m, buf, (size_t)n);
        }
    } else {
        if (m->len == 4) {
            int seq;
            memcpy(&seq, m->data, 4);
            if (seq != p->next_seq) p->order_ok = 0;
            p->next_seq = seq + 1;
        }
        atomic_fetch_add(&p->received, 1);
    }
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static int peer_is(pair *p, const char *want) {
    pthread_mutex_lock(&g_mu);
    int ok = !strcmp(p->last_peer, want);
    pthread_mutex_unlock(&g_mu);
    return ok;
}

static int order_ok(pair *p) {
    pthread_mutex_lock(&g_mu);
    int ok = p->order_ok;
    pthread_mutex_unlock(&g_mu);
    return ok;
}

static void cli_on_message(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    (void)mb;
    pair *p = ctx;
    if (m->peer == NULL && m->len == 4 && !memcmp(m->data, "pong", 4))
        atomic_fetch_add(&p->client_got, 1);
    notify();
}

static void cli_on_event(ac_mailbox *mb, int ev, const char *endpoint, void *ctx) {
    (void)mb;
    (void)endpoint;
    pair *p = ctx;
    if (ev == AC_EV_AUTH_FAILED) atomic_fetch_add(&p->auth_failed, 1);
    if (ev == AC_EV_CONNECTED) atomic_fetch_add(&p->connected, 1);
    notify();
}

static int srv_bind(ac_actor *a, void *ctx) {
    pair *p = ctx;
    p->sopts.on_message = srv_on_message;
    p->sopts.ctx = p;
    int rc = ac_mailbox_bind(a, p->endpoint, &p->sopts, &p->srv);
    if (!rc) snprintf(p->endpoint, sizeof p->endpoint, "%s", ac_mailbox_endpoint(p->srv));
    return rc;
}

static int cli_connect(ac_actor *a, void *ctx) {
    pair *p = ctx;
    p->copts.on_message = cli_on_message;
    p->copts.on_event = cli_on_event;
    p->copts.ctx = p;
    return ac_mailbox_connect(a, p->endpoint, p->identity, &p->copts, &p->cli);
}

static int cli_send_all(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    for (int i = 0; i < NMSG; i++) {
        int rc = ac_send(p->cli, NULL, &i, 4);
        if (rc) return rc;
    }
    return 0;
}

static int cli_send_one(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    int seq = 0;
    return ac_send(p->cli, NULL, &seq, 4);
}

static int srv_send_pong(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    return ac_send(p->srv, p->identity, "pong", 4);
}

static int srv_send_unknown(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    return ac_send(p->srv, "nobody-here", "x", 1);
}

static void on_reply(ac_mailbox *mb, int status, const ac_msg *r, void *ctx) {
    (void)mb;
    pair *p = ctx;
    if (status == 0) {
        p->reply_ok = r && r->len == 8 && !memcmp(r->data, "re:hello", 8);
        atomic_fetch_add(&p->replies, 1);
    } else if (status == CO_ETIMEOUT) {
        p->timeout_ms_seen = now_ms() - p->t_req;
        atomic_fetch_add(&p->timeouts, 1);
    } else if (status == CO_EABORTED) {
        atomic_fetch_add(&p->aborts, 1);
    }
    notify();
}

static int cli_request(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    p->t_req = now_ms();
    return ac_request(p->cli, NULL, "hello", 5, 200, on_reply, p);
}

static int cli_close(ac_actor *a, void *ctx) {
    (void)a;
    pair *p = ctx;
    ac_mailbox_close(&p->cli);
    return 0;
}

static void run_transport(const char *endpoint, const char *label) {
    fprintf(stderr, "  transport %s\n", label);
    pair p = {.order_ok = 1, .reply_requests = 1, .identity = "worker-1"};
    snprintf(p.endpoint, sizeof p.endpoint, "%s", endpoint);
    ac_actor *sa = start_actor("server"), *ca = start_actor("client");
    REQUIRE(sa && ca);
    int rc = on_actor(sa, srv_bind, &p);
    CHECK_MSG(rc == 0, "%s: %s", co_err_name(rc), co_err_detail());
    if (rc) goto out;
    CHECK(strncmp(p.endpoint, label, 3) == 0 && !strstr(p.endpoint, ":*"));
    CHECK(on_actor(ca, cli_connect, &p) == 0);

    /* ordering: many messages arrive all, in order */
    CHECK(on_actor(ca, cli_send_all, &p) == 0);
    CHECK(wait_for(&p.received, NMSG, 10000));
    CHECK(order_ok(&p));
    CHECK(peer_is(&p, "worker-1"));

    /* server -> client by identity; unknown peer is CO_EREMOTE */
    CHECK(on_actor(sa, srv_send_pong, &p) == 0);
    CHECK(wait_for(&p.client_got, 1, 5000));
    CHECK(on_actor(sa, srv_send_unknown, &p) == CO_EREMOTE);

    /* request/reply, then a request nobody answers times out */
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(wait_for(&p.replies, 1, 5000));
    CHECK(p.reply_ok);
    atomic_store(&p.reply_requests, 0);
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(wait_for(&p.timeouts, 1, 5000));
    CHECK_MSG(p.timeout_ms_seen >= 190 && p.timeout_ms_seen < 2000, "%.1f ms",
              p.timeout_ms_seen);
    CHECK(atomic_load(&p.replies) == 1);

    /* abort: closing the mailbox ends an outstanding request with CO_EABORTED */
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(on_actor(ca, cli_close, &p) == 0);
    CHECK(atomic_load(&p.aborts) == 1);
    usleep(250000);
    CHECK(atomic_load(&p.timeouts) == 1); /* the aborted request never times out too */
out:
    CHECK(ac_actor_stop(&ca) == 0);
    CHECK(ac_actor_stop(&sa) == 0);
}

static void test_ipc(void) {
    char dir[256], ep[300];
    REQUIRE(ac_ipc_dir_create(dir, sizeof dir) == 0);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    REQUIRE(ac_ipc_endpoint(dir, "server", ep, sizeof ep) == 0);
    run_transport(ep, "ipc");
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    CHECK(ac_ipc_endpoint(dir, longname, ep, sizeof ep) == CO_ERANGE);
    CHECK(ac_ipc_dir_remove(dir) == 0);
    CHECK(stat(dir, &st) != 0);
}

static void test_tcp(void) { run_transport("tcp://127.0.0.1:*", "tcp"); }

/* ---- security ------------------------------------------------------------------------ */

static void test_secret_file(void) {
    char dir[256], path[320];
    REQUIRE(ac_ipc_dir_create(dir, sizeof dir) == 0);
    snprintf(path, sizeof path, "%s/job.secret", dir);
    ac_secret s, l;
    REQUIRE(ac_secret_generate(&s) == 0);
    CHECK(strlen(s.server_public) == AC_KEY_Z85_LEN && strlen(s.client_secret) == AC_KEY_Z85_LEN);
    REQUIRE(ac_secret_write(path, &s) == 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(ac_secret_load(path, &l) == 0);
    CHECK(!memcmp(&s, &l, sizeof s));
    chmod(path, 0644);
    CHECK(ac_secret_load(path, &l) == CO_EDENIED);
    chmod(path, 0620);
    CHECK(ac_secret_load(path, &l) == CO_EDENIED);
    chmod(path, 0600);
    FILE *f = fopen(path, "w");
    fputs("server_public=short\n", f);
    fclose(f);
    CHECK(ac_secret_load(path, &l) == CO_EFORMAT);
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(ac_secret_load(path, &l) == CO_ENOENT);
    CHECK(ac_ipc_dir_remove(dir) == 0);
}

static void test_curve(void) {
    ac_secret job, other;
    REQUIRE(ac_secret_generate(&job) == 0);
    REQUIRE(ac_secret_generate(&other) == 0);
    ac_secret stranger = job; /* knows the server's public key, but not the job's client key */
    memcpy(stranger.client_public, other.client_public, sizeof stranger.client_public);
    memcpy(stranger.client_secret, other.client_secret, sizeof stranger.client_secret);

    pair p = {.order_ok = 1, .reply_requests = 1, .identity = "good"};
    snprintf(p.endpoint, sizeof p.endpoint, "tcp://127.0.0.1:*");
    p.sopts.secret = &job;
    p.sopts.zap_domain = "job-42";
    ac_actor *sa = start_actor("server"), *ca = start_actor("client");
    REQUIRE(sa && ca);
    int rc = on_actor(sa, srv_bind, &p);
    CHECK_MSG(rc == 0, "%s: %s", co_err_name(rc), co_err_detail());

    /* A stranger's message never reaches the server; its handshake is refused. */
    pair bad = {.identity = "bad"};
    snprintf(bad.endpoint, sizeof bad.endpoint, "%s", p.endpoint);
    bad.copts.secret = &stranger;
    CHECK(on_actor(ca, cli_connect, &bad) == 0);
    CHECK(on_actor(ca, cli_send_one, &bad) == 0);
    CHECK(wait_for(&bad.auth_failed, 1, 5000));

    /* A plain (no CURVE) client is refused too. */
    pair plain = {.identity = "plain"};
    snprintf(plain.endpoint, sizeof plain.endpoint, "%s", p.endpoint);
    CHECK(on_actor(ca, cli_connect, &plain) == 0);
    CHECK(on_actor(ca, cli_send_one, &plain) == 0);

    /* The job's client works. */
    p.copts.secret = &job;
    CHECK(on_actor(ca, cli_connect, &p) == 0);
    CHECK(on_actor(ca, cli_send_one, &p) == 0);
    CHECK(wait_for(&p.received, 1, 5000));
    CHECK(wait_for(&p.connected, 1, 5000));
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(wait_for(&p.replies, 1, 5000));
    CHECK(p.reply_ok);
    usleep(500000); /* give the refused clients time to retry */
    CHECK_MSG(atomic_load(&p.received) == 1, "server got %d messages",
              atomic_load(&p.received));
    CHECK(peer_is(&p, "good"));
    CHECK(atomic_load(&bad.connected) == 0);
    CHECK(ac_actor_stop(&ca) == 0);
    CHECK(ac_actor_stop(&sa) == 0);
}

/* ---- ZAP: malformed requests -------------------------------------------------------- */

typedef struct {
    const char *what;
    int nframes;
    const char *frame[10];
    size_t len[10];  /* 0: strlen(frame) */
} zap_req;

/* Sends one request on the REQ socket z and returns the reply's status code ("200", "400")
 * in code (3 bytes and NUL), or "" with no (complete) reply within the receive timeout. */
static void zap_ask(void *z, const zap_req *r, char code[4]) {
    code[0] = 0;
    for (int i = 0; i < r->nframes; i++) {
        size_t n = r->len[i] ? r->len[i] : strlen(r->frame[i]);
        if (zmq_send(z, r->frame[i], n, i + 1 < r->nframes ? ZMQ_SNDMORE : 0) < 0) return;
    }
    int frames = 0, more = 1;
    char buf[64];
    while (more) {
        int n = zmq_recv(z, buf, sizeof buf, 0);
        if (n < 0) return;
        if (frames == 2 && n == 3) memcpy(code, buf, 3), code[3] = 0;
        frames++;
        size_t sz = sizeof more;
        zmq_getsockopt(z, ZMQ_RCVMORE, &more, &sz);
    }
    if (frames != 6) code[0] = 0; /* version, id, status, text, user id, metadata */
}

static void test_zap_malformed(void) {
    ac_secret job, other;
    REQUIRE(ac_secret_generate(&job) == 0);
    REQUIRE(ac_secret_generate(&other) == 0);
    ac_secret stranger = job;
    memcpy(stranger.client_public, other.client_public, sizeof stranger.client_public);
    memcpy(stranger.client_secret, other.client_secret, sizeof stranger.client_secret);
    uint8_t key[32];
    REQUIRE(zmq_z85_decode(key, job.client_public) != NULL);

    pair p = {.order_ok = 1, .reply_requests = 1, .identity = "good"};
    snprintf(p.endpoint, sizeof p.endpoint, "tcp://127.0.0.1:*");
    p.sopts.secret = &job;
    p.sopts.zap_domain = "job-7";
    ac_actor *sa = start_actor("server"), *ca = start_actor("client");
    REQUIRE(sa && ca);
    int rc = on_actor(sa, srv_bind, &p); /* starts the ZAP handler */
    CHECK_MSG(rc == 0, "%s: %s", co_err_name(rc), co_err_detail());

    void *ctx = ac__ctx_ref(); /* the same context: inproc reaches the handler */
    REQUIRE(ctx);
    void *z = zmq_socket(ctx, ZMQ_REQ);
    REQUIRE(z);
    int zero = 0, tmo = 3000;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(z, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(z, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    REQUIRE(zmq_connect(z, "inproc://zeromq.zap.01") == 0);

    size_t big = 1u << 20;
    char *huge = malloc(big);
    REQUIRE(huge);
    memset(huge, 'd', big);
    const char *k = (const char *)key;
    zap_req bad[] = {
        {"one frame", 1, {"1.0"}, {0}},
        {"no credentials", 6, {"1.0", "1", "job-7", "127.0.0.1", "", "CURVE"}, {0}},
        {"wrong version", 7, {"2.0", "2", "job-7", "127.0.0.1", "", "CURVE", k}, {0, 0, 0, 0, 0, 0, 32}},
        {"oversized domain", 7, {"1.0", "3", huge, "127.0.0.1", "", "CURVE", k}, {0, 0, big, 0, 0, 0, 32}},
        {"oversized request id", 7, {"1.0", huge, "job-7", "127.0.0.1", "", "CURVE", k}, {0, big, 0, 0, 0, 0, 32}},
        {"oversized key", 7, {"1.0", "4", "job-7", "127.0.0.1", "", "CURVE", huge}, {0, 0, 0, 0, 0, 0, big}},
        {"wrong mechanism", 7, {"1.0", "5", "job-7", "127.0.0.1", "", "PLAIN", k}, {0, 0, 0, 0, 0, 0, 32}},
        {"too many frames", 9, {"1.0", "6", "job-7", "127.0.0.1", "", "CURVE", k, "x", "y"}, {0, 0, 0, 0, 0, 0, 32}},
        {"short key", 7, {"1.0", "7", "job-7", "127.0.0.1", "", "CURVE", k}, {0, 0, 0, 0, 0, 0, 31}},
        {"right key, other domain", 7, {"1.0", "8", "job-8", "127.0.0.1", "", "CURVE", k}, {0, 0, 0, 0, 0, 0, 32}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char code[4];
        zap_ask(z, &bad[i], code);
        CHECK_MSG(!strcmp(code, "400"), "ZAP request '%s': reply '%s', want 400", bad[i].what, code);
    }
    /* the handler still answers a well-formed request, and admits the job's key */
    zap_req good = {"job key", 7, {"1.0", "9", "job-7", "127.0.0.1", "", "CURVE", k}, {0, 0, 0, 0, 0, 0, 32}};
    char code[4];
    zap_ask(z, &good, code);
    CHECK_MSG(!strcmp(code, "200"), "well-formed ZAP request after the malformed ones: reply '%s'", code);
    free(huge);
    zmq_close(z);
    ac__ctx_unref();

    /* real CURVE handshakes through the handler: a wrong key refused, the job's key admitted */
    pair badp = {.identity = "bad"};
    snprintf(badp.endpoint, sizeof badp.endpoint, "%s", p.endpoint);
    badp.copts.secret = &stranger;
    CHECK(on_actor(ca, cli_connect, &badp) == 0);
    CHECK(on_actor(ca, cli_send_one, &badp) == 0);
    CHECK(wait_for(&badp.auth_failed, 1, 5000));
    p.copts.secret = &job;
    CHECK(on_actor(ca, cli_connect, &p) == 0);
    CHECK(wait_for(&p.connected, 1, 5000));
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(wait_for(&p.replies, 1, 5000));
    CHECK(p.reply_ok);
    CHECK(atomic_load(&badp.connected) == 0);
    CHECK(atomic_load(&p.received) == 0); /* only the request reached the server */
    CHECK(ac_actor_stop(&ca) == 0);
    CHECK(ac_actor_stop(&sa) == 0);
}

/* ---- ZMQ_MAXMSGSIZE ------------------------------------------------------------------ */

/* Waits (bounded) for a monitor event on the PAIR socket mon; returns whether it came. */
static int wait_event(void *mon, int event, int ms) {
    double end = now_ms() + ms;
    while (now_ms() < end) {
        zmq_pollitem_t it = {.socket = mon, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 100) <= 0) continue;
        uint8_t ev[6];
        int n = zmq_recv(mon, ev, sizeof ev, ZMQ_DONTWAIT);
        char addr[512];
        zmq_recv(mon, addr, sizeof addr, ZMQ_DONTWAIT); /* the endpoint frame */
        uint16_t e;
        memcpy(&e, ev, 2);
        if (n == 6 && e == event) return 1;
    }
    return 0;
}

static void test_max_msg_size(void) {
    pair p = {.order_ok = 1, .reply_requests = 1, .identity = "small"};
    snprintf(p.endpoint, sizeof p.endpoint, "tcp://127.0.0.1:*");
    ac_actor *sa = start_actor("server"), *ca = start_actor("client");
    REQUIRE(sa && ca);
    int rc = on_actor(sa, srv_bind, &p); /* default limit: AC_MAX_MSG_DEFAULT */
    CHECK_MSG(rc == 0, "%s: %s", co_err_name(rc), co_err_detail());
    if (rc) goto out;

    /* a raw DEALER speaking the mailbox's framing (kind byte 0xA0, then the payload) */
    void *zc = zmq_ctx_new();
    REQUIRE(zc);
    void *d = zmq_socket(zc, ZMQ_DEALER), *mon = zmq_socket(zc, ZMQ_PAIR);
    REQUIRE(d && mon);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(d, ZMQ_ROUTING_ID, "big", 3);
    zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero);
    REQUIRE(zmq_socket_monitor(d, "inproc://test-max-msg-mon", ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) == 0);
    REQUIRE(zmq_connect(mon, "inproc://test-max-msg-mon") == 0);
    REQUIRE(zmq_connect(d, p.endpoint) == 0);
    CHECK(wait_event(mon, ZMQ_EVENT_CONNECTED, 5000));

    size_t n = (size_t)AC_MAX_MSG_DEFAULT + 1;
    char *buf = calloc(1, n);
    REQUIRE(buf);
    buf[0] = (char)0xA0;
    CHECK(zmq_send(d, buf, n, 0) == (int)n);
    CHECK_MSG(wait_event(mon, ZMQ_EVENT_DISCONNECTED, 5000), "a frame of %zu bytes did not disconnect its sender", n);
    CHECK(wait_event(mon, ZMQ_EVENT_CONNECTED, 5000)); /* ZeroMQ reconnects it */

    /* the largest legitimate frame (an 8 MiB envelope and the request header) still passes */
    size_t legit = (8u << 20) + 9;
    CHECK(zmq_send(d, buf, legit, 0) == (int)legit);
    CHECK_MSG(wait_for(&p.received, 1, 10000), "a frame of %zu bytes was not delivered", legit);

    /* and the mailbox serves another peer as before */
    CHECK(on_actor(ca, cli_connect, &p) == 0);
    CHECK(on_actor(ca, cli_request, &p) == 0);
    CHECK(wait_for(&p.replies, 1, 5000));
    CHECK(p.reply_ok);
    usleep(100000);
    CHECK_MSG(atomic_load(&p.received) == 1, "server got %d messages, want 1 (the oversized one dropped)",
              atomic_load(&p.received));
    free(buf);
    zmq_socket_monitor(d, NULL, 0);
    zmq_close(mon);
    zmq_close(d);
    zmq_ctx_term(zc);
out:
    CHECK(ac_actor_stop(&ca) == 0);
    CHECK(ac_actor_stop(&sa) == 0);
}

int main(void) {
    RUN(test_lifecycle);
    RUN(test_start_timeout);
    RUN(test_run_on_calling_thread);
    RUN(test_post_from_threads);
    RUN(test_timers);
    RUN(test_ipc);
    RUN(test_tcp);
    RUN(test_secret_file);
    RUN(test_curve);
    RUN(test_zap_malformed);
    RUN(test_max_msg_size);
    return TEST_EXIT();
}
