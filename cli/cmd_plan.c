/* cmd_plan.c - `cohort plan`: what failures will cost a run of N GPUs over D days under each
 * recovery strategy (resilience/plan_sim.h's simulation), with recovery costs from a cohort run
 * report or flags; a table per strategy and, with --svg, ETTR against cluster size. */
#include "cli/cli.h"

#include "common/error.h"
#include "common/log.h"
#include "resilience/plan_sim.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plan_usage(FILE *f) {
    fputs("usage: cohort plan [flags]\n"
          "\n"
          "Simulates a run's failures (a Poisson process per GPU, kinds drawn from a mix) and compares\n"
          "recovery strategies: checkpoint-restart, in-process restart, warm spares, elastic. Prints\n"
          "each one's ETTR (useful training time / wall time), expected steps lost and its best\n"
          "checkpoint interval. Seeded: the same flags print the same numbers.\n"
          "\n"
          "  --gpus N                 GPUs training (default 16384)\n"
          "  --gpus-per-node N        (default 8)\n"
          "  --days D                 length of the run (default 54)\n"
          "  --failures-per-gpu-hour X  (default Llama 3's: 419 in 54 days on 16,384 GPUs)\n"
          "  --mix llama3|hw=A,sw=B,sdc=C  the failures' kinds (default llama3: Llama 3's 419\n"
          "                           unexpected interruptions by root cause)\n"
          "  --fallback-share X       share of failures the in-process strategies cannot cure and\n"
          "                           hand to checkpoint-restart (default 3/419: Llama 3's manual\n"
          "                           interventions)\n"
          "  --spares K               warm spare nodes for the spares strategy (default 2)\n"
          "  --from-report FILE       a cohort run report (--run-report): the step time and the\n"
          "                           in-process restart's cost measured there\n"
          "  --step-seconds S         one iteration (default 10, or the report's)\n"
          "  --save-seconds S         a checkpoint save's blocking part (default 30)\n"
          "  --restart-seconds S      checkpoint-restart: relaunch and load (default 600)\n"
          "  --inprocess-seconds S    in-process restart (default 60, or the report's)\n"
          "  --node-seconds S         in-process restart waiting for a new node (default 600)\n"
          "  --sdc-lost-seconds S     work redone after silent corruption (default: one step)\n"
          "  --repair-hours H         a lost node back in service (default 24)\n"
          "  --checkpoint-interval S  fixed instead of each strategy's best\n"
          "  --runs N                 runs averaged (default: enough for ~4000 failures, 8..400)\n"
          "  --seed N                 (default 1)\n"
          "  --svg FILE               ETTR against cluster size (512 to 131,072 GPUs) per strategy\n"
          "  --json                   one JSON object instead of the table\n",
          f);
}

typedef struct plan_opts {
    pl_params p;
    const char *report, *svg;
    double interval;    /* < 0: each strategy's best */
    bool json, runs_set, step_set, inproc_set, sdc_set;
} plan_opts;

static int number(const char *flag, const char *s, double lo, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || end == s || *end || errno || !(v >= lo) || !isfinite(v)) {
        fprintf(stderr, "cohort plan: %s '%s': give a number >= %g\n", flag, s ? s : "", lo);
        return CLI_USAGE;
    }
    *out = v;
    return 0;
}

static int parse_mix(const char *s, double *shares) {
    if (!strcmp(s, "llama3")) {
        pl_class_shares(pl_llama3_mix, pl_llama3_ncategories, shares);
        return 0;
    }
    double v[PL_NCLASSES] = {0}, sum = 0;
    if (sscanf(s, "hw=%lf,sw=%lf,sdc=%lf", &v[PL_HW], &v[PL_SW], &v[PL_SDC]) != 3 || v[0] < 0 || v[1] < 0 ||
        v[2] < 0 || !((sum = v[0] + v[1] + v[2]) > 0)) {
        fprintf(stderr, "cohort plan: --mix '%s': give llama3 or hw=A,sw=B,sdc=C (non-negative weights)\n", s);
        return CLI_USAGE;
    }
    for (int k = 0; k < PL_NCLASSES; k++) shares[k] = v[k] / sum;
    return 0;
}

/* The costs a run report measured: the in-process restart (detection + recovery of the faults
 * it recovered in process) and the step time (wall time less those, per validated iteration). */
static int read_report(plan_opts *o) {
    json_error_t e;
    json_t *d = json_load_file(o->report, 0, &e);
    if (!d) {
        fprintf(stderr, "cohort plan: --from-report %s: not a JSON run report (%s, line %d)\n", o->report, e.text,
                e.line);
        return CLI_USAGE;
    }
    double wall = json_number_value(json_object_get(d, "wall_seconds")), rec = 0;
    json_int_t iters = json_integer_value(json_object_get(d, "iterations_validated"));
    int n = 0;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(d, "faults"), i, f) {
        const char *by = json_string_value(json_object_get(f, "recovered_by"));
        json_t *rm = json_object_get(f, "recovery_ms"), *dm = json_object_get(f, "detection_ms");
        if (!by || strcmp(by, "in-process restart") || !json_is_number(rm)) continue;
        rec += (json_number_value(rm) + (json_is_number(dm) ? json_number_value(dm) : 0)) / 1000.0;
        n++;
    }
    if (!o->inproc_set && n > 0) o->p.c.inproc_s = rec / n;
    if (!o->step_set && iters > 0 && wall > rec) o->p.c.step_s = (wall - rec) / (double)iters;
    fprintf(stderr, "cohort plan: from %s: %d in-process restarts, %.2f s each; step %.3f s (%lld iterations)\n",
            o->report, n, n ? rec / n : 0.0, o->p.c.step_s, (long long)iters);
    json_decref(d);
    return 0;
}

static int parse(int argc, char **argv, plan_opts *o) {
    pl_params *p = &o->p;
    double v;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *x = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        i++;
        if (!strcmp(a, "--gpus") && !(rc = number(a, x, 1, &v))) p->gpus = (int)v;
        else if (!strcmp(a, "--gpus-per-node") && !(rc = number(a, x, 1, &v))) p->gpus_per_node = (int)v;
        else if (!strcmp(a, "--days")) rc = number(a, x, 1e-6, &p->days);
        else if (!strcmp(a, "--failures-per-gpu-hour")) rc = number(a, x, 1e-12, &p->rate_per_gpu_h);
        else if (!strcmp(a, "--mix")) rc = x ? parse_mix(x, p->shares) : number(a, x, 0, &v);
        else if (!strcmp(a, "--fallback-share")) rc = number(a, x, 0, &p->fallback_share);
        else if (!strcmp(a, "--spares") && !(rc = number(a, x, 0, &v))) p->spares = (int)v;
        else if (!strcmp(a, "--from-report")) o->report = x;
        else if (!strcmp(a, "--step-seconds")) rc = number(a, x, 0, &p->c.step_s), o->step_set = true;
        else if (!strcmp(a, "--save-seconds")) rc = number(a, x, 0, &p->c.save_s);
        else if (!strcmp(a, "--restart-seconds")) rc = number(a, x, 0, &p->c.restart_s);
        else if (!strcmp(a, "--inprocess-seconds")) rc = number(a, x, 0, &p->c.inproc_s), o->inproc_set = true;
        else if (!strcmp(a, "--node-seconds")) rc = number(a, x, 0, &p->c.node_s);
        else if (!strcmp(a, "--sdc-lost-seconds")) rc = number(a, x, 0, &p->c.sdc_lost_s), o->sdc_set = true;
        else if (!strcmp(a, "--repair-hours")) rc = number(a, x, 0, &p->c.repair_h);
        else if (!strcmp(a, "--checkpoint-interval")) rc = number(a, x, 1, &o->interval);
        else if (!strcmp(a, "--runs") && !(rc = number(a, x, 1, &v))) p->runs = (int)v, o->runs_set = true;
        else if (!strcmp(a, "--seed") && !(rc = number(a, x, 0, &v))) p->seed = (uint64_t)v;
        else if (!strcmp(a, "--svg")) o->svg = x;
        else if (!rc) {
            fprintf(stderr, "cohort plan: unknown flag '%s' (cohort plan --help lists them)\n", a);
            return CLI_USAGE;
        }
        if (rc) return rc;
        if (!x) {
            fprintf(stderr, "cohort plan: %s needs a value\n", a);
            return CLI_USAGE;
        }
    }
    if (p->fallback_share > 1) {
        fprintf(stderr, "cohort plan: --fallback-share %g: give a share between 0 and 1\n", p->fallback_share);
        return CLI_USAGE;
    }
    if (o->report && read_report(o)) return CLI_USAGE;
    if (!o->sdc_set) p->c.sdc_lost_s = p->c.step_s;
    return 0;
}

/* Runs enough for about 4000 failures in all (8..400), unless --runs. */
static void size_runs(plan_opts *o, pl_params *p) {
    if (o->runs_set) return;
    double per_run = p->rate_per_gpu_h * p->gpus * p->days * 24.0;
    double r = ceil(4000.0 / fmax(per_run, 1e-9));
    p->runs = r < 8 ? 8 : r > 400 ? 400 : (int)r;
}

static int evaluate(plan_opts *o, pl_params *p, double *tau, pl_result *r) {
    size_runs(o, p);
    if (o->interval > 0) {
        p->ckpt_interval_s = *tau = o->interval;
        return pl_simulate(p, r);
    }
    return pl_best_interval(p, tau, r);
}

static const char *const colours[PL_NSTRATEGIES] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};

/* ETTR against cluster size, one polyline per strategy, on log2 GPUs. */
static int write_svg(plan_opts *o) {
    enum { NS = 9, W = 720, H = 440, L = 70, R = 170, T = 30, B = 60 };
    double ettr[PL_NSTRATEGIES][NS];
    int sizes[NS];
    for (int k = 0; k < NS; k++) sizes[k] = 512 << k;
    for (int s = 0; s < PL_NSTRATEGIES; s++)
        for (int k = 0; k < NS; k++) {
            pl_params q = o->p;
            q.strategy = (pl_strategy)s;
            q.gpus = sizes[k];
            double tau;
            pl_result r;
            int rc = evaluate(o, &q, &tau, &r);
            if (rc) return rc;
            ettr[s][k] = r.ettr;
        }
    double lo = 1.0;
    for (int s = 0; s < PL_NSTRATEGIES; s++)
        for (int k = 0; k < NS; k++) lo = fmin(lo, ettr[s][k]);
    lo = floor(lo * 10.0) / 10.0;
    if (lo > 0.9) lo = 0.9;
    FILE *f = fopen(o->svg, "w");
    if (!f) return co_err_set(CO_EIO, "cohort plan: --svg %s: cannot write it (%s)", o->svg, strerror(errno));
    double pw = W - L - R, ph = H - T - B;
#define X(k) (L + pw * (k) / (NS - 1))
#define Y(e) (T + ph * (1.0 - ((e) - lo) / (1.0 - lo)))
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"18\" font-size=\"14\">ETTR against cluster size (%.0f days, %.3g failures per "
               "GPU-hour)</text>\n", L, o->p.days, o->p.rate_per_gpu_h);
    for (int i = 0; i <= 5; i++) {
        double e = lo + (1.0 - lo) * i / 5.0;
        fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%d\" y=\"%.1f\" "
                   "text-anchor=\"end\">%.2f</text>\n", L, L + pw, Y(e), Y(e), L - 6, Y(e) + 4, e);
    }
    for (int k = 0; k < NS; k++)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", X(k), H - B + 18, sizes[k]);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">GPUs</text>\n", L + pw / 2, H - B + 40);
    fprintf(f, "<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">ETTR</text>\n",
            T + ph / 2, T + ph / 2);
    for (int s = 0; s < PL_NSTRATEGIES; s++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", colours[s]);
        for (int k = 0; k < NS; k++) fprintf(f, "%.1f,%.1f ", X(k), Y(ettr[s][k]));
        fprintf(f, "\"/>\n<text x=\"%.1f\" y=\"%d\" fill=\"%s\">%s%s</text>\n", L + pw + 10, T + 20 + 18 * s,
                colours[s], pl_strategy_name((pl_strategy)s), s == PL_SPARES ? " (spare nodes)" : "");
    }
#undef X
#undef Y
    fputs("</svg>\n", f);
    if (fclose(f)) return co_err_set(CO_EIO, "cohort plan: --svg %s: cannot write it", o->svg);
    return 0;
}

static void print_table(const plan_opts *o, const pl_result *r, const double *tau) {
    const pl_params *p = &o->p;
    printf("cohort plan: %d GPUs (%d per node) for %.1f days, %.3g failures per GPU-hour (one every %.2f h), mix: "
           "%.1f%% node lost, %.1f%% software, %.1f%% silent corruption; %d runs, seed %llu\n",
           p->gpus, p->gpus_per_node, p->days, p->rate_per_gpu_h, 1.0 / (p->rate_per_gpu_h * p->gpus),
           100 * p->shares[PL_HW], 100 * p->shares[PL_SW], 100 * p->shares[PL_SDC], r[0].failures > 0 ? p->runs : 0,
           (unsigned long long)p->seed);
    printf("costs: step %.3g s, save %.3g s, checkpoint-restart %.3g s, in-process %.3g s, new node %.3g s, "
           "repair %.3g h, fallback share %.4f, spares %d nodes\n",
           p->c.step_s, p->c.save_s, p->c.restart_s, p->c.inproc_s, p->c.node_s, p->c.repair_h, p->fallback_share,
           p->spares);
    printf("%-20s %7s %9s %9s %12s %10s %14s\n", "strategy", "ETTR", "GPU-ETTR", "failures", "steps lost",
           "down (h)", "ckpt interval");
    for (int s = 0; s < PL_NSTRATEGIES; s++) {
        char iv[32];
        if (tau[s] > 0) snprintf(iv, sizeof iv, "%.0f s", tau[s]);
        else snprintf(iv, sizeof iv, "none");
        printf("%-20s %7.4f %9.4f %9.1f %12.0f %10.2f %14s\n", pl_strategy_name((pl_strategy)s), r[s].ettr,
               r[s].gpu_ettr, r[s].failures, r[s].steps_lost, r[s].down_s / 3600.0, iv);
    }
}

static void print_json(const plan_opts *o, const pl_result *r, const double *tau) {
    json_t *d = json_pack("{s:i, s:i, s:f, s:f, s:i}", "gpus", o->p.gpus, "gpus_per_node", o->p.gpus_per_node, "days",
                          o->p.days, "failures_per_gpu_hour", o->p.rate_per_gpu_h, "runs", o->p.runs);
    json_t *a = json_array();
    for (int s = 0; s < PL_NSTRATEGIES; s++)
        json_array_append_new(a, json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f}", "strategy",
                                           pl_strategy_name((pl_strategy)s), "ettr", r[s].ettr, "gpu_ettr",
                                           r[s].gpu_ettr, "failures", r[s].failures, "steps_lost", r[s].steps_lost,
                                           "down_seconds", r[s].down_s, "checkpoint_interval_s", tau[s]));
    json_object_set_new(d, "strategies", a);
    char *t = json_dumps(d, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (t) puts(t);
    free(t);
    json_decref(d);
}

int cli_plan(int argc, char **argv) {
    plan_opts o = {.interval = -1,
                   .p = {.gpus = PL_LLAMA3_GPUS, .gpus_per_node = 8, .days = PL_LLAMA3_DAYS, .spares = 2, .seed = 1,
                         .fallback_share = (double)PL_LLAMA3_MANUAL / PL_LLAMA3_INTERRUPTIONS,
                         .c = {.step_s = 10, .save_s = 30, .restart_s = 600, .inproc_s = 60, .node_s = 600,
                               .repair_h = 24}}};
    o.p.rate_per_gpu_h = pl_llama3_rate();
    pl_class_shares(pl_llama3_mix, pl_llama3_ncategories, o.p.shares);
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    pl_result r[PL_NSTRATEGIES];
    double tau[PL_NSTRATEGIES];
    for (int s = 0; s < PL_NSTRATEGIES; s++) {
        pl_params q = o.p;
        q.strategy = (pl_strategy)s;
        if ((rc = evaluate(&o, &q, &tau[s], &r[s]))) {
            co_log(CO_LOG_ERROR, "%s", co_err_detail());
            return CLI_USAGE;
        }
        o.p.runs = q.runs;
    }
    if (o.json) print_json(&o, r, tau);
    else print_table(&o, r, tau);
    if (o.svg && (rc = write_svg(&o))) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return CLI_FAILURE;
    }
    return CLI_OK;
}
