/*
 * A simple page allocator over the usable RAM the workload did not take:
 * the free memory is a sorted array of disjoint, non-adjacent extents
 * [base, end), so it can be handed out in large blocks (the balloon
 * driver's free page hints) as cheaply as in pages.  Allocation takes the
 * lowest free memory; freeing merges with the neighbouring extents.
 *
 * For free page reporting the allocator also remembers which 2 MiB chunks
 * have been reported to the device and not allocated since (a bitmap over
 * the 64 GiB identity map): allocating any page of a chunk clears its bit.
 * One CPU only (no locking).
 */
#include "guest.h"

#define MAX_EXTENTS 4096
#define CHUNK_SHIFT 21
#define CHUNKS ((64ULL << 30) >> CHUNK_SHIFT)

static struct range ext[MAX_EXTENTS];
static int next, inited;
static u64 nfree;			/* free pages */
static u64 reported[CHUNKS / 64];	/* 2 MiB chunks reported and untouched since */
static u64 hinted[CHUNKS / 64];		/* 2 MiB chunks wholly hinted at least once */

static inline void unreport(u64 base, u64 end)
{
	for (u64 c = base >> CHUNK_SHIFT; c < CHUNKS && (c << CHUNK_SHIFT) < end; c++)
		reported[c / 64] &= ~(1ULL << (c % 64));
}

void palloc_init(void)
{
	if (inited)
		return;
	inited = 1;
	next = take_rest(ext, MAX_EXTENTS);
	nfree = 0;
	for (int i = 0; i < next; i++)
		nfree += (ext[i].end - ext[i].base) / PAGE_SIZE;
}

static void remove_ext(int i)
{
	memmove(&ext[i], &ext[i + 1], (size_t)(next - i - 1) * sizeof(ext[0]));
	next--;
}

/* Takes up to max bytes (a multiple of 4 KiB) of contiguous memory from the
 * lowest extent; returns the base (0 when empty) and the length in *len. */
u64 palloc_alloc_block(u64 max, u64 *len)
{
	if (!next || max < PAGE_SIZE) {
		*len = 0;
		return 0;
	}
	u64 b = ext[0].base, n = ext[0].end - b;
	if (n > max)
		n = max & ~(PAGE_SIZE - 1);
	ext[0].base += n;
	if (ext[0].base >= ext[0].end)
		remove_ext(0);
	nfree -= n / PAGE_SIZE;
	unreport(b, b + n);
	*len = n;
	return b;
}

u64 palloc_alloc(void)
{
	u64 len;
	return palloc_alloc_block(PAGE_SIZE, &len);
}

/* First extent whose end is >= addr (binary search). */
static int find_ext(u64 addr)
{
	int lo = 0, hi = next;
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (ext[mid].end < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void palloc_free_range(u64 b, u64 len)
{
	u64 e = b + len;
	if (!len)
		return;
	int i = find_ext(b);
	if (i < next && ext[i].base < e && b < ext[i].end)
		return;		/* overlaps free memory: a double free, ignored */
	if (i < next && ext[i].end == b) {
		if (i + 1 < next && ext[i + 1].base < e)
			return;	/* overlaps the next extent */
		ext[i].end = e;
		if (i + 1 < next && ext[i + 1].base == e) {
			ext[i].end = ext[i + 1].end;
			remove_ext(i + 1);
		}
	} else if (i < next && ext[i].base == e) {
		ext[i].base = b;
	} else {
		if (next == MAX_EXTENTS)
			return;	/* table full: the memory is leaked */
		memmove(&ext[i + 1], &ext[i], (size_t)(next - i) * sizeof(ext[0]));
		ext[i].base = b;
		ext[i].end = e;
		next++;
	}
	nfree += len / PAGE_SIZE;
}

void palloc_free(u64 page)
{
	palloc_free_range(page, PAGE_SIZE);
}

/* Takes the lowest free 2 MiB-aligned 2 MiB chunk that has not been
 * reported since it was last allocated; 0 if there is none (or the extent
 * table cannot take the split). */
u64 palloc_take_unreported_chunk(void)
{
	const u64 sz = 1ULL << CHUNK_SHIFT;
	for (int i = 0; i < next; i++) {
		for (u64 a = (ext[i].base + sz - 1) & ~(sz - 1); a + sz <= ext[i].end; a += sz) {
			u64 c = a >> CHUNK_SHIFT;
			if (c >= CHUNKS || (reported[c / 64] >> (c % 64)) & 1)
				continue;
			if (a == ext[i].base) {
				ext[i].base += sz;
				if (ext[i].base >= ext[i].end)
					remove_ext(i);
			} else if (a + sz == ext[i].end) {
				ext[i].end = a;
			} else {
				if (next == MAX_EXTENTS)
					return 0;
				memmove(&ext[i + 1], &ext[i], (size_t)(next - i) * sizeof(ext[0]));
				next++;
				ext[i].end = a;
				ext[i + 1].base = a + sz;
			}
			nfree -= sz / PAGE_SIZE;
			return a;
		}
	}
	return 0;
}

/* Frees a chunk taken above and marks it reported. */
void palloc_free_reported_chunk(u64 a)
{
	u64 c = a >> CHUNK_SHIFT;
	palloc_free_range(a, 1ULL << CHUNK_SHIFT);
	if (c < CHUNKS)
		reported[c / 64] |= 1ULL << (c % 64);
}

/* Remembers (for good) the 2 MiB chunks lying wholly inside memory the
 * balloon driver hinted as free, so a workload can tell that it reuses
 * hinted memory.  The driver hints runs of contiguous blocks; a block
 * that continues the previous one extends its run, so chunks that
 * straddle two blocks count too. */
void palloc_mark_hinted(u64 base, u64 len)
{
	static u64 run_base, run_end;
	const u64 sz = 1ULL << CHUNK_SHIFT;
	if (base != run_end)
		run_base = base;
	run_end = base + len;
	u64 a = (run_base + sz - 1) & ~(sz - 1);
	if (a < (base & ~(sz - 1)))
		a = base & ~(sz - 1);	/* the chunks before were marked already */
	for (; a + sz <= run_end; a += sz) {
		u64 c = a >> CHUNK_SHIFT;
		if (c < CHUNKS)
			hinted[c / 64] |= 1ULL << (c % 64);
	}
}

int palloc_was_hinted(u64 addr)
{
	u64 c = addr >> CHUNK_SHIFT;
	return c < CHUNKS && ((hinted[c / 64] >> (c % 64)) & 1);
}

u64 palloc_free_pages(void)
{
	return nfree;
}

int palloc_extents(struct range *out, int max)
{
	for (int i = 0; i < next && i < max; i++)
		out[i] = ext[i];
	return next;
}
