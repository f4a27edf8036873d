/* status.c - the supervisor's view of its job for Prometheus and `cohort status`
 * (status.h): the latest training record, checkpoint timings, and the two renderings. */
#include "supervisor/status.h"

#include "common/error.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct svo {
    bool have;                 /* a training record has come */
    int64_t iteration, consumed_samples, train_iters;
    double lm_loss, grad_norm, learning_rate, tokens_per_second, ms_per_iteration;
    int64_t skipped, nan_iterations;
    int64_t records;
    double ckpt_last_s;        /* the newest checkpoint's save time (< 0: none yet) */
    int64_t ckpt_last_it;
    double ckpt_sum_s;
    int64_t ckpt_n;
    double load_s;             /* the latest checkpoint load's time (< 0: none) */
    int64_t load_it, loads;
};

int svo_new(svo **out) {
    svo *o = calloc(1, sizeof *o);
    *out = o;
    if (!o) return co_err_set(CO_ENOMEM, "supervisor status: out of memory");
    o->ckpt_last_s = -1;
    o->ckpt_last_it = -1;
    o->load_s = -1;
    o->load_it = -1;
    return 0;
}

void svo_destroy(svo **o) {
    free(*o);
    *o = NULL;
}

static double num(json_t *r, const char *k, double dflt) {
    json_t *v = json_object_get(r, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

void svo_on_record(svo *o, const char *record) {
    if (!o || !record) return;
    const char *p = record;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        json_t *r = n ? json_loadb(p, n, 0, NULL) : NULL;
        json_t *ev = json_object_get(r, "event");
        if (json_is_string(ev) && !strcmp(json_string_value(ev), "checkpoint_load")) {
            o->load_s = num(r, "seconds", -1);
            o->load_it = (int64_t)num(r, "iteration", -1);
            o->loads++;
        }
        if (json_is_object(r) && !json_object_get(r, "evaluation") && !json_object_get(r, "event") &&
            json_is_integer(json_object_get(r, "iteration")) && json_object_get(r, "lm_loss")) {
            o->have = true;
            o->records++;
            o->iteration = (int64_t)num(r, "iteration", 0);
            o->consumed_samples = (int64_t)num(r, "consumed_samples", 0);
            o->train_iters = (int64_t)num(r, "train_iters", 0);
            o->lm_loss = num(r, "lm_loss", NAN);
            o->grad_norm = num(r, "grad_norm", NAN);
            o->learning_rate = num(r, "learning_rate", NAN);
            o->tokens_per_second = num(r, "tokens_per_second", NAN);
            o->ms_per_iteration = num(r, "elapsed_ms_per_iteration", NAN);
            o->skipped = (int64_t)num(r, "skipped_iterations", 0);
            o->nan_iterations = (int64_t)num(r, "nan_iterations", 0);
        }
        json_decref(r);
        if (!nl) break;
        p = nl + 1;
    }
}

void svo_on_checkpoint(svo *o, int64_t it, double seconds) {
    if (!o) return;
    o->ckpt_last_it = it;
    o->ckpt_last_s = seconds;
    if (seconds >= 0) {
        o->ckpt_sum_s += seconds;
        o->ckpt_n++;
    }
}

/* ---- Prometheus ---------------------------------------------------------------------- */

/* A label value: backslash, double quote and newline escaped. */
static void label(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '\\') fputs("\\\\", f);
        else if (*s == '"') fputs("\\\"", f);
        else if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* A sample value: Prometheus spells the special ones NaN, +Inf, -Inf. */
static void value(FILE *f, double x) {
    if (isnan(x)) fputs("NaN", f);
    else if (isinf(x)) fputs(x > 0 ? "+Inf" : "-Inf", f);
    else fprintf(f, "%.15g", x);
}

static void head(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help, double x) {
    head(f, name, type, help);
    fprintf(f, "%s ", name);
    value(f, x);
    fputc('\n', f);
}

/* The job's identity, progress and the last rank's latest logged iteration. */
static void prom_job(FILE *f, const svo *o, const svo_job *j, const svv *v) {
    head(f, "cohort_job_info", "gauge", "The job: its id and state (always 1).");
    fputs("cohort_job_info{", f);
    if (j->job_id) { /* (a single process has no job id) */
        char id[32];
        snprintf(id, sizeof id, "%016" PRIx64, j->job_id);
        fputs("job_id=", f);
        label(f, id);
        fputc(',', f);
    }
    fputs("state=", f);
    label(f, j->state);
    fputs("} 1\n", f);
    one(f, "cohort_world_size", "gauge", "Ranks that train.", j->world);
    one(f, "cohort_generation", "gauge", "The job's generation (1, plus one per in-process restart).",
        (double)j->generation);
    one(f, "cohort_uptime_seconds", "gauge", "Seconds since the supervisor started.", j->uptime_s);
    int64_t it = o->have ? o->iteration : 0;
    one(f, "cohort_iteration", "gauge", "The newest iteration the last rank logged.", (double)it);
    if (v)
        one(f, "cohort_reported_iteration", "gauge", "The newest iteration any rank reported to the rerun state machine.",
            (double)svv_current_iteration(v));
    if (o->train_iters > 0 || j->train_iters > 0)
        one(f, "cohort_train_iterations", "gauge", "Iterations the job trains (--train-iters).",
            (double)(o->train_iters > 0 ? o->train_iters : j->train_iters));
    if (!o->have) return;
    one(f, "cohort_consumed_samples", "gauge", "Training samples consumed (Megatron's consumed_samples).",
        (double)o->consumed_samples);
    one(f, "cohort_lm_loss", "gauge", "Language-model loss of the latest logged iteration(s).", o->lm_loss);
    one(f, "cohort_grad_norm", "gauge", "Gradient norm of the latest logged iteration.", o->grad_norm);
    one(f, "cohort_learning_rate", "gauge", "Learning rate of the latest logged iteration.", o->learning_rate);
    one(f, "cohort_tokens_per_second", "gauge", "Training throughput over the latest log interval.",
        o->tokens_per_second);
    one(f, "cohort_iteration_seconds", "gauge", "Wall time per iteration over the latest log interval.",
        o->ms_per_iteration / 1000.0);
    one(f, "cohort_skipped_iterations", "gauge", "Iterations skipped (the trainer's count).", (double)o->skipped);
    one(f, "cohort_nan_iterations", "gauge", "Iterations with a NaN/Inf loss or gradient norm (the trainer's count).",
        (double)o->nan_iterations);
}

/* Which step time of a rank's svv_times a per-rank series shows. */
typedef enum { PROM_LAST, PROM_MEDIAN, PROM_SCORE } prom_time;

/* One per-rank series of the validator's step times (ranks without times, or a NaN score, left out). */
static void prom_rank_times(FILE *f, const svv *v, const char *name, const char *help, prom_time which) {
    head(f, name, "gauge", help);
    svv_times t;
    for (int r = 0; r < svv_world(v); r++) {
        if (!svv_rank_times(v, r, &t)) continue;
        double x = which == PROM_LAST ? t.last_ms / 1000.0 : which == PROM_MEDIAN ? t.median_ms / 1000.0 : t.score;
        if (which == PROM_SCORE && isnan(x)) continue;
        fprintf(f, "%s{rank=\"%d\"} ", name, r);
        value(f, x);
        fputc('\n', f);
    }
}

/* Each rank: up, its heartbeat's iteration, its step times and straggler score. */
static void prom_ranks(FILE *f, const svo_job *j, const svv *v) {
    head(f, "cohort_rank_up", "gauge", "1 while the rank's worker process is registered and running.");
    for (int i = 0; i < j->nslots; i++)
        if (j->ranks[i].rank >= 0) fprintf(f, "cohort_rank_up{rank=\"%d\",node=\"%d\"} %d\n", j->ranks[i].rank,
                                           j->ranks[i].node, j->ranks[i].alive ? 1 : 0);
    if (!v) return;
    head(f, "cohort_rank_iteration", "gauge", "The iteration each rank's latest heartbeat gave.");
    for (int i = 0; i < j->nslots; i++)
        if (j->ranks[i].rank >= 0)
            fprintf(f, "cohort_rank_iteration{rank=\"%d\"} %" PRId64 "\n", j->ranks[i].rank, j->ranks[i].iteration);
    prom_rank_times(f, v, "cohort_rank_step_seconds",
                    "Each rank's latest step time (data, forward, backward, all-reduce, optimizer), as it reported.",
                    PROM_LAST);
    prom_rank_times(f, v, "cohort_rank_step_median_seconds",
                    "Each rank's median step time over its latest 32 iterations.", PROM_MEDIAN);
    prom_rank_times(f, v, "cohort_straggler_score",
                    "Each rank's straggler score: the others' median compute time over its own, smoothed (1: on par; "
                    "below --straggler-threshold three iterations in a row: a straggler).", PROM_SCORE);
}

/* The rerun state machine's and the restarts' counters. */
static void prom_counters(FILE *f, const svv *v) {
    svv_counts c;
    svv_counts_get(v, &c);
    one(f, "cohort_restarts_total", "counter", "In-process restarts of the job.", (double)c.restarts);
    one(f, "cohort_validated_iterations_total", "counter", "Iterations the rerun state machine validated.",
        (double)c.validated);
    one(f, "cohort_replays_total", "counter", "Iterations replayed by the rerun state machine.", (double)c.replays);
    one(f, "cohort_peer_checks_total", "counter", "Iterations recomputed on a healthy peer replica.", (double)c.checks);
    one(f, "cohort_repairs_total", "counter", "Replicas repaired from a healthy peer's state.", (double)c.repairs);
    one(f, "cohort_validation_skipped_iterations_total", "counter",
        "Iterations the rerun state machine skipped (a persistent NaN with --skip).", (double)c.skips);
    one(f, "cohort_steps_lost_total", "counter", "Accepted iterations lost by restarts from a checkpoint.",
        (double)c.steps_lost);
    one(f, "cohort_stragglers", "gauge", "Ranks flagged as stragglers so far.", (double)c.stragglers);
}

/* The goodput so far (supervisor/goodput.h): ETTR and the seconds lost by cause. */
static void prom_goodput(FILE *f, const svv *v) {
    gp_summary g;
    svv_goodput(v, &g);
    one(f, "cohort_goodput_ettr", "gauge",
        "Effective training time ratio: productive step time over the wall time since the job started.", g.ettr);
    one(f, "cohort_goodput_productive_seconds", "gauge", "Productive step time so far.", g.productive);
    one(f, "cohort_goodput_wall_seconds", "gauge", "Wall time since the job started.", g.wall);
    one(f, "cohort_checkpoint_saves_stopped", "gauge",
        "1 once checkpoint saves were stopped because the save directory ran short of space (--save-space-margin).",
        *svv_saves_stopped(v) ? 1 : 0);
    head(f, "cohort_goodput_lost_seconds", "gauge",
         "Seconds lost by cause (startup, detection, restart, state_transfer, replay, recompute, checkpoint_save, "
         "straggler, shrunk_capacity, other).");
    for (int c = 0; c <= GP_NCAUSES; c++) {
        fputs("cohort_goodput_lost_seconds{cause=", f);
        label(f, c < GP_NCAUSES ? gp_cause_name((gp_cause)c) : "other");
        fputs("} ", f);
        value(f, c < GP_NCAUSES ? g.lost[c] : g.other);
        fputc('\n', f);
    }
}

/* Faults by kind and diagnosis, counted from the run report's list. */
static void prom_faults(FILE *f, const svv *v) {
    struct {
        char kind[32], diag[32];
        int n;
    } agg[64];
    int na = 0;
    svv_fault fl;
    for (int k = 0; !svv_fault_get(v, k, &fl); k++) {
        const char *dg = fl.diagnosis && *fl.diagnosis ? fl.diagnosis : "none";
        int a = 0;
        while (a < na && (strcmp(agg[a].kind, fl.kind) || strcmp(agg[a].diag, dg))) a++;
        if (a == na) {
            if (na == 64) continue;
            snprintf(agg[a].kind, sizeof agg[a].kind, "%s", fl.kind);
            snprintf(agg[a].diag, sizeof agg[a].diag, "%s", dg);
            agg[a].n = 0;
            na++;
        }
        agg[a].n++;
    }
    head(f, "cohort_faults_total", "counter",
         "Faults seen, by kind (killed, exited, hang, nan, injected, ...) and the rerun state machine's diagnosis.");
    for (int a = 0; a < na; a++) {
        fputs("cohort_faults_total{kind=", f);
        label(f, agg[a].kind);
        fputs(",diagnosis=", f);
        label(f, agg[a].diag);
        fprintf(f, "} %d\n", agg[a].n);
    }
}

/* Checkpoints committed and loaded, and their times. */
static void prom_checkpoints(FILE *f, const svo *o, const svo_job *j) {
    one(f, "cohort_checkpoints_total", "counter", "Checkpoints committed by this job.", (double)j->ckpt_commits);
    if (j->ckpt_last >= 0)
        one(f, "cohort_checkpoint_last_iteration", "gauge", "The newest committed checkpoint's iteration.",
            (double)j->ckpt_last);
    if (o->ckpt_last_s >= 0)
        one(f, "cohort_checkpoint_save_seconds", "gauge",
            "The newest checkpoint's save time: from its iteration's acceptance to its commit (every rank's write "
            "and the supervisor's commit).", o->ckpt_last_s);
    if (o->load_s >= 0) {
        one(f, "cohort_checkpoint_loads_total", "counter", "Checkpoints loaded (--load, restarts from a checkpoint).",
            (double)o->loads);
        one(f, "cohort_checkpoint_load_seconds", "gauge", "The latest checkpoint load's time (the logging rank's).",
            o->load_s);
    }
}

char *svo_prometheus(const svo *o, const svo_job *j, const svv *v) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    prom_job(f, o, j, v);
    prom_ranks(f, j, v);
    if (v) {
        prom_counters(f, v);
        prom_faults(f, v);
        prom_goodput(f, v);
    }
    prom_checkpoints(f, o, j);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- cohort status --------------------------------------------------------------------- */

static json_t *real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

char *svo_status_json(const svo *o, const svo_job *j, const svv *v, int nfaults) {
    json_t *d = json_object();
    if (!d) return NULL;
    char id[32];
    snprintf(id, sizeof id, "%016" PRIx64, j->job_id);
    json_object_set_new(d, "job_id", json_string(id));
    json_object_set_new(d, "supervisor_pid", json_integer(j->pid));
    json_object_set_new(d, "state", json_string(j->state));
    json_object_set_new(d, "generation", json_integer((json_int_t)j->generation));
    json_object_set_new(d, "world_size", json_integer(j->world));
    json_object_set_new(d, "nodes", json_integer(j->nnodes));
    json_object_set_new(d, "uptime_seconds", json_real(j->uptime_s));
    int64_t train_iters = o->train_iters > 0 ? o->train_iters : j->train_iters;
    int64_t it = o->have ? o->iteration : 0;
    json_object_set_new(d, "iteration", json_integer(it));
    json_object_set_new(d, "reported_iteration", json_integer(v ? svv_current_iteration(v) : 0));
    json_object_set_new(d, "train_iters", train_iters > 0 ? json_integer(train_iters) : json_null());
    json_object_set_new(d, "consumed_samples", o->have ? json_integer(o->consumed_samples) : json_null());
    json_object_set_new(d, "lm_loss", o->have ? real_or_null(o->lm_loss) : json_null());
    json_object_set_new(d, "grad_norm", o->have ? real_or_null(o->grad_norm) : json_null());
    json_object_set_new(d, "learning_rate", o->have ? real_or_null(o->learning_rate) : json_null());
    json_object_set_new(d, "tokens_per_second", o->have ? real_or_null(o->tokens_per_second) : json_null());
    json_object_set_new(d, "iteration_ms", o->have ? real_or_null(o->ms_per_iteration) : json_null());
    json_t *ranks = json_array();
    for (int i = 0; i < j->nslots; i++) {
        const svo_rank *r = &j->ranks[i];
        json_t *x = json_object();
        json_object_set_new(x, "rank", r->rank >= 0 ? json_integer(r->rank) : json_null());
        json_object_set_new(x, "spare", json_boolean(r->rank < 0));
        json_object_set_new(x, "node", json_integer(r->node));
        json_object_set_new(x, "host", json_string(r->host ? r->host : ""));
        json_object_set_new(x, "pid", json_integer(r->pid));
        json_object_set_new(x, "alive", json_boolean(r->alive));
        json_object_set_new(x, "iteration", json_integer(r->iteration));
        json_object_set_new(x, "last_seen_seconds", json_real(r->seen_ago_s));
        svv_times t;
        if (v && r->rank >= 0 && svv_rank_times(v, r->rank, &t)) {
            json_object_set_new(x, "step_ms", json_pack("{s:f,s:f,s:f,s:f,s:i}", "last", t.last_ms, "min", t.min_ms,
                                                        "median", t.median_ms, "max", t.max_ms, "iterations", t.n));
            json_object_set_new(x, "straggler_score", real_or_null(t.score));
            json_object_set_new(x, "straggler", json_boolean(t.flagged));
        } else {
            json_object_set_new(x, "step_ms", json_null());
            json_object_set_new(x, "straggler_score", json_null());
            json_object_set_new(x, "straggler", json_false());
        }
        json_array_append_new(ranks, x);
    }
    json_object_set_new(d, "ranks", ranks);
    json_t *faults = json_array();
    if (v) {
        svv_counts c;
        svv_counts_get(v, &c);
        json_object_set_new(d, "counters",
                            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:i}", "iterations_validated",
                                      (json_int_t)c.validated, "replays", (json_int_t)c.replays, "peer_checks",
                                      (json_int_t)c.checks, "repairs", (json_int_t)c.repairs, "iterations_skipped",
                                      (json_int_t)c.skips, "restarts", (json_int_t)c.restarts, "steps_lost",
                                      (json_int_t)c.steps_lost, "faults", c.faults, "stragglers", c.stragglers));
        int from = c.faults - (nfaults > 0 ? nfaults : 10);
        svv_fault fl;
        for (int k = from < 0 ? 0 : from; !svv_fault_get(v, k, &fl); k++) {
            json_t *x = json_object();
            json_object_set_new(x, "kind", json_string(fl.kind));
            json_object_set_new(x, "rank", json_integer(fl.rank));
            json_object_set_new(x, "iteration", json_integer(fl.iteration));
            json_object_set_new(x, "diagnosis", fl.diagnosis[0] ? json_string(fl.diagnosis) : json_null());
            json_object_set_new(x, "outcome", fl.outcome[0] ? json_string(fl.outcome) : json_null());
            json_object_set_new(x, "text", json_string(fl.text));
            json_array_append_new(faults, x);
        }
    }
    json_object_set_new(d, "faults", faults);
    /* the next checkpoint: the next multiple of --save-interval (or the final save at
     * --train-iters), at the latest iteration time */
    json_t *ck = json_object();
    json_object_set_new(ck, "save_dir", j->save_dir && *j->save_dir ? json_string(j->save_dir) : json_null());
    json_object_set_new(ck, "save_interval", j->save_interval > 0 ? json_integer(j->save_interval) : json_null());
    json_object_set_new(ck, "committed", json_integer(j->ckpt_commits));
    json_object_set_new(ck, "last_iteration", j->ckpt_last >= 0 ? json_integer(j->ckpt_last) : json_null());
    json_object_set_new(ck, "last_save_seconds", o->ckpt_last_s >= 0 ? json_real(o->ckpt_last_s) : json_null());
    json_object_set_new(ck, "last_load_iteration", o->load_it >= 0 ? json_integer(o->load_it) : json_null());
    json_object_set_new(ck, "last_load_seconds", o->load_s >= 0 ? json_real(o->load_s) : json_null());
    int64_t next = -1;
    if (j->save_dir && *j->save_dir) {
        if (j->save_interval > 0) next = (it / j->save_interval + 1) * j->save_interval;
        if (train_iters > 0 && (next < 0 || next > train_iters) && it < train_iters) next = train_iters;
    }
    json_object_set_new(ck, "next_iteration", next >= 0 ? json_integer(next) : json_null());
    double eta = next >= 0 && o->have && isfinite(o->ms_per_iteration) ? (double)(next - it) * o->ms_per_iteration / 1000.0
                                                                        : NAN;
    json_object_set_new(ck, "next_in_seconds", real_or_null(eta));
    json_object_set_new(d, "checkpoint", ck);
    char *s = json_dumps(d, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(d);
    return s;
}
