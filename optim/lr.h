/* lr.h - Megatron's learning-rate schedule (OptimizerParamScheduler.get_lr), in iterations:
 * linear warm-up from init_lr, then constant, linear, cosine, inverse-square-root or WSD
 * decay to min_lr over decay_iters. */
#ifndef COHORT_OPTIM_LR_H
#define COHORT_OPTIM_LR_H

#include <stdint.h>

typedef enum { LR_CONSTANT, LR_LINEAR, LR_COSINE, LR_INVSQRT, LR_WSD } lr_style;
typedef enum { WSD_EXPONENTIAL, WSD_LINEAR, WSD_COSINE, WSD_MINUS_SQRT } lr_wsd_style;

typedef struct lr_schedule {
    double max_lr, min_lr, init_lr;
    int64_t warmup_iters, decay_iters, wsd_decay_iters;
    lr_style style;
    lr_wsd_style wsd_style;
} lr_schedule;

/* Parses "cosine", "WSD", ... and "exponential", ...; -1 if unknown. */
int lr_style_parse(const char *s);
int lr_wsd_style_parse(const char *s);
/* Learning rate after `step` completed iterations (step 0: the first iteration's rate). */
double lr_at(const lr_schedule *s, int64_t step);

#endif
