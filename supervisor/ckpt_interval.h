/* ckpt_interval.h - the checkpoint interval from measurements, as pure logic: Young's
 * first-order optimum sqrt(2 * C * MTBF) (C: the blocking save cost), the job's mean time
 * between failures estimated from the faults it has seen with a prior (or given), and the
 * interval in iterations from the measured step time; and ci_auto, `--save-interval auto`'s
 * decision after each accepted iteration (the supervisor's, sent to every rank with the
 * iteration's verdict, so that all ranks save the same iterations; a single process's own). */
#ifndef COHORT_SUPERVISOR_CKPT_INTERVAL_H
#define COHORT_SUPERVISOR_CKPT_INTERVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Young's interval in seconds: sqrt(2 * save_s * mtbf_s) (0 when either is not positive). */
double ci_young(double save_s, double mtbf_s);

typedef struct ci_est {
    double expected_mtbf;  /* > 0: the MTBF given (--expected-mtbf); the observed faults are ignored */
    double prior_mtbf;     /* the prior's MTBF, seconds ... */
    double prior_s;        /* ... worth this much observed time */
    int64_t faults;        /* observed in this job ... */
    double wall_s;         /* ... over this much wall time */
    double save_s;         /* the blocking save cost, averaged (0: none measured) */
    int64_t saves;
} ci_est;

void ci_init(ci_est *e, double expected_mtbf, double prior_mtbf, double prior_s);
void ci_fault(ci_est *e);
void ci_wall(ci_est *e, double wall_s);
void ci_save(ci_est *e, double blocking_s);
/* The MTBF: given, or (prior_s + wall) / (prior_s / prior_mtbf + faults). */
double ci_mtbf(const ci_est *e);
/* The interval in iterations for a step of step_s seconds: Young's interval over it, rounded,
 * within [1, max_iters]; fallback when no save or step time has been measured yet. */
int64_t ci_iterations(const ci_est *e, double step_s, int64_t fallback, int64_t max_iters);

/* `--save-interval auto`: after an accepted iteration, whether a checkpoint follows it. Until a
 * save's cost is measured the first save comes CI_FIRST_SAVE iterations in (to measure it);
 * then every Young's interval in iterations, re-estimated at each decision from the save costs
 * (ci_save), the faults (ci_fault) and the wall time since ci_auto_init. */
#define CI_FIRST_SAVE 10
typedef struct ci_auto {
    ci_est est;
    double t0;          /* wall clock at the start, seconds */
    int64_t last_save;  /* the iteration saved or resumed from last (-1: none yet: the first decided) */
    int64_t interval;   /* the interval chosen last, iterations (0: none yet) */
    int64_t max_iters;  /* --train-iters: no interval beyond it */
    int64_t faults_seen; /* the faults the last decision knew of */
    int64_t reported;    /* the interval last reported as a change (0: none) */
} ci_auto;

void ci_auto_init(ci_auto *a, double expected_mtbf, int64_t max_iters, double now_s);
/* Iteration it was accepted at now_s, steps taking step_s (0: not known yet): whether a save
 * follows it. *changed: the interval moved by more than a tenth from the one last reported, or
 * a fault came since (worth a log line; the step time's noise moves it by a few iterations). */
bool ci_auto_due(ci_auto *a, int64_t it, double now_s, double step_s, bool *changed);
/* The job resumed from the checkpoint of iteration it (a restart that fell back to it). */
void ci_auto_resumed(ci_auto *a, int64_t it);
/* The last decision in words: "37 iterations (Young: sqrt(2 x 0.052 s x 2.0 s) = 0.46 s, ...)". */
void ci_auto_describe(const ci_auto *a, double step_s, char *out, size_t n);

#endif
