"""virtio-blk's error policy (werror/rerror, QEMU's) with a real guest:
the test guest's disk workload (disk=1, docs/guest.md: every block of
the region read, checked against the generation the guest last wrote,
rewritten) on a sparse 4 MiB image that lives on a tmpfs of 1 MiB, so
that the first round's writes run out of space (ENOSPC).  Needs root
(it mounts the tmpfs); without it the test fails, it does not skip.

  enospc_stop_cont  with werror's default (enospc) the VM stops in
      io-error: BLOCK_IO_ERROR with QEMU's fields (operation write,
      action stop, nospace, the reason), STOP, query-status io-error
      (running false), query-block io-status nospace with requests kept;
      a migration is refused while they are kept (they would be lost);
      after the tmpfs is grown, cont resumes the VM, the kept writes are
      retried, and the guest's own rounds go on with no error: the next
      round reads every block back (each retried write included) and
      finds none lost or wrong.
"""
import os
import re
import subprocess

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

CMDLINE = "workload=disk disk_mb=4 disk_rate=0 report_ms=300"


def reports(vm):
    return [(m.group(1), int(m.group(2))) for m in re.finditer(
        r"^disk (ok|bad) round=(\d+) ", vm.console.text(), re.M)]


def bad_lines(vm):
    return [line for line in vm.console.text().splitlines()
            if "disk BAD" in line or "disk error" in line]


def mount_small(path, size):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "kmig-werror", path],
                   check=True)


def test_enospc_stop_cont(d, vms, check):
    assert os.geteuid() == 0, "needs root: it mounts a small tmpfs for the image"
    small = os.path.join(d, "small")
    mount_small(small, "1M")
    try:
        run_enospc(d, small, vms, check)
    finally:
        subprocess.run(["umount", "-l", small], check=False)


def run_enospc(d, small, vms, check):
    img = os.path.join(small, "disk.img")
    subprocess.run(["truncate", "-s", "4M", img], check=True)
    vm = kt.kmig_vm(d, "vm", CMDLINE, memory="128M", extra=[
        "--drive", "file=%s,format=raw,if=none,id=d0" % img,
        "--device", "virtio-blk-pci,drive=d0,rerror=report"])
    vms.append(vm)
    q = vm.qmp()
    ev = q.wait_event("BLOCK_IO_ERROR", kt.slow(60))
    if not check("io_error_event", ev is not None, kt.dump(vm)):
        return
    data = ev.get("data", {})
    check("event_fields", data.get("device") == "d0" and data.get("node-name") == "d0" and
          data.get("operation") == "write" and data.get("action") == "stop" and
          data.get("nospace") is True and data.get("reason") == os.strerror(28), repr(ev))
    check("stop_event", q.wait_event("STOP", kt.slow(10)) is not None, repr(q.events))
    st = q.cmd("query-status")
    check("io_error_status", st.get("status") == "io-error" and st.get("running") is False,
          repr(st))
    b = q.cmd("query-block")[0]
    kept = b.get("x-counters", {}).get("kept", 0)
    check("io_status", b.get("io-status") == "nospace" and kept > 0, repr(b))
    # a migration would lose the kept writes: refused
    r = q.cmd_full("migrate", uri="tcp:127.0.0.1:%d" % kt.free_port())
    desc = r.get("error", {}).get("desc", "")
    check("migrate_refused", "keeps" in desc and "cont" in desc, repr(r))
    before = len(reports(vm))
    # room again: cont retries the kept writes and the guest goes on
    subprocess.run(["mount", "-o", "remount,size=16M", small], check=True)
    q.events.clear()
    q.cmd("cont")
    check("resume_event", q.wait_event("RESUME", kt.slow(10)) is not None, repr(q.events))
    st = q.cmd("query-status")
    check("running", st.get("status") == "running", repr(st))
    # round 2 reads back every block the first round wrote (the retried
    # writes among them): a report of round 3 means it has checked them all
    got = vm.console.wait(r"^disk \w+ round=3 ", kt.slow(90), proc=vm.proc)
    check("round_2_done", got is not None, kt.dump(vm))
    r = reports(vm)
    check("reports_ok", len(r) > before and all(x[0] == "ok" for x in r), repr(r[-6:]))
    bad = bad_lines(vm)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))
    b = q.cmd("query-block")[0]
    c = b.get("x-counters", {})
    check("retried", b.get("io-status") == "ok" and c.get("kept") == 0 and
          c.get("io-errors", 0) >= kept, repr(b))
    check("no_second_stop", q.cmd("query-status").get("status") == "running",
          repr(q.events))
