/* log.h - cohort's one way to say something on stderr: a level and the process's prefix.
 *
 * Every line a process logs reads "<prefix>: <message>\n", where the prefix names the process
 * ("cohort supervisor", "cohort node agent 1", "cohort rank 3", "cohort ckpt") and is set once
 * when the process knows who it is (co_log_set_prefix). A line is written with one write(2),
 * so lines from threads and from processes sharing a terminal do not interleave mid-line.
 * Lines below the level in COHORT_LOG_LEVEL (debug, info, warn, error; info when unset) are
 * dropped. Redis's serverLog is the model.
 *
 * What is not a log line stays out of it: a command's own report on stdout, `--help`, and the
 * Megatron-style iteration line, whose format users' tools parse. */
#ifndef COHORT_COMMON_LOG_H
#define COHORT_COMMON_LOG_H

typedef enum {
    CO_LOG_DEBUG = 0, /* what a developer chasing a fault wants; off by default */
    CO_LOG_INFO = 1,  /* what a run did: a restart, a checkpoint, a rank replaced */
    CO_LOG_WARN = 2,  /* something went wrong and was handled, or will be refused later */
    CO_LOG_ERROR = 3, /* something failed; the process or the job stops or recovers */
} co_log_level;

/* Sets the prefix of this process's lines (printf format); the default is "cohort". */
void co_log_set_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The prefix now in use ("cohort rank 3"). */
const char *co_log_prefix(void);
/* Lines below `level` are dropped from now on (overrides COHORT_LOG_LEVEL). */
void co_log_set_level(co_log_level level);
/* Whether a line at `level` would be written. */
int co_log_enabled(co_log_level level);

/* Writes "<prefix>: <message>\n" to stderr when `level` is enabled. The message has no
 * trailing newline; a long one is cut at 4 KiB. */
void co_log(co_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
