/* test_plan.c - `cohort plan`'s simulator against closed forms (Daly's checkpoint-restart
 * ETTR, the in-process restart's renewal cycle), its determinism and the Llama 3 mix; and the
 * random fault injector's draws (resilience/plan_sim.c, resilience/fault_injector.c). */
#include "common/error.h"
#include "resilience/fault_injector.h"
#include "resilience/plan_sim.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>

/* One GPU failing every m seconds on average, for enough days to see ~n failures. */
static pl_params one_gpu(pl_strategy s, double m, double n) {
    pl_params p = {.gpus = 1, .gpus_per_node = 1, .rate_per_gpu_h = 3600.0 / m, .strategy = s, .runs = 1, .seed = 5};
    p.days = n * m / 86400.0;
    p.shares[PL_HW] = 1.0;
    return p;
}

static void checkpoint_restart_is_daly(void) {
    const double m = 3600, delta = 60, r = 300;
    const double taus[] = {300, 900, 1800, 3600};
    for (int i = 0; i < 4; i++) {
        pl_params p = one_gpu(PL_CKPT_RESTART, m, 40000);
        p.c = (pl_costs){.save_s = delta, .restart_s = r};
        p.ckpt_interval_s = taus[i];
        pl_result x;
        REQUIRE(pl_simulate(&p, &x) == 0);
        double want = pl_daly_ettr(taus[i], delta, r, m);
        CHECK_MSG(fabs(x.ettr - want) < 0.02 * want, "tau %g: simulated %.4f, Daly %.4f", taus[i], x.ettr, want);
    }
}

static void best_interval_near_daly_optimum(void) {
    const double m = 3600, delta = 60, r = 300;
    pl_params p = one_gpu(PL_CKPT_RESTART, m, 20000);
    p.c = (pl_costs){.save_s = delta, .restart_s = r};
    double tau;
    pl_result x;
    REQUIRE(pl_best_interval(&p, &tau, &x) == 0);
    double best = 0;
    for (double t = 60; t < 20000; t += 10) best = fmax(best, pl_daly_ettr(t, delta, r, m));
    CHECK_MSG(fabs(x.ettr - best) < 0.02 * best, "best %.4f at %g s, Daly's optimum %.4f", x.ettr, tau, best);
    double young = pl_young_interval(delta, m);
    CHECK_MSG(tau > young / 2 && tau < young * 2, "best interval %g s, Young's %g s", tau, young);
}

/* In-process restart without checkpoints: each failure costs r of downtime (restarted by a
 * failure inside it) and half a step of rework: ETTR = (m - step/2) / (m e^{r/m}). */
static void inprocess_is_renewal(void) {
    const double m = 1800, r = 120, step = 20;
    pl_params p = one_gpu(PL_INPROCESS, m, 40000);
    p.shares[PL_HW] = 0;
    p.shares[PL_SW] = 1;
    p.c = (pl_costs){.step_s = step, .inproc_s = r};
    pl_result x;
    REQUIRE(pl_simulate(&p, &x) == 0);
    double want = (m - step / 2) / (m * exp(r / m));
    CHECK_MSG(fabs(x.ettr - want) < 0.01 * want, "simulated %.4f, closed form %.4f", x.ettr, want);
    CHECK_CLOSE(x.steps_lost / x.failures, 0.5, 0.02, 0);
}

static void strategies_order_and_determinism(void) {
    pl_params p = {.gpus = 16384, .gpus_per_node = 8, .days = 54, .rate_per_gpu_h = pl_llama3_rate(), .runs = 4,
                   .seed = 9, .spares = 0, .ckpt_interval_s = 1800,
                   .c = {.step_s = 10, .save_s = 30, .restart_s = 600, .inproc_s = 60, .node_s = 600, .repair_h = 24}};
    pl_class_shares(pl_llama3_mix, pl_llama3_ncategories, p.shares);
    pl_result r[PL_NSTRATEGIES], again;
    for (int s = 0; s < PL_NSTRATEGIES; s++) {
        p.strategy = (pl_strategy)s;
        REQUIRE(pl_simulate(&p, &r[s]) == 0);
    }
    CHECK(r[PL_INPROCESS].ettr > r[PL_CKPT_RESTART].ettr);
    CHECK(r[PL_SPARES].ettr == r[PL_INPROCESS].ettr); /* no spares: the same draws, the same costs */
    p.strategy = PL_SPARES;
    p.spares = 4;
    REQUIRE(pl_simulate(&p, &r[PL_SPARES]) == 0);
    CHECK(r[PL_SPARES].ettr > r[PL_INPROCESS].ettr && r[PL_SPARES].gpu_ettr < r[PL_SPARES].ettr);
    REQUIRE(pl_simulate(&p, &again) == 0);
    CHECK(memcmp(&again, &r[PL_SPARES], sizeof again) == 0);
    p.seed = 10;
    REQUIRE(pl_simulate(&p, &again) == 0);
    CHECK(again.ettr != r[PL_SPARES].ettr);
    /* about Llama 3's 419 failures per run */
    CHECK_MSG(fabs(r[PL_CKPT_RESTART].failures - 419) < 40, "%.1f failures", r[PL_CKPT_RESTART].failures);
    p.fallback_share = 2;
    CHECK(pl_simulate(&p, &again) == CO_EINVAL);
}

static void llama3_mix(void) {
    int total = 0;
    for (int i = 0; i < pl_llama3_ncategories; i++) total += pl_llama3_mix[i].count;
    CHECK(total == PL_LLAMA3_INTERRUPTIONS);
    CHECK_CLOSE(pl_llama3_rate() * 54 * 24 * 16384, 419.0, 1e-9, 0);
    double sh[PL_NCLASSES];
    pl_class_shares(pl_llama3_mix, pl_llama3_ncategories, sh);
    CHECK_CLOSE(sh[PL_SW], 63.0 / 419, 1e-12, 0);
    CHECK_CLOSE(sh[PL_SDC], 6.0 / 419, 1e-12, 0);
}

static void random_injector_draws(void) {
    fi_rand a, b;
    REQUIRE(fi_rand_init(&a, NULL, 2, "sigkill,SIGSTOP,nan", "2,1,1", -1, 20, 0, 42, 8) == 0);
    REQUIRE(fi_rand_init(&b, "", 2, "sigkill,SIGSTOP,nan", "2,1,1", -1, 20, 0, 42, 8) == 0);
    int nk[FI_NKINDS] = {0};
    double sum = 0;
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        fi_rand_plan p, q;
        fi_rand_draw(&a, &p);
        fi_rand_draw(&b, &q);
        CHECK(p.n == 2 && p.ranks[0] != p.ranks[1] && p.ranks[0] >= 1 && p.ranks[1] >= 1 && p.ranks[0] < 8 &&
              p.ranks[1] < 8);
        CHECK(p.kind == q.kind && p.delay_s == q.delay_s && p.ranks[0] == q.ranks[0] && p.ranks[1] == q.ranks[1]);
        nk[p.kind]++;
        sum += p.delay_s;
    }
    CHECK_CLOSE(sum / n, 20.0, 0.6, 0);
    CHECK_CLOSE((double)nk[FI_KILL] / n, 0.5, 0.02, 0);
    CHECK_CLOSE((double)nk[FI_STOP] / n, 0.25, 0.02, 0);
    CHECK(nk[FI_NAN] > 0 && nk[FI_HANG] == 0);
    fi_rand_plan p;
    REQUIRE(fi_rand_init(&a, "0,3", 0, "gpu_sleep", NULL, 7.5, 0, 0, 1, 4) == 0);
    fi_rand_draw(&a, &p);
    CHECK(p.n == 2 && p.ranks[0] == 0 && p.ranks[1] == 3 && p.kind == FI_HANG && p.delay_s == 7.5);
    CHECK(fi_rand_init(&a, "1", 0, "sigterm", NULL, -1, 5, 0, 1, 4) == CO_EINVAL &&
          strstr(co_err_detail(), "save and stop"));
    CHECK(fi_rand_init(&a, "1", 0, "workload_exc", NULL, -1, 5, 0, 1, 4) == CO_EINVAL);
    CHECK(fi_rand_init(&a, "1", 0, "melt", NULL, -1, 5, 0, 1, 4) == CO_EINVAL);
    CHECK(fi_rand_init(&a, "1", 1, "kill", NULL, -1, 5, 0, 1, 4) == CO_EINVAL);
    CHECK(fi_rand_init(&a, NULL, 4, "kill", NULL, -1, 5, 0, 1, 4) == CO_EINVAL); /* only 1..3 */
    CHECK(fi_rand_init(&a, "1", 0, "kill", NULL, -1, 0, 0, 1, 4) == CO_EINVAL);  /* no delay, no MTTI */
    CHECK(fi_rand_init(&a, "1", 0, "kill,nan", "1", -1, 5, 0, 1, 4) == CO_EINVAL);
}

int main(void) {
    RUN(checkpoint_restart_is_daly);
    RUN(best_interval_near_daly_optimum);
    RUN(inprocess_is_renewal);
    RUN(strategies_order_and_determinism);
    RUN(llama3_mix);
    RUN(random_injector_draws);
    return TEST_EXIT();
}
