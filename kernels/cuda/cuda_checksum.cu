// cuda_checksum.cu - the weights' blocked checksum on the GPU (kernels/checksum.h), so that
// the weights never travel to the host to be hashed: XXH3-64 of each block of KB_SUM_BLOCK
// floats, seeded by the run's seed plus the block's index, restated here in integer device
// code bit for bit with xxhash's scalar path (XXH3_64bits_withSeed, xxhash 0.8: the short
// inputs' paths and the long input's stripes, scrambles and merge over the seeded secret);
// the blocks' digests are combined by XOR on the device.
//   checksum_runs:  every run's blocks hashed, one XOR, 8 bytes to the host, one wait.
//   adamw_checksum: AdamW and the hash of each block it has just written in one kernel; the
//                   run's digest waits on the device until the backend's next sync copies
//                   every pending digest to the host at once (backend.h).
// Eight threads hash one block: lane l keeps XXH3's accumulator l over the block's stripes
// (accumulator l reads input words l and l^1 of each stripe and scrambles alone), then the
// eight accumulators meet by warp shuffles for the merge.
#include "kernels/cuda/cu_common.cuh"

extern "C" {
#include "kernels/checksum.h"
}

// xxhash's default secret (XXH3_kSecret) as 24 little-endian words: passed to the kernels by
// value, each thread derives the seeded secret (XXH3_initCustomSecret) from it
struct cu_xxh_secret {
    uint64_t w[24];
};

static const unsigned char xxh_ksecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static cu_xxh_secret xxh_secret(void) {
    cu_xxh_secret k;
    for (int i = 0; i < 24; i++) {
        uint64_t w = 0;
        for (int j = 7; j >= 0; j--) w = (w << 8) | xxh_ksecret[8 * i + j];
        k.w[i] = w;
    }
    return k;
}

#define XP32_1 0x9E3779B1ull
#define XP32_2 0x85EBCA77ull
#define XP32_3 0xC2B2AE3Dull
#define XP64_1 0x9E3779B185EBCA87ull
#define XP64_2 0xC2B2AE3D27D4EB4Full
#define XP64_3 0x165667B19E3779F9ull
#define XP64_4 0x85EBCA77C2B2AE63ull
#define XP64_5 0x27D4EB2F165667C5ull

// word i of the secret seeded with seed (seed 0: the default secret)
__device__ __forceinline__ uint64_t xs_word(const cu_xxh_secret &k, uint64_t seed, int i) {
    return (i & 1) ? k.w[i] - seed : k.w[i] + seed;
}
// the secret's 8 bytes from byte offset o, any alignment
__device__ __forceinline__ uint64_t xs64(const cu_xxh_secret &k, uint64_t seed, int o) {
    int i = o >> 3, s = (o & 7) * 8;
    uint64_t lo = xs_word(k, seed, i);
    return s ? (lo >> s) | (xs_word(k, seed, i + 1) << (64 - s)) : lo;
}
// the input's bytes [o, o+4) and [o, o+8) as xxhash reads them (o a multiple of 4)
__device__ __forceinline__ uint64_t xi32(const float *x, size_t o) { return __float_as_uint(x[o >> 2]); }
__device__ __forceinline__ uint64_t xi64(const float *x, size_t o) { return xi32(x, o) | (xi32(x, o + 4) << 32); }

__device__ __forceinline__ uint64_t x_fold(uint64_t a, uint64_t b) {
    return (a * b) ^ (uint64_t)__umul64hi((unsigned long long)a, (unsigned long long)b);
}
__device__ __forceinline__ uint64_t x_rotl(uint64_t v, int r) { return (v << r) | (v >> (64 - r)); }
__device__ __forceinline__ uint64_t x_swap64(uint64_t v) {
    uint64_t r = 0;
    for (int i = 0; i < 8; i++) r = (r << 8) | ((v >> (8 * i)) & 0xff);
    return r;
}
__device__ __forceinline__ uint64_t x_avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}
__device__ __forceinline__ uint64_t x_rrmxmx(uint64_t h, uint64_t len) {
    h ^= x_rotl(h, 49) ^ x_rotl(h, 24);
    h *= 0x9FB21C651E98DF25ull;
    h ^= (h >> 35) + len;
    h *= 0x9FB21C651E98DF25ull;
    return h ^ (h >> 28);
}
__device__ __forceinline__ uint64_t x_mix16(const float *x, size_t o, const cu_xxh_secret &k, int so, uint64_t seed) {
    return x_fold(xi64(x, o) ^ (xs64(k, 0, so) + seed), xi64(x, o + 8) ^ (xs64(k, 0, so + 8) - seed));
}

// XXH3_64bits_withSeed of len bytes, 4 <= len <= 240, a multiple of 4 (xxhash's short paths,
// over the default secret)
__device__ uint64_t x_short(const float *x, size_t len, const cu_xxh_secret &k, uint64_t seed) {
    if (len <= 8) {
        uint32_t s32 = (uint32_t)seed;
        uint64_t sw = ((s32 & 0xffu) << 24) | ((s32 & 0xff00u) << 8) | ((s32 >> 8) & 0xff00u) | (s32 >> 24);
        uint64_t sd = seed ^ (sw << 32);
        uint64_t in64 = xi32(x, len - 4) + (xi32(x, 0) << 32);
        return x_rrmxmx(in64 ^ ((xs64(k, 0, 8) ^ xs64(k, 0, 16)) - sd), len);
    }
    if (len <= 16) {
        uint64_t lo = xi64(x, 0) ^ ((xs64(k, 0, 24) ^ xs64(k, 0, 32)) + seed);
        uint64_t hi = xi64(x, len - 8) ^ ((xs64(k, 0, 40) ^ xs64(k, 0, 48)) - seed);
        return x_avalanche(len + x_swap64(lo) + hi + x_fold(lo, hi));
    }
    uint64_t acc = len * XP64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += x_mix16(x, 48, k, 96, seed);
                    acc += x_mix16(x, len - 64, k, 112, seed);
                }
                acc += x_mix16(x, 32, k, 64, seed);
                acc += x_mix16(x, len - 48, k, 80, seed);
            }
            acc += x_mix16(x, 16, k, 32, seed);
            acc += x_mix16(x, len - 32, k, 48, seed);
        }
        acc += x_mix16(x, 0, k, 0, seed);
        acc += x_mix16(x, len - 16, k, 16, seed);
        return x_avalanche(acc);
    }
    for (int i = 0; i < 8; i++) acc += x_mix16(x, 16 * i, k, 16 * i, seed);
    acc = x_avalanche(acc);
    for (int i = 8; i < (int)len / 16; i++) acc += x_mix16(x, 16 * i, k, 16 * (i - 8) + 3, seed);
    acc += x_mix16(x, len - 16, k, 136 - 17, seed);
    return x_avalanche(acc);
}

// lane l's part of XXH3_accumulate_512 on the stripe at byte io with the secret from so
__device__ __forceinline__ uint64_t x_stripe(uint64_t acc, const float *x, size_t io, const cu_xxh_secret &k,
                                             uint64_t seed, int so, int l) {
    uint64_t key = xi64(x, io + 8 * l) ^ xs64(k, seed, so + 8 * l);
    return acc + xi64(x, io + 8 * (l ^ 1)) + (key & 0xffffffffull) * (key >> 32);
}

// accumulator l of XXH3's long path over len > 240 bytes (the secret seeded with seed)
__device__ uint64_t x_long_lane(const float *x, size_t len, const cu_xxh_secret &k, uint64_t seed, int l) {
    const uint64_t init[8] = {XP32_3, XP64_1, XP64_2, XP64_3, XP64_4, XP32_2, XP64_5, XP32_1};
    uint64_t acc = init[l];
    size_t nb = (len - 1) / 1024; // blocks of 16 stripes of 64 bytes
    for (size_t b = 0; b < nb; b++) {
        for (int s = 0; s < 16; s++) acc = x_stripe(acc, x, b * 1024 + 64 * (size_t)s, k, seed, 8 * s, l);
        acc ^= acc >> 47;
        acc ^= xs64(k, seed, 192 - 64 + 8 * l);
        acc *= XP32_1;
    }
    int ns = (int)(((len - 1) - 1024 * nb) / 64);
    for (int s = 0; s < ns; s++) acc = x_stripe(acc, x, nb * 1024 + 64 * (size_t)s, k, seed, 8 * s, l);
    return x_stripe(acc, x, len - 64, k, seed, 192 - 64 - 7, l);
}

// XXH3_64bits_withSeed(x, 4 * n, seed) by a group of 8 consecutive threads of a warp, lane l =
// the thread's place in its group; every thread of the warp calls it (each group its own
// block; n = 0: no block, returns 0, reads nothing). Every lane of a group gets the digest.
__device__ uint64_t cu_xxh3_group(const float *x, size_t n, uint64_t seed, const cu_xxh_secret &k, int l) {
    size_t len = n * 4;
    bool lng = len > 240;
    uint64_t acc = lng ? x_long_lane(x, len, k, seed, l) : 0;
    uint64_t a[8];
    const int base = (int)(threadIdx.x & 31) & ~7;
    for (int j = 0; j < 8; j++) a[j] = (uint64_t)__shfl_sync(0xffffffffu, (unsigned long long)acc, base + j);
    if (len == 0) return 0;
    if (!lng) return x_short(x, len, k, seed);
    uint64_t r = len * XP64_1;
    for (int i = 0; i < 4; i++)
        r += x_fold(a[2 * i] ^ xs64(k, seed, 11 + 16 * i), a[2 * i + 1] ^ xs64(k, seed, 11 + 16 * i + 8));
    return x_avalanche(r);
}

// dig[blk] = the digest of block blk of x[0..n), 8 threads a block
__global__ void k_checksum(uint64_t *__restrict__ dig, const float *__restrict__ x, size_t n, uint64_t seed,
                           size_t nblk, cu_xxh_secret k) {
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, blk = gid >> 3;
    size_t lo = blk * KB_SUM_BLOCK, len = blk < nblk ? (n - lo < KB_SUM_BLOCK ? n - lo : KB_SUM_BLOCK) : 0;
    uint64_t h = cu_xxh3_group(len ? x + lo : x, len, seed + blk, k, (int)(gid & 7));
    if ((gid & 7) == 0 && blk < nblk) dig[blk] = h;
}

// *out = the XOR of dig[0..nd) (one block of XS_THREADS)
#define XS_THREADS 256
__global__ void k_xor_final(uint64_t *__restrict__ out, const uint64_t *__restrict__ dig, size_t nd) {
    __shared__ unsigned long long red[32];
    unsigned long long v = 0;
    for (size_t i = threadIdx.x; i < nd; i += XS_THREADS) v ^= dig[i];
    for (int o = 16; o > 0; o >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long s = 0;
        for (int w = 0; w < XS_THREADS / 32; w++) s ^= red[w];
        *out = s;
    }
}

static size_t blocks_of(size_t n) { return (n + KB_SUM_BLOCK - 1) / KB_SUM_BLOCK; }

uint64_t cu_checksum_runs(kb_backend *b, const float *const *x, const size_t *n, const uint64_t *seed, int nruns) {
    if (!cu_enter(b)) return 0;
    cu_state *st = cu_st(b);
    size_t total = 0;
    for (int j = 0; j < nruns; j++) total += blocks_of(n[j]);
    uint64_t *dig = (uint64_t *)cu_scratch(b, CU_SCR_SUM, (total + 1) * sizeof(uint64_t), "checksum");
    if (!dig) return 0;
    cu_xxh_secret k = xxh_secret();
    size_t at = 1;
    for (int j = 0; j < nruns; j++) {
        size_t nb = blocks_of(n[j]);
        if (!nb) continue;
        k_checksum<<<cu_blocks(nb * 8, XS_THREADS, (size_t)1 << 31), XS_THREADS, 0, st->stream>>>(dig + at, x[j], n[j],
                                                                                                 seed[j], nb, k);
        if (cu_launched(b, "checksum")) return 0;
        at += nb;
    }
    k_xor_final<<<1, XS_THREADS, 0, st->stream>>>(dig, dig + 1, total);
    if (cu_launched(b, "checksum")) return 0;
    if (cu_check(b, cudaMemcpyAsync(st->host_result, dig, sizeof(uint64_t), cudaMemcpyDeviceToHost, st->stream),
                 "checksum") ||
        cu_check(b, cudaStreamSynchronize(st->stream), "checksum (asynchronous failure)"))
        return 0;
    uint64_t h;
    memcpy(&h, st->host_result, sizeof h);
    return h;
}

// ---- AdamW with the checksum of what it wrote ----

// one block of AS_THREADS per checksum block: the update, a barrier (the block's writes are
// visible to its threads), then warp 0 hashes the block (its 4 groups of 8 the same block)
#define AS_THREADS 256
__global__ void k_adamw_checksum(float *__restrict__ p, const float *__restrict__ g, float *__restrict__ m,
                                 float *__restrict__ v, size_t n, float lr, float beta1, float beta2, float c1,
                                 float c2, float ib1, float ib2, float eps, float wd, float gscale,
                                 uint64_t *__restrict__ dig, uint64_t seed, cu_xxh_secret k) {
    size_t blk = blockIdx.x, lo = blk * KB_SUM_BLOCK, hi = n - lo < KB_SUM_BLOCK ? n : lo + KB_SUM_BLOCK;
    for (size_t i = lo + threadIdx.x; i < hi; i += AS_THREADS)
        cu_adamw_elem(p, g, m, v, i, lr, beta1, beta2, c1, c2, ib1, ib2, eps, wd, gscale);
    __syncthreads();
    if (threadIdx.x < 32) {
        uint64_t h = cu_xxh3_group(p + lo, hi - lo, seed + blk, k, (int)(threadIdx.x & 7));
        if (threadIdx.x == 0) dig[blk] = h;
    }
}

// room for one more pending digest; a full list is delivered first (a wait, then it grows)
static bool digests_room(kb_backend *b) {
    cu_state *st = cu_st(b);
    if (st->dig_pending < st->dig_cap) return true;
    if (st->dig_pending) {
        if (cu_check(b, cudaMemcpyAsync(st->dig_host, st->dig_dev, (size_t)st->dig_pending * sizeof(uint64_t),
                                        cudaMemcpyDeviceToHost, st->stream), "adamw_checksum") ||
            cu_check(b, cudaStreamSynchronize(st->stream), "adamw_checksum"))
            return false;
        cu_digests_deliver(b);
    }
    int cap = st->dig_cap ? 2 * st->dig_cap : 256;
    if (st->dig_dev) cudaFree(st->dig_dev);
    if (st->dig_host) cudaFreeHost(st->dig_host);
    free(st->dig_ptr);
    st->dig_dev = NULL, st->dig_host = NULL, st->dig_cap = 0;
    st->dig_ptr = (uint64_t **)malloc((size_t)cap * sizeof *st->dig_ptr);
    if (!st->dig_ptr) return cu_fail(b, CO_ENOMEM, "adamw_checksum", "out of host memory"), false;
    if (cu_check(b, cudaMalloc((void **)&st->dig_dev, (size_t)cap * sizeof(uint64_t)), "adamw_checksum") ||
        cu_check(b, cudaMallocHost((void **)&st->dig_host, (size_t)cap * sizeof(uint64_t)), "adamw_checksum"))
        return false;
    st->dig_cap = cap;
    return true;
}

void cu_adamw_checksum(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                       float beta2, float eps, float wd, float gscale, int64_t t, uint64_t seed, uint64_t *sum) {
    if (!sum) {
        cu_adamw(b, p, g, m, v, n, lr, beta1, beta2, eps, wd, gscale, t);
        return;
    }
    if (!cu_enter(b) || !digests_room(b)) return;
    cu_state *st = cu_st(b);
    size_t nb = blocks_of(n);
    uint64_t *out = st->dig_dev + st->dig_pending;
    if (nb) {
        uint64_t *dig = (uint64_t *)cu_scratch(b, CU_SCR_SUM, nb * sizeof(uint64_t), "adamw_checksum");
        if (!dig) return;
        if (t < 1) t = 1;
        float ib1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
        float ib2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
        k_adamw_checksum<<<(unsigned)nb, AS_THREADS, 0, st->stream>>>(p, g, m, v, n, lr, beta1, beta2, 1.0f - beta1,
                                                                     1.0f - beta2, ib1, ib2, eps, wd, gscale, dig,
                                                                     seed, xxh_secret());
        if (cu_launched(b, "adamw_checksum")) return;
        k_xor_final<<<1, XS_THREADS, 0, st->stream>>>(out, dig, nb);
        if (cu_launched(b, "adamw_checksum")) return;
    } else if (cu_check(b, cudaMemsetAsync(out, 0, sizeof *out, st->stream), "adamw_checksum")) {
        return; // an empty run's digest is 0
    }
    st->dig_ptr[st->dig_pending++] = sum;
}

void cu_digests_copy(kb_backend *b) {
    cu_state *st = cu_st(b);
    if (st->dig_pending && !b->status)
        cu_check(b, cudaMemcpyAsync(st->dig_host, st->dig_dev, (size_t)st->dig_pending * sizeof(uint64_t),
                                    cudaMemcpyDeviceToHost, st->stream), "adamw_checksum (the digests)");
}

void cu_digests_deliver(kb_backend *b) {
    cu_state *st = cu_st(b);
    if (!b->status)
        for (int i = 0; i < st->dig_pending; i++) *st->dig_ptr[i] = st->dig_host[i];
    st->dig_pending = 0;
}

void cu_digests_release(cu_state *st) {
    if (st->dig_dev) cudaFree(st->dig_dev);
    if (st->dig_host) cudaFreeHost(st->dig_host);
    free(st->dig_ptr);
    st->dig_dev = NULL, st->dig_host = NULL, st->dig_ptr = NULL;
    st->dig_cap = st->dig_pending = 0;
}
