/* bench_cpu.h - the CPU every benchmark result names: /proc/cpuinfo's 'model name' and the
 * ISA flags cohort's CPU kernels choose by (avx2, avx512f, avx512_bf16, amx_bf16). Header
 * only, for the programs in bench/; bench/cpuinfo.py prints the same line for the scripts.
 *
 *   text:  "cpu: MODEL; avx2 yes, avx512f no, avx512_bf16 no, amx_bf16 no"
 *   JSON:  "cpu":{"model":"MODEL","avx2":true,"avx512f":false,"avx512_bf16":false,"amx_bf16":false} */
#ifndef COHORT_BENCH_CPU_H
#define COHORT_BENCH_CPU_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define BENCH_CPU_NFLAGS 4
static const char *const bench_cpu_flag_names[BENCH_CPU_NFLAGS] = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"};

typedef struct {
    char model[256];
    bool flag[BENCH_CPU_NFLAGS];
} bench_cpu;

/* True when the space-separated list has the word w. */
static inline bool bench_cpu_has_word(const char *list, const char *w) {
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)) != NULL; p += n)
        if ((p == list || p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0')) return true;
    return false;
}

static inline void bench_cpu_read(bench_cpu *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    bool have_model = false, have_flags = false;
    while ((!have_model || !have_flags) && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (!have_model && !strncmp(line, "model name", 10)) {
            snprintf(c->model, sizeof c->model, "%s", v);
            c->model[strcspn(c->model, "\n")] = '\0';
            have_model = true;
        } else if (!have_flags && !strncmp(line, "flags", 5)) {
            for (int i = 0; i < BENCH_CPU_NFLAGS; i++) c->flag[i] = bench_cpu_has_word(v, bench_cpu_flag_names[i]);
            have_flags = true;
        }
    }
    fclose(f);
}

/* The text line, with a newline. */
static inline void bench_cpu_print(FILE *out) {
    bench_cpu c;
    bench_cpu_read(&c);
    fprintf(out, "cpu: %s;", c.model);
    for (int i = 0; i < BENCH_CPU_NFLAGS; i++)
        fprintf(out, "%s %s %s", i ? "," : "", bench_cpu_flag_names[i], c.flag[i] ? "yes" : "no");
    fputc('\n', out);
}

/* The JSON member "cpu":{...} (no surrounding separator) into buf. */
static inline void bench_cpu_json(char *buf, size_t n) {
    bench_cpu c;
    bench_cpu_read(&c);
    char model[512];
    size_t w = 0;
    for (const char *p = c.model; *p && w + 2 < sizeof model; p++) {
        if (*p == '"' || *p == '\\') model[w++] = '\\';
        model[w++] = (*p >= 0x20) ? *p : ' ';
    }
    model[w] = '\0';
    int k = snprintf(buf, n, "\"cpu\":{\"model\":\"%s\"", model);
    for (int i = 0; i < BENCH_CPU_NFLAGS && k > 0 && (size_t)k < n; i++)
        k += snprintf(buf + k, n - (size_t)k, ",\"%s\":%s", bench_cpu_flag_names[i], c.flag[i] ? "true" : "false");
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "}");
}

#endif
