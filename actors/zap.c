/* zap.c - the process's ZeroMQ context (shared by every actor, so inproc works between
 * them) and its ZAP handler: a thread answering on inproc://zeromq.zap.01 that admits a CURVE
 * client only if its public key is allowed on the request's domain. Fail closed: unknown
 * domain, other mechanism, unknown key -> "400". */
#include "actors/internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

typedef struct zap_entry {
    char domain[256];
    uint8_t key[32];
    int refs;
    struct zap_entry *next;
} zap_entry;

static pthread_mutex_t g_life = PTHREAD_MUTEX_INITIALIZER; /* context and ZAP thread */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;   /* the allowed keys */
static void *g_ctx;
static int g_refs;
static zap_entry *g_allowed;
static void *g_zap_sock; /* owned by the ZAP thread once it runs */
static pthread_t g_zap_thread;
static int g_zap_running;
static atomic_int g_zap_stop;

void *ac__ctx_ref(void) {
    pthread_mutex_lock(&g_life);
    if (!g_ctx) {
        g_ctx = zmq_ctx_new();
        if (g_ctx) zmq_ctx_set(g_ctx, ZMQ_BLOCKY, 0);
    }
    void *c = g_ctx;
    if (c) g_refs++;
    pthread_mutex_unlock(&g_life);
    return c;
}

void ac__ctx_unref(void) {
    pthread_mutex_lock(&g_life);
    if (--g_refs > 0) {
        pthread_mutex_unlock(&g_life);
        return;
    }
    if (g_zap_running) {
        atomic_store(&g_zap_stop, 1);
        pthread_join(g_zap_thread, NULL); /* the thread polls with a 50 ms timeout */
        g_zap_running = 0;
    }
    /* Every socket is closed with LINGER 0 by now and BLOCKY is off: term is prompt. */
    if (g_ctx) zmq_ctx_term(g_ctx);
    g_ctx = NULL;
    pthread_mutex_unlock(&g_life);
}

static int allowed(const char *domain, size_t dlen, const uint8_t *key) {
    int ok = 0;
    pthread_mutex_lock(&g_mu);
    for (zap_entry *e = g_allowed; e && !ok; e = e->next)
        ok = strlen(e->domain) == dlen && !memcmp(e->domain, domain, dlen) &&
             !memcmp(e->key, key, 32);
    pthread_mutex_unlock(&g_mu);
    return ok;
}

/* Receives one multipart request into frames (at most 8); returns the count or -1. */
static int recv_frames(void *s, zmq_msg_t *f, int max) {
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            return n > 0 ? -n - 1 : -1;
        }
        more = zmq_msg_more(&m);
        if (n < max) f[n++] = m;
        else zmq_msg_close(&m);
    }
    return n;
}

static void send_str(void *s, const void *data, size_t len, int more) {
    zmq_send(s, data, len, more ? ZMQ_SNDMORE : 0);
}

static void handle_request(void *s) {
    zmq_msg_t f[8];
    int n = recv_frames(s, f, 8);
    if (n < 0) {
        for (int i = 0; i < -n - 1; i++) zmq_msg_close(&f[i]);
        return;
    }
    /* version, request id, domain, address, identity, mechanism, credentials... */
    int ok = 0;
    if (n >= 7 && zmq_msg_size(&f[0]) == 3 && !memcmp(zmq_msg_data(&f[0]), "1.0", 3) &&
        zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) &&
        zmq_msg_size(&f[6]) == 32)
        ok = allowed(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), zmq_msg_data(&f[6]));
    send_str(s, "1.0", 3, 1);
    if (n >= 2) send_str(s, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
    else send_str(s, "", 0, 1);
    send_str(s, ok ? "200" : "400", 3, 1);
    send_str(s, ok ? "OK" : "key not allowed", ok ? 2 : 15, 1);
    send_str(s, ok ? "cohort" : "", ok ? 6 : 0, 1);
    send_str(s, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *zap_thread(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "cohort-zap");
    void *s = g_zap_sock;
    while (!atomic_load(&g_zap_stop)) {
        zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&it, 1, 50);
        if (rc > 0 && (it.revents & ZMQ_POLLIN)) handle_request(s);
        else if (rc < 0 && zmq_errno() == ETERM) break;
    }
    zmq_close(s);
    return NULL;
}

/* With g_life held. */
static int start_zap(void) {
    if (g_zap_running) return 0;
    void *s = zmq_socket(g_ctx, ZMQ_REP);
    if (!s) return co_err_set(CO_EINTERNAL, "ZAP socket: %s", zmq_strerror(zmq_errno()));
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(s, "inproc://zeromq.zap.01") != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return co_err_set(CO_EINTERNAL, "ZAP bind: %s", zmq_strerror(e));
    }
    g_zap_sock = s;
    atomic_store(&g_zap_stop, 0);
    int rc = pthread_create(&g_zap_thread, NULL, zap_thread, NULL);
    if (rc) {
        zmq_close(s);
        return co_err_set(CO_EINTERNAL, "ZAP thread: %s", strerror(rc));
    }
    g_zap_running = 1;
    return 0;
}

int ac__zap_allow(const char *domain, const uint8_t key[32]) {
    if (strlen(domain) >= sizeof g_allowed->domain)
        return co_err_set(CO_EINVAL, "ZAP domain too long");
    pthread_mutex_lock(&g_life);
    int rc = g_ctx ? start_zap() : co_err_set(CO_EINTERNAL, "no ZeroMQ context");
    pthread_mutex_unlock(&g_life);
    pthread_mutex_lock(&g_mu);
    if (rc == 0) {
        zap_entry *e = g_allowed;
        while (e && (strcmp(e->domain, domain) || memcmp(e->key, key, 32))) e = e->next;
        if (e) e->refs++;
        else if (!(e = calloc(1, sizeof *e))) rc = co_err_set(CO_ENOMEM, "ZAP: out of memory");
        else {
            strcpy(e->domain, domain);
            memcpy(e->key, key, 32);
            e->refs = 1;
            e->next = g_allowed;
            g_allowed = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

void ac__zap_disallow(const char *domain, const uint8_t key[32]) {
    pthread_mutex_lock(&g_mu);
    for (zap_entry **pp = &g_allowed; *pp; pp = &(*pp)->next) {
        zap_entry *e = *pp;
        if (strcmp(e->domain, domain) || memcmp(e->key, key, 32)) continue;
        if (--e->refs == 0) {
            *pp = e->next;
            free(e);
        }
        break;
    }
    pthread_mutex_unlock(&g_mu);
}
