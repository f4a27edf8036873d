/* inject_client.c - `cohort inject`'s and `cohort status`'s side: finds a running job's
 * supervisor (the `job` file in its private ipc directory), sends it an InjectFault request
 * and waits for the one-line answer (supervisor.c handle_inject), or a StatusRequest and
 * waits for the StatusReply's JSON document (handle_status). */
#include "cli/inject_client.h"

#include "actors/actor.h"
#include "common/error.h"
#include "common/proctitle.h"
#include "supervisor/msg.h"

#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int read_job(const char *path, sv_job *j) {
    FILE *f = fopen(path, "r");
    if (!f) return CO_ENOENT;
    char line[600];
    memset(j, 0, sizeof *j);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strncmp(line, "pid=", 4)) j->pid = atoi(line + 4);
        else if (!strncmp(line, "start=", 6)) j->start = strtoull(line + 6, NULL, 10);
        else if (!strncmp(line, "endpoint=", 9)) snprintf(j->endpoint, sizeof j->endpoint, "%.399s", line + 9);
        else if (!strncmp(line, "job=", 4)) j->job_id = strtoull(line + 4, NULL, 16);
    }
    fclose(f);
    return j->pid > 0 && j->endpoint[0] && j->job_id ? 0 : CO_EFORMAT;
}

int sv_find_jobs(sv_job *jobs, int cap, int *n) {
    *n = 0;
    char pat[2][400];
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    snprintf(pat[0], sizeof pat[0], "%s/cohort-*/job", xdg && *xdg ? xdg : "/nonexistent");
    snprintf(pat[1], sizeof pat[1], "/tmp/cohort-%u-*/job", (unsigned)geteuid());
    for (int k = 0; k < 2; k++) {
        glob_t g;
        if (glob(pat[k], 0, NULL, &g)) continue;
        for (size_t i = 0; i < g.gl_pathc && *n < cap; i++) {
            struct stat st;
            if (stat(g.gl_pathv[i], &st) || st.st_uid != geteuid()) continue;
            sv_job j;
            if (read_job(g.gl_pathv[i], &j)) continue;
            if (kill(j.pid, 0) && errno == ESRCH) continue; /* a job that ended without cleaning up */
            /* ... whose pid another process has taken since */
            if (j.start && co_proc_start_ticks(j.pid) != j.start) continue;
            jobs[(*n)++] = j;
        }
        globfree(&g);
    }
    return 0;
}

typedef struct req {
    const sv_job *job;
    const char *spec;       /* NULL: a status request */
    int timeout_ms;
    ac_mailbox *mb;
    sv__sender snd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    char *answer;           /* the reply's bytes, NUL-terminated (malloc'd) */
    size_t answer_len;
} req;

static void on_reply(ac_mailbox *mb, int status, const ac_msg *reply, void *ctx) {
    (void)mb;
    req *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->status = status;
    if (!status && reply) {
        r->answer = malloc(reply->len + 1);
        if (r->answer) {
            memcpy(r->answer, reply->data, reply->len);
            r->answer[reply->len] = '\0';
            r->answer_len = reply->len;
        } else {
            r->status = CO_ENOMEM;
        }
    }
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void on_message(ac_mailbox *mb, const ac_msg *m, void *ctx) {
    (void)mb;
    (void)m;
    (void)ctx; /* nothing but replies is expected */
}

static int client_start(ac_actor *a, void *ctx) {
    req *r = ctx;
    ac_mailbox_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.on_message = on_message;
    mo.ctx = r;
    char id[48];
    snprintf(id, sizeof id, "%s-%d", r->spec ? "inject" : "status", (int)getpid());
    int rc = ac_mailbox_connect(a, r->job->endpoint, id, &mo, &r->mb);
    if (rc) return rc;
    if (!r->spec) {
        Cohort__V1__StatusRequest sr = COHORT__V1__STATUS_REQUEST__INIT;
        return sv__request(r->mb, NULL, &r->snd, &sr.base, r->timeout_ms, on_reply, r);
    }
    Cohort__V1__Param pm = COHORT__V1__PARAM__INIT, *pp = &pm;
    pm.key = "spec";
    pm.value = (char *)r->spec;
    Cohort__V1__InjectFault inj = COHORT__V1__INJECT_FAULT__INIT;
    inj.kind = COHORT__V1__FAULT_KIND__FAULT_UNKNOWN;
    inj.target_rank = -1;
    inj.n_params = 1;
    inj.params = &pp;
    return sv__request(r->mb, NULL, &r->snd, &inj.base, r->timeout_ms, on_reply, r);
}

/* Sends spec (NULL: a status request) and waits for the reply: in r.answer (malloc'd). */
static int ask(const sv_job *job, const char *spec, int timeout_ms, req *out) {
    req r;
    memset(&r, 0, sizeof r);
    r.job = job;
    r.spec = spec;
    r.timeout_ms = timeout_ms;
    r.snd.job_id = job->job_id;
    r.snd.sender = PW_SENDER_UNASSIGNED;
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    ac_actor *a = NULL;
    ac_actor_opts ao = {.name = "inject", .on_start = client_start, .ctx = &r};
    int rc = ac_actor_start(&ao, &a);
    if (!rc) {
        /* the request's own timeout ends the wait; a second later is a guard against a lost callback */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000 + 1;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&r.mu);
        while (!r.done)
            if (pthread_cond_timedwait(&r.cv, &r.mu, &dl)) break;
        rc = r.done ? r.status : CO_ETIMEOUT;
        pthread_mutex_unlock(&r.mu);
    }
    ac_actor_stop(&a);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
    if (rc) {
        free(r.answer);
        r.answer = NULL;
        return co_err_set(rc, "no answer from the supervisor at %s (pid %d) within %d s", job->endpoint, job->pid,
                          (timeout_ms + 999) / 1000);
    }
    *out = r;
    return 0;
}

int sv_inject(const sv_job *job, const char *spec, int timeout_ms, char *answer, size_t n) {
    req r;
    int rc = ask(job, spec, timeout_ms, &r);
    if (rc) return rc;
    snprintf(answer, n, "%s", r.answer ? r.answer : "");
    free(r.answer);
    return 0;
}

int sv_status(const sv_job *job, int timeout_ms, char **json) {
    *json = NULL;
    req r;
    int rc = ask(job, NULL, timeout_ms, &r);
    if (rc) return rc;
    pw_msg *m = NULL;
    pw_expect exp = {.job_id = job->job_id};
    rc = r.answer_len ? pw_decode(r.answer, r.answer_len, NULL, &exp, NULL, &m, NULL)
                      : co_err_set(CO_EPROTOCOL, "an empty answer");
    free(r.answer);
    if (!rc && m->env->body_case != COHORT__V1__ENVELOPE__BODY_STATUS_REPLY)
        rc = co_err_set(CO_EPROTOCOL, "the answer is a %s, not a StatusReply", pw_body_name(m->env));
    if (!rc) {
        ProtobufCBinaryData *d = &m->env->status_reply->json;
        *json = malloc(d->len + 1);
        if (*json) {
            memcpy(*json, d->data, d->len);
            (*json)[d->len] = '\0';
        } else {
            rc = co_err_set(CO_ENOMEM, "out of memory");
        }
    }
    pw_msg_free(&m);
    if (rc) return co_err_set(rc, "the supervisor at %s (pid %d) answered the status request: %s", job->endpoint,
                              job->pid, co_err_detail());
    return 0;
}
