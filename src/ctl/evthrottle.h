/* Rate limit of a QMP event a guest can trigger at will (BALLOON_CHANGE:
 * each write of the balloon's `actual` field emits one), as QEMU does: at
 * most one per period.  The first event of a quiet period goes out at
 * once; later ones within the period replace each other, and the last is
 * emitted when the period ends, so a client always learns the final value
 * and never more than one event per period.
 *
 * Thread-safe: offer may be called from any thread (a vCPU's device
 * emulation), due from the control loop, which calls it at least every
 * 200 ms.
 */
#ifndef KMIG_CTL_EVTHROTTLE_H
#define KMIG_CTL_EVTHROTTLE_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

struct ev_throttle {
	pthread_mutex_t lock;
	uint64_t period_ms;
	uint64_t last_ms;            /* when one was last emitted; 0 = never */
	json_t *pending;             /* the latest held back, owned */
};

void ev_throttle__init(struct ev_throttle *t, uint64_t period_ms);
void ev_throttle__destroy(struct ev_throttle *t);
/* Takes data (owned).  Returns it when it should be emitted now (the
 * caller emits it), else NULL: it is held (replacing an older one). */
json_t *ev_throttle__offer(struct ev_throttle *t, uint64_t now_ms, json_t *data);
/* The held event once its period is over (to emit; owned), else NULL. */
json_t *ev_throttle__due(struct ev_throttle *t, uint64_t now_ms);

#endif
