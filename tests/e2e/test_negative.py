"""Negative controls: kmig's loss checks can fail.

A source built with the test-only fault hooks (`make SAN=1`, build-san/:
src/mig/send/fault.h) breaks a migration on purpose, once, as KMIG_FAULT asks:
the final pass leaves out one dirty page (skip-page), sends a copy an
earlier pass sent (stale-page), or a page is sent again with one byte
flipped (flip-byte); or one state section is not sent (drop-state).  The
target page lies in the verify guest's own memory (cpu 0's share, whose
place the guest prints at boot and which is the same for the same
command line and memory size).

Each fault must be caught:
- with x-verify, by the destination: status failed with the checksum
  mismatch as the reason, the source runs on, the destination exits 1
  and never ran the guest;
- without x-verify, by the guest on the destination, which checks every
  page before it rewrites it and after each round: "verify BAD" for the
  very page the source damaged;
- a missing state section, by the destination's section check.
A build without the hooks refuses KMIG_FAULT (the migration fails with a
reason and the source runs on).
"""
import re

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

VERIFY = "workload=verify mb=8 report_ms=200"
MEMORY = "128M"
SHARE_RX = r"^kmig-guest share cpu=0 base=0x([0-9a-f]+) pages=(\d+)"
FAULT_RX = r"fault injected: (\S+): page \d+ \(gpa 0x([0-9a-f]+)\)"
MISMATCH = "destination failed: END: guest RAM checksum mismatch (pages lost or corrupted)"
# the whole share (8 MiB) fits in the downtime limit: the migration converges
# at the first sync after the bulk pass, whose final pass holds share pages
PARAMS = {"max-bandwidth": 16 << 20, "downtime-limit": 2000}


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=12):
    return kt.dump(vm, n)


@pytest.fixture(scope="module")
def share():
    """(base, end) of cpu 0's verify share for VERIFY on MEMORY."""
    d = kt.tmpdir()
    vm = kt.kmig_vm(d, "probe", VERIFY, memory=MEMORY)
    try:
        m = vm.console.wait(SHARE_RX, kt.slow(30), proc=vm.proc)
    finally:
        vm.kill()
    assert m, "the verify guest printed no share line: %s" % kt.dump(vm)
    base = int(m.group(1), 16)
    return base, base + int(m.group(2)) * 4096


def pair(d, vms, fault, dst_kmig=None, tag=""):
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src" + tag, VERIFY, memory=MEMORY, kmig=kt.KMIG_FAULTS,
                     env={"KMIG_FAULT": fault})
    dst = kt.kmig_vm(d, "dst" + tag, VERIFY, memory=MEMORY, kmig=dst_kmig or kt.KMIG_FAULTS,
                     extra=["--incoming", uri])
    vms += [src, dst]
    return src, dst, uri


def verified_rounds(vm, start=0):
    return vm.console.wait(r"^verify ok round=\d+ cpu=0", kt.slow(20), start=start,
                           proc=vm.proc) is not None


def fault_line(src):
    m = re.search(FAULT_RX, src.output())
    return (m.group(1), int(m.group(2), 16)) if m else None


# multifd-zstd: the pages travel on two compressed channels, the damaged
# copy on the main stream after the final SYNC
@pytest.mark.parametrize("fault,transport", [
    ("skip-page", "main"), ("stale-page", "main"), ("flip-byte", "main"),
    ("skip-page", "multifd-zstd"), ("flip-byte", "multifd-zstd")])
def test_xverify_catches(d, vms, check, share, fault, transport):
    caps, params = {"x-verify": True}, dict(PARAMS)
    if transport == "multifd-zstd":
        caps["multifd"] = True
        params.update({"multifd-channels": 2, "x-compression": "zstd"})
    # a fault acts on the final pass's pages of the share; once under
    # emulation (of many runs) that pass held none stale-page could use and
    # the migration completed untouched: such a run proves nothing either
    # way, and one more migration is made (one that fires is judged as it is)
    for attempt in range(2):
        src, dst, uri = pair(d, vms, "%s@0x%x-0x%x" % ((fault,) + share),
                             tag=str(attempt or ""))
        if not check("boot", verified_rounds(src), dump(src)):
            return
        r = kt.migrate(src, dst, uri, caps=caps, params=params, timeout=kt.slow(60))
        got = fault_line(src)
        if got is not None or attempt or "fault not injected" not in src.output():
            break
        print("# xverify_catches[%s-%s]: the fault found nothing to act on (%r); once more"
              % (fault, transport, r.get("status")))
        src.kill()
        dst.kill()
    print("# xverify_catches[%s-%s]: fault %r, error-desc %r"
          % (fault, transport, got, r.get("error-desc")))
    check("fault_injected", got is not None and got[0] == fault
          and share[0] <= got[1] < share[1], dump(src))
    check("failed", r.get("status") == "failed" and r.get("error-desc") == MISMATCH,
          "query-migrate %r" % r)
    check("src_running", src.qmp().cmd("query-status").get("status") == "running", dump(src))
    src.console.poll()
    check("guest_goes_on", verified_rounds(src, len(src.console.lines)), dump(src))
    check("dst_exits_1", dst.wait_exit(kt.slow(20)) == 1, dump(dst))
    check("dst_never_ran", dst.console.count(r"^verify ok") == 0, dump(dst))


@pytest.mark.parametrize("fault", ["skip-page", "stale-page", "flip-byte"])
def test_guest_catches(d, vms, check, share, fault):
    src, dst, uri = pair(d, vms, "%s@0x%x-0x%x" % ((fault,) + share))
    if not check("boot", verified_rounds(src), dump(src)):
        return
    r = kt.migrate(src, dst, uri, params=PARAMS, timeout=kt.slow(60))
    got = fault_line(src)
    print("# guest_catches[%s]: fault %r, status %r" % (fault, got, r.get("status")))
    if not check("fault_injected", got is not None and got[0] == fault
                 and share[0] <= got[1] < share[1], dump(src)):
        return
    check("completed", r.get("status") == "completed", "query-migrate %r" % r)
    want = r"^verify BAD page=0x%x cpu=0 round=\d+ word=(\d+)" % got[1]
    m = dst.console.wait(want, kt.slow(30), proc=dst.proc)
    print("# guest_catches[%s]: %s" % (fault, m.group(0) if m else None))
    check("guest_reports_the_page", m is not None, "want /%s/; %s" % (want, dump(dst, 20)))
    if fault == "flip-byte" and m:
        check("flipped_word", int(m.group(1)) == 100 // 8, m.group(0))
    bad = re.findall(r"^verify BAD page=0x([0-9a-f]+)", dst.console.text(), re.M)
    check("only_that_page", all(int(a, 16) == got[1] for a in bad), "BAD pages %r" % bad)


def test_drop_state(d, vms, check, share):
    src, dst, uri = pair(d, vms, "drop-state=lapic")
    if not check("boot", verified_rounds(src), dump(src)):
        return
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params=PARAMS, timeout=kt.slow(60))
    print("# drop_state: error-desc %r" % r.get("error-desc"))
    check("fault_injected", "fault injected: drop-state: section lapic" in src.output(),
          dump(src))
    want = r"destination failed: state section lapic \(\d+\) instance 0 missing \(\d+ of \d+ arrived\)"
    check("failed", r.get("status") == "failed"
          and re.fullmatch(want, r.get("error-desc") or "") is not None, "query-migrate %r" % r)
    check("src_running", src.qmp().cmd("query-status").get("status") == "running", dump(src))
    check("dst_exits_1", dst.wait_exit(kt.slow(20)) == 1, dump(dst))
    check("dst_never_ran", dst.console.count(r"^verify ok") == 0, dump(dst))


def test_hooks_absent(d, vms, check):
    """kmig built without the hooks refuses KMIG_FAULT: the migration fails
    with the reason and the source runs on."""
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", "workload=idle report_ms=200", memory=MEMORY,
                     env={"KMIG_FAULT": "skip-page"})
    dst = kt.kmig_vm(d, "dst", "workload=idle report_ms=200", memory=MEMORY,
                     extra=["--incoming", uri])
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    if kt.KMIG == kt.KMIG_FAULTS:
        pytest.fail("KMIG_BUILD is the fault build; this test needs a normal build")
    r = kt.migrate(src, dst, uri, timeout=kt.slow(30))
    check("refused", r.get("status") == "failed" and "no fault hooks" in (r.get("error-desc") or ""),
          "query-migrate %r" % r)
    check("src_running", src.qmp().cmd("query-status").get("status") == "running", dump(src))


def test_xverify_catches_postcopy(d, vms, check, share):
    """Post-copy with x-verify: the push leaves one dirty page of the share
    out (and never sends it, asked for or not); the destination's post-copy
    checksum at END catches it."""
    src, dst, uri = pair(d, vms, "skip-page@0x%x-0x%x" % share)
    if not check("boot", verified_rounds(src), dump(src)):
        return
    for q in (dst.qmp(), src.qmp()):
        kt.set_caps(q, postcopy_ram=True)
    q = src.qmp()
    kt.set_caps(q, x_verify=True)
    # a low limit, so the switch comes after the bulk pass with share pages dirty
    kt.set_params(q, max_bandwidth=4 << 20, max_postcopy_bandwidth=4 << 20)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    kt.after_bulk_pass(q, kt.slow(60))
    q.cmd("migrate-start-postcopy")
    r = kt.wait_migration(q, kt.slow(60))
    got = fault_line(src)
    dr = dst.qmp().cmd("query-migrate")
    print("# xverify_catches_postcopy: fault %r, source %r, destination %r"
          % (got, r.get("error-desc"), dr.get("error-desc")))
    check("fault_injected", got is not None and got[0] == "skip-page"
          and share[0] <= got[1] < share[1], dump(src))
    check("src_failed", r.get("status") == "failed" and "checksum mismatch after post-copy"
          in r.get("error-desc", ""), "query-migrate %r" % r)
    check("dst_failed", dr.get("status") == "failed", repr(dr))
    check("src_stays_paused", q.cmd("query-status").get("status") == "paused",
          repr(q.cmd("query-status")))
