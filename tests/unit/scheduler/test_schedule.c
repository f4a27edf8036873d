/* test_schedule.c - pipeline schedules and layer placement (scheduler/schedule.h,
 * scheduler/placement.h): for many (p, v, m, group) every (micro batch, chunk) runs forward
 * once and backward once on every rank, each backward after its forward, in the three
 * phases with Megatron's warm-up counts; a discrete-event simulation runs all ranks' lists
 * at once (blocking receives, buffered sends) and finds no deadlock, every input received
 * after it was sent, each channel's messages consumed in the order they were sent, and the
 * iteration as long as the bubble formula (p-1)/(v*m) says. Placement: Megatron's own
 * examples, layouts, refusals. The lists and placements themselves are compared with a
 * Python restatement of Megatron's code by the integration test cli_schedule
 * (tests/data/pp_schedule_ref.py). */
#include "common/error.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"
#include "tests/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The scheduler's functions with the detail of a refusal copied into err (which the
 * assertions read). */
static int sched_check(const pp_sched_cfg *c, char *err, size_t n) {
    int rc = pp_sched_check(c);
    snprintf(err, n, "%s", rc ? co_err_detail() : "");
    return rc;
}
static int schedule(const pp_sched_cfg *c, pp_op *ops, int cap, int *k, char *err, size_t n) {
    int rc = pp_schedule(c, ops, cap, k);
    snprintf(err, n, "%s", rc ? co_err_detail() : "");
    return rc;
}
static int place_chunks(const pp_place_cfg *c, char *err, size_t n) {
    int v = pp_place_chunks(c);
    snprintf(err, n, "%s", v < 0 ? co_err_detail() : "");
    return v;
}
static int placement(const pp_place_cfg *c, pp_stage *st, int cap, int *v, char *err, size_t n) {
    int rc = pp_placement(c, st, cap, v);
    snprintf(err, n, "%s", rc ? co_err_detail() : "");
    return rc;
}
static char *layout_expand(const char *layout, int *ns, int *rc, char *err, size_t n) {
    char *x;
    *rc = pp_layout_expand(layout, &x, ns);
    snprintf(err, n, "%s", *rc ? co_err_detail() : "");
    return x;
}

/* Every valid configuration of the grids the cases walk: p 1..8, v 1..4, m 1..20, every group. */
#define FOR_CONFIGS(c)                                                                         \
    for (int p_ = 1; p_ <= 8; p_++)                                                            \
        for (int v_ = 1; v_ <= 4; v_++)                                                        \
            for (int m_ = 1; m_ <= 20; m_++)                                                   \
                for (int g_ = v_ == 1 ? 0 : p_; g_ <= (v_ == 1 ? 0 : m_); g_++)                \
                    for (pp_sched_cfg c = {.p = p_, .m = m_, .v = v_, .group = g_}; c.p; c.p = 0) \
                        if (sched_check(&c, err, sizeof err) == 0)

static int count_configs;

static void phases_and_counts(void) {
    char err[400];
    count_configs = 0;
    FOR_CONFIGS(c) {
        count_configs++;
        int T = c.m * c.v, n;
        pp_op *ops = malloc(sizeof *ops * (size_t)(2 * T));
        int *fwd = calloc((size_t)T, sizeof *fwd), *bwd = calloc((size_t)T, sizeof *bwd);
        REQUIRE(ops && fwd && bwd);
        for (c.rank = 0; c.rank < c.p; c.rank++) {
            REQUIRE(schedule(&c, ops, 2 * T, &n, err, sizeof err) == 0);
            REQUIRE(n == 2 * T);
            memset(fwd, 0, sizeof *fwd * (size_t)T);
            memset(bwd, 0, sizeof *bwd * (size_t)T);
            int w = pp_warmup(&c), first_b = -1;
            /* Megatron's warm-up: none without pipelining, p-r-1 for 1F1B, 2(p-r-1)+(v-1)g
             * interleaved; at most all m*v forwards */
            int want = c.p == 1 ? 0 : c.v == 1 ? c.p - c.rank - 1 : 2 * (c.p - c.rank - 1) + (c.v - 1) * pp_sched_group(&c);
            CHECK_MSG(w == (want < T ? want : T), "p %d r %d m %d v %d g %d: warm-up %d", c.p, c.rank, c.m, c.v, c.group, w);
            int next_f[4] = {0}, next_b[4] = {0};
            for (int i = 0; i < n; i++) {
                const pp_op *o = &ops[i];
                REQUIRE(o->mb >= 0 && o->mb < c.m && o->chunk >= 0 && o->chunk < c.v);
                int k = o->chunk * c.m + o->mb;
                /* the phases: w forwards, then pairs (forward, backward), then backwards */
                pp_kind phase = i < w ? PP_FORWARD : i >= 2 * T - w ? PP_BACKWARD : (i - w) % 2 ? PP_BACKWARD : PP_FORWARD;
                CHECK_MSG(o->kind == phase, "p %d r %d m %d v %d: op %d", c.p, c.rank, c.m, c.v, i);
                if (o->kind == PP_FORWARD) {
                    fwd[k]++;
                    /* each chunk takes its micro batches in order, forward and backward */
                    CHECK(o->mb == next_f[o->chunk]++);
                } else {
                    bwd[k]++;
                    CHECK_MSG(fwd[k] == 1, "p %d r %d m %d v %d: B%d.%d before its forward", c.p, c.rank, c.m, c.v, o->mb,
                              o->chunk);
                    CHECK(o->mb == next_b[o->chunk]++);
                    if (first_b < 0) first_b = i;
                }
            }
            for (int k = 0; k < T; k++) CHECK(fwd[k] == 1 && bwd[k] == 1);
            /* the forwards before the first backward: the warm-up and the first steady one */
            CHECK(first_b == (w < T ? w + 1 : T));
        }
        free(ops);
        free(fwd);
        free(bwd);
    }
    CHECK(count_configs > 1000);
    fprintf(stderr, "  %d configurations\n", count_configs);
}

/* The example in Megatron's comments (PP 2, group 3, m 5, v 2): the forward order of
 * virtual micro batches 0..9 is micro batches 0 1 2 0 1 2 3 4 3 4 of chunks 0 0 0 1 1 1 0 0
 * 1 1; backwards run the same micro batches with the chunks reversed. */
static void megatron_example(void) {
    char err[200];
    pp_sched_cfg c = {.p = 2, .rank = 0, .m = 5, .v = 2, .group = 3};
    REQUIRE(sched_check(&c, err, sizeof err) == 0);
    static const int mb[10] = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4}, ch[10] = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
    for (int k = 0; k < 10; k++) {
        int b, h;
        pp_table(&c, k, &b, &h);
        CHECK(b == mb[k] && h == ch[k]);
    }
    pp_op ops[20];
    int n;
    REQUIRE(schedule(&c, ops, 20, &n, err, sizeof err) == 0);
    /* warm-up 2(2-0-1) + (2-1)*3 = 5 */
    const char *want = "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 B1.0 B2.0 B3.1 B4.1 B3.0 B4.0";
    char got[400] = "";
    for (int i = 0; i < n; i++) {
        char b[16];
        pp_op_str(&ops[i], b, sizeof b);
        if (i) strcat(got, " ");
        strcat(got, b);
    }
    CHECK_MSG(!strcmp(got, want), "%s", got);
    CHECK(pp_warmup(&c) == 5);
    /* 1F1B, 4 stages, rank 1: warm-up 2 */
    c = (pp_sched_cfg){.p = 4, .rank = 1, .m = 4, .v = 1};
    REQUIRE(schedule(&c, ops, 20, &n, err, sizeof err) == 0);
    CHECK(n == 8 && ops[0].kind == PP_FORWARD && ops[2].kind == PP_FORWARD && ops[2].mb == 2 && ops[3].kind == PP_BACKWARD &&
          ops[3].mb == 0 && ops[7].kind == PP_BACKWARD && ops[7].mb == 3);
    CHECK(schedule(&c, ops, 7, &n, err, sizeof err) == CO_ERANGE);
}

static void links(void) {
    pp_sched_cfg c = {.p = 4, .rank = 0, .m = 8, .v = 2};
    pp_link l;
    pp_op f = {PP_FORWARD, 3, 0}, b = {PP_BACKWARD, 3, 0};
    pp_op_link(&c, &f, &l);
    CHECK(l.first_stage && !l.last_stage && l.from.rank == -1 && l.to.rank == 1 && l.to.chunk == 0);
    pp_op_link(&c, &b, &l);
    CHECK(l.first_stage && l.from.rank == 1 && l.from.chunk == 0 && l.to.rank == -1);
    f.chunk = b.chunk = 1; /* rank 0, chunk 1: from the last rank's chunk 0 */
    pp_op_link(&c, &f, &l);
    CHECK(!l.first_stage && l.from.rank == 3 && l.from.chunk == 0 && l.to.rank == 1 && l.to.chunk == 1);
    pp_op_link(&c, &b, &l);
    CHECK(l.to.rank == 3 && l.to.chunk == 0 && l.from.rank == 1 && l.from.chunk == 1);
    c.rank = 3;
    f.chunk = b.chunk = 0; /* the last rank's chunk 0 feeds rank 0's chunk 1 */
    pp_op_link(&c, &f, &l);
    CHECK(l.to.rank == 0 && l.to.chunk == 1 && !l.last_stage);
    f.chunk = b.chunk = 1;
    pp_op_link(&c, &f, &l);
    CHECK(l.last_stage && l.to.rank == -1 && l.from.rank == 2 && l.from.chunk == 1);
    pp_op_link(&c, &b, &l);
    CHECK(l.last_stage && l.from.rank == -1 && l.to.rank == 2 && l.to.chunk == 1);
    /* one rank, one chunk: no peers */
    c = (pp_sched_cfg){.p = 1, .rank = 0, .m = 2, .v = 1};
    pp_op_link(&c, &f, &l);
    f.chunk = 0;
    pp_op_link(&c, &f, &l);
    CHECK(l.first_stage && l.last_stage && l.from.rank == -1 && l.to.rank == -1);
}

/* All ranks' lists run together. An operation starts when its rank is free and its input
 * has arrived (a blocking receive; a backward also needs its own forward, done earlier on
 * the rank); sends are buffered (a rank never waits for its receiver). Forwards take tf
 * and backwards tb time units per chunk. Returns the makespan, or -1 on a deadlock. */
typedef struct sim {
    int p, m, v;
    long long *done; /* [rank][kind][chunk][mb]: finish time, -1 = not yet */
    int *sent, *recv; /* per channel (src, dst, kind): the (mb, chunk) sequence, as ints */
    int *nsent, *nrecv;
} sim;

static long long *done_at(sim *s, int r, int k, int c, int mb) {
    return &s->done[(((size_t)r * 2 + (size_t)k) * (size_t)s->v + (size_t)c) * (size_t)s->m + (size_t)mb];
}

static long long simulate(const pp_sched_cfg *base, int tf, int tb, bool *fifo_ok, bool *deps_ok) {
    char err[200];
    int p = base->p, m = base->m, v = base->v, T = m * v, n;
    sim s = {.p = p, .m = m, .v = v};
    s.done = malloc(sizeof *s.done * (size_t)p * 2 * (size_t)T);
    pp_op *ops = malloc(sizeof *ops * (size_t)p * 2 * (size_t)T);
    int nch = p * p * 2;
    s.sent = malloc(sizeof *s.sent * (size_t)nch * (size_t)T);
    s.recv = malloc(sizeof *s.recv * (size_t)nch * (size_t)T);
    s.nsent = calloc((size_t)nch, sizeof *s.nsent);
    s.nrecv = calloc((size_t)nch, sizeof *s.nrecv);
    int *ptr = calloc((size_t)p, sizeof *ptr);
    long long *free_at = calloc((size_t)p, sizeof *free_at), end = 0;
    if (!s.done || !ops || !s.sent || !s.recv || !s.nsent || !s.nrecv || !ptr || !free_at) abort();
    for (size_t i = 0; i < (size_t)p * 2 * (size_t)T; i++) s.done[i] = -1;
    for (int r = 0; r < p; r++) {
        pp_sched_cfg c = *base;
        c.rank = r;
        if (schedule(&c, ops + (size_t)r * 2 * T, 2 * T, &n, err, sizeof err)) abort();
    }
    *fifo_ok = *deps_ok = true;
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < p; r++) {
            pp_sched_cfg c = *base;
            c.rank = r;
            while (ptr[r] < 2 * T) {
                const pp_op *o = &ops[(size_t)r * 2 * T + (size_t)ptr[r]];
                pp_link l;
                pp_op_link(&c, o, &l);
                long long start = free_at[r];
                if (l.from.rank >= 0) {
                    long long t = *done_at(&s, l.from.rank, o->kind, l.from.chunk, o->mb);
                    if (t < 0) break; /* blocked on the receive */
                    if (t > start) start = t;
                    int ch = (l.from.rank * p + r) * 2 + (int)o->kind;
                    s.recv[(size_t)ch * T + (size_t)s.nrecv[ch]++] = o->mb * v + o->chunk;
                }
                if (o->kind == PP_BACKWARD) {
                    long long t = *done_at(&s, r, PP_FORWARD, o->chunk, o->mb);
                    if (t < 0 || t > start) *deps_ok = false;
                }
                long long fin = start + (o->kind == PP_FORWARD ? tf : tb);
                *done_at(&s, r, o->kind, o->chunk, o->mb) = fin;
                free_at[r] = fin;
                if (fin > end) end = fin;
                if (l.to.rank >= 0) {
                    int ch = (r * p + l.to.rank) * 2 + (int)o->kind;
                    s.sent[(size_t)ch * T + (size_t)s.nsent[ch]++] = o->mb * v + l.to.chunk;
                }
                ptr[r]++;
                progress = true;
            }
        }
    }
    for (int r = 0; r < p; r++)
        if (ptr[r] < 2 * T) end = -1;
    for (int ch = 0; ch < nch && end >= 0; ch++) {
        if (s.nsent[ch] != s.nrecv[ch]) *fifo_ok = false;
        for (int i = 0; i < s.nsent[ch] && i < s.nrecv[ch]; i++)
            if (s.sent[(size_t)ch * T + (size_t)i] != s.recv[(size_t)ch * T + (size_t)i]) *fifo_ok = false;
    }
    free(s.done);
    free(ops);
    free(s.sent);
    free(s.recv);
    free(s.nsent);
    free(s.nrecv);
    free(ptr);
    free(free_at);
    return end;
}

static void simulation(void) {
    char err[400];
    static const int times[][2] = {{1, 2}, {1, 1}, {3, 1}, {2, 5}};
    int runs = 0;
    FOR_CONFIGS(c) {
        for (int t = 0; t < 4; t++) {
            int tf = times[t][0], tb = times[t][1];
            bool fifo, deps;
            long long end = simulate(&c, tf, tb, &fifo, &deps);
            runs++;
            CHECK_MSG(end >= 0, "deadlock: p %d m %d v %d group %d", c.p, c.m, c.v, c.group);
            CHECK_MSG(deps, "p %d m %d v %d group %d: a backward before its forward", c.p, c.m, c.v, c.group);
            CHECK_MSG(fifo, "p %d m %d v %d group %d: a channel's messages received out of order", c.p, c.m, c.v, c.group);
            /* with every chunk's forward (backward) taking tf (tb), the iteration lasts the
             * work of one rank, m v (tf + tb), plus the bubble (p-1)(tf + tb): a fraction
             * (p-1)/(v m) of the work, as Narayanan et al. state it */
            long long want = (long long)c.m * c.v * (tf + tb) + (long long)(c.p - 1) * (tf + tb);
            CHECK_MSG(end == want, "p %d m %d v %d group %d, tf %d tb %d: makespan %lld, formula %lld", c.p, c.m, c.v,
                      c.group, tf, tb, end, want);
        }
    }
    fprintf(stderr, "  %d simulations\n", runs);
}

/* The exchange as NCCL runs it (pp_exchange_step, train/pipeline.c on the device): every
 * rank's list turned into a stream of groups (a step's group: the sends of the previous
 * step's operations and the receives pp_exchange_recvs gives it with `aligned`, else those
 * of this step's operations; after the list the last sends), run
 * with rendezvous sends: a send and its receive end together, once both are in the group
 * their ranks' streams are at and every earlier message of their channel (src, dst, kind)
 * has ended; a group ends when all its messages have. ops[r * n + i], step[r * n + i]: rank
 * r's list and whether operation i begins a step. True when every group ends; *fifo_ok
 * whether each channel's receives expect its messages in the order they are sent. */
typedef struct xmsg {
    int id, group;
} xmsg;

static bool exchange(const pp_sched_cfg *base, const pp_op *ops, const bool *step, int n, bool aligned,
                     bool *fifo_ok) {
    int p = base->p, m = base->m, nch = p * p * 2;
    xmsg *snd = malloc(sizeof *snd * (size_t)nch * (size_t)n), *rcv = malloc(sizeof *rcv * (size_t)nch * (size_t)n);
    int *ns = calloc((size_t)nch, sizeof *ns), *nr = calloc((size_t)nch, sizeof *nr), *at = calloc((size_t)nch, sizeof *at);
    int *left = calloc((size_t)p * (size_t)(n + 2), sizeof *left), *ngroups = calloc((size_t)p, sizeof *ngroups);
    int *cur = calloc((size_t)p, sizeof *cur);
    if (!snd || !rcv || !ns || !nr || !at || !left || !ngroups || !cur) abort();
    for (int r = 0; r < p; r++) {
        pp_sched_cfg c = *base;
        c.rank = r;
        int g = -1, held[2], held_ch[2], nheld = 0;
        for (int i = 0; i <= n; i++) {
            if (i == n || step[r * n + i]) {
                g++; /* a step begins (or the list ends): the held sends and the step's receives */
                for (int h = 0; h < nheld; h++) {
                    snd[(size_t)held_ch[h] * n + ns[held_ch[h]]++] = (xmsg){held[h], g};
                    left[r * (n + 2) + g]++;
                }
                nheld = 0;
                pp_op rv[8];
                int nrv = 0;
                if (aligned && i < n) {
                    nrv = pp_exchange_recvs(&c, ops + (size_t)r * n, n, i, rv, 8);
                    if (nrv < 0) abort();
                } else {
                    for (int j = i; j < n && (j == i || !step[r * n + j]); j++) rv[nrv++] = ops[r * n + j];
                }
                for (int j = 0; j < nrv; j++) {
                    const pp_op *o = &rv[j];
                    pp_link l;
                    pp_op_link(&c, o, &l);
                    if (l.from.rank < 0) continue;
                    int ch = (l.from.rank * p + r) * 2 + (int)o->kind;
                    rcv[(size_t)ch * n + nr[ch]++] = (xmsg){(l.from.chunk * p + l.from.rank) * m + o->mb, g};
                    left[r * (n + 2) + g]++;
                }
            }
            if (i == n) break;
            const pp_op *o = &ops[r * n + i];
            pp_link l;
            pp_op_link(&c, o, &l);
            if (l.to.rank < 0) continue;
            if (nheld == 2) abort(); /* (pipeline.c holds two) */
            held_ch[nheld] = (r * p + l.to.rank) * 2 + (int)o->kind;
            held[nheld++] = (o->chunk * p + r) * m + o->mb;
        }
        ngroups[r] = g + 1;
    }
    *fifo_ok = true;
    for (int ch = 0; ch < nch; ch++) {
        if (ns[ch] != nr[ch]) *fifo_ok = false;
        for (int k = 0; k < ns[ch] && k < nr[ch]; k++)
            if (snd[(size_t)ch * n + k].id != rcv[(size_t)ch * n + k].id) *fifo_ok = false;
    }
    for (bool progress = true; progress && *fifo_ok;) {
        progress = false;
        for (int r = 0; r < p; r++) /* each stream past its ended groups */
            while (cur[r] < ngroups[r] && left[r * (n + 2) + cur[r]] == 0) cur[r]++, progress = true;
        for (int ch = 0; ch < nch; ch++) {
            int src = ch / 2 / p, dst = ch / 2 % p;
            if (at[ch] == ns[ch]) continue;
            xmsg s = snd[(size_t)ch * n + at[ch]], q = rcv[(size_t)ch * n + at[ch]];
            if (s.group != cur[src] || q.group != cur[dst]) continue;
            left[src * (n + 2) + s.group]--;
            left[dst * (n + 2) + q.group]--;
            at[ch]++;
            progress = true;
        }
    }
    bool done = *fifo_ok;
    for (int r = 0; r < p; r++)
        if (cur[r] < ngroups[r]) done = false;
    free(snd), free(rcv), free(ns), free(nr), free(at), free(left), free(ngroups), free(cur);
    return done;
}

static void exchange_steps(void) {
    char err[400];
    int runs = 0, larger = 0, stuck = 0;
    FOR_CONFIGS(c) {
        if (c.p == 1 || c.m > 12) continue;
        int T = c.m * c.v, n = 2 * T;
        pp_op *ops = malloc(sizeof *ops * (size_t)c.p * (size_t)n), *ev = malloc(sizeof *ev * (size_t)c.p * (size_t)T);
        bool *step = malloc(sizeof *step * (size_t)c.p * (size_t)n), *each = malloc(sizeof *each * (size_t)c.p * (size_t)n);
        REQUIRE(ops && ev && step && each);
        for (int r = 0; r < c.p; r++) {
            pp_sched_cfg cr = c;
            cr.rank = r;
            int k;
            REQUIRE(schedule(&cr, ops + (size_t)r * n, n, &k, err, sizeof err) == 0);
            for (int i = 0; i < n; i++) step[r * n + i] = pp_exchange_step(&cr, i), each[r * n + i] = true;
            /* an evaluation: forwards only, each micro batch through the chunks (every one a step) */
            for (int mb = 0; mb < c.m; mb++)
                for (int ci = 0; ci < c.v; ci++) ev[r * T + mb * c.v + ci] = (pp_op){PP_FORWARD, mb, ci};
        }
        bool fifo;
        runs++;
        CHECK_MSG(exchange(&c, ops, step, n, true, &fifo), "deadlock: p %d m %d v %d group %d", c.p, c.m, c.v, c.group);
        CHECK_MSG(fifo, "p %d m %d v %d group %d: a channel's messages received out of order", c.p, c.m, c.v, c.group);
        bool larger_group = c.v > 1 && pp_sched_group(&c) > c.p;
        /* each receive with the operation that reads it: the same groups with the micro batch
         * group the pipeline size; with a larger one the first stage's receives of the last
         * stage's first-chunk outputs come too late (p 2 m 4 v 2 group 4 deadlocks so) */
        bool own = exchange(&c, ops, step, n, false, &fifo);
        if (larger_group) larger++, stuck += !own;
        else CHECK_MSG(own, "p %d m %d v %d group %d: the receives are not the consumers'", c.p, c.m, c.v, c.group);
        CHECK_MSG(exchange(&c, ev, each, T, false, &fifo) && fifo, "evaluation: p %d m %d v %d", c.p, c.m, c.v);
        /* every operation a step (each held send with the next receive) deadlocks the
         * interleaved schedule (pp 2, 2 chunks, 4 micro batches: rank 1 sends a gradient
         * that rank 0 receives only after its own send of a gradient, which rank 1 receives
         * after it) */
        if (c.p == 2 && c.v == 2 && c.m == 4 && c.group == 2)
            CHECK_MSG(!exchange(&c, ops, each, n, false, &fifo) && fifo,
                      "pairing each send with the next receive did not deadlock");
        if (c.v == 1) CHECK(exchange(&c, ops, each, n, false, &fifo)); /* (1F1B: the same steps) */
        free(ops), free(ev), free(step), free(each);
    }
    fprintf(stderr, "  %d exchanges, %d with a micro batch group larger than the pipeline; %d of those deadlock "
                    "receiving with the consumer\n", runs, larger, stuck);
    CHECK(larger > 100 && stuck > 100);
}

static void refusals(void) {
    char err[400];
    pp_sched_cfg c = {.p = 4, .rank = 0, .m = 3, .v = 2};
    CHECK(sched_check(&c, err, sizeof err) == CO_EINVAL && strstr(err, "[4, 3]"));
    CHECK(pp_warmup(&c) == -1);
    c = (pp_sched_cfg){.p = 4, .m = 10, .v = 2, .group = 4};
    CHECK(sched_check(&c, err, sizeof err) == CO_EINVAL && strstr(err, "= 2") && strstr(err, "pipeline size 4"));
    c.group = 5;
    CHECK(sched_check(&c, err, sizeof err) == 0); /* remainder 0 */
    c = (pp_sched_cfg){.p = 4, .m = 11, .v = 2, .group = 7}; /* remainder 4 = p */
    CHECK(sched_check(&c, err, sizeof err) == 0);
    c = (pp_sched_cfg){.p = 1, .m = 4, .v = 2};
    CHECK(sched_check(&c, err, sizeof err) == CO_EINVAL && strstr(err, "greater than 1"));
    c = (pp_sched_cfg){.p = 2, .rank = 2, .m = 4, .v = 1};
    CHECK(sched_check(&c, err, sizeof err) == CO_EINVAL && strstr(err, "rank 2"));
    c = (pp_sched_cfg){.p = 2, .m = 0, .v = 1};
    CHECK(sched_check(&c, err, sizeof err) == CO_EINVAL);
    c = (pp_sched_cfg){.p = 2, .m = 1, .v = 1, .group = 7}; /* the group only matters interleaved */
    CHECK(sched_check(&c, err, sizeof err) == 0);
}

/* ---- placement ---- */

static int place(pp_place_cfg c, pp_stage *st, int *v, char *err, size_t n) {
    return placement(&c, st, 64, v, err, n);
}

static void placement_examples(void) {
    char err[400];
    pp_stage st[64];
    int v;
    /* get_num_layers_to_build's comment: 8 layers, 2 stages, 4 chunks: rank 0 [0] [2] [4] [6],
     * rank 1 [1] [3] [5] [7]; 2 chunks: rank 0 [0,1] [4,5], rank 1 [2,3] [6,7] */
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 8, .v = 4}, st, &v, err, sizeof err) == 0);
    CHECK(v == 4);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) CHECK(st[r * 4 + c].first_layer == 2 * c + r && st[r * 4 + c].num_layers == 1);
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 8, .layers_per_vstage = 2}, st, &v, err, sizeof err) == 0);
    CHECK(v == 2 && st[0].first_layer == 0 && st[1].first_layer == 4 && st[2].first_layer == 2 && st[3].first_layer == 6);
    CHECK(st[0].embedding && !st[1].embedding && st[3].loss && !st[2].loss);
    /* the embedding and the loss counted as layers: 6 + 2 over 4 ranks, 2 each */
    REQUIRE(place((pp_place_cfg){.p = 4, .num_layers = 6, .account_embedding = true, .account_loss = true}, st, &v, err,
                  sizeof err) == 0);
    CHECK(st[0].num_layers == 1 && st[1].first_layer == 1 && st[1].num_layers == 2 && st[3].first_layer == 5 &&
          st[3].num_layers == 1);
    /* uneven: 1 on the first rank, 3 on the others */
    REQUIRE(place((pp_place_cfg){.p = 3, .num_layers = 7, .has_first = true, .first = 1}, st, &v, err, sizeof err) == 0);
    CHECK(st[0].num_layers == 1 && st[1].first_layer == 1 && st[1].num_layers == 3 && st[2].first_layer == 4);
    /* uneven with chunks, p = 2 and both ends given (Megatron divides by zero middle ranks) */
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 10, .v = 2, .has_first = true, .first = 4, .has_last = true,
                                 .last = 6}, st, &v, err, sizeof err) == 0);
    CHECK(st[0].first_layer == 0 && st[0].num_layers == 2 && st[2].first_layer == 2 && st[2].num_layers == 3 &&
          st[1].first_layer == 5 && st[3].first_layer == 7);
    /* MTP without a layout: the last stage */
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 4, .mtp_num_layers = 2}, st, &v, err, sizeof err) == 0);
    CHECK(st[0].mtp_layers == 0 && st[1].mtp_layers == 2);
}

static void layouts(void) {
    char err[400];
    pp_stage st[64];
    int v, ns, rc;
    /* the docstring's example */
    char *x = layout_expand("Ettt|(tt|)*29,m|L", &ns, &rc, err, sizeof err);
    REQUIRE(x);
    CHECK(ns == 32 && !strncmp(x, "Ettt|tt|tt|", 11) && !strcmp(x + strlen(x) - 9, "tt|tt|m|L"));
    free(x);
    /* the flag's help: "E|(t|)*3,m|m||L" */
    x = layout_expand("E|(t|)*3,m|m||L", &ns, &rc, err, sizeof err);
    REQUIRE(x);
    CHECK(!strcmp(x, "E|t|t|t|m|m||L") && ns == 8);
    free(x);
    /* re.sub semantics: the parenthesis pass takes up to the first ')'; X*N also repeats '|' */
    x = layout_expand("E((t)*2|)*2L", &ns, &rc, err, sizeof err);
    CHECK(!x && rc == CO_EINVAL && strstr(err, "'('"));
    free(x);
    x = layout_expand("Et|*2tL", &ns, &rc, err, sizeof err);
    REQUIRE(x);
    CHECK(!strcmp(x, "Et||tL") && ns == 3);
    free(x);
    x = layout_expand("E(t)*99999999L", &ns, &rc, err, sizeof err);
    CHECK(!x && rc == CO_EINVAL);
    /* VPP from the layout: 2 ranks x 2 chunks, stage i = chunk i/2 of rank i%2 */
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 6, .layout = "Et|tt|tt|tL"}, st, &v, err, sizeof err) == 0);
    CHECK(v == 2);
    CHECK(st[0].first_layer == 0 && st[0].num_layers == 1); /* rank 0 chunk 0 */
    CHECK(st[2].first_layer == 1 && st[2].num_layers == 2); /* rank 1 chunk 0 */
    CHECK(st[1].first_layer == 3 && st[1].num_layers == 2); /* rank 0 chunk 1 */
    CHECK(st[3].first_layer == 5 && st[3].num_layers == 1 && st[3].loss);
    REQUIRE(place((pp_place_cfg){.p = 2, .num_layers = 4, .layout = "Ett|ttmL", .mtp_num_layers = 1}, st, &v, err,
                  sizeof err) == 0);
    CHECK(st[1].mtp_layers == 1 && st[0].mtp_layers == 0);
    CHECK(pp_mtp_rank(st, 2, v) == 1 && pp_embedding_stages(st, 2, v, true) == 0); /* m with L: first, last */
    /* m on a stage before L's: the embedding group is the first, the MTP rank and (tied) the last */
    REQUIRE(place((pp_place_cfg){.p = 3, .num_layers = 4, .layout = "Ett|ttm|L", .mtp_num_layers = 1}, st, &v, err,
                  sizeof err) == 0);
    CHECK(pp_mtp_rank(st, 3, v) == 1 && pp_embedding_stages(st, 3, v, true) == 7ull &&
          pp_embedding_stages(st, 3, v, false) == 3ull);
    REQUIRE(place((pp_place_cfg){.p = 3, .num_layers = 6}, st, &v, err, sizeof err) == 0);
    CHECK(pp_mtp_rank(st, 3, v) == -1 && pp_embedding_stages(st, 3, v, true) == 0);
    static const struct {
        const char *layout, *msg;
        int p, L;
    } bad[] = {
        {"tE|tL", "first layer", 2, 2}, {"Et|Lt", "last layer", 2, 2}, {"EEt|tL", "exactly once", 2, 2},
        {"Et|tL", "decoder layers", 2, 3}, {"Et|t|tL", "not a multiple", 2, 3}, {"|Et|t|tL", "stage 0", 2, 3},
        {"Et|t|tL|", "last stage", 2, 3}, {"Ex|tL", "'x'", 2, 2}, {"", "no layers", 1, 1}, {"Et|tLm", "last layer", 2, 2},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pp_place_cfg c = {.p = bad[i].p, .num_layers = bad[i].L, .layout = bad[i].layout};
        CHECK_MSG(place_chunks(&c, err, sizeof err) == CO_EINVAL && strstr(err, bad[i].msg), "%s: %s", bad[i].layout,
                  err);
    }
}

static void placement_refusals(void) {
    char err[400];
    static const struct {
        pp_place_cfg c;
        const char *msg;
    } bad[] = {
        {{.p = 4, .num_layers = 10}, "not divisible by --pipeline-model-parallel-size 4"},
        {{.p = 2, .num_layers = 8, .v = 3}, "not divisible by the 3 model chunks"},
        {{.p = 1, .num_layers = 8, .v = 2}, "greater than 1"},
        {{.p = 2, .num_layers = 8, .v = 2, .layers_per_vstage = 2}, "at most one"},
        {{.p = 2, .num_layers = 8, .layers_per_vstage = 3}, "--num-layers-per-virtual-pipeline-stage 3"},
        {{.p = 2, .num_layers = 8, .has_first = true, .first = 2, .account_loss = true}, "cannot be combined"},
        {{.p = 2, .num_layers = 8, .has_first = true, .first = 0}, "larger than 0"},
        {{.p = 3, .num_layers = 8, .has_first = true, .first = 2, .has_last = true, .last = 6}, "both must be zero"},
        {{.p = 4, .num_layers = 9, .has_first = true, .first = 2}, "not divisible among them"},
        {{.p = 4, .num_layers = 8, .v = 2, .has_first = true, .first = 3}, "--decoder-first-pipeline-num-layers 3"},
        {{.p = 1, .num_layers = 8, .has_first = true, .first = 4, .has_last = true, .last = 4}, "2 or more"},
        {{.p = 3, .num_layers = 4, .has_first = true, .first = 3, .has_last = true, .last = 3}, "exceed"},
        {{.p = 2, .num_layers = 8, .has_first = true, .first = 2, .layers_per_vstage = 1}, "--num-virtual-stages"},
        {{.p = 2, .num_layers = 4, .layout = "Et|tL", .account_embedding = true}, "cannot be combined"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(place_chunks(&bad[i].c, err, sizeof err) == CO_EINVAL && strstr(err, bad[i].msg), "case %zu: %s", i,
                  err);
    pp_stage st[4];
    int v;
    pp_place_cfg c = {.p = 4, .num_layers = 8, .v = 2};
    CHECK(placement(&c, st, 4, &v, err, sizeof err) == CO_ERANGE);
}

/* Every placement the flags accept tiles the layers: the stages in stage order hold 0..L-1
 * one after the other (pp_placement checks it and fails with CO_EINTERNAL otherwise). */
static void tiling(void) {
    char err[400];
    pp_stage st[64];
    int v, accepted = 0;
    for (int p = 1; p <= 6; p++)
        for (int L = 1; L <= 24; L++)
            for (int vv = 0; vv <= 4; vv++)
                for (int f = -1; f <= 6; f++)
                    for (int t = -1; t <= 6; t++)
                        for (int acc = 0; acc < 4; acc++) {
                            pp_place_cfg c = {.p = p, .num_layers = L, .v = vv, .has_first = f >= 0, .first = f,
                                              .has_last = t >= 0, .last = t, .account_embedding = acc & 1,
                                              .account_loss = acc & 2};
                            int ch = place_chunks(&c, err, sizeof err);
                            if (ch < 0 || p * ch > 64) continue;
                            int rc = placement(&c, st, 64, &v, err, sizeof err);
                            CHECK_MSG(rc == 0, "p %d L %d v %d first %d last %d acc %d: %s", p, L, vv, f, t, acc, err);
                            accepted++;
                        }
    CHECK(accepted > 500);
    fprintf(stderr, "  %d placements\n", accepted);
}

int main(void) {
    RUN(phases_and_counts);
    RUN(megatron_example);
    RUN(links);
    RUN(simulation);
    RUN(exchange_steps);
    RUN(refusals);
    RUN(placement_examples);
    RUN(layouts);
    RUN(placement_refusals);
    RUN(tiling);
    return TEST_EXIT();
}
