/* lr.c - learning-rate schedules, following Megatron's OptimizerParamScheduler. */
#include "optim/lr.h"

#include <math.h>
#include <string.h>

int lr_style_parse(const char *s) {
    if (!strcmp(s, "constant")) return LR_CONSTANT;
    if (!strcmp(s, "linear")) return LR_LINEAR;
    if (!strcmp(s, "cosine")) return LR_COSINE;
    if (!strcmp(s, "inverse-square-root")) return LR_INVSQRT;
    if (!strcmp(s, "WSD")) return LR_WSD;
    return -1;
}

int lr_wsd_style_parse(const char *s) {
    if (!strcmp(s, "exponential")) return WSD_EXPONENTIAL;
    if (!strcmp(s, "linear")) return WSD_LINEAR;
    if (!strcmp(s, "cosine")) return WSD_COSINE;
    if (!strcmp(s, "minus_sqrt")) return WSD_MINUS_SQRT;
    return -1;
}

double lr_at(const lr_schedule *s, int64_t step) {
    double n = (double)step, w = (double)s->warmup_iters, d = (double)s->decay_iters;
    if (s->warmup_iters > 0 && step <= s->warmup_iters) return s->init_lr + (s->max_lr - s->init_lr) * n / w;
    if (s->style == LR_CONSTANT) return s->max_lr;
    if (step > s->decay_iters) return s->min_lr;
    if (s->style == LR_INVSQRT) {
        double ww = w > 1 ? w : 1, nn = n > 1 ? n : 1;
        double lr = s->max_lr * sqrt(ww) / sqrt(nn);
        return lr > s->min_lr ? lr : s->min_lr;
    }
    double ratio = d - w > 0 ? (n - w) / (d - w) : 1.0;
    double coeff;
    switch (s->style) {
    case LR_LINEAR: coeff = 1.0 - ratio; break;
    case LR_COSINE: coeff = 0.5 * (cos(M_PI * ratio) + 1.0); break;
    case LR_WSD: {
        double anneal_start = d - (double)s->wsd_decay_iters;
        if (n <= anneal_start || s->wsd_decay_iters <= 0) {
            coeff = 1.0;
        } else {
            double r = (n - anneal_start) / (double)s->wsd_decay_iters;
            switch (s->wsd_style) {
            case WSD_LINEAR: coeff = 1.0 - r; break;
            case WSD_COSINE: coeff = 0.5 * (cos(M_PI * r) + 1.0); break;
            case WSD_MINUS_SQRT: coeff = 1.0 - sqrt(r); break;
            default: coeff = 2.0 * pow(0.5, r) - 1.0; break;
            }
        }
        break;
    }
    default: coeff = 1.0; break;
    }
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}
