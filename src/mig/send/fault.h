/* Test-only fault injection in the outgoing migration: the negative
 * controls that show kmig's checks can fail (docs/testing.md, "Negative
 * controls").
 *
 * Compiled in only with -DKMIG_FAULTS (`make SAN=1`, build-san/); in any
 * other build every hook is a constant "no fault" and a KMIG_FAULT in the
 * environment is refused at migrate time with a clear error, so a test
 * run against the wrong build fails instead of passing unharmed.
 *
 * The source reads KMIG_FAULT when a migration starts:
 *   skip-page[@LO-HI]   the final pass (guest stopped) does not send the
 *                       first dirty page in [LO, HI) (guest-physical);
 *                       in post-copy the push leaves it out, and it is
 *                       never sent even when the destination asks
 *   stale-page[@LO-HI]  the final pass sends, for one dirty page in range,
 *                       the copy the source sent in an earlier pass
 *                       (only a page whose content changed since)
 *   flip-byte[@LO-HI]   after the final pass, the first non-zero page in
 *                       range that it sent is sent again with byte 100
 *                       flipped
 *   drop-state=NAME     the first STATE section named NAME (state__name,
 *                       e.g. lapic) is not sent
 *   skip-disk-chunk     x-block-migration: the final pass (guest stopped)
 *                       does not send the first disk chunk the guest wrote
 *                       since the previous pass that holds data (one it
 *                       zeroed may read as zero at the destination too)
 *   skip-disk-chunk@bulk  the same for the bulk pass's first two chunks
 *                       with data (a chunk the guest does not write again
 *                       is then never sent).  Two: a guest stopped with
 *                       its 16 requests in flight may have read every
 *                       block of one chunk already, and writes them anew
 *                       at the destination without reading the hole
 *   no-device-marks     for the whole migration, the devices' own writes
 *                       into guest RAM (virtio-net's received frames and
 *                       used rings, the balloon's) are not reported to the
 *                       dirty tracker (vm->device_marks_off)
 *   preempt-late        post-copy with postcopy-preempt: the pages asked for
 *                       stay in the preempt channel's buffer until END has
 *                       gone on the main stream and 500 ms more, as a
 *                       network that delays that connection would bring
 *                       them (the destination must wait for them)
 *   xbzrle-flip         xbzrle: the final pass (guest stopped) sends the
 *                       first page it sends as a delta with the delta's
 *                       last byte (one it writes) flipped; the source's
 *                       cache keeps the right copy
 *   snapshot-unprotected  background-snapshot: all of RAM is released
 *                       from write protection as soon as it is protected,
 *                       so each page goes as it is when the scan reads it
 *                       (a dump read while the guest runs), not as it was
 *                       when the snapshot began
 * LO and HI are hexadecimal (0x...) or decimal; no range means all RAM.
 * Each fault fires once per migration and says so on stderr
 * ("kmig: fault injected: ...").  The stale and flipped copies travel as
 * one extra PAGES record on the main stream after the final pass (and its
 * SYNC with multifd), so they land last on every transport. */
#ifndef KMIG_MIG_FAULT_H
#define KMIG_MIG_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

struct ram;

enum mig_fault_kind {
	MIG_FAULT_NONE = 0,
	MIG_FAULT_SKIP_PAGE,
	MIG_FAULT_STALE_PAGE,
	MIG_FAULT_FLIP_BYTE,
	MIG_FAULT_DROP_STATE,
	MIG_FAULT_NO_DEVICE_MARKS,
	MIG_FAULT_SKIP_DISK,
	MIG_FAULT_PREEMPT_LATE,
	MIG_FAULT_XBZRLE_FLIP,
	MIG_FAULT_SNAPSHOT_UNPROTECTED,
};

#define MIG_FAULT_SAVED 1024       /* stale-page: pages remembered (direct mapped) */
#define MIG_FAULT_FLIP_OFFSET 100  /* flip-byte: the byte flipped */
#define MIG_FAULT_BULK_DISK_SKIPS 2 /* skip-disk-chunk@bulk: data chunks left out */

struct mig_fault {
	enum mig_fault_kind kind;
	const struct ram *ram;
	uint64_t lo, hi;            /* guest-physical range [lo, hi) */
	char state[32];             /* drop-state: the section's name */
	bool disk_bulk;             /* skip-disk-chunk@bulk */
	unsigned disk_skipped;      /* chunks left out so far */
	bool fired;
	/* stale-page: copies of pages as sent in earlier passes */
	uint64_t *saved_page;       /* page + 1 per slot, 0 = empty */
	uint8_t *saved;             /* MIG_FAULT_SAVED pages */
	/* stale-page, flip-byte: the page to send again after the final pass */
	bool extra;
	uint64_t extra_page;
	uint8_t *extra_data;        /* one page */
};

/* Parses spec (NULL or "" = no fault) into f, for pages of ram (VM-wide
 * page numbers).  0, or -EINVAL with a reason in err (also when the build
 * has no fault hooks), or -ENOMEM. */
int mig_fault__init(struct mig_fault *f, const char *spec, const struct ram *ram, char *err,
		    size_t errlen) KMIG_MUST_CHECK;
void mig_fault__free(struct mig_fault *f);

#ifdef KMIG_FAULTS
/* Final pass: whether to leave out this page instead of sending it. */
bool mig_fault__skip(struct mig_fault *f, uint64_t page);
/* Every page the sender queues: remembers copies before the final pass;
 * in the final pass picks the page to send again (stale or flipped). */
void mig_fault__sent(struct mig_fault *f, bool final, uint64_t page, const uint8_t *host);
/* A disk chunk about to be sent, in the bulk pass or (final) with the
 * guest stopped: whether to leave it out. */
bool mig_fault__skip_disk(struct mig_fault *f, bool bulk, bool final);
/* Whether to leave out this STATE section. */
bool mig_fault__drop_state(struct mig_fault *f, uint32_t id, uint32_t instance);
/* After the final pass: whether a page must be sent again, and its data. */
bool mig_fault__extra(const struct mig_fault *f, uint64_t *page, const uint8_t **data);
/* After the final pass: if the fault found nothing to act on, says so. */
void mig_fault__report(const struct mig_fault *f);
/* preempt-late: whether the preempt channel holds its pages back (notes
 * that it acted when any were). */
bool mig_fault__preempt_late(struct mig_fault *f, bool any);
/* xbzrle-flip: whether to flip the last byte of this delta (final: the
 * guest is stopped). */
bool mig_fault__xbzrle_flip(struct mig_fault *f, bool final);
/* snapshot-unprotected: whether to lift all protection at once. */
bool mig_fault__snapshot_unprotected(struct mig_fault *f);
#else
static inline bool mig_fault__snapshot_unprotected(struct mig_fault *f)
{
	(void)f;
	return false;
}
static inline bool mig_fault__xbzrle_flip(struct mig_fault *f, bool final)
{
	(void)f; (void)final;
	return false;
}
static inline bool mig_fault__preempt_late(struct mig_fault *f, bool any)
{
	(void)f; (void)any;
	return false;
}
static inline bool mig_fault__skip(struct mig_fault *f, uint64_t page)
{
	(void)f; (void)page;
	return false;
}
static inline void mig_fault__sent(struct mig_fault *f, bool final, uint64_t page,
				   const uint8_t *host)
{
	(void)f; (void)final; (void)page; (void)host;
}
static inline bool mig_fault__skip_disk(struct mig_fault *f, bool bulk, bool final)
{
	(void)f; (void)bulk; (void)final;
	return false;
}
static inline bool mig_fault__drop_state(struct mig_fault *f, uint32_t id, uint32_t instance)
{
	(void)f; (void)id; (void)instance;
	return false;
}
static inline bool mig_fault__extra(const struct mig_fault *f, uint64_t *page,
				    const uint8_t **data)
{
	(void)f; (void)page; (void)data;
	return false;
}
static inline void mig_fault__report(const struct mig_fault *f)
{
	(void)f;
}
#endif

#endif
