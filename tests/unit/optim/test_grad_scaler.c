/* test_grad_scaler.c - fp16's loss scaler (optim/grad_scaler.c) against Megatron's
 * DynamicGradScaler (megatron/core/optimizer/grad_scaler.py), restated as a table of steps
 * worked out by hand from its update(): an overflow backs off only once the hysteresis
 * tracker reaches 0 and then at every further overflow, the minimum scale holds, a window of
 * good steps doubles the scale and restores the hysteresis; and against a line-by-line
 * restatement of that update() over long random overflow patterns. */
#include <math.h>

#include "optim/grad_scaler.h"
#include "tests/test.h"

typedef struct {
    int inf;
    float scale;
    int64_t growth, hyst;
} step;

/* initial 16, min 2, window 3, hysteresis 2 */
static const step table[] = {
    {1, 16, 0, 1},  /* first overflow: hysteresis 2 -> 1, no backoff */
    {0, 16, 1, 1},  /* a good step: the growth tracker counts */
    {1, 8, 0, 0},   /* second overflow: the tracker reaches 0, backoff; growth restarts */
    {1, 4, 0, -1},  /* every further overflow backs off */
    {1, 2, 0, -2},  /* down to the minimum */
    {1, 2, 0, -3},  /* never below it */
    {0, 2, 1, -3}, {0, 2, 2, -3},
    {0, 4, 0, 2},   /* the window's third good step: growth, hysteresis restored */
    {1, 4, 0, 1},   /* so one overflow does not back off */
    {0, 4, 1, 1}, {0, 4, 2, 1},
    {0, 8, 0, 2},
    {1, 8, 0, 1}, {1, 4, 0, 0},
};

static void table_of_steps(void) {
    opt_grad_scaler s;
    opt_grad_scaler_dynamic(&s, 16, 2, 3, 2);
    CHECK(s.scale == 16 && s.growth_tracker == 0 && s.hysteresis_tracker == 2);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        opt_grad_scaler_update(&s, table[i].inf);
        CHECK_MSG(s.scale == table[i].scale && s.growth_tracker == table[i].growth &&
                      s.hysteresis_tracker == table[i].hyst,
                  "step %zu: scale %g growth %lld hysteresis %lld, want %g %lld %lld", i + 1, s.scale,
                  (long long)s.growth_tracker, (long long)s.hysteresis_tracker, table[i].scale,
                  (long long)table[i].growth, (long long)table[i].hyst);
    }
}

/* Megatron's update(), statement by statement, with torch.max spelled out */
typedef struct {
    float scale, min_scale;
    long growth, hyst, window, hysteresis;
} ref;
static void ref_update(ref *r, int found_inf) {
    if (found_inf) {
        r->growth = 0;
        r->hyst -= 1;
        if (r->hyst <= 0) r->scale = fmaxf(r->scale * 0.5f, r->min_scale);
    } else {
        r->growth += 1;
        if (r->growth == r->window) {
            r->growth = 0;
            r->hyst = r->hysteresis;
            r->scale = r->scale * 2.0f;
        }
    }
}

static void random_patterns_against_restatement(void) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int backoffs = 0, growths = 0;
    for (int run = 0; run < 40; run++) {
        long window = 1 + run % 7, hyst = 1 + run % 4;
        opt_grad_scaler s;
        opt_grad_scaler_dynamic(&s, 4294967296.0, 1.0, window, hyst);
        ref r = {4294967296.0f, 1.0f, 0, hyst, window, hyst};
        for (int i = 0; i < 5000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int inf = (int)(x % 100) < 10 + run; /* overflow rates from 10% to 49% */
            float before = s.scale;
            opt_grad_scaler_update(&s, inf);
            ref_update(&r, inf);
            backoffs += s.scale < before, growths += s.scale > before;
            if (s.scale != r.scale || s.growth_tracker != r.growth || s.hysteresis_tracker != r.hyst) {
                CHECK_MSG(0, "run %d step %d: %g/%lld/%lld, reference %g/%ld/%ld", run, i, s.scale,
                          (long long)s.growth_tracker, (long long)s.hysteresis_tracker, r.scale, r.growth, r.hyst);
                return;
            }
            REQUIRE(s.scale >= 1.0f);
        }
    }
    CHECK(backoffs > 100 && growths > 100); /* both ways were exercised */
}

static void megatron_defaults_and_constant(void) {
    opt_grad_scaler s;
    opt_grad_scaler_dynamic(&s, 4294967296.0, 1.0, 1000, 2);
    CHECK(s.scale == 4294967296.0f);
    CHECK(opt_grad_scaler_inv(&s) == 1.0f / 4294967296.0f); /* a power of two: exact */
    for (int i = 0; i < 999; i++) opt_grad_scaler_update(&s, false);
    CHECK(s.scale == 4294967296.0f);
    opt_grad_scaler_update(&s, false); /* the 1000th good step */
    CHECK(s.scale == 8589934592.0f);
    opt_grad_scaler c;
    opt_grad_scaler_constant(&c, 4096);
    for (int i = 0; i < 10; i++) opt_grad_scaler_update(&c, i % 2);
    CHECK(c.scale == 4096.0f && c.growth_tracker == 0 && c.hysteresis_tracker == 0);
}

int main(void) {
    RUN(table_of_steps);
    RUN(random_patterns_against_restatement);
    RUN(megatron_defaults_and_constant);
    return TEST_EXIT();
}
