/* plan_sim.c - `cohort plan`'s discrete-event simulation (see plan_sim.h). */
#include "resilience/plan_sim.h"

#include "common/error.h"
#include "common/rng.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

const pl_category pl_llama3_mix[] = {
    {"faulty GPU", 148, PL_HW},
    {"GPU HBM3 memory", 72, PL_HW},
    {"software bug", 54, PL_SW},
    {"network switch/cable", 35, PL_HW},
    {"host maintenance", 32, PL_HW},
    {"GPU SRAM memory", 19, PL_HW},
    {"GPU system processor", 17, PL_HW},
    {"NIC", 7, PL_HW},
    {"NCCL watchdog timeouts", 7, PL_SW},
    {"silent data corruption", 6, PL_SDC},
    {"GPU thermal interface + sensor", 6, PL_HW},
    {"SSD", 3, PL_HW},
    {"power supply", 3, PL_HW},
    {"server chassis", 2, PL_HW},
    {"IO expansion board", 2, PL_HW},
    {"dependency", 2, PL_SW},
    {"CPU", 2, PL_HW},
    {"system memory", 2, PL_HW},
};
const int pl_llama3_ncategories = (int)(sizeof pl_llama3_mix / sizeof pl_llama3_mix[0]);

double pl_llama3_rate(void) { return PL_LLAMA3_INTERRUPTIONS / (PL_LLAMA3_DAYS * 24.0 * PL_LLAMA3_GPUS); }

void pl_class_shares(const pl_category *mix, int n, double *shares) {
    double total = 0;
    for (int k = 0; k < PL_NCLASSES; k++) shares[k] = 0;
    for (int i = 0; i < n; i++) {
        shares[mix[i].cls] += mix[i].count;
        total += mix[i].count;
    }
    for (int k = 0; k < PL_NCLASSES; k++) shares[k] = total > 0 ? shares[k] / total : 0;
}

const char *pl_strategy_name(pl_strategy s) {
    static const char *const n[] = {"checkpoint-restart", "in-process", "spares", "elastic"};
    return s < PL_NSTRATEGIES ? n[s] : "?";
}

const char *pl_class_name(pl_class c) {
    static const char *const n[] = {"node lost", "software", "silent data corruption"};
    return c < PL_NCLASSES ? n[c] : "?";
}

double pl_daly_ettr(double tau, double delta, double r, double m) {
    return tau / (m * exp(r / m) * (exp((tau + delta) / m) - 1.0));
}

double pl_young_interval(double delta, double m) { return sqrt(2.0 * delta * m); }

/* ---- one run ---------------------------------------------------------------------------- */

typedef enum { PH_WORK, PH_SAVE, PH_DOWN } phase;

/* The state of one simulated run. Work is measured in seconds at the full job's rate. */
typedef struct run {
    const pl_params *p;
    co_rng rng;
    double t, end;
    phase ph;
    double rem;         /* PH_SAVE, PH_DOWN: seconds left */
    double kept;        /* work saved in checkpoints or kept by the strategy's recovery */
    double since;       /* work since the last checkpoint */
    double cap;         /* the job's rate (elastic: nodes left / nodes) */
    int nodes, spares;  /* spare nodes free */
    double *repairs;    /* times lost nodes come back (FIFO: repair time is fixed) */
    int nrep, rep0, caprep;
    double next_fail;
    pl_result r;
} run;

static double exp_draw(co_rng *g, double mean) { return -log(1.0 - co_rng_uniform(g)) * mean; }

static pl_class draw_class(run *s) {
    double u = co_rng_uniform(&s->rng), acc = 0;
    for (int k = 0; k < PL_NCLASSES; k++) {
        acc += s->p->shares[k];
        if (u < acc) return (pl_class)k;
    }
    return PL_HW;
}

static void go_down(run *s, double seconds) {
    if (s->ph != PH_DOWN || s->rem < seconds) s->rem = seconds;
    s->ph = PH_DOWN;
}

/* Work lost: rollback loses everything since the checkpoint, else the step in progress. */
static void lose(run *s, bool rollback) {
    double l = rollback ? s->since : fmin(s->since, 0.5 * s->p->c.step_s);
    s->since -= l;
    s->r.lost_work_s += l;
}

static int push_repair(run *s, double at) {
    if (s->nrep == s->caprep) {
        int cap = s->caprep ? s->caprep * 2 : 64;
        double *n = realloc(s->repairs, sizeof *n * (size_t)cap);
        if (!n) return co_err_set(CO_ENOMEM, "cohort plan: out of memory");
        s->repairs = n;
        s->caprep = cap;
    }
    s->repairs[s->nrep++] = at;
    return 0;
}

static int on_failure(run *s) {
    const pl_params *p = s->p;
    const pl_costs *c = &p->c;
    pl_class k = draw_class(s);
    s->r.failures++;
    s->r.by_class[k]++;
    if (p->strategy == PL_CKPT_RESTART || (p->fallback_share > 0 && co_rng_uniform(&s->rng) < p->fallback_share)) {
        lose(s, true);
        go_down(s, c->restart_s);
        return 0;
    }
    if (k == PL_SW) {
        lose(s, false);
        go_down(s, c->inproc_s);
    } else if (k == PL_SDC) {
        lose(s, false);
        double l = fmin(s->since, c->sdc_lost_s);
        s->since -= l;
        s->r.lost_work_s += l;
        go_down(s, c->inproc_s);
    } else {
        lose(s, false);
        if (p->strategy == PL_SPARES && s->spares > 0) {
            s->spares--;
            go_down(s, c->inproc_s);
            return push_repair(s, s->t + c->repair_h * 3600.0);
        }
        if (p->strategy == PL_ELASTIC && s->cap > 1.5 / s->nodes) {
            s->cap -= 1.0 / s->nodes;
            go_down(s, c->inproc_s);
            return push_repair(s, s->t + c->repair_h * 3600.0);
        }
        go_down(s, c->node_s);
    }
    return 0;
}

static void on_repair(run *s) {
    s->rep0++;
    if (s->p->strategy == PL_SPARES) {
        s->spares++;
    } else {
        s->cap = fmin(1.0, s->cap + 1.0 / s->nodes);
        go_down(s, s->p->c.inproc_s); /* the node rejoins: the job restarts in process */
    }
}

/* The time the current phase ends (infinity: never). */
static double phase_end(const run *s) {
    if (s->ph != PH_WORK) return s->t + s->rem;
    double tau = s->p->ckpt_interval_s;
    if (tau <= 0) return INFINITY;
    return s->t + fmax(0.0, tau - s->since) / s->cap;
}

static void advance(run *s, double to) {
    double dt = to - s->t;
    if (s->ph == PH_WORK) s->since += dt * s->cap;
    else if (s->ph == PH_SAVE) s->rem -= dt, s->r.save_total_s += dt;
    else s->rem -= dt, s->r.down_s += dt;
    s->t = to;
}

static int one_run(const pl_params *p, uint64_t seed, pl_result *out) {
    run s = {.p = p, .end = p->days * 86400.0, .ph = PH_WORK, .cap = 1.0, .spares = p->spares};
    s.nodes = p->gpus / p->gpus_per_node > 0 ? p->gpus / p->gpus_per_node : 1;
    co_rng_seed(&s.rng, seed);
    double mean = 3600.0 / (p->rate_per_gpu_h * p->gpus);
    s.next_fail = exp_draw(&s.rng, mean);
    int rc = 0;
    while (!rc && s.t < s.end) {
        double pe = phase_end(&s), rep = s.rep0 < s.nrep ? s.repairs[s.rep0] : INFINITY;
        double next = fmin(fmin(pe, s.next_fail), fmin(rep, s.end));
        advance(&s, next);
        if (next == s.end) break;
        if (next == s.next_fail) {
            rc = on_failure(&s);
            s.next_fail = s.t + exp_draw(&s.rng, mean);
        } else if (next == rep) {
            on_repair(&s);
        } else if (s.ph == PH_WORK) {
            s.ph = PH_SAVE;
            s.rem = p->c.save_s;
        } else if (s.ph == PH_SAVE) {
            s.kept += s.since;
            s.since = 0;
            s.ph = PH_WORK;
        } else {
            s.ph = PH_WORK;
        }
    }
    free(s.repairs);
    /* the work since the last checkpoint is kept: the run ends with a final save */
    s.r.ettr = (s.kept + s.since) / s.end;
    *out = s.r;
    return rc;
}

static int check(const pl_params *p) {
    if (p->gpus < 1 || p->gpus_per_node < 1 || !(p->days > 0) || !(p->rate_per_gpu_h > 0) || p->runs < 1 ||
        p->spares < 0 || p->strategy >= PL_NSTRATEGIES || !(p->fallback_share >= 0 && p->fallback_share <= 1))
        return co_err_set(CO_EINVAL, "cohort plan: GPUs, GPUs per node, days, failure rate and runs must be "
                                     "positive, spares >= 0, the fallback share in [0, 1]");
    const pl_costs *c = &p->c;
    double v[] = {c->step_s, c->save_s, c->restart_s, c->inproc_s, c->node_s, c->sdc_lost_s, c->repair_h};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!(v[i] >= 0) || !isfinite(v[i])) return co_err_set(CO_EINVAL, "cohort plan: costs must be >= 0 seconds");
    double sum = 0;
    for (int k = 0; k < PL_NCLASSES; k++) sum += p->shares[k];
    if (fabs(sum - 1.0) > 1e-6) return co_err_set(CO_EINVAL, "cohort plan: the failure mix's shares do not sum to 1");
    return 0;
}

int pl_simulate(const pl_params *p, pl_result *r) {
    int rc = check(p);
    if (rc) return rc;
    memset(r, 0, sizeof *r);
    uint64_t x = p->seed;
    for (int i = 0; i < p->runs; i++) {
        pl_result one;
        if ((rc = one_run(p, co_splitmix64(&x), &one))) return rc;
        r->ettr += one.ettr;
        r->lost_work_s += one.lost_work_s;
        r->down_s += one.down_s;
        r->save_total_s += one.save_total_s;
        r->failures += one.failures;
        for (int k = 0; k < PL_NCLASSES; k++) r->by_class[k] += one.by_class[k];
    }
    double n = p->runs;
    r->ettr /= n;
    r->lost_work_s /= n;
    r->down_s /= n;
    r->save_total_s /= n;
    r->failures /= n;
    for (int k = 0; k < PL_NCLASSES; k++) r->by_class[k] /= n;
    r->steps_lost = p->c.step_s > 0 ? r->lost_work_s / p->c.step_s : 0;
    int held = p->gpus + (p->strategy == PL_SPARES ? p->spares * p->gpus_per_node : 0);
    r->gpu_ettr = r->ettr * p->gpus / held;
    return 0;
}

int pl_best_interval(const pl_params *p, double *tau, pl_result *r) {
    pl_params q = *p;
    double best = -1;
    double share = p->strategy == PL_CKPT_RESTART ? 1.0 : p->fallback_share;
    double m = share > 0 ? 3600.0 / (p->rate_per_gpu_h * p->gpus * share) : 1e12;
    double young = fmax(60.0, pl_young_interval(p->c.save_s, m));
    for (int i = -11; i <= 10; i++) {
        q.ckpt_interval_s = i < -10 ? 0 : young * pow(10.0, i / 10.0);
        pl_result x;
        int rc = pl_simulate(&q, &x);
        if (rc) return rc;
        if (x.ettr > best) {
            best = x.ettr;
            *tau = q.ckpt_interval_s;
            *r = x;
        }
    }
    return 0;
}
