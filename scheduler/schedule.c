/* schedule.c - Megatron's pipeline schedules as operation lists (see schedule.h). */
#include "scheduler/schedule.h"

#include "common/error.h"

#include <stdio.h>

int pp_sched_group(const pp_sched_cfg *c) { return c->group > 0 ? c->group : c->p; }

int pp_sched_check(const pp_sched_cfg *c) {
    if (c->p < 1 || c->p > PP_MAX_RANKS)
        return co_err_set(CO_EINVAL, "--pipeline-model-parallel-size %d is out of range (1..%d)", c->p, PP_MAX_RANKS);
    if (c->rank < 0 || c->rank >= c->p)
        return co_err_set(CO_EINVAL, "pipeline rank %d is out of range (0..%d for --pipeline-model-parallel-size %d)",
                          c->rank, c->p - 1, c->p);
    if (c->m < 1 || c->m > PP_MAX_MICROBATCHES)
        return co_err_set(CO_EINVAL, "the number of micro batches %d is out of range (1..%d)", c->m,
                          PP_MAX_MICROBATCHES);
    if (c->v < 1 || c->v > PP_MAX_CHUNKS)
        return co_err_set(CO_EINVAL, "the number of model chunks per pipeline rank %d is out of range (1..%d)", c->v,
                          PP_MAX_CHUNKS);
    if ((long long)c->m * c->v > PP_MAX_VIRTUAL_MICROBATCHES)
        return co_err_set(CO_EINVAL, "%d micro batches x %d model chunks = %lld virtual micro batches is more than %d",
                          c->m, c->v, (long long)c->m * c->v, PP_MAX_VIRTUAL_MICROBATCHES);
    if (c->group < 0)
        return co_err_set(CO_EINVAL, "--microbatch-group-size-per-virtual-pipeline-stage %d must be positive",
                          c->group);
    if (c->v == 1) return 0; /* the group size only shapes the interleaved schedule */
    if (c->p == 1) /* megatron/training/arguments.py */
        return co_err_set(CO_EINVAL, "%d model chunks per rank (the interleaved schedule) need "
                                     "--pipeline-model-parallel-size greater than 1", c->v);
    int g = pp_sched_group(c);
    if (g > c->m || g < c->p) /* forward_backward_pipelining_with_interleaving raises ValueError */
        return co_err_set(CO_EINVAL, "--microbatch-group-size-per-virtual-pipeline-stage %d must lie in [p, m] = "
                                     "[%d, %d] (pipeline size, micro batches)%s", g, c->p, c->m,
                          c->group ? "" : "; it defaults to the pipeline size, so the interleaved schedule needs at "
                                          "least that many micro batches");
    int rem = c->m % g;
    if (rem > 0 && rem < c->p) /* ... and RuntimeError: the last group would stall the pipeline */
        return co_err_set(CO_EINVAL, "%d micro batches mod --microbatch-group-size-per-virtual-pipeline-stage %d = "
                                     "%d: the remainder must be 0 or at least the pipeline size %d (a smaller last "
                                     "group leaves dependency bubbles; Megatron refuses it)", c->m, g, rem, c->p);
    return 0;
}

void pp_table(const pp_sched_cfg *c, int k, int *mb, int *chunk) {
    int m = c->m, v = c->v;
    int g = v > 1 ? pp_sched_group(c) : m; /* v = 1: the table is the identity, whatever g */
    /* get_schedule_table: groups start at 0, g, 2g, ... < m; a group whose end g past its
     * start reaches m is the last one and holds the rest; each group lists chunk 0's micro
     * batches, then chunk 1's, ... */
    int full = (m - 1) / g; /* groups before the last, each of g micro batches */
    long long in_full = (long long)full * g * v;
    if (k < in_full) {
        int grp = (int)(k / ((long long)g * v)), off = (int)(k % ((long long)g * v));
        *chunk = off / g;
        *mb = grp * g + off % g;
    } else {
        int off = (int)(k - in_full), size = m - full * g;
        *chunk = off / size;
        *mb = full * g + off % size;
    }
}

int pp_warmup(const pp_sched_cfg *c) {
    if (pp_sched_check(c)) return -1;
    if (c->p == 1) return 0; /* forward_backward_no_pipelining */
    long long total = (long long)c->m * c->v, w;
    if (c->v == 1) w = c->p - c->rank - 1; /* 1F1B */
    else w = 2LL * (c->p - c->rank - 1) + (long long)(c->v - 1) * pp_sched_group(c); /* get_pp_rank_microbatches */
    return (int)(w < total ? w : total);
}

/* Virtual micro batch k as the forward (backward: chunk reversed) operation. */
static pp_op vop(const pp_sched_cfg *c, int k, pp_kind kind) {
    pp_op o = {.kind = kind};
    pp_table(c, k, &o.mb, &o.chunk);
    if (kind == PP_BACKWARD) o.chunk = c->v - 1 - o.chunk;
    return o;
}

int pp_schedule(const pp_sched_cfg *c, pp_op *ops, int cap, int *n) {
    *n = 0;
    int rc = pp_sched_check(c);
    if (rc) return rc;
    int total = c->m * c->v;
    if (cap < 2 * total) return co_err_set(CO_ERANGE, "room for %d operations, the schedule has %d", cap, 2 * total);
    /* Three phases, as all three of Megatron's schedules run them (no pipelining: warm-up 0):
     * warm-up forwards 0..w-1; steady steps k = 0..total-w-1 of forward w+k then backward k;
     * cool-down backwards total-w..total-1. The backward of virtual micro batch k takes the
     * oldest forward output of its chunk (Megatron pops each chunk's list from the front):
     * the table's micro batch, chunk reversed. */
    int w = pp_warmup(c), i = 0;
    for (int k = 0; k < w; k++) ops[i++] = vop(c, k, PP_FORWARD);
    for (int k = 0; k < total - w; k++) {
        ops[i++] = vop(c, w + k, PP_FORWARD);
        ops[i++] = vop(c, k, PP_BACKWARD);
    }
    for (int k = total - w; k < total; k++) ops[i++] = vop(c, k, PP_BACKWARD);
    *n = i;
    return 0;
}

bool pp_exchange_step(const pp_sched_cfg *c, int i) {
    if (c->v == 1 || c->p == 1) return true;
    int w = pp_warmup(c), steady = 2 * (c->m * c->v - w);
    /* (in the steady phase the pair's backward receives with its forward) */
    return i < w || i >= w + steady || (i - w) % 2 == 0;
}

/* The wrap-around link of the interleaved schedule into this rank: the last rank's outputs
 * into rank 0's next chunk (forward), rank 0's input gradients into the last rank's previous
 * chunk (backward). */
static bool wraps_in(const pp_sched_cfg *c, const pp_op *o) {
    if (c->v == 1) return false;
    return o->kind == PP_FORWARD ? c->rank == 0 && o->chunk > 0 : c->rank == c->p - 1 && o->chunk < c->v - 1;
}

int pp_exchange_recvs(const pp_sched_cfg *c, const pp_op *ops, int n, int i, pp_op *r, int cap) {
    int k = 0, nf = 0, nb = 0;
    /* the step's own operations' receives, but for those of the wrap-around link */
    for (int j = i; j < n && (j == i || !pp_exchange_step(c, j)); j++) {
        pp_link l;
        pp_op_link(c, &ops[j], &l);
        if (l.from.rank < 0 || wraps_in(c, &ops[j])) continue;
        if (k == cap) return co_err_set(CO_ERANGE, "more than %d receives in a step of the exchange", cap);
        r[k++] = ops[j];
    }
    if (c->v == 1 || c->p == 1) return k;
    for (int j = 0; j < i && j < n; j++) {
        if (ops[j].kind == PP_FORWARD) nf++;
        else nb++;
    }
    /* the wrap-around link's, aligned with its sender (recv_tensor_from_previous_stage): the
     * leading stage (rank 0 forward, the last rank backward) is p - 1 steps ahead of the
     * ending one, so the step after its (nf-1)-th forward (nb-1)-th backward takes what the
     * sender's virtual micro batch nf - p (nb - p) sent, unless that was the sender's last
     * chunk (forward) or first (backward), which sends nothing round */
    int mb, ch;
    if (c->rank == 0 && nf - c->p >= 0) {
        pp_table(c, nf - c->p, &mb, &ch);
        if (ch < c->v - 1) {
            if (k == cap) return co_err_set(CO_ERANGE, "more than %d receives in a step of the exchange", cap);
            r[k++] = (pp_op){PP_FORWARD, mb, ch + 1};
        }
    }
    if (c->rank == c->p - 1 && nb - c->p >= 0) {
        pp_table(c, nb - c->p, &mb, &ch); /* (the backward runs chunk v-1-ch) */
        if (ch < c->v - 1) {
            if (k == cap) return co_err_set(CO_ERANGE, "more than %d receives in a step of the exchange", cap);
            r[k++] = (pp_op){PP_BACKWARD, mb, c->v - 2 - ch};
        }
    }
    return k;
}

void pp_op_link(const pp_sched_cfg *c, const pp_op *op, pp_link *l) {
    int p = c->p, r = c->rank, v = c->v, ch = op->chunk;
    pp_peer prev = {-1, -1}, next = {-1, -1};
    if (r > 0) prev = (pp_peer){r - 1, ch};
    else if (ch > 0) prev = (pp_peer){p - 1, ch - 1};
    if (r < p - 1) next = (pp_peer){r + 1, ch};
    else if (ch < v - 1) next = (pp_peer){0, ch + 1};
    l->first_stage = r == 0 && ch == 0;
    l->last_stage = r == p - 1 && ch == v - 1;
    if (op->kind == PP_FORWARD) {
        l->from = prev;
        l->to = next;
    } else {
        l->from = next;
        l->to = prev;
    }
}

int pp_op_str(const pp_op *op, char *buf, size_t n) {
    return snprintf(buf, n, "%c%d.%d", op->kind == PP_FORWARD ? 'F' : 'B', op->mb, op->chunk);
}
