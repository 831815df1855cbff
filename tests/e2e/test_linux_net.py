"""A stock Linux guest serves TCP across a live migration: Debian's own
kernel with Linux's own virtio_net bound to kmig's virtio-net-pci (inside
scripts/kvm-vm where this machine's KVM cannot run Linux), memcheck verify
rewriting 64 MiB, eth0 at 10.77.0.10 on host A's bridge (scripts/two-hosts)
and a TCP server in the guest streaming numbered lines (guest/linux/init
kmig.serve, one line every 10 ms).  A client in the client namespace reads
them while the guest migrates from host A to host B with x-verify:

  tcp_across_migration  completed; the connection is never reset nor
      closed, every line arrives once and in order, and lines keep coming
      after the switchover (now through B: A's bridge learned the guest's
      MAC on the wire); the longest stall, the lines and the client's
      retransmitted segments are printed; Linux negotiated what kmig offers
      (MRG_RXBUF, CTRL_VQ, GUEST_ANNOUNCE: the driver acknowledged the
      destination's announcements); memcheck found no page wrong and the
      console shows no warning, stall or oops.
"""
import time

import pytest

import kmigtest as kt
import linux_guest as lg
import netprobe
import twohosts

pytestmark = pytest.mark.linux

MAC = "52:54:00:4b:00:02"
GUEST_IP = "10.77.0.10"
PORT = 5000
NET = ["--netdev", "tap,id=n0,ifname=tap0,script=no",
       "--device", "virtio-net-pci,netdev=n0,mac=" + MAC]


def test_tcp_across_migration(d, vms, check):
    if not check("kernel", not lg.missing(), lg.missing()):
        return
    rd = lg.initramfs(d)
    cmd = lg.cmdline(64, 1, "kmig.ip=%s/24 kmig.serve=%d" % (GUEST_IP, PORT))
    with twohosts.topology() as h:
        uri = "tcp:%s:4445" % h["KMIG_NET_B"]
        src = lg.vm(d, "src", rd, cmd, memory="384M", extra=NET, netns=h["a"])
        dst = lg.vm(d, "dst", rd, cmd, memory="384M", extra=NET + ["--incoming", uri],
                    netns=h["b"])
        vms += [src, dst]
        up = src.console.wait(r"KMIG-LINUX serve port=%d" % PORT, kt.slow(180), proc=src.proc)
        if not check("serving", up is not None and
                     src.console.wait(lg.REPORT_OK, kt.slow(60), proc=src.proc) is not None,
                     kt.dump(src, 30)):
            return
        check("net_up", "KMIG-LINUX net eth0 mac=%s ip=%s/24" % (MAC, GUEST_IP) in
              src.console.text(), kt.dump(src, 30))
        start = lg.init_line(src)
        reader = netprobe.tcplines(GUEST_IP, PORT, netns=h["c"])
        time.sleep(kt.slow(2))
        r = kt.migrate(src, dst, uri, caps={"x-verify": True},
                       params={"max-bandwidth": 64 << 20}, timeout=kt.slow(240))
        done = time.monotonic()
        time.sleep(kt.slow(4))
        t = reader.stop()
        if not check("completed", r.get("status") == "completed",
                     "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
            return
        print("# tcp_across_migration: downtime %s ms, %d lines, longest stall %.0f ms "
              "(ending %.0f ms after completion), %d segments retransmitted" %
              (r.get("downtime"), t["lines"], t["max_gap"] * 1000,
               ((t["gap_at"] or done) - done) * 1000, t["retrans"]))
        check("no_reset", t["error"] is None, repr(t))
        check("in_order", t["bad"] == 0 and t["lines"] > 0, repr(t))
        check("lines_after", t["last"] is not None and t["last"] > done + 1.0, repr(t))
        check("fdb_wire", twohosts.fdb_port(h["a"], MAC) == "wire0",
              twohosts.fdb_port(h["a"], MAC))
        f = dst.qmp().cmd("query-rx-filter")
        c = f[0]["x-counters"] if f else {}
        check("guest_announced", c.get("announcements", 0) >= 1 and c.get("ctrl-commands", 0) >= 1
              and c.get("ctrl-errors", 1) == 0, repr(f))
        # the destination's console holds only what the guest wrote there
        check("memcheck_ok", dst.console.wait(lg.REPORT_OK, kt.slow(60), proc=dst.proc)
              is not None, kt.dump(dst, 20))
        bad = lg.bad_lines(dst) + lg.bad_lines(src, start)
        check("console_clean", not bad, " / ".join(bad[:5]))
