/* test_groups.c - Megatron's parallel groups (scheduler/groups.h): every kind partitions the
 * ranks it covers, topo_group_of finds a rank's group, the dense coordinates agree with
 * topo_init (and topo_coords; a shard is a data-parallel group), and layouts the world does not fit are refused. The groups themselves are
 * compared with a numpy restatement of Megatron's RankGenerator for many layouts by the
 * integration test cli_topology (tests/data/megatron_groups_ref.py). */
#include "scheduler/groups.h"
#include "scheduler/topology.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

static void partitions(void) {
    int world = 48, ranks[48], members[48];
    topo_layout l;
    char err[200];
    REQUIRE(topo_layout_init(&l, world, 2, 2, 3, 2, 1, false, err, sizeof err) == 0);
    CHECK(l.dp == 4 && l.edp == 12 && l.etp == 1);
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        int ng, sz, seen[48] = {0};
        topo_groups(&l, (topo_group_kind)k, ranks, &ng, &sz);
        bool partial = k == TOPO_G_EMBEDDING || k == TOPO_G_POS_EMBEDDING;
        CHECK_MSG(partial || ng * sz == world, "%s: %d x %d", topo_group_name((topo_group_kind)k), ng, sz);
        for (int i = 0; i < ng * sz; i++) {
            CHECK(ranks[i] >= 0 && ranks[i] < world);
            seen[ranks[i]]++;
        }
        for (int r = 0; r < world; r++) {
            CHECK(seen[r] <= 1 && (partial || seen[r] == 1));
            int n, g = topo_group_of(&l, (topo_group_kind)k, r, members, &n);
            CHECK((g >= 0) == (seen[r] == 1));
            if (g >= 0) {
                bool in = false;
                for (int i = 0; i < n; i++) in |= members[i] == r;
                CHECK(in && n == sz);
            }
        }
    }
    /* coordinates: a rank's place in its tp, cp, dp, pp groups is topo_init's */
    for (int r = 0; r < world; r++) {
        topo t;
        REQUIRE(topo_init(&t, world, 2, 2, 3, r) == 0);
        int n, m[48];
        static const topo_group_kind along[4] = {TOPO_G_TP, TOPO_G_CP, TOPO_G_DP, TOPO_G_PP};
        const int want[4] = {t.tp_rank, t.cp_rank, t.dp_rank, t.pp_rank};
        for (int d = 0; d < 4; d++) {
            topo_group_of(&l, along[d], r, m, &n);
            int at = -1;
            for (int i = 0; i < n; i++)
                if (m[i] == r) at = i;
            CHECK_MSG(at == want[d], "rank %d along %s: %d vs %d", r, topo_group_name(along[d]), at, want[d]);
        }
        topo_coord c;
        REQUIRE(topo_coords(&l, r, &c) == 0);
        CHECK(c.tp == t.tp_rank && c.cp == t.cp_rank && c.dp == t.dp_rank && c.pp == t.pp_rank);
        /* the members of its data-parallel group hold its shard, no other rank does */
        topo_group_of(&l, TOPO_G_DP, r, m, &n);
        for (int q = 0; q < world; q++) {
            topo_coord cq;
            REQUIRE(topo_coords(&l, q, &cq) == 0);
            bool in = false;
            for (int i = 0; i < n; i++) in |= m[i] == q;
            CHECK(topo_same_shard(&c, &cq) == in);
        }
    }
    /* the embedding groups: first and last stage of each pipeline */
    int ng, sz;
    topo_groups(&l, TOPO_G_EMBEDDING, ranks, &ng, &sz);
    CHECK(ng == 24 && sz == 2 && ranks[0] == 0 && ranks[1] == 24);
    topo_groups(&l, TOPO_G_POS_EMBEDDING, ranks, &ng, &sz);
    CHECK(ng == 24 && sz == 1 && ranks[23] == 23);
    /* MTP depths on a stage before the last (Megatron's get_embedding_ranks): the stages
     * named, in pipeline order; the group of a rank outside them: none */
    topo_layout e;
    REQUIRE(topo_layout_init(&e, 6, 1, 3, 1, 1, 1, false, err, sizeof err) == 0); /* pipelines 0 2 4, 1 3 5 */
    e.emb_stages = 1ull << 0 | 1ull << 1; /* untied: the first and the MTP stage */
    topo_groups(&e, TOPO_G_EMBEDDING, ranks, &ng, &sz);
    CHECK(ng == 2 && sz == 2 && ranks[0] == 0 && ranks[1] == 2 && ranks[2] == 1 && ranks[3] == 3);
    int mem[48], msz = 0;
    CHECK(topo_group_of(&e, TOPO_G_EMBEDDING, 3, mem, &msz) == 1 && msz == 2 && mem[0] == 1 && mem[1] == 3);
    CHECK(topo_group_of(&e, TOPO_G_EMBEDDING, 4, mem, &msz) < 0);
    e.emb_stages |= 1ull << 2; /* tied: the last too */
    topo_groups(&e, TOPO_G_EMBEDDING, ranks, &ng, &sz);
    CHECK(ng == 2 && sz == 3 && ranks[0] == 0 && ranks[1] == 2 && ranks[2] == 4);
}

static void refusals(void) {
    topo_layout l;
    char err[300];
    CHECK(topo_layout_init(&l, 6, 4, 1, 1, 1, 0, false, err, sizeof err) != 0 && strstr(err, "tensor 4"));
    CHECK(topo_layout_init(&l, 8, 1, 1, 1, 3, 1, false, err, sizeof err) != 0 && strstr(err, "expert 3"));
    CHECK(topo_layout_init(&l, 8, 2, 2, 1, 1, 1, true, err, sizeof err) != 0 && strstr(err, "pipeline groups differ"));
    CHECK(topo_layout_init(&l, 8, 2, 1, 1, 1, 1, true, err, sizeof err) == 0); /* one stage: the same groups */
    CHECK(topo_layout_init(&l, 8, 2, 2, 1, 1, 0, true, err, sizeof err) == 0 && l.etp == 2);
}

int main(void) {
    RUN(partitions);
    RUN(refusals);
    return TEST_EXIT();
}
