/* metrics_http.c - serves the supervisor's Prometheus snapshot over HTTP with libmicrohttpd
 * (metrics_http.h). No HTTP parsing here: libmicrohttpd hands over method and path; this
 * file decides what a path means (the raw URI, percent-decoded) and bounds every request's
 * time (a watchdog thread cuts connections past their deadline). */
#include "supervisor/metrics_http.h"

#include "common/error.h"

#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Slow clients cannot hold the endpoint: a request must arrive and be answered within
 * SVM_DEADLINE_S of its connection's start (or of the previous answer on a kept-alive
 * connection), however slowly it trickles in, else the connection is cut; one address holds
 * at most SVM_PER_IP connections of SVM_SLOTS. */
#define SVM_DEADLINE_S 5
#define SVM_SLOTS 64
#define SVM_PER_IP 32

/* one open connection: its socket and when its current request's time began */
typedef struct svm_conn {
    int fd;
    uint64_t since_ms;
    bool cut;
    struct svm_conn *prev, *next;
} svm_conn;

struct svm {
    struct MHD_Daemon *d;
    bool starting;      /* libmicrohttpd's messages go to why (start-up), else nowhere */
    char why[300];
    pthread_mutex_t mu;
    char *text; /* the snapshot (NULL: none yet) */
    size_t len;
    unsigned long requests;
    svm_conn *conns; /* open connections (under mu) */
    pthread_t watchdog;
    pthread_cond_t wake;
    bool stopping, have_watchdog;
};

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_TYPE "text/plain; charset=utf-8"

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A request's state (its con_cls): what its path is, and whether its headers were seen. */
static char k_metrics, k_other, k_metrics_body, k_other_body;

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* True when the raw URI's path (before any '?'), percent-decoded, is exactly "/metrics":
 * "/%6detrics" is, "/metrics%00", "/metrics/" and a malformed escape are not. */
static bool is_metrics_path(const char *uri) {
    static const char want[] = "/metrics";
    size_t n = 0;
    for (const char *p = uri; *p && *p != '?'; n++) {
        int ch = (unsigned char)*p++;
        if (ch == '%') {
            int hi = hexval(p[0]), lo = hi < 0 ? -1 : hexval(p[1]);
            if (lo < 0) return false;
            ch = hi * 16 + lo;
            p += 2;
        }
        if (n >= sizeof want - 1 || ch != want[n]) return false;
    }
    return n == sizeof want - 1;
}

/* libmicrohttpd's URI log hook: called once per request with the raw URI (before its own
 * decoding, which would end "/metrics%00" at the NUL); its result is the request's con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)c;
    return is_metrics_path(uri) ? &k_metrics : &k_other;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len) {
    /* (MHD_RESPMEM_MUST_FREE: libmicrohttpd frees body with free()) */
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned code, const char *text) {
    char *b = strdup(text);
    return b ? answer(c, code, TEXT_TYPE, b, strlen(b)) : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)url; /* (decoded by libmicrohttpd: on_uri judged the raw one) */
    (void)version;
    (void)upload_data;
    svm *m = cls;
    if (*con_cls == &k_metrics || *con_cls == &k_other) { /* first call for this request: its headers only */
        *con_cls = *con_cls == &k_metrics ? &k_metrics_body : &k_other_body;
        return MHD_YES;
    }
    if (*upload_size) { /* a body (any method): read and dropped, then answered */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*con_cls != &k_metrics_body) return answer_text(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return answer_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET /metrics\n");
    pthread_mutex_lock(&m->mu);
    m->requests++;
    size_t len = m->text ? m->len : 0;
    char *copy = malloc(len + 1);
    if (copy && len) memcpy(copy, m->text, len);
    pthread_mutex_unlock(&m->mu);
    if (!copy) return MHD_NO;
    return answer(c, MHD_HTTP_OK, PROM_CONTENT_TYPE, copy, len);
}

/* libmicrohttpd's error messages: kept while starting (why a bind failed, for the error
 * message); later ones (a client that went away) are not worth the job's stderr. */
static void on_log(void *cls, const char *fmt, va_list ap) {
    svm *m = cls;
    char line[300];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    pthread_mutex_lock(&m->mu);
    if (m->starting) snprintf(m->why, sizeof m->why, "%s", line);
    pthread_mutex_unlock(&m->mu);
}

/* A request answered: the connection's next request has its own deadline. */
static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    svm *m = cls;
    (void)t;
    *con_cls = NULL;
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    svm_conn *k = i ? i->socket_context : NULL;
    if (!k) return;
    pthread_mutex_lock(&m->mu);
    k->since_ms = now_ms();
    pthread_mutex_unlock(&m->mu);
}

/* Connections opened and closed: the watchdog's list. libmicrohttpd closes the socket only
 * after the CLOSED call, so under mu a listed fd is always still this connection's. */
static void on_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode t) {
    svm *m = cls;
    svm_conn *k = *socket_context;
    if (t == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!i || !(k = calloc(1, sizeof *k))) return; /* (unwatched: still under the idle timeout) */
        k->fd = i->connect_fd;
        pthread_mutex_lock(&m->mu);
        k->since_ms = now_ms();
        k->next = m->conns;
        if (m->conns) m->conns->prev = k;
        m->conns = k;
        pthread_mutex_unlock(&m->mu);
        *socket_context = k;
    } else if (t == MHD_CONNECTION_NOTIFY_CLOSED && k) {
        pthread_mutex_lock(&m->mu);
        if (k->prev) k->prev->next = k->next;
        else m->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&m->mu);
        free(k);
        *socket_context = NULL;
    }
}

/* Every 200 ms: a connection past its deadline is shut down (both ways); libmicrohttpd's
 * thread then sees it end and closes it, freeing its slot. */
static void *watchdog(void *arg) {
    svm *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        uint64_t now = now_ms();
        for (svm_conn *k = m->conns; k; k = k->next)
            if (!k->cut && now - k->since_ms > SVM_DEADLINE_S * 1000u) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
            }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 200 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&m->wake, &m->mu, &until);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static void stop_watchdog(svm *m) {
    if (!m->have_watchdog) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->watchdog, NULL);
    m->have_watchdog = false;
}

int svm_start(svm **out, const char *addr, int port) {
    *out = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    int g = getaddrinfo(addr, portstr, &hints, &ai);
    if (g || !ai)
        return co_err_set(CO_EIO, "--metrics-port: resolving the address %s failed: %s", addr, gai_strerror(g));
    svm *m = calloc(1, sizeof *m);
    if (!m) {
        freeaddrinfo(ai);
        return co_err_set(CO_ENOMEM, "--metrics-port: out of memory");
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &ca);
    pthread_condattr_destroy(&ca);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* every wait bounded: an idle connection is closed after SVM_DEADLINE_S, and so is a
     * request that takes longer than that to arrive (the watchdog) */
    m->starting = true;
    m->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_log, m,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SVM_DEADLINE_S,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)SVM_SLOTS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)SVM_PER_IP, MHD_OPTION_URI_LOG_CALLBACK, on_uri, (void *)m,
                            MHD_OPTION_NOTIFY_CONNECTION, on_conn, (void *)m, MHD_OPTION_NOTIFY_COMPLETED, on_done,
                            (void *)m, MHD_OPTION_END);
    freeaddrinfo(ai);
    int perr = m->d ? pthread_create(&m->watchdog, NULL, watchdog, m) : 0;
    if (m->d && perr) {
        MHD_stop_daemon(m->d);
        m->d = NULL;
        snprintf(m->why, sizeof m->why, "cannot start its watchdog thread: %s", strerror(perr));
    }
    m->have_watchdog = m->d != NULL;
    if (!m->d) {
        int rc = co_err_set(CO_EIO, "--metrics-port: cannot serve HTTP on %s port %d: %s", addr, port,
                            m->why[0] ? m->why : "libmicrohttpd could not start");
        pthread_cond_destroy(&m->wake);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return rc;
    }
    pthread_mutex_lock(&m->mu);
    m->starting = false;
    pthread_mutex_unlock(&m->mu);
    *out = m;
    return 0;
}

void svm_publish(svm *m, char *text) {
    if (!m || !text) return;
    size_t len = strlen(text);
    pthread_mutex_lock(&m->mu);
    char *old = m->text;
    m->text = text;
    m->len = len;
    pthread_mutex_unlock(&m->mu);
    free(old);
}

int svm_port(svm *m) {
    const union MHD_DaemonInfo *i = m ? MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT) : NULL;
    return i ? (int)i->port : -1;
}

unsigned long svm_requests(svm *m) {
    if (!m) return 0;
    pthread_mutex_lock(&m->mu);
    unsigned long n = m->requests;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void svm_stop(svm **pm) {
    svm *m = *pm;
    if (!m) return;
    stop_watchdog(m);
    MHD_stop_daemon(m->d);
    pthread_cond_destroy(&m->wake);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
    *pm = NULL;
}
