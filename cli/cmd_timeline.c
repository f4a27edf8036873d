/* cmd_timeline.c - `cohort timeline DIR`: reads the files every rank's recorder wrote
 * (train/timeline.h, --timeline-dir), picks one iteration, draws it as an SVG (one row per
 * rank), writes it as a Chrome trace (Perfetto, chrome://tracing) and prints each rank's
 * measured pipeline bubble beside Megatron's (p-1)/(v*m) (docs/timeline.md). The drawing
 * is cli/timeline_draw.c. */
#include "cli/cli.h"
#include "cli/timeline_draw.h"

#include "common/error.h"
#include "common/log.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage_text[] =
    "usage: cohort timeline DIR [--iteration N] [--svg FILE] [--trace FILE] [--json]\n"
    "\n"
    "Reads DIR/timeline-rank-NNNNN.jsonl, the records each rank writes with --timeline-dir DIR,\n"
    "and shows one iteration (default: the last one every rank's file holds complete):\n"
    "  --svg FILE     a picture: one row per rank (by pipeline, tensor, data rank), time in ms,\n"
    "                 forward (light) and backward (dark) boxes coloured by micro batch and\n"
    "                 labelled mb (mb.chunk with virtual stages), waits, reductions and the\n"
    "                 optimizer in greys; idle time is empty (default DIR/timeline-iter-N.svg)\n"
    "  --trace FILE   Chrome trace-event JSON, one thread per rank: open it in ui.perfetto.dev or\n"
    "                 chrome://tracing (default DIR/timeline-iter-N.trace.json)\n"
    "  --json         print the numbers below as one JSON object\n"
    "\n"
    "Prints each rank's measured bubble beside Megatron's formula (p-1)/(v*m):\n"
    "  bubble = (span - busy) / busy, where busy = the rank's forward and backward time in the\n"
    "  iteration and span = from the earliest forward start to the latest backward end over\n"
    "  every rank of its pipeline (same tensor and data rank): the pipeline phase of the step.\n"
    "With ideal timing (no communication cost, equal stages) 1F1B gives exactly the formula.\n"
    "Then the mean over ranks and the worst rank.\n"
    "\n"
    "Exit: 0; 1 no files, unreadable or malformed files, the iteration not recorded, a file\n"
    "that cannot be written; 2 usage.\n";

typedef struct args {
    const char *dir, *svg, *trace;
    int64_t iteration; /* -1: the last complete */
    bool json;
} args;

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->iteration = -1;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            fputs(usage_text, stdout);
            return -1;
        }
        if (!strcmp(s, "--json")) {
            a->json = true;
        } else if (!strcmp(s, "--iteration") || !strcmp(s, "--svg") || !strcmp(s, "--trace")) {
            if (i + 1 >= argc) {
                co_log(CO_LOG_ERROR, "%s needs a value (see --help)", s);
                return CLI_USAGE;
            }
            const char *v = argv[++i];
            if (!strcmp(s, "--svg")) a->svg = v;
            else if (!strcmp(s, "--trace")) a->trace = v;
            else {
                char *end;
                long long x = strtoll(v, &end, 10);
                if (end == v || *end || x < 1) {
                    co_log(CO_LOG_ERROR, "--iteration needs an iteration number (1, 2, ...), got '%s'", v);
                    return CLI_USAGE;
                }
                a->iteration = x;
            }
        } else if (s[0] == '-' && s[1]) {
            co_log(CO_LOG_ERROR, "unknown flag '%s' (see --help)", s);
            return CLI_USAGE;
        } else if (!a->dir) {
            a->dir = s;
        } else {
            co_log(CO_LOG_ERROR, "one directory only, got '%s' and '%s'", a->dir, s);
            return CLI_USAGE;
        }
    }
    if (!a->dir) {
        fputs("cohort timeline: needs the directory the ranks wrote (--timeline-dir); see --help\n", stderr);
        return CLI_USAGE;
    }
    return 0;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The rank numbers of DIR's timeline-rank-NNNNN.jsonl files, ascending. 0 or -1 (message
 * printed). */
static int list_ranks(const char *dir, int **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        co_log(CO_LOG_ERROR, "cannot open directory %s: %s", dir, strerror(errno));
        return -1;
    }
    int cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int r, len = 0;
        if (sscanf(de->d_name, "timeline-rank-%d.jsonl%n", &r, &len) != 1 || de->d_name[len] || r < 0) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            int *p = realloc(*out, sizeof *p * (size_t)cap);
            if (!p) {
                closedir(d);
                fputs("cohort timeline: out of memory\n", stderr);
                return -1;
            }
            *out = p;
        }
        (*out)[(*n)++] = r;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_int);
    return 0;
}

static bool has_iter(const tl_file *f, int64_t it) {
    return f->niters && bsearch(&it, f->iters, f->niters, sizeof *f->iters, cmp_i64);
}

/* "2-4, 7, 9-12" (at most n bytes) of the iterations some file holds. */
static void recorded_ranges(const tl_file *files, int nf, char *buf, size_t n) {
    size_t cap = 0, cnt = 0;
    for (int i = 0; i < nf; i++) cap += files[i].niters;
    int64_t *all = cap ? malloc(sizeof *all * cap) : NULL;
    buf[0] = '\0';
    if (!all) {
        snprintf(buf, n, "none");
        return;
    }
    for (int i = 0; i < nf; i++)
        for (size_t k = 0; k < files[i].niters; k++) all[cnt++] = files[i].iters[k];
    qsort(all, cnt, sizeof *all, cmp_i64);
    size_t len = 0;
    for (size_t i = 0; i < cnt && len + 1 < n;) {
        size_t j = i;
        while (j + 1 < cnt && (all[j + 1] == all[j] || all[j + 1] == all[j] + 1)) j++;
        int w = all[j] == all[i] ? snprintf(buf + len, n - len, "%s%lld", len ? ", " : "", (long long)all[i])
                                 : snprintf(buf + len, n - len, "%s%lld-%lld", len ? ", " : "", (long long)all[i],
                                            (long long)all[j]);
        if (w > 0) len = len + (size_t)w < n ? len + (size_t)w : n - 1;
        i = j + 1;
    }
    free(all);
}

/* Writes the stream's contents to path crash-safely. 0 or -1 (message printed). */
static int write_out(const char *path, char *data, size_t len, const char *what) {
    const void *bufs[1] = {data};
    size_t lens[1] = {len};
    int rc = fs_write_atomic(path, bufs, lens, 1);
    if (rc) co_log(CO_LOG_ERROR, "writing the %s %s: %s", what, path, co_err_detail());
    return rc ? -1 : 0;
}

/* A number in full precision; null when not finite. */
static void json_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.17g", x);
    else fputs("null", f);
}

/* Milliseconds to the microsecond the records resolve. */
static void json_ms(FILE *f, double seconds) {
    if (isfinite(seconds)) fprintf(f, "%.3f", seconds * 1e3);
    else fputs("null", f);
}

/* The per-rank numbers: busy, span, bubble (NAN where the rank ran no forward or backward).
 * Sums in integer microseconds: exact. */
static int bubble_stats(tld_view *v) {
    /* each pipeline (tensor rank, data rank): the first forward start, the last backward end */
    int np = v->meta.tp * v->meta.dp;
    int64_t *lo = malloc(sizeof *lo * (size_t)np), *hi = malloc(sizeof *hi * (size_t)np);
    if (!lo || !hi) {
        free(lo);
        free(hi);
        return -1;
    }
    for (int p = 0; p < np; p++) {
        lo[p] = INT64_MAX;
        hi[p] = INT64_MIN;
    }
    int64_t *busy = calloc((size_t)(v->nrows ? v->nrows : 1), sizeof *busy);
    if (!busy) {
        free(lo);
        free(hi);
        return -1;
    }
    for (int i = 0; i < v->nrows; i++) {
        tld_row *r = &v->rows[i];
        int p = r->meta.dp_rank * v->meta.tp + r->meta.tp_rank;
        for (size_t k = 0; k < r->n; k++) {
            const tl_record *e = &r->ev[k];
            if (e->kind != TL_FORWARD && e->kind != TL_BACKWARD) continue;
            busy[i] += e->t1 - e->t0;
            if (e->kind == TL_FORWARD && e->t0 < lo[p]) lo[p] = e->t0;
            if (e->kind == TL_BACKWARD && e->t1 > hi[p]) hi[p] = e->t1;
        }
    }
    v->mean_bubble = NAN;
    v->worst = -1;
    double sum = 0;
    int cnt = 0;
    for (int i = 0; i < v->nrows; i++) {
        tld_row *r = &v->rows[i];
        int p = r->meta.dp_rank * v->meta.tp + r->meta.tp_rank;
        r->busy = (double)busy[i] * 1e-6;
        r->span = hi[p] > lo[p] && lo[p] != INT64_MAX ? (double)(hi[p] - lo[p]) * 1e-6 : NAN;
        r->bubble = busy[i] > 0 && isfinite(r->span) ? (double)(hi[p] - lo[p] - busy[i]) / (double)busy[i] : NAN;
        if (!isfinite(r->bubble)) continue;
        sum += r->bubble;
        cnt++;
        if (v->worst < 0 || r->bubble > v->rows[v->worst].bubble) v->worst = i;
    }
    if (cnt) v->mean_bubble = sum / cnt;
    free(busy);
    free(lo);
    free(hi);
    return 0;
}

static void print_report(const tld_view *v, const args *a, const char *svg, const char *trace,
                         const int *missing, int nmissing, int64_t dropped) {
    const tl_meta *m = &v->meta;
    if (a->json) {
        printf("{\"dir\":");
        co_json_str(stdout, a->dir);
        printf(",\"iteration\":%lld,\"world\":%d,\"tp\":%d,\"pp\":%d,\"dp\":%d,\"v\":%d,\"m\":%d,\"formula\":",
               (long long)v->iteration, m->world, m->tp, m->pp, m->dp, m->v, m->m);
        json_num(stdout, v->formula);
        printf(",\"mean_bubble\":");
        json_num(stdout, v->mean_bubble);
        printf(",\"worst\":");
        if (v->worst >= 0) {
            printf("{\"rank\":%d,\"bubble\":", v->rows[v->worst].meta.rank);
            json_num(stdout, v->rows[v->worst].bubble);
            putchar('}');
        } else {
            printf("null");
        }
        printf(",\"ranks\":[");
        for (int i = 0; i < v->nrows; i++) {
            const tld_row *r = &v->rows[i];
            printf("%s{\"rank\":%d,\"pp_rank\":%d,\"tp_rank\":%d,\"dp_rank\":%d,\"events\":%zu,\"busy_ms\":", i ? "," : "",
                   r->meta.rank, r->meta.pp_rank, r->meta.tp_rank, r->meta.dp_rank, r->n);
            json_ms(stdout, r->busy);
            printf(",\"span_ms\":");
            json_ms(stdout, r->span);
            printf(",\"bubble\":");
            json_num(stdout, r->bubble);
            putchar('}');
        }
        printf("],\"missing_ranks\":[");
        for (int i = 0; i < nmissing; i++) printf("%s%d", i ? "," : "", missing[i]);
        printf("],\"events\":%zu,\"dropped\":%lld,\"svg\":", v->nevents, (long long)dropped);
        co_json_str(stdout, svg);
        printf(",\"trace\":");
        co_json_str(stdout, trace);
        printf("}\n");
        return;
    }
    printf("cohort timeline: iteration %lld of %s: %d ranks (tp %d x pp %d x dp %d), v %d, m %d\n",
           (long long)v->iteration, a->dir, m->world, m->tp, m->pp, m->dp, m->v, m->m);
    printf("bubble = (span - busy) / busy: busy = the rank's forward + backward time, span = its pipeline's\n"
           "first forward start to last backward end; formula = (p-1)/(v*m) = %.4f\n",
           v->formula);
    printf("%6s %4s %4s %4s %7s %10s %10s %8s\n", "rank", "pp", "tp", "dp", "events", "busy ms", "span ms", "bubble");
    for (int i = 0; i < v->nrows; i++) {
        const tld_row *r = &v->rows[i];
        printf("%6d %4d %4d %4d %7zu %10.3f %10.3f ", r->meta.rank, r->meta.pp_rank, r->meta.tp_rank, r->meta.dp_rank,
               r->n, r->busy * 1e3, isfinite(r->span) ? r->span * 1e3 : 0.0);
        if (isfinite(r->bubble)) printf("%8.4f\n", r->bubble);
        else printf("%8s\n", "-");
    }
    if (v->worst >= 0) {
        const tld_row *w = &v->rows[v->worst];
        printf("mean bubble %.4f (formula %.4f); worst rank %d (pp %d tp %d dp %d): %.4f\n", v->mean_bubble, v->formula,
               w->meta.rank, w->meta.pp_rank, w->meta.tp_rank, w->meta.dp_rank, w->bubble);
    } else {
        printf("no rank ran a forward and a backward in this iteration: no bubble\n");
    }
    printf("svg: %s\ntrace: %s\n", svg, trace);
}

int cli_timeline(int argc, char **argv) {
    co_log_set_prefix("cohort timeline");
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? CLI_OK : rc;
    int *ranks = NULL, nranks = 0;
    if (list_ranks(a.dir, &ranks, &nranks)) return CLI_FAILURE;
    if (!nranks) {
        co_log(CO_LOG_ERROR, "%s has no timeline-rank-*.jsonl files (was the job run with --timeline-dir %s?)",
                a.dir, a.dir);
        free(ranks);
        return CLI_FAILURE;
    }
    int status = CLI_FAILURE;
    tl_file *files = calloc((size_t)nranks, sizeof *files);
    int *missing = NULL, nmissing = 0;
    tld_view v;
    memset(&v, 0, sizeof v);
    char svg_path[4200], trace_path[4200], path[4200];
    if (!files) goto out;
    int nf = 0;
    for (int i = 0; i < nranks; i++) {
        snprintf(path, sizeof path, "%s/timeline-rank-%05d.jsonl", a.dir, ranks[i]);
        tl_file f;
        if (tl_read(path, &f)) {
            const char *why = co_err_detail();
            co_log(CO_LOG_ERROR, "%s", strncmp(why, "timeline: ", 10) ? why : why + 10);
            goto out;
        }
        if (!f.headers) {
            co_log(CO_LOG_WARN, "note: %s holds no records (its process stopped before writing any)",
                    path);
            tl_file_free(&f);
            continue;
        }
        if (f.meta.rank != ranks[i]) {
            co_log(CO_LOG_ERROR, "%s: malformed header: it says rank %d", path, f.meta.rank);
            tl_file_free(&f);
            goto out;
        }
        const tl_meta *m0 = nf ? &files[0].meta : &f.meta;
        if (m0->world != f.meta.world || m0->tp != f.meta.tp || m0->pp != f.meta.pp || m0->dp != f.meta.dp ||
            m0->v != f.meta.v || m0->m != f.meta.m) {
            fprintf(stderr,
                    "cohort timeline: %s: layout %d = tp %d x pp %d x dp %d (v %d, m %d) differs from rank %d's "
                    "%d = %d x %d x %d (v %d, m %d): files of two runs? Give each run an empty --timeline-dir\n",
                    path, f.meta.world, f.meta.tp, f.meta.pp, f.meta.dp, f.meta.v, f.meta.m, files[0].meta.rank,
                    m0->world, m0->tp, m0->pp, m0->dp, m0->v, m0->m);
            tl_file_free(&f);
            goto out;
        }
        if (f.torn || f.uncommitted)
            fprintf(stderr, "cohort timeline: note: %s ends in a record its process did not finish writing (%zu "
                            "events ignored)\n", path, f.uncommitted);
        files[nf++] = f;
    }
    if (!nf) {
        co_log(CO_LOG_ERROR, "no file in %s holds records", a.dir);
        goto out;
    }
    v.meta = files[0].meta;
    /* the iteration */
    int64_t it = a.iteration;
    char ranges[256];
    recorded_ranges(files, nf, ranges, sizeof ranges);
    if (it < 0) {
        for (size_t k = files[0].niters; k-- > 0 && it < 0;) {
            bool all = true;
            for (int i = 1; i < nf && all; i++) all = has_iter(&files[i], files[0].iters[k]);
            if (all) it = files[0].iters[k];
        }
        if (it < 0) {
            fprintf(stderr, "cohort timeline: no iteration is complete in every rank's file in %s (recorded: %s); "
                            "choose one with --iteration N\n", a.dir, ranges[0] ? ranges : "none");
            goto out;
        }
    } else {
        bool any = false;
        for (int i = 0; i < nf; i++) any |= has_iter(&files[i], it);
        if (!any) {
            co_log(CO_LOG_ERROR, "iteration %lld is not recorded in %s (recorded: %s)", (long long)it,
                    a.dir, ranges[0] ? ranges : "none");
            goto out;
        }
    }
    v.iteration = it;
    /* ranks without the iteration, or without a file */
    missing = malloc(sizeof *missing * (size_t)(v.meta.world > 0 ? v.meta.world : 1));
    v.rows = calloc((size_t)nf, sizeof *v.rows);
    if (!missing || !v.rows) goto out;
    int64_t dropped = 0;
    for (int r = 0, i = 0; r < v.meta.world; r++) {
        while (i < nf && files[i].meta.rank < r) i++;
        if (i < nf && files[i].meta.rank == r && has_iter(&files[i], it)) continue;
        missing[nmissing++] = r;
    }
    for (int i = 0; i < nf; i++) {
        if (files[i].meta.rank >= v.meta.world) {
            co_log(CO_LOG_ERROR, "%s/timeline-rank-%05d.jsonl: rank %d is outside the world of %d",
                    a.dir, files[i].meta.rank, files[i].meta.rank, v.meta.world);
            goto out;
        }
        if (!has_iter(&files[i], it)) continue;
        tld_row *row = &v.rows[v.nrows++];
        row->meta = files[i].meta;
        dropped += files[i].dropped;
        /* the iteration's events, in file order */
        size_t cnt = 0;
        for (size_t k = 0; k < files[i].n; k++) cnt += files[i].ev[k].iteration == it;
        row->ev = malloc(sizeof *row->ev * (cnt ? cnt : 1));
        if (!row->ev) goto out;
        for (size_t k = 0; k < files[i].n; k++)
            if (files[i].ev[k].iteration == it) row->ev[row->n++] = files[i].ev[k];
        v.nevents += row->n;
    }
    if (nmissing) {
        char list[512];
        size_t len = 0;
        list[0] = '\0';
        for (int i = 0; i < nmissing && len + 12 < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? " " : "", missing[i]);
        co_log(CO_LOG_WARN, "note: %d of %d ranks have no record of iteration %lld: %s%s", nmissing,
                v.meta.world, (long long)it, list, len + 12 >= sizeof list ? " ..." : "");
    }
    if (dropped)
        co_log(CO_LOG_WARN, "note: the recorders dropped %lld events (buffer full or bad times)",
                (long long)dropped);
    v.formula = (double)(v.meta.pp - 1) / ((double)v.meta.v * v.meta.m);
    tld_sort_rows(&v);
    if (bubble_stats(&v)) goto out;

    snprintf(svg_path, sizeof svg_path, "%s", a.svg ? a.svg : "");
    snprintf(trace_path, sizeof trace_path, "%s", a.trace ? a.trace : "");
    if (!a.svg) snprintf(svg_path, sizeof svg_path, "%s/timeline-iter-%lld.svg", a.dir, (long long)it);
    if (!a.trace) snprintf(trace_path, sizeof trace_path, "%s/timeline-iter-%lld.trace.json", a.dir, (long long)it);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) goto out;
    tld_svg(mem, &v);
    fclose(mem);
    rc = write_out(svg_path, buf, len, "picture");
    free(buf);
    if (rc) goto out;
    buf = NULL;
    mem = open_memstream(&buf, &len);
    if (!mem) goto out;
    tld_trace(mem, &v);
    fclose(mem);
    rc = write_out(trace_path, buf, len, "trace");
    free(buf);
    if (rc) goto out;
    print_report(&v, &a, svg_path, trace_path, missing, nmissing, dropped);
    status = CLI_OK;
out:
    if (status == CLI_FAILURE && !files) fputs("cohort timeline: out of memory\n", stderr);
    for (int i = 0; files && i < nranks; i++) tl_file_free(&files[i]);
    free(files);
    for (int i = 0; v.rows && i < v.nrows; i++) free(v.rows[i].ev);
    free(v.rows);
    free(missing);
    free(ranks);
    return status;
}
