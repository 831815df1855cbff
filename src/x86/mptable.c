/* The MP table (mptable.h), written field by field from the MP
 * Specification 1.4, chapter 4. */
#include "x86/mptable.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#define MP_FLOAT_SIZE 16u
#define MP_HDR_SIZE 44u
#define MP_CPU_SIZE 20u
#define MP_ENTRY_SIZE 8u            /* bus, I/O APIC, I/O and local interrupts */
#define MP_LOCAL_INTS 2u

enum { MP_PROCESSOR = 0, MP_BUS = 1, MP_IOAPIC = 2, MP_IOINT = 3, MP_LOCALINT = 4 };
enum { MP_INT = 0, MP_NMI = 1, MP_EXTINT = 3 };

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)v);
	put16(p + 2, (uint16_t)(v >> 16));
}

static uint8_t mp__checksum(const uint8_t *p, size_t n)
{
	uint8_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum = (uint8_t)(sum + p[i]);
	return (uint8_t)-sum;
}

enum { MP_FLAGS_BUS = 0, MP_FLAGS_LEVEL_HIGH = 0x0d };  /* polarity bits 1:0, trigger 3:2 */

/* Entries after the processors: buses, I/O APIC, I/O and local interrupts
 * (each PCI route takes the place of the ISA IRQ of its pin). */
static unsigned mp__entries(unsigned npci)
{
	return (npci ? 2 : 1) + 1 + MPTABLE_ISA_IRQS + MP_LOCAL_INTS;
}

size_t mptable__size(unsigned ncpus, unsigned npci)
{
	return MP_FLOAT_SIZE + MP_HDR_SIZE + ncpus * MP_CPU_SIZE + mp__entries(npci) * MP_ENTRY_SIZE;
}

static uint8_t *mp__cpu(uint8_t *p, unsigned id)
{
	p[0] = MP_PROCESSOR;
	p[1] = (uint8_t)id;             /* local APIC id */
	p[2] = 0x14;                    /* local APIC version (integrated) */
	p[3] = (uint8_t)(1 | (id == 0 ? 2 : 0)); /* enabled; bootstrap processor */
	put32(p + 4, 0x600);            /* CPU signature: family 6 */
	put32(p + 8, 0x201);            /* features: FPU, APIC */
	return p + MP_CPU_SIZE;
}

static uint8_t *mp__entry(uint8_t *p, uint8_t type, uint8_t kind, uint16_t flags,
			  uint8_t bus, uint8_t bus_irq, uint8_t dst, uint8_t pin)
{
	p[0] = type;
	p[1] = kind;
	put16(p + 2, flags);
	p[4] = bus;                     /* source bus */
	p[5] = bus_irq;
	p[6] = dst;
	p[7] = pin;
	return p + MP_ENTRY_SIZE;
}

static uint8_t *mp__bus(uint8_t *e, uint8_t id, const char type[6])
{
	e[0] = MP_BUS;
	e[1] = id;
	memcpy(e + 2, type, 6);
	return e + MP_ENTRY_SIZE;
}

static int mp__pci_gsi(const struct mptable_pci_irq *pci, unsigned npci, unsigned gsi)
{
	for (unsigned i = 0; i < npci; i++)
		if (pci[i].gsi == gsi)
			return (int)i;
	return -1;
}

/* The I/O interrupt entries: ISA IRQs, or a PCI route where one drives
 * the pin. */
static uint8_t *mp__ioints(uint8_t *e, uint8_t ioapic, const struct mptable_pci_irq *pci,
			   unsigned npci)
{
	uint8_t isa = npci ? 1 : 0;
	for (unsigned irq = 0; irq < MPTABLE_ISA_IRQS; irq++) {
		int r = mp__pci_gsi(pci, npci, irq);
		if (r < 0)
			e = mp__entry(e, MP_IOINT, MP_INT, MP_FLAGS_BUS, isa, (uint8_t)irq, ioapic,
				      (uint8_t)irq);
		else
			e = mp__entry(e, MP_IOINT, MP_INT, MP_FLAGS_LEVEL_HIGH, 0,
				      (uint8_t)(pci[r].slot << 2 | (pci[r].pin - 1)), ioapic,
				      (uint8_t)irq);
	}
	return e;
}

/* The configuration table at p; returns its length. */
static size_t mp__config(uint8_t *p, unsigned ncpus, const struct mptable_pci_irq *pci,
			 unsigned npci)
{
	uint8_t *e = p + MP_HDR_SIZE, ioapic = (uint8_t)ncpus;
	for (unsigned i = 0; i < ncpus; i++)
		e = mp__cpu(e, i);
	if (npci)
		e = mp__bus(e, 0, "PCI   ");
	e = mp__bus(e, npci ? 1 : 0, "ISA   ");
	e[0] = MP_IOAPIC;
	e[1] = ioapic;
	e[2] = 0x11;                    /* I/O APIC version */
	e[3] = 1;                       /* usable */
	put32(e + 4, MPTABLE_IOAPIC_GPA);
	e += MP_ENTRY_SIZE;
	e = mp__ioints(e, ioapic, pci, npci);
	uint8_t isa = npci ? 1 : 0;     /* local interrupts come from the ISA bus */
	e = mp__entry(e, MP_LOCALINT, MP_EXTINT, MP_FLAGS_BUS, isa, 0, 0xff, 0); /* every LINT0 */
	e = mp__entry(e, MP_LOCALINT, MP_NMI, MP_FLAGS_BUS, isa, 0, 0xff, 1);    /* and LINT1 */
	size_t len = (size_t)(e - p);
	memcpy(p, "PCMP", 4);
	put16(p + 4, (uint16_t)len);
	p[6] = 4;                       /* specification 1.4 */
	memcpy(p + 8, "KMIG    ", 8);   /* OEM id */
	memcpy(p + 16, "KMIG-VM     ", 12); /* product id */
	put16(p + 34, (uint16_t)(ncpus + mp__entries(npci)));
	put32(p + 36, MPTABLE_LAPIC_GPA);
	p[7] = mp__checksum(p, len);
	return len;
}

static bool mp__routes_ok(const struct mptable_pci_irq *pci, unsigned npci)
{
	if (npci > MPTABLE_MAX_PCI_IRQS || (npci && !pci))
		return false;
	for (unsigned i = 0; i < npci; i++)
		if (pci[i].slot > 31 || pci[i].pin < 1 || pci[i].pin > 4 ||
		    pci[i].gsi >= MPTABLE_ISA_IRQS || mp__pci_gsi(pci, i, pci[i].gsi) >= 0)
			return false;
	return true;
}

long mptable__build(uint8_t *buf, size_t cap, uint32_t gpa, unsigned ncpus,
		    const struct mptable_pci_irq *pci, unsigned npci)
{
	if (ncpus < 1 || ncpus > MPTABLE_MAX_CPUS || gpa % 16 || !mp__routes_ok(pci, npci))
		return -EINVAL;
	size_t size = mptable__size(ncpus, npci);
	if (cap < size)
		return -ENOSPC;
	memset(buf, 0, size);
	memcpy(buf, "_MP_", 4);
	put32(buf + 4, gpa + MP_FLOAT_SIZE);   /* the configuration table */
	buf[8] = 1;                            /* length in 16-byte units */
	buf[9] = 4;                            /* specification 1.4 */
	buf[10] = mp__checksum(buf, MP_FLOAT_SIZE);
	mp__config(buf + MP_FLOAT_SIZE, ncpus, pci, npci);
	return (long)size;
}
