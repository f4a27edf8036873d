/* inject.c - parsing --inject specifications and matching them at injection points
 * (see inject.h). */
#include "resilience/inject.h"

#include "common/config.h"
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --inject is a list flag: it must hold at least the specs a schedule may have */
_Static_assert(FI_MAX_SPECS <= CO_MAX_DATA_PATHS, "--inject's list is shorter than FI_MAX_SPECS");

static const char *const kind_names[FI_NKINDS] = {
    "kill", "stop", "hang", "slow", "nan", "inf", "spike", "bitflip-grad", "bitflip-param",
    "bitflip-act", "msg-delay", "msg-drop", "msg-dup", "kill-supervisor",
};

const char *fi_kind_name(fi_kind k) { return k < FI_NKINDS ? kind_names[k] : "?"; }

const char *fi_phase_name(fi_phase p) {
    static const char *const n[] = {"default", "forward", "backward", "allreduce", "optimizer"};
    return p <= FI_PH_OPTIMIZER ? n[p] : "?";
}

fi_phase fi_default_phase(fi_kind k) {
    switch (k) {
    case FI_BITFLIP_GRAD: return FI_PH_BACKWARD;
    case FI_BITFLIP_PARAM: return FI_PH_FORWARD;
    case FI_MSG_DELAY:
    case FI_MSG_DROP:
    case FI_MSG_DUP: return FI_PH_ALLREDUCE;
    default: return FI_PH_FORWARD;
    }
}

static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A refused spec: CO_EINVAL with the spec, what is wrong and the syntax as the detail. */
static int bad(const char *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const char *spec, const char *fmt, ...) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return co_err_set(CO_EINVAL, "--inject '%s': %s (syntax: KIND@rank=R,step=S[,microbatch=M][,phase=P]"
                                 "[,times=once|always][,bit=B][,ms=N]; see cohort train --help)", spec, what);
}

/* "N", "*" or "A-B" within [lo, hi]: a value, drawn from r when not fixed. */
static int parse_range(const char *v, int64_t lo, int64_t hi, uint64_t r, int64_t *out) {
    char *end;
    if (!strcmp(v, "*")) {
        if (hi < lo) return -1;
        *out = lo + (int64_t)(r % (uint64_t)(hi - lo + 1));
        return 0;
    }
    long long a = strtoll(v, &end, 10);
    if (end == v) return -1;
    if (!*end) {
        if (a < lo || a > hi) return -1;
        *out = a;
        return 0;
    }
    if (*end != '-') return -1;
    const char *p = end + 1;
    long long b = strtoll(p, &end, 10);
    if (end == p || *end || a > b || a < lo || b > hi) return -1;
    *out = a + (int64_t)(r % (uint64_t)(b - a + 1));
    return 0;
}

/* The steps a spec may name: lo..hi, and how a refusal says so. */
typedef struct step_range {
    int64_t lo, hi;
    const char *what; /* " (...)" after the range; NULL: any step >= 1 */
    bool live;        /* a running job's: lo is two after the iteration it is at */
} step_range;

static step_range train_steps(int64_t train_iters) {
    if (train_iters <= 0 || train_iters >= FI_STEPS_UNBOUNDED) return (step_range){1, FI_STEPS_UNBOUNDED, NULL, false};
    return (step_range){1, train_iters, " (iterations 1 to --train-iters)", false};
}

static int parse_one(const char *spec, int index, uint64_t seed, int world, step_range steps, fi_fault *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->spec, sizeof f->spec, "%s", spec);
    f->microbatch = -1;
    f->bit = -1;
    f->salt = mix64(seed ^ mix64((uint64_t)index + 1));
    char buf[256];
    if (strlen(spec) >= sizeof buf) return bad(spec, "too long");
    snprintf(buf, sizeof buf, "%s", spec);
    char *at = strchr(buf, '@');
    if (at) *at = '\0';
    int k = 0;
    while (k < FI_NKINDS && strcmp(buf, kind_names[k])) k++;
    if (k == FI_NKINDS) return bad(spec, "unknown kind '%s'", buf);
    f->kind = (fi_kind)k;
    bool have_rank = false, have_step = false;
    unsigned seen = 0; /* keys given (a bit per key) */
    char *save = NULL;
    for (char *kv = at ? strtok_r(at + 1, ",", &save) : NULL; kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return bad(spec, "'%s' is not key=value", kv);
        *eq = '\0';
        const char *key = kv, *val = eq + 1;
        int64_t v;
        static const char *const keys[] = {"rank", "step", "microbatch", "phase", "times", "bit", "ms"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            if (!strcmp(key, keys[k])) {
                if (seen & (1u << k)) return bad(spec, "'%s' is given twice", key);
                seen |= 1u << k;
            }
        if (!strcmp(key, "rank")) {
            if (parse_range(val, 0, world - 1, mix64(f->salt ^ 1), &v))
                return bad(spec, "rank '%s' is not in 0..%d", val, world - 1);
            f->rank = (int)v;
            have_rank = true;
        } else if (!strcmp(key, "step")) {
            if (parse_range(val, steps.lo, steps.hi, mix64(f->salt ^ 2), &v)) {
                if (!steps.what) return bad(spec, "step '%s' is not an iteration number (1, 2, ...)", val);
                char *end;
                long long s0 = strtoll(val, &end, 10);
                if (steps.live && end != val && !*end && s0 >= 1 && s0 < steps.lo)
                    return bad(spec, "step %lld is too soon: the job is at iteration %lld (give %lld..%lld)",
                               s0, (long long)steps.lo - 2, (long long)steps.lo, (long long)steps.hi);
                return bad(spec, "step '%s' is not in %lld..%lld%s", val, (long long)steps.lo,
                           (long long)steps.hi, steps.what);
            }
            f->step = v;
            have_step = true;
        } else if (!strcmp(key, "microbatch")) {
            if (parse_range(val, 0, 1 << 20, mix64(f->salt ^ 3), &v)) return bad(spec, "microbatch '%s'", val);
            f->microbatch = (int)v;
        } else if (!strcmp(key, "phase")) {
            fi_phase p = !strcmp(val, "forward")     ? FI_PH_FORWARD
                         : !strcmp(val, "backward")  ? FI_PH_BACKWARD
                         : !strcmp(val, "allreduce") ? FI_PH_ALLREDUCE
                         : !strcmp(val, "optimizer") ? FI_PH_OPTIMIZER
                                                     : FI_PH_DEFAULT;
            if (p == FI_PH_DEFAULT) return bad(spec, "phase '%s' is not forward|backward|allreduce|optimizer", val);
            f->phase = p;
        } else if (!strcmp(key, "times")) {
            if (strcmp(val, "once") && strcmp(val, "always")) return bad(spec, "times must be once or always");
            f->always = !strcmp(val, "always");
        } else if (!strcmp(key, "bit")) {
            if (parse_range(val, 0, 31, mix64(f->salt ^ 4), &v)) return bad(spec, "bit '%s' is not in 0..31", val);
            f->bit = (int)v;
        } else if (!strcmp(key, "ms")) {
            if (parse_range(val, 0, 3600 * 1000, mix64(f->salt ^ 5), &v)) return bad(spec, "ms '%s'", val);
            f->ms = (int)v;
        } else {
            return bad(spec, "unknown key '%s'", key);
        }
    }
    if (!have_step) return bad(spec, "step= is required");
    if (f->kind == FI_KILL_SUPERVISOR) {
        f->rank = -1;
    } else if (!have_rank) {
        return bad(spec, "rank= is required");
    }
    if (!f->phase) f->phase = fi_default_phase(f->kind);
    if (!f->ms) f->ms = f->kind == FI_SLOW ? 200 : f->kind == FI_MSG_DELAY ? 300 : 0;
    if (f->always && f->kind != FI_NAN && f->kind != FI_INF && f->kind != FI_SPIKE && f->kind != FI_SLOW)
        return bad(spec, "times=always applies to nan, inf, spike and slow only");
    return 0;
}

static int parse_all(fi_schedule *s, char *const *specs, int nspecs, uint64_t seed, int world, step_range steps) {
    memset(s, 0, sizeof *s);
    if (nspecs <= 0) return 0;
    if (nspecs > FI_MAX_SPECS)
        return co_err_set(CO_EINVAL, "%d fault specs: at most %d may be given (FI_MAX_SPECS)", nspecs, FI_MAX_SPECS);
    s->f = calloc((size_t)nspecs, sizeof *s->f);
    if (!s->f) return co_err_set(CO_ENOMEM, "--inject: out of memory");
    for (int i = 0; i < nspecs; i++) {
        int rc = parse_one(specs[i], i, seed, world, steps, &s->f[i]);
        if (rc) {
            fi_schedule_free(s);
            return rc;
        }
    }
    s->n = nspecs;
    return 0;
}

int fi_schedule_parse(fi_schedule *s, char *const *specs, int nspecs, uint64_t seed, int world, int64_t train_iters) {
    return parse_all(s, specs, nspecs, seed, world, train_steps(train_iters));
}

int fi_schedule_parse_live(fi_schedule *s, char *const *specs, int nspecs, int world, int64_t first, int64_t last) {
    step_range r = {first, last, " (the iterations the job has still to run, at least two ahead)", true};
    return parse_all(s, specs, nspecs, 0, world, r);
}

/* Drops the first fault that fired once and cannot fire again: a long job under the random
 * fault injector keeps receiving faults; true if one was dropped. */
static bool drop_spent(fi_schedule *s) {
    for (int i = 0; i < s->n; i++)
        if (s->f[i].fired && !s->f[i].always) {
            memmove(&s->f[i], &s->f[i + 1], sizeof *s->f * (size_t)(s->n - i - 1));
            s->n--;
            return true;
        }
    return false;
}

int fi_schedule_add(fi_schedule *s, const char *spec, uint64_t seed, int world, int64_t train_iters) {
    if (s->n >= FI_MAX_SPECS) drop_spent(s);
    if (s->n >= FI_MAX_SPECS)
        return co_err_set(CO_EINVAL, "--inject '%s': the job already has %d faults scheduled, the most it holds "
                                     "(FI_MAX_SPECS)", spec, FI_MAX_SPECS);
    fi_fault f;
    int rc = parse_one(spec, s->n, seed, world, train_steps(train_iters), &f);
    if (rc) return rc;
    fi_fault *nf = realloc(s->f, sizeof *nf * (size_t)(s->n + 1));
    if (!nf) return co_err_set(CO_ENOMEM, "--inject: out of memory");
    s->f = nf;
    s->f[s->n++] = f;
    return 0;
}

void fi_schedule_free(fi_schedule *s) {
    free(s->f);
    s->f = NULL;
    s->n = 0;
}

fi_fault *fi_take(fi_schedule *s, fi_kind kind, int rank, int data_rank, int64_t step, int microbatch, fi_phase phase) {
    for (int i = 0; s && i < s->n; i++) {
        fi_fault *f = &s->f[i];
        if (f->kind != kind || f->phase != phase) continue;
        /* slow,times=always: a straggler from its step on */
        if (f->step != step && !(kind == FI_SLOW && f->always && step > f->step)) continue;
        if (f->microbatch >= 0 && microbatch >= 0 && f->microbatch != microbatch) continue;
        bool data_kind = kind == FI_NAN || kind == FI_INF || kind == FI_SPIKE;
        bool repeats = f->always && (data_kind || kind == FI_SLOW);
        if (data_kind && f->always) {
            if (f->rank != data_rank) continue; /* whoever computes that batch */
        } else {
            if (f->rank != rank) continue;
            if (data_kind && data_rank != rank) continue;
        }
        if (f->fired && !repeats) continue;
        f->fired++;
        return f;
    }
    return NULL;
}

size_t fi_flip(const fi_fault *f, float *x, size_t n, int *bit_out) {
    uint64_t r = mix64(f->salt ^ 0xB17F11Full);
    size_t idx = n ? (size_t)(r % n) : 0;
    int bit = f->bit >= 0 ? f->bit : (int)((r >> 40) % 32);
    if (n) {
        uint32_t u;
        memcpy(&u, &x[idx], sizeof u);
        u ^= 1u << bit;
        memcpy(&x[idx], &u, sizeof u);
    }
    if (bit_out) *bit_out = bit;
    return idx;
}

void fi_describe(const fi_fault *f, int rank, int64_t step, int microbatch, char *buf, size_t n) {
    if (f->kind == FI_KILL_SUPERVISOR)
        snprintf(buf, n, "inject: %s at step %lld (--inject %s)", fi_kind_name(f->kind), (long long)step, f->spec);
    else
        snprintf(buf, n, "inject: %s on rank %d at step %lld, micro batch %d, phase %s (--inject %s)",
                 fi_kind_name(f->kind), rank, (long long)step, microbatch, fi_phase_name(f->phase), f->spec);
}
