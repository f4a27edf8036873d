/* md5.h - MD5 (RFC 1321), used for the GPTDataset index cache's file names (Megatron
 * names cache files by hashlib.md5(description).hexdigest()). Not for security. */
#ifndef COHORT_DATA_MD5_H
#define COHORT_DATA_MD5_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[4];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
} md5_ctx;

void md5_init(md5_ctx *c);
void md5_update(md5_ctx *c, const void *data, size_t n);
void md5_final(md5_ctx *c, uint8_t digest[16]);
/* One-shot: writes 32 lowercase hex digits and a NUL into hex[33]. */
void md5_hex(const void *data, size_t n, char hex[33]);

#endif
