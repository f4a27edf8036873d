/* error.h - cohort's error codes: negative integers, one table for names and messages.
 *
 * Every library function that can fail returns 0 (or a count) on success and a negative
 * CO_E* code on failure. The code says what kind of failure it was: local (NOMEM, IO,
 * NOSPC), remote (REMOTE, PROTOCOL, TIMEOUT waiting on a peer), misuse by the caller
 * (INVAL), or an abort that was asked for (ABORTED) -- what a supervisor needs to choose
 * between restart and stop. co_err_detail() holds the human sentence
 * for the most recent failure on this thread (file names, the step that failed).
 * Library code never calls exit(). */
#ifndef COHORT_COMMON_ERROR_H
#define COHORT_COMMON_ERROR_H

#include <stddef.h>

/* X(name, value, message) */
#define CO_ERRNO_MAP(X)                                                          \
    X(NOMEM, -1, "out of memory")                                                \
    X(INVAL, -2, "invalid argument")                                             \
    X(IO, -3, "input/output error")                                              \
    X(FORMAT, -4, "malformed file or message")                                   \
    X(NOENT, -5, "no such file or object")                                       \
    X(RANGE, -6, "value out of range")                                           \
    X(UNSUPPORTED, -7, "not supported by this build or device")                  \
    X(INTERRUPTED, -8, "interrupted")                                            \
    X(TIMEOUT, -9, "timed out")                                                  \
    X(NOSPC, -10, "no space left on device")                                     \
    X(INTERNAL, -11, "internal error")                                           \
    X(ABORTED, -12, "aborted")                                                   \
    X(REMOTE, -13, "a remote peer failed or went away")                          \
    X(PROTOCOL, -14, "protocol violation by a peer")                             \
    X(DENIED, -15, "permission denied")                                          \
    X(CORRUPT, -16, "no usable copy: the data failed verification")

typedef enum {
    CO_OK = 0,
#define CO__ERR_ENUM(name, val, msg) CO_E##name = (val),
    CO_ERRNO_MAP(CO__ERR_ENUM)
#undef CO__ERR_ENUM
} co_err;

/* "CO_EFORMAT" */
const char *co_err_name(int code);
/* "malformed file or message" */
const char *co_strerror(int code);

/* Records a detailed message for this thread and returns code (so callers can write
 * `return co_err_set(CO_EFORMAT, "%s: header too short", path);`). */
int co_err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The detail recorded by the last co_err_set on this thread ("" if none). */
const char *co_err_detail(void);
/* Clears the detail. */
void co_err_clear(void);

#endif
