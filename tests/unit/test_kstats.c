/* kvm_stats__parse (src/kvm/kvm_stats.c): the header and descriptor block of KVM_GET_STATS_FD,
 * built here as KVM lays it out, well-formed and broken. */
#include <errno.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvm/kvm_stats.h"

#define NAME_SIZE 48
#define DSIZE (sizeof(struct kvm_stats_desc) + NAME_SIZE)

struct blob {
	uint8_t b[4096];
	size_t len;
	uint32_t n;
};

static void blob__init(struct blob *x)
{
	memset(x, 0, sizeof(*x));
	struct kvm_stats_header h = { .name_size = NAME_SIZE, .id_offset = 24,
				      .desc_offset = 24 + 48, .data_offset = 0 };
	memcpy(x->b, &h, sizeof(h));
	x->len = h.desc_offset;
}

static void blob__add(struct blob *x, const char *name, uint32_t flags, uint16_t size,
		      uint32_t offset)
{
	uint8_t *d = x->b + x->len;
	memcpy(d, &flags, 4);
	memcpy(d + 6, &size, 2);
	memcpy(d + 8, &offset, 4);
	strncpy((char *)d + sizeof(struct kvm_stats_desc), name, NAME_SIZE);
	x->len += DSIZE;
	x->n++;
	memcpy(x->b + 8, &x->n, 4);
	uint32_t data = (uint32_t)x->len;
	memcpy(x->b + 20, &data, 4);
}

static void t_well_formed(struct t *t)
{
	struct blob x;
	blob__init(&x);
	blob__add(&x, "pages_4k", KVM_STATS_TYPE_INSTANT, 1, 0);
	blob__add(&x, "halt_poll_hist", KVM_STATS_TYPE_LINEAR_HIST, 32, 8);
	blob__add(&x, "pages_2m", KVM_STATS_TYPE_INSTANT, 1, 8 + 32 * 8);
	blob__add(&x, "remote_tlb_flush", KVM_STATS_TYPE_CUMULATIVE, 1, 16 + 32 * 8);
	struct kvm_stats s = { .fd = -1 };
	T_CHECK_EQ(t, kvm_stats__parse(&s, x.b, x.len), 0);
	T_CHECK_EQ(t, s.n, 3);                   /* the histogram is skipped */
	T_CHECK_EQ(t, s.data_size, 24 + 32 * 8); /* but its values are inside the block */
	T_CHECK(t, s.n == 3 && !strcmp(s.desc[0].name, "pages_4k") && s.desc[0].instant);
	T_CHECK(t, s.n == 3 && !strcmp(s.desc[1].name, "pages_2m") &&
		   s.desc[1].offset == 8 + 32 * 8);
	T_CHECK(t, s.n == 3 && !s.desc[2].instant);
	uint64_t v[3] = { 11, 22, 33 }, got = 0;
	T_CHECK_EQ(t, kvm_stats__find(&s, v, "pages_2m", &got), 0);
	T_CHECK_EQ(t, got, 22);
	T_CHECK_EQ(t, kvm_stats__find(&s, v, "pages_1g", &got), -ENOENT);
	uint64_t out[3];
	T_CHECK_EQ(t, kvm_stats__read(&s, out), -EBADF); /* no fd */
	kvm_stats__close(&s);
	T_CHECK(t, s.desc == NULL && s.fd == -1);
}

static void t_broken(struct t *t)
{
	struct kvm_stats s = { .fd = -1 };
	struct blob x;
	blob__init(&x);
	blob__add(&x, "pages_4k", 0, 1, 0);
	T_CHECK_EQ(t, kvm_stats__parse(&s, x.b, 10), -EPROTO);          /* short header */
	T_CHECK_EQ(t, kvm_stats__parse(&s, x.b, x.len - 1), -EPROTO);   /* short descriptors */
	struct blob y = x;
	memset(y.b + 72 + sizeof(struct kvm_stats_desc), 'a', NAME_SIZE); /* no NUL */
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	y = x;
	y.b[72 + sizeof(struct kvm_stats_desc)] = 0;                      /* empty name */
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	y = x;
	uint32_t off = 3;                                                 /* unaligned */
	memcpy(y.b + 72 + 8, &off, 4);
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	off = 1u << 24;                                                   /* past 1 MiB */
	memcpy(y.b + 72 + 8, &off, 4);
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	y = x;
	uint32_t big = 100000;                                            /* num_desc */
	memcpy(y.b + 8, &big, 4);
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	y = x;
	memcpy(y.b + 4, &big, 4);                                         /* name_size */
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	y = x;
	uint32_t inside = 8;                                              /* desc in header */
	memcpy(y.b + 16, &inside, 4);
	T_CHECK_EQ(t, kvm_stats__parse(&s, y.b, y.len), -EPROTO);
	T_CHECK(t, s.desc == NULL);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_well_formed);
	T_RUN(&t, t_broken);
	return T_DONE(&t);
}
