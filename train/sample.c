/* sample.c - temperature sampling with the training forward pass (batch of one). */
#include "train/sample.h"

#include "common/rng.h"

#include <math.h>
#include <stdlib.h>

int sample_extend(gpt_model *m, int32_t *tokens, int n, int max_len, int max_new, int max_context,
                  float temperature, int32_t stop, uint64_t seed) {
    const gpt_config *c = gpt_get_config(m);
    co_rng r;
    co_rng_seed(&r, seed);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)max_context);
    float *mask = malloc(sizeof(float) * (size_t)max_context);
    double *p = malloc(sizeof(double) * (size_t)c->vocab);
    if (!pos || !mask || !p) goto out;
    for (int i = 0; i < max_context; i++) {
        pos[i] = i;
        mask[i] = 0;
    }
    for (int k = 0; k < max_new && n < max_len; k++) {
        int start = n > max_context ? n - max_context : 0, T = n - start;
        gpt_batch b = {.B = 1, .T = T, .tokens = tokens + start, .targets = tokens + start, .positions = pos,
                       .seg = NULL, .loss_mask = mask};
        gpt_forward(m, &b, false, 0, NULL, NULL);
        const float *logits = gpt_last_logits(m, 0, T - 1);
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < c->vocab; v++) mx = fmax(mx, logits[v] / temperature);
        for (int v = 0; v < c->vocab; v++) sum += (p[v] = exp(logits[v] / temperature - mx));
        double u = co_rng_uniform(&r) * sum, acc = 0;
        int pick = c->vocab - 1;
        for (int v = 0; v < c->vocab; v++) {
            acc += p[v];
            if (u < acc) { pick = v; break; }
        }
        tokens[n++] = pick;
        if (pick == stop) break;
    }
out:
    free(pos);
    free(mask);
    free(p);
    return n;
}
