/* QEMU-style option strings (src/ctl/kvopts.c): pairs in order, ",," as
 * a comma inside a value, what is refused and what the error says. */
#include <errno.h>
#include <string.h>

#include "ctl/kvopts.h"
#include "ctl/ident_opts.h"
#include "ctl/mem_opts.h"
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

/* --object memory-backend-file and --machine memory-backend= */
static void t_mem_opts(struct t *t)
{
	struct mem_opts o;
	struct vm_config c;
	char err[512];
	const char *ok = "memory-backend-file,id=m0,size=256M,mem-path=/dev/shm/a,,b,share=on";
	memset(&o, 0, sizeof(o));
	memset(&c, 0, sizeof(c));
	T_CHECK(t, mem_opts__is_object(ok) && !mem_opts__is_object("tls-creds-psk,id=x"));
	T_CHECK_EQ(t, mem_opts__object(&o, ok, err, sizeof(err)), 0);
	T_CHECK_EQ(t, mem_opts__finish(&o, 0, &c, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "add --machine memory-backend=m0") != NULL);
	T_CHECK_EQ(t, mem_opts__machine(&o, "memory-backend=m0", err, sizeof(err)), 0);
	T_CHECK_EQ(t, mem_opts__finish(&o, 512ull << 20, &c, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "--memory is 512 MiB but memory backend m0 has size=256 MiB") != NULL);
	T_CHECK_EQ(t, mem_opts__finish(&o, 256ull << 20, &c, err, sizeof(err)), 0);
	T_CHECK_EQ(t, c.mem_size, 256ull << 20);
	T_CHECK(t, !strcmp(c.mem_path, "/dev/shm/a,b") && !strcmp(c.mem_id, "m0"));
	/* refusals, each with its reason */
	static const struct { const char *spec, *why; } bad[] = {
		{ "memory-backend-file,id=m,size=256M,mem-path=/x", "share=on is required" },
		{ "memory-backend-file,id=m,size=256M,mem-path=/x,share=off", "share=on is required" },
		{ "memory-backend-file,id=m,mem-path=/x,share=on", "size= is required" },
		{ "memory-backend-file,size=256M,mem-path=/x,share=on", "id= is required" },
		{ "memory-backend-file,id=m,size=256M,share=on", "mem-path= is required" },
		{ "memory-backend-file,id=m,size=100M,mem-path=/x,share=on", "multiple of 2 MiB" },
		{ "memory-backend-file,id=m,size=64M,mem-path=/x,share=on", "from 128M" },
		{ "memory-backend-file,id=m,size=256M,mem-path=/x,share=on,prealloc=on",
		  "unknown key 'prealloc'" },
		{ "memory-backend-memfd,id=m,size=256M,share=on", "memory-backend-file" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&o, 0, sizeof(o));
		err[0] = 0;
		T_CHECK_EQ(t, mem_opts__object(&o, bad[i].spec, err, sizeof(err)), -EINVAL);
		if (!strstr(err, bad[i].why)) {
			T_CHECK(t, !"reason");
			printf("#   %s: '%s' lacks '%s'\n", bad[i].spec, err, bad[i].why);
		}
	}
	memset(&o, 0, sizeof(o));
	T_CHECK_EQ(t, mem_opts__machine(&o, "memory-backend=zz", err, sizeof(err)), 0);
	T_CHECK_EQ(t, mem_opts__finish(&o, 0, &c, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "no memory-backend-file with that id") != NULL);
	T_CHECK_EQ(t, mem_opts__machine(&o, "memory-backend=zz", err, sizeof(err)), -EINVAL);
	memset(&o, 0, sizeof(o));
	T_CHECK_EQ(t, mem_opts__machine(&o, "accel=kvm", err, sizeof(err)), -EINVAL);
	/* one backend per VM */
	memset(&o, 0, sizeof(o));
	T_CHECK_EQ(t, mem_opts__object(&o, ok, err, sizeof(err)), 0);
	T_CHECK_EQ(t, mem_opts__object(&o, ok, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "one memory backend per VM") != NULL);
}

/* --uuid and --name */
static void t_ident_opts(struct t *t)
{
	struct vm_config c;
	char err[512], text[37];
	memset(&c, 0, sizeof(c));
	T_CHECK_EQ(t, ident_opts__uuid(&c, "5B3C2B5E-3f7a-4c1e-9d2a-0f6e8b1c4a7d", err,
				       sizeof(err)), 0);
	T_CHECK(t, c.has_uuid && c.uuid[0] == 0x5b && c.uuid[15] == 0x7d);
	ident_opts__uuid_text(c.uuid, text);
	T_CHECK(t, !strcmp(text, "5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7d"));
	static const char *const bad_uuid[] = {
		"", "5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7", "5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7d0",
		"5b3c2b5e3f7a4c1e9d2a0f6e8b1c4a7d", "5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7g",
		" 5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7", "5b3c2b5e_3f7a-4c1e-9d2a-0f6e8b1c4a7d",
	};
	for (size_t i = 0; i < sizeof(bad_uuid) / sizeof(bad_uuid[0]); i++) {
		memset(&c, 0, sizeof(c));
		T_CHECK_EQ(t, ident_opts__uuid(&c, bad_uuid[i], err, sizeof(err)), -EINVAL);
		T_CHECK(t, !c.has_uuid && strstr(err, "not a UUID"));
	}
	memset(&c, 0, sizeof(c));
	ident_opts__uuid_text(c.uuid, text);
	T_CHECK(t, !strcmp(text, "00000000-0000-0000-0000-000000000000"));
	T_CHECK_EQ(t, ident_opts__name(&c, "web-1", err, sizeof(err)), 0);
	T_CHECK(t, !strcmp(c.name, "web-1"));
	T_CHECK_EQ(t, ident_opts__name(&c, "guest=db \xc3\xa9t\xc3\xa9", err, sizeof(err)), 0);
	T_CHECK(t, !strcmp(c.name, "db \xc3\xa9t\xc3\xa9"));
	static const char *const bad_name[] = { "", "guest=", "a,b", "guest=a,debug-threads=on",
						"a\nb", "\xff" };
	for (size_t i = 0; i < sizeof(bad_name) / sizeof(bad_name[0]); i++) {
		strcpy(c.name, "kept");
		T_CHECK_EQ(t, ident_opts__name(&c, bad_name[i], err, sizeof(err)), -EINVAL);
		T_CHECK(t, !strcmp(c.name, "kept") && strstr(err, "--name"));
	}
	char lng[VM_NAME_MAX + 1];
	memset(lng, 'n', VM_NAME_MAX);
	lng[VM_NAME_MAX] = 0;
	T_CHECK_EQ(t, ident_opts__name(&c, lng, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "longer than 255 bytes") != NULL);
	lng[VM_NAME_MAX - 1] = 0;
	T_CHECK_EQ(t, ident_opts__name(&c, lng, err, sizeof(err)), 0);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_split);
	T_RUN(&t, t_refused);
	T_RUN(&t, t_helpers);
	T_RUN(&t, t_mem_opts);
	T_RUN(&t, t_ident_opts);
	return T_DONE(&t);
}
