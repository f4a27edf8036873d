/* preprocess.c - parallel, order-preserving JSONL -> .bin/.idx conversion (see
 * preprocess.h): one reader (the calling thread), N worker threads, one writer thread,
 * over a ring of batches. */
#include "data/preprocess.h"

#include "common/error.h"
#include "data/indexed.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define BATCH_BYTES (1u << 20)

typedef struct {
    int32_t *v;
    size_t n, cap;
} vec32;

static int vec_reserve(vec32 *a, size_t extra) {
    if (a->n + extra <= a->cap) return 0;
    size_t cap = a->cap ? a->cap : 1024;
    while (cap < a->n + extra) cap *= 2;
    int32_t *nv = realloc(a->v, cap * sizeof *nv);
    if (!nv) return CO_ENOMEM;
    a->v = nv;
    a->cap = cap;
    return 0;
}

static int vec_push(vec32 *a, int32_t x) {
    if (vec_reserve(a, 1)) return CO_ENOMEM;
    a->v[a->n++] = x;
    return 0;
}

enum { SLOT_EMPTY, SLOT_FILLED, SLOT_WORKING, SLOT_DONE };

typedef struct {
    int state;
    int64_t seq;         /* batch number */
    int64_t first_line;  /* 1-based line number of the first line */
    char *text;          /* whole lines */
    size_t len, cap;
    /* results */
    int64_t ndocs;
    vec32 tokens[PP_MAX_KEYS], seq_lens[PP_MAX_KEYS], doc_seq_end[PP_MAX_KEYS];
    vec32 bad;           /* index of each malformed document in the batch */
    char *bad_msg;       /* message of the first malformed document */
    int64_t bad_first;   /* its document index, -1 none */
    int rc;              /* a worker failure (memory, tokenizer) */
    char err[512];
} batch;

typedef struct {
    const pp_options *o;
    batch *ring;
    int nring;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next_work;   /* next batch a worker takes */
    int64_t produced;    /* batches filled by the reader */
    int eof;             /* the reader is done */
    int abort;           /* stop everything */
    /* writer */
    idx_writer *w[PP_MAX_KEYS];
    pp_stats st;
    int rc;
    char err[1024];
    int64_t total_bytes; /* input size when known (progress) */
    double t0, last_draw;
} pp_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *key_name(const pp_options *o, int k) { return o->nkeys ? o->keys[k] : "text"; }

/* Tokenizes one text value into the batch's vectors for key k. */
static int add_text(batch *b, int k, tok_session *ts, const char *s, size_t n, size_t *doc_tokens) {
    vec32 *t = &b->tokens[k];
    size_t want = n + 16;
    if (vec_reserve(t, want)) return CO_ENOMEM;
    int64_t r = tok_session_encode(ts, s, n, t->v + t->n, t->cap - t->n);
    if (r < 0) return (int)r;
    if ((size_t)r > t->cap - t->n) {
        if (vec_reserve(t, (size_t)r)) return CO_ENOMEM;
        r = tok_session_encode(ts, s, n, t->v + t->n, t->cap - t->n);
        if (r < 0) return (int)r;
    }
    if (r > 0) {
        t->n += (size_t)r;
        if (vec_push(&b->seq_lens[k], (int32_t)r)) return CO_ENOMEM;
        *doc_tokens += (size_t)r;
    }
    return 0;
}

static void mark_bad(batch *b, int64_t doc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void mark_bad(batch *b, int64_t doc, const char *fmt, ...) {
    vec_push(&b->bad, (int32_t)doc);
    if (b->bad_first < 0) {
        b->bad_first = doc;
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        b->bad_msg = strdup(msg);
    }
}

static void process_batch(pp_ctx *c, batch *b, tok_session *ts) {
    const pp_options *o = c->o;
    int nk = o->nkeys ? o->nkeys : 1;
    for (int k = 0; k < nk; k++) b->tokens[k].n = b->seq_lens[k].n = b->doc_seq_end[k].n = 0;
    b->bad.n = 0;
    free(b->bad_msg);
    b->bad_msg = NULL;
    b->bad_first = -1;
    b->ndocs = 0;
    b->rc = 0;
    size_t p = 0;
    while (p < b->len) {
        char *nl = memchr(b->text + p, '\n', b->len - p);
        size_t e = nl ? (size_t)(nl - b->text) : b->len;
        size_t le = e;
        if (le > p && b->text[le - 1] == '\r') le--;
        int64_t d = b->ndocs++;
        json_error_t jerr;
        json_t *root = json_loadb(b->text + p, le - p, JSON_ALLOW_NUL, &jerr);
        /* the tokens of a malformed line are rolled back */
        size_t mark_t[PP_MAX_KEYS], mark_s[PP_MAX_KEYS];
        for (int k = 0; k < nk; k++) mark_t[k] = b->tokens[k].n, mark_s[k] = b->seq_lens[k].n;
        int bad = 0;
        if (!root) {
            mark_bad(b, d, "malformed JSON: %s (column %d)", jerr.text, jerr.column);
            bad = 1;
        } else if (!json_is_object(root)) {
            mark_bad(b, d, "not a JSON object");
            bad = 1;
        }
        for (int k = 0; !bad && k < nk; k++) {
            json_t *v = json_object_get(root, key_name(o, k));
            size_t doc_tokens = 0;
            int rc = 0;
            if (!v) {
                mark_bad(b, d, "no key \"%s\"", key_name(o, k));
                bad = 1;
            } else if (json_is_string(v)) {
                rc = add_text(b, k, ts, json_string_value(v), json_string_length(v), &doc_tokens);
            } else if (json_is_array(v)) {
                size_t i;
                json_t *x;
                json_array_foreach(v, i, x) {
                    if (!json_is_string(x)) {
                        mark_bad(b, d, "\"%s\" is a list holding a non-string", key_name(o, k));
                        bad = 1;
                        break;
                    }
                    rc = add_text(b, k, ts, json_string_value(x), json_string_length(x), &doc_tokens);
                    if (rc) break;
                }
            } else {
                mark_bad(b, d, "\"%s\" is not a string or a list of strings", key_name(o, k));
                bad = 1;
            }
            if (rc) {
                b->rc = rc;
                snprintf(b->err, sizeof b->err, "%s", co_err_detail());
                json_decref(root);
                return;
            }
            if (!bad && doc_tokens > 0 && o->append_eod) {
                if (vec_push(&b->tokens[k], o->tok->eod)) {
                    b->rc = CO_ENOMEM;
                    snprintf(b->err, sizeof b->err, "out of memory");
                    json_decref(root);
                    return;
                }
                b->seq_lens[k].v[b->seq_lens[k].n - 1]++;
            }
        }
        json_decref(root);
        for (int k = 0; k < nk; k++) {
            if (bad) b->tokens[k].n = mark_t[k], b->seq_lens[k].n = mark_s[k];
            if (vec_push(&b->doc_seq_end[k], (int32_t)b->seq_lens[k].n)) {
                b->rc = CO_ENOMEM;
                snprintf(b->err, sizeof b->err, "out of memory");
                return;
            }
        }
        p = e + 1;
    }
}

typedef struct {
    pp_ctx *c;
    tok_session *ts;
    double cpu; /* this worker's CPU seconds */
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    pp_ctx *c = wa->c;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->abort && c->next_work >= c->produced && !c->eof) pthread_cond_wait(&c->cv, &c->mu);
        if (c->abort || c->next_work >= c->produced) break;
        batch *b = &c->ring[c->next_work % c->nring];
        c->next_work++;
        b->state = SLOT_WORKING;
        pthread_mutex_unlock(&c->mu);
        process_batch(c, b, wa->ts);
        pthread_mutex_lock(&c->mu);
        b->state = SLOT_DONE;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    struct timespec ts;
    if (!clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) wa->cpu = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return NULL;
}

static void draw_progress(pp_ctx *c, int final) {
    FILE *f = c->o->progress;
    if (!f) return;
    double t = now_s();
    if (!final && t - c->last_draw < 0.25) return;
    c->last_draw = t;
    double el = t - c->t0;
    double mbs = el > 0 ? (double)c->st.bytes / 1e6 / el : 0;
    char bar[32];
    int width = 24;
    double frac = c->total_bytes > 0 ? (double)c->st.bytes / (double)c->total_bytes : 0;
    if (frac > 1) frac = 1;
    for (int i = 0; i < width; i++) bar[i] = i < (int)(frac * width) ? '#' : '.';
    bar[width] = '\0';
    if (c->total_bytes > 0)
        fprintf(f, "\r\033[K[%s] %5.1f%% %lld docs %lld tokens %.1f MB/s", bar, 100 * frac,
                (long long)c->st.documents, (long long)c->st.tokens, mbs);
    else
        fprintf(f, "\r\033[K%lld docs %lld tokens %.1f MB/s", (long long)c->st.documents, (long long)c->st.tokens, mbs);
    if (final) fputs("\r\033[K", f);
    fflush(f);
}

/* Appends a finished batch to the outputs (writer thread). */
static int write_batch(pp_ctx *c, batch *b) {
    const pp_options *o = c->o;
    int nk = o->nkeys ? o->nkeys : 1;
    if (b->rc) return co_err_set(b->rc, "%s", b->err);
    size_t bi = 0;
    size_t toff[PP_MAX_KEYS] = {0}, soff[PP_MAX_KEYS] = {0};
    for (int64_t d = 0; d < b->ndocs; d++) {
        if (bi < b->bad.n && b->bad.v[bi] == d) {
            bi++;
            if (!o->skip_malformed)
                return co_err_set(CO_EFORMAT, "%s:%lld: %s (--skip-malformed skips such lines)",
                                  strcmp(o->input, "-") ? o->input : "<stdin>", (long long)(b->first_line + d),
                                  d == b->bad_first ? b->bad_msg : "malformed line");
            c->st.skipped++;
            continue;
        }
        for (int k = 0; k < nk; k++) {
            size_t end = (size_t)b->doc_seq_end[k].v[d];
            for (; soff[k] < end; soff[k]++) {
                size_t n = (size_t)b->seq_lens[k].v[soff[k]];
                int rc = idx_writer_add_sequence(c->w[k], b->tokens[k].v + toff[k], n);
                if (rc) return rc;
                toff[k] += n;
                c->st.sequences += k == 0;
                if (k == 0) c->st.tokens += (int64_t)n;
            }
            int rc = idx_writer_end_document(c->w[k]);
            if (rc) return rc;
        }
        c->st.documents++;
    }
    c->st.lines += b->ndocs;
    c->st.bytes += (int64_t)b->len;
    draw_progress(c, 0);
    return 0;
}

static void *writer_main(void *arg) {
    pp_ctx *c = arg;
    for (int64_t seq = 0;; seq++) {
        pthread_mutex_lock(&c->mu);
        batch *b = &c->ring[seq % c->nring];
        while (!c->abort && !(b->seq == seq && b->state == SLOT_DONE) && !(c->eof && seq >= c->produced))
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->abort || (c->eof && seq >= c->produced)) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        pthread_mutex_unlock(&c->mu);
        int rc = write_batch(c, b);
        pthread_mutex_lock(&c->mu);
        if (rc) {
            c->rc = rc;
            snprintf(c->err, sizeof c->err, "%s", co_err_detail());
            c->abort = 1;
        }
        b->state = SLOT_EMPTY;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (rc) break;
    }
    return NULL;
}

/* Fills b with whole lines from f, starting with the carry-over in *carry. Returns 0, or 1
 * at end of input with nothing read. */
static int fill_batch(FILE *f, batch *b, char **carry, size_t *carry_len, size_t *carry_cap, int *rc,
                      const char *path) {
    b->len = 0;
    if (b->cap < BATCH_BYTES + *carry_len + 1) {
        size_t cap = BATCH_BYTES + *carry_len + 1;
        char *nt = realloc(b->text, cap);
        if (!nt) return *rc = co_err_set(CO_ENOMEM, "out of memory"), 1;
        b->text = nt;
        b->cap = cap;
    }
    memcpy(b->text, *carry, *carry_len);
    b->len = *carry_len;
    *carry_len = 0;
    for (;;) {
        size_t got = fread(b->text + b->len, 1, b->cap - b->len - 1, f);
        b->len += got;
        if (ferror(f)) return *rc = co_err_set(CO_EIO, "%s: read error: %s", path, strerror(errno)), 1;
        char *last = NULL;
        for (size_t i = b->len; i > 0; i--)
            if (b->text[i - 1] == '\n') {
                last = b->text + i - 1;
                break;
            }
        if (last) {
            size_t keep = (size_t)(last - b->text) + 1;
            size_t rest = b->len - keep;
            if (rest > *carry_cap) {
                char *nc = realloc(*carry, rest);
                if (!nc) return *rc = co_err_set(CO_ENOMEM, "out of memory"), 1;
                *carry = nc;
                *carry_cap = rest;
            }
            memcpy(*carry, b->text + keep, rest);
            *carry_len = rest;
            b->len = keep;
            return 0;
        }
        if (feof(f)) return b->len == 0; /* a last line without a newline */
        /* a line longer than the buffer: grow */
        char *nt = realloc(b->text, b->cap * 2);
        if (!nt) return *rc = co_err_set(CO_ENOMEM, "out of memory"), 1;
        b->text = nt;
        b->cap *= 2;
    }
}

static int64_t count_lines(const char *s, size_t n) {
    int64_t k = 0;
    for (const char *p = s; (p = memchr(p, '\n', (size_t)(s + n - p))); p++) k++;
    if (n && s[n - 1] != '\n') k++;
    return k;
}

int pp_run(const pp_options *o, pp_stats *stats) {
    if (o->workers < 1 || o->workers > 256) return co_err_set(CO_EINVAL, "--workers must be in 1..256");
    if (o->nkeys > PP_MAX_KEYS) return co_err_set(CO_EINVAL, "at most %d --json-keys", PP_MAX_KEYS);
    int nk = o->nkeys ? o->nkeys : 1;
    FILE *f = strcmp(o->input, "-") ? fopen(o->input, "rb") : stdin;
    if (!f) return co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "%s: cannot open: %s", o->input, strerror(errno));
    json_object_seed(0); /* before the workers: jansson seeds its hash once */
    pp_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (f != stdin) fclose(f);
        return CO_ENOMEM;
    }
    c->o = o;
    c->nring = 2 * o->workers + 2;
    c->ring = calloc((size_t)c->nring, sizeof *c->ring);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    struct stat sb;
    if (f != stdin && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode)) c->total_bytes = sb.st_size;
    c->t0 = now_s();
    int rc = c->ring ? 0 : CO_ENOMEM;
    int dtype = idx_dtype_for_vocab(o->tok->vocab_size);
    for (int k = 0; !rc && k < nk; k++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s_%s_document", o->output_prefix, key_name(o, k)) >= sizeof path)
            rc = co_err_set(CO_EINVAL, "--output-prefix is too long");
        else
            rc = idx_writer_new(&c->w[k], path, dtype);
    }
    worker_arg *wa = calloc((size_t)o->workers, sizeof *wa);
    pthread_t *th = calloc((size_t)o->workers, sizeof *th);
    pthread_t wt;
    int nstarted = 0, writer_started = 0;
    if (!rc && (!wa || !th)) rc = CO_ENOMEM;
    for (int i = 0; !rc && i < o->workers; i++) {
        wa[i].c = c;
        rc = tok_session_new(&wa[i].ts, o->tok);
    }
    for (int i = 0; !rc && i < o->workers; i++) {
        if (pthread_create(&th[i], NULL, worker_main, &wa[i])) rc = co_err_set(CO_ENOMEM, "cannot start a worker thread");
        else nstarted++;
    }
    if (!rc) {
        if (pthread_create(&wt, NULL, writer_main, c)) rc = co_err_set(CO_ENOMEM, "cannot start the writer thread");
        else writer_started = 1;
    }
    /* the reader */
    char *carry = NULL;
    size_t carry_len = 0, carry_cap = 0;
    int64_t line = 1;
    int read_rc = 0;
    for (int64_t seq = 0; !rc; seq++) {
        batch *b = &c->ring[seq % c->nring];
        pthread_mutex_lock(&c->mu);
        while (!c->abort && seq >= c->nring && b->state != SLOT_EMPTY) pthread_cond_wait(&c->cv, &c->mu);
        int stop = c->abort;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        int end = fill_batch(f, b, &carry, &carry_len, &carry_cap, &read_rc, o->input);
        if (end || read_rc) break;
        pthread_mutex_lock(&c->mu);
        b->seq = seq;
        b->first_line = line;
        b->state = SLOT_FILLED;
        c->produced = seq + 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        line += count_lines(b->text, b->len);
    }
    pthread_mutex_lock(&c->mu);
    c->eof = 1;
    if (read_rc || rc) c->abort = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < nstarted; i++) pthread_join(th[i], NULL);
    if (writer_started) pthread_join(wt, NULL);
    free(carry);
    if (!rc) rc = read_rc;
    if (!rc && c->rc) rc = co_err_set(c->rc, "%s", c->err);
    for (int k = 0; k < nk; k++) {
        if (!rc) rc = idx_writer_finish(&c->w[k]);
        else idx_writer_abort(&c->w[k]);
    }
    c->st.seconds = now_s() - c->t0;
    for (int i = 0; wa && i < nstarted; i++) c->st.worker_cpu_seconds += wa[i].cpu;
    if (!rc) draw_progress(c, 1);
    else if (o->progress) fputs("\n", o->progress);
    if (stats) *stats = c->st;
    for (int i = 0; wa && i < o->workers; i++) tok_session_free(&wa[i].ts);
    for (int i = 0; c->ring && i < c->nring; i++) {
        batch *b = &c->ring[i];
        free(b->text);
        for (int k = 0; k < PP_MAX_KEYS; k++) free(b->tokens[k].v), free(b->seq_lens[k].v), free(b->doc_seq_end[k].v);
        free(b->bad.v);
        free(b->bad_msg);
    }
    free(c->ring);
    free(wa);
    free(th);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    if (f != stdin) fclose(f);
    return rc;
}
