/* test_cp_split.c - the trainer's context-parallel batch split (train/trainer_cp.c) on its
 * own: the load-balanced sequence split, the per-document THD split against hand-worked
 * layouts (rank r: chunk r of every document, then chunk 2cp-r-1 of every document; padding
 * after a document's real tokens with loss mask 0, its id and its last position; a trailing
 * padding document evening a micro batch's sequences; each token's row in the whole batch,
 * which hidden dropout is keyed by), every real token kept by exactly one
 * rank at its chunk's place for random documents at cp 1-4, the whole sequences' loss
 * tokens, and the capacity refusal. */
#include "train/trainer_internal.h"

#include "common/error.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    trainer t;
    tr_batch x;
    gpt_batch b;
} fixture;

/* A trainer holding only what the split reads: cp ranks, this one r, B x T micro batches. */
static void fx_init(fixture *f, int B, int T, int cp, int r, bool thd, double capacity) {
    memset(f, 0, sizeof *f);
    trainer *t = &f->t;
    t->cfg.micro_batch_size = B;
    t->cfg.seq_length = T;
    t->cfg.cp_packed_capacity = capacity;
    t->cpn = cp, t->cpr = r, t->thd = thd, t->docs = true;
    t->thd_quantum = 2 * cp;
    int cap = (int)(capacity * T);
    t->cap_total = thd ? (cap + 2 * cp - 1) / (2 * cp) * (2 * cp) : T;
    size_t N = (size_t)B * T;
    t->cp_i32 = malloc(4 * N * sizeof(int32_t));
    t->cp_f32 = malloc(N * sizeof(float));
    t->cp_rows = malloc(N * sizeof(int32_t));
    f->x.tokens = malloc(N * sizeof(int32_t));
    f->x.targets = malloc(N * sizeof(int32_t));
    f->x.positions = malloc(N * sizeof(int32_t));
    f->x.seg = malloc(N * sizeof(int32_t));
    f->x.mask = malloc(N * sizeof(float));
    f->x.dscale = NULL;
}

static void fx_free(fixture *f) {
    trainer__cp_free(&f->t);
    free(f->x.tokens), free(f->x.targets), free(f->x.positions), free(f->x.seg), free(f->x.mask);
}

/* sequence b: documents of the given lengths (summing to T); token i of the sequence is
 * 1000 b + i, its label 2000 + that, position i - its document's start, mask 1 */
static void fx_fill(fixture *f, int b, const int *lens, int n) {
    const int T = f->t.cfg.seq_length;
    size_t o = (size_t)b * T;
    int i = 0;
    for (int d = 0; d < n; d++)
        for (int k = 0; k < lens[d]; k++, i++) {
            f->x.tokens[o + i] = 1000 * b + i;
            f->x.targets[o + i] = 2000 + 1000 * b + i;
            f->x.positions[o + i] = k;
            f->x.seg[o + i] = i - k;
            f->x.mask[o + i] = 1.0f;
        }
    REQUIRE(i == T);
}

static int fx_split(fixture *f) {
    f->b = (gpt_batch){.B = f->t.cfg.micro_batch_size, .T = f->t.cfg.seq_length, .tokens = f->x.tokens,
                       .targets = f->x.targets, .positions = f->x.positions, .seg = f->x.seg, .loss_mask = f->x.mask};
    return trainer__cp_localize(&f->t, &f->x, &f->b, 0);
}

/* -1 in want: a padding token (token 0, mask 0, row -1); a real token's row in the whole
 * batch (gpt_batch.rows, what hidden dropout is keyed by) is b T + its position */
static void expect_tokens(const fixture *f, const int *want, int n) {
    REQUIRE(f->b.T * f->b.B == n);
    REQUIRE(f->b.rows == f->t.cp_rows);
    const int T = f->t.cfg.seq_length;
    for (int i = 0; i < n; i++) {
        if (want[i] < 0) {
            CHECK_MSG(f->x.tokens[i] == 0 && f->x.mask[i] == 0.0f && f->b.rows[i] == -1,
                      "local %d: a padding token, got %d mask %g row %d", i, f->x.tokens[i], f->x.mask[i], f->b.rows[i]);
        } else {
            CHECK_MSG(f->b.rows[i] == want[i] / 1000 * T + want[i] % 1000, "local %d: row %d", i, f->b.rows[i]);
            CHECK_MSG(f->x.tokens[i] == want[i] && f->x.mask[i] == 1.0f && f->x.targets[i] == 2000 + want[i],
                      "local %d: token %d, got %d (mask %g)", i, want[i], f->x.tokens[i], f->x.mask[i]);
        }
    }
}

static void test_sequence_split(void) {
    /* T 8, cp 2: rank 0 keeps chunks 0 and 3 (tokens 0,1,6,7), rank 1 chunks 1 and 2 */
    const int lens[2] = {3, 5};
    const int want[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}};
    for (int r = 0; r < 2; r++) {
        fixture f;
        fx_init(&f, 1, 8, 2, r, false, 1.5);
        fx_fill(&f, 0, lens, 2);
        REQUIRE(fx_split(&f) == 0);
        CHECK(f.b.T == 4);
        CHECK(f.t.cp_ntok == 8.0);
        expect_tokens(&f, want[r], 4);
        for (int i = 0; i < 4; i++) CHECK(f.x.seg[i] == (want[r][i] < 3 ? 0 : 3)); /* document ids */
        fx_free(&f);
    }
}

static void test_thd_layout(void) {
    /* T 16, cp 2 (chunks of 2cp = 4 per document): documents of 5, 3 and 8 tokens pad to 8,
     * 4 and 8 (20 tokens, 10 per rank, halves of 5). Chunk sizes S: 2, 1, 2.
     *   rank 0, chunk 0 of each: d1 {0,1}, d2 {5}, d3 {8,9}; chunk 3: d1 pads, d2 pad, d3 {14,15}
     *   rank 1, chunk 1: d1 {2,3}, d2 {6}, d3 {10,11}; chunk 2: d1 {4, pad}, d2 {7}, d3 {12,13} */
    const int lens[3] = {5, 3, 8};
    const int want[2][10] = {{0, 1, 5, 8, 9, -1, -1, -1, 14, 15}, {2, 3, 6, 10, 11, 4, -1, 7, 12, 13}};
    const int ids[2][10] = {{0, 0, 5, 8, 8, 0, 0, 5, 8, 8}, {0, 0, 5, 8, 8, 0, 0, 5, 8, 8}};
    for (int r = 0; r < 2; r++) {
        fixture f;
        fx_init(&f, 1, 16, 2, r, true, 1.5);
        fx_fill(&f, 0, lens, 3);
        REQUIRE(fx_split(&f) == 0);
        CHECK(f.b.T == 10);
        CHECK(f.t.cp_ntok == 16.0);
        expect_tokens(&f, want[r], 10);
        for (int i = 0; i < 10; i++) CHECK_MSG(f.x.seg[i] == ids[r][i], "rank %d local %d: doc %d", r, i, f.x.seg[i]);
        /* positions: the real tokens' own; a padding token its document's last */
        for (int i = 0; i < 10; i++) {
            int w = want[r][i];
            int pos = w >= 0 ? (w < 5 ? w : w < 8 ? w - 5 : w - 8) : (ids[r][i] == 0 ? 4 : ids[r][i] == 5 ? 2 : 7);
            CHECK_MSG(f.x.positions[i] == pos, "rank %d local %d: position %d, want %d", r, i, f.x.positions[i], pos);
        }
        CHECK(f.b.seg == f.x.seg);
        fx_free(&f);
    }
}

static void test_thd_trailing_padding(void) {
    /* B 2, T 8, cp 2: sequence 0 is one document (8, padded 8), sequence 1 has 1 + 7 (4 + 8 =
     * 12): the micro batch's padded length is 12, sequence 0 gets a padding document of 4
     * (id T = 8, mask 0) */
    fixture f;
    fx_init(&f, 2, 8, 2, 0, true, 1.5);
    const int a[1] = {8}, b[2] = {1, 7};
    fx_fill(&f, 0, a, 1);
    fx_fill(&f, 1, b, 2);
    REQUIRE(fx_split(&f) == 0);
    CHECK(f.b.T == 6);
    CHECK(f.t.cp_ntok == 16.0);
    /* rank 0, sequence 0: chunk 0 of d (S 2) {0,1}, of the padding document (S 1) pad; chunk 3:
     * {6,7}, pad. sequence 1: chunk 0 of d1 (S 1) {0}, of d2 (S 2) {1,2}; chunk 3: pad, {7, pad} */
    const int want[12] = {0, 1, -1, 6, 7, -1, 1000, 1001, 1002, -1, 1007, -1};
    expect_tokens(&f, want, 12);
    CHECK(f.x.seg[2] == 8 && f.x.seg[5] == 8);
    fx_free(&f);
}

static void test_thd_capacity(void) {
    /* T 16, cp 4 (chunks of 8): 16 documents of 1 token pad to 128 > 1.5 x 16 */
    fixture f;
    fx_init(&f, 1, 16, 4, 1, true, 1.5);
    int lens[16];
    for (int i = 0; i < 16; i++) lens[i] = 1;
    fx_fill(&f, 0, lens, 16);
    CHECK(fx_split(&f) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "sample 0: its documents padded to multiples of 2 * context-parallel-size = 8 "
                                  "take 128 tokens, more than the packed capacity 24") != NULL);
    fx_free(&f);
}

/* Random documents at cp 1..4 (cp 1 through the THD path with the trainer's cp 1 fields is not
 * a configuration; cp 2-4 here): every real token is kept by exactly one rank, at the place of
 * its chunk (rank r's half 0 holds chunk r of every document in order, half 1 chunk 2cp-r-1),
 * and every other local token is padding. */
static void test_thd_random(void) {
    uint64_t rng = 12345;
    for (int cp = 2; cp <= 4; cp++)
        for (int trial = 0; trial < 30; trial++) {
            const int T = 8 * cp * (1 + (int)(t_mix(rng++) % 4)), B = 1 + (int)(t_mix(rng++) % 3), c2 = 2 * cp;
            int lens[2048], nd[3], *ln[3];
            int used = 0;
            for (int b = 0; b < B; b++) {
                ln[b] = lens + used;
                int left = T, n = 0;
                while (left > 0) {
                    int l = 1 + (int)(t_mix(rng++) % (uint64_t)(T / 2));
                    l = l > left ? left : l;
                    ln[b][n++] = l;
                    left -= l;
                }
                nd[b] = n;
                used += n;
            }
            int *seen = calloc((size_t)B * T, sizeof(int));
            for (int r = 0; r < cp; r++) {
                fixture f;
                fx_init(&f, B, T, cp, r, true, (double)cp); /* the most a rank may hold */
                for (int b = 0; b < B; b++) fx_fill(&f, b, ln[b], nd[b]);
                REQUIRE(fx_split(&f) == 0);
                const int L = f.b.T, H = L / 2;
                REQUIRE(L % 2 == 0 && (L * cp) % c2 == 0);
                for (int b = 0; b < B; b++) {
                    /* walk the documents as the split does: chunk r, then chunk 2cp-r-1 */
                    int h = 0, start = 0;
                    for (int d = 0; d < nd[b]; d++) {
                        const int P = (ln[b][d] + c2 - 1) / c2 * c2, S = P / c2;
                        for (int half = 0; half < 2; half++) {
                            const int k = half ? c2 - r - 1 : r;
                            for (int q = 0; q < S; q++) {
                                const int v = k * S + q, li = b * L + half * H + h + q;
                                if (v < ln[b][d]) {
                                    CHECK(f.x.tokens[li] == 1000 * b + start + v && f.x.mask[li] == 1.0f);
                                    CHECK(f.b.rows[li] == b * T + start + v);
                                    seen[b * T + start + v]++;
                                } else {
                                    CHECK(f.x.mask[li] == 0.0f);
                                }
                                CHECK(f.x.seg[li] == start);
                            }
                        }
                        h += S;
                        start += ln[b][d];
                    }
                    for (int q = h; q < H; q++) /* the trailing padding document */
                        CHECK(f.x.mask[b * L + q] == 0.0f && f.x.mask[b * L + H + q] == 0.0f &&
                              f.x.seg[b * L + q] == T);
                }
                fx_free(&f);
            }
            for (int i = 0; i < B * T; i++) CHECK_MSG(seen[i] == 1, "cp %d: token %d kept %d times", cp, i, seen[i]);
            free(seen);
        }
}

int main(void) {
    RUN(test_sequence_split);
    RUN(test_thd_layout);
    RUN(test_thd_trailing_padding);
    RUN(test_thd_capacity);
    RUN(test_thd_random);
    return TEST_EXIT();
}
