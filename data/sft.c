/* sft.c - chat conversations tokenized with masks, packed, shuffled per epoch (sft.h). */
#include "data/sft.h"

#include "common/error.h"
#include "data/gpt_dataset.h"
#include "data/nprng.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sft_dataset {
    int32_t L;
    int32_t *tok;        /* all kept conversations' tokens */
    uint8_t *mask;       /* per token: counts in the loss as a label */
    int64_t *conv_off;   /* nconv+1 offsets into tok */
    int64_t nconv;
    int64_t *seq_conv;   /* nseq+1: first conversation of each packed sequence */
    int64_t nseq;
    int64_t *order;      /* num_samples entries */
    int64_t num_samples;
    sft_info info;
};

typedef struct {
    int32_t *tok;
    uint8_t *mask;
    size_t n, cap;
} stream;

static int push(stream *s, const int32_t *ids, size_t n, int m) {
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + n) cap *= 2;
        int32_t *nt = realloc(s->tok, cap * sizeof *nt);
        if (!nt) return CO_ENOMEM;
        s->tok = nt;
        uint8_t *nm = realloc(s->mask, cap);
        if (!nm) return CO_ENOMEM;
        s->mask = nm;
        s->cap = cap;
    }
    memcpy(s->tok + s->n, ids, n * sizeof *ids);
    memset(s->mask + s->n, m, n);
    s->n += n;
    return 0;
}

static int push_text(stream *s, tok_session *ts, const char *text, size_t len, int m, int32_t **buf, size_t *cap) {
    if (*cap < len + 16) {
        int32_t *nb = realloc(*buf, (len + 16) * sizeof *nb);
        if (!nb) return CO_ENOMEM;
        *buf = nb;
        *cap = len + 16;
    }
    int64_t k = tok_session_encode(ts, text, len, *buf, *cap);
    if (k < 0) return (int)k;
    if ((size_t)k > *cap) return co_err_set(CO_EINVAL, "SFT: more tokens than bytes"); /* cannot happen */
    return push(s, *buf, (size_t)k, m);
}

void sft_destroy(sft_dataset **pd) {
    sft_dataset *d = *pd;
    if (!d) return;
    free(d->tok);
    free(d->mask);
    free(d->conv_off);
    free(d->seq_conv);
    free(d->order);
    free(d);
    *pd = NULL;
}

int sft_build(sft_dataset **out, const char *path, const tok_tokenizer *tok, const char *split, int split_index,
              int32_t seq_length, uint32_t seed, int64_t num_samples) {
    *out = NULL;
    if (seq_length < 1) return co_err_set(CO_EINVAL, "SFT: sequence length must be positive");
    FILE *f = fopen(path, "rb");
    if (!f) return co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "%s: cannot open: %s", path, strerror(errno));
    json_object_seed(0);
    sft_dataset *d = calloc(1, sizeof *d);
    tok_session *ts = NULL;
    stream all = {0};
    int64_t *offs = NULL;
    size_t noffs = 0, capoffs = 0;
    int32_t *buf = NULL;
    size_t bufcap = 0;
    char *line = NULL;
    size_t linecap = 0;
    int rc = d ? tok_session_new(&ts, tok) : CO_ENOMEM;
    /* pass 1: every line, tokenized (the split is applied over lines afterwards) */
    int64_t lineno = 0;
    ssize_t ll;
    while (!rc && (ll = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        while (ll > 0 && (line[ll - 1] == '\n' || line[ll - 1] == '\r')) ll--;
        json_error_t jerr;
        json_t *root = json_loadb(line, (size_t)ll, JSON_ALLOW_NUL, &jerr);
        json_t *msgs = root ? json_object_get(root, "messages") : NULL;
        if (!root) rc = co_err_set(CO_EFORMAT, "%s:%lld: malformed JSON: %s", path, (long long)lineno, jerr.text);
        else if (!json_is_array(msgs))
            rc = co_err_set(CO_EFORMAT, "%s:%lld: no \"messages\" list", path, (long long)lineno);
        size_t start = all.n, i;
        json_t *m;
        int last_assistant = 0;
        if (!rc) json_array_foreach(msgs, i, m) {
            json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
            const char *r = json_string_value(role);
            if (!r || !json_is_string(content) ||
                (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))) {
                rc = co_err_set(CO_EFORMAT,
                                "%s:%lld: message %zu needs \"role\" (system, user or assistant) and a string \"content\"",
                                path, (long long)lineno, i);
                break;
            }
            char head[32];
            int hl = snprintf(head, sizeof head, "<|%s|>\n", r);
            last_assistant = !strcmp(r, "assistant");
            rc = push_text(&all, ts, head, (size_t)hl, 0, &buf, &bufcap);
            if (!rc) rc = push_text(&all, ts, json_string_value(content), json_string_length(content), last_assistant,
                                    &buf, &bufcap);
            if (!rc) rc = push_text(&all, ts, "\n", 1, 0, &buf, &bufcap);
            if (rc) break;
        }
        json_decref(root);
        if (!rc) {
            int32_t eod = tok->eod;
            rc = push(&all, &eod, 1, last_assistant);
        }
        if (!rc && noffs + 2 > capoffs) {
            capoffs = capoffs ? capoffs * 2 : 1024;
            int64_t *no = realloc(offs, capoffs * sizeof *no);
            if (!no) rc = CO_ENOMEM;
            else offs = no;
        }
        if (!rc) {
            if (!noffs) offs[noffs++] = (int64_t)start;
            offs[noffs++] = (int64_t)all.n;
        }
    }
    if (!rc && ferror(f)) rc = co_err_set(CO_EIO, "%s: read error", path);
    fclose(f);
    free(line);
    free(buf);
    tok_session_free(&ts);
    int64_t nlines = noffs ? (int64_t)noffs - 1 : 0;
    int64_t beg = 0, end = 0;
    if (!rc) {
        int z = gds_split_range(split ? split : "1,0,0", split_index, nlines, &beg, &end);
        if (z < 0) rc = z;
        else if (z == 1) { /* zero-width split: no dataset */
            free(all.tok);
            free(all.mask);
            free(offs);
            sft_destroy(&d);
            return 0;
        } else if (beg == end)
            rc = co_err_set(CO_EINVAL, "%s: split %d holds no conversations", path, split_index);
    }
    if (rc) goto fail;
    /* keep the split's conversations, truncated to L+1 tokens, dropping those under 2 */
    d->L = seq_length;
    d->tok = malloc((size_t)(offs[end] - offs[beg] + 1) * sizeof *d->tok);
    d->mask = malloc((size_t)(offs[end] - offs[beg] + 1));
    d->conv_off = malloc((size_t)(end - beg + 1) * sizeof *d->conv_off);
    if (!d->tok || !d->mask || !d->conv_off) {
        rc = co_err_set(CO_ENOMEM, "SFT: out of memory");
        goto fail;
    }
    int64_t w = 0;
    d->conv_off[0] = 0;
    for (int64_t c = beg; c < end; c++) {
        int64_t n = offs[c + 1] - offs[c];
        if (n < 2) {
            d->info.dropped++;
            continue;
        }
        if (n > (int64_t)seq_length + 1) {
            n = (int64_t)seq_length + 1;
            d->info.truncated++;
        }
        memcpy(d->tok + w, all.tok + offs[c], (size_t)n * sizeof *d->tok);
        memcpy(d->mask + w, all.mask + offs[c], (size_t)n);
        for (int64_t k = 1; k < n; k++) d->info.loss_tokens += d->mask[w + k];
        w += n;
        d->conv_off[++d->nconv] = w;
    }
    d->info.conversations = end - beg;
    d->info.tokens = w;
    free(all.tok);
    free(all.mask);
    all.tok = NULL;
    all.mask = NULL;
    free(offs);
    offs = NULL;
    if (!d->nconv) {
        rc = co_err_set(CO_EINVAL, "%s: no conversation of at least 2 tokens in the split", path);
        goto fail;
    }
    /* next-fit packing */
    d->seq_conv = malloc((size_t)(d->nconv + 1) * sizeof *d->seq_conv);
    if (!d->seq_conv) {
        rc = CO_ENOMEM;
        goto fail;
    }
    int64_t used = 0;
    for (int64_t c = 0; c < d->nconv; c++) {
        int64_t pos = d->conv_off[c + 1] - d->conv_off[c] - 1;
        if (c == 0 || used + pos > seq_length) {
            d->seq_conv[d->nseq++] = c;
            used = 0;
        }
        used += pos;
    }
    d->seq_conv[d->nseq] = d->nconv;
    d->info.sequences = d->nseq;
    /* order */
    int64_t epochs = num_samples > 0 ? (num_samples + d->nseq - 1) / d->nseq : 1;
    d->num_samples = epochs * d->nseq;
    d->order = malloc((size_t)d->num_samples * sizeof *d->order);
    if (!d->order) {
        rc = co_err_set(CO_ENOMEM, "SFT: out of memory");
        goto fail;
    }
    np_mt19937 mt;
    np_mt_seed(&mt, seed);
    for (int64_t e = 0; e < epochs; e++) {
        int64_t *o = d->order + e * d->nseq;
        for (int64_t i = 0; i < d->nseq; i++) o[i] = i;
        np_mt_shuffle_i64(&mt, o, (size_t)d->nseq);
    }
    *out = d;
    return 0;
fail:
    free(all.tok);
    free(all.mask);
    free(offs);
    sft_destroy(&d);
    return rc;
}

int64_t sft_num_samples(const sft_dataset *d) { return d->num_samples; }
void sft_get_info(const sft_dataset *d, sft_info *info) { *info = d->info; }
int64_t sft_sequence_of(const sft_dataset *d, int64_t i) { return i >= 0 && i < d->num_samples ? d->order[i] : -1; }

int sft_get(const sft_dataset *d, int64_t i, int32_t *tokens, int32_t *labels, float *loss_mask,
            int32_t *position_ids, int32_t *seg) {
    if (i < 0 || i >= d->num_samples)
        return co_err_set(CO_ERANGE, "SFT sample %lld out of range (%lld)", (long long)i, (long long)d->num_samples);
    int64_t s = d->order[i], p = 0;
    for (int64_t c = d->seq_conv[s]; c < d->seq_conv[s + 1]; c++) {
        int64_t o = d->conv_off[c], n = d->conv_off[c + 1] - o, start = p;
        for (int64_t k = 0; k + 1 < n; k++, p++) {
            tokens[p] = d->tok[o + k];
            labels[p] = d->tok[o + k + 1];
            if (loss_mask) loss_mask[p] = d->mask[o + k + 1] ? 1.0f : 0.0f;
            if (position_ids) position_ids[p] = (int32_t)k;
            if (seg) seg[p] = (int32_t)start;
        }
    }
    for (int64_t start = p; p < d->L; p++) {
        tokens[p] = labels[p] = 0;
        if (loss_mask) loss_mask[p] = 0;
        if (position_ids) position_ids[p] = (int32_t)(p - start);
        if (seg) seg[p] = (int32_t)start;
    }
    return 0;
}
