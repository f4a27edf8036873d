/* crc32c.h - CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord and
 * TensorBoard's event files use it, and their "masked" form. Debian 12 ships no crc32c
 * library, so this is a small table-driven (slice-by-8) implementation. */
#ifndef COHORT_OBSERVE_CRC32C_H
#define COHORT_OBSERVE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes: ob_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ob_crc32c(uint32_t crc, const void *buf, size_t n);
/* TensorFlow's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8, in 32 bits. */
uint32_t ob_crc32c_mask(uint32_t crc);

#endif
