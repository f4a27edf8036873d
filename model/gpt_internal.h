/* gpt_internal.h - what the model's files share (gpt.c: the tensor table, buffers,
 * initialisation; gpt_step.c: forward and backward of a chunk; gpt_tp.c: the tensor group's
 * collectives and the parallel layers). Not for use outside model/. */
#ifndef COHORT_MODEL_GPT_INTERNAL_H
#define COHORT_MODEL_GPT_INTERNAL_H

#include "model/gpt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Indices of a layer's tensors in the tensor table. */
enum { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC1_W, FC1_B, FC2_W, FC2_B,
       /* a MoE layer: the router; the local experts' fc1 then fc2 follow it in the table and
        * the flat buffer, then the shared expert's, all unpadded: moe.h's layout */
       ROUTER_W,
       /* its expert bias [E] (--moe-router-enable-expert-bias): a tensor with no gradient, moved
        * by gpt_moe_expert_bias's caller before each optimizer step (Megatron's buffer) */
       EBIAS, NLAYER_T };

/* An MTP depth's tensors besides its transformer layer's (t_layer[num_layers + k]). */
enum { MTP_EN_W, MTP_EN_B, MTP_HN_W, MTP_HN_B, MTP_EH_W, MTP_FN_W, MTP_FN_B, MTP_NT };

/* One layer's saved activations for one micro batch (N = B*T rows; Nl = N/tp under
 * sequence parallelism, else N). */
/* With bf16 activations (gpt_model.act16) ln1, ln2 and att, and act where act16_mlp, hold
 * kb_bf16 elements (half the bytes; typed float * still, read through gpt__a16) which only
 * the backend's *_bf16 operations touch. */
typedef struct layer_acts {
    float *x_in;        /* [Nl,C] residual stream entering the layer */
    float *ln1, *ln1_mean, *ln1_rstd;   /* [Nl,C], [Nl], [Nl] */
    float *qkv;         /* [N,Q] after rope */
    float *x_mid;       /* [Nl,C] residual stream after the attention branch */
    float *att, *lse;   /* [N,NH*HD], [B*NH*T] */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc1;         /* [N, F or 2F] (dense layers) */
    float *act;         /* [N,F] */
    moe_layer *moe;     /* a MoE layer's router, experts and their saved state */
    /* activation recomputation (gpt.h gpt_recompute): rc_pos >= 0 for a layer of a full
     * recomputation group (its place in the group; every buffer but a first layer's x_in is
     * the scratch set rc_pos's), -1 otherwise; sel the selective modules recomputed in its
     * backward (their buffers the model's shared scratch); xin_shard: a distributed group
     * input, this rank's [N/tp, C] rows (x_in then the shared full-size m->rc_xfull) */
    int rc_pos;
    unsigned sel;
    float *xin_shard;
    bool owns_xin, owns_rest; /* which buffers layer_acts_free frees */
} layer_acts;

/* An MTP depth's activations for one micro batch (the head chunk; host-visible memory):
 * the rolled batch, its embedding, the two norms, their concatenation, the transformer
 * layer, the final norm, the logits (then their gradient) and the per-token losses. Under
 * sequence parallelism the token-wise rows (emb to out) hold this rank's Nl = N/tp; the
 * logits [N,Vl] this rank's vocabulary columns. */
typedef struct mtp_acts {
    layer_acts layer;                       /* layer.x_in = eh_proj's output */
    float *emb, *en, *en_mean, *en_rstd;    /* [N,C], [N,C], [N], [N] */
    float *hn, *hn_mean, *hn_rstd;          /* [N,C], [N], [N] */
    float *cat;                             /* [N,2C] = [en | hn]; en, hn, cat kb_bf16 with act16 */
    float *x_out, *out, *out_mean, *out_rstd; /* the layer's output, the final norm's */
    float *logits, *losses;                 /* [N,V], [N] */
    int32_t *tok, *pos, *tgt;               /* [N] rolled k+1 places left, zero-filled */
    float *mask, *dscale;                   /* [N] */
    int32_t *d_tok, *d_pos, *d_tgt;         /* the backend's copies of tok, pos, tgt and dscale, */
    float *d_dscale;                        /* which its kernels read (NULL on the CPU: the host's) */
    double loss, ntok;                      /* the depth's masked mean loss, its tokens */
} mtp_acts;

/* One micro batch in flight through a chunk: its layers' activations and the end of its
 * residual stream; on the head chunk also the final norm, the logits (then their gradient)
 * and the per-token losses. */
typedef struct chunk_slot {
    layer_acts *acts;   /* [nlayers] */
    float *x_end;       /* [Nl,C] the stream after the last layer: the output for the next stage,
                           or on the head chunk the final norm's input; with no layers, the input */
    float *lnf, *lnf_mean, *lnf_rstd;   /* the final norm's (gpt__has_final_norm): [Nl,C], [Nl], [Nl];
                                           lnf kb_bf16 with bf16 activations (act16) */
    float *logits;      /* head: [N,Vl] */
    float *losses;      /* head: [N] */
    mtp_acts *mtp;      /* chunks running the MTP depths or (mtp_in) their losses: [mtp_layers]
                           (NULL without MTP) */
    float *mtp_out;     /* an MTP chunk without the head: [1 + mtp_layers, Nl, C] its output,
                           the final norm's then each depth's */
    bool mtp_done;      /* the last forward ran the MTP depths (training) */
    int B, T;           /* the micro batch's shape at its forward */
} chunk_slot;

typedef struct chunk_state {
    gpt_chunk def;
    int slots;
    chunk_slot *slot;   /* [slots] */
} chunk_state;

struct gpt_model {
    gpt_config cfg;
    kb_backend *be;
    const kb_ops *ops;
    int max_B, max_T;
    gpt_tensor *tensors;
    int ntensors;
    size_t nparams;
    float *params, *grads;
    kb_bf16 *params16; /* bf16 copy (bf16 mode) */
    /* called after each layer's backward (gpt_set_backward_hook), NULL: none */
    void (*bwd_hook)(void *ctx, int layer);
    void *bwd_hook_ctx;
    /* called before the forward uses a layer's weights (gpt_set_forward_hook), NULL: none */
    void (*fwd_hook)(void *ctx, int layer);
    bool moe_moved; /* a MoE layer's experts lie apart from its router (gpt_relayout) */
    void *fwd_hook_ctx;
    /* fault injection: flip one bit of the final norm's output in the next forward */
    bool act_flip;
    size_t act_flip_index;
    int act_flip_bit;
    /* tensor indices (-1 when absent on this rank) */
    int t_wte, t_wpe, t_lnf_w, t_lnf_b, t_lm;
    int *t_layer; /* [L + mtp_layers][NLAYER_T] by global layer, -1 when absent */
    int t_mtp[GPT_MAX_MTP][MTP_NT]; /* the MTP depths' own tensors (head chunk) */
    float *mtp_dout, *mtp_dcat, *mtp_demb, *mtp_dh[2]; /* MTP backward scratch [N,C], [N,2C], [N,C], 2x[N,C] */
    /* tp > 1: eh_proj's gathered input [N,2C] (kb_bf16 with act16), its input gradient's
     * partial sum [N,2C], this rank's output columns [N,C/tp] (or their gradient), the
     * gathered columns [tp][N][C/tp] */
    float *mtp_gcat, *mtp_dcatf, *mtp_part, *mtp_blk;
    float *mtp_dlnf;    /* the MTP depths' gradient of the main final norm's output (NULL: none) */
    float *mtp_gin;     /* an MTP chunk without the head: [1+D, N, C] its output's gradient, kept
                           out of dx (the depths' backward uses dx) */
    double mtp_loss_sum[GPT_MAX_MTP];
    int64_t mtp_forwards;
    /* pipeline parallelism: the chunks this rank holds (one of every layer without it) */
    int nchunks;
    chunk_state chunk[GPT_MAX_CHUNKS];
    int last_chunk, last_slot; /* of the last forward (sampling reads its logits) */
    /* activation recomputation: the scratch sets of a full group's layers [rc_nsets], the
     * selective modules' shared buffers (norm output, attention output and log-sum-exp, fc1
     * and activation, a MoE layer's state), a recomputed group's last output (discarded),
     * a distributed input gathered; every distinct MoE layer object (moes, owned) */
    layer_acts *rc_set;
    int rc_nsets;
    float *rc_ln, *rc_att, *rc_lse, *rc_fc1, *rc_act, *rc_xout, *rc_xfull;
    moe_layer *rc_moe;
    moe_layer **moes;
    int nmoes;
    bool recomputing;   /* a recomputed forward: no statistics counted twice */
    size_t act_bytes, act_layer_bytes, act_rc_bytes; /* activation memory allocated (gpt_activation_bytes) */
    /* backward scratch */
    float *dx, *dh, *dbig, *dqkv, *datt, *dffn;
    float *tmp;         /* [N,C] */
    float *norm_ones, *norm_1p; /* [C]: ones, and 1 + w of the norm being run (--apply-layernorm-1p) */
    /* tensor parallelism (gpt.h): this rank's shapes and the group */
    int tp, tpr;
    bool sp;
    int NHl, NKVl, kv0, Fl, Vl, v0;  /* local heads, groups, first group, ffn, vocabulary */
    struct cm_comm *tpc;
    int tp_timeout;
    int32_t *tok_l;                  /* [N] token ids in this rank's vocabulary shard, -1 elsewhere
                                      * (host memory; d_tokl the backend's copy where it differs) */
    int32_t *d_tokl;
    float *gath, *dfull, *dhs;       /* [N,C]: gathered input, gathered gradient, a shard's sum */
    float *ce_mx, *ce_all, *ce_sums; /* [N], [tp*N], [2N] */
    float *tp_buf;                   /* gpt_tp_finalize_grads' packing buffer */
    size_t tp_buf_n;
    gpt_tp_stats stats;
    bool overlap;                    /* the input-gradient sum runs beside the weight gradient */
    /* the tensor group's collectives queued on the backend's stream (CUDA with an NCCL
     * group: comm.h's *_q): no wait before or after them (gpt_tp.c) */
    void *tp_stream;
    bool dev_pp;                     /* gpt_set_device_pipeline */
    /* context parallelism (gpt_cp.c): the ring's group and the size of its shifts' waits */
    int cp, cpr;
    struct cm_comm *cpc;
    int cp_timeout;
    struct ring_ws *ring_ws; /* ring attention's buffers, kept across calls (cp > 1; gpt_cp.c) */
    /* Backends whose memory the host cannot hand to kernels (CUDA): the batch arrays are
     * copied into backend buffers each forward, and losses come back through host_losses.
     * host_batch (CPU): the caller's arrays are used as they are. */
    bool host_batch;
    /* bf16 activations (backend.h's *_bf16 operations, CUDA in bf16 mode): the norms' outputs
     * and attention's output stored in bf16 (act16), the GELU's output too (act16_mlp: GELU
     * layers); at any cp (the ring rounds att once, gpt_cp.c); MoE layers take their input
     * in bf16 (moe_set_input16); fp32 elsewhere; under tensor parallelism the
     * sequence-parallel all-gathers of the norms' outputs move bf16 elements; with MTP the
     * depths' layers, enorm's and hnorm's outputs and their concatenation too, while the
     * main final norm's output on the MTP chunk and the depths' final norms' stay fp32
     * (gpt__lnf16) */
    bool act16, act16_mlp;
    float *moe_x32;     /* act16 with MoE layers: their shared fp32 input scratch (moe_set_input16) */
    size_t moe_x32_n;
    /* mixture of experts */
    float aux_loss_scale;
    float mtp_tok_w; /* --calculate-per-token-loss's MTP token weight, < 0: none */
    gpt_moe_stats moe_acc;
    int64_t *moe_tpe;   /* [L][E] tokens per expert since the last gpt_moe_stats_take */
    bool pack;          /* add_split does not pad (a MoE layer's block) */
    int pack_run;       /* while pack: the index of the run's first tensor */
    int32_t *d_tok, *d_tgt, *d_pos, *d_seg;
    float *d_dscale, *host_losses;
};

#define P(m, idx) ((idx) < 0 ? NULL : (m)->params + (m)->tensors[idx].offset)
#define G(m, idx) ((idx) < 0 ? NULL : (m)->grads + (m)->tensors[idx].offset)
#define P16(m, idx) ((idx) < 0 || !(m)->params16 ? NULL : (m)->params16 + (m)->tensors[idx].offset)

/* Every MoE layer's token group (model/moe.h moe_set_token_group: grp, its first `shards`
 * ranks splitting a batch's rows); a failure goes to the backend's status. gpt_tp.c. */
void gpt__moe_token_group(gpt_model *m, struct cm_comm *grp, int shards, int timeout_ms);
/* A norm's weight as the kernels take it: the stored tensor, or under --apply-layernorm-1p
 * 1 + w, written into m->norm_1p just before the norm that reads it (one stream: the next
 * norm's rewrites it after this one has run). The stored tensor's gradient is the kernel's:
 * d(1 + w)/dw = 1. */
static inline const float *gpt__norm_w(gpt_model *m, int idx) {
    if (!m->cfg.norm_1p || idx < 0) return P(m, idx);
    m->ops->add(m->be, m->norm_1p, m->norm_ones, P(m, idx), (size_t)m->cfg.hidden);
    return m->norm_1p;
}
static inline int gpt__qkv_local(const gpt_model *m) { return (m->NHl + 2 * m->NKVl) * m->cfg.head_dim; }
static inline int gpt__fc1_local(const gpt_model *m) { return m->cfg.swiglu ? 2 * m->Fl : m->Fl; }

/* The batch arrays a chunk's kernels read (gpt_step.c's to_backend): the caller's on the CPU,
 * backend copies elsewhere. */
typedef struct dev_batch {
    const int32_t *tokens, *positions, *seg, *targets;
    const float *dscale;
    const int32_t *rows; /* host memory: gpt_batch.rows (each token's row in the whole batch) */
} dev_batch;

/* Dropout stream offsets: each dropout site of a micro batch gets its own counter range
 * (layer -1: the embedding; an MTP depth's layers count on from num_layers). */
static inline uint64_t gpt__site(int layer, int which) {
    return ((uint64_t)(layer + 1) * 8u + (uint64_t)which) << 40;
}

/* Full recomputation of layer i of a chunk of n layers: its place in its group [*g0, *g1),
 * or -1 when the layer keeps its activations (gpt.h gpt_recompute). */
static inline int gpt__rc_pos(const gpt_recompute *r, int i, int n, int *g0, int *g1) {
    int k = r->num_layers;
    if (r->full == GPT_RC_UNIFORM && k > 0) {
        *g0 = i - i % k;
        *g1 = *g0 + k < n ? *g0 + k : n;
        return i - *g0;
    }
    if (r->full == GPT_RC_BLOCK && i < k) {
        *g0 = i;
        *g1 = i + 1;
        return 0;
    }
    *g0 = *g1 = i;
    return -1;
}

/* ---- gpt_step.c: one transformer layer (gpt_step.c's loop, and the MTP depths') ---- */
int gpt__layer_forward(gpt_model *m, layer_acts *a, int l, float *x_out, const dev_batch *xb, int B, int T,
                       bool train, uint64_t seed);
int gpt__layer_backward(gpt_model *m, layer_acts *a, int l, const dev_batch *xb, int B, int T, uint64_t seed);

/* this batch's token ids in this rank's vocabulary shard (-1 elsewhere; m->tok_l, or the
 * backend's copy), for the vocabulary-parallel embedding (tp > 1) */
const int32_t *gpt__vocab_shard_tokens(gpt_model *m, const int32_t *tokens, int N);
/* the embedding of N tokens into x [Nl, C] (vocabulary-parallel under tensor parallelism;
 * host_tokens in host memory, tokens the backend's copy) and its backward from dx [Nl, C] */
void gpt__embedding_forward(gpt_model *m, float *x, const int32_t *host_tokens, const int32_t *tokens,
                            const int32_t *positions, int N);
void gpt__embedding_backward(gpt_model *m, const float *dx, const int32_t *host_tokens, const int32_t *tokens,
                             const int32_t *positions, int N);
/* N rows' loss from this rank's logits [N, Vl], the logits turned into the gradient weighted
 * by dscale (vocabulary-parallel under tensor parallelism) */
void gpt__cross_entropy(gpt_model *m, float *losses, float *logits, const int32_t *targets, const float *dscale,
                        int N);

/* ---- gpt_mtp.c: multi-token prediction on the head chunk (training forwards only) ----
 * forward after the main loss (sl->lnf is the main final norm's output); backward before
 * the main head's: leaves in m->mtp_dlnf the depths' gradient of sl->lnf. */
int gpt__mtp_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, bool train, uint64_t seed);
int gpt__mtp_backward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, uint64_t seed);
/* The MTP depths split over two stages (gpt_chunk.mtp without the head, .mtp_in with it):
 * mtp_hidden_* on the MTP stage (sl->lnf the main final norm's output; each depth's output
 * into sl->mtp_out after the main one; backward from dout [1+D, Nl, C], leaving the depths'
 * gradient of sl->lnf in m->mtp_dlnf), mtp_loss_* on the head (the depths' outputs the
 * streams after the first of in; backward writes their gradients into din's). */
int gpt__mtp_hidden_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, uint64_t seed);
int gpt__mtp_hidden_backward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, const float *dout, uint64_t seed);
int gpt__mtp_loss_forward(gpt_model *m, chunk_slot *sl, const gpt_batch *b, const float *in);
int gpt__mtp_loss_backward(gpt_model *m, chunk_slot *sl, const float *in, float *din);

/* The chunk applies the final norm: the head's, unless the MTP depths ran before it (then
 * the MTP chunk's, before the depths). */
static inline bool gpt__has_final_norm(const gpt_chunk *d) { return d->mtp || (d->head && !d->mtp_in); }
/* The final norm's output (the output layer's input on the head: sl->lnf, or the first
 * stream received after the MTP stage) holds bf16: with act16 where only the output layer
 * reads it; fp32 on an MTP chunk (the depth 0 hnorm's input, a norm's, and the stream sent
 * on after an MTP stage) and on the head after one (the stream received is fp32). */
static inline bool gpt__lnf16(const gpt_model *m, const gpt_chunk *d) { return m->act16 && !d->mtp && !d->mtp_in; }

/* ---- gpt_tp.c: the tensor group (each a no-op at tp 1 where it says so) ---- */
/* x[n] summed over the group (reduce_from_tensor_region) */
void gpt__tp_allreduce(gpt_model *m, float *x, size_t n);
/* full[N,C] (every rank's) summed, this rank's rows [r N/tp, (r+1) N/tp) into shard */
void gpt__tp_reduce_scatter(gpt_model *m, float *shard, const float *full, size_t shard_n);
/* full = every rank's shard, in rank order */
void gpt__tp_allgather(gpt_model *m, float *full, const float *shard, size_t shard_n);
/* the same of an activation buffer (a norm's output before qkv, fc1 or the output layer
 * under sequence parallelism): its kb_bf16 elements, 2 bytes each, when a16 */
void gpt__tp_allgather_act(gpt_model *m, float *full, const float *shard, size_t shard_n, bool a16);
/* din (summed over the group into dh) and dW of a column-parallel layer (qkv, fc1, the
 * output layer); at tp 1 the one-rank product into dh */
void gpt__column_parallel_backward(gpt_model *m, float *dW, float *dbias, const float *dout, const float *in,
                                   const float *W, const kb_bf16 *W16, int N, int IC, int OC);
/* a row-parallel layer (proj, fc2): out[Nl,C] = (in[N,IC] W^T summed over the group,
 * reduce-scattered to this rank's tokens under SP) + bias; and its backward */
void gpt__row_parallel_forward(gpt_model *m, float *out, const float *in, const float *W, const kb_bf16 *W16,
                               const float *bias, int N, int IC, int Nl);
void gpt__row_parallel_backward(gpt_model *m, float *din, float *dW, float *dbias, const float *dout,
                                const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int Nl);
/* the three with an activation input `in` of bf16 elements when a16 (gpt_model.act16: the
 * norms', attention's and the GELU's outputs); the gradients fp32 either way */
void gpt__column_parallel_backward_act(gpt_model *m, bool a16, float *dW, float *dbias, const float *dout,
                                       const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC);
void gpt__row_parallel_forward_act(gpt_model *m, bool a16, float *out, const float *in, const float *W,
                                   const kb_bf16 *W16, const float *bias, int N, int IC, int Nl);
void gpt__row_parallel_backward_act(gpt_model *m, bool a16, float *din, float *dW, float *dbias, const float *dout,
                                    const float *in, const float *W, const kb_bf16 *W16, int N, int IC, int Nl);
/* the seed of dropout inside the tensor region: seed + 2718 + tp_rank (tp > 1) */
uint64_t gpt__tp_seed(const gpt_model *m, uint64_t seed);

/* ---- gpt_cp.c: attention of one layer, the one-rank kernel at cp 1, the ring over the
 * context group at cp > 1 (errors go to the backend's sticky status) ---- */
/* bf16 activations: a buffer of layer_acts holding kb_bf16 (gpt_model.act16) */
static inline kb_bf16 *gpt__a16(float *p) { return (kb_bf16 *)(void *)p; }
/* A norm whose output only products read (the layers' two norms): bf16 with act16 */
void gpt__norm_act(gpt_model *m, float *out, float *mean, float *rstd, const float *in, const float *w,
                   const float *bias, int N);
/* out = in W^T + bias at tp 1 for an activation in's buffer (bf16 when a16) */
void gpt__linear_act(gpt_model *m, float *out, const float *in, bool a16, const float *W, const kb_bf16 *W16,
                     const float *bias, int N, int IC, int OC);
void gpt__attention_forward(gpt_model *m, float *att, float *lse, const float *qkv, const int32_t *seg, int B, int T,
                            float pa, uint64_t seed, uint64_t site);
/* Hidden dropout of this rank's Nl token rows (rows r0.. of the batch's local tokens, r0 =
 * tpr x Nl under sequence parallelism) keyed by the element's index in the whole micro batch:
 * rows[] maps local rows to the whole batch's (NULL: the identity); padding rows (-1) get
 * indices past the whole batch's. out may alias in. */
void gpt__dropout_rows(gpt_model *m, const int32_t *rows, int N, float *out, const float *in, int Nl, float p,
                       uint64_t seed, uint64_t site);
void gpt__attention_backward(gpt_model *m, float *dqkv, const float *datt, const float *qkv, const float *att,
                             const float *lse, const int32_t *seg, int B, int T, float pa, uint64_t seed,
                             uint64_t site);

/* Points MoE layer `moe` (of the layer whose tensor indices are t) at its weights' places in
 * the flat buffer when gpt_relayout moved its experts apart from its router. */
void gpt__moe_bind(gpt_model *m, const int *t, struct moe_layer *moe);

#endif
