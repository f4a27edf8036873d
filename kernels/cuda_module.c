/* cuda_module.c - loads the CUDA backend and the NCCL communicator when a process first asks
 * for them.
 *
 * They live in a module of their own, libcohort_cuda.so, built beside `cohort` wherever the
 * build has CUDA: mapping cuBLASLt and running its initialisers costs a process about half a
 * second of CPU at start, which every supervisor, node agent, worker and `cohort ckpt`
 * would pay on a machine without a GPU (and every CPU test, thousands of processes). The
 * entry points below are the ones the rest of cohort calls (kernels/cuda/cuda.h,
 * comm/nccl_comm.h); each loads the module once and calls its function of the same name.
 * The module resolves cohort's own functions (co_err_set, the kernels' helpers) from the
 * executable, which exports them (meson.build: export_dynamic), so an error it records is
 * the one co_err_detail() reads.
 *
 * Where it is looked for, in order: $COHORT_CUDA_MODULE; beside the executable; the build
 * directory it was built in; the install's library directory; the loader's search path.
 * A build with COHORT_CUDA_MODULE_PATH defined (the test-only cohort-cudasim, which runs the
 * CUDA backend on the CPU stand-in of tests/cudasim/) loads the module at that path instead
 * of looking (unless $COHORT_CUDA_MODULE names one). */
#include "kernels/cuda/cuda.h"
#ifdef COHORT_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

#include "common/error.h"
#include "cohort_cuda_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef COHORT_CUDA_MODULE_PATH
#define MODULE_NAME COHORT_CUDA_MODULE_PATH
#else
#define MODULE_NAME "libcohort_cuda.so"
#endif

static pthread_once_t mod__once = PTHREAD_ONCE_INIT;
static void *mod__handle;
static char mod__why[512];

static void *mod__try(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && !mod__why[0]) snprintf(mod__why, sizeof mod__why, "%s", dlerror());
    return h;
}

static void mod__load(void) {
    const char *env = getenv("COHORT_CUDA_MODULE");
    if (env && *env) {
        mod__handle = mod__try(env);
        return; /* asked for this one: no other */
    }
#ifdef COHORT_CUDA_MODULE_PATH
    mod__handle = mod__try(COHORT_CUDA_MODULE_PATH);
    return;
#endif
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash && (size_t)(slash - exe) + sizeof MODULE_NAME + 1 < sizeof exe) {
            strcpy(slash + 1, MODULE_NAME);
            if (access(exe, R_OK) == 0 && (mod__handle = mod__try(exe))) return;
        }
    }
    const char *dirs[] = {COHORT_CUDA_MODULE_BUILD_DIR, COHORT_CUDA_MODULE_INSTALL_DIR};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dirs[i], MODULE_NAME);
        if (access(p, R_OK) == 0 && (mod__handle = mod__try(p))) return;
    }
    mod__handle = mod__try(MODULE_NAME);
}

/* The module's function `name`, or NULL with the reason recorded (co_err_detail). */
static void *mod__sym(const char *name) {
    pthread_once(&mod__once, mod__load);
    if (!mod__handle) {
        co_err_set(CO_EUNSUPPORTED, "the CUDA module (%s) cannot be loaded: %s", MODULE_NAME,
                   mod__why[0] ? mod__why : "not found");
        return NULL;
    }
    void *f = dlsym(mod__handle, name);
    if (!f) co_err_set(CO_EUNSUPPORTED, "the CUDA module has no %s: %s", name, dlerror());
    return f;
}

int cuda_device_count(char *why, size_t n) {
    int (*f)(char *, size_t) = (int (*)(char *, size_t))mod__sym("cuda_device_count");
    if (!f) {
        if (why && n) snprintf(why, n, "%s", co_err_detail());
        return 0;
    }
    return f(why, n);
}

int cuda_backend_create(kb_backend **out, const kb_options *opt) {
    int (*f)(kb_backend **, const kb_options *) =
        (int (*)(kb_backend **, const kb_options *))mod__sym("cuda_backend_create");
    return f ? f(out, opt) : CO_EUNSUPPORTED;
}

void cuda_backend_release(kb_backend *b) {
    void (*f)(kb_backend *) = (void (*)(kb_backend *))mod__sym("cuda_backend_release");
    if (f) f(b);
}

const char *cuda_backend_describe(const kb_backend *b) {
    const char *(*f)(const kb_backend *) = (const char *(*)(const kb_backend *))mod__sym("cuda_backend_describe");
    return f ? f(b) : "cuda (module not loaded)";
}

int cuda_backend_profile(kb_backend *b, double ms[CU_PROF_N]) {
    int (*f)(kb_backend *, double *) = (int (*)(kb_backend *, double *))mod__sym("cuda_backend_profile");
    return f ? f(b, ms) : -1;
}

bool cuda_build_covers(int major, int minor) {
    bool (*f)(int, int) = (bool (*)(int, int))mod__sym("cuda_build_covers");
    return f ? f(major, minor) : false;
}

void cuda_build_code(char *buf, size_t n) {
    void (*f)(char *, size_t) = (void (*)(char *, size_t))mod__sym("cuda_build_code");
    if (f) f(buf, n);
    else if (buf && n) snprintf(buf, n, "none (%s)", co_err_detail());
}

#ifdef COHORT_HAVE_NCCL
void cm_nccl_options_default(cm_nccl_options *opt) {
    void (*f)(cm_nccl_options *) = (void (*)(cm_nccl_options *))mod__sym("cm_nccl_options_default");
    if (f) f(opt);
    else memset(opt, 0, sizeof *opt);
}

int cm_nccl_get_unique_id(uint8_t out[128]) {
    int (*f)(uint8_t *) = (int (*)(uint8_t *))mod__sym("cm_nccl_get_unique_id");
    return f ? f(out) : CO_EUNSUPPORTED;
}

int cm_nccl_new(cm_comm **out, int rank, int size, const uint8_t id[128], int device, const cm_nccl_options *opt) {
    int (*f)(cm_comm **, int, int, const uint8_t *, int, const cm_nccl_options *) =
        (int (*)(cm_comm **, int, int, const uint8_t *, int, const cm_nccl_options *))mod__sym("cm_nccl_new");
    return f ? f(out, rank, size, id, device, opt) : CO_EUNSUPPORTED;
}

int cm_nccl_split_color(cm_comm *c, int color, int key, cm_comm **out, int timeout_ms) {
    int (*f)(cm_comm *, int, int, cm_comm **, int) =
        (int (*)(cm_comm *, int, int, cm_comm **, int))mod__sym("cm_nccl_split_color");
    return f ? f(c, color, key, out, timeout_ms) : CO_EUNSUPPORTED;
}

void *cm_nccl_stream(cm_comm *c) {
    void *(*f)(cm_comm *) = (void *(*)(cm_comm *))mod__sym("cm_nccl_stream");
    return f ? f(c) : NULL;
}
#endif
