/* cmd_schedule.c - `cohort schedule`: the pipeline schedule and layer placement Megatron's
 * flags describe, as each pipeline rank would run them: which decoder layers every (rank,
 * model chunk) builds (scheduler/placement.h) and every rank's ordered forward and backward
 * operations of one iteration (scheduler/schedule.h), with the warm-up counts and the
 * bubble fraction. It computes them also for layouts `cohort train` does not run yet. */
#include "cli/cli.h"

#include "common/error.h"
#include "scheduler/placement.h"
#include "scheduler/schedule.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fputs("usage: cohort schedule [--json] [flags]\n"
          "       cohort schedule --batch   (one run per line of standard input, each a JSON array of the\n"
          "                                 flags, answered by {\"exit\", \"stdout\", \"stderr\"} on one line)\n"
          "Prints, for Megatron's pipeline flags, the decoder layers each pipeline rank and model chunk\n"
          "builds and every rank's forward/backward operations of one iteration, in order, as Megatron's\n"
          "schedules run them (no pipelining for p = 1, 1F1B for one chunk per rank, the interleaved\n"
          "schedule for several), with the warm-up counts and the bubble fraction (p-1)/(v*m).\n"
          "\n"
          "  --pipeline-model-parallel-size P                  pipeline ranks (default 1)\n"
          "  --num-layers L                                    decoder layers; without it only the operations\n"
          "                                                    are printed\n"
          "  --num-virtual-stages-per-pipeline-rank V          model chunks per rank (interleaved schedule);\n"
          "  --virtual-pipeline-model-parallel-size V            the same (cohort train's name)\n"
          "  --num-layers-per-virtual-pipeline-stage N         V = L / P / N (needs --num-layers)\n"
          "  --microbatch-group-size-per-virtual-pipeline-stage G\n"
          "                                                    micro batches run through a chunk at a time\n"
          "                                                    (interleaved only; default P; P <= G <= M)\n"
          "  --decoder-first-pipeline-num-layers F             layers on rank 0 (the rest split evenly)\n"
          "  --decoder-last-pipeline-num-layers T              layers on rank P-1\n"
          "  --account-for-embedding-in-pipeline-split         the embedding counts as a layer of rank 0\n"
          "  --account-for-loss-in-pipeline-split              the loss counts as a layer of rank P-1\n"
          "  --pipeline-model-parallel-layout S                stages split by '|', E embedding, t decoder\n"
          "                                                    layer, m MTP layer, L loss, X*N and (...)*N\n"
          "                                                    repeat; P*V stages: stage i is chunk i/P of\n"
          "                                                    rank i%P (e.g. \"Et|(tt|)*2tL\")\n"
          "  --mtp-num-layers K                                multi-token prediction layers\n"
          "  --num-microbatches M                              micro batches per iteration, or:\n"
          "  --global-batch-size B --micro-batch-size b --data-parallel-size D\n"
          "                                                    M = B / (b * D) (defaults: b = 1, D = 1, B = b*D)\n"
          "  --json                                            one JSON object\n"
          "\n"
          "Operations are written Fm.c / Bm.c: forward / backward of micro batch m through model chunk c;\n"
          "each rank's list shows its warm-up forwards | steady forward-backward pairs | cool-down\n"
          "backwards (\"-\" for an empty phase). Stage order: chunk 0 of ranks 0..P-1, then chunk 1, ...\n"
          "The embedding is on chunk 0 of rank 0, the final norm, output layer and loss on chunk V-1 of\n"
          "rank P-1. Exit status 2 when Megatron would refuse the flags (the message says which rule).\n",
          f);
}

typedef struct opts {
    int p, L, v, v2, lpv, group, first, last, mtp, m, gbs, mbs, dp;
    bool has_first, has_last, has_m, has_gbs, acc_e, acc_l, json;
    const char *layout;
} opts;

/* Reads an integer flag's value: "--flag V" or "--flag=V". 1 if argv[*i] is the flag, 0 if
 * not, -1 on a bad value (message printed). */
static int int_flag(FILE *errf, int argc, char **argv, int *i, const char *name, int *out, bool *given) {
    const char *a = argv[*i], *val;
    size_t n = strlen(name);
    if (strncmp(a, name, n)) return 0;
    if (a[n] == '=') val = a + n + 1;
    else if (!a[n]) {
        if (*i + 1 >= argc) {
            fprintf(errf, "cohort schedule: %s needs a value\n", name);
            return -1;
        }
        val = argv[++*i];
    } else return 0;
    char *end;
    errno = 0;
    long x = strtol(val, &end, 10);
    if (errno || end == val || *end || x < -(1L << 30) || x > (1L << 30)) {
        fprintf(errf, "cohort schedule: %s '%s' is not an integer\n", name, val);
        return -1;
    }
    *out = (int)x;
    if (given) *given = true;
    return 1;
}

static int parse(FILE *errf, int argc, char **argv, opts *o) {
    *o = (opts){.p = 1, .mbs = 1, .dp = 1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--account-for-embedding-in-pipeline-split")) {
            o->acc_e = true;
            continue;
        }
        if (!strcmp(a, "--account-for-loss-in-pipeline-split")) {
            o->acc_l = true;
            continue;
        }
        const char *lf = "--pipeline-model-parallel-layout";
        size_t ln = strlen(lf);
        if (!strncmp(a, lf, ln) && (a[ln] == '=' || !a[ln])) {
            if (a[ln] == '=') o->layout = a + ln + 1;
            else if (i + 1 < argc) o->layout = argv[++i];
            else {
                fprintf(errf, "cohort schedule: %s needs a value\n", lf);
                return -1;
            }
            continue;
        }
        struct {
            const char *name;
            int *out;
            bool *given;
        } f[] = {
            {"--pipeline-model-parallel-size", &o->p, NULL},
            {"--num-layers", &o->L, NULL},
            {"--num-virtual-stages-per-pipeline-rank", &o->v, NULL},
            {"--virtual-pipeline-model-parallel-size", &o->v2, NULL},
            {"--num-layers-per-virtual-pipeline-stage", &o->lpv, NULL},
            {"--microbatch-group-size-per-virtual-pipeline-stage", &o->group, NULL},
            {"--decoder-first-pipeline-num-layers", &o->first, &o->has_first},
            {"--decoder-last-pipeline-num-layers", &o->last, &o->has_last},
            {"--mtp-num-layers", &o->mtp, NULL},
            {"--num-microbatches", &o->m, &o->has_m},
            {"--global-batch-size", &o->gbs, &o->has_gbs},
            {"--micro-batch-size", &o->mbs, NULL},
            {"--data-parallel-size", &o->dp, NULL},
        };
        int k, rc = 0;
        for (k = 0; k < (int)(sizeof f / sizeof f[0]); k++)
            if ((rc = int_flag(errf, argc, argv, &i, f[k].name, f[k].out, f[k].given))) break;
        if (rc < 0) return -1;
        if (rc == 0) {
            fprintf(errf, "cohort schedule: unknown flag '%s' (cohort schedule --help lists the flags)\n", a);
            return -1;
        }
    }
    return 0;
}

/* The values that must be positive when given (0 is no "not given" for Megatron either:
 * it fails on a group of 0 or 0 chunks); --mtp-num-layers 0 means none. */
static int check_ranges(FILE *errf, int argc, char **argv, const opts *o) {
    struct {
        const char *name;
        int v;
    } r[] = {{"--pipeline-model-parallel-size", o->p},
             {"--num-layers", o->L},
             {"--num-virtual-stages-per-pipeline-rank", o->v},
             {"--virtual-pipeline-model-parallel-size", o->v2},
             {"--num-layers-per-virtual-pipeline-stage", o->lpv},
             {"--microbatch-group-size-per-virtual-pipeline-stage", o->group},
             {"--num-microbatches", o->m},
             {"--global-batch-size", o->gbs},
             {"--micro-batch-size", o->mbs},
             {"--data-parallel-size", o->dp}};
    for (int k = 0; k < (int)(sizeof r / sizeof r[0]); k++) {
        size_t n = strlen(r[k].name);
        bool given = false;
        for (int i = 0; i < argc; i++) given |= !strncmp(argv[i], r[k].name, n) && (!argv[i][n] || argv[i][n] == '=');
        if (given && r[k].v < 1) {
            fprintf(errf, "cohort schedule: %s %d must be at least 1\n", r[k].name, r[k].v);
            return -1;
        }
    }
    if (o->mtp < 0) {
        fprintf(errf, "cohort schedule: --mtp-num-layers %d must not be negative\n", o->mtp);
        return -1;
    }
    return 0;
}

/* M from --num-microbatches or the batch sizes (Megatron's microbatch calculator). */
static int microbatches(FILE *errf, const opts *o, int *m) {
    long long per = (long long)o->mbs * o->dp, gbs = o->has_gbs ? o->gbs : per;
    if (gbs < 1) {
        fprintf(errf, "cohort schedule: --global-batch-size %lld must be at least 1\n", gbs);
        return -1;
    }
    if (gbs % per) {
        fprintf(errf, "cohort schedule: global batch size (%lld) is not divisible by micro batch size (%d) times "
                        "data parallel size (%d)\n", gbs, o->mbs, o->dp);
        return -1;
    }
    if (o->has_m) {
        if (o->m < 1) {
            fprintf(errf, "cohort schedule: --num-microbatches %d must be at least 1\n", o->m);
            return -1;
        }
        if (o->has_gbs && gbs / per != o->m) {
            fprintf(errf, "cohort schedule: --num-microbatches %d differs from --global-batch-size %lld / "
                            "(--micro-batch-size %d x --data-parallel-size %d) = %lld\n", o->m, gbs, o->mbs, o->dp,
                    gbs / per);
            return -1;
        }
        *m = o->m;
    } else {
        if (gbs / per > PP_MAX_MICROBATCHES) {
            fprintf(errf, "cohort schedule: %lld micro batches are more than %d\n", gbs / per, PP_MAX_MICROBATCHES);
            return -1;
        }
        *m = (int)(gbs / per);
    }
    return 0;
}

static void print_ops(FILE *f, const pp_op *ops, int from, int to, bool json, bool *first) {
    char b[32];
    if (!json && from == to) fputs(" -", f);
    for (int i = from; i < to; i++) {
        pp_op_str(&ops[i], b, sizeof b);
        if (json) fprintf(f, "%s\"%s\"", *first ? "" : ",", b);
        else fprintf(f, " %s", b);
        *first = false;
    }
}

/* One run: the flags in argv, its output into out, its errors into errf. */
static int schedule_main(int argc, char **argv, FILE *out, FILE *errf) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(out);
            return CLI_OK;
        }
    opts o;
    int m;
    if (parse(errf, argc, argv, &o) || check_ranges(errf, argc, argv, &o) || microbatches(errf, &o, &m)) return CLI_USAGE;
    if (o.v && o.v2 && o.v != o.v2) {
        fprintf(errf, "cohort schedule: --num-virtual-stages-per-pipeline-rank %d and "
                        "--virtual-pipeline-model-parallel-size %d differ (they are the same flag)\n", o.v, o.v2);
        return CLI_USAGE;
    }
    int vflag = o.v ? o.v : o.v2;
    bool placed = o.L > 0;
    if (!placed && (o.layout || o.has_first || o.has_last || o.acc_e || o.acc_l || o.lpv || o.mtp)) {
        fprintf(errf, "cohort schedule: the layer placement flags need --num-layers\n");
        return CLI_USAGE;
    }
    pp_place_cfg pc = {.p = o.p, .num_layers = o.L, .v = vflag, .layers_per_vstage = o.lpv, .has_first = o.has_first,
                       .has_last = o.has_last, .first = o.first, .last = o.last, .account_embedding = o.acc_e,
                       .account_loss = o.acc_l, .layout = o.layout, .mtp_num_layers = o.mtp};
    int v = vflag ? vflag : 1;
    pp_stage *st = NULL;
    if (placed) {
        v = pp_place_chunks(&pc);
        if (v < 0) {
            fprintf(errf, "cohort schedule: %s\n", co_err_detail());
            return v == CO_ENOMEM ? CLI_FAILURE : CLI_USAGE;
        }
    }
    pp_sched_cfg sc = {.p = o.p, .rank = 0, .m = m, .v = v, .group = o.group};
    if (pp_sched_check(&sc)) {
        fprintf(errf, "cohort schedule: %s\n", co_err_detail());
        return CLI_USAGE;
    }
    int cap = 2 * m * v, n, vv;
    pp_op *ops = malloc(sizeof *ops * (size_t)cap);
    if (placed) st = malloc(sizeof *st * (size_t)o.p * (size_t)v);
    if (!ops || (placed && !st)) {
        fprintf(errf, "cohort schedule: out of memory\n");
        free(ops);
        free(st);
        return CLI_FAILURE;
    }
    if (placed) {
        int rc = pp_placement(&pc, st, o.p * v, &vv);
        if (rc) {
            fprintf(errf, "cohort schedule: %s\n", co_err_detail());
            free(ops);
            free(st);
            return rc == CO_EINVAL ? CLI_USAGE : CLI_FAILURE;
        }
    }
    int p = o.p, g = pp_sched_group(&sc);
    const char *kind = p == 1 ? "no-pipelining" : v == 1 ? "1f1b" : "interleaved";
    double bubble = p == 1 ? 0 : (double)(p - 1) / ((double)v * m);
    FILE *f = out;
    if (o.json) {
        fprintf(f, "{\"pipeline_model_parallel_size\":%d,\"virtual_pipeline_model_parallel_size\":%d,"
                   "\"num_microbatches\":%d,\"microbatch_group_size\":", p, v, m);
        if (v > 1) fprintf(f, "%d", g);
        else fputs("null", f);
        fprintf(f, ",\"schedule\":\"%s\",\"bubble\":{\"formula\":\"(p-1)/(v*m)\",\"value\":%.17g},\"num_layers\":", kind,
                bubble);
        if (placed) fprintf(f, "%d", o.L);
        else fputs("null", f);
        fputs(",\"layout\":", f);
        if (o.layout) co_json_str(f, o.layout);
        else fputs("null", f);
        fputs(",\"stages\":", f);
        if (placed) {
            fputc('[', f);
            for (int i = 0; i < p * v; i++) {
                int r = i % p, c = i / p;
                const pp_stage *s = &st[r * v + c];
                fprintf(f, "%s{\"stage\":%d,\"rank\":%d,\"chunk\":%d,\"first_layer\":%d,\"num_layers\":%d,"
                           "\"mtp_layers\":%d,\"embedding\":%s,\"loss\":%s}", i ? "," : "", i, r, c, s->first_layer,
                        s->num_layers, s->mtp_layers, s->embedding ? "true" : "false", s->loss ? "true" : "false");
            }
            fputc(']', f);
        } else fputs("null", f);
        fputs(",\"ranks\":[", f);
    } else {
        if (p == 1) fprintf(f, "cohort schedule: no pipelining (1 rank), %d micro batch%s: forward then backward of each\n",
                            m, m == 1 ? "" : "es");
        else if (v == 1)
            fprintf(f, "cohort schedule: 1F1B over %d pipeline ranks, %d micro batch%s\n", p, m, m == 1 ? "" : "es");
        else
            fprintf(f, "cohort schedule: interleaved 1F1B over %d pipeline ranks x %d model chunks, %d micro batches "
                       "in groups of %d\n", p, v, m, g);
        if (p == 1) fputs("bubble: none\n", f);
        else fprintf(f, "bubble (p-1)/(v*m) = %d/(%d*%d) = %.4f\n", p - 1, v, m, bubble);
        if (placed) {
            fprintf(f, "\nlayers (%d decoder layers; stage i = chunk i/%d of rank i%%%d):\n", o.L, p, p);
            fputs("  stage  rank chunk  layers        count  also holds\n", f);
            for (int i = 0; i < p * v; i++) {
                int r = i % p, c = i / p;
                const pp_stage *s = &st[r * v + c];
                char range[48];
                if (s->num_layers) snprintf(range, sizeof range, "%d-%d", s->first_layer, s->first_layer + s->num_layers - 1);
                else snprintf(range, sizeof range, "-");
                char also[96] = "";
                size_t k = 0;
                if (s->embedding) k += (size_t)snprintf(also + k, sizeof also - k, "embedding");
                if (s->mtp_layers)
                    k += (size_t)snprintf(also + k, sizeof also - k, "%s%d MTP layer%s", k ? "; " : "", s->mtp_layers,
                                          s->mtp_layers == 1 ? "" : "s");
                if (s->loss) snprintf(also + k, sizeof also - k, "%sfinal norm, output layer, loss", k ? "; " : "");
                fprintf(f, "  %5d %5d %5d  %-12s %6d%s%s\n", i, r, c, range, s->num_layers, *also ? "  " : "", also);
            }
        }
        fputs("\noperations (Fm.c / Bm.c: forward / backward of micro batch m through chunk c;\n"
              "            warm-up forwards | steady forward-backward pairs | cool-down backwards):\n", f);
    }
    for (int r = 0; r < p; r++) {
        sc.rank = r;
        if (pp_schedule(&sc, ops, cap, &n)) { /* checked above: cannot fail */
            fprintf(errf, "cohort schedule: %s\n", co_err_detail());
            free(ops);
            free(st);
            return CLI_FAILURE;
        }
        int w = pp_warmup(&sc), total = m * v;
        /* warm-up ends at w, the steady pairs at w + 2 (total - w) */
        int steady_end = w + 2 * (total - w);
        bool first = true;
        if (o.json) {
            fprintf(f, "%s{\"rank\":%d,\"warmup\":%d,\"ops\":[", r ? "," : "", r, w);
            print_ops(f, ops, 0, n, true, &first);
            fputs("]}", f);
        } else {
            fprintf(f, "  rank %d (warm-up %d):", r, w);
            print_ops(f, ops, 0, w, false, &first);
            fputs(" |", f);
            print_ops(f, ops, w, steady_end, false, &first);
            fputs(" |", f);
            print_ops(f, ops, steady_end, n, false, &first);
            fputc('\n', f);
        }
    }
    if (o.json) fputs("]}\n", f);
    free(ops);
    free(st);
    return CLI_OK;
}

/* --batch: one run per line of standard input, each line a JSON array of the flags
 * (["--pipeline-model-parallel-size", "4", ...]), each answered on one line of standard
 * output, {"exit": N, "stdout": "...", "stderr": "..."}: a test of thousands of layouts pays
 * for one process start, not thousands. */
static int batch(void) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *a = json_loadb(line, (size_t)len, 0, &je);
        size_t n = json_is_array(a) ? json_array_size(a) : 0;
        char **argv = calloc(n + 1, sizeof *argv);
        char *o = NULL, *e = NULL;
        size_t ol = 0, el = 0;
        FILE *out = open_memstream(&o, &ol), *errf = open_memstream(&e, &el);
        int rc = CLI_FAILURE;
        if (!argv || !out || !errf) {
            if (errf) fputs("cohort schedule --batch: out of memory\n", errf);
        } else if (!json_is_array(a)) {
            fprintf(errf, "cohort schedule --batch: not a JSON array of flags: %s\n", je.text);
            rc = CLI_USAGE;
        } else {
            bool strings = true;
            for (size_t i = 0; i < n; i++) {
                argv[i] = (char *)json_string_value(json_array_get(a, i));
                strings = strings && argv[i];
            }
            if (strings) rc = schedule_main((int)n, argv, out, errf);
            else fputs("cohort schedule --batch: every flag must be a string\n", errf), rc = CLI_USAGE;
        }
        if (out) fclose(out);
        if (errf) fclose(errf);
        json_t *r = json_pack("{sissss}", "exit", rc, "stdout", o ? o : "", "stderr", e ? e : "");
        if (r) json_dumpf(r, stdout, JSON_COMPACT);
        putchar('\n');
        fflush(stdout);
        json_decref(r);
        if (a) json_decref(a);
        free(argv), free(o), free(e);
    }
    free(line);
    return CLI_OK;
}

int cli_schedule(int argc, char **argv) {
    if (argc == 1 && !strcmp(argv[0], "--batch")) return batch();
    return schedule_main(argc, argv, stdout, stderr);
}
