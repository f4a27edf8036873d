/* unicode.h - UTF-8 decoding and the code-point classes of GPT-2's pre-tokenisation regex
 * (\p{L} letters, \p{N} numbers, JavaScript's \s whitespace). The tables live in the
 * generated unicode_tables.c (data/gen_unicode_tables.js; the Unicode version is in
 * uni_tables_version). */
#ifndef COHORT_DATA_UNICODE_H
#define COHORT_DATA_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t lo, hi; /* inclusive */
} uni_range;

extern const char uni_tables_version[];
extern const uni_range uni_letter_ranges[], uni_number_ranges[], uni_space_ranges[];
extern const int uni_letter_count, uni_number_count, uni_space_count;

enum { UNI_OTHER = 0, UNI_LETTER = 1, UNI_NUMBER = 2, UNI_SPACE = 3 };

/* Class of a code point (UNI_OTHER for anything outside the three classes). */
int uni_class(uint32_t cp);

/* Decodes one UTF-8 sequence at s[0..n) (n >= 1). Returns its length in bytes and stores
 * the code point; an invalid or truncated sequence yields length 1 and *cp = 0xFFFD
 * (class UNI_OTHER), so every byte is consumed exactly once. */
size_t uni_decode(const unsigned char *s, size_t n, uint32_t *cp);

#endif
