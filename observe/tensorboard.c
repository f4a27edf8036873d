/* tensorboard.c - cohort's metrics records -> Megatron's TensorBoard tags (see
 * tensorboard.h; the list is in docs/observability.md).
 *
 * Three kinds of record arrive (train/trainer.c, supervisor/validate.c):
 *   training   {"iteration", "consumed_samples", "lm_loss", "learning_rate", ...}
 *   evaluation {"evaluation": "valid"|"test", "iteration", "lm_loss", "lm_loss_ppl", ...}
 *   events     {"event": "straggler"|"straggler_stage"|"fault"|"restart"|..., "iteration", ...}
 * Megatron's tags come from the first two, cohort's own series (cohort/...) from all. */
#include "observe/tensorboard.h"

#include "common/config.h"
#include "common/error.h"
#include "observe/tfevents.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

struct ob_tb {
    ob_tb_options o;
    char dir[1024];
    ob_tfevents *w;
    int err;                /* the first write error (every later record returns it) */
    int64_t samples;        /* consumed samples of the last training record */
    int64_t faults, restarts;
};

void ob_tb_options_from_config(ob_tb_options *o, const co_config *c, int world) {
    memset(o, 0, sizeof *o);
    o->dir = c->tensorboard_dir;
    o->log_interval = c->tensorboard_log_interval;
    o->queue_size = c->tensorboard_queue_size;
    o->learning_rate = c->log_learning_rate_to_tensorboard;
    o->loss_scale = c->log_loss_scale_to_tensorboard;
    o->validation_ppl = c->log_validation_ppl_to_tensorboard;
    o->timers = c->log_timers_to_tensorboard;
    o->memory = c->log_memory_to_tensorboard;
    o->world_size = c->log_world_size_to_tensorboard;
    o->world = world;
}

int ob_tb_open(ob_tb **out, const ob_tb_options *o) {
    *out = NULL;
    ob_tb *tb = calloc(1, sizeof *tb);
    if (!tb) return co_err_set(CO_ENOMEM, "TensorBoard: out of memory");
    tb->o = *o;
    snprintf(tb->dir, sizeof tb->dir, "%s", o->dir ? o->dir : "");
    tb->o.dir = tb->dir;
    if (tb->o.log_interval < 1) tb->o.log_interval = 1;
    int rc = ob_tfevents_open(&tb->w, tb->dir, o->queue_size, o->flush_secs);
    if (rc) {
        free(tb);
        return rc;
    }
    *out = tb;
    return 0;
}

const char *ob_tb_path(const ob_tb *tb) { return ob_tfevents_path(tb->w); }

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* One scalar against step; vs_samples >= 0: also "<tag> vs samples" against it. */
static void scalar(ob_tb *tb, const char *tag, double v, int64_t step, int64_t vs_samples, double wall) {
    if (tb->err) return;
    int rc = ob_tfevents_scalar(tb->w, tag, step, (float)v, wall);
    if (!rc && vs_samples >= 0) {
        char t2[160];
        snprintf(t2, sizeof t2, "%s vs samples", tag);
        rc = ob_tfevents_scalar(tb->w, t2, vs_samples, (float)v, wall);
    }
    if (rc) tb->err = rc;
}

/* A number field of the record (integers too, and the trainer's "nan", "inf" and "-inf":
 * JSON has no such numbers); false when absent or not a number. */
static bool num(json_t *o, const char *key, double *v) {
    json_t *x = json_object_get(o, key);
    if (json_is_string(x)) {
        const char *s = json_string_value(x);
        if (!strcmp(s, "nan")) *v = NAN;
        else if (!strcmp(s, "inf")) *v = INFINITY;
        else if (!strcmp(s, "-inf")) *v = -INFINITY;
        else return false;
        return true;
    }
    if (!json_is_number(x)) return false;
    *v = json_number_value(x);
    return true;
}

static void training(ob_tb *tb, json_t *r, int64_t it, double wall) {
    const ob_tb_options *o = &tb->o;
    double v, gbs = 0;
    if (num(r, "consumed_samples", &v)) tb->samples = (int64_t)v;
    if (it % o->log_interval) return;
    int64_t s = tb->samples;
    if (o->learning_rate && num(r, "learning_rate", &v)) scalar(tb, "learning-rate", v, it, s, wall);
    num(r, "global_batch_size", &gbs);
    /* Megatron's skipped_train_samples: the samples of skipped iterations (cohort counts
     * the iterations: --iterations-to-skip and those the rerun state machine skips) */
    if (num(r, "skipped_iterations", &v) && v > 0) scalar(tb, "skipped-train-samples", v * gbs, it, s, wall);
    if (gbs > 0) scalar(tb, "batch-size", gbs, it, s, wall);
    if (num(r, "lm_loss", &v)) scalar(tb, "lm loss", v, it, s, wall);
    if (o->loss_scale && num(r, "loss_scale", &v)) scalar(tb, "loss-scale", v, it, s, wall);
    if (o->world_size) scalar(tb, "world-size", o->world, it, s, wall);
    if (num(r, "grad_norm", &v)) scalar(tb, "grad-norm", v, it, s, wall);
    /* mixture of experts and multi-token prediction (Megatron's MoE metrics tracker and
     * MTPLossLoggingHelper write these names, by iteration) */
    if (num(r, "load_balancing_loss", &v)) scalar(tb, "load_balancing_loss", v, it, -1, wall);
    if (num(r, "z_loss", &v)) scalar(tb, "z_loss", v, it, -1, wall);
    for (int k = 1; k <= 8; k++) {
        char key[32], tag[32];
        snprintf(key, sizeof key, "mtp_%d_loss", k);
        snprintf(tag, sizeof tag, "mtp_%d loss", k);
        if (!num(r, key, &v)) break;
        scalar(tb, tag, v, it, -1, wall);
    }
    if (o->memory) {
        /* Megatron's are the CUDA allocator's counters; cohort's are the logging rank's
         * resident memory (train/trainer.c reads /proc/self/status) */
        if (num(r, "rss_bytes", &v)) scalar(tb, "mem-resident-bytes", v, it, -1, wall);
        if (num(r, "max_rss_bytes", &v)) scalar(tb, "mem-max-resident-bytes", v, it, -1, wall);
    }
    if (o->timers) {
        if (num(r, "elapsed_ms_per_iteration", &v)) scalar(tb, "iteration-time", v / 1000.0, it, -1, wall);
        if (num(r, "tflops_per_rank", &v)) scalar(tb, "throughput", v, it, -1, wall);
        /* cohort's timers, in seconds per iteration as Megatron's timers.write gives them */
        static const char *const timers[][2] = {{"validation_ms_per_iteration", "rerun-validation-time"},
                                                {"weight_checksum_ms_per_iteration", "weight-checksum-time"},
                                                {"weight_hash_ms_per_iteration", "weight-hash-time"},
                                                {"tensor_comm_ms_per_iteration", "tensor-comm-time"}};
        for (size_t k = 0; k < sizeof timers / sizeof *timers; k++)
            if (num(r, timers[k][0], &v)) scalar(tb, timers[k][1], v / 1000.0, it, -1, wall);
    }
    if (num(r, "tokens_per_second", &v)) scalar(tb, "cohort/tokens-per-second", v, it, -1, wall);
    if (num(r, "skipped_iterations", &v)) scalar(tb, "cohort/skipped-iterations", v, it, -1, wall);
    if (num(r, "nan_iterations", &v)) scalar(tb, "cohort/nan-iterations", v, it, -1, wall);
}

static void evaluation(ob_tb *tb, json_t *r, const char *split, int64_t it, double wall) {
    /* Megatron writes the validation results (periodic and final); the test split's only
     * with --skip-train, which cohort has not */
    if (strcmp(split, "valid")) return;
    double v;
    int64_t s = num(r, "consumed_samples", &v) ? (int64_t)v : tb->samples;
    if (num(r, "lm_loss", &v)) scalar(tb, "lm loss validation", v, it, s, wall);
    if (tb->o.validation_ppl && num(r, "lm_loss_ppl", &v)) scalar(tb, "lm loss validation ppl", v, it, s, wall);
}

static void event(ob_tb *tb, json_t *r, const char *kind, int64_t it, double wall) {
    double v, who;
    char tag[160];
    if (!strcmp(kind, "straggler") && num(r, "score", &v) && num(r, "rank", &who)) {
        snprintf(tag, sizeof tag, "cohort/straggler-score/rank-%d", (int)who);
        scalar(tb, tag, v, it, -1, wall);
    } else if (!strcmp(kind, "straggler_stage") && num(r, "score", &v) && num(r, "stage", &who)) {
        snprintf(tag, sizeof tag, "cohort/straggler-score/stage-%d", (int)who);
        scalar(tb, tag, v, it, -1, wall);
    } else if (!strcmp(kind, "fault")) {
        /* recorded when it happens (recover_ms < 0), again when its recovery ends */
        double rec = -1;
        num(r, "recover_ms", &rec);
        if (rec < 0) scalar(tb, "cohort/faults", (double)++tb->faults, it, -1, wall);
        else scalar(tb, "cohort/fault-recovery-seconds", rec / 1000.0, it, -1, wall);
    } else if (!strcmp(kind, "restart")) { /* an in-process restart's recovery ended */
        scalar(tb, "cohort/restarts", (double)++tb->restarts, it, -1, wall);
        if (num(r, "recover_ms", &v) && v >= 0) scalar(tb, "cohort/restart-seconds", v / 1000.0, it, -1, wall);
    } else if (!strcmp(kind, "replay") && num(r, "replays", &v)) {
        scalar(tb, "cohort/replays", v, it, -1, wall);
    } else if (!strcmp(kind, "goodput") && num(r, "ettr", &v)) {
        /* the supervisor's goodput accounting (after a fault's recovery, at the end) */
        scalar(tb, "cohort/goodput/ettr", v, it, -1, wall);
        json_t *lost = json_object_get(r, "lost_seconds"), *x;
        const char *cause;
        json_object_foreach(lost, cause, x) {
            snprintf(tag, sizeof tag, "cohort/goodput/lost-seconds/%s", cause);
            if (json_is_number(x)) scalar(tb, tag, json_number_value(x), it, -1, wall);
        }
    } else if (!strcmp(kind, "checkpoint") && num(r, "commit_ms", &v)) {
        /* the supervisor's view of a save: the first rank's acknowledgement to the commit */
        scalar(tb, "cohort/checkpoint-commit-seconds", v / 1000.0, it, -1, wall);
    }
}

int ob_tb_record(ob_tb *tb, const char *json, size_t len) {
    if (tb->err) return tb->err;
    json_t *r = json_loadb(json, len, JSON_DECODE_ANY, NULL);
    if (!json_is_object(r)) {
        json_decref(r);
        return 0;
    }
    double itd = -1;
    num(r, "iteration", &itd);
    int64_t it = (int64_t)itd;
    double wall = wall_now();
    json_t *ev = json_object_get(r, "evaluation"), *kind = json_object_get(r, "event");
    if (json_is_string(kind)) event(tb, r, json_string_value(kind), it < 0 ? 0 : it, wall);
    else if (it >= 0 && json_is_string(ev)) evaluation(tb, r, json_string_value(ev), it, wall);
    else if (it >= 0 && json_object_get(r, "lm_loss")) training(tb, r, it, wall);
    json_decref(r);
    return tb->err;
}

int ob_tb_flush(ob_tb *tb) {
    if (tb->err) return tb->err;
    return tb->err = ob_tfevents_flush(tb->w);
}

int ob_tb_close(ob_tb **ptb) {
    ob_tb *tb = *ptb;
    if (!tb) return 0;
    *ptb = NULL;
    int rc = ob_tfevents_close(&tb->w);
    if (tb->err) rc = tb->err;
    free(tb);
    return rc;
}
