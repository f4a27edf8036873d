/* nprng.h - exact reimplementations of the numpy random generators Megatron's data
 * pipeline depends on.
 *
 *  - np_mt19937: numpy's legacy numpy.random.RandomState(seed) (MT19937 seeded with
 *    init_genrand from a 32-bit seed) and its `shuffle` of a 1-D array, which draws
 *    j = random_interval(i) for i = n-1 .. 1 and swaps x[i], x[j]. Used by GPTDataset for
 *    the document and shuffle indices.
 *  - np_pcg64: numpy.random.default_rng(seed) (SeedSequence -> PCG64 XSL-RR) and
 *    Generator.integers(low, high, size, dtype=numpy.int32) (buffered 32-bit draws and
 *    Lemire's bounded method). Used by MockGPTDataset's document lengths.
 *
 * All functions are pure computation and cannot fail except where an int is returned. */
#ifndef COHORT_DATA_NPRNG_H
#define COHORT_DATA_NPRNG_H

#include <stddef.h>
#include <stdint.h>

#define NP_MT_N 624

typedef struct {
    uint32_t key[NP_MT_N];
    int pos;
} np_mt19937;

/* numpy.random.RandomState(seed) for an integer seed in [0, 2^32). */
void np_mt_seed(np_mt19937 *mt, uint32_t seed);
/* One 32-bit output (mt19937_next32). */
uint32_t np_mt_next32(np_mt19937 *mt);
/* One 64-bit output: (next32 << 32) | next32, high word drawn first (mt19937_next64). */
uint64_t np_mt_next64(np_mt19937 *mt);
/* numpy's random_interval(max): uniform in [0, max] by mask rejection; 32-bit draws when
 * max <= 0xffffffff, else 64-bit draws. */
uint64_t np_mt_interval(np_mt19937 *mt, uint64_t max);
/* RandomState.shuffle(x) of a 1-D array of n elements, in place. */
void np_mt_shuffle_i32(np_mt19937 *mt, int32_t *x, size_t n);
void np_mt_shuffle_u32(np_mt19937 *mt, uint32_t *x, size_t n);
void np_mt_shuffle_i64(np_mt19937 *mt, int64_t *x, size_t n);

typedef struct {
    uint64_t state_hi, state_lo; /* 128-bit LCG state */
    uint64_t inc_hi, inc_lo;     /* 128-bit increment (odd) */
    int has_uint32;              /* buffered upper half of the last 64-bit draw */
    uint32_t uinteger;
} np_pcg64;

/* numpy.random.default_rng(seed) for a non-negative integer seed < 2^64
 * (SeedSequence(seed).generate_state(4, uint64) -> pcg64_set_seed). */
void np_pcg64_seed(np_pcg64 *g, uint64_t seed);
/* One 64-bit output (LCG step then XSL-RR). */
uint64_t np_pcg64_next64(np_pcg64 *g);
/* One 32-bit output: the low half of a fresh 64-bit draw, the buffered high half next. */
uint32_t np_pcg64_next32(np_pcg64 *g);
/* Generator.integers(low, high, size=n, dtype=numpy.int32): values in [low, high).
 * Returns 0, or CO_EINVAL when low >= high. */
int np_pcg64_integers_i32(np_pcg64 *g, int32_t low, int32_t high, size_t n, int32_t *out);

#endif
