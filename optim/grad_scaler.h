/* grad_scaler.h - the loss scale of --fp16 training: Megatron's ConstantGradScaler
 * (--loss-scale) and DynamicGradScaler (megatron/core/optimizer/grad_scaler.py).
 *
 * The loss is multiplied by the scale before the backward, so that small gradients survive
 * the fp16 products; the optimizer divides them by it again. A step whose gradients hold an
 * Inf or NaN (found on every rank: see docs/fp16.md) is skipped, and the scaler learns of it:
 *   found inf   growth tracker := 0; hysteresis tracker -= 1; once it is <= 0 the scale
 *               halves (never below --min-loss-scale), and keeps halving at each further
 *               overflow until a growth resets the tracker;
 *   no inf      growth tracker += 1; at --loss-scale-window good steps in a row the tracker
 *               restarts, the hysteresis tracker is --hysteresis again and the scale doubles.
 * The scale is an fp32 value as Megatron's tensor is (growth factor 2, backoff 0.5: always a
 * power of two from a power-of-two start). A constant scaler never changes. Pure logic. */
#ifndef COHORT_OPTIM_GRAD_SCALER_H
#define COHORT_OPTIM_GRAD_SCALER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct opt_grad_scaler {
    bool dynamic;            /* false: --loss-scale, a constant */
    float scale;             /* the current loss scale */
    float min_scale;         /* --min-loss-scale */
    int64_t window;          /* --loss-scale-window: good steps before the scale grows */
    int64_t hysteresis;      /* --hysteresis: overflows before it backs off */
    int64_t growth_tracker;  /* good steps since the last overflow or growth */
    int64_t hysteresis_tracker;
} opt_grad_scaler;

/* A dynamic scaler (initial scale, min scale, window, hysteresis as Megatron's flags). */
void opt_grad_scaler_dynamic(opt_grad_scaler *s, double initial, double min_scale, int64_t window,
                             int64_t hysteresis);
/* A constant scaler of the given scale. */
void opt_grad_scaler_constant(opt_grad_scaler *s, double scale);
/* After a step (applied or skipped): found_inf says whether its gradients overflowed. */
void opt_grad_scaler_update(opt_grad_scaler *s, bool found_inf);
/* 1 / scale as Megatron's inv_scale: the reciprocal in double, rounded to fp32. */
float opt_grad_scaler_inv(const opt_grad_scaler *s);

#endif
