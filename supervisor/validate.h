/* validate.h - the supervisor's side of the rerun state machine and of the run report:
 * gathers every rank's LossReports into rounds, asks resilience/rerun.c for the verdict,
 * sends it to every rank, appends rejected results to Megatron's tracker file, scores
 * stragglers from the per-phase timings, fires supervisor-side injected faults, and at the
 * end writes the run report. Private to supervisor/; runs on the supervisor's loop. */
#ifndef COHORT_SUPERVISOR_VALIDATE_H
#define COHORT_SUPERVISOR_VALIDATE_H

#include "protocol/wire.h"
#include "resilience/inject.h"
#include "resilience/rerun.h"
#include "supervisor/goodput.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct svv svv;

typedef int (*svv_send_fn)(void *ctx, int rank, const ProtobufCMessage *body);

typedef struct svv_options {
    rr_options rr;                /* world = data-parallel ranks */
    const char *tracker_file;     /* --result-rejected-tracker-filename ("" / NULL: none) */
    const char *job;              /* job id for the tracker lines */
    double straggler_threshold;   /* --straggler-threshold (0.75) */
    fi_schedule *inject;          /* kill-supervisor faults */
    FILE *metrics;                /* straggler records (NULL: none) */
    /* [world]: each rank's pipeline stage (NULL: no pipeline). A rank is then scored against
     * the ranks of its own stage (the same work), and each stage against the others (a slow
     * stage sets the pace of its whole pipeline: the work is not balanced, or its ranks are
     * slow); copied. */
    const int *stage_of;
    int nstages;
    int quarantine_after;         /* faults attributed to one rank ... (0: never quarantine) */
    int64_t quarantine_window;    /* ... within this many iterations quarantine it */
    int evict_after;              /* --straggler-evict-after (0: never evict) */
    bool save_auto;               /* --save-interval auto: each ACCEPT says whether the ranks save */
    double expected_mtbf;         /* --expected-mtbf (0: estimated from the faults seen) */
    int64_t train_iters;          /* no interval longer than the run */
} svv_options;

int svv_new(svv **out, const svv_options *o, svv_send_fn send, void *ctx);
void svv_destroy(svv **v);

/* A rank's LossReport. Returns 0, or an exit status (> 0) when the verdict stops the job;
 * why then says why. *quarantine: a rank found faulty too often (to be replaced), or -1. */
int svv_on_report(svv *v, int rank, const Cohort__V1__LossReport *r, char *why, size_t n, int *quarantine);
/* A rank's parameter checksums for a round (sent after its loss reports, when they said
 * one follows): the round is complete only with them. Returns as svv_on_report. */
int svv_on_checksum(svv *v, int rank, const Cohort__V1__ParamsChecksum *c, char *why, size_t n, int *quarantine);
/* An "event: ..." line a worker sent (an injected or repaired fault on that rank). */
void svv_on_event(svv *v, int rank, const char *line);
/* Another kind of fault the supervisor saw (a dead or silent rank): kind, rank, text. */
void svv_note_fault(svv *v, const char *kind, int rank, const char *diagnosis);

/* In-process restart: the generation was aborted for `why` (kind "killed", "exited", "hang",
 * ...; detect_ms: how long the fault went unnoticed); the round in progress is dropped.
 * svv_restart_done: every rank resumes after iteration `iteration`, from a survivor's
 * memory or (from_checkpoint) from the last checkpoint, losing the iterations since. The fault's recovery
 * time runs until the first iteration accepted after it. */
void svv_restart_begin(svv *v, const char *kind, int rank, const char *why, uint64_t detect_ms);
void svv_restart_done(svv *v, int64_t iteration, bool from_checkpoint);
/* --elastic: from the restart on, `world` ranks report (at most the world at the start), as
 * `replicas` data-parallel replicas, stage_of[world] each rank's pipeline stage (with a
 * pipeline; NULL without); the goodput counts the rest of the world as shrunk capacity.
 * Call between svv_restart_begin and svv_restart_done. */
int svv_set_world(svv *v, int world, int replicas, const int *stage_of);
/* A round that stopped progressing: some ranks reported, others not, for soft_ms. Returns
 * true with the silent ranks in missing (at most cap) and when the round began in *since. */
bool svv_stalled(svv *v, uint64_t now, uint64_t soft_ms, int *missing, int cap, int *nmissing, uint64_t *since);
/* A straggler to evict (--straggler-evict-after): a rank scored below the threshold
 * evict_after iterations in a row, each run below it offered once (a refused eviction is not
 * asked again until the rank scores above the threshold or a restart), or -1. scores gets the
 * run's scores (at most cap, oldest first), *n how many; an "evicted" restart
 * (svv_restart_begin) keeps them in its fault record. */
int svv_evict_candidate(svv *v, double *scores, int cap, int *n);
/* The state machine's state for checkpoints (ctx: the svv), and restoring it after --load. */
int svv_state_save(void *ctx, char *buf, size_t n);
int svv_state_load(svv *v, const char *json);
/* The newest iteration any rank has reported (0 before any). */
int64_t svv_current_iteration(const svv *v);
/* The slowest iteration seen (ms between accepted verdicts) once 5 have completed, else 0. */
double svv_max_step_ms(const svv *v);

/* For `cohort status` and the Prometheus metrics (supervisor/status.c): the counters of
 * the run report so far, its faults (k from 0, oldest first; CO_ENOENT past the last; the
 * strings live as long as v), and each rank's step times over the latest iterations (the
 * sum of its phases; false before any) with its straggler score (NAN before the warm-up). */
typedef struct svv_counts {
    int64_t validated, replays, checks, repairs, skips, restarts, steps_lost;
    int faults, stragglers;
} svv_counts;
typedef struct svv_fault {
    const char *kind, *diagnosis, *outcome, *text; /* diagnosis, outcome: "" when none */
    int rank;
    int64_t iteration;
    double detect_ms, recover_ms; /* < 0: not measured */
} svv_fault;
typedef struct svv_times {
    double last_ms, min_ms, median_ms, max_ms, score;
    int n;
    bool flagged;
} svv_times;
void svv_counts_get(const svv *v, svv_counts *c);
int svv_fault_get(const svv *v, int k, svv_fault *f);
bool svv_rank_times(const svv *v, int r, svv_times *t);
int svv_world(const svv *v);
/* When iteration it was accepted (sv__now_ms), if it is among the latest 16; else 0. */
uint64_t svv_accepted_ms(const svv *v, int64_t it);

/* Goodput (goodput.h): a worker's metrics record (its {"event":"checkpoint_save",
 * "blocking_seconds"} is a save's blocking time), and the accounting so far. */
void svv_on_record(svv *v, const char *record);
void svv_goodput(const svv *v, gp_summary *s);
/* Saves were stopped for lack of space (why; kept once): the report and Prometheus say so. */
void svv_note_saves_stopped(svv *v, const char *why);
const char *svv_saves_stopped(const svv *v);

/* The run report: a human summary on `human` and a JSON file at json_path (NULL: none). */
int svv_write_report(svv *v, FILE *human, const char *json_path, int exit_status, double wall_s);

#endif
