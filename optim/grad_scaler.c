/* grad_scaler.c - fp16's loss scale, Megatron's constant and dynamic scalers (grad_scaler.h). */
#include "optim/grad_scaler.h"

void opt_grad_scaler_dynamic(opt_grad_scaler *s, double initial, double min_scale, int64_t window,
                             int64_t hysteresis) {
    *s = (opt_grad_scaler){.dynamic = true,
                           .scale = (float)initial,
                           .min_scale = (float)min_scale,
                           .window = window,
                           .hysteresis = hysteresis,
                           .hysteresis_tracker = hysteresis};
}

void opt_grad_scaler_constant(opt_grad_scaler *s, double scale) {
    *s = (opt_grad_scaler){.dynamic = false, .scale = (float)scale, .min_scale = (float)scale};
}

void opt_grad_scaler_update(opt_grad_scaler *s, bool found_inf) {
    if (!s->dynamic) return;
    if (found_inf) {
        s->growth_tracker = 0;
        s->hysteresis_tracker--;
        if (s->hysteresis_tracker <= 0) {
            float b = s->scale * 0.5f;
            s->scale = b > s->min_scale ? b : s->min_scale;
        }
        return;
    }
    if (++s->growth_tracker == s->window) {
        s->growth_tracker = 0;
        s->hysteresis_tracker = s->hysteresis;
        s->scale = s->scale * 2.0f;
    }
}

float opt_grad_scaler_inv(const opt_grad_scaler *s) { return (float)(1.0 / (double)s->scale); }
