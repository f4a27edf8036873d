/* link.c - the worker's mailbox thread: registers with the supervisor, waits for the
 * assignment, sends heartbeats and log lines, and turns the supervisor's Shutdown and
 * Abort orders (or its silence) into the stop flag and an aborted communicator. */
#include "worker/link.h"

#include "actors/actor.h"
#include "common/error.h"
#include "common/log.h"
#include "supervisor/msg.h"
#include "resilience/rerun.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define LINK_HEARTBEAT_MS 1000
#define LINK_SILENCE_MS 30000

struct sv_link {
    ac_actor *a;
    ac_mailbox *mb;
    sv__sender snd;
    int local_rank, node_rank;
    const char *config_json;           /* the caller's, for the registration (NULL: none) */
    char endpoint[400], identity[64], data_endpoint[400];
    ac_secret secret;
    bool have_secret;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool assigned, goodbye_done;
    sv_assignment asg;
    int asg_rc;
    volatile sig_atomic_t *stop;
    volatile sig_atomic_t *signalled;  /* this process's first SIGINT/SIGTERM (0: none; NULL: not watched) */
    bool signal_reported;              /* told the supervisor (link thread only) */
    bool stop_ordered;                 /* the supervisor's Shutdown with status 0, under mu */
    bool verdicts_end;                 /* ... one for another reason than a signal: the supervisor
                                          stops validating (a signal's stop is validated to its end) */
    ac_timer *sig_timer;
    _Atomic int64_t iteration;
    _Atomic int waiting_on;  /* sv_link_waiting: -1 when not waiting for a pipeline peer */
    _Atomic uint64_t waiting_since_ms;
    _Atomic uint64_t last_heard_ms;
    bool lost_reported;
    int silence_ms;                    /* the supervisor's silence that stops this worker */
    pid_t parent;                      /* the local supervisor's pid, when the link opened */
    ac_timer *hb;
    pw_stats stats;
    FILE *log, *metrics;
    char *inject[16];                  /* specs from `cohort inject`, under mu */
    int ninject;
    /* in-process restart (sv_link_await_restart), under mu */
    volatile sig_atomic_t *abort_flag; /* NULL: restart disabled, an Abort stops the worker */
    uint64_t pending_gen;              /* the newest Abort's generation */
    uint64_t gen;                      /* the generation this worker runs in */
    bool have_restart;
    sv_assignment restart_asg;
    /* the rerun state machine's verdicts (sv_link_verdict), under mu */
    rr_verdict verdict;
    bool have_verdict;
    Cohort__V1__LossReport *last_report[1]; /* the last round sent (one message), for resending */
    int nlast;
    Cohort__V1__ParamsChecksum last_sum; /* the round's parameter checksums (have_sum), resent with it */
    bool have_sum;
    /* checkpoint commit (sv_link_checkpoint_*): the supervisor's last answer, under mu */
    int64_t ckpt_iteration;
    int ckpt_phase;
    bool saves_stopped;       /* a COMMIT said the save directory is running out of space */
    bool aborted;             /* the job was aborted or the supervisor lost */
    void (*abort_fn)(void *ctx); /* sv_link_attach_abort, under mu */
    void *abort_ctx;
};

static void free_round(sv_link *l);

/* Waits on the link's condition (mu held) for at most ms: the waits below re-check their
 * conditions (abort, stop, deadlines) in slices. */
static void wait_slice(sv_link *l, long ms) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += ms * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&l->cv, &l->mu, &dl);
}

bool sv_link_wanted(void) { return getenv("COHORT_SUPERVISOR") != NULL; }

void sv_link_data_options(sv_link *l, cm_zmq_options *o) {
    cm_zmq_options_default(o);
    /* a generation's communicators are built before the link can abort them (they are
     * attached once made): the Abort of a newer generation reaches them through the flag
     * instead, so that a rank still connecting to a peer that died goes to the barrier */
    if (l) o->cancel = l->abort_flag;
    if (!l || !l->have_secret) return;
    o->curve_server_public = l->secret.server_public;
    o->curve_server_secret = l->secret.server_secret;
    o->curve_client_secret = l->secret.client_secret;
}

void sv_assignment_free(sv_assignment *a) {
    if (a->endpoints)
        for (int r = 0; r < a->world; r++) free(a->endpoints[r]);
    free(a->endpoints);
    a->endpoints = NULL;
    free(a->checkpoint_dir);
    a->checkpoint_dir = NULL;
}

static void abort_all(sv_link *l) {
    *l->stop = 1;
    /* the communicators, and a worker still waiting for its assignment (or a checkpoint's
     * commit) gives up now */
    pthread_mutex_lock(&l->mu);
    if (l->abort_fn) l->abort_fn(l->abort_ctx);
    l->aborted = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Fills a from an Assign (the first one, or a Restart's). */
static int parse_assignment(const Cohort__V1__Assign *as, sv_assignment *a) {
    memset(a, 0, sizeof *a);
    if (as->world_size < 1 || as->rank >= as->world_size || as->n_peers != as->world_size || !as->topology)
        return co_err_set(CO_EPROTOCOL, "supervisor sent an inconsistent assignment");
    a->rank = (int)as->rank;
    a->world = (int)as->world_size;
    a->tp = (int)as->topology->tp;
    a->pp = (int)as->topology->pp;
    a->cp = (int)as->topology->cp;
    a->dp = (int)as->topology->dp;
    a->ep = as->topology->has_ep && as->topology->ep ? (int)as->topology->ep : 1;
    a->etp = as->topology->has_etp && as->topology->etp ? (int)as->topology->etp : a->tp;
    a->tp_pp_dp = as->topology->has_tp_pp_dp && as->topology->tp_pp_dp;
    a->emb_stages = as->topology->has_emb_stages ? as->topology->emb_stages : 0;
    if (a->tp < 1 || a->pp < 1 || a->cp < 1 || a->dp < 1 || (int64_t)a->tp * a->pp * a->cp * a->dp != a->world)
        return co_err_set(CO_EPROTOCOL, "assignment: layout tp %d x cp %d x dp %d x pp %d is not the world of %d",
                          a->tp, a->cp, a->dp, a->pp, a->world);
    if (as->has_nccl_unique_id) {
        if (as->nccl_unique_id.len != sizeof a->nccl_id)
            return co_err_set(CO_EPROTOCOL, "assignment: an NCCL unique id of %zu bytes", as->nccl_unique_id.len);
        memcpy(a->nccl_id, as->nccl_unique_id.data, sizeof a->nccl_id);
        a->have_nccl_id = true;
    }
    if (as->coords) {
        a->coords = (topo_coord){(int)as->coords->tp, (int)as->coords->cp, (int)as->coords->dp, (int)as->coords->pp, 0};
        a->have_coords = true;
    }
    a->job_id = as->job_id;
    a->generation = as->generation;
    a->start_iteration = as->has_start_iteration ? (int64_t)as->start_iteration : 0;
    a->state_source = as->has_state_source ? as->state_source : -1;
    a->faults_through = as->has_faults_through ? (int64_t)as->faults_through : 0;
    if (as->checkpoint_dir && *as->checkpoint_dir && !(a->checkpoint_dir = strdup(as->checkpoint_dir))) return CO_ENOMEM;
    if (a->state_source >= a->world) return co_err_set(CO_EPROTOCOL, "assignment: state source %d", a->state_source);
    a->endpoints = calloc((size_t)a->world, sizeof *a->endpoints);
    if (!a->endpoints) return CO_ENOMEM;
    for (size_t i = 0; i < as->n_peers; i++) {
        uint32_t r = as->peers[i]->rank;
        if (r >= (uint32_t)a->world || a->endpoints[r]) {
            sv_assignment_free(a);
            return co_err_set(CO_EPROTOCOL, "supervisor's assignment lists rank %u twice or out of range", r);
        }
        if (!(a->endpoints[r] = strdup(as->peers[i]->endpoint))) {
            sv_assignment_free(a);
            return CO_ENOMEM;
        }
    }
    return 0;
}

static void take_assignment(sv_link *l, const Cohort__V1__Assign *as) {
    int rc = parse_assignment(as, &l->asg);
    if (!rc) {
        l->snd.sender = (uint32_t)l->asg.rank;
        l->snd.generation = l->asg.generation;
        l->snd.seq = 0;
    }
    pthread_mutex_lock(&l->mu);
    l->assigned = true;
    l->asg_rc = rc;
    if (!rc) l->gen = l->asg.generation;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* An Abort of a newer generation with restart enabled: unwind, do not stop. */
static void take_abort(sv_link *l, const Cohort__V1__Abort *ab) {
    if (!l->abort_flag || ab->generation <= l->snd.generation) {
        abort_all(l);
        return;
    }
    __atomic_store_n(l->abort_flag, 1, __ATOMIC_RELEASE); /* read by other threads (cm_zmq_options.cancel) */
    pthread_mutex_lock(&l->mu);
    if (l->abort_fn) l->abort_fn(l->abort_ctx);
    if (ab->generation > l->pending_gen) l->pending_gen = ab->generation;
    l->aborted = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void take_restart(sv_link *l, const Cohort__V1__Restart *rs) {
    sv_assignment a;
    int rc = parse_assignment(rs->assignment, &a);
    pthread_mutex_lock(&l->mu);
    if (!rc && rs->new_generation == l->pending_gen && a.generation == rs->new_generation) {
        sv_assignment_free(&l->restart_asg);
        l->restart_asg = a;
        l->have_restart = true;
        pthread_cond_broadcast(&l->cv);
    } else if (!rc) {
        sv_assignment_free(&a); /* an older restart than the abort we are answering */
    }
    pthread_mutex_unlock(&l->mu);
}

static void take_verdict(sv_link *l, const Cohort__V1__Verdict *vd) {
    pthread_mutex_lock(&l->mu);
    rr_verdict *v = &l->verdict;
    memset(v, 0, sizeof *v);
    v->iteration = (int64_t)vd->iteration;
    v->decision = (rr_decision)vd->decision;
    v->attempt = vd->has_attempt ? (int)vd->attempt : 0;
    v->suspect = vd->has_suspect ? vd->suspect : -1;
    v->helper = vd->has_helper ? vd->helper : -1;
    v->save = vd->has_save && vd->save;
    v->diagnosis = RR_DIAG_NONE;
    if (vd->diagnosis)
        for (int d = RR_DIAG_CORRECT; d <= RR_DIAG_PERSISTENT; d++)
            if (!strcmp(vd->diagnosis, rr_diagnosis_name((rr_diagnosis)d))) v->diagnosis = (rr_diagnosis)d;
    snprintf(v->reason, sizeof v->reason, "%s", vd->reason ? vd->reason : "");
    l->have_verdict = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void on_message(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    (void)mb;
    sv_link *l = ctx;
    pw_msg *msg = sv__decode(m, l->snd.job_id, 0, &l->stats);
    if (!msg) return;
    atomic_store(&l->last_heard_ms, sv__now_ms());
    Cohort__V1__Envelope *e = msg->env;
    switch (e->body_case) {
    case COHORT__V1__ENVELOPE__BODY_ASSIGN:
        if (!l->assigned) take_assignment(l, e->assign);
        break;
    case COHORT__V1__ENVELOPE__BODY_SHUTDOWN:
        /* status 0: finish the current step and stop; otherwise the job failed: abort now */
        if (e->shutdown->exit_status == 0) {
            *l->stop = 1;
            pthread_mutex_lock(&l->mu); /* wakes a worker still waiting for its assignment */
            l->stop_ordered = true;
            if (!e->shutdown->reason || strcmp(e->shutdown->reason, "signal")) l->verdicts_end = true;
            pthread_cond_broadcast(&l->cv);
            pthread_mutex_unlock(&l->mu);
        } else {
            abort_all(l);
        }
        break;
    case COHORT__V1__ENVELOPE__BODY_ABORT: take_abort(l, e->abort); break;
    case COHORT__V1__ENVELOPE__BODY_RESTART: take_restart(l, e->restart); break;
    case COHORT__V1__ENVELOPE__BODY_INJECT_FAULT: /* `cohort inject`, through the supervisor */
        for (size_t i = 0; i < e->inject_fault->n_params; i++)
            if (!strcmp(e->inject_fault->params[i]->key, "spec")) {
                pthread_mutex_lock(&l->mu);
                if (l->ninject < 16 && (l->inject[l->ninject] = strdup(e->inject_fault->params[i]->value))) l->ninject++;
                pthread_mutex_unlock(&l->mu);
            }
        break;
    case COHORT__V1__ENVELOPE__BODY_VERDICT: take_verdict(l, e->verdict); break;
    case COHORT__V1__ENVELOPE__BODY_CHECKPOINT_COMMAND: /* the supervisor's COMMIT or ABORT */
        pthread_mutex_lock(&l->mu);
        l->ckpt_iteration = (int64_t)e->checkpoint_command->iteration;
        l->ckpt_phase = (int)e->checkpoint_command->phase;
        if (e->checkpoint_command->has_saves_stopped && e->checkpoint_command->saves_stopped)
            l->saves_stopped = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        break;
    default: break;
    }
    pw_msg_free(&msg);
}

static void heartbeat_tick(ac_timer *t, void *ctx) {
    (void)t;
    sv_link *l = ctx;
    Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
    hb.iteration = (uint64_t)atomic_load(&l->iteration);
    int waiting = atomic_load(&l->waiting_on);
    if (waiting >= 0) {
        uint64_t since = atomic_load(&l->waiting_since_ms), now = sv__now_ms();
        hb.has_waiting_on = 1;
        hb.waiting_on = waiting;
        hb.has_waiting_ms = 1;
        hb.waiting_ms = (uint32_t)(now > since && now - since < UINT32_MAX ? now - since : 0);
    }
    sv__send(l->mb, NULL, &l->snd, &hb.base);
    if (!l->lost_reported && sv__now_ms() - atomic_load(&l->last_heard_ms) > (uint64_t)l->silence_ms) {
        l->lost_reported = true;
        fprintf(stderr, "cohort worker %d: no word from the supervisor for %.1f s; stopping\n", l->local_rank,
                (double)l->silence_ms / 1000);
        abort_all(l);
    }
}

/* A SIGINT/SIGTERM this worker got itself (a scheduler's, or one sent to it alone): the
 * supervisor is told at once, so that the whole job stops after the same step (the ranks'
 * stop vote does that anyway) and this worker's death by a second signal is not taken for a
 * crash: a SignalReceived message (supervisor.c). */
static void signal_tick(ac_timer *t, void *ctx) {
    (void)t;
    sv_link *l = ctx;
    /* the local supervisor's death (where PR_SET_PDEATHSIG did not end this process first):
     * nothing can validate a stop any more; without this a worker waiting for a verdict would
     * wait for the silence check's 30 s */
    if (!l->lost_reported && getppid() != l->parent) {
        l->lost_reported = true;
        fprintf(stderr, "cohort worker %d: the supervisor (pid %d) died; stopping\n", l->local_rank, (int)l->parent);
        abort_all(l);
        return;
    }
    int sig = l->signalled ? *l->signalled : 0;
    if (!sig || l->signal_reported) return;
    l->signal_reported = true;
    char text[200];
    snprintf(text, sizeof text, "%s received by worker %d (pid %d)", strsignal(sig), l->local_rank, (int)getpid());
    Cohort__V1__SignalReceived sr = COHORT__V1__SIGNAL_RECEIVED__INIT;
    sr.signal = sig;
    sr.what = text;
    sv__send(l->mb, NULL, &l->snd, &sr.base);
}

/* Test hook: COHORT_TEST_REGISTER_DELAY="LOCAL_RANK:MS,..." delays that worker's
 * registration, so tests can start ranks in any order and kill one mid-rendezvous. */
static void test_register_delay(int local_rank) {
    const char *spec = getenv("COHORT_TEST_REGISTER_DELAY");
    while (spec && *spec) {
        int r, ms, n = 0;
        if (sscanf(spec, "%d:%d%n", &r, &ms, &n) != 2) return;
        if (r == local_rank && ms > 0) usleep((useconds_t)ms * 1000);
        spec += n;
        if (*spec == ',') spec++;
    }
}

static int link_on_start(ac_actor *a, void *ctx) {
    sv_link *l = ctx;
    l->a = a;
    test_register_delay(l->local_rank);
    ac_mailbox_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.on_message = on_message;
    mo.ctx = l;
    mo.secret = l->have_secret ? &l->secret : NULL;
    int rc = ac_mailbox_connect(a, l->endpoint, l->identity, &mo, &l->mb);
    if (rc) return rc;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    Cohort__V1__Register r = COHORT__V1__REGISTER__INIT;
    r.hostname = host;
    r.pid = (uint32_t)getpid();
    r.local_rank = (uint32_t)l->local_rank;
    r.node_rank = (uint32_t)l->node_rank;
    r.data_endpoint = l->data_endpoint;
    if (l->config_json) {
        r.has_config_json = 1;
        r.config_json.data = (uint8_t *)l->config_json;
        r.config_json.len = strlen(l->config_json);
    }
    rc = sv__send(l->mb, NULL, &l->snd, &r.base);
    if (!rc) rc = ac_timer_start(a, LINK_HEARTBEAT_MS, LINK_HEARTBEAT_MS, heartbeat_tick, l, &l->hb);
    if (!rc) rc = ac_timer_start(a, 50, 50, signal_tick, l, &l->sig_timer);
    if (!rc) signal_tick(NULL, l); /* one that came during setup, before the link */
    return rc;
}

int sv_link_open(sv_link **out, volatile sig_atomic_t *stop, volatile sig_atomic_t *signalled, int timeout_ms,
                 const char *config_json, sv_assignment *asg) {
    *out = NULL;
    memset(asg, 0, sizeof *asg);
    const char *ep = getenv("COHORT_SUPERVISOR"), *job = getenv("COHORT_JOB_ID"), *lr = getenv("COHORT_LOCAL_RANK");
    const char *dir = getenv("COHORT_IPC_DIR");
    if (!ep || !job || !lr || !dir) return co_err_set(CO_EINVAL, "worker: COHORT_SUPERVISOR/JOB_ID/LOCAL_RANK/IPC_DIR not set");
    /* a local worker must not outlive its supervisor or node agent. SIGKILL, not SIGTERM: the
     * signal comes when the thread that started this process ends, which while a killed
     * agent's threads end one by one is before getppid() changes, and a SIGTERM would then
     * read as a stop request to the job (signal_tick) rather than the node's loss */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pid_t parent = getppid();
    if (parent == 1) return co_err_set(CO_EREMOTE, "worker: the supervisor is already gone");
    sv_link *l = calloc(1, sizeof *l);
    if (!l) return CO_ENOMEM;
    atomic_store(&l->waiting_on, -1);
    l->parent = parent;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->stop = stop;
    l->signalled = signalled;
    l->config_json = config_json;
    l->local_rank = atoi(lr);
    l->snd.job_id = strtoull(job, NULL, 16);
    l->snd.sender = PW_SENDER_UNASSIGNED;
    atomic_store(&l->last_heard_ms, sv__now_ms());
    snprintf(l->endpoint, sizeof l->endpoint, "%s", ep);
    const char *id = getenv("COHORT_WORKER_ID"), *node = getenv("COHORT_NODE_RANK");
    const char *data_ep = getenv("COHORT_DATA_ENDPOINT"), *secret = getenv("COHORT_JOB_SECRET");
    l->node_rank = node ? atoi(node) : 0;
    /* "w<slot>.<nonce>": its slot, and this process apart from an earlier one in that slot
     * (a lost node's worker that comes back is refused once its slot is another's) */
    uint32_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) nonce = (uint32_t)getpid();
    snprintf(l->identity, sizeof l->identity, "w%d.%08x", id ? atoi(id) : l->local_rank, nonce);
    const char *silence = getenv("COHORT_SILENCE_MS");
    l->silence_ms = silence && atoi(silence) > 0 ? atoi(silence) : LINK_SILENCE_MS;
    int rc = 0;
    if (data_ep && *data_ep) {
        snprintf(l->data_endpoint, sizeof l->data_endpoint, "%s", data_ep);
    } else {
        char name[64];
        snprintf(name, sizeof name, "data-%d", l->local_rank);
        rc = ac_ipc_endpoint(dir, name, l->data_endpoint, sizeof l->data_endpoint);
    }
    if (!rc && secret && *secret) {
        rc = ac_secret_load(secret, &l->secret);
        l->have_secret = rc == 0;
    }
    ac_actor_opts ao = {.name = "worker-link", .on_start = link_on_start, .ctx = l};
    if (!rc) rc = ac_actor_start(&ao, &l->a);
    if (rc) {
        sv_link_close(&l);
        return rc;
    }
    /* wait for the assignment */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&l->mu);
    /* a signal of this process's own does not end the wait (the supervisor, told by the
     * link, stops the whole job); the supervisor's stop order, an abort or its death does */
    while (!l->assigned && !l->stop_ordered && !l->aborted) {
        if (getppid() != parent) {
            l->aborted = true; /* the local supervisor is gone (a remote one: the silence check) */
            break;
        }
        if (timeout_ms < 0) {
            /* a warm spare: until a rank comes, or the supervisor goes (the silence check) */
            wait_slice(l, 200);
            continue;
        }
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (now.tv_sec > dl.tv_sec || (now.tv_sec == dl.tv_sec && now.tv_nsec >= dl.tv_nsec)) break;
        wait_slice(l, 200);
    }
    bool got = l->assigned, ordered = l->stop_ordered, aborted = l->aborted;
    rc = l->asg_rc;
    pthread_mutex_unlock(&l->mu);
    if (!got && ordered)
        rc = co_err_set(CO_EABORTED, "worker %d: the supervisor stopped the job before it began", l->local_rank);
    else if (!got && aborted)
        rc = co_err_set(CO_EREMOTE, "worker %d: the job failed or the supervisor went silent before the assignment",
                        l->local_rank);
    else if (!got)
        rc = co_err_set(CO_ETIMEOUT, "worker %d: no rank assignment from the supervisor", l->local_rank);
    if (rc) {
        sv_link_close(&l);
        return rc;
    }
    *asg = l->asg;
    l->asg.endpoints = NULL; /* the caller owns them now, and the checkpoint directory */
    l->asg.checkpoint_dir = NULL;
    *out = l;
    return 0;
}

void sv_link_attach_abort(sv_link *l, void (*abort)(void *ctx), void *ctx) {
    pthread_mutex_lock(&l->mu);
    l->abort_fn = abort;
    l->abort_ctx = ctx;
    pthread_mutex_unlock(&l->mu);
}

void sv_link_progress(sv_link *l, int64_t iteration) { atomic_store(&l->iteration, iteration); }
void sv_link_waiting(sv_link *l, int world_rank) {
    if (world_rank >= 0) atomic_store(&l->waiting_since_ms, sv__now_ms());
    atomic_store(&l->waiting_on, world_rank);
}

/* ---- checkpoint commit: acknowledgements out, the supervisor's answer in ---- */

uint64_t sv_link_job_id(const sv_link *l) { return l->snd.job_id; }

typedef struct ack_post {
    sv_link *l;
    Cohort__V1__CheckpointAck ack;
    Cohort__V1__FileInfo *fi;
    Cohort__V1__FileInfo **fp;
} ack_post;

static void send_ack(ac_actor *a, void *ctx) {
    (void)a;
    ack_post *p = ctx;
    p->ack.rank = p->l->snd.sender;
    int rc = sv__send(p->l->mb, NULL, &p->l->snd, &p->ack.base);
    if (rc) fprintf(stderr, "cohort worker %d: sending the checkpoint acknowledgement failed: %s\n", p->l->local_rank, co_strerror(rc));
    for (size_t i = 0; i < p->ack.n_files; i++) free(p->fi[i].path);
    free(p->ack.error);
    free(p->fi);
    free(p->fp);
    free(p);
}

int sv_link_checkpoint_ack(sv_link *l, int64_t iteration, int status, const char *error, const sv_file_info *files, int n) {
    ack_post *p = calloc(1, sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "checkpoint acknowledgement: out of memory");
    Cohort__V1__CheckpointAck init = COHORT__V1__CHECKPOINT_ACK__INIT;
    p->l = l;
    p->ack = init;
    p->ack.iteration = (uint64_t)iteration;
    p->ack.phase = COHORT__V1__CHECKPOINT_PHASE__CKPT_WRITE;
    p->ack.status = status;
    p->ack.has_rank = 1;
    p->fi = calloc((size_t)(n > 0 ? n : 1), sizeof *p->fi);
    p->fp = calloc((size_t)(n > 0 ? n : 1), sizeof *p->fp);
    bool ok = p->fi && p->fp && (!error || (p->ack.error = strndup(error, 2000)));
    for (int i = 0; ok && i < n; i++) {
        Cohort__V1__FileInfo fi = COHORT__V1__FILE_INFO__INIT;
        p->fi[i] = fi;
        p->fi[i].size = files[i].size;
        p->fi[i].checksum = files[i].checksum;
        ok = (p->fi[i].path = strdup(files[i].path)) != NULL;
        p->fp[i] = &p->fi[i];
        p->ack.n_files = (size_t)i + 1;
    }
    p->ack.files = p->fp;
    if (!ok || ac_post(l->a, send_ack, p)) {
        for (size_t i = 0; p->fi && i < p->ack.n_files; i++) free(p->fi[i].path);
        free(p->ack.error);
        free(p->fi);
        free(p->fp);
        free(p);
        return co_err_set(ok ? CO_EIO : CO_ENOMEM, "checkpoint acknowledgement: cannot post it to the link thread");
    }
    return 0;
}

int sv_link_checkpoint_wait(sv_link *l, int64_t iteration, int timeout_ms) {
    uint64_t deadline = sv__now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    int phase = 0;
    bool aborted = false;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->ckpt_iteration == iteration && l->ckpt_phase) phase = l->ckpt_phase;
        aborted = l->aborted;
        if (phase || aborted || sv__now_ms() >= deadline || getppid() != l->parent) break;
        /* wake at least every 200 ms: the supervisor (our parent) may have died */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 200 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&l->cv, &l->mu, &dl);
    }
    pthread_mutex_unlock(&l->mu);
    if (phase == COHORT__V1__CHECKPOINT_PHASE__CKPT_COMMIT) return 0;
    if (phase == COHORT__V1__CHECKPOINT_PHASE__CKPT_ABORT)
        return co_err_set(CO_EABORTED, "the supervisor aborted it (a rank failed or died; see the supervisor's message)");
    if (getppid() != l->parent) return co_err_set(CO_EREMOTE, "the supervisor went away before committing it");
    if (aborted) return co_err_set(CO_EABORTED, "the job was aborted before the supervisor committed it");
    return co_err_set(CO_ETIMEOUT, "no answer from the supervisor within %d s", timeout_ms / 1000);
}

bool sv_link_saves_stopped(sv_link *l) {
    pthread_mutex_lock(&l->mu);
    bool stopped = l->saves_stopped;
    pthread_mutex_unlock(&l->mu);
    return stopped;
}

/* ---- log forwarding: a FILE whose complete lines become LogLine messages ---- */

typedef struct log_post {
    sv_link *l;
    char *text;
    bool metrics;
} log_post;

static void send_log(ac_actor *a, void *ctx) {
    (void)a;
    log_post *p = ctx;
    if (p->metrics) {
        Cohort__V1__Metrics mt = COHORT__V1__METRICS__INIT;
        mt.has_rank = 1;
        mt.rank = p->l->snd.sender;
        mt.record = p->text;
        sv__send(p->l->mb, NULL, &p->l->snd, &mt.base);
    } else {
        Cohort__V1__LogLine ll = COHORT__V1__LOG_LINE__INIT;
        ll.rank = p->l->snd.sender;
        ll.level = COHORT__V1__LOG_LEVEL__LOG_INFO;
        ll.text = p->text;
        sv__send(p->l->mb, NULL, &p->l->snd, &ll.base);
    }
    free(p->text);
    free(p);
}


static ssize_t forward_write(sv_link *l, const char *buf, size_t n, bool metrics) {
    /* the stream is line buffered: buf holds whole lines (or a flush of a partial one);
     * split long ones below the protocol's string limit */
    size_t off = 0;
    while (off < n) {
        size_t len = n - off < 3500 ? n - off : 3500;
        log_post *p = malloc(sizeof *p);
        char *text = malloc(len + 1);
        if (!p || !text) {
            free(p);
            free(text);
            return -1;
        }
        memcpy(text, buf + off, len);
        text[len] = '\0';
        p->l = l;
        p->text = text;
        p->metrics = metrics;
        if (ac_post(l->a, send_log, p)) {
            free(text);
            free(p);
            return -1;
        }
        off += len;
    }
    return (ssize_t)n;
}

static ssize_t log_write(void *cookie, const char *buf, size_t n) { return forward_write(cookie, buf, n, false); }
static ssize_t metrics_write(void *cookie, const char *buf, size_t n) { return forward_write(cookie, buf, n, true); }

FILE *sv_link_log_stream(sv_link *l) {
    if (l->log) return l->log;
    cookie_io_functions_t io = {.write = log_write};
    l->log = fopencookie(l, "w", io);
    if (l->log) setvbuf(l->log, NULL, _IOLBF, 8192);
    return l->log;
}

FILE *sv_link_metrics_stream(sv_link *l) {
    if (l->metrics) return l->metrics;
    cookie_io_functions_t io = {.write = metrics_write};
    l->metrics = fopencookie(l, "w", io);
    /* a record is one line; fully buffered streams would split long records */
    if (l->metrics) setvbuf(l->metrics, NULL, _IOLBF, 8192);
    return l->metrics;
}

/* ---- closing: a request the supervisor answers proves everything before it arrived ---- */

static void goodbye_reply(ac_mailbox *mb, int status, const ac_msg *reply, void *ctx) {
    (void)mb;
    (void)status;
    (void)reply;
    sv_link *l = ctx;
    pthread_mutex_lock(&l->mu);
    l->goodbye_done = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void send_goodbye(ac_actor *a, void *ctx) {
    (void)a;
    sv_link *l = ctx;
    Cohort__V1__Heartbeat hb = COHORT__V1__HEARTBEAT__INIT;
    hb.iteration = (uint64_t)atomic_load(&l->iteration);
    hb.has_phase = 1;
    hb.phase = COHORT__V1__PHASE__PHASE_SHUTDOWN;
    if (sv__request(l->mb, NULL, &l->snd, &hb.base, 2000, goodbye_reply, l))
        goodbye_reply(NULL, CO_EIO, NULL, l); /* nothing to wait for */
}

static void report_signal_now(ac_actor *a, void *ctx) {
    (void)a;
    signal_tick(NULL, ctx);
}

void sv_link_close(sv_link **pl) {
    sv_link *l = *pl;
    if (!l) return;
    /* a signal the 50 ms tick has not reported yet (a stop faster than that) goes before
     * the goodbye, so that the run report has it */
    if (l->a && l->mb) ac_post(l->a, report_signal_now, l);
    if (l->log) {
        fclose(l->log);
        l->log = NULL;
    }
    if (l->metrics) {
        fclose(l->metrics);
        l->metrics = NULL;
    }
    if (l->a && l->mb && !ac_post(l->a, send_goodbye, l)) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 3;
        pthread_mutex_lock(&l->mu);
        while (!l->goodbye_done)
            if (pthread_cond_timedwait(&l->cv, &l->mu, &dl)) break;
        pthread_mutex_unlock(&l->mu);
    }
    if (ac_actor_stop(&l->a)) {
        /* its thread still runs (abandoned: it frees the actor when it ends) and may read
         * the link: leave the link's memory to it rather than free what a thread uses */
        co_log(CO_LOG_WARN, "%s; its memory is left to it", co_err_detail());
        *pl = NULL;
        return;
    }
    free_round(l);
    for (int i = 0; i < l->ninject; i++) free(l->inject[i]);
    sv_assignment_free(&l->asg);
    sv_assignment_free(&l->restart_asg);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
    *pl = NULL;
}

/* ---- the rerun state machine: loss reports out, verdicts in ---- */

static void free_round(sv_link *l) {
    for (int i = 0; i < l->nlast; i++) {
        Cohort__V1__LossReport *r = l->last_report[i];
        for (size_t k = 0; k < r->n_phase_ms; k++) free(r->phase_ms[k]);
        free(r->phase_ms);
        for (size_t k = 0; k < r->n_aux_losses; k++) {
            free(r->aux_losses[k]->key);
            free(r->aux_losses[k]);
        }
        free(r->aux_losses);
        free(r);
    }
    l->nlast = 0;
}

typedef struct report_post {
    sv_link *l;
    rr_report r;
    double phase_ms[8];
    const char *const *phase_names;
    int nphases;
    int copies;     /* 1, or 2 for an injected duplicate */
    int delay_ms;
} report_post;

static void send_round(sv_link *l, int copies) {
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < l->nlast; i++) sv__send(l->mb, NULL, &l->snd, &l->last_report[i]->base);
}

/* the checksums go once the all-reduce they overlap is done; a resend repeats them with
 * their round's reports */
static void resend_sum(sv_link *l) {
    if (l->have_sum && l->nlast && l->last_sum.iteration == l->last_report[0]->iteration &&
        l->last_sum.attempt == l->last_report[0]->attempt)
        sv__send(l->mb, NULL, &l->snd, &l->last_sum.base);
}

typedef struct sum_post {
    sv_link *l;
    Cohort__V1__ParamsChecksum m;
} sum_post;

static void post_sum(ac_actor *a, void *ctx) {
    (void)a;
    sum_post *p = ctx;
    p->m.rank = p->l->snd.sender; /* the world rank, as in the loss reports */
    p->l->last_sum = p->m;
    p->l->have_sum = true;
    sv__send(p->l->mb, NULL, &p->l->snd, &p->l->last_sum.base);
    free(p);
}

int sv_link_checksum(sv_link *l, const rr_report *r) {
    sum_post *p = calloc(1, sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "parameter checksum: out of memory");
    Cohort__V1__ParamsChecksum init = COHORT__V1__PARAMS_CHECKSUM__INIT;
    p->l = l;
    p->m = init;
    p->m.iteration = (uint64_t)r->iteration;
    p->m.attempt = (uint32_t)r->attempt;
    p->m.used = r->sum_used;
    p->m.has_written = r->has_written;
    p->m.written = r->sum_written;
    int rc = ac_post(l->a, post_sum, p);
    if (rc) free(p);
    return rc;
}

/* The round's message: its micro batches folded (any number of them), the gradient norm,
 * the phases' times and the MoE/MTP losses. NULL when out of memory. */
static Cohort__V1__LossReport *round_message(const sv_link *l, const report_post *p) {
    Cohort__V1__LossReport *lr = calloc(1, sizeof *lr);
    if (!lr) return NULL;
    Cohort__V1__LossReport init = COHORT__V1__LOSS_REPORT__INIT;
    *lr = init;
    lr->iteration = (uint64_t)p->r.iteration;
    lr->micro_batch = 0;
    lr->loss_sum = p->r.mb.loss_sum;
    lr->has_tokens = 1;
    lr->tokens = p->r.mb.tokens_sum;
    lr->has_results_digest = lr->has_loss_peak = lr->has_bad_micro_batch = lr->has_bad_loss = 1;
    lr->results_digest = p->r.mb.digest;
    lr->loss_peak = p->r.mb.loss_peak;
    lr->bad_micro_batch = p->r.mb.bad_mb;
    lr->bad_loss = p->r.mb.bad_loss;
    lr->token_count = (uint64_t)(lr->tokens > 0 ? lr->tokens + 0.5 : 0);
    lr->rank = l->snd.sender; /* the world rank (a trainer's rank is its data-parallel one) */
    lr->has_loss_bits = 1;
    memcpy(&lr->loss_bits, &lr->loss_sum, sizeof lr->loss_bits);
    lr->has_attempt = 1;
    lr->attempt = (uint32_t)p->r.attempt;
    lr->has_micro_batches = 1;
    lr->micro_batches = (uint32_t)p->r.nmb;
    lr->has_check_for = 1;
    lr->check_for = p->r.check_for;
    if (p->r.has_sum) lr->has_checksum_follows = lr->checksum_follows = 1;
    lr->has_grad_norm = 1;
    lr->grad_norm = p->r.grad_norm;
    lr->phase_ms = calloc((size_t)p->nphases, sizeof *lr->phase_ms);
    for (int k = 0; lr->phase_ms && k < p->nphases; k++) {
        Cohort__V1__KeyValue *kv = malloc(sizeof *kv);
        if (!kv) break;
        Cohort__V1__KeyValue kinit = COHORT__V1__KEY_VALUE__INIT;
        *kv = kinit;
        kv->key = (char *)p->phase_names[k];
        kv->value = p->phase_ms[k];
        lr->phase_ms[lr->n_phase_ms++] = kv;
    }
    int na = p->r.naux > 0 && p->r.naux <= RR_MAX_AUX ? p->r.naux : 0;
    lr->aux_losses = na ? calloc((size_t)na, sizeof *lr->aux_losses) : NULL;
    for (int k = 0; lr->aux_losses && k < na; k++) {
        Cohort__V1__KeyValue *kv = malloc(sizeof *kv);
        char *key = kv ? strndup(p->r.aux_key[k], sizeof p->r.aux_key[k]) : NULL;
        if (!key) {
            free(kv);
            break;
        }
        Cohort__V1__KeyValue kinit = COHORT__V1__KEY_VALUE__INIT;
        *kv = kinit;
        kv->key = key;
        kv->value = p->r.aux[k];
        lr->aux_losses[lr->n_aux_losses++] = kv;
    }
    return lr;
}

static void post_report(ac_actor *a, void *ctx) {
    (void)a;
    report_post *p = ctx;
    sv_link *l = p->l;
    free_round(l);
    Cohort__V1__LossReport *lr = round_message(l, p);
    if (lr) l->last_report[l->nlast++] = lr;
    send_round(l, p->copies);
    free(p);
}

static void delayed_report(ac_timer *t, void *ctx) {
    (void)t;
    report_post *p = ctx;
    post_report(p->l->a, p);
}

static void post_delayed(ac_actor *a, void *ctx) {
    report_post *p = ctx;
    /* a one-shot timer without a handle frees itself after firing */
    if (ac_timer_start(a, (uint64_t)p->delay_ms, 0, delayed_report, p, NULL)) post_report(a, p);
}

int sv_link_report(sv_link *l, const rr_report *r, const double *phase_ms, const char *const *phase_names,
                   int nphases, int copies, int delay_ms) {
    report_post *p = calloc(1, sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "loss report: out of memory");
    p->l = l;
    p->r = *r;
    p->nphases = nphases < 8 ? nphases : 8;
    for (int k = 0; k < p->nphases; k++) p->phase_ms[k] = phase_ms[k];
    p->phase_names = phase_names;
    p->copies = copies;
    p->delay_ms = delay_ms;
    pthread_mutex_lock(&l->mu);
    l->have_verdict = false;
    pthread_mutex_unlock(&l->mu);
    int rc = ac_post(l->a, delay_ms > 0 ? post_delayed : post_report, p);
    if (rc) free(p);
    return rc;
}

static void resend_round(ac_actor *a, void *ctx) {
    (void)a;
    sv_link *l = ctx;
    send_round(l, 1);
    resend_sum(l);
}

/* Does v answer the round (iteration, attempt)? RERUN/CHECK/REPAIR name the next round. */
static bool answers(const rr_verdict *v, int64_t iteration, int attempt) {
    if (v->iteration != iteration) return false;
    if (v->decision == RR_RERUN || v->decision == RR_CHECK || v->decision == RR_REPAIR) return v->attempt > attempt;
    return v->attempt >= attempt;
}

int sv_link_verdict(sv_link *l, int64_t iteration, int attempt, rr_verdict *out, int timeout_ms) {
    uint64_t start = sv__now_ms(), last_send = start, stop_seen = 0;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    while (!(l->have_verdict && answers(&l->verdict, iteration, attempt))) {
        uint64_t now = sv__now_ms();
        if (l->aborted) {
            rc = co_err_set(CO_EABORTED, "waiting for the verdict of iteration %lld: the job was aborted",
                            (long long)iteration);
            break;
        }
        if (l->verdicts_end && !stop_seen) stop_seen = now;
        if (stop_seen && now - stop_seen > 3000) {
            rc = co_err_set(CO_EABORTED, "waiting for the verdict of iteration %lld: stopping", (long long)iteration);
            break;
        }
        if (timeout_ms >= 0 && now - start > (uint64_t)timeout_ms) {
            rc = co_err_set(CO_ETIMEOUT, "no verdict for iteration %lld from the supervisor in %d s",
                            (long long)iteration, timeout_ms / 1000);
            break;
        }
        if (now - last_send >= 1000) {
            /* a report (or the verdict) may have been lost: the supervisor answers a repeat */
            last_send = now;
            pthread_mutex_unlock(&l->mu);
            ac_post(l->a, resend_round, l);
            pthread_mutex_lock(&l->mu);
            continue;
        }
        wait_slice(l, 100);
    }
    if (!rc) *out = l->verdict;
    pthread_mutex_unlock(&l->mu);
    return rc;
}

static void send_event(ac_actor *a, void *ctx) {
    (void)a;
    log_post *p = ctx;
    Cohort__V1__FaultEvent ev = COHORT__V1__FAULT_EVENT__INIT;
    ev.text = p->text;
    sv__send(p->l->mb, NULL, &p->l->snd, &ev.base);
    free(p->text);
    free(p);
}

void sv_link_event(sv_link *l, const char *line) {
    log_post *p = malloc(sizeof *p);
    size_t n = strcspn(line, "\n"); /* one line */
    char *text = strndup(line, n < 3000 ? n : 3000);
    if (!p || !text) {
        free(p);
        free(text);
        return;
    }
    p->l = l;
    p->text = text;
    p->metrics = false;
    if (ac_post(l->a, send_event, p)) {
        free(text);
        free(p);
    }
}

/* ---- in-process restart ---- */

void sv_link_enable_restart(sv_link *l, volatile sig_atomic_t *abort_flag) {
    pthread_mutex_lock(&l->mu);
    l->abort_flag = abort_flag;
    pthread_mutex_unlock(&l->mu);
}

bool sv_link_restart_pending(sv_link *l) {
    pthread_mutex_lock(&l->mu);
    bool p = l->abort_flag && l->pending_gen > l->gen;
    pthread_mutex_unlock(&l->mu);
    return p;
}

typedef struct ready_post {
    sv_link *l;
    uint64_t gen;
    int64_t iteration;
} ready_post;

static void send_ready(ac_actor *a, void *ctx) {
    (void)a;
    ready_post *p = ctx;
    sv_link *l = p->l;
    /* the barrier message travels in the new generation, so the supervisor takes it */
    uint64_t g = l->snd.generation, seq = l->snd.seq;
    l->snd.generation = p->gen;
    l->snd.seq = 0;
    Cohort__V1__Ready rd = COHORT__V1__READY__INIT;
    rd.has_rank = 1;
    rd.rank = l->snd.sender;
    rd.has_iteration = 1;
    rd.iteration = (uint64_t)p->iteration;
    sv__send(l->mb, NULL, &l->snd, &rd.base);
    l->snd.generation = g;
    l->snd.seq = seq;
    free(p);
}

static void apply_generation(ac_actor *a, void *ctx) {
    (void)a;
    ready_post *p = ctx;
    p->l->snd.generation = p->gen;
    p->l->snd.sender = (uint32_t)p->iteration; /* the new rank */
    p->l->snd.seq = 0;
    free(p);
}

int sv_link_await_restart(sv_link *l, int64_t iteration, sv_assignment *out, int timeout_ms) {
    memset(out, 0, sizeof *out);
    uint64_t start = sv__now_ms(), sent_gen = 0;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if (l->have_restart && l->restart_asg.generation == l->pending_gen) break;
        /* the supervisor's stop order, or the link's own (the supervisor lost); a signal of
         * this process's alone is not: the supervisor stops the job once it has restarted */
        if (l->stop_ordered || (*l->stop && !(l->signalled && *l->signalled))) {
            rc = co_err_set(CO_EABORTED, "stopping while waiting to restart");
            break;
        }
        if (timeout_ms >= 0 && sv__now_ms() - start > (uint64_t)timeout_ms) {
            rc = co_err_set(CO_ETIMEOUT, "no restart order from the supervisor in %d s", timeout_ms / 1000);
            break;
        }
        if (l->pending_gen != sent_gen) {
            /* (again, when a newer abort came while waiting) */
            ready_post *p = malloc(sizeof *p);
            if (!p) {
                rc = CO_ENOMEM;
                break;
            }
            p->l = l;
            p->gen = sent_gen = l->pending_gen;
            p->iteration = iteration;
            pthread_mutex_unlock(&l->mu);
            if (ac_post(l->a, send_ready, p)) free(p);
            pthread_mutex_lock(&l->mu);
            continue;
        }
        wait_slice(l, 100);
    }
    if (!rc) {
        *out = l->restart_asg;
        memset(&l->restart_asg, 0, sizeof l->restart_asg);
        l->have_restart = false;
        l->gen = out->generation;
        l->aborted = false;
        l->have_verdict = false;
        *l->abort_flag = 0;
    }
    pthread_mutex_unlock(&l->mu);
    if (!rc) {
        /* the new generation's identity, set on the link thread before anything sent later */
        ready_post *p = malloc(sizeof *p);
        if (!p) return CO_ENOMEM;
        p->l = l;
        p->gen = out->generation;
        p->iteration = out->rank;
        if ((rc = ac_post(l->a, apply_generation, p))) free(p);
    }
    return rc;
}

typedef struct failure_post {
    sv_link *l;
    int code;
    int status;              /* the worker's own incurable failure's exit status; 0: a collective's */
    char text[1600];
} failure_post;

/* An Abort to the supervisor on the link thread: a failed collective, or (status) this
 * worker's own failure that no restart cures. */
static void send_failure(ac_actor *a, void *ctx) {
    (void)a;
    failure_post *p = ctx;
    Cohort__V1__Abort ab = COHORT__V1__ABORT__INIT;
    ab.generation = p->l->snd.generation;
    ab.reason = p->text;
    ab.has_error_code = 1;
    ab.error_code = p->code;
    ab.has_failed_rank = 1;
    ab.failed_rank = p->l->snd.sender;
    ab.has_exit_status = p->status != 0;
    ab.exit_status = p->status;
    sv__send(p->l->mb, NULL, &p->l->snd, &ab.base);
    free(p);
}

int sv_link_fatal(sv_link *l, int code, int status, const char *what) {
    failure_post *p = calloc(1, sizeof *p);
    if (!p) return co_err_set(CO_ENOMEM, "out of memory");
    *p = (failure_post){.l = l, .code = code, .status = status};
    snprintf(p->text, sizeof p->text, "%s", what);
    if (!l->a || ac_post(l->a, send_failure, p)) {
        free(p);
        return co_err_set(CO_EIO, "the supervisor link is closed");
    }
    return 0;
}

bool sv_link_await_abort(sv_link *l, int code, const char *what, int timeout_ms) {
    failure_post *p = calloc(1, sizeof *p);
    if (p) {
        p->l = l;
        p->code = code;
        snprintf(p->text, sizeof p->text, "%s", what);
        if (ac_post(l->a, send_failure, p)) free(p);
    }
    uint64_t start = sv__now_ms();
    pthread_mutex_lock(&l->mu);
    bool pending = false;
    while (l->abort_flag && !(pending = l->pending_gen > l->gen) && !*l->stop &&
           sv__now_ms() - start < (uint64_t)timeout_ms) {
        wait_slice(l, 50);
    }
    pthread_mutex_unlock(&l->mu);
    return pending;
}

int sv_link_take_injections(sv_link *l, char **specs, int cap) {
    pthread_mutex_lock(&l->mu);
    int n = l->ninject < cap ? l->ninject : cap;
    memcpy(specs, l->inject, sizeof *specs * (size_t)n);
    memmove(l->inject, l->inject + n, sizeof *l->inject * (size_t)(l->ninject - n));
    l->ninject -= n;
    pthread_mutex_unlock(&l->mu);
    return n;
}
