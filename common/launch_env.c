/* launch_env.c - reads a node's place in the job from torchrun-style, Slurm and Kubernetes
 * Indexed Job variables for `cohort train` (launch_env.h; docs/deploy.md). */
#include "common/launch_env.h"

#include "common/error.h"

#include <errno.h>
#include <netdb.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int co_hostlist_first(const char *list, char *out, size_t n) {
    if (!list || !*list || !n) return CO_EINVAL;
    size_t len = 0;
    const char *p = list;
    while (*p && *p != ',') {
        if (*p == '[') {
            /* a range group: its first number, as written (zero padding kept) */
            p++;
            const char *start = p;
            while (*p >= '0' && *p <= '9') p++;
            if (p == start || (*p != '-' && *p != ',' && *p != ']')) return CO_EINVAL;
            size_t k = (size_t)(p - start);
            if (len + k >= n) return CO_EINVAL;
            memcpy(out + len, start, k);
            len += k;
            while (*p && *p != ']') p++;
            if (*p != ']') return CO_EINVAL;
            p++;
            continue;
        }
        if (*p == ']') return CO_EINVAL;
        if (len + 1 >= n) return CO_EINVAL;
        out[len++] = *p++;
    }
    if (!len) return CO_EINVAL;
    out[len] = '\0';
    return 0;
}

/* The first of names that is set and not empty (its name in *which), or NULL. */
static const char *first_of(co_env_get get, const char *const *names, const char **which) {
    for (; *names; names++) {
        const char *v = get(*names);
        if (v && *v) {
            *which = *names;
            return v;
        }
    }
    return NULL;
}

static bool parse_int(const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return false;
    *out = (int)x;
    return true;
}

/* Appends "--FLAG VALUE (VARIABLE)" to the note. */
static void add_note(char *note, size_t n, const char *flag, const char *value, const char *var) {
    size_t len = n ? strlen(note) : 0;
    if (len + 1 < n) snprintf(note + len, n - len, "%s--%s %s (%s)", len ? ", " : "", flag, value, var);
}

static const char *process_env(const char *name) { return getenv(name); }

int co_launch_env_apply(co_config *c, co_env_get get, char *note, size_t notelen) {
    if (notelen) note[0] = '\0';
    if (!get) get = process_env;
    /* Slurm counts only inside a step that srun started (one task per node); the batch
     * script's own environment has SLURM_NNODES too, and a `cohort train` run there directly
     * is one process on one node */
    const char *step = get("SLURM_STEP_ID");
    if (!step || !*step) step = get("SLURM_STEPID");
    bool slurm = step && *step && get("SLURM_NODEID") && strcmp(step, "4294967294") && strcmp(step, "batch");
    const char *which = NULL, *v;
    struct {
        const char *flag;
        const char *const *names;
        int *field;
        long lo, hi;
    } ints[] = {
        {"nnodes", (const char *const[]){"NNODES", "PET_NNODES", NULL}, &c->nnodes, 1, CO_MAX_PROCS},
        {"node-rank", (const char *const[]){"NODE_RANK", "PET_NODE_RANK", NULL}, &c->node_rank, 0, CO_MAX_PROCS - 1},
        {"master-port", (const char *const[]){"MASTER_PORT", "PET_MASTER_PORT", NULL}, &c->master_port, 1, 65535},
        {"nproc-per-node", (const char *const[]){"NPROC_PER_NODE", "PET_NPROC_PER_NODE", NULL}, &c->nproc_per_node, 1,
         CO_MAX_PROCS},
    };
    static const char *const slurm_nnodes[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", NULL};
    static const char *const slurm_rank[] = {"SLURM_NODEID", NULL};
    static const char *const k8s_rank[] = {"JOB_COMPLETION_INDEX", NULL};
    bool nnodes_from_slurm = false;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (co_config_was_set(c, ints[i].flag)) continue;
        v = first_of(get, ints[i].names, &which);
        if (!v && slurm && !strcmp(ints[i].flag, "nnodes")) {
            v = first_of(get, slurm_nnodes, &which);
            nnodes_from_slurm = v != NULL;
        }
        if (!v && slurm && !strcmp(ints[i].flag, "node-rank")) v = first_of(get, slurm_rank, &which);
        if (!v && !strcmp(ints[i].flag, "node-rank")) v = first_of(get, k8s_rank, &which);
        if (!v) continue;
        if (!parse_int(v, ints[i].lo, ints[i].hi, ints[i].field))
            return co_err_set(CO_EINVAL, "reading --%s from the environment: %s=%s is not a number in %ld..%ld",
                              ints[i].flag, which, v, ints[i].lo, ints[i].hi);
        add_note(note, notelen, ints[i].flag, v, which);
    }
    if (!co_config_was_set(c, "master-addr")) {
        static const char *const names[] = {"MASTER_ADDR", "PET_MASTER_ADDR", NULL};
        static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
        v = first_of(get, names, &which);
        if (v && strlen(v) >= sizeof c->master_addr)
            return co_err_set(CO_EINVAL, "reading --master-addr from the environment: %s is too long", which);
        if (v) {
            snprintf(c->master_addr, sizeof c->master_addr, "%s", v);
        } else if (slurm && (v = first_of(get, lists, &which))) {
            /* node 0 of the step is the first host of its node list */
            if (co_hostlist_first(v, c->master_addr, sizeof c->master_addr))
                return co_err_set(CO_EINVAL, "reading --master-addr from the environment: %s=%s is not a host list",
                                  which, v);
        }
        if (v) {
            add_note(note, notelen, "master-addr", c->master_addr, which);
        }
    }
    if (slurm && !co_config_was_set(c, "node-addr") && (v = get("SLURMD_NODENAME")) && *v &&
        strlen(v) < sizeof c->node_addr) {
        /* this node's address for its peers: the name Slurm knows the node by (slurmctld
         * reaches slurmd by it unless the node has a NodeAddr), where it resolves; else
         * cohort's default, the host name's address */
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        if (getaddrinfo(v, NULL, &hints, &res) == 0 && res) {
            freeaddrinfo(res);
            snprintf(c->node_addr, sizeof c->node_addr, "%s", v);
            add_note(note, notelen, "node-addr", v, "SLURMD_NODENAME");
        }
    }
    if (nnodes_from_slurm) {
        /* one task per node: each runs the node's supervisor or agent, which starts the workers */
        const char *nt = get("SLURM_STEP_NUM_TASKS");
        if (!nt || !*nt) nt = get("SLURM_NTASKS");
        int ntasks;
        if (nt && parse_int(nt, 1, INT_MAX, &ntasks) && ntasks != c->nnodes)
            return co_err_set(CO_EINVAL, "under srun, cohort runs one task per node (srun --ntasks-per-node=1; it "
                                         "starts --nproc-per-node workers itself), but this step has %d tasks on %d "
                                         "nodes", ntasks, c->nnodes);
    }
    return 0;
}
