/* timeline_draw.h - what `cohort timeline` draws (cli/cmd_timeline.c): one iteration's
 * records per rank, their bubble numbers, and the two outputs: an SVG picture (plain SVG
 * 1.1, no scripts, generic fonts) and Chrome's trace-event JSON. */
#ifndef COHORT_CLI_TIMELINE_DRAW_H
#define COHORT_CLI_TIMELINE_DRAW_H

#include "train/timeline.h"

#include <stdio.h>

typedef struct tld_row {
    tl_meta meta;
    tl_record *ev; /* this rank's records of the iteration */
    size_t n;
    double busy, span, bubble; /* seconds, seconds, fraction (NAN: no forward/backward) */
} tld_row;

typedef struct tld_view {
    tl_meta meta; /* the layout (rank fields: those of the first file) */
    int64_t iteration;
    tld_row *rows; /* ranks that recorded the iteration */
    int nrows;
    size_t nevents;
    double formula;     /* (p-1)/(v*m) */
    double mean_bubble; /* NAN: none */
    int worst;          /* row index, -1: none */
} tld_view;

/* Orders the rows by pipeline rank, then tensor rank, then data rank. */
void tld_sort_rows(tld_view *v);
/* The picture: one <rect class="ev"> per record. */
void tld_svg(FILE *f, const tld_view *v);
/* {"traceEvents": [...]}: one complete ("X") event per record, a thread per rank. */
void tld_trace(FILE *f, const tld_view *v);

#endif
