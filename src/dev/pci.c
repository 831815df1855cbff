#include "dev/pci.h"

#include <errno.h>
#include <string.h>

#define PCI_CONF_ENABLE 0x80000000u

static void pci__put(uint8_t *p, uint64_t v, unsigned len)
{
	for (unsigned i = 0; i < len; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t pci__get(const uint8_t *p, unsigned len)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < len; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

void pci_dev__init(struct pci_dev *d, uint16_t vendor, uint16_t device, uint8_t revision,
		   uint32_t class_code, uint16_t subsys_vendor, uint16_t subsys_id,
		   uint8_t irq_line)
{
	memset(d, 0, sizeof(*d));
	pci__put(&d->cfg[PCI_VENDOR_ID], vendor, 2);
	pci__put(&d->cfg[PCI_DEVICE_ID], device, 2);
	d->cfg[PCI_REVISION] = revision;
	pci__put(&d->cfg[PCI_CLASS_PROG], class_code, 3);
	pci__put(&d->cfg[PCI_SUBSYS_VENDOR], subsys_vendor, 2);
	pci__put(&d->cfg[PCI_SUBSYS_ID], subsys_id, 2);
	pci__put(&d->wmask[PCI_COMMAND], PCI_COMMAND_IO | PCI_COMMAND_MEMORY |
		 PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE, 2);
	d->wmask[0x0c] = 0xff; /* cache line size */
	d->wmask[0x0d] = 0xff; /* latency timer */
	d->wmask[PCI_INT_LINE] = 0xff;
	d->cfg[PCI_INT_LINE] = irq_line;
	d->cfg[PCI_INT_PIN] = irq_line ? 1 : 0; /* INTA */
}

int pci_dev__set_bar64(struct pci_dev *d, unsigned bar, uint64_t size, uint64_t gpa)
{
	if (bar + 1 >= PCI_NUM_BARS || size < 16 || (size & (size - 1)) || (gpa & (size - 1)))
		return -EINVAL;
	unsigned off = PCI_BAR0 + 4 * bar;
	d->bar_size[bar] = size;
	pci__put(&d->cfg[off], (gpa & 0xfffffff0u) | PCI_BAR_MEM_64, 4);
	pci__put(&d->cfg[off + 4], gpa >> 32, 4);
	pci__put(&d->wmask[off], ~(size - 1) & 0xfffffff0u, 4);
	pci__put(&d->wmask[off + 4], ~(size - 1) >> 32, 4);
	return 0;
}

uint64_t pci_dev__bar_addr(const struct pci_dev *d, unsigned bar)
{
	if (bar + 1 >= PCI_NUM_BARS || !d->bar_size[bar])
		return 0;
	unsigned off = PCI_BAR0 + 4 * bar;
	return (pci__get(&d->cfg[off], 4) & ~0xfull) | pci__get(&d->cfg[off + 4], 4) << 32;
}

uint64_t pci_dev__bar_decode(const struct pci_dev *d, unsigned bar)
{
	return (d->cfg[PCI_COMMAND] & PCI_COMMAND_MEMORY) ? pci_dev__bar_addr(d, bar) : 0;
}

int pci_dev__add_cap(struct pci_dev *d, uint8_t off, const void *data, uint8_t len)
{
	if (off < 0x40 || (off & 3) || len < 2 || off + len > PCI_CFG_SIZE)
		return -EINVAL;
	memcpy(&d->cfg[off], data, len);
	d->cfg[off + 1] = 0;
	if (!d->cfg[PCI_CAP_PTR]) {
		d->cfg[PCI_CAP_PTR] = off;
	} else {
		unsigned p = d->cfg[PCI_CAP_PTR];
		for (unsigned hops = 0; d->cfg[p + 1] && hops < 64; hops++)
			p = d->cfg[p + 1];
		d->cfg[p + 1] = off;
	}
	d->cfg[PCI_STATUS] |= PCI_STATUS_CAP_LIST;
	return 0;
}

void pci_dev__cfg_read(const struct pci_dev *d, unsigned off, void *data, unsigned len)
{
	if (off >= PCI_CFG_SIZE || len > PCI_CFG_SIZE - off) {
		memset(data, 0xff, len);
		return;
	}
	memcpy(data, &d->cfg[off], len);
}

void pci_dev__cfg_write(struct pci_dev *d, unsigned off, const void *data, unsigned len)
{
	if (off >= PCI_CFG_SIZE || len > PCI_CFG_SIZE - off)
		return;
	const uint8_t *src = data;
	for (unsigned i = 0; i < len; i++) {
		uint8_t m = d->wmask[off + i];
		d->cfg[off + i] = (uint8_t)((d->cfg[off + i] & ~m) | (src[i] & m));
	}
}

void pci__init(struct pci_bus *bus)
{
	memset(bus, 0, sizeof(*bus));
	pthread_mutex_init(&bus->lock, NULL);
	pci_dev__init(&bus->host_bridge, 0x8086, 0x1237, 2, 0x060000, 0, 0, 0);
	bus->slots[0] = &bus->host_bridge;
}

void pci__destroy(struct pci_bus *bus)
{
	pthread_mutex_destroy(&bus->lock);
}

int pci__add(struct pci_bus *bus, unsigned slot, struct pci_dev *d)
{
	if (slot == 0 || slot >= PCI_MAX_SLOTS || !d)
		return -EINVAL;
	pthread_mutex_lock(&bus->lock);
	int rc = bus->slots[slot] ? -EBUSY : 0;
	if (!rc)
		bus->slots[slot] = d;
	pthread_mutex_unlock(&bus->lock);
	return rc;
}

/* A guest's configuration write, then bar_moved for each BAR that now
 * decodes elsewhere; bus lock held. */
static void pci__guest_cfg_write(struct pci_dev *d, unsigned off, const void *data, unsigned size)
{
	uint64_t before[PCI_NUM_BARS];
	for (unsigned b = 0; b < PCI_NUM_BARS; b++)
		before[b] = pci_dev__bar_decode(d, b);
	pci_dev__cfg_write(d, off, data, size);
	if (!d->ops || !d->ops->bar_moved)
		return;
	for (unsigned b = 0; b < PCI_NUM_BARS; b++) {
		uint64_t now = pci_dev__bar_decode(d, b);
		if (d->bar_size[b] && now != before[b])
			d->ops->bar_moved(d->ctx, b, now);
	}
}

/* The function the address register selects, or NULL; bus lock held. */
static struct pci_dev *pci__selected(struct pci_bus *bus)
{
	uint32_t a = bus->conf_addr;
	if (!(a & PCI_CONF_ENABLE) || ((a >> 16) & 0xff) != 0 || ((a >> 8) & 7) != 0)
		return NULL;
	return bus->slots[(a >> 11) & 0x1f];
}

void pci__pio(struct pci_bus *bus, uint16_t port, bool is_write, void *data, unsigned size)
{
	pthread_mutex_lock(&bus->lock);
	if (port == PCI_CONF_ADDR && size == 4) {
		if (is_write)
			bus->conf_addr = (uint32_t)pci__get(data, 4) & ~3u;
		else
			pci__put(data, bus->conf_addr, 4);
	} else if (port >= PCI_CONF_DATA && port < PCI_CONF_ADDR + PCI_CONF_NPORTS &&
		   (size == 1 || size == 2 || size == 4)) {
		unsigned off = (bus->conf_addr & 0xfc) + (port - PCI_CONF_DATA);
		struct pci_dev *d = pci__selected(bus);
		if (!d || off + size > PCI_CFG_SIZE) {
			if (!is_write)
				memset(data, 0xff, size);
		} else if (is_write) {
			pci__guest_cfg_write(d, off, data, size);
		} else {
			pci_dev__cfg_read(d, off, data, size);
		}
	} else if (!is_write) {
		memset(data, 0xff, size);
	}
	pthread_mutex_unlock(&bus->lock);
}

bool pci__mmio(struct pci_bus *bus, uint64_t gpa, bool is_write, void *data, unsigned len)
{
	struct pci_dev *hit = NULL;
	unsigned hit_bar = 0;
	uint64_t off = 0;
	pthread_mutex_lock(&bus->lock);
	for (unsigned s = 1; s < PCI_MAX_SLOTS && !hit; s++) {
		struct pci_dev *d = bus->slots[s];
		if (!d || !(d->cfg[PCI_COMMAND] & PCI_COMMAND_MEMORY))
			continue;
		for (unsigned b = 0; b < PCI_NUM_BARS; b++) {
			uint64_t base = pci_dev__bar_addr(d, b), size = d->bar_size[b];
			if (!base || gpa < base || gpa - base >= size || len > size - (gpa - base))
				continue;
			hit = d;
			hit_bar = b;
			off = gpa - base;
			break;
		}
	}
	pthread_mutex_unlock(&bus->lock);
	if (!hit || !hit->ops)
		return false;
	if (is_write)
		hit->ops->bar_write(hit->ctx, hit_bar, off, data, len);
	else
		hit->ops->bar_read(hit->ctx, hit_bar, off, data, len);
	return true;
}
