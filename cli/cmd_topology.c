/* cmd_topology.c - `cohort topology`: every rank's coordinates and parallel groups for the
 * layout `cohort train`'s flags describe (world = --nproc-per-node x --nnodes, or
 * --world-size), built as Megatron builds them (scheduler/groups.h). It computes the
 * groups also for layouts whose compute `cohort train` does not run yet. */
#include "common/log.h"
#include "cli/cli.h"
#include "common/error.h"
#include "scheduler/groups.h"
#include "scheduler/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fputs("usage: cohort topology [--json] [--world-size N] [cohort train's flags]\n"
          "Prints every rank's coordinates (tp cp dp pp, and the expert layout's etp ep edp) and\n"
          "every group Megatron builds for the layout: tp, cp, dp, dp-cp, pp, tp-pp (model\n"
          "parallel), tp-cp, tp-dp-cp, tp-dp, embedding (first and last pipeline stage),\n"
          "position-embedding (first stage) and the expert groups ep, expert-tp, expert-tp-ep,\n"
          "expert-tp-ep-pp, expert-dp. The flags that count: --tensor-model-parallel-size,\n"
          "--pipeline-model-parallel-size, --context-parallel-size, --expert-model-parallel-size,\n"
          "--expert-tensor-parallel-size, --use-tp-pp-dp-mapping, and the world: --world-size N\n"
          "(default --nproc-per-node x --nnodes). Rank order: tp-cp-ep-dp-pp, the first fastest\n"
          "(tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping). --json: one JSON object instead.\n",
          f);
}

static void print_list(FILE *f, const int *r, int n, bool json) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? (json ? "," : ", ") : "", r[i]);
    fputc(']', f);
}

int cli_topology(int argc, char **argv) {
    co_log_set_prefix("cohort topology");
    bool json = false;
    int world = 0;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return CLI_FAILURE;
    int nrest = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            free(rest);
            return CLI_OK;
        }
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--world-size") && i + 1 < argc) world = atoi(argv[++i]);
        else rest[nrest++] = argv[i];
    }
    co_config c;
    co_config_defaults(&c);
    char err[4096];
    int rc = co_config_parse(&c, nrest, rest);
    free(rest);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        co_config_free(&c);
        return CLI_USAGE;
    }
    if (world == 0) world = c.nproc_per_node * c.nnodes;
    topo_layout l;
    if (world < 1 || world > 1 << 16) {
        co_log(CO_LOG_ERROR, "world size %d: give --world-size N (1..65536) or --nproc-per-node/--nnodes",
                world);
        co_config_free(&c);
        return CLI_USAGE;
    }
    rc = topo_layout_init(&l, world, c.tensor_model_parallel_size, c.pipeline_model_parallel_size,
                          c.context_parallel_size, c.expert_model_parallel_size, c.expert_tensor_parallel_size,
                          c.use_tp_pp_dp_mapping, err, sizeof err);
    l.emb_stages = pp_embedding_stages_of_config(&c); /* (MTP layers before the last stage) */
    co_config_free(&c);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", err);
        return CLI_USAGE;
    }
    int *g = malloc(sizeof *g * (size_t)world), *coord = calloc((size_t)world * 7, sizeof *coord);
    if (!g || !coord) {
        free(g);
        free(coord);
        return CLI_FAILURE;
    }
    /* a rank's coordinate along a dimension is its place in that dimension's group */
    static const topo_group_kind along[7] = {TOPO_G_TP, TOPO_G_CP, TOPO_G_DP, TOPO_G_PP, TOPO_G_ETP, TOPO_G_EP, TOPO_G_EDP};
    for (int d = 0; d < 7; d++) {
        int ng, sz;
        topo_groups(&l, along[d], g, &ng, &sz);
        for (int k = 0; k < ng * sz; k++) coord[g[k] * 7 + d] = k % sz;
    }
    const char *order = l.tp_pp_dp ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp";
    FILE *f = stdout;
    if (json) {
        fprintf(f, "{\"world\":%d,\"order\":\"%s\",\"tp\":%d,\"cp\":%d,\"dp\":%d,\"pp\":%d,\"ep\":%d,\"etp\":%d,"
                   "\"edp\":%d,\"ranks\":[", world, order, l.tp, l.cp, l.dp, l.pp, l.ep, l.etp, l.edp);
        for (int r = 0; r < world; r++) {
            const int *x = coord + r * 7;
            fprintf(f, "%s{\"rank\":%d,\"tp\":%d,\"cp\":%d,\"dp\":%d,\"pp\":%d,\"etp\":%d,\"ep\":%d,\"edp\":%d}",
                    r ? "," : "", r, x[0], x[1], x[2], x[3], x[4], x[5], x[6]);
        }
        fputs("],\"groups\":{", f);
    } else {
        printf("cohort topology: world %d = tp %d x cp %d x dp %d x pp %d (order %s, the first fastest); experts: "
               "etp %d x ep %d x edp %d x pp %d\n\n rank   tp   cp   dp   pp |  etp   ep  edp\n",
               world, l.tp, l.cp, l.dp, l.pp, order, l.etp, l.ep, l.edp, l.pp);
        for (int r = 0; r < world; r++) {
            const int *x = coord + r * 7;
            printf("%5d %4d %4d %4d %4d | %4d %4d %4d\n", r, x[0], x[1], x[2], x[3], x[4], x[5], x[6]);
        }
        puts("\ngroups (each: its ranks, in group order):");
    }
    for (int k = 0; k < TOPO_NGROUP_KINDS; k++) {
        int ng, sz;
        topo_groups(&l, (topo_group_kind)k, g, &ng, &sz);
        if (json) fprintf(f, "%s\"%s\":[", k ? "," : "", topo_group_name((topo_group_kind)k));
        else printf("  %-19s %d of %d:", topo_group_name((topo_group_kind)k), ng, sz);
        for (int i = 0; i < ng; i++) {
            if (json && i) fputc(',', f);
            if (!json) fputc(' ', f);
            print_list(f, g + i * sz, sz, json);
        }
        fputs(json ? "]" : "\n", f);
    }
    if (json) fputs("}}\n", f);
    free(g);
    free(coord);
    return CLI_OK;
}
