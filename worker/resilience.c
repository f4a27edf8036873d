/* resilience.c - a rank's resilience flags wired to its trainer: the rerun
 * state machine's validator (in-process for one rank, the supervisor's through the worker's
 * link otherwise), the --inject schedule, --iterations-to-skip plus the iterations Megatron's
 * tracker file says to skip, and the fault events a worker reports for the run report. */
#include "worker/resilience.h"

#include "common/error.h"
#include "common/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long a rank waits for its verdict before giving up (the supervisor is alive: it
 * answers repeats every second; this bounds a stuck job). */
#define VERDICT_TIMEOUT_MS (10 * 60 * 1000)

struct wk_resil {
    co_config c;
    sv_link *link;
    int rank, world;
    trainer *t; /* attached (wk_resil_attach) */
    fi_schedule inj;
    rr_machine *rr; /* one rank: the state machine runs here */
    int64_t skips[CO_MAX_DATA_PATHS + 512];
    int nskips;
    int nev_seen;
};

void wk_rr_options(const co_config *c, int world, rr_options *o) {
    rr_options_default(o, world);
    o->mode = !strcmp(c->rerun_mode, "disabled")                   ? RR_MODE_DISABLED
              : !strcmp(c->rerun_mode, "report_determinism_stats") ? RR_MODE_DETERMINISM
                                                                   : RR_MODE_VALIDATE;
    o->check_nan = c->check_for_nan_in_loss_and_grad;
    o->check_spiky = c->check_for_spiky_loss;
    o->check_large_grads = c->check_for_large_grads;
    o->check_rank_outliers = c->check_rank_outliers;
    o->skip_on_reproducible = !strcmp(c->on_reproducible_error, "skip");
    o->grad_overflow_skips = c->fp16;
    o->injection_rate = c->error_injection_rate;
    o->injection_type = !strcmp(c->error_injection_type, "correct_result")     ? RR_INJECT_CORRECT
                        : !strcmp(c->error_injection_type, "persistent_error") ? RR_INJECT_PERSISTENT
                                                                               : RR_INJECT_TRANSIENT;
    o->seed = (uint64_t)c->seed;
}

int wk_inject_parse(const co_config *c, int world, fi_schedule *s) {
    return fi_schedule_parse(s, c->inject, c->n_inject, (uint64_t)c->inject_seed, world, c->train_iters);
}

/* ---- the validator ---- */

static int local_report(void *ctx, const rr_report *r, const double phase_ms[TR_NPHASES]) {
    (void)phase_ms;
    wk_resil *x = ctx;
    int rc = rr_add(x->rr, r);
    return rc < 0 ? rc : 0;
}

static int local_verdict(void *ctx, int64_t iteration, int attempt, rr_verdict *v) {
    (void)iteration;
    (void)attempt;
    wk_resil *x = ctx;
    int rc = rr_decide(x->rr, v);
    if (rc) return rc;
    int n;
    const rr_event *ev = rr_events(x->rr, &n);
    for (; x->nev_seen < n; x->nev_seen++)
        if (x->c.result_rejected_tracker_filename[0] &&
            rr_tracker_append(x->c.result_rejected_tracker_filename, &ev[x->nev_seen], NULL))
            co_log(CO_LOG_WARN, "%s", co_err_detail());
    return 0;
}

static int link_report(void *ctx, const rr_report *r, const double phase_ms[TR_NPHASES]) {
    wk_resil *x = ctx;
    int copies = 1, delay = 0;
    /* injected control-message faults act on this round's report */
    fi_fault *f;
    char line[400];
    static const fi_kind mk[] = {FI_MSG_DROP, FI_MSG_DUP, FI_MSG_DELAY};
    for (int k = 0; k < 3; k++)
        if (r->attempt == 0 && r->check_for < 0 &&
            (f = fi_take(&x->inj, mk[k], x->rank, x->rank, r->iteration, -1, FI_PH_ALLREDUCE))) {
            fi_describe(f, x->rank, r->iteration, -1, line, sizeof line);
            co_log(CO_LOG_WARN, "%s", line);
            sv_link_event(x->link, line);
            if (mk[k] == FI_MSG_DROP) copies = 0;
            if (mk[k] == FI_MSG_DUP) copies = 2;
            if (mk[k] == FI_MSG_DELAY) delay = f->ms;
        }
    return sv_link_report(x->link, r, phase_ms, trainer_phase_names, TR_NPHASES, copies, delay);
}

static int link_verdict(void *ctx, int64_t iteration, int attempt, rr_verdict *v) {
    wk_resil *x = ctx;
    return sv_link_verdict(x->link, iteration, attempt, v, VERDICT_TIMEOUT_MS);
}

static int link_checksum(void *ctx, const rr_report *r) {
    wk_resil *x = ctx;
    return sv_link_checksum(x->link, r);
}

static void link_event(void *ctx, const char *line) {
    wk_resil *x = ctx;
    sv_link_event(x->link, line);
}

int wk_resil_new(wk_resil **out, const co_config *c, sv_link *link, int rank, int world) {
    *out = NULL;
    wk_resil *x = calloc(1, sizeof *x);
    if (!x) return co_err_set(CO_ENOMEM, "resilience: out of memory");
    x->c = *c;
    x->link = link;
    x->rank = rank;
    x->world = world;
    int rc = wk_inject_parse(c, world, &x->inj);
    if (!rc && !link && strcmp(c->rerun_mode, "disabled")) {
        rr_options o;
        wk_rr_options(c, 1, &o);
        rc = rr_new(&x->rr, &o); /* (its detail stays) */
    }
    if (rc) {
        wk_resil_destroy(&x);
        return rc;
    }
    for (int i = 0; i < c->n_iterations_to_skip; i++) x->skips[x->nskips++] = atoll(c->iterations_to_skip[i]);
    if (c->result_rejected_tracker_filename[0])
        x->nskips += rr_tracker_skips(c->result_rejected_tracker_filename, x->skips + x->nskips, 512);
    *out = x;
    return 0;
}

/* After every iteration: faults `cohort inject` sent join the schedule. */
static int pull_injections(trainer *t, void *ctx, bool final, train_end why) {
    (void)t;
    (void)why;
    wk_resil *x = ctx;
    if (final) return 0;
    char *specs[16];
    int n = sv_link_take_injections(x->link, specs, 16);
    for (int i = 0; i < n; i++) {
        if (fi_schedule_add(&x->inj, specs[i], (uint64_t)x->c.inject_seed, x->world, x->c.train_iters))
            co_log(CO_LOG_WARN, "%s", co_err_detail());
        free(specs[i]);
    }
    return 0;
}

int wk_resil_attach(wk_resil *x, trainer *t, FILE *log) {
    if (x->nskips) {
        trainer_set_skips(t, x->skips, x->nskips);
        if (log && x->c.result_rejected_tracker_filename[0] && x->nskips > x->c.n_iterations_to_skip)
            fprintf(log, "cohort: skipping %d iteration(s) that %s shows failing reproducibly\n",
                    x->nskips - x->c.n_iterations_to_skip, x->c.result_rejected_tracker_filename);
    }
    x->t = t;
    trainer_set_injector(t, &x->inj, x->rank);
    if (x->link) {
        int rc = trainer_set_hook(t, pull_injections, x);
        if (rc) return rc;
        trainer_set_event_sink(t, link_event, x);
        if (strcmp(x->c.rerun_mode, "disabled")) {
            trainer_validator v = {.report = link_report, .verdict = link_verdict, .checksum = link_checksum, .ctx = x};
            trainer_set_validator(t, &v);
        }
    } else if (x->rr) {
        trainer_validator v = {.report = local_report, .verdict = local_verdict, .ctx = x};
        trainer_set_validator(t, &v);
    }
    return 0;
}

void wk_resil_set_rank(wk_resil *x, int rank) {
    x->rank = rank;
    if (x->t) trainer_set_injector(x->t, &x->inj, rank);
}

void wk_resil_mark_replayed(wk_resil *x, int64_t step) {
    /* faults up to the step the job had reached fired already (in a process now gone, or on
     * the rank this process held before a shift) */
    for (int i = 0; i < x->inj.n; i++) {
        fi_fault *f = &x->inj.f[i];
        if (f->rank != x->rank || f->step > step) continue;
        if (!f->fired) f->fired = 1;
        /* a slow rank (times=always) is its process's machine: another process is not slow */
        if (f->kind == FI_SLOW) f->always = false;
    }
}

static int local_state_save(void *ctx, char *buf, size_t n) {
    wk_resil *x = ctx;
    return x->rr ? rr_state_save(x->rr, buf, n) : CO_ENOENT;
}

void wk_resil_attach_ckpt(wk_resil *x, wk_ckpt *k) {
    if (!x->rr || !k) return; /* with a supervisor the state lives there */
    wk_ckpt_set_rerun_state(k, local_state_save, x);
    const char *st = wk_ckpt_loaded_rerun_state(k);
    if (st && strstr(st, "spiky_max") && rr_state_load(x->rr, st))
        co_log(CO_LOG_WARN, "the checkpoint's rerun state machine state is not usable (%s); starting afresh",
               co_err_detail());
}

void wk_resil_destroy(wk_resil **px) {
    wk_resil *x = *px;
    if (!x) return;
    if (x->rr) {
        int n;
        const rr_event *ev = rr_events(x->rr, &n);
        if (n) co_log(CO_LOG_INFO, "the rerun state machine handled %d fault(s):", n);
        for (int i = 0; i < n; i++)
            fprintf(stderr, "  - iteration %lld, %s, %s: %s%s%s%s\n", (long long)ev[i].iteration, ev[i].check,
                    rr_diagnosis_name(ev[i].diagnosis), ev[i].message, ev[i].aux[0] ? " [its MoE/MTP losses: " : "",
                    ev[i].aux, ev[i].aux[0] ? "]" : "");
        if (!strcmp(x->c.rerun_mode, "report_determinism_stats")) {
            char buf[400];
            rr_determinism_summary(x->rr, buf, sizeof buf);
            co_log(CO_LOG_INFO, "determinism: %s", buf);
        }
    }
    rr_destroy(&x->rr);
    fi_schedule_free(&x->inj);
    free(x);
    *px = NULL;
}
