/* test_planner.c - supervisor/planner.c, the supervisor's restart decisions, over fault
 * patterns: each replica of every shard dead in turn (data, tensor, pipeline parallel), every
 * replica of one shard dead (the checkpoint, or no way on without one), survivors behind,
 * both holders of a distributed-optimizer shard dead, warm spares (one dying during the
 * restart; whole spare nodes), shift-ranks without a spare, nothing alive, waiting for the
 * barrier, and evicting a straggler (a spare, none, the last replica, an optimizer shard's last
 * holder, a whole node). */
#include "supervisor/planner.h"

#include "tests/test.h"

#define MAXW 16

/* A job of world ranks (tp x pp x cp, the rest data parallel) plus spares warm spares, every
 * rank at the barrier having committed iteration 10. */
typedef struct job {
    topo_layout layout;
    topo_coord coord[MAXW];
    svp_slot slots[MAXW];
    svp_view v;
    int source[MAXW], new_rank[MAXW], take[MAXW];
    svp_plan p;
} job;

static int job_init_ep(job *j, int world, int spares, int tp, int pp, int cp, int ep) {
    char err[200];
    memset(j, 0, sizeof *j);
    if (topo_layout_init(&j->layout, world, tp, pp, cp, ep, 0, false, err, sizeof err)) {
        fprintf(stderr, "layout: %s\n", err);
        return -1;
    }
    for (int r = 0; r < world; r++)
        if (topo_coords(&j->layout, r, &j->coord[r])) return -1;
    for (int i = 0; i < world + spares; i++)
        j->slots[i] = (svp_slot){.state = SVP_TRAINING, .rank = i < world ? i : -1, .ready = i < world,
                                 .ready_iter = 10};
    j->v = (svp_view){.slots = j->slots, .nslots = world + spares, .world = world, .coord = j->coord,
                      .checkpoint_iter = -1, .current_iter = 11};
    j->p = (svp_plan){.source = j->source, .new_rank = j->new_rank};
    return 0;
}

static int job_init_cp(job *j, int world, int spares, int tp, int pp, int cp) {
    return job_init_ep(j, world, spares, tp, pp, cp, 1);
}
static int job_init(job *j, int world, int spares, int tp, int pp) { return job_init_cp(j, world, spares, tp, pp, 1); }

/* Rank r's process died and a new one registered in its slot (not at the barrier). */
static void replaced(job *j, int slot) {
    j->slots[slot].state = SVP_REGISTERED;
    j->slots[slot].replacing = true;
    j->slots[slot].ready = false;
    j->slots[slot].ready_iter = 0;
}

static void plan(job *j) { svp_plan_restart(&j->v, &j->p); }

/* dp 4: one rank dead; every rank takes the first survivor's state. */
static void data_parallel_each_dead(void) {
    for (int dead = 0; dead < 4; dead++) {
        job j;
        REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
        replaced(&j, dead);
        plan(&j);
        CHECK_MSG(j.p.verdict == SVP_FROM_PEERS, "dead %d: verdict %d", dead, j.p.verdict);
        int first = dead == 0 ? 1 : 0;
        for (int r = 0; r < 4; r++) CHECK_MSG(j.source[r] == first, "dead %d: rank %d from %d", dead, r, j.source[r]);
        CHECK(j.p.src == first);
        CHECK(j.p.resume_iter == 10 && j.p.committed == 10);
        CHECK(j.p.faults_through == 11);
        CHECK(j.p.nreplaced == 1 && j.p.nsources == 1);
        for (int i = 0; i < 4; i++) CHECK(j.new_rank[i] == i);
    }
}

/* tp 2 x pp 2 x dp 2 (and tp 2 x dp 2, tp 1 x pp 4 x dp 2): every rank dead in turn; each
 * shard's source is its first surviving replica, never the dead rank, never another shard. */
static void model_parallel_each_replica_dead(void) {
    const int shapes[][3] = {{4, 2, 1}, {8, 2, 2}, {8, 1, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int world = shapes[s][0], tp = shapes[s][1], pp = shapes[s][2];
        for (int dead = 0; dead < world; dead++) {
            job j;
            REQUIRE(job_init(&j, world, 0, tp, pp) == 0);
            replaced(&j, dead);
            plan(&j);
            CHECK_MSG(j.p.verdict == SVP_FROM_PEERS, "world %d tp %d pp %d dead %d", world, tp, pp, dead);
            for (int r = 0; r < world; r++) {
                int src = j.source[r];
                REQUIRE(src >= 0 && src < world);
                CHECK_MSG(topo_same_shard(&j.coord[src], &j.coord[r]), "rank %d from %d: another shard", r, src);
                CHECK_MSG(src != dead, "rank %d from the dead rank %d", r, dead);
                int first = -1;
                for (int q = world - 1; q >= 0; q--)
                    if (q != dead && topo_same_shard(&j.coord[q], &j.coord[r])) first = q;
                CHECK_MSG(src == first, "rank %d from %d, not its shard's first survivor %d", r, src, first);
            }
            CHECK_MSG(j.p.nsources == tp * pp, "%d sources", j.p.nsources); /* one per shard */
        }
    }
}

/* tp 2 x dp 2: both replicas of one shard dead: the checkpoint, or no way on without one. */
static void all_replicas_of_a_shard_dead(void) {
    job j;
    REQUIRE(job_init(&j, 4, 0, 2, 1) == 0);
    /* the ranks of tp rank 0 */
    int shard[2], n = 0;
    for (int r = 0; r < 4; r++)
        if (j.coord[r].tp == 0) shard[n++] = r;
    REQUIRE(n == 2);
    replaced(&j, shard[0]);
    replaced(&j, shard[1]);
    plan(&j);
    CHECK(j.p.verdict == SVP_CANNOT_CONTINUE);
    CHECK(j.p.reason == SVP_SHARD_LOST);
    CHECK(j.p.why_rank == shard[0] || j.p.why_rank == shard[1]);
    j.v.checkpoint_iter = 8;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_CHECKPOINT);
    CHECK(j.p.reason == SVP_SHARD_LOST);
    CHECK(j.p.src == -1);
    CHECK(j.p.resume_iter == 8 && j.p.committed == 10);
    for (int r = 0; r < 4; r++) CHECK(j.source[r] == -1);
    CHECK(j.p.nreplaced == 2);
}

/* The survivors of one shard committed less than another shard's: the checkpoint. */
static void shard_behind(void) {
    job j;
    REQUIRE(job_init(&j, 4, 0, 2, 1) == 0);
    for (int r = 0; r < 4; r++)
        if (j.coord[r].tp == 1) j.slots[r].ready_iter = 9;
    j.v.checkpoint_iter = 5;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_CHECKPOINT);
    CHECK(j.p.reason == SVP_SHARD_BEHIND);
    CHECK(j.coord[j.p.why_rank].tp == 1);
    CHECK(j.p.resume_iter == 5);
}

/* dp 4 with the distributed optimizer: a shard lives on rank k and (redundancy) k + 1. */
static void optimizer_holders(void) {
    job j;
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.dopt_holders = 2;
    j.v.checkpoint_iter = 6;
    replaced(&j, 1);
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS); /* rank 1's shard lives on rank 2 too */
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == -1);
    replaced(&j, 2); /* both holders of rank 1's shard */
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_CHECKPOINT);
    CHECK(j.p.reason == SVP_OPTIMIZER_LOST);
    CHECK(j.p.why_rank == 1);
    CHECK(j.p.resume_iter == 6 && j.p.committed == 10);
    /* the last rank's shard lives on rank 0 too (the group wraps) */
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.dopt_holders = 2;
    replaced(&j, 3);
    replaced(&j, 0);
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 3);
    /* no redundancy: one dead holder is enough */
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.dopt_holders = 1;
    replaced(&j, 2);
    plan(&j);
    CHECK(j.p.verdict == SVP_CANNOT_CONTINUE && j.p.reason == SVP_OPTIMIZER_LOST && j.p.why_rank == 2);
    /* a holder that committed less than the newest iteration does not count */
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.dopt_holders = 2;
    j.slots[1].ready_iter = 9;
    j.slots[2].ready_iter = 9;
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 1);
}

/* Data 4 x expert 2 with the distributed optimizer: the dense shards' ring is the data-
 * parallel group (ranks 0..3), the experts' the expert-data-parallel pairs {0, 2} and {1, 3}. */
static void optimizer_shards_expert_parallel(void) {
    job j;
    REQUIRE(job_init_ep(&j, 4, 0, 1, 1, 1, 2) == 0);
    REQUIRE(j.coord[1].ep == 1 && j.coord[2].ep == 0 && j.coord[2].dp == 2);
    j.v.dopt_holders = 2;
    replaced(&j, 0); /* its dense shard on rank 1, its experts' on rank 2 */
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == -1);
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS);
    replaced(&j, 2); /* both holders of the experts' shard of ranks 0 and 2 */
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 0);
    REQUIRE(job_init_ep(&j, 4, 0, 1, 1, 1, 2) == 0);
    j.v.dopt_holders = 2;
    replaced(&j, 1);
    replaced(&j, 3); /* the dense shards live on ranks 2 and 0; the experts' of 1 and 3 nowhere */
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 1);
    REQUIRE(job_init_ep(&j, 4, 0, 1, 1, 1, 2) == 0);
    j.v.dopt_holders = 2;
    replaced(&j, 2);
    replaced(&j, 3); /* the dense shard of rank 2 lost (on 2 and 3) */
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 2);
}

/* Context 2 x data 2: the shards span data x context, the context rank fastest (rank 1 is
 * context 1 of data-parallel rank 0, place 1; rank 2 is context 0 of data-parallel rank 1,
 * place 2): shard 1 lives on ranks 1 and 2, not on rank 3 (the same context rank in the
 * other replica). */
static void optimizer_holders_cp(void) {
    job j;
    REQUIRE(job_init_cp(&j, 4, 0, 1, 1, 2) == 0);
    REQUIRE(j.coord[1].cp == 1 && j.coord[1].dp == 0 && j.coord[2].cp == 0 && j.coord[2].dp == 1);
    j.v.dopt_holders = 2;
    replaced(&j, 1);
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == -1); /* on rank 2 too */
    replaced(&j, 2);
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == 1);
    /* ranks 1 and 3: shard 1 on rank 2, shard 3 on rank 0 (the ring wraps) */
    REQUIRE(job_init_cp(&j, 4, 0, 1, 1, 2) == 0);
    j.v.dopt_holders = 2;
    replaced(&j, 1);
    replaced(&j, 3);
    CHECK(svp_optimizer_shard_lost(&j.v, 10) == -1);
}

/* Warm spares: the last live spare takes the first dead rank; a spare dying during the
 * restart leaves its new rank to a new process in its slot. */
static void spares(void) {
    job j;
    REQUIRE(job_init(&j, 4, 2, 1, 1) == 0); /* slots 4 and 5: spares */
    j.slots[1].state = SVP_EXITED;
    j.slots[3].state = SVP_EXITING;
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[1] == 5 && j.take[3] == 4);
    CHECK(j.take[0] == -1 && j.take[2] == -1 && j.take[4] == -1 && j.take[5] == -1);
    /* a spare not registered yet (or gone) is not taken */
    j.slots[5].state = SVP_STARTED;
    j.slots[4].state = SVP_EXITED;
    CHECK(svp_take_spares(&j.v, j.take) == 0);
    CHECK(j.take[1] == -1 && j.take[3] == -1);
    /* one spare, two dead ranks: the first dead rank gets it */
    REQUIRE(job_init(&j, 4, 1, 1, 1) == 0);
    j.slots[0].state = SVP_EXITED;
    j.slots[2].state = SVP_EXITED;
    CHECK(svp_take_spares(&j.v, j.take) == 1);
    CHECK(j.take[0] == 4 && j.take[2] == -1);
    /* the spare took rank 0 (slot 0 is a spare now, starting); then it dies before its assignment */
    j.slots[4].rank = 0;
    j.slots[0].rank = -1;
    j.slots[0].state = SVP_STARTED;
    replaced(&j, 4);
    replaced(&j, 2);
    j.slots[4].state = SVP_EXITING;
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT);
    CHECK(svp_take_spares(&j.v, j.take) == 0); /* already being replaced: in place, no spare */
    j.slots[4].state = SVP_RESPAWN;
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT);
    j.slots[4].state = SVP_REGISTERED;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS);
    CHECK(j.p.nreplaced == 2);
    CHECK(j.source[0] == 1 && j.source[2] == 1);
    CHECK(j.new_rank[4] == 0 && j.new_rank[0] == -1);
}

/* ShiftRanks with no spare: survivors close up in order, the replacement comes last. */
static void shift_ranks_without_spare(void) {
    job j;
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.shift_ranks = true;
    replaced(&j, 0);
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS);
    CHECK(j.new_rank[1] == 0 && j.new_rank[2] == 1 && j.new_rank[3] == 2 && j.new_rank[0] == 3);
    CHECK(j.p.src == 0); /* rank 1's state, rank 0 now */
    for (int r = 0; r < 4; r++) CHECK(j.source[r] == 0);
    /* two dead, the first survivor later in the world */
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.v.shift_ranks = true;
    replaced(&j, 0);
    replaced(&j, 2);
    j.slots[3].ready_iter = 11; /* committed more: the source */
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS && j.p.resume_iter == 11);
    CHECK(j.new_rank[1] == 0 && j.new_rank[3] == 1 && j.new_rank[0] == 2 && j.new_rank[2] == 3);
    CHECK(j.p.src == 1);
}

/* Nothing survived: the checkpoint, or no way on; faults up to the newest iteration fired. */
static void nothing_alive(void) {
    job j;
    REQUIRE(job_init(&j, 2, 0, 1, 1) == 0);
    replaced(&j, 0);
    replaced(&j, 1);
    plan(&j);
    CHECK(j.p.verdict == SVP_CANNOT_CONTINUE && j.p.reason == SVP_NO_SURVIVOR);
    CHECK(j.p.faults_through == 12);
    j.v.checkpoint_iter = 4;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_CHECKPOINT && j.p.resume_iter == 4 && j.p.committed == -1);
    CHECK(j.source[0] == -1 && j.source[1] == -1);
}

/* Not yet: a survivor away from the barrier, a replacement not registered. */
static void waits(void) {
    job j;
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    j.slots[2].ready = false;
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT);
    REQUIRE(job_init(&j, 4, 0, 1, 1) == 0);
    replaced(&j, 1);
    j.slots[1].state = SVP_STARTED;
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT);
    j.slots[1].state = SVP_TRAINING;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS);
}

/* Several nodes, node-major (nproc per node): each slot's node. */
static void on_nodes(job *j, int nproc) {
    for (int i = 0; i < j->v.nslots; i++) j->slots[i].node = i / nproc;
}

/* A node lost: every slot on it at once; its replacements started by a new agent. */
static void node_lost(job *j, int node) {
    for (int i = 0; i < j->v.nslots; i++)
        if (j->slots[i].node == node) {
            replaced(j, i);
            j->slots[i].state = SVP_STARTED; /* not registered yet */
        }
}

/* Three nodes x 2, tp 2 x dp 3 (node 2: ranks 4 and 5, one replica of each shard): a rank on
 * node 2 dead takes its state from its shard's replica on node 0; node 2 lost whole costs no
 * step: the plan waits for the new agent's workers, then both take their peers' state. */
static void nodes_replica_elsewhere(void) {
    job j;
    REQUIRE(job_init(&j, 6, 0, 2, 1) == 0);
    on_nodes(&j, 2);
    for (int n = 0; n < 3; n++) CHECK_MSG(svp_node_shard_lost(&j.v, n) == -1, "node %d", n);
    replaced(&j, 5);
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS && j.p.nreplaced == 1);
    CHECK(j.source[5] == 1 && j.source[4] == 0); /* node 0's replicas, the shard's first */
    REQUIRE(job_init(&j, 6, 0, 2, 1) == 0);
    on_nodes(&j, 2);
    node_lost(&j, 2);
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT);
    j.slots[4].state = SVP_REGISTERED;
    plan(&j);
    CHECK(j.p.verdict == SVP_WAIT); /* rank 5's process not registered yet */
    j.slots[5].state = SVP_REGISTERED;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS && j.p.reason == SVP_OK);
    CHECK(j.p.nreplaced == 2 && j.p.resume_iter == 10);
    for (int r = 0; r < 6; r++) CHECK_MSG(j.source[r] == r % 2, "rank %d from %d", r, j.source[r]);
}

/* Two nodes x 1, tp 2 (node 1 holds tp rank 1, the shard's only replica): losing node 1 loses
 * that shard: the checkpoint (none: no way on); a node of a dp-only job loses nothing. */
static void nodes_shard_only_there(void) {
    job j;
    REQUIRE(job_init(&j, 2, 0, 2, 1) == 0);
    on_nodes(&j, 1);
    CHECK(svp_node_shard_lost(&j.v, 1) == 1);
    CHECK(svp_node_shard_lost(&j.v, 0) == 0);
    node_lost(&j, 1);
    j.slots[1].state = SVP_REGISTERED;
    plan(&j);
    CHECK(j.p.verdict == SVP_CANNOT_CONTINUE && j.p.reason == SVP_SHARD_LOST && j.p.why_rank == 1);
    j.v.checkpoint_iter = 8;
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_CHECKPOINT && j.p.resume_iter == 8 && j.source[0] == -1);
    /* 4 nodes x 2, tp 2 x dp 4 with nodes holding both tp ranks: any node may go */
    REQUIRE(job_init(&j, 8, 0, 2, 1) == 0);
    on_nodes(&j, 2);
    for (int n = 0; n < 4; n++) CHECK_MSG(svp_node_shard_lost(&j.v, n) == -1, "node %d", n);
    /* ... but not a second node while the first's replacements are not in */
    node_lost(&j, 1);
    CHECK(svp_node_shard_lost(&j.v, 2) == -1);
    for (int i = 0; i < 8; i++)
        if (j.slots[i].node >= 1) j.slots[i].state = SVP_STARTED, j.slots[i].replacing = true;
    CHECK(svp_node_shard_lost(&j.v, 0) == 0);
}

/* Four nodes x 2, tp 2 x dp 3 on six ranks, node 3's two processes warm spares. Per process
 * (rank granularity) the last spare takes the first dead rank; with node granularity node 1
 * lost whole takes the whole spare node slot for slot, one rank dead on node 1 takes it too
 * for both ranks (the live one's process given up) unless the live rank's state has no other
 * replica, and a spare node missing a process, or already taken, is no spare node. */
static void spare_nodes(void) {
    job j;
    REQUIRE(job_init(&j, 6, 2, 2, 1) == 0);
    on_nodes(&j, 2);
    j.slots[2].state = j.slots[3].state = SVP_EXITING;
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[2] == 7 && j.take[3] == 6);
    j.v.node_granularity = true;
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[2] == 6 && j.take[3] == 7);
    for (int i = 0; i < 8; i++)
        if (i != 2 && i != 3) CHECK_MSG(j.take[i] == -1, "slot %d took %d", i, j.take[i]);
    j.slots[3].state = SVP_TRAINING; /* only rank 2 dead: node 1 goes out whole, live rank 3 too */
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[2] == 6 && j.take[3] == 7);
    /* ... but not where rank 3's shard has no live replica on another node (replacements) */
    j.slots[1].replacing = j.slots[5].replacing = true;
    CHECK(svp_take_spares(&j.v, j.take) == 0);
    CHECK(j.take[2] == -1 && j.take[3] == -1);
    j.slots[1].replacing = j.slots[5].replacing = false;
    j.slots[3].state = SVP_EXITED;
    j.slots[7].state = SVP_STARTED; /* a spare not registered: node 3 is not whole */
    CHECK(svp_take_spares(&j.v, j.take) == 0);
    j.slots[7].state = SVP_REGISTERED;
    j.slots[4].state = j.slots[5].state = SVP_EXITED; /* nodes 1 and 2 lost, one spare node */
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[2] == 6 && j.take[3] == 7 && j.take[4] == -1 && j.take[5] == -1);
    /* node 1's replacements on their way (in place): nothing taken for it again */
    j.slots[2].replacing = j.slots[3].replacing = true;
    CHECK(svp_take_spares(&j.v, j.take) == 2);
    CHECK(j.take[2] == -1 && j.take[4] == 6 && j.take[5] == 7);
}

/* Evicting a live straggler: the last spare takes its rank, the other slots keep theirs; the
 * restart that follows takes its state from its data-parallel peer. Refused without a free
 * spare, for a shard's last replica, for an optimizer shard's only holder, for a rank not
 * marked or already being replaced. */
static void evict_straggler(void) {
    job j;
    REQUIRE(job_init(&j, 2, 1, 1, 1) == 0); /* dp 2, slot 2 a spare */
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_BUSY); /* not marked */
    j.slots[1].evict = true;
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_OK);
    CHECK(j.take[1] == 2 && j.take[0] == -1 && j.take[2] == -1);
    CHECK(svp_take_spares(&j.v, j.take) == 1 && j.take[1] == 2); /* begin_restart's view: the same */
    /* carried out: the spare holds rank 1, slot 1 a spare (its process stopped) */
    j.slots[2].rank = 1;
    j.slots[1].rank = -1;
    j.slots[1].evict = false;
    j.slots[1].state = SVP_EXITED;
    replaced(&j, 2);
    plan(&j);
    CHECK(j.p.verdict == SVP_FROM_PEERS && j.p.reason == SVP_OK && j.p.resume_iter == 10);
    CHECK(j.source[1] == 0 && j.p.nreplaced == 1 && j.new_rank[2] == 1 && j.new_rank[1] == -1);
    /* no spare (or one not registered): refused */
    REQUIRE(job_init(&j, 2, 0, 1, 1) == 0);
    j.slots[0].evict = true;
    CHECK(svp_plan_evict(&j.v, 0, j.take) == SVP_EVICT_NO_SPARE);
    CHECK(j.take[0] == -1 && j.take[1] == -1);
    REQUIRE(job_init(&j, 2, 1, 1, 1) == 0);
    j.slots[2].state = SVP_STARTED;
    j.slots[0].evict = true;
    CHECK(svp_plan_evict(&j.v, 0, j.take) == SVP_EVICT_NO_SPARE);
    /* its only peer being replaced: it holds the shard's last replica */
    REQUIRE(job_init(&j, 2, 1, 1, 1) == 0);
    replaced(&j, 0);
    j.slots[1].evict = true;
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_LAST_REPLICA);
    j.slots[0].evict = true; /* and a replacement is not evicted */
    CHECK(svp_plan_evict(&j.v, 0, j.take) == SVP_EVICT_BUSY);
    /* tp 2 x dp 1: no replica at all */
    REQUIRE(job_init(&j, 2, 1, 2, 1) == 0);
    j.slots[1].evict = true;
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_LAST_REPLICA);
    /* tp 2 x dp 2: rank 3's shard lives on rank 1 */
    REQUIRE(job_init(&j, 4, 1, 2, 1) == 0);
    j.slots[3].evict = true;
    CHECK(svp_plan_evict(&j.v, 3, j.take) == SVP_EVICT_OK && j.take[3] == 4);
    /* the distributed optimizer without redundancy: its optimizer shard has no other holder */
    REQUIRE(job_init(&j, 2, 1, 1, 1) == 0);
    j.v.dopt_holders = 1;
    j.slots[1].evict = true;
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_OPTIMIZER);
    j.v.dopt_holders = 2; /* with redundancy rank 0 holds it too */
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_OK && j.take[1] == 2);
}

/* Node granularity: a straggler's node leaves whole for the spare node (its live peer on the
 * node too, where its shard has a replica on another node); not where the node holds a shard's
 * last replica, nor without a whole spare node. */
static void evict_straggler_node(void) {
    job j;
    REQUIRE(job_init(&j, 4, 2, 1, 1) == 0); /* dp 4 on nodes 0, 1; node 2 spare */
    on_nodes(&j, 2);
    j.v.node_granularity = true;
    j.slots[3].evict = true;
    CHECK(svp_plan_evict(&j.v, 3, j.take) == SVP_EVICT_OK);
    CHECK(j.take[2] == 4 && j.take[3] == 5 && j.take[0] == -1 && j.take[1] == -1);
    j.slots[5].state = SVP_EXITED; /* the spare node is not whole */
    CHECK(svp_plan_evict(&j.v, 3, j.take) == SVP_EVICT_NO_SPARE);
    /* tp 2 x dp 2 on two nodes, one tp pair per node... */
    REQUIRE(job_init(&j, 4, 2, 2, 1) == 0);
    on_nodes(&j, 2);
    j.v.node_granularity = true;
    j.slots[1].evict = true;
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_OK && j.take[0] == 4 && j.take[1] == 5);
    replaced(&j, 2); /* ... node 1's rank 2 being replaced: node 0 holds shard tp 0's last replica */
    CHECK(svp_plan_evict(&j.v, 1, j.take) == SVP_EVICT_LAST_REPLICA);
}

int main(void) {
    RUN(data_parallel_each_dead);
    RUN(model_parallel_each_replica_dead);
    RUN(all_replicas_of_a_shard_dead);
    RUN(shard_behind);
    RUN(optimizer_holders);
    RUN(optimizer_holders_cp);
    RUN(optimizer_shards_expert_parallel);
    RUN(spares);
    RUN(shift_ranks_without_spare);
    RUN(nothing_alive);
    RUN(waits);
    RUN(nodes_replica_elsewhere);
    RUN(nodes_shard_only_there);
    RUN(spare_nodes);
    RUN(evict_straggler);
    RUN(evict_straggler_node);
    return TEST_EXIT();
}
