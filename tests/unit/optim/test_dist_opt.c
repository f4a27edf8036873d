/* test_dist_opt.c - the distributed optimizer's step (optim/dist_opt.c) across forked ranks
 * over the ZeroMQ communicator, as tests/unit/comm does.
 *
 * Every rank builds a small GPT's parameter table (tiny tensors: biases and norms of 16
 * elements, matrices of a few hundred, so many parameters span shard boundaries), the
 * same initial weights, and per step its own gradients; it runs N steps of dopt_step and,
 * locally, the replicated optimizer (optim/adamw.c's opt_adamw_step on a gpt_model) on
 * the same gradients summed in rank order and averaged. Checked on dp 2, 3 and 4, with
 * the default bucket size (one bucket) and a small one (many buckets):
 *   exact gradients (multiples of 1/64, so every sum is exact in any order): parameters
 *     (the full buffer on every rank) and both moments (each rank's shard) bitwise equal
 *     to the replicated optimizer's, with clipping active (the gradient norm bitwise equal
 *     for dp a power of two; at dp 3 it may differ by an ulp of a double, within 1e-12,
 *     which has not changed the float clipping factor here);
 *   random gradients (sums rounded differently by the ring and the reference): within
 *     |d| <= 1e-6 + 1e-4 |ref| for parameters and moments (reported: the largest);
 *   with redundancy, rank k+1's copy of shard k (parameters, both moments, step) bitwise
 *     equal to rank k's own, and rank k's shard, wiped, restored from that copy sent back
 *     (dopt_shard_restore) to exactly what it held;
 *   the final state's hash identical across two runs of one configuration;
 *   a rank killed before a step: the others' dopt_step returns an error naming the step;
 *   a rank that aborts its communicator: its step returns CO_EABORTED, the others' fail.
 * Prints the bytes per parameter per rank for this table and for GPT-2 124M, and checks
 * the bytes rank 0 sends per step: 2(d-1)/d of the buffer, plus one shard with redundancy. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/dist_opt.h"
#include "tests/test.h"
#include "tests/fork_ranks.h"

const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "called_from_lib:libzmq.so.5\nrace:libzmq.so.5\n"; }

#define T_MS 20000
#define STEPS 5

typedef struct cfg {
    int dp;
    size_t bucket;
    bool exact, redundant;
    bool allreduce; /* the all-reduce path (dopt_options.allreduce: shared memory on one host) */
    int kill_rank;  /* -1: none; else this rank dies before the first step */
    int abort_rank; /* -1: none; else this rank aborts its communicator before the first step */
    char out[256]; /* directory for each rank's final hash */
} cfg;

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* rank r's gradient of element j of parameter i at step t */
static float grad(const cfg *c, int t, int r, int i, size_t j) {
    uint64_t h = t_mix(t_mix(t_mix((uint64_t)t * 7919u + (uint64_t)r) + (uint64_t)i) + j);
    if (c->exact) return (float)((int)(h % 2001) - 1000) / 64.0f;
    return (float)((double)(h >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 3.7f;
}

static gpt_config tiny(void) {
    gpt_config c = {.num_layers = 2, .hidden = 16, .heads = 4, .kv_groups = 4, .head_dim = 4, .ffn_hidden = 32,
                    .vocab = 37, .padded_vocab = gpt_padded_vocab(37, 8), .max_positions = 16, .rope = false,
                    .rotary_base = 10000.0f, .rmsnorm = false, .norm_eps = 1e-5f, .swiglu = false, .tied = true,
                    .bias = true, .init_std = 0.02f, .hidden_dropout = 0.0f, .attention_dropout = 0.0f};
    return c;
}

static cm_comm *mk(int rank, int n, const char *dir) {
    char eps[8][160];
    const char *ep[8];
    for (int r = 0; r < n; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.chunk_bytes = 4096; /* several chunks per bucket */
    zo.small_bytes = 256;  /* both reduce-scatter algorithms occur */
    zo.connect_timeout_ms = 20000;
    zo.linger_ms = 1000;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &zo);
    CHECK_MSG(rc == 0, "rank %d: cm_zmq_new: %s: %s", rank, co_err_name(rc), co_err_detail());
    return c;
}

static const float LR = 1e-3f;

static void scenario(int rank, const cfg *c, const char *dir) {
    int dp = c->dp;
    kb_backend *be = NULL;
    kb_options ko = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &ko) == 0);
    gpt_config gc = tiny();
    gpt_model *model = NULL;
    REQUIRE(gpt_new(&model, &gc, be, 1, 8) == 0);
    gpt_init(model, 1234);
    int nt = gpt_num_tensors(model);
    const gpt_tensor *t = gpt_tensors(model);
    size_t *numel = malloc((size_t)nt * sizeof *numel), *off = malloc((size_t)nt * sizeof *off);
    bool *decay = malloc((size_t)nt * sizeof *decay);
    for (int i = 0; i < nt; i++) {
        numel[i] = t[i].numel;
        off[i] = t[i].offset;
        decay[i] = t[i].decay;
    }
    dopt_layout L;
    REQUIRE(dopt_layout_build(&L, numel, nt, dp, c->bucket) == 0);
    dopt_options o = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip_grad = 1.0f,
                      .redundant = c->redundant, .timeout_ms = T_MS};
    dopt_state s;
    REQUIRE(dopt_init(&s, &L, rank, &o, be) == 0);
    dopt_pack(&L, gpt_params(model), off, s.params);
    dopt_init_shards(&s);
    opt_adamw ref;
    REQUIRE(opt_adamw_init(&ref, model, o.beta1, o.beta2, o.eps, o.weight_decay, o.clip_grad) == 0);
    cm_comm *comm = mk(rank, dp, dir);
    REQUIRE(comm);
    if (c->allreduce) {
        CHECK_MSG(cm_zmq_shared_memory(comm), "rank %d: the ranks of this test should share memory", rank);
        s.opt.allreduce = true;
    }
    /* every rank is connected before one dies or aborts (else cm_zmq_new fails instead); the
     * failing rank waits a moment so that the others are inside dopt_step when it fails (a
     * rank that still sees the failure in the barrier says so and passes) */
    bool fails = c->kill_rank >= 0 || c->abort_rank >= 0;
    int brc = comm->ops->barrier(comm, T_MS);
    if (brc && fails) {
        fprintf(stderr, "rank %d: the failure arrived before the step: %s\n", rank, co_err_detail());
        goto done;
    }
    REQUIRE_MSG(brc == 0, "barrier: %s", co_err_detail());
    if (rank == c->kill_rank || rank == c->abort_rank) t_sleep_ms(300);
    if (rank == c->kill_rank) raise(SIGKILL);
    if (rank == c->abort_rank) comm->ops->abort(comm);
    float *g = gpt_grads(model);
    uint64_t z0 = 0, z1 = 0, sh0 = 0, sh1 = 0;
    cm_zmq_traffic(comm, &z0, &sh0);
    double max_dp = 0, max_dm = 0, max_dv = 0;
    bool clipped = false;
    for (int step = 1; step <= STEPS; step++) {
        /* this rank's gradient in the layout; the reference's: the sum in rank order, averaged */
        dopt_grads_clear(&s);
        be->ops->zero(be, g, gpt_num_params(model));
        for (int i = 0; i < nt; i++)
            for (size_t j = 0; j < numel[i]; j++) {
                s.grads[L.param_start[i] + j] = grad(c, step, rank, i, j);
                float sum = 0;
                for (int r = 0; r < dp; r++) sum += grad(c, step, r, i, j);
                g[off[i] + j] = sum;
            }
        be->ops->scale(be, g, 1.0f / (float)dp, gpt_num_params(model));
        double norm = 0, rnorm = opt_grad_norm(model);
        int rc = dopt_step(&s, comm, decay, LR, &norm);
        if (fails) {
            CHECK_MSG(rc != 0, "rank %d: a step with rank %d dead / %d aborted succeeded", rank, c->kill_rank,
                      c->abort_rank);
            if (rank == c->abort_rank) CHECK_MSG(rc == CO_EABORTED, "rank %d: %s", rank, co_err_name(rc));
            CHECK_MSG(strstr(co_err_detail(), "distributed optimizer step") != NULL, "detail: %s", co_err_detail());
            fprintf(stderr, "rank %d: with rank %d dead / %d aborted: %s: %s\n", rank, c->kill_rank, c->abort_rank,
                    co_err_name(rc), co_err_detail());
            goto done;
        }
        REQUIRE_MSG(rc == 0, "rank %d step %d: %s: %s", rank, step, co_err_name(rc), co_err_detail());
        /* exact gradients over a power-of-two dp: every square and sum exact, so the norms
         * agree bitwise; otherwise the averaged gradient's squares round, and the shard
         * sums add them in another order than the replicated one (seen: 1 ulp) */
        if (c->exact && (dp & (dp - 1)) == 0)
            CHECK_MSG(norm == rnorm, "rank %d: norm %.17g vs replicated %.17g", rank, norm, rnorm);
        CHECK_CLOSE(norm, rnorm, 0, c->exact ? 1e-12 : 1e-6); /* random: float sums differ by ulps */
        clipped |= rnorm > o.clip_grad;
        opt_adamw_step(&ref, model, LR, rnorm);
    }
    CHECK_MSG(clipped, "the test should clip at least once");
    cm_zmq_traffic(comm, &z1, &sh1);
    if (rank == 0) {
        /* per step: reduce-scatter and all-gather each send (dp-1)/dp of the buffer, the copy
         * one shard more; the norm's 8 bytes go through shared memory */
        double expect = c->allreduce ? 0 /* every byte through shared memory, the copy's gradient read locally */
                                     : 2.0 * (dp - 1) / dp * (double)L.total * 4 + (c->redundant ? (double)L.shard_total * 4 : 0);
        fprintf(stderr, "  dp %d bucket %zu%s: rank 0 sent %.0f bytes per step over ZeroMQ (%.0f expected: "
                        "2(d-1)/d of %zu buffer bytes%s), %.0f through shared memory\n",
                dp, L.bucket_size, c->redundant ? " redundant" : "", (double)(z1 - z0) / STEPS, expect,
                L.total * 4, c->redundant ? " + one shard" : "", (double)(sh1 - sh0) / STEPS);
        CHECK_MSG((double)(z1 - z0) / STEPS == expect, "rank 0 sent %llu bytes in %d steps",
                  (unsigned long long)(z1 - z0), STEPS);
    }
    /* parameters: the whole buffer on every rank */
    float *mine = malloc(gpt_num_params(model) * sizeof(float));
    memcpy(mine, gpt_params(model), gpt_num_params(model) * sizeof(float));
    dopt_unpack(&L, s.params, off, mine);
    size_t pdiff = 0, mdiff = 0;
    const float *rp = gpt_params(model);
    for (int i = 0; i < nt; i++)
        for (size_t j = 0; j < numel[i]; j++) {
            float a = mine[off[i] + j], b = rp[off[i] + j];
            pdiff += memcmp(&a, &b, 4) != 0;
            double d = fabs((double)a - b) / (1e-6 + 1e-4 * fabs(b));
            if (d > max_dp) max_dp = d;
        }
    /* moments: this rank's pieces */
    for (int k = 0; k < L.npieces[rank]; k++) {
        const dopt_piece *pc = &L.pieces[rank][k];
        for (size_t j = 0; j < pc->param_hi - pc->param_lo; j++) {
            size_t ro = off[pc->param] + pc->param_lo + j, so = pc->shard_off + j;
            mdiff += memcmp(&s.m[so], &ref.m[ro], 4) != 0 || memcmp(&s.v[so], &ref.v[ro], 4) != 0;
            double dm = fabs((double)s.m[so] - ref.m[ro]) / (1e-6 + 1e-4 * fabs(ref.m[ro]));
            double dv = fabs((double)s.v[so] - ref.v[ro]) / (1e-6 + 1e-4 * fabs(ref.v[ro]));
            if (dm > max_dm) max_dm = dm;
            if (dv > max_dv) max_dv = dv;
        }
    }
    if (c->exact) {
        CHECK_MSG(pdiff == 0, "rank %d: %zu parameters differ from the replicated optimizer's", rank, pdiff);
        CHECK_MSG(mdiff == 0, "rank %d: %zu moment elements differ from the replicated optimizer's", rank, mdiff);
    }
    CHECK_MSG(max_dp <= 1 && max_dm <= 1 && max_dv <= 1,
              "rank %d: beyond tolerance: params %.3g, m %.3g, v %.3g (units of 1e-6 + 1e-4|ref|)", rank, max_dp,
              max_dm, max_dv);
    if (rank == 0)
        fprintf(stderr, "  dp %d bucket %zu (%d buckets) %s: %zu/%zu parameters not bitwise equal; largest "
                        "|d|/(1e-6+1e-4|ref|): params %.3g m %.3g v %.3g\n",
                dp, L.bucket_size, L.nbuckets, c->exact ? "exact" : "random", pdiff, gpt_num_params(model), max_dp,
                max_dm, max_dv);
    /* redundancy: send the own shard's state to rank+1, which compares it with its copy */
    if (c->redundant && dp > 1) {
        size_t n = L.shard_total, bytes = 3 * n * sizeof(float) + sizeof(int64_t);
        unsigned char *own = malloc(bytes), *peer = malloc(bytes), *copy = malloc(bytes);
        dopt_shard_view v;
        REQUIRE(dopt_shard_view_get(&s, rank, &v, (float *)own) == 0);
        memcpy(own + n * 4, v.m, n * 4);
        memcpy(own + 2 * n * 4, v.v, n * 4);
        memcpy(own + 3 * n * 4, &v.step, 8);
        int prv = (rank + dp - 1) % dp, nxt = (rank + 1) % dp;
        REQUIRE(dopt_shard_view_get(&s, prv, &v, (float *)copy) == 0);
        memcpy(copy + n * 4, v.m, n * 4);
        memcpy(copy + 2 * n * 4, v.v, n * 4);
        memcpy(copy + 3 * n * 4, &v.step, 8);
        if (dp > 3) CHECK(dopt_shard_view_get(&s, (rank + 2) % dp, &v, NULL) == CO_ENOENT);
        int rc;
        if (rank % 2 == 0) {
            rc = comm->ops->send(comm, own, bytes, nxt, T_MS);
            if (!rc) rc = comm->ops->recv(comm, peer, bytes, prv, T_MS);
        } else {
            rc = comm->ops->recv(comm, peer, bytes, prv, T_MS);
            if (!rc) rc = comm->ops->send(comm, own, bytes, nxt, T_MS);
        }
        REQUIRE_MSG(rc == 0, "exchange: %s", co_err_detail());
        CHECK_MSG(memcmp(peer, copy, bytes) == 0, "rank %d: its copy of shard %d differs from rank %d's own", rank,
                  prv, prv);
        /* the handover: rank+1 sends back its copy of this rank's shard; this rank forgets its
         * own shard (parameters, moments, step), restores it from what it received, and holds
         * exactly what it held before */
        if (rank % 2 == 0) {
            rc = comm->ops->send(comm, copy, bytes, prv, T_MS);
            if (!rc) rc = comm->ops->recv(comm, peer, bytes, nxt, T_MS);
        } else {
            rc = comm->ops->recv(comm, peer, bytes, nxt, T_MS);
            if (!rc) rc = comm->ops->send(comm, copy, bytes, prv, T_MS);
        }
        REQUIRE_MSG(rc == 0, "handover: %s", co_err_detail());
        uint64_t before = fnv(s.params, L.total * 4, fnv(s.m, n * 4, fnv(s.v, n * 4, 0)));
        int64_t step_before = s.step;
        for (int b = 0; b < L.nbuckets; b++)
            memset(s.params + L.buckets[b].start + (size_t)rank * L.buckets[b].shard, 0xff, L.buckets[b].shard * 4);
        memset(s.m, 0xff, n * 4);
        memset(s.v, 0xff, n * 4);
        s.step = 0;
        dopt_shard_view hv = {.shard = rank, .n = n, .m = (const float *)(peer + n * 4),
                              .v = (const float *)(peer + 2 * n * 4)};
        memcpy(&hv.step, peer + 3 * n * 4, 8);
        REQUIRE(dopt_shard_restore(&s, &hv, (const float *)peer) == 0);
        CHECK_MSG(fnv(s.params, L.total * 4, fnv(s.m, n * 4, fnv(s.v, n * 4, 0))) == before && s.step == step_before,
                  "rank %d: its shard restored from rank %d's copy is not what it held", rank, nxt);
        hv.shard = (rank + 2) % dp;
        if (dp > 3) CHECK(dopt_shard_restore(&s, &hv, (const float *)peer) == CO_ENOENT);
        free(own);
        free(peer);
        free(copy);
    }
    /* the hash of everything this rank holds, for the reproducibility check */
    uint64_t h = fnv(s.params, L.total * 4, 1469598103934665603ull);
    h = fnv(s.m, L.shard_total * 4, h);
    h = fnv(s.v, L.shard_total * 4, h);
    if (s.rparams) h = fnv(s.rparams, L.shard_total * 4, fnv(s.rm, L.shard_total * 4, fnv(s.rv, L.shard_total * 4, h)));
    char path[400];
    snprintf(path, sizeof path, "%s/hash%d", c->out, rank);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "%016llx\n", (unsigned long long)h);
    fclose(f);
    free(mine);
done:
    cm_destroy(&comm);
    opt_adamw_free(&ref, model);
    dopt_free(&s);
    dopt_layout_free(&L);
    gpt_destroy(&model);
    kb_backend_destroy(&be);
    free(numel);
    free(off);
    free(decay);
}

static void scenario_rank(int rank, int n, const char *dir, const void *c) {
    (void)n;
    scenario(rank, c, dir);
}

static int run_group(const char *name, cfg *c, int limit_ms) {
    return t_fork_ranks(name, "doptest", c->dp, scenario_rank, c, c->kill_rank, limit_ms);
}

static void read_hashes(const cfg *c, char out[][32]) {
    for (int r = 0; r < c->dp; r++) {
        char path[400];
        snprintf(path, sizeof path, "%s/hash%d", c->out, r);
        FILE *f = fopen(path, "r");
        out[r][0] = 0;
        if (f) {
            if (!fgets(out[r], 32, f)) out[r][0] = 0;
            fclose(f);
        }
    }
}

/* One configuration, run twice: both runs pass and every rank's state hashes equal. */
static void run_config_ar(int dp, size_t bucket, bool exact, bool redundant, bool allreduce) {
    cfg c = {.dp = dp, .bucket = bucket, .exact = exact, .redundant = redundant, .allreduce = allreduce,
             .kill_rank = -1, .abort_rank = -1};
    char tmp[] = "/tmp/dopthash-XXXXXX";
    REQUIRE(mkdtemp(tmp));
    snprintf(c.out, sizeof c.out, "%s", tmp);
    char name[96], h1[8][32], h2[8][32];
    snprintf(name, sizeof name, "dp %d bucket %zu %s%s%s", dp, bucket, exact ? "exact" : "random",
             redundant ? " redundant" : "", allreduce ? " all-reduce path" : "");
    CHECK_MSG(run_group(name, &c, 60000) == 0, "%s: first run", name);
    read_hashes(&c, h1);
    CHECK_MSG(run_group(name, &c, 60000) == 0, "%s: second run", name);
    read_hashes(&c, h2);
    for (int r = 0; r < dp; r++)
        CHECK_MSG(h1[r][0] && strcmp(h1[r], h2[r]) == 0, "%s: rank %d state differs between runs (%s vs %s)", name,
                  r, h1[r], h2[r]);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
}

static void run_config(int dp, size_t bucket, bool exact, bool redundant) {
    run_config_ar(dp, bucket, exact, redundant, false);
}

/* The all-reduce path (shared memory): the same checks against the replicated optimizer,
 * nothing over ZeroMQ, bitwise reproducible. */
static void test_allreduce_path(void) {
    run_config_ar(2, 300, false, true, true);
    run_config_ar(3, 300, true, true, true);
    run_config_ar(4, 0, false, false, true);
    run_config_ar(4, 300, false, true, true);
}

static void test_dp2(void) {
    run_config(2, 0, true, true);
    run_config(2, 300, true, true);
    run_config(2, 300, false, true);
}
static void test_dp3(void) {
    run_config(3, 0, true, true);
    run_config(3, 300, true, true);
    run_config(3, 300, false, false);
}
static void test_dp4(void) {
    run_config(4, 0, true, false);
    run_config(4, 300, true, true);
    run_config(4, 300, false, true);
}

static void test_dead_rank(void) {
    cfg c = {.dp = 3, .bucket = 300, .exact = true, .redundant = true, .kill_rank = 2, .abort_rank = -1};
    snprintf(c.out, sizeof c.out, "/tmp");
    CHECK(run_group("dead rank", &c, 60000) == 0);
}

static void test_aborted(void) {
    cfg c = {.dp = 4, .bucket = 300, .exact = true, .redundant = true, .kill_rank = -1, .abort_rank = 1};
    snprintf(c.out, sizeof c.out, "/tmp");
    CHECK(run_group("aborted", &c, 60000) == 0);
}

/* Bytes per parameter per rank: this test's table and GPT-2 124M at several dp. */
static void test_memory(void) {
    gpt_config gs[2] = {tiny(), tiny()};
    gs[1] = (gpt_config){.num_layers = 12, .hidden = 768, .heads = 12, .kv_groups = 12, .head_dim = 64,
                         .ffn_hidden = 3072, .vocab = 50257, .padded_vocab = gpt_padded_vocab(50257, 128),
                         .max_positions = 1024, .rotary_base = 10000.0f, .norm_eps = 1e-5f, .tied = true,
                         .bias = true, .init_std = 0.02f};
    const char *names[2] = {"test table", "GPT-2 124M"};
    for (int k = 0; k < 2; k++) {
        gpt_tensor *t = NULL;
        int n = 0;
        size_t np = 0;
        REQUIRE(gpt_tensor_table(&gs[k], &t, &n, &np) == 0);
        size_t *numel = malloc((size_t)n * sizeof *numel);
        for (int i = 0; i < n; i++) numel[i] = t[i].numel;
        np = 0;
        for (int i = 0; i < n; i++) np += numel[i];
        int dps[] = {1, 2, 3, 4, 8, 64};
        for (size_t d = 0; d < sizeof dps / sizeof *dps; d++) {
            dopt_layout L;
            REQUIRE(dopt_layout_build(&L, numel, n, dps[d], 0) == 0);
            double b = dopt_bytes_per_param(&L, np, false), br = dopt_bytes_per_param(&L, np, true);
            fprintf(stderr, "  %s (%zu parameters) dp %2d: %.3f bytes/parameter/rank (8 + 8/d = %.3f; "
                            "replicated AdamW 16), %.3f with redundancy (8 + 24/d = %.3f; none at dp 1)\n",
                    names[k], np, dps[d], b, 8.0 + 8.0 / dps[d], br, dps[d] > 1 ? 8.0 + 24.0 / dps[d] : 16.0);
            CHECK(b >= 8.0 + 8.0 / dps[d] - 1e-9);
            if (k == 1) CHECK(b < 8.0 + 8.0 / dps[d] + 0.01); /* padding is small on a real model */
            dopt_layout_free(&L);
        }
        free(numel);
        free(t);
    }
}

int main(void) {
    RUN(test_memory);
    RUN(test_dp2);
    RUN(test_dp3);
    RUN(test_dp4);
    RUN(test_allreduce_path);
    RUN(test_dead_rank);
    RUN(test_aborted);
    return TEST_EXIT();
}
