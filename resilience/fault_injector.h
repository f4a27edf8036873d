/* fault_injector.h - Megatron's random fault injector (megatron/core/fault_injector.py over
 * nvidia-resiliency-ext's faults) as cohort's fault kinds: the pure part, the plan drawn at
 * the start of training and after every restart. The supervisor fires it.
 *
 * As in Megatron: the target ranks are --fault-injector-ranks, or --fault-injector-num-ranks
 * ranks drawn from 1..world-1 (rank 0 is never drawn); one fault type per plan, drawn from
 * --fault-injector-fault-types weighted by --fault-injector-fault-probabilities (normalised;
 * default equal); the delay is --fault-injector-fault-delay, or --fault-injector-offset-seconds
 * plus an exponential draw with mean --fault-injector-mtti-seconds. Every target rank gets
 * the same fault at the same time. The draws come from --fault-injector-seed alone, so the
 * sequence of plans is the same on every run (where in the run each one lands depends on the
 * wall clock).
 *
 * Type names (case-insensitive, '_' and '-' alike): NVRx's SIGKILL, SEGFAULT, OS_ABORT (the
 * rank dies: cohort's kill), SIGSTOP (stop), GPU_SLEEP, LOCK_GIL (the rank stops making
 * progress: hang), Megatron's example name crash (kill), and cohort's own kinds kill, stop,
 * hang, slow, nan, inf, spike, bitflip-grad, bitflip-param, bitflip-act. NVRx's GPU_ERROR,
 * WORKLOAD_EXC, ASYNC_EXC, SIGNAL_EXC, SIGINT, SIGTERM are refused (fi_rand_init says why). */
#ifndef COHORT_RESILIENCE_FAULT_INJECTOR_H
#define COHORT_RESILIENCE_FAULT_INJECTOR_H

#include "common/rng.h"
#include "resilience/inject.h"

#include <stdbool.h>
#include <stdint.h>

#define FI_RAND_MAX_TYPES 16
#define FI_RAND_MAX_RANKS 64

typedef struct fi_rand {
    int ranks[FI_RAND_MAX_RANKS]; /* --fault-injector-ranks */
    int nranks;                   /* 0: draw num_ranks of 1..world-1 */
    int num_ranks;
    int world;
    fi_kind kinds[FI_RAND_MAX_TYPES];
    char names[FI_RAND_MAX_TYPES][24]; /* as given */
    double weight[FI_RAND_MAX_TYPES];  /* normalised */
    int ntypes;
    double delay_s;  /* >= 0: the fixed delay; < 0: offset + Exp(mtti) */
    double mtti_s, offset_s;
    co_rng rng;
    int nplans;      /* plans drawn so far */
} fi_rand;

/* One plan: `kind` on ranks[0..n) after delay_s seconds. */
typedef struct fi_rand_plan {
    int ranks[FI_RAND_MAX_RANKS];
    int n;
    fi_kind kind;
    const char *type; /* the type's name as given */
    double delay_s;
} fi_rand_plan;

/* The flags as given (ranks, types, probabilities: comma lists; "" or NULL: not given;
 * num_ranks 0: not given; delay_s < 0: not given; mtti_s 0: not given). Refuses, with one line
 * in co_err_detail() naming the flag: both or neither of ranks and num_ranks, a rank outside
 * 0..world-1, num_ranks outside 1..world-1, an unknown or unsupported type, probabilities whose
 * count differs or that are negative or sum to 0, neither a delay nor an MTTI. */
int fi_rand_init(fi_rand *r, const char *ranks, int num_ranks, const char *types, const char *probabilities,
                 double delay_s, double mtti_s, double offset_s, uint64_t seed, int world);

/* Whether the flags ask for the injector at all (Megatron: ranks or num_ranks given). */
static inline bool fi_rand_wanted(const char *ranks, int num_ranks) { return (ranks && *ranks) || num_ranks > 0; }

/* The next plan (Megatron's order: ranks, then type, then delay). */
void fi_rand_draw(fi_rand *r, fi_rand_plan *p);

/* The fault kind a type name stands for; CO_EINVAL (with why) for names cohort refuses. */
int fi_rand_kind(const char *name, fi_kind *kind);

#endif
