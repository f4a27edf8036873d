/* ckpt_interval.c - the checkpoint interval from measurements (see ckpt_interval.h). */
#include "supervisor/ckpt_interval.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

double ci_young(double save_s, double mtbf_s) {
    return save_s > 0 && mtbf_s > 0 ? sqrt(2 * save_s * mtbf_s) : 0;
}

void ci_init(ci_est *e, double expected_mtbf, double prior_mtbf, double prior_s) {
    memset(e, 0, sizeof *e);
    e->expected_mtbf = expected_mtbf > 0 ? expected_mtbf : 0;
    e->prior_mtbf = prior_mtbf > 0 ? prior_mtbf : 86400;
    e->prior_s = prior_s > 0 ? prior_s : e->prior_mtbf;
}

void ci_fault(ci_est *e) { e->faults++; }

void ci_wall(ci_est *e, double wall_s) {
    if (wall_s > e->wall_s) e->wall_s = wall_s;
}

void ci_save(ci_est *e, double blocking_s) {
    if (!(blocking_s >= 0)) return;
    e->saves++;
    e->save_s += (blocking_s - e->save_s) / (double)e->saves; /* the running mean */
}

double ci_mtbf(const ci_est *e) {
    if (e->expected_mtbf > 0) return e->expected_mtbf;
    return (e->prior_s + e->wall_s) / (e->prior_s / e->prior_mtbf + (double)e->faults);
}

int64_t ci_iterations(const ci_est *e, double step_s, int64_t fallback, int64_t max_iters) {
    double t = ci_young(e->save_s, ci_mtbf(e));
    if (!(t > 0) || !(step_s > 0)) return fallback;
    double n = floor(t / step_s + 0.5);
    if (n < 1) n = 1;
    if (max_iters > 0 && n > (double)max_iters) n = (double)max_iters;
    return (int64_t)n;
}

void ci_auto_init(ci_auto *a, double expected_mtbf, int64_t max_iters, double now_s) {
    memset(a, 0, sizeof *a);
    ci_init(&a->est, expected_mtbf, 86400, 3600); /* (a prior of a day between failures, worth an hour of observation) */
    a->t0 = now_s;
    a->last_save = -1;
    a->max_iters = max_iters;
}

bool ci_auto_due(ci_auto *a, int64_t it, double now_s, double step_s, bool *changed) {
    ci_wall(&a->est, now_s - a->t0);
    if (a->last_save < 0) a->last_save = it - 1; /* (the job's first accepted iteration) */
    int64_t n = a->est.saves ? ci_iterations(&a->est, step_s, CI_FIRST_SAVE, a->max_iters) : CI_FIRST_SAVE;
    int64_t moved = n > a->reported ? n - a->reported : a->reported - n;
    *changed = !a->reported || 10 * moved > a->reported || a->est.faults != a->faults_seen;
    if (*changed) a->reported = n;
    a->faults_seen = a->est.faults;
    a->interval = n;
    if (it - a->last_save < n) return false;
    a->last_save = it;
    return true;
}

void ci_auto_resumed(ci_auto *a, int64_t it) { a->last_save = it; }

void ci_auto_describe(const ci_auto *a, double step_s, char *out, size_t n) {
    const ci_est *e = &a->est;
    if (!e->saves) {
        snprintf(out, n, "%" PRId64 " iterations (no save measured yet: the first measures its cost)", a->interval);
        return;
    }
    double mtbf = ci_mtbf(e);
    char src[160];
    if (e->expected_mtbf > 0) snprintf(src, sizeof src, "given by --expected-mtbf");
    else
        snprintf(src, sizeof src, "a prior of %.0f s and %" PRId64 " fault(s) in %.0f s", e->prior_mtbf, e->faults,
                 e->wall_s);
    snprintf(out, n,
             "%" PRId64 " iterations (Young: sqrt(2 x %.3f s to save x %.1f s between failures) = %.2f s at %.4f s a "
             "step; the save cost from %" PRId64 " save(s), the MTBF %s)",
             a->interval, e->save_s, mtbf, ci_young(e->save_s, mtbf), step_s, e->saves, src);
}
