#!/usr/bin/env python3
"""Free page benchmark with a stock Linux guest (seed 002 with Linux's own
virtio-balloon driver): bytes sent without and with the guest's free page
information, kmig and QEMU 7.2 on the same kernel and initramfs, in one run.

Needs a KVM that runs Linux: on kvm_pvm machines run it inside
scripts/kvm-vm (kvm_amd under emulation), where timings are not
performance figures; bytes sent are the headline.

Guest: Debian's kernel (/var/cache/kmig/kvm-vm/vmlinuz) and the project's
initramfs (guest/linux/mkinitrd.sh with Linux's virtio_pci and
virtio_balloon modules), 1 vCPU, --memory (2 GiB).
Cases:
  booted  kmig.mode=none: Linux just booted, its /init ticking;
  filled  kmig.mode=fill-free kmig.mib=N: memcheck filled N MiB with
          non-zero data, checked it and exited, giving it back to Linux;
  churn   kmig.mode=fill-free kmig.repeat=0 kmig.mib=N (--churn-mb): the
          guest fills N MiB, checks and frees it, over and over, while
          the migration runs (migrated once the first pass is done); on
          the destination it must go on with no page bad.
Modes:
  none        no balloon device;
  hints       free page hinting only: kmig --balloon=free-page-reporting=off,
              QEMU -device virtio-balloon-pci,free-page-hint=on,iothread=io0;
              the bulk pass starts at once and hints arrive while it sends;
  hints-wait  kmig only: the same with x-free-page-hint-wait=2000;
  reporting   free page reporting only: kmig --balloon=free-page-hint=off,
              QEMU -device virtio-balloon-pci,free-page-reporting=on; the
              migration starts --report-wait seconds after the workload.
Each run boots a fresh source and destination once (a boot whose console
has been silent for 40 s has hung: the run is recorded as setup-failed
with the console's last lines), waits for the workload,
migrates over tcp:127.0.0.1 at --bandwidth (the same cap for both) and
records query-migrate's final answer, and whether the guest ticks on the
destination.  Writes bench/results/linux-free-pages.json and prints a table
of medians.  Never asserts.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import kmigtest as kt  # noqa: E402
import run as mig  # noqa: E402  (Proc, free_port, wait_dst_ready, host_info, ...)

RESULTS = os.path.join(ROOT, "bench", "results")
CACHE = os.environ.get("KMIG_VM_CACHE", "/var/cache/kmig/kvm-vm")
MODES = ("none", "hints", "hints-wait", "reporting")
VMMS = ("kmig", "qemu")
HINT_WAIT_MS = 2000
KMIG_BALLOON = {"hints": "--balloon=free-page-reporting=off",
                "hints-wait": "--balloon=free-page-reporting=off",
                "reporting": "--balloon=free-page-hint=off"}
QEMU_BALLOON = {"hints": "virtio-balloon-pci,free-page-hint=on,iothread=io0",
                "reporting": "virtio-balloon-pci,free-page-reporting=on"}
TICK = r"KMIG-LINUX tick (\d+) "
QUIET = 40          # seconds of a silent console: a hung boot
FREED = r"memcheck filled-and-freed mib=\d+ bad=(\d+)"


def cmdline(case, a):
    wl = {"booted": "kmig.mode=none",
          "filled": "kmig.mode=fill-free kmig.mib=%d" % a.fill_mb,
          "churn": "kmig.mode=fill-free kmig.repeat=0 kmig.mib=%d" % a.churn_mb}[case]
    return "console=ttyS0 panic=-1 %s kmig.then=ticks" % wl


def args_for(env, vmm, case, mode, a, d, name, incoming=None):
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    if vmm == "kmig":
        args = [env["kmig"], "run", "--kernel", env["kernel"], "--initrd", env["initrd"],
                "--cmdline", cmdline(case, a), "--memory", a.memory, "--cpus", "1",
                "--console", "file:" + console, "--qmp", "unix:" + qmp]
        if mode != "none":
            args.append(KMIG_BALLOON[mode])
        return args + (["--incoming", incoming] if incoming else [])
    args = ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-machine", "pc",
            "-nodefaults", "-nographic", "-m", a.memory, "-smp", "1",
            "-kernel", env["kernel"], "-initrd", env["initrd"], "-append", cmdline(case, a),
            "-chardev", "file,id=con,path=" + console, "-serial", "chardev:con",
            "-monitor", "none", "-qmp", "unix:%s,server=on,wait=off" % qmp]
    if mode == "hints":
        args += ["-object", "iothread,id=io0"]
    if mode != "none":
        args += ["-device", QEMU_BALLOON[mode]]
    return args + (["-incoming", incoming] if incoming else [])


def wait_moving(src, pattern, a):
    """Waits for pattern on the console while it moves: None when it has
    been silent for QUIET s (the emulated platform hangs now and then,
    docs/platform.md) or a.boot_cap has passed."""
    t0, last, n = time.monotonic(), time.monotonic(), -1
    while time.monotonic() - t0 < a.boot_cap:
        m = src.console.wait(pattern, 2, proc=src.proc)
        if m or src.proc.poll() is not None:
            return m
        size = len(src.console.lines) + len(src.console.partial())
        if size != n:
            n, last = size, time.monotonic()
        elif time.monotonic() - last > QUIET:
            return None
    return None


def settle(src, case, mode, a):
    """Waits for the workload and a few ticks; (ok, seconds, note)."""
    t0 = time.monotonic()
    if case != "booted" and wait_moving(src, r"memcheck filled-and-freed .*bad=0", a) is None:
        return False, time.monotonic() - t0, "fill-free did not finish"
    if case == "churn":
        return True, time.monotonic() - t0, None
    if wait_moving(src, r"KMIG-LINUX tick 3 ", a) is None:
        return False, time.monotonic() - t0, "no tick"
    if mode == "reporting":
        time.sleep(a.report_wait)
    return True, time.monotonic() - t0, None


def migrate(src, dst, uri, mode, a):
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
            return r, None
        time.sleep(0.1)
    q.cmd("migrate_cancel")
    return r, "cancelled after %d s" % a.cap


def one_run(env, vmm, case, mode, rep, a):
    d = tempfile.mkdtemp(prefix="lfp-", dir=env["tmp"])
    uri = "tcp:127.0.0.1:%d" % mig.free_port()
    res = {"vmm": vmm, "case": case, "mode": mode, "rep": rep}
    src = mig.Proc(d, "src", args_for(env, vmm, case, mode, a, d, "src"))
    dst = mig.Proc(d, "dst", args_for(env, vmm, case, mode, a, d, "dst", incoming=uri))
    try:
        ok, secs, note = settle(src, case, mode, a)
        res.update(settle_s=round(secs, 1), settle_note=note)
        if not ok or not mig.wait_dst_ready(dst, vmm):
            res["status"] = "setup-failed"
            res["console_tail"] = src.console.text().splitlines()[-6:]
            return res
        if vmm == "kmig" and mode != "none":
            b = src.qmp().cmd("query-balloon")
            res["reported_pages_before"] = b.get("x-reported-pages")
        r, cut = migrate(src, dst, uri, mode, a)
        ram = r.get("ram", {})
        res.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), transferred=ram.get("transferred"),
                   normal=ram.get("normal"), duplicate=ram.get("duplicate"),
                   free_pages_skipped=r.get("x-free-pages-skipped"), note=cut)
        if case == "churn":
            # the destination's guest goes on filling and freeing, no page bad
            m = r.get("status") == "completed" and dst.console.wait(FREED, 120, proc=dst.proc)
            res["dst_guest_ticks"] = bool(m) and not any(
                int(b) for b in re.findall(FREED, dst.console.text()))
        else:
            last = max([int(x) for x in re.findall(TICK, src.console.text())] or [0])
            res["dst_guest_ticks"] = r.get("status") == "completed" and dst.console.wait(
                r"KMIG-LINUX tick %d " % (last + 2), 60, proc=dst.proc) is not None
        if not res["dst_guest_ticks"]:
            res["dst_console_tail"] = dst.console.text().splitlines()[-4:]
        return res
    finally:
        src.kill()
        dst.kill()
        shutil.rmtree(d, ignore_errors=True)


def summarize(runs):
    summary = {}
    for r in runs:
        summary.setdefault(r["case"], {}).setdefault(r["vmm"], {}).setdefault(r["mode"], []).append(r)
    for case, by_vmm in summary.items():
        for vmm, by_mode in by_vmm.items():
            for mode, rs in by_mode.items():
                done = [r for r in rs if r.get("status") == "completed"]
                by_mode[mode] = {
                    "runs": len(rs), "completed": len(done),
                    "dst_guest_ticks": sum(1 for r in done if r.get("dst_guest_ticks")),
                    "transferred_kib": mig.med([r["transferred"] // 1024 for r in done
                                            if r.get("transferred") is not None]),
                    "normal_pages": mig.med([r.get("normal") for r in done]),
                    "free_pages_skipped": mig.med([r.get("free_pages_skipped") for r in done]),
                    "total_ms": mig.med([r.get("total_ms") for r in done]),
                    "downtime_ms": mig.med([r.get("downtime_ms") for r in done]),
                }
    return summary


def table(summary):
    fmt = "%-7s %-5s %-10s %9s %14s %12s %10s %10s"
    lines = [fmt % ("case", "vmm", "mode", "done", "sent KiB", "normal pages", "skipped",
                    "total ms")]
    for case in ("booted", "filled", "churn"):
        for vmm in VMMS:
            for mode in MODES:
                s = summary.get(case, {}).get(vmm, {}).get(mode)
                if not s:
                    continue
                f = lambda x: "-" if x is None else "%d" % x  # noqa: E731
                lines.append(fmt % (case, vmm, mode, "%d/%d" % (s["completed"], s["runs"]),
                                    f(s["transferred_kib"]), f(s["normal_pages"]),
                                    f(s["free_pages_skipped"]), f(s["total_ms"])))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", default="2G")
    p.add_argument("--fill-mb", type=int, default=1536, help="fill-free MiB (filled case)")
    p.add_argument("--churn-mb", type=int, default=1024, help="fill-free MiB (churn case)")
    p.add_argument("--bandwidth", type=int, default=125000000, help="bytes/s, 0 = unlimited")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cap", type=int, default=180, help="seconds before a migration is cancelled")
    p.add_argument("--boot-cap", type=int, default=240, help="seconds for boot and workload")
    p.add_argument("--report-wait", type=float, default=10.0,
                   help="reporting: seconds between the workload's end and the migration")
    p.add_argument("--vmms", default=",".join(VMMS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cases", default="booted,filled")
    p.add_argument("--out", default=os.path.join(RESULTS, "linux-free-pages.json"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kmig-lfp-")
    try:
        kmig = os.path.join(tmp, "kmig")
        shutil.copy2(os.path.join(ROOT, "build", "kmig"), kmig)
        initrd = os.path.join(tmp, "initrd.gz")
        subprocess.run([os.path.join(ROOT, "guest/linux/mkinitrd.sh"), initrd,
                        os.path.join(ROOT, "build/linux/memcheck"),
                        os.path.join(CACHE, "guest-mods")], check=True)
        env = {"kmig": kmig, "kernel": os.path.join(CACHE, "vmlinuz"), "initrd": initrd,
               "tmp": tmp}
        info = mig.host_info()
        info["emulated"] = kt.emulated()
        bins = {"kmig_sha256": mig.sha256(kmig), "kernel_sha256": mig.sha256(env["kernel"]),
                "initrd_sha256": mig.sha256(initrd)}
        runs = []
        for rep in range(a.reps):
            for case in a.cases.split(","):
                for mode in a.modes.split(","):
                    for vmm in a.vmms.split(","):
                        if vmm != "kmig" and mode == "hints-wait":
                            continue
                        r = one_run(env, vmm, case, mode, rep, a)
                        print("# %s" % json.dumps(r), flush=True)
                        runs.append(r)
            # after each repetition, so that a run cut short keeps what it had
            summary = summarize(runs)
            mig.save_results(a, "linux-free-pages", info, bins, runs, summary, table(summary),
                             kmig_devices=KMIG_BALLOON, qemu_devices=QEMU_BALLOON,
                             reps_done=rep + 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
