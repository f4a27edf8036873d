/* metrics_local.c - the Prometheus endpoint of a single-process job (metrics_local.h). The
 * trainer's thread writes records; each complete line is parsed and the snapshot rendered
 * and published there (metrics_http.c copies it under its mutex for the HTTP thread). */
#include "worker/metrics_local.h"

#include "common/error.h"
#include "supervisor/metrics_http.h"
#include "supervisor/msg.h"
#include "supervisor/status.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct svl {
    svm *http;
    svo *obs;
    FILE *file;      /* --metrics-file, or NULL */
    FILE *stream;    /* the trainer's */
    char line[8192]; /* a record being written */
    size_t n;
    char host[64];
    int64_t save_interval, train_iters;
    const char *save_dir;
    uint64_t t0, last_ms; /* started; the latest snapshot published */
};

static void publish(svl *l) {
    svo_rank r = {.rank = 0, .node = 0, .pid = (uint32_t)getpid(), .host = l->host, .alive = true};
    svo_job j = {.pid = (int)getpid(), .job_id = 0, .generation = 1, .state = "training", .world = 1, .nnodes = 1,
                 .nslots = 1, .ranks = &r, .save_interval = l->save_interval, .train_iters = l->train_iters,
                 .save_dir = l->save_dir, .ckpt_last = -1, .uptime_s = (double)(sv__now_ms() - l->t0) / 1000.0};
    svm_publish(l->http, svo_prometheus(l->obs, &j, NULL));
}

static ssize_t on_write(void *cookie, const char *buf, size_t n) {
    svl *l = cookie;
    if (l->file && (fwrite(buf, 1, n, l->file) != n || fflush(l->file))) return -1;
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            l->line[l->n] = '\0';
            svo_on_record(l->obs, l->line);
            l->n = 0;
            any = true;
        } else if (l->n < sizeof l->line - 1) {
            l->line[l->n++] = buf[i];
        }
    }
    /* (at most 5 snapshots a second: a fast job logs hundreds of records a second) */
    if (any && sv__now_ms() - l->last_ms >= 200) {
        l->last_ms = sv__now_ms();
        publish(l);
    }
    return (ssize_t)n;
}

/* The stream closed by its user (a stream that forwards to it, observe/tee.c, closes it). */
static int on_close(void *cookie) {
    ((svl *)cookie)->stream = NULL;
    return 0;
}

int svl_start(svl **out, int port, const char *metrics_file, int64_t save_interval, int64_t train_iters,
              const char *save_dir, FILE **stream) {
    *out = NULL;
    *stream = NULL;
    svl *l = calloc(1, sizeof *l);
    if (!l) return co_err_set(CO_ENOMEM, "--metrics-port: out of memory");
    l->save_interval = save_interval;
    l->train_iters = train_iters;
    l->save_dir = save_dir ? save_dir : "";
    l->t0 = sv__now_ms();
    if (gethostname(l->host, sizeof l->host)) l->host[0] = '\0';
    l->host[sizeof l->host - 1] = '\0';
    int rc = svo_new(&l->obs);
    if (!rc && metrics_file && *metrics_file && !(l->file = fopen(metrics_file, "a")))
        rc = co_err_set(CO_EIO, "cannot open --metrics-file %s", metrics_file);
    if (!rc) rc = svm_start(&l->http, "127.0.0.1", port);
    cookie_io_functions_t io = {.write = on_write, .close = on_close};
    if (!rc && !(l->stream = fopencookie(l, "w", io))) rc = co_err_set(CO_ENOMEM, "--metrics-port: the records' stream");
    if (rc) {
        svl_stop(&l);
        return rc;
    }
    setvbuf(l->stream, NULL, _IOLBF, 8192);
    publish(l);
    *out = l;
    *stream = l->stream;
    return 0;
}

void svl_stop(svl **pl) {
    svl *l = *pl;
    if (!l) return;
    if (l->stream) fclose(l->stream);
    svm_stop(&l->http);
    if (l->file) fclose(l->file);
    svo_destroy(&l->obs);
    free(l);
    *pl = NULL;
}
