/* timeline_draw.c - the SVG picture and the Chrome trace of one iteration's timeline
 * (cli/timeline_draw.h). The SVG is plain SVG 1.1 with presentation attributes only (no
 * CSS, no scripts, generic font families), so every browser draws it the same; each box
 * carries a <title> that a browser shows on hover. */
#include "cli/timeline_draw.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* geometry (px) */
#define W_TOTAL 1200
#define LEFT 200  /* the label column */
#define RIGHT 70  /* the bubble column */
#define TOP 64    /* title lines and the column headers */
#define ROW_H 24
#define STAGE_GAP 8
#define PLOT_W (W_TOTAL - LEFT - RIGHT)

/* Micro batch hues, ordered so that neighbouring micro batches differ by 60 degrees or more
 * (the list repeats every 10). */
static const int mb_hues[10] = {210, 30, 120, 330, 270, 60, 175, 0, 90, 300};

/* Colours of the other kinds (greys for waiting and communication). */
static const char *const kind_fill[TL_NKINDS] = {
    [TL_RECV_WAIT] = "#c8c8c8", [TL_SEND] = "#969696",    [TL_DP_REDUCE] = "#525252", [TL_EMBED_REDUCE] = "#8c564b",
    [TL_TP_COMM] = "#a6761d",   [TL_OPTIMIZER] = "#1f1f1f", [TL_DATA] = "#6f7fb0",    [TL_OTHER] = "#dedede",
};

/* Kinds drawn as a strip at the bottom of the row (they happen beside or inside compute):
 * every kind but forward, backward and the optimizer step. */
static bool is_strip(tl_kind k) { return k != TL_FORWARD && k != TL_BACKWARD && k != TL_OPTIMIZER; }

static void hsl_hex(double h, double s, double l, char out[8]) {
    double c = (1 - fabs(2 * l - 1)) * s, hp = fmod(h, 360.0) / 60.0, x = c * (1 - fabs(fmod(hp, 2.0) - 1));
    double r = 0, g = 0, b = 0;
    if (hp < 1) r = c, g = x;
    else if (hp < 2) r = x, g = c;
    else if (hp < 3) g = c, b = x;
    else if (hp < 4) g = x, b = c;
    else if (hp < 5) r = x, b = c;
    else r = c, b = x;
    double m = l - c / 2;
    snprintf(out, 8, "#%02x%02x%02x", (int)lround((r + m) * 255), (int)lround((g + m) * 255), (int)lround((b + m) * 255));
}

/* Forward: light; backward: dark; in the micro batch's hue. */
static void mb_colour(int mb, bool backward, char out[8]) {
    int h = mb_hues[(mb < 0 ? 0 : mb) % 10];
    if (backward) hsl_hex(h, 0.62, 0.40, out);
    else hsl_hex(h, 0.75, 0.78, out);
}

static int cmp_rows(const void *a, const void *b) {
    const tl_meta *x = &((const tld_row *)a)->meta, *y = &((const tld_row *)b)->meta;
    if (x->pp_rank != y->pp_rank) return x->pp_rank - y->pp_rank;
    if (x->tp_rank != y->tp_rank) return x->tp_rank - y->tp_rank;
    if (x->dp_rank != y->dp_rank) return x->dp_rank - y->dp_rank;
    return x->rank - y->rank;
}

void tld_sort_rows(tld_view *v) {
    if (v->nrows > 1) qsort(v->rows, (size_t)v->nrows, sizeof *v->rows, cmp_rows);
}

/* The earliest start and latest end of the iteration's records (microseconds). */
static void extent(const tld_view *v, int64_t *t0, int64_t *t1) {
    *t0 = INT64_MAX;
    *t1 = INT64_MIN;
    for (int i = 0; i < v->nrows; i++)
        for (size_t k = 0; k < v->rows[i].n; k++) {
            if (v->rows[i].ev[k].t0 < *t0) *t0 = v->rows[i].ev[k].t0;
            if (v->rows[i].ev[k].t1 > *t1) *t1 = v->rows[i].ev[k].t1;
        }
    if (*t0 == INT64_MAX) *t0 = *t1 = 0;
    if (*t1 <= *t0) *t1 = *t0 + 1;
}

/* 1, 2 or 5 times a power of ten, about span/8. */
static double tick_step(double span) {
    double raw = span / 8, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return mag * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

static void fmt_bubble(char *buf, size_t n, double b) {
    if (isfinite(b)) snprintf(buf, n, "%.3f", b);
    else snprintf(buf, n, "-");
}

/* The box's text: "3", or "3.1" (micro batch 3, chunk 1) with virtual stages. */
static void box_label(const tld_view *v, const tl_record *e, char *buf, size_t n) {
    if (v->meta.v > 1 && e->chunk >= 0) snprintf(buf, n, "%d.%d", e->mb, e->chunk);
    else snprintf(buf, n, "%d", e->mb);
}

static void draw_event(FILE *f, const tld_view *v, const tld_row *r, const tl_record *e, double y, int64_t org,
                       double scale) {
    double x = LEFT + (double)(e->t0 - org) * scale, w = (double)(e->t1 - e->t0) * scale;
    if (w < 0.5) w = 0.5;
    bool strip = is_strip(e->kind);
    double top = strip ? y + ROW_H * 0.62 : y + 2, h = strip ? ROW_H * 0.34 : ROW_H - 4;
    char fill[8];
    const char *fc = kind_fill[e->kind];
    bool fb = e->kind == TL_FORWARD || e->kind == TL_BACKWARD;
    if (fb) {
        mb_colour(e->mb, e->kind == TL_BACKWARD, fill);
        fc = fill;
    }
    fprintf(f, "<rect class=\"ev\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"%s>", x, top, w, h, fc,
            fb ? " stroke=\"#ffffff\" stroke-width=\"0.6\"" : "");
    fprintf(f, "<title>rank %d: %s", r->meta.rank, tl_kind_name(e->kind));
    if (e->mb >= 0) fprintf(f, " mb %d", e->mb);
    if (e->chunk >= 0 && v->meta.v > 1) fprintf(f, " chunk %d", e->chunk);
    fprintf(f, ", %.3f to %.3f ms (%.3f ms)</title></rect>\n", (double)(e->t0 - org) * 1e-3,
            (double)(e->t1 - org) * 1e-3, (double)(e->t1 - e->t0) * 1e-3);
    if (fb && v->meta.v > 1 && e->chunk % 2 == 1) /* odd chunks hatched: neighbouring chunks differ */
        fprintf(f, "<rect class=\"hatch\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"url(#odd)\"/>\n",
                x, top, w, h);
    if (fb && e->mb >= 0) {
        char lab[32];
        box_label(v, e, lab, sizeof lab);
        if (w >= 6.2 * (double)strlen(lab) + 3)
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"10\" text-anchor=\"middle\" "
                    "fill=\"%s\">%s</text>\n",
                    x + w / 2, y + ROW_H / 2.0 + 3.5, e->kind == TL_BACKWARD ? "#ffffff" : "#1a1a1a", lab);
    }
}

void tld_svg(FILE *f, const tld_view *v) {
    int64_t org, end;
    extent(v, &org, &end);
    double scale = PLOT_W / (double)(end - org); /* px per microsecond */
    /* rows: a gap between pipeline stages */
    double *ys = malloc(sizeof *ys * (v->nrows > 0 ? (size_t)v->nrows : 1u));
    double y = TOP;
    for (int i = 0; i < v->nrows; i++) {
        if (i && v->rows[i].meta.pp_rank != v->rows[i - 1].meta.pp_rank) y += STAGE_GAP;
        if (ys) ys[i] = y;
        y += ROW_H;
    }
    double plot_bottom = y;
    /* which other kinds appear (for the legend) */
    bool present[TL_NKINDS] = {false};
    for (int i = 0; i < v->nrows; i++)
        for (size_t k = 0; k < v->rows[i].n; k++) present[v->rows[i].ev[k].kind] = true;
    int nkinds = 0;
    for (int k = TL_RECV_WAIT; k < TL_NKINDS; k++) nkinds += present[k];
    double legend_y = plot_bottom + 50;
    double height = legend_y + 22 + (nkinds ? 22 : 0) + 12;

    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%.0f\" "
               "viewBox=\"0 0 %d %.0f\">\n",
            W_TOTAL, ceil(height), W_TOTAL, ceil(height));
    fprintf(f, "<title>cohort timeline, iteration %lld</title>\n", (long long)v->iteration);
    fputs("<defs><pattern id=\"odd\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" "
          "patternTransform=\"rotate(45)\"><path d=\"M1,0 L1,6\" stroke=\"#ffffff\" stroke-width=\"2\" "
          "stroke-opacity=\"0.55\"/></pattern></defs>\n",
          f);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W_TOTAL, ceil(height));
    /* title */
    char mean[32], worst[96] = "";
    fmt_bubble(mean, sizeof mean, v->mean_bubble);
    if (v->worst >= 0) {
        char wb[32];
        fmt_bubble(wb, sizeof wb, v->rows[v->worst].bubble);
        snprintf(worst, sizeof worst, ", worst rank %d: %s", v->rows[v->worst].meta.rank, wb);
    }
    fprintf(f,
            "<text x=\"12\" y=\"22\" font-family=\"sans-serif\" font-size=\"15\" font-weight=\"bold\" fill=\"#111111\">"
            "cohort timeline: iteration %lld, tp %d x pp %d x dp %d, v %d, m %d</text>\n",
            (long long)v->iteration, v->meta.tp, v->meta.pp, v->meta.dp, v->meta.v, v->meta.m);
    fprintf(f,
            "<text x=\"12\" y=\"40\" font-family=\"sans-serif\" font-size=\"12\" fill=\"#333333\">bubble "
            "(span - busy)/busy: mean %s, Megatron's (p-1)/(v*m) = %.3f%s; empty space is idle time</text>\n",
            mean, v->formula, worst);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#555555\" "
            "text-anchor=\"end\">bubble</text>\n",
            W_TOTAL - 8, TOP - 6);
    /* grid and axis */
    double span_ms = (double)(end - org) * 1e-3, step = tick_step(span_ms);
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    for (int k = 0; k * step <= span_ms * (1 + 1e-9) && k < 100; k++) {
        double x = LEFT + k * step * 1e3 * scale;
        fprintf(f,
                "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e2e2e2\" stroke-width=\"1\"/>\n"
                "<text x=\"%.2f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"10\" fill=\"#444444\" "
                "text-anchor=\"middle\">%.*f</text>\n",
                x, TOP - 2, x, plot_bottom + 4, x, plot_bottom + 16, decimals, k * step);
    }
    fprintf(f,
            "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#888888\" stroke-width=\"1\"/>\n"
            "<text x=\"%d\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#444444\" "
            "text-anchor=\"middle\">time (ms) from the first record of iteration %lld</text>\n",
            LEFT, plot_bottom + 4, LEFT + PLOT_W, plot_bottom + 4, LEFT + PLOT_W / 2, plot_bottom + 32,
            (long long)v->iteration);
    /* rows: background, label, bubble, then compute boxes, then the strips over them */
    for (int i = 0; i < v->nrows && ys; i++) {
        const tld_row *r = &v->rows[i];
        char b[32];
        fmt_bubble(b, sizeof b, r->bubble);
        fprintf(f,
                "<rect class=\"row\" x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%d\" fill=\"#fcfcfc\" "
                "stroke=\"#ececec\" stroke-width=\"1\"/>\n"
                "<text x=\"12\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" font-weight=\"bold\" "
                "fill=\"#111111\">rank %d</text>\n"
                "<text x=\"80\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#444444\">"
                "pp %d  tp %d  dp %d</text>\n"
                "<text x=\"%d\" y=\"%.2f\" font-family=\"monospace\" font-size=\"11\" fill=\"#111111\" "
                "text-anchor=\"end\">%s</text>\n",
                LEFT, ys[i], PLOT_W, ROW_H, ys[i] + ROW_H / 2.0 + 4, r->meta.rank, ys[i] + ROW_H / 2.0 + 4,
                r->meta.pp_rank, r->meta.tp_rank, r->meta.dp_rank, W_TOTAL - 8, ys[i] + ROW_H / 2.0 + 4, b);
    }
    for (int pass = 0; pass < 2 && ys; pass++)
        for (int i = 0; i < v->nrows; i++)
            for (size_t k = 0; k < v->rows[i].n; k++)
                if (is_strip(v->rows[i].ev[k].kind) == (pass == 1))
                    draw_event(f, v, &v->rows[i], &v->rows[i].ev[k], ys[i], org, scale);
    /* legend: micro batch colours, then the other kinds present */
    double lx = 12, ly = legend_y;
    fprintf(f,
            "<text x=\"%.0f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#333333\">micro batch "
            "(forward light, backward dark%s):</text>\n",
            lx, ly + 10, v->meta.v > 1 ? "; label mb.chunk, odd chunks hatched" : "; label mb");
    lx += v->meta.v > 1 ? 410 : 290;
    int nshow = v->meta.m < 10 ? v->meta.m : 10;
    for (int mb = 0; mb < nshow; mb++) {
        char fc[8], bc[8];
        mb_colour(mb, false, fc);
        mb_colour(mb, true, bc);
        fprintf(f,
                "<rect class=\"key\" x=\"%.0f\" y=\"%.2f\" width=\"10\" height=\"12\" fill=\"%s\"/>"
                "<rect class=\"key\" x=\"%.0f\" y=\"%.2f\" width=\"10\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#333333\">%d</text>\n",
                lx, ly, fc, lx + 10, ly, bc, lx + 24, ly + 10, mb);
        lx += 50;
    }
    if (v->meta.m > 10)
        fprintf(f, "<text x=\"%.0f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#333333\">"
                   "(colours repeat every 10)</text>\n", lx, ly + 10);
    lx = 12;
    ly += 22;
    for (int k = TL_RECV_WAIT; k < TL_NKINDS; k++) {
        if (!present[k]) continue;
        fprintf(f,
                "<rect class=\"key\" x=\"%.0f\" y=\"%.2f\" width=\"16\" height=\"%s\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.2f\" font-family=\"sans-serif\" font-size=\"11\" fill=\"#333333\">%s</text>\n",
                lx, is_strip((tl_kind)k) ? ly + 5 : ly, is_strip((tl_kind)k) ? "7" : "12", kind_fill[k], lx + 21,
                ly + 10, tl_kind_name((tl_kind)k));
        lx += 130;
    }
    fputs("</svg>\n", f);
    free(ys);
}

static void trace_name(const tld_view *v, const tl_record *e, char *buf, size_t n) {
    if (e->kind == TL_FORWARD || e->kind == TL_BACKWARD) {
        char lab[32];
        box_label(v, e, lab, sizeof lab);
        snprintf(buf, n, "%s %s", e->kind == TL_FORWARD ? "F" : "B", lab);
    } else if (e->mb >= 0) {
        snprintf(buf, n, "%s %d", tl_kind_name(e->kind), e->mb);
    } else {
        snprintf(buf, n, "%s", tl_kind_name(e->kind));
    }
}

void tld_trace(FILE *f, const tld_view *v) {
    int64_t org, end;
    extent(v, &org, &end);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"iteration\":%lld,\"origin_unix_us\":%lld,\"tp\":%d,"
               "\"pp\":%d,\"dp\":%d,\"v\":%d,\"m\":%d},\n\"traceEvents\":[\n",
            (long long)v->iteration, (long long)org, v->meta.tp, v->meta.pp, v->meta.dp, v->meta.v, v->meta.m);
    /* a process per pipeline stage, a thread per rank (sorted as the rows) */
    bool first = true;
    for (int i = 0; i < v->nrows; i++) {
        const tl_meta *m = &v->rows[i].meta;
        if (i == 0 || m->pp_rank != v->rows[i - 1].meta.pp_rank)
            fprintf(f,
                    "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
                    "\"pipeline stage %d\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                    "\"args\":{\"sort_index\":%d}}",
                    first ? "" : ",\n", m->pp_rank, m->pp_rank, m->pp_rank, m->pp_rank);
        first = false;
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"rank %d (pp %d, "
                "tp %d, dp %d)\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":"
                "{\"sort_index\":%d}}",
                m->pp_rank, m->rank, m->rank, m->pp_rank, m->tp_rank, m->dp_rank, m->pp_rank, m->rank, i);
    }
    for (int i = 0; i < v->nrows; i++) {
        const tld_row *r = &v->rows[i];
        for (size_t k = 0; k < r->n; k++) {
            const tl_record *e = &r->ev[k];
            char name[64];
            trace_name(v, e, name, sizeof name);
            fprintf(f,
                    "%s{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,\"pid\":%d,\"tid\":%d,"
                    "\"args\":{\"iteration\":%lld,\"mb\":%d,\"chunk\":%d}}",
                    first ? "" : ",\n", name, tl_kind_name(e->kind), (long long)(e->t0 - org), (long long)(e->t1 - e->t0),
                    r->meta.pp_rank, r->meta.rank, (long long)e->iteration, e->mb, e->chunk);
            first = false;
        }
    }
    fputs("\n]}\n", f);
}
