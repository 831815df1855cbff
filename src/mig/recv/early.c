/* Connections that spoke before their turn: held until it comes. */
#include "mig/recv/early.h"

/* Closes the gap at i (its stream moved out or closed). */
static void early__remove(struct mig_early *e, unsigned i)
{
	for (unsigned j = i + 1; j < e->n; j++) {
		e->type[j - 1] = e->type[j];
		mig_stream__move(&e->stream[j - 1], &e->stream[j]);
	}
	e->n--;
}

int mig_early__hold(struct mig_early *e, struct mig_stream *s, uint32_t type)
{
	int pushed = 0;
	if (e->n >= MIG_EARLY_MAX) {
		mig_stream__close(&e->stream[0]);
		early__remove(e, 0);
		pushed = 1;
	}
	e->type[e->n] = type;
	mig_stream__move(&e->stream[e->n], s);
	e->n++;
	return pushed;
}

bool mig_early__take(struct mig_early *e, uint32_t type, struct mig_stream *s)
{
	for (unsigned i = 0; i < e->n; i++) {
		if (e->type[i] != type)
			continue;
		mig_stream__move(s, &e->stream[i]);
		early__remove(e, i);
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
