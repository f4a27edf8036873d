/* ckpt_coord.c - the supervisor coordinates the commit of a checkpoint written by several
 * ranks (see ckpt_coord.h and docs/checkpoints.md, "Several ranks").
 *
 * Each rank writes its files into SAVE/iter_N.tmp-JOB, fsyncs them and acknowledges
 * (CheckpointAck, phase WRITE: its files with size and XXH64, or its error). When all W
 * have acknowledged success, the supervisor completes the manifest from rank 0's plan and
 * every rank's writer record (ck_complete_shared), commits (ck_commit: fsync, rename, fsync
 * of SAVE, tracker), applies --most-recent-k and answers every rank COMMIT. A failed
 * acknowledgement, a failure here, or the job failing before all are in aborts: the
 * temporary directory is removed and every rank is answered ABORT. The tracker only ever
 * moves to a committed, complete checkpoint. */
#include "supervisor/ckpt_coord.h"

#include "checkpoint/ckpt.h"
#include "common/error.h"
#include "common/log.h"
#include "supervisor/msg.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

struct svc {
    char save_dir[4096];
    char token[64];
    int keep, world;
    int ranks_cap;           /* ranks acked[] has room for (the world at the start: --elastic shrinks it) */
    svc_send_fn send;
    void *ctx;
    /* the save in progress */
    int64_t iteration;       /* -1: none */
    bool *acked;             /* [world] */
    int nacked;
    ck_mfile *files;         /* acknowledged files */
    int nfiles, cap;
    bool aborted;            /* the save in progress was aborted */
    bool failing;            /* the job is failing: no more commits */
    int (*rerun_save)(void *ctx, char *buf, size_t n);
    void *rerun_ctx;
    FILE *metrics;           /* commits recorded here (svc_set_metrics) */
    uint64_t first_ack_ms;   /* the save in progress: its first acknowledgement */
    int64_t commits, last_committed; /* svc_committed */
    int keep_every;          /* --keep-every (0: none) */
    double margin;           /* --save-space-margin (0: saves never stop) */
    char stopped[600];       /* why saves were stopped ("": they were not) */
};

int svc_new(svc **out, const char *save_dir, int keep, int world, uint64_t job_id, svc_send_fn send, void *ctx) {
    *out = NULL;
    svc *c = calloc(1, sizeof *c);
    if (!c || !(c->acked = calloc((size_t)(world > 0 ? world : 1), sizeof *c->acked))) {
        free(c);
        return co_err_set(CO_ENOMEM, "supervisor: checkpoint coordinator: out of memory");
    }
    snprintf(c->save_dir, sizeof c->save_dir, "%s", save_dir);
    snprintf(c->token, sizeof c->token, CK_JOB_TOKEN_FMT, job_id);
    c->keep = keep;
    c->world = c->ranks_cap = world;
    c->send = send;
    c->ctx = ctx;
    c->iteration = -1;
    c->last_committed = -1;
    ck_test_set_role("sv"); /* COHORT_CKPT_CRASH_AT=PHASE@sv */
    *out = c;
    return 0;
}

static void tell_all(svc *c, int64_t it, Cohort__V1__CheckpointPhase phase, const char *dir) {
    for (int r = 0; r < c->world; r++) {
        Cohort__V1__CheckpointCommand cmd = COHORT__V1__CHECKPOINT_COMMAND__INIT;
        cmd.iteration = (uint64_t)it;
        cmd.directory = (char *)dir;
        cmd.phase = phase;
        if (phase == COHORT__V1__CHECKPOINT_PHASE__CKPT_COMMIT && c->stopped[0])
            cmd.has_saves_stopped = cmd.saves_stopped = true;
        c->send(c->ctx, r, &cmd.base);
    }
}

static void reset(svc *c) {
    c->iteration = -1;
    c->nacked = 0;
    c->nfiles = 0;
    c->aborted = false;
    memset(c->acked, 0, (size_t)c->world * sizeof *c->acked);
}

/* Aborts the save in progress: every rank is answered ABORT at once; the temporary
 * directory is removed when every rank has acknowledged (none writes into it any more), or
 * at the end of the job. */
static void abort_save(svc *c, const char *why) {
    if (c->aborted) return;
    c->aborted = true;
    char tmp[4400];
    ck_tmp_dir_shared(tmp, sizeof tmp, c->save_dir, c->iteration, c->token);
    co_log(CO_LOG_WARN, "checkpoint at iteration %" PRId64 " aborted: %s; removed %s once no rank writes "
           "into it (the tracker still names the previous checkpoint)", c->iteration, why, tmp);
    fflush(stderr);
    tell_all(c, c->iteration, COHORT__V1__CHECKPOINT_PHASE__CKPT_ABORT, tmp);
}

static void finish_aborted(svc *c) {
    char tmp[4400];
    ck_tmp_dir_shared(tmp, sizeof tmp, c->save_dir, c->iteration, c->token);
    if (ck_remove_dir(tmp)) co_log(CO_LOG_WARN, "removing %s: %s", tmp, co_err_detail());
    reset(c);
}

/* The save directory's free bytes: COHORT_TEST_FREE_BYTES when set (the tests' seam: no
 * small file system to fill here), else statvfs's, for an unprivileged writer. */
static int free_bytes(const char *dir, double *out) {
    const char *t = getenv("COHORT_TEST_FREE_BYTES");
    if (t && *t) {
        *out = strtod(t, NULL);
        return 0;
    }
    struct statvfs st;
    if (statvfs(dir, &st)) return -1;
    *out = (double)st.f_bavail * (double)st.f_frsize;
    return 0;
}

/* After committing iteration it: saves stop when the free space left is below this
 * checkpoint's size times the margin (the next one would likely not fit); said once, in the
 * log and the metrics stream, and to the ranks in the commit's answer. */
static void check_space(svc *c, int64_t it) {
    if (c->margin <= 0 || c->stopped[0]) return;
    double size = 0, avail;
    for (int i = 0; i < c->nfiles; i++) size += (double)c->files[i].size;
    if (free_bytes(c->save_dir, &avail) || avail >= size * c->margin) return;
    snprintf(c->stopped, sizeof c->stopped,
             "the save directory %.400s has %.1f MiB free, below the last checkpoint's %.1f MiB x %g (--save-space-margin)",
             c->save_dir, avail / 1048576.0, size / 1048576.0, c->margin);
    co_log(CO_LOG_WARN, "checkpoint: saving stopped after iteration %" PRId64 ": %s; training goes on without "
           "saving: free space there (or lower --save-space-margin) and relaunch with --load to save again", it,
           c->stopped);
    if (c->metrics) {
        fprintf(c->metrics, "{\"event\":\"saves_stopped\",\"iteration\":%" PRId64 ",\"free_bytes\":%.0f,"
                "\"needed_bytes\":%.0f}\n", it, avail, size * c->margin);
        fflush(c->metrics);
    }
}

static void commit(svc *c) {
    int64_t it = c->iteration;
    char tmp[4400], final[4400];
    ck_tmp_dir_shared(tmp, sizeof tmp, c->save_dir, it, c->token);
    ck_iter_dir(final, sizeof final, c->save_dir, it);
    json_t *rerun = NULL;
    if (c->rerun_save) {
        char buf[4096];
        if (!c->rerun_save(c->rerun_ctx, buf, sizeof buf)) rerun = json_loads(buf, 0, NULL);
    }
    int rc = ck_complete_shared_ex(tmp, it, c->world, c->files, c->nfiles, rerun);
    if (rerun) json_decref(rerun);
    if (!rc) ck_crash_point("manifest"); /* manifest written, not yet renamed */
    if (!rc) rc = ck_commit(c->save_dir, it, tmp);
    if (rc) {
        char why[1400];
        snprintf(why, sizeof why, "committing failed: %s", co_err_detail());
        abort_save(c, why);
        finish_aborted(c);
        return;
    }
    if (c->keep > 0) {
        int64_t removed[64];
        int nr = 0;
        if (ck_prune_every(c->save_dir, c->keep, c->keep_every, false, removed, 64, &nr))
            co_log(CO_LOG_WARN, "retention (--most-recent-k %d, --keep-every %d) after saving iteration %" PRId64 ": %s",
                   c->keep, c->keep_every, it, co_err_detail());
        for (int i = 0; i < nr && i < 64; i++)
            co_log(CO_LOG_INFO, "retention: removed the checkpoint of iteration %" PRId64, removed[i]);
    }
    check_space(c, it);
    tell_all(c, it, COHORT__V1__CHECKPOINT_PHASE__CKPT_COMMIT, final);
    if (c->metrics) {
        fprintf(c->metrics, "{\"event\":\"checkpoint\",\"iteration\":%" PRId64 ",\"commit_ms\":%.3f}\n", it,
                (double)(sv__now_ms() - c->first_ack_ms));
        fflush(c->metrics);
    }
    c->commits++;
    c->last_committed = it;
    reset(c);
}

void svc_on_ack(svc *c, int rank, const Cohort__V1__CheckpointAck *ack) {
    if (rank < 0 || rank >= c->world || ack->phase != COHORT__V1__CHECKPOINT_PHASE__CKPT_WRITE) return;
    int64_t it = (int64_t)ack->iteration;
    if (c->iteration >= 0 && c->iteration != it) {
        /* ranks save in lockstep; one that is elsewhere ends both saves */
        char why[200];
        snprintf(why, sizeof why, "rank %d acknowledged iteration %" PRId64 " while %" PRId64 " was in progress", rank, it,
                 c->iteration);
        abort_save(c, why);
        finish_aborted(c);
        c->failing = true;
    }
    if (c->iteration < 0) {
        c->iteration = it;
        c->first_ack_ms = sv__now_ms();
    }
    if (c->failing) abort_save(c, "the job is stopping");
    if (c->acked[rank]) return; /* a duplicate */
    c->acked[rank] = true;
    c->nacked++;
    if (ack->status != 0) {
        char why[2400];
        snprintf(why, sizeof why, "rank %d failed to write its part: %s (%s)", rank, ack->error ? ack->error : "no detail",
                 co_strerror(ack->status));
        abort_save(c, why);
    }
    for (size_t i = 0; i < ack->n_files && !c->aborted; i++) {
        if (c->nfiles == c->cap) {
            int cap = c->cap ? 2 * c->cap : 16;
            ck_mfile *p = realloc(c->files, (size_t)cap * sizeof *p);
            if (!p) {
                abort_save(c, "out of memory");
                break;
            }
            c->files = p;
            c->cap = cap;
        }
        ck_mfile *f = &c->files[c->nfiles++];
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "%s", ack->files[i]->path);
        f->writer = rank;
        f->size = ack->files[i]->size;
        f->xxh64 = ack->files[i]->checksum;
    }
    if (c->aborted) {
        /* (the rank may have acknowledged after the ABORT went out: it hears it again) */
        Cohort__V1__CheckpointCommand cmd = COHORT__V1__CHECKPOINT_COMMAND__INIT;
        cmd.iteration = (uint64_t)it;
        cmd.directory = "";
        cmd.phase = COHORT__V1__CHECKPOINT_PHASE__CKPT_ABORT;
        c->send(c->ctx, rank, &cmd.base);
        if (c->nacked == c->world) finish_aborted(c);
        return;
    }
    if (c->nacked == c->world) commit(c);
}

void svc_set_metrics(svc *c, FILE *metrics) { c->metrics = metrics; }

void svc_abort(svc *c, const char *why) {
    if (!c) return;
    c->failing = true;
    if (c->iteration >= 0) abort_save(c, why);
}

void svc_set_rerun_state(svc *c, int (*save)(void *ctx, char *buf, size_t n), void *ctx) {
    if (!c) return;
    c->rerun_save = save;
    c->rerun_ctx = ctx;
}

void svc_restart(svc *c, const char *why) {
    if (!c || c->iteration < 0) return;
    /* the save in progress dies with its generation; the next generation saves afresh */
    abort_save(c, why);
    finish_aborted(c);
}

int svc_set_world(svc *c, int world) {
    if (!c) return 0;
    if (world < 1 || world > c->ranks_cap)
        return co_err_set(CO_EINVAL, "checkpoint coordinator: world %d (1..%d)", world, c->ranks_cap);
    svc_restart(c, "the world changes size"); /* (a save in progress dies with its generation) */
    c->world = world;
    memset(c->acked, 0, (size_t)c->ranks_cap * sizeof *c->acked);
    return 0;
}

void svc_destroy(svc **pc) {
    svc *c = *pc;
    if (!c) return;
    ck_remove_tmp_dirs(c->save_dir, c->token);
    free(c->acked);
    free(c->files);
    free(c);
    *pc = NULL;
}

int64_t svc_committed(const svc *c, int64_t *iteration) {
    *iteration = c ? c->last_committed : -1;
    return c ? c->commits : 0;
}

void svc_set_limits(svc *c, int keep_every, double space_margin) {
    if (!c) return;
    c->keep_every = keep_every > 0 ? keep_every : 0;
    c->margin = space_margin > 0 ? space_margin : 0;
}

const char *svc_saves_stopped(const svc *c) { return c ? c->stopped : ""; }

void svc_resend_stopped(svc *c) {
    if (!c || !c->stopped[0] || c->last_committed < 0) return;
    char final[4400];
    ck_iter_dir(final, sizeof final, c->save_dir, c->last_committed);
    tell_all(c, c->last_committed, COHORT__V1__CHECKPOINT_PHASE__CKPT_COMMIT, final);
}
