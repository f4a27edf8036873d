/* gpt_infer.h - the GPT decoder's inference forward with a key/value cache: text generation
 * at one position's cost per new token (Megatron's static inference context).
 *
 * A prompt is prefilled in one step (its tokens' keys and values kept for every layer), then
 * each generated token is one more step of one position: its query attends to the cached
 * keys and values of every earlier position. The products go through the backend's
 * operations the training forward uses (linear_forward: bf16 weights in bf16 mode, fp32
 * otherwise; norms, rope, GELU/SwiGLU, the MoE layer with its router per token); only the
 * attention of the new rows over the cache is computed here, in fp32 on the host.
 *
 * For a model on one process: tensor parallelism 1, one chunk with the embedding and the
 * head, no context parallelism, a backend whose memory the host reads (the CPU). The MTP
 * depths, if the model has them, are not run: the main head decides (as Megatron). Dropout
 * is off. The logits of every position equal a full forward's (gpt_forward) up to the
 * products' summation order, except for MoE layers with an expert capacity, whose token
 * dropping depends on the tokens in one call. */
#ifndef COHORT_MODEL_GPT_INFER_H
#define COHORT_MODEL_GPT_INFER_H

#include "model/gpt.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gpt_kv gpt_kv;

/* A cache of at most cap positions for m (which it uses, and whose activation buffers it
 * takes as scratch: no training forward of m while it is in use). A step may hold up to the
 * model's max_T tokens. CO_EINVAL (with the detail) for a model it cannot run (tp > 1,
 * pipeline chunks, context parallelism, CUDA) or cap beyond the learned positions. */
int gpt_kv_new(gpt_kv **out, gpt_model *m, int cap);
void gpt_kv_destroy(gpt_kv **kv);
/* Forgets the cached positions (the next step starts at position 0). */
void gpt_kv_reset(gpt_kv *kv);
/* Positions cached so far. */
int gpt_kv_len(const gpt_kv *kv);

/* Appends tokens[0..n) at positions gpt_kv_len.. and computes their logits: *logits points
 * at [n][padded_vocab] floats (all true) or at the last token's padded_vocab (all false),
 * valid until the next step or a forward of the model. 0, or CO_EINVAL (the cache or a step
 * would overflow, a token id outside the vocabulary), or the backend's error. */
int gpt_kv_step(gpt_kv *kv, const int32_t *tokens, int n, bool all, const float **logits);

#endif
