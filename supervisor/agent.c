/* agent.c - the node agent's role (core.h): on a node other than node 0 it spawns that node's
 * workers (the shared core in supervisor.c), points them at node 0's supervisor, reports a
 * worker's death and a signal it received to the supervisor at once, heartbeats it, and exits
 * 75 when the supervisor stops the job for preemption. It assigns, validates and commits
 * nothing: the supervisor does. */
#include "supervisor/core.h"

#include "common/error.h"
#include "common/log.h"

#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* Connects to node 0's supervisor as "agentN". */
static int agent_open_mailbox(sv *s, ac_mailbox_opts *mo) {
    char id[32];
    snprintf(id, sizeof id, "agent%d", s->o.node_rank);
    snprintf(s->endpoint, sizeof s->endpoint, "tcp://%s:%d", s->o.master_addr, s->o.master_port);
    return ac_mailbox_connect(s->a, s->endpoint, id, mo, &s->mb);
}

/* From the supervisor: the job stops for preemption (its begin_signal_stop), so this node's
 * process exits 75 too (an Indexed Job restarts only the pods that did not exit 0). */
static void agent_on_message(sv *s, ac_mailbox *mb, const ac_msg *m, const pw_msg *msg) {
    (void)mb;
    (void)m;
    if (!msg) return;
    const Cohort__V1__Envelope *e = msg->env;
    if (e->body_case == COHORT__V1__ENVELOPE__BODY_PREEMPT && !s->agent_sig) {
        int sig = e->preempt->signal;
        if (sig == SIGTERM || sig == SIGUSR1) s->agent_sig = sig;
    }
}

static void agent_tick(sv *s, uint64_t now) {
    (void)now;
    Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
    sv__send(s->mb, NULL, &s->snd, &hb.base);
}

/* A worker of this node exited: killed by a signal while the agent itself was being stopped
 * by one (a stop, not a crash), or failed: the supervisor is told at once and stops the job;
 * this node's other workers are killed after the grace. */
static void agent_worker_exited(sv *s, worker *w, int64_t status, int term_signal) {
    if ((term_signal == SIGINT || term_signal == SIGTERM || term_signal == SIGUSR1) && s->signals) {
        co_log(CO_LOG_WARN, "rank %d (pid %u) was killed by %s during the stop", w->rank, w->pid,
               strsignal(term_signal));
        if (!s->first_failure) s->first_failure = 128 + term_signal;
        return;
    }
    if ((!term_signal && status == 0) || s->first_failure) return;
    char why[256];
    int st = sv__rank_failure(s, w, status, term_signal, why, sizeof why);
    s->first_failure = st;
    co_log(CO_LOG_WARN, "%s", why);
    Cohort__V1__Abort ab = COHORT__V1__ABORT__INIT;
    ab.generation = s->snd.generation;
    ab.reason = why;
    ab.has_failed_rank = 1;
    ab.failed_rank = (uint32_t)w->rank;
    ab.has_error_code = 1;
    ab.error_code = st;
    sv__send(s->mb, NULL, &s->snd, &ab.base);
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
