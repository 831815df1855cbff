/* mig_early: connections held for their turn, each with its first record
 * unread, taken by the record they begin with, oldest first; a full set
 * pushes its oldest out. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "mig/recv/early.h"

/* A connection whose peer sent one record of `type` (CHANNEL or PREEMPT)
 * whose session begins with `tag`; its header peeked (read into the
 * stream's buffer, not consumed) as the destination does before it
 * decides.  The peer's end goes into *peer. */
static int conn(struct mig_stream *s, uint32_t type, uint8_t tag, int *peer)
{
	int sv[2];
	uint8_t rec[128], b[PROTO_HDR_SIZE], session[PROTO_SESSION_LEN] = { tag };
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -errno;
	*peer = sv[1];
	ssize_t n = type == PROTO_PREEMPT ?
		    proto__encode_preempt(rec, sizeof(rec), session, 0) :
		    proto__encode_channel(rec, sizeof(rec), 1, PROTO_MAX_CHANNELS, session);
	if (n < 0 || write(sv[1], rec, (size_t)n) != n || mig_stream__init(s, sv[0]))
		return -EIO;
	return mig_stream__peek(s, b, sizeof(b));
}

/* s's first record: of type, its session beginning with tag. */
static int first_record_is(struct mig_stream *s, uint32_t type, uint8_t tag)
{
	struct proto_hdr h;
	uint8_t buf[128], session[PROTO_SESSION_LEN];
	uint32_t index, count;
	const char *why;
	if (mig_stream__get_record(s, &h, buf, sizeof(buf)) || h.type != type)
		return 0;
	if (type == PROTO_PREEMPT)
		return !proto__decode_preempt(buf, h.length, session, &count, &why) &&
		       session[0] == tag;
	return !proto__decode_channel(buf, h.length, &index, &count, session, &why) &&
	       session[0] == tag;
}

static void t_take_by_type(struct t *t)
{
	struct mig_early e;
	memset(&e, 0, sizeof(e));
	struct mig_stream s;
	int peers[3];
	static const uint32_t types[3] = { PROTO_CHANNEL, PROTO_PREEMPT, PROTO_CHANNEL };
	for (int i = 0; i < 3; i++) {
		T_CHECK_EQ(t, conn(&s, types[i], (uint8_t)(10 + i), &peers[i]), 0);
		T_CHECK_EQ(t, mig_early__hold(&e, &s, types[i]), 0);
		T_CHECK_EQ(t, s.fd, -1);        /* moved out */
	}
	T_CHECK(t, !mig_early__take(&e, PROTO_START, &s));
	T_CHECK(t, mig_early__take(&e, PROTO_PREEMPT, &s));
	T_CHECK(t, first_record_is(&s, PROTO_PREEMPT, 11));
	mig_stream__close(&s);
	T_CHECK(t, !mig_early__take(&e, PROTO_PREEMPT, &s));
	T_CHECK(t, mig_early__take(&e, PROTO_CHANNEL, &s));     /* the older first */
	T_CHECK(t, first_record_is(&s, PROTO_CHANNEL, 10));
	mig_stream__close(&s);
	T_CHECK(t, mig_early__take(&e, PROTO_CHANNEL, &s));
	T_CHECK(t, first_record_is(&s, PROTO_CHANNEL, 12));
	/* the stream moved twice still works both ways */
	uint8_t x = 0;
	T_CHECK_EQ(t, mig_stream__put_record(&s, PROTO_RP_OK, 0, NULL, 0), 0);
	T_CHECK_EQ(t, mig_stream__flush(&s), 0);
	T_CHECK_EQ(t, (int)recv(peers[2], &x, 1, MSG_DONTWAIT), 1);
	mig_stream__close(&s);
	T_CHECK_EQ(t, mig_early__drop(&e), 0u);
	for (int i = 0; i < 3; i++)
		close(peers[i]);
}

static void t_full_pushes_oldest(struct t *t)
{
	struct mig_early e;
	memset(&e, 0, sizeof(e));
	struct mig_stream s;
	int peers[MIG_EARLY_MAX + 1];
	for (unsigned i = 0; i < MIG_EARLY_MAX; i++) {
		T_CHECK_EQ(t, conn(&s, PROTO_CHANNEL, (uint8_t)i, &peers[i]), 0);
		T_CHECK_EQ(t, mig_early__hold(&e, &s, PROTO_CHANNEL), 0);
	}
	/* one more pushes the oldest out (closed: its peer reads EOF) */
	T_CHECK_EQ(t, conn(&s, PROTO_CHANNEL, 99, &peers[MIG_EARLY_MAX]), 0);
	T_CHECK_EQ(t, mig_early__hold(&e, &s, PROTO_CHANNEL), 1);
	uint8_t b[64];
	T_CHECK_EQ(t, (int)read(peers[0], b, sizeof(b)), 0);
	T_CHECK(t, mig_early__take(&e, PROTO_CHANNEL, &s));     /* now the oldest */
	T_CHECK(t, first_record_is(&s, PROTO_CHANNEL, 1));
	mig_stream__close(&s);
	T_CHECK_EQ(t, mig_early__drop(&e), MIG_EARLY_MAX - 1);
	/* every held connection closed: each peer reads EOF; the newest was held */
	for (unsigned i = 2; i <= MIG_EARLY_MAX; i++)
		T_CHECK_EQ(t, (int)read(peers[i], b, sizeof(b)), 0);
	T_CHECK(t, !mig_early__take(&e, PROTO_CHANNEL, &s));
	for (unsigned i = 0; i <= MIG_EARLY_MAX; i++)
		close(peers[i]);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_take_by_type);
	T_RUN(&t, t_full_pushes_oldest);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
