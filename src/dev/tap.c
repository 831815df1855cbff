#include "dev/tap.h"

#include "dev/net.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/if.h>
#include <linux/if_tun.h>

int tap__open(struct tap *t, const char *ifname, char *err, size_t errlen)
{
	t->fd = -1;
	if (!ifname || !*ifname || strlen(ifname) >= TAP_NAME_MAX) {
		snprintf(err, errlen, "tap: interface name \"%.40s\" is empty or longer than %d bytes",
			 ifname ? ifname : "", TAP_NAME_MAX - 1);
		return -EINVAL;
	}
	int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		snprintf(err, errlen, "tap %s: cannot open /dev/net/tun: %s", ifname, strerror(-rc));
		return rc;
	}
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
	memcpy(ifr.ifr_name, ifname, strlen(ifname));
	int hdr = NET_HDR_LEN;
	if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
		int rc = -errno;
		snprintf(err, errlen, "tap %s: %s%s", ifname, strerror(-rc),
			 rc == -EBUSY ? " (the tap is in use by another process)" :
			 rc == -EPERM ? " (not allowed to attach or create it)" :
			 rc == -EINVAL ? " (an interface of that name exists and is not a tap with a "
					 "virtio-net header)" : "");
		close(fd);
		return rc;
	}
	if (ioctl(fd, TUNSETVNETHDRSZ, &hdr) < 0) {
		int rc = -errno;
		snprintf(err, errlen, "tap %s: cannot set a %d-byte virtio-net header: %s", ifname,
			 NET_HDR_LEN, strerror(-rc));
		close(fd);
		return rc;
	}
	t->fd = fd;
	snprintf(t->name, sizeof(t->name), "%s", ifr.ifr_name);
	if (tap__offload(t, 0))
		log_debug("tap %s: TUNSETOFFLOAD 0 refused", t->name);
	return 0;
}

void tap__close(struct tap *t)
{
	if (t->fd >= 0)
		close(t->fd);
	t->fd = -1;
}

int tap__offload(struct tap *t, unsigned flags)
{
	return ioctl(t->fd, TUNSETOFFLOAD, (unsigned long)flags) < 0 ? -errno : 0;
}

bool tap__probe(struct tap *t, unsigned flags)
{
	bool ok = tap__offload(t, flags) == 0;
	if (tap__offload(t, 0))
		log_debug("tap %s: TUNSETOFFLOAD 0 refused", t->name);
	return ok;
}
