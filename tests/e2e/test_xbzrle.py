"""xbzrle (docs/protocol.md "XBZRLE"): once the bulk pass is over, a page the
destination already holds goes as the bytes that changed since the copy
the source's cache keeps of it.

Each migration first holds the switchover off (a downtime limit of 0 ms,
which only a round with nothing left to send would meet, and these
guests always write; the rounds are held to 20 MB/s, so that the guest
runs in them) until the source has sent deltas (for the stress guest
1024, of its own pages) and at least three dirty syncs have passed, then
allows it (30 s): the checks do not depend on how fast the machine is.

- test_stress_deltas: the stress guest writes one byte of each page per
  sweep, xbzrle's best case: the deltas are a few bytes each, x-verify
  passes, the destination's guest runs; query-migrate's "xbzrle-cache"
  has QEMU's fields; kmig migrate's summary line names the deltas.
- test_verify_guest: the verify guest rewrites whole pages (their deltas
  overflow and the pages go whole) and is caught mid-page (partial
  deltas); 2 vCPUs; x-verify and the guest's own check pass.
- test_postcopy_after_deltas: pre-copy rounds with deltas, then
  migrate-start-postcopy: the destination takes whole pages from the
  switch on; x-verify's post-copy sum passes and the guest runs on.
- test_catches (negative control; the build-san binary): KMIG_FAULT=
  xbzrle-flip flips one byte of one delta of the final pass; x-verify
  must fail the migration and the source's guest run on.
- test_refusals: xbzrle-cache-size not a power of two, or below a page;
  xbzrle with multifd (QEMU's words); kmig migrate's --xbzrle checks.
"""
import os
import re
import subprocess
import sys
import time

import pytest

import kmigtest as kt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # its sibling's helpers
from test_postcopy import (  # noqa: E402
    booted, check_dst_runs, check_verified, completed_postcopy, dump, tcp_uri)

pytestmark = pytest.mark.kvm

STRESS = "workload=stress mb=32 report_ms=300"
VERIFY = "workload=verify mb=%d cpus=%d report_ms=300"
MISMATCH = "destination failed: END: guest RAM checksum mismatch (pages lost or corrupted)"
HOLD = {"downtime-limit": 0}
# rounds held to 20 MB/s: the sender sleeps, so the guest runs in them (on
# a loaded emulated host an unlimited sender kept a stress guest from
# writing for rounds on end, which then found nothing to send and ended
# the migration with no deltas of its pages)
LIMIT = 20000000
STRESS_DELTAS = 1024    # of its 8192 pages: the stress guest's own


def pair(d, vms, cmdline, cpus=1, kmig=None, env=None):
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", cmdline, memory="256M", cpus=cpus, kmig=kmig, env=env)
    dst = kt.kmig_vm(d, "dst", cmdline, memory="256M", cpus=cpus, kmig=kmig,
                     extra=["--incoming", uri])
    vms += [src, dst]
    return src, dst, uri


def hold_until_deltas(q, timeout, release=True, overflow=False, pages=1):
    """Waits (the switchover held off) until that many deltas went out
    (and, with overflow, a delta too long went whole) and three dirty
    syncs passed; then (release) allows the switchover.  Returns the last
    reply."""
    deadline = time.time() + timeout
    r = {}
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL:
            break
        xb = r.get("xbzrle-cache", {})
        if (xb.get("pages", 0) >= pages and (not overflow or xb.get("overflow", 0) > 0) and
                r.get("ram", {}).get("dirty-sync-count", 0) >= 3):
            break
        time.sleep(0.1)
    if release:
        q.cmd("migrate-set-parameters", **{"downtime-limit": 30000})
    return r


def start(src, dst, uri, caps=None):
    q = src.qmp()
    kt.set_caps(q, **dict({"xbzrle": True, "x_verify": True}, **(caps or {})))
    q.cmd("migrate-set-parameters", **dict(HOLD, **{"max-bandwidth": LIMIT}))
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    return q


def test_stress_deltas(d, vms, check):
    src, dst, uri = pair(d, vms, STRESS)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    q = start(src, dst, uri)
    mid = hold_until_deltas(q, kt.slow(120), pages=STRESS_DELTAS)
    r = kt.wait_migration(q, kt.slow(60))
    xb = r.get("xbzrle-cache", {})
    print("# stress_deltas: held %r; xbzrle %r; ram %r" % (mid.get("xbzrle-cache"), xb,
                                                         r.get("ram")))
    check("completed", r.get("status") == "completed", "query-migrate %r; %s" % (r, dump(dst)))
    check("qemu_fields", set(xb) >= {"cache-size", "bytes", "pages", "cache-miss",
                                     "cache-miss-rate", "encoding-rate", "overflow"}, repr(xb))
    check("cache_size", xb.get("cache-size") == 64 << 20, repr(xb))
    check("deltas", xb.get("pages", 0) >= STRESS_DELTAS, repr(xb))
    # one byte per page changed: a delta is its 10-byte head and 3 bytes
    check("small_deltas", xb.get("bytes", 1 << 30) <= 16 * max(xb.get("pages", 0), 1), repr(xb))
    check("encoding_rate", xb.get("encoding-rate", 0) > 100, repr(xb))
    check("misses", 0 < xb.get("cache-miss", 0), repr(xb))   # the first round after the bulk pass
    n = len(dst.console.lines)
    check("dst_runs", dst.console.wait(r"^stress cpu=0", kt.slow(20), start=n, proc=dst.proc)
          is not None, dump(dst))
    check("dst_running", dst.qmp().cmd("query-status").get("status") == "running")


def test_verify_guest(d, vms, check):
    src, dst, uri = pair(d, vms, VERIFY % (48, 2), cpus=2)
    if not check("boot", booted(src, 2), dump(src)):
        return
    q = start(src, dst, uri)
    mid = hold_until_deltas(q, kt.slow(120), overflow=True)
    r = kt.wait_migration(q, kt.slow(60))
    xb = r.get("xbzrle-cache", {})
    print("# verify_guest: held %r; xbzrle %r" % (mid.get("xbzrle-cache"), xb))
    check("completed", r.get("status") == "completed", "query-migrate %r; %s" % (r, dump(dst)))
    check("deltas", xb.get("pages", 0) > 0, repr(xb))
    check("overflows", xb.get("overflow", 0) > 0, repr(xb))   # whole pages rewritten
    n = len(dst.console.lines)
    ok = [dst.console.wait(r"^verify ok round=\d+ cpu=%d" % c, kt.slow(30), start=n,
                           proc=dst.proc) for c in (0, 1)]
    check("dst_verify_ok", all(ok), dump(dst))
    check("no_verify_bad", dst.console.count("verify BAD") == 0, dump(dst))


def test_postcopy_after_deltas(d, vms, check):
    src, dst, uri = pair(d, vms, VERIFY % (48, 1))
    if not check("boot", booted(src, 1), dump(src)):
        return
    kt.set_caps(dst.qmp(), postcopy_ram=True)
    q = start(src, dst, uri, {"postcopy_ram": True})
    mid = hold_until_deltas(q, kt.slow(120), release=False)
    if not check("active_at_the_switch", mid.get("status") == "active", repr(mid)):
        return
    q.cmd("migrate-start-postcopy")
    r, seen = kt.follow(q, kt.slow(90))
    print("# postcopy_after_deltas: held %r; statuses %r; xbzrle %r"
          % (mid.get("xbzrle-cache"), seen, r.get("xbzrle-cache")))
    check("deltas_first", mid.get("xbzrle-cache", {}).get("pages", 0) > 0, repr(mid))
    if not completed_postcopy(check, src, dst, r, seen):
        return
    check_verified(check, dst)
    check_dst_runs(check, src, dst)


def test_catches(d, vms, check):
    if not os.path.exists(kt.KMIG_FAULTS):
        pytest.fail("no fault build at %s (make SAN=1)" % kt.KMIG_FAULTS)
    src, dst, uri = pair(d, vms, STRESS, kmig=kt.KMIG_FAULTS, env={"KMIG_FAULT": "xbzrle-flip"})
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    q = start(src, dst, uri)
    hold_until_deltas(q, kt.slow(120), pages=STRESS_DELTAS)
    r = kt.wait_migration(q, kt.slow(60))
    print("# catches: status %r, error-desc %r" % (r.get("status"), r.get("error-desc")))
    check("fault_injected", "fault injected: xbzrle-flip" in src.output(), dump(src))
    check("failed", r.get("status") == "failed" and r.get("error-desc") == MISMATCH,
          "query-migrate %r" % r)
    check("src_running", q.cmd("query-status").get("status") == "running", dump(src))
    n = len(src.console.lines)
    check("guest_goes_on", src.console.wait(r"^stress cpu=0", kt.slow(20), start=n,
                                            proc=src.proc) is not None, dump(src))
    check("dst_exits_1", dst.wait_exit(kt.slow(20)) == 1, dump(dst))


def test_refusals(d, vms, check):
    vm = kt.kmig_vm(d, "vm", "workload=idle report_ms=300", memory="128M")
    vms.append(vm)
    q = vm.qmp()
    p = q.cmd("query-migrate-parameters")
    check("default_size", p.get("xbzrle-cache-size") == 64 << 20, repr(p))
    for size in (3 << 20, 2048, 0):
        rep = q.cmd_full("migrate-set-parameters", **{"xbzrle-cache-size": size})
        check("size_%d_refused" % size, "power of two no less than the target page size"
              in rep.get("error", {}).get("desc", ""), repr(rep))
    q.cmd("migrate-set-parameters", **{"xbzrle-cache-size": 8 << 20})
    check("size_taken", q.cmd("query-migrate-parameters").get("xbzrle-cache-size") == 8 << 20)
    caps = {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}
    check("capability_listed", caps.get("xbzrle") is False, repr(caps))
    rep = q.cmd_full("migrate-set-capabilities",
                     capabilities=[{"capability": "xbzrle", "state": True},
                                   {"capability": "multifd", "state": True}])
    check("multifd_refused", rep.get("error", {}).get("desc") ==
          "Multifd is not compatible with xbzrle", repr(rep))
    caps = {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}
    check("left_off", not caps.get("xbzrle") and not caps.get("multifd"), repr(caps))
    for args, want in ((["--xbzrle", "3"], "a power of two"),
                       (["--xbzrle", "64", "--multifd", "2"], "not compatible with xbzrle")):
        res = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + vm.qmp_path] + args +
                             [tcp_uri()], capture_output=True, text=True, timeout=30)
        check("cli_%s_refused" % "_".join(args[1::2]), res.returncode != 0 and
              want in res.stderr, "rc %r, %r" % (res.returncode, res.stderr))


def test_cli(d, vms, check):
    """kmig migrate --xbzrle 16: sets the capability and the cache, and the
    summary has the xbzrle line (how many deltas went depends on how many
    rounds the migration took: what they carry is test_stress_deltas')."""
    src, dst, uri = pair(d, vms, STRESS)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    kt.wait_incoming(dst)
    res = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path, "--xbzrle", "16",
                          "--verify", uri], capture_output=True, text=True,
                         timeout=kt.slow(180))
    print("# cli: rc %r\n%s" % (res.returncode, res.stdout))
    check("completed", res.returncode == 0 and "status completed" in res.stdout,
          "rc %r: %s %s" % (res.returncode, res.stdout, res.stderr[-400:]))
    m = re.search(r"^xbzrle: (\d+) pages sent as deltas", res.stdout, re.M)
    check("summary", m is not None, res.stdout)
    p = src.qmp().cmd("query-migrate-parameters")
    check("cache_set", p.get("xbzrle-cache-size") == 16 << 20, repr(p))
    caps = {c["capability"]: c["state"] for c in src.qmp().cmd("query-migrate-capabilities")}
    check("capability_set", caps.get("xbzrle") is True, repr(caps))
