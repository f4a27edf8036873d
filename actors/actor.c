/* actor.c - actors (a libuv loop on its own thread or the caller's), the READY/STOP
 * lifecycle, cross-thread posts (uv_async + a locked queue) and timers. */
#include "actors/internal.h"

#include "common/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ST_NEW = 0, ST_RUNNING = 1, ST_READY = 2, ST_ENDED = 3 };

/* ---- posts and STOP ------------------------------------------------------------------ */

/* Runs the posts queued so far; posts made meanwhile (a function re-posting itself) wait
 * for the next loop iteration, so the loop's I/O is never starved. */
static void run_posts(ac_actor *a) {
    pthread_mutex_lock(&a->mu);
    ac__post *p = a->post_head;
    a->post_head = a->post_tail = NULL;
    pthread_mutex_unlock(&a->mu);
    while (p) {
        ac__post *next = p->next;
        p->fn(a, p->ctx);
        free(p);
        p = next;
    }
}

static void close_any(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void shutdown_loop(ac_actor *a, int run_on_stop) {
    if (a->shutting_down) return;
    a->shutting_down = 1;
    if (run_on_stop && a->opts.on_stop) a->opts.on_stop(a, a->opts.ctx);
    run_posts(a); /* posts accepted before STOP still run */
    ac__mailbox_close_all(a);
    /* Barrier: a sender that flipped stop_requested finishes its uv_async_send under the
     * lock; after it nobody sends (posts are refused, STOP is sent once). */
    pthread_mutex_lock(&a->mu);
    pthread_mutex_unlock(&a->mu);
    while (a->timers) {
        ac_timer *t = a->timers;
        ac_timer_stop(&t);
    }
    /* Everything else still open on the loop (the caller's handles, our async and idle). */
    uv_walk(&a->loop, close_any, NULL);
}

static void on_async(uv_async_t *h) {
    ac_actor *a = h->data;
    if (a->shutting_down) return;
    run_posts(a);
    if (atomic_load(&a->stop_requested)) shutdown_loop(a, 1);
}

void ac_actor_request_stop(ac_actor *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    int first = !atomic_exchange(&a->stop_requested, 1);
    if (first && a->state != ST_ENDED) uv_async_send(&a->async);
    pthread_mutex_unlock(&a->mu);
}

int ac_actor_stopping(const ac_actor *a) { return atomic_load(&a->stop_requested); }

int ac_post(ac_actor *a, void (*fn)(ac_actor *a, void *ctx), void *ctx) {
    if (!a || !fn) return co_err_set(CO_EINVAL, "ac_post: no actor or function");
    ac__post *p = malloc(sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "ac_post: out of memory");
    p->fn = fn;
    p->ctx = ctx;
    p->next = NULL;
    pthread_mutex_lock(&a->mu);
    if (atomic_load(&a->stop_requested) || a->state == ST_ENDED) {
        pthread_mutex_unlock(&a->mu);
        free(p);
        return co_err_set(CO_EABORTED, "actor %s is stopping", a->name);
    }
    if (a->post_tail) a->post_tail->next = p;
    else a->post_head = p;
    a->post_tail = p;
    /* uv_async_send under the lock: the loop cannot end (and the handle close) meanwhile,
     * because shutdown needs stop_requested, which is only set under this lock. */
    uv_async_send(&a->async);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* ---- drain idle (for mailbox.c) ------------------------------------------------------ */

static void on_drain_idle(uv_idle_t *h) {
    ac_actor *a = h->data;
    uv_idle_stop(h);
    a->drain_active = 0;
    ac__mailbox_drain_pending(a);
}

void ac__actor_want_drain(ac_actor *a) {
    if (a->drain_active || a->shutting_down) return;
    a->drain_active = 1;
    uv_idle_start(&a->drain, on_drain_idle);
}

/* ---- lifecycle ----------------------------------------------------------------------- */

int ac_actor_new(const ac_actor_opts *opts, ac_actor **out) {
    if (!out) return co_err_set(CO_EINVAL, "ac_actor_new: no output");
    *out = NULL;
    ac_actor *a = calloc(1, sizeof *a);
    if (!a) return co_err_set(CO_ENOMEM, "ac_actor_new: out of memory");
    if (opts) a->opts = *opts;
    snprintf(a->name, sizeof a->name, "%s", a->opts.name ? a->opts.name : "actor");
    a->opts.name = a->name;
    if (a->opts.start_timeout_ms <= 0) a->opts.start_timeout_ms = 10000;
    if (a->opts.stop_timeout_ms <= 0) a->opts.stop_timeout_ms = 10000;
    int rc = uv_loop_init(&a->loop);
    if (rc) {
        free(a);
        return co_err_set(CO_EINTERNAL, "actor: uv_loop_init: %s", uv_strerror(rc));
    }
    a->loop.data = a;
    uv_async_init(&a->loop, &a->async, on_async);
    a->async.data = a;
    uv_idle_init(&a->loop, &a->drain);
    a->drain.data = a;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    atomic_init(&a->stop_requested, 0);
    a->zctx = ac__ctx_ref();
    if (!a->zctx) {
        uv_close((uv_handle_t *)&a->async, NULL);
        uv_close((uv_handle_t *)&a->drain, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv);
        free(a);
        return co_err_set(CO_EINTERNAL, "actor: cannot create the ZeroMQ context");
    }
    *out = a;
    return 0;
}

static void set_state(ac_actor *a, int st, int rc) {
    pthread_mutex_lock(&a->mu);
    a->state = st;
    if (rc) a->start_rc = rc;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

int ac_actor_run(ac_actor *a) {
    if (!a) return co_err_set(CO_EINVAL, "ac_actor_run: no actor");
    set_state(a, ST_RUNNING, 0);
    int rc = 0;
    if (a->opts.on_start) rc = a->opts.on_start(a, a->opts.ctx);
    if (rc < 0) {
        snprintf(a->start_detail, sizeof a->start_detail, "%s", co_err_detail());
        pthread_mutex_lock(&a->mu);
        atomic_store(&a->stop_requested, 1); /* refuse posts from now on */
        pthread_mutex_unlock(&a->mu);
        shutdown_loop(a, 0);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        set_state(a, ST_ENDED, rc);
        return co_err_set(rc, "actor %s: start failed: %s", a->name, a->start_detail);
    }
    set_state(a, ST_READY, 0);
    /* A STOP requested before READY is already pending in the async handle. */
    uv_run(&a->loop, UV_RUN_DEFAULT);
    /* uv_run returns when no handles are left: only after shutdown closed them all. */
    if (!a->shutting_down) shutdown_loop(a, 1);
    while (uv_run(&a->loop, UV_RUN_NOWAIT)) {
    }
    set_state(a, ST_ENDED, 0);
    return 0;
}

static void free_actor(ac_actor *a) {
    int rc = uv_loop_close(&a->loop);
    for (int i = 0; rc == UV_EBUSY && i < 100; i++) {
        uv_walk(&a->loop, close_any, NULL);
        uv_run(&a->loop, UV_RUN_NOWAIT);
        rc = uv_loop_close(&a->loop);
    }
    ac__post *p = a->post_head;
    while (p) {
        ac__post *n = p->next;
        free(p);
        p = n;
    }
    ac__ctx_unref();
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

void ac_actor_destroy(ac_actor **ap) {
    if (!ap || !*ap) return;
    ac_actor *a = *ap;
    *ap = NULL;
    if (a->state == ST_NEW) {
        /* Never ran: close what ac_actor_new and any setup calls opened. */
        atomic_store(&a->stop_requested, 1);
        shutdown_loop(a, 0);
        uv_run(&a->loop, UV_RUN_DEFAULT);
    }
    free_actor(a);
}

static void *actor_thread(void *arg) {
    ac_actor *a = arg;
    char tname[16];
    memcpy(tname, a->name, sizeof tname - 1); /* Linux allows 15 characters */
    tname[sizeof tname - 1] = 0;
    pthread_setname_np(pthread_self(), tname);
    ac_actor_run(a);
    pthread_mutex_lock(&a->mu);
    int abandoned = a->abandoned;
    pthread_mutex_unlock(&a->mu);
    if (abandoned) free_actor(a);
    return NULL;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Marks the actor abandoned unless it already ended; returns 1 if it ended (caller frees). */
static int abandon(ac_actor *a) {
    pthread_mutex_lock(&a->mu);
    int ended = a->state == ST_ENDED;
    if (!ended) a->abandoned = 1;
    pthread_mutex_unlock(&a->mu);
    if (!ended) pthread_detach(a->thread);
    return ended;
}

static int join_bounded(ac_actor *a) {
    struct timespec ts;
    deadline_in(&ts, a->opts.stop_timeout_ms);
    pthread_mutex_lock(&a->mu);
    int rc = 0;
    while (a->state != ST_ENDED && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    int ended = a->state == ST_ENDED;
    pthread_mutex_unlock(&a->mu);
    if (!ended) {
        if (abandon(a)) ended = 1;
        else return co_err_set(CO_ETIMEOUT, "actor %s did not stop within %d ms", a->name,
                               a->opts.stop_timeout_ms);
    }
    /* ST_ENDED is set at the very end of the thread's work; the join is immediate. */
    pthread_join(a->thread, NULL);
    return 0;
}

int ac_actor_start(const ac_actor_opts *opts, ac_actor **out) {
    if (!out) return co_err_set(CO_EINVAL, "ac_actor_start: no output");
    ac_actor *a;
    int rc = ac_actor_new(opts, &a);
    if (rc) return rc;
    a->threaded = 1;
    rc = pthread_create(&a->thread, NULL, actor_thread, a);
    if (rc) {
        ac_actor_destroy(&a);
        return co_err_set(CO_EINTERNAL, "actor: pthread_create: %s", strerror(rc));
    }
    struct timespec ts;
    deadline_in(&ts, a->opts.start_timeout_ms);
    pthread_mutex_lock(&a->mu);
    int w = 0;
    while (a->state != ST_READY && a->state != ST_ENDED && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    int st = a->state, src = a->start_rc;
    pthread_mutex_unlock(&a->mu);
    if (st == ST_READY) {
        *out = a;
        return 0;
    }
    if (st == ST_ENDED) {
        char detail[400];
        snprintf(detail, sizeof detail, "actor %s: start failed: %s", a->name, a->start_detail);
        pthread_join(a->thread, NULL);
        free_actor(a);
        return co_err_set(src ? src : CO_EINTERNAL, "%s", detail);
    }
    ac_actor_request_stop(a);
    if (abandon(a)) {
        pthread_join(a->thread, NULL);
        free_actor(a);
    }
    return co_err_set(CO_ETIMEOUT, "actor did not become READY within %d ms",
                      opts && opts->start_timeout_ms > 0 ? opts->start_timeout_ms : 10000);
}

int ac_actor_stop(ac_actor **ap) {
    if (!ap || !*ap) return 0;
    ac_actor *a = *ap;
    *ap = NULL;
    if (!a->threaded) {
        ac_actor_destroy(&a);
        return 0;
    }
    ac_actor_request_stop(a);
    int rc = join_bounded(a);
    if (rc) return rc;
    free_actor(a);
    return 0;
}

uv_loop_t *ac_actor_loop(ac_actor *a) { return &a->loop; }
const char *ac_actor_name(const ac_actor *a) { return a->name; }

/* ---- timers -------------------------------------------------------------------------- */

static void timer_closed(uv_handle_t *h) { free(h->data); }

static void on_timer(uv_timer_t *h) {
    ac_timer *t = h->data;
    t->cb(t, t->ctx);
    if (t->autofree && !t->closing) {
        ac_timer *tt = t;
        ac_timer_stop(&tt);
    }
}

int ac_timer_start(ac_actor *a, uint64_t ms, uint64_t repeat_ms, ac_timer_fn cb, void *ctx,
                   ac_timer **out) {
    if (out) *out = NULL;
    if (!a || !cb) return co_err_set(CO_EINVAL, "ac_timer_start: no actor or callback");
    if (a->shutting_down) return co_err_set(CO_EABORTED, "actor %s is stopping", a->name);
    ac_timer *t = calloc(1, sizeof *t);
    if (!t) return co_err_set(CO_ENOMEM, "ac_timer_start: out of memory");
    t->a = a;
    t->cb = cb;
    t->ctx = ctx;
    t->autofree = !out && repeat_ms == 0;
    uv_timer_init(&a->loop, &t->h);
    t->h.data = t;
    t->next = a->timers;
    if (a->timers) a->timers->prev = t;
    a->timers = t;
    /* libuv 1.44 runs a 0 ms timer armed inside a timer callback in the same pass: one that
     * re-arms itself would starve the loop. 1 ms makes it wait for the next iteration. */
    uv_timer_start(&t->h, on_timer, ms ? ms : 1, repeat_ms);
    if (out) *out = t;
    return 0;
}

void ac_timer_stop(ac_timer **tp) {
    if (!tp || !*tp) return;
    ac_timer *t = *tp;
    *tp = NULL;
    if (t->closing) return;
    t->closing = 1;
    ac_actor *a = t->a;
    if (t->prev) t->prev->next = t->next;
    else a->timers = t->next;
    if (t->next) t->next->prev = t->prev;
    uv_timer_stop(&t->h);
    if (!uv_is_closing((uv_handle_t *)&t->h)) uv_close((uv_handle_t *)&t->h, timer_closed);
}
