"""A source's later connections that speak before the earlier ones
(docs/protocol.md, "Connections that speak before their turn"): the
destination holds each for its turn, and the migration completes.

The source opens its main stream, then the postcopy-preempt channel, then
the multifd channels, each as soon as the one before has sent its first
record.  A relay (tests/lib/reorderproxy.py) forwards their first bytes
in another order, as a network that keeps no order between connections
may:

  multifd_before_main   four multifd channels, then the main stream
  preempt_after_multifd  the main stream, the two multifd channels, then
                        the postcopy-preempt channel (taken while the
                        destination waits for the preempt channel)
  all_reversed          the two multifd channels, the postcopy-preempt
                        channel, the main stream
  intruders             before the source, 17 connections (as many as
                        are held) each begin with a well-formed CHANNEL
                        of another session; then four multifd channels
                        before the main stream: the source's push the
                        oldest four intruders out, the other 13 are
                        dropped when the channels' turn comes without
                        using up the 16 strays a channel's wait allows,
                        and the source's are taken; 17 strays counted

The relay lets each connection speak only once the destination has held
the ones before it (its log says so), so that the destination never sees
two with bytes at once: of those it would take the one that connected
first, which would undo the order.  Each migration completes with
x-verify, the destination's guest checks its pages on, no connection is
counted as a stray, and the destination held every connection that spoke
before another.  (Negative control: at aa274ce, whose destination dropped
such a connection as a stray, all three fail: the source's migration fails
on the channel the destination closed, `multifd channel N: write: Broken
pipe`.  At 70e2bb6, which held them but refused a connection when 17
were held and charged held intruders to the channels' stray budget,
intruders fails.)
"""
import os
import socket
import sys
import time

import pytest

import kmigtest as kt
from reorderproxy import ReorderProxy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # its sibling's helpers
from test_hostile import SESSION_OTHER, channel_record  # noqa: E402
from test_multifd import dst_verifies  # noqa: E402

pytestmark = pytest.mark.kvm

VERIFY = "workload=verify mb=64 cpus=2 report_ms=300"
HELD = "spoke before its turn: held"

CASES = {
    # order of first bytes; multifd channels; postcopy-preempt
    "multifd_before_main": ([1, 2, 3, 4, 0], 4, False),
    "preempt_after_multifd": ([0, 2, 3, 1], 2, True),
    "all_reversed": ([3, 2, 1, 0], 2, True),
    "intruders": ([1, 2, 3, 4, 0], 4, False),
}
INTRUDERS = 17      # MIG_EARLY_MAX


def intrude(check, dst, port):
    """INTRUDERS connections, each with another session's CHANNEL, all
    held by the destination (it logs each); returns their sockets."""
    socks = []
    for i in range(INTRUDERS):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(channel_record(1 + i % 4, 4, SESSION_OTHER))
        socks.append(c)
    deadline = time.time() + kt.slow(20)
    while time.time() < deadline and dst.output().count(HELD) < INTRUDERS:
        time.sleep(0.05)
    check("intruders_held", dst.output().count(HELD) == INTRUDERS, dst.output()[-800:])
    return socks


@pytest.mark.parametrize("case", list(CASES))
def test_early(d, vms, check, case):
    order, channels, preempt = CASES[case]
    port = kt.free_port()
    src = kt.kmig_vm(d, "src", VERIFY, memory="256M", cpus=2)
    dst = kt.kmig_vm(d, "dst", VERIFY, memory="256M", cpus=2,
                     extra=["--incoming", "tcp:127.0.0.1:%d" % port])
    vms += [src, dst]
    if not check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20))
                 is not None, kt.dump(src)):
        return
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), kt.dump(dst)):
        return
    intruders = intrude(check, dst, port) if case == "intruders" else []
    base = len(intruders)
    caps = {"multifd": True, "x-verify": True}
    if preempt:
        caps.update({"postcopy-ram": True, "postcopy-preempt": True})
        kt.set_caps(dst.qmp(), postcopy_ram=True, postcopy_preempt=True)
    def gate(i):
        """The destination held each connection before order[i] that is
        not the main stream (within 10 s)."""
        want = base + sum(1 for k in order[:i] if k != 0)
        deadline = time.time() + kt.slow(10)
        while time.time() < deadline and dst.proc.poll() is None:
            if dst.output().count(HELD) >= want:
                return True
            time.sleep(0.02)
        return False

    relay = ReorderProxy(port, order, gate, wait_s=kt.slow(10))
    try:
        res = kt.migrate(src, dst, "tcp:127.0.0.1:%d" % relay.port, caps=caps,
                         params={"multifd-channels": channels, "max-bandwidth": 0},
                         timeout=kt.slow(60))
        print("# %s: first bytes in the order %r; %r" % (case, relay.first, relay.error))
        check("reordered", relay.reordered and relay.first == order,
              "the relay sent first bytes in the order %r (%r), not %r, each after the "
              "destination held those before" % (relay.first, relay.reordered, order))
        if not check("completed", res.get("status") == "completed",
                     "query-migrate %r; src %s; dst %s" % (res, kt.dump(src), kt.dump(dst))):
            return
        dq = kt.wait_migration(dst.qmp(), kt.slow(20))
        strays = dq.get("x-stray-connections", {}).get("count", 0)
        check("strays", strays == base, "%d strays, expected %d; %r" % (strays, base, dq))
        if base:
            out = dst.output()
            check("intruders_dropped", out.count("pushed out by a later one") == 4 and
                  out.count("of another migration's session") == base - 4, out[-1500:])
        # every connection but the main stream that spoke before another
        early = base + sum(1 for k in order[:-1] if k != 0)
        held = dst.output().count(HELD)
        check("held", held == early, "held %d, expected %d; %s" % (held, early,
                                                                  dst.output()[-800:]))
        check("channels", "%d multifd channels" % channels in dst.output(), dst.output()[-400:])
        if preempt:
            check("preempt_open", "postcopy-preempt channel open" in dst.output(),
                  dst.output()[-400:])
        dst_verifies(check, dst)     # and x-verify's hash matched at END, or it failed
    finally:
        relay.close()
        for c in intruders:
            c.close()
