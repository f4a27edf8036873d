/* moe_freq.c - the list form of --moe-layer-freq: Megatron's moe_freq_type evaluates a Python
 * list expression of the characters `0-9 , [ ] ( ) + *` (its _eval_pattern refuses any other,
 * spaces included), e.g. "([1]*3+[0]*1)*2" or "[0,1,1,1]", giving one entry per layer: 1 a
 * MoE layer, 0 a dense one. This is that expression language's part Megatron's examples use:
 * integers, list displays of integers, parentheses, + (integers add, lists concatenate) and
 * * (integers multiply, a list times an integer repeats it), with Python's precedence; what
 * Python would refuse (a list plus an integer, a tuple, a nested list) is refused, and so is
 * an entry other than 0 and 1 (Megatron's layer specs take only those). */
#include "common/config.h"

#include "common/error.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INT_LIMIT 1000000000LL

/* A value: an integer, or a list of integers (at most CO_MAX_LAYERS entries). */
typedef struct lval {
    bool list;
    long long n;
    int len;
    int v[CO_MAX_LAYERS];
} lval;

typedef struct lparse {
    const char *s;
    size_t i;
    const char *why; /* the first error's reason, NULL: none */
} lparse;

static int fail(lparse *p, const char *why) {
    if (!p->why) p->why = why;
    return -1;
}

static int expr(lparse *p, lval *out);

static int append(lparse *p, lval *a, const lval *b) {
    if (a->len + b->len > CO_MAX_LAYERS) return fail(p, "more entries than layers cohort allows");
    memcpy(a->v + a->len, b->v, sizeof(int) * (size_t)b->len);
    a->len += b->len;
    return 0;
}

/* '[' [expr (',' expr)* [',']] ']' after the '['; every element an integer */
static int list_display(lparse *p, lval *out) {
    out->list = true;
    out->len = 0;
    lval *e = malloc(sizeof *e);
    if (!e) return fail(p, "out of memory");
    int rc = 0;
    while (!rc && p->s[p->i] != ']') {
        rc = expr(p, e);
        if (!rc && e->list) rc = fail(p, "a list inside a list (each entry is 0 or 1)");
        if (!rc && out->len >= CO_MAX_LAYERS) rc = fail(p, "more entries than layers cohort allows");
        if (!rc) out->v[out->len++] = (int)e->n;
        if (!rc && p->s[p->i] == ',') p->i++;
        else if (!rc && p->s[p->i] != ']') rc = fail(p, "a list's entries are separated by commas and end with ]");
    }
    free(e);
    if (!rc) p->i++;
    return rc;
}

static int atom(lparse *p, lval *out) {
    char ch = p->s[p->i];
    if (ch >= '0' && ch <= '9') {
        long long n = 0;
        while (p->s[p->i] >= '0' && p->s[p->i] <= '9') {
            n = n * 10 + (p->s[p->i++] - '0');
            if (n > INT_LIMIT) return fail(p, "a number too large");
        }
        out->list = false;
        out->n = n;
        return 0;
    }
    if (ch == '[') {
        p->i++;
        return list_display(p, out);
    }
    if (ch == '(') {
        p->i++;
        if (expr(p, out)) return -1;
        if (p->s[p->i] == ',') return fail(p, "a tuple (only lists and integers)");
        if (p->s[p->i] != ')') return fail(p, "a ( without its )");
        p->i++;
        return 0;
    }
    return fail(p, ch ? "an operator where a number, [ or ( belongs" : "the expression ends early");
}

/* a * b: integers multiply, a list and an integer repeat the list (none for n <= 0) */
static int times(lparse *p, lval *a, const lval *b) {
    if (a->list && b->list) return fail(p, "a list times a list");
    if (!a->list && !b->list) {
        a->n *= b->n;
        return a->n > INT_LIMIT || a->n < -INT_LIMIT ? fail(p, "a number too large") : 0;
    }
    const lval *l = a->list ? a : b;
    long long k = a->list ? b->n : a->n;
    if (k > 0 && (long long)l->len * k > CO_MAX_LAYERS) return fail(p, "more entries than layers cohort allows");
    int len = k > 0 ? l->len * (int)k : 0;
    if (!a->list) memcpy(a->v, b->v, sizeof(int) * (size_t)b->len);
    for (int j = l->len; j < len; j++) a->v[j] = a->v[j - l->len];
    a->list = true;
    a->len = len;
    return 0;
}

static int term(lparse *p, lval *out) {
    if (atom(p, out)) return -1;
    lval *b = malloc(sizeof *b);
    if (!b) return fail(p, "out of memory");
    int rc = 0;
    while (!rc && p->s[p->i] == '*') {
        p->i++;
        rc = atom(p, b);
        if (!rc) rc = times(p, out, b);
    }
    free(b);
    return rc;
}

static int expr(lparse *p, lval *out) {
    if (term(p, out)) return -1;
    lval *b = malloc(sizeof *b);
    if (!b) return fail(p, "out of memory");
    int rc = 0;
    while (!rc && p->s[p->i] == '+') {
        p->i++;
        rc = term(p, b);
        if (!rc && out->list != b->list) rc = fail(p, "a list plus an integer");
        else if (!rc && out->list) rc = append(p, out, b);
        else if (!rc) out->n += b->n;
    }
    free(b);
    return rc;
}

int co_moe_layer_list(const char *text, char *out, size_t cap) {
    if (strspn(text, "0123456789,[]()+*") != strlen(text))
        return co_err_set(CO_EINVAL, "--moe-layer-freq '%s': Megatron's list form takes only digits, commas, [ ], "
                                     "( ), + and * (no spaces), e.g. \"([1]*3+[0]*1)*2\" or \"[0,1,1,1]\"", text);
    lval *v = malloc(sizeof *v);
    if (!v) return co_err_set(CO_ENOMEM, "--moe-layer-freq: out of memory");
    lparse p = {.s = text};
    int rc = expr(&p, v);
    if (!rc && text[p.i]) rc = fail(&p, "text after the expression");
    if (!rc && !v->list) rc = fail(&p, "an integer, not a list (give an integer N without brackets)");
    for (int j = 0; !rc && j < v->len; j++)
        if (v->v[j] != 0 && v->v[j] != 1) rc = fail(&p, "an entry other than 0 (dense) and 1 (MoE)");
    if (!rc && (size_t)v->len >= cap) rc = fail(&p, "more entries than layers cohort allows");
    if (rc) {
        free(v);
        return co_err_set(CO_EINVAL, "--moe-layer-freq '%s': %s, at character %zu", text, p.why, p.i + 1);
    }
    for (int j = 0; j < v->len; j++) out[j] = (char)('0' + v->v[j]);
    out[v->len] = '\0';
    free(v);
    return 0;
}
