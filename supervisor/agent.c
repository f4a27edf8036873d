/* agent.c - the node agent's role (core.h): on a node other than node 0 it spawns that node's
 * workers (the shared core in supervisor.c), points them at node 0's supervisor, reports a
 * worker's exit, a stopped worker (it reads its own processes' state) and a signal it received
 * to the supervisor at once, heartbeats it, and carries out the supervisor's orders for its
 * slots during an in-process restart (kill a hung or silent worker, start a replacement). It
 * exits 75 when the supervisor stops the job for preemption, and stops its workers and exits 8
 * when it hears nothing from the supervisor for the heartbeat timeout (its node is lost). It
 * assigns, validates and commits nothing: the supervisor does. */
#include "supervisor/core.h"

#include "common/error.h"
#include "common/log.h"

#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* How often the agent reads its workers' process state (a stopped one is reported at once). */
#define AGENT_PROC_POLL_MS 100

int sv__send_slot_event(sv *s, int kind, const worker *w, const char *reason) {
    Cohort__V1__SlotEvent ev = COHORT__V1__SLOT_EVENT__INIT;
    ev.kind = (Cohort__V1__SlotEvent__Kind)kind;
    ev.slot = (uint32_t)w->index;
    ev.has_pid = w->pid != 0;
    ev.pid = w->pid;
    if (kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_EXITED) {
        ev.has_exit_status = ev.has_term_signal = 1;
        ev.exit_status = (int32_t)w->exit_status;
        ev.term_signal = w->term_signal;
    }
    ev.reason = (char *)reason;
    ev.has_spare = kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_RESPAWN;
    ev.spare = w->rank < 0;
    if (s->agent) return sv__send(s->mb, NULL, &s->snd, &ev.base);
    return sv__agent_send(s, w->index / s->o.nproc, &ev.base);
}

/* This node's slot of a SlotEvent (NULL: not this node's). */
static worker *agent_slot(sv *s, uint32_t slot) {
    int i = (int)slot - s->o.node_rank * s->o.nproc;
    return i >= 0 && i < s->nw ? &s->w[i] : NULL;
}

static bool agent_running(const worker *w) { return w->state == SVP_STARTED || svp_alive(w->state); }

/* An agent does not end while a failed slot awaits the supervisor's order. */
static void agent_sync_restarting(sv *s) {
    bool awaiting = false;
    for (int i = 0; i < s->nw; i++) awaiting = awaiting || s->w[i].replacing;
    s->restarting = awaiting;
}

/* The supervisor's order for slot w: kill its process (hung, stopped or silent), or start a
 * new one (now, or once the old one is gone). */
static void agent_order(sv *s, worker *w, const Cohort__V1__SlotEvent *ev) {
    const char *why = ev->reason && *ev->reason ? ev->reason : "the supervisor's order";
    if (ev->kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_KILL) {
        if (!agent_running(w) || (ev->has_pid && ev->pid && ev->pid != w->pid)) return; /* gone already */
        co_log(CO_LOG_WARN, "killing worker %d (pid %u): %s", w->index, w->pid, why);
        uv_process_kill(&w->proc, SIGKILL);
    } else if (ev->kind == COHORT__V1__SLOT_EVENT__KIND__SLOT_RESPAWN && !s->stopping) {
        w->replacing = false;
        agent_sync_restarting(s);
        w->rank = ev->has_spare && ev->spare ? -1 : w->index; /* (a warm spare waits for a rank) */
        co_log(CO_LOG_INFO, "starting a %s in slot %d: %s", w->rank < 0 ? "warm spare" : "replacement", w->index, why);
        if (w->state == SVP_EXITING) {
            sv__w_set(w, SVP_RESPAWN); /* started once its handle is closed */
        } else if (w->state == SVP_EXITED || w->state == SVP_EMPTY) {
            if (sv__spawn_one(s, w)) {
                co_log(CO_LOG_ERROR, "%s", co_err_detail());
                sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_EXITED, w, "could not start a replacement");
            }
        } else {
            w->respawn_ordered = true; /* still running: replaced once it exits */
            uv_process_kill(&w->proc, SIGKILL);
        }
    }
}

/* The supervisor stops the job: this node's workers hear it themselves; a failure's status is
 * this process's too, and what is left after the grace is killed. */
static void agent_shutdown(sv *s, const Cohort__V1__Shutdown *sd) {
    if (s->stopping) return;
    s->stopping = true;
    for (int i = 0; i < s->nw; i++) s->w[i].replacing = false;
    agent_sync_restarting(s);
    if (sd->exit_status != 0 && s->status < 0) s->status = sd->exit_status;
    if (sd->exit_status != 0)
        co_log(CO_LOG_ERROR, "the supervisor stops this node: %s (exit %d)", sd->reason ? sd->reason : "the job failed",
               sd->exit_status);
    ac_timer_start(s->a, (uint64_t)s->o.kill_grace_ms, 0, sv__kill_remaining, s, &s->kill_timer);
    sv__maybe_finish(s);
}

static void agent_poll(ac_timer *t, void *ctx);

/* Connects to node 0's supervisor as "agentN"; reads its workers' process state every
 * AGENT_PROC_POLL_MS. */

static int agent_open_mailbox(sv *s, ac_mailbox_opts *mo) {
    /* "agentN.X": X tells this agent from a lost one of the same node, which the supervisor
     * refuses once another took its place */
    char id[64];
    uint32_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) nonce = (uint32_t)sv__now_ms();
    snprintf(id, sizeof id, "agent%d.%d.%08x", s->o.node_rank, (int)getpid(), nonce);
    snprintf(s->endpoint, sizeof s->endpoint, "tcp://%s:%d", s->o.master_addr, s->o.master_port);
    int rc = ac_mailbox_connect(s->a, s->endpoint, id, mo, &s->mb);
    if (!rc) { /* known to the supervisor at once (its orders, its stop reach this agent) */
        Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
        sv__send(s->mb, NULL, &s->snd, &hb.base);
    }
    if (!rc && !s->no_proc_state) rc = ac_timer_start(s->a, AGENT_PROC_POLL_MS, AGENT_PROC_POLL_MS, agent_poll, s,
                                                        &s->poll_timer);
    return rc;
}

/* From the supervisor: heartbeats (it lives), the job's stop for preemption (its
 * begin_signal_stop: this node's process exits 75 too, as an Indexed Job restarts only the pods
 * that did not exit 0), the job's end, and orders for this node's slots. */
static void agent_on_message(sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg) {
    (void)mb;
    (void)m;
    if (!msg) return;
    s->sup_heard_ms = sv__now_ms();
    const Cohort__V1__Envelope *e = msg->env;
    if (e->body_case == COHORT__V1__ENVELOPE__BODY_PREEMPT && !s->agent_sig) {
        int sig = e->preempt->signal;
        if (sig == SIGTERM || sig == SIGUSR1) s->agent_sig = sig;
    } else if (e->body_case == COHORT__V1__ENVELOPE__BODY_SHUTDOWN) {
        agent_shutdown(s, e->shutdown);
    } else if (e->body_case == COHORT__V1__ENVELOPE__BODY_SLOT_EVENT) {
        worker *w = agent_slot(s, e->slot_event->slot);
        if (w) agent_order(s, w, e->slot_event);
    }
}

/* Its workers' process state: a stopped one (SIGSTOP, a debugger) is reported at once, and
 * again when it runs on (the supervisor replaces a stopped rank at the restart barrier). */
static void agent_poll(ac_timer *t, void *ctx) {
    (void)t;
    sv *s = ctx;
    for (int i = 0; i < s->nw && !s->stopping; i++) {
        worker *w = &s->w[i];
        if (!agent_running(w) || !w->pid) continue;
        bool stopped = sv__process_stopped((pid_t)w->pid);
        if (stopped == (w->stopped_pid == w->pid)) continue;
        w->stopped_pid = stopped ? w->pid : 0;
        char why[160];
        snprintf(why, sizeof why, "worker %d (pid %u) is %s", w->index, w->pid,
                 stopped ? "stopped (process state T)" : "running again");
        if (stopped) co_log(CO_LOG_WARN, "%s", why);
        sv__send_slot_event(s, stopped ? COHORT__V1__SLOT_EVENT__KIND__SLOT_STOPPED
                                       : COHORT__V1__SLOT_EVENT__KIND__SLOT_CONTINUED, w, why);
    }
}

/* The supervisor's node is lost: its workers cannot be validated or commit a checkpoint
 * without it, so they are killed at once (the last committed checkpoint stays as it is). */
static void agent_supervisor_lost(sv *s, uint64_t now) {
    s->sup_lost = true;
    if (s->sup_heard_ms)
        co_log(CO_LOG_ERROR, "no word from the supervisor at %s for %.1f s (--inprocess-heartbeat-timeout %.1f s): "
               "node 0 is lost; stopping this node's workers (the last checkpoint in --save is intact; exit %d)",
               s->endpoint, (double)(now - s->sup_heard_ms) / 1000, (double)s->o.heartbeat_timeout_ms / 1000,
               SV_EXIT_SUPERVISOR_LOST);
    else
        co_log(CO_LOG_ERROR, "the supervisor at %s was never heard from in %.1f s (--rendezvous-timeout): stopping "
               "this node's workers (exit %d)", s->endpoint, (double)(now - s->t_start) / 1000, SV_EXIT_SUPERVISOR_LOST);
    s->status = SV_EXIT_SUPERVISOR_LOST;
    s->stopping = true;
    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[i];
        w->replacing = false;
        if (!agent_running(w)) continue;
        co_log(CO_LOG_WARN, "killing worker %d (pid %u)", w->index, w->pid);
        uv_process_kill(&w->proc, SIGKILL);
    }
    agent_sync_restarting(s);
    sv__maybe_finish(s);
}

static void agent_tick(sv *s, uint64_t now) {
    Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
    sv__send(s->mb, NULL, &s->snd, &hb.base);
    if (s->sup_lost) return;
    /* (before the supervisor is first heard from, its node may still be starting: the
     * rendezvous timeout) */
    uint64_t limit = s->sup_heard_ms ? (uint64_t)s->o.heartbeat_timeout_ms : (uint64_t)s->o.rendezvous_timeout_ms;
    uint64_t since = s->sup_heard_ms ? s->sup_heard_ms : s->t_start;
    if (now > since && now - since > limit) agent_supervisor_lost(s, now);
}

/* A worker of this node exited: killed by a signal while the agent itself was being stopped
 * by one (a stop, not a crash), or failed: the supervisor is told at once and decides (an
 * in-process restart orders a replacement here; otherwise the job stops and this node's
 * other workers are killed after the grace). */
static void agent_worker_exited(sv *s, worker *w, int64_t status, int term_signal) {
    if ((term_signal == SIGINT || term_signal == SIGTERM || term_signal == SIGUSR1) && s->signals) {
        co_log(CO_LOG_WARN, "rank %d (pid %u) was killed by %s during the stop", w->rank, w->pid,
               strsignal(term_signal));
        if (!s->first_failure) s->first_failure = 128 + term_signal;
        return;
    }
    w->stopped_pid = 0;
    if (w->respawn_ordered) { /* killed on the supervisor's order to be replaced */
        w->respawn_ordered = false;
        sv__w_set(w, SVP_RESPAWN);
    }
    if (!term_signal && status == 0 && !s->sup_lost) { /* its end: the supervisor lets the spares go after the last */
        sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_EXITED, w, "finished");
        return;
    }
    /* (once the job stops, its workers' ends are the stop's, not failures) */
    if (s->first_failure || s->sup_lost || s->stopping) return;
    char why[256];
    int st = sv__rank_failure(s, w, status, term_signal, why, sizeof why);
    co_log(CO_LOG_WARN, "%s", why);
    sv__send_slot_event(s, COHORT__V1__SLOT_EVENT__KIND__SLOT_EXITED, w, why);
    /* the supervisor decides: a replacement, or the job's end; awaited while it lives (its
     * silence ends the wait), unless the failure is one it never restarts (flags or data
     * refused, a reproducible NaN) */
    bool curable = term_signal || (status != SV_EXIT_USAGE && status != SV_EXIT_NAN);
    if (s->restart_enabled && !s->stopping && s->sup_heard_ms && curable) {
        if (w->state != SVP_RESPAWN) {
            w->replacing = true; /* until the supervisor orders its replacement or stops the job */
            agent_sync_restarting(s);
        }
        return;
    }
    s->first_failure = st;
    ac_timer_start(s->a, (uint64_t)s->o.kill_grace_ms, 0, sv__kill_remaining, s, &s->kill_timer);
}

/* The agent tells the supervisor, which orders every rank to stop after its step. It does
 * not pass the signal on to its workers: a scheduler (Slurm's scancel, srun forwarding a
 * signal) signals every process of the step, and a forwarded copy would reach a worker as a
 * second signal, which kills it. */
static void agent_first_signal(sv *s, int signum) {
    s->agent_sig = signum;
    co_log(CO_LOG_INFO, "%s: asking the supervisor to stop the job", strsignal(signum));
    char text[200];
    snprintf(text, sizeof text, "%s received by node agent %d (pid %d)", strsignal(signum), s->o.node_rank,
             (int)getpid());
    Cohort__V1__SignalReceived sr = COHORT__V1__SIGNAL_RECEIVED__INIT;
    sr.signal = signum;
    sr.what = text;
    sv__send(s->mb, NULL, &s->snd, &sr.base);
}

/* Its own signal or the supervisor's preemption order: the exit is 75 if it was one. */
static int agent_stop_signal(const sv *s) { return s->agent_sig; }

const sv__role sv__agent_role = {
    .open_mailbox = agent_open_mailbox,
    .on_message = agent_on_message,
    .tick = agent_tick,
    .worker_exited = agent_worker_exited,
    .first_signal = agent_first_signal,
    .stop_signal = agent_stop_signal,
};
