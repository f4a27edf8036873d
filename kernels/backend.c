/* backend.c - creates the backend for the requested device. */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#ifdef COHORT_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

int kb_cuda_available(char *why, size_t n) {
#ifdef COHORT_HAVE_CUDA
    return cuda_device_count(why, n);
#else
    if (why && n)
        snprintf(why, n, "this build has no CUDA backend (configured without it: meson's summary says why)");
    return 0;
#endif
}

int kb_backend_new(kb_backend **out, const kb_options *opt) {
    if (!out) return co_err_set(CO_EINVAL, "kb_backend_new: out is NULL");
    *out = NULL;
    kb_options def = {.device = KB_DEVICE_CPU, .threads = 0, .bf16 = false};
    if (!opt) opt = &def;
    switch (opt->device) {
    case KB_DEVICE_CPU:
        return cpu_backend_create(out, opt);
    case KB_DEVICE_CUDA:
#ifdef COHORT_HAVE_CUDA
        return cuda_backend_create(out, opt);
#else
        return co_err_set(CO_EUNSUPPORTED, "the CUDA backend is not part of this build (configured without it: "
                                           "meson's summary says why)");
#endif
    }
    return co_err_set(CO_EINVAL, "kb_backend_new: unknown device %d", (int)opt->device);
}

void kb_backend_destroy(kb_backend **b) {
    if (!b || !*b) return;
    if ((*b)->opt.device == KB_DEVICE_CPU) cpu_backend_release(*b);
#ifdef COHORT_HAVE_CUDA
    else if ((*b)->opt.device == KB_DEVICE_CUDA) cuda_backend_release(*b);
#endif
    *b = NULL;
}

const char *kb_backend_describe(const kb_backend *b) {
    if (!b) return "none";
    if (b->opt.device == KB_DEVICE_CPU) return cpu_backend_describe(b);
#ifdef COHORT_HAVE_CUDA
    if (b->opt.device == KB_DEVICE_CUDA) return cuda_backend_describe(b);
#endif
    return "unknown";
}
