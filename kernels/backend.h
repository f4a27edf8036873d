/* backend.h - the table of operations the model computes with.
 *
 * The model (model/gpt.c) never calls BLAS, OpenMP or CUDA directly: every layer's forward
 * and backward goes through a kb_backend, which holds a table of function pointers (kb_ops)
 * and the backend's private state. The CPU backend (kernels/cpu/) is the reference; the
 * CUDA backend (kernels/cuda/, docs/gpu.md) provides the same table over CUDA managed
 * memory: its operations are queued on a stream and return before they finish, so host code
 * reads buffers the backend wrote only after `sync` (or through `copy` into host memory).
 *
 * Conventions for every operation:
 *  - Row-major tensors. N = B*T rows (tokens) unless said otherwise; C = hidden size.
 *  - Weights of linear layers are stored as PyTorch stores them: W[OC, IC], y = x W^T + b.
 *  - Backward operations ACCUMULATE (+=) into parameter gradients (dW, db, dwte, ...) and
 *    into activation gradients named d* unless the comment says "overwrites".
 *  - All operations are deterministic: the same inputs and thread count give the same bits
 *    (reductions use a fixed partition, no atomics).
 *  - Dropout and any other randomness comes from a counter-based generator keyed by
 *    (seed, offset, element index), so backward regenerates the same mask and a step can be
 *    replayed exactly.
 *  - Pointers named *16 are 16-bit (uint16_t) copies used only by matrix products in
 *    bf16 mode (bfloat16) or fp16 mode (IEEE half); they may be NULL when the backend runs
 *    in fp32.
 */
#ifndef COHORT_KERNELS_BACKEND_H
#define COHORT_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint16_t kb_bf16;

typedef enum { KB_DEVICE_CPU = 0, KB_DEVICE_CUDA = 1 } kb_device;

typedef struct kb_options {
    kb_device device;
    int threads;      /* CPU threads; <= 0 means all online cores */
    bool bf16;        /* matrix products take bf16 inputs, accumulate and output fp32 */
    bool fp16;        /* matrix products take fp16 inputs (rounded to nearest even, beyond 65504:
                       * Inf), accumulate and output fp32; the *16 copies hold fp16 (--fp16) */
    bool bf16_reference; /* CPU: take bf16 even where the CPU has no bf16 matrix instructions
                          * (oneDNN's slower paths; the reference of the GPU tests), where it
                          * is otherwise refused as no faster than fp32 */
    int cuda_device;  /* CUDA: index of the GPU to use; the trainer passes the worker's local
                       * rank on its node (0 for a single process), docs/gpu.md */
} kb_options;

typedef struct kb_backend kb_backend;

/* Masks of block attention (kb_ops.block_attention_*). */
typedef enum {
    KB_BLOCK_MASK_NONE = 0,  /* every query sees every key */
    KB_BLOCK_MASK_CAUSAL = 1 /* same token set (Tq == Tk): query t sees keys j <= t */
} kb_block_mask;

/* One block of attention. Row (token) t of sequence b of q is q[(b*q_brows + t)*q_stride]
 * (q_brows = 0 means Tq), query head h at column h*hd; k and v the same with k_brows and
 * group g at column g*hd. So q, k and v may point into a packed qkv buffer, or at the second
 * half of each sequence of one (q_brows = 2*Tq).
 *   q[B][Tq][nh*hd], k[B][Tk][nkv*hd], v[B][Tk][nkv*hd] (strided as above)
 * qdoc/kdoc (both NULL, or both set): a document id per token, indexed like the rows
 * (qdoc[b*q_brows + t], kdoc[b*k_brows + j]); query t sees key j only if the ids are equal
 * (and, with the causal mask, j <= t). So attention never crosses a document. */
typedef struct kb_block_attn {
    int B, Tq, Tk, nh, nkv, hd;
    kb_block_mask mask;
    const float *q, *k, *v;
    size_t q_stride, k_stride, v_stride; /* floats between consecutive rows */
    int q_brows, k_brows;                /* rows between consecutive sequences (0: Tq, Tk) */
    const int32_t *qdoc, *kdoc;
} kb_block_attn;

/* The most groups one sumsq_runs call sums (the distributed optimizer's buckets: one wait
 * for up to this many) */
#define KB_SUMSQ_MAX_GROUPS 256

typedef struct kb_ops {
    /* ---- memory ---- */
    /* Allocates n bytes (64-byte aligned, zeroed). NULL on failure. */
    void *(*alloc)(kb_backend *b, size_t nbytes);
    void (*free)(kb_backend *b, void *p);
    /* x[0..n) = 0 */
    void (*zero)(kb_backend *b, float *x, size_t n);
    /* dst16[i] = round-to-nearest-even bf16(src[i]), or fp16(src[i]) in fp16 mode */
    void (*to_bf16)(kb_backend *b, kb_bf16 *dst16, const float *src, size_t n);
    /* Waits until every operation queued so far has finished, so the host may read (and
     * write) backend memory; an asynchronous failure found here sets the sticky status.
     * CPU: nothing to do (operations finish before they return). */
    void (*sync)(kb_backend *b);
    /* dst[0..nbytes) = src[0..nbytes), in order with the queued operations; either side may
     * be host memory or backend memory. When dst is host memory the bytes are there on
     * return; a host src may be reused as soon as the call returns. */
    void (*copy)(kb_backend *b, void *dst, const void *src, size_t nbytes);

    /* ---- matrix products ---- */
    /* out[N,OC] = in[N,IC] W[OC,IC]^T (+ bias[OC] if bias != NULL). Overwrites out.
     * in16 / W16: optional bf16 copies of in / W (bf16 mode converts in itself if in16 is NULL). */
    void (*linear_forward)(kb_backend *b, float *out, const float *in, const float *W,
                           const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
    /* din[N,IC] (overwrites, skipped if NULL) = dout[N,OC] W[OC,IC]
     * dW[OC,IC] += dout^T in ; dbias[OC] += sum_rows dout (skipped if NULL) */
    void (*linear_backward)(kb_backend *b, float *din, float *dW, float *dbias,
                            const float *dout, const float *in, const float *W,
                            const kb_bf16 *W16, int N, int IC, int OC);

    /* ---- embeddings ---- */
    /* out[N,C] = wte[tok[n]] (+ wpe[pos[n]] if wpe != NULL). Overwrites out. A token
     * id < 0 (one another tensor-parallel rank's vocabulary shard holds) has a zero word
     * embedding row here, and gets no gradient in embed_backward. */
    void (*embed_forward)(kb_backend *b, float *out, const int32_t *tok, const int32_t *pos,
                          const float *wte, const float *wpe, int N, int C);
    /* dwte[tok[n]] += dout[n]; dwpe[pos[n]] += dout[n] (if dwpe). Deterministic order. */
    void (*embed_backward)(kb_backend *b, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tok, const int32_t *pos, int N, int C, int V);

    /* ---- normalisation ---- */
    /* LayerNorm (bias != NULL... weight and bias) or RMSNorm (rms = true, bias ignored).
     * out[N,C]; mean[N] (unused for RMSNorm, may be NULL then), rstd[N] saved for backward. */
    void (*norm_forward)(kb_backend *b, bool rms, float *out, float *mean, float *rstd,
                         const float *in, const float *w, const float *bias, int N, int C,
                         float eps);
    /* din[N,C] += ...; dw[C] += ...; dbias[C] += ... (LayerNorm only) */
    void (*norm_backward)(kb_backend *b, bool rms, float *din, float *dw, float *dbias,
                          const float *dout, const float *in, const float *w,
                          const float *mean, const float *rstd, int N, int C);

    /* ---- rotary position embedding ---- */
    /* In place on the q and k heads of qkv[N, (nh + 2*nkv) * hd]: rotates the first
     * hd dims of each q and k head (pairs (i, i + hd/2), as Megatron's non-interleaved rope)
     * by angle pos[n] * base^(-2i/hd). inverse = true applies the transpose (for backward
     * on dqkv). */
    void (*rope)(kb_backend *b, float *qkv, const int32_t *pos, int N, int nh, int nkv,
                 int hd, float base, bool inverse);

    /* ---- attention ---- */
    /* Causal grouped-query attention.
     * qkv[B*T, (nh + 2*nkv)*hd]: per token, nh query heads, then nkv key heads, then nkv
     *   value heads, each hd wide. Query head h uses key/value group h / (nh/nkv).
     * seg[B*T] (may be NULL): index of the first position of the token's document within
     *   its sequence; token t attends to j with seg[t] <= j <= t (reset_attention_mask).
     * out[B*T, nh*hd]; lse[B*nh*T] = log-sum-exp of each softmax row (saved for backward),
     *   laid out lse[(b*nh + h)*T + t], scores scaled by 1/sqrt(hd).
     * dropout p on the attention probabilities, mask from (seed, offset): probability
     *   (b, h, t, j) is kept iff kb_keep(seed, offset + ((b*nh + h)*T + t)*T + j, p), then
     *   scaled by 1/(1-p); lse is that of the undropped softmax. Memory grows
     * with T, not T^2; the masked upper half is not computed. */
    void (*attention_forward)(kb_backend *b, float *out, float *lse, const float *qkv,
                              const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                              float p_drop, uint64_t seed, uint64_t offset);
    /* dqkv[B*T, (nh+2*nkv)*hd] (overwrites) from dout[B*T, nh*hd]. */
    void (*attention_backward)(kb_backend *b, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse,
                               const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                               float p_drop, uint64_t seed, uint64_t offset);

    /* ---- block attention (context parallelism, model/ring_attention.c) ----
     * Attention of a query block against a key/value block that may be different token
     * sets (a rank's own chunks against a chunk received from another rank). GQA as above:
     * query head h uses key/value group h / (nh/nkv); scores scaled by 1/sqrt(hd). No
     * dropout. See kb_block_attn for the shapes and masks.
     * Both backends provide them (CUDA: kernels/cuda/cuda_cp.cu); ring_attention_* fail
     * with CO_EUNSUPPORTED where a backend has none. */
    /* out[B*Tq, nh*hd] and lse[(b*nh + h)*Tq + t] (both overwritten). A row that sees no key
     * (every key masked) gets out = 0 and lse = -INFINITY. */
    void (*block_attention_forward)(kb_backend *b, const struct kb_block_attn *a, float *out,
                                    float *lse);
    /* Backward of one block given the FINAL (merged) out[B*Tq, nh*hd] and lse of the rows,
     * so that P = exp(S - lse) is the block's share of the full softmax, and
     * dout[B*Tq, nh*hd]. ACCUMULATES (+=) into dq, dk and dv, laid out like q, k and v
     * (rows b*brows + t, head h / group g at column h*hd / g*hd, row strides
     * dq_stride, dk_stride, dv_stride). */
    void (*block_attention_backward)(kb_backend *b, const struct kb_block_attn *a,
                                     const float *out, const float *lse, const float *dout,
                                     float *dq, size_t dq_stride, float *dk, size_t dk_stride,
                                     float *dv, size_t dv_stride);

    /* ---- activations ---- */
    /* GELU (tanh approximation): out[n] = gelu(in[n]). Overwrites out. */
    void (*gelu_forward)(kb_backend *b, float *out, const float *in, size_t n);
    /* din[n] = dout[n] * gelu'(in[n]). Overwrites din (din may alias dout). */
    void (*gelu_backward)(kb_backend *b, float *din, const float *dout, const float *in,
                          size_t n);
    /* SwiGLU: in[N, 2F] = [a | g] per row; out[N,F] = silu(a) * g. */
    void (*swiglu_forward)(kb_backend *b, float *out, const float *in, int N, int F);
    /* din[N,2F] (overwrites) from dout[N,F]. */
    void (*swiglu_backward)(kb_backend *b, float *din, const float *dout, const float *in,
                            int N, int F);

    /* ---- elementwise ---- */
    /* out = a + b (out may alias a or b) */
    void (*add)(kb_backend *b, float *out, const float *x, const float *y, size_t n);
    /* x *= s */
    void (*scale)(kb_backend *b, float *x, float s, size_t n);
    /* Inverted dropout: out[i] = keep(i) ? in[i] / (1-p) : 0, keep(i) from (seed, offset+i).
     * backward is the same operation applied to the gradient (same seed/offset).
     * p == 0 copies. out may alias in. */
    void (*dropout)(kb_backend *b, float *out, const float *in, size_t n, float p,
                    uint64_t seed, uint64_t offset);

    /* ---- loss ---- */
    /* Fused softmax cross-entropy over the padded vocabulary Vp.
     * logits[N,Vp] is OVERWRITTEN with d(loss)/d(logits) * dscale[n]
     * (softmax - onehot(target)) * dscale[n]; losses[N] = -log softmax[target] (per token,
     * unmasked). Rows with dscale[n] == 0 get a zero gradient. */
    void (*cross_entropy)(kb_backend *b, float *losses, float *logits, const int32_t *targets,
                          const float *dscale, int N, int Vp);

    /* ---- optimizer ---- */
    /* Sum of squares of x[0..n) in double, with a fixed reduction order. */
    double (*sumsq)(kb_backend *b, const float *x, size_t n);
    /* AdamW with decoupled weight decay, bias correction for step t (1-based), grads are
     * multiplied by gscale first (clipping). p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). */
    void (*adamw)(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float wd, float gscale,
                  int64_t t);
    /* adamw, and *sum = kb_checksum_f32(p, n, seed) of the p it wrote, each block hashed as
     * it is written (kernels/checksum.h). The CPU backend writes *sum before it returns; a
     * queued backend (CUDA) by the time the next sync returns, so *sum must stay valid and
     * unread until then (one copy of every pending digest to the host at that sync). NULL
     * where a backend cannot: the caller hashes. */
    void (*adamw_checksum)(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n,
                           float lr, float beta1, float beta2, float eps, float wd, float gscale,
                           int64_t t, uint64_t seed, uint64_t *sum);
    /* Several sums of squares with one wait: out[k] (host memory) = the sum, in run order,
     * of sumsq(x[j], n[j]) over group k's runs j in [end[k-1], end[k]) (end[-1] = 0), each
     * run reduced as sumsq reduces it, so out equals a host loop over sumsq bit for bit. On
     * CUDA the runs' sums stay on the device and one copy brings out[] to the host. */
    void (*sumsq_runs)(kb_backend *b, const float *const *x, const size_t *n, const int *end,
                       int ngroups, double *out); /* ngroups <= KB_SUMSQ_MAX_GROUPS */
    /* The XOR over runs j < nruns of kb_checksum_f32(x[j], n[j], seed[j]) (kernels/checksum.h),
     * computed where the data lives: on CUDA by a kernel, only the 8-byte digest copied to
     * the host (one wait). Returns 0 with b->status set when it cannot run. */
    uint64_t (*checksum_runs)(kb_backend *b, const float *const *x, const size_t *n,
                              const uint64_t *seed, int nruns);

    /* ---- tensor parallelism (model/gpt.c with tp > 1; NULL where a backend has not
     * built them: the model then refuses tp > 1) ---- */
    /* out[N,C] += bias[C] on every row (a row-parallel layer's bias, after the reduction) */
    void (*bias_add)(kb_backend *b, float *out, const float *bias, int N, int C);
    /* dbias[C] += sum over rows of dout[N,C] */
    void (*bias_grad)(kb_backend *b, float *dbias, const float *dout, int N, int C);
    /* The vocabulary-parallel cross-entropy, in three steps around the tensor group's
     * reductions; this rank holds logits[N,V] of the vocabulary ids [v0, v0 + V) of Vt:
     *   ce_max:  mx[n] = max_j logits[n,j]                  (the caller then takes the MAX
     *                                                         over the group into mx)
     *   ce_sums: sums[n] = sum_j exp(logits[n,j] - mx[n]);  sums[N + n] = logits[n, t - v0]
     *            - mx[n] where the target t is in this rank's range, else 0 (then SUM)
     *   ce_grad: losses[n] = log(sums[n]) - sums[N + n] (0 for a target outside [0, Vt));
     *            logits OVERWRITTEN with (softmax - onehot(t)) * dscale[n], the one-hot only
     *            on the rank that owns t; rows with dscale 0 get 0. */
    void (*ce_max)(kb_backend *b, float *mx, const float *logits, int N, int V);
    void (*ce_sums)(kb_backend *b, float *sums, const float *logits, const float *mx,
                    const int32_t *targets, int v0, int N, int V);
    void (*ce_grad)(kb_backend *b, float *losses, float *logits, const float *mx,
                    const float *sums, const int32_t *targets, const float *dscale, int v0,
                    int Vt, int N, int V);

    /* ---- grouped products (the MoE layer's experts, --moe-grouped-gemm; NULL where a
     * backend has not built them: model/moe.c then runs one product per group) ----
     * n groups; group j is rows [off[j], off[j+1]) (host memory, off[0] may be > 0) of in
     * and out, with weights W + j*OC*IC ([OC,IC]). One call for every group: the CPU backend
     * spreads (group, row block) pieces over its threads, each piece one single-threaded
     * product, so the bits do not depend on the thread count; the CUDA backend runs one
     * cuBLAS grouped GEMM (kernels/cuda/cuda_grouped.cu). Groups with no rows: nothing
     * written, dW_j unchanged.
     *   forward:  out[rows_j, OC] = in[rows_j, IC] W_j^T                     (overwrites)
     *   backward: din[rows_j, IC] = dout[rows_j, OC] W_j   (overwrites; skipped if NULL)
     *             dW_j[OC, IC] += dout[rows_j]^T in[rows_j]      (skipped if NULL) */
    void (*grouped_linear_forward)(kb_backend *b, float *out, const float *in, const float *W,
                                   const int32_t *off, int n, int IC, int OC);
    void (*grouped_linear_backward)(kb_backend *b, float *din, float *dW, const float *dout,
                                    const float *in, const float *W, const int32_t *off, int n,
                                    int IC, int OC);

    /* ---- fused products (CUDA: cuBLASLt epilogues; NULL where a backend has none, and the
     * caller composes them from linear_*, gelu_* and bias_grad) ---- */
    /* pre[N,OC] = in[N,IC] W[OC,IC]^T + bias[OC]; out[N,OC] = gelu(pre) (tanh). Overwrites both. */
    void (*linear_gelu_forward)(kb_backend *b, float *out, float *pre, const float *in, const float *W,
                                const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
    /* din[N,IC] = (dout[N,OC] W[OC,IC]) * gelu'(pre[N,IC]) (overwrites); dbias[IC] += sum over
     * rows of din (skipped if NULL): the backward of the product after linear_gelu_forward
     * (W is the NEXT layer's weight) through the GELU, with the GELU layer's bias gradient. */
    void (*linear_backward_dgelu)(kb_backend *b, float *din, float *dbias, const float *dout,
                                  const float *W, const kb_bf16 *W16, const float *pre, int N,
                                  int IC, int OC);
    /* ---- ordering other device work with the backend's ----
     * The CUDA stream (cudaStream_t) the backend queues its operations on, so that other
     * work (stream-ordered NCCL, comm.h's *_q operations) is queued in order with them;
     * NULL where operations finish before they return (CPU). */
    void *(*stream)(kb_backend *b);

    /* ---- bf16 activations (CUDA in bf16 mode; NULL elsewhere: the model then keeps these
     * activations in fp32 and the products round them per call). The activations that only
     * products read (the norms' outputs before qkv and fc1, attention's output before the
     * projection, the GELU's output before fc2) made in bf16 by the kernel that computes
     * them (rounded once, to nearest even) and stored so; statistics (mean, rstd, lse), the
     * GELU's pre-activation and every gradient stay fp32. Each is its fp32 counterpart with
     * the activation's pointer kb_bf16: the bits a product reads are those the fp32 form's
     * per-call rounding gives, so only the attention backward's rowsum(O * dO) and the bias
     * gradients' inputs differ from the fp32-activation path (docs/gpu.md). ---- */
    void (*norm_forward_bf16)(kb_backend *b, bool rms, kb_bf16 *out, float *mean, float *rstd, const float *in,
                              const float *w, const float *bias, int N, int C, float eps);
    void (*linear_forward_bf16)(kb_backend *b, float *out, const kb_bf16 *in, const float *W, const kb_bf16 *W16,
                                const float *bias, int N, int IC, int OC);
    void (*linear_backward_bf16)(kb_backend *b, float *din, float *dW, float *dbias, const float *dout,
                                 const kb_bf16 *in, const float *W, const kb_bf16 *W16, int N, int IC, int OC);
    /* as linear_gelu_forward with a bf16 input and output (bias may be NULL) */
    void (*linear_gelu_forward_bf16)(kb_backend *b, kb_bf16 *out, float *pre, const kb_bf16 *in, const float *W,
                                     const kb_bf16 *W16, const float *bias, int N, int IC, int OC);
    /* as swiglu_forward with the output rounded once to bf16 (out[N, F]; in[N, 2F] fp32, the
     * backward's input as before) */
    void (*swiglu_forward_bf16)(kb_backend *b, kb_bf16 *out, const float *in, int N, int F);
    void (*attention_forward_bf16)(kb_backend *b, kb_bf16 *out, float *lse, const float *qkv, const int32_t *seg,
                                   int B, int T, int nh, int nkv, int hd, float p_drop, uint64_t seed,
                                   uint64_t offset);
    void (*attention_backward_bf16)(kb_backend *b, float *dqkv, const float *dout, const float *qkv,
                                    const kb_bf16 *out, const float *lse, const int32_t *seg, int B, int T, int nh,
                                    int nkv, int hd, float p_drop, uint64_t seed, uint64_t offset);

    /* ---- pitched copies ---- */
    /* rows x width bytes: row r of dst (dst + r dst_pitch) = row r of src (src + r src_pitch),
     * in order with the queued operations, both in backend memory (not overlapping): a
     * concatenation along the rows' width or a slice of columns without a wait. */
    void (*copy_rows)(kb_backend *b, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                      size_t rows);
    /* ---- ring attention's bookkeeping (context parallelism, model/ring_attention.c): the
     * steps' merge in the backend's order (with copy_rows above for the ring's copies), so
     * that a queued backend (CUDA) needs no host wait per ring step. The CPU's are the same
     * loops on the host. ---- */
    /* The LSE merge of a ring step's partial result into the running one, for rows q0..q0+nq
     * of each of B sequences of L rows: out[B*L, nh*hd], lse[(b*nh + h)*L + t] (updated);
     * po[B*nq, nh*hd], pl[(b*nh + h)*nq + t] (the step's block). Per row, where pl is not
     * -inf: lse' = max + log1p(exp(min - max)) of (lse, pl), out' = out e^(lse - lse') +
     * po e^(pl - lse'); rows whose pl is -inf (no key seen) are left alone. */
    void (*ring_merge)(kb_backend *b, float *out, float *lse, const float *po, const float *pl, int B, int nh,
                       int hd, int L, int q0, int nq);
    /* dst[i] = src16[i] as fp32 (bf16 widened, exact) */
    void (*bf16_to_f32)(kb_backend *b, float *dst, const kb_bf16 *src, size_t n);
    /* A second stream beside the backend's (CUDA; NULL where operations finish before they
     * return, CPU), for work that should run beside the kernels (the ring's NCCL shifts):
     * side_fork makes it wait for everything queued on the backend's stream so far,
     * side_join makes the backend's stream wait for everything queued on it so far (events:
     * no host wait). Work queued on it must be joined before the next sync, which waits for
     * the backend's stream only. */
    void *(*side_stream)(kb_backend *b);
    void (*side_fork)(kb_backend *b);
    void (*side_join)(kb_backend *b);
    /* ---- the MoE layer's token permutations (model/moe.c, moe_ep.c): rows of C floats moved
     * and combined where the data lives, so the tokens never pass through the host. Index
     * tables (idx, off, row) and weights (w) are in backend memory (the caller fills them with
     * copy). Each output element is computed by one thread in a fixed order: deterministic, no
     * atomics, bitwise the CPU backend's (explicit fused multiply-adds on both). ---- */
    /* out[r, :] = in[idx[r], :] for r < M (idx NULL: in[r, :]). out must not alias in. */
    void (*gather_rows)(kb_backend *b, float *out, const float *in, const int32_t *idx, int M, int C);
    /* the same from bf16 rows (the MoE layer's bf16 input), widened exactly to fp32 */
    void (*gather_rows_bf16)(kb_backend *b, float *out, const kb_bf16 *in, const int32_t *idx, int M, int C);
    /* y[n, :] = (acc ? y[n, :] : 0) + sum over j = off[n] .. off[n+1]-1, in that order, of
     * w[j] * src[row[j], :] (w NULL: weight 1, a plain addition), for n < N; a row with no
     * entries is 0 (acc: unchanged). y must not alias src. */
    void (*combine_rows)(kb_backend *b, float *y, const float *src, const int32_t *off, const int32_t *row,
                         const float *w, int N, int C, bool acc);
    /* The backward of out[r] weighted by w[r] into y[idx[r]], for r < M: dout[r, :] (overwrites)
     * = w[r] * dy[idx[r], :]; dw[r] (double, overwrites) = sum over q ascending of
     * dy[idx[r], q] * out[r, q]. dout must not alias out. */
    void (*combine_backward)(kb_backend *b, float *dout, double *dw, const float *dy, const float *out,
                             const int32_t *idx, const float *w, int M, int C);
} kb_ops;

struct kb_backend {
    const kb_ops *ops;
    kb_options opt;
    void *impl; /* backend-private state */
    /* Sticky error: operations return void, so one that cannot run (scratch memory it could
     * not allocate; on a GPU, an asynchronous fault) records a negative CO_E* code here and
     * leaves its outputs unspecified. Callers check it once per step with kb_backend_status;
     * it stays set until kb_backend_clear_status. */
    int status;
};

/* The sticky error (0 if none); co_err_detail() of the failing thread says which op. */
static inline int kb_backend_status(const kb_backend *b) { return b->status; }
static inline void kb_backend_clear_status(kb_backend *b) { b->status = 0; }

/* Creates a backend. Returns 0 or a negative CO_E* code (CO_EUNSUPPORTED for a device this
 * build or machine lacks; co_err_detail() says why). */
int kb_backend_new(kb_backend **out, const kb_options *opt);
/* Destroys the backend and nulls the pointer. */
void kb_backend_destroy(kb_backend **b);
/* A short description ("cpu: oneDNN 2.6.3, 2 threads, fp32"). */
const char *kb_backend_describe(const kb_backend *b);
/* Whether this build and machine can run the CUDA backend: the number of GPUs it can use
 * (> 0), or 0 (then why[0..n) says why: no CUDA in this build, no driver, no device, a GPU
 * this build has no code for or that cannot share managed memory with the CPU). Reads
 * device attributes only (no CUDA context); cheap enough to call once. */
int kb_cuda_available(char *why, size_t n);
/* Whether --bf16 is useful on this CPU: 1 yes (AVX512-BF16 or AMX matrix products), 0 no
 * (then why[0..n) is the one-line refusal, naming the CPU and what to use instead). The
 * CPU backend refuses to be created with bf16 where this says no. */
int kb_cpu_bf16_check(char *why, size_t n);
/* "Intel(R) Xeon(R) ..., kernels for AVX-512": the CPU and the level its kernels use. */
void kb_cpu_describe_isa(char *out, size_t n);

/* Counter-based random stream shared by all backends: a uniform 32-bit value for
 * (seed, counter), and the dropout keep test used by every kernel. */
static inline uint32_t kb_rand32(uint64_t seed, uint64_t counter) {
    uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32);
}
static inline bool kb_keep(uint64_t seed, uint64_t counter, float p) {
    /* keep with probability 1-p */
    return (float)kb_rand32(seed, counter) * (1.0f / 4294967296.0f) >= p;
}

#endif
