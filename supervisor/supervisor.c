/* supervisor.c - spawns this node's workers, runs the rendezvous, watches heartbeats and
 * exits, prints the log lines workers send, and decides how the job ended (supervisor.h).
 * Everything runs on one actor loop on the calling thread: the control mailbox, the
 * worker processes (uv_spawn), the timers and the signal handlers. The core (slots and their
 * processes, signals, the loop) is shared with the node agent, whose role is agent.c; the
 * supervisor's role is here (core.h's sv__role), and a restart's decisions are planner.c's. */
#include "supervisor/supervisor.h"

#include "actors/actor.h"
#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "supervisor/core.h"
#include "checkpoint/store.h"
#include "common/fsutil.h"
#include "common/proctitle.h"
#include "supervisor/metrics_http.h"
#include "supervisor/msg.h"
#include "supervisor/planner.h"
#include "supervisor/elastic.h"
#include "supervisor/status.h"
#include "supervisor/validate.h"
#include "observe/tensorboard.h"
#include "scheduler/groups.h"
#ifdef COHORT_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>

extern char **environ;

/* The transitions of a slot's process (planner.h's svp_wstate), all of them: allowed[from]
 * has bit `to` set. */
static const unsigned w_allowed[] = {
    [SVP_EMPTY] = 1u << SVP_STARTED | 1u << SVP_REGISTERED, /* started here; another node's registered */
    [SVP_STARTED] = 1u << SVP_REGISTERED | 1u << SVP_EXITING,
    [SVP_REGISTERED] = 1u << SVP_TRAINING | 1u << SVP_EXITING,
    [SVP_TRAINING] = 1u << SVP_REGISTERED | 1u << SVP_EXITING, /* assigned again; exited */
    [SVP_EXITING] = 1u << SVP_EXITED | 1u << SVP_RESPAWN,      /* handle closed; a new process planned */
    [SVP_EXITED] = 1u << SVP_STARTED,                          /* a new process at once */
    [SVP_RESPAWN] = 1u << SVP_STARTED | 1u << SVP_EXITED,      /* started once closed; or it failed to */
};

static const char *w_state_name(svp_wstate st) {
    static const char *const names[] = {"empty", "started", "registered", "training", "exiting", "exited", "respawn"};
    return (unsigned)st < sizeof names / sizeof *names ? names[st] : "?";
}

/* Moves slot w's process to state to; a transition the table does not allow is a bug, said
 * (and made all the same: the supervisor's bookkeeping follows the processes). */
void sv__w_set(worker *w, svp_wstate to) {
    if (w->state == to) return;
    if (!(w_allowed[w->state] & 1u << to))
        co_log(CO_LOG_ERROR, "internal: slot %d went from %s to %s", w->index, w_state_name(w->state), w_state_name(to));
    w->state = to;
}

/* Its process exited (whether its handle is closed yet or a new one is planned or not). */
static bool w_exited(const worker *w) { return w->state == SVP_EXITING || w->state == SVP_EXITED; }

/* Is slot w's process started on this node (else another node's: not ours to start or kill)? */
static bool w_local(const sv *s, const worker *w) { return w->index / s->o.nproc == s->o.node_rank; }

/* Its process runs here (started, not exited). */
static bool w_running(const sv *s, const worker *w) {
    return w_local(s, w) && (w->state == SVP_STARTED || svp_alive(w->state));
}

/* Its process registered (and may have exited since): the registration's data endpoint is
 * kept until the slot is unregistered (its rank or its process replaced). */
static bool w_registered(const worker *w) { return w->data_endpoint != NULL; }


static uint64_t random_job_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ sv__now_ms();
    return id ? id : 1;
}

/* Milliseconds from t to now, 0 when t is later. */
static uint64_t ms_since_(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

static void send_shutdown(sv *s, worker *w, int status, const char *reason) {
    Cohort__V1__Shutdown sd = COHORT__V1__SHUTDOWN__INIT;
    sd.exit_status = status;
    sd.reason = (char *)reason;
    sv__send(s->mb, w->identity, &s->snd, &sd.base);
}

/* The slot holding data-parallel rank r (NULL: none). */
static worker *rank_slot(struct sv *s, int r);

/* Ends the loop once no worker of this node is left running and the job cannot go on. */
static void on_proc_closed(uv_handle_t *h);
static void begin_restart(sv *s, const char *kind, int rank, const char *why, uint64_t detect_ms);
static void check_restart_done(sv *s);
static void watch_progress(sv *s, uint64_t now);
static void begin_signal_stop(sv *s, int signum, int rank, const char *what);
static void stop_incurable(sv *s, int rank, int status, const char *what);
static int respawn_slot(sv *s, worker *w);

/* Slots whose process registered (the rendezvous is complete when every slot's has). */
static int registered_count(const sv *s) {
    int n = 0;
    for (int i = 0; i < s->nw; i++) n += w_registered(&s->w[i]);
    return n;
}

/* A slot's process is gone (or retired): its registration's endpoint goes. */
static void unregister(sv *s, worker *w) {
    (void)s;
    free(w->data_endpoint);
    w->data_endpoint = NULL;
}

static worker *rank_slot(sv *s, int r) {
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].rank == r && r >= 0) return &s->w[i];
    return NULL;
}

void sv__kill_remaining(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    s->kill_timer = NULL;
    for (int i = 0; i < s->nw; i++)
        if (w_running(s, &s->w[i])) {
            co_log(CO_LOG_ERROR, "worker %d (pid %u) did not stop; killing it", s->w[i].index, s->w[i].pid);
            uv_process_kill(&s->w[i].proc, SIGKILL);
        }
}

/* Ends the job with status: tells every worker, then kills what is left after a grace. */
static void begin_shutdown(sv *s, int status, const char *reason) {
    svc_abort(s->ckpt, reason); /* a checkpoint in progress is not committed */
    if (s->status < 0) s->status = status;
    if (s->stopping) return;
    s->stopping = true;
    for (int i = 0; i < s->nw; i++)
        if (svp_alive(s->w[i].state)) send_shutdown(s, &s->w[i], status, reason);
    for (int n = 1; n < s->o.nnodes && !s->agent; n++) { /* every node agent: the job is over */
        Cohort__V1__Shutdown sd = COHORT__V1__SHUTDOWN__INIT;
        sd.exit_status = status;
        sd.reason = (char *)reason;
        sv__agent_send(s, n, &sd.base);
    }
    ac_timer_start(s->a, (uint64_t)s->o.kill_grace_ms, 0, sv__kill_remaining, s, &s->kill_timer);
}

/* Kills slot w's process: here, or through its node's agent (why: for the agent's log). */
static void kill_slot(sv *s, worker *w, const char *why) {
    if (w_local(s, w)) uv_process_kill(&w->proc, SIGKILL);
    else sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_KILL, w, why);
}

/* Whether node n's slots have a process or an agent to start one: this node, or a node whose
 * agent is known and not lost. */
static bool node_has_agent(const sv *s, int n) {
    return n == s->o.node_rank || !s->agent_id || (n >= 0 && n < s->o.nnodes && s->agent_id[n][0]);
}

int sv__agent_send(sv *s, int n, const ProtobufCMessage *body) {
    if (!s->agent_id || n < 1 || n >= s->o.nnodes || !s->agent_id[n][0]) return 0; /* none (yet, or lost) */
    return sv__send(s->mb, s->agent_id[n], &s->snd, body);
}

/* The job's active ranks all finished: the warm spares are told to go. */
static void finish_spares(sv *s) {
    /* (another node's process runs until it says goodbye or its agent reports its end) */
    for (int i = 0; i < s->nw; i++)
        if (s->w[i].rank >= 0 &&
            (w_running(s, &s->w[i]) || (!w_local(s, &s->w[i]) && svp_alive(s->w[i].state) && !s->w[i].goodbye)))
            return;
    s->finishing = true;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->rank >= 0) continue;
        if (svp_alive(w->state) && (w_running(s, w) || !w_local(s, w))) send_shutdown(s, w, 0, "the job is done");
        else if (w_running(s, w)) uv_process_kill(&w->proc, SIGKILL); /* nothing to lose (a SIGTERM would only be a stop request) */
    }
}

int sv__rank_failure(const sv *s, const worker *w, int64_t status, int term_signal, char *why, size_t n) {
    if (term_signal)
        snprintf(why, n, "rank %d (node %d, pid %u) was killed by signal %d (%s)", w->rank, w->index / s->o.nproc,
                 w->pid, term_signal, strsignal(term_signal));
    else
        snprintf(why, n, "rank %d (node %d, pid %u) exited with status %" PRId64, w->rank, w->index / s->o.nproc,
                 w->pid, status);
    return status == 3 && !term_signal ? SV_EXIT_NAN : SV_EXIT_WORKER_FAILED;
}

/* A rank's process failed (exited non-zero or was killed): an incurable setup failure stops
 * the job, anything else restarts it in process where that is on, else stops it. */
static void rank_failed(sv *s, worker *w, int64_t status, int term_signal) {
    char why[256];
    int st = sv__rank_failure(s, w, status, term_signal, why, sizeof why);
    if (s->stopping) return;
    if (!term_signal && status == SV_EXIT_USAGE) {
        /* a worker exits 2 only where its flags or its checkpoint were refused (as CO_EINVAL at
         * setup); one that did not say why (sv_link_fatal) is stopped for all the same */
        char what[300];
        snprintf(what, sizeof what, "exited with status 2 (pid %u): its flags or its checkpoint were refused (its "
                 "message is above)", w->pid);
        stop_incurable(s, w->rank, sv_incurable_status(CO_EINVAL, SV_EXIT_USAGE), what);
    } else if (s->restart_enabled && s->assigned && st != SV_EXIT_NAN) {
        begin_restart(s, term_signal ? "killed" : "exited", w->rank, why, 0);
    } else {
        if (s->val) svv_note_fault(s->val, term_signal ? "killed" : "exited", w->rank, why);
        /* (its heartbeat's iteration, or the newest the validator saw: a heartbeat may be old) */
        int64_t it = s->val && svv_current_iteration(s->val) > (int64_t)w->iteration ? svv_current_iteration(s->val)
                                                                                      : (int64_t)w->iteration;
        co_log(CO_LOG_ERROR, "%s at iteration %" PRId64 "; stopping the job", why, it);
        begin_shutdown(s, st, why);
    }
}

/* The supervisor's side of a worker's exit (on_exit_cb): a warm spare is replaced, a
 * quarantined rank's replacement starts, a kill by signal during a clean stop ends the job
 * with it, a failure restarts or stops the job, the last active rank's clean exit lets the
 * spares go. */
static void supervisor_worker_exited(sv *s, worker *w, int64_t status, int term_signal) {
    if (w->rank < 0) {
        /* a warm spare died: start another (no rank lost, no restart) */
        if (!s->stopping && !s->finishing) {
            unregister(s, w);
            if (respawn_slot(s, w)) co_log(CO_LOG_ERROR, "a new spare: %s", co_err_detail());
        }
        return;
    }
    if (w->retiring && !s->stopping) {
        /* a quarantined rank, retired on purpose: its replacement starts once the handle closes */
        w->retiring = false;
        w->replacing = true;
        unregister(s, w);
        if (respawn_slot(s, w)) begin_shutdown(s, SV_EXIT_FAILURE, "could not start a replacement worker");
        return;
    }
    if ((term_signal == SIGINT || term_signal == SIGTERM || term_signal == SIGUSR1) && (s->sig_stop || w->signalled)) {
        /* killed by a signal during a clean stop by signal (a second one, or one that came
         * before the worker's handlers were installed): a stop, not a crash; no restart */
        char why[256];
        snprintf(why, sizeof why, "rank %d (pid %u) was killed by %s during the stop", w->rank, w->pid,
                 strsignal(term_signal));
        co_log(CO_LOG_WARN, "%s", why);
        if (!s->stopping && s->assigned) begin_shutdown(s, 128 + term_signal, why); /* its step is lost */
        else if (!s->stopping) begin_shutdown(s, SV_EXIT_OK, why);                  /* nothing trained yet */
        return;
    }
    if (term_signal || status != 0) rank_failed(s, w, status, term_signal);
    else if (!s->restarting) finish_spares(s);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int term_signal) {
    worker *w = p->data;
    sv *s = w->sv;
    sv__w_set(w, SVP_EXITING);
    w->exit_status = status;
    w->term_signal = term_signal;
    uv_close((uv_handle_t *)p, on_proc_closed);
    s->role->worker_exited(s, w, status, term_signal);
    sv__maybe_finish(s);
}

void sv__maybe_finish(sv *s) {
    if (s->restarting && !s->stopping) return; /* replacements are on their way */
    bool running = false, all_registered = true;
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        running = running || w_running(s, w);
        /* another node's warm spare is told to go once every rank ended (finish_spares): the
         * supervisor waits for it, or it would wait for a rank until it found the silence */
        running = running || (!s->agent && !s->stopping && w->rank < 0 && !w_local(s, w) && svp_alive(w->state) &&
                               !w->goodbye);
        /* (a lost node's slot that holds no rank waits for nothing: no agent starts it) */
        all_registered = all_registered && (w_registered(w) || (!s->agent && w->rank < 0 && !w_local(s, w) &&
                                                                (w->state == SVP_EXITED || w->state == SVP_EMPTY) &&
                                                                !node_has_agent(s, w->index / s->o.nproc)) ||
                                            (w->elastic_left && w->state == SVP_EXITED));
    }
    if (!running && (s->agent || all_registered || s->stopping)) ac_actor_request_stop(s->a);
}

/* Every rank's data endpoint (pe, pp: [world]); false if a rank has no slot. */
static bool fill_peers(sv *s, Cohort__V1__PeerEndpoint *pe, Cohort__V1__PeerEndpoint **pp) {
    /* (several nodes: a slot's tcp endpoint serves every generation, bound anew by each) */
    bool restart = s->snd.generation > 1 && s->o.nnodes == 1;
    for (int r = 0; r < s->world; r++) {
        worker *wr = rank_slot(s, r);
        if (!wr) return false;
        pe[r] = (Cohort__V1__PeerEndpoint)COHORT__V1__PEER_ENDPOINT__INIT;
        pe[r].rank = (uint32_t)r;
        /* after a restart every rank binds its endpoint of the new generation */
        pe[r].endpoint = restart ? wr->spawn_endpoint : wr->data_endpoint;
        pe[r].has_local_rank = 1;
        pe[r].local_rank = (uint32_t)wr->local_rank;
        pe[r].has_node_rank = 1;
        pe[r].node_rank = (uint32_t)(wr->index / s->o.nproc);
        pp[r] = &pe[r];
    }
    return true;
}

/* The world's parallel layout as the assignment carries it. */
static void fill_topology(const sv *s, Cohort__V1__Topology *topo) {
    *topo = (Cohort__V1__Topology)COHORT__V1__TOPOLOGY__INIT;
    topo->tp = (uint32_t)s->layout.tp;
    topo->pp = (uint32_t)s->layout.pp;
    topo->cp = (uint32_t)s->layout.cp;
    topo->dp = (uint32_t)s->layout.dp;
    topo->has_ep = topo->has_etp = topo->has_tp_pp_dp = 1;
    topo->ep = (uint32_t)s->layout.ep;
    topo->etp = (uint32_t)s->layout.etp;
    topo->tp_pp_dp = s->layout.tp_pp_dp;
    topo->has_emb_stages = s->layout.emb_stages != 0;
    topo->emb_stages = s->layout.emb_stages;
}

/* NCCL: one unique id per generation for the world (the groups are split from it); false
 * (the job stopped) if there is none. */
static bool nccl_unique_id(sv *s, uint8_t id[128]) {
    if (!s->o.nccl) return true;
#ifdef COHORT_HAVE_NCCL
    int rc = cm_nccl_get_unique_id(id);
#else
    (void)id;
    int rc = co_err_set(CO_EUNSUPPORTED, "this build has no NCCL");
#endif
    if (!rc) return true;
    char why[600];
    snprintf(why, sizeof why, "no NCCL unique id for generation %" PRIu64 ": %s", s->snd.generation, co_err_detail());
    begin_shutdown(s, SV_EXIT_FAILURE, why);
    return false;
}

/* Sends rank r its assignment: an Assign, or a Restart carrying it to a survivor. */
static void send_assignment(sv *s, int r, Cohort__V1__Assign *as, int64_t start_iteration, int source) {
    worker *wr = rank_slot(s, r);
    bool restart = s->snd.generation > 1;
    Cohort__V1__Coordinates co = COHORT__V1__COORDINATES__INIT;
    co.tp = (uint32_t)s->coord[r].tp;
    co.cp = (uint32_t)s->coord[r].cp;
    co.dp = (uint32_t)s->coord[r].dp;
    co.pp = (uint32_t)s->coord[r].pp;
    as->coords = &co;
    as->rank = (uint32_t)r; /* node-major: node_rank * nproc + local_rank */
    if (restart) {
        as->has_start_iteration = 1;
        as->start_iteration = (uint64_t)start_iteration;
        as->has_state_source = 1;
        as->state_source = source >= 0 ? s->source[r] : -1; /* a peer holding its shard */
        as->has_faults_through = 1;
        as->faults_through = (uint64_t)s->restart_faults_through;
        if (source < 0) as->checkpoint_dir = (char *)s->o.save_dir; /* load it */
    }
    int rc;
    if (wr->state == SVP_TRAINING) sv__w_set(wr, SVP_REGISTERED); /* (until its first loss of this generation) */
    if (!restart || wr->replacing) {
        rc = sv__send(s->mb, wr->identity, &s->snd, &as->base);
        wr->replacing = false;
    } else {
        Cohort__V1__Restart rs = COHORT__V1__RESTART__INIT;
        rs.new_generation = s->snd.generation;
        rs.assignment = as;
        rs.reason = "in-process restart";
        rc = sv__send(s->mb, wr->identity, &s->snd, &rs.base);
    }
    as->coords = NULL;
    if (rc) co_log(CO_LOG_ERROR, "sending the assignment to worker %d failed: %s", r, co_strerror(rc));
}

/* Sends every rank its assignment for the current generation: an Assign (at the start, and
 * to a replacement) or a Restart (to a survivor of an aborted generation). start_iteration
 * and source: where the new generation resumes and whose state every rank takes (source < 0:
 * every rank loads the checkpoint). */
static void send_assignments(sv *s, int64_t start_iteration, int source) {
    int n = s->world;
    Cohort__V1__PeerEndpoint *pe = calloc((size_t)n, sizeof *pe);
    Cohort__V1__PeerEndpoint **pp = calloc((size_t)n, sizeof *pp);
    uint8_t nccl_id[128];
    if (!pe || !pp) begin_shutdown(s, SV_EXIT_FAILURE, "out of memory");
    else if (!fill_peers(s, pe, pp)) begin_shutdown(s, SV_EXIT_FAILURE, "no worker holds a rank");
    else if (nccl_unique_id(s, nccl_id)) {
        Cohort__V1__Topology topo;
        fill_topology(s, &topo);
        for (int r = 0; r < n; r++) {
            Cohort__V1__Assign as = COHORT__V1__ASSIGN__INIT;
            if (s->o.nccl) {
                as.has_nccl_unique_id = 1;
                as.nccl_unique_id.len = sizeof nccl_id;
                as.nccl_unique_id.data = nccl_id;
            }
            as.world_size = (uint32_t)n;
            as.topology = &topo;
            as.n_peers = (size_t)n;
            as.peers = pp;
            as.job_id = s->snd.job_id;
            as.generation = s->snd.generation;
            send_assignment(s, r, &as, start_iteration, source);
        }
        s->assigned = true;
        ac_timer_stop(&s->rdv_timer);
        sv__fi_arm(s);
    }
    free(pe);
    free(pp);
}

static void assign_ranks(sv *s) { send_assignments(s, 0, -1); }

/* ---- in-process restart ---------------------------------------------------------------- */

int sv_incurable_status(int code, int worker_status) {
    switch (code) {
    case CO_EINVAL:
    case CO_EUNSUPPORTED: /* flags or a checkpoint that do not fit: the same on every start */
        return worker_status == SV_EXIT_USAGE ? SV_EXIT_USAGE : SV_EXIT_FAILURE;
    case CO_ENOSPC: /* a full disk or quota */
    case CO_EDENIED: /* permission denied */
    case CO_ENOENT: /* a missing file */
    case CO_ECORRUPT: /* no usable copy: every checkpoint the job could load failed verification */
        return SV_EXIT_FAILURE;
    default: /* a peer's death (CO_EREMOTE), a timeout, an abort, I/O, memory: a restart may cure it */
        return 0;
    }
}

/* Rank rank failed with an error no restart cures (status: sv_incurable_status's, what: its
 * message): the first such failure stops the job at once with that status and its message;
 * later ones (the other ranks failing the same way) say nothing more. */
static void stop_incurable(sv *s, int rank, int status, const char *what) {
    if (s->incurable) return;
    s->incurable = true;
    char msg[1200];
    snprintf(msg, sizeof msg, "rank %d: %s", rank, what);
    if (s->stopping) { /* the job is stopping for another reason: the message still counts */
        fprintf(stderr, "cohort: %s\n", msg);
        return;
    }
    fprintf(stderr, "cohort: %s (stopping: a restart cannot cure this)\n", msg);
    fflush(stderr);
    if (s->val) svv_note_fault(s->val, "exited", rank, "stopped the job: a restart cannot cure it (its message above)");
    begin_shutdown(s, status, msg);
}

/* A worker's own failure (sv_link_fatal: an Abort with its exit status), which it did not
 * print. Stops the job where no restart cures it; else the message is only printed. */
static void on_fatal(sv *s, worker *w, const Cohort__V1__Abort *ab, uint64_t generation) {
    char what[1000];
    snprintf(what, sizeof what, "%.*s", (int)strcspn(ab->reason, "\n"), ab->reason);
    int st = sv_incurable_status(ab->has_error_code ? ab->error_code : 0, ab->exit_status);
    /* (a failure in a generation already aborted may be the abort's doing: the restart goes on) */
    if (st && generation == s->snd.generation) stop_incurable(s, w->rank, st, what);
    else fprintf(stderr, "cohort: rank %d: %s\n", w->rank, what);
}

static void on_proc_closed(uv_handle_t *h) {
    worker *w = h->data;
    if (w->state == SVP_EXITING) sv__w_set(w, SVP_EXITED);
    if (w->state == SVP_RESPAWN) {
        /* (test hook COHORT_TEST_RESPAWN_FAILS: a replacement's process cannot start) */
        int rc = getenv("COHORT_TEST_RESPAWN_FAILS") ? co_err_set(CO_EIO, "supervisor: starting a replacement for "
                                                                           "rank %d: COHORT_TEST_RESPAWN_FAILS", w->rank)
                                                     : sv__spawn_one(w->sv, w);
        if (rc && w->sv->o.elastic && w->rank >= 0 && w->sv->restarting) {
            /* --elastic: its replica leaves at the restart barrier instead */
            sv__w_set(w, SVP_EXITED);
            co_log(CO_LOG_WARN, "rank %d's replacement could not start (%s): its model replica leaves (--elastic)",
                   w->rank, co_err_detail());
            w->replacing = false;
            w->elastic_gone = true;
            check_restart_done(w->sv);
            return;
        }
        if (rc) {
            sv__w_set(w, SVP_EXITED);
            co_log(CO_LOG_WARN, "%s", co_err_detail());
            begin_shutdown(w->sv, SV_EXIT_FAILURE, "could not start a replacement worker");
        }
    }
}

static void plan_view(sv *s, svp_view *v, svp_slot *slots);

/* --elastic: the restart budget is used up; the dead ranks are not replaced and their replicas
 * leave at the restart barrier instead of the job stopping. False: none is dead (a hang), or
 * not elastic: the job stops. */
static bool elastic_budget_out(sv *s, const char *why, int recent) {
    int n = 0;
    for (int i = 0; s->o.elastic && i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->rank < 0 || !svp_dead(w->state)) continue;
        w->elastic_gone = true;
        n++;
        co_log(CO_LOG_WARN, "%s; %d restarts within %d s already (--inprocess-restart-limit): rank %d is not replaced, "
               "its model replica leaves (--elastic)", why, recent, s->o.restart_window_ms / 1000, w->rank);
    }
    return n > 0;
}

/* Whether --inprocess-restart-limit restarts happened within the window already (then the
 * job is stopped, unless --elastic lets the dead ranks' replicas leave); else the restart is
 * counted. */
static bool restart_limit_reached(sv *s, uint64_t now, const char *why) {
    int recent = 0;
    for (int k = 0; k < s->nrestarts && k < 64; k++)
        if (now - s->restart_times[k] <= (uint64_t)s->o.restart_window_ms) recent++;
    if (recent >= s->o.restart_limit && !elastic_budget_out(s, why, recent)) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s; %d restarts within %d s already (--inprocess-restart-limit): stopping the job",
                 why, recent, s->o.restart_window_ms / 1000);
        co_log(CO_LOG_ERROR, "%s", msg);
        begin_shutdown(s, SV_EXIT_WORKER_FAILED, msg);
        return true;
    }
    s->restart_times[s->nrestarts % 64] = now;
    s->nrestarts++;
    return false;
}

/* Starts a new process in slot w, whose process exited, unless one is on its way: at once,
 * or once its old process handle is closed. */
static int respawn_slot(sv *s, worker *w) {
    if (!w_local(s, w)) {
        /* another node's: its agent starts the new process, which registers here */
        if (w->state == SVP_EXITING) sv__w_set(w, SVP_RESPAWN);
        char why[96];
        if (w->rank < 0) snprintf(why, sizeof why, "a new warm spare (generation %" PRIu64 ")", s->snd.generation);
        else snprintf(why, sizeof why, "rank %d is replaced (generation %" PRIu64 ")", w->rank, s->snd.generation);
        int rc = sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_RESPAWN, w, why);
        if (rc) return co_err_set(rc, "supervisor: ordering node %d's agent to replace rank %d failed",
                                  w->index / s->o.nproc, w->rank);
        sv__w_set(w, SVP_STARTED);
        w->pid = 0;
        w->stopped_pid = 0;
        w->exit_status = 0; /* (the dead process's: not the job's end) */
        w->term_signal = 0;
        w->last_seen_ms = sv__now_ms();
        return 0;
    }
    if (w->state == SVP_EXITING) sv__w_set(w, SVP_RESPAWN);
    return w->state == SVP_EXITED ? sv__spawn_one(s, w) : 0;
}

/* Dead slot w's rank goes to the warm spare sp (NULL: to a new process in w). */
static int replace_dead_rank(sv *s, worker *w, worker *sp) {
    if (sp) {
        /* a warm spare takes the dead rank; the dead slot starts a new spare (none on a lost
         * node: its slots wait for a new agent of the node, whose workers become spares) */
        co_log(CO_LOG_INFO, "the warm spare in slot %d takes rank %d (node %d, pid %u: started before the fault)",
               sp->index, w->rank, sp->index / s->o.nproc, sp->pid);
        sp->rank = w->rank;
        sp->replacing = true;
        if (s->o.nnodes == 1) snprintf(sp->spawn_endpoint, sizeof sp->spawn_endpoint, "%s", w->spawn_endpoint);
        w->rank = -1;
        unregister(s, w);
        if (node_has_agent(s, w->index / s->o.nproc)) {
            if (!s->finishing && respawn_slot(s, w)) co_log(CO_LOG_ERROR, "a new spare: %s", co_err_detail());
        } else if (w->state == SVP_EXITING) {
            sv__w_set(w, SVP_EXITED);
        }
        return 0;
    }
    if (w->elastic_gone) { /* (--elastic: nothing replaces it; its replica leaves) */
        unregister(s, w);
        return 0;
    }
    if (!w->replacing) {
        w->replacing = true;
        unregister(s, w);
    }
    int rc = respawn_slot(s, w);
    if (rc && s->o.elastic) {
        co_log(CO_LOG_WARN, "rank %d's replacement could not start (%s): its model replica leaves (--elastic)", w->rank,
               co_err_detail());
        w->replacing = false;
        w->elastic_gone = true;
        return 0;
    }
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        begin_shutdown(s, SV_EXIT_FAILURE, "could not start a replacement worker");
    }
    return rc;
}

/* Node granularity: live slot w's node leaves the active world, its rank goes to the warm
 * spare sp on a spare node and its process is killed (its exit, a spare's, starts a new spare
 * in its slot: the node becomes a spare node). */
static void give_up_rank(sv *s, worker *w, worker *sp) {
    const char *why = s->o.node_granularity ? "its node leaves the active world" : "it is evicted as a straggler";
    co_log(CO_LOG_INFO, "the warm spare in slot %d takes rank %d (node %d, pid %u: started before the fault) from the "
           "live process of slot %d (pid %u), %s", sp->index, w->rank, sp->index / s->o.nproc, sp->pid, w->index,
           w->pid, why);
    sp->rank = w->rank;
    sp->replacing = true;
    w->rank = -1;
    w->abort_ms = 0;
    w->evicting = false;
    kill_slot(s, w, s->o.node_granularity ? "its node leaves the active world (--inprocess-granularity node)"
                                          : "evicted as a straggler (--straggler-evict-after)");
}

/* Aborts the current generation: the survivors unwind to their restart barrier, dead ranks
 * are respawned or taken by warm spares. Called again if anything fails while a restart is
 * in progress. */
static void begin_restart(sv *s, const char *kind, int rank, const char *why, uint64_t detect_ms) {
    for (int k = 0; k < s->nw; k++) { /* what the heartbeats said of pipeline waits is old news now */
        s->w[k].waiting_on = -1;
        s->w[k].waiting_ms = 0;
    }
    uint64_t now = sv__now_ms();
    s->evict_rank = -1; /* an eviction not carried out yet: the scores start over */
    if (s->val) svv_restart_begin(s->val, kind, rank, why, detect_ms);
    /* (--elastic's grow is capacity returning, not a failure: no restart budget spent) */
    if (strcmp(kind, "elastic_grow") && restart_limit_reached(s, now, why)) return;
    uint64_t gen = ++s->snd.generation;
    if (!s->restarting) s->restart_t0 = s->barrier_t0 = now;
    s->restarting = true;
    co_log(CO_LOG_WARN, "%s; in-process restart into generation %" PRIu64, why, gen);
    svc_restart(s->ckpt, why);
    /* which warm spare takes each dead rank (planner.c) */
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    int *take = calloc((size_t)s->nw, sizeof *take);
    svp_view v;
    if (slots && take) {
        plan_view(s, &v, slots);
        svp_take_spares(&v, take);
    }
    free(slots);
    if (!slots || !take) {
        free(take);
        begin_shutdown(s, SV_EXIT_FAILURE, "out of memory");
        return;
    }
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        char name[48];
        snprintf(name, sizeof name, "data-%d-g%" PRIu64, w->index, gen);
        if (s->o.nnodes == 1 && ac_ipc_endpoint(s->ipc_dir, name, w->spawn_endpoint, sizeof w->spawn_endpoint)) {
            begin_shutdown(s, SV_EXIT_FAILURE, "no endpoint for the new generation");
            break;
        }
        w->ready_gen = 0;
        if (w->rank < 0) continue; /* a warm spare: not in the generation */
        if (take[i] >= 0 && s->o.node_granularity && (i % s->o.nproc == 0 || take[i - 1] < 0))
            co_log(CO_LOG_INFO, "the spare node %d takes the ranks of node %d whole (--inprocess-granularity node)",
                   take[i] / s->o.nproc, i / s->o.nproc);
        if (svp_dead(w->state)) {
            if (replace_dead_rank(s, w, take[i] >= 0 ? &s->w[take[i]] : NULL)) break;
        } else if (take[i] >= 0) {
            give_up_rank(s, w, &s->w[take[i]]);
        } else if (svp_alive(w->state) && !w->replacing) {
            Cohort__V1__Abort ab = COHORT__V1__ABORT__INIT;
            ab.generation = gen;
            ab.reason = (char *)why;
            ab.has_failed_rank = 1;
            ab.failed_rank = (uint32_t)(rank >= 0 ? rank : 0);
            sv__send(s->mb, w->identity, &s->snd, &ab.base);
            w->abort_ms = now;
        }
    }
    for (int i = 0; i < s->nw; i++) s->w[i].evicting = false; /* carried out (or not possible any more) */
    free(take);
}

static void collective_failed(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    ac_timer_stop(&s->collective_timer); /* frees it: it may fire again in a later generation */
    if (s->stopping || s->restarting || s->snd.generation != s->collective_gen) return; /* explained already */
    begin_restart(s, "collective", s->collective_rank, s->collective_why, sv__now_ms() - s->collective_t0);
}

/* The planner's view of the job (slots: [s->nw], filled here). */
static void plan_view(sv *s, svp_view *v, svp_slot *slots) {
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        slots[i] = (svp_slot){.state = w->state, .rank = w->rank, .node = w->index / s->o.nproc,
                              .replacing = w->replacing, .ready = w->ready_gen == s->snd.generation,
                              .ready_iter = w->ready_iter, .evict = w->evicting};
    }
    *v = (svp_view){.slots = slots, .nslots = s->nw, .world = s->world, .coord = s->coord,
                    .dopt_holders = s->o.dopt_holders, .shift_ranks = s->o.shift_ranks, .checkpoint_iter = -1,
                    .current_iter = s->val ? svv_current_iteration(s->val) : -1,
                    .node_granularity = s->o.node_granularity};
}

/* Says why the survivors' state cannot be used (the plan's reason) and what happens instead. */
static void say_fallback(sv *s, const svp_plan *p) {
    const topo_coord *c = p->why_rank >= 0 ? &s->coord[p->why_rank] : NULL;
    if (p->reason == SVP_OPTIMIZER_LOST)
        co_log(CO_LOG_WARN, "the optimizer shard of data-parallel rank %d (rank %d; model shard tp %d, cp %d, pp %d) "
               "lost every holder at iteration %" PRId64 "%s", c->dp, p->why_rank, c->tp, c->cp, c->pp, p->committed,
               s->o.dopt_holders > 1 ? " (it and the next data-parallel rank)" : " (no --dist-opt-redundancy)");
    else if (p->reason == SVP_SHARD_LOST || p->reason == SVP_SHARD_BEHIND)
        co_log(CO_LOG_WARN, "%s of the model shard tp %d, cp %d, pp %d (rank %d's)",
               p->reason == SVP_SHARD_LOST ? "no replica survived" : "the surviving replicas are behind the others",
               c->tp, c->cp, c->pp, p->why_rank);
    if (p->verdict == SVP_FROM_CHECKPOINT)
        co_log(CO_LOG_WARN, "no replica of the state survived: the new generation loads the checkpoint of iteration "
               "%" PRId64 " from %s (%" PRId64 " steps lost)", p->resume_iter, s->o.save_dir,
               p->committed > p->resume_iter ? p->committed - p->resume_iter : 0);
}

/* Says where the new generation's state comes from. */
static void say_resume(sv *s, const svp_plan *p) {
    char from[200];
    if (p->src >= 0 && p->nsources <= 1) {
        snprintf(from, sizeof from, "the state of rank %d", p->source[0]);
    } else if (p->src >= 0) {
        int len = snprintf(from, sizeof from, "the state of ranks");
        for (int r = 0, k = 0; r < s->world && len < (int)sizeof from - 40; r++)
            if (p->source[r] == r) len += snprintf(from + len, sizeof from - (size_t)len, "%s %d", k++ ? "," : "", r);
        snprintf(from + len, sizeof from - (size_t)len, " (one per model shard)");
    } else {
        snprintf(from, sizeof from, "the checkpoint's state");
    }
    co_log(CO_LOG_INFO, "generation %" PRIu64 ": %d rank(s) resume after iteration %" PRId64 " with %s (%d replaced; "
           "%.0f ms since the fault)", s->snd.generation, s->world, p->resume_iter, from, p->nreplaced,
           (double)(sv__now_ms() - s->restart_t0));
}

/* ---- --elastic: the shrink and the grow (their plans: elastic.c) ----------------------- */

/* The world of plan p from the next generation on: every slot's rank, the layout, the ranks'
 * coordinates, the validator's and the checkpoint coordinator's world. */
static int elastic_apply(sv *s, const sve_plan *p) {
    for (int i = 0; i < s->nw; i++) s->w[i].rank = p->new_rank[i];
    s->layout = p->layout;
    s->world = p->layout.world;
    for (int r = 0; r < s->world; r++)
        if (topo_coords(&s->layout, r, &s->coord[r])) return co_err_set(CO_ENOMEM, "elastic: out of memory");
    int *stage_of = s->o.pp > 1 ? malloc(sizeof *stage_of * (size_t)s->world) : NULL;
    if (s->o.pp > 1 && !stage_of) return co_err_set(CO_ENOMEM, "elastic: out of memory");
    for (int r = 0; stage_of && r < s->world; r++) stage_of[r] = s->coord[r].pp;
    int rc = s->val ? svv_set_world(s->val, s->world, s->o.replicas ? s->layout.dp : 0, stage_of) : 0;
    free(stage_of);
    if (!rc && s->ckpt) rc = svc_set_world(s->ckpt, s->world);
    return rc;
}

/* The shrink: the ranks of lost nodes that no new agent replaced in time (elastic_gone) are gone
 * for good, and the replicas that held them leave. False: the job stops (below
 * --elastic-min-replicas, or the new world could not be made). */
static bool elastic_shrink(sv *s, svp_view *v, sve_plan *p, bool *gone) {
    int n = 0;
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        gone[i] = (s->elastic_gone[w->index / s->o.nproc] || w->elastic_gone) && w->rank >= 0 && !svp_alive(w->state);
        n += gone[i];
    }
    if (!n) return true;
    int dp0 = s->layout.dp, left = sve_plan_shrink(v, &s->layout, gone, s->o.elastic_min_replicas, p);
    char why[300];
    int olost = left > 0 ? sve_optimizer_lost(v, &s->layout, gone, s->o.dopt_holders) : -1;
    if (olost >= 0) {
        snprintf(why, sizeof why, "--elastic: the optimizer shard of data-parallel rank %d leaves with every holder%s: "
                 "the shards cannot be re-partitioned from memory", olost,
                 s->o.dopt_holders > 1 ? " (it and the next data-parallel rank)" : " (no --dist-opt-redundancy)");
        co_log(CO_LOG_ERROR, "%s; stopping the job (exit %d: restart it from the last checkpoint)", why,
               SV_EXIT_NODE_LOST);
        begin_shutdown(s, SV_EXIT_NODE_LOST, why);
        return false;
    }
    if (left < 0) {
        snprintf(why, sizeof why, "--elastic: %d of %d model replicas lost a rank for good and %d would remain, fewer "
                 "than --elastic-min-replicas %d", p->changed, dp0, dp0 - p->changed, s->o.elastic_min_replicas);
        co_log(CO_LOG_ERROR, "%s; stopping the job (exit %d: restart it from the last checkpoint)", why,
               SV_EXIT_NODE_LOST);
        begin_shutdown(s, SV_EXIT_NODE_LOST, why);
        return false;
    }
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (!gone[i]) continue;
        w->replacing = w->elastic_gone = false; /* (nothing replaces it: its slot waits for a new agent of its node) */
        w->elastic_left = true;
        /* (a lost node's slot was ordered a replacement from no agent; a local exiting one's
         * handle closes first) */
        if (w->state == SVP_STARTED && !w_local(s, w)) sv__w_set(w, SVP_EXITING);
        if (w->state == SVP_RESPAWN || (w->state == SVP_EXITING && !w_local(s, w))) sv__w_set(w, SVP_EXITED);
    }
    for (int k = 0; k < s->o.nnodes; k++)
        if (s->elastic_gone[k]) s->elastic_out[k] = true, s->elastic_gone[k] = false;
    if (elastic_apply(s, p)) {
        begin_shutdown(s, SV_EXIT_FAILURE, co_err_detail());
        return false;
    }
    co_log(CO_LOG_WARN, "--elastic: %d model replica(s) lost a rank for good and leave; the job trains on with %d "
           "replica(s) (%d ranks, it had %d), the global batch unchanged", left, s->layout.dp, s->world,
           dp0 * s->layout.tp * s->layout.cp * s->layout.pp);
    return true;
}

/* The grow: the workers of a returned node (elastic_out, its new agent's, registered and
 * holding no rank) join as new replicas and take their state from their peers' memory. */
static bool elastic_join(sv *s, svp_view *v, sve_plan *p, bool *join) {
    s->elastic_grow = false;
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        join[i] = s->elastic_out[w->index / s->o.nproc] && w->rank < 0 && svp_alive(w->state);
    }
    int per = s->layout.tp * s->layout.cp * s->layout.pp, dp0 = s->layout.dp;
    int added = sve_plan_grow(v, &s->layout, join, s->world0 / per, p);
    if (added <= 0) return true; /* (no whole replica: they wait) */
    if (elastic_apply(s, p)) {
        begin_shutdown(s, SV_EXIT_FAILURE, co_err_detail());
        return false;
    }
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (!join[i] || w->rank < 0) continue;
        w->replacing = true; /* (a new process: it takes its shard's state from a peer) */
        s->elastic_out[w->index / s->o.nproc] = false;
    }
    co_log(CO_LOG_WARN, "--elastic: %d model replica(s) join; the job trains on with %d replica(s) (%d ranks, it had "
           "%d)", added, s->layout.dp, s->world, dp0 * per);
    return true;
}

/* At the restart barrier, before the plan: the world shrinks or grows. False: the job stops. */
static bool elastic_resize(sv *s) {
    if (!s->o.elastic) return true;
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    int *nr = calloc((size_t)s->nw, sizeof *nr);
    bool *mark = calloc((size_t)s->nw, sizeof *mark);
    bool ok = slots && nr && mark;
    if (!ok) begin_shutdown(s, SV_EXIT_FAILURE, "out of memory");
    svp_view v;
    sve_plan p = {.new_rank = nr};
    if (ok) {
        plan_view(s, &v, slots);
        ok = elastic_shrink(s, &v, &p, mark);
    }
    if (ok && s->elastic_grow) {
        plan_view(s, &v, slots);
        v.world = s->world;
        ok = elastic_join(s, &v, &p, mark);
    }
    free(slots);
    free(nr);
    free(mark);
    return ok;
}

/* --elastic, every tick while the job trains: a node whose replicas left has a new agent whose
 * workers all registered: the job grows back at the next step (an in-process restart). */
static void elastic_watch(sv *s) {
    if (!s->o.elastic || !s->assigned || s->restarting || s->stopping || s->finishing) return;
    for (int n = 1; n < s->o.nnodes; n++) {
        if (!s->elastic_out[n] || !s->agent_id[n][0]) continue;
        bool all = true;
        for (int i = n * s->o.nproc; i < (n + 1) * s->o.nproc && i < s->nw; i++)
            all = all && s->w[i].rank < 0 && svp_alive(s->w[i].state);
        if (!all) continue;
        char why[200];
        snprintf(why, sizeof why, "--elastic: node %d's new agent and its %d worker(s) joined", n, s->o.nproc);
        s->elastic_grow = true;
        begin_restart(s, "elastic_grow", -1, why, 0);
        return;
    }
}

/* Once every survivor is at the restart barrier and every replacement registered: plans the
 * new generation (planner.c) and carries the plan out. */
static void check_restart_done(sv *s) {
    if (!s->restarting || s->stopping) return;
    if (!elastic_resize(s)) return;
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    int *new_rank = calloc((size_t)s->nw, sizeof *new_rank);
    if (!slots || !new_rank) {
        free(slots);
        free(new_rank);
        begin_shutdown(s, SV_EXIT_FAILURE, "out of memory");
        return;
    }
    svp_view v;
    plan_view(s, &v, slots);
    svp_plan p = {.source = s->source, .new_rank = new_rank};
    svp_plan_restart(&v, &p);
    if (p.verdict != SVP_WAIT && p.reason != SVP_OK) {
        /* every replica of a shard died: the new processes load the last checkpoint instead */
        int64_t ck = -1;
        if (s->o.save_dir && *s->o.save_dir && !ck_read_tracker(s->o.save_dir, &ck) && ck >= 0) {
            v.checkpoint_iter = ck;
            svp_plan_restart(&v, &p);
        }
    }
    if (p.verdict != SVP_WAIT) say_fallback(s, &p);
    if (p.verdict == SVP_CANNOT_CONTINUE)
        begin_shutdown(s, SV_EXIT_WORKER_FAILED, "no data-parallel replica of a model shard survived and there "
                                                 "is no checkpoint to restart from (--save)");
    if (p.verdict == SVP_WAIT || p.verdict == SVP_CANNOT_CONTINUE) {
        free(slots);
        free(new_rank);
        return;
    }
    s->restart_faults_through = p.faults_through;
    for (int i = 0; i < s->nw; i++) s->w[i].rank = new_rank[i];
    free(slots);
    free(new_rank);
    s->restarting = false;
    say_resume(s, &p);
    if (s->val) svv_restart_done(s->val, p.resume_iter, p.src < 0);
    send_assignments(s, p.resume_iter, p.src);
    svc_resend_stopped(s->ckpt); /* (a replacement process has not heard it) */
    if (s->sig_stop) {
        /* a signal came during the restart: the new generation stops before its first step
         * (the ranks vote at the start of training), saving what the survivors had */
        for (int i = 0; i < s->nw; i++)
            if (svp_alive(s->w[i].state)) send_shutdown(s, &s->w[i], 0, "signal");
    }
}

int64_t sv__current_iteration(sv *s) {
    int64_t cur = 0;
    for (int i = 0; i < s->nw; i++)
        if ((int64_t)s->w[i].iteration > cur) cur = (int64_t)s->w[i].iteration;
    if (s->val && svv_current_iteration(s->val) > cur) cur = svv_current_iteration(s->val);
    return cur;
}

void sv__inject_send(sv *s, const fi_fault *f, const char *spec) {
    Cohort__V1__Param pm = COHORT__V1__PARAM__INIT, *pp = &pm;
    pm.key = "spec";
    pm.value = (char *)spec;
    Cohort__V1__InjectFault inj = COHORT__V1__INJECT_FAULT__INIT;
    inj.target_rank = f->rank;
    inj.has_iteration = 1;
    inj.iteration = (uint64_t)f->step;
    inj.n_params = 1;
    inj.params = &pp;
    for (int i = 0; i < s->nw; i++)
        if (svp_alive(s->w[i].state)) sv__send(s->mb, s->w[i].identity, &s->snd, &inj.base);
}

/* `cohort inject` against this job: checks the spec, forwards it to the workers (or keeps
 * a kill-supervisor), and answers with one line: "ok: ..." or "error: ...". */
static void handle_inject(sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg) {
    char out[900];
    const char *spec = NULL;
    if (msg && msg->env->body_case == COHORT__V1__ENVELOPE__BODY_INJECT_FAULT)
        for (size_t i = 0; i < msg->env->inject_fault->n_params; i++)
            if (!strcmp(msg->env->inject_fault->params[i]->key, "spec")) spec = msg->env->inject_fault->params[i]->value;
    int64_t cur = sv__current_iteration(s);
    fi_schedule one = {0};
    if (!spec) {
        snprintf(out, sizeof out, "error: not an injection request");
    } else if (!s->assigned || s->stopping) {
        snprintf(out, sizeof out, "error: the job is %s", s->stopping ? "stopping" : "not running yet");
    } else if (s->live_injects + (s->o.inject ? s->o.inject->n : 0) >= FI_MAX_SPECS) {
        snprintf(out, sizeof out, "error: the job has %d injections already, the most one job takes (--inject and "
                 "cohort inject together)", FI_MAX_SPECS);
    } else if (fi_schedule_add(&one, spec, (uint64_t)sv__now_ms(), s->nw,
                               s->o.train_iters > 0 ? s->o.train_iters : INT64_MAX / 4)) {
        snprintf(out, sizeof out, "error: %s", co_err_detail());
    } else if (one.f[0].step <= cur + 1) {
        snprintf(out, sizeof out, "error: step %lld is too soon: the job is at iteration %lld (give step >= %lld)",
                 (long long)one.f[0].step, (long long)cur, (long long)cur + 2);
    } else {
        if (one.f[0].kind == FI_KILL_SUPERVISOR) {
            if (!s->o.inject || fi_schedule_add(s->o.inject, spec, 0, s->nw, INT64_MAX / 4))
                snprintf(out, sizeof out, "error: cannot keep it");
        } else {
            sv__inject_send(s, &one.f[0], spec);
            s->live_injects++; /* (a kill-supervisor counts in --inject's schedule) */
        }
        char line[700];
        snprintf(line, sizeof line, "inject: %s (cohort inject), requested at iteration %lld", spec, (long long)cur);
        co_log(CO_LOG_WARN, "%s", line);
        if (s->val) svv_on_event(s->val, one.f[0].rank, line);
        snprintf(out, sizeof out, "ok: %s (the job is at iteration %lld)", spec, (long long)cur);
    }
    fi_schedule_free(&one);
    if (m->request_id) ac_reply(mb, m, out, strlen(out));
}

/* The job as status.c renders it; ranks: [s->nw], filled here. */
static void job_view(sv *s, svo_job *j, svo_rank *ranks) {
    uint64_t now = sv__now_ms();
    memset(j, 0, sizeof *j);
    j->pid = (int)getpid();
    j->job_id = s->snd.job_id;
    j->generation = s->snd.generation;
    j->state = s->stopping ? "stopping" : s->restarting ? "restarting" : s->assigned ? "training" : "rendezvous";
    j->world = s->world;
    j->nnodes = s->o.nnodes;
    j->nslots = s->nw;
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        ranks[i] = (svo_rank){.rank = w->rank, .node = w->index / s->o.nproc, .pid = w->pid, .host = w->host,
                              .iteration = (int64_t)w->iteration, .alive = svp_alive(w->state),
                              .seen_ago_s = w->last_seen_ms ? (double)ms_since_(now, w->last_seen_ms) / 1000.0 : -1};
    }
    j->ranks = ranks;
    j->save_interval = s->o.save_interval;
    j->train_iters = s->o.train_iters;
    j->save_dir = s->o.save_dir ? s->o.save_dir : "";
    j->ckpt_commits = svc_committed(s->ckpt, &j->ckpt_last);
    j->uptime_s = (double)(now - s->t_start) / 1000.0;
}

/* Renders the Prometheus snapshot and hands it to the HTTP thread (--metrics-port). */
static void publish_metrics(sv *s) {
    if (!s->http || !s->obs) return;
    s->published_ms = sv__now_ms();
    svo_rank *ranks = calloc((size_t)s->nw, sizeof *ranks);
    if (!ranks) return;
    svo_job j;
    job_view(s, &j, ranks);
    svm_publish(s->http, svo_prometheus(s->obs, &j, s->val));
    free(ranks);
}

/* `cohort status` against this job: a StatusReply with the JSON document (status.h). */
static void handle_status(sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg) {
    if (!m->request_id) return;
    int nfaults = 10;
    if (msg && msg->env->body_case == COHORT__V1__ENVELOPE__BODY_STATUS_REQUEST && msg->env->status_request->has_faults &&
        msg->env->status_request->faults > 0)
        nfaults = (int)msg->env->status_request->faults;
    char *doc = NULL;
    svo_rank *ranks = calloc((size_t)s->nw, sizeof *ranks);
    if (ranks && s->obs) {
        svo_job j;
        job_view(s, &j, ranks);
        doc = svo_status_json(s->obs, &j, s->val, nfaults);
    }
    free(ranks);
    const char *err = "{\"error\":\"this supervisor cannot tell its status (out of memory)\"}";
    Cohort__V1__StatusReply rep = COHORT__V1__STATUS_REPLY__INIT;
    rep.json.data = (uint8_t *)(doc ? doc : err);
    rep.json.len = strlen(doc ? doc : err);
    uint8_t *buf = NULL;
    size_t len = 0;
    sv__sender snd = s->snd; /* (a reply is not in the workers' sequence) */
    snd.seq = 0;
    if (!sv__encode(&snd, &rep.base, &buf, &len)) ac_reply(mb, m, buf, len);
    else ac_reply(mb, m, "", 0);
    free(buf);
    free(doc);
}

/* Flags that may differ between nodes: where a node is, its local paths and threads, and
 * what only node 0 writes. Every other flag changes what the job computes or saves
 * (--timeline-iterations too: every rank must record the same iterations; --timeline-dir
 * is a node's local path, as the cache is). */
static const char *const node_local_flags[] = {"node-rank", "node-addr", "master-addr", "data-cache-path", "workdir",
                                               "threads", "progress", "metrics-file", "run-report", "job-secret",
                                               "sample-lines", "timeline-dir", "tensorboard-dir",
                                               "metrics-port"};

/* Whether two workers' flags (co_config_write_json objects) differ beyond the node-local
 * ones; why then names the first few that do, with both values. */
static bool flags_differ(const char *a_json, const char *b_json, char *why, size_t n) {
    json_t *a = json_loads(a_json, 0, NULL), *b = json_loads(b_json, 0, NULL);
    bool differ = false;
    size_t len = 0;
    why[0] = '\0';
    if (!json_is_object(a) || !json_is_object(b)) {
        differ = true;
        snprintf(why, n, "unreadable flags");
    } else {
        const char *key;
        json_t *va;
        int shown = 0;
        json_object_foreach(a, key, va) {
            bool local = false;
            for (size_t k = 0; k < sizeof node_local_flags / sizeof *node_local_flags; k++)
                if (!strcmp(key, node_local_flags[k])) local = true;
            json_t *vb = json_object_get(b, key);
            if (local || (vb && json_equal(va, vb))) continue;
            differ = true;
            if (shown++ >= 4 || len >= n - 1) continue;
            char *ta = json_dumps(va, JSON_ENCODE_ANY | JSON_COMPACT), *tb = vb ? json_dumps(vb, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            int w = snprintf(why + len, n - len, "%s--%s %s there, %s here", len ? "; " : "", key,
                             ta ? ta : "?", tb ? tb : "(absent)");
            if (w > 0) len = len + (size_t)w < n ? len + (size_t)w : n - 1;
            free(ta);
            free(tb);
        }
        if (shown > 4 && len < n - 1) snprintf(why + len, n - len, "; and %d more", shown - 4);
    }
    json_decref(a);
    json_decref(b);
    return differ;
}

/* A worker's Register: checks its node's flags against the job's, then the rendezvous (or
 * the restart, for a replacement) may be complete. */
static void on_registration(sv *s, worker *w, const Cohort__V1__Register *r) {
    if ((w->state != SVP_STARTED && w->state != SVP_EMPTY) || (int)r->local_rank != w->local_rank ||
        (int)r->node_rank * s->o.nproc + w->local_rank != w->index)
        return;
    char *flags = r->has_config_json ? strndup((const char *)r->config_json.data, r->config_json.len) : NULL;
    if (flags && !s->stopping) {
        char why[600];
        if (!s->flags_ref) {
            s->flags_ref = flags;
            flags = NULL;
            s->flags_ref_node = (int)r->node_rank;
        } else if (flags_differ(s->flags_ref, flags, why, sizeof why)) {
            char msg[1100], local[300] = "";
            size_t nl = sizeof node_local_flags / sizeof *node_local_flags;
            for (size_t k = 0, len = 0; k < nl && len < sizeof local; k++)
                len += (size_t)snprintf(local + len, sizeof local - len, "%s--%s", k ? ", " : "", node_local_flags[k]);
            snprintf(msg, sizeof msg, "node %u's training flags differ from node %d's: %s; every node must run the "
                     "same `cohort train` flags (only %s may differ)", r->node_rank, s->flags_ref_node, why, local);
            co_log(CO_LOG_ERROR, "%s", msg);
            begin_shutdown(s, SV_EXIT_USAGE, msg);
        }
    }
    free(flags);
    sv__w_set(w, SVP_REGISTERED);
    w->pid = r->pid;
    w->goodbye = false;
    snprintf(w->host, sizeof w->host, "%s", r->hostname ? r->hostname : "");
    w->data_endpoint = strdup(r->data_endpoint);
    if (!w->data_endpoint) {
        begin_shutdown(s, SV_EXIT_FAILURE, "out of memory");
        return;
    }
    if (s->stopping) {
        send_shutdown(s, w, s->status > 0 && s->status < 128 ? s->status : 0, "the job is stopping");
        return;
    }
    if (s->finishing && w->rank < 0) { /* a spare that came after the others were let go */
        send_shutdown(s, w, 0, "the job is done");
        return;
    }
    if (w->replacing) check_restart_done(s); /* a replacement */
    else if (!s->stopping && !s->assigned && registered_count(s) == s->nw) assign_ranks(s);
}

/* A worker's Abort: its own failure (sv_link_fatal), or a collective of its that failed. */
static void on_worker_abort(sv *s, worker *w, const Cohort__V1__Abort *ab, uint64_t generation) {
    if (ab->has_exit_status) { /* the worker's own failure (sv_link_fatal) */
        on_fatal(s, w, ab, generation);
        return;
    }
    if (s->stopping || generation != s->snd.generation) return;
    if (!s->restart_enabled) {
        begin_shutdown(s, SV_EXIT_WORKER_FAILED, ab->reason);
        return;
    }
    /* a peer died or timed out: restart if nothing else does within a moment (a dead peer's
     * exit usually arrives too, and names the rank) */
    if (!s->restarting && !s->collective_timer) {
        snprintf(s->collective_why, sizeof s->collective_why, "%s", ab->reason);
        s->collective_rank = w->rank;
        s->collective_gen = s->snd.generation;
        s->collective_t0 = sv__now_ms();
        ac_timer_start(s->a, 300, 0, collective_failed, s, &s->collective_timer);
    }
}

/* A survivor at the restart barrier of the current generation. */
static void on_ready(sv *s, worker *w, const Cohort__V1__Ready *rd, uint64_t generation) {
    if (!s->restarting || generation != s->snd.generation || w->replacing) return;
    if (w->retiring) {
        kill_slot(s, w, "quarantined"); /* its exit starts the replacement */
        return;
    }
    w->ready_gen = generation;
    w->ready_iter = rd->has_iteration ? (int64_t)rd->iteration : 0;
    s->last_ready_ms = sv__now_ms();
    check_restart_done(s);
}

/* A quarantine decided in an earlier iteration is carried out once a report of a later one
 * comes (every rank applied and logged that iteration): true if the restart began. */
static bool retire_quarantined(sv *s, int64_t it) {
    if (s->quarantine_rank < 0 || it <= s->quarantine_after) return false;
    int q = s->quarantine_rank;
    s->quarantine_rank = -1;
    worker *qw = rank_slot(s, q);
    if (!s->restart_enabled || !qw || w_exited(qw)) return false;
    char msg[200];
    snprintf(msg, sizeof msg, "rank %d quarantined (found faulty too often)", q);
    qw->retiring = true; /* retired at this restart's barrier */
    begin_restart(s, "quarantine", q, msg, 0);
    return true;
}

/* Why a straggler cannot be evicted (planner.c's verdict). */
static const char *evict_refusal(svp_evict_verdict e) {
    switch (e) {
    case SVP_EVICT_NO_SPARE: return "no free warm spare (--inprocess-active-world-size)";
    case SVP_EVICT_LAST_REPLICA: return "it (or its node) holds the last live replica of a model shard";
    case SVP_EVICT_OPTIMIZER: return "it (or its node) holds the last live copy of an optimizer shard";
    default: return "it is not a live rank of this generation";
    }
}

/* An eviction decided in an earlier iteration (--straggler-evict-after) is carried out once a
 * report of a later one comes (a step boundary, as a quarantine): a warm spare takes the
 * straggler's rank and its shard's state from a peer in an in-process restart, its process
 * (with node granularity its node's) is stopped. The last rank writes the log line and the
 * metrics record of each iteration after its verdict: evicting it, the boundary is its own
 * report of a later iteration (from: the sender), which it sends after that record on the
 * same connection, so the record is in before its process is stopped (another rank's report
 * of that iteration can come first). Where the eviction cannot be, it is said and the job goes
 * on. True if the restart began. */
static bool evict_straggler(sv *s, int64_t it, const worker *from) {
    if (s->evict_rank < 0 || it <= s->evict_after) return false;
    if (s->evict_rank == s->world - 1 && from->rank != s->evict_rank) return false;
    int r = s->evict_rank;
    s->evict_rank = -1;
    worker *w = rank_slot(s, r);
    svp_evict_verdict e = SVP_EVICT_BUSY;
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    int *take = calloc((size_t)s->nw, sizeof *take);
    if (w && slots && take && s->restart_enabled) {
        svp_view v;
        w->evicting = true;
        plan_view(s, &v, slots);
        e = svp_plan_evict(&v, r, take);
        w->evicting = e == SVP_EVICT_OK;
    }
    free(slots);
    free(take);
    char msg[400];
    if (e != SVP_EVICT_OK) {
        co_log(CO_LOG_WARN, "straggler: rank %d scored below --straggler-threshold %d iterations in a row (%s): it "
               "would be evicted (--straggler-evict-after) but cannot: %s; training goes on", r,
               s->o.straggler_evict_after, s->evict_scores,
               !s->restart_enabled ? "in-process restart is off" : evict_refusal(e));
        return false;
    }
    snprintf(msg, sizeof msg, "rank %d (pid %u) evicted as a straggler: scored below %.2f %d iterations in a row (%s)",
             r, w->pid, s->o.straggler_threshold > 0 ? s->o.straggler_threshold : 0.75, s->o.straggler_evict_after,
             s->evict_scores);
    begin_restart(s, "evicted", r, msg, 0);
    return true;
}

/* A straggler to evict (the validator's), noted for the next iteration's boundary. */
static void note_straggler(sv *s, int64_t it) {
    double sc[8];
    int n;
    int r = svv_evict_candidate(s->val, sc, 8, &n);
    if (r < 0 || s->evict_rank >= 0) return;
    s->evict_rank = r;
    s->evict_after = it;
    int len = snprintf(s->evict_scores, sizeof s->evict_scores, "scores");
    for (int k = 0; k < n && len < (int)sizeof s->evict_scores - 8; k++)
        len += snprintf(s->evict_scores + len, sizeof s->evict_scores - (size_t)len, " %.2f", sc[k]);
}

/* A worker's LossReport or ParamsChecksum: to the validator. */
static void on_report(sv *s, worker *w, const Cohort__V1__Envelope *e) {
    if (!s->val || s->stopping || s->restarting || e->generation != s->snd.generation) return;
    char why[400];
    int quarantine = -1;
    bool sum = e->body_case == COHORT__V1__ENVELOPE__BODY_PARAMS_CHECKSUM;
    int64_t it = (int64_t)(sum ? e->params_checksum->iteration : e->loss_report->iteration);
    if (retire_quarantined(s, it) || evict_straggler(s, it, w)) return;
    if (w->state == SVP_REGISTERED) sv__w_set(w, SVP_TRAINING);
    int st = w->rank < 0 ? 0
             : sum      ? svv_on_checksum(s->val, w->rank, e->params_checksum, why, sizeof why, &quarantine)
                        : svv_on_report(s->val, w->rank, e->loss_report, why, sizeof why, &quarantine);
    if (st > 0) begin_shutdown(s, st, why);
    else if (quarantine >= 0 && s->quarantine_rank < 0) {
        /* not now: ranks still in this iteration's all-reduce would be aborted before
         * applying it while the others have, and its log line would be lost */
        s->quarantine_rank = quarantine;
        s->quarantine_after = it;
    } else if (st == 0) {
        note_straggler(s, it);
    }
}

/* A worker's CheckpointAck: to the commit coordinator; a write that failed for good stops the job. */
static void on_checkpoint_ack(sv *s, worker *w, const Cohort__V1__CheckpointAck *ack, uint64_t generation) {
    if (!s->ckpt || generation != s->snd.generation || w->rank < 0) return;
    int64_t before, after;
    int64_t n0 = svc_committed(s->ckpt, &before);
    svc_on_ack(s->ckpt, w->rank, ack);
    if (s->val && *svc_saves_stopped(s->ckpt)) svv_note_saves_stopped(s->val, svc_saves_stopped(s->ckpt));
    /* a write that failed for good (a full disk, permission denied): stop before the
     * other ranks, their save aborted, ask for a restart */
    int st = ack->status < 0 ? sv_incurable_status(ack->status, SV_EXIT_FAILURE) : 0;
    if (st) {
        char what[1200];
        snprintf(what, sizeof what, "checkpoint: writing its part of iteration %" PRIu64 " failed: %s (%s)",
                 ack->iteration, ack->error ? ack->error : "no detail", co_strerror(ack->status));
        stop_incurable(s, w->rank, st, what);
    }
    if (svc_committed(s->ckpt, &after) != n0 && s->obs) {
        /* committed: its save time from its iteration's acceptance (if the validator saw it) */
        uint64_t acc = s->val ? svv_accepted_ms(s->val, after) : 0;
        svo_on_checkpoint(s->obs, after, acc ? (double)ms_since_(sv__now_ms(), acc) / 1000.0 : -1);
        publish_metrics(s);
    }
}

/* A worker's Metrics record: into --metrics-file and what Prometheus is told. */
static void on_metrics(sv *s, const Cohort__V1__Metrics *mt) {
    if (!mt->record) return;
    if (s->metrics) {
        fputs(mt->record, s->metrics);
        fflush(s->metrics);
    }
    svo_on_record(s->obs, mt->record);
    svv_on_record(s->val, mt->record); /* a save's blocking time, for the goodput */
    /* (at most 5 snapshots a second: a fast job logs hundreds of records a second; the
     * heartbeat tick publishes the rest) */
    if (sv__now_ms() - s->published_ms >= 200) publish_metrics(s);
}

/* A worker got SIGINT/SIGTERM/SIGUSR1 itself (link.c): the whole job stops cleanly. */
static void on_worker_signal(sv *s, worker *w, int sig) {
    w->signalled = true;
    if (sig != SIGINT && sig != SIGTERM && sig != SIGUSR1) return;
    char what[160];
    snprintf(what, sizeof what, "%s received by rank %d (pid %u)", strsignal(sig), w->rank, w->pid);
    begin_signal_stop(s, sig, w->rank, what);
}

/* A message from one of the job's workers. */
static void on_worker_message(sv *s, worker *w, const Cohort__V1__Envelope *e) {
    w->last_seen_ms = sv__now_ms();
    switch (e->body_case) {
    case COHORT__V1__ENVELOPE__BODY_REGISTRATION: on_registration(s, w, e->registration); break;
    case COHORT__V1__ENVELOPE__BODY_HEARTBEAT:
        w->iteration = e->heartbeat->iteration;
        w->waiting_on = e->heartbeat->has_waiting_on ? e->heartbeat->waiting_on : -1;
        w->waiting_ms = e->heartbeat->has_waiting_ms ? e->heartbeat->waiting_ms : 0;
        break;
    case COHORT__V1__ENVELOPE__BODY_ABORT: on_worker_abort(s, w, e->abort, e->generation); break;
    case COHORT__V1__ENVELOPE__BODY_READY: on_ready(s, w, e->ready, e->generation); break;
    case COHORT__V1__ENVELOPE__BODY_LOSS_REPORT:
    case COHORT__V1__ENVELOPE__BODY_PARAMS_CHECKSUM: on_report(s, w, e); break;
    case COHORT__V1__ENVELOPE__BODY_CHECKPOINT_ACK: on_checkpoint_ack(s, w, e->checkpoint_ack, e->generation); break;
    case COHORT__V1__ENVELOPE__BODY_METRICS: on_metrics(s, e->metrics); break;
    case COHORT__V1__ENVELOPE__BODY_SIGNAL_RECEIVED: on_worker_signal(s, w, e->signal_received->signal); break;
    case COHORT__V1__ENVELOPE__BODY_FAULT_EVENT:
        /* an injected or repaired fault on that rank: for the run report */
        if (s->val) svv_on_event(s->val, w->rank, e->fault_event->text);
        break;
    case COHORT__V1__ENVELOPE__BODY_LOG_LINE: {
        FILE *f = e->log_line->level >= COHORT__V1__LOG_LEVEL__LOG_WARNING ? stderr : stdout;
        fputs(e->log_line->text, f);
        fflush(f);
        break;
    }
    default: break;
    }
}

/* A new agent of node n, which was lost after warm spares took its ranks (or held spares
 * only): its slots await its workers as warm spares; one it started for a rank (it cannot
 * know the ranks moved) is restarted as a spare, off the critical path. */
static void adopt_spare_slots(sv *s, int n) {
    bool said = false;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->index / s->o.nproc != n || w->rank >= 0 || w->state != SVP_EXITED) continue;
        if (!said)
            co_log(CO_LOG_INFO, "a new agent of node %d joined: its slots hold warm spares (the node's ranks went to "
                   "spares before)", n);
        said = true;
        w->elastic_left = false;
        sv__w_set(w, SVP_STARTED);
        w->pid = 0;
        w->exit_status = w->term_signal = 0;
        w->last_seen_ms = sv__now_ms();
        w->adopting = w->index < s->world && !s->elastic_out[n]; /* (started by the agent as a rank; --elastic: they join as ranks) */
        if (w->adopting)
            sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_RESPAWN, w, "its rank went to a warm spare");
    }
}

/* Whether peer is node n's agent: the first to speak for its node, or after the node was lost
 * a new one (its workers then replace the node's ranks). Any other (an agent that was lost and
 * came back, a second agent of one node) is told to stop. */
static bool agent_admitted(sv *s, int n, const char *peer) {
    if (!strcmp(s->agent_id[n], peer)) return true;
    if (!s->agent_id[n][0] && strcmp(s->agent_gone[n], peer)) {
        snprintf(s->agent_id[n], sizeof s->agent_id[n], "%s", peer);
        if (s->stopping) { /* (begin_shutdown did not know it yet) */
            Cohort__V1__Shutdown sd = COHORT__V1__SHUTDOWN__INIT;
            sd.exit_status = s->status > 0 && s->status < 128 ? s->status : 0;
            sd.reason = "the job is stopping";
            sv__send(s->mb, peer, &s->snd, &sd.base);
        }
        if (s->node_lost_ms[n]) {
            co_log(CO_LOG_WARN, "a new agent of node %d joined after %.1f s; its workers replace the node's ranks", n,
                   (double)ms_since_(sv__now_ms(), s->node_lost_ms[n]) / 1000);
            s->node_lost_ms[n] = 0;
            s->barrier_t0 = sv__now_ms(); /* its workers' start has the barrier's time */
        }
        if (s->agent_gone[n][0]) adopt_spare_slots(s, n);
        return true;
    }
    char why[200];
    snprintf(why, sizeof why, "refused: node %d %s", n, !strcmp(s->agent_gone[n], peer)
             ? "was lost and its ranks were given to another agent" : "has another agent");
    co_log(CO_LOG_WARN, "node %d's agent %s %s", n, peer, why);
    Cohort__V1__Shutdown sd = COHORT__V1__SHUTDOWN__INIT;
    sd.exit_status = SV_EXIT_NODE_LOST;
    sd.reason = why;
    sv__send(s->mb, peer, &s->snd, &sd.base);
    return false;
}

/* Node agent n's report on one of its node's slots: a worker's process exited (the same as
 * a local worker's exit), or is stopped or runs again (the laggard check at the restart
 * barrier reads it as it reads a local process's state). */
static void on_slot_event(sv *s, int n, const Cohort__V1__SlotEvent *ev) {
    if ((int)ev->slot >= s->nw || (int)ev->slot / s->o.nproc != n || n == s->o.node_rank) return;
    worker *w = &s->w[ev->slot];
    if (ev->has_pid && ev->pid && w->pid && ev->pid != w->pid) return; /* about an older process */
    bool stopped = ev->kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_STOPPED;
    if (stopped || ev->kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_CONTINUED) {
        w->stopped_pid = stopped ? ev->pid : 0;
        if (w->stopped_pid && s->restarting) watch_progress(s, sv__now_ms()); /* replaced now, not a tick later */
        return;
    }
    if (ev->kind != COHORT__V1__SLOT_EVENT__KIND__SLOT_EXITED || w_exited(w) || w->state == SVP_EMPTY) return;
    if (!w->pid && ev->has_pid) w->pid = ev->pid; /* (a replacement that died before it registered) */
    sv__w_set(w, SVP_EXITING);
    if (w->adopting) { /* killed to be restarted as a warm spare, as ordered: its agent does */
        w->adopting = false;
        unregister(s, w);
        w->identity[0] = '\0';
        sv__w_set(w, SVP_RESPAWN);
        sv__w_set(w, SVP_STARTED);
        w->pid = 0;
        w->last_seen_ms = sv__now_ms();
        return;
    }
    w->exit_status = ev->has_exit_status ? ev->exit_status : 1;
    w->term_signal = ev->has_term_signal ? ev->term_signal : 0;
    w->stopped_pid = 0;
    s->role->worker_exited(s, w, w->exit_status, w->term_signal);
    sv__maybe_finish(s);
}

/* A message from another node's agent (its identity "agentN"): a signal it received (the job
 * stops cleanly), or a report on one of its slots. Every message says the agent lives. */
static void on_agent_message(sv *s, const char *peer, const Cohort__V1__Envelope *e) {
    char *end = NULL;
    long n = strtol(peer + 5, &end, 10);
    if (!end || (*end && *end != '.') || n < 1 || n >= s->o.nnodes || !s->agent_id) return;
    if (!agent_admitted(s, (int)n, peer)) return;
    if (!s->agent_heard_ms[n]) {
        /* answered at once, not at the next tick: an agent takes a failure of its workers for
         * the job's end until it has heard the supervisor (a short job's first fault can come
         * before the first tick) */
        Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
        sv__agent_send(s, (int)n, &hb.base);
    }
    s->agent_heard_ms[n] = sv__now_ms();
    if (e->body_case == COHORT__V1__ENVELOPE__BODY_SIGNAL_RECEIVED) {
        int sig = e->signal_received->signal;
        if (sig != SIGINT && sig != SIGTERM && sig != SIGUSR1) return;
        char what[200];
        const char *t = e->signal_received->what ? e->signal_received->what : strsignal(sig);
        snprintf(what, sizeof what, "%.*s", (int)strcspn(t, "\n"), t);
        begin_signal_stop(s, sig, -1, what);
    } else if (e->body_case == COHORT__V1__ENVELOPE__BODY_SLOT_EVENT) {
        on_slot_event(s, (int)n, e->slot_event);
    }
}

/* The slot of the worker whose identity is peer ("w<slot>.<nonce>", worker/link.c): the slot
 * whose process it is, or for a registration the slot waiting for its process (which then
 * takes the identity). NULL: none (a process whose slot was given to another). */
static worker *worker_of(sv *s, const char *peer, const Cohort__V1__Envelope *e) {
    for (int i = 0; i < s->nw; i++)
        if (!strcmp(s->w[i].identity, peer)) return &s->w[i];
    char *end = NULL;
    long slot = peer[0] == 'w' ? strtol(peer + 1, &end, 10) : -1;
    if (e->body_case != COHORT__V1__ENVELOPE__BODY_REGISTRATION || !end || end == peer + 1 || (*end && *end != '.') ||
        slot < 0 || slot >= s->nw)
        return NULL;
    worker *w = &s->w[slot];
    if (w->state != SVP_STARTED && w->state != SVP_EMPTY) return NULL;
    snprintf(w->identity, sizeof w->identity, "%s", peer);
    return w;
}

/* Decodes a message; one dropped as malformed or over a limit is said at once (a worker whose
 * registration is dropped would wait for its assignment until its timeout with nothing said). */
static pw_msg *decode_message(sv *s, const ac_msg *m) {
    uint64_t bad = s->stats.dropped[PW_DROP_OVERSIZED] + s->stats.dropped[PW_DROP_MALFORMED] +
                   s->stats.dropped[PW_DROP_LIMITS];
    pw_msg *msg = sv__decode(m, s->snd.job_id, 0, &s->stats);
    if (!msg && s->drops_told < 3 &&
        s->stats.dropped[PW_DROP_OVERSIZED] + s->stats.dropped[PW_DROP_MALFORMED] + s->stats.dropped[PW_DROP_LIMITS] > bad) {
        s->drops_told++;
        co_log(CO_LOG_WARN, "dropped a message from %s: %s", m->peer ? m->peer : "an unnamed peer", co_err_detail());
    }
    return msg;
}

/* The supervisor's messages: `cohort inject` and `cohort status` requests, the workers', the
 * node agents'. */
static void supervisor_on_message(sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg) {
    if (m->peer && !strncmp(m->peer, "inject-", 7)) {
        handle_inject(s, mb, m, msg);
        return;
    }
    if (m->peer && !strncmp(m->peer, "status-", 7)) {
        handle_status(s, mb, m, msg);
        return;
    }
    if (m->request_id) ac_reply(mb, m, "", 0); /* a worker's goodbye: its earlier messages are in */
    if (!msg || !m->peer) return;
    if (!strncmp(m->peer, "agent", 5)) {
        on_agent_message(s, m->peer, msg->env);
        return;
    }
    worker *w = worker_of(s, m->peer, msg->env);
    if (w && m->request_id && !w_local(s, w)) {
        /* another node's process ending (its agent's report of the end may be lost with it):
         * the last rank's lets the spares go, a spare's lets the supervisor end */
        w->goodbye = true;
        if (w->rank >= 0 && !s->restarting) finish_spares(s);
        sv__maybe_finish(s);
    }
    if (w) {
        on_worker_message(s, w, msg->env);
    } else if (m->peer[0] == 'w' && !m->request_id && !s->stopping) {
        /* a process whose slot another took (a lost node's worker that came back): it stops */
        Cohort__V1__Shutdown sd = COHORT__V1__SHUTDOWN__INIT;
        sd.exit_status = SV_EXIT_NODE_LOST;
        sd.reason = "refused: its rank was given to another process";
        sv__send(s->mb, m->peer, &s->snd, &sd.base);
    }
}

static void on_message(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    sv *s = ctx;
    pw_msg *msg = decode_message(s, m);
    s->role->on_message(s, mb, m, msg);
    pw_msg_free(&msg);
}

static void heartbeat_tick(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    s->role->tick(s, sv__now_ms());
}

static bool spares_cover_node(sv *s, int n);

/* Node n's agent went silent: its ranks are lost together. Its identity is refused from now
 * on (it may come back, its workers too: they are told to stop), the generation is aborted,
 * and warm spares on other nodes take its ranks (svp_take_spares) or, where they cannot take
 * all, the survivors wait at the restart barrier for a new agent of node rank n, whose workers
 * take the node's slots (watch_lost_nodes bounds the wait); one that joins after spares took
 * the ranks brings spares. */
static void lose_node(sv *s, int n, const char *why, uint64_t silent_ms) {
    uint64_t now = sv__now_ms();
    bool covered = spares_cover_node(s, n);
    snprintf(s->agent_gone[n], sizeof s->agent_gone[n], "%s", s->agent_id[n]);
    s->agent_id[n][0] = '\0';
    s->agent_heard_ms[n] = 0;
    s->node_lost_ms[n] = covered ? 0 : now;
    if (covered)
        co_log(CO_LOG_ERROR, "%s; node %d's ranks go to warm spares on other nodes: no new agent of node %d is awaited",
               why, n, n);
    else
        co_log(CO_LOG_ERROR, "%s; waiting up to %.1f s (--node-replacement-timeout) for a new agent of node %d%s", why,
               (double)s->o.node_replacement_ms / 1000, n, s->o.elastic ? ", then the job shrinks (--elastic)" : "");
    /* what the loss costs (planner.c): nothing where every shard it held lives on elsewhere */
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    if (slots) {
        svp_view v;
        plan_view(s, &v, slots);
        int lost = svp_node_shard_lost(&v, n);
        if (lost < 0)
            co_log(CO_LOG_INFO, "every model shard node %d held has a replica on another node: its ranks' "
                   "replacements take their peers' state", n);
        else
            co_log(CO_LOG_WARN, "the model shard tp %d, cp %d, pp %d (rank %d's) had no replica outside node %d: the "
                   "new generation loads the last checkpoint", s->coord[lost].tp, s->coord[lost].cp,
                   s->coord[lost].pp, lost, n);
        free(slots);
    }
    int first = -1;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->index / s->o.nproc != n) continue;
        w->identity[0] = '\0'; /* its process is refused if it comes back */
        w->stopped_pid = 0;
        unregister(s, w);
        if (w_exited(w) || w->state == SVP_EMPTY || w->state == SVP_RESPAWN) continue;
        sv__w_set(w, SVP_EXITING);
        w->term_signal = SIGKILL;
        if (first < 0) first = w->rank;
    }
    if (s->assigned && !s->stopping) begin_restart(s, "node_lost", first, why, silent_ms);
}

/* Node n's agent went silent while the node held warm spares only: the spare pool shrinks, no
 * rank is lost and nothing restarts; its slots wait for a new agent of the node. */
static void lose_spare_node(sv *s, int n, const char *why) {
    snprintf(s->agent_gone[n], sizeof s->agent_gone[n], "%s", s->agent_id[n]);
    s->agent_id[n][0] = '\0';
    s->agent_heard_ms[n] = 0;
    int left = 0;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->index / s->o.nproc == n) {
            w->identity[0] = '\0';
            w->stopped_pid = 0;
            unregister(s, w);
            if (svp_alive(w->state) || w->state == SVP_STARTED) sv__w_set(w, SVP_EXITING);
            if (w->state == SVP_EXITING || w->state == SVP_RESPAWN) sv__w_set(w, SVP_EXITED);
        } else {
            left += w->rank < 0 && svp_alive(w->state);
        }
    }
    co_log(CO_LOG_WARN, "%s; it held warm spares only: no rank is lost, %d warm spare(s) left", why, left);
    if (s->val) svv_on_event(s->val, -1, why);
    sv__maybe_finish(s); /* the job's ranks may have ended while it waited for these spares' goodbye */
}

/* Whether every process of node n ended and none is awaited (its agent ends then). */
static bool node_done(const sv *s, int n) {
    for (int i = 0; i < s->nw; i++) {
        const worker *w = &s->w[i];
        if (w->index / s->o.nproc == n && (w->replacing || !(w_exited(w) || w->state == SVP_EMPTY))) return false;
    }
    return true;
}

/* What node n holds, in words ("ranks 2 to 3", "ranks 6, 2", "warm spares only"); the number
 * of ranks it holds. */
static int node_holds(const sv *s, int n, char *out, size_t len) {
    int r[64], k = 0;
    for (int i = 0; i < s->nw && k < 64; i++)
        if (s->w[i].index / s->o.nproc == n && s->w[i].rank >= 0) r[k++] = s->w[i].rank;
    bool range = k > 1;
    for (int j = 1; j < k; j++) range = range && r[j] == r[j - 1] + 1;
    if (!k) snprintf(out, len, "warm spares only");
    else if (k == 1) snprintf(out, len, "rank %d", r[0]);
    else if (range) snprintf(out, len, "ranks %d to %d", r[0], r[k - 1]);
    else {
        int o = snprintf(out, len, "ranks");
        for (int j = 0; j < k && o > 0 && (size_t)o < len; j++)
            o += snprintf(out + o, len - (size_t)o, "%s %d", j ? "," : "", r[j]);
    }
    return k;
}

/* Whether warm spares on other nodes would take every rank node n holds, were it lost. */
static bool spares_cover_node(sv *s, int n) {
    svp_slot *slots = calloc((size_t)s->nw, sizeof *slots);
    int *take = calloc((size_t)s->nw, sizeof *take);
    bool cover = slots && take;
    if (cover) {
        svp_view v;
        plan_view(s, &v, slots);
        for (int i = 0; i < s->nw; i++)
            if (slots[i].node == n) slots[i].state = SVP_EXITED;
        svp_take_spares(&v, take);
        for (int i = 0; i < s->nw; i++) cover = cover && (slots[i].node != n || slots[i].rank < 0 || take[i] >= 0);
    }
    free(slots);
    free(take);
    return cover;
}

/* Several nodes: a heartbeat to every node agent (an agent that hears nothing for the heartbeat
 * timeout stops its node); an agent silent for the heartbeat timeout is a node lost, its ranks
 * with it: the job stops (SV_EXIT_NODE_LOST) and is restarted from the last checkpoint. */
static void watch_agents(sv *s, uint64_t now) {
    for (int n = 1; n < s->o.nnodes; n++) {
        Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
        sv__agent_send(s, n, &hb.base);
        uint64_t heard = s->agent_heard_ms ? s->agent_heard_ms[n] : 0;
        if (s->stopping || !s->assigned || !heard || now <= heard || now - heard <= (uint64_t)s->o.heartbeat_timeout_ms)
            continue;
        if (node_done(s, n)) { /* its workers ended and none is awaited: the agent ended too */
            s->agent_heard_ms[n] = 0;
            continue;
        }
        char why[400], holds[200];
        int nranks = node_holds(s, n, holds, sizeof holds);
        snprintf(why, sizeof why, "node %d's agent sent nothing for %.1f s (--inprocess-heartbeat-timeout %.1f s): the "
                 "node is lost with its %s", n, (double)(now - heard) / 1000, (double)s->o.heartbeat_timeout_ms / 1000,
                 holds);
        if (s->restart_enabled && !nranks) {
            lose_spare_node(s, n, why);
            continue;
        }
        /* (warm spares that take all its ranks need no new agent of the node) */
        if (s->restart_enabled && (s->o.node_replacement_ms > 0 || s->o.elastic || spares_cover_node(s, n))) {
            lose_node(s, n, why, now - heard); /* (the restart notes the fault) */
            continue;
        }
        int first = -1;
        for (int i = 0; i < s->nw && first < 0; i++)
            if (s->w[i].index / s->o.nproc == n) first = s->w[i].rank;
        if (s->val) svv_note_fault(s->val, "node_lost", first, why);
        co_log(CO_LOG_ERROR, "%s; stopping the job (exit %d: restart it from the last checkpoint)", why,
               SV_EXIT_NODE_LOST);
        begin_shutdown(s, SV_EXIT_NODE_LOST, why);
    }
}

/* Whether node n's agent has been silent for two heartbeat intervals or more. */
static bool agent_silent(const sv *s, int n, uint64_t now) {
    uint64_t heard = s->agent_heard_ms ? s->agent_heard_ms[n] : 0;
    return n != s->o.node_rank && heard && now > heard && now - heard > 2 * (uint64_t)s->o.heartbeat_interval_ms;
}

/* The supervisor's tick: hangs, the metrics snapshot, a heartbeat to every worker and the
 * workers' silence, the node agents'. */
static void supervisor_tick(sv *s, uint64_t now) {
    watch_agents(s, now);
    elastic_watch(s);
    watch_progress(s, now);
    publish_metrics(s); /* heartbeats, restarts and ranks' ages change without a record */
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (!svp_alive(w->state)) continue;
        Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
        hb.iteration = w->iteration;
        sv__send(s->mb, w->identity, &s->snd, &hb.base);
        /* (a worker whose node's agent went silent too is left to the node's loss: its
         * process cannot be killed or replaced through that agent) */
        if (!w_local(s, w) && agent_silent(s, w->index / s->o.nproc, now)) continue;
        if (!s->stopping && s->restart_enabled && now - w->last_seen_ms > (uint64_t)s->o.heartbeat_timeout_ms) {
            co_log(CO_LOG_ERROR, "rank %d (pid %u) sent no heartbeat for %d s; killing it to replace it",
                   w->rank, w->pid, s->o.heartbeat_timeout_ms / 1000);
            w->last_seen_ms = now; /* once */
            kill_slot(s, w, "it sent no heartbeat");
            continue;
        }
        if (!s->stopping && now - w->last_seen_ms > (uint64_t)s->o.heartbeat_timeout_ms) {
            char why[160];
            snprintf(why, sizeof why, "rank %d (pid %u) sent no heartbeat for %d s", w->rank, w->pid,
                     s->o.heartbeat_timeout_ms / 1000);
            co_log(CO_LOG_ERROR, "%s; stopping the job", why);
            begin_shutdown(s, SV_EXIT_LOST_WORKER, why);
        }
    }
}

/* A laggard at the restart barrier that was training (not one still in its setup, which
 * may take longer) is killed this long (plus the slowest step) after every other rank
 * reached the barrier. */
#define LAGGARD_GRACE_MS 2000

/* Milliseconds from t to now, 0 when t is later (a time taken after now was: abort_ms is set
 * by begin_restart while a tick's now is older). */
static uint64_t ms_since(uint64_t now, uint64_t t) { return now > t ? now - t : 0; }

/* Is the local process pid stopped (SIGSTOP, a debugger)? Its state in /proc/PID/stat:
 * "PID (COMM) S ...", COMM may hold spaces and parentheses, so the state follows the last ')'. */
bool sv__process_stopped(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* A pipeline that stopped: the ranks that wait for a peer's message (their heartbeats say
 * which) and those they wait for. A rank waited on that waits for nobody is where the
 * pipeline is stuck (hung in its compute, or gone quiet): named in note as its stage, the
 * ranks waiting on it after. Returns that rank, or -1 (no pipeline, or no such rank). */
static int stuck_stage(sv *s, char *note, size_t n) {
    if (s->o.pp < 2 || !n || !s->coord) return -1;
    int stuck = -1;
    for (int i = 0; i < s->nw && stuck < 0; i++) {
        const worker *w = &s->w[i];
        if (w->rank < 0 || w->rank >= s->world || w->waiting_on >= 0) continue;
        for (int k = 0; k < s->nw; k++)
            if (s->w[k].rank >= 0 && s->w[k].waiting_on == w->rank) stuck = w->rank;
    }
    if (stuck < 0) return -1;
    int len = snprintf(note, n, "; stuck: pipeline stage %d (rank %d), waited on by rank", s->coord[stuck].pp, stuck);
    for (int k = 0; k < s->nw && len > 0 && (size_t)len < n - 16; k++)
        if (s->w[k].rank >= 0 && s->w[k].waiting_on == stuck) len += snprintf(note + len, n - (size_t)len, " %d", s->w[k].rank);
    return stuck;
}

/* A lost node waits for a new agent (its ranks' replacements) until --node-replacement-timeout,
 * then the job stops (SV_EXIT_NODE_LOST). True while one waits (the barrier's timeout waits). */
static bool watch_lost_nodes(sv *s, uint64_t now) {
    bool waiting = false;
    for (int n = 1; n < s->o.nnodes && s->node_lost_ms && !s->stopping; n++) {
        if (!s->node_lost_ms[n]) continue;
        if (ms_since(now, s->node_lost_ms[n]) <= (uint64_t)s->o.node_replacement_ms) {
            waiting = true;
            continue;
        }
        if (s->o.elastic) { /* its replicas leave at the barrier (elastic_resize) */
            co_log(CO_LOG_WARN, "node %d was lost and no agent of node rank %d joined within %.1f s "
                   "(--node-replacement-timeout): its ranks are gone for good (--elastic)", n, n,
                   (double)s->o.node_replacement_ms / 1000);
            s->node_lost_ms[n] = 0;
            s->elastic_gone[n] = true;
            check_restart_done(s);
            continue;
        }
        char why[300];
        snprintf(why, sizeof why, "node %d was lost and no agent of node rank %d joined within %.1f s "
                 "(--node-replacement-timeout)", n, n, (double)s->o.node_replacement_ms / 1000);
        co_log(CO_LOG_ERROR, "%s; stopping the job (exit %d: restart it from the last checkpoint)", why,
               SV_EXIT_NODE_LOST);
        begin_shutdown(s, SV_EXIT_NODE_LOST, why);
    }
    return waiting;
}

/* Hangs: a round whose reports stopped coming for the soft timeout aborts the generation;
 * a rank that does not reach the restart barrier by the hard timeout is killed; the whole
 * barrier has the barrier timeout. */
static void watch_progress(sv *s, uint64_t now) {
    if (!s->restart_enabled || s->stopping || !s->assigned) return;
    uint64_t soft = (uint64_t)s->o.soft_timeout_ms, hard = (uint64_t)s->o.hard_timeout_ms;
    if (!s->o.soft_timeout_set && s->val) {
        /* learned: 5x the slowest step seen, once there are enough steps to know */
        double step = svv_max_step_ms(s->val);
        if (step > 0) {
            uint64_t learned = (uint64_t)(5 * step) < 2000 ? 2000 : (uint64_t)(5 * step);
            if (learned < soft) {
                hard = hard - soft + learned;
                soft = learned;
            }
        }
    }
    if (s->restarting) {
        /* the laggards: a stopped local process never comes (killed at once); one that has not
         * come LAGGARD_GRACE_MS + the slowest step after every other rank did is unresponsive
         * (killed then, not at the hard timeout: the others wait at the barrier meanwhile) */
        int ready = 0;
        for (int i = 0; i < s->nw; i++) {
            worker *w = &s->w[i];
            if (w->rank >= 0 && !w->replacing && !w_exited(w) && w->ready_gen == s->snd.generation) ready++;
        }
        double step = s->val ? svv_max_step_ms(s->val) : 0;
        uint64_t grace = LAGGARD_GRACE_MS + (uint64_t)(step > 0 ? step : 0);
        bool others_in = ready > 0 && s->last_ready_ms >= s->restart_t0 && ms_since(now, s->last_ready_ms) > grace;
        for (int i = 0; i < s->nw; i++) {
            worker *w = &s->w[i];
            if (w->rank < 0 || w->replacing || w_exited(w) || w->ready_gen == s->snd.generation || !w->abort_ms) continue;
            char why[160];
            why[0] = '\0';
            /* (test hook COHORT_TEST_NO_PROC_STATE: as for a remote node's rank, unread) */
            if (w_local(s, w) && w->pid && !s->no_proc_state && sv__process_stopped((pid_t)w->pid))
                snprintf(why, sizeof why, "is stopped (process state T)");
            else if (!w_local(s, w) && w->pid && w->stopped_pid == w->pid) /* as its node's agent reported */
                snprintf(why, sizeof why, "is stopped (process state T, node %d's agent says)", w->index / s->o.nproc);
            else if (others_in && w->state == SVP_TRAINING && ms_since(now, w->abort_ms) > grace) /* (one in setup may be slow) */
                snprintf(why, sizeof why, "did not reach the restart barrier %.1f s after the other %d rank(s)",
                         (double)ms_since(now, s->last_ready_ms) / 1000, ready);
            else if (ms_since(now, w->abort_ms) > hard - soft)
                snprintf(why, sizeof why, "did not reach the restart barrier in %.1f s", (double)(hard - soft) / 1000);
            if (!why[0]) continue;
            co_log(CO_LOG_ERROR, "rank %d %s; killing it to replace it", w->rank, why);
            w->abort_ms = 0;
            kill_slot(s, w, why);
        }
        if (!watch_lost_nodes(s, now) && ms_since(now, s->barrier_t0) > (uint64_t)s->o.barrier_timeout_ms)
            begin_shutdown(s, SV_EXIT_WORKER_FAILED, "the restart barrier timed out (--inprocess-barrier-timeout)");
        return;
    }
    int missing[64], nmissing = 0;
    uint64_t since = 0;
    /* a pipeline waits between reports: a rank waiting for a peer's message longer than the
     * soft timeout finds a hang before any rank of the round has reported */
    for (int i = 0; i < s->nw && s->o.pp > 1; i++) {
        const worker *w = &s->w[i];
        if (w->rank < 0 || w_exited(w) || w->waiting_on < 0 || w->waiting_ms <= soft) continue;
        char why[300];
        int len = snprintf(why, sizeof why, "no progress: rank %d waited %.1f s for rank %d's pipeline message (soft "
                           "timeout %.1f s)", w->rank, (double)w->waiting_ms / 1000, w->waiting_on, (double)soft / 1000);
        int stuck = stuck_stage(s, why + len, sizeof why - (size_t)len);
        begin_restart(s, "hang", stuck >= 0 ? stuck : w->waiting_on, why, w->waiting_ms);
        if (s->restarting) watch_progress(s, sv__now_ms());
        return;
    }
    if (s->val && svv_stalled(s->val, now, soft, missing, 64, &nmissing, &since)) {
        char why[300];
        int len = snprintf(why, sizeof why, "no progress for %.1f s (rank", (double)(now - since) / 1000);
        for (int k = 0; k < nmissing && len < (int)sizeof why - 40; k++)
            len += snprintf(why + len, sizeof why - (size_t)len, " %d", missing[k]);
        len += snprintf(why + len, sizeof why - (size_t)len, " did not report; soft timeout %.1f s)",
                        (double)soft / 1000);
        int stuck = stuck_stage(s, why + len, sizeof why - (size_t)(len < (int)sizeof why ? len : (int)sizeof why - 1));
        begin_restart(s, "hang", stuck >= 0 ? stuck : nmissing ? missing[0] : -1, why, now - since);
        if (s->restarting) watch_progress(s, sv__now_ms()); /* a stopped rank is killed now, not a tick later */
    }
}

static void rendezvous_timeout(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    s->rdv_timer = NULL;
    if (s->assigned || s->stopping) return;
    co_log(CO_LOG_ERROR, "rendezvous timed out after %d s: %d of %d workers registered",
           s->o.rendezvous_timeout_ms / 1000, registered_count(s), s->nw);
    begin_shutdown(s, SV_EXIT_RENDEZVOUS, "rendezvous timed out");
    /* unregistered workers cannot hear the shutdown; they hold nothing (to a worker, SIGTERM
     * is a request to stop after its step, which one not yet training would only note) */
    for (int i = 0; i < s->nw; i++)
        if (w_running(s, &s->w[i]) && s->w[i].state == SVP_STARTED) uv_process_kill(&s->w[i].proc, SIGKILL);
    sv__maybe_finish(s); /* every local worker may already be gone */
}

/* A clean stop by signal (the supervisor's own, to it or to its process group, or one a
 * worker reported): before the ranks are assigned the job ends at once (nothing trained yet);
 * after, every rank is told to stop after its current step (the ranks vote on it with the
 * step's all-reduce, so all stop after the same iteration), saves with --save and exits 0,
 * and the run report is written. During an in-process restart the order follows the
 * restart's assignments (check_restart_done). rank: who got it (-1: the supervisor). */
static void begin_signal_stop(sv *s, int signum, int rank, const char *what) {
    if (s->sig_stop || s->stopping) return; /* under way, or the job ends anyway */
    s->sig_stop = signum;
    if (s->val) svv_note_fault(s->val, "signal", rank, what);
    if (!s->assigned) {
        co_log(CO_LOG_ERROR, "%s before training began: stopping the job", what);
        begin_shutdown(s, SV_EXIT_OK, "signal before training");
        sv__maybe_finish(s);
        return;
    }
    co_log(CO_LOG_INFO, "%s: the job stops after the current step%s", what,
           s->restarting ? " (once the restart in progress is done)" : "");
    if (sv_preempting_signal(signum, s->o.requeue_on_sigterm))
        for (int n = 1; n < s->o.nnodes; n++) {
            /* every node's process exits 75, whichever received the signal */
            Cohort__V1__Preempt pr = COHORT__V1__PREEMPT__INIT;
            pr.signal = signum;
            sv__agent_send(s, n, &pr.base);
        }
    if (s->restarting) return;
    for (int i = 0; i < s->nw; i++)
        if (svp_alive(s->w[i].state)) send_shutdown(s, &s->w[i], 0, "signal");
}

/* The supervisor's own SIGINT/SIGTERM/SIGUSR1: the job stops cleanly. */
static void supervisor_first_signal(sv *s, int signum) {
    char what[120];
    snprintf(what, sizeof what, "%s received by the supervisor", strsignal(signum));
    begin_signal_stop(s, signum, -1, what);
}

static void on_signal(uv_signal_t *h, int signum) {
    sv *s = h->data;
    if (++s->signals == 1) {
        s->role->first_signal(s, signum);
    } else {
        /* a second signal: at once; the step in progress is lost */
        co_log(CO_LOG_ERROR, "second %s: killing the workers", strsignal(signum));
        s->status = 128 + signum;
        begin_shutdown(s, 128 + signum, "interrupted twice");
        sv__kill_remaining(NULL, s);
        sv__maybe_finish(s);
    }
}

/* Whether a worker inherits the supervisor's environment variable: all but COHORT_* (the
 * supervisor sets those it means a worker to have), except the ones a user sets for the whole
 * job: tests' hooks, the corpus and checkpoint settings, the CUDA module to load, and the
 * CUDA and NCCL stand-ins' settings (tests/cudasim/: the device count, the seed, the timeout). */
static bool inherited(const char *kv) {
    static const char *const keep[] = {"COHORT_TEST_", "COHORT_CORPUS_", "COHORT_CKPT_", "COHORT_CUDA_MODULE=",
                                       "COHORT_CUDASIM_", "COHORT_SIM_NCCL_"};
    if (strncmp(kv, "COHORT_", 7)) return true;
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (!strncmp(kv, keep[i], strlen(keep[i]))) return true;
    return false;
}

/* Starts the worker process of slot w (at the start, or to replace a dead rank). */
int sv__spawn_one(sv *s, worker *w) {
    uv_loop_t *loop = ac_actor_loop(s->a);
    int nenv = 0;
    while (environ[nenv]) nenv++;
    char **args = calloc((size_t)s->o.nworker_args + 3, sizeof *args);
    char **env = calloc((size_t)nenv + (size_t)s->o.nextra_env + 11, sizeof *env); /* + 10 vars + NULL */
    char vars[10][600];
    if (!args || !env) {
        free(args);
        free(env);
        return co_err_set(CO_ENOMEM, "supervisor: spawning workers");
    }
    args[0] = (char *)s->o.exe;
    args[1] = "train";
    for (int k = 0; k < s->o.nworker_args; k++) args[2 + k] = s->o.worker_args[k];
    int ne = 0;
    for (int k = 0; k < nenv; k++)
        if (inherited(environ[k])) env[ne++] = environ[k];
    snprintf(vars[0], sizeof vars[0], "COHORT_SUPERVISOR=%s", s->endpoint);
    snprintf(vars[1], sizeof vars[1], "COHORT_JOB_ID=%" PRIx64, s->snd.job_id);
    snprintf(vars[2], sizeof vars[2], "COHORT_LOCAL_RANK=%d", w->local_rank);
    snprintf(vars[3], sizeof vars[3], "COHORT_IPC_DIR=%s", s->ipc_dir);
    snprintf(vars[4], sizeof vars[4], "COHORT_NODE_RANK=%d", s->o.node_rank);
    snprintf(vars[5], sizeof vars[5], "COHORT_WORKER_ID=%d", w->index);
    snprintf(vars[6], sizeof vars[6], "COHORT_DATA_ENDPOINT=%s", w->spawn_endpoint);
    snprintf(vars[7], sizeof vars[7], "COHORT_JOB_SECRET=%s", s->have_secret ? s->o.secret_path : "");
    /* a warm spare waits for a rank as long as its supervisor lives */
    snprintf(vars[8], sizeof vars[8], "COHORT_SPARE=%d", w->rank < 0 ? 1 : 0);
    /* the supervisor's silence after which the worker stops itself (a partitioned node's) */
    snprintf(vars[9], sizeof vars[9], "COHORT_SILENCE_MS=%d", s->o.heartbeat_timeout_ms);
    for (int k = 0; k < 10; k++) env[ne++] = vars[k];
    for (int k = 0; k < s->o.nextra_env; k++) env[ne++] = s->o.extra_env[k];
    uv_stdio_container_t stdio[3];
    for (int k = 0; k < 3; k++) {
        stdio[k].flags = UV_INHERIT_FD;
        stdio[k].data.fd = k;
    }
    uv_process_options_t po;
    memset(&po, 0, sizeof po);
    po.file = s->o.exe;
    po.args = args;
    po.env = env;
    po.exit_cb = on_exit_cb;
    po.stdio = stdio;
    po.stdio_count = 3;
    w->proc.data = w;
    int rc = uv_spawn(loop, &w->proc, &po);
    free(args);
    free(env);
    if (rc) return co_err_set(CO_EIO, "supervisor: starting worker %d (%s) failed: %s", w->index, s->o.exe, uv_strerror(rc));
    sv__w_set(w, SVP_STARTED);
    w->pid = (uint32_t)w->proc.pid;
    w->exit_status = 0; /* (a replaced process's is not the job's end) */
    w->term_signal = 0;
    w->last_seen_ms = sv__now_ms();
    return 0;
}

static int spawn_workers(sv *s) {
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        if (w->index / s->o.nproc != s->o.node_rank) continue; /* another node's */
        int rc = sv__spawn_one(s, w);
        if (rc) return rc;
    }
    return 0;
}

/* ckpt_coord.c's way to reach a rank. */
static int send_to_rank(void *ctx, int rank, const ProtobufCMessage *body) {
    sv *s = ctx;
    worker *w = rank_slot(s, rank);
    if (!w || !svp_alive(w->state)) return CO_ENOENT;
    return sv__send(s->mb, w->identity, &s->snd, body);
}

/* The supervisor's mailbox (bound: ipc on one node, tcp on several), the job file `cohort
 * inject` and `cohort status` find it by, --metrics-port's server, the rendezvous timeout. */
static int supervisor_open_mailbox(sv *s, ac_mailbox_opts *mo) {
    int rc = 0;
    if (s->o.nnodes == 1) {
        rc = ac_ipc_endpoint(s->ipc_dir, "supervisor", s->endpoint, sizeof s->endpoint);
        if (!rc) rc = ac_mailbox_bind(s->a, s->endpoint, mo, &s->mb);
    } else {
        char bind_ep[300];
        snprintf(bind_ep, sizeof bind_ep, "tcp://*:%d", s->o.master_port);
        snprintf(s->endpoint, sizeof s->endpoint, "tcp://%s:%d", s->o.master_addr, s->o.master_port);
        rc = ac_mailbox_bind(s->a, bind_ep, mo, &s->mb);
    }
    if (rc) return rc;
    /* how `cohort inject` finds this job: <ipc dir>/job */
    char path[400];
    snprintf(path, sizeof path, "%s/job", s->ipc_dir);
    FILE *f = fopen(path, "w");
    if (f) {
        /* (start: a pid another process takes after this one died is not this job) */
        fprintf(f, "pid=%d\nstart=%" PRIu64 "\nendpoint=%s\njob=%" PRIx64 "\n", (int)getpid(), co_proc_start_ticks(0),
                s->endpoint, s->snd.job_id);
        fclose(f);
    }
    if (s->o.metrics_port > 0) {
        /* one node: loopback only (nothing leaves the machine); several: node 0's address as
         * the other nodes reach it (--master-addr) */
        const char *addr = s->o.nnodes > 1 && s->o.master_addr && *s->o.master_addr ? s->o.master_addr : "127.0.0.1";
        rc = svm_start(&s->http, addr, s->o.metrics_port);
        if (rc) return rc;
        publish_metrics(s);
        co_log(CO_LOG_INFO, "Prometheus metrics at http://%s%s%s:%d/metrics", strchr(addr, ':') ? "[" : "", addr,
               strchr(addr, ':') ? "]" : "", s->o.metrics_port);
    }
    return ac_timer_start(s->a, (uint64_t)s->o.rendezvous_timeout_ms, 0, rendezvous_timeout, s, &s->rdv_timer);
}

static int sv_on_start(ac_actor *a, void *ctx) {
    sv *s = ctx;
    s->a = a;
    int rc = ac_ipc_dir_create(s->ipc_dir, sizeof s->ipc_dir);
    ac_mailbox_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.on_message = on_message;
    mo.ctx = s;
    mo.secret = s->have_secret ? &s->secret : NULL;
    if (!rc) rc = s->role->open_mailbox(s, &mo);
    for (int i = 0; !rc && i < s->nw; i++) {
        worker *w = &s->w[i];
        if (s->o.nnodes == 1) {
            char name[32];
            snprintf(name, sizeof name, "data-%d", w->index);
            rc = ac_ipc_endpoint(s->ipc_dir, name, w->spawn_endpoint, sizeof w->spawn_endpoint);
        } else {
            snprintf(w->spawn_endpoint, sizeof w->spawn_endpoint, "tcp://%s:%d", s->o.node_addr,
                     s->o.master_port + 1 + w->index);
        }
    }
    if (rc) return rc;
    uv_signal_init(ac_actor_loop(a), &s->sig_int);
    uv_signal_init(ac_actor_loop(a), &s->sig_term);
    uv_signal_init(ac_actor_loop(a), &s->sig_usr1);
    s->sig_int.data = s->sig_term.data = s->sig_usr1.data = s;
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_usr1, on_signal, SIGUSR1); /* Slurm's warning before the time limit */
    if (s->o.signalled && *s->o.signalled) {
        /* one that came before these handlers (cmd_train.c's recorded it) */
        int sig = *s->o.signalled;
        *s->o.signalled = 0;
        on_signal(sig == SIGINT ? &s->sig_int : sig == SIGUSR1 ? &s->sig_usr1 : &s->sig_term, sig);
    }
    rc = ac_timer_start(a, (uint64_t)s->o.heartbeat_interval_ms, (uint64_t)s->o.heartbeat_interval_ms, heartbeat_tick, s,
                        &s->hb_timer);
    if (!rc) rc = spawn_workers(s);
    if (rc) {
        /* workers already started must not outlive us */
        for (int i = 0; i < s->nw; i++)
            if (w_running(s, &s->w[i])) uv_process_kill(&s->w[i].proc, SIGKILL);
    }
    return rc;
}

static void sv_on_stop(ac_actor *a, void *ctx) {
    (void)a;
    sv *s = ctx;
    uv_signal_stop(&s->sig_int);
    uv_signal_stop(&s->sig_term);
    uv_signal_stop(&s->sig_usr1);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_usr1, NULL);
}

/* The per-worker and per-rank tables, the outputs and the coordinators of sv_run (each may
 * not have been made yet). */
static void release(sv *s) {
    svv_destroy(&s->val);
    svc_destroy(&s->ckpt);
    svo_destroy(&s->obs);
    if (s->metrics) fclose(s->metrics);
    s->metrics = NULL;
    free(s->flags_ref);
    for (int i = 0; s->w && i < s->nw; i++) free(s->w[i].data_endpoint);
    free(s->w);
    free(s->coord);
    free(s->source);
    free(s->agent_heard_ms);
    free(s->node_lost_ms);
    free(s->elastic_gone);
    free(s->elastic_out);
    free(s->agent_id);
    free(s->agent_gone);
}

/* Several nodes: the job secret, and the job id every node derives from it. */
static int load_job_secret(sv *s) {
    if (s->o.nnodes > 1) {
        int rc = s->o.secret_path && *s->o.secret_path
                     ? ac_secret_load(s->o.secret_path, &s->secret)
                     : co_err_set(CO_EINVAL, "several nodes need --job-secret (cohort keygen)");
        if (rc) {
            co_log(CO_LOG_ERROR, "job secret: %s (%s)", co_err_detail(), co_strerror(rc));
            return SV_EXIT_FAILURE;
        }
        s->have_secret = true;
        s->snd.job_id = XXH64(s->secret.server_public, strlen(s->secret.server_public), 0) | 1u;
    }
    co_proctitle_role(s->agent ? CO_PROC_AGENT : CO_PROC_SUPERVISOR, -1, s->o.node_rank, s->snd.job_id);
    return 0;
}

/* The world's parallel layout (the supervisor's: an agent assigns nothing). */
static int init_layout(sv *s) {
    char err[300];
    if (topo_layout_init(&s->layout, s->world, s->o.tp > 0 ? s->o.tp : 1, s->o.pp > 0 ? s->o.pp : 1,
                         s->o.cp > 0 ? s->o.cp : 1, s->o.ep > 0 ? s->o.ep : 1, s->o.etp, s->o.tp_pp_dp, err,
                         sizeof err)) {
        co_log(CO_LOG_ERROR, "%s", err);
        return SV_EXIT_USAGE;
    }
    s->layout.emb_stages = s->o.emb_stages;
    if (s->o.shift_ranks && s->layout.dp != s->world) {
        co_log(CO_LOG_ERROR, "--inprocess-rank-assignment shift-ranks renumbers the ranks, which would move model "
               "shards: not with tensor, context or pipeline parallelism");
        return SV_EXIT_USAGE;
    }
    return 0;
}

/* The world's ranks' coordinates and restart sources (the supervisor's). */
static int init_coords(sv *s) {
    s->coord = calloc((size_t)s->world, sizeof *s->coord);
    s->source = calloc((size_t)s->world, sizeof *s->source);
    s->agent_heard_ms = calloc((size_t)s->o.nnodes, sizeof *s->agent_heard_ms);
    s->node_lost_ms = calloc((size_t)s->o.nnodes, sizeof *s->node_lost_ms);
    s->agent_id = calloc((size_t)s->o.nnodes, sizeof *s->agent_id);
    s->agent_gone = calloc((size_t)s->o.nnodes, sizeof *s->agent_gone);
    s->elastic_gone = calloc((size_t)s->o.nnodes, sizeof *s->elastic_gone);
    s->elastic_out = calloc((size_t)s->o.nnodes, sizeof *s->elastic_out);
    s->world0 = s->world;
    bool ok = s->coord && s->source && s->agent_heard_ms && s->node_lost_ms && s->agent_id && s->agent_gone &&
              s->elastic_gone && s->elastic_out;
    for (int r = 0; r < s->world && ok; r++) ok = topo_coords(&s->layout, r, &s->coord[r]) == 0;
    return ok ? 0 : SV_EXIT_FAILURE;
}

/* The worker slots of this process: the job's (supervisor) or its node's (agent). */
static int init_slots(sv *s) {
    s->w = calloc((size_t)s->nw, sizeof *s->w);
    if (!s->w) return SV_EXIT_FAILURE;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        w->sv = s;
        w->waiting_on = -1;
        w->index = s->agent ? s->o.node_rank * s->o.nproc + i : i;
        w->local_rank = w->index % s->o.nproc;
        snprintf(w->identity, sizeof w->identity, "w%d", w->index);
        w->rank = w->index < s->world ? w->index : -1;
    }
    return 0;
}

/* --metrics-file and --tensorboard-dir: the stream the workers' records and the validator's
 * events go to. */
static int open_metrics(sv *s) {
    if (s->o.metrics_file && *s->o.metrics_file && !(s->metrics = fopen(s->o.metrics_file, "a"))) {
        co_log(CO_LOG_ERROR, "cannot open --metrics-file %s", s->o.metrics_file);
        return SV_EXIT_FAILURE;
    }
    if (s->o.tensorboard && s->o.tensorboard->dir && *s->o.tensorboard->dir) {
        /* every record that reaches the metrics file (the last rank's, the validator's
         * events) becomes TensorBoard events too: the stream passes it on to both */
        ob_tb *tb = NULL;
        FILE *tee = NULL;
        if (ob_tb_open(&tb, s->o.tensorboard) || !(tee = ob_tee_open(s->metrics, tb))) {
            co_log(CO_LOG_ERROR, "--tensorboard-dir: %s", tb ? "cannot make the metrics stream" : co_err_detail());
            ob_tb_close(&tb);
            return SV_EXIT_FAILURE;
        }
        s->metrics = tee;
    }
    return 0;
}

/* The checkpoint commits, what the job tells outside, and the validator of every iteration. */
static int open_coordinators(sv *s) {
    if (s->o.save_dir && *s->o.save_dir &&
        svc_new(&s->ckpt, s->o.save_dir, s->o.most_recent_k, s->world, s->snd.job_id, send_to_rank, s)) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return SV_EXIT_FAILURE;
    }
    svc_set_limits(s->ckpt, s->o.keep_every, s->o.save_space_margin);
    if (svo_new(&s->obs)) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return SV_EXIT_FAILURE;
    }
    snprintf(s->job_hex, sizeof s->job_hex, "%016" PRIx64, s->snd.job_id);
    svv_options vo = {.rr = s->o.rerun, .tracker_file = s->o.tracker_file, .job = s->job_hex,
                      .straggler_threshold = s->o.straggler_threshold > 0 ? s->o.straggler_threshold : 0.75,
                      .inject = s->o.inject, .metrics = s->metrics, .quarantine_after = s->o.quarantine_after,
                      .quarantine_window = s->o.quarantine_window, .evict_after = s->o.straggler_evict_after,
                      .save_auto = s->o.save_interval == CO_SAVE_INTERVAL_AUTO && s->o.save_dir && *s->o.save_dir && s->world > 1,
                      .expected_mtbf = s->o.expected_mtbf, .train_iters = s->o.train_iters};
    vo.rr.world = s->world;
    int *stage_of = s->o.pp > 1 ? malloc(sizeof *stage_of * (size_t)s->world) : NULL;
    for (int r = 0; stage_of && r < s->world; r++) stage_of[r] = s->coord[r].pp;
    vo.stage_of = stage_of;
    vo.nstages = s->o.pp;
    vo.rr.replica_stride = s->o.replica_stride > 1 ? s->o.replica_stride : 1;
    vo.rr.replicas = s->o.replicas;
    int vrc = svv_new(&s->val, &vo, send_to_rank, s);
    free(stage_of); /* (copied) */
    if (vrc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return SV_EXIT_FAILURE;
    }
    if (s->o.rerun_state && *s->o.rerun_state && svv_state_load(s->val, s->o.rerun_state))
        co_log(CO_LOG_WARN, "the checkpoint's rerun state machine state is not usable (%s); starting afresh",
               co_err_detail());
    svc_set_rerun_state(s->ckpt, svv_state_save, s->val);
    if (s->ckpt) svc_set_metrics(s->ckpt, s->metrics);
    return 0;
}

/* The supervisor's own setup: the layout, the ranks' coordinates, the metrics stream, the
 * coordinators. */
static int supervisor_setup(sv *s) {
    int st = init_layout(s);
    if (!st) st = init_coords(s);
    if (!st) st = open_metrics(s);
    if (!st) st = open_coordinators(s);
    return st;
}

static int supervisor_stop_signal(const sv *s) { return s->sig_stop; }

static const sv__role supervisor_role = {
    .setup = supervisor_setup,
    .open_mailbox = supervisor_open_mailbox,
    .on_message = supervisor_on_message,
    .tick = supervisor_tick,
    .worker_exited = supervisor_worker_exited,
    .first_signal = supervisor_first_signal,
    .stop_signal = supervisor_stop_signal,
};

/* The options with their defaults, the process's log prefix, who this process is. */
static void init_options(sv *s, const sv_options *opt) {
    memset(s, 0, sizeof *s);
    s->o = *opt;
    if (!s->o.rendezvous_timeout_ms) s->o.rendezvous_timeout_ms = 120000;
    if (!s->o.heartbeat_interval_ms) s->o.heartbeat_interval_ms = 1000;
    if (!s->o.heartbeat_timeout_ms) s->o.heartbeat_timeout_ms = 30000;
    if (!s->o.kill_grace_ms) s->o.kill_grace_ms = 10000;
    if (s->o.nnodes < 1) s->o.nnodes = 1;
    s->status = -1;
    s->quarantine_rank = -1;
    s->evict_rank = -1;
    s->agent = s->o.nnodes > 1 && s->o.node_rank > 0;
    s->role = s->agent ? &sv__agent_role : &supervisor_role;
    if (s->agent) co_log_set_prefix("cohort node agent %d", s->o.node_rank);
    else co_log_set_prefix("cohort supervisor");
    /* (several nodes: every node's agent replaces its workers on the supervisor's order) */
    s->restart_enabled = s->o.restart;
    if (!s->o.restart_window_ms) s->o.restart_window_ms = 600000;
    s->no_proc_state = getenv("COHORT_TEST_NO_PROC_STATE") != NULL;
    if (!s->o.soft_timeout_ms) s->o.soft_timeout_ms = 60000;
    if (!s->o.hard_timeout_ms) s->o.hard_timeout_ms = 90000;
    if (!s->o.barrier_timeout_ms) s->o.barrier_timeout_ms = 120000;
    s->snd.job_id = s->o.job_id ? s->o.job_id : random_job_id();
    s->snd.generation = 1;
    s->snd.sender = s->agent ? PW_SENDER_UNASSIGNED : PW_SENDER_SUPERVISOR;
    /* the supervisor tracks every worker of the job, an agent its node's */
    s->nw = s->agent ? s->o.nproc : s->o.nproc * s->o.nnodes;
    /* (the job's processes, node-major; the last beyond the active world are warm spares) */
    int procs = s->o.nproc * s->o.nnodes;
    s->world = s->o.active_world > 0 && s->o.active_world < procs ? s->o.active_world : procs;
}

/* How the job ended (supervisor.h's statuses), once the loop is over; rc: the loop's error. */
static int final_status(sv *s, int rc) {
    int status = rc ? SV_EXIT_FAILURE : s->status >= 0 ? s->status : s->first_failure ? s->first_failure : SV_EXIT_OK;
    if (!rc && s->status < 0 && !s->first_failure) {
        /* every worker exited on its own: a clean end only if all exited 0 */
        for (int i = 0; i < s->nw; i++)
            if (s->w[i].rank >= 0 && (s->w[i].exit_status || s->w[i].term_signal)) status = SV_EXIT_WORKER_FAILED;
    }
    /* a clean stop for preemption: saved, but not done (the scheduler requeues the job) */
    int stop_sig = s->role->stop_signal(s);
    if (status == SV_EXIT_OK && stop_sig && sv_preempting_signal(stop_sig, s->o.requeue_on_sigterm)) {
        status = SV_EXIT_PREEMPTED;
        co_log(CO_LOG_INFO, "stopped for preemption (%s): exit %d, requeue the job to resume from --load",
               strsignal(stop_sig), SV_EXIT_PREEMPTED);
    }
    return status;
}

/* The run report on stderr and into --run-report (whose directory a job stopped before its
 * first save has not made yet). */
static void write_run_report(sv *s, int status) {
    if (!s->val) return;
    if (s->o.report_file && *s->o.report_file) {
        char dir[1100];
        snprintf(dir, sizeof dir, "%s", s->o.report_file);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = '\0';
            if (access(dir, F_OK)) fs_mkdirs(dir);
        }
    }
    if (svv_write_report(s->val, stderr, s->o.report_file, status, (double)(sv__now_ms() - s->t_start) / 1000.0))
        co_log(CO_LOG_WARN, "%s", co_err_detail());
}

int sv_run(const sv_options *opt) {
    sv s;
    init_options(&s, opt);
    int st = load_job_secret(&s);
    if (!st) st = init_slots(&s);
    s.t_start = sv__now_ms();
    if (!st && s.role->setup) st = s.role->setup(&s);
    if (st) {
        release(&s);
        return st;
    }
    ac_actor_opts ao = {.name = "supervisor", .on_start = sv_on_start, .on_stop = sv_on_stop, .ctx = &s};
    int rc = ac_actor_new(&ao, &s.a);
    if (!rc) rc = ac_actor_run(s.a);
    if (rc) co_log(CO_LOG_ERROR, "%s (%s)", co_err_detail(), co_strerror(rc));
    ac_actor_destroy(&s.a);
    svm_stop(&s.http); /* (Prometheus sees the job gone: its scrapes fail) */
    svc_destroy(&s.ckpt); /* every local worker is gone: unfinished saves' directories go */
    if (s.ipc_dir[0]) ac_ipc_dir_remove(s.ipc_dir);
    int status = final_status(&s, rc);
    write_run_report(&s, status);
    uint64_t dropped = pw_stats_dropped(&s.stats);
    if (dropped) co_log(CO_LOG_WARN, "dropped %" PRIu64 " malformed or foreign messages", dropped);
    release(&s);
    return status;
}
