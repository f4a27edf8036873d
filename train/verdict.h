/* verdict.h - what an iteration does next, decided from the validator's verdict and the step's
 * numbers: pure functions, no I/O, so that every outcome can be tested on its own
 * (tests/unit/train/test_verdict.c). trainer_train (train/trainer.c) acts on the answer. */
#ifndef COHORT_TRAIN_VERDICT_H
#define COHORT_TRAIN_VERDICT_H

#include "resilience/rerun.h"

#include <stdbool.h>

typedef enum {
    TR_ACT_STEP = 0,         /* apply the update */
    TR_ACT_RERUN,            /* replay the step in place (same micro batches and dropout streams) */
    TR_ACT_CHECK,            /* a check round: the helper's replica recomputes the suspect's share */
    TR_ACT_REPAIR,           /* every rank takes the helper's parameters and optimizer state, then replays */
    TR_ACT_SKIP,             /* drop the iteration's update (the batch is consumed) */
    TR_ACT_REJECT,           /* the rerun state machine stopped the job: TRAIN_REJECTED */
    TR_ACT_PROTOCOL,         /* a verdict that cannot follow this round (ACCEPT after a check round) */
    TR_ACT_STOP_NAN_LOSS,    /* unvalidated, --check-for-nan-in-loss-and-grad: the loss is not finite */
    TR_ACT_STOP_NAN_GRADS,   /* unvalidated, --check-for-nan-in-loss-and-grad: the gradient norm is not finite */
    TR_ACT_STOP_NAN_REDUCED, /* the reduced gradient's norm is not finite (validated per rank or not checked) */
} tr_action;

/* After a round: the action for verdict v (NULL: no validator, the step is applied as
 * computed); checking: the round just run was a check round. RERUN, CHECK and REPAIR run
 * another round; the others end the verdict loop. */
tr_action tr_verdict_action(const rr_verdict *v, bool checking);

/* Before the optimizer step of an accepted round: TR_ACT_STEP, or why training stops with
 * TRAIN_NAN. validated: a validator judged the round (it checks NaN itself); check_nan:
 * --check-for-nan-in-loss-and-grad; loss: the step's mean loss; grad_norm: the reduced
 * gradient's norm. */
tr_action tr_update_action(bool validated, bool check_nan, double loss, double grad_norm);

/* The same under --fp16's loss scaling: gradients that overflowed (a non-finite norm) with a
 * finite loss are not a fault but a loss scale too large: TR_ACT_SKIP (Megatron skips the
 * step, the iteration counts, the scaler backs off). A non-finite loss stops as above. */
tr_action tr_update_action_fp16(bool validated, bool check_nan, double loss, double grad_norm);

/* Whether the action runs another round of the same iteration. */
static inline bool tr_action_replays(tr_action a) {
    return a == TR_ACT_RERUN || a == TR_ACT_CHECK || a == TR_ACT_REPAIR;
}

/* "step", "rerun", ... (logs and tests). */
const char *tr_action_name(tr_action a);

#endif
