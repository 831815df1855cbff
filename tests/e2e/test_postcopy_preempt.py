"""postcopy-preempt (docs/protocol.md "Post-copy preempt"): the pages the
destination asks for in post-copy go on a connection of their own, so
they never wait behind the background push in the main stream's buffers.

- test_preempt: plain and under TLS, 2 vCPUs (the push follows one
  vCPU's faults, so the other's go on the channel), the channel opens at
  setup, carries every page the source answered (both sides count them),
  and the migration completes with x-verify; the destination's guest goes
  on with no page wrong.
- test_preempt_late: a test-only fault (KMIG_FAULT=preempt-late, the
  build-san binary) holds the channel's pages until END has gone on the
  main stream and 500 ms more, as a network that delays that connection
  would.  The destination must wait for them before it checks and
  finishes; x-verify and the guest's own check pass.  (Negative control:
  with the destination's wait taken out, this test fails.)
- test_preempt_recover: post-copy with the channel pauses (migrate-pause
  at the destination), recovers on a new link that reopens the channel
  (both sides open it twice), completes with x-verify.
- test_cli_preempt: kmig migrate --postcopy after-pass --preempt sets the
  capability on both sides (--dest-qmp) and completes; --preempt alone is
  refused.
- test_preempt_refusals: postcopy-preempt without postcopy-ram, with a
  file: URI, and to a destination without the capability (the source's
  guest runs on).
"""
import os
import re
import sys
import time

import pytest

import kmigtest as kt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # its sibling's helpers
from test_postcopy import (  # noqa: E402
    LIMIT, RING, VERIFY, booted, check_dst_runs, check_verified, cli,
    completed_postcopy, dump, psk_creds, tcp_uri, wait_status)

pytestmark = pytest.mark.kvm


def pair(d, vms, uri, extra=(), dst_extra=(), kmig=None, env=None, mb=96, cpus=1):
    src = kt.kmig_vm(d, "src", VERIFY % (mb, cpus), memory="512M", cpus=cpus,
                     extra=list(RING) + list(extra), kmig=kmig, env=env)
    dst = kt.kmig_vm(d, "dst", VERIFY % (mb, cpus), memory="512M", cpus=cpus,
                     extra=list(RING) + list(extra) + list(dst_extra) + ["--incoming", uri],
                     kmig=kmig)
    vms += [src, dst]
    return src, dst


def start(src, dst, uri, params=None, dst_preempt=True):
    """postcopy-ram and postcopy-preempt on both sides (the destination's
    preempt as asked), x-verify; the push held to LIMIT so the guest
    faults on pages still at the source."""
    kt.set_caps(dst.qmp(), postcopy_ram=True, postcopy_preempt=dst_preempt)
    q = src.qmp()
    kt.set_caps(q, postcopy_ram=True, postcopy_preempt=True, x_verify=True)
    kt.set_params(q, **dict({"max_bandwidth": LIMIT, "max_postcopy_bandwidth": LIMIT},
                            **(params or {})))
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    return q


def to_postcopy(check, q):
    kt.after_bulk_pass(q, kt.slow(60))
    q.cmd("migrate-start-postcopy")
    r = wait_status(q, "postcopy-active", kt.slow(20))
    return check("postcopy_active", r.get("status") == "postcopy-active", repr(r))


def dst_completed(check, dst):
    """The destination's query-migrate once it ended: completed."""
    dq = kt.wait_migration(dst.qmp(), kt.slow(20))
    check("dst_completed", dq.get("status") == "completed", repr(dq))
    return dq


def preempt_pages(r):
    return r.get("x-postcopy-preempt", {}).get("pages", -1)


def check_counted(check, src, r, dq):
    """Both sides counted the pages the channel carried: the source what it
    sent, the destination what it placed from it; every request the source
    answered went there (the others were for pages already on their way:
    the push follows the faults)."""
    sent, placed = preempt_pages(r), preempt_pages(dq)
    asked = r.get("ram", {}).get("postcopy-requests", 0)
    m = re.search(r"post-copy: (\d+) requests for pages already on their way", src.output())
    dups = int(m.group(1)) if m else -1
    print("# preempt: %d requests, %d for pages on their way, %d pages sent on the channel, "
          "%d placed from it" % (asked, dups, sent, placed))
    check("preempt_pages", 0 < sent and dups >= 0 and sent + dups <= asked and
          0 < placed <= sent, "requests %d, on their way %d, sent %d, placed %d; %r / %r"
          % (asked, dups, sent, placed, r, dq))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_preempt(d, vms, check, tls):
    uri = tcp_uri()
    extra, params = [], {}
    if tls:
        extra = ["--object", psk_creds(d)]
        params["tls_creds"] = "k0"
    # two vCPUs walking their own halves: the push follows one, the other
    # faults on pages it has not reached, which go on the channel
    src, dst = pair(d, vms, uri, extra, ["--tls-creds", "k0"] if tls else (), mb=64, cpus=2)
    if not check("boot", booted(src, 2), dump(src)):
        return
    caps = {c["capability"]: c["state"] for c in src.qmp().cmd("query-migrate-capabilities")}
    check("listed", caps.get("postcopy-preempt") is False, repr(caps))
    q = start(src, dst, uri, params)
    if not to_postcopy(check, q):
        return
    r, seen = kt.follow(q, kt.slow(90))
    if not completed_postcopy(check, src, dst, r, seen):
        return
    dq = dst_completed(check, dst)
    check("opened", "postcopy-preempt channel open" in src.output() and
          "postcopy-preempt channel open" in dst.output(),
          src.output()[-400:] + dst.output()[-400:])
    check_counted(check, src, r, dq)
    if tls:     # the main stream and the channel, each its own session
        check("tls_both", src.output().count("TLS 1.3 with 'k0'") == 1 and
              dst.output().count("TLS 1.3 with 'k0'") == 1, src.output()[-600:])
    check_verified(check, dst)
    check_dst_runs(check, src, dst)


def test_preempt_late(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, uri, kmig=kt.KMIG_FAULTS, env={"KMIG_FAULT": "preempt-late"})
    if not check("boot", booted(src, 1), dump(src)):
        return
    q = start(src, dst, uri)
    if not to_postcopy(check, q):
        return
    r, seen = kt.follow(q, kt.slow(90))
    check("fault_fired", "fault injected: preempt-late" in src.output(), src.output()[-600:])
    if not completed_postcopy(check, src, dst, r, seen):
        return
    dq = dst_completed(check, dst)
    check_counted(check, src, r, dq)
    check_verified(check, dst)
    check_dst_runs(check, src, dst)


def test_preempt_recover(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, uri, mb=128)
    if not check("boot", booted(src, 1), dump(src)):
        return
    # the push held back further: the pause lands with pages still here
    q, dq = start(src, dst, uri, {"max_postcopy_bandwidth": LIMIT // 4}), dst.qmp()
    if not to_postcopy(check, q):
        return
    rd = wait_status(dq, "postcopy-active", kt.slow(20))
    if not check("dst_postcopy_active", rd.get("status") == "postcopy-active", repr(rd)):
        return
    dq.cmd("migrate-pause")     # both links go; the source pauses too
    rs = wait_status(q, "postcopy-paused", kt.slow(20))
    rd = wait_status(dq, "postcopy-paused", kt.slow(20))
    if not check("paused", rs.get("status") == "postcopy-paused" and
                 rd.get("status") == "postcopy-paused", "%r / %r" % (rs, rd)):
        return
    uri2 = tcp_uri()
    dq.cmd("migrate-recover", uri=uri2)
    r = wait_status(dq, "postcopy-recover", kt.slow(10))
    check("dst_recover", r.get("status") == "postcopy-recover", repr(r))
    kt.set_params(q, max_postcopy_bandwidth=0)
    q.cmd("migrate", uri=uri2, resume=True)
    r, seen = kt.follow(q, kt.slow(90))
    print("# preempt_recover: statuses after the resume %r" % seen)
    if not check("completed", r.get("status") == "completed",
                 "query-migrate %r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    dst_completed(check, dst)
    # the channel again on the recovery's link, on both sides
    check("reopened", src.output().count("postcopy-preempt channel open") == 2 and
          dst.output().count("postcopy-preempt channel open") == 2,
          "%s / %s" % (src.output()[-600:], dst.output()[-600:]))
    check_verified(check, dst)
    check_dst_runs(check, src, dst)


def test_preempt_refusals(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, uri, mb=32)
    if not check("boot", booted(src, 1), dump(src)):
        return
    q = src.qmp()
    e = q.cmd_full("migrate-set-capabilities", capabilities=[
        {"capability": "postcopy-preempt", "state": True}]).get("error", {}).get("desc", "")
    check("needs_postcopy_ram", e == "Postcopy preempt requires postcopy-ram", e)
    kt.set_caps(q, postcopy_ram=True, postcopy_preempt=True)
    e = q.cmd_full("migrate", uri="file:" + d + "/save").get("error", {}).get("desc", "")
    check("file_refused", "postcopy-preempt needs a tcp: or unix: URI" in e, e)
    # a destination without the capability refuses the stream at PREEMPT
    kt.set_caps(dst.qmp(), postcopy_ram=True)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = kt.wait_migration(q, kt.slow(30))
    check("failed", r.get("status") == "failed" and
          "postcopy-preempt is not enabled" in r.get("error-desc", ""), repr(r))
    check("dst_exits", dst.proc.wait(kt.slow(20)) != 0, dump(dst))
    st = q.cmd("query-status").get("status")
    check("src_runs", st == "running", st)
    n = src.console.count(r"^verify ok")
    time.sleep(kt.slow(2))
    check("src_guest_runs", src.console.count(r"^verify ok") > n, dump(src))


def test_cli_preempt(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, uri, mb=64, cpus=2)
    if not check("boot", booted(src, 2), dump(src)):
        return
    r = cli(src.qmp_path, "--preempt", uri)
    check("needs_postcopy", r.returncode not in (0, None) and
          "--preempt needs --postcopy" in r.stderr, "%s %r" % (r.returncode, r.stderr))
    kt.wait_incoming(dst)
    r = cli(src.qmp_path, "--bandwidth", "20", "--postcopy", "after-pass", "--preempt",
            "--verify", "--dest-qmp", "unix:" + dst.qmp_path, uri, vms=(src, dst))
    print("# cli_preempt: status %s\n%s" % (r.returncode, r.stdout))
    if not check("completed", r.returncode == 0 and "status completed" in r.stdout,
                 "%s %r %r" % (r.returncode, r.stdout, r.stderr[-2000:])):
        return
    check("summary", re.search(r"^postcopy-preempt: \d+ pages asked for went on its channel$",
                               r.stdout, re.M) is not None, r.stdout)
    q, dq = src.qmp().cmd("query-migrate"), kt.wait_migration(dst.qmp(), kt.slow(20))
    check("both_sides", preempt_pages(q) >= 0 and preempt_pages(dq) >= 0 and
          "postcopy-preempt channel open" in dst.output(), "%r / %r" % (q, dq))
    check_verified(check, dst)
    check_dst_runs(check, src, dst)
