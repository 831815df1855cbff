/* Test-only fault injection in the outgoing migration (see fault.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/ram.h"
#include "mig/send/fault.h"
#include "state/state.h"

#define FAULT_PAGE 4096u

void mig_fault__free(struct mig_fault *f)
{
	free(f->saved_page);
	free(f->saved);
	free(f->extra_data);
	memset(f, 0, sizeof(*f));
}

#ifndef KMIG_FAULTS

int mig_fault__init(struct mig_fault *f, const char *spec, const struct ram *ram, char *err,
		    size_t errlen)
{
	memset(f, 0, sizeof(*f));
	(void)ram;
	if (!spec || !*spec)
		return 0;
	snprintf(err, errlen, "KMIG_FAULT is set, but this kmig has no fault hooks "
		 "(they are built with make SAN=1)");
	return -EINVAL;
}

#else

static int fault__range(struct mig_fault *f, const char *s, char *err, size_t errlen)
{
	f->lo = 0;
	f->hi = UINT64_MAX;
	if (!*s)
		return 0;
	char *end;
	if (*s != '@')
		goto bad;
	errno = 0;
	f->lo = strtoull(s + 1, &end, 0);
	if (errno || end == s + 1 || *end != '-')
		goto bad;
	const char *h = end + 1;
	f->hi = strtoull(h, &end, 0);
	if (errno || end == h || *end || f->hi <= f->lo)
		goto bad;
	return 0;
bad:
	snprintf(err, errlen, "KMIG_FAULT: bad range \"%s\" (want @LO-HI, LO < HI)", s);
	return -EINVAL;
}

static int fault__alloc(struct mig_fault *f)
{
	f->extra_data = malloc(FAULT_PAGE);
	if (f->kind == MIG_FAULT_STALE_PAGE) {
		f->saved_page = calloc(MIG_FAULT_SAVED, sizeof(*f->saved_page));
		f->saved = malloc((size_t)MIG_FAULT_SAVED * FAULT_PAGE);
		if (!f->saved_page || !f->saved)
			return -ENOMEM;
	}
	return f->extra_data ? 0 : -ENOMEM;
}

int mig_fault__init(struct mig_fault *f, const char *spec, const struct ram *ram, char *err,
		    size_t errlen)
{
	static const struct { const char *name; enum mig_fault_kind kind; } kinds[] = {
		{ "skip-page", MIG_FAULT_SKIP_PAGE },
		{ "stale-page", MIG_FAULT_STALE_PAGE },
		{ "flip-byte", MIG_FAULT_FLIP_BYTE },
	};
	memset(f, 0, sizeof(*f));
	f->ram = ram;
	if (!spec || !*spec)
		return 0;
	if (!strcmp(spec, "no-device-marks")) {
		f->kind = MIG_FAULT_NO_DEVICE_MARKS;
		f->fired = true;         /* acts from the start (the sender's doing) */
		return 0;
	}
	if (!strcmp(spec, "preempt-late")) {
		f->kind = MIG_FAULT_PREEMPT_LATE;
		return 0;
	}
	if (!strcmp(spec, "xbzrle-flip")) {
		f->kind = MIG_FAULT_XBZRLE_FLIP;
		return 0;
	}
	if (!strcmp(spec, "snapshot-unprotected")) {
		f->kind = MIG_FAULT_SNAPSHOT_UNPROTECTED;
		return 0;
	}
	if (!strcmp(spec, "skip-disk-chunk") || !strcmp(spec, "skip-disk-chunk@bulk")) {
		f->kind = MIG_FAULT_SKIP_DISK;
		f->disk_bulk = spec[15] == '@';
		return 0;
	}
	if (!strncmp(spec, "drop-state=", 11)) {
		size_t n = strlen(spec + 11);
		if (!n || n >= sizeof(f->state)) {
			snprintf(err, errlen, "KMIG_FAULT: bad section name in \"%s\"", spec);
			return -EINVAL;
		}
		memcpy(f->state, spec + 11, n + 1);
		f->kind = MIG_FAULT_DROP_STATE;
		return 0;
	}
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		size_t n = strlen(kinds[i].name);
		if (strncmp(spec, kinds[i].name, n))
			continue;
		f->kind = kinds[i].kind;
		int rc = fault__range(f, spec + n, err, errlen);
		if (!rc)
			rc = fault__alloc(f);
		if (rc == -ENOMEM)
			snprintf(err, errlen, "KMIG_FAULT: out of memory");
		if (rc)
			mig_fault__free(f);
		return rc;
	}
	snprintf(err, errlen, "KMIG_FAULT: unknown fault \"%s\" (skip-page, stale-page, "
		 "flip-byte, drop-state=NAME, no-device-marks, skip-disk-chunk[@bulk], "
		 "preempt-late, xbzrle-flip, snapshot-unprotected)", spec);
	return -EINVAL;
}

/* The page's guest-physical address if it lies in the fault's range. */
static bool fault__in_range(const struct mig_fault *f, uint64_t page, uint64_t *gpa)
{
	*gpa = ram__page_gpa(f->ram, page);
	return *gpa != UINT64_MAX && *gpa >= f->lo && *gpa < f->hi;
}

bool mig_fault__skip(struct mig_fault *f, uint64_t page)
{
	uint64_t gpa;
	if (f->kind != MIG_FAULT_SKIP_PAGE || f->fired || !fault__in_range(f, page, &gpa))
		return false;
	f->fired = true;
	log_warn("fault injected: skip-page: page %llu (gpa 0x%llx) left out of the final pass",
		 (unsigned long long)page, (unsigned long long)gpa);
	return true;
}

static bool fault__zero(const uint8_t *p)
{
	for (unsigned i = 0; i < FAULT_PAGE; i++)
		if (p[i])
			return false;
	return true;
}

/* Final pass, stale-page: this page was sent before with other content. */
static void fault__stale(struct mig_fault *f, uint64_t page, uint64_t gpa, const uint8_t *host)
{
	size_t slot = page % MIG_FAULT_SAVED;
	const uint8_t *old = f->saved + slot * FAULT_PAGE;
	if (f->saved_page[slot] != page + 1 || !memcmp(old, host, FAULT_PAGE))
		return;
	memcpy(f->extra_data, old, FAULT_PAGE);
	f->extra = f->fired = true;
	f->extra_page = page;
	log_warn("fault injected: stale-page: page %llu (gpa 0x%llx) sent again as an earlier "
		 "pass sent it", (unsigned long long)page, (unsigned long long)gpa);
}

void mig_fault__sent(struct mig_fault *f, bool final, uint64_t page, const uint8_t *host)
{
	uint64_t gpa;
	if (f->kind == MIG_FAULT_NONE || f->kind == MIG_FAULT_DROP_STATE || f->fired ||
	    !fault__in_range(f, page, &gpa))
		return;
	if (f->kind == MIG_FAULT_STALE_PAGE && !final) {
		size_t slot = page % MIG_FAULT_SAVED;
		f->saved_page[slot] = page + 1;
		memcpy(f->saved + slot * FAULT_PAGE, host, FAULT_PAGE);
	} else if (f->kind == MIG_FAULT_STALE_PAGE) {
		fault__stale(f, page, gpa, host);
	} else if (f->kind == MIG_FAULT_FLIP_BYTE && final && !fault__zero(host)) {
		memcpy(f->extra_data, host, FAULT_PAGE);
		f->extra_data[MIG_FAULT_FLIP_OFFSET] ^= 0x5a;
		f->extra = f->fired = true;
		f->extra_page = page;
		log_warn("fault injected: flip-byte: page %llu (gpa 0x%llx) sent again with byte %u "
			 "flipped", (unsigned long long)page, (unsigned long long)gpa,
			 MIG_FAULT_FLIP_OFFSET);
	}
}

bool mig_fault__drop_state(struct mig_fault *f, uint32_t id, uint32_t instance)
{
	if (f->kind != MIG_FAULT_DROP_STATE || f->fired || strcmp(state__name(id), f->state))
		return false;
	f->fired = true;
	log_warn("fault injected: drop-state: section %s (%u) instance %u not sent", f->state, id,
		 instance);
	return true;
}

bool mig_fault__skip_disk(struct mig_fault *f, bool bulk, bool final)
{
	unsigned n = f->disk_bulk ? MIG_FAULT_BULK_DISK_SKIPS : 1;
	if (f->kind != MIG_FAULT_SKIP_DISK || f->disk_skipped >= n ||
	    (f->disk_bulk ? !bulk : !final))
		return false;
	if (!f->fired)
		log_warn("fault injected: skip-disk-chunk%s: %s not sent",
			 f->disk_bulk ? "@bulk" : "", n > 1 ? "two disk chunks are" : "a disk chunk is");
	f->fired = true;
	f->disk_skipped++;
	return true;
}

bool mig_fault__extra(const struct mig_fault *f, uint64_t *page, const uint8_t **data)
{
	if (!f->extra)
		return false;
	*page = f->extra_page;
	*data = f->extra_data;
	return true;
}

bool mig_fault__preempt_late(struct mig_fault *f, bool any)
{
	if (f->kind != MIG_FAULT_PREEMPT_LATE)
		return false;
	if (any && !f->fired) {
		f->fired = true;
		log_warn("fault injected: preempt-late: the pages asked for reach the preempt "
			 "channel only after END");
	}
	return true;
}

bool mig_fault__xbzrle_flip(struct mig_fault *f, bool final)
{
	if (f->kind != MIG_FAULT_XBZRLE_FLIP || f->fired || !final)
		return false;
	f->fired = true;
	log_warn("fault injected: xbzrle-flip: a delta of the final pass has a byte flipped");
	return true;
}

bool mig_fault__snapshot_unprotected(struct mig_fault *f)
{
	if (f->kind != MIG_FAULT_SNAPSHOT_UNPROTECTED)
		return false;
	if (!f->fired)
		log_warn("fault injected: snapshot-unprotected: guest RAM is released from "
			 "write protection at once");
	f->fired = true;
	return true;
}

void mig_fault__report(const struct mig_fault *f)
{
	static const char *names[] = { "", "skip-page", "stale-page", "flip-byte", "drop-state",
				       "no-device-marks", "skip-disk-chunk", "preempt-late",
				       "xbzrle-flip", "snapshot-unprotected" };
	if (f->kind != MIG_FAULT_NONE && !f->fired)
		log_warn("fault not injected: %s found nothing to act on", names[f->kind]);
}

#endif
