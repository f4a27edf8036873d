/* inject.h - the fault injector's schedule: `--inject` specifications parsed into faults,
 * and the question every injection point asks ("does a fault fire here, now?").
 *
 *   KIND@rank=R,step=S[,microbatch=M][,phase=P][,times=once|always][,bit=B][,ms=N]
 *
 * R and S may be `*` (any rank) or `A-B` (a range): the fault then takes one value drawn
 * from --inject-seed and its position in the list, so a random schedule is the same on
 * every run and every rank. step is the 1-based iteration (as in the log line), microbatch
 * the 0-based micro batch within the rank's share of the step, phase one of forward,
 * backward, allreduce, optimizer (default: the kind's natural phase). Kinds:
 *
 *   kill            SIGKILL the rank                 stop   SIGSTOP the rank
 *   hang            busy loop inside compute          slow   sleep ms (default 200) per micro batch;
 *                                                            times=always: every step from S on
 *   nan, inf, spike the loss of one micro batch is NaN, Inf or 1000x; times=always: every
 *                   computation of that batch (also on a peer that recomputes it), a data problem
 *   bitflip-grad    flip bit B (random if absent) of one gradient value
 *   bitflip-param   flip bit B of one parameter (silent memory corruption); phase=optimizer:
 *                   right after the step's update
 *   bitflip-act     flip bit B of one activation during forward
 *   msg-delay, msg-drop, msg-dup   the rank's loss report is delayed (ms), dropped or sent twice
 *   kill-supervisor the supervisor SIGKILLs itself when the step begins
 */
#ifndef COHORT_RESILIENCE_INJECT_H
#define COHORT_RESILIENCE_INJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most specs one schedule holds: `cohort train --inject` (also the flag's list size,
 * CO_MAX_DATA_PATHS) and one `cohort inject` call alike; fi_schedule_add refuses more. */
#define FI_MAX_SPECS 64

/* A bound on steps at or above this is "not known" (`cohort inject` checking syntax only,
 * the supervisor's own check): a bad step is then refused as "not an iteration number". */
#define FI_STEPS_UNBOUNDED (INT64_MAX / 8)

typedef enum {
    FI_KILL, FI_STOP, FI_HANG, FI_SLOW, FI_NAN, FI_INF, FI_SPIKE, FI_BITFLIP_GRAD, FI_BITFLIP_PARAM,
    FI_BITFLIP_ACT, FI_MSG_DELAY, FI_MSG_DROP, FI_MSG_DUP, FI_KILL_SUPERVISOR, FI_NKINDS
} fi_kind;

typedef enum { FI_PH_DEFAULT = 0, FI_PH_FORWARD, FI_PH_BACKWARD, FI_PH_ALLREDUCE, FI_PH_OPTIMIZER } fi_phase;

typedef struct fi_fault {
    fi_kind kind;
    int rank;          /* -1: the supervisor (kill-supervisor) */
    int64_t step;
    int microbatch;    /* -1: any */
    fi_phase phase;
    bool always;
    int bit;           /* -1: drawn from the seed */
    int ms;
    uint64_t salt;     /* per-fault random stream (bit and element choice) */
    int fired;
    char spec[160];
} fi_fault;

typedef struct fi_schedule {
    fi_fault *f;
    int n;
} fi_schedule;

/* Parses every spec (index k is the k-th --inject; at most FI_MAX_SPECS). world: ranks;
 * train_iters bounds steps (1..train_iters; <= 0 or >= FI_STEPS_UNBOUNDED: any positive
 * step). A key given twice in one spec is refused. On error: CO_EINVAL (or CO_ENOMEM) with
 * one message naming the spec in co_err_detail(). */
int fi_schedule_parse(fi_schedule *s, char *const *specs, int nspecs, uint64_t seed, int world, int64_t train_iters);
/* The same for a running job (`cohort inject`): steps must be in first..last, the
 * iterations it has still to run. */
int fi_schedule_parse_live(fi_schedule *s, char *const *specs, int nspecs, int world, int64_t first, int64_t last);
/* Adds one more (`cohort inject` against a running job); when the schedule is full, a fault
 * that fired once (spent) makes room; CO_EINVAL past FI_MAX_SPECS faults still live. */
int fi_schedule_add(fi_schedule *s, const char *spec, uint64_t seed, int world, int64_t train_iters);
void fi_schedule_free(fi_schedule *s);

/* The natural phase of a kind (where it fires when phase= is not given). */
fi_phase fi_default_phase(fi_kind k);
const char *fi_kind_name(fi_kind k);
const char *fi_phase_name(fi_phase p);

/* The next fault of `kind` that fires on `rank` at (step, microbatch, phase), or NULL.
 * For nan/inf/spike pass data_rank: the rank whose micro batch is computed (a peer may
 * recompute another rank's batch); a times=always fault fires for everyone who computes
 * it, a once fault only on its rank the first time. Marks the fault fired. */
fi_fault *fi_take(fi_schedule *s, fi_kind kind, int rank, int data_rank, int64_t step, int microbatch,
                  fi_phase phase);

/* Flips bit `bit` (or one drawn from f->salt) of one of x[0..n) (drawn from f->salt);
 * returns the index; *bit_out the bit. */
size_t fi_flip(const fi_fault *f, float *x, size_t n, int *bit_out);

/* One line describing a firing, for the log: "inject: nan on rank 1 at step 20, micro batch 0". */
void fi_describe(const fi_fault *f, int rank, int64_t step, int microbatch, char *buf, size_t n);

#endif
