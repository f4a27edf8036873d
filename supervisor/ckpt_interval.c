/* ckpt_interval.c - the checkpoint interval from measurements (see ckpt_interval.h). */
#include "supervisor/ckpt_interval.h"

#include <math.h>
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
