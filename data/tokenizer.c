/* tokenizer.c - byte-level, Megatron NullTokenizer, GPT-2 BPE, the SentencePiece wrappers and
 * TikTokenizer behind one interface. */
#include "data/tokenizer.h"

#include "common/config.h"
#include "common/error.h"
#include "common/log.h"
#include "data/bpe.h"
#include "data/spm.h"
#include "data/tiktoken.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tok_byte_init(tok_tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->bos = -1;
    t->kind = TOK_BYTE;
    t->vocab_size = TOK_BYTE_VOCAB;
    t->eod = TOK_BYTE_EOD;
}

int tok_null_init(tok_tokenizer *t, int64_t v) {
    if (v < 1 || v >= INT32_MAX) return co_err_set(CO_EINVAL, "NullTokenizer: bad vocab size %" PRId64, v);
    memset(t, 0, sizeof *t);
    t->bos = -1;
    t->kind = TOK_NULL;
    t->vocab_size = v + 1;
    t->eod = (int32_t)v;
    return 0;
}

static int open_gpt2(tok_tokenizer *t, const char *vocab_file, const char *merge_file) {
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

/* Megatron's _SentencePieceTokenizer._initalize (vocab_extra_ids 0): a special token that is
 * a piece keeps the piece's id, any other takes the next id; listed once, in first-added
 * order (the order its encode prefers among matches at the same place). Returns the id. */
static int spm_add_special(tok_tokenizer *t, const char *text) {
    for (int i = 0; i < t->n_special; i++)
        if (!strcmp(t->special_text[i], text)) return t->special_id[i];
    int32_t id = spm_piece_id(t->spm, text, strlen(text));
    if (id < 0) id = (int32_t)t->vocab_size++;
    if (!(t->special_text[t->n_special] = strdup(text))) return co_err_set(CO_ENOMEM, "tokenizer: out of memory");
    t->special_id[t->n_special++] = id;
    return id;
}

/* The piece of a model's special id, or fallback where the model has none (id -1). */
static const char *spm_special_piece(const tok_tokenizer *t, int32_t id, const char *fallback, char *buf, size_t n) {
    return id >= 0 && spm_id_to_piece(t->spm, id, buf, n) >= 0 ? buf : fallback;
}

static int open_spm(tok_tokenizer *t, const char *type, const char *model) {
    int kind = !strcmp(type, "SentencePieceTokenizer")      ? TOK_SPM_PLAIN
               : !strcmp(type, "GPTSentencePieceTokenizer") ? TOK_SPM_GPT
                                                            : TOK_SPM_LLAMA2;
    if (!model || !*model) return co_err_set(CO_EINVAL, "--tokenizer-type %s needs --tokenizer-model FILE.model", type);
    int rc = spm_load(&t->spm, model);
    if (rc) return rc;
    t->kind = TOK_SPM;
    t->spm_kind = kind;
    t->vocab_size = spm_piece_count(t->spm);
    t->bos = spm_bos_id(t->spm);
    if (kind != TOK_SPM_PLAIN) {
        t->eod = spm_eos_id(t->spm);
        t->add_bos = kind == TOK_SPM_LLAMA2;
        if (t->eod < 0 || (t->add_bos && t->bos < 0))
            return co_err_set(CO_EINVAL,
                              "--tokenizer-model %s: %s needs a model with an eos%s piece (spm_train --eos_id)", model,
                              type, t->add_bos ? " and a bos" : "");
        return 0;
    }
    char buf[256];
    static const char *const fixed[] = {"<CLS>", "<SEP>", "<EOD>", "<MASK>"};
    for (int i = 0; i < 4; i++)
        if ((rc = spm_add_special(t, fixed[i])) < 0) return rc;
    t->eod = t->special_id[2];
    if ((rc = spm_add_special(t, spm_special_piece(t, spm_pad_id(t->spm), "<PAD>", buf, sizeof buf))) < 0) return rc;
    if ((rc = spm_add_special(t, spm_special_piece(t, t->bos, "<BOS>", buf, sizeof buf))) < 0) return rc;
    t->bos = rc;
    if ((rc = spm_add_special(t, spm_special_piece(t, spm_eos_id(t->spm), "<EOS>", buf, sizeof buf))) < 0) return rc;
    return 0;
}

static int open_tiktoken(tok_tokenizer *t, const tok_options *o) {
    const char *pat = o->tiktoken_pattern;
    if (!o->tokenizer_model || !*o->tokenizer_model)
        return co_err_set(CO_EINVAL, "--tokenizer-type TikTokenizer needs --tokenizer-model (a tiktoken ranks file)");
    if (!pat || (strcmp(pat, "v1") && strcmp(pat, "v2")))
        return co_err_set(CO_EINVAL, "--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2");
    tt_options to = {
        .path = o->tokenizer_model,
        .pattern = !strcmp(pat, "v1") ? TT_PATTERN_V1 : TT_PATTERN_V2,
        .vocab_size = o->vocab_size,
        .num_special = o->tiktoken_num_special_tokens < 0 ? 1000 : o->tiktoken_num_special_tokens,
        .special = o->n_tiktoken_special_tokens > 0 ? o->tiktoken_special_tokens : NULL,
        .n_special = o->n_tiktoken_special_tokens,
    };
    int rc = tt_load(&t->tt, &to);
    if (rc) return rc;
    t->kind = TOK_TIKTOKEN;
    t->vocab_size = tt_vocab_size(t->tt);
    t->eod = tt_eos(t->tt);
    t->bos = tt_bos(t->tt);
    return 0;
}

int tok_open_options(tok_tokenizer *t, const tok_options *o) {
    memset(t, 0, sizeof *t);
    t->bos = -1;
    const char *type = o->type ? o->type : "GPT2BPETokenizer";
    int rc;
    if (!strcmp(type, "ByteLevelTokenizer")) {
        tok_byte_init(t);
        return 0;
    }
    if (!strcmp(type, "NullTokenizer")) return tok_null_init(t, o->vocab_size);
    if (!strcmp(type, "GPT2BPETokenizer")) rc = open_gpt2(t, o->vocab_file, o->merge_file);
    else if (!strcmp(type, "SentencePieceTokenizer") || !strcmp(type, "GPTSentencePieceTokenizer") ||
             !strcmp(type, "Llama2Tokenizer"))
        rc = open_spm(t, type, o->tokenizer_model);
    else if (!strcmp(type, "TikTokenizer")) rc = open_tiktoken(t, o);
    else
        return co_err_set(CO_EINVAL,
                          "unsupported tokenizer type %s (GPT2BPETokenizer, NullTokenizer, ByteLevelTokenizer, "
                          "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer)",
                          type);
    if (rc < 0) {
        tok_close(t);
        return rc;
    }
    if (t->vocab_size > INT32_MAX) {
        tok_close(t);
        return co_err_set(CO_EINVAL, "%s: vocabulary of %" PRId64 " entries is too large", type, t->vocab_size);
    }
    co_log(CO_LOG_DEBUG, "tokenizer %s: vocabulary %" PRId64 ", eod %d, bos %d", type, t->vocab_size, (int)t->eod,
           (int)t->bos);
    return 0;
}

int tok_open(tok_tokenizer *t, const char *type, int64_t vocab_size_arg, const char *vocab_file,
             const char *merge_file) {
    tok_options o = {.type = type, .vocab_size = vocab_size_arg, .vocab_file = vocab_file, .merge_file = merge_file,
                     .tiktoken_num_special_tokens = -1};
    return tok_open_options(t, &o);
}

int tok_open_config(tok_tokenizer *t, const co_config *c) {
    tok_options o = {
        .type = c->tokenizer_type,
        .vocab_size = c->vocab_size,
        .vocab_file = c->vocab_file,
        .merge_file = c->merge_file,
        .tokenizer_model = c->tokenizer_model,
        .tiktoken_pattern = c->tiktoken_pattern[0] ? c->tiktoken_pattern : NULL,
        .tiktoken_num_special_tokens = c->tiktoken_num_special_tokens,
        .tiktoken_special_tokens = (const char *const *)c->tiktoken_special_tokens,
        .n_tiktoken_special_tokens = c->n_tiktoken_special_tokens,
    };
    return tok_open_options(t, &o);
}

void tok_close(tok_tokenizer *t) {
    if (t->bpe) bpe_free(&t->bpe);
    if (t->spm) spm_free(&t->spm);
    if (t->tt) tt_free(&t->tt);
    for (int i = 0; i < t->n_special; i++) free(t->special_text[i]);
    t->n_special = 0;
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

/* SentencePieceTokenizer's tokenize: the earliest special token's text (the first listed
 * among those at the same place) becomes its id, the text between goes through SentencePiece. */
static int64_t spm_plain_encode(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap) {
    size_t next[TOK_SPM_SPECIALS]; /* each special's next place at or after p (len: none) */
    for (int i = 0; i < t->n_special; i++) next[i] = 0;
    int64_t n = 0;
    size_t p = 0;
    for (bool first = true;; first = false) {
        int which = -1;
        for (int i = 0; i < t->n_special; i++) {
            size_t k = strlen(t->special_text[i]);
            if (first || (next[i] < p && next[i] != len)) {
                const char *hit = p < len ? memmem(text + p, len - p, t->special_text[i], k) : NULL;
                next[i] = hit ? (size_t)(hit - text) : len;
            }
            if (next[i] < len && (which < 0 || next[i] < next[which])) which = i;
        }
        size_t end = which < 0 ? len : next[which];
        int64_t r = spm_encode(t->spm, text + p, end - p, (size_t)n < cap ? out + n : NULL,
                               (size_t)n < cap ? cap - (size_t)n : 0);
        if (r < 0) return r;
        n += r;
        if (which < 0) return n;
        if ((size_t)n < cap) out[n] = t->special_id[which];
        n++;
        p = end + strlen(t->special_text[which]);
    }
}

static int64_t spm_encode_tok(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap) {
    if (t->spm_kind == TOK_SPM_PLAIN) return spm_plain_encode(t, text, len, out, cap);
    size_t b = t->add_bos ? 1 : 0;
    if (b && cap > 0) out[0] = t->bos;
    int64_t r = spm_encode(t->spm, text, len, cap > b ? out + b : NULL, cap > b ? cap - b : 0);
    return r < 0 ? r : r + (int64_t)b;
}

/* Decodes ids[0..n) of a SentencePiece tokenizer at out[*w..cap). */
static int spm_decode_at(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap, size_t *w) {
    int64_t r = spm_decode(t->spm, ids, n, *w < cap ? out + *w : NULL, *w < cap ? cap - *w : 0);
    if (r < 0) return (int)r;
    *w += (size_t)r;
    return 0;
}

static void put(char *out, size_t cap, size_t *w, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++, (*w)++)
        if (*w + 1 < cap) out[*w] = s[i];
}

/* Megatron's detokenize: SentencePiece's decode, and for SentencePieceTokenizer " TOKEN "
 * for each special id. */
static int64_t spm_decode_tok(const tok_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t w = 0, last = 0;
    int rc;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return co_err_set(CO_EINVAL, "decode: id %d out of range (vocab %" PRId64 ")", (int)ids[i], t->vocab_size);
        int sp = -1;
        for (int j = 0; t->spm_kind == TOK_SPM_PLAIN && j < t->n_special && sp < 0; j++)
            if (t->special_id[j] == ids[i]) sp = j;
        if (sp < 0) continue;
        if ((rc = spm_decode_at(t, ids + last, i - last, out, cap, &w))) return rc;
        put(out, cap, &w, " ", 1);
        put(out, cap, &w, t->special_text[sp], strlen(t->special_text[sp]));
        put(out, cap, &w, " ", 1);
        last = i + 1;
    }
    if ((rc = spm_decode_at(t, ids + last, n - last, out, cap, &w))) return rc;
    if (cap > 0) out[w < cap ? w : cap - 1] = '\0';
    return (int64_t)w;
}

int64_t tok_encode(const tok_tokenizer *t, const char *text, size_t len, int32_t *out, size_t cap) {
    if (t->kind == TOK_GPT2) return bpe_encode_once(t->bpe, text, len, out, cap);
    if (t->kind == TOK_SPM) return spm_encode_tok(t, text, len, out, cap);
    if (t->kind == TOK_TIKTOKEN) return tt_encode(t->tt, text, len, out, cap);
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
    if (t->kind == TOK_SPM) return spm_decode_tok(t, ids, n, out, cap);
    if (t->kind == TOK_TIKTOKEN) return tt_decode(t->tt, ids, n, out, cap);
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
