/* backend.c - creates the backend for the requested device. */
#include <stdlib.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"


int kb_backend_new(kb_backend **out, const kb_options *opt) {
    if (!out) return co_err_set(CO_EINVAL, "kb_backend_new: out is NULL");
    *out = NULL;
    kb_options def = {.device = KB_DEVICE_CPU, .threads = 0, .bf16 = false};
    if (!opt) opt = &def;
    switch (opt->device) {
    case KB_DEVICE_CPU:
        return cpu_backend_create(out, opt);
    case KB_DEVICE_CUDA:
        return co_err_set(CO_EUNSUPPORTED, "the CUDA backend is not part of this build yet");
    }
    return co_err_set(CO_EINVAL, "kb_backend_new: unknown device %d", (int)opt->device);
}

void kb_backend_destroy(kb_backend **b) {
    if (!b || !*b) return;
    if ((*b)->opt.device == KB_DEVICE_CPU) cpu_backend_release(*b);
    *b = NULL;
}

const char *kb_backend_describe(const kb_backend *b) {
    if (!b) return "none";
    if (b->opt.device == KB_DEVICE_CPU) return cpu_backend_describe(b);
    return "unknown";
}
