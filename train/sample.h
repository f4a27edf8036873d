/* sample.h - text generation from a trained model, for showing that it learned.
 * Seeded: the same model, prompt and seed give the same text. */
#ifndef COHORT_TRAIN_SAMPLE_H
#define COHORT_TRAIN_SAMPLE_H

#include "model/gpt.h"

#include <stdint.h>

/* Extends tokens[0..n) (n >= 1) up to max_len tokens, at most max_new new ones, sampling
 * with temperature from the model's distribution over the real vocabulary (padding
 * excluded); stops early after a token equal to stop (pass -1 for none). The context is
 * the last max_context tokens. Returns the new length. */
int sample_extend(gpt_model *m, int32_t *tokens, int n, int max_len, int max_new, int max_context,
                  float temperature, int32_t stop, uint64_t seed);

#endif
