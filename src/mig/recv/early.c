/* Connections that spoke before their turn: held until it comes. */
#include <errno.h>

#include "mig/recv/early.h"

int mig_early__hold(struct mig_early *e, struct mig_stream *s, uint32_t type)
{
	if (e->n >= MIG_EARLY_MAX)
		return -ENOSPC;
	e->type[e->n] = type;
	mig_stream__move(&e->stream[e->n], s);
	e->n++;
	return 0;
}

bool mig_early__take(struct mig_early *e, uint32_t type, struct mig_stream *s)
{
	for (unsigned i = 0; i < e->n; i++) {
		if (e->type[i] != type)
			continue;
		mig_stream__move(s, &e->stream[i]);
		for (unsigned j = i + 1; j < e->n; j++) {
			e->type[j - 1] = e->type[j];
			mig_stream__move(&e->stream[j - 1], &e->stream[j]);
		}
		e->n--;
		return true;
	}
	return false;
}

unsigned mig_early__drop(struct mig_early *e)
{
	unsigned n = e->n;
	for (unsigned i = 0; i < n; i++)
		mig_stream__close(&e->stream[i]);
	e->n = 0;
	return n;
}
