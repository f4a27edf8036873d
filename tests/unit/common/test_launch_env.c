/* test_launch_env.c - a node's place in the job read from the launcher's environment
 * (common/launch_env.c): Slurm host lists, the precedence of flags over torchrun-style over
 * Slurm over Kubernetes variables, Slurm only inside an srun step, and the refusals. */
#include "common/config.h"
#include "common/error.h"
#include "common/launch_env.h"
#include "tests/test.h"

#include <string.h>

/* The environment of a case: NAME=VALUE strings, NULL-terminated. */
static const char *const *g_env;
static const char *fake_get(const char *name) {
    size_t n = strlen(name);
    for (const char *const *e = g_env; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

/* Parses argv (after "train"), applies env; returns apply's code. */
static int place(co_config *c, const char *const *env, int argc, char **argv, char *note, char *err) {
    co_config_defaults(c);
    int rc = co_config_parse(c, argc, argv);
    if (rc) return rc;
    g_env = env;
    rc = co_launch_env_apply(c, fake_get, note, 600);
    if (rc) snprintf(err, 600, "%s", co_err_detail());
    return rc;
}

static void test_hostlist(void) {
    char h[64];
    CHECK(!co_hostlist_first("127.0.0.[1-2]", h, sizeof h) && !strcmp(h, "127.0.0.1"));
    CHECK(!co_hostlist_first("node[01-04,07],gpu3", h, sizeof h) && !strcmp(h, "node01"));
    CHECK(!co_hostlist_first("gpu3,node[1-2]", h, sizeof h) && !strcmp(h, "gpu3"));
    CHECK(!co_hostlist_first("rack[2-3]-n[007,9]", h, sizeof h) && !strcmp(h, "rack2-n007"));
    CHECK(!co_hostlist_first("solo", h, sizeof h) && !strcmp(h, "solo"));
    CHECK(co_hostlist_first("", h, sizeof h) == CO_EINVAL);
    CHECK(co_hostlist_first("node[", h, sizeof h) == CO_EINVAL);
    CHECK(co_hostlist_first("node[a-b]", h, sizeof h) == CO_EINVAL);
    CHECK(co_hostlist_first("averyveryverylonghostname", h, 8) == CO_EINVAL);
}

static const char *const srun_env[] = {"SLURM_JOB_ID=7", "SLURM_STEP_ID=0", "SLURM_NODEID=1", "SLURM_NNODES=2",
                                       "SLURMD_NODENAME=127.0.0.2",
                                       "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NUM_TASKS=2",
                                       "SLURM_STEP_NODELIST=127.0.0.[1-2]", "SLURM_JOB_NODELIST=127.0.0.[1-2]", NULL};

static void test_slurm(void) {
    co_config c;
    char note[600], err[600];
    char *argv[] = {"--mock-data"};
    REQUIRE(!place(&c, srun_env, 1, argv, note, err));
    CHECK(c.nnodes == 2 && c.node_rank == 1 && !strcmp(c.master_addr, "127.0.0.1") && c.master_port == 29500);
    CHECK_MSG(strstr(note, "--node-rank 1 (SLURM_NODEID)") != NULL, "note: %s", note);
    CHECK(!strcmp(c.node_addr, "127.0.0.2")); /* this node's address: Slurm's name for it */
    co_config_free(&c);
    /* a node name that does not resolve leaves --node-addr to cohort's default */
    static const char *const unresolved[] = {"SLURM_STEP_ID=0", "SLURM_NODEID=1", "SLURM_STEP_NUM_NODES=2",
                                             "SLURM_STEP_NODELIST=n[1-2]", "SLURMD_NODENAME=no-such-node.invalid", NULL};
    REQUIRE(!place(&c, unresolved, 1, argv, note, err));
    CHECK(c.node_addr[0] == '\0' && !strcmp(c.master_addr, "n1"));
    co_config_free(&c);
    /* flags win, each on its own */
    char *argv2[] = {"--node-rank", "0", "--master-addr", "10.0.0.9"};
    REQUIRE(!place(&c, srun_env, 4, argv2, note, err));
    CHECK(c.nnodes == 2 && c.node_rank == 0 && !strcmp(c.master_addr, "10.0.0.9"));
    co_config_free(&c);
    /* the batch script's own environment (no step): nothing from Slurm */
    static const char *const batch_env[] = {"SLURM_JOB_ID=7", "SLURM_NODEID=0", "SLURM_NNODES=2",
                                            "SLURM_JOB_NODELIST=127.0.0.[1-2]", NULL};
    REQUIRE(!place(&c, batch_env, 1, argv, note, err));
    CHECK(c.nnodes == 1 && c.node_rank == 0 && !strcmp(c.master_addr, "127.0.0.1") && note[0] == '\0');
    co_config_free(&c);
    /* several tasks per node: refused */
    static const char *const many[] = {"SLURM_STEP_ID=0", "SLURM_NODEID=0", "SLURM_STEP_NUM_NODES=2",
                                       "SLURM_STEP_NUM_TASKS=16", "SLURM_STEP_NODELIST=n[1-2]", NULL};
    CHECK(place(&c, many, 1, argv, note, err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "one task per node") != NULL, "err: %s", err);
    co_config_free(&c);
}

static void test_torchrun_and_k8s(void) {
    co_config c;
    char note[600], err[600];
    char *argv[] = {"--mock-data"};
    /* torchrun-style variables over Slurm's */
    static const char *const both[] = {"NNODES=3", "MASTER_ADDR=head", "MASTER_PORT=31000", "NPROC_PER_NODE=4",
                                       "SLURM_STEP_ID=0", "SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=3",
                                       "SLURM_STEP_NODELIST=n[1-3]", NULL};
    REQUIRE(!place(&c, both, 1, argv, note, err));
    CHECK(c.nnodes == 3 && c.node_rank == 2 && !strcmp(c.master_addr, "head") && c.master_port == 31000 &&
          c.nproc_per_node == 4);
    co_config_free(&c);
    /* an Indexed Job: the node rank from JOB_COMPLETION_INDEX, the rest from the manifest's variables */
    static const char *const k8s[] = {"JOB_COMPLETION_INDEX=1", "NNODES=2", "MASTER_ADDR=cohort-0.cohort",
                                      "MASTER_PORT=29500", NULL};
    REQUIRE(!place(&c, k8s, 1, argv, note, err));
    CHECK(c.nnodes == 2 && c.node_rank == 1 && !strcmp(c.master_addr, "cohort-0.cohort"));
    CHECK_MSG(strstr(note, "--node-rank 1 (JOB_COMPLETION_INDEX)") != NULL, "note: %s", note);
    co_config_free(&c);
    /* NODE_RANK over JOB_COMPLETION_INDEX; a malformed number refused */
    static const char *const both_k8s[] = {"JOB_COMPLETION_INDEX=1", "NODE_RANK=0", NULL};
    REQUIRE(!place(&c, both_k8s, 1, argv, note, err));
    CHECK(c.node_rank == 0);
    co_config_free(&c);
    static const char *const bad[] = {"NNODES=two", NULL};
    CHECK(place(&c, bad, 1, argv, note, err) == CO_EINVAL);
    CHECK_MSG(strstr(err, "NNODES=two") != NULL, "err: %s", err);
    co_config_free(&c);
}

int main(void) {
    RUN(test_hostlist);
    RUN(test_slurm);
    RUN(test_torchrun_and_k8s);
    return TEST_EXIT();
}
