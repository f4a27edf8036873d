/* internal.h - the actor runtime's private structures and cross-file helpers (ac__ names).
 * Not for use outside actors/. */
#ifndef COHORT_ACTORS_INTERNAL_H
#define COHORT_ACTORS_INTERNAL_H

#include "actors/actor.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct ac__post {
    void (*fn)(ac_actor *a, void *ctx);
    void *ctx;
    struct ac__post *next;
} ac__post;

struct ac_timer {
    uv_timer_t h;
    ac_actor *a;
    ac_timer_fn cb;
    void *ctx;
    int autofree;  /* one-shot with no owner: frees itself after firing */
    int closing;
    ac_timer *prev, *next;
};

struct ac_actor {
    char name[64];
    ac_actor_opts opts;
    uv_loop_t loop;
    uv_async_t async;    /* wakes the loop for posts and STOP */
    uv_idle_t drain;     /* runs deferred mailbox drains (ZMQ_FD is edge-triggered) */
    int drain_active;
    void *zctx;          /* the process's ZeroMQ context (a reference) */

    pthread_mutex_t mu;  /* guards the fields below */
    pthread_cond_t cv;
    ac__post *post_head, *post_tail;
    atomic_int stop_requested;
    int state;           /* 0 new, 1 running, 2 ready, 3 ended */
    int start_rc;        /* on_start's code */
    char start_detail[256];
    int abandoned;       /* the starter gave up waiting: the thread frees the actor */
    int threaded;
    pthread_t thread;

    int shutting_down;   /* loop side: shutdown began */
    ac_mailbox *mailboxes;
    ac_timer *timers;
};

/* mailbox.c */
void ac__mailbox_close_all(ac_actor *a);
void ac__mailbox_drain_pending(ac_actor *a); /* runs drains the idle handle deferred */
void ac__actor_want_drain(ac_actor *a);       /* starts the idle handle */

/* zap.c: the process-wide ZeroMQ context and ZAP handler. */
void *ac__ctx_ref(void);
void ac__ctx_unref(void);
/* Admits clients with the binary 32-byte public key on domain (reference counted). */
int ac__zap_allow(const char *domain, const uint8_t key[32]);
void ac__zap_disallow(const char *domain, const uint8_t key[32]);

#endif
