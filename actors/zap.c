/* zap.c - the process's ZeroMQ context (shared by every actor, so inproc works between
 * them) and its ZAP handler: a thread answering on inproc://zeromq.zap.01 that admits a CURVE
 * client only if its public key is allowed on the request's domain. Fail closed: unknown
 * domain, other mechanism, unknown key, any malformed request -> "400"; every request, well
 * formed or not, is read whole and answered, so one bad request never stalls the next. */
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

enum { ZAP_FRAMES = 7 }; /* version, request id, domain, address, identity, mechanism, key */

/* Receives one whole multipart request, keeping its first max frames in f (the rest are
 * read and closed: the socket is never left inside a message). Returns the number of frames
 * the request had (0: nothing to read). A receive that fails after the first frame (not
 * EINTR, which is retried) still drains what ZMQ_RCVMORE announces. */
static int recv_frames(void *s, zmq_msg_t *f, int max, int *kept, int *broken) {
    int n = 0, more = 1, retries = 0;
    *kept = 0;
    *broken = 0;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc;
        do rc = zmq_msg_recv(&m, s, ZMQ_DONTWAIT);
        while (rc < 0 && zmq_errno() == EINTR);
        if (rc < 0) {
            zmq_msg_close(&m);
            if (n == 0) return 0; /* spurious wake-up: nothing was taken */
            *broken = 1;          /* cannot happen with ZeroMQ's atomic messages; be safe */
            int rm = 0;
            size_t sz = sizeof rm;
            if (zmq_getsockopt(s, ZMQ_RCVMORE, &rm, &sz) || !rm || ++retries > 100) break;
            continue; /* try the announced frames again */
        }
        more = zmq_msg_more(&m);
        n++;
        if (*kept < max) f[(*kept)++] = m;
        else zmq_msg_close(&m);
    }
    return n;
}

static void send_frame(void *s, const void *data, size_t len, int more) {
    int rc;
    do rc = zmq_send(s, data, len, more ? ZMQ_SNDMORE : 0);
    while (rc < 0 && zmq_errno() == EINTR);
}

static int frame_is(zmq_msg_t *m, const char *want) {
    size_t n = strlen(want);
    return zmq_msg_size(m) == n && !memcmp(zmq_msg_data(m), want, n);
}

/* One request, one reply, whatever came: a malformed request (too few or too many frames,
 * another version or mechanism, a field too long, a key not 32 bytes) is answered "400" like
 * an unknown key, so the REP socket always returns to reading the next request. */
static void handle_request(void *s) {
    zmq_msg_t f[ZAP_FRAMES + 1];
    int kept = 0, broken = 0;
    int n = recv_frames(s, f, ZAP_FRAMES + 1, &kept, &broken);
    if (n == 0) return;
    const char *why = "malformed request";
    int ok = 0;
    if (broken || n != ZAP_FRAMES) why = n < ZAP_FRAMES ? "too few frames" : "too many frames";
    else if (!frame_is(&f[0], "1.0")) why = "unsupported ZAP version";
    else if (zmq_msg_size(&f[1]) > 255 || zmq_msg_size(&f[2]) > 255 || zmq_msg_size(&f[3]) > 255 ||
             zmq_msg_size(&f[4]) > 255)
        why = "oversized frame";
    else if (!frame_is(&f[5], "CURVE")) why = "mechanism not allowed";
    else if (zmq_msg_size(&f[6]) != 32) why = "malformed CURVE key";
    else if (!(ok = allowed(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), zmq_msg_data(&f[6])))) why = "key not allowed";
    send_frame(s, "1.0", 3, 1);
    /* the request id is echoed when it is one (an oversized one is not: the reply must
     * still be small) */
    if (kept >= 2 && zmq_msg_size(&f[1]) <= 255) send_frame(s, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
    else send_frame(s, "", 0, 1);
    send_frame(s, ok ? "200" : "400", 3, 1);
    send_frame(s, ok ? "OK" : why, strlen(ok ? "OK" : why), 1);
    send_frame(s, ok ? "cohort" : "", ok ? 6 : 0, 1);
    send_frame(s, "", 0, 0);
    for (int i = 0; i < kept; i++) zmq_msg_close(&f[i]);
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
    /* never wait long on the socket: a reply that cannot go out in a second is dropped */
    int tmo = 1000;
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
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
