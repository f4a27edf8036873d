/* ckpt_interval.h - the checkpoint interval from measurements, as pure logic: Young's
 * first-order optimum sqrt(2 * C * MTBF) (C: the blocking save cost), the job's mean time
 * between failures estimated from the faults it has seen with a prior (or given), and the
 * interval in iterations from the measured step time. The building block of
 * `--save-interval auto`, which is not wired into the supervisor and the ranks yet. */
#ifndef COHORT_SUPERVISOR_CKPT_INTERVAL_H
#define COHORT_SUPERVISOR_CKPT_INTERVAL_H

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

#endif
