/* zmq_auth.c - CURVE on the data plane: rank keys derived from the job secret and the ZAP
 * handler that turns a proven key into the peer's rank (see zmq_auth.h).
 *
 * Why per-rank keys: with one shared client key, every job member proves only "I am in the
 * job"; the rank it then claims would be its own word. Here each rank authenticates with its
 * own keypair, the handler maps the key to the rank, and ZeroMQ attaches that rank to every
 * message of the connection as User-Id metadata, which the receiver trusts instead of the
 * routing id. The handler fails closed: another domain, mechanism or key, or a malformed
 * request, is answered 400; each request is read whole, so a bad one never stalls the next. */
#include "comm/zmq_auth.h"

#include "common/error.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static const char k_label[] = "cohort data plane rank";

int cm__rank_keypair(const char *client_secret_z85, int rank, char pub[41], char sec[41]) {
    uint8_t job[32], msg[sizeof k_label + 4], sk[32];
    if (!client_secret_z85 || strlen(client_secret_z85) != 40 || !zmq_z85_decode(job, client_secret_z85))
        return co_err_set(CO_EINVAL, "data-plane CURVE: the job's client secret key is not 40 Z85 characters");
    if (!zmq_has("curve")) return co_err_set(CO_EUNSUPPORTED, "data-plane CURVE: libzmq was built without CURVE");
    if (sodium_init() < 0) return co_err_set(CO_EUNSUPPORTED, "data-plane CURVE: libsodium failed to start");
    memcpy(msg, k_label, sizeof k_label);
    for (int i = 0; i < 4; i++) msg[sizeof k_label + i] = (uint8_t)((uint32_t)rank >> (8 * i));
    crypto_generichash(sk, sizeof sk, msg, sizeof msg, job, sizeof job);
    int rc = zmq_z85_encode(sec, sk, 32) && zmq_curve_public(pub, sec) == 0
                 ? 0
                 : co_err_set(CO_EINTERNAL, "data-plane CURVE: deriving rank %d's key: %s", rank,
                              zmq_strerror(zmq_errno()));
    sodium_memzero(job, sizeof job);
    sodium_memzero(sk, sizeof sk);
    return rc;
}

typedef struct {
    uint8_t key[32];
    int rank;
} zap_key;

struct cm__zap {
    void *sock;
    pthread_t thread;
    atomic_int stop;
    int n;
    zap_key *keys; /* sorted by key */
};

static int key_cmp(const void *a, const void *b) { return memcmp(a, b, 32); }

/* ZAP 1.0 request: version, request id, domain, address, identity, mechanism, credentials */
#define ZAP_FRAMES 7

static void send_frame(void *s, const void *p, size_t n, int more) {
    zmq_send(s, p, n, more ? ZMQ_SNDMORE : 0);
}

static bool frame_is(zmq_msg_t *m, const char *want) {
    size_t n = strlen(want);
    return zmq_msg_size(m) == n && !memcmp(zmq_msg_data(m), want, n);
}

static void handle(cm__zap *z) {
    zmq_msg_t f[ZAP_FRAMES];
    int n = 0;
    bool more = true, broken = false;
    while (more) {
        zmq_msg_t x;
        zmq_msg_init(&x);
        /* never blocks: poll said a request is there, and its frames arrive together */
        if (zmq_msg_recv(&x, z->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&x);
            broken = true;
            break;
        }
        more = zmq_msg_more(&x);
        if (n < ZAP_FRAMES) f[n++] = x;
        else {
            zmq_msg_close(&x);
            broken = true;
        }
    }
    if (broken && n == 0) return;
    const char *why = "malformed request";
    int rank = -1;
    if (broken || n != ZAP_FRAMES) why = "wrong number of frames";
    else if (!frame_is(&f[0], "1.0")) why = "unsupported ZAP version";
    else if (!frame_is(&f[2], CM__ZAP_DOMAIN)) why = "domain not allowed";
    else if (!frame_is(&f[5], "CURVE")) why = "mechanism not allowed";
    else if (zmq_msg_size(&f[6]) != 32) why = "malformed CURVE key";
    else {
        zap_key *k = bsearch(zmq_msg_data(&f[6]), z->keys, (size_t)z->n, sizeof *z->keys, key_cmp);
        if (k) rank = k->rank;
        else why = "key not allowed";
    }
    char uid[16] = "";
    if (rank >= 0) snprintf(uid, sizeof uid, "%d", rank);
    send_frame(z->sock, "1.0", 3, 1);
    if (n >= 2 && zmq_msg_size(&f[1]) <= 255) send_frame(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
    else send_frame(z->sock, "", 0, 1);
    send_frame(z->sock, rank >= 0 ? "200" : "400", 3, 1);
    send_frame(z->sock, rank >= 0 ? "OK" : why, strlen(rank >= 0 ? "OK" : why), 1);
    send_frame(z->sock, uid, strlen(uid), 1);
    send_frame(z->sock, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg) {
    cm__zap *z = arg;
    pthread_setname_np(pthread_self(), "cohort-dzap");
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t it = {.socket = z->sock, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&it, 1, 50);
        if (rc > 0 && (it.revents & ZMQ_POLLIN)) handle(z);
        else if (rc < 0 && zmq_errno() == ETERM) break;
    }
    return NULL;
}

int cm__zap_start(void *ctx, const char *client_secret_z85, int size, int self, cm__zap **out) {
    *out = NULL;
    cm__zap *z = calloc(1, sizeof *z);
    if (!z || !(z->keys = calloc((size_t)size, sizeof *z->keys))) {
        free(z);
        return co_err_set(CO_ENOMEM, "data-plane ZAP handler");
    }
    int rc = 0;
    for (int r = 0; r < size && !rc; r++) {
        if (r == self) continue;
        char pub[41], sec[41];
        rc = cm__rank_keypair(client_secret_z85, r, pub, sec);
        sodium_memzero(sec, sizeof sec);
        if (!rc) {
            zmq_z85_decode(z->keys[z->n].key, pub);
            z->keys[z->n++].rank = r;
        }
    }
    if (!rc) qsort(z->keys, (size_t)z->n, sizeof *z->keys, key_cmp);
    if (!rc && !(z->sock = zmq_socket(ctx, ZMQ_REP)))
        rc = co_err_set(CO_EIO, "data-plane ZAP socket: %s", zmq_strerror(zmq_errno()));
    if (!rc) {
        int zero = 0, tmo = 1000; /* a reply that cannot go out in a second is dropped */
        zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(z->sock, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
        if (zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0)
            rc = co_err_set(CO_EIO, "data-plane ZAP bind: %s", zmq_strerror(zmq_errno()));
    }
    if (!rc) {
        int e = pthread_create(&z->thread, NULL, zap_main, z);
        if (e) rc = co_err_set(CO_EIO, "data-plane ZAP thread: %s", strerror(e));
    }
    if (rc) {
        if (z->sock) zmq_close(z->sock);
        free(z->keys);
        free(z);
        return rc;
    }
    *out = z;
    return 0;
}

void cm__zap_stop(cm__zap **zp) {
    cm__zap *z = zp ? *zp : NULL;
    if (!z) return;
    atomic_store(&z->stop, 1);
    pthread_join(z->thread, NULL); /* it polls in 50 ms slices */
    zmq_close(z->sock);
    free(z->keys);
    free(z);
    *zp = NULL;
}

int cm__zap_rank(const char *user_id, int size) {
    if (!user_id || !*user_id || strlen(user_id) > 10) return -1;
    long v = 0;
    for (const char *p = user_id; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v < size ? (int)v : -1;
}
