/* planner.h - the supervisor's restart decisions as pure functions: from the supervisor's
 * view of its worker slots (which rank each holds, which are alive, which reached the restart
 * barrier after committing which iteration) to a plan: which warm spare takes a dead rank,
 * whether the restart can be assigned yet, which survivor each rank of the new generation
 * takes its state from or that every rank loads the checkpoint, the new rank numbers under
 * shift-ranks, or that the job cannot continue and why. No I/O, no sockets, no globals: the
 * supervisor (supervisor.c) builds the view, calls the planner and carries out the plan, and
 * tests/unit/supervisor/test_planner.c drives it over fault patterns. */
#ifndef COHORT_SUPERVISOR_PLANNER_H
#define COHORT_SUPERVISOR_PLANNER_H

#include "scheduler/groups.h"

#include <stdbool.h>
#include <stdint.h>

/* A worker slot's process, through its life (supervisor.c's sv__w_set makes every
 * transition; the table there says which are allowed):
 *   EMPTY -> STARTED -> REGISTERED <-> TRAINING -> EXITING -> EXITED
 *                                                   EXITING -> RESPAWN -> STARTED
 *   EXITED -> STARTED (a replacement started at once)
 * Another node's slot goes EMPTY -> REGISTERED (its process is not started here). */
typedef enum svp_wstate {
    SVP_EMPTY = 0,   /* no process: not started yet, or another node's that has not registered */
    SVP_STARTED,     /* its process runs (started here) and has not registered yet */
    SVP_REGISTERED,  /* registered over the mailbox: alive and reachable; no loss reported since its assignment */
    SVP_TRAINING,    /* as REGISTERED, and it reported a loss since its assignment (past its setup) */
    SVP_EXITING,     /* its process exited; the process handle is being closed */
    SVP_EXITED,      /* its process exited; the handle is closed and no new process is planned */
    SVP_RESPAWN,     /* its process exited; a new one starts once the handle is closed */
} svp_wstate;

/* Alive and reachable (registered, not exited). */
static inline bool svp_alive(svp_wstate st) { return st == SVP_REGISTERED || st == SVP_TRAINING; }
/* Its process is gone (or was never started here) and nothing brings a new one yet. */
static inline bool svp_dead(svp_wstate st) { return st == SVP_EMPTY || st == SVP_EXITING || st == SVP_EXITED; }

/* One worker slot as the planner sees it. */
typedef struct svp_slot {
    svp_wstate state;
    int rank;            /* the rank it holds, -1: a warm spare */
    int node;
    bool replacing;      /* a new process for its rank, not assigned yet: takes its state from a peer */
    bool ready;          /* reached the restart barrier of the current generation */
    int64_t ready_iter;  /* ... having committed this iteration */
    bool evict;          /* alive, and to be given up for a warm spare (a straggler: svp_plan_evict) */
} svp_slot;

/* The supervisor's view of the job during a restart. */
typedef struct svp_view {
    const svp_slot *slots;
    int nslots;
    int world;                 /* active ranks 0..world-1 */
    const topo_coord *coord;   /* [world] each rank's coordinates: its model shard is (tp, cp, pp, ep) */
    int dopt_holders;          /* holders of a data-parallel rank's optimizer shard (0: no distributed optimizer) */
    bool shift_ranks;          /* survivors close up, replacements last */
    int64_t checkpoint_iter;   /* the newest committed checkpoint's iteration, -1: none */
    int64_t current_iter;      /* the newest iteration the validator saw, -1: none */
    bool node_granularity;     /* --inprocess-granularity node: spares are whole nodes (slots of one .node) */
} svp_view;

/* The warm spare (a slot index) that takes each dead rank at the abort of a generation:
 * take[i] for every slot i (-1: none; slot i's own process is replaced in place when it
 * holds a dead rank). A spare is alive and holds no rank; the last such slot is taken first,
 * each at most once. With node granularity (NVRx's: a node with fewer healthy ranks than its
 * processes leaves the active world whole) the spares are whole nodes (every slot of it an
 * alive spare; the last such node first), and a node that lost a rank takes one: its k-th slot
 * takes the node's k-th slot's rank, alive ranks too (take[i] >= 0 for a live slot i: its
 * process is given up, the caller kills it). A node keeps its live ranks, and its dead ones
 * are replaced in place, where no spare node is free or where a live rank's shard has no live
 * replica on another node (its state would be lost). Returns how many slots were taken. */
int svp_take_spares(const svp_view *v, int *take);

/* Whether a straggler can be evicted (--straggler-evict-after). */
typedef enum svp_evict_verdict {
    SVP_EVICT_OK = 0,        /* take[] says which spare takes it (with node granularity: its node's ranks) */
    SVP_EVICT_NO_SPARE,      /* no free warm spare (spare node) */
    SVP_EVICT_LAST_REPLICA,  /* a rank that would leave holds its model shard's last live replica */
    SVP_EVICT_OPTIMIZER,     /* ... or an optimizer shard's last live holder */
    SVP_EVICT_BUSY,          /* not a live, assigned rank (already replaced, exiting) or not marked evict */
} svp_evict_verdict;

/* The eviction of live rank `rank`, whose slot the view marks evict: with node granularity its
 * whole node leaves for a spare node, else its slot for a warm spare (svp_take_spares, the
 * evicted slot counted as lost: take[] as there, the caller kills the evicted processes). A
 * rank that leaves must keep a live replica of its model shard (and, with the distributed
 * optimizer, of each optimizer shard it holds) on a slot that stays: its state is taken from
 * there, no step lost. */
svp_evict_verdict svp_plan_evict(const svp_view *v, int rank, int *take);

typedef enum svp_verdict {
    SVP_WAIT = 0,        /* a survivor has not reached the barrier, or a replacement has not registered */
    SVP_FROM_PEERS,      /* every rank takes the state of a survivor of its shard */
    SVP_FROM_CHECKPOINT, /* every rank loads the checkpoint of plan.resume_iter */
    SVP_CANNOT_CONTINUE, /* a shard lost every copy and there is no checkpoint */
} svp_verdict;

/* Why the survivors' state cannot be used (SVP_FROM_CHECKPOINT, SVP_CANNOT_CONTINUE). */
typedef enum svp_reason {
    SVP_OK = 0,
    SVP_NO_SURVIVOR,       /* no rank survived */
    SVP_OPTIMIZER_LOST,    /* an optimizer shard lost every holder (plan.why_rank's) */
    SVP_SHARD_LOST,        /* a model shard lost every replica (plan.why_rank's) */
    SVP_SHARD_BEHIND,      /* a shard's survivors committed less than another shard's */
} svp_reason;

/* The restart's outcome. The caller gives source and new_rank room for world and nslots ints. */
typedef struct svp_plan {
    svp_verdict verdict;
    svp_reason reason;
    int why_rank;            /* the rank the reason is about (-1) */
    int64_t committed;       /* the newest iteration a survivor committed (-1: none) */
    int64_t resume_iter;     /* where the new generation resumes: committed, or the checkpoint's */
    int64_t faults_through;  /* injected faults up to this iteration fired already */
    int src;                 /* a survivor that committed resume_iter (new numbering), -1: checkpoint */
    int nsources;            /* ranks that are their own shard's source */
    int nreplaced;           /* replacements in the new generation */
    int *source;             /* [world] by new rank: the rank whose state it takes (-1: checkpoint) */
    int *new_rank;           /* [nslots] each slot's rank in the new generation (-1: a spare) */
} svp_plan;

/* Plans the new generation once every survivor reached the barrier and every replacement
 * registered (else plan->verdict is SVP_WAIT and nothing else is set). Per model shard (the
 * ranks with the same tp, cp, pp and expert coordinates), the survivor that committed the
 * most is its ranks' source; a shard without a survivor, a shard behind another, an optimizer
 * shard without a holder that committed the newest iteration, or no survivor at all make
 * every rank load the checkpoint (SVP_CANNOT_CONTINUE without one). */
void svp_plan_restart(const svp_view *v, svp_plan *plan);

/* Several nodes: what losing node `node` (its agent silent: every slot on it gone at once)
 * costs. Returns the first rank on the node whose model shard has no live replica on another
 * node (then the new generation, whenever it comes, loads the checkpoint: every replica of that
 * shard died), or -1 when every shard the node held survives elsewhere (its ranks' replacements
 * take their peers' state: no step lost). Slots on other nodes count when alive and not
 * replacements. */
int svp_node_shard_lost(const svp_view *v, int node);

/* The first rank whose optimizer shard has no holder that survived and committed iteration
 * M (itself and the next dopt_holders - 1 ranks of its gradient group: the ranks of its
 * tensor x pipeline shard over data x context, the context rank varying fastest), or -1. */
int svp_optimizer_shard_lost(const svp_view *v, int64_t M);

#endif
