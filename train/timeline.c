/* timeline.c - the per-rank recorder of a training step's operations and its reader
 * (train/timeline.h; the file format and the rules for killed processes are described
 * there, the command that draws the files is cli/cmd_timeline.c). */
#include "train/timeline.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TL_TEXT_BUF 65536 /* formatted lines are written in pieces of at most this */
#define TL_LINE_MAX 256   /* one event line is shorter (times are checked in tl_event) */
#define TL_MAX_TIME 1e11  /* seconds: a time beyond (year 5138) is a caller's bug */

struct tl_rec {
    int fd;
    char path[4096];
    tl_meta meta;
    tl_record *buf;
    int cap;
    atomic_size_t n;           /* reserved slots; may pass cap (those events are dropped) */
    atomic_llong bad;          /* events dropped for their times since the last flush */
    int64_t dropped_total;
    char *text;                /* TL_TEXT_BUF bytes */
};

static const char *const kind_names[TL_NKINDS] = {"forward", "backward", "recv_wait", "send", "dp_reduce",
                                                  "embed_reduce", "tp_comm", "optimizer", "data", "other"};

const char *tl_kind_name(tl_kind k) { return (unsigned)k < TL_NKINDS ? kind_names[k] : "other"; }

int tl_kind_from_name(const char *name) {
    for (int k = 0; k < TL_NKINDS; k++)
        if (!strcmp(name, kind_names[k])) return k;
    return -1;
}

double tl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tl_meta_check(const tl_meta *m) {
    if (!m) return co_err_set(CO_EINVAL, "timeline: no layout given");
    if (m->tp < 1 || m->pp < 1 || m->dp < 1 || m->v < 1 || m->m < 1 || m->world < 1)
        return co_err_set(CO_EINVAL, "timeline: sizes must be positive (world %d, tp %d, pp %d, dp %d, v %d, m %d)",
                          m->world, m->tp, m->pp, m->dp, m->v, m->m);
    if (m->world > (1 << 20) || m->v > 1024 || m->m > (1 << 24)) /* beyond any job: a corrupt header */
        return co_err_set(CO_EINVAL, "timeline: world %d, v %d or m %d is absurd", m->world, m->v, m->m);
    if ((int64_t)m->tp * m->pp * m->dp != m->world)
        return co_err_set(CO_EINVAL, "timeline: world %d is not tp %d x pp %d x dp %d", m->world, m->tp, m->pp, m->dp);
    if (m->rank < 0 || m->rank >= m->world || m->tp_rank < 0 || m->tp_rank >= m->tp || m->pp_rank < 0 ||
        m->pp_rank >= m->pp || m->dp_rank < 0 || m->dp_rank >= m->dp)
        return co_err_set(CO_EINVAL, "timeline: rank %d (tp %d, pp %d, dp %d) is outside the layout %d = %d x %d x %d",
                          m->rank, m->tp_rank, m->pp_rank, m->dp_rank, m->world, m->tp, m->pp, m->dp);
    return 0;
}

int tl_default_capacity(const tl_meta *meta) {
    int64_t c = 16 * (int64_t)(meta && meta->m > 0 ? meta->m : 1) * (meta && meta->v > 0 ? meta->v : 1) + 256;
    if (c < 4096) c = 4096;
    if (c > (1 << 24)) c = 1 << 24;
    return (int)c;
}

/* Writes all of buf (retrying partial writes and EINTR). 0 or a CO_E* code with detail. */
static int write_all(int fd, const char *path, const char *buf, size_t len, const char *what) {
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return co_err_set(fs_errno_code(e), "timeline: writing %s to %s: %s", what, path, strerror(e));
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

int tl_open(tl_rec **out, const char *dir, const tl_meta *meta) {
    return tl_open_capacity(out, dir, meta, tl_default_capacity(meta));
}

int tl_open_capacity(tl_rec **out, const char *dir, const tl_meta *meta, int capacity) {
    *out = NULL;
    int rc = tl_meta_check(meta);
    if (rc) return rc;
    if (!dir || !*dir) return co_err_set(CO_EINVAL, "timeline: no directory given");
    if (capacity < 1) return co_err_set(CO_EINVAL, "timeline: buffer capacity %d is not positive", capacity);
    rc = fs_mkdirs(dir);
    if (rc) return co_err_set(rc, "timeline: %s", co_err_detail());
    tl_rec *r = calloc(1, sizeof *r);
    if (!r) return co_err_set(CO_ENOMEM, "timeline: out of memory for the recorder");
    r->fd = -1;
    r->meta = *meta;
    r->cap = capacity;
    r->buf = malloc(sizeof *r->buf * (size_t)capacity);
    r->text = malloc(TL_TEXT_BUF);
    if (!r->buf || !r->text) {
        rc = co_err_set(CO_ENOMEM, "timeline: out of memory for a buffer of %d events", capacity);
        goto fail;
    }
    atomic_init(&r->n, 0);
    atomic_init(&r->bad, 0);
    if (snprintf(r->path, sizeof r->path, "%s/timeline-rank-%05d.jsonl", dir, meta->rank) >= (int)sizeof r->path) {
        rc = co_err_set(CO_EINVAL, "timeline: directory name too long: %s", dir);
        goto fail;
    }
    r->fd = open(r->path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0666); /* read: its last byte */
    if (r->fd < 0) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "timeline: opening %s: %s", r->path, strerror(e));
        goto fail;
    }
    /* an earlier process killed in the middle of a line: start on a fresh line */
    struct stat st;
    if (fstat(r->fd, &st) == 0 && st.st_size > 0) {
        char last = '\n';
        if (pread(r->fd, &last, 1, st.st_size - 1) == 1 && last != '\n' &&
            (rc = write_all(r->fd, r->path, "\n", 1, "a line end")))
            goto fail;
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1)) host[0] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '?';
    int len = snprintf(r->text, TL_TEXT_BUF,
                       "{\"timeline\":1,\"rank\":%d,\"world\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"tp_rank\":%d,"
                       "\"pp_rank\":%d,\"dp_rank\":%d,\"v\":%d,\"m\":%d,\"clock\":\"realtime_us\",\"pid\":%ld,"
                       "\"host\":\"%s\"}\n",
                       meta->rank, meta->world, meta->tp, meta->pp, meta->dp, meta->tp_rank, meta->pp_rank,
                       meta->dp_rank, meta->v, meta->m, (long)getpid(), host);
    rc = write_all(r->fd, r->path, r->text, (size_t)len, "the header");
    if (rc) goto fail;
    *out = r;
    return 0;
fail:
    if (r->fd >= 0) close(r->fd);
    free(r->buf);
    free(r->text);
    free(r);
    return rc;
}

void tl_event(tl_rec *r, tl_kind k, int64_t iteration, int mb, int chunk, double t0, double t1) {
    if (!r) return;
    if (!(t0 >= 0 && t0 <= t1 && t1 < TL_MAX_TIME)) { /* false for NaN too */
        atomic_fetch_add_explicit(&r->bad, 1, memory_order_relaxed);
        return;
    }
    size_t i = atomic_fetch_add_explicit(&r->n, 1, memory_order_relaxed);
    if (i >= (size_t)r->cap) return; /* counted at the flush: n - cap */
    tl_record *e = &r->buf[i];
    e->kind = (unsigned)k < TL_NKINDS ? k : TL_OTHER;
    e->iteration = iteration;
    e->mb = mb;
    e->chunk = chunk;
    e->t0 = llround(t0 * 1e6);
    e->t1 = llround(t1 * 1e6);
}

int tl_flush(tl_rec *r) {
    if (!r) return 0;
    size_t n = atomic_load(&r->n);
    int64_t bad = atomic_load(&r->bad);
    size_t kept = n < (size_t)r->cap ? n : (size_t)r->cap;
    int64_t dropped = (int64_t)(n - kept) + bad;
    atomic_store(&r->n, 0);
    atomic_store(&r->bad, 0);
    r->dropped_total += dropped;
    if (kept == 0 && dropped == 0) return 0;
    int64_t last = INT64_MIN;
    size_t len = 0;
    int rc = 0;
    for (size_t i = 0; i < kept && !rc; i++) {
        const tl_record *e = &r->buf[i];
        if (e->iteration > last) last = e->iteration;
        if (len + TL_LINE_MAX > TL_TEXT_BUF) {
            rc = write_all(r->fd, r->path, r->text, len, "events");
            len = 0;
        }
        len += (size_t)snprintf(r->text + len, TL_TEXT_BUF - len,
                                "{\"k\":\"%s\",\"it\":%lld,\"mb\":%d,\"c\":%d,\"t0\":%lld,\"t1\":%lld}\n",
                                kind_names[e->kind], (long long)e->iteration, e->mb, e->chunk, (long long)e->t0,
                                (long long)e->t1);
    }
    if (rc) return rc;
    if (kept == 0) last = -1; /* only dropped events: the block names no iteration */
    len += (size_t)snprintf(r->text + len, TL_TEXT_BUF - len, "{\"end\":%lld,\"events\":%zu,\"dropped\":%lld}\n",
                            (long long)last, kept, (long long)dropped);
    return write_all(r->fd, r->path, r->text, len, "events");
}

void tl_discard(tl_rec *r) {
    if (!r) return;
    atomic_store(&r->n, 0);
    atomic_store(&r->bad, 0);
}

int64_t tl_dropped(const tl_rec *r) {
    if (!r) return 0;
    tl_rec *w = (tl_rec *)r;
    size_t n = atomic_load(&w->n);
    return r->dropped_total + atomic_load(&w->bad) + (int64_t)(n > (size_t)r->cap ? n - (size_t)r->cap : 0);
}

void tl_close(tl_rec **rp) {
    if (!rp || !*rp) return;
    tl_rec *r = *rp;
    if (r->fd >= 0) close(r->fd);
    free(r->buf);
    free(r->text);
    free(r);
    *rp = NULL;
}

/* ---- reading ---- */

/* An int member of o into *v; false when absent, not an integer or out of int range. */
static bool get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *v) {
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x)) return false;
    json_int_t i = json_integer_value(x);
    if (i < lo || i > hi) return false;
    *v = i;
    return true;
}

static int parse_header(json_t *o, tl_meta *m) {
    static const char *const keys[10] = {"rank", "world", "tp", "pp", "dp", "tp_rank", "pp_rank", "dp_rank", "v", "m"};
    int *dst[10] = {&m->rank, &m->world, &m->tp, &m->pp, &m->dp, &m->tp_rank, &m->pp_rank, &m->dp_rank, &m->v, &m->m};
    int64_t ver;
    if (!get_int(o, "timeline", 1, 1, &ver)) return -1;
    for (int i = 0; i < 10; i++) {
        int64_t x;
        if (!get_int(o, keys[i], INT_MIN, INT_MAX, &x)) return -1;
        *dst[i] = (int)x;
    }
    return 0;
}

static bool is_header_line(const char *s, size_t len) {
    static const char tag[] = "{\"timeline\":";
    return len >= sizeof tag - 1 && !memcmp(s, tag, sizeof tag - 1);
}

/* A growable array of records. */
static int push(tl_record **a, size_t *n, size_t *cap, const tl_record *e) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        tl_record *p = realloc(*a, nc * sizeof *p);
        if (!p) return -1;
        *a = p;
        *cap = nc;
    }
    (*a)[(*n)++] = *e;
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Moves the pending block into f: records of iterations the block holds that an earlier
 * block holds too are dropped first (the later block wins). */
static int commit(tl_file *f, size_t *fcap, tl_record *pend, size_t npend, size_t *icap) {
    if (!npend) return 0;
    int64_t maxc = f->niters ? f->iters[f->niters - 1] : INT64_MIN;
    bool overlap = false;
    for (size_t i = 0; i < npend; i++)
        if (pend[i].iteration <= maxc &&
            bsearch(&pend[i].iteration, f->iters, f->niters, sizeof *f->iters, cmp_i64))
            overlap = true;
    if (overlap) {
        size_t w = 0;
        for (size_t i = 0; i < f->n; i++) {
            bool again = false;
            for (size_t j = 0; j < npend && !again; j++) again = pend[j].iteration == f->ev[i].iteration;
            if (!again) f->ev[w++] = f->ev[i];
        }
        f->n = w;
    }
    for (size_t i = 0; i < npend; i++) {
        if (push(&f->ev, &f->n, fcap, &pend[i])) return -1;
        int64_t it = pend[i].iteration;
        if (f->niters && bsearch(&it, f->iters, f->niters, sizeof *f->iters, cmp_i64)) continue;
        if (f->niters == *icap) {
            size_t nc = *icap ? *icap * 2 : 64;
            int64_t *p = realloc(f->iters, nc * sizeof *p);
            if (!p) return -1;
            f->iters = p;
            *icap = nc;
        }
        size_t k = f->niters++;
        while (k > 0 && f->iters[k - 1] > it) {
            f->iters[k] = f->iters[k - 1];
            k--;
        }
        f->iters[k] = it;
    }
    return 0;
}

int tl_read(const char *path, tl_file *f) {
    memset(f, 0, sizeof *f);
    char *data;
    size_t len;
    int rc = fs_read_all(path, &data, &len);
    if (rc) return co_err_set(rc, "timeline: reading %s: %s", path, co_err_detail());
    tl_record *pend = NULL;
    size_t npend = 0, pcap = 0, fcap = 0, icap = 0;
    size_t lineno = 0;
    rc = 0;
    for (size_t pos = 0; pos < len && !rc;) {
        const char *s = data + pos;
        const char *nl = memchr(s, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - s) : len - pos;
        pos += n + (nl ? 1 : 0);
        lineno++;
        if (n == 0) continue;
        json_error_t jerr;
        json_t *o = nl ? json_loadb(s, n, 0, &jerr) : NULL;
        if (!json_is_object(o)) {
            json_decref(o);
            /* torn: the last line, or a line a killed process left before a new header */
            const char *next = nl ? nl + 1 : NULL;
            size_t left = next ? len - (size_t)(next - data) : 0;
            if (!nl || is_header_line(next, left)) {
                f->torn = 1;
                continue;
            }
            rc = co_err_set(CO_EFORMAT, "timeline: %s:%zu: not a JSON object", path, lineno);
            break;
        }
        int64_t it, mb, ch, endv, t0, t1;
        json_t *k = json_object_get(o, "k");
        if (json_object_get(o, "timeline")) {
            tl_meta m;
            if (parse_header(o, &m) || tl_meta_check(&m))
                rc = co_err_set(CO_EFORMAT, "timeline: %s:%zu: malformed header (%s)", path, lineno,
                                parse_header(o, &m) ? "a field is missing or not an integer" : co_err_detail());
            else if (f->headers && memcmp(&m, &f->meta, sizeof m))
                rc = co_err_set(CO_EFORMAT,
                                "timeline: %s:%zu: the header disagrees with the first (rank %d of %d = %dx%dx%d, v %d, "
                                "m %d there): records of two different runs? Give each run an empty directory",
                                path, lineno, f->meta.rank, f->meta.world, f->meta.tp, f->meta.pp, f->meta.dp,
                                f->meta.v, f->meta.m);
            else {
                f->meta = m;
                f->headers++;
                f->uncommitted += npend; /* a block its process never finished */
                npend = 0;
            }
        } else if (!f->headers) {
            rc = co_err_set(CO_EFORMAT, "timeline: %s:%zu: no header line before the records", path, lineno);
        } else if (json_is_string(k)) {
            int kind = tl_kind_from_name(json_string_value(k));
            tl_record e;
            if (!get_int(o, "it", INT64_MIN, INT64_MAX, &it) || !get_int(o, "mb", INT_MIN, INT_MAX, &mb) ||
                !get_int(o, "c", INT_MIN, INT_MAX, &ch) || !get_int(o, "t0", 0, INT64_MAX, &t0) ||
                !get_int(o, "t1", 0, INT64_MAX, &t1) || t1 < t0) {
                rc = co_err_set(CO_EFORMAT, "timeline: %s:%zu: malformed event", path, lineno);
            } else {
                e = (tl_record){kind < 0 ? TL_OTHER : (tl_kind)kind, it, (int)mb, (int)ch, t0, t1};
                if (push(&pend, &npend, &pcap, &e)) rc = co_err_set(CO_ENOMEM, "timeline: %s: out of memory", path);
            }
        } else if (get_int(o, "end", INT64_MIN, INT64_MAX, &endv)) {
            int64_t dr = 0;
            get_int(o, "dropped", 0, INT64_MAX, &dr);
            f->dropped += dr;
            if (commit(f, &fcap, pend, npend, &icap)) rc = co_err_set(CO_ENOMEM, "timeline: %s: out of memory", path);
            npend = 0;
        } else {
            rc = co_err_set(CO_EFORMAT, "timeline: %s:%zu: neither a header, an event nor an end line", path, lineno);
        }
        json_decref(o);
    }
    f->uncommitted += npend;
    free(pend);
    free(data);
    if (rc) tl_file_free(f);
    return rc;
}

void tl_file_free(tl_file *f) {
    if (!f) return;
    free(f->ev);
    free(f->iters);
    memset(f, 0, sizeof *f);
}
