/* validate.c - the supervisor's rerun state machine, straggler scores and run report
 * (see validate.h). */
#include "supervisor/validate.h"

#include "common/error.h"
#include "common/log.h"
#include "supervisor/ckpt_interval.h"
#include "supervisor/goodput.h"
#include "supervisor/msg.h"
#include "supervisor/supervisor.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define SVV_NPH 5 /* data, forward, backward, allreduce, optimizer (train/trainer.h) */
static const char *const ph_names[SVV_NPH] = {"data", "forward", "backward", "allreduce", "optimizer"};

typedef struct pend {
    rr_report r;
    int got;        /* the round's message has come (one a round) */
    bool added;
    bool want_sum;  /* a ParamsChecksum follows the reports (r.has_sum: it has come) */
    double phase_ms[SVV_NPH];
} pend;

#define SVV_EVICT_SCORES 16 /* the scores an eviction's record keeps */

typedef struct fault_rec {
    char kind[32];
    int rank;
    int64_t iteration;
    char diagnosis[32];
    char outcome[16];
    char text[640];
    double detect_ms, recover_ms; /* < 0: not measured */
    double scores[SVV_EVICT_SCORES]; /* an eviction's straggler scores, oldest first */
    int nscores;
    bool open;                    /* an rr fault whose recovery is still running */
    bool restart;                 /* recovered by an in-process restart */
    uint64_t t_detect;            /* when it was detected (restart faults) */
} fault_rec;

/* A fault `cohort inject` or the random fault injector asked for: not a fault until a rank
 * reports it fired. */
typedef struct inject_req {
    char spec[200];
    int64_t requested_at; /* the iteration the job was at */
    bool random;          /* the random fault injector's (--fault-injector-*) */
} inject_req;

/* The lines the supervisor records for a `cohort inject` request (supervisor.c handle_inject)
 * and a random fault injector's injection (supervisor/fault_injector.c):
 * "inject: SPEC (cohort inject), requested at iteration N",
 * "inject: SPEC (--fault-injector), requested at iteration N". */
#define SVV_REQUEST_MARK " (cohort inject), requested at iteration "
#define SVV_RANDOM_MARK " (--fault-injector), requested at iteration "
#define SVV_MAX_REQUESTS 1024 /* listed in the report; more are counted only */

struct svv {
    svv_options o;
    rr_machine *rr;
    svv_send_fn send;
    void *ctx;
    int W;
    int W0;          /* the world at the start: the arrays' size (--elastic shrinks W, grows it back) */
    pend *p;
    rr_verdict last;
    bool have_last;
    int64_t last_iter;
    int last_attempt;
    uint64_t first_report_ms, reject_ms;
    int64_t first_report_iter;
    int nev_seen;
    fault_rec *f;
    int nf, capf;
    inject_req *req;              /* `cohort inject` requests (SVV_MAX_REQUESTS at most) ... */
    int nreq;
    int64_t nreq_total;           /* ... and how many came */
    int64_t nreq_random;          /* of those, the random fault injector's */
    int n_cli_inject;             /* the --inject specs (o.inject's first entries) */
    double *ema;    /* [W] compute time (data + forward + backward) per iteration, smoothed */
    double *worst;  /* [W] lowest score seen */
    int *low;       /* [W] consecutive iterations scored below the threshold */
    bool *flagged;
    int *stage_of;  /* [W] or NULL (svv_options.stage_of) */
    int nstages;
    double *sworst; /* [nstages] lowest stage score seen */
    int *slow;      /* [nstages] consecutive iterations a stage scored below the threshold */
    bool *sflagged;
    int64_t rounds;
    bool cold;      /* a restart: the next round is not scored */
    int64_t validated, reruns, checks, repairs, skips;
    int64_t duplicate_reports; /* loss reports that arrived twice (counted once) */
    int64_t restarts;
    uint64_t round_first_ms;      /* first report of the round in progress (0: none) */
    uint64_t last_accept_ms;
    int naccepts;
    double max_step_ms;
    int64_t resumed_at;           /* iteration the last restart resumed after (-1: none) */
    int64_t max_iter;             /* the newest iteration any rank reported (kept across restarts) */
    int64_t last_accepted;        /* the newest iteration accepted (kept across restarts) */
    int64_t *fault_iters;         /* [W][8] iterations of each rank's latest attributed faults */
    int quarantined[64], nquar;
    int64_t lost_steps;
    /* for `cohort status` and Prometheus (svv_rank_times) */
    double *hist;   /* [W][SVV_HIST] each rank's step time (every phase), ms, the latest SVV_HIST iterations */
    int64_t *nhist; /* [W] iterations recorded */
    double *score;  /* [W] latest straggler score (NAN: none yet) */
    char saves_stopped[600]; /* why checkpoint saves were stopped ("": they were not) */
    ci_auto ci;          /* --save-interval auto's estimate (o.save_auto) */
    gp gp;               /* the goodput accounting (goodput.h), fed as iterations are accepted */
    int64_t reruns_seen; /* replays already charged to an accepted step */
    double *shist;  /* [W][SVV_EVICT_SCORES] each rank's latest scores */
    bool *evict_asked;  /* [W] its run below the threshold was offered for eviction (svv_evict_candidate) */
    double evict_scores[SVV_EVICT_SCORES]; /* the latest candidate's run of scores, for its fault record */
    int nevict_scores;
    int64_t acc_it[16];  /* the latest accepted iterations ... */
    uint64_t acc_ms[16]; /* ... and when (svv_accepted_ms) */
    int nacc;
};

#define SVV_HIST 32

static void goodput_event(const svv *v, const gp_summary *g);

int svv_new(svv **out, const svv_options *o, svv_send_fn send, void *ctx) {
    *out = NULL;
    svv *v = calloc(1, sizeof *v);
    if (!v) return CO_ENOMEM;
    v->o = *o;
    v->send = send;
    v->ctx = ctx;
    v->W = v->W0 = o->rr.world;
    ci_auto_init(&v->ci, o->expected_mtbf, o->train_iters, (double)sv__now_ms() / 1e3);
    int rc = rr_new(&v->rr, &o->rr);
    v->p = calloc((size_t)v->W, sizeof *v->p);
    v->ema = calloc((size_t)v->W, sizeof *v->ema);
    v->worst = calloc((size_t)v->W, sizeof *v->worst);
    v->flagged = calloc((size_t)v->W, sizeof *v->flagged);
    v->low = calloc((size_t)v->W, sizeof *v->low);
    v->fault_iters = calloc((size_t)v->W * 8, sizeof *v->fault_iters);
    v->hist = calloc((size_t)v->W * SVV_HIST, sizeof *v->hist);
    v->nhist = calloc((size_t)v->W, sizeof *v->nhist);
    v->score = calloc((size_t)v->W, sizeof *v->score);
    v->shist = calloc((size_t)v->W * SVV_EVICT_SCORES, sizeof *v->shist);
    v->evict_asked = calloc((size_t)v->W, sizeof *v->evict_asked);
    if (!rc && (!v->p || !v->ema || !v->worst || !v->flagged || !v->low || !v->fault_iters || !v->hist || !v->nhist ||
                !v->score || !v->shist || !v->evict_asked))
        rc = CO_ENOMEM;
    if (!rc && o->stage_of && o->nstages > 1) {
        v->nstages = o->nstages;
        v->stage_of = malloc(sizeof *v->stage_of * (size_t)v->W);
        v->sworst = malloc(sizeof *v->sworst * (size_t)v->nstages);
        v->slow = calloc((size_t)v->nstages, sizeof *v->slow);
        v->sflagged = calloc((size_t)v->nstages, sizeof *v->sflagged);
        if (!v->stage_of || !v->sworst || !v->slow || !v->sflagged) rc = CO_ENOMEM;
        for (int r = 0; !rc && r < v->W; r++) v->stage_of[r] = o->stage_of[r];
        for (int k = 0; !rc && k < v->nstages; k++) v->sworst[k] = INFINITY;
    }
    v->o.stage_of = NULL;
    if (rc) {
        svv_destroy(&v);
        return rc;
    }
    for (int r = 0; r < v->W; r++) v->worst[r] = INFINITY, v->score[r] = NAN;
    v->resumed_at = -1;
    gp_init(&v->gp, (double)sv__now_ms() / 1e3);
    v->first_report_iter = -1;
    v->n_cli_inject = o->inject ? o->inject->n : 0;
    *out = v;
    return 0;
}

void svv_destroy(svv **pv) {
    svv *v = *pv;
    if (!v) return;
    rr_destroy(&v->rr);
    free(v->p);
    free(v->ema);
    free(v->stage_of);
    free(v->sworst);
    free(v->slow);
    free(v->sflagged);
    free(v->worst);
    free(v->flagged);
    free(v->low);
    free(v->fault_iters);
    free(v->hist);
    free(v->nhist);
    free(v->score);
    free(v->shist);
    free(v->evict_asked);
    free(v->f);
    free(v->req);
    free(v);
    *pv = NULL;
}

static fault_rec *new_fault(svv *v) {
    if (v->nf == v->capf) {
        int cap = v->capf ? 2 * v->capf : 16;
        fault_rec *f = realloc(v->f, sizeof *f * (size_t)cap);
        if (!f) return NULL;
        v->f = f;
        v->capf = cap;
    }
    fault_rec *f = &v->f[v->nf++];
    ci_fault(&v->ci.est);
    memset(f, 0, sizeof *f);
    f->detect_ms = f->recover_ms = -1;
    return f;
}

/* A fault for the metrics stream (and so TensorBoard's cohort/faults, cohort/restarts:
 * observe/tensorboard.c): {"event":"fault"} when it is recorded (recover_ms < 0: still
 * being recovered) or when its recovery ends, {"event":"restart"} for one an in-process
 * restart recovered. */
static json_t *scores_json(const fault_rec *f) {
    json_t *a = json_array();
    for (int k = 0; a && k < f->nscores; k++) json_array_append_new(a, json_real(f->scores[k]));
    return a;
}

static void fault_event(const svv *v, const fault_rec *f, const char *event) {
    if (!v->o.metrics) return;
    json_t *o = json_pack("{s:s, s:s, s:i, s:I, s:s, s:s, s:f, s:f}", "event", event, "kind", f->kind, "rank", f->rank,
                          "iteration", (json_int_t)f->iteration, "diagnosis", f->diagnosis, "outcome", f->outcome,
                          "detect_ms", f->detect_ms, "recover_ms", f->recover_ms);
    if (o && f->nscores) json_object_set_new(o, "scores", scores_json(f));
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (line) {
        fprintf(v->o.metrics, "%s\n", line);
        fflush(v->o.metrics);
    }
    free(line);
    json_decref(o);
}

/* A `cohort inject` request: kept to be matched with its firing, never counted a fault. */
static void note_request(svv *v, const char *line, const char *mark, bool random) {
    v->nreq_total++;
    v->nreq_random += random;
    if (v->nreq >= SVV_MAX_REQUESTS) return;
    if (!v->req && !(v->req = calloc(SVV_MAX_REQUESTS, sizeof *v->req))) return;
    inject_req *q = &v->req[v->nreq++];
    const char *spec = strstr(line, "inject: ");
    spec = spec && spec < mark ? spec + 8 : line;
    snprintf(q->spec, sizeof q->spec, "%.*s", (int)(mark - spec), spec);
    q->requested_at = atoll(mark + strlen(random ? SVV_RANDOM_MARK : SVV_REQUEST_MARK));
    q->random = random;
}

void svv_on_event(svv *v, int rank, const char *line) {
    const char *mark = strstr(line, SVV_REQUEST_MARK), *rmark = strstr(line, SVV_RANDOM_MARK);
    if (mark || rmark) {
        note_request(v, line, mark ? mark : rmark, !mark);
        return;
    }
    fault_rec *f = new_fault(v);
    if (!f) return;
    snprintf(f->kind, sizeof f->kind, "%s", strstr(line, "inject:") ? "injected" : "worker");
    f->rank = rank;
    f->iteration = -1;
    const char *at = strstr(line, " at step ");
    if (at) f->iteration = atoll(at + 9);
    snprintf(f->text, sizeof f->text, "%s", line);
    size_t n = strlen(f->text);
    while (n && f->text[n - 1] == '\n') f->text[--n] = '\0';
    fault_event(v, f, "fault");
}

void svv_note_fault(svv *v, const char *kind, int rank, const char *diagnosis) {
    fault_rec *f = new_fault(v);
    if (!f) return;
    snprintf(f->kind, sizeof f->kind, "%s", kind);
    f->rank = rank;
    f->iteration = v->last_iter;
    snprintf(f->text, sizeof f->text, "%s", diagnosis);
    fault_event(v, f, "fault");
}

/* --save-interval auto: whether a checkpoint follows accepted iteration it; a new interval is
 * logged and recorded in the metrics with its inputs. */
static bool auto_save(svv *v, int64_t it, uint64_t now) {
    gp_summary g;
    svv_goodput(v, &g);
    int64_t since = v->ci.last_save < 0 ? 1 : it - v->ci.last_save; /* (iterations since the last save) */
    bool changed = false, due = ci_auto_due(&v->ci, it, (double)now / 1e3, g.median_step, &changed);
    if (changed) {
        char why[400];
        ci_auto_describe(&v->ci, g.median_step, why, sizeof why);
        co_log(CO_LOG_INFO, "--save-interval auto: a checkpoint every %s", why);
        if (v->o.metrics) {
            const ci_est *e = &v->ci.est;
            fprintf(v->o.metrics,
                    "{\"event\":\"save_interval\",\"iteration\":%" PRId64 ",\"interval_iterations\":%" PRId64
                    ",\"save_seconds\":%.6f,\"saves_measured\":%" PRId64 ",\"mtbf_seconds\":%.3f,\"faults\":%" PRId64
                    ",\"step_seconds\":%.6f,\"young_seconds\":%.3f}\n",
                    it, v->ci.interval, e->save_s, e->saves, ci_mtbf(e), e->faults, g.median_step,
                    ci_young(e->save_s, ci_mtbf(e)));
            fflush(v->o.metrics);
        }
    }
    if (due && v->o.metrics) {
        fprintf(v->o.metrics, "{\"event\":\"save_ordered\",\"iteration\":%" PRId64 ",\"interval_iterations\":%" PRId64
                ",\"since_last\":%" PRId64 "}\n", it, v->ci.interval, since);
        fflush(v->o.metrics);
    }
    return due;
}

static void send_verdict(svv *v, const rr_verdict *vd, int only_rank) {
    Cohort__V1__Verdict m = COHORT__V1__VERDICT__INIT;
    m.iteration = (uint64_t)vd->iteration;
    m.decision = (Cohort__V1__Decision)vd->decision;
    m.reason = (char *)vd->reason;
    m.has_attempt = 1;
    m.attempt = (uint32_t)vd->attempt;
    m.has_suspect = 1;
    m.suspect = vd->suspect;
    m.has_helper = 1;
    m.helper = vd->helper;
    if (vd->diagnosis != RR_DIAG_NONE) m.diagnosis = (char *)rr_diagnosis_name(vd->diagnosis);
    if (vd->save) m.has_save = m.save = 1;
    for (int r = 0; r < v->W; r++)
        if (only_rank < 0 || r == only_rank) v->send(v->ctx, r, &m.base);
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_dbl);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* With a pipeline: each stage's compute (the median of its ranks') against the others'
 * median; a stage below the threshold three iterations in a row is reported. */
static void score_stages(svv *v, int64_t iteration, double *buf) {
    int S = v->nstages;
    double *stage = buf + v->W; /* [S] */
    for (int k = 0; k < S; k++) {
        int n = 0;
        for (int r = 0; r < v->W; r++)
            if (v->stage_of[r] == k) buf[n++] = v->ema[r];
        stage[k] = n ? median(buf, n) : 0;
    }
    for (int k = 0; k < S; k++) {
        int n = 0;
        for (int q = 0; q < S; q++)
            if (q != k) buf[n++] = stage[q];
        double med = median(buf, n), score = stage[k] > 0 ? med / stage[k] : 1;
        if (score < v->sworst[k]) v->sworst[k] = score;
        v->slow[k] = score < v->o.straggler_threshold ? v->slow[k] + 1 : 0;
        if (v->slow[k] >= 3 && !v->sflagged[k]) {
            v->sflagged[k] = true;
            co_log(CO_LOG_WARN,
                   "straggler stage: pipeline stage %d at iteration %" PRId64 " scores %.2f "
                   "(compute %.0f ms per iteration, the other stages' median %.0f ms; threshold %.2f): it sets the "
                   "pipeline's pace (its layers cost more than the others', or all its ranks are slow)",
                   k, iteration, score, stage[k], med, v->o.straggler_threshold);
            if (v->o.metrics) {
                fprintf(v->o.metrics,
                        "{\"event\":\"straggler_stage\",\"iteration\":%" PRId64 ",\"stage\":%d,\"score\":%.4f,"
                        "\"compute_ms\":%.3f,\"others_median_ms\":%.3f}\n",
                        iteration, k, score, stage[k], med);
                fflush(v->o.metrics);
            }
        }
    }
}

/* Straggler scores from the first round of an iteration: median of the others' compute
 * time / this rank's (Megatron's section score), each smoothed over iterations; with a
 * pipeline the others are the ranks of the same stage (the same work), and the stages are
 * scored too (score_stages). */
static void score_stragglers(svv *v, int64_t iteration) {
    int W = v->W;
    for (int r = 0; r < W; r++) { /* each rank's step time, for status and metrics */
        double t = 0;
        for (int q = 0; q < SVV_NPH; q++) t += v->p[r].phase_ms[q];
        v->hist[(size_t)r * SVV_HIST + (size_t)(v->nhist[r] % SVV_HIST)] = t;
        v->nhist[r]++;
    }
    if (W < 2) return;
    if (v->cold) { /* the first iteration after a restart: a process that just took a rank is
                    * still cold (scored on it, a newcomer looks like a straggler) */
        v->cold = false;
        return;
    }
    for (int r = 0; r < W; r++) {
        const double *ph = v->p[r].phase_ms;
        double c = ph[0] + ph[1] + ph[2];
        v->ema[r] = v->rounds ? 0.7 * v->ema[r] + 0.3 * c : c;
    }
    v->rounds++;
    if (v->rounds < 5) return; /* warm-up: first iterations are slow everywhere */
    double *others = malloc(sizeof(double) * (size_t)(W + v->nstages));
    if (!others) return;
    if (v->stage_of) score_stages(v, iteration, others);
    for (int r = 0; r < W; r++) {
        int n = 0;
        for (int q = 0; q < W; q++)
            if (q != r && (!v->stage_of || v->stage_of[q] == v->stage_of[r])) others[n++] = v->ema[q];
        if (!n) continue; /* alone on its stage: nobody does the same work */
        double med = median(others, n);
        double score = v->ema[r] > 0 ? med / v->ema[r] : 1;
        v->score[r] = score;
        if (score < v->worst[r]) v->worst[r] = score;
        v->low[r] = score < v->o.straggler_threshold ? v->low[r] + 1 : 0;
        v->shist[(size_t)r * SVV_EVICT_SCORES + (size_t)((v->low[r] + SVV_EVICT_SCORES - 1) % SVV_EVICT_SCORES)] = score;
        if (!v->low[r]) v->evict_asked[r] = false;
        /* three iterations in a row: one slow step is noise, not a straggler */
        if (v->low[r] >= 3 && !v->flagged[r]) {
            v->flagged[r] = true;
            co_log(CO_LOG_WARN,
                   "straggler: rank %d at iteration %" PRId64 " scores %.2f (compute %.0f ms per "
                   "iteration, others' median %.0f ms; threshold %.2f)",
                   r, iteration, score, v->ema[r], med, v->o.straggler_threshold);
            if (v->o.metrics) {
                fprintf(v->o.metrics,
                        "{\"event\":\"straggler\",\"iteration\":%" PRId64 ",\"rank\":%d,\"score\":%.4f,"
                        "\"compute_ms\":%.3f,\"others_median_ms\":%.3f}\n",
                        iteration, r, score, v->ema[r], med);
                fflush(v->o.metrics);
            }
        }
    }
    free(others);
}

static void take_events(svv *v, uint64_t now, int *quarantine) {
    int n;
    const rr_event *ev = rr_events(v->rr, &n);
    for (; v->nev_seen < n; v->nev_seen++) {
        const rr_event *e = &ev[v->nev_seen];
        if ((e->diagnosis == RR_DIAG_TRANSIENT || e->diagnosis == RR_DIAG_PERSISTENT) && v->o.quarantine_after > 0 &&
            e->rank >= 0 && e->rank < v->W) {
            /* faults attributed to this rank within the window: too many and it is replaced */
            int64_t *h = v->fault_iters + (size_t)e->rank * 8;
            int cnt = 1;
            for (int k = 0; k < 8; k++)
                if (h[k] > 0 && e->iteration - h[k] < v->o.quarantine_window) cnt++;
            memmove(h + 1, h, sizeof *h * 7);
            h[0] = e->iteration;
            if (cnt >= v->o.quarantine_after && *quarantine < 0) {
                *quarantine = e->rank;
                memset(h, 0, sizeof *h * 8);
                if (v->nquar < 64) v->quarantined[v->nquar++] = e->rank;
                co_log(CO_LOG_WARN, "rank %d was found faulty %d times within %" PRId64
                       " iterations: quarantined; its process is replaced", e->rank, cnt,
                       v->o.quarantine_window);
            }
        }
        if (v->o.tracker_file && *v->o.tracker_file) {
            int rc = rr_tracker_append(v->o.tracker_file, e, v->o.job);
            if (rc) co_log(CO_LOG_WARN, "%s", co_err_detail());
        }
        fault_rec *f = new_fault(v);
        if (!f) continue;
        snprintf(f->kind, sizeof f->kind, "%s", e->check);
        f->rank = e->rank;
        f->iteration = e->iteration;
        snprintf(f->diagnosis, sizeof f->diagnosis, "%s", rr_diagnosis_name(e->diagnosis));
        snprintf(f->outcome, sizeof f->outcome, "%s", rr_decision_name(e->outcome));
        snprintf(f->text, sizeof f->text, "%s%s%s%s%s", e->message, e->injected ? " (--error-injection-rate)" : "",
                 e->aux[0] ? " [its MoE/MTP losses: " : "", e->aux, e->aux[0] ? "]" : "");
        f->detect_ms = v->reject_ms >= v->first_report_ms ? (double)(v->reject_ms - v->first_report_ms) : -1;
        f->open = true;
        fault_event(v, f, "fault");
        (void)now;
    }
}

/* rank's pending round emptied and made (it, attempt, check_for) */
static void pend_reset(pend *p, int rank, int64_t it, int attempt, int check_for) {
    memset(p, 0, sizeof *p);
    p->r.iteration = it;
    p->r.attempt = attempt;
    p->r.rank = rank;
    p->r.check_for = check_for;
}

/* rank's pending round becomes (it, attempt, check_for): reset if it was another one, or
 * if nothing has arrived for it since the last decision */
static void pend_round(svv *v, int rank, int64_t it, int attempt, int check_for) {
    pend *p = &v->p[rank];
    if (p->r.iteration != it || p->r.attempt != attempt || p->r.check_for != check_for || !(p->got || p->r.has_sum))
        pend_reset(p, rank, it, attempt, check_for);
}

static int complete(svv *v, int rank, uint64_t now, char *why, size_t n, int *quarantine);

int svv_on_report(svv *v, int rank, const Cohort__V1__LossReport *lr, char *why, size_t n, int *quarantine) {
    *quarantine = -1;
    if (rank < 0 || rank >= v->W || (int)lr->rank != rank) return 0;
    int64_t it = (int64_t)lr->iteration;
    int attempt = lr->has_attempt ? (int)lr->attempt : 0;
    int check_for = lr->has_check_for ? lr->check_for : -1;
    int nmb = lr->has_micro_batches ? (int)lr->micro_batches : 1;
    if (nmb < 1 || lr->micro_batch != 0) return 0; /* one message a round: its micro batches folded */
    uint64_t now = sv__now_ms();
    if (v->have_last && it == v->last_iter && attempt == v->last_attempt) {
        /* a repeat of a round already decided: its verdict was lost on the way */
        send_verdict(v, &v->last, rank);
        return 0;
    }
    pend *p = &v->p[rank];
    if (p->added && p->r.iteration == it && p->r.attempt == attempt) { /* a duplicate of a whole round */
        v->duplicate_reports++;
        return 0;
    }
    pend_round(v, rank, it, attempt, check_for);
    if (p->got) { /* a duplicate message */
        v->duplicate_reports++;
        return 0;
    }
    p->r.nmb = nmb;
    if (lr->has_checksum_follows && lr->checksum_follows) p->want_sum = true;
    if (it > v->max_iter) v->max_iter = it;
    if (!v->round_first_ms) v->round_first_ms = now;
    p->got = 1;
    /* the micro batches as the rank folded them */
    p->r.mb = (rr_mbs){.n = nmb, .loss_sum = lr->loss_sum,
                       .tokens_sum = lr->has_tokens ? lr->tokens : (double)lr->token_count,
                       .loss_peak = lr->has_loss_peak ? lr->loss_peak : lr->loss_sum,
                       .bad_mb = lr->has_bad_micro_batch ? lr->bad_micro_batch : -1,
                       .bad_loss = lr->bad_loss, .digest = lr->results_digest};
    if (lr->has_grad_norm) p->r.grad_norm = lr->grad_norm;
    for (size_t k = 0; k < lr->n_phase_ms; k++)
        for (int q = 0; q < SVV_NPH; q++)
            if (!strcmp(lr->phase_ms[k]->key, ph_names[q])) p->phase_ms[q] = lr->phase_ms[k]->value;
    /* the MoE and MTP losses: carried into the events, not validated */
    for (size_t k = 0; k < lr->n_aux_losses && p->r.naux < RR_MAX_AUX; k++) {
        snprintf(p->r.aux_key[p->r.naux], sizeof p->r.aux_key[0], "%s", lr->aux_losses[k]->key);
        p->r.aux[p->r.naux++] = lr->aux_losses[k]->value;
    }
    return complete(v, rank, now, why, n, quarantine);
}

int svv_on_checksum(svv *v, int rank, const Cohort__V1__ParamsChecksum *c, char *why, size_t n, int *quarantine) {
    *quarantine = -1;
    if (rank < 0 || rank >= v->W || (int)c->rank != rank) return 0;
    int64_t it = (int64_t)c->iteration;
    int attempt = (int)c->attempt;
    if (v->have_last && it == v->last_iter && attempt == v->last_attempt) return 0; /* decided already */
    pend *p = &v->p[rank];
    if (p->added && p->r.iteration == it && p->r.attempt == attempt) return 0;
    pend_round(v, rank, it, attempt, -1);
    p->r.has_sum = true;
    p->r.sum_used = c->used;
    p->r.has_written = c->has_written;
    p->r.sum_written = c->written;
    return complete(v, rank, sv__now_ms(), why, n, quarantine);
}

/* A rank's reports for the round (and its checksum, if one was announced) are all in: the
 * round goes to the state machine, and when it is complete its verdict to every rank. */
static int complete(svv *v, int rank, uint64_t now, char *why, size_t n, int *quarantine) {
    pend *p = &v->p[rank];
    int64_t it = p->r.iteration;
    int attempt = p->r.attempt, check_for = p->r.check_for;
    if (!p->r.nmb || !p->got || p->added || (p->want_sum && !p->r.has_sum)) return 0;
    if (attempt == 0 && check_for < 0 && it != v->first_report_iter) {
        v->first_report_iter = it;
        v->first_report_ms = now;
        v->reject_ms = 0;
        /* kill-supervisor: the supervisor dies as the step's results come in */
        fi_fault *f = fi_take(v->o.inject, FI_KILL_SUPERVISOR, -1, -1, it, -1, FI_PH_FORWARD);
        if (f) {
            char line[300];
            fi_describe(f, -1, it, -1, line, sizeof line);
            co_log(CO_LOG_WARN, "%s", line);
            fflush(stderr);
            raise(SIGKILL);
        }
    }
    int rc = rr_add(v->rr, &p->r);
    if (rc < 0) return 0; /* not part of the current round: ignored */
    p->added = true;
    if (rc == 0) return 0;
    rr_verdict vd;
    if (rr_decide(v->rr, &vd)) return 0;
    if (attempt == 0 && check_for < 0) {
        v->validated++;
        score_stragglers(v, it);
    }
    for (int r = 0; r < v->W; r++) v->p[r].added = false, v->p[r].got = 0, v->p[r].r.has_sum = v->p[r].want_sum = false;
    v->round_first_ms = 0;
    if (vd.decision == RR_ACCEPT || vd.decision == RR_SKIP) {
        if (v->last_accept_ms && v->naccepts >= 5 && (double)(now - v->last_accept_ms) > v->max_step_ms)
            v->max_step_ms = (double)(now - v->last_accept_ms);
        v->last_accept_ms = now;
        v->naccepts++;
        gp_step(&v->gp, (double)now / 1e3, it,
                v->reruns > v->reruns_seen && v->reject_ms ? (double)v->reject_ms / 1e3 : -1);
        v->reruns_seen = v->reruns;
        if (it > v->last_accepted) v->last_accepted = it;
        v->acc_it[v->nacc % 16] = it;
        v->acc_ms[v->nacc % 16] = now;
        v->nacc++;
    }
    if (vd.decision == RR_ACCEPT && v->o.save_auto) vd.save = auto_save(v, it, now);
    v->last = vd;
    v->have_last = true;
    v->last_iter = it;
    v->last_attempt = attempt;
    if (vd.decision != RR_ACCEPT && !v->reject_ms) v->reject_ms = now;
    switch (vd.decision) {
    case RR_RERUN:
        v->reruns++;
        if (v->o.metrics) { /* a replay of the iteration (TensorBoard's cohort/replays) */
            fprintf(v->o.metrics, "{\"event\":\"replay\",\"iteration\":%" PRId64 ",\"attempt\":%d,\"replays\":%" PRId64 "}\n",
                    it, attempt + 1, v->reruns);
            fflush(v->o.metrics);
        }
        break;
    case RR_CHECK: v->checks++; break;
    case RR_REPAIR: v->repairs++; break;
    case RR_SKIP: v->skips++; break;
    default: break;
    }
    take_events(v, now, quarantine);
    if (vd.decision == RR_ACCEPT || vd.decision == RR_SKIP || vd.decision == RR_STOP) {
        bool closed = false;
        for (int k = 0; k < v->nf; k++)
            if (v->f[k].open) {
                v->f[k].open = false;
                v->f[k].recover_ms = v->f[k].restart ? (double)(now - v->f[k].t_detect)
                                     : v->reject_ms  ? (double)(now - v->reject_ms)
                                                     : 0;
                fault_event(v, &v->f[k], v->f[k].restart ? "restart" : "fault");
                closed = true;
            }
        if (closed) {
            gp_summary g;
            svv_goodput(v, &g);
            goodput_event(v, &g);
        }
    }
    if (vd.decision != RR_ACCEPT || vd.diagnosis != RR_DIAG_NONE)
        co_log(CO_LOG_WARN, "iteration %" PRId64 ": %s%s%s%s: %s", it, rr_decision_name(vd.decision),
               vd.diagnosis != RR_DIAG_NONE ? " (" : "", vd.diagnosis != RR_DIAG_NONE ? rr_diagnosis_name(vd.diagnosis) : "",
               vd.diagnosis != RR_DIAG_NONE ? ")" : "", vd.reason);
    send_verdict(v, &vd, -1);
    if (vd.decision == RR_STOP) {
        snprintf(why, n, "iteration %" PRId64 ": %s", it, vd.reason);
        return SV_EXIT_NAN;
    }
    return 0;
}

typedef struct inj_view inj_view;
static int write_report(svv *v, FILE *human, const char *json_path, int exit_status, double wall_s,
                        const inj_view *inj, int ninj, int nfired);

/* One injection asked for: an --inject spec or a `cohort inject` request. */
struct inj_view {
    const char *spec;
    bool live;            /* cohort inject or --fault-injector (requested_at says when) */
    bool random;          /* --fault-injector */
    int64_t requested_at;
    bool fired;           /* a rank reported it firing */
};

/* The injections asked for (--inject's, then cohort inject's) and whether a rank reported
 * each firing: a firing's line ends "(--inject SPEC)" (fi_describe, the spec cut to 159
 * characters); each firing is matched to one injection. *out malloc'd; returns the count. */
static int injections(const svv *v, inj_view **out, int *nfired) {
    int n = v->n_cli_inject + v->nreq;
    *out = NULL;
    *nfired = 0;
    if (!n) return 0;
    inj_view *x = calloc((size_t)n, sizeof *x);
    bool *used = calloc((size_t)v->nf + 1, sizeof *used);
    if (!x || !used) {
        free(x);
        free(used);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        bool live = i >= v->n_cli_inject;
        const inject_req *q = live ? &v->req[i - v->n_cli_inject] : NULL;
        x[i] = (inj_view){.spec = live ? q->spec : v->o.inject->f[i].spec, .live = live, .random = live && q->random,
                          .requested_at = live ? q->requested_at : -1};
        char needle[200];
        snprintf(needle, sizeof needle, "(--inject %.159s)", x[i].spec);
        for (int k = 0; k < v->nf && !x[i].fired; k++)
            if (!used[k] && !strcmp(v->f[k].kind, "injected") && strstr(v->f[k].text, needle))
                used[k] = x[i].fired = true;
        *nfired += x[i].fired;
    }
    free(used);
    *out = x;
    return n;
}

/* The report's injection lines: how many were asked for and fired, and those that did not. */
static void report_injections(FILE *human, const svv *v, const inj_view *x, int n, int nfired) {
    if (!human || !n) return;
    int64_t asked = v->n_cli_inject + v->nreq_total; /* (requests past SVV_MAX_REQUESTS are counted, not kept) */
    char rnd[64] = "";
    if (v->nreq_random) snprintf(rnd, sizeof rnd, ", %" PRId64 " by --fault-injector", v->nreq_random);
    fprintf(human, "  injections: %" PRId64 " asked for (%d by --inject, %" PRId64 " by cohort inject%s), %d reported "
                   "fired\n", asked, v->n_cli_inject, v->nreq_total - v->nreq_random, rnd, nfired);
    int listed = 0;
    for (int i = 0; i < n && listed < 16; i++)
        if (!x[i].fired) {
            if (x[i].live)
                fprintf(human, "  - not fired: %s (%s at iteration %" PRId64 ")\n", x[i].spec,
                        x[i].random ? "--fault-injector" : "cohort inject", x[i].requested_at);
            else
                fprintf(human, "  - not fired: %s (--inject)\n", x[i].spec);
            listed++;
        }
    if (asked - nfired > listed)
        fprintf(human, "  - ... and %" PRId64 " more not fired\n", asked - nfired - listed);
}

/* The same in the JSON report: every injection with its source and whether it fired. */
static json_t *injections_json(const svv *v, const inj_view *x, int n, int nfired) {
    json_t *o = json_object(), *a = json_array();
    if (!o || !a) {
        json_decref(o);
        json_decref(a);
        return NULL;
    }
    json_object_set_new(o, "requested", json_integer(v->n_cli_inject + v->nreq_total));
    json_object_set_new(o, "fired", json_integer(nfired));
    for (int i = 0; i < n; i++) {
        char text[400];
        if (x[i].live)
            snprintf(text, sizeof text, "inject: %s%s%" PRId64, x[i].spec,
                     x[i].random ? SVV_RANDOM_MARK : SVV_REQUEST_MARK, x[i].requested_at);
        else
            snprintf(text, sizeof text, "inject: %s (--inject)", x[i].spec);
        json_t *j = json_pack("{s:s, s:s, s:b, s:s}", "spec", x[i].spec, "source",
                              x[i].random ? "--fault-injector" : x[i].live ? "cohort inject" : "--inject", "fired", x[i].fired, "text", text);
        if (j && x[i].live) json_object_set_new(j, "requested_at", json_integer(x[i].requested_at));
        if (j) json_array_append_new(a, j);
    }
    json_object_set_new(o, "list", a);
    return o;
}

int svv_write_report(svv *v, FILE *human, const char *json_path, int exit_status, double wall_s) {
    inj_view *inj = NULL;
    int nfired = 0, ninj = injections(v, &inj, &nfired);
    int rc = write_report(v, human, json_path, exit_status, wall_s, inj, ninj, nfired);
    free(inj);
    return rc;
}

void svv_on_record(svv *v, const char *record) {
    if (!v || !record || !strstr(record, "\"checkpoint_save\"")) return;
    for (const char *p = record; *p;) { /* (a record may hold several lines) */
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        json_t *r = n ? json_loadb(p, n, 0, NULL) : NULL;
        json_t *ev = json_object_get(r, "event"), *s = json_object_get(r, "blocking_seconds");
        if (json_is_string(ev) && !strcmp(json_string_value(ev), "checkpoint_save") && json_is_number(s))
            gp_save(&v->gp, json_number_value(s)), ci_save(&v->ci.est, json_number_value(s));
        json_decref(r);
        if (!nl) break;
        p = nl + 1;
    }
}

void svv_note_saves_stopped(svv *v, const char *why) {
    if (v && !v->saves_stopped[0]) snprintf(v->saves_stopped, sizeof v->saves_stopped, "%s", why);
}

const char *svv_saves_stopped(const svv *v) { return v ? v->saves_stopped : ""; }

void svv_goodput(const svv *v, gp_summary *s) { gp_get(&v->gp, (double)sv__now_ms() / 1e3, s); }

/* The goodput as a JSON object: ETTR, productive and wall seconds, seconds lost by cause. */
static json_t *goodput_json(const gp_summary *g) {
    json_t *o = json_object(), *l = json_object();
    if (!o || !l) {
        json_decref(o);
        json_decref(l);
        return NULL;
    }
    for (int c = 0; c < GP_NCAUSES; c++) json_object_set_new(l, gp_cause_name((gp_cause)c), json_real(g->lost[c]));
    json_object_set_new(o, "lost_seconds", l);
    json_object_set_new(o, "ettr", json_real(g->ettr));
    json_object_set_new(o, "productive_seconds", json_real(g->productive));
    json_object_set_new(o, "wall_seconds", json_real(g->wall));
    json_object_set_new(o, "other_seconds", json_real(g->other));
    json_object_set_new(o, "median_step_seconds", json_real(g->median_step));
    json_object_set_new(o, "steps", json_integer(g->steps));
    return o;
}

/* The goodput so far into the metrics stream ({"event":"goodput",...}: TensorBoard's
 * cohort/goodput/...): after a fault's recovery and at the end. */
static void goodput_event(const svv *v, const gp_summary *g) {
    if (!v->o.metrics) return;
    json_t *o = goodput_json(g);
    if (!o) return;
    json_object_set_new(o, "event", json_string("goodput"));
    json_object_set_new(o, "iteration", json_integer(v->last_accepted > 0 ? v->last_accepted : 0));
    char *line = json_dumps(o, JSON_COMPACT);
    if (line) {
        fprintf(v->o.metrics, "%s\n", line);
        fflush(v->o.metrics);
    }
    free(line);
    json_decref(o);
}

/* The goodput in the report: one log line, a metrics record, and an object in the JSON. */
static json_t *report_goodput(const svv *v) {
    gp_summary g;
    svv_goodput(v, &g);
    goodput_event(v, &g);
    char lost[600];
    size_t k = 0;
    lost[0] = 0;
    for (int c = 0; c < GP_NCAUSES; c++)
        if (g.lost[c] > 0 && k < sizeof lost)
            k += (size_t)snprintf(lost + k, sizeof lost - k, "%s%s %.2f s", k ? ", " : "", gp_cause_name((gp_cause)c),
                                  g.lost[c]);
    co_log(CO_LOG_INFO, "goodput: ETTR %.3f (%.2f s of productive steps in %.2f s); lost: %s%sother %.2f s", g.ettr,
           g.productive, g.wall, lost, k ? ", " : "", g.other);
    return goodput_json(&g);
}

static int write_report(svv *v, FILE *human, const char *json_path, int exit_status, double wall_s,
                        const inj_view *inj, int ninj, int nfired) {
    json_t *gpj = report_goodput(v);
    int nstrag = 0;
    for (int r = 0; r < v->W; r++) nstrag += v->flagged[r];
    for (int k = 0; k < v->nstages; k++) nstrag += v->sflagged[k];
    if (human && (v->nf || nstrag || v->reruns || v->restarts || nfired < ninj)) {
        fprintf(human, "cohort run report: exit status %d after %.1f s; %" PRId64 " iterations validated, %" PRId64
                       " replays, %" PRId64 " peer checks, %" PRId64 " repairs, %" PRId64 " skipped; %d fault(s), "
                       "%d straggler(s), %" PRId64 " restart(s), %" PRId64 " step(s) lost\n",
                exit_status, wall_s, v->validated, v->reruns, v->checks, v->repairs, v->skips, v->nf, nstrag,
                v->restarts, v->lost_steps);
        for (int k = 0; k < v->nf; k++) {
            const fault_rec *f = &v->f[k];
            fprintf(human, "  - %s, rank %d, iteration %" PRId64 "%s%s: %s", f->kind, f->rank, f->iteration,
                    f->diagnosis[0] ? ", " : "", f->diagnosis, f->text);
            if (f->detect_ms >= 0 && f->recover_ms >= 0)
                fprintf(human, " (detected in %.0f ms, %s in %.0f ms)", f->detect_ms,
                        f->restart ? "next step completed" : "recovered", f->recover_ms);
            fputc('\n', human);
        }
        for (int r = 0; r < v->W; r++)
            if (v->flagged[r]) fprintf(human, "  - straggler: rank %d, lowest score %.2f\n", r, v->worst[r]);
        for (int k = 0; k < v->nstages; k++)
            if (v->sflagged[k])
                fprintf(human, "  - straggler stage: pipeline stage %d, lowest score %.2f\n", k, v->sworst[k]);
        for (int k = 0; k < v->nquar; k++) fprintf(human, "  - quarantined and replaced: rank %d\n", v->quarantined[k]);
        report_injections(human, v, inj, ninj, nfired);
    }
    if (human && v->saves_stopped[0]) fprintf(human, "cohort run report: checkpoint saves stopped: %s\n", v->saves_stopped);
    if (!json_path || !*json_path) {
        json_decref(gpj);
        return 0;
    }
    json_t *o = json_object(), *fs = json_array(), *ss = json_array();
    if (gpj) json_object_set_new(o, "goodput", gpj);
    if (v->saves_stopped[0]) json_object_set_new(o, "checkpoint_saves_stopped", json_string(v->saves_stopped));
    if (!o || !fs || !ss) {
        json_decref(o);
        json_decref(fs);
        json_decref(ss);
        return CO_ENOMEM;
    }
    json_object_set_new(o, "exit_status", json_integer(exit_status));
    json_object_set_new(o, "wall_seconds", json_real(wall_s));
    json_object_set_new(o, "iterations_validated", json_integer(v->validated));
    json_object_set_new(o, "replays", json_integer(v->reruns));
    json_object_set_new(o, "peer_checks", json_integer(v->checks));
    json_object_set_new(o, "repairs", json_integer(v->repairs));
    json_object_set_new(o, "iterations_skipped", json_integer(v->skips));
    json_object_set_new(o, "restarts", json_integer(v->restarts));
    json_object_set_new(o, "duplicate_reports", json_integer(v->duplicate_reports));
    json_object_set_new(o, "steps_lost", json_integer(v->lost_steps));
    json_t *q = json_array();
    for (int k = 0; k < v->nquar; k++) json_array_append_new(q, json_integer(v->quarantined[k]));
    json_object_set_new(o, "quarantined_ranks", q);
    for (int k = 0; k < v->nf; k++) {
        const fault_rec *f = &v->f[k];
        json_t *j = json_object();
        json_object_set_new(j, "kind", json_string(f->kind));
        json_object_set_new(j, "rank", json_integer(f->rank));
        json_object_set_new(j, "iteration", json_integer(f->iteration));
        if (f->diagnosis[0]) json_object_set_new(j, "diagnosis", json_string(f->diagnosis));
        if (f->outcome[0]) json_object_set_new(j, "outcome", json_string(f->outcome));
        json_object_set_new(j, "text", json_string(f->text));
        if (f->detect_ms >= 0) json_object_set_new(j, "detection_ms", json_real(f->detect_ms));
        if (f->recover_ms >= 0) json_object_set_new(j, "recovery_ms", json_real(f->recover_ms));
        if (f->restart) json_object_set_new(j, "recovered_by", json_string("in-process restart"));
        if (f->nscores) json_object_set_new(j, "scores", scores_json(f));
        json_array_append_new(fs, j);
    }
    json_object_set_new(o, "faults", fs);
    json_t *ij = injections_json(v, inj, ninj, nfired);
    if (ij) json_object_set_new(o, "injections", ij);
    for (int r = 0; r < v->W; r++)
        if (v->flagged[r]) {
            json_t *j = json_object();
            json_object_set_new(j, "rank", json_integer(r));
            json_object_set_new(j, "lowest_score", json_real(v->worst[r]));
            json_array_append_new(ss, j);
        }
    json_object_set_new(o, "stragglers", ss);
    json_t *sst = json_array();
    for (int k = 0; k < v->nstages; k++)
        if (v->sflagged[k]) json_array_append_new(sst, json_pack("{sisf}", "stage", k, "lowest_score", v->sworst[k]));
    json_object_set_new(o, "straggler_stages", sst);
    char det[512];
    rr_determinism_summary(v->rr, det, sizeof det);
    if (v->o.rr.mode == RR_MODE_DETERMINISM) json_object_set_new(o, "determinism", json_string(det));
    if (v->o.rr.mode == RR_MODE_DETERMINISM && human) fprintf(human, "cohort: determinism: %s\n", det);
    int rc = json_dump_file(o, json_path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    return rc ? co_err_set(CO_EIO, "run report: cannot write %s", json_path) : 0;
}

void svv_restart_begin(svv *v, const char *kind, int rank, const char *why, uint64_t detect_ms) {
    uint64_t now = sv__now_ms();
    fault_rec *f = new_fault(v);
    if (f) {
        snprintf(f->kind, sizeof f->kind, "%s", kind);
        f->rank = rank;
        f->iteration = v->have_last ? v->last_iter + 1 : -1;
        snprintf(f->diagnosis, sizeof f->diagnosis, "%s", !strcmp(kind, "evicted")        ? "straggler"
                                                         : !strcmp(kind, "elastic_grow") ? "capacity_returned"
                                                                                         : "rank_failure");
        snprintf(f->outcome, sizeof f->outcome, "%s", "restart");
        snprintf(f->text, sizeof f->text, "%s", why);
        f->detect_ms = (double)detect_ms;
        f->open = true;
        f->restart = true;
        f->t_detect = now;
        if (!strcmp(kind, "evicted")) { /* the scores that made it a straggler to evict */
            memcpy(f->scores, v->evict_scores, sizeof f->scores);
            f->nscores = v->nevict_scores;
        }
        fault_event(v, f, "fault");
    }
    v->restarts++;
    gp_restart_begin(&v->gp, (double)now / 1e3, (double)detect_ms / 1e3);
    rr_restart(v->rr);
    memset(v->p, 0, sizeof *v->p * (size_t)v->W);
    v->have_last = false;
    v->first_report_iter = -1;
    v->round_first_ms = 0;
    v->last_accept_ms = 0; /* the restart is not a step */
    v->rounds = 0;         /* straggler scores start over: a restart disturbs every rank's times */
    v->cold = true;
    memset(v->low, 0, sizeof *v->low * (size_t)v->W);
    memset(v->evict_asked, 0, sizeof *v->evict_asked * (size_t)v->W);
}

int svv_set_world(svv *v, int world, int replicas, const int *stage_of) {
    if (world > v->W0 || (v->stage_of && !stage_of))
        return co_err_set(CO_EINVAL, "validator: world %d (at most %d%s)", world, v->W0,
                          v->stage_of ? ", each rank's pipeline stage given" : "");
    int rc = rr_set_world(v->rr, world, replicas);
    if (rc) return rc;
    v->W = world;
    /* (the stages keep their numbers; their ranks are numbered anew) */
    for (int r = 0; v->stage_of && r < world; r++) v->stage_of[r] = stage_of[r];
    /* the ranks are numbered anew: what was learned about each starts over */
    size_t n = (size_t)v->W0;
    memset(v->p, 0, sizeof *v->p * n);
    memset(v->ema, 0, sizeof *v->ema * n);
    memset(v->flagged, 0, sizeof *v->flagged * n);
    memset(v->low, 0, sizeof *v->low * n);
    memset(v->nhist, 0, sizeof *v->nhist * n);
    memset(v->evict_asked, 0, sizeof *v->evict_asked * n);
    for (size_t r = 0; r < n; r++) v->worst[r] = INFINITY, v->score[r] = NAN;
    gp_set_capacity(&v->gp, (double)world / v->W0);
    return 0;
}

int svv_evict_candidate(svv *v, double *scores, int cap, int *n) {
    *n = 0;
    if (v->o.evict_after <= 0) return -1;
    for (int r = 0; r < v->W; r++) {
        if (v->low[r] < v->o.evict_after || v->evict_asked[r]) continue;
        v->evict_asked[r] = true;
        /* the run's scores, oldest first (the ring holds the run's k-th score at k-1 mod its size) */
        int m = v->low[r] < SVV_EVICT_SCORES ? v->low[r] : SVV_EVICT_SCORES;
        for (int k = 0; k < m; k++) {
            double x = v->shist[(size_t)r * SVV_EVICT_SCORES + (size_t)((v->low[r] - m + k) % SVV_EVICT_SCORES)];
            v->evict_scores[k] = x;
            if (k < cap) scores[(*n)++] = x;
        }
        v->nevict_scores = m;
        return r;
    }
    return -1;
}

void svv_restart_done(svv *v, int64_t iteration, bool from_checkpoint) {
    /* steps lost: with a surviving replica none (the newest state is resumed); from a
     * checkpoint, the iterations accepted after it */
    if (from_checkpoint && v->last_accepted > iteration) v->lost_steps += v->last_accepted - iteration;
    v->resumed_at = iteration;
    if (from_checkpoint) ci_auto_resumed(&v->ci, iteration);
    gp_restart_done(&v->gp, (double)sv__now_ms() / 1e3);
}

bool svv_stalled(svv *v, uint64_t now, uint64_t soft_ms, int *missing, int cap, int *nmissing, uint64_t *since) {
    *nmissing = 0;
    if (!v->round_first_ms || now - v->round_first_ms <= soft_ms) return false;
    /* a rank whose loss reports are in and whose checksum is not is in the all-reduce the
     * checksum waits for: not the one that is stuck (the collective's timeout finds that) */
    for (int r = 0; r < v->W; r++) {
        const pend *p = &v->p[r]; /* (a round added to the state machine is reported) */
        bool reported = p->r.nmb > 0 && p->got;
        if (!reported && *nmissing < cap) missing[(*nmissing)++] = r;
    }
    *since = v->round_first_ms;
    return *nmissing > 0;
}

double svv_max_step_ms(const svv *v) { return v->naccepts >= 6 ? v->max_step_ms : 0; }

int64_t svv_current_iteration(const svv *v) { return v->max_iter; }

int svv_state_save(void *ctx, char *buf, size_t n) {
    svv *v = ctx;
    return rr_state_save(v->rr, buf, n);
}

int svv_state_load(svv *v, const char *json) { return rr_state_load(v->rr, json); }

void svv_counts_get(const svv *v, svv_counts *c) {
    c->validated = v->validated;
    c->replays = v->reruns;
    c->checks = v->checks;
    c->repairs = v->repairs;
    c->skips = v->skips;
    c->restarts = v->restarts;
    c->steps_lost = v->lost_steps;
    c->faults = v->nf;
    c->stragglers = 0;
    for (int r = 0; r < v->W; r++) c->stragglers += v->flagged[r];
}

int svv_fault_get(const svv *v, int k, svv_fault *f) {
    if (k < 0 || k >= v->nf) return CO_ENOENT;
    const fault_rec *r = &v->f[k];
    f->kind = r->kind;
    f->rank = r->rank;
    f->iteration = r->iteration;
    f->diagnosis = r->diagnosis;
    f->outcome = r->outcome;
    f->text = r->text;
    f->detect_ms = r->detect_ms;
    f->recover_ms = r->recover_ms;
    return 0;
}

bool svv_rank_times(const svv *v, int r, svv_times *t) {
    memset(t, 0, sizeof *t);
    t->score = NAN;
    if (r < 0 || r >= v->W || !v->nhist[r]) return false;
    int n = v->nhist[r] < SVV_HIST ? (int)v->nhist[r] : SVV_HIST;
    double x[SVV_HIST];
    memcpy(x, v->hist + (size_t)r * SVV_HIST, sizeof *x * (size_t)n);
    t->last_ms = x[(v->nhist[r] - 1) % SVV_HIST];
    t->n = n;
    t->median_ms = median(x, n); /* (sorts x) */
    t->min_ms = x[0];
    t->max_ms = x[n - 1];
    t->score = v->score[r];
    t->flagged = v->flagged[r];
    return true;
}

int svv_world(const svv *v) { return v->W; }

uint64_t svv_accepted_ms(const svv *v, int64_t it) {
    for (int k = 0; k < 16 && k < v->nacc; k++)
        if (v->acc_it[k] == it) return v->acc_ms[k];
    return 0;
}
