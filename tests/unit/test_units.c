#include <errno.h>

#include "base/bitmap.h"
#include "base/units.h"
#include "harness.h"

static void t_sizes(struct t *t)
{
	static const struct { const char *s; int rc; uint64_t v; } tab[] = {
		{ "1G", 0, GiB }, { "512M", 0, 512 * MiB }, { "512MiB", 0, 512 * MiB },
		{ "64k", 0, 64 * KiB }, { "4096", 0, 4096 }, { "2g", 0, 2 * GiB },
		{ "1T", 0, 1024 * GiB }, { "12MB", 0, 12 * MiB }, { "", -EINVAL, 0 },
		{ "G", -EINVAL, 0 }, { "1X", -EINVAL, 0 }, { "-1G", -EINVAL, 0 },
		{ "1G5", -EINVAL, 0 }, { "99999999999999999999", -ERANGE, 0 },
		{ "99999999999T", -ERANGE, 0 }, { " 1G", -EINVAL, 0 },
	};
	for (unsigned i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		uint64_t v = 0;
		int rc = units__parse_size(tab[i].s, 1, &v);
		T_CHECK_EQ(t, rc, tab[i].rc);
		if (!rc)
			T_CHECK_EQ(t, v, tab[i].v);
	}
	uint64_t v;
	T_CHECK_EQ(t, units__parse_size("3", MiB, &v), 0);
	T_CHECK_EQ(t, v, 3 * MiB);
}

static void t_numbers(struct t *t)
{
	uint64_t v;
	T_CHECK_EQ(t, units__parse_u64("2", 1, 8, &v), 0);
	T_CHECK_EQ(t, v, 2);
	T_CHECK_EQ(t, units__parse_u64("0", 1, 8, &v), -ERANGE);
	T_CHECK_EQ(t, units__parse_u64("9", 1, 8, &v), -ERANGE);
	T_CHECK_EQ(t, units__parse_u64("2x", 1, 8, &v), -EINVAL);
	T_CHECK_EQ(t, units__parse_u64(NULL, 1, 8, &v), -EINVAL);
}

static void t_bitmap(struct t *t)
{
	struct bitmap b, c;
	T_CHECK_EQ(t, bitmap__init(&b, 200), 0);
	T_CHECK_EQ(t, bitmap__init(&c, 200), 0);
	bitmap__set_range(&b, 3, 70);
	T_CHECK_EQ(t, bitmap__count(&b), 70);
	T_CHECK_EQ(t, bitmap__next_set(&b, 0), 3);
	T_CHECK_EQ(t, bitmap__next_set(&b, 73), 200);
	bitmap__clear_range(&b, 10, 1000);
	T_CHECK_EQ(t, bitmap__count(&b), 7);
	T_CHECK(t, bitmap__test_and_set(&b, 150));
	T_CHECK(t, !bitmap__test_and_set(&b, 150));
	bitmap__set_all(&c);
	T_CHECK_EQ(t, bitmap__count(&c), 200);
	T_CHECK_EQ(t, bitmap__or(&b, &c), 200 - 8);
	uint64_t words[2] = { 0x5, 0x1 };
	bitmap__clear_all(&b);
	T_CHECK_EQ(t, bitmap__or_words(&b, 64, words, 65), 3);
	T_CHECK(t, bitmap__test(&b, 64) && bitmap__test(&b, 66) && bitmap__test(&b, 128));
	T_CHECK_EQ(t, bitmap__or_words(&b, 192, words, 128), 2); /* clipped at 200 */
	T_CHECK_EQ(t, bitmap__or_words(&b, 3, words, 64), 0);    /* misaligned: refused */
	/* andnot: clears what c has, only over the shorter map */
	bitmap__set_all(&b);
	bitmap__clear_all(&c);
	bitmap__set_range(&c, 60, 10);
	bitmap__set(&c, 199);
	struct bitmap c_short = { c.words, 190 };
	bitmap__andnot(&b, &c_short);
	T_CHECK_EQ(t, bitmap__count(&b), 190);
	T_CHECK(t, !bitmap__test(&b, 60) && !bitmap__test(&b, 69) && bitmap__test(&b, 70));
	T_CHECK(t, bitmap__test(&b, 199)); /* past the shorter map: kept */
	bitmap__andnot(&b, &c);
	T_CHECK(t, !bitmap__test(&b, 199) && bitmap__count(&b) == 189);
	bitmap__free(&b);
	bitmap__free(&c);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_sizes);
	T_RUN(&t, t_numbers);
	T_RUN(&t, t_bitmap);
	return T_DONE(&t);
}
