/* fuzz_wire_decode_seeds.c - writes the seed corpus for fuzz_wire_decode: every body type
 * with every field set (0, 1 and 3 elements per repeated field), under a few headers.
 * Usage: fuzz_wire_decode_seeds DIR */
#include "protocol/wire.h"
#include "tests/unit/protocol/pw_sample.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const ProtobufCMessageDescriptor *bodies[64];
    size_t nb = pws_bodies(bodies, 64), written = 0;
    const pw_header hdrs[] = {
        {.job_id = 0x1234567890abcdefull, .generation = 2, .sender = 0, .seq = 1},
        {.job_id = 0x1234567890abcdefull, .generation = 7, .sender = PW_SENDER_SUPERVISOR,
         .seq = 99, .sent_ns = 1700000000000000000ull},
    };
    const size_t reps[] = {0, 1, 3};
    for (size_t i = 0; i < nb; i++)
        for (size_t h = 0; h < sizeof hdrs / sizeof hdrs[0]; h++)
            for (size_t r = 0; r < sizeof reps / sizeof reps[0]; r++) {
                if (h && r != 1) continue;
                ProtobufCMessage *b = pws_fill(bodies[i], (unsigned)(i * 7 + r), reps[r]);
                uint8_t *enc;
                size_t len;
                if (!b || pw_encode_alloc(&hdrs[h], b, &enc, &len)) {
                    fprintf(stderr, "seed %s failed\n", bodies[i]->short_name);
                    return 1;
                }
                char path[4096];
                snprintf(path, sizeof path, "%s/%s-%zu-%zu", argv[1], bodies[i]->short_name,
                         h, reps[r]);
                FILE *f = fopen(path, "wb");
                if (!f || fwrite(enc, 1, len, f) != len || fclose(f)) {
                    fprintf(stderr, "%s: cannot write\n", path);
                    return 1;
                }
                written++;
                free(enc);
                pws_free(&b);
            }
    printf("%zu seeds in %s\n", written, argv[1]);
    return 0;
}
