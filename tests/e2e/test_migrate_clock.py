"""The guest's clock across a live migration: the TSC on the destination
goes on from the source's, counting the switchover, never backwards and
never ahead of the wall clock.

The source and destination start together, as in every test, so their VMs
are the same age: that is when KVM's TSC-write heuristic (a host write
within a second of what KVM expects is taken as a request to synchronise
vCPUs) used to override the restored TSC.  On a host whose TSC KVM thinks
unstable (kvm_amd under emulation) it then added the destination's age to
the guest's clock; see src/state/state_tsc.c.
"""
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

REPORT_MS = 100
HB = re.compile(r"^heartbeat t_ms=(\d+) gap_ms=(\d+)")


def heartbeats(console):
    console.poll()
    return [(int(m.group(1)), int(m.group(2))) for m in map(HB.search, console.lines) if m]


@pytest.mark.parametrize("age_s", [4])
def test_guest_clock_continuous(d, vms, check, age_s):
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    cmd = "workload=idle report_ms=%d" % REPORT_MS
    src = kt.kmig_vm(d, "src", cmd, memory="256M")
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", extra=["--incoming", uri])
    vms += [src, dst]
    assert src.console.wait(r"^heartbeat", kt.slow(20), proc=src.proc), kt.dump(src)
    # old enough that a clock jump by the VM's age stands out from the
    # migration's own time
    deadline = time.time() + kt.slow(30)
    while time.time() < deadline and (heartbeats(src.console) or [(0, 0)])[-1][0] < age_s * 1000:
        time.sleep(0.1)
    w0 = time.time()
    r = kt.migrate(src, dst, uri, params={"max-bandwidth": 0}, timeout=kt.slow(60))
    assert r.get("status") == "completed", "query-migrate %r; %s" % (r, kt.dump(src))
    m = dst.console.wait(r"^heartbeat", kt.slow(20), proc=dst.proc)
    w2 = time.time()
    assert m is not None, "the guest is silent on the destination: %s" % kt.dump(dst)
    s_t = heartbeats(src.console)[-1][0]
    d_t, d_gap = heartbeats(dst.console)[0]
    wall_ms = (w2 - w0) * 1000
    print("# source's last heartbeat t_ms=%d, destination's first t_ms=%d (gap_ms=%d); "
          "wall %.0f ms from migrate to that line; downtime %s ms"
          % (s_t, d_t, d_gap, wall_ms, r.get("downtime")))
    check("not_backwards", d_t >= s_t, "guest clock went back from %d to %d ms" % (s_t, d_t))
    # the guest's view of the downtime: the gap before its first heartbeat
    # on the destination is the switchover plus at most one period; it
    # cannot be much shorter than the pause the source reports (the guest's
    # clock runs on across it) nor longer beyond scheduling slack
    down = r.get("downtime", -1)
    check("guest_sees_the_downtime", down >= 0
          and down / 2 - 50 <= d_gap <= down + REPORT_MS + kt.slow(250),
          "first heartbeat on the destination after a %d ms gap; downtime %d ms" % (d_gap, down))
    # between the two lines no more guest time may pass than wall time did
    # (plus one heartbeat period and scheduling slack)
    check("not_ahead_of_wall_clock", d_t - s_t <= wall_ms + REPORT_MS + 300,
          "guest clock advanced %d ms across the migration while %.0f ms of wall time "
          "passed" % (d_t - s_t, wall_ms))
    # and it keeps running at the wall clock's pace on the destination
    t1, n1 = time.time(), heartbeats(dst.console)[-1][0]
    time.sleep(2)
    t2, n2 = time.time(), heartbeats(dst.console)[-1][0]
    check("runs_on", n2 > n1, "no heartbeat in 2 s on the destination: %s" % kt.dump(dst))
    check("pace", n2 - n1 <= (t2 - t1) * 1000 + REPORT_MS + 300,
          "guest clock ran %d ms in %.0f ms of wall time" % (n2 - n1, (t2 - t1) * 1000))
