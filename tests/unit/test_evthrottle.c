/* Unit tests of the QMP event rate limit (ctl/evthrottle). */
#include <jansson.h>

#include "ctl/evthrottle.h"
#include "harness.h"

static int64_t val(json_t *j)
{
	int64_t v = json_integer_value(json_object_get(j, "actual"));
	json_decref(j);
	return v;
}

static json_t *ev(int64_t actual)
{
	return json_pack("{s:I}", "actual", (json_int_t)actual);
}

/* A guest that writes `actual` 10000 times within 3 s: at most one event
 * per second goes out, and the last value is among them. */
static void t_flood(struct t *t)
{
	struct ev_throttle th;
	int emitted = 0;
	int64_t last = -1;
	ev_throttle__init(&th, 1000);
	for (int i = 1; i <= 10000; i++) {
		uint64_t now = 5000 + (uint64_t)i * 3000 / 10000;   /* 5.0 .. 8.0 s */
		json_t *out = ev_throttle__offer(&th, now, ev(i));
		if (out) {
			emitted++;
			last = val(out);
		}
		out = ev_throttle__due(&th, now);
		if (out) {
			emitted++;
			last = val(out);
		}
	}
	/* at 5.0 s at once, then one at the end of each period: 6, 7, 8 s */
	T_CHECK_EQ(t, emitted, 4);
	json_t *out = ev_throttle__due(&th, 9000);
	if (out)
		last = val(out);
	T_CHECK_EQ(t, last, 10000);          /* the final value is never lost */
	T_CHECK(t, ev_throttle__due(&th, 20000) == NULL);
	ev_throttle__destroy(&th);
}

/* Events further apart than the period go out at once, each one. */
static void t_quiet(struct t *t)
{
	struct ev_throttle th;
	ev_throttle__init(&th, 1000);
	for (int i = 0; i < 5; i++) {
		json_t *out = ev_throttle__offer(&th, 100 + (uint64_t)i * 1500, ev(i));
		T_CHECK(t, out != NULL);
		if (out)
			T_CHECK_EQ(t, val(out), i);
		T_CHECK(t, ev_throttle__due(&th, 100 + (uint64_t)i * 1500 + 1200) == NULL);
	}
	/* a second one within the period waits for its end */
	json_t *first = ev_throttle__offer(&th, 10000, ev(7));
	T_CHECK(t, first != NULL);
	json_decref(first);
	T_CHECK(t, ev_throttle__offer(&th, 10001, ev(8)) == NULL);
	T_CHECK(t, ev_throttle__due(&th, 10500) == NULL);
	json_t *out = ev_throttle__due(&th, 11000);
	T_CHECK(t, out != NULL);
	if (out)
		T_CHECK_EQ(t, val(out), 8);
	ev_throttle__destroy(&th);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_flood);
	T_RUN(&t, t_quiet);
	return T_DONE(&t);
}
