/* rerun.c - the rerun state machine (see rerun.h for the rounds and the diagnoses). */
#include "resilience/rerun.h"

#include "common/config.h"
#include "common/error.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define RR_TRACK_N 100   /* values the spike and gradient trackers learn from, then freeze */
#define RR_MAX_ATTEMPT 4 /* replays of one iteration before giving up */

typedef enum { ROUND_ALL = 0, ROUND_CHECK = 1 } round_kind;

struct rr_machine {
    rr_options o;
    int wcap;            /* ranks the per-rank arrays hold (the world at the start) */
    int64_t iter;        /* iteration of the current round, -1 before the first report */
    int attempt;         /* attempt the current round expects */
    round_kind kind;
    rr_report *cur;      /* [world] this round's reports (ROUND_CHECK: the helper's in cur[0]) */
    bool *have;
    int nhave;
    rr_report *first;    /* [world] the reports of the round that was rejected */
    rr_report suspect_rerun;
    int suspect, helper;
    char rej_check[32];
    double rej_value;
    bool rej_fatal;
    bool after_repair;
    bool accept_replay;  /* the next round only rebuilds gradients after a peer check */
    bool sum_replay;     /* the round replays a step whose parameter checksums disagreed */
    /* --error-injection-rate: the rank whose result is replaced in this iteration */
    int inj_rank;
    bool inj_active;
    /* trackers of Megatron's spiky-loss and large-gradient checks */
    double spiky_max, grad_max;
    int spiky_n, grad_n;
    int *faults;         /* [world] faults attributed to each rank */
    rr_event *ev;
    int nev, cap;
    /* report_determinism_stats */
    double *rel;
    int nrel, relcap;
    int64_t compared, identical;
};

void rr_options_default(rr_options *o, int world) {
    memset(o, 0, sizeof *o);
    o->mode = RR_MODE_VALIDATE;
    o->world = world;
    o->check_nan = true;
    o->check_rank_outliers = true;
    o->spiky_factor = 10;
    o->large_grad_factor = 10;
    o->outlier_factor = 1000; /* a flipped exponent bit, not the spread of honest gradients */
    o->injection_type = RR_INJECT_TRANSIENT;
}

const char *rr_decision_name(rr_decision d) {
    switch (d) {
    case RR_ACCEPT: return "accept";
    case RR_RERUN: return "rerun";
    case RR_SKIP: return "skip";
    case RR_STOP: return "stop";
    case RR_CHECK: return "check";
    case RR_REPAIR: return "repair";
    }
    return "?";
}

const char *rr_diagnosis_name(rr_diagnosis d) {
    switch (d) {
    case RR_DIAG_CORRECT: return "correct_result";
    case RR_DIAG_TRANSIENT: return "transient_error";
    case RR_DIAG_PERSISTENT: return "persistent_error";
    default: return "none";
    }
}

int rr_new(rr_machine **out, const rr_options *o) {
    *out = NULL;
    if (o->world < 1 || o->world > 1 << 20) return co_err_set(CO_EINVAL, "rerun: world size %d", o->world);
    rr_machine *m = calloc(1, sizeof *m);
    if (!m) return CO_ENOMEM;
    m->o = *o;
    m->wcap = o->world;
    m->iter = -1;
    m->suspect = m->helper = m->inj_rank = -1;
    m->cur = calloc((size_t)o->world, sizeof *m->cur);
    m->first = calloc((size_t)o->world, sizeof *m->first);
    m->have = calloc((size_t)o->world, sizeof *m->have);
    m->faults = calloc((size_t)o->world, sizeof *m->faults);
    if (!m->cur || !m->first || !m->have || !m->faults) {
        rr_destroy(&m);
        return CO_ENOMEM;
    }
    *out = m;
    return 0;
}

int rr_set_world(rr_machine *m, int world, int replicas) {
    if (world < 1 || world > m->wcap) return co_err_set(CO_EINVAL, "rerun: world size %d (1..%d)", world, m->wcap);
    m->o.world = world;
    m->o.replicas = replicas;
    memset(m->have, 0, sizeof *m->have * (size_t)m->wcap);
    memset(m->faults, 0, sizeof *m->faults * (size_t)m->wcap); /* (ranks are numbered anew) */
    m->nhave = 0;
    return 0;
}

void rr_destroy(rr_machine **pm) {
    rr_machine *m = *pm;
    if (!m) return;
    free(m->cur);
    free(m->first);
    free(m->have);
    free(m->faults);
    free(m->ev);
    free(m->rel);
    free(m);
    *pm = NULL;
}

static void start_round(rr_machine *m, round_kind kind, int attempt) {
    m->kind = kind;
    m->attempt = attempt;
    m->nhave = 0;
    memset(m->have, 0, sizeof *m->have * (size_t)m->o.world);
}

int rr_add(rr_machine *m, const rr_report *r) {
    if (r->rank < 0 || r->rank >= m->o.world || r->nmb < 0 || r->mb.n != r->nmb)
        return co_err_set(CO_EPROTOCOL, "rerun: report from rank %d with %d micro batches", r->rank, r->nmb);
    if (m->iter < 0 || (r->iteration > m->iter && r->attempt == 0 && m->nhave == 0 && m->kind == ROUND_ALL &&
                        m->attempt == 0)) {
        /* the first report of a new iteration */
        if (m->iter >= 0 && r->iteration <= m->iter) return co_err_set(CO_EPROTOCOL, "rerun: stale iteration");
        m->iter = r->iteration;
        start_round(m, ROUND_ALL, 0);
        m->after_repair = false;
        m->accept_replay = false;
        m->sum_replay = false;
        m->suspect = m->helper = -1;
        m->inj_active = false;
    }
    if (r->iteration != m->iter || r->attempt != m->attempt)
        return co_err_set(CO_EPROTOCOL, "rerun: report for iteration %lld attempt %d, expecting %lld attempt %d",
                          (long long)r->iteration, r->attempt, (long long)m->iter, m->attempt);
    if (m->kind == ROUND_CHECK) {
        if (r->rank != m->helper || r->check_for != m->suspect)
            return co_err_set(CO_EPROTOCOL, "rerun: unexpected check report from rank %d", r->rank);
        m->cur[0] = *r;
        m->nhave = 1;
        return 1;
    }
    if (r->check_for >= 0 || m->have[r->rank])
        return co_err_set(CO_EPROTOCOL, "rerun: duplicate report from rank %d", r->rank);
    m->have[r->rank] = true;
    m->cur[r->rank] = *r;
    return ++m->nhave == m->o.world ? 1 : 0;
}

/* ---- checks ---------------------------------------------------------------------------- */

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* First rejection among the round's reports: returns its rank or -1. */
static int find_rejection(rr_machine *m, const rr_report *rs, int n, char *check, double *value, bool *fatal) {
    const rr_options *o = &m->o;
    for (int k = 0; k < n; k++) {
        const rr_report *r = &rs[k];
        if (o->check_nan) {
            if (r->mb.bad_mb >= 0) {
                snprintf(check, 32, "%s", isnan(r->mb.bad_loss) ? "nan_loss" : "inf_loss");
                *value = r->mb.bad_loss;
                *fatal = true;
                return r->rank;
            }
            if (!isfinite(r->grad_norm) && !o->grad_overflow_skips) {
                snprintf(check, 32, "%s", isnan(r->grad_norm) ? "nan_grad" : "inf_grad");
                *value = r->grad_norm;
                *fatal = true;
                return r->rank;
            }
        }
    }
    for (int k = 0; k < n; k++) {
        const rr_report *r = &rs[k];
        /* the largest loss is a spike exactly when some micro batch's is */
        if (o->check_spiky && m->spiky_n > 0 && r->mb.n > 0 && fabs(r->mb.loss_peak) >= o->spiky_factor * m->spiky_max) {
            snprintf(check, 32, "spiky_loss");
            *value = r->mb.loss_peak;
            *fatal = false;
            return r->rank;
        }
        if (o->check_large_grads && m->grad_n > 0 && (isfinite(r->grad_norm) || !o->grad_overflow_skips) &&
            r->grad_norm >= o->large_grad_factor * m->grad_max) {
            snprintf(check, 32, "large_grad");
            *value = r->grad_norm;
            *fatal = false;
            return r->rank;
        }
    }
    if (o->check_rank_outliers && n >= 2) {
        double *others = malloc(sizeof(double) * (size_t)n);
        if (!others) return -1;
        for (int k = 0; k < n; k++) {
            int c = 0;
            for (int j = 0; j < n; j++)
                if (j != k) others[c++] = rs[j].grad_norm;
            qsort(others, (size_t)c, sizeof *others, cmp_dbl);
            double med = c % 2 ? others[c / 2] : 0.5 * (others[c / 2 - 1] + others[c / 2]);
            /* with two ranks the larger one is the outlier; the smaller is never flagged */
            if (med > 0 && rs[k].grad_norm > o->outlier_factor * med &&
                (isfinite(rs[k].grad_norm) || !o->grad_overflow_skips)) {
                free(others);
                snprintf(check, 32, "grad_outlier");
                *value = rs[k].grad_norm;
                *fatal = false;
                return rs[k].rank;
            }
        }
        free(others);
    }
    return -1;
}

static void track(rr_machine *m) {
    for (int k = 0; k < m->o.world; k++) {
        const rr_report *r = &m->cur[k];
        /* the tracker learns a report's micro batches at once, through their largest loss */
        if (m->spiky_n < RR_TRACK_N && r->mb.n > 0) {
            if (fabs(r->mb.loss_peak) > m->spiky_max) m->spiky_max = fabs(r->mb.loss_peak);
            m->spiky_n = r->mb.n < RR_TRACK_N - m->spiky_n ? m->spiky_n + r->mb.n : RR_TRACK_N;
        }
        if (m->grad_n < RR_TRACK_N && (isfinite(r->grad_norm) || !m->o.grad_overflow_skips)) {
            if (r->grad_norm > m->grad_max) m->grad_max = r->grad_norm;
            m->grad_n++;
        }
    }
}

static bool same_dbl(double a, double b) {
    if (isnan(a) && isnan(b)) return true;
    return memcmp(&a, &b, sizeof a) == 0;
}

/* The same result bit for bit (NaN equals NaN, as Megatron's comparison). */
static bool same_result(const rr_report *a, const rr_report *b) {
    if (a->nmb != b->nmb || a->mb.n != b->mb.n || a->mb.digest != b->mb.digest) return false;
    return same_dbl(a->mb.loss_sum, b->mb.loss_sum) && same_dbl(a->mb.tokens_sum, b->mb.tokens_sum) &&
           same_dbl(a->grad_norm, b->grad_norm);
}

static double rel_diff(double a, double b) {
    if (same_dbl(a, b)) return 0;
    if (!isfinite(a) || !isfinite(b)) return INFINITY;
    return fabs((a - b) / (a + b) * 2);
}

/* ---- injection (--error-injection-rate / --error-injection-type) ------------------------ */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The first micro batch's loss becomes NaN (the same change on every attempt, so that a
 * persistent fault reproduces bit for bit). */
void rr_mbs_reset(rr_mbs *s) {
    memset(s, 0, sizeof *s);
    s->bad_mb = -1;
}

/* the bits of x, every NaN one value */
static uint64_t dbl_bits(double x) {
    uint64_t u;
    if (isnan(x)) return 0x7FF8000000000000ull;
    memcpy(&u, &x, sizeof u);
    return u;
}

void rr_mbs_add(rr_mbs *s, int mb, double loss, double tokens) {
    s->n++;
    s->loss_sum += loss;
    s->tokens_sum += tokens;
    if (!isfinite(loss) && (s->bad_mb < 0 || mb < s->bad_mb)) s->bad_mb = mb, s->bad_loss = loss;
    if (fabs(loss) > fabs(s->loss_peak)) s->loss_peak = loss; /* NaN never is */
    s->digest += mix64(mix64(mix64((uint64_t)mb + 0x51ED27A3ull) ^ dbl_bits(loss)) ^ dbl_bits(tokens));
}

static void poison(rr_report *r) {
    if (r->mb.n > 0) {
        r->mb.bad_mb = 0;
        r->mb.bad_loss = NAN;
        r->mb.loss_sum = NAN;
        r->mb.digest ^= 0x9E3779B97F4A7C15ull;
    } else {
        r->grad_norm = NAN;
    }
}

/* ---- events ----------------------------------------------------------------------------- */

static void add_event(rr_machine *m, int rank, rr_diagnosis d, rr_decision outcome, bool repaired, const char *msg) {
    if (m->nev == m->cap) {
        int cap = m->cap ? 2 * m->cap : 16;
        rr_event *e = realloc(m->ev, sizeof *e * (size_t)cap);
        if (!e) return; /* the event is lost, the decision is not */
        m->ev = e;
        m->cap = cap;
    }
    rr_event *e = &m->ev[m->nev++];
    memset(e, 0, sizeof *e);
    e->iteration = m->iter;
    e->rank = rank;
    e->diagnosis = d;
    e->outcome = outcome;
    e->injected = m->inj_active && rank == m->inj_rank;
    e->repaired = repaired;
    snprintf(e->check, sizeof e->check, "%s", m->rej_check);
    e->value = m->rej_value;
    snprintf(e->message, sizeof e->message, "%s", msg);
    /* the rank's MoE and MTP losses where the suspicion arose (the replay's otherwise) */
    const rr_report *r = NULL;
    if (rank >= 0 && rank < m->o.world)
        r = m->first[rank].iteration == m->iter && m->first[rank].naux ? &m->first[rank] : &m->cur[rank];
    size_t len = 0;
    for (int k = 0; r && k < r->naux && k < RR_MAX_AUX && len < sizeof e->aux; k++) {
        int w = snprintf(e->aux + len, sizeof e->aux - len, "%s%.*s %.6g", k ? ", " : "", 23, r->aux_key[k], r->aux[k]);
        if (w < 0) break;
        len += (size_t)w;
    }
}

void rr_restart(rr_machine *m) {
    m->iter = -1;
    m->suspect = m->helper = -1;
    m->after_repair = m->accept_replay = m->inj_active = m->sum_replay = false;
    start_round(m, ROUND_ALL, 0);
}

const rr_event *rr_events(const rr_machine *m, int *n) {
    *n = m->nev;
    return m->ev;
}

/* ---- parameter checksums ---------------------------------------------------------------- */

/* Every report carries a checksum and they are not all the same. */
static bool sums_differ(const rr_report *rs, int n) {
    for (int k = 0; k < n; k++)
        if (!rs[k].has_sum) return false;
    for (int k = 1; k < n; k++)
        if (rs[k].sum_used != rs[0].sum_used) return true;
    return false;
}

/* The lowest rank of a checksum that more than half the ranks report (*count of them), or -1. */
static int sum_majority(const rr_report *rs, int n, int *count) {
    for (int k = 0; k < n; k++) {
        int c = 0;
        for (int j = 0; j < n; j++) c += rs[j].sum_used == rs[k].sum_used;
        if (2 * c > n) {
            *count = c;
            return k;
        }
    }
    *count = 0;
    return -1;
}

/* With no majority: the lowest rank whose parameters are as it last wrote them, when all
 * such ranks agree and every other rank's parameters changed since it wrote them; or -1. */
static int sum_attribute(const rr_report *rs, int n) {
    int healthy = -1;
    for (int k = 0; k < n; k++) {
        if (!rs[k].has_written) return -1;
        bool intact = rs[k].sum_used == rs[k].sum_written;
        if (intact && healthy >= 0 && rs[k].sum_used != rs[healthy].sum_used) return -1;
        if (intact && healthy < 0) healthy = k;
    }
    return healthy;
}

/* ---- decisions -------------------------------------------------------------------------- */

static void verdict(rr_verdict *v, const rr_machine *m, rr_decision d, rr_diagnosis diag, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void verdict(rr_verdict *v, const rr_machine *m, rr_decision d, rr_diagnosis diag, const char *fmt, ...) {
    v->iteration = m->iter;
    v->decision = d;
    v->attempt = m->attempt;
    v->suspect = m->suspect;
    v->helper = m->helper;
    v->diagnosis = diag;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof v->reason, fmt, ap);
    va_end(ap);
}

/* A rejection to replay: the round's results are kept to compare the replay with. */
static void suspect(rr_machine *m, int rank, const char *check, double value, bool fatal) {
    memcpy(m->first, m->cur, sizeof *m->cur * (size_t)m->o.world);
    m->suspect = rank;
    snprintf(m->rej_check, sizeof m->rej_check, "%s", check);
    m->rej_value = value;
    m->rej_fatal = fatal;
    start_round(m, ROUND_ALL, m->attempt + 1);
}

static rr_decision give_up(const rr_machine *m) { return m->o.skip_on_reproducible ? RR_SKIP : RR_STOP; }

/* A fault the checksums found: the check the event and the tracker name. */
static void sum_check(rr_machine *m, double value) {
    snprintf(m->rej_check, sizeof m->rej_check, "param_checksum");
    m->rej_value = value;
}

/* The rank at rank r's place (tensor and pipeline coordinates) in rank src's replica. */
static int counterpart(const rr_machine *m, int r, int src) {
    int R = m->o.replica_stride > 1 ? m->o.replica_stride : 1;
    int replicas = m->o.replicas > 0 ? m->o.replicas : m->o.world / R;
    return r + (src / R % replicas - r / R % replicas) * R;
}

/* Replicas whose parameter checksum differs from rank src's are corrupt: every rank takes
 * src's state and the step is replayed (the after-repair round must then agree). */
static void sum_repair(rr_machine *m, rr_verdict *v, int src, int agree) {
    const rr_report *c = m->cur;
    int W = m->o.world, first = -1, nbad = 0;
    char msg[300] = "", first_msg[300] = "", list[120] = "";
    size_t ll = 0;
    sum_check(m, agree);
    m->rej_fatal = true;
    for (int r = 0; r < W; r++) {
        if (c[r].sum_used == c[src].sum_used) continue;
        if (first < 0) first = r;
        nbad++;
        if (agree > 0)
            snprintf(msg, sizeof msg,
                     "rank %d: parameters differ from %d of %d replicas' (checksum %016llx, theirs %016llx): silent "
                     "data corruption; repaired from rank %d", r, agree, W, (unsigned long long)c[r].sum_used,
                     (unsigned long long)c[src].sum_used, counterpart(m, r, src));
        else
            snprintf(msg, sizeof msg,
                     "rank %d: parameters changed in memory since its last update (checksum written %016llx, used "
                     "%016llx), on replay too, while rank %d's are as it wrote them: silent data corruption; "
                     "repaired from rank %d", r, (unsigned long long)c[r].sum_written,
                     (unsigned long long)c[r].sum_used, counterpart(m, r, src), counterpart(m, r, src));
        m->faults[r]++;
        add_event(m, r, RR_DIAG_PERSISTENT, RR_ACCEPT, true, msg);
        if (nbad == 1) snprintf(first_msg, sizeof first_msg, "%s", msg);
        if (ll < sizeof list) ll += (size_t)snprintf(list + ll, sizeof list - ll, "%s%d", nbad > 1 ? ", " : "", r);
    }
    m->suspect = first;
    m->helper = src;
    m->after_repair = true;
    start_round(m, ROUND_ALL, m->attempt + 1);
    /* several ranks: the first one's account (under expert parallelism the ranks of an expert
     * group report one combined checksum, so all of them differ whichever one's memory
     * changed) */
    if (nbad > 1)
        verdict(v, m, RR_REPAIR, RR_DIAG_PERSISTENT, "%d ranks' parameters differ from rank %d's (ranks %s; the first: %s)",
                nbad, src, list, first_msg);
    else
        verdict(v, m, RR_REPAIR, RR_DIAG_PERSISTENT, "%s", msg);
}

/* The parameter checksums of a complete round (VALIDATE mode). Returns 1 with *v set when
 * they decide the round, 0 when the losses' checks go on as usual. */
static int decide_sums(rr_machine *m, rr_verdict *v, int rej) {
    int W = m->o.world, agree = 0;
    bool differ = sums_differ(m->cur, W);
    if (m->after_repair) {
        if (!differ) return 0;
        char msg[200];
        sum_check(m, m->rej_value);
        snprintf(msg, sizeof msg, "parameter checksums still differ after rank %d's state was taken: cannot repair",
                 m->helper);
        add_event(m, m->suspect, RR_DIAG_PERSISTENT, RR_STOP, false, msg);
        verdict(v, m, RR_STOP, RR_DIAG_PERSISTENT, "%s", msg);
        start_round(m, ROUND_ALL, 0);
        return 1;
    }
    if (m->sum_replay) {
        m->sum_replay = false;
        if (!differ) {
            /* the replay agrees: the first round's parameters (or their reading) were wrong
             * only for a moment */
            int r = 0;
            for (int k = 0; k < W; k++)
                if (m->cur[k].sum_used != m->first[k].sum_used) r = k;
            char msg[220];
            snprintf(msg, sizeof msg, "rank %d: parameter checksums differed between the replicas and agree on replay: "
                     "transient fault", r);
            sum_check(m, 0);
            m->faults[r]++;
            add_event(m, r, RR_DIAG_TRANSIENT, RR_ACCEPT, false, msg);
            if (rej >= 0) {
                m->suspect = -1; /* the replay's own rejection is handled from the start */
                return 0;
            }
            track(m);
            verdict(v, m, RR_ACCEPT, RR_DIAG_TRANSIENT, "%s", msg);
            start_round(m, ROUND_ALL, 0);
            return 1;
        }
        int src = sum_majority(m->cur, W, &agree);
        if (src < 0) src = sum_attribute(m->cur, W);
        if (src >= 0) {
            sum_repair(m, v, src, agree);
            return 1;
        }
        char msg[240];
        int len = snprintf(msg, sizeof msg, "parameter checksums differ between the replicas on replay too, and no "
                                            "rank can be shown faulty (used/written:");
        for (int k = 0; k < W && len < (int)sizeof msg - 40; k++)
            len += snprintf(msg + len, sizeof msg - (size_t)len, " %d %08x/%08x", k, (unsigned)(m->cur[k].sum_used >> 32),
                            (unsigned)(m->cur[k].sum_written >> 32));
        if (len < (int)sizeof msg - 2) snprintf(msg + len, sizeof msg - (size_t)len, ")");
        sum_check(m, m->rej_value);
        add_event(m, -1, RR_DIAG_PERSISTENT, RR_STOP, false, msg);
        verdict(v, m, RR_STOP, RR_DIAG_PERSISTENT, "%s", msg);
        start_round(m, ROUND_ALL, 0);
        return 1;
    }
    if (!differ || m->suspect >= 0 || m->accept_replay) return 0;
    /* the iteration's first round */
    int src = sum_majority(m->cur, W, &agree);
    if (src >= 0) {
        sum_repair(m, v, src, agree);
        return 1;
    }
    memcpy(m->first, m->cur, sizeof *m->cur * (size_t)W);
    m->sum_replay = true;
    start_round(m, ROUND_ALL, m->attempt + 1);
    verdict(v, m, RR_RERUN, RR_DIAG_NONE,
            "parameter checksums differ between the replicas with no majority (rank 0 %016llx, rank 1 %016llx); "
            "replaying the step", (unsigned long long)m->cur[0].sum_used, (unsigned long long)m->cur[1].sum_used);
    return 1;
}

/* What the first rejecting rank failed: the check, its value, and whether it is fatal (a
 * NaN or Inf) rather than a spike that may be real. */
typedef struct {
    int rank; /* -1: nothing rejected */
    char check[32];
    double value;
    bool fatal;
} rejection;

/* --rerun-inject: chosen once per iteration from the seed; poisons the chosen rank's result
 * on the first attempt, or on every attempt for a persistent fault. */
static void inject_fault(rr_machine *m) {
    int W = m->o.world;
    if (m->attempt == 0 && m->o.injection_rate > 0 && m->o.mode == RR_MODE_VALIDATE) {
        uint64_t h = mix64(m->o.seed ^ mix64((uint64_t)m->iter + 0x1234567ull));
        if (h % (uint64_t)m->o.injection_rate == 0) {
            m->inj_active = true;
            m->inj_rank = (int)((h >> 32) % (uint64_t)W);
        }
    }
    if (m->inj_active && !m->after_repair &&
        (m->attempt == 0 || m->o.injection_type != RR_INJECT_TRANSIENT))
        poison(&m->cur[m->inj_rank]);
}

/* Keeps one relative difference for the determinism summary. */
static void keep_rel(rr_machine *m, double d) {
    if (m->nrel == m->relcap) {
        int cap = m->relcap ? 2 * m->relcap : 64;
        double *p = realloc(m->rel, sizeof *p * (size_t)cap);
        if (!p) return;
        m->rel = p;
        m->relcap = cap;
    }
    m->rel[m->nrel++] = d;
}

/* report_determinism_stats: every iteration runs twice; the second run's losses and
 * gradient norm are compared with the first's and the step accepted. */
static void decide_determinism(rr_machine *m, rr_verdict *v) {
    int W = m->o.world;
    if (m->attempt == 0) {
        memcpy(m->first, m->cur, sizeof *m->cur * (size_t)W);
        start_round(m, ROUND_ALL, 1);
        verdict(v, m, RR_RERUN, RR_DIAG_NONE, "report_determinism_stats: every iteration runs twice");
        return;
    }
    /* per rank its micro batches' losses and its gradient norm. The losses are folded: equal
     * digests mean every one identical; otherwise each counts as differing by their sums'
     * relative difference (the digest cannot say which differ) */
    for (int k = 0; k < W; k++) {
        const rr_report *a = &m->first[k], *b = &m->cur[k];
        int n = b->mb.n;
        double dl = a->mb.digest == b->mb.digest && a->mb.n == n ? 0 : rel_diff(a->mb.loss_sum, b->mb.loss_sum);
        if (dl == 0 && (a->mb.digest != b->mb.digest || a->mb.n != n)) dl = DBL_MIN; /* bits differ, sums agree: differing, by an unknown amount */
        for (int i = 0; i <= n; i++) {
            double d = i < n ? dl : rel_diff(a->grad_norm, b->grad_norm);
            m->compared++;
            if (d == 0) m->identical++;
            else keep_rel(m, d);
        }
    }
    track(m);
    verdict(v, m, RR_ACCEPT, RR_DIAG_NONE, "determinism compared");
    start_round(m, ROUND_ALL, 0);
}

/* Accepts the step with diagnosis `diag`: the trackers learn from it, a new iteration starts. */
static void accept_step(rr_machine *m, rr_verdict *v, rr_diagnosis diag, const char *msg) {
    track(m);
    verdict(v, m, RR_ACCEPT, diag, "%s", msg);
    start_round(m, ROUND_ALL, 0);
}

/* Ends the iteration with `d` (skip or stop) after recording the event. */
static void end_with(rr_machine *m, rr_verdict *v, int rank, rr_diagnosis diag, rr_decision d, const char *msg) {
    add_event(m, rank, diag, d, false, msg);
    verdict(v, m, d, diag, "%s", msg);
    start_round(m, ROUND_ALL, 0);
}

/* The round after a suspect's state was repaired from a peer: valid, or the fault is in the
 * data or the model (it came back). */
static void decide_after_repair(rr_machine *m, rr_verdict *v, const rejection *r) {
    char msg[200];
    if (r->rank < 0) {
        snprintf(msg, sizeof msg, "rank %d repaired from rank %d; the replay is valid", m->suspect, m->helper);
        accept_step(m, v, RR_DIAG_PERSISTENT, msg);
        return;
    }
    snprintf(msg, sizeof msg, "rank %d: %s (%g) again after its state was repaired", r->rank, r->check, r->value);
    snprintf(m->rej_check, sizeof m->rej_check, "%s", r->check);
    m->rej_value = r->value;
    end_with(m, v, r->rank, RR_DIAG_CORRECT, give_up(m), msg);
}

/* A replay in which the suspect's result changed: a transient fault if nothing is rejected
 * now, otherwise another rejection to follow (or a stop after too many attempts). */
static void decide_not_reproduced(rr_machine *m, rr_verdict *v, const rejection *r) {
    char msg[200];
    int s = m->suspect;
    if (r->rank < 0) {
        snprintf(msg, sizeof msg, "rank %d: %s (%g) did not reproduce on replay: transient fault", s, m->rej_check,
                 m->rej_value);
        m->faults[s]++;
        add_event(m, s, RR_DIAG_TRANSIENT, RR_ACCEPT, false, msg);
        accept_step(m, v, RR_DIAG_TRANSIENT, msg);
        return;
    }
    if (m->attempt >= RR_MAX_ATTEMPT) {
        snprintf(msg, sizeof msg, "rank %d: %s (%g): results differ on every replay", r->rank, r->check, r->value);
        end_with(m, v, r->rank, RR_DIAG_PERSISTENT, RR_STOP, msg);
        return;
    }
    suspect(m, r->rank, r->check, r->value, r->fatal);
    verdict(v, m, RR_RERUN, RR_DIAG_NONE, "rank %d: %s (%g) in the replay; replaying again", r->rank, r->check,
            r->value);
}

/* The suspect reproduced its rejected result: with one replica that is the answer (a real
 * spike goes on, a NaN skips or stops); with several, a healthy peer recomputes the
 * suspect's micro batches to tell the hardware from the data. */
static void decide_reproduced(rr_machine *m, rr_verdict *v) {
    char msg[200];
    int s = m->suspect, W = m->o.world;
    int R = m->o.replica_stride > 1 ? m->o.replica_stride : 1, replicas = m->o.replicas > 0 ? m->o.replicas : W / R;
    if (replicas <= 1 && !m->rej_fatal) {
        snprintf(msg, sizeof msg, "%s (%g) reproduced: a real value, training goes on", m->rej_check, m->rej_value);
        add_event(m, s, RR_DIAG_CORRECT, RR_ACCEPT, false, msg);
        accept_step(m, v, RR_DIAG_CORRECT, msg);
        return;
    }
    if (replicas <= 1) {
        snprintf(msg, sizeof msg, "%s (%g) reproduced on replay: the data or the model is at fault", m->rej_check,
                 m->rej_value);
        end_with(m, v, s, RR_DIAG_CORRECT, give_up(m), msg);
        return;
    }
    m->suspect_rerun = m->cur[s];
    int d = s / R % replicas; /* the suspect's replica: the same place in the next one helps */
    m->helper = s + ((d + 1) % replicas - d) * R;
    start_round(m, ROUND_CHECK, m->attempt + 1);
    verdict(v, m, RR_CHECK, RR_DIAG_NONE, "rank %d: %s (%g) reproduced; rank %d recomputes its micro batches", s,
            m->rej_check, m->rej_value, m->helper);
}

/* A round in which every rank reported: checksums first, then the rejection's stage (first
 * round, replay of an accepted-on-peer result, after a repair, replay). */
static int decide_all(rr_machine *m, rr_verdict *v) {
    inject_fault(m);
    if (m->o.mode == RR_MODE_DETERMINISM) {
        decide_determinism(m, v);
        return 0;
    }
    rejection r = {.rank = -1};
    r.rank = find_rejection(m, m->cur, m->o.world, r.check, &r.value, &r.fatal);
    if (decide_sums(m, v, r.rank)) return 0;

    if (m->accept_replay) {
        m->accept_replay = false;
        if (r.rank < 0 || !r.fatal) {
            track(m);
            verdict(v, m, RR_ACCEPT, RR_DIAG_CORRECT, "rank %d: %s reproduced on a peer: accepted", m->suspect,
                    m->rej_check);
            start_round(m, ROUND_ALL, 0);
            return 0;
        }
        m->suspect = -1; /* a fatal result in the rebuild: handle it from the start */
    }
    if (m->suspect < 0) { /* the iteration's first round */
        if (r.rank < 0) {
            accept_step(m, v, RR_DIAG_NONE, "validated");
            return 0;
        }
        suspect(m, r.rank, r.check, r.value, r.fatal);
        verdict(v, m, RR_RERUN, RR_DIAG_NONE, "rank %d: %s (%g); replaying the step in place", r.rank, r.check,
                r.value);
        return 0;
    }
    if (m->after_repair) decide_after_repair(m, v, &r);
    else if (!same_result(&m->cur[m->suspect], &m->first[m->suspect])) decide_not_reproduced(m, v, &r);
    else decide_reproduced(m, v);
    return 0;
}

static int decide_check(rr_machine *m, rr_verdict *v) {
    rr_report *h = &m->cur[0];
    if (m->inj_active && m->o.injection_type == RR_INJECT_CORRECT) poison(h);
    int s = m->suspect;
    rr_report as_suspect = *h;
    as_suspect.rank = s;
    char check[32];
    double value;
    bool fatal;
    if (same_result(&as_suspect, &m->suspect_rerun) && !m->rej_fatal) {
        /* a non-fatal check (spike, large or outlying gradient) that a healthy peer
         * reproduces: a real value, as Megatron treats it */
        char msg[220];
        snprintf(msg, sizeof msg, "rank %d: %s (%g) reproduced on rank %d too: a real value, training goes on", s,
                 m->rej_check, m->rej_value, m->helper);
        add_event(m, s, RR_DIAG_CORRECT, RR_ACCEPT, false, msg);
        m->after_repair = false;
        start_round(m, ROUND_ALL, m->attempt + 1);
        verdict(v, m, RR_RERUN, RR_DIAG_CORRECT, "%s; replaying the step to rebuild the gradients", msg);
        m->accept_replay = true;
        return 0;
    }
    if (same_result(&as_suspect, &m->suspect_rerun)) {
        char msg[220];
        snprintf(msg, sizeof msg, "rank %d: %s (%g) reproduced on rank %d too: the data or the model is at fault", s,
                 m->rej_check, m->rej_value, m->helper);
        add_event(m, s, RR_DIAG_CORRECT, give_up(m), false, msg);
        verdict(v, m, give_up(m), RR_DIAG_CORRECT, "%s", msg);
        start_round(m, ROUND_ALL, 0);
        return 0;
    }
    if (find_rejection(m, &as_suspect, 1, check, &value, &fatal) >= 0) {
        char msg[220];
        snprintf(msg, sizeof msg, "rank %d: %s (%g); rank %d gets another invalid result (%s): cannot attribute", s,
                 m->rej_check, m->rej_value, m->helper, check);
        add_event(m, s, RR_DIAG_PERSISTENT, RR_STOP, false, msg);
        verdict(v, m, RR_STOP, RR_DIAG_PERSISTENT, "%s", msg);
        start_round(m, ROUND_ALL, 0);
        return 0;
    }
    char msg[220];
    snprintf(msg, sizeof msg, "rank %d: %s (%g) reproduces on rank %d only: its state is corrupt; repaired from rank %d",
             s, m->rej_check, m->rej_value, s, m->helper);
    m->faults[s]++;
    add_event(m, s, RR_DIAG_PERSISTENT, RR_ACCEPT, true, msg);
    m->after_repair = true;
    start_round(m, ROUND_ALL, m->attempt + 1);
    verdict(v, m, RR_REPAIR, RR_DIAG_PERSISTENT, "%s", msg);
    return 0;
}

int rr_decide(rr_machine *m, rr_verdict *v) {
    memset(v, 0, sizeof *v);
    if (m->iter < 0) return co_err_set(CO_EINVAL, "rerun: no report yet");
    if (m->kind == ROUND_CHECK ? m->nhave < 1 : m->nhave < m->o.world)
        return co_err_set(CO_EINVAL, "rerun: round incomplete (%d reports)", m->nhave);
    if (m->o.mode == RR_MODE_DISABLED) {
        verdict(v, m, RR_ACCEPT, RR_DIAG_NONE, "validation disabled");
        start_round(m, ROUND_ALL, 0);
        return 0;
    }
    return m->kind == ROUND_CHECK ? decide_check(m, v) : decide_all(m, v);
}

/* ---- determinism summary ---------------------------------------------------------------- */

void rr_determinism_summary(const rr_machine *m, char *buf, size_t n) {
    if (!m->nrel) {
        snprintf(buf, n, "%lld values compared, all identical", (long long)m->compared);
        return;
    }
    double *s = malloc(sizeof *s * (size_t)m->nrel);
    if (!s) {
        snprintf(buf, n, "%lld values compared", (long long)m->compared);
        return;
    }
    memcpy(s, m->rel, sizeof *s * (size_t)m->nrel);
    qsort(s, (size_t)m->nrel, sizeof *s, cmp_dbl);
    double sum = 0;
    for (int i = 0; i < m->nrel; i++) sum += s[i];
    int64_t t = m->compared;
    double ps[4] = {0.5, 0.9, 0.99, 0.999};
    double q[4];
    for (int k = 0; k < 4; k++) {
        int64_t idx = (int64_t)((double)t * ps[k]) - m->identical;
        q[k] = idx >= 0 && idx < m->nrel ? s[idx] : 0;
    }
    snprintf(buf, n,
             "%lld/%lld total/identical samples, rel. variability: avg= %.3E, p50= %.3E, p90= %.3E, p99= %.3E, "
             "p99.9= %.3E, max: %.3E",
             (long long)t, (long long)m->identical, sum / (double)t, q[0], q[1], q[2], q[3], s[m->nrel - 1]);
    free(s);
}

/* ---- state in checkpoints --------------------------------------------------------------- */

int rr_state_save(const rr_machine *m, char *buf, size_t n) {
    json_t *o = json_object(), *f = json_array();
    if (!o || !f) {
        json_decref(o);
        json_decref(f);
        return CO_ENOMEM;
    }
    for (int k = 0; k < m->o.world; k++) json_array_append_new(f, json_integer(m->faults[k]));
    json_object_set_new(o, "spiky_max", json_real(m->spiky_max));
    json_object_set_new(o, "spiky_n", json_integer(m->spiky_n));
    json_object_set_new(o, "grad_max", json_real(m->grad_max));
    json_object_set_new(o, "grad_n", json_integer(m->grad_n));
    json_object_set_new(o, "faults", f);
    json_object_set_new(o, "mode", json_string(m->o.mode == RR_MODE_DISABLED      ? "disabled"
                                               : m->o.mode == RR_MODE_DETERMINISM ? "report_determinism_stats"
                                                                                  : "validate_results"));
    char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    if (!text) return CO_ENOMEM;
    size_t len = strlen(text);
    int rc = len < n ? 0 : co_err_set(CO_EINVAL, "rerun: state does not fit %zu bytes", n);
    if (!rc) memcpy(buf, text, len + 1);
    free(text);
    return rc;
}

int rr_state_load(rr_machine *m, const char *text) {
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return co_err_set(CO_EFORMAT, "rerun state: not a JSON object (%s)", e.text);
    }
    json_t *sm = json_object_get(o, "spiky_max"), *sn = json_object_get(o, "spiky_n");
    json_t *gm = json_object_get(o, "grad_max"), *gn = json_object_get(o, "grad_n");
    json_t *f = json_object_get(o, "faults");
    int rc = 0;
    if (!json_is_number(sm) || !json_is_integer(sn) || !json_is_number(gm) || !json_is_integer(gn) ||
        !json_is_array(f) || json_integer_value(sn) < 0 || json_integer_value(sn) > RR_TRACK_N ||
        json_integer_value(gn) < 0 || json_integer_value(gn) > RR_TRACK_N)
        rc = co_err_set(CO_EFORMAT, "rerun state: missing or invalid fields");
    if (!rc) {
        m->spiky_max = json_number_value(sm);
        m->spiky_n = (int)json_integer_value(sn);
        m->grad_max = json_number_value(gm);
        m->grad_n = (int)json_integer_value(gn);
        /* fault counts are per rank: kept only when the layout is the same */
        if ((int)json_array_size(f) == m->o.world)
            for (int k = 0; k < m->o.world; k++) m->faults[k] = (int)json_integer_value(json_array_get(f, (size_t)k));
    }
    json_decref(o);
    return rc;
}
