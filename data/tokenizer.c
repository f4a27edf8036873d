/* tokenizer.c - byte-level, Megatron NullTokenizer and GPT-2 BPE behind one interface. */
#include "data/tokenizer.h"

#include "common/error.h"
#include "data/bpe.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tok_byte_init(tok_tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->kind = TOK_BYTE;
    t->vocab_size = TOK_BYTE_VOCAB;
    t->eod = TOK_BYTE_EOD;
}

int tok_null_init(tok_tokenizer *t, int64_t v) {
    if (v < 1 || v >= INT32_MAX) return co_err_set(CO_EINVAL, "NullTokenizer: bad vocab size %" PRId64, v);
    memset(t, 0, sizeof *t);
    t->kind = TOK_NULL;
    t->vocab_size = v + 1;
    t->eod = (int32_t)v;
    return 0;
}

int tok_open(tok_tokenizer *t, const char *type, int64_t vocab_size_arg, const char *vocab_file,
             const char *merge_file) {
    memset(t, 0, sizeof *t);
    if (!strcmp(type, "ByteLevelTokenizer")) {
        tok_byte_init(t);
        return 0;
    }
    if (!strcmp(type, "NullTokenizer")) return tok_null_init(t, vocab_size_arg);
    if (strcmp(type, "GPT2BPETokenizer"))
        return co_err_set(CO_EINVAL, "unsupported tokenizer type %s (GPT2BPETokenizer, NullTokenizer, ByteLevelTokenizer)",
                          type);
    char vbuf[4096], mbuf[4096];
    if (!vocab_file || !*vocab_file || !merge_file || !*merge_file) {
        int rc = bpe_default_files(vbuf, sizeof vbuf, mbuf, sizeof mbuf);
        if (rc) return rc;
        if (!vocab_file || !*vocab_file) vocab_file = vbuf;
        if (!merge_file || !*merge_file) merge_file = mbuf;
    }
    int rc = bpe_load(&t->bpe, vocab_file, merge_file);
    if (rc) return rc;
    int32_t eod = bpe_token_id(t->bpe, "<|endoftext|>", 13);
    if (eod < 0) {
        bpe_free(&t->bpe);
        return co_err_set(CO_EFORMAT, "%s: no <|endoftext|> token", vocab_file);
    }
    t->kind = TOK_GPT2;
    t->vocab_size = bpe_vocab_size(t->bpe);
    t->eod = eod;
    return 0;
}

void tok_close(tok_tokenizer *t) {
    if (t->bpe) bpe_free(&t->bpe);
}

struct tok_session {
    const tok_tokenizer *t;
    bpe_encoder *enc;
};

int tok_session_new(tok_session **out, const tok_tokenizer *t) {
    *out = NULL;
    tok_session *s = calloc(1, sizeof *s);
    if (!s) return co_err_set(CO_ENOMEM, "tokenizer session: out of memory");
    s->t = t;
    if (t->kind == TOK_GPT2) {
        int rc = bpe_encoder_new(&s->enc, t->bpe);
        if (rc) {
            free(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

void tok_session_free(tok_session **ps) {
    tok_session *s = *ps;
    if (!s) return;
    bpe_encoder_free(&s->enc);
    free(s);
    *ps = NULL;
}

int64_t tok_session_encode(tok_session *s, const char *text, size_t len, int32_t *out, size_t cap) {
    if (s->enc) return bpe_encode(s->enc, text, len, out, cap);
    return tok_encode(s->t, text, len, out, cap);
}

int64_t tok_encode(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap) {
    if (t->kind == TOK_GPT2) return bpe_encode_once(t->bpe, text, len, out, cap);
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
    if (t->kind == TOK_GPT2) return bpe_decode(t->bpe, ids, n, out, cap);
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
