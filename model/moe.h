/* moe.h - Megatron's mixture-of-experts MLP on one rank: router, load-balancing and z
 * losses, capacity and token dropping, E expert MLPs computed as one product per expert
 * over the tokens routed to it, an optional shared expert; forward and backward over a
 * kb_backend. Not yet used by the trainer (docs/moe.md).
 *
 * Shapes: N tokens (B sequences of T consecutive tokens, cohort's [B*T] order), h hidden,
 * E experts, k router top-k, F an expert's intermediate size (F1 = 2F under SwiGLU, else
 * F), Fs the shared expert's (Fs1 likewise), M rows routed to experts (sum over experts of
 * the tokens each computes).
 *
 * What it computes (Megatron core's router.py / moe_utils.py, parallelism-facts.md §5):
 *   logits[N,E] = x[N,h] Wr[E,h]^T                                (no bias)
 *   z_loss = z_coeff * mean_n logsumexp(logits[n])^2
 *   selection (per token, ties broken by the LOWER expert index, see below):
 *     softmax:              idx = topk(logits); probs = softmax over the k selected logits
 *     softmax, pre_softmax: s = softmax(logits) over E; idx = topk(s); probs = s[idx]
 *     sigmoid:              s = sigmoid(logits); idx = topk(s + expert_bias);
 *                           probs = s[idx], / (sum of the k + 1e-20) when k > 1
 *     group-limited (num_groups G > 0): experts in G contiguous groups; a group's score is
 *       the sum of its top k/group_topk selection scores; only the group_topk best groups
 *       are eligible for the top-k
 *     probs *= scaling_factor (when > 0)
 *   capacity (capacity_factor > 0): cap = ceil(N*k/E * factor), at most N; per expert the
 *     cap tokens with the largest routing prob (drop policy probs) or the first cap tokens
 *     routed to it (position); with pad_to_capacity every expert computes exactly cap
 *     tokens, those not routed to it with prob 0
 *   y[n] = sum over kept (n,e) of probs[n,e] * MLP_e(x[n])  (+ MLP_shared(x[n]))
 *     MLP(x) = act(x W1^T) W2^T, act gelu (tanh) or swiglu ([a|g] -> silu(a) g), no biases
 *     (Megatron's experts under --disable-bias-linear; its GroupedMLP has none)
 *   aux losses (Megatron's compute_routing_scores_for_aux_loss): scores a[N,E] = softmax of
 *     the logits, or sigmoid normalised over all E (+1e-20); counts c[e] from the plain
 *     top-k of a (no groups, no bias, no dropping):
 *     aux_loss:     aux_coeff * E/(k N^2) * sum_e (sum_n a[n,e]) c[e]
 *     seq_aux_loss: aux_coeff / B * sum_b E/(k T^2) * sum_e (sum_{n in b} a[n,e]) c_b[e]
 *   Both losses' gradients flow into the router weights in moe_backward, scaled by the
 *   caller's loss_scale (Megatron's MoEAuxLossAutoScaler).
 * Ties: every top-k (experts, groups, tokens under a capacity) takes larger values first
 * and, among equal values, the lower index first (torch.topk leaves this unspecified).
 *
 * Parameters live in one flat buffer (moe_offsets), gradients in another of the same
 * layout; the expert bias is not a parameter (Megatron's buffer, updated from the token
 * counts by moe_expert_bias_update). Routing runs on the host over backend memory (a sync
 * before it reads the logits); matrix products and activations go through the backend.
 * Every operation is deterministic: the same inputs and thread count give the same bits. */
#ifndef COHORT_MODEL_MOE_H
#define COHORT_MODEL_MOE_H

#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { MOE_SCORE_SOFTMAX = 0, MOE_SCORE_SIGMOID = 1 } moe_score_fn;
typedef enum { MOE_LB_NONE = 0, MOE_LB_AUX = 1, MOE_LB_SEQ_AUX = 2 } moe_lb_type;
typedef enum { MOE_DROP_PROBS = 0, MOE_DROP_POSITION = 1 } moe_drop_policy;

typedef struct moe_config {
    int hidden;              /* h */
    int num_experts;         /* E */
    int ffn_hidden;          /* F: each expert's intermediate size (--moe-ffn-hidden-size) */
    int topk;                /* k (--moe-router-topk) */
    moe_score_fn score;      /* --moe-router-score-function */
    bool pre_softmax;        /* --moe-router-pre-softmax (softmax only) */
    int num_groups;          /* --moe-router-num-groups (0: no group limit) */
    int group_topk;          /* --moe-router-group-topk */
    float scaling_factor;    /* --moe-router-topk-scaling-factor (0: none) */
    bool expert_bias;        /* --moe-router-enable-expert-bias (sigmoid only, as Megatron) */
    moe_lb_type lb;          /* --moe-router-load-balancing-type */
    float aux_coeff;         /* --moe-aux-loss-coeff */
    float z_coeff;           /* --moe-z-loss-coeff (0: no z-loss) */
    double capacity_factor;  /* --moe-expert-capacity-factor (<= 0: dropless) */
    moe_drop_policy drop;    /* --moe-token-drop-policy */
    bool pad_to_capacity;    /* --moe-pad-expert-input-to-capacity */
    bool swiglu;
    int shared_ffn;          /* Fs: --moe-shared-expert-intermediate-size (0: none) */
} moe_config;

/* Offsets (in floats) of the tensors in the flat parameter buffer. */
typedef struct moe_offsets {
    size_t router;      /* Wr[E,h] */
    size_t fc1;         /* W1[E][F1,h]: expert e's at fc1 + e*F1*h */
    size_t fc2;         /* W2[E][h,F]:  expert e's at fc2 + e*h*F */
    size_t shared_fc1;  /* Ws1[Fs1,h] (absent when shared_ffn is 0) */
    size_t shared_fc2;  /* Ws2[h,Fs] */
    size_t total;
} moe_offsets;

typedef struct moe_layer moe_layer;

/* Checks the configuration (CO_EINVAL naming the setting otherwise) and computes the
 * layout. */
int moe_layout(const moe_config *c, moe_offsets *off);
/* A layer for up to max_tokens tokens per call; buffers in be's memory. Returns 0 or a
 * negative CO_E* code (co_err_detail() says which setting or allocation). */
int moe_new(moe_layer **out, const moe_config *c, kb_backend *be, int max_tokens);
void moe_destroy(moe_layer **m);
const moe_offsets *moe_layer_offsets(const moe_layer *m);
/* Deterministic initialisation of params[total]: normal(0, std) from seed (co_rng). */
void moe_init_params(const moe_layer *m, float *params, float std, uint64_t seed);

/* Forward for x[N,h], N = B*T (B sequences of T tokens, for seq_aux_loss): y[N,h]
 * (overwrites). params: the flat buffer (backend memory); expert_bias[E] (host memory) or
 * NULL (zero bias). Saves what moe_backward needs. Returns 0 or a negative CO_E* code
 * (N above max_tokens; the backend's sticky status). */
int moe_forward(moe_layer *m, float *y, const float *x, const float *params, const float *expert_bias,
                int B, int T);
/* Backward of the last forward: dx[N,h] (OVERWRITES; must not alias dy), dparams
 * (ACCUMULATES, same layout), from dy[N,h]; the aux and z losses contribute loss_scale *
 * their gradient (the weight the caller's objective gives them; 1 for a plain sum). x and
 * params as given to forward, unchanged since. */
int moe_backward(moe_layer *m, float *dx, float *dparams, const float *dy, const float *x, const float *params,
                 float loss_scale);

/* The last forward's values (host memory, valid until the next forward). */
double moe_aux_loss(const moe_layer *m);  /* the load-balancing loss (0 for none) */
double moe_z_loss(const moe_layer *m);    /* 0 when z_coeff is 0 */
/* tokens each expert computes after dropping and padding [E] (Megatron's routing_map.sum(0)) */
const int32_t *moe_tokens_per_expert(const moe_layer *m);
/* the dispatched routing map [N,E] (1: token n is computed by expert e) and the routing
 * probabilities [N,E] (0 where not routed or dropped) */
const uint8_t *moe_routing_map(const moe_layer *m);
const float *moe_routing_probs(const moe_layer *m);
/* tokens dropped by the capacity (routed (n,e) pairs not computed) */
int moe_dropped(const moe_layer *m);
/* the capacity of the last forward (0 when dropless) */
int moe_capacity(const moe_layer *m);

/* Megatron's get_updated_expert_bias: bias[e] += rate * sign(mean(tpe) - tpe[e]). */
void moe_expert_bias_update(float *bias, const int32_t *tokens_per_expert, int E, float rate);

#endif
