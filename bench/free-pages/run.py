#!/usr/bin/env python3
"""Free page benchmark (seed 002): bytes sent and migration time without and
with the guest's free page information, kmig vs QEMU 7.2 in the same run.

Cases (the seed's two tables):
  booted  workload=idle: a guest that has just booted;
  filled  workload=fill-free mb=N: the guest filled most of its memory with
          non-zero data and gave it back to its page allocator.
Modes:
  none       no balloon device (what both VMMs send by default);
  hints      virtio-balloon free page hinting: kmig --balloon,
             QEMU -device virtio-balloon-pci,disable-legacy=on,
             free-page-hint=on,iothread=io0 -object iothread,id=io0;
             the bulk pass starts at once and hints arrive while it sends;
  hints-wait kmig only: hints, with x-free-page-hint-wait=2000 (the bulk
             pass first waits up to 2 s for the hints, kmig's behaviour
             before hinting ran alongside the pass);
  hints-exits kmig only: hints with --balloon=ioeventfd=off (each queue
             notification a vCPU exit handled in the vCPU's thread, as
             before kmig took them through ioeventfds);
  reporting  free page reporting (free pages discarded on the host before
             the migration, then sent as zero pages): kmig --balloon,
             QEMU ...,free-page-reporting=on.
The guest is the test guest with its balloon driver (balloon=1,
balloon_hint=0|1, balloon_report=0|1).  Each run starts a fresh source and
destination, waits for the workload (and, for reporting, until the guest's
reported total stops growing), then migrates over tcp:127.0.0.1 at
--bandwidth and records query-migrate's final answer.

Writes bench/results/free-pages.json and prints a table (medians).  Never
asserts.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import kmigtest as kt  # noqa: E402
import run as mig  # noqa: E402  (Proc, vm_args, host_info, snapshot_binaries, ...)

RESULTS = os.path.join(ROOT, "bench", "results")
MIB = 1 << 20
MODES = ("none", "hints", "hints-wait", "hints-exits", "reporting")
KMIG_ONLY = ("hints-wait", "hints-exits")
HINT_WAIT_MS = 2000
VMMS = ("kmig", "qemu")
QEMU_BALLOON = "virtio-balloon-pci,disable-legacy=on,%s"


def cmdline(case, mode, a):
    wl = "workload=idle" if case == "booted" else "workload=fill-free mb=%d" % a.fill_mb
    cl = "%s report_ms=1000 tsc_khz=%d" % (wl, a.tsc_khz)
    if mode in ("hints", "hints-wait", "hints-exits"):
        cl += " balloon=1 balloon_hint=1 balloon_report=0"
    elif mode == "reporting":
        cl += " balloon=1 balloon_hint=0 balloon_report=1"
    return cl


def args_for(env, vmm, case, mode, a, d, name, incoming=None):
    args = mig.vm_args(env, vmm, 0, cmdline(case, mode, a), a.memory, 1, d, name, incoming)
    if vmm == "kmig":
        if mode == "hints-exits":
            return args + ["--balloon=ioeventfd=off"]
        return args + (["--balloon"] if mode != "none" else [])
    args += ["-cpu", kt.QEMU_CPU]
    if mode == "hints":
        args += ["-object", "iothread,id=io0",
                 "-device", QEMU_BALLOON % "free-page-hint=on,iothread=io0"]
    elif mode == "reporting":
        args += ["-device", QEMU_BALLOON % "free-page-reporting=on"]
    return args


def settle(src, case, mode, timeout=90.0):
    """Waits for the workload; returns (ok, seconds, note)."""
    t0 = time.monotonic()
    want = r"^kmig-guest ready" if case == "booted" else r"^fill-free done"
    if src.console.wait(want, timeout, proc=src.proc) is None:
        return False, time.monotonic() - t0, "workload did not start"
    if mode != "none" and src.console.wait(r"^balloon bound", 10, proc=src.proc) is None:
        return False, time.monotonic() - t0, "balloon driver not bound"
    if mode != "reporting":
        time.sleep(1.0)
        return True, time.monotonic() - t0, None
    # reporting: until the reported total has not grown for 3 s
    rx = re.compile(r"^balloon reported mb=\d+ total_mb=(\d+)")
    last, since = -1, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tot = max([int(m.group(1)) for m in map(rx.search, src.console.lines) if m] or [-1])
        src.console.poll()
        if tot != last:
            last, since = tot, time.monotonic()
        elif tot >= 0 and time.monotonic() - since >= 3.0:
            return True, time.monotonic() - t0, "reported %d MiB" % tot
        time.sleep(0.2)
    return last >= 0, time.monotonic() - t0, "reported %d MiB (timeout)" % last


def one_run(env, vmm, case, mode, rep, a):
    d = tempfile.mkdtemp(prefix="fp-", dir=env["tmp"])
    port = mig.free_port()
    uri = "tcp:127.0.0.1:%d" % port
    res = {"vmm": vmm, "case": case, "mode": mode, "rep": rep}
    src = mig.Proc(d, "src", args_for(env, vmm, case, mode, a, d, "src"))
    dst = mig.Proc(d, "dst", args_for(env, vmm, case, mode, a, d, "dst", incoming=uri))
    try:
        ok, secs, note = settle(src, case, mode)
        res.update(settle_s=round(secs, 2), settle_note=note)
        if not ok or not mig.wait_dst_ready(dst, vmm):
            res["status"] = "setup-failed"
            res["console_tail"] = src.console.text().splitlines()[-5:]
            return res
        q = src.qmp()
        q.cmd("migrate-set-parameters", **{"max-bandwidth": a.bandwidth or mig.QEMU_UNLIMITED})
        if mode == "hints-wait":
            q.cmd("migrate-set-parameters", **{"x-free-page-hint-wait": HINT_WAIT_MS})
        q.cmd("migrate", uri=uri)
        deadline = time.monotonic() + a.cap
        r = {}
        while time.monotonic() < deadline:
            r = q.cmd("query-migrate")
            if r.get("status") in kt.MIG_FINAL:
                break
            time.sleep(0.05)
        if r.get("status") not in kt.MIG_FINAL:
            q.cmd("migrate_cancel")
            res["note"] = "cancelled after %d s" % a.cap
        ram = r.get("ram", {})
        res.update(status=r.get("status"), total_ms=r.get("total-time"),
                   setup_ms=r.get("setup-time"), downtime_ms=r.get("downtime"),
                   transferred=ram.get("transferred"), normal=ram.get("normal"),
                   duplicate=ram.get("duplicate"),
                   free_pages_skipped=r.get("x-free-pages-skipped"),
                   balloon_pages_skipped=r.get("x-balloon-pages-skipped"))
        # the guest runs on the destination: a heartbeat within 3 s
        res["dst_guest_alive"] = r.get("status") == "completed" and dst.console.wait(
            r"^heartbeat", 3.0, proc=dst.proc) is not None
        return res
    finally:
        src.kill()
        dst.kill()
        shutil.rmtree(d, ignore_errors=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs):
    out = {}
    for r in runs:
        out.setdefault(r["case"], {}).setdefault(r["vmm"], {}).setdefault(r["mode"], []).append(r)
    summary = {}
    for case, by_vmm in out.items():
        for vmm, by_mode in by_vmm.items():
            for mode, rs in by_mode.items():
                done = [r for r in rs if r.get("status") == "completed"]
                summary.setdefault(case, {}).setdefault(vmm, {})[mode] = {
                    "runs": len(rs), "completed": len(done),
                    "total_ms": med([r["total_ms"] for r in done]),
                    "setup_ms": med([r["setup_ms"] for r in done]),
                    "downtime_ms": med([r["downtime_ms"] for r in done]),
                    "transferred_kib": med([r["transferred"] // 1024 for r in done
                                            if r.get("transferred") is not None]),
                    "free_pages_skipped": med([r.get("free_pages_skipped") for r in done]),
                }
    return summary


def table(summary):
    lines = ["%-7s %-5s %-10s %10s %10s %10s %14s %10s" % (
        "case", "vmm", "mode", "total ms", "setup ms", "downtime", "sent KiB", "skipped")]
    for case in ("booted", "filled"):
        for vmm in VMMS:
            for mode in MODES:
                s = summary.get(case, {}).get(vmm, {}).get(mode)
                if not s:
                    continue
                f = lambda x: "-" if x is None else "%d" % x  # noqa: E731
                lines.append("%-7s %-5s %-10s %10s %10s %10s %14s %10s" % (
                    case, vmm, mode, f(s["total_ms"]), f(s["setup_ms"]), f(s["downtime_ms"]),
                    f(s["transferred_kib"]), f(s["free_pages_skipped"])))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", default="1G")
    p.add_argument("--fill-mb", type=int, default=768, help="fill-free MiB (filled case)")
    p.add_argument("--bandwidth", type=int, default=125000000, help="bytes/s, 0 = unlimited")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cap", type=int, default=120, help="seconds before a migration is cancelled")
    p.add_argument("--vmms", default=",".join(VMMS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cases", default="booted,filled")
    p.add_argument("--tsc-khz", type=int, default=0)
    p.add_argument("--out", default=os.path.join(RESULTS, "free-pages.json"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kmig-fp-")
    try:
        kmig, guest, bins = mig.snapshot_binaries(tmp)
        env = {"kmig": kmig, "guest": guest, "tmp": tmp}
        info = mig.host_info()
        if not a.tsc_khz:
            a.tsc_khz = mig.calibrate_tsc(env, tmp) or 2000000
        runs = []
        for rep in range(a.reps):
            for case in a.cases.split(","):
                for mode in a.modes.split(","):
                    for vmm in a.vmms.split(","):
                        if vmm != "kmig" and mode in KMIG_ONLY:
                            continue
                        r = one_run(env, vmm, case, mode, rep, a)
                        print("# %s" % json.dumps(r), flush=True)
                        runs.append(r)
        summary = summarize(runs)
        mig.save_results(a, "free-pages", info, bins, runs, summary, table(summary),
                         qemu_devices={
                             "hints": QEMU_BALLOON % "free-page-hint=on,iothread=io0",
                             "reporting": QEMU_BALLOON % "free-page-reporting=on"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
