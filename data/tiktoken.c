/* tiktoken.c - Megatron's TikTokenizer: the ranks file (tiktoken's or Megatron's JSON), the
 * special tokens, the v1/v2 pre-tokenisers written by hand, tiktoken's byte-pair merge. */
#include "data/tiktoken.h"

#include "common/error.h"
#include "data/unicode.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

struct tt_model {
    int64_t vocab;       /* ids 0 .. vocab-1 */
    int num_special;
    int32_t bos, eos;
    int pattern;
    char *bytes;         /* every id's bytes, concatenated (special tokens: their text) */
    int64_t *off;        /* vocab+1 offsets */
    int32_t *table;      /* open addressing over the ranks' bytes: rank or -1 */
    size_t mask;
    int64_t nranks;      /* ranks kept: 0 .. nranks-1 */
};

/* ---------------------------------------------------------------- classes */

int tt_class(uint32_t cp) {
    if (cp < 128) {
        if ((cp >= 'a' && cp <= 'z')) return TT_LL;
        if ((cp >= 'A' && cp <= 'Z')) return TT_LU;
        if (cp >= '0' && cp <= '9') return TT_N;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return TT_S;
        return TT_OTHER;
    }
    int lo = 0, hi = tt_range_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < tt_ranges[mid].lo) hi = mid - 1;
        else if (cp > tt_ranges[mid].hi) lo = mid + 1;
        else return tt_ranges[mid].cls;
    }
    return TT_OTHER;
}

/* class sets the patterns use, as bits of (1 << class) */
#define B(c) (1u << (c))
#define SET_L (B(TT_LU) | B(TT_LL) | B(TT_LT) | B(TT_LM) | B(TT_LO))
#define SET_UPPER (B(TT_LU) | B(TT_LT) | B(TT_LM) | B(TT_LO) | B(TT_M)) /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] */
#define SET_LOWER (B(TT_LL) | B(TT_LM) | B(TT_LO) | B(TT_M))            /* [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
#define SET_OTHER (~(SET_L | B(TT_N) | B(TT_S)))                         /* [^\s\p{L}\p{N}] */

typedef struct {
    const unsigned char *s;
    size_t len;
} text;

/* The code point at p: its class bit in *bit, returns its byte length. */
static size_t at(text t, size_t p, uint32_t *cp, unsigned *bit) {
    size_t l = uni_decode(t.s + p, t.len - p, cp);
    *bit = B(tt_class(*cp));
    return l;
}

static bool is_prefix(uint32_t cp, unsigned bit) { /* [^\r\n\p{L}\p{N}] */
    return cp != '\r' && cp != '\n' && !(bit & (SET_L | B(TT_N)));
}

/* End of the run of characters in set starting at p. */
static size_t run(text t, size_t p, unsigned set) {
    while (p < t.len) {
        uint32_t cp;
        unsigned bit;
        size_t l = at(t, p, &cp, &bit);
        if (!(bit & set)) break;
        p += l;
    }
    return p;
}

static size_t newlines(text t, size_t p) { /* [\r\n]* */
    while (p < t.len && (t.s[p] == '\r' || t.s[p] == '\n')) p++;
    return p;
}

/* v2's [\p{Lu}...]*[\p{Ll}...]+ at p (with backtracking): its end, or 0 when it fails. */
static size_t upper_star_lower_plus(text t, size_t p) {
    size_t q = p, last_end = 0;
    while (q < t.len) {
        uint32_t cp;
        unsigned bit;
        size_t l = at(t, q, &cp, &bit);
        if (!(bit & SET_UPPER)) break;
        if (bit & SET_LOWER) last_end = q + l; /* where a backtracked U* could hand over to W+ */
        q += l;
    }
    size_t e = run(t, q, SET_LOWER);
    if (e > q) return e;
    return last_end; /* the characters after it are upper-only, so W+ is that one character */
}

/* The whitespace alternatives shared by both patterns: \s*[\r\n](+) | \s+(?!\S) | \s+. */
static size_t spaces(text t) {
    size_t p = 0, last = 0, nl_end = 0;
    int count = 0;
    while (p < t.len) {
        uint32_t cp;
        unsigned bit;
        size_t l = at(t, p, &cp, &bit);
        if (!(bit & B(TT_S))) break;
        if (cp == '\r' || cp == '\n') nl_end = p + l;
        last = p;
        p += l;
        count++;
    }
    if (nl_end) return nl_end;
    if (p == t.len || count < 2) return p;
    return last;
}

static size_t piece_v1(text t) {
    uint32_t c0;
    unsigned b0;
    size_t l0 = at(t, 0, &c0, &b0);
    if (b0 & SET_L) return run(t, 0, SET_L);
    if (is_prefix(c0, b0)) { /* [^\r\n\p{L}\p{N}]?+\p{L}+ */
        size_t e = run(t, l0, SET_L);
        if (e > l0) return e;
    }
    if (b0 & B(TT_N)) return l0;
    size_t o = c0 == ' ' && l0 < t.len ? 1 : 0; /*  ?[^\s\p{L}\p{N}]++[\r\n]* */
    size_t e = run(t, o, SET_OTHER);
    if (e == o && o) e = run(t, 0, SET_OTHER), o = 0;
    if (e > o) return newlines(t, e);
    return spaces(t);
}

static size_t piece_v2(text t) {
    uint32_t c0;
    unsigned b0;
    size_t l0 = at(t, 0, &c0, &b0);
    bool pre = is_prefix(c0, b0);
    size_t e;
    /* [^\r\n\p{L}\p{N}]?[U]*[W]+ */
    if (pre && (e = upper_star_lower_plus(t, l0))) return e;
    if ((e = upper_star_lower_plus(t, 0))) return e;
    /* [^\r\n\p{L}\p{N}]?[U]+[W]* */
    if (pre && (e = run(t, l0, SET_UPPER)) > l0) return run(t, e, SET_LOWER);
    if ((e = run(t, 0, SET_UPPER)) > 0) return run(t, e, SET_LOWER);
    if (b0 & B(TT_N)) return l0;
    size_t o = c0 == ' ' && l0 < t.len ? 1 : 0; /*  ?[^\s\p{L}\p{N}]+[\r\n/]* */
    e = run(t, o, SET_OTHER);
    if (e == o && o) e = run(t, 0, SET_OTHER), o = 0;
    if (e > o) {
        while (e < t.len && (t.s[e] == '\r' || t.s[e] == '\n' || t.s[e] == '/')) e++;
        return e;
    }
    return spaces(t);
}

size_t tt_next_piece(int pattern, const char *s, size_t len) {
    text t = {(const unsigned char *)s, len};
    size_t n = pattern == TT_PATTERN_V2 ? piece_v2(t) : piece_v1(t);
    if (n == 0) { /* never for these patterns; one character rather than a loop */
        uint32_t cp;
        n = uni_decode(t.s, len, &cp);
    }
    return n;
}

/* ---------------------------------------------------------------- vocabulary */

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

static size_t tok_len(const tt_model *m, int64_t id) { return (size_t)(m->off[id + 1] - m->off[id]); }

/* Rank of the bytes p[0..n), or -1. */
static int32_t rank_of(const tt_model *m, const unsigned char *p, size_t n) {
    size_t i = (size_t)hash_bytes(p, n) & m->mask;
    for (;;) {
        int32_t r = m->table[i];
        if (r < 0) return -1;
        int64_t id = r + m->num_special;
        if (tok_len(m, id) == n && !memcmp(m->bytes + m->off[id], p, n)) return r;
        i = (i + 1) & m->mask;
    }
}

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes base64 s[0..n) into out (room for 3n/4 bytes); -1 when it is not base64. */
static int64_t b64_decode(const char *s, size_t n, unsigned char *out) {
    uint32_t acc = 0;
    int bits = 0;
    int64_t w = 0;
    size_t pad = 0;
    while (n > 0 && s[n - 1] == '=' && pad < 2) n--, pad++;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[w++] = (unsigned char)(acc >> bits);
        }
    }
    return w;
}

/* One token of the file: its bytes and rank, appended to a growing list. */
typedef struct {
    unsigned char *bytes;
    int64_t *off, *rank;
    size_t n, cap, used, bcap;
} rank_list;

static int list_add(rank_list *L, const char *b64, size_t n, int64_t rank) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 1024;
        int64_t *o = realloc(L->off, (cap + 1) * sizeof *o), *r = o ? realloc(L->rank, cap * sizeof *r) : NULL;
        if (o) L->off = o;
        if (!o || !r) return CO_ENOMEM;
        L->rank = r;
        L->cap = cap;
    }
    if (L->used + n + 4 > L->bcap) {
        size_t bcap = L->bcap ? 2 * L->bcap + n : 1 << 20;
        unsigned char *b = realloc(L->bytes, bcap);
        if (!b) return CO_ENOMEM;
        L->bytes = b;
        L->bcap = bcap;
    }
    if (L->n == 0) L->off[0] = 0;
    int64_t w = b64_decode(b64, n, L->bytes + L->used);
    if (w <= 0) return CO_EFORMAT;
    L->used += (size_t)w;
    L->rank[L->n] = rank;
    L->off[++L->n] = (int64_t)L->used;
    return 0;
}

static int read_tiktoken(rank_list *L, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "--tokenizer-model %s: cannot open: %s", path,
                              strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t k;
    int rc = 0;
    while (!rc && (k = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = '\0';
        if (k == 0) continue;
        char *sp = strchr(line, ' '), *end;
        long long r = sp ? strtoll(sp + 1, &end, 10) : -1;
        if (!sp || end == sp + 1 || *end || r < 0 || r >= INT32_MAX) {
            rc = co_err_set(CO_EFORMAT, "--tokenizer-model %s:%zu: not a tiktoken ranks line \"BASE64 RANK\"", path,
                            lineno);
            break;
        }
        int e = list_add(L, line, (size_t)(sp - line), r);
        if (e == CO_EFORMAT) rc = co_err_set(e, "--tokenizer-model %s:%zu: the token is not base64", path, lineno);
        else if (e) rc = co_err_set(e, "--tokenizer-model %s: out of memory", path);
    }
    if (!rc && ferror(f)) rc = co_err_set(CO_EIO, "--tokenizer-model %s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

/* Megatron's JSON (reload_mergeable_ranks): a list of {"rank", "token_bytes", "token_str"},
 * rank i at index i, ranks 0..255 the single bytes 0..255. */
static int read_json(rank_list *L, const char *path) {
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &jerr); /* token_str may hold a NUL */
    if (!root && access(path, R_OK))
        return co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "--tokenizer-model %s: cannot open: %s", path,
                          strerror(errno));
    if (!root) return co_err_set(CO_EFORMAT, "--tokenizer-model %s:%d: not JSON: %s", path, jerr.line, jerr.text);
    int rc = 0;
    if (!json_is_array(root)) rc = co_err_set(CO_EFORMAT, "--tokenizer-model %s: not a JSON list of ranks", path);
    for (size_t i = 0; !rc && i < json_array_size(root); i++) {
        json_t *o = json_array_get(root, i), *r = json_object_get(o, "rank"), *b = json_object_get(o, "token_bytes");
        if (!json_is_integer(r) || json_integer_value(r) != (json_int_t)i || !json_is_string(b)) {
            rc = co_err_set(CO_EFORMAT, "--tokenizer-model %s: entry %zu is not {\"rank\": %zu, \"token_bytes\": ...}",
                            path, i, i);
            break;
        }
        int e = list_add(L, json_string_value(b), json_string_length(b), (int64_t)i);
        if (e == CO_EFORMAT) rc = co_err_set(e, "--tokenizer-model %s: entry %zu: token_bytes is not base64", path, i);
        else if (e) rc = co_err_set(e, "--tokenizer-model %s: out of memory", path);
        else if (i < 256 && (L->off[i + 1] - L->off[i] != 1 || L->bytes[L->off[i]] != i))
            rc = co_err_set(CO_EFORMAT, "--tokenizer-model %s: rank %zu is not the single byte %zu", path, i, i);
    }
    json_decref(root);
    return rc;
}

static const char *const default_special[] = {"<unk>", "<s>", "</s>"};

/* Megatron's checks of the special tokens; the list with fillers goes to names[0..ns). */
static int special_names(const tt_options *o, char **names, int64_t vocab) {
    const char *const *sp = o->special ? o->special : default_special;
    int n = o->special ? o->n_special : 3, ns = o->num_special;
    if (ns < n || ns >= vocab)
        return co_err_set(CO_EINVAL,
                          "--tiktoken-num-special-tokens %d: must be at least the %d special tokens and below the "
                          "vocabulary size %lld",
                          ns, n, (long long)vocab);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(sp[i], sp[j]))
                return co_err_set(CO_EINVAL, "--tiktoken-special-tokens: %s is given twice", sp[i]);
    for (int d = 0; d < 3; d++) {
        int found = 0;
        for (int i = 0; i < n; i++) found |= !strcmp(sp[i], default_special[d]);
        if (!found)
            return co_err_set(CO_EINVAL, "--tiktoken-special-tokens must include <unk>, <s> and </s> (no %s)",
                              default_special[d]);
    }
    for (int i = 0; i < ns; i++) {
        char buf[32];
        if (i >= n) snprintf(buf, sizeof buf, "<SPECIAL_%d>", i);
        names[i] = strdup(i < n ? sp[i] : buf);
        if (!names[i]) return co_err_set(CO_ENOMEM, "TikTokenizer: out of memory");
        for (int j = 0; i >= n && j < n; j++) /* a given name equal to a filler */
            if (!strcmp(sp[j], buf))
                return co_err_set(CO_EINVAL, "--tiktoken-special-tokens: %s is a filler's name", buf);
    }
    return 0;
}

/* Where each rank below inner is in L (pos[rank]); Megatron's check that they all are, once.
 * *total: their bytes. */
static int rank_positions(const rank_list *L, int64_t inner, int64_t vocab, const char *path, int64_t **out,
                          size_t *total) {
    int64_t *pos = malloc((size_t)inner * sizeof *pos);
    if (!pos) return co_err_set(CO_ENOMEM, "TikTokenizer: out of memory");
    for (int64_t r = 0; r < inner; r++) pos[r] = -1;
    int rc = 0;
    *total = 0;
    for (size_t i = 0; !rc && i < L->n; i++) {
        if (L->rank[i] >= inner) continue;
        if (pos[L->rank[i]] >= 0)
            rc = co_err_set(CO_EFORMAT, "--tokenizer-model %s: rank %lld is given twice", path, (long long)L->rank[i]);
        pos[L->rank[i]] = (int64_t)i;
        *total += (size_t)(L->off[i + 1] - L->off[i]);
    }
    for (int64_t r = 0; !rc && r < inner; r++)
        if (pos[r] < 0)
            rc = co_err_set(CO_EFORMAT,
                            "--tokenizer-model %s: no rank %lld (the vocabulary of %lld needs ranks 0..%lld)", path,
                            (long long)r, (long long)vocab, (long long)inner - 1);
    if (rc) free(pos);
    else *out = pos;
    return rc;
}

/* The open-addressing table from a rank's bytes to the rank; every byte must have a rank. */
static int index_ranks(tt_model *m, const char *path) {
    memset(m->table, 0xff, (m->mask + 1) * sizeof *m->table);
    for (int64_t r = 0; r < m->nranks; r++) {
        const unsigned char *b = (const unsigned char *)m->bytes + m->off[r + m->num_special];
        size_t n = tok_len(m, r + m->num_special);
        if (rank_of(m, b, n) >= 0)
            return co_err_set(CO_EFORMAT, "--tokenizer-model %s: two ranks of the same bytes", path);
        size_t i = (size_t)hash_bytes(b, n) & m->mask;
        while (m->table[i] >= 0) i = (i + 1) & m->mask;
        m->table[i] = (int32_t)r;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (rank_of(m, &c, 1) < 0)
            return co_err_set(CO_EFORMAT, "--tokenizer-model %s: byte 0x%02x has no rank below %lld", path, b,
                              (long long)m->nranks);
    }
    return 0;
}

/* Lays out every id's bytes (specials, then ranks 0..inner-1) and indexes the ranks. */
static int build(tt_model *m, const rank_list *L, char **names, const char *path) {
    int64_t inner = m->vocab - m->num_special, *pos = NULL;
    size_t total = 0;
    int rc = rank_positions(L, inner, m->vocab, path, &pos, &total);
    if (rc) return rc;
    for (int i = 0; i < m->num_special; i++) total += strlen(names[i]);
    size_t cap = 1;
    while (cap < 2 * (size_t)inner) cap <<= 1;
    m->mask = cap - 1;
    m->nranks = inner;
    m->bytes = malloc(total + 1);
    m->off = malloc((size_t)(m->vocab + 1) * sizeof *m->off);
    m->table = malloc(cap * sizeof *m->table);
    if (!m->bytes || !m->off || !m->table) {
        free(pos);
        return co_err_set(CO_ENOMEM, "TikTokenizer: out of memory");
    }
    m->off[0] = 0;
    for (int64_t id = 0; id < m->vocab; id++) {
        int64_t i = id < m->num_special ? -1 : pos[id - m->num_special]; /* the rank's entry in L */
        const void *src = i < 0 ? (const void *)names[id] : L->bytes + L->off[i];
        size_t n = i < 0 ? strlen(names[id]) : (size_t)(L->off[i + 1] - L->off[i]);
        memcpy(m->bytes + m->off[id], src, n);
        m->off[id + 1] = m->off[id] + (int64_t)n;
    }
    free(pos);
    return index_ranks(m, path);
}

int tt_load(tt_model **out, const tt_options *o) {
    *out = NULL;
    if (o->pattern != TT_PATTERN_V1 && o->pattern != TT_PATTERN_V2)
        return co_err_set(CO_EINVAL, "--tiktoken-pattern: v1 or v2");
    size_t pl = strlen(o->path);
    bool json = pl >= 5 && !strcmp(o->path + pl - 5, ".json");
    rank_list L = {0};
    int rc = json ? read_json(&L, o->path) : read_tiktoken(&L, o->path);
    tt_model *m = rc ? NULL : calloc(1, sizeof *m);
    char **names = m ? calloc((size_t)(o->num_special > 0 ? o->num_special : 1), sizeof *names) : NULL;
    if (!rc && !names) rc = co_err_set(CO_ENOMEM, "TikTokenizer: out of memory");
    if (!rc) {
        m->num_special = o->num_special;
        m->pattern = o->pattern;
        m->vocab = o->vocab_size > 0 ? o->vocab_size : (int64_t)L.n + o->num_special;
        if (o->vocab_size <= 0 && m->vocab > TT_DEFAULT_VOCAB) m->vocab = TT_DEFAULT_VOCAB;
        if (m->vocab > INT32_MAX) rc = co_err_set(CO_EINVAL, "--vocab-size %lld: too large", (long long)m->vocab);
    }
    if (!rc) rc = special_names(o, names, m->vocab);
    if (!rc) rc = build(m, &L, names, o->path);
    if (!rc) {
        for (int i = 0; i < m->num_special; i++) {
            if (!strcmp(names[i], "<s>")) m->bos = i;
            if (!strcmp(names[i], "</s>")) m->eos = i;
        }
    }
    for (int i = 0; names && i < o->num_special; i++) free(names[i]);
    free(names);
    free(L.bytes);
    free(L.off);
    free(L.rank);
    if (rc) {
        tt_free(&m);
        return rc;
    }
    *out = m;
    return 0;
}

void tt_free(tt_model **pm) {
    tt_model *m = *pm;
    if (!m) return;
    free(m->bytes);
    free(m->off);
    free(m->table);
    free(m);
    *pm = NULL;
}

int64_t tt_vocab_size(const tt_model *m) { return m->vocab; }
int32_t tt_bos(const tt_model *m) { return m->bos; }
int32_t tt_eos(const tt_model *m) { return m->eos; }

/* ---------------------------------------------------------------- encode, decode */

/* tiktoken's _byte_pair_merge over piece p[0..n) (n >= 2): part starts in start[0..k],
 * rank[i] the rank of parts i and i+1 together. Writes ids, returns their count. */
static int64_t byte_pair(const tt_model *m, const unsigned char *p, size_t n, size_t *start, int64_t *rank,
                         int32_t *ids) {
    size_t k = n + 1; /* boundaries 0..n */
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (size_t i = 0; i + 2 < k; i++) rank[i] = rank_of(m, p + i, 2);
    for (;;) {
        int64_t best = -1;
        size_t bi = 0;
        for (size_t i = 0; i + 2 < k; i++)
            if (rank[i] >= 0 && (best < 0 || rank[i] < best)) best = rank[i], bi = i;
        if (best < 0) break;
        memmove(start + bi + 1, start + bi + 2, (k - bi - 2) * sizeof *start);
        memmove(rank + bi + 1, rank + bi + 2, (k >= bi + 4 ? k - bi - 4 : 0) * sizeof *rank);
        k--;
        for (size_t i = bi ? bi - 1 : 0; i <= bi && i + 2 < k; i++)
            rank[i] = rank_of(m, p + start[i], start[i + 2] - start[i]);
    }
    for (size_t i = 0; i + 1 < k; i++)
        ids[i] = (int32_t)(rank_of(m, p + start[i], start[i + 1] - start[i]) + m->num_special);
    return (int64_t)(k - 1);
}

int64_t tt_encode(const tt_model *m, const char *s, size_t len, int32_t *out, size_t cap) {
    const unsigned char *u = (const unsigned char *)s;
    size_t *start = NULL, scap = 0;
    int64_t *rank = NULL;
    int32_t *ids = NULL;
    int64_t n = 0;
    for (size_t p = 0; p < len;) {
        size_t k = tt_next_piece(m->pattern, s + p, len - p);
        int32_t r = rank_of(m, u + p, k);
        if (r >= 0) {
            if ((size_t)n < cap) out[n] = r + m->num_special;
            n++;
        } else {
            if (k + 1 > scap) {
                scap = 2 * (k + 1);
                free(start), free(rank), free(ids);
                start = malloc(scap * sizeof *start);
                rank = malloc(scap * sizeof *rank);
                ids = malloc(scap * sizeof *ids);
                if (!start || !rank || !ids) {
                    free(start), free(rank), free(ids);
                    return co_err_set(CO_ENOMEM, "TikTokenizer: out of memory");
                }
            }
            int64_t c = byte_pair(m, u + p, k, start, rank, ids);
            for (int64_t i = 0; i < c; i++, n++)
                if ((size_t)n < cap) out[n] = ids[i];
        }
        p += k;
    }
    free(start), free(rank), free(ids);
    return n;
}

int64_t tt_decode(const tt_model *m, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= m->vocab)
            return co_err_set(CO_EINVAL, "decode: id %d out of range (vocab %lld)", (int)ids[i], (long long)m->vocab);
        size_t l = tok_len(m, ids[i]);
        for (size_t j = 0; j < l; j++, w++)
            if (w + 1 < cap) out[w] = m->bytes[m->off[ids[i]] + (int64_t)j];
    }
    if (cap > 0) out[w < cap ? w : cap - 1] = '\0';
    return (int64_t)w;
}
