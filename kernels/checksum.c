/* checksum.c - the weights' blocked checksum (see checksum.h). */
#include "kernels/checksum.h"

#include <xxhash.h>

uint64_t kb_checksum_block(const float *x, size_t n, uint64_t seed, size_t block) {
    return XXH3_64bits_withSeed(x, n * sizeof(float), seed + block);
}

uint64_t kb_checksum_f32(const float *x, size_t n, uint64_t seed) {
    uint64_t h = 0;
    for (size_t b = 0, lo = 0; lo < n; b++, lo += KB_SUM_BLOCK)
        h ^= kb_checksum_block(x + lo, n - lo < KB_SUM_BLOCK ? n - lo : KB_SUM_BLOCK, seed, b);
    return h;
}
