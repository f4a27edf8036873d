/* loader.c - single, blended, per-split and SFT datasets behind dl_* (see loader.h). */
#include "data/loader.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "data/md5.h"
#include "data/npy.h"
#include "data/sft.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *path;
    gds_dataset *gds;
    sft_dataset *sft;
} leaf;

struct dl_dataset {
    leaf *leaves;
    int n;
    double *weights;           /* normalised; NULL when not blended */
    int64_t size;              /* samples */
    int16_t *dataset_index;    /* blended only */
    int64_t *dataset_sample_index;
    int from_cache;
};

static int64_t leaf_samples(const leaf *l) { return l->gds ? gds_num_samples(l->gds) : sft_num_samples(l->sft); }

static double pairwise(const double *a, int n) {
    if (n < 8) {
        double res = 0.;
        for (int i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8], res;
        int i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

double dl_numpy_sum(const double *a, int n) {
    /* add.reduce starts from the first element and adds the pairwise sum of the rest */
    return n ? a[0] + pairwise(a + 1, n - 1) : 0.0;
}

void dl_blend_indices(const double *w, int n, int64_t size, int16_t *di, int64_t *dsi, int64_t *counts) {
    for (int i = 0; i < n; i++) counts[i] = 0;
    for (int64_t s = 0; s < size; s++) {
        double sd = s > 1 ? (double)s : 1.0;
        int best = 0;
        /* the product is rounded before the subtraction, as in helpers.cpp: a fused
         * multiply-add (which -march=native would allow) changes ties */
        volatile double prod = w[0] * sd;
        double err = prod - (double)counts[0];
        for (int i = 1; i < n; i++) {
            prod = w[i] * sd;
            double e = prod - (double)counts[i];
            if (e > err) {
                err = e;
                best = i;
            }
        }
        di[s] = (int16_t)best;
        dsi[s] = counts[best];
        counts[best]++;
    }
}

int dl_check_request(const char *what, int64_t asked, int64_t available) {
    if (asked <= available) return 0;
    return co_err_set(CO_EINVAL, "%s: the blend asks for %lld samples but the dataset has only %lld", what,
                      (long long)asked, (long long)available);
}

void dl_destroy(dl_dataset **pd) {
    dl_dataset *d = *pd;
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        gds_destroy(&d->leaves[i].gds);
        sft_destroy(&d->leaves[i].sft);
        free(d->leaves[i].path);
    }
    free(d->leaves);
    free(d->weights);
    free(d->dataset_index);
    free(d->dataset_sample_index);
    free(d);
    *pd = NULL;
}

static const char *split_name(int s) { return s == 0 ? "train" : s == 1 ? "valid" : "test"; }

static int build_leaf(leaf *l, const dl_config *cfg, const char *path, const char *split, int s, int64_t want) {
    if (cfg->sft) {
        if (!cfg->tok) return co_err_set(CO_EINVAL, "SFT data needs a tokenizer");
        /* the tokens come from this tokenizer: in range when its vocabulary fits the model's */
        if (cfg->base.vocab_size > 0 && (int64_t)tok_vocab_size(cfg->tok) > cfg->base.vocab_size)
            return co_err_set(CO_EINVAL, "%s: the SFT tokenizer has %lld entries, more than the model's vocabulary of %lld",
                              path ? path : "SFT data", (long long)tok_vocab_size(cfg->tok),
                              (long long)cfg->base.vocab_size);
        l->path = strdup(path ? path : "");
        return sft_build(&l->sft, path, cfg->tok, split, s, cfg->base.seq_length, cfg->base.seed, want);
    }
    gds_config g = cfg->base;
    g.split = split;
    g.prefix = path;
    l->path = strdup(path ? path : "mock");
    return gds_build(&l->gds, &g, s, want);
}

/* Blend cache: load or build+store the two indices. */
static int blend_cache(dl_dataset *d, const dl_config *cfg, int s) {
    const char *cdir = cfg->base.cache_dir;
    char dir[4096];
    if (!cdir || cfg->base.no_cache) return 1;
    if ((size_t)snprintf(dir, sizeof dir, "%s/BlendedDataset_indices", cdir) >= sizeof dir) return 1;
    /* description */
    size_t cap = 512;
    for (int i = 0; i < d->n; i++) cap += strlen(d->leaves[i].path) + 64;
    char *desc = malloc(cap), *p = desc, *end = desc + cap;
    if (!desc) return CO_ENOMEM;
    p += snprintf(p, (size_t)(end - p), "{\n    \"class\": \"BlendedDataset\",\n    \"datasets\": [");
    for (int i = 0; i < d->n; i++)
        p += snprintf(p, (size_t)(end - p), "%s\n        {\"path\": \"%s\", \"samples\": %lld}", i ? "," : "",
                      d->leaves[i].path, (long long)leaf_samples(&d->leaves[i]));
    p += snprintf(p, (size_t)(end - p), "\n    ],\n    \"split\": \"%s\",\n    \"weights\": [", split_name(s));
    for (int i = 0; i < d->n; i++) p += snprintf(p, (size_t)(end - p), "%s%.17g", i ? ", " : "", d->weights[i]);
    p += snprintf(p, (size_t)(end - p), "],\n    \"size\": %lld,\n    \"sft\": %s\n}", (long long)d->size,
                  cfg->sft ? "true" : "false");
    char hex[33];
    md5_hex(desc, strlen(desc), hex);
    char pfx[4200], path[4400];
    snprintf(pfx, sizeof pfx, "%s/%s-BlendedDataset-%s-", dir, hex, split_name(s));
    /* load */
    snprintf(path, sizeof path, "%sdescription.txt", pfx);
    FILE *f = fopen(path, "rb");
    int loaded = 0;
    if (f) {
        char *old = malloc(cap + 2);
        size_t n = old ? fread(old, 1, cap + 1, f) : 0;
        fclose(f);
        if (old && n == strlen(desc) && !memcmp(old, desc, n)) {
            int64_t sh1[2], sh2[2];
            void *a = NULL, *b = NULL;
            snprintf(path, sizeof path, "%sdataset_index.npy", pfx);
            int r1 = npy_read(path, "<i2", 1, sh1, &a);
            snprintf(path, sizeof path, "%sdataset_sample_index.npy", pfx);
            int r2 = r1 ? r1 : npy_read(path, "<i8", 1, sh2, &b);
            if (!r1 && !r2 && sh1[0] == d->size && sh2[0] == d->size) {
                int16_t *di = a;
                int64_t *dsi = b;
                int ok = 1;
                for (int64_t k = 0; ok && k < d->size; k++)
                    ok = di[k] >= 0 && di[k] < d->n && dsi[k] >= 0 && dsi[k] < leaf_samples(&d->leaves[di[k]]);
                if (ok) {
                    free(d->dataset_index);
                    free(d->dataset_sample_index);
                    d->dataset_index = di;
                    d->dataset_sample_index = dsi;
                    a = b = NULL;
                    loaded = 1;
                }
            }
            free(a);
            free(b);
        }
        free(old);
    }
    int rc = 0;
    if (!loaded) {
        rc = fs_mkdirs(dir);
        int64_t shape[2] = {d->size, 0};
        snprintf(path, sizeof path, "%sdataset_index.npy", pfx);
        if (!rc) rc = npy_write(path, "<i2", 1, shape, d->dataset_index);
        snprintf(path, sizeof path, "%sdataset_sample_index.npy", pfx);
        if (!rc) rc = npy_write(path, "<i8", 1, shape, d->dataset_sample_index);
        snprintf(path, sizeof path, "%sdescription.txt", pfx);
        const void *bufs[1] = {desc};
        size_t lens[1] = {strlen(desc)};
        if (!rc) rc = fs_write_atomic_unique(path, bufs, lens, 1);
    }
    free(desc);
    d->from_cache = loaded;
    return rc;
}

int dl_build(dl_dataset **out, const dl_config *cfg, int s, int64_t want) {
    *out = NULL;
    if (s < 0 || s > 2) return co_err_set(CO_EINVAL, "split index %d out of range", s);
    int per_split = cfg->n_split_path[0] || cfg->n_split_path[1] || cfg->n_split_path[2];
    char *const *list = per_split ? cfg->split_path[s] : cfg->data_path;
    int n = per_split ? cfg->n_split_path[s] : cfg->n_data_path;
    static const char *spoof[3] = {"1,0,0", "0,1,0", "0,0,1"};
    const char *split = per_split ? spoof[s] : cfg->base.split;
    if (per_split && n == 0) return 0;
    if (want <= 0) return 0;
    dl_dataset *d = calloc(1, sizeof *d);
    if (!d) return CO_ENOMEM;
    int rc = 0;
    const char *flag = per_split ? (s == 0 ? "--train-data-path" : s == 1 ? "--valid-data-path" : "--test-data-path")
                                 : "--data-path";
    /* a single prefix, weighted or not */
    int single = cfg->base.mock || n == 1;
    if (n == 2) {
        char *e;
        strtod(list[0], &e);
        single = e != list[0] && !*e;
    }
    if (!single && (n < 2 || n % 2)) {
        rc = co_err_set(CO_EINVAL, "%s: a blend is 'W1 PREFIX1 W2 PREFIX2 ...' (weights and prefixes alternate)", flag);
        goto fail;
    }
    if (single) {
        d->n = 1;
        d->leaves = calloc(1, sizeof *d->leaves);
        if (!d->leaves) {
            rc = CO_ENOMEM;
            goto fail;
        }
        rc = build_leaf(&d->leaves[0], cfg, cfg->base.mock ? NULL : list[n - 1], split, s, want);
        if (rc) goto fail;
        if (!d->leaves[0].gds && !d->leaves[0].sft) { /* zero-width split */
            dl_destroy(&d);
            return 0;
        }
        d->size = leaf_samples(&d->leaves[0]);
        *out = d;
        return 0;
    }
    d->n = n / 2;
    if (d->n > INT16_MAX) {
        rc = co_err_set(CO_EINVAL, "%s: too many datasets", flag);
        goto fail;
    }
    d->leaves = calloc((size_t)d->n, sizeof *d->leaves);
    d->weights = malloc((size_t)d->n * sizeof *d->weights);
    if (!d->leaves || !d->weights) {
        rc = CO_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < d->n; i++) {
        char *e;
        d->weights[i] = strtod(list[2 * i], &e);
        if (e == list[2 * i] || *e || !(d->weights[i] >= 0) || isinf(d->weights[i])) {
            rc = co_err_set(CO_EINVAL, "%s: weight '%s' of %s is not a non-negative number", flag, list[2 * i],
                            list[2 * i + 1]);
            goto fail;
        }
    }
    double sum = dl_numpy_sum(d->weights, d->n);
    if (!(sum > 0)) {
        rc = co_err_set(CO_EINVAL, "%s: the weights sum to zero", flag);
        goto fail;
    }
    for (int i = 0; i < d->n; i++) d->weights[i] /= sum;
    for (int i = 0; i < d->n; i++) {
        int64_t ask = (int64_t)ceil(ceil((double)want * d->weights[i]) * 1.005);
        rc = build_leaf(&d->leaves[i], cfg, list[2 * i + 1], split, s, ask);
        if (rc) goto fail;
        if (!d->leaves[i].gds && !d->leaves[i].sft) { /* zero-width split: no blend */
            dl_destroy(&d);
            return 0;
        }
    }
    d->size = want;
    d->dataset_index = malloc((size_t)want * sizeof *d->dataset_index);
    d->dataset_sample_index = malloc((size_t)want * sizeof *d->dataset_sample_index);
    int64_t *counts = calloc((size_t)d->n, sizeof *counts);
    if (!d->dataset_index || !d->dataset_sample_index || !counts) {
        free(counts);
        rc = CO_ENOMEM;
        goto fail;
    }
    dl_blend_indices(d->weights, d->n, want, d->dataset_index, d->dataset_sample_index, counts);
    for (int i = 0; !rc && i < d->n; i++) {
        int64_t have = leaf_samples(&d->leaves[i]);
        char what[512];
        snprintf(what, sizeof what, "%s (%s split, dataset %d: %s)", flag, split_name(s), i, d->leaves[i].path);
        rc = dl_check_request(what, counts[i], have);
    }
    free(counts);
    if (rc) goto fail;
    rc = blend_cache(d, cfg, s);
    if (rc == 1) rc = 0;
    if (rc) goto fail;
    *out = d;
    return 0;
fail:
    dl_destroy(&d);
    return rc;
}

int64_t dl_num_samples(const dl_dataset *d) { return d->size; }
int dl_num_datasets(const dl_dataset *d) { return d->n; }
const char *dl_dataset_path(const dl_dataset *d, int i) { return i >= 0 && i < d->n ? d->leaves[i].path : NULL; }
int dl_loaded_from_cache(const dl_dataset *d) { return d->from_cache; }

int dl_origin(const dl_dataset *d, int64_t i, int *dataset, int64_t *sample, int64_t *doc_pos, int64_t *offset) {
    if (i < 0 || i >= d->size)
        return co_err_set(CO_ERANGE, "sample %lld out of range (%lld)", (long long)i, (long long)d->size);
    int k = d->dataset_index ? d->dataset_index[i] : 0;
    int64_t j = d->dataset_index ? d->dataset_sample_index[i] : i;
    *dataset = k;
    *sample = j;
    *doc_pos = *offset = -1;
    if (d->leaves[k].gds) return gds_sample_index_pair(d->leaves[k].gds, j, doc_pos, offset);
    *doc_pos = sft_sequence_of(d->leaves[k].sft, j);
    return 0;
}

int dl_get(const dl_dataset *d, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask, int32_t *position_ids,
           int32_t *seg) {
    if (i < 0 || i >= d->size)
        return co_err_set(CO_ERANGE, "sample %lld out of range (%lld)", (long long)i, (long long)d->size);
    int k = d->dataset_index ? d->dataset_index[i] : 0;
    int64_t j = d->dataset_index ? d->dataset_sample_index[i] : i;
    const leaf *l = &d->leaves[k];
    if (l->gds) return gds_get(l->gds, j, tokens, labels, loss_mask, position_ids, seg);
    return sft_get(l->sft, j, tokens, labels, loss_mask, position_ids, seg);
}
