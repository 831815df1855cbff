/* Little-endian load/store helpers for the wire protocol (byte-wise, so
 * safe on unaligned buffers and on any host byte order). */
#ifndef KMIG_MIG_PROTO_LE_H
#define KMIG_MIG_PROTO_LE_H

#include <stdint.h>

static inline void le__put32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}
static inline void le__put64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t le__get32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}
static inline uint64_t le__get64(const uint8_t *b)
{
	return (uint64_t)le__get32(b) | (uint64_t)le__get32(b + 4) << 32;
}

#endif
