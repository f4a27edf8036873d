/* test_proctitle.c - common/proctitle.c: the comm and the command line `ps` shows change,
 * while argv's strings, the environment and glibc's program name stay readable (they are
 * copied before the memory they lay in takes the title); threads started before the title
 * take the name too. */
#include "common/proctitle.h"

#include "tests/test.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <unistd.h>

static int g_argc;
static char **g_argv;

static void read_file(const char *path, char *buf, size_t cap, size_t *len) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
}

static void comm_of(const char *path, char *buf, size_t cap) {
    read_file(path, buf, cap, NULL);
    buf[strcspn(buf, "\n")] = '\0';
}

/* /proc/self/cmdline: its first string, and whether only NULs follow it */
static bool cmdline_is(const char *want) {
    static char buf[1 << 20];
    size_t n;
    read_file("/proc/self/cmdline", buf, sizeof buf, &n);
    if (strcmp(buf, want)) {
        fprintf(stderr, "cmdline '%s', want '%s'\n", buf, want);
        return false;
    }
    for (size_t i = strlen(buf); i < n; i++)
        if (buf[i]) return false;
    return true;
}

static void test_comm_without_init(void) {
    char before[1 << 12], comm[32];
    read_file("/proc/self/cmdline", before, sizeof before, NULL);
    co_proctitle_set("t-before-init", "not written: no area yet");
    comm_of("/proc/self/comm", comm, sizeof comm);
    CHECK(!strcmp(comm, "t-before-init"));
    char after[1 << 12];
    read_file("/proc/self/cmdline", after, sizeof after, NULL);
    CHECK(!strcmp(before, after)); /* argv untouched */
}

static pthread_barrier_t g_bar;
static long g_tid;
static void *sleeper(void *arg) {
    (void)arg;
    g_tid = (long)syscall(SYS_gettid);
    pthread_barrier_wait(&g_bar); /* started, under the process's name of the time */
    pthread_barrier_wait(&g_bar); /* the test has read this thread's name */
    return NULL;
}

static void test_title_keeps_argv_and_environ(void) {
    /* what the process had before */
    char *args[64];
    int n = g_argc < 64 ? g_argc : 64;
    for (int i = 0; i < n; i++) args[i] = strdup(g_argv[i]);
    const char *path0 = getenv("PATH");
    REQUIRE(path0 != NULL);
    char *path = strdup(path0), *inv = strdup(program_invocation_name);
    char *old_arg0 = g_argv[0];
    pthread_t th;
    pthread_barrier_init(&g_bar, NULL, 2);
    REQUIRE(pthread_create(&th, NULL, sleeper, NULL) == 0);
    pthread_barrier_wait(&g_bar);

    co_proctitle_init(g_argc, g_argv);
    CHECK(g_argv[0] != old_arg0); /* argv points at copies now */
    co_proctitle_set("t-titled-and-longer", "cohort: a test title");
    char comm[32], tpath[64];
    comm_of("/proc/self/comm", comm, sizeof comm);
    CHECK_MSG(!strcmp(comm, "t-titled-and-lo"), "comm '%s'", comm); /* 15 characters */
    /* the thread started before, under the old name, took the new one */
    snprintf(tpath, sizeof tpath, "/proc/self/task/%ld/comm", g_tid);
    comm_of(tpath, comm, sizeof comm);
    CHECK_MSG(!strcmp(comm, "t-titled-and-lo"), "thread comm '%s'", comm);
    pthread_barrier_wait(&g_bar);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&g_bar);

    CHECK(cmdline_is("cohort: a test title"));
    for (int i = 0; i < n; i++) CHECK_MSG(!strcmp(g_argv[i], args[i]), "argv[%d] '%s'", i, g_argv[i]);
    CHECK(getenv("PATH") && !strcmp(getenv("PATH"), path));
    CHECK(!strcmp(program_invocation_name, inv));
    CHECK(setenv("COHORT_PROCTITLE_TEST", "1", 1) == 0 && !strcmp(getenv("COHORT_PROCTITLE_TEST"), "1"));
    for (int i = 0; i < n; i++) free(args[i]);
    free(path);
    free(inv);
}

/* a title longer than argv and the environment had: cut to fit, nothing beyond overwritten */
static void test_long_title(void) {
    static char big[1 << 20];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const char *path = getenv("PATH");
    char *keep = path ? strdup(path) : NULL;
    co_proctitle_set("t-long", big);
    char buf[64];
    read_file("/proc/self/cmdline", buf, sizeof buf, NULL);
    CHECK(!strncmp(buf, "xxxxxxxx", 8));
    CHECK(keep && getenv("PATH") && !strcmp(getenv("PATH"), keep));
    free(keep);
}

static void test_roles(void) {
    char comm[32];
    co_proctitle_role(CO_PROC_WORKER, 3, 1, 0x1a2bull);
    comm_of("/proc/self/comm", comm, sizeof comm);
    CHECK(!strcmp(comm, "cohort-r3"));
    CHECK(cmdline_is("cohort: rank 3 of job 0000000000001a2b (node 1)"));
    co_proctitle_role(CO_PROC_AGENT, -1, 2, 0xffull);
    comm_of("/proc/self/comm", comm, sizeof comm);
    CHECK(!strcmp(comm, "cohort-agent2"));
    CHECK(cmdline_is("cohort: node agent 2 of job 00000000000000ff"));
    co_proctitle_role(CO_PROC_SUPERVISOR, -1, 0, 0xffull);
    comm_of("/proc/self/comm", comm, sizeof comm);
    CHECK(!strcmp(comm, "cohort-sv"));
    CHECK(cmdline_is("cohort: supervisor of job 00000000000000ff"));
}

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    RUN(test_comm_without_init);
    RUN(test_title_keeps_argv_and_environ);
    RUN(test_roles);
    RUN(test_long_title);
    return TEST_EXIT();
}
