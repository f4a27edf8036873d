/* fault_injector.c - Megatron's random fault injector's plans over cohort's fault kinds
 * (see fault_injector.h). */
#include "resilience/fault_injector.h"

#include "common/error.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A type name: NVRx's faults, Megatron's example, cohort's kinds; why: NULL where cohort has
 * the fault, else why it is refused. */
typedef struct type_entry {
    const char *name;
    fi_kind kind;
    const char *why;
} type_entry;

static const type_entry types[] = {
    {"sigkill", FI_KILL, NULL},
    {"segfault", FI_KILL, NULL},
    {"os_abort", FI_KILL, NULL},
    {"crash", FI_KILL, NULL},
    {"sigstop", FI_STOP, NULL},
    {"gpu_sleep", FI_HANG, NULL},
    {"lock_gil", FI_HANG, NULL},
    {"kill", FI_KILL, NULL},
    {"stop", FI_STOP, NULL},
    {"hang", FI_HANG, NULL},
    {"slow", FI_SLOW, NULL},
    {"nan", FI_NAN, NULL},
    {"inf", FI_INF, NULL},
    {"spike", FI_SPIKE, NULL},
    {"bitflip_grad", FI_BITFLIP_GRAD, NULL},
    {"bitflip_param", FI_BITFLIP_PARAM, NULL},
    {"bitflip_act", FI_BITFLIP_ACT, NULL},
    {"gpu_error", FI_KILL, "a CUDA error raised on the device; use sigkill or segfault (the rank dies as it would)"},
    {"workload_exc", FI_KILL, "a Python exception inside the training loop; use sigkill or hang"},
    {"async_exc", FI_KILL, "a Python exception raised in the main thread; use sigkill or hang"},
    {"signal_exc", FI_KILL, "a SIGUSR1 turned into a Python exception; use sigkill or hang"},
    {"sigterm", FI_KILL, "cohort takes SIGTERM as a request to save and stop, not a fault; use sigkill"},
    {"sigint", FI_KILL, "cohort takes SIGINT as a request to save and stop, not a fault; use sigkill"},
};

int fi_rand_kind(const char *name, fi_kind *kind) {
    char low[32];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof low)
        return co_err_set(CO_EINVAL, "--fault-injector-fault-types: '%s' is not a fault type", name);
    for (size_t i = 0; i <= n; i++) low[i] = name[i] == '-' ? '_' : (char)tolower((unsigned char)name[i]);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (strcmp(types[i].name, low)) continue;
        if (types[i].why)
            return co_err_set(CO_EINVAL, "--fault-injector-fault-types: %s is not supported by cohort (%s)", name,
                              types[i].why);
        *kind = types[i].kind;
        return 0;
    }
    return co_err_set(CO_EINVAL,
                      "--fault-injector-fault-types: '%s' is not a fault type (give sigkill, segfault, os_abort, sigstop, "
                      "gpu_sleep, lock_gil, or one of cohort's: kill stop hang slow nan inf spike bitflip-grad "
                      "bitflip-param bitflip-act)", name);
}

/* Splits a comma list into at most max items of at most item_len-1 characters; the count,
 * or -1 (too many or too long). */
static int split(const char *s, char (*out)[24], int max) {
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (n >= max || len == 0 || len >= sizeof out[0]) return -1;
        memcpy(out[n], p, len);
        out[n++][len] = '\0';
        if (!e) return n;
        p = e + 1;
    }
}

static int parse_ranks(fi_rand *r, const char *ranks, int world) {
    char items[FI_RAND_MAX_RANKS][24];
    int n = split(ranks, items, FI_RAND_MAX_RANKS);
    if (n < 0) return co_err_set(CO_EINVAL, "--fault-injector-ranks '%s': give a comma list of at most %d ranks", ranks,
                                 FI_RAND_MAX_RANKS);
    for (int i = 0; i < n; i++) {
        char *end;
        long v = strtol(items[i], &end, 10);
        if (*end || v < 0 || v >= world)
            return co_err_set(CO_EINVAL, "--fault-injector-ranks: '%s' is not a rank of this job (0..%d)", items[i],
                              world - 1);
        r->ranks[r->nranks++] = (int)v;
    }
    return 0;
}

static int parse_types(fi_rand *r, const char *types, const char *probabilities) {
    if (!types || !*types)
        return co_err_set(CO_EINVAL, "--fault-injector-fault-types is needed with --fault-injector-ranks or "
                                     "--fault-injector-num-ranks (e.g. sigkill,sigstop)");
    r->ntypes = split(types, r->names, FI_RAND_MAX_TYPES);
    if (r->ntypes < 0)
        return co_err_set(CO_EINVAL, "--fault-injector-fault-types '%s': give a comma list of at most %d types", types,
                          FI_RAND_MAX_TYPES);
    for (int i = 0; i < r->ntypes; i++) {
        int rc = fi_rand_kind(r->names[i], &r->kinds[i]);
        if (rc) return rc;
        r->weight[i] = 1.0 / r->ntypes;
    }
    if (!probabilities || !*probabilities) return 0;
    char items[FI_RAND_MAX_TYPES][24];
    int n = split(probabilities, items, FI_RAND_MAX_TYPES);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        char *end;
        r->weight[i] = strtod(items[i], &end);
        if (*end || !(r->weight[i] >= 0) || !isfinite(r->weight[i])) n = -1;
        if (n < 0) break;
        sum += r->weight[i];
    }
    if (n != r->ntypes || !(sum > 0))
        return co_err_set(CO_EINVAL, "--fault-injector-fault-probabilities '%s': give %d non-negative weights, one per "
                                     "type of --fault-injector-fault-types, not all 0", probabilities, r->ntypes);
    for (int i = 0; i < n; i++) r->weight[i] /= sum;
    return 0;
}

int fi_rand_init(fi_rand *r, const char *ranks, int num_ranks, const char *types, const char *probabilities,
                 double delay_s, double mtti_s, double offset_s, uint64_t seed, int world) {
    memset(r, 0, sizeof *r);
    r->world = world;
    bool have_ranks = ranks && *ranks;
    if (have_ranks && num_ranks > 0)
        return co_err_set(CO_EINVAL, "--fault-injector-ranks and --fault-injector-num-ranks: give one of them");
    if (!have_ranks && num_ranks <= 0)
        return co_err_set(CO_EINVAL, "--fault-injector-ranks or --fault-injector-num-ranks is needed");
    if (have_ranks) {
        int rc = parse_ranks(r, ranks, world);
        if (rc) return rc;
    } else if (num_ranks > world - 1 || num_ranks > FI_RAND_MAX_RANKS) {
        return co_err_set(CO_EINVAL, "--fault-injector-num-ranks %d: ranks are drawn from 1..%d (rank 0 never), give "
                                     "at most %d", num_ranks, world - 1, world - 1 < FI_RAND_MAX_RANKS ? world - 1 :
                                     FI_RAND_MAX_RANKS);
    }
    r->num_ranks = num_ranks;
    int rc = parse_types(r, types, probabilities);
    if (rc) return rc;
    if (delay_s < 0 && !(mtti_s > 0))
        return co_err_set(CO_EINVAL, "--fault-injector-mtti-seconds (> 0) or --fault-injector-fault-delay is needed");
    if (!(offset_s >= 0) || !isfinite(offset_s) || !isfinite(mtti_s))
        return co_err_set(CO_EINVAL, "--fault-injector-offset-seconds %g: give a number of seconds >= 0", offset_s);
    r->delay_s = delay_s;
    r->mtti_s = mtti_s;
    r->offset_s = offset_s;
    co_rng_seed(&r->rng, seed);
    return 0;
}

void fi_rand_draw(fi_rand *r, fi_rand_plan *p) {
    memset(p, 0, sizeof *p);
    if (r->nranks) {
        memcpy(p->ranks, r->ranks, (size_t)r->nranks * sizeof p->ranks[0]);
        p->n = r->nranks;
    } else {
        /* k of 1..world-1 without replacement: a partial Fisher-Yates shuffle */
        int pool[FI_RAND_MAX_RANKS * 4], m = r->world - 1 < (int)(sizeof pool / sizeof pool[0]) ? r->world - 1 :
                                                 (int)(sizeof pool / sizeof pool[0]);
        for (int i = 0; i < m; i++) pool[i] = i + 1;
        for (int i = 0; i < r->num_ranks && i < m; i++) {
            int j = i + (int)(co_rng_next(&r->rng) % (uint64_t)(m - i));
            int t = pool[i];
            pool[i] = pool[j];
            pool[j] = t;
            p->ranks[p->n++] = pool[i];
        }
    }
    double u = co_rng_uniform(&r->rng), acc = 0;
    int t = r->ntypes - 1;
    for (int i = 0; i < r->ntypes; i++) {
        acc += r->weight[i];
        if (u < acc) {
            t = i;
            break;
        }
    }
    p->kind = r->kinds[t];
    p->type = r->names[t];
    p->delay_s = r->delay_s >= 0 ? r->delay_s : r->offset_s - log(1.0 - co_rng_uniform(&r->rng)) * r->mtti_s;
    r->nplans++;
}
