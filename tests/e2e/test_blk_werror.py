"""virtio-blk's error policy (werror/rerror, QEMU's) with a real guest:
the test guest's disk workload (disk=1, docs/guest.md: every block of
the region read, checked against the generation the guest last wrote,
rewritten) on a sparse 1 MiB image that lives on a tmpfs of 512 KiB, so
that the first round's writes run out of space half-way (ENOSPC).  Needs root
(it mounts the tmpfs); without it the test fails, it does not skip.

  enospc_stop_migrate_cont  with werror's default (enospc) the VM stops
      in io-error: BLOCK_IO_ERROR with QEMU's fields (operation write,
      action stop, nospace, the reason), STOP, query-status io-error
      (running false), query-block io-status nospace with requests kept;
      cont with the disk still full retries them and the VM stops again;
      the VM in io-error migrates (x-verify; shared image) and the
      destination comes up in io-error holding the same kept requests;
      after the tmpfs is grown, cont there retries them and the guest's
      rounds go on with no error: the next round reads every block back
      (the retried writes included) and finds none lost or wrong.
"""
import os
import re
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

CMDLINE = "workload=disk disk_mb=1 disk_rate=0 report_ms=300"


def reports(vm):
    return [(m.group(1), int(m.group(2))) for m in re.finditer(
        r"^disk (ok|bad) round=(\d+) ", vm.console.text(), re.M)]


def past_round(vm, n, timeout):
    """Waits for a disk report of a round after n (the guest reports
    every report_ms, several rounds apart when they are quick)."""
    deadline = time.time() + timeout
    while time.time() < deadline and vm.proc.poll() is None:
        if any(r > n for _, r in reports(vm)):
            return True
        time.sleep(0.2)
    return any(r > n for _, r in reports(vm))


def bad_lines(vm):
    return [line for line in vm.console.text().splitlines()
            if "disk BAD" in line or "disk error" in line]


def blk_args(img):
    return ["--drive", "file=%s,format=raw,if=none,id=d0" % img,
            "--device", "virtio-blk-pci,drive=d0,rerror=report"]


def test_enospc_stop_migrate_cont(d, vms, check):
    assert os.geteuid() == 0, "needs root: it mounts a small tmpfs for the image"
    small = os.path.join(d, "small")
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "kmig-werror", small], check=True)
    try:
        run(d, small, vms, check)
    finally:
        subprocess.run(["umount", "-l", small], check=False)


def stopped(q, vm, check, name):
    """Waits for BLOCK_IO_ERROR (action stop, ENOSPC) and STOP: io-error."""
    ev = q.wait_event("BLOCK_IO_ERROR", kt.slow(60))
    if not check(name + "_event", ev is not None, kt.dump(vm)):
        return False
    data = ev.get("data", {})
    check(name + "_fields", data.get("device") == "d0" and data.get("node-name") == "d0" and
          data.get("operation") == "write" and data.get("action") == "stop" and
          data.get("nospace") is True and data.get("reason") == os.strerror(28), repr(ev))
    check(name + "_stop", q.wait_event("STOP", kt.slow(10)) is not None, repr(q.events))
    st = q.cmd("query-status")
    return check(name + "_io_error", st.get("status") == "io-error" and
                 st.get("running") is False, repr(st))


def kept(q):
    b = q.cmd("query-block")[0]
    return b.get("io-status"), b.get("x-counters", {}).get("kept", 0)


def run(d, small, vms, check):
    img = os.path.join(small, "disk.img")
    subprocess.run(["truncate", "-s", "1M", img], check=True)
    # started paused: QMP is connected before the first write fails
    # (natively that is milliseconds after boot, and an event emitted
    # before a client connects reaches none)
    src = kt.kmig_vm(d, "src", CMDLINE, memory="128M", extra=blk_args(img) + ["-S"])
    vms.append(src)
    q = src.qmp()
    q.cmd("cont")
    if not stopped(q, src, check, "first"):
        return
    ios, n = kept(q)
    check("io_status", ios == "nospace" and n > 0, "%r %r" % (ios, n))
    # cont with the disk still full: retried, failed again, stopped again
    q.events.clear()
    q.cmd("cont")
    check("resume", q.wait_event("RESUME", kt.slow(10)) is not None, repr(q.events))
    if not stopped(q, src, check, "again"):
        return
    # the VM in io-error migrates with its kept requests
    ios, n = kept(q)
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = kt.kmig_vm(d, "dst", CMDLINE, memory="128M", extra=blk_args(img) + ["--incoming", uri])
    vms.append(dst)
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, timeout=kt.slow(60))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, kt.dump(src), kt.dump(dst))):
        return
    dq = dst.qmp()
    st = dq.cmd("query-status")
    check("dst_io_error", st.get("status") == "io-error", repr(st))
    check("dst_kept", kept(dq) == (ios, n), "%r, source had %r" % (kept(dq), (ios, n)))
    before = len(reports(dst))
    # room again: cont on the destination retries them, the guest goes on
    subprocess.run(["mount", "-o", "remount,size=8M", small], check=True)
    dq.cmd("cont")
    check("dst_running", dq.cmd("query-status").get("status") == "running", "")
    # round 2 reads back every block round 1 wrote (the retried writes
    # among them): a report of round 3 or later means it has checked them all
    check("round_2_done", past_round(dst, 2, kt.slow(30)), kt.dump(dst))
    r = reports(dst)
    check("reports_ok", len(r) > before and all(x[0] == "ok" for x in r), repr(r[-6:]))
    bad = bad_lines(src) + bad_lines(dst)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))
    check("retried", kept(dq) == ("ok", 0), repr(kept(dq)))
    check("no_other_stop", dq.cmd("query-status").get("status") == "running",
          repr(dq.events))
