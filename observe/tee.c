/* tee.c - the metrics stream of a process that writes TensorBoard events (see
 * ob_tee_open in tensorboard.h): a fopencookie stream that passes every byte on to the
 * metrics file and every complete line (one record) to the TensorBoard writer. The
 * trainer and the supervisor keep writing records with fprintf/fflush as before. */
#include "observe/tensorboard.h"

#include "common/error.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>

typedef struct tee {
    FILE *file;
    ob_tb *tb;
    char *line;
    size_t len, cap;
    bool warned;
} tee;

static void warn(tee *t, int rc) {
    if (t->warned || !rc) return;
    t->warned = true;
    co_log(CO_LOG_WARN, "TensorBoard: %s; no more events are written (the metrics file goes on)",
            co_err_detail()[0] ? co_err_detail() : co_strerror(rc));
}

static ssize_t tee_write(void *c, const char *buf, size_t n) {
    tee *t = c;
    if (t->file && fwrite(buf, 1, n, t->file) != n) return -1;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            if (t->len) warn(t, ob_tb_record(t->tb, t->line, t->len));
            t->len = 0;
            continue;
        }
        if (t->len + 1 > t->cap) {
            size_t cap = t->cap ? 2 * t->cap : 1024;
            char *l = realloc(t->line, cap);
            if (!l) return -1;
            t->line = l;
            t->cap = cap;
        }
        t->line[t->len++] = buf[i];
    }
    /* the writer flushed its record: so does the file (as when it wrote the file itself) */
    if (t->file) fflush(t->file);
    return (ssize_t)n;
}

static int tee_close(void *c) {
    tee *t = c;
    if (t->len) warn(t, ob_tb_record(t->tb, t->line, t->len));
    int rc = 0;
    warn(t, ob_tb_close(&t->tb));
    if (t->file && fclose(t->file)) rc = -1;
    free(t->line);
    free(t);
    return rc;
}

FILE *ob_tee_open(FILE *file, ob_tb *tb) {
    tee *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->file = file;
    t->tb = tb;
    cookie_io_functions_t io = {.write = tee_write, .close = tee_close};
    FILE *f = fopencookie(t, "w", io);
    if (!f) {
        free(t);
        return NULL;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 16);
    return f;
}
