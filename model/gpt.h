/* gpt.h - the GPT decoder: parameter layout, forward and backward over a kb_backend.
 *
 * All parameters live in one flat fp32 buffer and all gradients in another with the same
 * layout (gpt_tensor gives each tensor's name, shape and offset), so the optimizer, the
 * gradient all-reduce and checkpoints are single flat operations. Activations for one
 * micro batch are allocated once at the largest batch shape and reused.
 *
 * Shapes: B micro batch, T sequence, C hidden, L layers, NH query heads, NKV key/value
 * groups, HD head dimension, F MLP hidden, Vp padded vocabulary, N = B*T. */
#ifndef COHORT_MODEL_GPT_H
#define COHORT_MODEL_GPT_H

#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    float norm_eps;
    bool swiglu;
    bool tied;            /* LM head shares the token embedding */
    bool bias;            /* biases in linear layers */
    float init_std;
    float hidden_dropout, attention_dropout;
} gpt_config;

typedef struct gpt_tensor {
    char name[64];        /* global name, e.g. "layers.3.attn.qkv.weight" */
    int ndim;
    int shape[2];
    size_t offset, numel; /* in floats, into the flat buffers */
    bool decay;           /* weight decay applies (weight matrices and embeddings) */
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
} gpt_batch;

typedef struct gpt_model gpt_model;

/* Padded vocabulary size as Megatron computes it. */
int gpt_padded_vocab(int vocab, int divisible_by);

/* Creates the model for micro batches of at most max_B x max_T tokens. Parameters and
 * gradients are allocated (gradients zeroed) but not initialised: call gpt_init. */
int gpt_new(gpt_model **out, const gpt_config *cfg, kb_backend *be, int max_B, int max_T);
void gpt_destroy(gpt_model **m);

/* Megatron's initialisation: normal(0, init_std) for weights and embeddings, output
 * projections (attention proj, MLP fc2) normal(0, init_std / sqrt(2 L)), biases 0, norm
 * weights 1; drawn from a generator seeded with seed. */
void gpt_init(gpt_model *m, uint64_t seed);

size_t gpt_num_params(const gpt_model *m);
float *gpt_params(gpt_model *m);
float *gpt_grads(gpt_model *m);
int gpt_num_tensors(const gpt_model *m);
const gpt_tensor *gpt_tensors(const gpt_model *m);
const gpt_config *gpt_get_config(const gpt_model *m);
kb_backend *gpt_backend(gpt_model *m);

/* Refreshes the bf16 copy of the weights (after every optimizer step in bf16 mode). */
void gpt_sync_bf16(gpt_model *m);
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

/* Forward pass for one micro batch. train: dropout on (keyed by dropout_seed) and the
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
/* Fault injection: the next forward flips bit `bit` of element index (mod B*T*C) of the
 * final norm's output, the activation the output layer reads (resilience/inject.h). An
 * earlier one is mostly normalised away by the next LayerNorm: silent, but harmless. */
void gpt_inject_act_flip(gpt_model *m, size_t index, int bit);

/* Logits of position t of sequence b after a forward with dscale = NULL: Vp floats, valid
 * until the next forward. */
const float *gpt_last_logits(gpt_model *m, int b, int t);

/* Model FLOPs of one sample of seq_len tokens, forward + backward, by Megatron's formula
 * (num_floating_point_operations / batch). */
double gpt_flops_per_sample(const gpt_config *c, int seq_len);

#endif
