/* QEMU-style option strings (src/ctl/kvopts.c): pairs in order, ",," as
 * a comma inside a value, what is refused and what the error says. */
#include <errno.h>
#include <string.h>

#include "ctl/kvopts.h"
#include "harness.h"

struct seen {
	char pairs[8][64];
	unsigned n;
	const char *fail_on;      /* a key fn refuses */
};

static int record(void *ctx, const char *key, const char *val, char *err, size_t errlen)
{
	struct seen *s = ctx;
	if (s->fail_on && !strcmp(key, s->fail_on)) {
		snprintf(err, errlen, "refused %s", key);
		return -ERANGE;
	}
	if (s->n < 8)
		snprintf(s->pairs[s->n++], 64, "%s|%s", key, val);
	return 0;
}

static void t_split(struct t *t)
{
	struct seen s = { 0 };
	char err[256] = "";
	T_CHECK_EQ(t, kvopts__split("--x", "a=1,file=/x/a,,b.img,c=", record, &s, err,
				    sizeof(err)), 0);
	T_CHECK_EQ(t, s.n, 3);
	T_CHECK(t, !strcmp(s.pairs[0], "a|1"));
	T_CHECK(t, !strcmp(s.pairs[1], "file|/x/a,b.img"));
	T_CHECK(t, !strcmp(s.pairs[2], "c|"));
	memset(&s, 0, sizeof(s));    /* a trailing comma, and nothing at all */
	T_CHECK_EQ(t, kvopts__split("--x", "a=1,", record, &s, err, sizeof(err)), 0);
	T_CHECK_EQ(t, s.n, 1);
	T_CHECK_EQ(t, kvopts__split("--x", "", record, &s, err, sizeof(err)), 0);
	T_CHECK_EQ(t, s.n, 1);
}

static void t_refused(struct t *t)
{
	struct seen s = { .fail_on = "b" };
	char err[256] = "";
	T_CHECK_EQ(t, kvopts__split("--x", "a=1,novalue", record, &s, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "--x") && strstr(err, "\"novalue\" is not key=value"));
	T_CHECK_EQ(t, kvopts__split("--x", "=v", record, &s, err, sizeof(err)), -EINVAL);
	T_CHECK_EQ(t, kvopts__split("--x", ",a=1", record, &s, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "an empty property") != NULL);
	/* fn's own error ends it: the pairs after are never seen */
	memset(s.pairs, 0, sizeof(s.pairs));
	s.n = 0;
	T_CHECK_EQ(t, kvopts__split("--x", "a=1,b=2,c=3", record, &s, err, sizeof(err)), -ERANGE);
	T_CHECK_EQ(t, s.n, 1);
	T_CHECK(t, !strcmp(err, "refused b"));
	/* too long for one pair */
	static char big[KVOPTS_SPEC_MAX + 16];
	memset(big, 'a', sizeof(big) - 1);
	big[0] = 'k';
	big[1] = '=';
	T_CHECK_EQ(t, kvopts__split("--x", big, record, &s, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "too long") != NULL);
}

static void t_helpers(struct t *t)
{
	T_CHECK(t, !strcmp(kvopts__after_driver("virtio-blk-pci,drive=d", "virtio-blk-pci"),
			   "drive=d"));
	T_CHECK(t, !strcmp(kvopts__after_driver("tap", "tap"), ""));
	T_CHECK(t, kvopts__after_driver("tapx,id=a", "tap") == NULL);
	T_CHECK(t, kvopts__after_driver("ta", "tap") == NULL);
	char dst[4], err[256];
	T_CHECK_EQ(t, kvopts__copy(dst, sizeof(dst), "--x", "id", "abc", err, sizeof(err)), 0);
	T_CHECK(t, !strcmp(dst, "abc"));
	T_CHECK_EQ(t, kvopts__copy(dst, sizeof(dst), "--x", "id", "abcd", err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "longer than 3 bytes") != NULL);
	T_CHECK_EQ(t, kvopts__copy(dst, sizeof(dst), "--x", "id", "", err, sizeof(err)), -EINVAL);
	bool on = false;
	T_CHECK_EQ(t, kvopts__onoff("--x", "k", "on", &on, err, sizeof(err)), 0);
	T_CHECK(t, on);
	T_CHECK_EQ(t, kvopts__onoff("--x", "k", "yes", &on, err, sizeof(err)), -EINVAL);
	T_CHECK(t, on && strstr(err, "k=yes: expected on or off"));
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_split);
	T_RUN(&t, t_refused);
	T_RUN(&t, t_helpers);
	return T_DONE(&t);
}
