/* test_ckpt_interval.c - supervisor/ckpt_interval.c: Young's interval, the MTBF estimate with
 * its prior, the interval in iterations, and --save-interval auto's decisions (ci_auto). */
#include "supervisor/ckpt_interval.h"

#include "tests/test.h"

#include <string.h>

static void formula(void) {
    CHECK_CLOSE(ci_young(10, 3600), 268.32815729997475, 1e-9, 0); /* sqrt(2 * 10 * 3600) */
    CHECK(ci_young(0, 3600) == 0 && ci_young(10, 0) == 0);
}

static void estimator(void) {
    ci_est e;
    ci_init(&e, 0, 86400, 86400);
    CHECK_CLOSE(ci_mtbf(&e), 86400, 1e-9, 0); /* the prior alone */
    ci_wall(&e, 3600);
    CHECK_CLOSE(ci_mtbf(&e), 86400 + 3600, 1e-6, 0); /* an hour without a fault */
    ci_fault(&e);
    ci_fault(&e);
    CHECK_CLOSE(ci_mtbf(&e), (86400.0 + 3600) / 3, 1e-6, 0); /* 1 pseudo fault + 2 observed */
    /* the interval shortens as faults come */
    ci_save(&e, 4);
    ci_save(&e, 6);
    CHECK_CLOSE(e.save_s, 5, 1e-12, 0);
    int64_t before = ci_iterations(&e, 0.5, 100, 0);
    CHECK(before == (int64_t)(ci_young(5, (86400.0 + 3600) / 3) / 0.5 + 0.5));
    for (int i = 0; i < 10; i++) ci_fault(&e);
    CHECK(ci_iterations(&e, 0.5, 100, 0) < before);
    /* given: the observed faults do not count */
    ci_est g;
    ci_init(&g, 7200, 0, 0);
    ci_fault(&g);
    CHECK_CLOSE(ci_mtbf(&g), 7200, 1e-12, 0);
    CHECK(ci_iterations(&g, 1, 100, 0) == 100); /* no save measured yet: the fallback */
    ci_save(&g, 2);
    CHECK(ci_iterations(&g, 1, 100, 0) == 170); /* sqrt(2 * 2 * 7200) = 169.7 */
    CHECK(ci_iterations(&g, 1, 100, 50) == 50);
    CHECK(ci_iterations(&g, 1000, 100, 0) == 1);
}

/* --save-interval auto: the first save at CI_FIRST_SAVE to measure its cost, then Young's
 * interval counted from the last save; a fault re-estimates it (and is worth a log line); a
 * resume from a checkpoint counts from there. */
static void auto_decisions(void) {
    ci_auto a;
    ci_auto_init(&a, 200, 1000, 0); /* MTBF given: 200 s */
    bool changed = false;
    int saved = -1;
    for (int it = 51; it <= 80 && saved < 0; it++) /* the job resumed after iteration 50 */
        if (ci_auto_due(&a, it, it, 0.1, &changed)) saved = it;
    CHECK(saved == 50 + CI_FIRST_SAVE);
    ci_save(&a.est, 0.25); /* sqrt(2 x 0.25 x 200) = 10 s = 100 steps of 0.1 s */
    CHECK(!ci_auto_due(&a, 61, 61, 0.1, &changed) && changed && a.interval == 100);
    CHECK(!ci_auto_due(&a, 62, 62, 0.1, &changed) && !changed);
    CHECK(!ci_auto_due(&a, 159, 159, 0.1, &changed));
    CHECK(ci_auto_due(&a, 160, 160, 0.1, &changed));
    char line[400];
    ci_auto_describe(&a, 0.1, line, sizeof line);
    CHECK(strstr(line, "100 iterations (Young: sqrt(2 x 0.250 s to save x 200.0 s between failures) = 10.00 s") != NULL);
    /* estimated: a fault shortens the interval and is reported as a change */
    ci_auto e;
    ci_auto_init(&e, 0, 1000000, 0);
    ci_save(&e.est, 1);
    ci_auto_due(&e, 1, 100, 0.01, &changed);
    int64_t before = e.interval;
    ci_fault(&e.est);
    ci_auto_due(&e, 2, 101, 0.01, &changed);
    CHECK(changed && e.interval < before);
    ci_auto_resumed(&e, 500);
    CHECK(!ci_auto_due(&e, 501, 102, 0.01, &changed));
}

int main(void) {
    RUN(formula);
    RUN(estimator);
    RUN(auto_decisions);
    return TEST_EXIT();
}
