/* PCI bus 0 behind a host bridge, reached through configuration
 * mechanism #1: the guest writes an address to port 0xCF8 (bit 31 enable,
 * bus 23:16, device 15:11, function 10:8, register 7:2) and reads or
 * writes 1, 2 or 4 bytes at 0xCFC..0xCFF.  Only bus 0, function 0 exist.
 * Slot 0 is an i440FX-like host bridge (8086:1237, class 0x0600).
 *
 * A device is a 256-byte configuration space with a write mask per byte
 * (read-only bytes keep their value), up to six BARs, and callbacks for
 * accesses to its memory BARs.  BAR sizing works as on hardware: writing
 * ~0 and reading back gives ~(size - 1) | type bits.  A memory BAR
 * decodes only while the command register's memory-space bit is set and
 * its address is non-zero; the guest may move a BAR at any time.
 *
 * Threads: pci__pio and pci__mmio come from vCPU threads (any number at
 * once); the bus lock serialises configuration accesses.  BAR callbacks
 * run without the bus lock: a device has its own.  pci__add only during
 * start-up; pci__save_dev / pci__load_dev with the vCPUs paused. */
#ifndef KMIG_DEV_PCI_H
#define KMIG_DEV_PCI_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

#define PCI_CONF_ADDR 0xcf8
#define PCI_CONF_DATA 0xcfc
#define PCI_CONF_NPORTS 8          /* 0xCF8..0xCFF */
#define PCI_CFG_SIZE 256
#define PCI_MAX_SLOTS 32
#define PCI_NUM_BARS 6

/* configuration space offsets and bits */
#define PCI_VENDOR_ID 0x00
#define PCI_DEVICE_ID 0x02
#define PCI_COMMAND 0x04
#define PCI_STATUS 0x06
#define PCI_REVISION 0x08
#define PCI_CLASS_PROG 0x09
#define PCI_HEADER_TYPE 0x0e
#define PCI_BAR0 0x10
#define PCI_SUBSYS_VENDOR 0x2c
#define PCI_SUBSYS_ID 0x2e
#define PCI_CAP_PTR 0x34
#define PCI_INT_LINE 0x3c
#define PCI_INT_PIN 0x3d
#define PCI_COMMAND_IO 0x1
#define PCI_COMMAND_MEMORY 0x2
#define PCI_COMMAND_MASTER 0x4
#define PCI_COMMAND_INTX_DISABLE 0x400
#define PCI_STATUS_CAP_LIST 0x10
#define PCI_BAR_MEM_64 0x4

struct pci_dev_ops {
	/* An access of len (1, 2, 4 or 8) bytes at offset off inside BAR bar
	 * (off + len <= the BAR's size).  data is little-endian. */
	void (*bar_read)(void *ctx, unsigned bar, uint64_t off, void *data, unsigned len);
	void (*bar_write)(void *ctx, unsigned bar, uint64_t off, const void *data, unsigned len);
	/* May be NULL.  A configuration write through 0xCF8/0xCFC changed
	 * where memory BAR bar decodes: gpa, or 0 when it no longer decodes
	 * (memory space off, or address 0).  Runs with the bus lock held. */
	void (*bar_moved)(void *ctx, unsigned bar, uint64_t gpa);
};

struct pci_dev {
	uint8_t cfg[PCI_CFG_SIZE];
	uint8_t wmask[PCI_CFG_SIZE];     /* bits the guest may change */
	uint64_t bar_size[PCI_NUM_BARS]; /* 0: BAR unused; memory BARs only */
	const struct pci_dev_ops *ops;
	void *ctx;
};

struct pci_bus {
	pthread_mutex_t lock;
	uint32_t conf_addr;              /* last value written to 0xCF8 */
	struct pci_dev host_bridge;
	struct pci_dev *slots[PCI_MAX_SLOTS];
};

/* Sets up bus 0 with the host bridge in slot 0. */
void pci__init(struct pci_bus *bus);
void pci__destroy(struct pci_bus *bus);

/* Fills the header of a type-0 function (ids, class, revision, command
 * bits the guest may change, interrupt pin INTA and line irq_line). */
void pci_dev__init(struct pci_dev *d, uint16_t vendor, uint16_t device, uint8_t revision,
		   uint32_t class_code, uint16_t subsys_vendor, uint16_t subsys_id,
		   uint8_t irq_line);
/* Declares a 64-bit memory BAR bar (and bar + 1 as its upper half) of
 * size bytes (a power of two >= 16) at gpa (0: unassigned).  -EINVAL. */
int pci_dev__set_bar64(struct pci_dev *d, unsigned bar, uint64_t size, uint64_t gpa) KMIG_MUST_CHECK;
/* Current guest-physical address of a memory BAR (0 if unassigned). */
uint64_t pci_dev__bar_addr(const struct pci_dev *d, unsigned bar);
/* Where the BAR decodes now: its address while memory space is on, else 0. */
uint64_t pci_dev__bar_decode(const struct pci_dev *d, unsigned bar);
/* Appends a capability of len bytes (data[0] = id; data[1] is filled
 * with the next pointer) at offset off, linking it into the list.  The
 * caller picks non-overlapping offsets >= 0x40, 4-byte aligned. */
int pci_dev__add_cap(struct pci_dev *d, uint8_t off, const void *data, uint8_t len) KMIG_MUST_CHECK;

/* Plugs d into slot (1..31).  -EBUSY / -EINVAL. */
int pci__add(struct pci_bus *bus, unsigned slot, struct pci_dev *d) KMIG_MUST_CHECK;

/* Port I/O in 0xCF8..0xCFF; reads of anything absent give all ones. */
void pci__pio(struct pci_bus *bus, uint16_t port, bool is_write, void *data, unsigned size);
/* MMIO: returns true if a device's BAR decodes [gpa, gpa + len). */
bool pci__mmio(struct pci_bus *bus, uint64_t gpa, bool is_write, void *data, unsigned len);

/* Raw configuration space access (tests, save/restore); off + len <= 256. */
void pci_dev__cfg_read(const struct pci_dev *d, unsigned off, void *data, unsigned len);
void pci_dev__cfg_write(struct pci_dev *d, unsigned off, const void *data, unsigned len);

#endif
