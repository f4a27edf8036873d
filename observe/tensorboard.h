/* tensorboard.h - Megatron's TensorBoard scalars from cohort's metrics records.
 *
 * The process that writes the metrics file (the single process, or the supervisor of a
 * multi-rank job: the last rank's records, Megatron's "last rank writes") hands every
 * record (one JSON object per line) to ob_tb_record, which writes the tags Megatron's
 * training_log and evaluate_and_print_results write (docs/observability.md lists them)
 * into one event file under --tensorboard-dir. */
#ifndef COHORT_OBSERVE_TENSORBOARD_H
#define COHORT_OBSERVE_TENSORBOARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct co_config;

typedef struct ob_tb_options {
    const char *dir;     /* --tensorboard-dir */
    int log_interval;    /* --tensorboard-log-interval: training tags at iterations divisible by it */
    int queue_size;      /* --tensorboard-queue-size: events buffered before a write */
    double flush_secs;   /* a write at least this often while events come (0: 120, SummaryWriter's) */
    bool learning_rate;  /* --log-learning-rate-to-tensorboard (on; --no-... turns it off) */
    bool loss_scale;     /* --log-loss-scale-to-tensorboard (on; --no-... turns it off) */
    bool validation_ppl; /* --log-validation-ppl-to-tensorboard */
    bool timers;         /* --log-timers-to-tensorboard */
    bool memory;         /* --log-memory-to-tensorboard */
    bool world_size;     /* --log-world-size-to-tensorboard */
    int world;           /* the job's training ranks (world-size's value) */
} ob_tb_options;

typedef struct ob_tb ob_tb;

/* The options of a configuration whose job has world training ranks. */
void ob_tb_options_from_config(ob_tb_options *o, const struct co_config *c, int world);
/* Creates the event file (tfevents.h). 0 or a CO_E* code, co_err_detail says which step. */
int ob_tb_open(ob_tb **out, const ob_tb_options *o);
/* The event file's path. */
const char *ob_tb_path(const ob_tb *tb);
/* One metrics record (a JSON object, len bytes, no NUL needed): its tags are queued.
 * Records that are no JSON object or carry nothing TensorBoard shows are ignored (0).
 * After a write error every later call returns that error at once. */
int ob_tb_record(ob_tb *tb, const char *json, size_t len);
/* Writes what is queued. */
int ob_tb_flush(ob_tb *tb);
/* Flushes, closes the file; *tb becomes NULL. 0 or the first error. */
int ob_tb_close(ob_tb **tb);

/* A stream for metrics records: every byte goes on to file (when not NULL; flushed at
 * each fflush of the stream), every complete line to tb. fclose of the stream closes file
 * and tb (a TensorBoard error is reported once on stderr, the metrics file goes on).
 * NULL (errno set) when the stream cannot be made; file and tb are then not closed. */
FILE *ob_tee_open(FILE *file, ob_tb *tb);

#endif
