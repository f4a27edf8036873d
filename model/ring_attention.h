/* ring_attention.h - load-balanced ring attention for context parallelism (docs/
 * context-parallel.md): the model's attention at --context-parallel-size > 1 (model/gpt_cp.c),
 * also tested on its own (tests/unit/model/test_ring_attention.c).
 *
 * A sequence of `seq` tokens is cut into 2*cp chunks of S = seq/(2*cp) tokens; rank r keeps
 * chunks r and 2*cp-r-1, concatenated, so L = 2*S = seq/cp local tokens per sequence and
 * every rank gets the same share of the causal work. Over cp steps each rank's key/value
 * block travels around the ring (rank r sends to r+1, receives from r-1):
 *   step 0:      the local chunks against themselves, causal;
 *   step i <= r: all local queries against the first half (first chunk) of the received KV;
 *   step i > r:  the second half of the local queries against all of the received KV;
 * partial (out, lse) are merged with lse = max + log1p(exp(min - max)), and out rescaled by
 * exp(lse_part - lse_new). Backward sends KV around again and, behind it in its own message,
 * its dK/dV accumulator; the shift after the last step hands each dK/dV to its owner.
 *
 * The ring talks through a ring_exchange, so the same code runs over cohort's comm
 * (ring_exchange_comm) or in one process with a thread per simulated rank (ring_sim).
 *
 * Local tensors (per rank, B sequences of L tokens, rows b*L + t):
 *   qkv[B*L, (nh + 2*nkv)*hd] packed as for kb_ops.attention_forward
 *   doc[B*L] (or NULL): document id of each token (e.g. the global index of its document's
 *     first token, i.e. the seg[] of the full sequence); attention never crosses ids
 *   out[B*L, nh*hd], lse[(b*nh + h)*L + t], dout like out, dqkv like qkv (overwritten).
 * Errors are CO_E* codes with co_err_detail() naming the step. Everything a step computes
 * (the block, the LSE merge, the dK/dV accumulation, the message's packing) is a backend
 * operation (kernels/backend.h: block attention, ring_merge, add, copy_rows), so on CUDA it
 * is queued on the backend's stream; with an exchange that queues its shifts as well
 * (shift_q: NCCL, on the backend's side stream beside the block, ordered by events) a call
 * makes no host wait at all, otherwise the host waits for the device before each step's
 * shifts. A call returns with its work queued (sync before reading). */
#ifndef COHORT_MODEL_RING_ATTENTION_H
#define COHORT_MODEL_RING_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kernels/backend.h"

/* One rank's view of the ring. shift sends send[0..nbytes) to rank (rank+1) % cp and
 * receives nbytes from rank (rank-1+cp) % cp into recv (distinct buffers); every rank calls
 * it the same number of times with the same nbytes. Blocking, with a timeout or abort;
 * returns 0 or a CO_E* code. */
typedef struct ring_exchange {
    int (*shift)(void *ctx, const void *send, void *recv, size_t nbytes);
    /* The same shift queued on a CUDA stream (the backend's side stream, kb_ops.side_stream,
     * or its stream) behind the work queued there, returning once queued; NULL where the
     * exchange has none (ring_sim, a ZeroMQ group). With it a queued backend's ring waits
     * for the device at no step. */
    int (*shift_q)(void *ctx, const void *send, void *recv, size_t nbytes, void *stream);
    void *ctx;
} ring_exchange;

typedef struct ring_geo {
    int cp, rank;      /* ring size and this rank */
    int B, seq;        /* sequences, and tokens per full sequence (seq % (2*cp) == 0) */
    int nh, nkv, hd;   /* query heads, key/value heads, head size */
} ring_geo;

/* 0, or CO_EINVAL naming what is wrong (seq not divisible by 2*cp, bad rank, ...). */
int ring_check(const ring_geo *g);

/* pos[0..seq/cp) = the global positions of rank's local tokens (chunk rank, then chunk
 * 2*cp-rank-1), the position ids of RoPE / learned positions. 0 or CO_EINVAL. */
int ring_positions(int32_t *pos, int seq, int cp, int rank);

/* dst[B][seq/cp] rows = rank's rows of src[B][seq] (rows of row_bytes bytes): the
 * load-balanced split of any per-token tensor. ring_unsplit_rows writes them back:
 * dst[B][seq] rows of rank from src[B][seq/cp]. 0 or CO_EINVAL. */
int ring_split_rows(void *dst, const void *src, size_t row_bytes, int B, int seq, int cp,
                    int rank);
int ring_unsplit_rows(void *dst, const void *src, size_t row_bytes, int B, int seq, int cp,
                      int rank);

/* Causal attention of the local tokens against the whole sequence (see top). out and lse
 * are overwritten. Calls x->shift cp-1 times. */
int ring_attention_forward(kb_backend *b, const ring_exchange *x, const ring_geo *g, float *out,
                           float *lse, const float *qkv, const int32_t *doc);

/* The ring's buffers, kept across calls (a queued backend's allocation waits for the
 * device); the calls without _ws allocate and free their own. One per backend and thread. */
typedef struct ring_ws ring_ws;
ring_ws *ring_ws_new(void); /* NULL when out of memory */
void ring_ws_free(ring_ws **ws);

/* ring_attention_forward with a workspace (NULL: the call's own) and, where out16 is set, the
 * output rounded once to bf16 into out16[B*L, nh*hd] after the last merge (out unused, may be
 * NULL; the running output is fp32 in the workspace). */
int ring_attention_forward_ws(kb_backend *b, ring_ws *ws, const ring_exchange *x, const ring_geo *g, float *out,
                              kb_bf16 *out16, float *lse, const float *qkv, const int32_t *doc);

/* Backward from the forward's out and lse: dqkv (overwritten) from dout. Calls x->shift
 * 2cp-1 times: at step i > 0 the dK/dV accumulator finished at step i-1, then (i < cp-1) the
 * next step's KV, both beside step i's block (a helper thread on the CPU; queued before it
 * with shift_q); and the last accumulator home after the last step. */
int ring_attention_backward(kb_backend *b, const ring_exchange *x, const ring_geo *g,
                            float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, const int32_t *doc);
/* ring_attention_backward with a workspace (NULL: the call's own) and, where out16 is set,
 * the forward's bf16 output (out unused): D = rowsum(O dO) from its bf16 values, as
 * kb_ops.attention_backward_bf16 takes them. */
int ring_attention_backward_ws(kb_backend *b, ring_ws *ws, const ring_exchange *x, const ring_geo *g, float *dqkv,
                               const float *dout, const float *qkv, const float *out, const kb_bf16 *out16,
                               const float *lse, const int32_t *doc);

/* ---- exchange over cohort's comm: blocking send/recv (the comm interface has no
 * non-blocking calls), even ranks send first and odd ranks receive first, so no pair waits
 * on the other. The ring is the communicator's ranks in order (c->size == cp). The forward
 * calls shift on a helper thread while it computes the current step's block (overlap), so
 * an exchange's shift must be callable from another thread than the caller's. ---- */
typedef struct ring_comm {
    cm_comm *c;
    int timeout_ms; /* per send or recv; < 0 without limit (cm_abort still ends it) */
} ring_comm;
/* x uses rc (which must outlive x). */
void ring_exchange_comm(ring_exchange *x, ring_comm *rc);

/* ---- exchange inside one process: cp threads, one per simulated rank, meet at each
 * shift. Each wait ends after timeout_ms (CO_ETIMEOUT, and the simulation is aborted for
 * every rank) or on ring_sim_abort (CO_EABORTED). ---- */
typedef struct ring_sim ring_sim;
int ring_sim_new(ring_sim **out, int cp, int timeout_ms);
/* The exchange of simulated rank `rank` (valid while the ring_sim lives). */
void ring_sim_exchange(ring_sim *s, int rank, ring_exchange *x);
void ring_sim_abort(ring_sim *s);
void ring_sim_free(ring_sim **s);

#endif
