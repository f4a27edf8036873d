/* fuzz_ck_manifest.c - libFuzzer target: the checkpoint manifest parser on arbitrary bytes.
 * A manifest that parses must serialise and parse again to the same structure. */
#include "checkpoint/format.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ck_manifest *m = NULL;
    if (ck_manifest_parse((const char *)data, size, "fuzz", &m)) return 0;
    char *text;
    size_t len;
    if (!ck_manifest_dump(m, &text, &len)) {
        ck_manifest *again = NULL;
        if (ck_manifest_parse(text, len, "fuzz-again", &again)) abort();
        if (again->iteration != m->iteration || again->ntensors != m->ntensors || again->nfiles != m->nfiles ||
            memcmp(&again->progress, &m->progress, sizeof m->progress))
            abort();
        for (int i = 0; i < m->ntensors; i++)
            if (again->tensors[i].nslices != m->tensors[i].nslices || strcmp(again->tensors[i].name, m->tensors[i].name))
                abort();
        ck_manifest_free(&again);
        free(text);
    }
    ck_manifest_free(&m);
    return 0;
}
