/* supervisor.h - the job's supervisor: spawns the worker processes of this node, runs the
 * rendezvous (workers register; ranks, topology and peers' data endpoints are assigned),
 * exchanges heartbeats both ways, prints the log lines workers send, and ends the job with
 * an exit status that says how it ended.
 *
 * Several nodes: node 0 runs the supervisor on tcp (master address and port, CURVE with the
 * job secret); every other node runs a node agent (sv_run with node_rank > 0) that spawns
 * that node's workers, points them at node 0's supervisor, and reports a local worker's
 * death to the supervisor at once. Ranks are node-major: node_rank * nproc + local_rank.
 * Workers' data endpoints are tcp://NODE_ADDR:(master_port + 1 + rank).
 *
 * A worker is `cohort train` itself, started with the same flags and with COHORT_SUPERVISOR
 * (and a few more variables, see link.h) in its environment. A local worker's death is
 * noticed at once from its exit; a silent one through missed heartbeats.
 *
 * Exit statuses (cohort train with --nproc-per-node > 1):
 *   0 every worker finished (train-iters, exit interval or duration, or a clean stop on
 *     SIGTERM/SIGINT after the current step: to the supervisor, to its process group or to
 *     one worker; docs/resilience.md "Signals")
 *   1 the supervisor itself failed (spawn, sockets, memory)
 *   3 training stopped on a NaN/Inf loss or gradient norm that the rerun state machine found
 *     reproducible (on a healthy peer too): a data or model problem, not a fault
 *   1 also: a rank failed with an error a restart cannot cure (sv_incurable_status: a full
 *     disk, permission denied, a missing file), as one process would exit
 *   2 also: a rank's setup refused its flags or its checkpoint (a --load whose model differs
 *     from the flags), as one process would exit; the job stops at once, no restart
 *   4 a worker failed or died and could not be replaced (in-process restart disabled, the
 *     restart limit reached, or no replica of its state survived); the others were stopped
 *   5 the rendezvous did not complete in time
 *   6 a worker stopped sending heartbeats and in-process restart is disabled; the job was
 *     stopped
 *   7 (several nodes) a node was lost: its agent went silent for the heartbeat timeout or
 *     its connection dropped, and no agent of that node rank took its place in time; the
 *     others were stopped, the last checkpoint is intact (restart the job from --load)
 *   8 (a node agent) the supervisor's node was lost: nothing heard from it for the heartbeat
 *     timeout; this node's workers were stopped, the last checkpoint is intact
 *   75 a clean stop for preemption (SIGUSR1; SIGTERM with --requeue-on-sigterm): as 0, but
 *     the job is not done; a scheduler requeues it and it resumes from --load
 *   128 + N a second signal N (130: SIGINT, 143: SIGTERM) stopped the job at once, or a
 *     worker was killed by SIGINT/SIGTERM during a clean stop: the step in progress is lost */
#ifndef COHORT_SUPERVISOR_SUPERVISOR_H
#define COHORT_SUPERVISOR_SUPERVISOR_H

#include "resilience/fault_injector.h"
#include "resilience/inject.h"
#include "resilience/rerun.h"

#include <signal.h>

enum {
    SV_EXIT_OK = 0,
    SV_EXIT_FAILURE = 1,
    SV_EXIT_USAGE = 2,       /* misuse: a node whose training flags differ from the others', a rank's refused setup */
    SV_EXIT_NAN = 3,
    SV_EXIT_WORKER_FAILED = 4,
    SV_EXIT_RENDEZVOUS = 5,
    SV_EXIT_LOST_WORKER = 6,
    SV_EXIT_NODE_LOST = 7,       /* several nodes: a node agent was lost and not replaced in time */
    SV_EXIT_SUPERVISOR_LOST = 8, /* a node agent: the supervisor's node was lost */
    /* a clean stop for preemption (SIGUSR1, or SIGTERM with --requeue-on-sigterm): the step
     * finished, --save saved; requeue the job to resume (EX_TEMPFAIL, deploy/slurm) */
    SV_EXIT_PREEMPTED = 75,
};

typedef struct sv_options {
    int nproc;                     /* workers to spawn on this node */
    int nnodes, node_rank;         /* 1, 0 for one node */
    const char *master_addr;       /* node 0's address (several nodes) */
    int master_port;               /* node 0's control port; data ports follow it */
    const char *node_addr;         /* this node's address as the others reach it */
    const char *secret_path;       /* job secret file (required for several nodes) */
    const char *exe;               /* the cohort binary (/proc/self/exe) */
    char *const *worker_args;      /* argv after "cohort train", passed to every worker */
    int nworker_args;
    /* the parallel layout of the world (scheduler/groups.h; 0: 1, etp 0: as tp): which shard
     * of the model each rank holds, so that a dead rank's shard is taken from a peer of it */
    int tp, pp, cp, ep, etp;
    int replica_stride, replicas; /* ranks of one replica report its results: rr_options' */
    bool tp_pp_dp;                 /* --use-tp-pp-dp-mapping */
    unsigned long long emb_stages; /* the embedding group's pipeline stages (topo_layout's; 0: first, last) */
    bool nccl;                     /* --device cuda: every assignment carries an NCCL unique id (a new one
                                      per generation), from which the ranks build their NCCL groups */
    int rendezvous_timeout_ms;     /* all workers registered and ready (default 120000) */
    int heartbeat_interval_ms;     /* both ways (default 1000) */
    int heartbeat_timeout_ms;      /* a worker silent this long is lost (default 30000) */
    int kill_grace_ms;             /* after asking workers to stop, SIGKILL after (default 10000) */
    const char *metrics_file;      /* where workers' metrics records go ("" or NULL: none) */
    /* --tensorboard-dir and its flags (observe/tensorboard.h), or NULL: node 0's supervisor
     * also writes the metrics records it receives and makes as TensorBoard events */
    const struct ob_tb_options *tensorboard;
    int metrics_port;              /* Prometheus GET /metrics on this port (0: off; node 0 only), bound to
                                      127.0.0.1 on one node, master_addr on several (metrics_http.h) */
    int64_t save_interval;         /* --save-interval (CO_SAVE_INTERVAL_AUTO: the validator decides), --train-iters:
                                      for `cohort status`'s next checkpoint */
    double expected_mtbf;          /* --expected-mtbf, seconds (0: estimated) */
    int64_t train_iters;
    /* checkpoints: the ranks write their parts of each save into --save and the supervisor
     * commits them (ckpt_coord.c); NULL or "": no --save */
    const char *save_dir;
    int most_recent_k;             /* retention after each commit (<= 0: keep all) */
    int keep_every;                /* ... keeping every checkpoint at a multiple of this too (0: none) */
    double save_space_margin;      /* saves stop below the last checkpoint's size times this free (0: never) */
    /* extra environment for workers ("NAME=value"), e.g. the embedded corpus location */
    char *const *extra_env;
    int nextra_env;
    /* the rerun state machine (mode RR_MODE_DISABLED: workers do not report) and the run
     * report (supervisor/validate.h) */
    rr_options rerun;
    const char *tracker_file;      /* --result-rejected-tracker-filename */
    const char *rerun_state;       /* the --load checkpoint's state machine state (JSON; NULL) */
    const char *report_file;       /* JSON run report (NULL: none) */
    double straggler_threshold;
    int straggler_evict_after;     /* a rank scored below the threshold this many iterations in a row is evicted
                                      (a warm spare takes it); 0: never */
    fi_schedule *inject;           /* --inject (kill-supervisor fires here) */
    const fi_rand *fault_injector; /* Megatron's random fault injector (--fault-injector-*; NULL: off) */
    /* in-process restart (every node: node agents respawn their node's workers on the
     * supervisor's order): a dead, hung or silent rank aborts the generation; the
     * survivors wait at a restart barrier inside their processes, dead ranks are respawned
     * and take their state from a surviving replica. 0 restart_limit: disabled. */
    bool restart;
    int node_replacement_ms;       /* several nodes: how long survivors wait for a lost node's new agent (0: stop) */
    bool elastic;                  /* --elastic: capacity lost for good shrinks the data-parallel size, and
                                      grows it back when it returns */
    int elastic_min_replicas;      /* ... not below this many model replicas */
    int restart_limit;             /* restarts allowed within restart_window_ms */
    int restart_window_ms;
    int soft_timeout_ms;           /* no progress this long: abort and restart (0: 60000) */
    bool soft_timeout_set;         /* given explicitly; else learned from step times */
    int hard_timeout_ms;           /* ... and a rank still not at the barrier is killed */
    int barrier_timeout_ms;        /* every rank at the restart barrier within this */
    int dopt_holders;              /* --use-distributed-optimizer: a data-parallel rank's optimizer shard lives
                                      on it and, with --dist-opt-redundancy, on the next data-parallel rank
                                      (2); 1 without redundancy; 0: no distributed optimizer (every replica
                                      holds the whole state) */
    bool shift_ranks;              /* after a restart survivors close up, replacements last
                                      (ShiftRanks); else a replacement takes the dead rank (FillGaps) */
    int active_world;              /* ranks that train (0: every worker); the rest are warm spares
                                      that take a dead rank's place (any node) */
    bool node_granularity;         /* --inprocess-granularity node: the spares are whole nodes, which take a
                                      lost node's ranks together */
    int quarantine_after;          /* faults attributed to a rank within quarantine_window */
    int64_t quarantine_window;     /* iterations: then its process is replaced (0: never) */
    uint64_t job_id;               /* the job's id (0: a random one); several nodes derive it
                                      from the job secret instead */
    /* the caller's record of a SIGINT/SIGTERM that came before the supervisor's own handlers
     * were installed (its number; 0: none; NULL: not kept): honoured as soon as they are */
    volatile sig_atomic_t *signalled;
    bool requeue_on_sigterm;       /* a stop by SIGTERM is a preemption too (SV_EXIT_PREEMPTED) */
} sv_options;

/* Whether a clean stop by signal sig is a preemption (exit SV_EXIT_PREEMPTED): SIGUSR1
 * (Slurm's --signal before the time limit), SIGTERM with requeue_on_sigterm. */
static inline bool sv_preempting_signal(int sig, bool requeue_on_sigterm) {
    return sig == SIGUSR1 || (sig == SIGTERM && requeue_on_sigterm);
}

/* Whether a rank's own failure can be cured by a restart. code: the CO_E* code it failed
 * with; worker_status: the status it exits with (1, or 2 where its setup refused the flags or
 * the checkpoint: worker/rank.h's WK_FAILURE and WK_USAGE). Returns 0 when a restart may
 * cure it (a peer's death or disconnect, a timeout, an abort, an I/O or memory error: the
 * rank is restarted), else the job's exit status, the one a single process would exit with:
 * SV_EXIT_USAGE for a configuration or checkpoint that does not fit (CO_EINVAL,
 * CO_EUNSUPPORTED with worker_status 2), SV_EXIT_FAILURE for the rest of what no restart
 * changes (CO_EINVAL or CO_EUNSUPPORTED later on, CO_ENOSPC: a full disk or quota,
 * CO_EDENIED: permission denied, CO_ENOENT: a missing file). The worker asks it before
 * telling the supervisor (sv_link_fatal) and the supervisor before stopping the job. */
int sv_incurable_status(int code, int worker_status);

/* Runs the job to its end; returns one of the exit statuses above. */
int sv_run(const sv_options *o);

#endif
