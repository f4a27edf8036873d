/* timeline.h - the timeline of a training step: every rank logs when each of its operations
 * (forward and backward of a micro batch and chunk, pipeline waits and sends, reductions,
 * the optimizer step, data) starts and ends; `cohort timeline` turns the files into a
 * picture, a Chrome trace and the measured pipeline bubble (docs/timeline.md).
 *
 * Recording is cheap: tl_open allocates a bounded buffer once; tl_event stores one record
 * in it (no allocation, no I/O, safe from several threads at once); tl_flush, at the end of
 * an iteration, formats the buffer and appends it to DIR/timeline-rank-NNNNN.jsonl in one
 * write. Events past the buffer's capacity are dropped and counted (the count is written).
 *
 * The file is JSON lines, appended to (a replaced or restarted process adds to it):
 *   {"timeline":1,"rank":R,"world":W,"tp":..,"pp":..,"dp":..,"tp_rank":..,"pp_rank":..,
 *    "dp_rank":..,"v":V,"m":M,"clock":"realtime_us","pid":P,"host":H}          at each tl_open
 *   {"k":"forward","it":I,"mb":B,"c":C,"t0":US,"t1":US}               one per event
 *   {"end":I,"events":N,"dropped":D}                                  closes each flush
 * Times are integer microseconds of CLOCK_REALTIME (ranks on one host share the clock;
 * across hosts it is as close as their clocks are synchronised), so that durations and
 * sums read back exactly (a double of seconds since 1970 resolves only 0.24 us). A flush is one write(2), so a process that
 * is killed leaves complete blocks, at worst followed by one torn block: the reader keeps
 * only the events of blocks that end with their "end" line and ignores a torn last line.
 * When one iteration appears in two blocks (replayed after a restart), the later wins.
 *
 * Errors: negative CO_E* codes with a detail sentence (co_err_detail); never exit(). */
#ifndef COHORT_TRAIN_TIMELINE_H
#define COHORT_TRAIN_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    TL_FORWARD,      /* a micro batch's forward through one chunk of layers */
    TL_BACKWARD,     /* its backward */
    TL_RECV_WAIT,    /* waiting for an activation or gradient from a neighbouring stage */
    TL_SEND,         /* sending one to a neighbouring stage (the part that blocks) */
    TL_DP_REDUCE,    /* the data-parallel gradient all-reduce */
    TL_EMBED_REDUCE, /* the embedding-gradient all-reduce of the first and last stage */
    TL_TP_COMM,      /* a tensor-parallel collective (inside a forward or backward) */
    TL_OPTIMIZER,    /* gradient norm, clipping and the optimizer step */
    TL_DATA,         /* reading or broadcasting a micro batch */
    TL_OTHER,
    TL_NKINDS
} tl_kind;

/* The rank's place in the job, written in each file's header. world = tp x pp x dp
 * (context parallelism, once it exists, needs a cp field). */
typedef struct tl_meta {
    int rank, world, tp, pp, dp, tp_rank, pp_rank, dp_rank;
    int v, m; /* model chunks per rank (virtual pipeline stages; 1 without), micro batches per iteration */
} tl_meta;

typedef struct tl_rec tl_rec;

/* Events the buffer holds between flushes when tl_open chooses: 16 per micro batch and
 * chunk plus 256, at least 4096 (a 1F1B step records about 4 per micro batch and chunk). */
int tl_default_capacity(const tl_meta *meta);

/* Creates DIR (mkdir -p) and opens DIR/timeline-rank-NNNNN.jsonl (NNNNN = meta->rank) for
 * appending, with a header line. 0, or CO_EINVAL (meta out of range), CO_EIO, CO_ENOMEM. */
int tl_open(tl_rec **out, const char *dir, const tl_meta *meta);
/* The same with a buffer of `capacity` events (1 or more). */
int tl_open_capacity(tl_rec **out, const char *dir, const tl_meta *meta, int capacity);

/* Seconds of CLOCK_REALTIME. */
double tl_now(void);

/* Records one operation of iteration `iteration` (cohort's 1-based count) from t0 to t1
 * (tl_now values). mb, chunk: the micro batch and model chunk, -1 when not applicable. A
 * full buffer, or times that are not finite with t0 <= t1, drop the event (counted). A
 * kind out of range is recorded as TL_OTHER. r may be NULL (nothing happens), so a caller
 * need not test whether recording is on. */
void tl_event(tl_rec *r, tl_kind k, int64_t iteration, int mb, int chunk, double t0, double t1);

/* Appends the buffered events and their "end" line to the file and empties the buffer; at
 * the end of an iteration (no tl_event may run meanwhile). Nothing buffered: nothing
 * written. 0, or CO_EIO / CO_ENOSPC (the buffer is emptied all the same). r may be NULL. */
int tl_flush(tl_rec *r);

/* Forgets the buffered events: an iteration that was abandoned and will be replayed (a
 * rerun attempt, an in-process restart). r may be NULL. */
void tl_discard(tl_rec *r);

/* Events dropped since tl_open (buffer full, bad times). */
int64_t tl_dropped(const tl_rec *r);

/* Closes the file without flushing (call tl_flush first to keep what is buffered); sets
 * *r to NULL. */
void tl_close(tl_rec **r);

/* "forward", "backward", "recv_wait", "send", "dp_reduce", "embed_reduce", "tp_comm",
 * "optimizer", "data", "other"; tl_kind_from_name returns -1 for an unknown name. */
const char *tl_kind_name(tl_kind k);
int tl_kind_from_name(const char *name);

/* ---- reading (cohort timeline, tests) ---- */

typedef struct tl_record {
    tl_kind kind;
    int64_t iteration;
    int mb, chunk;
    int64_t t0, t1; /* microseconds of CLOCK_REALTIME */
} tl_record;

typedef struct tl_file {
    tl_meta meta;          /* from the last header */
    tl_record *ev;         /* the events of complete blocks, in file order */
    size_t n;
    int64_t *iters;        /* iterations that some complete block holds, ascending, unique */
    size_t niters;
    int64_t dropped;       /* the "dropped" counts of the complete blocks */
    size_t uncommitted;    /* events of blocks without their "end" line (ignored) */
    int torn;              /* 1: the last line was incomplete (ignored) */
    int headers;           /* header lines (opens) */
} tl_file;

/* Reads one rank's file. CO_ENOENT / CO_EIO (unreadable), CO_EFORMAT (no header first, a
 * malformed header, a malformed line that is neither the last nor followed by a header,
 * headers that disagree on the layout), each with the path and line in the detail. */
int tl_read(const char *path, tl_file *out);
void tl_file_free(tl_file *f);

/* Checks a layout: sizes >= 1, world = tp x pp x dp, coordinates and rank in range,
 * v, m >= 1. 0 or CO_EINVAL with the detail. */
int tl_meta_check(const tl_meta *m);

#endif
