/* nprng.c - numpy's MT19937 (legacy RandomState) and PCG64 (default_rng) generators. */
#include "data/nprng.h"

#include "common/error.h"

/* ---- MT19937 (numpy/random/src/mt19937) ---- */

#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfU
#define MT_UPPER 0x80000000U
#define MT_LOWER 0x7fffffffU

void np_mt_seed(np_mt19937 *mt, uint32_t seed) {
    for (int pos = 0; pos < NP_MT_N; pos++) {
        mt->key[pos] = seed;
        seed = (uint32_t)(1812433253U * (seed ^ (seed >> 30)) + (uint32_t)pos + 1U);
    }
    mt->pos = NP_MT_N;
}

static void mt_gen(np_mt19937 *mt) {
    uint32_t y;
    int i;
    for (i = 0; i < NP_MT_N - MT_M; i++) {
        y = (mt->key[i] & MT_UPPER) | (mt->key[i + 1] & MT_LOWER);
        mt->key[i] = mt->key[i + MT_M] ^ (y >> 1) ^ (-(y & 1U) & MT_MATRIX_A);
    }
    for (; i < NP_MT_N - 1; i++) {
        y = (mt->key[i] & MT_UPPER) | (mt->key[i + 1] & MT_LOWER);
        mt->key[i] = mt->key[i + (MT_M - NP_MT_N)] ^ (y >> 1) ^ (-(y & 1U) & MT_MATRIX_A);
    }
    y = (mt->key[NP_MT_N - 1] & MT_UPPER) | (mt->key[0] & MT_LOWER);
    mt->key[NP_MT_N - 1] = mt->key[MT_M - 1] ^ (y >> 1) ^ (-(y & 1U) & MT_MATRIX_A);
    mt->pos = 0;
}

uint32_t np_mt_next32(np_mt19937 *mt) {
    if (mt->pos == NP_MT_N) mt_gen(mt);
    uint32_t y = mt->key[mt->pos++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

uint64_t np_mt_next64(np_mt19937 *mt) {
    uint64_t hi = np_mt_next32(mt);
    uint64_t lo = np_mt_next32(mt);
    return (hi << 32) | lo;
}

uint64_t np_mt_interval(np_mt19937 *mt, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max, value;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    if (max <= 0xffffffffULL) {
        while ((value = (np_mt_next32(mt) & mask)) > max) {
        }
    } else {
        while ((value = (np_mt_next64(mt) & mask)) > max) {
        }
    }
    return value;
}

#define NP_SHUFFLE(name, type)                                                  \
    void name(np_mt19937 *mt, type *x, size_t n) {                              \
        if (n < 2) return;                                                      \
        for (size_t i = n - 1; i >= 1; i--) {                                   \
            size_t j = (size_t)np_mt_interval(mt, (uint64_t)i);                 \
            type t = x[i];                                                      \
            x[i] = x[j];                                                        \
            x[j] = t;                                                           \
        }                                                                       \
    }
NP_SHUFFLE(np_mt_shuffle_i32, int32_t)
NP_SHUFFLE(np_mt_shuffle_u32, uint32_t)
NP_SHUFFLE(np_mt_shuffle_i64, int64_t)

/* ---- SeedSequence (numpy/random/bit_generator.pyx) ---- */

#define SS_INIT_A 0x43b0d7e5U
#define SS_MULT_A 0x931e8875U
#define SS_INIT_B 0x8b51f9ddU
#define SS_MULT_B 0x58f38dedU
#define SS_MIX_MULT_L 0xca01f9ddU
#define SS_MIX_MULT_R 0x4973f715U
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    r ^= r >> SS_XSHIFT;
    return r;
}

/* SeedSequence(seed).generate_state(n_words32) */
static void ss_generate(uint64_t seed, uint32_t *out, int n_words) {
    uint32_t entropy[2];
    int n_ent = 0;
    if (seed == 0) {
        entropy[n_ent++] = 0;
    } else {
        while (seed > 0) {
            entropy[n_ent++] = (uint32_t)(seed & 0xffffffffU);
            seed >>= 32;
        }
    }
    uint32_t pool[SS_POOL];
    uint32_t hc = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++)
        pool[i] = ss_hashmix(i < n_ent ? entropy[i] : 0U, &hc);
    for (int s = 0; s < SS_POOL; s++)
        for (int d = 0; d < SS_POOL; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    /* n_ent <= 2 < pool size: no remaining entropy words to mix in. */
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < n_words; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> SS_XSHIFT;
        out[i] = v;
    }
}

/* ---- PCG64 (numpy/random/src/pcg64) ---- */

__extension__ typedef unsigned __int128 u128;

#define PCG_MULT_HI 0x2360ED051FC65DA4ULL
#define PCG_MULT_LO 0x4385DF649FCCF645ULL

static u128 mk128(uint64_t hi, uint64_t lo) { return ((u128)hi << 64) | lo; }

static void pcg_step(np_pcg64 *g) {
    u128 s = mk128(g->state_hi, g->state_lo);
    s = s * mk128(PCG_MULT_HI, PCG_MULT_LO) + mk128(g->inc_hi, g->inc_lo);
    g->state_hi = (uint64_t)(s >> 64);
    g->state_lo = (uint64_t)s;
}

void np_pcg64_seed(np_pcg64 *g, uint64_t seed) {
    uint32_t w[8];
    ss_generate(seed, w, 8);
    uint64_t v[4];
    for (int i = 0; i < 4; i++) v[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    u128 initstate = mk128(v[0], v[1]);
    u128 initseq = mk128(v[2], v[3]);
    u128 inc = (initseq << 1) | 1U;
    g->state_hi = 0;
    g->state_lo = 0;
    g->inc_hi = (uint64_t)(inc >> 64);
    g->inc_lo = (uint64_t)inc;
    pcg_step(g);
    u128 s = mk128(g->state_hi, g->state_lo) + initstate;
    g->state_hi = (uint64_t)(s >> 64);
    g->state_lo = (uint64_t)s;
    pcg_step(g);
    g->has_uint32 = 0;
    g->uinteger = 0;
}

uint64_t np_pcg64_next64(np_pcg64 *g) {
    pcg_step(g);
    uint64_t x = g->state_hi ^ g->state_lo;
    unsigned rot = (unsigned)(g->state_hi >> 58);
    return (x >> rot) | (x << ((64U - rot) & 63U));
}

uint32_t np_pcg64_next32(np_pcg64 *g) {
    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    uint64_t next = np_pcg64_next64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)(next & 0xffffffffU);
}

static uint32_t lemire32(np_pcg64 *g, uint32_t rng) {
    const uint32_t rng_excl = rng + 1;
    uint64_t m = (uint64_t)np_pcg64_next32(g) * rng_excl;
    uint32_t leftover = (uint32_t)(m & 0xffffffffU);
    if (leftover < rng_excl) {
        const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
        while (leftover < threshold) {
            m = (uint64_t)np_pcg64_next32(g) * rng_excl;
            leftover = (uint32_t)(m & 0xffffffffU);
        }
    }
    return (uint32_t)(m >> 32);
}

int np_pcg64_integers_i32(np_pcg64 *g, int32_t low, int32_t high, size_t n, int32_t *out) {
    if (low >= high)
        return co_err_set(CO_EINVAL, "integers: low (%d) >= high (%d)", (int)low, (int)high);
    uint32_t rng = (uint32_t)((int64_t)high - 1 - (int64_t)low);
    uint32_t off = (uint32_t)low;
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        if (rng == 0)
            v = off;
        else if (rng == 0xffffffffU)
            v = off + np_pcg64_next32(g);
        else
            v = off + lemire32(g, rng);
        out[i] = (int32_t)v;
    }
    return 0;
}
