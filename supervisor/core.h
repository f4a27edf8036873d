/* core.h - what the supervisor and the node agent share (private to supervisor/): a worker
 * slot, the process's state, and the role that says what the process does as one or the other
 * (supervisor.c: the shared core, spawning and watching this node's workers, and the
 * supervisor's role; agent.c: the node agent's role). */
#ifndef COHORT_SUPERVISOR_CORE_H
#define COHORT_SUPERVISOR_CORE_H

#include "actors/actor.h"
#include "observe/tensorboard.h"
#include "scheduler/groups.h"
#include "supervisor/ckpt_coord.h"
#include "supervisor/metrics_http.h"
#include "supervisor/msg.h"
#include "supervisor/planner.h"
#include "supervisor/status.h"
#include "supervisor/supervisor.h"
#include "supervisor/validate.h"

#include <stdio.h>
#include <sys/types.h>

struct sv;

typedef struct worker {
    struct sv *sv;
    int index;              /* global rank: node_rank * nproc + local_rank */
    int local_rank;
    uv_process_t proc;
    svp_wstate state;         /* its process's life (planner.h; every change through w_set) */
    int64_t exit_status;
    int term_signal;
    char identity[64];
    char spawn_endpoint[400]; /* the data endpoint given to a worker spawned here */
    char *data_endpoint;      /* as registered */
    uint32_t pid;
    char host[64];            /* as it registered */
    uint64_t last_seen_ms;
    uint64_t iteration;
    int waiting_on;           /* the world rank whose pipeline message it waits for (heartbeat), -1 */
    uint32_t waiting_ms;      /* ... for this long at its last heartbeat */
    /* in-process restart: what the slot's rank is in for, beside its process's life */
    bool replacing;           /* a replacement not yet assigned */
    uint64_t ready_gen;       /* generation whose restart barrier it reached */
    int64_t ready_iter;       /* the iteration it committed last */
    uint64_t abort_ms;        /* when it was sent the Abort */
    bool retiring;            /* quarantined: replaced once it reaches the restart barrier */
    bool evicting;            /* a straggler being evicted: a warm spare takes its rank (planner's view) */
    bool signalled;           /* it reported a SIGINT/SIGTERM of its own */
    int rank;                 /* its data-parallel rank, -1 for a warm spare (index is its slot) */
    bool elastic_gone;        /* --elastic: dead, and nothing replaces it (the restart budget used up, its
                                 respawn failed): its replica leaves at the restart barrier */
    bool elastic_left;        /* --elastic: its replica left; the slot waits for nothing */
    /* several nodes */
    uint32_t stopped_pid;     /* supervisor: another node's process its agent reported stopped (0: none) */
    bool goodbye;             /* supervisor: its process said goodbye (it is ending) */
    bool adopting;            /* supervisor: its agent restarts its process as a warm spare (a rank's before) */
    bool respawn_ordered;     /* agent: the supervisor ordered a new process once this one is gone */
} worker;

typedef struct sv {
    sv_options o;
    int live_injects;       /* `cohort inject` requests taken (with --inject's, at most FI_MAX_SPECS) */
    fi_rand fir;            /* the random fault injector (o.fault_injector's copy; fir.world 0: off) */
    fi_rand_plan fi_plan;   /* its next plan */
    ac_timer *fi_timer;     /* ... which fires when this does */
    ac_actor *a;
    ac_mailbox *mb;
    sv__sender snd;
    char ipc_dir[256];
    char endpoint[320];
    worker *w;              /* supervisor: every worker of the job; agent: this node's */
    int nw;
    bool agent;             /* a node agent (node_rank > 0) */
    const struct sv__role *role; /* what the process does as the supervisor or as a node agent */
    ac_secret secret;
    bool have_secret;
    int first_failure;      /* agent: the first failing worker's status */
    char *flags_ref;        /* the first registered worker's flags (JSON), the job's */
    int flags_ref_node;
    bool assigned, stopping;
    int status;             /* -1 until decided */
    ac_timer *hb_timer, *rdv_timer, *kill_timer;
    uv_signal_t sig_int, sig_term, sig_usr1;
    int signals;            /* SIGINT/SIGTERM/SIGUSR1 the supervisor itself received */
    int agent_sig;          /* agent: the first of them (its exit status says a preemption) */
    int sig_stop;           /* a clean stop by this signal is under way (0: none) */
    pw_stats stats;
    int drops_told;         /* messages dropped as malformed or over a limit, said on stderr */
    FILE *metrics;          /* --metrics-file, written from the workers' Metrics records */
    svc *ckpt;              /* commits the ranks' checkpoints (--save; ckpt_coord.c) */
    svv *val;               /* validates every iteration, writes the run report (validate.c) */
    svo *obs;               /* what Prometheus and `cohort status` are told (status.c) */
    svm *http;              /* --metrics-port's HTTP server (metrics_http.c) */
    uint64_t published_ms;  /* when the latest snapshot was published */
    uint64_t t_start;
    bool restart_enabled;   /* in-process restart (one node) */
    int world;              /* active ranks (--inprocess-active-world-size); slots beyond are spares */
    bool finishing;         /* every active rank finished: the spares are told to go */
    bool restarting;        /* between an Abort and every rank's Restart */
    uint64_t restart_t0;
    uint64_t last_ready_ms; /* when the last rank reached the restart barrier */
    topo_layout layout;     /* the world's parallel layout (sv_options tp, pp, cp, ep, etp) */
    topo_coord *coord;      /* [world] each rank's coordinates: its shard is (tp, cp, pp) */
    int *source;            /* [world] after a restart: the survivor whose state each rank takes */
    bool no_proc_state;     /* test hook: local workers' process state is not read */
    uint64_t restart_times[64];
    int nrestarts;
    int64_t restart_faults_through; /* injected faults up to this step already fired */
    int quarantine_rank;        /* a rank to retire once the next iteration starts (-1) */
    int64_t quarantine_after;
    int evict_rank;             /* a straggler to evict once the next iteration starts (-1) */
    int64_t evict_after;
    char evict_scores[200];     /* its scores below the threshold, for the log */
    ac_timer *collective_timer; /* a worker's failed collective, awaiting its explanation */
    char collective_why[600];
    int collective_rank;
    uint64_t collective_gen, collective_t0;
    bool incurable;             /* a rank's failure no restart cures stopped the job (its message printed) */
    char job_hex[32];           /* the job id as the validator's tracker lines name it (it keeps a pointer) */
    /* several nodes */
    uint64_t sup_heard_ms;      /* agent: when the supervisor was last heard from */
    bool sup_lost;              /* agent: the supervisor's node was lost (exit SV_EXIT_SUPERVISOR_LOST) */
    ac_timer *poll_timer;       /* agent: reads its workers' process state */
    uint64_t *agent_heard_ms;   /* supervisor: [nnodes] when each node's agent was last heard from */
    char (*agent_id)[64];       /* supervisor: [nnodes] each node's agent's identity ("agentN.X"; "": none) */
    char (*agent_gone)[64];     /* supervisor: [nnodes] a lost agent's identity: refused if it comes back */
    uint64_t *node_lost_ms;     /* supervisor: [nnodes] when a node was lost and awaits a new agent (0: not) */
    uint64_t barrier_t0;        /* when the restart barrier's timeout began (a lost node's new agent restarts it) */
    /* --elastic (supervisor.c's elastic_*; the plans: elastic.c) */
    int world0;                 /* the world at the start: coord and source have room for it */
    bool *elastic_gone;         /* [nnodes] a lost node no new agent replaced in time: its replicas leave */
    bool *elastic_out;          /* [nnodes] a node whose replicas left: a new agent of it grows the job back */
    bool elastic_grow;          /* the restart under way is a grow: the new agent's workers join */
} sv;

/* What the process does as the supervisor (supervisor.c) or as a node agent (agent.c). */
typedef struct sv__role {
    /* before the loop, the slots made (NULL: nothing): the supervisor's layout, metrics stream,
     * checkpoint coordinator and validator */
    int (*setup)(struct sv *s);
    /* its mailbox (mo: the handlers): the supervisor binds it, an agent connects to node 0's */
    int (*open_mailbox)(struct sv *s, ac_mailbox_opts *mo);
    /* a message m to its mailbox mb, decoded (msg; NULL: dropped as malformed or foreign) */
    void (*on_message)(struct sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg);
    /* every heartbeat interval */
    void (*tick)(struct sv *s, uint64_t now);
    /* worker w exited (its state recorded, its handle closing): what follows; status and
     * term_signal as libuv gives them */
    void (*worker_exited)(struct sv *s, worker *w, int64_t status, int term_signal);
    /* the first SIGINT/SIGTERM/SIGUSR1 the process itself received */
    void (*first_signal)(struct sv *s, int signum);
    /* the signal whose clean stop makes the job's exit a preemption (0: none) */
    int (*stop_signal)(const struct sv *s);
} sv__role;

extern const sv__role sv__agent_role;

/* After kill_grace_ms: SIGKILL for this node's workers still running (a timer callback). */
void sv__kill_remaining(ac_timer *t, void *ctx);
/* The iteration the job is at (the furthest any rank or the state machine reached). */
int64_t sv__current_iteration(sv *s);
/* Sends a checked fault (its spec) to every live worker, to fire at f->step on f->rank. */
void sv__inject_send(sv *s, const fi_fault *f, const char *spec);
/* The random fault injector (fault_injector.c): draws the first plan and arms its timer;
 * called whenever ranks are assigned (it acts the first time only). */
void sv__fi_arm(sv *s);
/* Ends the loop once no worker of this node is left running and the job cannot go on. */
void sv__maybe_finish(struct sv *s);
/* Starts the worker process of slot w (at the start, or to replace a dead rank). */
int sv__spawn_one(struct sv *s, struct worker *w);
/* Moves slot w's process to state to (the transition table's check). */
void sv__w_set(struct worker *w, svp_wstate to);
/* Is the local process pid stopped (SIGSTOP, a debugger)? */
bool sv__process_stopped(pid_t pid);
/* Sends body to node n's agent (the supervisor's; nothing while the node has none). */
int sv__agent_send(struct sv *s, int n, const ProtobufCMessage *body);
/* Sends a SlotEvent of kind about slot (the agent: to the supervisor; the supervisor: to the
 * slot's node agent). */
int sv__send_slot_event(struct sv *s, int kind, const struct worker *w, const char *reason);
/* A failed rank's process in words into why ("rank 3 (node 1, pid 42) was killed by signal
 * 9 (Killed)") and the job's exit status for it (SV_EXIT_NAN for a worker's NaN exit). */
int sv__rank_failure(const struct sv *s, const struct worker *w, int64_t status, int term_signal, char *why,
                     size_t n);

#endif
