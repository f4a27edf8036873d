/* goodput.h - the job's goodput accounting as pure logic: events in (accepted steps, faults
 * and their restarts, blocking checkpoint saves), seconds by cause out, and the effective
 * training time ratio (ETTR: productive step time over the wall time since the job started).
 * Times are seconds on one monotonic clock the caller chooses. The supervisor feeds it from
 * its validator (supervisor/validate.c) and reports it in the run report, the final log
 * summary, Prometheus and TensorBoard (docs/observability.md "Goodput").
 *
 * How the wall time is split:
 *   job start .. first accepted step         startup (spawn, rendezvous, setup, load, step 1)
 *   accepted step .. next accepted step      the blocking part of a save made between them
 *                                            (checkpoint_save), the attempts the rerun state
 *                                            machine rejected before it replayed the step
 *                                            (replay), then up to the median step productive
 *                                            (recompute when the iteration was accepted
 *                                            before a checkpoint fallback), the rest straggler
 *   last step .. a fault's detection         the detection delay (detection), the work of the
 *                                            aborted step before it (recompute)
 *   detection .. every rank restarted        restart (abort, respawn, re-entry)
 *   restart .. next accepted step            up to the median step as above, the rest
 *                                            state_transfer (peer-memory handover or load)
 *   anything else (after the last step: the final save, shutdown) is "other".
 * Shrunk capacity: while an elastic job trains on fewer ranks than it started with
 * (gp_set_capacity), each step's productive time counts at that share of the full world and
 * the rest as shrunk_capacity. */
#ifndef COHORT_SUPERVISOR_GOODPUT_H
#define COHORT_SUPERVISOR_GOODPUT_H

#include <stdbool.h>
#include <stdint.h>

typedef enum gp_cause {
    GP_STARTUP = 0,
    GP_DETECTION,
    GP_RESTART,
    GP_STATE_TRANSFER,
    GP_REPLAY,
    GP_RECOMPUTE,
    GP_CHECKPOINT_SAVE,
    GP_STRAGGLER,
    GP_SHRUNK_CAPACITY,
    GP_NCAUSES
} gp_cause;

/* The cause's name in reports and metric labels ("detection", "checkpoint_save", ...). */
const char *gp_cause_name(gp_cause c);

#define GP_WINDOW 32 /* clean step times the median is taken over */

typedef struct gp {
    double t0;               /* the job's start */
    double last;             /* the latest accepted step, or a restart's end (< 0: none yet) */
    bool after_restart;      /* the next step's excess is state transfer */
    bool started;            /* a step was accepted */
    bool in_restart;
    double restart_t0;       /* when the restart began */
    int64_t high_water;      /* the newest iteration ever accepted (-1: none) */
    double save_pending;     /* blocking save time not yet taken out of a step interval */
    double productive;
    double capacity;         /* the world's share of the full one (--elastic; 0 or 1: whole) */
    double lost[GP_NCAUSES];
    double win[GP_WINDOW];   /* the latest clean step times */
    int nwin;
    int64_t steps, recomputed_steps;
} gp;

typedef struct gp_summary {
    double wall, productive, ettr, other;
    double lost[GP_NCAUSES];
    double median_step;      /* 0: not yet known */
    int64_t steps;           /* accepted steps (the recomputed included) */
} gp_summary;

void gp_init(gp *g, double t0);
/* Iteration `it` was accepted at `now`; rejected: when the rerun state machine rejected its
 * first attempt (< 0: it did not; the attempts until then are replay). */
void gp_step(gp *g, double now, int64_t it, double rejected);
/* A fault was found at `now` after going unnoticed for detect_s: training stops until
 * gp_restart_done. */
void gp_restart_begin(gp *g, double now, double detect_s);
/* Every rank resumes at `now` (from a peer's memory or a checkpoint: the iterations accepted
 * before and done again count as recompute). */
void gp_restart_done(gp *g, double now);
/* A checkpoint save blocked training for seconds (the slowest rank's, or the logging rank's). */
void gp_save(gp *g, double seconds);
/* Seconds of lost capacity (an elastic job running short of ranks); nothing calls it yet. */
void gp_shrunk(gp *g, double seconds);
/* --elastic: the job trains on this share of its full world from now on (1: whole again). */
void gp_set_capacity(gp *g, double fraction);
/* The accounting at `now`. */
void gp_get(const gp *g, double now, gp_summary *s);

#endif
