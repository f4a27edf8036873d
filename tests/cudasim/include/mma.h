// mma.h - the CUDA stand-in's WMMA (nvcuda::wmma, tensor-core fragments) for device code compiled
// with the host C++ compiler (tests/cudasim/, docs/testing.md). Found before CUDA's own mma.h.
//
// Only the subset cohort's kernels use: 16x16x16 fragments of bf16 (matrix_a / matrix_b, row- or
// column-major) and float accumulators; fill_fragment, load_matrix_sync, store_matrix_sync,
// mma_sync. On a GPU a fragment is spread over the warp's 32 lanes in an unspecified mapping;
// here every lane holds the whole tile (its logical row-major image), which is the same thing
// to a kernel that never indexes fragment elements. So:
//   - every lane of the warp must call each operation (the calls meet at a warp barrier, so
//     a divergent call is reported as the stand-in reports a divergent __syncwarp);
//   - a load reads the whole tile through the kernel's (shared-memory-checked) pointer, so
//     words another lane wrote without an ordering __syncwarp are reported as races;
//   - a store writes lane l's share (elements e with e mod 32 == l), so another lane's
//     reading them needs a __syncwarp, as on a GPU.
// mma_sync computes each output element as c + (sum over k of a*b in double), rounded to
// float once: a GPU's tensor cores accumulate in fp32 in an unspecified order, so results
// agree with a GPU to fp32 accumulation error, not bitwise. cudasim_mma_count (sim_exec.cc)
// counts the warp-level products, so a test can tell that a tensor-core path ran.
#ifndef COHORT_TESTS_CUDASIM_MMA_H
#define COHORT_TESTS_CUDASIM_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>

#include "cudasim_device.h"

extern "C" uint64_t cudasim_mma_count; // warp-level mma_sync calls (lane 0 counts)

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

static inline float sim_to_float(float v) { return v; }
static inline float sim_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
static inline float sim_round(float *, float x) { return x; }
static inline float sim_round(__nv_bfloat16 *, float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// rows x cols of the tile this fragment holds, in logical (row-major) order
template <class Use, int M, int N, int K> struct sim_shape;
template <int M, int N, int K> struct sim_shape<matrix_a, M, N, K> { enum { R = M, C = K }; };
template <int M, int N, int K> struct sim_shape<matrix_b, M, N, K> { enum { R = K, C = N }; };
template <int M, int N, int K> struct sim_shape<accumulator, M, N, K> { enum { R = M, C = N }; };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  public:
    enum { rows = sim_shape<Use, M, N, K>::R, cols = sim_shape<Use, M, N, K>::C, num_elements = rows * cols };
    static_assert(M == 16 && N == 16 && K == 16, "the stand-in's WMMA has 16x16x16 fragments only");
    float v[num_elements]; // the values (bf16 ones exactly representable)
    typedef T element_type;
};

static inline void sim_warp_meet(const char *what) {
    (void)::cudasim::warp_op(::cudasim::W_SYNCWARP, 0xffffffffu, 0, 0, what, 0);
}

template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float x) {
    for (int i = 0; i < f.num_elements; i++) f.v[i] = sim_round((T *)0, x);
}

// matrix_a / matrix_b: the layout is the fragment's; element (r, c) of the tile is
// p[r * ldm + c] (row_major) or p[c * ldm + r] (col_major)
template <class Use, int M, int N, int K, class T, class L, class P>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, P p, unsigned ldm) {
    sim_warp_meet("wmma::load_matrix_sync");
    const bool col = std::is_same<L, col_major>::value;
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) {
            long i = col ? (long)c * ldm + r : (long)r * ldm + c;
            T x = p[i];
            f.v[r * f.cols + c] = sim_to_float(x);
        }
}

template <int M, int N, int K, class P>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, P p, unsigned ldm, layout_t lay) {
    sim_warp_meet("wmma::load_matrix_sync");
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) {
            long i = lay == mem_col_major ? (long)c * ldm + r : (long)r * ldm + c;
            float x = p[i];
            f.v[r * f.cols + c] = x;
        }
}

template <int M, int N, int K, class P>
static inline void store_matrix_sync(P p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm,
                                     layout_t lay) {
    sim_warp_meet("wmma::store_matrix_sync");
    int lane = ::cudasim::g_thread->lane;
    for (int e = lane; e < f.num_elements; e += 32) {
        int r = e / f.cols, c = e % f.cols;
        long i = lay == mem_col_major ? (long)c * ldm + r : (long)r * ldm + c;
        p[i] = f.v[e];
    }
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                            const fragment<matrix_b, M, N, K, TB, LB> &b,
                            const fragment<accumulator, M, N, K, float> &c) {
    sim_warp_meet("wmma::mma_sync");
    if (::cudasim::g_thread->lane == 0) __atomic_add_fetch(&cudasim_mma_count, 1, __ATOMIC_RELAXED);
    float out[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) s += (double)a.v[i * K + k] * (double)b.v[k * N + j];
            out[i * N + j] = (float)((double)c.v[i * N + j] + s);
        }
    for (int i = 0; i < M * N; i++) d.v[i] = out[i];
}

} // namespace wmma
} // namespace nvcuda

#endif
