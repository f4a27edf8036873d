/* rng.h - a small deterministic generator (xoshiro256**, seeded by splitmix64) for
 * initialisation and sampling. Dropout uses the counter-based kb_rand32 instead, so that a
 * step can be replayed without saving generator state. */
#ifndef COHORT_COMMON_RNG_H
#define COHORT_COMMON_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct co_rng {
    uint64_t s[4];
} co_rng;

static inline uint64_t co_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void co_rng_seed(co_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = co_splitmix64(&seed);
}

static inline uint64_t co_rng_next(co_rng *r) {
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* uniform in [0, 1) */
static inline double co_rng_uniform(co_rng *r) { return (double)(co_rng_next(r) >> 11) * 0x1.0p-53; }

/* standard normal (Box-Muller, one value per call) */
static inline double co_rng_normal(co_rng *r) {
    double u1 = co_rng_uniform(r), u2 = co_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
