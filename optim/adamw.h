/* adamw.h - AdamW over the model's flat parameter buffer with global-norm clipping.
 * Weight decay applies to the tensors the model marks (weight matrices and embeddings),
 * not to biases and norm parameters, as in Megatron. Moments are fp32, like the master
 * weights. */
#ifndef COHORT_OPTIM_ADAMW_H
#define COHORT_OPTIM_ADAMW_H

#include "model/gpt.h"

typedef struct opt_adamw {
    float beta1, beta2, eps, weight_decay, clip_grad;
    float inv_loss_scale; /* --fp16: the gradients are the loss scale times the true ones, the
                             step multiplies them by this (0: they are not scaled) */
    float *m, *v;   /* same layout as the parameters */
    size_t n;
    int64_t step;   /* optimizer steps taken */
    uint64_t *sums; /* each tensor's checksum from the fused step (a queued backend writes them
                       at its sync), nsums of them; allocated at the first fused step */
    int nsums;
    /* >= 0: this step's rate of the input embedding and the output layer (Megatron's
     * --decoupled-lr: "embedding.word_embeddings.weight", "output_layer.weight"); < 0 (as
     * opt_adamw_init leaves it): the step's lr for every tensor */
    double lr_decoupled;
} opt_adamw;

int opt_adamw_init(opt_adamw *o, gpt_model *model, float beta1, float beta2, float eps, float wd,
                   float clip_grad);
void opt_adamw_free(opt_adamw *o, gpt_model *model);
/* Global L2 norm of the gradients (tied weights counted once: they are one tensor). */
double opt_grad_norm(gpt_model *model);
/* The factor gradients are multiplied by before the step: clip / (norm + 1e-6) where that
 * is below 1 (Megatron's clip_grad_norm), else 1; clip <= 0: no clipping. optim/dist_opt.c
 * uses it too, so both optimizers clip identically. */
float opt_clip_scale(float clip_grad, double grad_norm);
/* The factor of a step under a loss scale: opt_clip_scale's (of the true, unscaled norm)
 * times inv_loss_scale where that is > 0. Megatron unscales the gradients, then clips them:
 * with a power-of-two scale (a dynamic one always is) the product is exact, so the step's
 * bits are the same. */
float opt_step_scale(float clip_grad, double grad_norm, float inv_loss_scale);
/* Whether tensor t is one Megatron flags is_embedding_or_output_parameter: the input
 * embedding's and the output layer's weights, which --decoupled-lr trains at its rate. */
bool opt_decoupled_tensor(const gpt_tensor *t);
/* One step at learning rate lr, clipping with the given gradient norm. Refreshes the bf16
 * weight copy. */
void opt_adamw_step(opt_adamw *o, gpt_model *model, double lr, double grad_norm);
/* The same step, and *sum = gpt_weights_checksum(model) of the weights it wrote, hashed
 * as they are written where the backend can (kernels/checksum.h). */
void opt_adamw_step_checksum(opt_adamw *o, gpt_model *model, double lr, double grad_norm, uint64_t *sum);

#endif
