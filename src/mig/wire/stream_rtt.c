/* A TCP stream's smallest round-trip time (see stream.h).  A file of its
 * own: glibc's struct tcp_info stops before tcpi_min_rtt, and the kernel's
 * header cannot be included beside glibc's. */
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#include "mig/wire/stream.h"

uint64_t mig_stream__min_rtt_us(struct mig_stream *s)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	memset(&ti, 0, sizeof(ti));
	if (!s->is_socket || getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
	    len < offsetof(struct tcp_info, tcpi_min_rtt) + sizeof(ti.tcpi_min_rtt))
		return 0;
	return ti.tcpi_min_rtt == ~0u ? 0 : ti.tcpi_min_rtt;   /* ~0: none measured yet */
}
