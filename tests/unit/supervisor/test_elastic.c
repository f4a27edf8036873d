/* test_elastic.c - supervisor/elastic.c, --elastic's plans: a node of dp 4 lost (dp 2 keeps its
 * ranks), a middle replica lost (the others close up in order), tp 2 (a replica of two ranks
 * leaves whole, its live rank too), pp 2 and cp 2 (each rank keeps its stage or context rank;
 * a layout whose nodes hold parts of several replicas loses them all), the floor of
 * --elastic-min-replicas, and the grow back (the new node's slots take the new replicas'
 * ranks, the old ranks keep their coordinates, never beyond the job's first size). */
#include "supervisor/elastic.h"

#include "tests/test.h"

#define MAXW 16

typedef struct job {
    topo_layout layout;
    topo_coord coord[MAXW];
    svp_slot slots[MAXW];
    svp_view v;
    bool mark[MAXW];
    int new_rank[MAXW];
    sve_plan p;
} job;

/* world ranks, tp x pp x cp (tp_pp_dp: --use-tp-pp-dp-mapping's order), nproc slots per node,
 * every slot alive and holding its rank. */
static int job_init_mp(job *j, int world, int tp, int pp, int cp, bool tp_pp_dp, int nproc) {
    char err[200];
    memset(j, 0, sizeof *j);
    if (topo_layout_init(&j->layout, world, tp, pp, cp, 1, 0, tp_pp_dp, err, sizeof err)) return -1;
    for (int r = 0; r < world; r++)
        if (topo_coords(&j->layout, r, &j->coord[r])) return -1;
    for (int i = 0; i < world; i++) j->slots[i] = (svp_slot){.state = SVP_TRAINING, .rank = i, .node = i / nproc};
    j->v = (svp_view){.slots = j->slots, .nslots = world, .world = world, .coord = j->coord};
    j->p.new_rank = j->new_rank;
    return 0;
}

static int job_init(job *j, int world, int tp, int nproc) { return job_init_mp(j, world, tp, 1, 1, false, nproc); }

/* Node n's slots gone (dead, marked). */
static void lose(job *j, int n) {
    for (int i = 0; i < j->v.nslots; i++)
        if (j->slots[i].node == n) j->slots[i].state = SVP_EXITED, j->mark[i] = true;
}

/* dp 4 on two nodes of 2, node 1 lost: dp 2, ranks 0 and 1 keep their numbers; node 1 back: dp 4. */
static void node_lost_and_back(void) {
    job j;
    REQUIRE(job_init(&j, 4, 1, 2) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 2);
    CHECK(j.p.layout.dp == 2 && j.p.layout.world == 2);
    CHECK(j.new_rank[0] == 0 && j.new_rank[1] == 1 && j.new_rank[2] == -1 && j.new_rank[3] == -1);
    /* the grow: the world of 2 as the supervisor holds it after the shrink */
    topo_layout l2 = j.p.layout;
    topo_coord c2[MAXW];
    for (int r = 0; r < 2; r++) REQUIRE(topo_coords(&l2, r, &c2[r]) == 0);
    for (int i = 0; i < 4; i++) j.slots[i].rank = j.new_rank[i];
    j.slots[2].state = j.slots[3].state = SVP_REGISTERED; /* the new agent's workers */
    j.v.world = 2;
    j.v.coord = c2;
    bool join[MAXW] = {false, false, true, true};
    CHECK(sve_plan_grow(&j.v, &l2, join, 4, &j.p) == 2);
    CHECK(j.p.layout.dp == 4 && j.p.layout.world == 4);
    for (int i = 0; i < 4; i++) CHECK_MSG(j.new_rank[i] == i, "slot %d: rank %d", i, j.new_rank[i]);
    /* never beyond the first size; one worker alone is no replica at tp 2 */
    CHECK(sve_plan_grow(&j.v, &l2, join, 3, &j.p) == 1);
    CHECK(j.new_rank[2] == 2 && j.new_rank[3] == -1);
}

/* dp 4, one node per rank, rank 1's node lost: 0, 2, 3 close up to 0, 1, 2. */
static void middle_replica_lost(void) {
    job j;
    REQUIRE(job_init(&j, 4, 1, 1) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 1);
    CHECK(j.p.layout.dp == 3);
    CHECK(j.new_rank[0] == 0 && j.new_rank[1] == -1 && j.new_rank[2] == 1 && j.new_rank[3] == 2);
}

/* tp 2 x dp 3 on three nodes of 2 with the replicas across nodes (slots 0..5, node = slot / 2,
 * replica = rank / 2): node 1 holds replica 1 whole; then a replica split over two nodes. */
static void tensor_parallel(void) {
    job j;
    REQUIRE(job_init(&j, 6, 2, 2) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 1);
    CHECK(j.p.layout.dp == 2 && j.p.layout.tp == 2);
    int want[6] = {0, 1, -1, -1, 2, 3};
    for (int i = 0; i < 6; i++) CHECK_MSG(j.new_rank[i] == want[i], "slot %d: rank %d", i, j.new_rank[i]);
    /* the same job with nodes of 3: node 0 holds replica 0 and tp 0 of replica 1 */
    REQUIRE(job_init(&j, 6, 2, 3) == 0);
    lose(&j, 0);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 2);
    CHECK(j.p.layout.dp == 1);
    int want2[6] = {-1, -1, -1, -1, 0, 1}; /* rank 3 lives but its replica left */
    for (int i = 0; i < 6; i++) CHECK_MSG(j.new_rank[i] == want2[i], "slot %d: rank %d", i, j.new_rank[i]);
}

/* Every kept slot's rank has the coordinates (tp, cp, pp) its old rank had, and dp as kept. */
static void same_coords(const job *j, const int *dp_to) {
    for (int i = 0; i < j->v.nslots; i++) {
        if (j->new_rank[i] < 0) continue;
        topo_coord o = j->coord[j->slots[i].rank], n;
        REQUIRE(topo_coords(&j->p.layout, j->new_rank[i], &n) == 0);
        CHECK_MSG(n.tp == o.tp && n.cp == o.cp && n.pp == o.pp && n.dp == dp_to[o.dp],
                  "slot %d: (tp %d cp %d pp %d dp %d) -> (tp %d cp %d pp %d dp %d)", i, o.tp, o.cp, o.pp, o.dp, n.tp,
                  n.cp, n.pp, n.dp);
    }
}

/* pp 2 x dp 3 on three nodes of 2 with --use-tp-pp-dp-mapping (node k holds replica k's two
 * stages): node 1 lost, replicas 0 and 2 stay with their stages; without the mapping (stage
 * outermost) node 1 holds stage 0 of replica 2 and stage 1 of replica 0, so both leave. cp 2 x
 * dp 3 (context ranks next to each other): as the mapped pipeline. */
static void pipeline_and_context(void) {
    job j;
    int to[3] = {0, -1, 1};
    REQUIRE(job_init_mp(&j, 6, 1, 2, 1, true, 2) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 1);
    CHECK(j.p.layout.dp == 2 && j.p.layout.pp == 2 && j.p.layout.tp_pp_dp);
    int want[6] = {0, 1, -1, -1, 2, 3};
    for (int i = 0; i < 6; i++) CHECK_MSG(j.new_rank[i] == want[i], "slot %d: rank %d", i, j.new_rank[i]);
    same_coords(&j, to);
    REQUIRE(job_init_mp(&j, 6, 1, 2, 1, false, 2) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 2);
    int to2[3] = {-1, 0, -1};
    CHECK(j.p.layout.dp == 1);
    same_coords(&j, to2);
    REQUIRE(job_init_mp(&j, 6, 1, 1, 2, false, 2) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 1);
    CHECK(j.p.layout.dp == 2 && j.p.layout.cp == 2);
    for (int i = 0; i < 6; i++) CHECK_MSG(j.new_rank[i] == want[i], "slot %d: rank %d", i, j.new_rank[i]);
    same_coords(&j, to);
}

/* --elastic-min-replicas: dp 4 losing 2 with a floor of 3 is refused; nothing lost changes nothing. */
static void min_replicas(void) {
    job j;
    REQUIRE(job_init(&j, 4, 1, 2) == 0);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == 0);
    lose(&j, 1);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 3, &j.p) == -1);
    CHECK(j.p.changed == 2);
    lose(&j, 0);
    CHECK(sve_plan_shrink(&j.v, &j.layout, j.mark, 1, &j.p) == -1); /* (none would remain) */
}

/* The distributed optimizer's shards: dp 4, shard k on k and k + 1. Node 1 (ranks 2, 3) takes
 * shard 2 with both holders; rank 1 alone leaves its shard on rank 2; without redundancy any
 * leaving rank's shard is lost. */
static void optimizer_shards(void) {
    job j;
    REQUIRE(job_init(&j, 4, 1, 2) == 0);
    lose(&j, 1);
    CHECK(sve_optimizer_lost(&j.v, &j.layout, j.mark, 2) == 2);
    CHECK(sve_optimizer_lost(&j.v, &j.layout, j.mark, 0) == -1); /* (no distributed optimizer) */
    REQUIRE(job_init(&j, 4, 1, 1) == 0);
    lose(&j, 1);
    CHECK(sve_optimizer_lost(&j.v, &j.layout, j.mark, 2) == -1);
    CHECK(sve_optimizer_lost(&j.v, &j.layout, j.mark, 1) == 1);
    REQUIRE(job_init(&j, 4, 1, 1) == 0);
    lose(&j, 3); /* (its copy wraps round to rank 0) */
    CHECK(sve_optimizer_lost(&j.v, &j.layout, j.mark, 2) == -1);
}

int main(void) {
    RUN(optimizer_shards);
    RUN(node_lost_and_back);
    RUN(middle_replica_lost);
    RUN(tensor_parallel);
    RUN(pipeline_and_context);
    RUN(min_replicas);
    return TEST_EXIT();
}
