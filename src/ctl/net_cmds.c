#include "ctl/net_cmds.h"

#include <stdio.h>
#include <string.h>

#include "ctl/control.h"
#include "dev/announce.h"
#include "dev/net.h"
#include "kvm/vm_net.h"

#define NET_NIC_DEFAULT_NAME "virtio-net-pci.0"

static const char *net_cmds__nic_name(const struct vm *vm)
{
	return vm->cfg.netc.device_id[0] ? vm->cfg.netc.device_id : NET_NIC_DEFAULT_NAME;
}

static bool net_cmds__names_nic(const struct vm *vm, const char *name)
{
	return vm->net && (!strcmp(name, vm->cfg.netc.netdev_id) ||
			   !strcmp(name, net_cmds__nic_name(vm)));
}

static json_t *cmd_set_link(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "name", "up", NULL };
	struct control *c = ctx;
	const char *name = NULL;
	bool up = false;
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "name", &name, true, err) < 0 ||
	    qmp_arg__bool(args, "up", &up, true, err) < 0)
		return NULL;
	if (!net_cmds__names_nic(c->vm, name)) {
		qmp_error__set(err, QMP_ERROR_DEVICE_NOT_FOUND, "Device '%s' not found", name);
		return NULL;
	}
	net__set_link(c->vm->net, up);
	return NULL;
}

static void net_cmds__mac(const uint8_t *m, char out[18])
{
	snprintf(out, 18, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}

static json_t *net_cmds__table(const uint8_t (*t)[6], unsigned n)
{
	json_t *a = json_array();
	char s[18];
	for (unsigned i = 0; a && i < n; i++) {
		net_cmds__mac(t[i], s);
		json_array_append_new(a, json_string(s));
	}
	return a;
}

static json_t *net_cmds__counters(struct net *n)
{
	struct net_stats s;
	net__get_stats(n, &s);
	return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
			 "rx-frames", (json_int_t)s.rx_frames, "rx-bytes", (json_int_t)s.rx_bytes,
			 "rx-filtered", (json_int_t)s.rx_filtered,
			 "rx-too-long", (json_int_t)s.rx_too_long,
			 "rx-bad-offload", (json_int_t)s.rx_bad_offload,
			 "rx-link-down", (json_int_t)s.rx_link_down,
			 "rx-dropped-pending", (json_int_t)s.rx_dropped_pending,
			 "tx-frames", (json_int_t)s.tx_frames, "tx-bytes", (json_int_t)s.tx_bytes,
			 "tx-errors", (json_int_t)s.tx_errors,
			 "tx-link-down", (json_int_t)s.tx_link_down,
			 "ctrl-commands", (json_int_t)s.ctrl_cmds,
			 "ctrl-errors", (json_int_t)s.ctrl_errors,
			 "announcements", (json_int_t)s.announces);
}

static json_t *net_cmds__filter(struct vm *vm)
{
	struct net_rx_filter f;
	char mac[18];
	net__get_filter(vm->net, &f);
	net_cmds__mac(f.mac, mac);
	return json_pack("{s:s,s:b,s:s,s:s,s:s,s:b,s:b,s:b,s:s,s:[],s:o,s:o,s:o,s:b}",
			 "name", net_cmds__nic_name(vm), "promiscuous", f.promisc,
			 "multicast", f.allmulti ? "all" : "normal", "unicast", "normal",
			 "vlan", "all", "broadcast-allowed", 1,
			 "multicast-overflow", f.multi_overflow, "unicast-overflow", f.uni_overflow,
			 "main-mac", mac, "vlan-table", "unicast-table", net_cmds__table(f.uni, f.nuni),
			 "multicast-table", net_cmds__table(f.multi, f.nmulti),
			 "x-counters", net_cmds__counters(vm->net), "x-link-up", net__link(vm->net));
}

static json_t *cmd_query_rx_filter(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "name", NULL };
	struct control *c = ctx;
	const char *name = NULL;
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "name", &name, false, err) < 0)
		return NULL;
	if (name && !net_cmds__names_nic(c->vm, name)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "invalid net client name: %s", name);
		return NULL;
	}
	json_t *list = json_array();
	if (list && c->vm->net)
		json_array_append_new(list, net_cmds__filter(c->vm));
	return list;
}

/* announce-self's interfaces: absent (every NIC) or a list of names;
 * whether this VM's NIC is among them (false with err set if the list
 * is not one of strings). */
static bool net_cmds__named(const struct vm *vm, json_t *list, struct qmp_error *err)
{
	if (!list)
		return true;
	size_t i;
	json_t *v;
	bool named = false;
	if (!json_is_array(list)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Invalid parameter type for 'interfaces', "
			       "expected: array");
		return false;
	}
	json_array_foreach(list, i, v) {
		if (!json_is_string(v)) {
			qmp_error__set(err, QMP_ERROR_GENERIC, "Invalid parameter type for "
				       "'interfaces', expected: array of strings");
			return false;
		}
		named |= net_cmds__names_nic(vm, json_string_value(v));
	}
	return named;
}

static json_t *cmd_announce_self(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "initial", "max", "rounds", "step", "interfaces",
					     "id", NULL };
	struct control *c = ctx;
	struct announce_params p;
	if (qmp_arg__check_known(args, known, err) ||
	    qmp_arg__uint(args, "initial", &p.initial_ms, true, err) < 0 ||
	    qmp_arg__uint(args, "max", &p.max_ms, true, err) < 0 ||
	    qmp_arg__uint(args, "rounds", &p.rounds, true, err) < 0 ||
	    qmp_arg__uint(args, "step", &p.step_ms, true, err) < 0)
		return NULL;
	if (announce__check(&p)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "initial, max and step must be 1..%u ms with "
			       "initial <= max, rounds 1..%u", ANNOUNCE_MAX_MS, ANNOUNCE_MAX_ROUNDS);
		return NULL;
	}
	if (c->vm->net && net_cmds__named(c->vm, json_object_get(args, "interfaces"), err) &&
	    vm_net__announce(c->vm, &p))
		qmp_error__set(err, QMP_ERROR_GENERIC, "the announcements could not start");
	return NULL;
}

int control__register_net(struct control *c)
{
	int rc = qmp__register(c->qmp, "set_link", cmd_set_link, c);
	if (!rc)
		rc = qmp__register(c->qmp, "query-rx-filter", cmd_query_rx_filter, c);
	if (!rc)
		rc = qmp__register(c->qmp, "announce-self", cmd_announce_self, c);
	return rc;
}
