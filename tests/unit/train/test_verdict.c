/* test_verdict.c - what an iteration does next (train/verdict.c): every decision of the rerun
 * state machine mapped to its action, ACCEPT after a check round refused, no validator
 * stepping; the NaN policy before the update (unvalidated with and without
 * --check-for-nan-in-loss-and-grad, validated, the reduced gradients' overflow); and the
 * trainer's hooks refusing one beyond the number it holds (train/trainer.c). */
#include "train/trainer_internal.h"
#include "train/verdict.h"

#include "common/error.h"
#include "tests/test.h"

#include <math.h>
#include <string.h>

static rr_verdict verdict(rr_decision d) {
    rr_verdict v;
    memset(&v, 0, sizeof v);
    v.decision = d;
    v.suspect = v.helper = -1;
    return v;
}

static void test_verdict_actions(void) {
    CHECK(tr_verdict_action(NULL, false) == TR_ACT_STEP); /* no validator: the step as computed */
    struct {
        rr_decision d;
        tr_action a;
        bool replays;
    } cases[] = {
        {RR_ACCEPT, TR_ACT_STEP, false}, {RR_RERUN, TR_ACT_RERUN, true}, {RR_CHECK, TR_ACT_CHECK, true},
        {RR_REPAIR, TR_ACT_REPAIR, true}, {RR_SKIP, TR_ACT_SKIP, false},  {RR_STOP, TR_ACT_REJECT, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rr_verdict v = verdict(cases[k].d);
        tr_action a = tr_verdict_action(&v, false);
        CHECK_MSG(a == cases[k].a, "%s gave %s", rr_decision_name(cases[k].d), tr_action_name(a));
        CHECK(tr_action_replays(a) == cases[k].replays);
    }
    /* after a check round the machine decides again; accepting it outright is a protocol error */
    rr_verdict v = verdict(RR_ACCEPT);
    CHECK(tr_verdict_action(&v, true) == TR_ACT_PROTOCOL);
    CHECK(!tr_action_replays(TR_ACT_PROTOCOL));
    v = verdict(RR_RERUN);
    CHECK(tr_verdict_action(&v, true) == TR_ACT_RERUN);
    v = verdict(RR_SKIP);
    CHECK(tr_verdict_action(&v, true) == TR_ACT_SKIP);
    v = verdict((rr_decision)99); /* a decision the trainer does not know stops it */
    CHECK(tr_verdict_action(&v, false) == TR_ACT_REJECT);
}

static void test_update_actions(void) {
    /* finite: step, whoever checks */
    CHECK(tr_update_action(false, true, 2.5, 1.0) == TR_ACT_STEP);
    CHECK(tr_update_action(true, true, 2.5, 1.0) == TR_ACT_STEP);
    /* unvalidated with the NaN check: the loss first, then the gradients */
    CHECK(tr_update_action(false, true, NAN, 1.0) == TR_ACT_STOP_NAN_LOSS);
    CHECK(tr_update_action(false, true, INFINITY, NAN) == TR_ACT_STOP_NAN_LOSS);
    CHECK(tr_update_action(false, true, 2.5, INFINITY) == TR_ACT_STOP_NAN_GRADS);
    /* unvalidated without the check: a bad loss is logged and trained on... */
    CHECK(tr_update_action(false, false, NAN, 1.0) == TR_ACT_STEP);
    /* ...but overflowed gradients are never applied, checked or not, validated or not */
    CHECK(tr_update_action(false, false, 2.5, NAN) == TR_ACT_STOP_NAN_REDUCED);
    CHECK(tr_update_action(true, true, 2.5, -INFINITY) == TR_ACT_STOP_NAN_REDUCED);
    /* a validated round's loss is the validator's business */
    CHECK(tr_update_action(true, true, NAN, 1.0) == TR_ACT_STEP);
    CHECK(strcmp(tr_action_name(TR_ACT_STOP_NAN_GRADS), "stop: nan gradients") == 0);
    /* --fp16: overflowed gradients with a finite loss skip the step instead of stopping */
    CHECK(tr_update_action_fp16(false, true, 2.5, 1.0) == TR_ACT_STEP);
    CHECK(tr_update_action_fp16(false, true, 2.5, INFINITY) == TR_ACT_SKIP);
    CHECK(tr_update_action_fp16(true, true, 2.5, NAN) == TR_ACT_SKIP);
    CHECK(tr_update_action_fp16(false, false, 2.5, NAN) == TR_ACT_SKIP);
    /* a non-finite loss is still checked as without --fp16 */
    CHECK(tr_update_action_fp16(false, true, NAN, NAN) == TR_ACT_STOP_NAN_LOSS);
    CHECK(tr_update_action_fp16(false, true, INFINITY, 1.0) == TR_ACT_STOP_NAN_LOSS);
}

static int calls;
static int count_hook(trainer *t, void *ctx, bool final, train_end why) {
    (void)t, (void)final, (void)why;
    calls += *(int *)ctx;
    return 0;
}
static int count_pre_step(trainer *t, void *ctx) {
    (void)t;
    calls += *(int *)ctx;
    return 0;
}

static void test_hooks_refused_beyond_capacity(void) {
    static trainer t; /* only the hook tables are used */
    memset(&t, 0, sizeof t);
    int weight[TRAINER_MAX_HOOKS + 1];
    for (int i = 0; i <= TRAINER_MAX_HOOKS; i++) weight[i] = 1 << i;
    for (int i = 0; i < TRAINER_MAX_HOOKS; i++) {
        CHECK(trainer_set_hook(&t, count_hook, &weight[i]) == 0);
        CHECK(trainer_set_pre_step_hook(&t, count_pre_step, &weight[i]) == 0);
    }
    co_err_clear();
    CHECK(trainer_set_hook(&t, count_hook, &weight[TRAINER_MAX_HOOKS]) == CO_ERANGE);
    CHECK_MSG(strstr(co_err_detail(), "hook") != NULL, "detail: %s", co_err_detail());
    CHECK(trainer_set_pre_step_hook(&t, count_pre_step, &weight[TRAINER_MAX_HOOKS]) == CO_ERANGE);
    CHECK(t.nhooks == TRAINER_MAX_HOOKS && t.npre_step == TRAINER_MAX_HOOKS);
    /* the ones held all run, the refused one never does */
    calls = 0;
    for (int i = 0; i < t.nhooks; i++) t.hook[i](&t, t.hook_ctx[i], false, TRAIN_DONE);
    CHECK(calls == (1 << TRAINER_MAX_HOOKS) - 1);
    calls = 0;
    for (int i = 0; i < t.npre_step; i++) t.pre_step[i](&t, t.pre_step_ctx[i]);
    CHECK(calls == (1 << TRAINER_MAX_HOOKS) - 1);
}

int main(void) {
    RUN(test_verdict_actions);
    RUN(test_update_actions);
    RUN(test_hooks_refused_beyond_capacity);
    return TEST_EXIT();
}
