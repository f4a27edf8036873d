/* proctitle.c - names a cohort process for `ps` and `top` (proctitle.h): the comm through
 * prctl(PR_SET_NAME), the command line by writing over the memory the kernel reports as
 * /proc/PID/cmdline (argv's strings, and the environment's right after them), as
 * setproctitle(3) implementations do. */
#include "common/proctitle.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

extern char **environ;

static char *g_area; /* argv's strings and the environment's after them: free for a title */
static size_t g_len;
static char **g_env; /* the environment's copy (kept here too: setenv may leave it for its own) */

/* Copies n strings (NULL-terminated when n < 0) into a new array, NULL at its end. */
static char **copy_strings(char **v, int n) {
    if (n < 0)
        for (n = 0; v[n]; n++) {}
    char **out = calloc((size_t)n + 1, sizeof *out);
    for (int i = 0; out && i < n; i++)
        if (!(out[i] = strdup(v[i]))) {
            while (i-- > 0) free(out[i]);
            free(out);
            return NULL;
        }
    return out;
}

void co_proctitle_init(int argc, char **argv) {
    if (g_area || argc < 1 || !argv || !argv[0]) return;
    /* the area: argv's strings as they lie one after the other, then the environment's */
    char *start = argv[0], *end = argv[0];
    for (int i = 0; i < argc && argv[i] == end; i++) end += strlen(argv[i]) + 1;
    for (int i = 0; environ && environ[i] && environ[i] == end; i++) end += strlen(environ[i]) + 1;
    char **args = copy_strings(argv, argc), **env = environ ? copy_strings(environ, -1) : NULL;
    if (!args || (environ && !env)) { /* (no room for a title: only the comm will change) */
        for (int i = 0; args && args[i]; i++) free(args[i]);
        for (int i = 0; env && env[i]; i++) free(env[i]);
        free(args);
        free(env);
        return;
    }
    /* glibc's messages name the program through these: keep them pointing at live text */
    char *inv = program_invocation_name, *inv_short = program_invocation_short_name;
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(argv[i]) + 1;
        if (inv >= argv[i] && inv < argv[i] + n) program_invocation_name = args[i] + (inv - argv[i]);
        if (inv_short >= argv[i] && inv_short < argv[i] + n) program_invocation_short_name = args[i] + (inv_short - argv[i]);
        argv[i] = args[i];
    }
    free(args); /* (the array: its strings are argv's now, for the process's life) */
    if (env) environ = g_env = env; /* (the old strings and array are left alone: the area is ours) */
    g_area = start;
    g_len = (size_t)(end - start);
}

/* Renames, besides the calling thread, every thread of this process still called old (the
 * threads started before the process knew what it is: a worker's link thread). */
static void rename_threads(const char *old, const char *comm) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], name[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r+");
        if (!f) continue;
        if (fgets(name, sizeof name, f)) {
            name[strcspn(name, "\n")] = '\0';
            if (!strcmp(name, old)) {
                rewind(f);
                fputs(comm, f);
            }
        }
        fclose(f);
    }
    closedir(d);
}

void co_proctitle_set(const char *comm, const char *title) {
    char old[17] = "", name[16];
    prctl(PR_GET_NAME, old, 0, 0, 0);
    snprintf(name, sizeof name, "%s", comm);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    if (old[0] && strcmp(old, name)) rename_threads(old, name);
    if (!g_area || g_len < 2) return;
    /* the title, then NULs to the end: /proc/PID/cmdline shows the title (and the padding) */
    size_t n = strlen(title);
    if (n > g_len - 1) n = g_len - 1;
    memcpy(g_area, title, n);
    memset(g_area + n, 0, g_len - n);
}

void co_proctitle_role(co_proc_role role, int rank, int node, uint64_t job_id) {
    char comm[32], title[160];
    if (role == CO_PROC_SUPERVISOR) {
        snprintf(comm, sizeof comm, "cohort-sv");
        snprintf(title, sizeof title, "cohort: supervisor of job %016" PRIx64, job_id);
    } else if (role == CO_PROC_AGENT) {
        snprintf(comm, sizeof comm, "cohort-agent%d", node);
        snprintf(title, sizeof title, "cohort: node agent %d of job %016" PRIx64, node, job_id);
    } else {
        snprintf(comm, sizeof comm, "cohort-r%d", rank);
        snprintf(title, sizeof title, "cohort: rank %d of job %016" PRIx64 " (node %d)", rank, job_id, node);
    }
    co_proctitle_set(comm, title);
}

uint64_t co_proc_start_ticks(int pid) {
    char path[64], buf[1024];
    if (pid > 0) snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else snprintf(path, sizeof path, "/proc/self/stat");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": the comm may hold spaces and parentheses, so the fields
     * are counted from its last ')'; starttime is the 22nd field, the 20th after it */
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    for (int field = 2; field < 21; field++) {
        p = strchr(p + 1, ' ');
        if (!p) return 0;
    }
    return strtoull(p + 1, NULL, 10);
}
