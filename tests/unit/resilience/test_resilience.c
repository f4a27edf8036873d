/* test_resilience.c - the rerun state machine's rounds and diagnoses, its state and tracker
 * file, and the fault injector's schedule (resilience/). */
#include "common/error.h"
#include "resilience/inject.h"
#include "resilience/rerun.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The injector's parsers with the detail of a refusal copied into err (which the
 * assertions read). */
static int inject_parse(fi_schedule *s, char *const *specs, int n, uint64_t seed, int world, int64_t iters, char *err,
                        size_t errlen) {
    int rc = fi_schedule_parse(s, specs, n, seed, world, iters);
    snprintf(err, errlen, "%s", rc ? co_err_detail() : "");
    return rc;
}
static int inject_parse_live(fi_schedule *s, char *const *specs, int n, int world, int64_t first, int64_t last,
                             char *err, size_t errlen) {
    int rc = fi_schedule_parse_live(s, specs, n, world, first, last);
    snprintf(err, errlen, "%s", rc ? co_err_detail() : "");
    return rc;
}
static int inject_add(fi_schedule *s, const char *spec, uint64_t seed, int world, int64_t iters, char *err,
                      size_t errlen) {
    int rc = fi_schedule_add(s, spec, seed, world, iters);
    snprintf(err, errlen, "%s", rc ? co_err_detail() : "");
    return rc;
}

static rr_report rep(int64_t it, int attempt, int rank, double loss, double gnorm) {
    rr_report r;
    memset(&r, 0, sizeof r);
    r.iteration = it;
    r.attempt = attempt;
    r.rank = rank;
    r.check_for = -1;
    r.nmb = 2;
    rr_mbs_reset(&r.mb);
    rr_mbs_add(&r.mb, 0, loss, 64);
    rr_mbs_add(&r.mb, 1, loss + 0.5, 64);
    r.grad_norm = gnorm;
    return r;
}

/* One round: every rank reports (loss, norm) and the verdict comes back. */
static rr_verdict round_all(rr_machine *m, int W, int64_t it, int attempt, const double *loss, const double *gn) {
    rr_verdict v;
    memset(&v, 0, sizeof v);
    for (int r = 0; r < W; r++) {
        rr_report x = rep(it, attempt, r, loss[r], gn[r]);
        int rc = rr_add(m, &x);
        CHECK_MSG(rc == (r == W - 1), "rr_add rank %d: %d", r, rc);
    }
    rr_decide(m, &v);
    return v;
}

static void accepts_valid(void) {
    rr_options o;
    rr_options_default(&o, 3);
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[3] = {100, 101, 99}, g[3] = {1, 1.1, 0.9};
    for (int it = 1; it <= 5; it++) {
        rr_verdict v = round_all(m, 3, it, 0, l, g);
        CHECK(v.decision == RR_ACCEPT);
    }
    int n;
    rr_events(m, &n);
    CHECK(n == 0);
    /* a report for a stale iteration, a duplicate and an unknown rank are refused */
    rr_report x = rep(6, 0, 0, 1, 1);
    CHECK(rr_add(m, &x) == 0);
    CHECK(rr_add(m, &x) < 0);
    x = rep(6, 0, 7, 1, 1);
    CHECK(rr_add(m, &x) < 0);
    x = rep(3, 0, 1, 1, 1);
    CHECK(rr_add(m, &x) < 0);
    rr_destroy(&m);
    CHECK(m == NULL);
}

static void transient_nan(void) {
    rr_options o;
    rr_options_default(&o, 3);
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[3] = {100, NAN, 99}, g[3] = {1, 1.1, 0.9};
    rr_verdict v = round_all(m, 3, 1, 0, l, g);
    CHECK(v.decision == RR_RERUN && v.attempt == 1 && v.suspect == 1);
    l[1] = 101; /* the replay is clean */
    v = round_all(m, 3, 1, 1, l, g);
    CHECK(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_TRANSIENT);
    int n;
    const rr_event *e = rr_events(m, &n);
    REQUIRE(n == 1);
    CHECK(e[0].rank == 1 && e[0].diagnosis == RR_DIAG_TRANSIENT && !strcmp(e[0].check, "nan_loss"));
    rr_destroy(&m);
}

/* --fp16 (grad_overflow_skips): a rank's overflowed gradient norm with finite losses is
 * accepted (the trainer skips the step) and stays out of the gradient checks' history; a NaN
 * loss is still rerun. Without the option the same round is rerun. */
static void fp16_overflow_accepted(void) {
    rr_options o;
    rr_options_default(&o, 3);
    o.check_large_grads = o.check_rank_outliers = true;
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[3] = {100, 101, 99}, g[3] = {1, INFINITY, 0.9};
    rr_verdict v = round_all(m, 3, 1, 0, l, g);
    CHECK(v.decision == RR_RERUN && v.suspect == 1); /* (not under --fp16) */
    rr_destroy(&m);
    o.grad_overflow_skips = true;
    REQUIRE(rr_new(&m, &o) == 0);
    v = round_all(m, 3, 1, 0, l, g);
    CHECK_MSG(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_NONE, "%d: %s", v.decision, v.reason);
    g[0] = NAN, g[1] = 1.2;
    v = round_all(m, 3, 2, 0, l, g);
    CHECK(v.decision == RR_ACCEPT);
    g[0] = 1.1; /* the history kept finite norms only: a normal norm is no large gradient */
    v = round_all(m, 3, 3, 0, l, g);
    CHECK(v.decision == RR_ACCEPT);
    l[2] = NAN; /* a non-finite loss is validated as always */
    v = round_all(m, 3, 4, 0, l, g);
    CHECK(v.decision == RR_RERUN && v.suspect == 2);
    int n;
    rr_events(m, &n);
    CHECK(n == 0);
    rr_destroy(&m);
}

/* A NaN that reproduces on its rank: a peer recomputes; the same NaN there is a data
 * problem (stop, or skip by policy); a clean result there means the rank is corrupt. */
static void reproducible(bool peer_agrees, bool skip) {
    rr_options o;
    rr_options_default(&o, 3);
    o.skip_on_reproducible = skip;
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[3] = {100, 101, INFINITY}, g[3] = {1, 1.1, 0.9};
    rr_verdict v = round_all(m, 3, 4, 0, l, g);
    CHECK(v.decision == RR_RERUN);
    v = round_all(m, 3, 4, 1, l, g);
    CHECK(v.decision == RR_CHECK && v.suspect == 2 && v.helper == 0 && v.attempt == 2);
    rr_report c = rep(4, 2, 0, peer_agrees ? INFINITY : 99.5, 0.9);
    c.check_for = 2;
    CHECK(rr_add(m, &c) == 1);
    rr_decide(m, &v);
    if (peer_agrees) {
        CHECK(v.decision == (skip ? RR_SKIP : RR_STOP) && v.diagnosis == RR_DIAG_CORRECT);
    } else {
        CHECK(v.decision == RR_REPAIR && v.helper == 0 && v.diagnosis == RR_DIAG_PERSISTENT && v.attempt == 3);
        l[2] = 99.5;
        v = round_all(m, 3, 4, 3, l, g);
        CHECK(v.decision == RR_ACCEPT);
        int n;
        const rr_event *e = rr_events(m, &n);
        REQUIRE(n == 1);
        CHECK(e[0].repaired && e[0].rank == 2 && e[0].diagnosis == RR_DIAG_PERSISTENT);
    }
    rr_destroy(&m);
}
static void reproducible_stop(void) { reproducible(true, false); }
static void reproducible_skip(void) { reproducible(true, true); }
static void corrupt_rank_repaired(void) { reproducible(false, false); }

static void one_rank(void) {
    rr_options o;
    rr_options_default(&o, 1);
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[1] = {NAN}, g[1] = {1};
    rr_verdict v = round_all(m, 1, 1, 0, l, g);
    CHECK(v.decision == RR_RERUN);
    v = round_all(m, 1, 1, 1, l, g);
    CHECK(v.decision == RR_STOP && v.diagnosis == RR_DIAG_CORRECT);
    rr_destroy(&m);
}

static void outlier_and_spike(void) {
    rr_options o;
    rr_options_default(&o, 4);
    o.check_spiky = true;
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[4] = {100, 101, 99, 100}, g[4] = {1, 1, 1, 1};
    CHECK(round_all(m, 4, 1, 0, l, g).decision == RR_ACCEPT);
    g[3] = 1e30; /* a flipped exponent bit in one rank's gradients */
    rr_verdict v = round_all(m, 4, 2, 0, l, g);
    CHECK(v.decision == RR_RERUN && v.suspect == 3);
    g[3] = 1;
    v = round_all(m, 4, 2, 1, l, g);
    CHECK(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_TRANSIENT);
    l[0] = 5000; /* 10x the largest loss seen: a spike, which reproduces on a peer too */
    v = round_all(m, 4, 3, 0, l, g);
    CHECK(v.decision == RR_RERUN && v.suspect == 0);
    v = round_all(m, 4, 3, 1, l, g);
    CHECK(v.decision == RR_CHECK && v.helper == 1);
    rr_report c = rep(3, 2, 1, 5000, 1);
    c.check_for = 0;
    CHECK(rr_add(m, &c) == 1);
    rr_decide(m, &v);
    CHECK(v.decision == RR_RERUN && v.diagnosis == RR_DIAG_CORRECT); /* rebuild the gradients */
    v = round_all(m, 4, 3, 3, l, g);
    CHECK(v.decision == RR_ACCEPT); /* a real spike: training goes on */
    rr_destroy(&m);
}

static void determinism_mode(void) {
    rr_options o;
    rr_options_default(&o, 2);
    o.mode = RR_MODE_DETERMINISM;
    rr_machine *m;
    REQUIRE(rr_new(&m, &o) == 0);
    double l[2] = {100, 101}, g[2] = {1, 1};
    CHECK(round_all(m, 2, 1, 0, l, g).decision == RR_RERUN);
    l[1] = 101.001;
    CHECK(round_all(m, 2, 1, 1, l, g).decision == RR_ACCEPT);
    char buf[400];
    rr_determinism_summary(m, buf, sizeof buf);
    CHECK_MSG(strstr(buf, "6/4 total/identical") != NULL, "%s", buf); /* rank 1: two losses differ */
    rr_destroy(&m);
}

static void injection_types(void) {
    /* --error-injection-rate 1: every iteration; the three types end three ways */
    rr_inject_type types[3] = {RR_INJECT_TRANSIENT, RR_INJECT_PERSISTENT, RR_INJECT_CORRECT};
    rr_diagnosis want[3] = {RR_DIAG_TRANSIENT, RR_DIAG_PERSISTENT, RR_DIAG_CORRECT};
    for (int k = 0; k < 3; k++) {
        rr_options o;
        rr_options_default(&o, 2);
        o.injection_rate = 1;
        o.injection_type = types[k];
        rr_machine *m;
        REQUIRE(rr_new(&m, &o) == 0);
        double l[2] = {100, 101}, g[2] = {1, 1};
        rr_verdict v = round_all(m, 2, 1, 0, l, g);
        CHECK(v.decision == RR_RERUN);
        int s = v.suspect;
        v = round_all(m, 2, 1, 1, l, g);
        if (types[k] != RR_INJECT_TRANSIENT) {
            CHECK(v.decision == RR_CHECK);
            rr_report c = rep(1, 2, v.helper, l[s], 1);
            c.check_for = s;
            CHECK(rr_add(m, &c) == 1);
            rr_decide(m, &v);
            if (types[k] == RR_INJECT_PERSISTENT) {
                CHECK(v.decision == RR_REPAIR);
                v = round_all(m, 2, 1, 3, l, g);
            }
        }
        CHECK_MSG(v.diagnosis == want[k], "type %d: diagnosis %d", k, v.diagnosis);
        int n;
        const rr_event *e = rr_events(m, &n);
        CHECK(n == 1 && e[0].injected);
        rr_destroy(&m);
    }
}

static void state_and_tracker(void) {
    rr_options o;
    rr_options_default(&o, 2);
    o.check_spiky = true;
    rr_machine *m, *m2;
    REQUIRE(rr_new(&m, &o) == 0);
    REQUIRE(rr_new(&m2, &o) == 0);
    double l[2] = {100, 101}, g[2] = {1, 2};
    round_all(m, 2, 1, 0, l, g);
    char a[512], b[512];
    REQUIRE(rr_state_save(m, a, sizeof a) == 0);
    CHECK(rr_state_load(m2, a) == 0);
    REQUIRE(rr_state_save(m2, b, sizeof b) == 0);
    CHECK_MSG(!strcmp(a, b), "%s vs %s", a, b);
    CHECK(rr_state_load(m2, "{\"spiky_max\": 1}") == CO_EFORMAT);
    CHECK(rr_state_load(m2, "not json") == CO_EFORMAT);
    /* the restored tracker still knows the running maximum: 10x is a spike */
    l[0] = 1100; /* > 10 x 101.5, the largest loss of iteration 1 */
    CHECK(round_all(m2, 2, 2, 0, l, g).decision == RR_RERUN);

    char path[] = "/tmp/cohort-tracker-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    rr_event e;
    memset(&e, 0, sizeof e);
    e.iteration = 7, e.rank = 1, e.diagnosis = RR_DIAG_TRANSIENT;
    snprintf(e.check, sizeof e.check, "nan_loss");
    snprintf(e.message, sizeof e.message, "a 'quoted' message");
    CHECK(rr_tracker_append(path, &e, "42") == 0);
    int64_t its[8];
    CHECK(rr_tracker_skips(path, its, 8) == 0); /* transient once: not skipped */
    CHECK(rr_tracker_append(path, &e, "42") == 0);
    CHECK(rr_tracker_skips(path, its, 8) == 1 && its[0] == 7); /* twice on one rank */
    e.iteration = 9, e.diagnosis = RR_DIAG_CORRECT;
    CHECK(rr_tracker_append(path, &e, NULL) == 0);
    CHECK(rr_tracker_skips(path, its, 8) == 2 && its[1] == 9);
    FILE *f = fopen(path, "r");
    char line[512] = "";
    REQUIRE(f && fgets(line, sizeof line, f));
    fclose(f);
    CHECK_MSG(strstr(line, " jobID=42 rank=1 iteration=7 status=transient_error ") && strstr(line, "message='") &&
                  !strstr(line, "'quoted'"), "%s", line);
    unlink(path);
    rr_destroy(&m);
    rr_destroy(&m2);
}

static void inject_schedule(void) {
    char err[512];
    fi_schedule s;
    char *ok[] = {"nan@rank=1,step=5", "kill@rank=*,step=10-20", "bitflip-grad@rank=0,step=3,bit=30",
                  "slow@rank=2,step=4,ms=50,times=always", "kill-supervisor@step=8", "spike@rank=3,step=6,microbatch=1,times=always"};
    REQUIRE(inject_parse(&s, ok, 6, 7, 4, 100, err, sizeof err) == 0);
    CHECK(s.n == 6 && s.f[0].kind == FI_NAN && s.f[0].rank == 1 && s.f[0].step == 5 && s.f[0].phase == FI_PH_FORWARD);
    CHECK(s.f[1].rank >= 0 && s.f[1].rank < 4 && s.f[1].step >= 10 && s.f[1].step <= 20);
    CHECK(s.f[2].bit == 30 && s.f[2].phase == FI_PH_BACKWARD);
    CHECK(s.f[4].rank == -1);
    /* the same seed draws the same schedule; another seed may not */
    fi_schedule s2;
    REQUIRE(inject_parse(&s2, ok, 6, 7, 4, 100, err, sizeof err) == 0);
    CHECK(s2.f[1].rank == s.f[1].rank && s2.f[1].step == s.f[1].step);
    fi_schedule_free(&s2);
    /* once: fires on its rank, once */
    CHECK(fi_take(&s, FI_NAN, 1, 1, 5, 0, FI_PH_FORWARD) != NULL);
    CHECK(fi_take(&s, FI_NAN, 1, 1, 5, 0, FI_PH_FORWARD) == NULL);
    CHECK(fi_take(&s, FI_NAN, 0, 0, 5, 0, FI_PH_FORWARD) == NULL);
    /* always on a batch: whoever computes it, every time, only that micro batch */
    CHECK(fi_take(&s, FI_SPIKE, 3, 3, 6, 1, FI_PH_FORWARD) != NULL);
    CHECK(fi_take(&s, FI_SPIKE, 0, 3, 6, 1, FI_PH_FORWARD) != NULL);
    CHECK(fi_take(&s, FI_SPIKE, 3, 3, 6, 0, FI_PH_FORWARD) == NULL);
    /* slow,times=always: every step from its own on */
    CHECK(fi_take(&s, FI_SLOW, 2, 2, 3, 0, FI_PH_FORWARD) == NULL);
    CHECK(fi_take(&s, FI_SLOW, 2, 2, 4, 0, FI_PH_FORWARD) != NULL);
    CHECK(fi_take(&s, FI_SLOW, 2, 2, 9, 1, FI_PH_FORWARD) != NULL);
    /* a flip changes exactly one bit of one value */
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = 0.5f;
    int bit;
    size_t idx = fi_flip(&s.f[2], x, 16, &bit);
    CHECK(bit == 30 && idx < 16 && x[idx] > 1e30f);
    for (int i = 0; i < 16; i++)
        if ((size_t)i != idx) CHECK(x[i] == 0.5f);
    fi_schedule_free(&s);

    const char *bad[][2] = {{"melt@rank=0,step=1", "unknown kind 'melt'"},
                            {"nan@rank=4,step=1", "rank '4' is not in 0..3"},
                            {"nan@rank=0", "step= is required"},
                            {"nan@step=2", "rank= is required"},
                            {"nan@rank=0,step=101", "is not in 1..100"},
                            {"kill@rank=0,step=2,times=always", "times=always applies to"},
                            {"nan@rank=0,step=2,phase=lunch", "phase 'lunch'"},
                            {"nan@rank=0,step=2,colour=red", "unknown key 'colour'"},
                            {"bitflip-grad@rank=0,step=2,bit=32", "bit '32'"},
                            /* a key twice: which one would count? */
                            {"nan@rank=0,step=3,step=4", "'step' is given twice"},
                            {"nan@rank=0,rank=1,step=3", "'rank' is given twice"},
                            {"slow@rank=0,step=3,ms=5,ms=6", "'ms' is given twice"},
                            /* the real range, named */
                            {"nan@rank=0,step=0", "step '0' is not in 1..100 (iterations 1 to --train-iters)"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *spec[1] = {(char *)bad[k][0]};
        int rc = inject_parse(&s, spec, 1, 0, 4, 100, err, sizeof err);
        CHECK_MSG(rc == CO_EINVAL && strstr(err, bad[k][1]), "%s: %s", bad[k][0], err);
    }
    /* steps unknown (cohort inject checking the syntax): no "1..0" */
    char *zero[1] = {"nan@rank=0,step=0"};
    CHECK(inject_parse(&s, zero, 1, 0, 4, 0, err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "step '0' is not an iteration number (1, 2, ...)") && !strstr(err, "1..0"), "%s", err);
    /* a running job's remaining iterations */
    char *live[1] = {"nan@rank=0,step=5"};
    CHECK(inject_parse_live(&s, live, 1, 4, 12, 100, err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "step 5 is too soon: the job is at iteration 10 (give 12..100)"), "%s", err);
    live[0] = "nan@rank=0,step=101";
    CHECK(inject_parse_live(&s, live, 1, 4, 12, 100, err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "step '101' is not in 12..100 (the iterations the job has still to run"), "%s", err);
    live[0] = "nan@rank=0,step=12";
    CHECK(inject_parse_live(&s, live, 1, 4, 12, 100, err, sizeof err) == 0 && s.n == 1);
    fi_schedule_free(&s);
}

/* One cap on a schedule's specs, FI_MAX_SPECS, for --inject and cohort inject alike. */
static void inject_cap(void) {
    char err[512];
    CHECK(FI_MAX_SPECS == 64);
    char *specs[FI_MAX_SPECS + 1];
    char buf[FI_MAX_SPECS + 1][48];
    for (int i = 0; i <= FI_MAX_SPECS; i++) {
        snprintf(buf[i], sizeof buf[i], "nan@rank=0,step=%d", i + 1);
        specs[i] = buf[i];
    }
    fi_schedule s;
    CHECK(inject_parse(&s, specs, FI_MAX_SPECS + 1, 0, 4, 1000, err, sizeof err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "65 fault specs: at most 64"), "%s", err);
    REQUIRE(inject_parse(&s, specs, FI_MAX_SPECS, 0, 4, 1000, err, sizeof err) == 0);
    CHECK(inject_add(&s, "nan@rank=1,step=900", 0, 4, 1000, err, sizeof err) == CO_EINVAL && s.n == FI_MAX_SPECS);
    CHECK_MSG(strstr(err, "already has 64 faults scheduled"), "%s", err);
    fi_schedule_free(&s);
    REQUIRE(inject_parse(&s, specs, 3, 0, 4, 1000, err, sizeof err) == 0);
    CHECK(inject_add(&s, "nan@rank=1,step=900", 0, 4, 1000, err, sizeof err) == 0 && s.n == 4);
    fi_schedule_free(&s);
}

/* A report folds any number of micro batches into one fixed size: at 256 and 100000 micro
 * batches a NaN in micro batch 200 (or the last) is found, a replay that changes one loss
 * by one bit is told apart, one that repeats every bit is the same result, and a report
 * whose count disagrees with its fold is refused. */
static rr_report many(int64_t it, int attempt, int nmb, int bad, int flip) {
    rr_report r = rep(it, attempt, 0, 2.0, 1.0);
    r.nmb = nmb;
    rr_mbs_reset(&r.mb);
    for (int i = 0; i < nmb; i++) {
        double l = 2.0 + 1e-3 * (i % 7);
        if (i == bad) l = NAN;
        if (i == flip) l = nextafter(l, 10.0);
        rr_mbs_add(&r.mb, i, l, 64);
    }
    return r;
}

static void many_micro_batches(void) {
    CHECK(sizeof(rr_report) < 1024); /* no per-micro-batch array: the same size for any count */
    int counts[2] = {256, 100000};
    for (int c = 0; c < 2; c++) {
        int n = counts[c];
        rr_options o;
        rr_options_default(&o, 1);
        rr_machine *m;
        REQUIRE(rr_new(&m, &o) == 0);
        rr_report r = many(1, 0, n, -1, -1);
        CHECK(rr_add(m, &r) == 1);
        rr_verdict v;
        rr_decide(m, &v);
        CHECK(v.decision == RR_ACCEPT);
        r = many(2, 0, n, 200, -1);
        CHECK(r.mb.bad_mb == 200 && isnan(r.mb.bad_loss));
        CHECK(rr_add(m, &r) == 1);
        rr_decide(m, &v);
        CHECK_MSG(v.decision == RR_RERUN, "%d micro batches: a NaN in micro batch 200 gave %s", n,
                  rr_decision_name(v.decision));
        r = many(2, 1, n, -1, n - 1); /* the replay: finite, one loss a bit apart */
        CHECK(rr_add(m, &r) == 1);
        rr_decide(m, &v);
        CHECK_MSG(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_TRANSIENT, "%d: %s %s", n,
                  rr_decision_name(v.decision), rr_diagnosis_name(v.diagnosis));
        r = many(3, 0, n, n - 1, -1); /* the last micro batch */
        CHECK(rr_add(m, &r) == 1);
        rr_decide(m, &v);
        CHECK(v.decision == RR_RERUN);
        r = many(3, 1, n, n - 1, -1); /* reproduces bit for bit: one replica, a real problem */
        CHECK(rr_add(m, &r) == 1);
        rr_decide(m, &v);
        CHECK_MSG(v.decision == RR_STOP && v.diagnosis == RR_DIAG_CORRECT, "%d: %s", n, rr_decision_name(v.decision));
        r = many(4, 0, n, -1, -1);
        r.nmb = n + 1; /* claims more micro batches than it folded */
        CHECK(rr_add(m, &r) < 0);
        rr_destroy(&m);
    }
    /* the digest: order of folding does not matter, one bit of one loss or token count does */
    rr_mbs a, b, c;
    rr_mbs_reset(&a), rr_mbs_reset(&b), rr_mbs_reset(&c);
    for (int i = 0; i < 300; i++) rr_mbs_add(&a, i, 1.0 + i, 8);
    for (int i = 299; i >= 0; i--) rr_mbs_add(&b, i, 1.0 + i, 8);
    for (int i = 0; i < 300; i++) rr_mbs_add(&c, i, 1.0 + i, i == 150 ? nextafter(8.0, 9.0) : 8);
    CHECK(a.digest == b.digest && a.n == 300 && a.loss_peak == 300.0);
    CHECK(a.digest != c.digest);
    rr_mbs_reset(&c);
    for (int i = 0; i < 300; i++) rr_mbs_add(&c, i == 7 ? 8 : i == 8 ? 7 : i, 1.0 + i, 8); /* two swapped */
    CHECK(a.digest != c.digest);
}

/* One round with parameter checksums: used[r], written[r] (0: none written). */
static rr_verdict round_sums(rr_machine *m, int W, int64_t it, int attempt, const uint64_t *used,
                             const uint64_t *written) {
    rr_verdict v;
    memset(&v, 0, sizeof v);
    for (int r = 0; r < W; r++) {
        rr_report x = rep(it, attempt, r, 100, 1);
        x.has_sum = true;
        x.sum_used = used[r];
        x.has_written = written[r] != 0;
        x.sum_written = written[r];
        int rc = rr_add(m, &x);
        CHECK_MSG(rc == (r == W - 1), "rr_add rank %d: %d", r, rc);
    }
    CHECK(rr_decide(m, &v) == 0);
    return v;
}

static const rr_event *last_event(rr_machine *m, int *n) {
    const rr_event *e = rr_events(m, n);
    return *n ? &e[*n - 1] : NULL;
}

/* Silent data corruption: replicas whose weights' checksums differ are found in the step,
 * repaired from the majority, or with two replicas from the one whose weights are as it
 * wrote them; a disagreement that does not reproduce is transient; one that cannot be
 * attributed stops the job. */
static void weight_checksums(void) {
    rr_options o;
    rr_machine *m;
    /* four replicas, rank 2 differs: repaired from rank 0, the replay must agree */
    rr_options_default(&o, 4);
    REQUIRE(rr_new(&m, &o) == 0);
    uint64_t ok4[4] = {7, 7, 7, 7}, bad4[4] = {7, 7, 9, 7}, wr4[4] = {7, 7, 7, 7};
    CHECK(round_sums(m, 4, 1, 0, ok4, wr4).decision == RR_ACCEPT);
    rr_verdict v = round_sums(m, 4, 2, 0, bad4, wr4);
    CHECK(v.decision == RR_REPAIR && v.helper == 0 && v.suspect == 2 && v.diagnosis == RR_DIAG_PERSISTENT);
    CHECK_MSG(strstr(v.reason, "rank 2: parameters differ from 3 of 4 replicas'") != NULL, "%s", v.reason);
    int n;
    const rr_event *e = last_event(m, &n);
    CHECK(n == 1 && e && e->rank == 2 && !strcmp(e->check, "param_checksum") && e->repaired &&
          e->diagnosis == RR_DIAG_PERSISTENT);
    v = round_sums(m, 4, 2, v.attempt, ok4, wr4);
    CHECK(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_PERSISTENT);
    /* two of four differ (3 and 1 against 7, 7): still a majority of the other value? no:
     * 2 of 4 is not more than half; the replay decides, and the written sums attribute */
    uint64_t split[4] = {7, 5, 7, 5}, wsplit[4] = {7, 7, 7, 7};
    v = round_sums(m, 4, 3, 0, split, wsplit);
    CHECK(v.decision == RR_RERUN);
    v = round_sums(m, 4, 3, v.attempt, split, wsplit);
    CHECK_MSG(v.decision == RR_REPAIR && v.helper == 0, "%s", v.reason);
    CHECK(round_sums(m, 4, 3, v.attempt, ok4, wr4).decision == RR_ACCEPT);
    /* repaired, and the replicas still differ: stop */
    v = round_sums(m, 4, 4, 0, bad4, wr4);
    CHECK(v.decision == RR_REPAIR);
    v = round_sums(m, 4, 4, v.attempt, bad4, wr4);
    CHECK_MSG(v.decision == RR_STOP && strstr(v.reason, "still differ after"), "%s", v.reason);
    rr_destroy(&m);

    /* two replicas: no majority; the replay reproduces; rank 1's weights changed since it
     * wrote them (5 written, 9 used), rank 0's did not: repaired from rank 0 */
    rr_options_default(&o, 2);
    REQUIRE(rr_new(&m, &o) == 0);
    uint64_t u2[2] = {5, 9}, w2[2] = {5, 5}, ok2[2] = {5, 5};
    v = round_sums(m, 2, 1, 0, u2, w2);
    CHECK(v.decision == RR_RERUN && v.diagnosis == RR_DIAG_NONE);
    v = round_sums(m, 2, 1, v.attempt, u2, w2);
    CHECK_MSG(v.decision == RR_REPAIR && v.helper == 0 && v.suspect == 1, "%s", v.reason);
    CHECK_MSG(strstr(v.reason, "rank 1: parameters changed in memory since its last update") != NULL, "%s", v.reason);
    CHECK(round_sums(m, 2, 1, v.attempt, ok2, w2).decision == RR_ACCEPT);
    /* rank 0 this time */
    uint64_t u2b[2] = {9, 5};
    v = round_sums(m, 2, 2, 0, u2b, w2);
    v = round_sums(m, 2, 2, v.attempt, u2b, w2);
    CHECK(v.decision == RR_REPAIR && v.helper == 1 && v.suspect == 0);
    CHECK(round_sums(m, 2, 2, v.attempt, ok2, w2).decision == RR_ACCEPT);
    /* the replay agrees: a transient fault, the replay is accepted */
    v = round_sums(m, 2, 3, 0, u2, w2);
    CHECK(v.decision == RR_RERUN);
    v = round_sums(m, 2, 3, v.attempt, ok2, w2);
    CHECK(v.decision == RR_ACCEPT && v.diagnosis == RR_DIAG_TRANSIENT);
    e = last_event(m, &n);
    CHECK(e && e->rank == 1 && e->diagnosis == RR_DIAG_TRANSIENT && !strcmp(e->check, "param_checksum"));
    /* both ranks' weights are as they wrote them, yet differ (a fault inside one rank's
     * optimizer step): no rank can be shown faulty, the job stops */
    uint64_t wboth[2] = {5, 9};
    v = round_sums(m, 2, 4, 0, u2, wboth);
    v = round_sums(m, 2, 4, v.attempt, u2, wboth);
    CHECK_MSG(v.decision == RR_STOP && strstr(v.reason, "no rank can be shown faulty"), "%s", v.reason);
    /* nothing written to compare with (0): cannot attribute either */
    uint64_t none[2] = {0, 0};
    v = round_sums(m, 2, 5, 0, u2, none);
    v = round_sums(m, 2, 5, v.attempt, u2, none);
    CHECK(v.decision == RR_STOP);
    rr_destroy(&m);

    /* a report without checksums (an unchecked interval) compares nothing */
    rr_options_default(&o, 2);
    REQUIRE(rr_new(&m, &o) == 0);
    double l[2] = {100, 100}, g[2] = {1, 1};
    CHECK(round_all(m, 2, 1, 0, l, g).decision == RR_ACCEPT);
    rr_destroy(&m);
}

int main(void) {
    RUN(many_micro_batches);
    RUN(accepts_valid);
    RUN(transient_nan);
    RUN(fp16_overflow_accepted);
    RUN(reproducible_stop);
    RUN(reproducible_skip);
    RUN(corrupt_rank_repaired);
    RUN(one_rank);
    RUN(outlier_and_spike);
    RUN(determinism_mode);
    RUN(injection_types);
    RUN(state_and_tracker);
    RUN(inject_schedule);
    RUN(inject_cap);
    RUN(weight_checksums);
    return TEST_EXIT();
}
