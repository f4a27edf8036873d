/* moe.h - Megatron's mixture-of-experts MLP on one rank: router, load-balancing and z
 * losses, capacity and token dropping, E expert MLPs computed as one product per expert
 * over the tokens routed to it, an optional shared expert; forward and backward over a
 * kb_backend, with its experts split over an expert-parallel group and each expert over an
 * expert-tensor group (moe_set_expert_group). Under sequence parallelism each tensor rank
 * routes its token shard (moe_set_sequence_group).
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
 * before it reads the logits); matrix products, activations and the token permutations
 * (backend.h gather_rows, combine_rows, combine_backward, from index tables the routing
 * writes) go through the backend, so the tokens themselves never pass through the host.
 * Every operation is deterministic: the same inputs and thread count give the same bits. */
#ifndef COHORT_MODEL_MOE_H
#define COHORT_MODEL_MOE_H

#include "comm/comm.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { MOE_SCORE_SOFTMAX = 0, MOE_SCORE_SIGMOID = 1 } moe_score_fn;
/* MOE_LB_GLOBAL_AUX: Megatron's global_aux_loss (moe_set_global_group); MOE_LB_SINKHORN:
 * Megatron's sinkhorn routing (no aux loss; the score function, pre-softmax, groups, scaling
 * factor and expert bias do not apply): in training the top-k of each token's row of
 * sinkhorn(logits) over this rank's tokens (moe_utils.sinkhorn: exp of the logits balanced
 * by alternating row and column scalings until the columns' mean change is below 1e-4, at
 * most 1000 rounds) chooses the experts, outside training the top-k of the activation; the
 * probabilities are the activation of the chosen, sigmoid at top-1, else the softmax over
 * all experts (not renormalised) */
typedef enum {
    MOE_LB_NONE = 0,
    MOE_LB_AUX = 1,
    MOE_LB_SEQ_AUX = 2,
    MOE_LB_GLOBAL_AUX = 3,
    MOE_LB_SINKHORN = 4
} moe_lb_type;
typedef enum { MOE_DROP_PROBS = 0, MOE_DROP_POSITION = 1 } moe_drop_policy;
/* --moe-token-dispatcher-type: how tokens reach the experts of other ranks */
typedef enum { MOE_DISPATCH_ALLTOALL = 0, MOE_DISPATCH_ALLGATHER = 1 } moe_dispatcher;

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
    bool grouped_gemm;       /* --moe-grouped-gemm: every expert's product in one grouped call
                                (kb_ops.grouped_linear_*; one product per expert where the
                                backend has none) */
    int ep_size;             /* --expert-model-parallel-size (0 or 1: every expert here);
                                the flat buffer then holds E/ep_size experts (moe_set_expert_group) */
    int etp_size;            /* --expert-tensor-parallel-size (0 or 1: each expert whole); > 1:
                                each expert's F split over etp_size ranks (fc1 rows, both SwiGLU
                                halves; fc2 columns): the flat buffer holds F/etp_size of each */
} moe_config;

/* Offsets (in floats) of the tensors in the flat parameter buffer. With ep_size > 1 the
 * experts are this rank's El = E/ep_size (local index j = global expert e0 + j); with
 * etp_size > 1 each holds Fl = F/etp_size of the intermediate size (F1l = 2 Fl under SwiGLU:
 * this rank's rows of the gate half, then of the up half). */
typedef struct moe_offsets {
    size_t router;      /* Wr[E,h] */
    size_t fc1;         /* W1[El][F1l,h]: local expert j's at fc1 + j*F1l*h */
    size_t fc2;         /* W2[El][h,Fl]:  local expert j's at fc2 + j*h*Fl */
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
/* Training or not for the next forwards (sinkhorn routing chooses differently; a new layer
 * trains). */
void moe_set_training(moe_layer *m, bool train);
/* Where the experts' and the shared expert's weights are, in elements from the router's start
 * (the params and dparams the calls take): moe_layout's places by default; the distributed
 * optimizer with expert parallelism lays the experts out apart from the rest (gpt_relayout). */
void moe_set_param_offsets(moe_layer *m, size_t fc1, size_t fc2, size_t shared_fc1, size_t shared_fc2);
/* The 16-bit copies (bf16, or fp16 with --fp16) of the params the next calls take, at the
 * same offsets (the model's per-step copies, made after the optimizer), or NULL: then the
 * experts' 16-bit products convert their weights per call. With copies the experts run one
 * product per expert reading them (what the grouped products do in 16-bit mode). */
void moe_set_params16(moe_layer *m, const kb_bf16 *p16);
/* bf16 input (the model's bf16 activations, gpt_internal.h act16): from now on the x that
 * moe_forward and moe_backward take holds N x h bf16 values (kb_bf16), which each call widens
 * exactly into x32 (backend memory of at least max_tokens x h floats, which other layers may
 * share: it is only used during a call) for the router (fp32 math, as Megatron's
 * --moe-router-dtype fp32), the shared expert and the dispatch. x32 NULL: fp32 input. 0, or
 * CO_EUNSUPPORTED where the backend has no gather_rows_bf16. */
int moe_set_input16(moe_layer *m, float *x32);
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

/* Megatron's global_aux_loss (lb MOE_LB_GLOBAL_AUX): the aux loss with the top-k counts of
 * the global batch so far. Each forward sums this rank's counts over the token group (as
 * aux_loss) and over dp (the data-parallel group, NULL: one replica: Megatron's tp_dp_cp
 * group), adds them to the step's running sum and takes the running mean over the forwards
 * so far (global_tokens_per_expert / ga_steps); the loss is coeff * E / (k T^2) *
 * sum_e (this rank's tokens' summed scores of e) * mean count of e, T = this rank's tokens x
 * token-group size x dp size. share: the layer whose running sum this one adds to (the same
 * model layer in another micro batch slot), NULL: its own. moe_global_aux_reset clears the
 * running sum (Megatron's reset_global_aux_loss_tracker, once per step). Every rank of dp
 * must run the same forwards in the same order. */
int moe_set_global_group(moe_layer *m, struct cm_comm *dp, moe_layer *share, int timeout_ms);
void moe_global_aux_reset(moe_layer *m);

/* ---- expert parallelism (moe_ep.c) ----
 * The layer's experts are split over the group ep (size c.ep_size, Megatron's expert group:
 * ranks that hold different tokens): rank r computes experts [r*El, (r+1)*El), El = E/ep.
 * Every rank routes its own tokens (router weights replicated, capacity and aux losses over
 * its own tokens, as Megatron); then
 *   alltoall:  the counts per (rank, expert) go round in an all-to-all, each rank's rows for
 *              another rank's experts go there (uneven blocks), the owner sorts them by
 *              expert (then source rank, then token), computes, and the outputs come back
 *              the same way; backward sends the output gradients and returns the input
 *              gradients;
 *   allgather: every rank gathers the group's tokens, routing map and probabilities (each
 *              rank must route the same number of tokens), computes its experts over every
 *              token routed to them, and a reduce-scatter sums the partial outputs back to
 *              the tokens' owners; backward gathers dy and reduce-scatters dx and the
 *              routing probabilities' gradient.
 * Expert weight gradients stay on the owner (the caller all-reduces them over the
 * expert-data-parallel group only); the router's are local (all-reduce over data parallel).
 * Every call has timeout_ms (< 0: none; cm_abort ends it) and returns the communicator's
 * error with the step named. With ep NULL (or size 1) the layer computes every expert.
 *
 * Experts split over an expert-tensor group (c.etp_size t > 1, Megatron's
 * --expert-tensor-parallel-size): the group given is the expert-tensor x expert group of
 * t * ep_size ranks, member g = (expert rank g / t, expert-tensor rank g % t) (scheduler/
 * groups.h's "expert-tp-ep", the tensor group itself at ep_size 1). Each member holds F/t of
 * its experts' intermediate size (fc1 column-parallel, fc2 row-parallel). alltoall: a rank's
 * rows for expert rank q go to every one of q's t members (Megatron's all-to-all over the
 * expert group followed by the all-gather over the expert-tensor group, in one exchange);
 * each member computes its partial output over all of them and sends it back, and the rank
 * sums the t partials of each row (the reduce-scatter over the expert-tensor group) in
 * member order. allgather: the gather and the reduce-scatter span the whole group (Megatron:
 * over tp x ep), so the partial outputs, input gradients and probability gradients are
 * summed there. The expert weight gradients are this member's slice's, complete for the
 * group's tokens (not partial: the caller sums them over the expert-data-parallel group
 * only). An etp_size > 1 layer refuses to run without the group. */
int moe_set_expert_group(moe_layer *m, cm_comm *ep, moe_dispatcher d, int timeout_ms);
/* Bytes this rank has sent to its expert group since the layer was made. */
uint64_t moe_ep_bytes_sent(const moe_layer *m);
/* Seconds this rank has spent in dispatch and combine (the exchanges and the sorting of rows,
 * not the experts' products) since the layer was made. */
double moe_ep_dispatch_seconds(const moe_layer *m);
/* The flat buffer of expert-parallel rank `rank` of ep_size from the full (ep 1) buffer of
 * c (c.ep_size ignored; whole experts: c.etp_size ignored too): the router, experts [rank*El, (rank+1)*El), the shared expert.
 * moe_ep_unslice writes them back (the gradients of every rank make the full gradient). */
void moe_ep_slice(const moe_config *c, int ep_size, int rank, const float *full, float *local);
void moe_ep_unslice(const moe_config *c, int ep_size, int rank, const float *local, float *full);

/* ---- sequence parallelism (moe.c) ----
 * Megatron's layout under tensor parallelism with --expert-tensor-parallel-size 1 and
 * sequence parallelism: every rank of the tensor group sq holds the whole router, experts
 * and shared expert and routes and computes its own shard of the micro batch's tokens. With
 * the group set (size s, rank r), moe_forward's B x T is the WHOLE micro batch and x holds
 * this rank's N = B T / s rows [r N, (r+1) N) of it (cohort's [B*T] order). As Megatron's
 * router over its tensor-and-context group: the aux losses' top-k counts are summed over the
 * group (one all-reduce per forward) with the whole batch's token count (seq_aux_loss: per
 * sequence of the whole batch), so each rank's aux loss, and its gradient, is its tokens'
 * part of one rank's (the group's sum is one rank's); the z-loss coefficient is divided by s
 * (each rank's z loss is z_coeff/s times the mean over its tokens). The parameter gradients
 * are this rank's part: the caller sums them over the group (the experts' too at
 * etp_size 1 and ep_size 1; split experts' gradients are this rank's slice's, whole).
 * Refused (CO_EUNSUPPORTED): a capacity (Megatron's is over each rank's tokens and drops
 * other tokens than one rank would). sq NULL or of size 1: one rank. timeout_ms < 0: none. */
int moe_set_sequence_group(moe_layer *m, cm_comm *sq, int timeout_ms);
/* The general form (context parallelism, docs/moe.md "Context parallelism"): sq is the
 * tensor x context group (Megatron's tp_cp group, tensor ranks fastest), of which `shards`
 * (the tensor ranks, 1 without tensor parallelism) split one B x T batch's rows as above;
 * the group's sq->size / shards context ranks hold other tokens of the same sequences (each
 * sequence's T local tokens in rows [b T, (b+1) T) of its B x T batch: the load-balanced
 * split). The aux losses' counts are summed over sq, the token counts are the whole
 * sequences', the z coefficient is divided by sq->size. moe_set_sequence_group(m, sq, t) is
 * moe_set_token_group(m, sq, sq->size, t). */
int moe_set_token_group(moe_layer *m, cm_comm *sq, int shards, int timeout_ms);

/* Padding rows (context parallelism's THD split pads each document to a multiple of 2cp;
 * Megatron's router padding_mask): rows[B*T] gives each row of the next forwards' whole
 * B x T batch (every shard's rows, cohort's order) an id, < 0 for a padding row; NULL (the
 * default): none. The pointer is read by every moe_forward until changed (the forward copies
 * this rank's rows). A padding row is routed to no expert (its routed output 0, no gradient
 * into the router from it), and left out of every statistic: the aux losses' scores, counts
 * and token counts (summed over the token group, and dp for the global aux loss), the
 * z-loss's mean, the tokens per expert (the expert bias's counts), the capacity (computed
 * from this rank's real rows, which alone are candidates) and sinkhorn's balancing; so every
 * value is the one of the same batch without its padding rows. The shared expert still runs
 * on every row (per token, as a dense MLP). With a mask set, each forward sums the real rows
 * over the token group (one more all-reduce), so every rank of the group must set one. */
void moe_set_padding(moe_layer *m, const int32_t *rows);

/* Megatron's get_updated_expert_bias: bias[e] += rate * sign(mean(tpe) - tpe[e]). */
void moe_expert_bias_update(float *bias, const int32_t *tokens_per_expert, int E, float rate);

#endif
