/*
 * A simple page allocator over the usable RAM above the image: the free
 * memory is a sorted array of extents [base, end), so it can be enumerated
 * in large blocks (the future balloon driver reports them as free-page
 * hints).  Allocation takes the lowest free page; freeing merges with the
 * neighbouring extents.  One CPU only (no locking).
 */
#include "guest.h"

#define MAX_EXTENTS 256
static struct range ext[MAX_EXTENTS];
static int next;

void palloc_init(void)
{
	next = 0;
	for (int i = 0; i < nram && next < MAX_EXTENTS; i++)
		ext[next++] = ram[i];
}

u64 palloc_alloc(void)
{
	while (next && ext[0].base >= ext[0].end) {
		memmove(&ext[0], &ext[1], (size_t)(next - 1) * sizeof(ext[0]));
		next--;
	}
	if (!next)
		return 0;
	u64 p = ext[0].base;
	ext[0].base += PAGE_SIZE;
	return p;
}

void palloc_free(u64 page)
{
	int i = 0;
	while (i < next && ext[i].end < page)
		i++;
	/* now ext[i] is the first extent that ends at or after page */
	if (i < next && ext[i].end == page) {
		ext[i].end += PAGE_SIZE;
		if (i + 1 < next && ext[i + 1].base == ext[i].end) {
			ext[i].end = ext[i + 1].end;
			memmove(&ext[i + 1], &ext[i + 2], (size_t)(next - i - 2) * sizeof(ext[0]));
			next--;
		}
		return;
	}
	if (i < next && ext[i].base == page + PAGE_SIZE) {
		ext[i].base = page;
		return;
	}
	if (next == MAX_EXTENTS)
		return;		/* table full: the page is leaked */
	memmove(&ext[i + 1], &ext[i], (size_t)(next - i) * sizeof(ext[0]));
	ext[i].base = page;
	ext[i].end = page + PAGE_SIZE;
	next++;
}

u64 palloc_free_pages(void)
{
	u64 n = 0;
	for (int i = 0; i < next; i++)
		n += (ext[i].end - ext[i].base) / PAGE_SIZE;
	return n;
}

int palloc_extents(struct range *out, int max)
{
	int n = 0;
	for (int i = 0; i < next; i++) {
		if (ext[i].end <= ext[i].base)
			continue;
		if (n < max)
			out[n] = ext[i];
		n++;
	}
	return n;
}
