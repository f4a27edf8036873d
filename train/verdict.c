/* verdict.c - what an iteration does next (see verdict.h). */
#include "train/verdict.h"

#include <math.h>

tr_action tr_verdict_action(const rr_verdict *v, bool checking) {
    if (!v) return TR_ACT_STEP;
    switch (v->decision) {
    case RR_ACCEPT: return checking ? TR_ACT_PROTOCOL : TR_ACT_STEP;
    case RR_RERUN: return TR_ACT_RERUN;
    case RR_CHECK: return TR_ACT_CHECK;
    case RR_REPAIR: return TR_ACT_REPAIR;
    case RR_SKIP: return TR_ACT_SKIP;
    default: return TR_ACT_REJECT; /* RR_STOP, and anything the machine does not send */
    }
}

tr_action tr_update_action(bool validated, bool check_nan, double loss, double grad_norm) {
    if (!validated && check_nan && !isfinite(loss)) return TR_ACT_STOP_NAN_LOSS;
    if (!validated && check_nan && !isfinite(grad_norm)) return TR_ACT_STOP_NAN_GRADS;
    /* whatever was checked before, reduced gradients that overflowed are never applied */
    if (!isfinite(grad_norm)) return TR_ACT_STOP_NAN_REDUCED;
    return TR_ACT_STEP;
}

tr_action tr_update_action_fp16(bool validated, bool check_nan, double loss, double grad_norm) {
    tr_action a = tr_update_action(validated, check_nan, loss, grad_norm);
    if (a == TR_ACT_STOP_NAN_GRADS) return TR_ACT_SKIP;
    /* a validated round's loss was checked; an unchecked non-finite loss overflowed too */
    if (a == TR_ACT_STOP_NAN_REDUCED) return TR_ACT_SKIP;
    return a;
}

const char *tr_action_name(tr_action a) {
    static const char *const names[] = {"step", "rerun", "check", "repair", "skip", "reject", "protocol",
                                        "stop: nan loss", "stop: nan gradients", "stop: nan reduced gradients"};
    return a >= TR_ACT_STEP && a <= TR_ACT_STOP_NAN_REDUCED ? names[a] : "?";
}
