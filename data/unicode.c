/* unicode.c - UTF-8 decoding and code-point classification over the generated tables. */
#include "data/unicode.h"

static int in_ranges(const uni_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int uni_class(uint32_t cp) {
    if (cp < 128) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UNI_LETTER;
        if (cp >= '0' && cp <= '9') return UNI_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return UNI_SPACE;
        return UNI_OTHER;
    }
    if (in_ranges(uni_letter_ranges, uni_letter_count, cp)) return UNI_LETTER;
    if (in_ranges(uni_number_ranges, uni_number_count, cp)) return UNI_NUMBER;
    if (in_ranges(uni_space_ranges, uni_space_count, cp)) return UNI_SPACE;
    return UNI_OTHER;
}

size_t uni_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) len = 2, v = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, v = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, v = c & 0x07, min = 0x10000;
    else goto bad;
    if (len > n) goto bad;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xfffd;
    return 1;
}
