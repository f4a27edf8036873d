/* gpt_check.h - the model's part of the configuration's checks: the shapes (layers, hidden
 * sizes, heads and query groups, positions, vocabulary), what tensor parallelism splits,
 * the mixture of experts' and multi-token prediction's flags, and sizes no machine has.
 * The checks add their problems to a co_problems list (common/config.h); train/
 * config_check.c runs them in order. The tensor-parallel rules exist once, here: the
 * configuration's check lists every broken one, gpt_tp_check (gpt.h) returns the first. */
#ifndef COHORT_MODEL_GPT_CHECK_H
#define COHORT_MODEL_GPT_CHECK_H

#include "common/config.h"

#include <stdbool.h>

struct gpt_config;
struct gpt_recompute;

/* The tensor-parallel rules for cfg->tp > 1: heads, query groups (one divides the other),
 * ffn size, padded vocabulary divisible by tp, and the sequence (max_T > 0) under sequence
 * parallelism. With P, every broken rule is added to it and 0 returned; without, the first
 * one is CO_EINVAL with co_err_detail() naming it. */
int gpt_tp_rules(const struct gpt_config *cfg, int max_T, co_problems *P);

/* The mixture of experts' flags (--num-experts and --moe-*), with what they do not combine
 * with. sizes_ok: the parallel sizes are in range. */
void gpt_check_moe(const co_config *c, bool sizes_ok, co_problems *P);
/* Multi-token prediction's flags. */
void gpt_check_mtp(const co_config *c, bool sizes_ok, co_problems *P);
/* --num-layers, --hidden-size, --num-attention-heads and --seq-length given and in range
 * (the sizes the shapes' checks divide by). */
void gpt_check_required(const co_config *c, co_problems *P);
/* Once the sizes above are valid: derives kv channels, query groups, ffn size and maximum
 * positions where not given, checks the shapes, the tensor-parallel split and the
 * vocabulary, then the widths and memory the model would take. */
void gpt_check_shapes(co_config *c, co_problems *P);
/* The model's recomputation (gpt.h gpt_recompute) from --recompute-granularity, -method,
 * -num-layers, -modules, --recompute-activations and --distribute-saved-activations, checked
 * as Megatron checks them (gpt_check_shapes lists every problem); CO_EINVAL with the first
 * problems in co_err_detail() when they do not combine. */
int gpt_recompute_of(const co_config *c, struct gpt_recompute *r);
/* The mixture of experts' configuration from the --num-experts and --moe-* flags (zeroed
 * without experts): the routing, its losses and capacity, the experts' sizes (dense_ffn: the
 * model's MLP size, the experts' without --moe-ffn-hidden-size), --expert-model-parallel-size;
 * the expert tensor-parallel size as given (0: unset, the caller's tensor size). */
struct moe_config;
void gpt_moe_of(const co_config *c, int dense_ffn, struct moe_config *mc);
/* --moe-layer-freq into the model's configuration: the integer, or the list form's layers. */
void gpt_moe_layers_of(const co_config *c, struct gpt_config *m);

#endif
