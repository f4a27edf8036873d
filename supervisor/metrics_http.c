/* metrics_http.c - serves the supervisor's Prometheus snapshot over HTTP with libmicrohttpd
 * (metrics_http.h). No HTTP parsing here: libmicrohttpd hands over method and path. */
#include "supervisor/metrics_http.h"

#include "common/error.h"

#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct svm {
    struct MHD_Daemon *d;
    bool starting;      /* libmicrohttpd's messages go to why (start-up), else nowhere */
    char why[300];
    pthread_mutex_t mu;
    char *text; /* the snapshot (NULL: none yet) */
    size_t len;
    unsigned long requests;
};

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result answer(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len) {
    /* (MHD_RESPMEM_MUST_FREE: libmicrohttpd frees body with free()) */
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    svm *m = cls;
    if (!*con_cls) { /* first call for this request: its headers only */
        *con_cls = (void *)1;
        return MHD_YES;
    }
    *upload_size = 0; /* a body, if any, is ignored */
    if (strcmp(url, "/metrics") != 0) {
        char *b = strdup("not found: the metrics are at /metrics\n");
        return b ? answer(c, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8", b, strlen(b)) : MHD_NO;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        char *b = strdup("method not allowed: GET /metrics\n");
        return b ? answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", b, strlen(b)) : MHD_NO;
    }
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

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    (void)cls;
    (void)c;
    (void)t;
    *con_cls = NULL;
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
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* every wait bounded: an idle connection is closed after 10 s; at most 16 at once */
    m->starting = true;
    m->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_log, m,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                            MHD_OPTION_NOTIFY_COMPLETED, on_done, (void *)NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!m->d) {
        int rc = co_err_set(CO_EIO, "--metrics-port: cannot serve HTTP on %s port %d: %s", addr, port,
                            m->why[0] ? m->why : "libmicrohttpd could not start");
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
    MHD_stop_daemon(m->d);
    pthread_mutex_destroy(&m->mu);
    free(m->text);
    free(m);
    *pm = NULL;
}
