/* gpt.h - the GPT decoder: parameter layout, forward and backward over a kb_backend.
 *
 * All parameters live in one flat fp32 buffer and all gradients in another with the same
 * layout (gpt_tensor gives each tensor's name, shape and offset), so the optimizer, the
 * gradient all-reduce and checkpoints are single flat operations. Activations for one
 * micro batch are allocated once at the largest batch shape and reused.
 *
 * Shapes: B micro batch, T sequence, C hidden, L layers, NH query heads, NKV key/value
 * groups, HD head dimension, F MLP hidden, Vp padded vocabulary, N = B*T.
 *
 * Tensor parallelism (tp > 1, Megatron's layers, parallelism-facts.md §1): rank r of the
 * tensor group holds a slice of every split tensor and computes its part of each layer:
 *   column-parallel (split output rows, no communication forward, input gradient summed
 *     over the group): attention.qkv (NH/tp query heads and NKV/tp groups; with NKV < tp
 *     the one group its heads use, held by tp/NKV ranks), mlp.fc1 (F/tp rows of the gate
 *     and of the up half separately under SwiGLU), output_layer (Vp/tp vocabulary rows);
 *   row-parallel (split input columns, output summed over the group, bias after the sum):
 *     attention.proj, mlp.fc2;
 *   vocabulary-parallel: the word embedding (rows [r Vp/tp, (r+1) Vp/tp), other ids give
 *     zero rows, summed over the group) and the cross-entropy (max, target logit and sum of
 *     exponentials reduced over the group; no rank holds full-vocabulary logits);
 *   replicated: norms, position embedding, row-parallel biases.
 * With sequence_parallel the token-wise part (norms, dropout, residual) runs on this rank's
 * N/tp rows (contiguous in the [B*T] token order): all-gather before a column-parallel
 * layer, reduce-scatter after a row-parallel one, and the replicated parameters' gradients
 * are partial per rank (summed by gpt_tp_finalize_grads). A MoE layer (sequence
 * parallelism required) keeps its router and shared expert whole on every rank, run over this
 * rank's N/tp tokens (moe_set_sequence_group: aux counts summed over the group, z coefficient
 * / tp), their gradients partial per rank like the norms'; its experts are whole there too
 * (Megatron's expert tensor-parallel size 1, moe.etp_size 1: partial gradients) or split over
 * the tensor group (moe.etp_size = tp: each expert's fc1 rows and fc2 columns are split
 * tensors like the dense MLP's, the tokens exchanged over the group given by
 * gpt_set_expert_group, the slices' gradients whole). Dropout inside the tensor region
 * (attention probabilities of this rank's heads) is keyed by seed + 2718 + r, as Megatron's
 * tensor-parallel RNG; dropout on the hidden state by the global element index, so tp and
 * sequence parallelism draw the same masks as one rank. A collective that fails records its
 * error in the backend's sticky status (kb_backend_status). */
#ifndef COHORT_MODEL_GPT_H
#define COHORT_MODEL_GPT_H

#include "kernels/backend.h"
#include "model/moe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Pipeline parallelism: a model chunk is a run of consecutive layers (global indices
 * [layer0, layer0 + nlayers)) that one pipeline stage (or virtual stage) computes; the chunk
 * with the embedding reads tokens, the one with the head (final norm, output layer, loss)
 * computes the loss, every other chunk takes its input from the previous stage and hands its
 * output to the next. slots: micro batches in flight in it at once (activation sets; the
 * pipeline schedule's most forwards not yet matched by their backward). */
#define GPT_MAX_CHUNKS 8
#define GPT_MOE_LIST_MAX 1024 /* layers a --moe-layer-freq list can name (CO_MAX_LAYERS) */
typedef struct gpt_chunk {
    int layer0, nlayers;
    bool embedding, head;
    int slots;
    /* multi-token prediction placed on a stage before the loss's (the layout's m before L,
     * docs/mtp.md; Megatron's MTP stage):
     *   mtp:    this chunk runs the MTP depths after its layers and the final norm, and in
     *           training hands on 1 + D streams of [Nl,C]: the final norm's output, then
     *           each depth's output (Megatron's hidden states concatenated along the
     *           sequence); it holds a copy of the word embedding (the embedding group);
     *   mtp_in: the depths ran on an earlier stage: in training this chunk's input (its
     *           output too, without the head) is those 1 + D streams, and the head computes
     *           the depths' losses from them, without a final norm of its own.
     * The head with neither (and mtp_layers > 0) runs the depths itself. */
    bool mtp, mtp_in;
} gpt_chunk;

/* Activation recomputation, as Megatron's --recompute-* flags (docs/memory.md). Full: whole
 * layers are recomputed in the backward from a kept input, their activations in one scratch
 * set per layer of a group instead of one per micro batch in flight; uniform: groups of
 * num_layers consecutive layers of a chunk, each group's input kept; block: the first
 * num_layers layers of each chunk, each its own group, the rest kept whole. distribute (tp > 1,
 * no sequence parallelism): each kept input other than a chunk's first is held as this rank's
 * N/tp rows and all-gathered before its recomputation. Selective: the modules' outputs are
 * recomputed in the layer's backward (core_attn: attention's output and log-sum-exp from the
 * kept qkv; layernorm: the two norms' outputs from their inputs; mlp: a dense layer's fc1 and
 * activation from the norm's output; moe: a MoE layer's whole forward). Recomputation runs
 * the same kernels in the same order on the same inputs, and dropout is keyed by (seed,
 * layer, element), so gradients are bitwise those of the run that keeps everything. */
enum { GPT_RC_NONE = 0, GPT_RC_UNIFORM = 1, GPT_RC_BLOCK = 2 };
enum { GPT_RC_CORE_ATTN = 1u, GPT_RC_LAYERNORM = 2u, GPT_RC_MLP = 4u, GPT_RC_MOE = 8u };
typedef struct gpt_recompute {
    int full;           /* GPT_RC_NONE, GPT_RC_UNIFORM or GPT_RC_BLOCK */
    int num_layers;     /* full: the group size (uniform) or recomputed layers per chunk (block) */
    unsigned modules;   /* selective: GPT_RC_* bits */
    bool distribute;    /* full, tp > 1 without sequence parallelism */
} gpt_recompute;

typedef struct gpt_config {
    int num_layers;       /* L */
    int hidden;           /* C */
    int heads;            /* NH */
    int kv_groups;        /* NKV */
    int head_dim;         /* HD */
    int ffn_hidden;       /* F */
    int vocab;            /* tokenizer vocabulary */
    int padded_vocab;     /* Vp: vocab rounded up to a multiple of make_vocab_size_divisible_by */
    int max_positions;    /* learned position table rows */
    bool rope;            /* rope instead of learned absolute positions */
    float rotary_base;
    bool rmsnorm;         /* RMSNorm instead of LayerNorm */
    /* Megatron's --apply-layernorm-1p (zero-centred norm weights): every norm's weight is
     * stored as w - 1, initialised to 0, and the norm's output is norm(x) * (1 + w) */
    bool norm_1p;
    float norm_eps;
    bool swiglu;
    bool tied;            /* LM head shares the token embedding */
    bool bias;            /* biases in linear layers */
    float init_std;
    float hidden_dropout, attention_dropout;
    int tp, tp_rank;      /* tensor-parallel size (0 or 1: none) and this rank in the group */
    bool sequence_parallel;
    /* context parallelism (cp > 1, docs/context-parallel.md): this rank holds B x T local
     * tokens of sequences of T*cp tokens (the load-balanced split, or the per-document split
     * of packed sequences); attention runs as a ring over the context group
     * (model/ring_attention.h, gpt_set_context_group), everything else per token */
    int cp, cp_rank;
    /* the per-document split (THD): gpt_batch.rows marks padding rows (-1), which the MoE
     * layers route to no expert and leave out of their statistics (moe_set_padding) */
    bool cp_thd;
    /* the chunks this rank holds, in the order of their layers (nchunks 0: one chunk of all
     * layers with the embedding and the head, one slot: no pipelining) */
    int nchunks;
    gpt_chunk chunks[GPT_MAX_CHUNKS];
    /* mixture of experts (model/moe.h; moe.num_experts 0: a dense model): the MLP of every
     * moe_layer_freq-th layer (layer l with l % moe_layer_freq == 0, Megatron's
     * --moe-layer-freq N) is a MoE layer of moe.num_experts experts of moe.ffn_hidden;
     * moe.hidden and moe.swiglu are the model's. Experts are tensors of their own, named by
     * global expert index ("layers.L.mlp.experts.E.fc1.weight"), so a checkpoint reshards
     * across expert-parallel sizes by name; with moe.ep_size > 1 this rank holds experts
     * [ep_rank * E/ep, (ep_rank + 1) * E/ep); with moe.etp_size = tp > 1 its tensor rank's
     * slice of each (the expert tensor-parallel size must be 1 or tp). Not with bf16 yet. */
    moe_config moe;
    int moe_layer_freq;
    /* Megatron's list form of --moe-layer-freq: bit l of moe_list set for a MoE layer l
     * (moe_listed; layers up to GPT_MOE_LIST_MAX), in place of moe_layer_freq */
    bool moe_listed;
    uint64_t moe_list[GPT_MOE_LIST_MAX / 64];
    int ep_rank;
    /* multi-token prediction (Megatron's --mtp-num-layers D, --mtp-loss-scaling-factor):
     * on the head chunk, D depths each predict one token further (docs/mtp.md); 0: none */
    int mtp_layers;
    float mtp_loss_scaling;
    /* activation recomputation (docs/memory.md) */
    gpt_recompute recompute;
} gpt_config;
#define GPT_MAX_MTP 8

/* How the tensor group splits a tensor: not at all (every rank holds it whole), along its
 * rows (dimension 0) or its columns (dimension 1). */
typedef enum { GPT_TP_REPLICATED = 0, GPT_TP_ROWS = 1, GPT_TP_COLS = 2 } gpt_tp_split;

/* One contiguous run of this rank's slice along the split dimension: local index, global
 * index, length, and how many ranks of the tensor group hold the same run (1: this rank
 * alone; tp: all of them). */
typedef struct gpt_piece {
    int local, global, len, share;
} gpt_piece;

typedef struct gpt_tensor {
    char name[64];        /* global name, e.g. "layers.3.attn.qkv.weight" */
    int ndim;
    int shape[2];         /* this rank's shape (the global one at tp 1) */
    size_t offset, numel; /* in floats, into the flat buffers */
    int gshape[2];        /* the global shape: the tensor at tp 1 */
    int split;            /* gpt_tp_split */
    int npieces;          /* this rank's slice: runs of the split dimension (of rows when */
    gpt_piece piece[3];   /*   replicated: one run of every row, share tp) */
    bool partial_grad;    /* replicated, but each rank's gradient is a part (sequence
                           * parallelism): gpt_tp_finalize_grads sums it over the group */
    bool emb_copy;        /* the head's copy of the tied word embedding on a stage without the
                           * embedding (pipeline parallelism): kept equal to the first stage's by
                           * summing their gradients over the embedding group; the first stage's
                           * is the one saved and counted in the gradient norm */
    bool decay;           /* weight decay applies (weight matrices and embeddings) */
    bool packed;          /* follows the previous tensor with no gap: a MoE layer's block of
                           * router, experts and shared expert is one unpadded run in moe.h's
                           * layout; a relayout (gpt_relayout) keeps the run whole */
    int packed_run;       /* the index of the first tensor of its run (-1: none) */
    bool expert;          /* a MoE expert's weight ("layers.L.mlp.experts.E.*"): under expert
                           * parallelism held by one expert rank, its gradient reduced over the
                           * expert-data-parallel group only */
    float init_std;       /* 0: ones (norm weights) or zeros (biases), see init_ones */
    bool init_ones;
} gpt_tensor;

/* What one micro batch gives the model. Arrays are [B*T]. */
typedef struct gpt_batch {
    int B, T;
    const int32_t *tokens;
    const int32_t *targets;
    const int32_t *positions;
    const int32_t *seg;   /* first position of each token's document, or NULL */
    const float *loss_mask;
    /* context parallelism: each local token's row in the whole micro batch (b * seq + its
     * position there; -1 for padding), or NULL: the tokens are the whole micro batch. Hidden
     * dropout is keyed by it, so a context-parallel run draws the masks of one rank. */
    const int32_t *rows;
    /* context parallelism with multi-token prediction: the whole micro batch's arrays (B x
     * full_T tokens, in rows' numbering), from which the depths roll their tokens, positions,
     * labels and mask across the context ranks' chunks; NULL otherwise */
    const int32_t *full_tokens, *full_targets, *full_positions;
    const float *full_mask;
    int full_T;
} gpt_batch;

typedef struct gpt_model gpt_model;

/* Padded vocabulary size as Megatron computes it (pass divisible_by x tp under tensor
 * parallelism). */
int gpt_padded_vocab(int vocab, int divisible_by);

/* Whether cfg can be split over its tensor group: 0, or CO_EINVAL with co_err_detail()
 * naming what does not divide (heads, query groups, ffn, vocabulary, sequence under
 * sequence parallelism when max_T > 0). */
int gpt_tp_check(const gpt_config *cfg, int max_T);

/* Creates the model for micro batches of at most max_B x max_T tokens. Parameters and
 * gradients are allocated (gradients zeroed) but not initialised: call gpt_init. */
int gpt_new(gpt_model **out, const gpt_config *cfg, kb_backend *be, int max_B, int max_T);
void gpt_destroy(gpt_model **m);

struct cm_comm;
/* The tensor group's communicator (cfg.tp ranks, this one cfg.tp_rank); required before
 * the first forward when tp > 1, NULL at tp 1. Collectives wait at most timeout_ms. */
void gpt_set_tensor_group(gpt_model *m, struct cm_comm *tp, int timeout_ms);
/* fn(ctx, layer) after the backward of each decoder layer (global index), its weight
 * gradients written (the backend synced): the gradient reduction's overlap starts buckets
 * whose gradients are final. NULL: none. */
void gpt_set_backward_hook(gpt_model *m, void (*fn)(void *ctx, int layer), void *ctx);
/* fn(ctx, layer) in a chunk's forward before it reads the weights of: the embedding (layer
 * -1, before anything else), decoder layer `layer` (global index), everything after the
 * decoder layers (layer = GPT_HOOK_AFTER_LAYERS: final norm, head, MTP): the overlapped
 * parameter all-gather waits there for the buckets holding them. NULL: none. */
#define GPT_HOOK_AFTER_LAYERS (1 << 30)
void gpt_set_forward_hook(gpt_model *m, void (*fn)(void *ctx, int layer), void *ctx);

/* The context group's communicator (cfg.cp ranks, this one cfg.cp_rank; the ring is its
 * ranks in order); required before the first forward when cp > 1. Each ring shift waits at
 * most timeout_ms. The batch's seg[] (or NULL: plain causal) is then a document id per local
 * token (ring_attention.h's doc). */
void gpt_set_context_group(gpt_model *m, struct cm_comm *cp, int timeout_ms);
/* With MoE layers under tensor (sequence) and context parallelism together: the tensor x
 * context group (Megatron's tp_cp, tensor ranks fastest), over which the MoE layers' aux
 * losses count their tokens (model/moe.h moe_set_token_group). After the two above (each of
 * which sets the MoE layers' group to its own when the other size is 1). */
void gpt_set_moe_token_group(gpt_model *m, struct cm_comm *tpcp, int timeout_ms);
/* --moe-router-load-balancing-type global_aux_loss: every MoE layer's data-parallel group
 * (moe_set_global_group; a layer's micro batch slots share one running sum), and the reset of
 * those sums before each step (gpt_cp.c) */
void gpt_set_moe_global_group(gpt_model *m, struct cm_comm *dp, int timeout_ms);
void gpt_moe_global_reset(gpt_model *m);

/* Whether backward sums a column-parallel layer's input gradient over the group on a
 * helper thread while it computes the weight gradient (on by default; the results are the
 * same bits either way). */
void gpt_tp_set_overlap(gpt_model *m, bool on);

/* Whether the caller moves a pipeline chunk's output and its input's gradient on the device
 * in stream order (train/pipeline.c over NCCL): gpt_chunk_forward of a chunk without the
 * head and gpt_chunk_backward then return without waiting for the device, and the caller
 * syncs the backend before the host reads gradients. Off by default (a host send needs
 * the data written). */
void gpt_set_device_pipeline(gpt_model *m, bool on);

/* The sum of squares of the gradients this rank accounts for in the group's norm: its
 * slices, and the runs several ranks hold only on the first of them (replicated tensors on
 * rank 0), so the group's sum is the norm's square of the whole model's gradient. At tp 1
 * every gradient. */
double gpt_tp_grad_sumsq(gpt_model *m);
/* The same without the experts' tensors, whose sum of squares (every one this rank holds)
 * goes into *experts (expert parallelism: each expert rank holds its own). */
double gpt_tp_grad_sumsq_split(gpt_model *m, double *experts);

/* The tensor table of rank cfg->tp_rank of a tensor group of cfg->tp, as gpt_new builds it
 * (names, global and local shapes, each split tensor's pieces, offsets into the flat
 * buffers; *nparams, may be NULL, their total), without allocating any buffer: what a
 * checkpoint needs to know which slice each tensor rank holds. Free *out with free().
 * CO_EINVAL (with the detail) if cfg does not split over its group. */
int gpt_tensor_table(const gpt_config *cfg, gpt_tensor **out, int *n, size_t *nparams);

/* Whether the tensor of this global name has a row per padded-vocabulary id (the word
 * embedding and the output layer, and so their optimizer moments under the same name). */
bool gpt_tensor_is_vocab(const char *name);

/* This rank's slice of a tensor: local[t->numel] from global[gshape[0] x gshape[1]]. */
void gpt_tensor_take_slice(const gpt_tensor *t, const float *global, float *local);

/* After the last backward of a step (tp > 1): sums over the tensor group the gradients
 * that are partial per rank (sequence-parallel norms and biases; key/value rows that
 * several ranks hold when NKV < tp). Returns 0 or the collective's error. */
int gpt_tp_finalize_grads(gpt_model *m);

/* The tensor group's collectives since the last call (then reset): seconds spent in them,
 * their bandwidth-optimal volume sent per rank (ring all-reduce 2 (p-1)/p n, all-gather and
 * reduce-scatter (p-1) x the shard), and how many. */
typedef struct gpt_tp_stats {
    double comm_s;
    uint64_t analytic_bytes, calls;
} gpt_tp_stats;
void gpt_tp_stats_take(gpt_model *m, gpt_tp_stats *out);

/* Megatron's initialisation: normal(0, init_std) for weights and embeddings, output
 * projections (attention proj, MLP fc2) normal(0, init_std / sqrt(2 L)), biases 0, norm
 * weights 1; drawn from a generator seeded with seed. Under tensor parallelism every rank
 * draws the global tensors as one rank would and keeps its slice (Megatron's
 * --use-cpu-initialization), so a tp run starts from the weights of the tp 1 run. */
void gpt_init(gpt_model *m, uint64_t seed);

size_t gpt_num_params(const gpt_model *m);
/* The activation memory this rank allocated, in bytes: every micro batch's saved activations
 * and the recomputation's scratch (a MoE layer's own state not counted); *layers (NULL: not
 * wanted) the transformer layers' share of the saved ones, *scratch the recomputation's. */
size_t gpt_activation_bytes(const gpt_model *m, size_t *layers, size_t *scratch);
float *gpt_params(gpt_model *m);
float *gpt_grads(gpt_model *m);
int gpt_num_tensors(const gpt_model *m);
const gpt_tensor *gpt_tensors(const gpt_model *m);
const gpt_config *gpt_get_config(const gpt_model *m);
kb_backend *gpt_backend(gpt_model *m);

/* Refreshes the bf16 copy of the weights (after every optimizer step in bf16 mode). */
void gpt_sync_bf16(gpt_model *m);
/* The same for elements [lo, lo + n) of the flat buffer only (a bucket just gathered). */
void gpt_sync_bf16_range(gpt_model *m, size_t lo, size_t n);
/* The bf16 working copy of the weights the forward and backward read in bf16 mode
 * (gpt_num_params elements of 2 bytes), or NULL in fp32 mode. */
const void *gpt_params_bf16(const gpt_model *m);
/* The weights' checksum data-parallel replicas compare (kernels/checksum.h): the XOR over
 * the tensors of kb_checksum_f32 of each with seed GPT_SUM_SEED(its index), XOR in bf16
 * mode the XXH3 of the bf16 copy (gpt_weights_checksum16, 0 in fp32 mode). Host memory. */
#define GPT_SUM_SEED(i) (((uint64_t)(i) + 1) << 40)
uint64_t gpt_weights_checksum(gpt_model *m);
uint64_t gpt_weights_checksum32(gpt_model *m);
uint64_t gpt_weights_checksum16(gpt_model *m);

/* ---- pipeline stages: one chunk at a time ----
 * A micro batch goes through a chunk's forward into activation slot s (0 <= s < its slots)
 * and later its backward from the same slot. Dropout is keyed by the global layer index, so
 * a pipelined model draws the masks of the unpipelined one.
 *   before the forward of a chunk without the embedding: the previous stage's output into
 *     gpt_chunk_input(m, c, s) [S, Nl, C] (Nl = B*T, or B*T/tp under sequence parallelism;
 *     S = gpt_chunk_streams(m, c, false, train), 1 but after MTP depths on an earlier stage);
 *   after the forward of a chunk without the head: gpt_chunk_output(m, c, s) [S, Nl, C] for
 *     the next stage (S = gpt_chunk_streams(m, c, true, train));
 *   before the backward of a chunk without the head: the next stage's gradient of that
 *     output into gpt_chunk_output_grad(m) [S, Nl, C];
 *   after the backward of a chunk without the embedding: gpt_chunk_input_grad(m) [S, Nl, C]
 *     for the previous stage (valid until the next backward).
 * The batch gives B, T, positions and document starts to every chunk, tokens to the one with
 * the embedding and the one running MTP depths, targets and loss mask to the one with the
 * head (and the MTP one). gpt_chunk_forward returns
 * the masked loss sum on the head chunk (with dscale; as gpt_forward), 0 elsewhere. */
int gpt_num_chunks(const gpt_model *m);
const gpt_chunk *gpt_chunk_def(const gpt_model *m, int c);
/* How many [Nl,C] streams chunk c's output (output true) or input carries: 1 + mtp_layers
 * in a training step after the MTP depths ran on a stage before the loss's (gpt_chunk.mtp,
 * .mtp_in), else 1. Both ends of a pipeline link agree on it; its gradient has as many. */
int gpt_chunk_streams(const gpt_model *m, int c, bool output, bool train);
float *gpt_chunk_input(gpt_model *m, int c, int s);
const float *gpt_chunk_output(const gpt_model *m, int c, int s);
float *gpt_chunk_output_grad(gpt_model *m);
const float *gpt_chunk_input_grad(const gpt_model *m);
double gpt_chunk_forward(gpt_model *m, int c, int s, const gpt_batch *b, bool train, uint64_t dropout_seed,
                         const float *dscale, float *losses);
void gpt_chunk_backward(gpt_model *m, int c, int s, const gpt_batch *b, uint64_t dropout_seed);
/* The tensor index of the word embedding when it must be summed over the embedding group
 * after backward (pipeline parallelism: the first stage's and the copies of the last stage,
 * with tied embeddings, and of the stage running the MTP depths), else -1. */
int gpt_tied_embedding(const gpt_model *m);

/* Forward pass for one micro batch (no pipelining: one chunk with the embedding and the
 * head). train: dropout on (keyed by dropout_seed) and the
 * activations kept for backward. dscale[B*T] gives each token's weight in the gradient of
 * the logits (loss_mask / tokens / micro batches; zeros for evaluation). Writes the
 * per-token loss (unmasked) into losses[B*T] if not NULL and returns sum(losses *
 * loss_mask). With dscale == NULL no loss is computed (returns 0) and the logits stay
 * readable through gpt_last_logits (sampling). */
double gpt_forward(gpt_model *m, const gpt_batch *b, bool train, uint64_t dropout_seed,
                   const float *dscale, float *losses);
/* Backward pass of the last training forward; accumulates into the gradients. */
void gpt_backward(gpt_model *m, const gpt_batch *b, uint64_t dropout_seed);
/* Zeroes the gradient buffer. */
void gpt_zero_grad(gpt_model *m);
/* Before gpt_init: puts every tensor i at offsets[i] (a multiple of 16) of new flat
 * parameter, gradient (and bf16) buffers of `total` elements, zero (the old buffers are
 * freed first, their contents not kept, so memory never holds both): the distributed
 * optimizer's bucketed layout (optim/dist_opt.h) becomes the model's own, with no second
 * copy. On failure the model is unusable (destroy it). */
int gpt_relayout(gpt_model *m, const size_t *offsets, size_t total);
/* Fault injection: the next forward flips bit `bit` of element index (mod B*T*C) of the
 * final norm's output, the activation the output layer reads (resilience/inject.h). An
 * earlier one is mostly normalised away by the next LayerNorm: silent, but harmless. */
void gpt_inject_act_flip(gpt_model *m, size_t index, int bit);

/* Logits of position t of sequence b after a forward with dscale = NULL: Vp floats, valid
 * until the next forward. NULL under tensor parallelism (each rank holds Vp/tp). */
const float *gpt_last_logits(gpt_model *m, int b, int t);

/* ---- mixture of experts ----
 * Whether layer l is a MoE layer. */
bool gpt_layer_is_moe(const gpt_config *c, int l);
/* The weight of the auxiliary losses in the gradient: the MoE layers' aux and z losses
 * (Megatron's MoEAuxLossAutoScaler) and the MTP depths' losses (MTPLossAutoScaler), as the
 * main loss's backward scale: 1 / micro batches per step (1 until set). */
void gpt_set_aux_loss_scale(gpt_model *m, float scale);
/* --calculate-per-token-loss's MTP weight (Megatron's process_mtp_loss): depth k's tokens
 * weigh scale / D * (the micro batch's loss tokens / depth k's) * w, w the main loss's token
 * weight, instead of scale / D / (depth k's tokens) * the auxiliary-loss weight; w < 0 (the
 * default): per micro batch. */
void gpt_set_mtp_token_weight(gpt_model *m, float w);
/* The expert-parallel group and dispatcher for every MoE layer: moe.ep_size ranks (this one
 * at ep_rank), or with moe.etp_size > 1 the expert-tensor x expert group of etp_size x ep_size
 * (the tensor group at ep_size 1); required before the first forward when either is > 1. */
int gpt_set_expert_group(gpt_model *m, struct cm_comm *ep, moe_dispatcher d, int timeout_ms);
/* Sums since the last call (then reset), over the MoE layers' training forwards: the
 * load-balancing loss divided by its coefficient and the z loss divided by its (Megatron
 * logs them so: "load_balancing_loss", "z_loss"), the forwards counted and the tokens
 * dropped; and into tpe[num_layers * E] (may be NULL) the tokens each expert of each layer
 * computed (rows of dense layers and of other stages' layers stay 0). Under sequence
 * parallelism each of them is this rank's: its part of the load-balancing loss (the tensor
 * group's sum is one rank's), the mean z loss over its tokens (the group's mean is one
 * rank's: Megatron's tracker averages it over tensor x data), its tokens' counts. */
typedef struct gpt_moe_stats {
    double lb_loss, z_loss;
    int64_t forwards;
    int64_t dropped;
} gpt_moe_stats;
void gpt_moe_stats_take(gpt_model *m, gpt_moe_stats *out, int64_t *tpe);
/* The same sums without resetting them (what the validator's report shows), and the MTP
 * depths' (gpt_mtp_stats_take's) likewise. */
void gpt_moe_stats_peek(const gpt_model *m, gpt_moe_stats *out);
void gpt_mtp_stats_peek(const gpt_model *m, double *loss_sums, int64_t *forwards);
/* Expert parallelism's counters over every MoE layer of this rank since the model was made:
 * bytes sent to the expert group and seconds in dispatch and combine (moe_ep_bytes_sent,
 * moe_ep_dispatch_seconds). */
void gpt_moe_ep_counters(const gpt_model *m, uint64_t *bytes, double *seconds);
/* Layer l's expert bias [E] (host-visible parameter memory; no gradient: its caller moves it
 * with moe_expert_bias_update before the optimizer step), or NULL (not a MoE layer of this
 * rank, or no expert bias). */
float *gpt_moe_expert_bias(gpt_model *m, int l);

/* ---- multi-token prediction ----
 * The masked mean loss of each MTP depth in the last training forward (losses[mtp_layers]). */
void gpt_mtp_last_losses(const gpt_model *m, double *losses);
/* Sums since the last call (then reset) of each depth's masked mean loss over the training
 * forwards of the head chunk, and their count. */
void gpt_mtp_stats_take(gpt_model *m, double *loss_sums, int64_t *forwards);

/* Model FLOPs of one sample of seq_len tokens, forward + backward, by Megatron's formula
 * (num_floating_point_operations / batch). */
double gpt_flops_per_sample(const gpt_config *c, int seq_len);

#endif
