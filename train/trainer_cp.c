/* trainer_cp.c - the trainer's context parallelism (docs/context-parallel.md): the context
 * and data x context groups, each micro batch cut to this rank's tokens, the loss tokens of
 * the whole sequences.
 *
 * Every context rank (tensor rank 0 of it, then broadcast to its tensor group) reads the
 * whole micro batch and keeps its share:
 *   sequence split (default): of each sequence of seq tokens, chunks r and 2cp-r-1 of the
 *     2cp chunks (ring_split_rows); the document starts (seg) become the document ids of the
 *     local tokens, so --reset-attention-mask works through the ring's document ids;
 *   THD (packed sequences: --sft, or --cp-packed-sequences with --reset-attention-mask): the
 *     documents of each sequence (cu_seqlens, from the document starts) are each padded to a
 *     multiple of 2cp (cu_seqlens_padded; the padding follows the document's real tokens,
 *     with loss mask 0, the document's id and its last position) and EACH DOCUMENT is split
 *     by the same rule; the local tokens are chunk r of every document, then chunk 2cp-r-1 of
 *     every document, which is exactly the layout whose structural causal rule
 *     ring_attention applies (see the header of model/ring_attention.h). The sequences of a
 *     micro batch share one padded length: the shorter ones get a trailing padding document.
 *     The padded length is at most cap_total (--cp-packed-capacity x seq, rounded up to 2cp);
 *     a micro batch that needs more is refused (CO_EINVAL naming it).
 * The loss is normalised by the loss tokens of the whole sequences (counted before the
 * split, the same on every context rank), and the trainer sums loss and token counts over
 * the data x context group (the bug class of Megatron #7452). */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "model/ring_attention.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trainer__cp_set_groups(trainer *t, const tr_groups *g) {
    if (t->cpn <= 1) return;
    t->g.cp = g->cp;
    t->g.dpcp = g->dpcp;
    t->g.tpcp = g->tpcp;
    gpt_set_context_group(t->model, g->cp, TRAIN_COMM_TIMEOUT_MS);
    /* (the MoE layers' token group under tensor parallelism too) */
    if (t->cfg.num_experts > 0 && t->tp_size > 1) gpt_set_moe_token_group(t->model, g->tpcp, TRAIN_COMM_TIMEOUT_MS);
    kb_backend_clear_status(t->be); /* a ring shift the last generation's abort failed */
}

static int round_up(int a, int m) { return (a + m - 1) / m * m; }

int trainer__cp_setup(trainer *t, const trainer_data *data, gpt_config *m) {
    const co_config *c = &t->cfg;
    t->cpn = c->context_parallel_size > 1 ? c->context_parallel_size : 1;
    t->local_T = c->seq_length;
    if (t->cpn == 1) return 0;
    if (!data->groups.cp || data->groups.cp->size != t->cpn || !data->groups.dpcp)
        return co_err_set(CO_EINVAL, "a context group of %d ranks (and the data x context group) for "
                                     "--context-parallel-size %d", data->groups.cp ? data->groups.cp->size : 0, t->cpn);
    if (c->seq_length % (2 * t->cpn))
        return co_err_set(CO_EINVAL, "the sequence length %d is not divisible by 2 * context-parallel-size = %d",
                          c->seq_length, 2 * t->cpn);
    t->g.cp = data->groups.cp;
    t->g.dpcp = data->groups.dpcp;
    t->g.tpcp = data->groups.tpcp;
    t->cpr = t->g.cp->rank;
    t->thd = c->sft || c->cp_packed_sequences;
    t->docs = c->sft || c->reset_attention_mask;
    /* the padded length of a micro batch's sequences is a multiple of 2cp, and under sequence
     * parallelism of 2cp x tp, so that the local tokens split over the tensor group */
    t->thd_quantum = 2 * t->cpn * (c->sequence_parallel && t->tp_size > 1 ? t->tp_size : 1);
    t->cap_total = t->thd ? round_up((int)(c->cp_packed_capacity * c->seq_length), t->thd_quantum) : c->seq_length;
    t->local_T = t->cap_total / t->cpn;
    if (t->local_T > c->seq_length) /* (the batch buffers hold a whole sequence per sample) */
        return co_err_set(CO_EINVAL, "--cp-packed-capacity %g: %d padded tokens per sequence, %d per context rank, "
                                     "more than --seq-length %d", c->cp_packed_capacity, t->cap_total, t->local_T,
                          c->seq_length);
    m->cp = t->cpn;
    m->cp_rank = t->cpr;
    m->cp_thd = t->thd;
    if (t->log && t->thd)
        fprintf(t->log, "cohort: context parallelism %d: per-document split (THD: documents padded to multiples of %d, "
                        "at most %d tokens per sequence, %d per rank)\n", t->cpn, t->thd_quantum, t->cap_total,
                t->local_T);
    else if (t->log)
        fprintf(t->log, "cohort: context parallelism %d: load-balanced sequence split (chunks r and %d-r of %d), %d "
                        "tokens per sequence on each rank\n", t->cpn, 2 * t->cpn - 1, 2 * t->cpn, t->local_T);
    size_t N = (size_t)c->micro_batch_size * c->seq_length;
    t->cp_i32 = malloc(4 * N * sizeof(int32_t));
    t->cp_f32 = malloc(N * sizeof(float));
    t->cp_rows = malloc(N * sizeof(int32_t));
    if (!t->cp_i32 || !t->cp_f32 || !t->cp_rows) return co_err_set(CO_ENOMEM, "context parallelism: out of memory");
    return 0;
}

void trainer__cp_free(trainer *t) {
    free(t->cp_i32);
    free(t->cp_f32);
    free(t->cp_rows);
    t->cp_i32 = NULL;
    t->cp_f32 = NULL;
    t->cp_rows = NULL;
}

/* The sequence split: every per-token array to this rank's chunks. */
static int split_sequences(trainer *t, tr_batch *x, int B, int T) {
    size_t N = (size_t)B * T;
    int32_t *full[4] = {x->tokens, x->targets, x->positions, x->seg};
    int rc = 0;
    for (int k = 0; k < 4 && !rc; k++) {
        memcpy(t->cp_i32 + k * N, full[k], N * sizeof(int32_t));
        rc = ring_split_rows(full[k], t->cp_i32 + k * N, sizeof(int32_t), B, T, t->cpn, t->cpr);
    }
    memcpy(t->cp_f32, x->mask, N * sizeof(float));
    if (!rc) rc = ring_split_rows(x->mask, t->cp_f32, sizeof(float), B, T, t->cpn, t->cpr);
    /* each local token's row in the whole batch (the rows' indices, split alike) */
    for (size_t i = 0; i < N && !rc; i++) t->cp_i32[i] = (int32_t)i;
    if (!rc) rc = ring_split_rows(t->cp_rows, t->cp_i32, sizeof(int32_t), B, T, t->cpn, t->cpr);
    return rc;
}

/* THD: the documents of each sequence padded to 2cp and split one by one (see top). */
static int split_documents(trainer *t, tr_batch *x, int B, int T, int64_t first, int *local_T) {
    const int c2 = 2 * t->cpn, r = t->cpr;
    size_t N = (size_t)B * T;
    int32_t *tok = t->cp_i32, *tgt = tok + N, *pos = tgt + N, *seg = pos + N;
    float *mask = t->cp_f32;
    memcpy(tok, x->tokens, N * sizeof(int32_t));
    memcpy(tgt, x->targets, N * sizeof(int32_t));
    memcpy(pos, x->positions, N * sizeof(int32_t));
    memcpy(seg, x->seg, N * sizeof(int32_t));
    memcpy(mask, x->mask, N * sizeof(float));
    /* the micro batch's padded length: the longest sequence's sum of padded documents */
    int P = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *sg = seg + (size_t)b * T;
        int p = 0;
        for (int i = 0, j; i < T; i = j) {
            for (j = i + 1; j < T && sg[j] == sg[i]; j++) {
            }
            p += round_up(j - i, c2);
        }
        if (round_up(p, t->thd_quantum) > t->cap_total)
            return co_err_set(CO_EINVAL, "sample %lld: its documents padded to multiples of 2 * context-parallel-size "
                                         "= %d take %d tokens, more than the packed capacity %d (--cp-packed-capacity %g x "
                                         "--seq-length): too many short documents for the per-document split; raise "
                                         "--cp-packed-capacity or split whole sequences",
                              (long long)(first + b), c2, p, t->cap_total, t->cfg.cp_packed_capacity);
        if (p > P) P = p;
    }
    P = round_up(P, t->thd_quantum); /* (the trailing padding document takes the rest) */
    const int L = P / t->cpn, H = L / 2;
    for (int b = 0; b < B; b++) {
        const size_t o = (size_t)b * T, lo = (size_t)b * L;
        const int32_t *sg = seg + o;
        int h = 0, p = 0; /* local tokens written per half; padded tokens so far */
        for (int i = 0, j; i < P; i = j) {
            /* a document [i, j) of the sequence, or the trailing padding document */
            int len, id, last;
            if (i < T) {
                for (j = i + 1; j < T && sg[j] == sg[i]; j++) {
                }
                len = j - i, id = sg[i], last = j - 1;
            } else {
                j = i; /* (i counts real tokens; the padding document has none) */
                len = 0, id = T, last = T - 1;
            }
            const int Pd = i < T ? round_up(len, c2) : P - p, S = Pd / c2;
            for (int half = 0; half < 2; half++) {
                const int k = half ? c2 - r - 1 : r; /* the chunk of this document */
                for (int q = 0; q < S; q++) {
                    const int v = k * S + q; /* index in the padded document */
                    const size_t d = lo + (size_t)half * H + h + q;
                    if (v < len) {
                        const size_t s = o + i + v;
                        x->tokens[d] = tok[s], x->targets[d] = tgt[s], x->positions[d] = pos[s];
                        x->mask[d] = mask[s];
                        t->cp_rows[d] = (int32_t)s;
                    } else {
                        x->tokens[d] = 0, x->targets[d] = 0, x->mask[d] = 0.0f;
                        x->positions[d] = pos[o + last]; /* a position the table has */
                        t->cp_rows[d] = -1;
                    }
                    x->seg[d] = id;
                }
            }
            h += S;
            p += Pd;
            if (i >= T) break;
        }
        if (h != H) return co_err_set(CO_EINTERNAL, "THD split: %d local tokens per half, expected %d", h, H);
    }
    *local_T = L;
    return 0;
}

int trainer__cp_localize(trainer *t, tr_batch *x, gpt_batch *b, int64_t first) {
    const int B = b->B, T = b->T;
    size_t N = (size_t)B * T;
    double ntok = 0;
    for (size_t i = 0; i < N; i++) ntok += x->mask[i];
    t->cp_ntok = ntok;
    if (x->full) {
        /* (the MTP depths roll the whole sequences: model/gpt_mtp.c) */
        memcpy(x->full, x->tokens, N * sizeof(int32_t));
        memcpy(x->full + N, x->targets, N * sizeof(int32_t));
        memcpy(x->full + 2 * N, x->positions, N * sizeof(int32_t));
        memcpy(x->full_mask, x->mask, N * sizeof(float));
        b->full_tokens = x->full, b->full_targets = x->full + N, b->full_positions = x->full + 2 * N;
        b->full_mask = x->full_mask;
        b->full_T = T;
    }
    int L = T / t->cpn, rc;
    if (t->thd) rc = split_documents(t, x, B, T, first, &L);
    else rc = split_sequences(t, x, B, T);
    if (rc) return rc;
    b->T = L;
    b->seg = t->docs ? x->seg : NULL;
    b->rows = t->cp_rows;
    return 0;
}
