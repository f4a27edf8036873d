/* sim_reduce.c - the NCCL stand-in's element-wise reductions: sum, prod, max, min and avg
 * (a sum, then one division by the rank count) over NCCL's integer and floating types.
 * Half and bfloat16 values are widened to float, combined, and rounded back (to nearest
 * even) at every step, as a reduction in the type itself would. */
#include "tests/cudasim/nccl/sim_nccl.h"

#include <math.h>
#include <string.h>

size_t sim_type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0; /* the fp8 types: not modelled */
    }
}

static float bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float f16_to_f(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else {
        float f = ldexpf((float)m, -24); /* subnormal */
        return s ? -f : f;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return s | 0x7e00;      /* NaN */
    if (a >= 0x477ff000u) return s | 0x7c00;     /* overflows to infinity (from 65520 up) */
    if (a < 0x38800000u) {                       /* subnormal or zero: round |f| * 2^24 */
        float x = ldexpf(fabsf(f), 24);
        return s | (uint16_t)lrintf(x);          /* lrintf: to nearest even */
    }
    uint32_t m = a + 0xfffu + ((a >> 13) & 1);   /* round the 13 dropped bits to nearest even */
    return s | (uint16_t)((m - 0x38000000u) >> 13);
}

/* U: the type sums and products are computed in (integers: the unsigned one of the same
 * width, so that they wrap as on a GPU instead of overflowing) */
#define APPLY(acc, v, op, T, U)                                                                    \
    switch (op) {                                                                                  \
    case ncclProd: acc = (T)((U)acc * (U)v); break;                                                \
    case ncclMax: acc = v > acc ? v : acc; break;                                                  \
    case ncclMin: acc = v < acc ? v : acc; break;                                                  \
    default: acc = (T)((U)acc + (U)v); break; /* sum, avg */                                       \
    }

#define NATIVE(T, U)                                                                               \
    static void red_##T(T *d, const T *s, size_t n, ncclRedOp_t op) {                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a = d[i], v = s[i];                                                                  \
            APPLY(a, v, op, T, U);                                                                 \
            d[i] = a;                                                                              \
        }                                                                                          \
    }
NATIVE(int8_t, uint32_t)
NATIVE(uint8_t, uint32_t)
NATIVE(int32_t, uint32_t)
NATIVE(uint32_t, uint32_t)
NATIVE(int64_t, uint64_t)
NATIVE(uint64_t, uint64_t)
NATIVE(float, float)
NATIVE(double, double)

static void red_half(uint16_t *d, const uint16_t *s, size_t n, ncclRedOp_t op, bool bf) {
    for (size_t i = 0; i < n; i++) {
        float a = bf ? bf16_to_f(d[i]) : f16_to_f(d[i]), v = bf ? bf16_to_f(s[i]) : f16_to_f(s[i]);
        APPLY(a, v, op, float, float);
        d[i] = bf ? f_to_bf16(a) : f_to_f16(a);
    }
}

void sim_reduce(void *dst, const void *src, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
    case ncclInt8: red_int8_t(dst, src, n, op); break;
    case ncclUint8: red_uint8_t(dst, src, n, op); break;
    case ncclInt32: red_int32_t(dst, src, n, op); break;
    case ncclUint32: red_uint32_t(dst, src, n, op); break;
    case ncclInt64: red_int64_t(dst, src, n, op); break;
    case ncclUint64: red_uint64_t(dst, src, n, op); break;
    case ncclFloat32: red_float(dst, src, n, op); break;
    case ncclFloat64: red_double(dst, src, n, op); break;
    case ncclFloat16: red_half(dst, src, n, op, false); break;
    case ncclBfloat16: red_half(dst, src, n, op, true); break;
    default: break;
    }
}

#define DIVIDE(T)                                                                                  \
    for (size_t i = 0; i < n; i++) ((T *)dst)[i] = (T)(((T *)dst)[i] / (T)k);

void sim_finish_avg(void *dst, size_t n, ncclDataType_t t, int k) {
    switch (t) {
    case ncclInt8: DIVIDE(int8_t) break;
    case ncclUint8: DIVIDE(uint8_t) break;
    case ncclInt32: DIVIDE(int32_t) break;
    case ncclUint32: DIVIDE(uint32_t) break;
    case ncclInt64: DIVIDE(int64_t) break;
    case ncclUint64: DIVIDE(uint64_t) break;
    case ncclFloat32: DIVIDE(float) break;
    case ncclFloat64: DIVIDE(double) break;
    case ncclFloat16:
    case ncclBfloat16: {
        bool bf = t == ncclBfloat16;
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++) {
            float a = (bf ? bf16_to_f(h[i]) : f16_to_f(h[i])) / (float)k;
            h[i] = bf ? f_to_bf16(a) : f_to_f16(a);
        }
        break;
    }
    default: break;
    }
}
