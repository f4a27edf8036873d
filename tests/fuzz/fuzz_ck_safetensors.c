/* fuzz_ck_safetensors.c - libFuzzer target: the safetensors header parser on arbitrary
 * bytes (the input is a whole file). Accepted entries must lie inside the data section. */
#include "checkpoint/format.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ck_st_header *h = NULL;
    if (ck_st_parse(data, size, size, "fuzz", &h)) return 0;
    uint64_t prev = 0;
    for (int i = 0; i < h->n; i++) {
        const ck_st_entry *e = &h->e[i];
        if (e->begin != prev || e->end < e->begin || h->data_start + e->end > size) abort();
        prev = e->end;
    }
    if (prev != h->data_len) abort();
    ck_st_header_free(&h);
    return 0;
}
