#include "ctl/net_opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/kvopts.h"
#include "dev/net.h"

void net_opts__init(struct net_opts *o)
{
	static const uint8_t qemu_first_mac[6] = { 0x52, 0x54, 0x00, 0x12, 0x34, 0x56 };
	memset(o, 0, sizeof(*o));
	memcpy(o->dev.mac, qemu_first_mac, 6);
}

static int net_opts__hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
		return (c | 0x20) - 'a' + 10;
	return -1;
}

int net_opts__parse_mac(const char *s, uint8_t mac[6])
{
	if (strlen(s) != 17)
		return -EINVAL;
	for (unsigned i = 0; i < 6; i++) {
		int hi = net_opts__hex(s[3 * i]), lo = net_opts__hex(s[3 * i + 1]);
		if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != ':'))
			return -EINVAL;
		mac[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

/* "DRIVER,key=value,...": the driver name, then each pair through fn. */
static int net_opts__split(struct net_opts *o, const char *opt, const char *spec,
			   const char *driver, kvopts_fn fn, char *err, size_t errlen)
{
	const char *rest = kvopts__after_driver(spec, driver);
	if (!rest) {
		snprintf(err, errlen, "%s %s: kmig has only %s here%s", opt, spec, driver,
			 !strcmp(opt, "--device") ? " (or virtio-blk-pci; the balloon is --balloon)" : "");
		return -EINVAL;
	}
	return kvopts__split(opt, rest, fn, o, err, errlen);
}

static int net_opts__netdev_kv(void *ctx, const char *key, const char *val, char *err,
			       size_t errlen)
{
	struct net_opts *o = ctx;
	if (!strcmp(key, "id"))
		return kvopts__copy(o->netdev_id, sizeof(o->netdev_id), "--netdev", key, val, err,
				      errlen);
	if (!strcmp(key, "ifname"))
		return kvopts__copy(o->ifname, sizeof(o->ifname), "--netdev", key, val, err, errlen);
	if ((!strcmp(key, "script") || !strcmp(key, "downscript")) && !strcmp(val, "no"))
		return 0;
	if (!strcmp(key, "script") || !strcmp(key, "downscript")) {
		snprintf(err, errlen, "--netdev: %s=%s: kmig runs no scripts; set the tap up "
			 "beforehand and give %s=no (or leave it out)", key, val, key);
		return -EINVAL;
	}
	if (!strcmp(key, "vhost") && !strcmp(val, "off"))
		return 0;
	snprintf(err, errlen, "--netdev: unknown or unsupported property %s=%s (id, ifname, "
		 "script=no, downscript=no, vhost=off)", key, val);
	return -EINVAL;
}

int net_opts__netdev(struct net_opts *o, const char *spec, char *err, size_t errlen)
{
	if (o->have_netdev) {
		snprintf(err, errlen, "--netdev %s: kmig has one network device", spec);
		return -EINVAL;
	}
	int rc = net_opts__split(o, "--netdev", spec, "tap", net_opts__netdev_kv, err, errlen);
	if (!rc && (!o->netdev_id[0] || !o->ifname[0])) {
		snprintf(err, errlen, "--netdev %s: id= and ifname= are required", spec);
		rc = -EINVAL;
	}
	o->have_netdev = rc == 0;
	return rc;
}

static int net_opts__device_kv(void *ctx, const char *key, const char *val, char *err,
			       size_t errlen)
{
	struct net_opts *o = ctx;
	if (!strcmp(key, "netdev"))
		return kvopts__copy(o->device_netdev, sizeof(o->device_netdev), "--device", key, val,
				      err, errlen);
	if (!strcmp(key, "id"))
		return kvopts__copy(o->dev.device_id, sizeof(o->dev.device_id), "--device", key,
				      val, err, errlen);
	if (!strcmp(key, "mac")) {
		if (net_opts__parse_mac(val, o->dev.mac) || (o->dev.mac[0] & 1)) {
			snprintf(err, errlen, "--device: mac=%s: expected a unicast MAC such as "
				 "52:54:00:12:34:56", val);
			return -EINVAL;
		}
		return 0;
	}
	if (!strcmp(key, "mtu")) {
		char *end;
		unsigned long v = strtoul(val, &end, 10);
		if (*end || !*val || v < NET_MTU_MIN || v > 65535) {
			snprintf(err, errlen, "--device: mtu=%s: expected %d to 65535", val, NET_MTU_MIN);
			return -EINVAL;
		}
		o->dev.mtu = (uint16_t)v;
		return 0;
	}
	if (!strcmp(key, "csum") && (!strcmp(val, "on") || !strcmp(val, "off"))) {
		o->dev.no_offloads = !strcmp(val, "off");
		return 0;
	}
	snprintf(err, errlen, "--device: unknown or unsupported property %s=%s (netdev, id, mac, "
		 "mtu, csum)", key, val);
	return -EINVAL;
}

int net_opts__device(struct net_opts *o, const char *spec, char *err, size_t errlen)
{
	if (o->have_device) {
		snprintf(err, errlen, "--device %s: kmig has one virtio-net-pci device", spec);
		return -EINVAL;
	}
	int rc = net_opts__split(o, "--device", spec, "virtio-net-pci", net_opts__device_kv, err,
				 errlen);
	if (!rc && !o->device_netdev[0]) {
		snprintf(err, errlen, "--device %s: netdev= is required", spec);
		rc = -EINVAL;
	}
	o->have_device = rc == 0;
	return rc;
}

int net_opts__finish(const struct net_opts *o, struct vm_net_config *out, bool *on, char *err,
		     size_t errlen)
{
	*on = false;
	if (!o->have_netdev && !o->have_device)
		return 0;
	if (!o->have_device) {
		snprintf(err, errlen, "--netdev id=%s: no --device virtio-net-pci,netdev=%s uses it",
			 o->netdev_id, o->netdev_id);
		return -EINVAL;
	}
	if (!o->have_netdev || strcmp(o->netdev_id, o->device_netdev)) {
		snprintf(err, errlen, "--device virtio-net-pci: netdev=%s names no --netdev",
			 o->device_netdev);
		return -EINVAL;
	}
	*out = o->dev;
	memcpy(out->netdev_id, o->netdev_id, sizeof(out->netdev_id));
	memcpy(out->ifname, o->ifname, sizeof(out->ifname));
	*on = true;
	return 0;
}
