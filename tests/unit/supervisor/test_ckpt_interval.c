/* test_ckpt_interval.c - supervisor/ckpt_interval.c: Young's interval, the MTBF estimate with
 * its prior, and the interval in iterations. */
#include "supervisor/ckpt_interval.h"

#include "tests/test.h"

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

int main(void) {
    RUN(formula);
    RUN(estimator);
    return TEST_EXIT();
}
