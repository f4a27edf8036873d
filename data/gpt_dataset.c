/* gpt_dataset.c - Megatron GPTDataset index building, cache and items. */
#include "data/gpt_dataset.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "data/indexed.h"
#include "data/md5.h"
#include "data/npy.h"
#include "data/nprng.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- sources ---- */

#define MOCK_SIZE 100000
#define MOCK_MAX_LEN 4096

struct gds_source {
    idx_reader *idx;     /* indexed source */
    int32_t *mock_lens;  /* mock source */
    int64_t mock_vocab;
    int32_t mock_eod;
    int64_t n;
    const int32_t *lens;
};

int gds_source_open_indexed(gds_source **out, const char *prefix) {
    *out = NULL;
    gds_source *s = calloc(1, sizeof *s);
    if (!s) return co_err_set(CO_ENOMEM, "%s: out of memory", prefix);
    int rc = idx_open(&s->idx, prefix);
    if (rc) {
        free(s);
        return rc;
    }
    s->n = idx_num_sequences(s->idx);
    s->lens = idx_sequence_lengths(s->idx);
    *out = s;
    return 0;
}

/* The mock source's document count: Megatron's 100,000, or (a test seam) the first N of its
 * documents when COHORT_TEST_MOCK_SEQUENCES=N. Tiny test jobs set it: the indices of 100,000
 * documents of up to 4096 tokens (6.4 million samples of 32 tokens) cost each rank a second
 * or more to build or verify, far more than their few training steps. */
static int mock_size(int64_t *n) {
    *n = MOCK_SIZE;
    const char *e = getenv("COHORT_TEST_MOCK_SEQUENCES");
    if (!e || !*e) return 0;
    char *end;
    long long v = strtoll(e, &end, 10);
    if (*end || v < 1 || v > MOCK_SIZE)
        return co_err_set(CO_EINVAL, "COHORT_TEST_MOCK_SEQUENCES=%s: want a document count from 1 to %d", e,
                          MOCK_SIZE);
    *n = v;
    return 0;
}

int gds_source_open_mock(gds_source **out, int64_t vocab_size, int32_t eod) {
    *out = NULL;
    if (vocab_size <= 0) return co_err_set(CO_EINVAL, "mock data: vocab_size must be positive");
    if (eod < 0 || eod >= vocab_size)
        return co_err_set(CO_EINVAL, "mock data: the EOD id %d is outside the vocabulary 0..%" PRId64, (int)eod,
                          vocab_size - 1);
    int64_t n;
    int rc = mock_size(&n);
    if (rc) return rc;
    gds_source *s = calloc(1, sizeof *s);
    int32_t *lens = malloc(MOCK_SIZE * sizeof *lens);
    if (!s || !lens) {
        free(s);
        free(lens);
        return co_err_set(CO_ENOMEM, "mock data: out of memory");
    }
    np_pcg64 g;
    np_pcg64_seed(&g, 0);
    np_pcg64_integers_i32(&g, 1, MOCK_MAX_LEN, MOCK_SIZE, lens);
    s->mock_lens = lens;
    s->mock_vocab = vocab_size;
    s->mock_eod = eod;
    s->n = n;
    s->lens = lens;
    *out = s;
    return 0;
}

int gds_source_check_vocab(const gds_source *s, int64_t vocab_size) {
    return s->idx ? idx_check_vocab(s->idx, vocab_size) : 0;
}

void gds_source_close(gds_source **sp) {
    if (!sp || !*sp) return;
    idx_close(&(*sp)->idx);
    free((*sp)->mock_lens);
    free(*sp);
    *sp = NULL;
}

int64_t gds_source_num_sequences(const gds_source *s) { return s->n; }
const int32_t *gds_source_lengths(const gds_source *s) { return s->lens; }

int gds_source_read(const gds_source *s, int64_t seq, int64_t offset, int64_t n, int32_t *out) {
    if (s->idx) return idx_read(s->idx, seq, offset, n, out);
    if (seq < 0 || seq >= s->n || offset < 0 || n < 0 || offset + n > s->lens[seq])
        return co_err_set(CO_ERANGE, "mock data: read of sequence %" PRId64 " out of range", seq);
    int64_t len = s->lens[seq];
    for (int64_t k = 0; k < n; k++) {
        int64_t p = offset + k;
        out[k] = p == len - 1 ? s->mock_eod : (int32_t)((p + 1) % s->mock_vocab);
    }
    return 0;
}

/* ---- split ---- */

int gds_parse_split(const char *split, double frac[3], double bookends[4]) {
    if (!split) split = "1,0,0";
    double v[3] = {0, 0, 0};
    int n = 0;
    const char *p = split;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        if (n == 3) return co_err_set(CO_EINVAL, "split \"%s\": more than 3 numbers", split);
        if (!isdigit((unsigned char)*p) && *p != '.')
            return co_err_set(CO_EINVAL, "split \"%s\": expected a non-negative number at \"%s\"", split, p);
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !isfinite(x) || x < 0)
            return co_err_set(CO_EINVAL, "split \"%s\": bad number at \"%s\"", split, p);
        v[n++] = x;
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == ',' || *p == '/') {
            p++;
            while (*p == ' ' || *p == '\t') p++;
            if (!*p) return co_err_set(CO_EINVAL, "split \"%s\": trailing separator", split);
        } else if (*p) {
            return co_err_set(CO_EINVAL, "split \"%s\": unexpected character '%c'", split, *p);
        }
    }
    if (n == 0) return co_err_set(CO_EINVAL, "split \"%s\": no numbers", split);
    double sum = 0;
    for (int i = 0; i < 3; i++) sum += v[i];
    if (!(sum > 0)) return co_err_set(CO_EINVAL, "split \"%s\": the numbers sum to zero", split);
    bookends[0] = 0;
    for (int i = 0; i < 3; i++) {
        frac[i] = v[i] / sum;
        bookends[i + 1] = bookends[i] + frac[i];
    }
    return 0;
}

int gds_split_range(const char *split, int s, int64_t n, int64_t *beg, int64_t *end) {
    double frac[3], be[4];
    if (s < 0 || s > 2) return co_err_set(CO_EINVAL, "split index %d out of range", s);
    int rc = gds_parse_split(split, frac, be);
    if (rc) return rc;
    *beg = *end = 0;
    if (be[s] == be[s + 1]) return 1;
    /* Python round(): ties to even, which rint does in the default rounding mode */
    *beg = (int64_t)rint(be[s] * (double)n);
    *end = (int64_t)rint(be[s + 1] * (double)n);
    return 0;
}

/* ---- dataset ---- */

static const char *SPLIT_NAMES[3] = {"train", "valid", "test"};

struct gds_dataset {
    gds_source *src;
    int own_src;
    int32_t L;
    int32_t eod;
    int eod_mask_loss, reset_position_ids, reset_attention_mask;
    int64_t num_epochs;
    int separate;
    int loaded;
    int32_t *doc_index;
    int64_t n_doc_index;
    int64_t *sample_index; /* (n_samples+1) x 2 */
    int64_t *shuffle;
    int64_t n_samples;
    char *cache_prefix;
};

void gds_destroy(gds_dataset **dp) {
    if (!dp || !*dp) return;
    gds_dataset *d = *dp;
    if (d->own_src) gds_source_close(&d->src);
    free(d->doc_index);
    free(d->sample_index);
    free(d->shuffle);
    free(d->cache_prefix);
    free(d);
    *dp = NULL;
}

int64_t gds_num_samples(const gds_dataset *ds) { return ds->n_samples; }
int64_t gds_num_epochs(const gds_dataset *ds) { return ds->num_epochs; }
int gds_separate_final_epoch(const gds_dataset *ds) { return ds->separate; }
int32_t gds_seq_length(const gds_dataset *ds) { return ds->L; }
int gds_loaded_from_cache(const gds_dataset *ds) { return ds->loaded; }
const char *gds_cache_prefix(const gds_dataset *ds) { return ds->cache_prefix; }

const int32_t *gds_document_index(const gds_dataset *ds, int64_t *n) {
    if (n) *n = ds->n_doc_index;
    return ds->doc_index;
}
const int64_t *gds_sample_index(const gds_dataset *ds, int64_t *rows) {
    if (rows) *rows = ds->n_samples + 1;
    return ds->sample_index;
}
const int64_t *gds_shuffle_index(const gds_dataset *ds, int64_t *n) {
    if (n) *n = ds->n_samples;
    return ds->shuffle;
}

int gds_sample_index_pair(const gds_dataset *ds, int64_t i, int64_t *doc_pos, int64_t *offset) {
    if (i < 0 || i >= ds->n_samples)
        return co_err_set(CO_ERANGE, "sample %" PRId64 " out of range (dataset has %" PRId64 ")", i,
                          ds->n_samples);
    int64_t j = ds->shuffle[i];
    *doc_pos = ds->sample_index[2 * j];
    *offset = ds->sample_index[2 * j + 1];
    return 0;
}

/* helpers.cpp build_sample_idx (drop_last_partial_sequence, add_extra_token_to_sequence). */
static int build_sample_index(const int32_t *sizes, const int32_t *doc_index, int64_t n_doc, int32_t L,
                              int64_t n_samples, int64_t *out) {
    int64_t di = 0, off = 0;
    out[0] = 0;
    out[1] = 0;
    for (int64_t s = 1; s <= n_samples; s++) {
        int64_t remaining = (int64_t)L + 1;
        while (remaining != 0) {
            if (di >= n_doc) return co_err_set(CO_EINTERNAL, "sample index walk ran past the document index");
            int64_t doc_len = (int64_t)sizes[doc_index[di]] - off;
            remaining -= doc_len;
            if (remaining <= 0) {
                off += remaining + doc_len - 1;
                remaining = 0;
            } else {
                di++;
                off = 0;
            }
        }
        out[2 * s] = di;
        out[2 * s + 1] = off;
    }
    return 0;
}

static void json_str(char **p, char *end, const char *s) {
    if (!s) {
        *p += snprintf(*p, (size_t)(end - *p), "null");
        return;
    }
    *p += snprintf(*p, (size_t)(end - *p), "\"");
    for (; *s && *p < end - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            *p += snprintf(*p, (size_t)(end - *p), "\\%c", c);
        else if (c < 0x20)
            *p += snprintf(*p, (size_t)(end - *p), "\\u%04x", c);
        else
            *p += snprintf(*p, (size_t)(end - *p), "%c", c);
    }
    *p += snprintf(*p, (size_t)(end - *p), "\"");
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

typedef struct {
    int64_t ndocs, E, T, S, sans;
    int separate;
    int64_t beg, end;
} plan;

/* Loads and validates cached indices into d; 0 on success, <0 when absent or invalid. */
static int load_cache(gds_dataset *d, const plan *pl, const char *desc, const char *pfx) {
    char path[4096];
    snprintf(path, sizeof path, "%sdescription.txt", pfx);
    char *text;
    size_t len;
    int rc = fs_read_all(path, &text, &len);
    if (rc) return rc;
    int same = strcmp(text, desc) == 0;
    free(text);
    if (!same) return co_err_set(CO_EFORMAT, "%s: description differs", path);

    int64_t shape[2];
    void *data = NULL;
    snprintf(path, sizeof path, "%sdocument_index.npy", pfx);
    rc = npy_read(path, "<i4", 1, shape, &data);
    if (rc) return rc;
    int32_t *doc = data;
    if (shape[0] != pl->E * pl->ndocs) {
        free(doc);
        return co_err_set(CO_EFORMAT, "%s: wrong length", path);
    }
    int32_t *counts = calloc((size_t)pl->ndocs + 1, sizeof *counts);
    if (!counts) {
        free(doc);
        return co_err_set(CO_ENOMEM, "out of memory");
    }
    int ok = 1;
    for (int64_t i = 0; i < shape[0] && ok; i++) {
        int64_t v = doc[i];
        if (v < pl->beg || v >= pl->end || ++counts[v - pl->beg] > pl->E) ok = 0;
    }
    free(counts);
    if (!ok) {
        free(doc);
        return co_err_set(CO_EFORMAT, "%s: not a tiling of the split's documents", path);
    }

    int64_t *sample = malloc((size_t)(pl->S + 1) * 2 * sizeof *sample);
    if (!sample) {
        free(doc);
        return co_err_set(CO_ENOMEM, "out of memory");
    }
    rc = build_sample_index(gds_source_lengths(d->src), doc, shape[0], d->L, pl->S, sample);
    if (rc) {
        free(doc);
        free(sample);
        return rc;
    }
    int wide = shape[0] > INT32_MAX;
    snprintf(path, sizeof path, "%ssample_index.npy", pfx);
    rc = npy_read(path, wide ? "<i8" : "<i4", 2, shape, &data);
    if (rc == 0) {
        if (shape[0] != pl->S + 1 || shape[1] != 2) {
            rc = co_err_set(CO_EFORMAT, "%s: wrong shape", path);
        } else {
            for (int64_t i = 0; i < 2 * (pl->S + 1); i++) {
                int64_t v = wide ? ((int64_t *)data)[i] : ((int32_t *)data)[i];
                if (v != sample[i]) {
                    rc = co_err_set(CO_EFORMAT, "%s: differs from the document index", path);
                    break;
                }
            }
        }
        free(data);
    }
    if (rc) {
        free(doc);
        free(sample);
        return rc;
    }

    int64_t *shuf = malloc((size_t)(pl->S ? pl->S : 1) * sizeof *shuf);
    uint8_t *seen = calloc((size_t)(pl->S ? pl->S : 1), 1);
    int big = pl->S >= (int64_t)UINT32_MAX - 1;
    snprintf(path, sizeof path, "%sshuffle_index.npy", pfx);
    rc = (!shuf || !seen) ? co_err_set(CO_ENOMEM, "out of memory")
                          : npy_read(path, big ? "<i8" : "<u4", 1, shape, &data);
    if (rc == 0) {
        if (shape[0] != pl->S) {
            rc = co_err_set(CO_EFORMAT, "%s: wrong length", path);
        } else {
            for (int64_t i = 0; i < pl->S; i++) {
                int64_t v = big ? ((int64_t *)data)[i] : (int64_t)((uint32_t *)data)[i];
                int64_t lo = i < pl->sans ? 0 : pl->sans, hi = i < pl->sans ? pl->sans : pl->S;
                if (v < lo || v >= hi || seen[v]) {
                    rc = co_err_set(CO_EFORMAT, "%s: not a permutation of its parts", path);
                    break;
                }
                seen[v] = 1;
                shuf[i] = v;
            }
        }
        free(data);
    }
    free(seen);
    if (rc) {
        free(doc);
        free(sample);
        free(shuf);
        return rc;
    }
    d->doc_index = doc;
    d->n_doc_index = pl->E * pl->ndocs;
    d->sample_index = sample;
    d->shuffle = shuf;
    return 0;
}

static int write_cache(const gds_dataset *d, const plan *pl, const char *desc, const char *pfx) {
    char path[4096];
    snprintf(path, sizeof path, "%sdescription.txt", pfx);
    const void *bufs[1] = {desc};
    size_t lens[1] = {strlen(desc)};
    int rc = fs_write_atomic_unique(path, bufs, lens, 1);
    if (rc) return rc;
    int64_t shape[2] = {d->n_doc_index, 0};
    snprintf(path, sizeof path, "%sdocument_index.npy", pfx);
    rc = npy_write(path, "<i4", 1, shape, d->doc_index);
    if (rc) return rc;

    size_t n2 = (size_t)(pl->S + 1) * 2;
    int wide = d->n_doc_index > INT32_MAX;
    void *tmp = malloc(n2 * (wide ? 8 : 4));
    if (!tmp) return co_err_set(CO_ENOMEM, "out of memory");
    if (wide)
        memcpy(tmp, d->sample_index, n2 * 8);
    else
        for (size_t i = 0; i < n2; i++) ((int32_t *)tmp)[i] = (int32_t)d->sample_index[i];
    shape[0] = pl->S + 1;
    shape[1] = 2;
    snprintf(path, sizeof path, "%ssample_index.npy", pfx);
    rc = npy_write(path, wide ? "<i8" : "<i4", 2, shape, tmp);
    free(tmp);
    if (rc) return rc;

    int big = pl->S >= (int64_t)UINT32_MAX - 1;
    tmp = malloc((size_t)(pl->S ? pl->S : 1) * (big ? 8 : 4));
    if (!tmp) return co_err_set(CO_ENOMEM, "out of memory");
    if (big)
        memcpy(tmp, d->shuffle, (size_t)pl->S * 8);
    else
        for (int64_t i = 0; i < pl->S; i++) ((uint32_t *)tmp)[i] = (uint32_t)d->shuffle[i];
    shape[0] = pl->S;
    shape[1] = 0;
    snprintf(path, sizeof path, "%sshuffle_index.npy", pfx);
    rc = npy_write(path, big ? "<i8" : "<u4", 1, shape, tmp);
    free(tmp);
    return rc;
}

static int build_indices(gds_dataset *d, const plan *pl, uint32_t seed) {
    np_mt19937 *mt = malloc(sizeof *mt);
    d->n_doc_index = pl->E * pl->ndocs;
    d->doc_index = malloc((size_t)(d->n_doc_index ? d->n_doc_index : 1) * sizeof *d->doc_index);
    d->sample_index = malloc((size_t)(pl->S + 1) * 2 * sizeof *d->sample_index);
    d->shuffle = malloc((size_t)(pl->S ? pl->S : 1) * sizeof *d->shuffle);
    if (!mt || !d->doc_index || !d->sample_index || !d->shuffle) {
        free(mt);
        return co_err_set(CO_ENOMEM, "GPTDataset: out of memory for the indices (%" PRId64 " samples)", pl->S);
    }
    np_mt_seed(mt, seed);
    for (int64_t e = 0; e < pl->E; e++)
        for (int64_t k = 0; k < pl->ndocs; k++) d->doc_index[e * pl->ndocs + k] = (int32_t)(pl->beg + k);
    if (!pl->separate) {
        np_mt_shuffle_i32(mt, d->doc_index, (size_t)d->n_doc_index);
    } else {
        size_t first = (size_t)((pl->E - 1) * pl->ndocs);
        np_mt_shuffle_i32(mt, d->doc_index, first);
        np_mt_shuffle_i32(mt, d->doc_index + first, (size_t)pl->ndocs);
    }
    int rc = build_sample_index(gds_source_lengths(d->src), d->doc_index, d->n_doc_index, d->L, pl->S,
                                d->sample_index);
    if (rc) {
        free(mt);
        return rc;
    }
    for (int64_t i = 0; i < pl->S; i++) d->shuffle[i] = i;
    np_mt_shuffle_i64(mt, d->shuffle, (size_t)pl->sans);
    if (pl->sans < pl->S) np_mt_shuffle_i64(mt, d->shuffle + pl->sans, (size_t)(pl->S - pl->sans));
    free(mt);
    return 0;
}

int gds_build_from_source(gds_dataset **out, const gds_config *cfg, gds_source *src, const char *dataset_path,
                          int split_index, int64_t num_samples) {
    *out = NULL;
    if (cfg->seq_length <= 0) return co_err_set(CO_EINVAL, "GPTDataset: seq_length must be positive");
    if (num_samples < 0) return co_err_set(CO_EINVAL, "GPTDataset: negative num_samples");
    plan pl = {0};
    int rc = gds_split_range(cfg->split, split_index, gds_source_num_sequences(src), &pl.beg, &pl.end);
    if (rc < 0) return rc;
    if (rc == 1) return 0; /* zero-width split: no dataset */
    const char *sname = SPLIT_NAMES[split_index];
    pl.ndocs = pl.end - pl.beg;
    if (pl.ndocs <= 0)
        return co_err_set(CO_EINVAL, "GPTDataset %s: split \"%s\" covers no documents of %s", sname,
                          cfg->split ? cfg->split : "1,0,0", dataset_path ? dataset_path : "mock data");
    const int32_t *lens = gds_source_lengths(src);
    for (int64_t k = pl.beg; k < pl.end; k++) pl.T += lens[k];
    if (pl.T <= 1)
        return co_err_set(CO_EINVAL, "GPTDataset %s: the split's documents hold %" PRId64 " tokens", sname, pl.T);
    int64_t L = cfg->seq_length;
    if (num_samples > (INT64_MAX - 1) / L) return co_err_set(CO_ERANGE, "GPTDataset: num_samples too large");
    int64_t need = num_samples * L + 1;
    pl.E = (need + pl.T - 1) / pl.T;
    if (pl.E < 1) pl.E = 1;
    if (pl.E > INT64_MAX / pl.T || pl.E * pl.ndocs > INT64_MAX / 2)
        return co_err_set(CO_ERANGE, "GPTDataset: too many epochs");
    pl.S = (pl.E * pl.T - 1) / L;
    pl.separate = 0;
    pl.sans = pl.S;
    if (pl.E > 1) {
        int64_t sans = ((pl.E - 1) * pl.T - 1) / L;
        int64_t from_final = num_samples - sans;
        int64_t per_epoch = (pl.T - 1) / L;
        if (from_final < (int64_t)(0.80 * (double)per_epoch)) {
            pl.separate = 1;
            pl.sans = sans;
        }
    }

    gds_dataset *d = calloc(1, sizeof *d);
    if (!d) return co_err_set(CO_ENOMEM, "out of memory");
    d->src = src;
    d->L = cfg->seq_length;
    d->eod = cfg->eod;
    d->eod_mask_loss = cfg->eod_mask_loss;
    d->reset_position_ids = cfg->reset_position_ids;
    d->reset_attention_mask = cfg->reset_attention_mask;
    d->num_epochs = pl.E;
    d->separate = pl.separate;
    d->n_samples = pl.S;

    /* description and cache location */
    const char *cdir = cfg->cache_dir;
    char dirbuf[4096];
    if (!cdir && !cfg->mock && dataset_path) {
        snprintf(dirbuf, sizeof dirbuf, "%s/cache/GPTDataset_indices", dataset_path);
        cdir = dirbuf;
    }
    char desc[8192];
    if (!cfg->no_cache && cdir) {
        int64_t total_tokens = 0;
        for (int64_t k = 0; k < gds_source_num_sequences(src); k++) total_tokens += lens[k];
        char *p = desc, *end = desc + sizeof desc;
        p += snprintf(p, (size_t)(end - p), "{\n    \"class\": \"GPTDataset\",\n    \"dataset_path\": ");
        json_str(&p, end, dataset_path);
        p += snprintf(p, (size_t)(end - p), ",\n    \"num_samples\": %" PRId64 ",\n    \"index_split\": \"%s\",\n",
                      num_samples, sname);
        p += snprintf(p, (size_t)(end - p), "    \"random_seed\": %" PRIu32 ",\n    \"sequence_length\": %d,\n",
                      cfg->seed, (int)cfg->seq_length);
        p += snprintf(p, (size_t)(end - p), "    \"split\": ");
        json_str(&p, end, cfg->split ? cfg->split : "1,0,0");
        p += snprintf(p, (size_t)(end - p),
                      ",\n    \"add_extra_token_to_sequence\": true,\n    \"mock\": %s,\n"
                      "    \"dataset_num_sequences\": %" PRId64 ",\n    \"dataset_num_tokens\": %" PRId64 "\n}",
                      cfg->mock ? "true" : "false", gds_source_num_sequences(src), total_tokens);
        char hex[33];
        md5_hex(desc, strlen(desc), hex);
        size_t need_len = strlen(cdir) + 64 + strlen(sname);
        d->cache_prefix = malloc(need_len);
        if (!d->cache_prefix) {
            gds_destroy(&d);
            return co_err_set(CO_ENOMEM, "out of memory");
        }
        snprintf(d->cache_prefix, need_len, "%s/%s-GPTDataset-%s-", cdir, hex, sname);
        char probe[4200];
        snprintf(probe, sizeof probe, "%sdescription.txt", d->cache_prefix);
        if (file_exists(probe)) {
            gds_dataset tmp = *d;
            if (load_cache(&tmp, &pl, desc, d->cache_prefix) == 0) {
                *d = tmp;
                d->loaded = 1;
            }
            co_err_clear();
        }
    }
    if (!d->loaded) {
        rc = build_indices(d, &pl, cfg->seed);
        if (rc == 0 && d->cache_prefix) {
            rc = fs_mkdirs(cdir);
            if (rc == 0) rc = write_cache(d, &pl, desc, d->cache_prefix);
        }
        if (rc) {
            gds_destroy(&d);
            return rc;
        }
    }
    *out = d;
    return 0;
}

int gds_build(gds_dataset **out, const gds_config *cfg, int split_index, int64_t num_samples) {
    *out = NULL;
    if (split_index < 0 || split_index > 2) return co_err_set(CO_EINVAL, "split index %d out of range", split_index);
    /* decide zero width before opening anything */
    double frac[3], be[4];
    int rc = gds_parse_split(cfg->split, frac, be);
    if (rc) return rc;
    if (be[split_index] == be[split_index + 1]) return 0;
    gds_source *src;
    if (cfg->mock)
        rc = gds_source_open_mock(&src, cfg->vocab_size, cfg->eod);
    else if (!cfg->data_prefix)
        rc = co_err_set(CO_EINVAL, "GPTDataset: no data prefix and not mock");
    else if (!(rc = gds_source_open_indexed(&src, cfg->data_prefix)) && (rc = gds_source_check_vocab(src, cfg->vocab_size)))
        gds_source_close(&src);
    if (rc) return rc;
    rc = gds_build_from_source(out, cfg, src, cfg->mock ? NULL : cfg->data_prefix, split_index, num_samples);
    if (rc || !*out) {
        gds_source_close(&src);
        return rc;
    }
    (*out)->own_src = 1;
    return 0;
}

int gds_get(const gds_dataset *ds, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask,
            int32_t *position_ids, int32_t *seg) {
    if (i < 0 || i >= ds->n_samples)
        return co_err_set(CO_ERANGE, "sample %" PRId64 " out of range (dataset has %" PRId64 ")", i,
                          ds->n_samples);
    const int64_t L = ds->L, need = L + 1;
    int32_t *text = malloc((size_t)need * sizeof *text);
    if (!text) return co_err_set(CO_ENOMEM, "out of memory");
    int64_t j = ds->shuffle[i];
    int64_t bp = ds->sample_index[2 * j], bo = ds->sample_index[2 * j + 1];
    int64_t ep = ds->sample_index[2 * j + 2], eo = ds->sample_index[2 * j + 3];
    const int32_t *lens = gds_source_lengths(ds->src);
    int64_t have = 0;
    int rc = 0;
    for (int64_t p = bp; p <= ep && rc == 0; p++) {
        int32_t doc = ds->doc_index[p];
        int64_t off = p == bp ? bo : 0;
        int64_t len = p < ep ? (int64_t)lens[doc] - off : eo + 1 - off;
        if (len < 0 || have + len > need) {
            rc = co_err_set(CO_EINTERNAL, "sample %" PRId64 ": inconsistent sample index", i);
            break;
        }
        rc = gds_source_read(ds->src, doc, off, len, text + have);
        have += len;
    }
    if (rc) {
        free(text);
        return rc;
    }
    for (; have < need; have++) text[have] = -1; /* Megatron's _PAD_TOKEN_ID */
    int64_t start = 0;
    for (int64_t p = 0; p < L; p++) {
        int32_t t = text[p], lab = text[p + 1];
        tokens[p] = t == -1 ? 0 : t;
        labels[p] = lab == -1 ? 0 : lab;
        if (loss_mask) loss_mask[p] = (lab == -1 || (ds->eod_mask_loss && t == ds->eod)) ? 0.0f : 1.0f;
        if (position_ids) position_ids[p] = (int32_t)(ds->reset_position_ids ? p - start : p);
        if (seg) seg[p] = (int32_t)(ds->reset_attention_mask ? start : 0);
        if (t == ds->eod) start = p + 1;
    }
    free(text);
    return 0;
}
