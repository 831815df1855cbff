"""virtio-net across a live migration, with the test guest's driver (net=1:
a UDP echo responder), on two "hosts" built from network namespaces
(scripts/two-hosts): the source kmig in host A with A's tap, the
destination in host B with B's, the migration stream over the wire between
them, the client probing the guest from its own namespace on A's bridge.

  udp_across_migration  a guest under verify load answers probes (one
      every 10 ms) before, during and after a migration A -> B with
      x-verify over TLS (PSK, on both sides; auto-converge, as TLS under
      emulation carries about what the guest dirties): completed, every echo intact, replies after the switchover
      come through B (A's bridge learned the guest's MAC on the wire from
      the destination's RARP announcements, 5 rounds counted), the source
      counted the frames it dropped at the switchover; set_link down stops
      the echoes and up brings them back; query-rx-filter names the MAC;
      a second kmig on the same tap is refused (busy), and one naming a
      netdev nobody defined never starts;
  cancel_then_postcopy  with the device present: a migration cancelled in
      its bulk pass leaves the source answering (dirty logging off, echoes
      go on, nothing pending on the device); then post-copy with 2 multifd
      channels to a new destination completes with x-verify while probed,
      and the guest answers from B; query-rx-filter answers on the
      destination all along;
  device_marks_negative_control  the same migration with the source's
      device writes left unreported (KMIG_FAULT=no-device-marks, test
      build): x-verify finds the destination's RAM differs (the received
      frames and used rings it never got), so the marks are what keeps
      them.
Longest gap in replies, probes lost and the first reply after the
switchover are printed (timings under emulation are not performance).
"""
import os
import re
import subprocess
import time

import pytest

import kmigtest as kt
import netprobe
import twohosts

pytestmark = pytest.mark.kvm

MAC = "52:54:00:4b:00:01"
GUEST_IP = "10.77.0.10"
PORT = 7777
CMDLINE = "workload=verify mb=32 report_ms=300 net=1 ip=%s udp_port=%d" % (GUEST_IP, PORT)
NET = ["--netdev", "tap,id=n0,ifname=tap0,script=no",
       "--device", "virtio-net-pci,netdev=n0,mac=" + MAC]


@pytest.fixture
def hosts():
    with twohosts.topology() as h:
        yield h


def psk(d):
    """--object arguments of a PSK credential "k0" (tests/lib/make-certs.sh)."""
    keys = os.path.join(d, "keys")
    subprocess.run([os.path.join(kt.ROOT, "tests/lib/make-certs.sh"), keys], check=True)
    return ["--object", "tls-creds-psk,id=k0,dir=%s/psk" % keys]


def start_pair(d, vms, h, kmig=None, env=None, tls=()):
    """tls: --object arguments for both sides; the destination then takes
    only TLS (--tls-creds k0)."""
    src = kt.kmig_vm(d, "src", CMDLINE, memory="256M", extra=NET + list(tls), kmig=kmig,
                     env=env, netns=h["a"])
    vms.append(src)
    dst, uri = start_dst(d, vms, h, "dst", 4444, kmig=kmig,
                         extra=list(tls) + (["--tls-creds", "k0"] if tls else []))
    return src, dst, uri


def start_dst(d, vms, h, name, port, kmig=None, extra=()):
    uri = "tcp:%s:%d" % (h["KMIG_NET_B"], port)
    dst = kt.kmig_vm(d, name, CMDLINE, memory="256M",
                     extra=NET + list(extra) + ["--incoming", uri], kmig=kmig, netns=h["b"])
    vms.append(dst)
    return dst, uri


def link_up(vm):
    return vm.console.wait(r"^net: mac=%s ip=%s link=up" % (MAC, GUEST_IP), kt.slow(60),
                           proc=vm.proc) is not None


def echo_ok(h, n=20, interval_ms=20):
    p = netprobe.probe(GUEST_IP, PORT, interval_ms=interval_ms, netns=h["c"])
    time.sleep(n * interval_ms / 1000.0)
    r = p.stop()
    return len(r.replies), r


def counters(vm):
    f = vm.qmp().cmd("query-rx-filter")
    return f[0]["x-counters"] if f else {}


def test_udp_across_migration(d, vms, check, hosts):
    h = hosts
    src, dst, uri = start_pair(d, vms, h, tls=psk(d))
    if not check("link_up", link_up(src), kt.dump(src)):
        return
    q = src.qmp()
    f = q.cmd("query-rx-filter")
    check("rx_filter", len(f) == 1 and f[0]["main-mac"] == MAC and f[0]["name"] ==
          "virtio-net-pci.0", repr(f))
    n, r = echo_ok(h)
    if not check("echo_before", n >= 15 and not r.mismatched, r.summary()):
        return
    check("fdb_tap", twohosts.fdb_port(h["a"], MAC) == "tap0", twohosts.fdb_port(h["a"], MAC))
    # the link goes down and up: the guest sees it, echoes stop and resume
    q.cmd("set_link", name="n0", up=False)
    check("guest_link_down", src.console.wait(r"^net: mac=%s ip=\S+ link=down" % MAC,
                                              kt.slow(20), proc=src.proc) is not None)
    n, _ = echo_ok(h, n=10)
    check("no_echo_link_down", n == 0, "%d replies" % n)
    q.cmd("set_link", name="virtio-net-pci.0", up=True)
    n, _ = echo_ok(h)
    check("echo_link_up", n >= 15, "%d replies" % n)
    e = q.cmd_full("set_link", name="nothing", up=True).get("error", {})
    check("set_link_unknown", e.get("class") == "DeviceNotFound", repr(e))
    # a second VMM on the busy tap, one naming an undefined netdev
    busy = kt.kmig_vm(d, "busy", CMDLINE, memory="128M", extra=NET, netns=h["a"])
    vms.append(busy)
    rc = busy.wait_exit(kt.slow(30))
    check("busy_tap_refused", rc == 1 and "in use by another process" in busy.output(),
          "rc %r: %s" % (rc, busy.output()[-300:]))
    bad = kt.kmig_vm(d, "bad", CMDLINE, memory="128M", netns=h["a"],
                     extra=["--device", "virtio-net-pci,netdev=nope"])
    vms.append(bad)
    rc = bad.wait_exit(kt.slow(30))
    check("undefined_netdev", rc != 0 and "names no --netdev" in bad.output(),
          "rc %r: %s" % (rc, bad.output()[-300:]))
    # the migration, probed all along
    p = netprobe.probe(GUEST_IP, PORT, interval_ms=10, netns=h["c"])
    time.sleep(0.5)
    # auto-converge: under emulation TLS carries about what the guest
    # dirties (test_tls.py), so without it the migration need not end
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "auto-converge": True},
                   params={"max-bandwidth": 64 << 20, "tls-creds": "k0",
                           "downtime-limit": 1000, "x-cpu-throttle-policy": "computed"},
                   timeout=kt.slow(120))
    done = time.monotonic()
    time.sleep(kt.slow(3))
    pr = p.stop()
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    first = pr.first_reply_after(done)
    print("# udp_across_migration: downtime %s ms, longest gap in replies %.0f ms, "
          "%d of %d probes lost, first reply %.0f ms after completion" %
          (r.get("downtime"), pr.max_gap()[0] * 1000, pr.lost, len(pr.sent),
           (first - done) * 1000 if first else -1))
    check("tls_on_both", "TLS 1.3 with 'k0'" in src.output() and
          "TLS 1.3 with 'k0'" in dst.output(), src.output()[-300:] + dst.output()[-300:])
    check("echo_after", first is not None, pr.summary())
    check("echo_intact", not pr.mismatched, pr.summary())
    # the destination announced the guest: 5 rounds, and A's bridge now
    # sends the guest's frames over the wire
    deadline = time.time() + kt.slow(10)
    while counters(dst).get("announcements", 0) < 5 and time.time() < deadline:
        time.sleep(0.2)
    check("announced", counters(dst).get("announcements") == 5, repr(counters(dst)))
    check("fdb_wire", twohosts.fdb_port(h["a"], MAC) == "wire0", twohosts.fdb_port(h["a"], MAC))
    check("dst_rx", counters(dst).get("rx-frames", 0) > 0, repr(counters(dst)))
    check("src_dropped_counted", re.search(r"frames waiting in the tap at the switchover "
                                           r"were dropped", src.output()) is not None,
          src.output()[-400:])
    n, r2 = echo_ok(h)
    check("echo_on_b", n >= 15, r2.summary())
    bad = [l for l in dst.console.text().splitlines() if "verify BAD" in l or "net error" in l]
    check("guest_clean", not bad, " / ".join(bad[:3]))


def test_cancel_then_postcopy(d, vms, check, hosts):
    h = hosts
    src, dst, uri = start_pair(d, vms, h)
    if not check("link_up", link_up(src), kt.dump(src)):
        return
    q = src.qmp()
    # cancelled in the bulk pass (1 MiB/s: it cannot end first)
    kt.set_caps(q, x_verify=True)
    kt.set_params(q, max_bandwidth=1 << 20)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = kt.cancel_in_bulk(q, kt.slow(30))
    check("cancelled", r.get("status") == "cancelled" and r["ram"]["transferred"] > 0,
          repr(r))
    check("src_running", q.cmd("query-status").get("status") == "running",
          repr(q.cmd("query-status")))
    check("logging_off", not q.cmd("x-query-dirty-tracking").get("logging"),
          repr(q.cmd("x-query-dirty-tracking")))
    n, r0 = echo_ok(h)
    check("echo_after_cancel", n >= 15 and not r0.mismatched, r0.summary())
    # the source's connection ended in its stream: the destination fails
    check("dst_exited", dst.wait_exit(kt.slow(20)) is not None, kt.dump(dst))
    dst.kill()
    # post-copy with multifd to a new destination, probed all along
    dst2, uri2 = start_dst(d, vms, h, "dst2", 4446)
    dq = dst2.qmp()
    kt.set_caps(dq, postcopy_ram=True, multifd=True)
    kt.set_caps(q, postcopy_ram=True, multifd=True)
    kt.set_params(q, max_bandwidth=8 << 20, multifd_channels=2)
    kt.wait_incoming(dst2)
    p = netprobe.probe(GUEST_IP, PORT, interval_ms=10, netns=h["c"])
    q.cmd("migrate", uri=uri2)
    kt.wait_transferred(q, 24 << 20, kt.slow(60))
    q.cmd("migrate-start-postcopy")
    seen, st = set(), {}
    deadline = time.time() + kt.slow(120)
    while time.time() < deadline:
        st = q.cmd("query-migrate")
        seen.add(st.get("status"))
        # the destination's QMP answers while it runs the guest in post-copy
        if st.get("status") == "postcopy-active":
            check("dst_rx_filter", len(dq.cmd("query-rx-filter")) == 1)
        if st.get("status") in kt.MIG_FINAL:
            break
        time.sleep(0.1)
    done = time.monotonic()
    time.sleep(kt.slow(2))
    pr = p.stop()
    if not check("completed", st.get("status") == "completed" and "postcopy-active" in seen,
                 "%r %r; src %s; dst %s" % (st, seen, kt.dump(src), kt.dump(dst2))):
        return
    print("# cancel_then_postcopy: longest gap in replies %.0f ms, %d of %d probes lost" %
          (pr.max_gap()[0] * 1000, pr.lost, len(pr.sent)))
    check("echo_after_postcopy", pr.first_reply_after(done) is not None and not pr.mismatched,
          pr.summary())
    check("fdb_wire", twohosts.fdb_port(h["a"], MAC) == "wire0",
          twohosts.fdb_port(h["a"], MAC))
    bad = [l for l in dst2.console.text().splitlines() if "verify BAD" in l or "net error" in l]
    check("guest_clean", not bad, " / ".join(bad[:3]))


@pytest.mark.slow   # under emulation a minute and more: make test-full runs it there
def test_device_marks_negative_control(d, vms, check, hosts):
    h = hosts
    src, dst, uri = start_pair(d, vms, h, kmig=kt.KMIG_FAULTS,
                               env={"KMIG_FAULT": "no-device-marks"})
    if not check("link_up", link_up(src), kt.dump(src)):
        return
    p = netprobe.probe(GUEST_IP, PORT, interval_ms=5, netns=h["c"])
    time.sleep(0.5)
    # auto-converge: natively the guest rewrites its 32 MiB faster than
    # the downtime limit lets the last pass go
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "auto-converge": True},
                   params={"max-bandwidth": 64 << 20}, timeout=kt.slow(120))
    p.stop()
    out = src.output() + dst.output()
    check("fault_injected", "fault injected: no-device-marks" in src.output(),
          src.output()[-300:])
    check("verify_failed", r.get("status") == "failed", repr(r))
    # the reason is read from query-migrate: the VMMs' own log lines may
    # still be on their way when the status reads failed
    check("checksum_reason", "guest RAM checksum mismatch" in (r.get("error-desc") or ""),
          "%r; output %s" % (r, out[-500:]))
