/* moe_internal.h - the MoE layer's state, shared by moe.c (routing, the experts' products,
 * forward and backward on one rank) and moe_ep.c (expert parallelism: the token
 * dispatchers). Private to model/: not part of moe.h's interface. */
#ifndef COHORT_MODEL_MOE_INTERNAL_H
#define COHORT_MODEL_MOE_INTERNAL_H

#include "comm/comm.h"
#include "model/moe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The expert side of expert parallelism: rows received from the group, grown on demand. */
typedef struct moe__ep {
    cm_comm *c;             /* the expert-parallel group, or NULL */
    moe_dispatcher disp;
    int timeout_ms;
    int size, rank, El, e0; /* group size and rank; local experts [e0, e0 + El) */
    int etp;                /* expert-tensor ranks per expert rank (1: whole experts): member g is
                               expert rank g / etp */
    float *dup, *home;      /* etp > 1, alltoall: [maxM*etp,h] each rank's rows once per member
                               of their expert rank; the members' partial rows come home */
    size_t cap;             /* rows the buffers below hold */
    float *xs;              /* [cap,h] rows in arrival (source-major) order, for any exchange */
    float *xr, *h1, *act, *out, *dact, *dh1, *dx; /* expert-major: [cap,h|F1|F|h|F|F1|h] */
    int32_t *roff;          /* [El+1] expert-major offsets of the local experts' rows */
    int32_t *perm;          /* [cap] expert-major row -> source-major row */
    int32_t *scnt, *rcnt;   /* [size*El] rows sent to / received from each rank per local expert */
    size_t *sbytes, *rbytes;/* [size] */
    size_t R;               /* rows received in the last forward */
    /* allgather dispatcher: the group's tokens */
    float *xg, *pg;         /* [size*maxN,h], [size*maxN,E] */
    uint8_t *mg;            /* [size*maxN,E] */
    float *yg;              /* [size*maxN,h] partial outputs, then input gradients */
    double *dpg;            /* [size*maxN,E] */
    int32_t *rtok;          /* [cap] gathered token of each expert-major row */
    /* the permutations' tables in backend memory (backend.h gather_rows, combine_rows), copied
     * from the host's: [cap] each, the allgather's per-token offsets [size*maxN+1] */
    int32_t *d_perm;        /* alltoall: expert-major row -> source-major row; allgather: rtok */
    int32_t *d_inv;         /* alltoall: source-major row -> expert-major row */
    int32_t *goff, *grow;   /* allgather (host): each gathered token's rows, in expert order */
    float *gw;              /* allgather (host): their routing probabilities */
    int32_t *d_goff, *d_grow;
    float *d_gw, *d_rw;     /* allgather: goff's weights; each expert-major row's */
    double *d_dw;           /* allgather: each row's probability gradient (read by the host after a wait) */
    uint64_t bytes_out;     /* bytes this rank sent to peers (both directions of every exchange) */
    double dispatch_s;      /* seconds in dispatch and combine (exchanges, sorting; not the experts) */
} moe__ep;

struct moe_layer {
    moe_config c;
    moe_offsets off;
    kb_backend *be;
    const kb_ops *o;
    int maxN, maxM, E, h, k, F, F1, Fs, Fs1; /* F, F1: this rank's slice of an expert (etp_size) */
    /* backend memory */
    float *logits;          /* [maxN,E] */
    float *xp, *h1, *act;   /* [maxM,h], [maxM,F1], [maxM,F] */
    float *out;             /* [maxM,h] */
    float *dout, *dact;     /* [maxM,h], [maxM,F] */
    float *dh1, *dxp;       /* [maxM,F1], [maxM,h] */
    float *dlogits;         /* [maxN,E] */
    float *s_h1, *s_act;    /* [maxN,Fs1], [maxN,Fs] */
    float *s_dact, *s_dh1;  /* [maxN,Fs], [maxN,Fs1] */
    float *tmp;             /* [maxN,h] */
    /* host memory */
    int32_t *sel;           /* [maxN,k] selected experts, best first */
    float *rprobs;          /* [maxN,E] routing probs before dropping (0 where not selected) */
    float *probs;           /* [maxN,E] after dropping */
    uint8_t *map0, *map;    /* [maxN,E] selected / dispatched */
    double *lse;            /* [maxN] */
    float *auxs;            /* [maxN,E] scores of the aux losses */
    int32_t *auxcnt;        /* [maxN*sq_size*E]: counts per sequence (seq_aux) or [E] (aux),
                             over the whole micro batch under sequence parallelism */
    int32_t *tpe;           /* [E] */
    int32_t *eoff;          /* [E+1] */
    int32_t *row_tok;       /* [maxM] */
    int32_t *row_exp;       /* [maxM] */
    double *dprob;          /* [maxN,E] */
    double *rs;             /* [E] scratch: selection scores */
    double *gs;             /* [E] scratch */
    uint8_t *elig;          /* [E] scratch */
    double *snorm, *sd0, *sd1; /* sinkhorn routing: [maxN,E] the balanced scores, [maxN], [E] */
    bool train;             /* the forward trains (moe_set_training) */
    struct cand { float v; int32_t n; } *cand; /* [maxN] */
    /* the permutations on the backend (backend.h gather_rows, combine_rows, combine_backward):
     * the host's tables copied into backend memory each forward. Rows r < M are expert-major
     * (row_tok, row_exp); token n's rows are trow[toff[n] .. toff[n+1]) in expert order with
     * their probabilities tw; rw[r] is row r's probability, d_dw[r] its gradient (read by
     * the host after the backward's wait). */
    int32_t *toff, *trow;   /* host: [maxN+1], [maxM] */
    float *tw, *rw;         /* host: [maxM] each */
    int32_t *d_rowtok, *d_toff, *d_trow; /* backend copies of row_tok, toff, trow */
    float *d_tw, *d_rw;
    double *d_dw;
    /* bf16 input (moe_set_input16): x holds bf16, widened into x32 (shared scratch [maxN,h])
     * for the router and the shared expert; the bf16 copies of params (moe_set_params16) */
    bool x16;
    float *x32;
    const kb_bf16 *p16;
    /* expert parallelism (moe_ep.c): ep NULL = every expert on this rank (El = E, e0 = 0) */
    moe__ep ep;
    /* sequence and context parallelism (moe_set_token_group): the group whose ranks hold the
     * micro batch's other tokens, or NULL (sq_size 1, sq_rank 0); its first sq_shards ranks
     * (the tensor ranks) split one B x T batch's rows, the sq_size / sq_shards context ranks
     * hold other parts of the same sequences */
    cm_comm *sq;
    int sq_size, sq_rank, sq_timeout, sq_shards;
    int64_t *sq_cnt;        /* [maxN*sq_size*E] the aux counts summed over the group */
    /* global_aux_loss (moe_set_global_group): the data-parallel group, the layer holding the
     * step's running sum of the global counts (this one or another slot's), that sum [E],
     * the forwards it holds, and the last forward's mean counts [E] */
    struct cm_comm *gdp;
    int gdp_timeout;
    struct moe_layer *gacc;
    int64_t *gsum;
    int64_t gsteps;
    double *gavg;
    /* padding rows (moe_set_padding): the caller's row ids of the whole B x T batch (< 0:
     * padding), or NULL; the last forward's flags for this rank's N rows (1: padding), whether
     * it had a mask, the real rows per aux sequence summed over the token group [maxN] and
     * their total, this rank's real rows, and the global aux loss's token count */
    const int32_t *pad_rows;
    uint8_t *pad;
    bool masked;
    int64_t *vseq;
    int64_t vtot;
    int nvalid;             /* this rank's real rows */
    double gT;
    /* the last forward (N: this rank's tokens; B x T: the whole micro batch's) */
    int N, B, T, M, cap, dropped;
    double aux, z;
    bool have_fwd;
};

/* The products of experts [0, n) of the local table (params' fc1/fc2 index j) over rows
 * off[j]..off[j+1] of xin: h1, act, out (forward); dout -> dact, dh1, dxin and the weight
 * gradients (backward, accumulating). */
void moe__experts_forward(moe_layer *m, const float *params, const float *xin, float *h1, float *act, float *out,
                          const int32_t *off, int n);
void moe__experts_backward(moe_layer *m, const float *params, float *dparams, const float *dout, const float *xin,
                           const float *h1, const float *act, float *dact, float *dh1, float *dxin,
                           const int32_t *off, int n);

/* moe_ep.c: with an expert group, the forward's expert part (from m->xp, m->eoff, m->tpe to
 * m->out rows in m->xp's order; the allgather dispatcher: to y directly) and the backward's
 * (from m->dout to m->dxp; allgather: dy to dx's expert part and m->dprob). */
/* x: the layer's input in fp32 (widened already under bf16 input) */
int moe__ep_forward(moe_layer *m, const float *params, const float *x, float *y);
int moe__ep_backward(moe_layer *m, const float *params, float *dparams, const float *dy, float *dx_experts);
void moe__ep_free(moe_layer *m);

#endif
