/* Bitmaps of pages.  Bit i stands for page i.  Set/test/clear of single
 * bits are atomic (several threads may set bits at once); whole-map
 * operations are not and need the caller's exclusion. */
#ifndef KMIG_BASE_BITMAP_H
#define KMIG_BASE_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

struct bitmap {
	uint64_t *words;
	size_t nbits;
};

#define BITMAP_WORDS(n) (((n) + 63) / 64)

/* Allocates a zeroed bitmap of nbits; -ENOMEM on failure. */
int bitmap__init(struct bitmap *b, size_t nbits) KMIG_MUST_CHECK;
void bitmap__free(struct bitmap *b);

static inline bool bitmap__test(const struct bitmap *b, size_t i)
{
	return (__atomic_load_n(&b->words[i / 64], __ATOMIC_RELAXED) >> (i % 64)) & 1;
}
static inline void bitmap__set(struct bitmap *b, size_t i)
{
	__atomic_fetch_or(&b->words[i / 64], 1ULL << (i % 64), __ATOMIC_RELAXED);
}
/* Sets bit i; returns whether it was clear before. */
static inline bool bitmap__test_and_set(struct bitmap *b, size_t i)
{
	uint64_t m = 1ULL << (i % 64);
	return !(__atomic_fetch_or(&b->words[i / 64], m, __ATOMIC_RELAXED) & m);
}
static inline void bitmap__clear_bit(struct bitmap *b, size_t i)
{
	__atomic_fetch_and(&b->words[i / 64], ~(1ULL << (i % 64)), __ATOMIC_RELAXED);
}

void bitmap__set_all(struct bitmap *b);
void bitmap__clear_all(struct bitmap *b);
/* Sets/clears bits [start, start + n); bounds are clipped to nbits.  Each
 * word is changed atomically, so several threads may set ranges at once. */
void bitmap__set_range(struct bitmap *b, size_t start, size_t n);
void bitmap__clear_range(struct bitmap *b, size_t start, size_t n);
size_t bitmap__count(const struct bitmap *b);
/* First set bit at or after i, or nbits if none. */
size_t bitmap__next_set(const struct bitmap *b, size_t i);
/* dst |= src over the first min(nbits) bits; returns bits newly set in dst. */
size_t bitmap__or(struct bitmap *dst, const struct bitmap *src);
/* dst &= ~src over the first min(nbits) bits. */
void bitmap__andnot(struct bitmap *dst, const struct bitmap *src);
/* dst |= the raw words src (nbits bits, little-endian bit order as KVM
 * returns them), placed at bit offset dst_start (a multiple of 64);
 * returns the number of bits that were newly set in dst. */
size_t bitmap__or_words(struct bitmap *dst, size_t dst_start,
			const uint64_t *src, size_t nbits);

#endif
