#include "ctl/balloon_cmds.h"

#include "base/timeutil.h"
#include "ctl/control.h"
#include "dev/balloon.h"

static struct balloon *balloon_cmds__get(struct control *c, struct qmp_error *err)
{
	if (!c->vm->balloon)
		qmp_error__set(err, QMP_ERROR_DEVICE_NOT_ACTIVE, "No balloon device has been activated");
	return c->vm->balloon;
}

static json_t *cmd_balloon(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "value", NULL };
	struct control *c = ctx;
	int64_t value = 0;
	if (qmp_arg__check_known(args, known, err) || qmp_arg__int(args, "value", &value, true, err) < 0)
		return NULL;
	struct balloon *b = balloon_cmds__get(c, err);
	if (!b)
		return NULL;
	if (value <= 0 || balloon__set_target(b, (uint64_t)value))
		qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter 'target' expects a size");
	return NULL;
}

static json_t *cmd_query_balloon(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	struct balloon *b = balloon_cmds__get(c, err);
	if (!b)
		return NULL;
	struct balloon_stats st;
	balloon__get_stats(b, &st);
	/* QEMU's reply, and kmig's device counters since it was created */
	return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "actual", (json_int_t)balloon__actual_bytes(b),
			 "x-ballooned-pages", (json_int_t)st.ballooned,
			 "x-hinted-pages", (json_int_t)st.hinted_pages,
			 "x-reported-pages", (json_int_t)st.reported_pages,
			 "x-notify-exits", (json_int_t)st.notify_exits,
			 "x-notify-ioeventfds", (json_int_t)st.notify_events);
}

/* The guest writes `actual` as often as it likes: one event a second at
 * most, the last value always delivered (ctl/evthrottle.h). */
static void balloon_cmds__on_change(void *ctx, uint64_t actual)
{
	struct control *c = ctx;
	json_t *now = ev_throttle__offer(&c->balloon_change, time__now_ms(),
					 json_pack("{s:I}", "actual", (json_int_t)actual));
	if (now)
		control__event(c, "BALLOON_CHANGE", now);
	/* else held: the control loop emits it when the second is over */
}

int control__register_balloon(struct control *c)
{
	int rc = qmp__register(c->qmp, "balloon", cmd_balloon, c);
	if (!rc)
		rc = qmp__register(c->qmp, "query-balloon", cmd_query_balloon, c);
	if (!rc && c->vm->balloon)
		balloon__set_change_cb(c->vm->balloon, balloon_cmds__on_change, c);
	return rc;
}
