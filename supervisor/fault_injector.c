/* fault_injector.c - the supervisor's side of Megatron's random fault injector
 * (resilience/fault_injector.h): when training starts the first plan is drawn and a timer
 * armed for its delay; when it fires, each target rank gets the plan's fault at the earliest
 * step a live injection may name (the step after the one in progress), through the same path
 * as `cohort inject`, and the next plan is drawn from then. So faults come as a renewal process
 * with mean time between injections offset + MTTI, whatever they cost. (Megatron draws a plan
 * at each restart instead: its injection thread dies with the process; in cohort a fault that
 * needs no restart, a NaN replayed, would end the stream.) A plan due while the job restarts
 * waits until it trains again. */
#include "supervisor/core.h"

#include "common/error.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void draw_and_arm(sv *s);

static void fire(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    ac_timer_stop(&s->fi_timer);
    const fi_rand_plan *p = &s->fi_plan;
    if (s->stopping) return;
    if (!s->assigned || s->restarting) {
        if (ac_timer_start(s->a, 200, 0, fire, s, &s->fi_timer))
            co_log(CO_LOG_WARN, "fault injector: cannot arm its timer: %s", co_err_detail());
        return;
    }
    int64_t cur = sv__current_iteration(s), step = cur + 2;
    if (s->o.train_iters > 0 && step > s->o.train_iters) {
        co_log(CO_LOG_INFO, "fault injector: plan %d (%s) not injected: the job ends at iteration %" PRId64,
               s->fir.nplans, p->type, s->o.train_iters);
        return;
    }
    for (int i = 0; i < p->n; i++) {
        char spec[96], line[240];
        /* a bit flip hits bit 30 (the exponent's top: the corruption the checks must catch; a
         * flip of a low mantissa bit is below what any check sees and would stay in the run) */
        bool flip = p->kind == FI_BITFLIP_GRAD || p->kind == FI_BITFLIP_PARAM || p->kind == FI_BITFLIP_ACT;
        snprintf(spec, sizeof spec, "%s@rank=%d,step=%" PRId64 "%s", fi_kind_name(p->kind), p->ranks[i], step,
                 flip ? ",bit=30" : "");
        fi_schedule one = {0};
        if (fi_schedule_add(&one, spec, 0, s->nw, INT64_MAX / 4)) {
            co_log(CO_LOG_WARN, "fault injector: %s", co_err_detail());
            fi_schedule_free(&one);
            continue;
        }
        sv__inject_send(s, &one.f[0], spec);
        fi_schedule_free(&one);
        snprintf(line, sizeof line, "inject: %s (--fault-injector), requested at iteration %" PRId64, spec, cur);
        co_log(CO_LOG_WARN, "%s", line);
        if (s->val) svv_on_event(s->val, p->ranks[i], line);
    }
    draw_and_arm(s);
}

static void draw_and_arm(sv *s) {
    fi_rand_draw(&s->fir, &s->fi_plan);
    const fi_rand_plan *p = &s->fi_plan;
    char ranks[256];
    size_t k = 0;
    ranks[0] = '\0';
    for (int i = 0; i < p->n && k < sizeof ranks - 12; i++)
        k += (size_t)snprintf(ranks + k, sizeof ranks - k, "%s%d", i ? "," : "", p->ranks[i]);
    co_log(CO_LOG_INFO, "fault injector: plan %d: %s (%s) on rank%s %s in %.1f s", s->fir.nplans, p->type,
           fi_kind_name(p->kind), p->n > 1 ? "s" : "", ranks, p->delay_s);
    double ms = p->delay_s * 1000.0;
    if (ac_timer_start(s->a, ms < 1 ? 1 : (uint64_t)ms, 0, fire, s, &s->fi_timer))
        co_log(CO_LOG_WARN, "fault injector: cannot arm its timer: %s", co_err_detail());
}

void sv__fi_arm(sv *s) {
    if (!s->o.fault_injector || s->fir.world) return; /* off, or armed already */
    s->fir = *s->o.fault_injector;
    draw_and_arm(s);
}
