/* cmd_ckpt.c - `cohort ckpt`: tools for checkpoint directories (docs/checkpoints.md):
 * ls, inspect, verify, diff, convert, prune; each with --help and --json. */
#include "cli/cli.h"

#include "checkpoint/ckpt.h"
#include "checkpoint/lock.h"
#include "cli/ckpt_layout.h"
#include "common/error.h"
#include "common/log.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* verify's exit codes follow ck_bad: 0 ok, 1 unreadable, 3 malformed, 4 incomplete, 5 checksum */
enum { X_OK = 0, X_DIFFER = 1, X_USAGE = 2, X_UNSUPPORTED = 3 };

static const char *top_usage =
    "usage: cohort ckpt <tool> [flags]   (each tool takes --help and --json)\n"
    "\n"
    "  ls SAVE                    checkpoints in a save directory: iteration, time, size, status\n"
    "  inspect CKPT               manifest, and tensors with shapes, dtypes and L2 norms\n"
    "  verify CKPT                checksums and completeness (exit status says what failed)\n"
    "  diff CKPT_A CKPT_B         which tensors differ (exit 0 bitwise equal, 1 different)\n"
    "  convert CKPT --to hf-gpt2|hf-llama --output DIR   export to Hugging Face GPT-2 or Llama\n"
    "                             (model.safetensors + config.json; the padded vocabulary kept,\n"
    "                             --trim-vocab cuts it)\n"
    "  convert HFDIR --from hf-gpt2|hf-llama --output SAVE   import a Hugging Face model as a\n"
    "                             checkpoint to --finetune from\n"
    "  convert CKPT --to cohort --tensor-model-parallel-size T [--data-parallel-size D] --output SAVE\n"
    "                             rewrite in the layout a T x D job writes\n"
    "  prune SAVE --keep K        retention: keep the K most recent and the tracker's\n"
    "\n"
    "CKPT is a checkpoint directory (SAVE/iter_0000100) or a save directory (the tracker's\n"
    "checkpoint, or --iteration N).\n";

typedef struct args {
    bool json, help, dry_run, trim_vocab;
    int64_t iteration;
    int keep, tp, dp;
    bool model_only;
    double atol;  /* diff: differences up to this are within tolerance (-1: none) */
    const char *to, *from, *output;
    const char *pos[4];
    int npos;
} args;

static int parse_args(int argc, char **argv, args *a, const char *tool) {
    memset(a, 0, sizeof *a);
    a->iteration = -1;
    a->keep = -1;
    a->tp = a->dp = 0;
    a->atol = -1;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--json")) a->json = true;
        else if (!strcmp(s, "--help") || !strcmp(s, "-h")) a->help = true;
        else if (!strcmp(s, "--dry-run")) a->dry_run = true;
        else if (!strcmp(s, "--trim-vocab") && !strcmp(tool, "convert")) a->trim_vocab = true;
        else if (!strcmp(s, "--model-only") && !strcmp(tool, "diff")) a->model_only = true;
        else if (!strcmp(s, "--atol") && !strcmp(tool, "diff") && i + 1 < argc) {
            char *end;
            a->atol = strtod(argv[++i], &end);
            if (*end || !(a->atol >= 0)) {
                co_log(CO_LOG_ERROR, "--atol %s: give a non-negative number (the largest absolute difference allowed)",
                       argv[i]);
                return X_USAGE;
            }
        }
        else if ((!strcmp(s, "--iteration") || !strcmp(s, "--keep") || !strcmp(s, "--to") || !strcmp(s, "--output") ||
                  (!strcmp(tool, "convert") && !strcmp(s, "--from")) ||
                  (!strcmp(tool, "convert") &&
                   (!strcmp(s, "--tensor-model-parallel-size") || !strcmp(s, "--data-parallel-size")))) &&
                 i + 1 < argc) {
            const char *v = argv[++i];
            char *end;
            if (!strcmp(s, "--to")) a->to = v;
            else if (!strcmp(s, "--from")) a->from = v;
            else if (!strcmp(s, "--output")) a->output = v;
            else {
                long long x = strtoll(v, &end, 10);
                if (*end || end == v || x < 0) {
                    co_log(CO_LOG_ERROR, "%s needs a non-negative integer, got '%s'", s, v);
                    return X_USAGE;
                }
                if (!strcmp(s, "--keep")) a->keep = (int)x;
                else if (!strcmp(s, "--tensor-model-parallel-size")) a->tp = (int)(x > 4096 ? 4096 : x);
                else if (!strcmp(s, "--data-parallel-size")) a->dp = (int)(x > 4096 ? 4096 : x);
                else a->iteration = x;
            }
        } else if (s[0] == '-' && s[1]) {
            co_log(CO_LOG_ERROR, "unknown or incomplete flag '%s' (see --help)", s);
            return X_USAGE;
        } else if (a->npos < 4) {
            a->pos[a->npos++] = s;
        } else {
            co_log(CO_LOG_ERROR, "too many arguments");
            return X_USAGE;
        }
    }
    return 0;
}

/* CKPT: a checkpoint directory, or a save directory (tracker / --iteration). */
static int resolve(const char *path, int64_t iteration, char *out, size_t n) {
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/%s", path, CK_MANIFEST_NAME);
    struct stat st;
    if (iteration < 0 && !stat(mp, &st)) {
        snprintf(out, n, "%s", path);
        return 0;
    }
    int64_t it = iteration;
    if (it < 0) {
        int rc = ck_read_tracker(path, &it);
        if (rc == CO_EFORMAT)
            return ck_err_wrap(rc, "%s: cannot tell which checkpoint to read (give --iteration N or a checkpoint "
                                   "directory)", path);
        if (rc) {
            char base[4096];
            snprintf(base, sizeof base, "%s", path);
            const char *slash = strrchr(base, '/');
            if (ck_parse_iter_name(slash ? slash + 1 : base) >= 0) { /* an iter_ dir without a manifest */
                snprintf(out, n, "%s", path);
                return 0;
            }
            return co_err_set(CO_ENOENT, "%s: neither a checkpoint (no %s) nor a save directory with a tracker", path,
                              CK_MANIFEST_NAME);
        }
    }
    ck_iter_dir(out, n, path, it);
    return 0;
}

/* A tool's start: its flags parsed, --help answered with usage. False: stop and exit with
 * *status; true: go on (*status is 0). */
static bool tool_begin(int argc, char **argv, args *a, const char *tool, const char *usage, int *status) {
    *status = parse_args(argc, argv, a, tool);
    if (*status) return false;
    if (a->help) {
        fputs(usage, stdout);
        return false;
    }
    return true;
}

/* False with the usage error "needs WHAT" when the tool lacks it. */
static bool tool_need(bool ok, const char *what, int *status) {
    *status = ok ? 0 : X_USAGE;
    if (!ok) co_log(CO_LOG_ERROR, "needs %s (see --help)", what);
    return ok;
}

static void print_time(char *buf, size_t n, int64_t unix_s) {
    time_t t = (time_t)unix_s;
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static uint64_t dir_size(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t total = 0;
    struct dirent *de;
    char p[4608];
    struct stat st;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (!stat(p, &st) && S_ISREG(st.st_mode)) total += (uint64_t)st.st_size;
        }
    closedir(d);
    return total;
}

/* ---- ls ---------------------------------------------------------------------------------- */

/* Cheap status: manifest parses and every file is present with its size. */
static const char *quick_status(const char *dir, ck_manifest **out) {
    ck_manifest *m = NULL;
    int rc = ck_read_manifest(dir, &m);
    *out = NULL;
    if (rc) return rc == CO_ENOENT ? "incomplete" : "malformed";
    for (int i = 0; i < m->nfiles; i++) {
        char p[4400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, m->files[i].name);
        if (stat(p, &st) || (uint64_t)st.st_size != m->files[i].size) {
            ck_manifest_free(&m);
            return "incomplete";
        }
    }
    *out = m;
    return "complete";
}

static const char ls_usage[] =
    "usage: cohort ckpt ls SAVE [--json]\n\nLists the checkpoints in save directory SAVE: iteration, creation time,\n"
    "size, status (complete: manifest and every file of the right size; incomplete;\n"
    "malformed) and which one the tracker names. Checksums: `cohort ckpt verify`.\n"
    "Exit: 0, 1 cannot read SAVE, 2 usage.\n";

static int tool_ls(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "ls", ls_usage, &rc) ||
        !tool_need(a.npos == 1, "one save directory", &rc))
        return rc;
    const char *save = a.pos[0];
    int64_t *its;
    int n;
    rc = ck_list_iterations(save, &its, &n);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return 1;
    }
    int64_t tracked = -1;
    int trc = ck_read_tracker(save, &tracked);
    bool has_tracker = !trc;
    char tracker_error[1200] = ""; /* a tracker there but unreadable */
    if (trc && trc != CO_ENOENT) snprintf(tracker_error, sizeof tracker_error, "%s", co_err_detail());
    json_t *arr = json_array();
    if (!a.json) printf("%-10s  %-19s  %12s  %-10s  %s\n", "iteration", "time", "size", "status", "");
    for (int i = 0; i < n; i++) {
        char dir[4200], when[32] = "-";
        ck_iter_dir(dir, sizeof dir, save, its[i]);
        ck_manifest *m;
        const char *status = quick_status(dir, &m);
        if (m) print_time(when, sizeof when, m->created_unix);
        uint64_t size = dir_size(dir);
        bool latest = has_tracker && its[i] == tracked;
        if (a.json)
            json_array_append_new(arr, json_pack("{sIsssIsssbss}", "iteration", (json_int_t)its[i], "time", when, "size",
                                                 (json_int_t)size, "status", status, "latest", latest, "path", dir));
        else
            printf("%-10" PRId64 "  %-19s  %12" PRIu64 "  %-10s  %s\n", its[i], when, size, status,
                   latest ? "<- latest (tracker)" : "");
        ck_manifest_free(&m);
    }
    if (a.json) {
        json_t *o = json_pack("{sssoso}", "save_dir", save, "checkpoints", arr, "tracker",
                              has_tracker ? json_integer(tracked) : json_null());
        if (tracker_error[0]) json_object_set_new(o, "tracker_error", json_string(tracker_error));
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(o);
    } else {
        json_decref(arr);
        if (tracker_error[0]) printf("tracker unreadable: %s\n", tracker_error);
        else if (!has_tracker) printf("(no %s)\n", CK_TRACKER_NAME);
        else if (!n || tracked != its[n - 1]) printf("tracker: iteration %" PRId64 "\n", tracked);
    }
    free(its);
    return 0;
}

/* ---- inspect ----------------------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    int o = snprintf(buf, n, "[");
    for (int d = 0; d < ndim && o < (int)n; d++) o += snprintf(buf + o, n - (size_t)o, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (o < (int)n) snprintf(buf + o, n - (size_t)o, "]");
}

static int64_t numel(const ck_mtensor *t) {
    int64_t p = 1;
    for (int d = 0; d < t->ndim; d++) p *= t->shape[d];
    return p;
}

static int exit_of_bad(ck_bad b) { return b == CK_OK ? 1 : (int)b; }

static const char inspect_usage[] =
    "usage: cohort ckpt inspect CKPT [--iteration N] [--json]\n\nPrints the manifest (iteration, progress, "
    "seed, layout, model, optimizer, files) and\nevery tensor with its dtype, shape, pieces on disk and L2 "
    "norm (reading and verifying\nthe shards). Exit: 0, 1 unreadable, 2 usage, 3 malformed, 4 incomplete, 5 "
    "checksum.\n";

static int tool_inspect(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "inspect", inspect_usage, &rc) ||
        !tool_need(a.npos == 1, "one checkpoint", &rc))
        return rc;
    char dir[4200];
    ck_manifest *m = NULL;
    if ((rc = resolve(a.pos[0], a.iteration, dir, sizeof dir)) || (rc = ck_read_manifest(dir, &m))) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return rc == CO_EFORMAT ? CK_BAD_FORMAT : rc == CO_ENOENT ? CK_BAD_INCOMPLETE : 1;
    }
    float **bufs = NULL;
    ck_bad bad = CK_OK;
    rc = ck_read_all(dir, m, 1 << CK_KIND_MODEL | 1 << CK_KIND_OPTIM, &bufs, &bad);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        ck_manifest_free(&m);
        return exit_of_bad(bad);
    }
    json_t *tens = json_array();
    for (int i = 0; i < m->ntensors; i++) {
        const ck_mtensor *t = &m->tensors[i];
        double s = 0;
        int64_t ne = numel(t);
        for (int64_t k = 0; k < ne; k++) s += (double)bufs[i][k] * bufs[i][k];
        json_t *sh = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        /* the pipeline stages whose ranks wrote it (a file's group is its model shard) */
        json_t *st = json_array();
        int tsz = m->layout.tensor > 0 ? m->layout.tensor : 1;
        for (int k = 0; k < t->nslices; k++) {
            int stage = m->files[t->slices[k].file].group / tsz;
            bool seen = false;
            for (size_t q = 0; q < json_array_size(st); q++) seen = seen || json_integer_value(json_array_get(st, q)) == stage;
            if (!seen) json_array_append_new(st, json_integer(stage));
        }
        json_array_append_new(tens, json_pack("{sssssssosisfso}", "name", t->name, "kind", t->kind ? "optim" : "model",
                                              "dtype", ck_dtype_name(t->dtype), "shape", sh, "pieces", t->nslices, "norm",
                                              sqrt(s), "stages", st));
    }
    ck_free_all(m, &bufs);
    if (a.json) {
        json_t *o = json_pack("{sssOso}", "path", dir, "manifest", m->doc, "tensors", tens);
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        putchar('\n');
        json_decref(o);
    } else {
        char when[32];
        print_time(when, sizeof when, m->created_unix);
        const ck_progress *p = &m->progress;
        const ck_model_info *mi = &m->model;
        printf("checkpoint %s\n  format %s version %d, created %s\n", dir, CK_FORMAT_NAME, m->version, when);
        printf("  iteration %" PRId64 ", consumed samples train %" PRId64 " valid %" PRId64 " test %" PRId64
               ", skipped %" PRId64 ", nan %" PRId64 "\n",
               m->iteration, p->consumed[0], p->consumed[1], p->consumed[2], p->skipped, p->nan_iters);
        printf("  seed %" PRId64 "; parallel: world %d = tensor %d x pipeline %d x context %d x data %d, %d writer%s\n",
               m->seed, m->layout.world, m->layout.tensor, m->layout.pipeline, m->layout.context, m->layout.data,
               m->layout.writers, m->layout.writers == 1 ? "" : "s");
        printf("  model: %d layers, hidden %d, %d heads (%d kv groups, head dim %d), ffn %d, vocab %d (padded %d), "
               "%s, %s, %s, %s, %s\n",
               mi->num_layers, mi->hidden, mi->heads, mi->kv_groups, mi->head_dim, mi->ffn_hidden, mi->vocab,
               mi->padded_vocab, mi->rope ? "rope" : "learned positions", mi->rmsnorm ? "RMSNorm" : "LayerNorm",
               mi->swiglu ? "SwiGLU" : "GELU", mi->tied ? "tied" : "untied", mi->bias ? "biases" : "no biases");
        if (m->optim.present)
            printf("  optimizer: %s, step %" PRId64 ", betas (%g, %g), eps %g, weight decay %g, clip %g\n", m->optim.type,
                   m->optim.step, m->optim.beta1, m->optim.beta2, m->optim.eps, m->optim.weight_decay, m->optim.clip_grad);
        else
            printf("  optimizer: not saved (--no-save-optim)\n");
        for (int i = 0; i < m->nfiles; i++) {
            char hx[33];
            ck_hex128(m->files[i].xxh128, hx);
            printf("  file %-36s %12" PRIu64 " bytes  xxh3-128 %s\n", m->files[i].name, m->files[i].size, hx);
        }
        bool staged = m->layout.pipeline > 1;
        printf("  %-52s %-5s %-4s %-16s %6s  %-12s%s\n", "tensor", "kind", "type", "shape", "pieces", "L2 norm",
               staged ? "  stage" : "");
        size_t i;
        json_t *t;
        json_array_foreach(tens, i, t) {
            char sh[64];
            shape_str(sh, sizeof sh, m->tensors[i].ndim, m->tensors[i].shape);
            char stages[64] = "";
            json_t *st = json_object_get(t, "stages");
            for (size_t q = 0; staged && q < json_array_size(st) && strlen(stages) < sizeof stages - 12; q++)
                snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%lld", q ? "," : "  stage ",
                         (long long)json_integer_value(json_array_get(st, q)));
            printf("  %-52s %-5s %-4s %-16s %6d  %-12.6g%s\n", m->tensors[i].name, m->tensors[i].kind ? "optim" : "model",
                   ck_dtype_name(m->tensors[i].dtype), sh, m->tensors[i].nslices,
                   json_real_value(json_object_get(t, "norm")), stages);
        }
        json_decref(tens);
    }
    ck_manifest_free(&m);
    return 0;
}

/* ---- verify ------------------------------------------------------------------------------ */

typedef struct vctx {
    bool json;
    json_t *files;
} vctx;

static const char *bad_name(ck_bad b) {
    switch (b) {
    case CK_OK: return "ok";
    case CK_BAD_IO: return "unreadable";
    case CK_BAD_FORMAT: return "malformed";
    case CK_BAD_INCOMPLETE: return "incomplete";
    case CK_BAD_CHECKSUM: return "checksum mismatch";
    }
    return "?";
}

static void vreport(void *ctx, const char *file, ck_bad bad, const char *detail) {
    vctx *v = ctx;
    if (v->json) json_array_append_new(v->files, json_pack("{sssssiss}", "file", file, "status", bad_name(bad), "code", (int)bad,
                                                          "detail", detail));
    else if (bad == CK_OK) printf("  %-40s ok\n", file);
    else printf("  %-40s %s: %s\n", file, bad_name(bad), detail);
}

static const char verify_usage[] =
    "usage: cohort ckpt verify CKPT [--iteration N] [--json]\n\nReads every file the manifest lists and checks "
    "its presence, size, safetensors header\n(against the manifest) and XXH3-128 checksum.\n\n"
    "exit status: 0 verified; 1 unreadable (I/O, permissions); 2 usage; 3 malformed (manifest or\n"
    "shard header unparsable or inconsistent); 4 incomplete (manifest or a file missing, a file\n"
    "truncated or of the wrong size); 5 checksum mismatch (corrupt data). With several problems\n"
    "the first in the order 3, 4, 5, 1 decides.\n";

static int tool_verify(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "verify", verify_usage, &rc) ||
        !tool_need(a.npos == 1, "one checkpoint", &rc))
        return rc;
    char dir[4200];
    if ((rc = resolve(a.pos[0], a.iteration, dir, sizeof dir))) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return rc == CO_EFORMAT ? CK_BAD_FORMAT : CK_BAD_INCOMPLETE;
    }
    vctx v = {a.json, json_array()};
    if (!a.json) printf("verifying %s\n", dir);
    ck_bad bad = CK_OK;
    rc = ck_verify(dir, &bad, vreport, &v);
    if (a.json) {
        json_t *o = json_pack("{sssssiso}", "path", dir, "status", bad_name(bad), "code", (int)bad, "files", v.files);
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(o);
    } else {
        json_decref(v.files);
        printf(rc ? "FAILED: %s\n" : "%s: checkpoint verified\n", rc ? bad_name(bad) : dir);
    }
    return rc ? (int)(bad ? bad : CK_BAD_IO) : 0;
}

/* ---- diff -------------------------------------------------------------------------------- */

static int open_all(const char *path, int64_t it, char *dir, size_t n, ck_manifest **m, float ***bufs) {
    int rc = resolve(path, it, dir, n);
    if (!rc) rc = ck_read_manifest(dir, m);
    ck_bad bad;
    if (!rc) rc = ck_read_all(dir, *m, 1 << CK_KIND_MODEL | 1 << CK_KIND_OPTIM, bufs, &bad);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        ck_manifest_free(m);
    }
    return rc;
}

static const char diff_usage[] =
    "usage: cohort ckpt diff CKPT_A CKPT_B [--model-only] [--atol X] [--json]\n\nCompares every tensor (model and optimizer state) of "
    "two checkpoints, whatever their\nlayouts on disk: bitwise equal, or the largest absolute and relative "
    "difference\n(|a-b| / max(|b|, 1e-30)); tensors in one only or with other shapes.\n"
    "  --model-only  the parameters only: optimizer state on either side is left out\n"
    "  --atol X      a tensor whose elements differ by at most X is \"within tolerance\" and counts as\n"
    "                equal (a run whose gradients were summed in another order: --elastic)\n"
    "exit status: 0 every tensor bitwise equal (or within --atol); 1 they differ; 2 usage or a checkpoint\n"
    "unreadable.\n";

static int tool_diff(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "diff", diff_usage, &rc) ||
        !tool_need(a.npos == 2, "two checkpoints", &rc))
        return rc;
    char da[4200], db[4200];
    ck_manifest *ma = NULL, *mb = NULL;
    float **ba = NULL, **bb = NULL;
    if (open_all(a.pos[0], -1, da, sizeof da, &ma, &ba)) return X_USAGE;
    if (open_all(a.pos[1], -1, db, sizeof db, &mb, &bb)) {
        ck_free_all(ma, &ba);
        ck_manifest_free(&ma);
        return X_USAGE;
    }
    json_t *arr = json_array();
    int ndiff = 0, nequal = 0, nwithin = 0;
    for (int i = 0; i < ma->ntensors; i++) {
        const ck_mtensor *t = &ma->tensors[i], *u = ck_manifest_find(mb, t->name);
        if (a.model_only && t->kind != CK_KIND_MODEL) continue;
        const char *status;
        double maxabs = 0, maxrel = 0;
        if (!u) status = "only in A";
        else {
            bool same_shape = t->ndim == u->ndim;
            for (int d = 0; same_shape && d < t->ndim; d++) same_shape = t->shape[d] == u->shape[d];
            if (!same_shape) status = "shape differs";
            else {
                const float *x = ba[i], *y = bb[u - mb->tensors];
                int64_t ne = numel(t);
                status = memcmp(x, y, (size_t)ne * sizeof(float)) ? "differs" : "bitwise equal";
                if (strcmp(status, "bitwise equal"))
                    for (int64_t k = 0; k < ne; k++) {
                        double d = fabs((double)x[k] - (double)y[k]);
                        double r = d / fmax(fabs((double)y[k]), 1e-30);
                        if (d > maxabs || isnan(d)) maxabs = d;
                        if (r > maxrel || isnan(r)) maxrel = r;
                    }
            }
        }
        if (!strcmp(status, "differs") && a.atol >= 0 && maxabs <= a.atol) status = "within tolerance", nwithin++;
        bool eq = !strcmp(status, "bitwise equal") || !strcmp(status, "within tolerance");
        eq ? nequal++ : ndiff++;
        if (a.json)
            json_array_append_new(arr, json_pack("{sssssfsf}", "name", t->name, "status", status, "max_abs", maxabs,
                                                 "max_rel", maxrel));
        else if (!eq) {
            if (!strcmp(status, "differs"))
                printf("  %-52s differs: max abs %.6g, max rel %.6g\n", t->name, maxabs, maxrel);
            else
                printf("  %-52s %s\n", t->name, status);
        }
    }
    for (int i = 0; i < mb->ntensors; i++)
        if (!ck_manifest_find(ma, mb->tensors[i].name) && !(a.model_only && mb->tensors[i].kind != CK_KIND_MODEL)) {
            ndiff++;
            if (a.json) json_array_append_new(arr, json_pack("{ssss}", "name", mb->tensors[i].name, "status", "only in B"));
            else printf("  %-52s only in B\n", mb->tensors[i].name);
        }
    if (a.json) {
        json_t *o = json_pack("{sssssbsisisiso}", "a", da, "b", db, "bitwise_equal", ndiff == 0 && nwithin == 0, "equal",
                              nequal, "within_tolerance", nwithin, "different", ndiff, "tensors", arr);
        json_dumpf(o, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        putchar('\n');
        json_decref(o);
    } else {
        json_decref(arr);
        const char *how = a.atol >= 0 ? "equal within --atol" : "bitwise equal";
        if (ndiff) printf("%d tensor%s differ, %d %s\n", ndiff, ndiff == 1 ? "" : "s", nequal, how);
        else printf("%s: %d tensors\n", how, nequal);
    }
    ck_free_all(ma, &ba);
    ck_free_all(mb, &bb);
    ck_manifest_free(&ma);
    ck_manifest_free(&mb);
    return ndiff ? X_DIFFER : X_OK;
}

/* ---- convert ----------------------------------------------------------------------------- */

static const char convert_usage[] =
    "usage: cohort ckpt convert CKPT --to hf-gpt2|hf-llama --output DIR [--trim-vocab] [--iteration N] [--json]\n"
    "       cohort ckpt convert CKPT --to cohort --tensor-model-parallel-size T [--data-parallel-size D]\n"
    "                               --output SAVE [--iteration N] [--json]\n"
    "       cohort ckpt convert HFDIR --from hf-gpt2|hf-llama --output SAVE [--json]\n\n"
    "hf-gpt2: writes DIR/model.safetensors and DIR/config.json in the Hugging Face GPT-2\n"
    "layout (GPT2LMHeadModel; Conv1D weights [in, out], c_attn = [q | k | v], output layer\n"
    "tied), from a checkpoint of any layout (tensor-parallel slices are joined). The\n"
    "embedding keeps every padded vocabulary row and config.json's vocab_size is the padded\n"
    "size, so the softmax runs over the same logits as cohort's and the exported model\n"
    "computes cohort's loss. Needs GPT-2's options: learned positions, LayerNorm, GELU, tied\n"
    "embeddings, biases, no grouped-query attention.\n"
    "hf-llama: the same in the Hugging Face Llama layout (LlamaForCausalLM: q/k/v_proj cut\n"
    "from qkv, gate/up_proj from fc1, lm_head unless tied; config.json with rope_theta,\n"
    "rms_norm_eps, num_key_value_heads, head_dim). Needs Llama's options: rotary positions,\n"
    "RMSNorm, SwiGLU, no biases, no experts, no MTP layers.\n"
    "  --trim-vocab  drop the padded rows: vocab_size = the tokenizer's vocabulary, and the\n"
    "                softmax then runs over the real vocabulary only, so the exported model's\n"
    "                probabilities and losses differ from cohort's (they are equal only when\n"
    "                nothing was padded).\n"
    "Both exports add a \"cohort\" object to config.json (tokenizer flags, real vocabulary)\n"
    "that an import reads back.\n"
    "cohort: writes SAVE/iter_N and SAVE's tracker as a job of T tensor-parallel x D\n"
    "data-parallel ranks (D default 1) saves them: T x D shard files per kind, each tensor\n"
    "rank's slices spread over its D replicas, the padded vocabulary a multiple of\n"
    "--make-vocab-size-divisible-by x T (new rows copy the last row, rows past the new size\n"
    "are dropped). `cohort train --load` reads any layout at any size without this; it is\n"
    "for files cut as that job cuts them. Model and optimizer state, progress, seed and\n"
    "the rerun state machine's state are carried over. SAVE must not hold iteration N nor\n"
    "anything newer (its tracker would move back: refused), and must not be in use by a\n"
    "job (its lock, SAVE/.cohort.lock, is taken while converting).\n"
    "--from hf-gpt2|hf-llama: imports the Hugging Face model in HFDIR (config.json, and\n"
    "model.safetensors or the shards model.safetensors.index.json names; F32, F16, BF16 or\n"
    "F64 tensors, stored as fp32) as SAVE/iter_0000000: tensor-parallel size 1, no optimizer\n"
    "state, the model and tokenizer flags recorded. Train from it with `cohort train --load\n"
    "SAVE --finetune --use-checkpoint-args` at any layout. The tokenizer is config.json's\n"
    "\"cohort\" object's, else GPT2BPETokenizer for a GPT-2 of 50257 rows, else NullTokenizer\n"
    "over every row. A missing or misshapen tensor, a config key that disagrees with the\n"
    "tensors, a truncated file, and tensors or options cohort's model lacks (rope_scaling,\n"
    "biases in Llama, another activation) are refused by name. SAVE must hold no checkpoint.\n"
    "Either way --output must not be or lie inside a checkpoint directory (the source's\n"
    "included), nor lie inside a save directory (hf-gpt2, hf-llama: nor be one). SIGINT or\n"
    "SIGTERM stops the conversion and removes its temporary files; those a killed conversion\n"
    "left (of a process no longer running) are removed by the next one into that output.\n"
    "exit status: 0 written; 1 failure (malformed input); 2 usage, an --output refused, or a\n"
    "layout the model does not split into; 3 the model, target or source is not supported;\n"
    "128 + the signal when interrupted.\n";

/* Reports the leftovers a cleaner removed and kept (stderr: the tool's own output stays
 * what it was). */
static void report_stale(const char *where, const ck_stale *st) {
    for (int i = 0; i < st->nremoved && i < CK_STALE_MAX; i++)
        co_log(CO_LOG_INFO, "removed %s/%s, left by an interrupted process that is no longer running", where, st->removed[i]);
    for (int i = 0; i < st->nkept && i < CK_STALE_MAX; i++)
        co_log(CO_LOG_INFO, "kept %s/%s: %s", where, st->kept[i], st->why_kept[i]);
}

/* --to cohort: SAVE locked for the conversion, leftovers of dead conversions removed, and
 * refused when it holds an iteration past the one written (its tracker would move back). */
static int convert_cohort(const char *dir, const ck_manifest *m, const args *a, char *note, size_t note_len) {
    ck_lock *lock = NULL;
    char lnote[600] = "";
    int rc = ck_savedir_lock_as(&lock, "--output", a->output, "ckpt-convert", lnote, sizeof lnote);
    if (rc) return rc;
    if (lnote[0]) co_log(CO_LOG_ERROR, "%s", lnote);
    ck_stale st;
    rc = ck_clean_dead(a->output, NULL, false, &st);
    if (!rc) report_stale(a->output, &st);
    int64_t tracked = -1, *its = NULL;
    int n = 0;
    int trc = rc ? 0 : ck_read_tracker(a->output, &tracked);
    if (trc == CO_EFORMAT)
        rc = ck_err_wrap(CO_EINVAL, "--output %s: its tracker is unreadable, so writing iteration %" PRId64
                                    " there could move it back", a->output, m->iteration);
    else if (trc && trc != CO_ENOENT) rc = trc;
    if (!rc) rc = ck_list_iterations(a->output, &its, &n);
    int64_t newest = n ? its[n - 1] : -1;
    if (tracked > newest) newest = tracked;
    free(its);
    if (!rc && newest > m->iteration)
        rc = co_err_set(CO_EINVAL,
                        "--output %s holds iteration %" PRId64 " (%s), later than iteration %" PRId64
                        " being converted: writing it would move the tracker back and the next --load would resume "
                        "at %" PRId64 "; choose another directory",
                        a->output, newest, newest == tracked ? "its tracker's" : "a checkpoint directory",
                        m->iteration, m->iteration);
    if (!rc) rc = cli_ckpt_relayout(dir, m, a->tp, a->dp, a->output, note, note_len);
    int keep = rc;
    char detail[2048];
    snprintf(detail, sizeof detail, "%s", co_err_detail());
    ck_savedir_unlock(&lock);
    if (keep) co_err_set(keep, "%s", detail);
    return keep;
}

/* --to hf-gpt2: leftovers of dead exports into the directory removed, then the export. */
static int convert_hf(const char *dir, const ck_manifest *m, const args *a) {
    static const char *const names[] = {"model.safetensors", "config.json"};
    ck_stale st;
    int rc = ck_clean_dead_files(a->output, names, 2, &st);
    if (rc) return rc;
    report_stale(a->output, &st);
    return !strcmp(a->to, "hf-llama") ? ck_export_hf_llama(dir, m, a->output, a->trim_vocab)
                                       : ck_export_hf_gpt2(dir, m, a->output, a->trim_vocab);
}

/* --from: SAVE locked, leftovers of dead conversions removed, refused when it holds any
 * checkpoint (iteration 0 would move its tracker back or replace one), then the import. */
static int convert_import(const args *a) {
    ck_lock *lock = NULL;
    char lnote[600] = "";
    int rc = ck_savedir_lock_as(&lock, "--output", a->output, "ckpt-convert", lnote, sizeof lnote);
    if (rc) return rc;
    if (lnote[0]) co_log(CO_LOG_ERROR, "%s", lnote);
    ck_stale st;
    rc = ck_clean_dead(a->output, NULL, false, &st);
    if (!rc) report_stale(a->output, &st);
    int64_t tracked = -1, *its = NULL;
    int n = 0;
    if (!rc) rc = ck_list_iterations(a->output, &its, &n);
    free(its);
    if (!rc && (n || !ck_read_tracker(a->output, &tracked)))
        rc = co_err_set(CO_EINVAL, "--output %s already holds a checkpoint; import into an empty or new directory",
                        a->output);
    if (!rc) rc = ck_import_hf(a->pos[0], !strcmp(a->from, "hf-gpt2"), a->output);
    int keep = rc;
    char detail[2048];
    snprintf(detail, sizeof detail, "%s", co_err_detail());
    ck_savedir_unlock(&lock);
    if (keep) co_err_set(keep, "%s", detail);
    return keep;
}

static int tool_import(const args *a) {
    if (strcmp(a->from, "hf-gpt2") && strcmp(a->from, "hf-llama")) {
        co_log(CO_LOG_ERROR, "--from %s: unknown source; hf-gpt2 or hf-llama", a->from);
        return X_UNSUPPORTED;
    }
    if (a->to || a->tp || a->dp || a->trim_vocab || a->iteration >= 0) {
        co_log(CO_LOG_ERROR, "--from takes HFDIR and --output only (no --to, layout sizes, --trim-vocab or --iteration)");
        return X_USAGE;
    }
    if (ck_check_output(a->output, true, "--output")) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return X_USAGE;
    }
    int rc = ck_catch_signals();
    if (!rc) rc = convert_import(a);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        if (ck_interrupted()) {
            co_log(CO_LOG_ERROR, "interrupted: its temporary files are removed and nothing was written to %s", a->output);
            ck_reraise();
        }
        return rc == CO_EUNSUPPORTED ? X_UNSUPPORTED : rc == CO_EINVAL ? X_USAGE : 1;
    }
    if (a->json)
        printf("{\"from\": \"%s\", \"source\": \"%s\", \"output\": \"%s\", \"iteration\": 0}\n", a->from, a->pos[0],
               a->output);
    else
        printf("wrote %s iteration 0 from %s (Hugging Face %s; tensor-parallel size 1, no optimizer state: train with "
               "--finetune --use-checkpoint-args)\n", a->output, a->pos[0], strcmp(a->from, "hf-gpt2") ? "Llama" : "GPT-2");
    return 0;
}

static int tool_convert(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "convert", convert_usage, &rc) ||
        !tool_need(a.npos == 1 && (a.to || a.from) && a.output, "CKPT, --to (or --from) and --output", &rc))
        return rc;
    if (a.from) return tool_import(&a);
    bool cohort = !strcmp(a.to, "cohort");
    if (strcmp(a.to, "hf-gpt2") && strcmp(a.to, "hf-llama") && !cohort) {
        co_log(CO_LOG_ERROR, "--to %s: unknown target; hf-gpt2, hf-llama or cohort", a.to);
        return X_UNSUPPORTED;
    }
    if (cohort && a.tp < 1) {
        co_log(CO_LOG_ERROR, "--to cohort needs --tensor-model-parallel-size T (1 or more)");
        return X_USAGE;
    }
    if (!cohort && (a.tp || a.dp)) {
        co_log(CO_LOG_ERROR, "--tensor-model-parallel-size and --data-parallel-size go with --to cohort");
        return X_USAGE;
    }
    if (cohort && !a.dp) a.dp = 1;
    if ((rc = ck_check_output(a.output, cohort, "--output"))) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return X_USAGE;
    }
    char dir[4200];
    ck_manifest *m = NULL;
    if ((rc = resolve(a.pos[0], a.iteration, dir, sizeof dir)) || (rc = ck_read_manifest(dir, &m))) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        return 1;
    }
    char note[300] = "";
    if (!(rc = ck_catch_signals()))
        rc = cohort ? convert_cohort(dir, m, &a, note, sizeof note) : convert_hf(dir, m, &a);
    int64_t it = m->iteration;
    ck_manifest_free(&m);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", co_err_detail());
        if (ck_interrupted()) {
            co_log(CO_LOG_ERROR, "interrupted: its temporary files are removed and nothing was written to %s",
                    a.output);
            ck_reraise();
        }
        return rc == CO_EUNSUPPORTED ? X_UNSUPPORTED : rc == CO_EINVAL ? X_USAGE : 1;
    }
    if (cohort) {
        if (a.json)
            printf("{\"from\": \"%s\", \"to\": \"cohort\", \"output\": \"%s\", \"iteration\": %" PRId64
                   ", \"tensor\": %d, \"data\": %d, \"note\": \"%s\"}\n", dir, a.output, it, a.tp, a.dp, note);
        else
            printf("wrote %s iteration %" PRId64 " in the layout of tensor-parallel size %d x data-parallel size %d "
                   "from %s%s%s\n", a.output, it, a.tp, a.dp, dir, note[0] ? "; " : "", note);
        return 0;
    }
    if (a.json)
        printf("{\"from\": \"%s\", \"to\": \"%s\", \"output\": \"%s\", \"trim_vocab\": %s}\n", dir, a.to, a.output,
               a.trim_vocab ? "true" : "false");
    else
        printf("wrote %s/model.safetensors and %s/config.json (Hugging Face %s, %s) from %s\n", a.output, a.output,
               strcmp(a.to, "hf-llama") ? "GPT-2" : "Llama",
               a.trim_vocab ? "padded vocabulary rows dropped" : "padded vocabulary kept", dir);
    return 0;
}

/* ---- prune ------------------------------------------------------------------------------- */

static const char prune_usage[] =
    "usage: cohort ckpt prune SAVE --keep K [--dry-run] [--json]\n\nRemoves all but the K most recent "
    "checkpoints of SAVE. Never removes the one the\ntracker names, nor any newer than it (a save that did "
    "not reach its commit). A\ncheckpoint is renamed away before it is deleted, so it never looks complete "
    "while\nhalf removed. Also removes the leftovers of interrupted saves and removals\n(iter_*.tmp-*, "
    "iter_*.del-*) whose process is gone, and lists them apart from the\ncheckpoints; while a job holds "
    "SAVE's lock (SAVE/.cohort.lock), or a leftover's\nprocess runs, that leftover is kept: it may be a save "
    "in progress. Without a running\njob, prune holds the lock itself while it works. SIGINT or SIGTERM stops "
    "it between\ncheckpoints.\nexit status: 0, 1 failure, 2 usage, 128 + the signal when interrupted.\n";

/* The save directory's lock for a prune: taken when free (no job can start and begin a
 * save meanwhile), else *who says which job holds it. 0, or an error. */
static int prune_lock(const char *save, bool dry_run, ck_lock **lock, char *who, size_t n) {
    *lock = NULL;
    int held = ck_savedir_lock_held(save, who, n);
    if (held < 0) return held;
    if (held || dry_run) return 0;
    char note[600] = "";
    int rc = ck_savedir_lock_as(lock, "save directory", save, "ckpt-prune", note, sizeof note);
    if (rc == CO_EINVAL && ck_savedir_lock_held(save, who, n) == 1) return 0; /* a job just took it */
    if (!rc && note[0]) co_log(CO_LOG_ERROR, "%s", note);
    return rc;
}

static void prune_print(const args *a, const int64_t *removed, int nr, const ck_stale *st) {
    const char *verb = a->dry_run ? "would remove" : "removed";
    if (a->json) {
        json_t *arr = json_array(), *tmp = json_array(), *kept = json_array();
        for (int i = 0; i < nr && i < 4096; i++) json_array_append_new(arr, json_integer(removed[i]));
        for (int i = 0; i < st->nremoved && i < CK_STALE_MAX; i++) json_array_append_new(tmp, json_string(st->removed[i]));
        for (int i = 0; i < st->nkept && i < CK_STALE_MAX; i++)
            json_array_append_new(kept, json_pack("{ssss}", "name", st->kept[i], "why", st->why_kept[i]));
        json_t *o = json_pack("{sssbsosisosiso}", "save_dir", a->pos[0], "dry_run", a->dry_run, "removed", arr,
                              "temporary_removed_count", st->nremoved, "temporary_removed", tmp, "temporary_kept_count",
                              st->nkept, "temporary_kept", kept);
        json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(o);
        return;
    }
    for (int i = 0; i < nr && i < 4096; i++) printf("%s iteration %" PRId64 "\n", verb, removed[i]);
    for (int i = 0; i < st->nremoved && i < CK_STALE_MAX; i++)
        printf("%s stale temporary directory %s (its process is gone)\n", verb, st->removed[i]);
    for (int i = 0; i < st->nkept && i < CK_STALE_MAX; i++)
        printf("kept temporary directory %s: %s\n", st->kept[i], st->why_kept[i]);
    printf("%d checkpoint%s %s; %d stale temporary director%s %s", nr, nr == 1 ? "" : "s",
           a->dry_run ? "would be removed" : "removed", st->nremoved, st->nremoved == 1 ? "y" : "ies",
           a->dry_run ? "would be removed" : "removed");
    if (st->nkept) printf(", %d kept (in use)", st->nkept);
    putchar('\n');
}

static int tool_prune(int argc, char **argv) {
    args a;
    int rc;
    if (!tool_begin(argc, argv, &a, "prune", prune_usage, &rc) ||
        !tool_need(a.npos == 1 && a.keep >= 1, "SAVE and --keep K >= 1", &rc))
        return rc;
    const char *save = a.pos[0];
    struct stat sb;
    if (stat(save, &sb) || !S_ISDIR(sb.st_mode)) {
        co_log(CO_LOG_ERROR, "%s: not a directory", save);
        return 1;
    }
    int64_t removed[4096];
    int nr = 0;
    ck_stale st;
    memset(&st, 0, sizeof st);
    ck_lock *lock = NULL;
    char who[512] = "";
    rc = ck_catch_signals();
    if (!rc) rc = prune_lock(save, a.dry_run, &lock, who, sizeof who);
    if (!rc) rc = ck_clean_dead(save, who[0] ? who : NULL, a.dry_run, &st);
    if (!rc) rc = ck_prune(save, a.keep, a.dry_run, removed, 4096, &nr);
    char detail[2048];
    snprintf(detail, sizeof detail, "%s", co_err_detail());
    ck_savedir_unlock(&lock);
    if (rc) {
        co_log(CO_LOG_ERROR, "%s", detail);
        /* what was removed before the failure */
        for (int i = 0; i < nr && i < 4096; i++) co_log(CO_LOG_INFO, "removed iteration %" PRId64, removed[i]);
        if (ck_interrupted()) ck_reraise();
        return 1;
    }
    prune_print(&a, removed, nr, &st);
    return 0;
}

int cli_ckpt(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") || !strcmp(argv[0], "help")) {
        fputs(top_usage, argc < 1 ? stderr : stdout);
        return argc < 1 ? X_USAGE : 0;
    }
    const char *tool = argv[0];
    co_log_set_prefix("cohort ckpt %s", tool);
    if (!strcmp(tool, "ls")) return tool_ls(argc - 1, argv + 1);
    if (!strcmp(tool, "inspect")) return tool_inspect(argc - 1, argv + 1);
    if (!strcmp(tool, "verify")) return tool_verify(argc - 1, argv + 1);
    if (!strcmp(tool, "diff")) return tool_diff(argc - 1, argv + 1);
    if (!strcmp(tool, "convert")) return tool_convert(argc - 1, argv + 1);
    if (!strcmp(tool, "prune")) return tool_prune(argc - 1, argv + 1);
    fprintf(stderr, "cohort ckpt: unknown tool '%s'\n%s", tool, top_usage);
    return X_USAGE;
}
