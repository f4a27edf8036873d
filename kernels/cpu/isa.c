/* isa.c - what this CPU can do, decided once at run time: the instruction-set level the CPU
 * backend's own kernels use, whether --bf16 is useful here, and the CPU's name for messages.
 *
 * The level is the smallest of three answers: what the CPU reports (cpuid, through GCC's
 * __builtin_cpu_supports, which also checks that the OS saves the wider registers), what
 * oneDNN says it will use (dnnl_get_effective_cpu_isa: it honours ONEDNN_MAX_CPU_ISA, so
 * that one variable makes this machine behave as an older CPU for tests and comparisons),
 * and what the binary was compiled to allow. bf16 is useful only where the matrix
 * products have bf16 instructions: AVX512-BF16 or AMX. Elsewhere oneDNN 2.6 either has no
 * bf16 matrix product at all (AVX2) or emulates it at about the speed of fp32 (AVX-512),
 * so --bf16 is refused there rather than run as something slower or different. */
#include <stdio.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/cpu.h"

static int isa_from_onednn(void) {
    dnnl_cpu_isa_t d = dnnl_get_effective_cpu_isa();
    /* oneDNN's ISA values are bit sets that include the lower levels' bits */
    if ((d & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx) return CPU_ISA_AMX;
    if ((d & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16) return CPU_ISA_AVX512_BF16;
    if ((d & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) return CPU_ISA_AVX512;
    if ((d & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2) return CPU_ISA_AVX2;
    return CPU_ISA_BASE;
}

static int isa_from_cpu(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return CPU_ISA_BASE;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
        return CPU_ISA_AVX2;
    /* AMX needs the kernel's permission, which oneDNN asks for; its answer decides that */
    if (!__builtin_cpu_supports("avx512bf16")) return CPU_ISA_AVX512;
    return CPU_ISA_AMX;
}

static int isa_compiled(void) {
    /* the AVX-512 and AVX2 kernels are compiled for their targets whatever -march says; a
     * compiler that cannot do so leaves only the portable loops */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    return CPU_ISA_AMX;
#else
    return CPU_ISA_BASE;
#endif
}

int cpu_isa_level(void) {
    static int level = -1; /* racy but idempotent: every thread computes the same value */
    if (level < 0) {
        int a = isa_from_onednn(), b = isa_from_cpu(), c = isa_compiled();
        int l = a < b ? a : b;
        level = l < c ? l : c;
    }
    return level;
}

const char *cpu_isa_name(int level) {
    switch (level) {
    case CPU_ISA_AMX: return "AMX";
    case CPU_ISA_AVX512_BF16: return "AVX-512 BF16";
    case CPU_ISA_AVX512: return "AVX-512";
    case CPU_ISA_AVX2: return "AVX2";
    default: return "x86-64 without AVX2";
    }
}

void cpu_model_name(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *p = strchr(line, ':');
        if (!p) break;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        size_t len = strcspn(p, "\n");
        snprintf(out, n, "%.*s", (int)len, p);
        break;
    }
    fclose(f);
}

int kb_cpu_bf16_check(char *why, size_t n) {
    int level = cpu_isa_level();
    if (level >= CPU_ISA_AVX512_BF16) return 1;
    if (why && n) {
        char model[160];
        cpu_model_name(model, sizeof model);
        snprintf(why, n,
                 "--bf16: this CPU (%s, %s) has no bf16 matrix instructions (AVX512-BF16 or AMX), so bf16 "
                 "products would be no faster than fp32 here; train without --bf16 (fp32)",
                 model, cpu_isa_name(level));
    }
    return 0;
}

void kb_cpu_describe_isa(char *out, size_t n) {
    char model[160];
    cpu_model_name(model, sizeof model);
    snprintf(out, n, "%s, kernels for %s", model, cpu_isa_name(cpu_isa_level()));
}
