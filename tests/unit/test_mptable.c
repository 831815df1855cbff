/* The MP table (x86/mptable.h): checksums, layout and every entry, read
 * back as a guest's parser reads them (MP Specification 1.4, chapter 4). */
#include <errno.h>
#include <string.h>

#include "harness.h"
#include "x86/mptable.h"

static unsigned get(const uint8_t *p, unsigned n)
{
	unsigned v = 0;
	for (unsigned i = n; i-- > 0;)
		v = (v << 8) | p[i];
	return v;
}

static uint8_t sum(const uint8_t *p, size_t n)
{
	uint8_t s = 0;
	for (size_t i = 0; i < n; i++)
		s = (uint8_t)(s + p[i]);
	return s;
}

static void t_layout(struct t *t)
{
	static uint8_t b[4096];
	for (unsigned n = 1; n <= MPTABLE_MAX_CPUS; n += 63) {
		long len = mptable__build(b, sizeof(b), MPTABLE_GPA, n);
		T_CHECK_EQ(t, len, (long)mptable__size(n));
		/* floating pointer: signature, table address, length, checksum */
		T_CHECK(t, !memcmp(b, "_MP_", 4) && get(b + 4, 4) == MPTABLE_GPA + 16);
		T_CHECK(t, b[8] == 1 && b[9] == 4 && b[11] == 0 && sum(b, 16) == 0);
		const uint8_t *c = b + 16;
		unsigned clen = get(c + 4, 2), count = get(c + 34, 2);
		T_CHECK(t, !memcmp(c, "PCMP", 4) && c[6] == 4 && sum(c, clen) == 0);
		T_CHECK(t, 16 + clen == (unsigned)len && get(c + 36, 4) == MPTABLE_LAPIC_GPA);
		T_CHECK_EQ(t, count, n + 2 + MPTABLE_ISA_IRQS + 2);
		/* walk the entries as a parser does */
		unsigned cpus = 0, bsp = 0, buses = 0, ioapics = 0, ioints = 0, lints = 0;
		const uint8_t *e = c + 44;
		for (unsigned i = 0; i < count && e < c + clen; i++) {
			switch (e[0]) {
			case 0:
				T_CHECK(t, e[1] == cpus && (e[3] & 1));
				bsp += (e[3] & 2) != 0;
				cpus++;
				e += 20;
				break;
			case 1:
				T_CHECK(t, !memcmp(e + 2, "ISA   ", 6));
				buses++;
				e += 8;
				break;
			case 2:
				T_CHECK(t, e[1] == n && (e[3] & 1) && get(e + 4, 4) == MPTABLE_IOAPIC_GPA);
				ioapics++;
				e += 8;
				break;
			case 3:
				T_CHECK(t, e[1] == 0 && e[5] == ioints && e[6] == n && e[7] == ioints);
				ioints++;
				e += 8;
				break;
			case 4:
				T_CHECK(t, e[6] == 0xff && e[7] == lints && e[1] == (lints ? 1 : 3));
				lints++;
				e += 8;
				break;
			default:
				T_CHECK(t, 0);
				e = c + clen;
			}
		}
		T_CHECK(t, e == c + clen);
		T_CHECK(t, cpus == n && bsp == 1 && buses == 1 && ioapics == 1 &&
			   ioints == MPTABLE_ISA_IRQS && lints == 2);
	}
}

static void t_refusals(struct t *t)
{
	uint8_t b[1024];
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 0), -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, MPTABLE_MAX_CPUS + 1), -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA + 8, 1), -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, mptable__size(2) - 1, MPTABLE_GPA, 2), -ENOSPC);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_layout);
	T_RUN(&t, t_refusals);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
