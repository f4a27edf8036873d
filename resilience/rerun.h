/* rerun.h - the rerun state machine: every loss and gradient norm validated before any rank
 * applies its optimizer step, and a rejected result replayed to tell a transient fault
 * from a real problem (megatron-facts.md §4, extended to attribute faults to a rank).
 *
 * Pure logic, no I/O: the supervisor feeds it the reports of every data-parallel rank and
 * sends its verdict to all of them; a single-process run keeps one in-process. One
 * iteration goes through rounds:
 *
 *   initial   every rank reports each micro batch's summed masked loss and its own
 *             gradient norm (before the data-parallel reduction). All pass -> ACCEPT.
 *   rerun     a rejection -> RERUN: every rank replays the step in place (same micro
 *             batches, same dropout streams, gradients cleared) and reports again. The
 *             suspect's new result differs from its first -> transient fault: ACCEPT the
 *             replay, record the rank. It reproduces -> for a non-fatal check (spike,
 *             large gradient) a real value: ACCEPT; for a fatal one (NaN, Inf) -> CHECK.
 *   check     another data-parallel rank (same parameters) recomputes the suspect's micro
 *             batches. Same result -> the data or the model is at fault: STOP or SKIP by
 *             policy. Different and valid -> the suspect's state is corrupt: REPAIR (every
 *             rank takes the checker's parameters and optimizer state), then RERUN.
 *
 * Silent data corruption: every data-parallel rank also reports a checksum of the
 * parameters it used. Replicas must hold bitwise the same parameters, so checksums that
 * differ in the iteration's first round mean a corrupted replica, whatever the losses say:
 *   majority  more than half the ranks agree -> REPAIR the others from the lowest of them
 *             (persistent_error, check "param_checksum"), then the replayed round must agree.
 *   none      (two replicas, or an even split) -> RERUN. Agreeing now -> transient fault
 *             (a faulty read): ACCEPT the replay. Still differing -> the ranks whose
 *             parameters are what they last wrote, and agree with each other, are healthy
 *             if every other rank's changed since it wrote them (each replica's optimizer
 *             step, computed from the same validated parameters and bitwise equal reduced
 *             gradients, is its peers' recomputation): REPAIR from the lowest healthy rank;
 *             otherwise STOP (cannot attribute).
 *
 * With one rank there is no peer: a reproducible fatal result is a real problem.
 * Under --fp16 (rr_options.grad_overflow_skips) gradients that overflow are not judged here.
 * Results are compared bit for bit (a deterministic backend replays exactly). */
#ifndef COHORT_RESILIENCE_RERUN_H
#define COHORT_RESILIENCE_RERUN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { RR_MODE_DISABLED = 0, RR_MODE_VALIDATE = 1, RR_MODE_DETERMINISM = 2 } rr_mode;

/* Values match protocol Decision (cohort.proto). */
typedef enum {
    RR_ACCEPT = 1, /* apply the optimizer step */
    RR_RERUN = 2,  /* every rank replays the step and reports again */
    RR_SKIP = 3,   /* drop this iteration's update and go on */
    RR_STOP = 4,   /* stop the job */
    RR_CHECK = 5,  /* `helper` recomputes `suspect`'s micro batches and reports */
    RR_REPAIR = 6, /* every rank takes `helper`'s state, then replays the step */
} rr_decision;

/* Megatron's error-injection types (--error-injection-type). */
typedef enum { RR_INJECT_CORRECT = 0, RR_INJECT_TRANSIENT = 1, RR_INJECT_PERSISTENT = 2 } rr_inject_type;

typedef struct rr_options {
    rr_mode mode;
    int world;                 /* ranks reporting */
    int replica_stride;        /* the ranks of one model replica (a tensor x pipeline group) report
                                * the same results; the same place in consecutive data-parallel
                                * replicas is replica_stride world ranks apart (Megatron's order:
                                * the tensor size, or tensor x pipeline with tp-pp-dp); 0 or 1:
                                * every rank is a replica. A recomputation runs on another replica. */
    int replicas;              /* data-parallel replicas (0: world / replica_stride) */
    bool check_nan;            /* NaN/Inf in losses and gradient norms (fatal) */
    bool check_spiky;          /* --check-for-spiky-loss (non-fatal) */
    bool check_large_grads;    /* --check-for-large-grads (non-fatal) */
    bool check_rank_outliers;  /* a rank's gradient norm > factor x the median of the others */
    double spiky_factor;       /* 10: a loss >= factor x the running max of the first 100 is a spike */
    double large_grad_factor;  /* 10 */
    double outlier_factor;     /* 1000 */
    bool skip_on_reproducible; /* a reproducible fatal result: SKIP the iteration (else STOP) */
    bool grad_overflow_skips;  /* --fp16's loss scaling: a non-finite gradient norm with finite
                                * losses is the scale overflowing, not a fault: accepted here
                                * (the trainer skips the step and the scale backs off, as
                                * Megatron's optimizer does), and left out of the gradient
                                * checks and their history; non-finite losses are checked as
                                * always */
    int injection_rate;        /* --error-injection-rate: about once per N validated iterations */
    rr_inject_type injection_type;
    uint64_t seed;
} rr_options;

void rr_options_default(rr_options *o, int world);

/* A round's micro batches folded as they finish, so that a report has one size whatever
 * their number: the sums, the largest |loss| (the spike check), the first non-finite loss
 * (the NaN/Inf check) and a digest of every micro batch's exact loss and token count (a
 * replay compares bit for bit through it: equal digests mean equal results). */
typedef struct rr_mbs {
    int n;               /* micro batches folded */
    double loss_sum;     /* their loss sums added in micro-batch order */
    double tokens_sum;
    double loss_peak;    /* the loss of largest magnitude (0 with none) */
    int bad_mb;          /* the first micro batch whose loss is not finite (-1: none) */
    double bad_loss;     /* its loss */
    uint64_t digest;     /* sum over micro batches of a hash of (index, loss bits, tokens bits);
                          * every NaN hashes alike, as the comparison takes NaN equal to NaN */
} rr_mbs;

void rr_mbs_reset(rr_mbs *s);
/* Folds micro batch mb's loss sum and token count in (any order gives the same digest; the
 * sums follow the order of the calls). */
void rr_mbs_add(rr_mbs *s, int mb, double loss, double tokens);

/* One rank's report for one round: its micro batches folded (rr_mbs: any number, a fixed
 * size) and the norm of its own gradients before reduction. check_for >= 0 in a CHECK
 * round: these are the micro batches of rank check_for, recomputed here. */
#define RR_MAX_AUX 10
typedef struct rr_report {
    int64_t iteration;
    int attempt;
    int rank;
    int check_for;
    int nmb;
    rr_mbs mb;
    double grad_norm;
    /* checksums of the parameters this rank used in the round (XXH3 of its weights), and of
     * the parameters as it last wrote them (its optimizer step, a repair, a load); has_sum
     * false: no checksum this round (a one-rank job, a check round, an unchecked interval) */
    bool has_sum, has_written;
    uint64_t sum_used, sum_written;
    /* the round's auxiliary losses on this rank, reported, not validated (Megatron validates
     * the language-model loss only): the MoE layers' "load_balancing_loss" and "z_loss", each
     * MTP depth's "mtp_K loss", as the log line names them; naux 0 without */
    int naux;
    char aux_key[RR_MAX_AUX][24];
    double aux[RR_MAX_AUX];
} rr_report;

typedef enum { RR_DIAG_NONE = 0, RR_DIAG_CORRECT, RR_DIAG_TRANSIENT, RR_DIAG_PERSISTENT } rr_diagnosis;

typedef struct rr_verdict {
    int64_t iteration;
    rr_decision decision;
    int attempt;        /* the round the ranks run next (RERUN/CHECK/REPAIR), or the last one */
    int suspect;        /* rank under suspicion (-1 none) */
    int helper;         /* CHECK: who recomputes; REPAIR: whose state everyone takes (-1) */
    rr_diagnosis diagnosis;
    bool save;          /* ACCEPT: a checkpoint follows the step (--save-interval auto's choice, the supervisor's) */
    char reason[512];
} rr_verdict;

/* One finished fault (for the run report and the tracker file). */
typedef struct rr_event {
    int64_t iteration;
    int rank;
    rr_diagnosis diagnosis;
    rr_decision outcome;     /* ACCEPT (went on), SKIP or STOP */
    bool injected;           /* came from --error-injection-rate */
    bool repaired;           /* the rank's state was replaced from a peer */
    char check[32];          /* "nan_loss", "inf_loss", "nan_grad", "spiky_loss", ... */
    double value;
    char message[256];
    char aux[200];           /* the rank's auxiliary losses in the round that raised it
                              * ("load_balancing_loss 1.0046, z_loss 1.944"), "" without */
} rr_event;

typedef struct rr_machine rr_machine;

int rr_new(rr_machine **out, const rr_options *o);
void rr_destroy(rr_machine **m);

/* Adds one report. Returns 1 when the round is complete (every expected rank reported),
 * 0 when more are expected, or a negative CO_E* code for a report that does not belong to
 * the current round (stale attempt, unknown rank, duplicate): it is ignored. */
int rr_add(rr_machine *m, const rr_report *r);
/* The verdict of a complete round; starts the next round (or the next iteration). */
int rr_decide(rr_machine *m, rr_verdict *v);

/* The generation was aborted (in-process restart): the round in progress is dropped and the
 * next report starts its iteration afresh (the interrupted step is replayed). */
void rr_restart(rr_machine *m);
/* --elastic: from the next round on `world` ranks report (at most the world rr_new was given),
 * `replicas` of them data-parallel replicas (0: world / replica_stride); at a restart, with
 * rr_restart. The faults counted per rank are forgotten (the ranks are numbered anew). */
int rr_set_world(rr_machine *m, int world, int replicas);

/* Events of finished faults since the start; *n their count. */
const rr_event *rr_events(const rr_machine *m, int *n);
/* report_determinism_stats: a one-line summary of the relative differences seen. */
void rr_determinism_summary(const rr_machine *m, char *buf, size_t n);

/* The state that must survive a checkpoint (spike and gradient trackers, fault counts),
 * as one JSON object text; rr_state_load restores it. */
int rr_state_save(const rr_machine *m, char *buf, size_t n);
int rr_state_load(rr_machine *m, const char *json);

/* Megatron's tracker file (tracker.c: the only file I/O in resilience/). Appends one line
 * for a rejected result in its format
 * (ts=... node=... device=... jobID=... rank=R iteration=I status=S result=V message='...'). */
int rr_tracker_append(const char *path, const rr_event *e, const char *job);
/* Iterations to skip from a tracker file: those rejected reproducibly, or more than once on
 * one rank (Megatron's rule). Appends to iters (up to cap); returns the count added. */
int rr_tracker_skips(const char *path, int64_t *iters, int cap);

const char *rr_decision_name(rr_decision d);
const char *rr_diagnosis_name(rr_diagnosis d);

#endif
