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
		long len = mptable__build(b, sizeof(b), MPTABLE_GPA, n, NULL, 0);
		T_CHECK_EQ(t, len, (long)mptable__size(n, 0));
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
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 0, NULL, 0), -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, MPTABLE_MAX_CPUS + 1, NULL, 0),
		   -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA + 8, 1, NULL, 0), -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, mptable__size(2, 0) - 1, MPTABLE_GPA, 2, NULL, 0), -ENOSPC);
	T_CHECK_EQ(t, mptable__build(b, mptable__size(2, 1) - 1, MPTABLE_GPA, 2,
				     &(struct mptable_pci_irq){ 3, 1, 10 }, 1), -ENOSPC);
	/* bad routes: pin 0 and 5, slot 32, a GSI past the ISA pins, two on one
	 * pin, too many, none given */
	const struct mptable_pci_irq bad[][2] = {
		{ { 3, 0, 10 } }, { { 3, 5, 10 } }, { { 32, 1, 10 } }, { { 3, 1, 16 } },
		{ { 3, 1, 10 }, { 4, 1, 10 } },
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 1, bad[i], bad[i][1].pin ? 2 : 1),
			   -EINVAL);
	struct mptable_pci_irq many[MPTABLE_MAX_PCI_IRQS + 1];
	for (unsigned i = 0; i <= MPTABLE_MAX_PCI_IRQS; i++)
		many[i] = (struct mptable_pci_irq){ (uint8_t)(i + 1), 1, (uint8_t)(i + 3) };
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 1, many, MPTABLE_MAX_PCI_IRQS),
		   (long)mptable__size(1, MPTABLE_MAX_PCI_IRQS));
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 1, many, MPTABLE_MAX_PCI_IRQS + 1),
		   -EINVAL);
	T_CHECK_EQ(t, mptable__build(b, sizeof(b), MPTABLE_GPA, 1, NULL, 1), -EINVAL);
}

/* A PCI route (the balloon: slot 3, INTA, GSI 10): bus 0 is PCI, bus 1
 * ISA; pin 10's entry comes from PCI bus 0, device 3 pin A, level and
 * active high; every other pin is its ISA IRQ on bus 1. */
static void t_pci(struct t *t)
{
	static uint8_t b[4096];
	const struct mptable_pci_irq r[2] = { { 3, 1, 10 }, { 5, 2, 11 } };
	for (unsigned npci = 1; npci <= 2; npci++) {
		long len = mptable__build(b, sizeof(b), MPTABLE_GPA, 2, r, npci);
		T_CHECK_EQ(t, len, (long)mptable__size(2, npci));
		const uint8_t *c = b + 16;
		unsigned clen = get(c + 4, 2), count = get(c + 34, 2);
		T_CHECK(t, sum(c, clen) == 0 && 16 + clen == (unsigned)len);
		T_CHECK_EQ(t, count, 2 + 2 + 1 + MPTABLE_ISA_IRQS + 2);
		const uint8_t *e = c + 44 + 2 * 20;
		T_CHECK(t, e[0] == 1 && e[1] == 0 && !memcmp(e + 2, "PCI   ", 6));
		T_CHECK(t, e[8] == 1 && e[9] == 1 && !memcmp(e + 10, "ISA   ", 6));
		T_CHECK(t, e[16] == 2 && e[17] == 2);
		e += 24;
		for (unsigned pin = 0; pin < MPTABLE_ISA_IRQS; pin++, e += 8) {
			T_CHECK(t, e[0] == 3 && e[1] == 0 && e[6] == 2 && e[7] == pin);
			unsigned k = pin == 10 ? 0 : pin == 11 && npci == 2 ? 1 : 2;
			if (k < 2)      /* bus 0, device << 2 | pin - 1, level, high */
				T_CHECK(t, e[4] == 0 && e[5] == (r[k].slot << 2 | (r[k].pin - 1)) &&
					   get(e + 2, 2) == 0x0d);
			else
				T_CHECK(t, e[4] == 1 && e[5] == pin && get(e + 2, 2) == 0);
		}
		/* LINT0 and LINT1 come from the ISA bus (1) */
		T_CHECK(t, e[0] == 4 && e[8] == 4 && e[4] == 1 && e[12] == 1 && e + 16 == c + clen);
	}
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_layout);
	T_RUN(&t, t_refusals);
	T_RUN(&t, t_pci);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
