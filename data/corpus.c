/* corpus.c - builds the default corpus from the system's licence texts. */
#include "data/corpus.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "data/indexed.h"
#include "data/tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char **rel;   /* relative paths */
    char **real;  /* realpaths */
    int *is_link;
    size_t n, cap;
} flist;

static int fl_add(flist *l, const char *rel, const char *real, int is_link) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        char **a = realloc(l->rel, nc * sizeof *a);
        if (!a) return CO_ENOMEM;
        l->rel = a;
        char **b = realloc(l->real, nc * sizeof *b);
        if (!b) return CO_ENOMEM;
        l->real = b;
        int *c = realloc(l->is_link, nc * sizeof *c);
        if (!c) return CO_ENOMEM;
        l->is_link = c;
        l->cap = nc;
    }
    l->rel[l->n] = strdup(rel);
    l->real[l->n] = strdup(real);
    l->is_link[l->n] = is_link;
    if (!l->rel[l->n] || !l->real[l->n]) {
        free(l->rel[l->n]);
        free(l->real[l->n]);
        return CO_ENOMEM;
    }
    l->n++;
    return 0;
}

static void fl_free(flist *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->rel[i]);
        free(l->real[i]);
    }
    free(l->rel);
    free(l->real);
    free(l->is_link);
}

static int walk(const char *root, const char *rel, flist *l, int depth) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: cannot open directory: %s", path, strerror(e));
    }
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char r2[PATH_MAX], p2[PATH_MAX], real[PATH_MAX];
        if (snprintf(r2, sizeof r2, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >= (int)sizeof r2) continue;
        if (snprintf(p2, sizeof p2, "%s/%s", root, r2) >= (int)sizeof p2) continue;
        struct stat lst, st;
        if (lstat(p2, &lst) != 0) continue;
        if (S_ISDIR(lst.st_mode)) {
            if (depth < 8) rc = walk(root, r2, l, depth + 1);
            continue;
        }
        if (stat(p2, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (!realpath(p2, real)) continue;
        if (fl_add(l, r2, real, S_ISLNK(lst.st_mode)) != 0) rc = co_err_set(CO_ENOMEM, "out of memory");
    }
    closedir(d);
    return rc;
}

static int cmp_idx(const void *a, const void *b, void *arg) {
    char **rel = arg;
    return strcmp(rel[*(const size_t *)a], rel[*(const size_t *)b]);
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

double corpus_entropy(const int64_t *counts, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += counts[i];
    if (total == 0) return 0.0;
    double h = 0.0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0) {
            double p = (double)counts[i] / (double)total;
            h -= p * log(p);
        }
    return h;
}

int corpus_build(const char *src_dir, const char *out_dir, const char *name, corpus_info *stats) {
    if (!src_dir) src_dir = CORPUS_DEFAULT_DIR;
    struct stat st;
    if (stat(src_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return co_err_set(CO_ENOENT, "%s: corpus source directory is missing (install base-files or pass another)",
                          src_dir);
    if (stat(out_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return co_err_set(CO_ENOENT, "%s: output directory is missing", out_dir);
    flist l = {0};
    int rc = walk(src_dir, "", &l, 0);
    size_t *order = NULL;
    int32_t *tok = NULL;
    idx_writer *w = NULL;
    int64_t counts[TOK_BYTE_VOCAB] = {0};
    corpus_info s = {0};
    snprintf(s.source_dir, sizeof s.source_dir, "%s", src_dir);
    if (rc) goto out;
    order = malloc((l.n ? l.n : 1) * sizeof *order);
    if (!order) {
        rc = co_err_set(CO_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < l.n; i++) order[i] = i;
    qsort_r(order, l.n, sizeof *order, cmp_idx, l.rel);
    char prefix[PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s/%s", out_dir, name);
    rc = idx_writer_new(&w, prefix, idx_dtype_for_vocab(TOK_BYTE_VOCAB));
    if (rc) goto out;
    for (size_t k = 0; k < l.n && rc == 0; k++) {
        size_t i = order[k];
        if (l.is_link[i]) {
            /* skip a symlink whose target is an included regular file (or an earlier link) */
            int dup = 0;
            for (size_t j = 0; j < l.n && !dup; j++)
                if (j != i && !strcmp(l.real[j], l.real[i]) && (!l.is_link[j] || j < i)) dup = 1;
            if (dup) continue;
        }
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", src_dir, l.rel[i]);
        char *data;
        size_t len;
        rc = fs_read_all(path, &data, &len);
        if (rc) break;
        s.files++;
        free(tok);
        tok = malloc((len + 1) * sizeof *tok);
        if (!tok) {
            free(data);
            rc = co_err_set(CO_ENOMEM, "out of memory");
            break;
        }
        size_t pos = 0, ntok = 0;
        while (pos <= len && rc == 0) {
            size_t e = pos;
            while (e < len && data[e] != '\n') e++;
            int blank = is_blank(data + pos, e - pos);
            if (!blank) {
                if (ntok) tok[ntok++] = '\n';
                for (size_t c = pos; c < e; c++) tok[ntok++] = (unsigned char)data[c];
            }
            if ((blank || e >= len) && ntok) {
                tok[ntok] = TOK_BYTE_EOD;
                for (size_t c = 0; c <= ntok; c++) counts[tok[c]]++;
                rc = idx_writer_add_sequence(w, tok, ntok + 1);
                if (rc == 0) rc = idx_writer_end_document(w);
                s.documents++;
                s.tokens += (int64_t)ntok + 1;
                ntok = 0;
            }
            pos = e + 1;
        }
        free(data);
    }
    if (rc) goto out;
    if (s.documents == 0) {
        rc = co_err_set(CO_EFORMAT, "%s: no text found for the corpus", src_dir);
        goto out;
    }
    rc = idx_writer_finish(&w);
    s.unigram_entropy = corpus_entropy(counts, TOK_BYTE_VOCAB);
    if (rc == 0 && stats) *stats = s;
out:
    idx_writer_abort(&w);
    free(tok);
    free(order);
    fl_free(&l);
    return rc;
}

int corpus_build_default(const char *workdir, char *prefix, size_t prefix_size, corpus_info *info) {
    int rc = fs_mkdirs(workdir);
    if (rc) return rc;
    if ((size_t)snprintf(prefix, prefix_size, "%s/common-licenses", workdir) >= prefix_size)
        return co_err_set(CO_ERANGE, "%s: path too long", workdir);
    return corpus_build(CORPUS_DEFAULT_DIR, workdir, "common-licenses", info);
}
