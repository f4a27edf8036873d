/* checksum.h - the weights' checksum data-parallel replicas compare every step (silent data
 * corruption, resilience/rerun.h): XXH3-64 of each block of KB_SUM_BLOCK floats, seeded by
 * the caller's seed plus the block's index, the blocks' hashes combined by XOR. Blocks let a
 * kernel hash what it has just written while it is still in cache (the CPU backend's AdamW
 * does, adamw_checksum in backend.h), and in any order or on any thread, with one result. */
#ifndef COHORT_KERNELS_CHECKSUM_H
#define COHORT_KERNELS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define KB_SUM_BLOCK ((size_t)16384)

/* The checksum of x[0..n) (host memory). */
uint64_t kb_checksum_f32(const float *x, size_t n, uint64_t seed);
/* One block: x[0..n), n <= KB_SUM_BLOCK, the block'th of its buffer. */
uint64_t kb_checksum_block(const float *x, size_t n, uint64_t seed, size_t block);

#endif
