/* tokenizer.c - byte-level and Megatron NullTokenizer. */
#include "data/tokenizer.h"

#include "common/error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tok_byte_init(tok_tokenizer *t) {
    t->kind = TOK_BYTE;
    t->vocab_size = TOK_BYTE_VOCAB;
    t->eod = TOK_BYTE_EOD;
}

int tok_null_init(tok_tokenizer *t, int64_t v) {
    if (v < 1 || v >= INT32_MAX) return co_err_set(CO_EINVAL, "NullTokenizer: bad vocab size %" PRId64, v);
    t->kind = TOK_NULL;
    t->vocab_size = v + 1;
    t->eod = (int32_t)v;
    return 0;
}

int64_t tok_encode(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap) {
    if (t->kind == TOK_BYTE) {
        for (size_t i = 0; i < len && i < cap; i++) out[i] = (unsigned char)text[i];
        return (int64_t)len;
    }
    int64_t n = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t')) i++;
        if (i >= len) break;
        int64_t v = 0;
        size_t s = i;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            v = v * 10 + (text[i] - '0');
            if (v >= t->vocab_size) break;
            i++;
        }
        if (i == s || v >= t->vocab_size || (i < len && text[i] != ' ' && text[i] != '\n' && text[i] != '\t'))
            return co_err_set(CO_EINVAL, "NullTokenizer: \"%.*s\" is not an id below %" PRId64,
                              (int)((len - s) < 32 ? (len - s) : 32), text + s, t->vocab_size);
        if ((size_t)n < cap) out[n] = (int32_t)v;
        n++;
    }
    return n;
}

int64_t tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return co_err_set(CO_EINVAL, "decode: id %d out of range (vocab %" PRId64 ")", (int)ids[i],
                              t->vocab_size);
        if (t->kind == TOK_BYTE) {
            if (ids[i] == t->eod) continue;
            if (w + 1 < cap) out[w] = (char)ids[i];
            w++;
        } else {
            char num[16];
            int k = snprintf(num, sizeof num, "%s%d", i ? " " : "", (int)ids[i]);
            for (int j = 0; j < k; j++, w++)
                if (w + 1 < cap) out[w] = num[j];
        }
    }
    if (cap > 0) out[w < cap ? w : cap - 1] = '\0';
    return (int64_t)w;
}

int tok_byte_encode(const char *text, size_t len, int32_t *out, int cap) {
    int n = 0;
    for (size_t i = 0; i < len && n < cap; i++) out[n++] = (unsigned char)text[i];
    return n;
}

size_t tok_byte_decode(const int32_t *ids, int n, char *out, size_t cap) {
    size_t w = 0;
    for (int i = 0; i < n && w < cap; i++)
        if (ids[i] >= 0 && ids[i] < 256) out[w++] = (char)ids[i];
    return w;
}
