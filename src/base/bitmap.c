#include "base/bitmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int bitmap__init(struct bitmap *b, size_t nbits)
{
	b->nbits = nbits;
	b->words = calloc(BITMAP_WORDS(nbits) ? BITMAP_WORDS(nbits) : 1, sizeof(uint64_t));
	return b->words ? 0 : -ENOMEM;
}

void bitmap__free(struct bitmap *b)
{
	free(b->words);
	b->words = NULL;
	b->nbits = 0;
}

static void bitmap__trim(struct bitmap *b)
{
	if (b->nbits % 64)
		b->words[b->nbits / 64] &= (1ULL << (b->nbits % 64)) - 1;
}

void bitmap__set_all(struct bitmap *b)
{
	memset(b->words, 0xff, BITMAP_WORDS(b->nbits) * sizeof(uint64_t));
	bitmap__trim(b);
}

void bitmap__clear_all(struct bitmap *b)
{
	memset(b->words, 0, BITMAP_WORDS(b->nbits) * sizeof(uint64_t));
}

static void bitmap__range(struct bitmap *b, size_t start, size_t n, int set)
{
	if (start >= b->nbits)
		return;
	if (n > b->nbits - start)
		n = b->nbits - start;
	size_t end = start + n;
	while (start < end) {
		size_t bit = start % 64, take = 64 - bit;
		if (take > end - start)
			take = end - start;
		uint64_t m = (take == 64 ? ~0ULL : ((1ULL << take) - 1)) << bit;
		if (set)
			__atomic_fetch_or(&b->words[start / 64], m, __ATOMIC_RELAXED);
		else
			__atomic_fetch_and(&b->words[start / 64], ~m, __ATOMIC_RELAXED);
		start += take;
	}
}

void bitmap__set_range(struct bitmap *b, size_t start, size_t n)
{
	bitmap__range(b, start, n, 1);
}

void bitmap__clear_range(struct bitmap *b, size_t start, size_t n)
{
	bitmap__range(b, start, n, 0);
}

size_t bitmap__count(const struct bitmap *b)
{
	size_t n = 0;
	for (size_t i = 0; i < BITMAP_WORDS(b->nbits); i++)
		n += __builtin_popcountll(b->words[i]);
	return n;
}

size_t bitmap__next_set(const struct bitmap *b, size_t i)
{
	if (i >= b->nbits)
		return b->nbits;
	size_t w = i / 64;
	uint64_t word = b->words[w] & (~0ULL << (i % 64));
	for (;;) {
		if (word) {
			size_t r = w * 64 + __builtin_ctzll(word);
			return r < b->nbits ? r : b->nbits;
		}
		if (++w >= BITMAP_WORDS(b->nbits))
			return b->nbits;
		word = b->words[w];
	}
}

size_t bitmap__or(struct bitmap *dst, const struct bitmap *src)
{
	size_t n = dst->nbits < src->nbits ? dst->nbits : src->nbits;
	return bitmap__or_words(dst, 0, src->words, n);
}

void bitmap__andnot(struct bitmap *dst, const struct bitmap *src)
{
	size_t n = dst->nbits < src->nbits ? dst->nbits : src->nbits;
	size_t words = n / 64;
	for (size_t i = 0; i < words; i++)
		dst->words[i] &= ~src->words[i];
	if (n % 64)
		dst->words[words] &= ~(src->words[words] & ((1ULL << (n % 64)) - 1));
}

size_t bitmap__or_words(struct bitmap *dst, size_t dst_start,
			const uint64_t *src, size_t nbits)
{
	size_t added = 0;
	if (dst_start % 64 || dst_start >= dst->nbits)
		return 0;
	if (nbits > dst->nbits - dst_start)
		nbits = dst->nbits - dst_start;
	size_t words = BITMAP_WORDS(nbits), base = dst_start / 64;
	for (size_t i = 0; i < words; i++) {
		uint64_t s = src[i];
		if (i == words - 1 && nbits % 64)
			s &= (1ULL << (nbits % 64)) - 1;
		if (!s)
			continue;
		uint64_t old = __atomic_fetch_or(&dst->words[base + i], s, __ATOMIC_RELAXED);
		added += __builtin_popcountll(s & ~old);
	}
	return added;
}
