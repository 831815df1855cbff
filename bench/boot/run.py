#!/usr/bin/env python3
"""Boot time and memory footprint: kmig vs QEMU on the same test guest.

For each VMM variant and each run: start the VMM process, poll the guest's
console file until the line `kmig-guest ready` appears (time measured from
just before the process is spawned), then read the VMM process's VmRSS
(/proc/PID/status) and Pss (/proc/PID/smaps_rollup) and kill it.  The guest
runs workload=idle; runs of the variants are interleaved so that load from
other processes on the host hits all of them alike.  Reports medians.

Writes bench/results/boot.json and prints a table.  Never asserts.
"""
import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
QBOOT = "/usr/share/qemu/qboot.rom"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_head():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def host_info():
    with open("/proc/loadavg") as f:
        load = [float(x) for x in f.read().split()[:3]]
    mhz = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                          text=True).stdout.splitlines()
    return {"nproc": os.cpu_count(), "loadavg_start": load, "cpu_mhz": mhz,
            "kernel": platform.release(), "qemu_version": qemu[0] if qemu else None,
            "kvm_modules": sorted(m for m in os.listdir("/sys/module") if m.startswith("kvm")),
            "git_head": git_head(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def snapshot_binaries(d):
    """Copies kmig and the guest ELF so a concurrent rebuild cannot change them mid-run."""
    src_kmig = os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build"), "kmig")
    src_guest = os.path.join(ROOT, "build", "guest", "kmig-guest.elf")
    kmig = os.path.join(d, "kmig")
    guest = os.path.join(d, "kmig-guest.elf")
    shutil.copy2(src_kmig, kmig)
    shutil.copy2(src_guest, guest)
    return kmig, guest, {"kmig": src_kmig, "kmig_sha256": sha256(kmig),
                         "guest": src_guest, "guest_sha256": sha256(guest)}


def proc_mem(pid):
    """VmRSS, VmHWM (from status) and Pss (from smaps_rollup) of pid, in KiB."""
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0])
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("Pss", "Pss_Anon", "Pss_File"):
                    out[k] = int(v.split()[0])
    except (OSError, ValueError):
        pass
    return out


def command(variant, kmig, guest, cmdline, memory, cpus, console, qmp):
    if variant == "kmig":
        return [kmig, "run", "--kernel", guest, "--cmdline", cmdline, "--memory", memory,
                "--cpus", str(cpus), "--console", "file:" + console, "--qmp", "unix:" + qmp]
    fw = []
    if variant == "qemu" and os.path.exists(QBOOT):
        fw = ["-bios", QBOOT]
    return ["qemu-system-x86_64", "-accel", "kvm", "-nodefaults", "-nographic",
            "-machine", "pc", "-m", memory, "-smp", str(cpus)] + fw + [
            "-kernel", guest, "-append", cmdline,
            "-chardev", "file,id=con,path=" + console, "-serial", "chardev:con",
            "-monitor", "none", "-qmp", "unix:%s,server=on,wait=off" % qmp]


def firmware(variant):
    if variant == "kmig":
        return "none (PVH entry)"
    if variant == "qemu" and os.path.exists(QBOOT):
        return "qboot"
    return "seabios"


def one_boot(d, tag, variant, kmig, guest, cmdline, memory, cpus, timeout, poll_s):
    console = os.path.join(d, tag + ".log")
    qmp = os.path.join(d, tag + ".qmp")
    out = open(os.path.join(d, tag + ".out"), "w")
    args = command(variant, kmig, guest, cmdline, memory, cpus, console, qmp)
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    res = {"ok": False}
    try:
        deadline = t0 + timeout
        data = b""
        pos = 0
        while time.monotonic() < deadline and p.poll() is None:
            try:
                with open(console, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
                    data += chunk
            except FileNotFoundError:
                pass
            if b"kmig-guest ready" in data:
                t = time.monotonic() - t0
                mem = proc_mem(p.pid)
                res = {"ok": True, "ready_s": t,
                       "rss_kib": mem.get("VmRSS"), "hwm_kib": mem.get("VmHWM"),
                       "pss_kib": mem.get("Pss"), "pss_anon_kib": mem.get("Pss_Anon"),
                       "pss_file_kib": mem.get("Pss_File")}
                break
            time.sleep(poll_s)
        if not res["ok"]:
            res["why"] = "exited with %r" % p.poll() if p.poll() is not None else "timeout"
            res["console_tail"] = data.decode(errors="replace")[-400:]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        out.close()
    return res


def calibrate_tsc(d, kmig, guest):
    """Boots kmig once without tsc_khz= and reads the guest's `kmig-guest tsc_khz=` line."""
    console = os.path.join(d, "calib.log")
    args = command("kmig", kmig, guest, "workload=idle", "256M", 1, console,
                   os.path.join(d, "calib.qmp"))
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                         start_new_session=True)
    khz = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and khz is None:
            try:
                with open(console) as f:
                    for line in f:
                        if line.startswith("kmig-guest tsc_khz="):
                            khz = int(line.split("=")[1].split()[0])
            except FileNotFoundError:
                pass
            time.sleep(0.02)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return khz


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="boots per variant (default 5)")
    ap.add_argument("--memory", default="1G")
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--variants", default="kmig,qemu,qemu-seabios",
                    help="comma list of kmig, qemu (with qboot when installed), qemu-seabios")
    ap.add_argument("--tsc-khz", type=int, default=0,
                    help="guest TSC kHz (default: from a calibration boot)")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=2.0, help="console poll interval")
    ap.add_argument("--out", default=os.path.join(RESULTS, "boot.json"))
    ap.add_argument("--quick", action="store_true", help="2 runs, kmig and qemu (qboot) only")
    a = ap.parse_args()
    if a.quick:
        a.runs = 2
        a.variants = "kmig,qemu"
    variants = [v for v in a.variants.split(",") if v]

    info = host_info()
    d = tempfile.mkdtemp(prefix="kmigbench-boot-")
    kmig, guest, bins = snapshot_binaries(d)
    tsc = a.tsc_khz or calibrate_tsc(d, kmig, guest)
    cmdline = "workload=idle cpus=%d" % a.cpus + (" tsc_khz=%d" % tsc if tsc else "")

    runs = {v: [] for v in variants}
    for i in range(a.runs):
        for v in variants:        # interleaved: shared load hits every variant alike
            r = one_boot(d, "%s-%d" % (v, i), v, kmig, guest, cmdline, a.memory, a.cpus,
                         a.timeout, a.poll_ms / 1000.0)
            runs[v].append(r)
            print("  run %d %-13s %s" % (i, v, ("ready %.3f s  RSS %d KiB  Pss %d KiB" % (
                r["ready_s"], r["rss_kib"] or 0, r["pss_kib"] or 0)) if r["ok"] else
                "FAILED: " + r.get("why", "")), flush=True)

    summary = {}
    for v in variants:
        ok = [r for r in runs[v] if r["ok"]]
        summary[v] = {"firmware": firmware(v), "runs_ok": len(ok), "runs": len(runs[v])}
        for k in ("ready_s", "rss_kib", "hwm_kib", "pss_kib", "pss_anon_kib", "pss_file_kib"):
            summary[v]["median_" + k] = med(r.get(k) for r in ok)
        summary[v]["min_ready_s"] = min((r["ready_s"] for r in ok), default=None)
        summary[v]["max_ready_s"] = max((r["ready_s"] for r in ok), default=None)
    base = summary.get("kmig", {})
    for v in variants:
        s = summary[v]
        for k in ("ready_s", "rss_kib", "pss_kib"):
            b, x = base.get("median_" + k), s.get("median_" + k)
            s["ratio_%s_vs_kmig" % k] = (x / b) if b and x is not None else None

    with open("/proc/loadavg") as f:
        info["loadavg_end"] = [float(x) for x in f.read().split()[:3]]
    doc = {"benchmark": "boot", "host": info, "binaries": bins,
           "config": {"memory": a.memory, "cpus": a.cpus, "guest_cmdline": cmdline,
                      "runs": a.runs, "variants": variants, "poll_ms": a.poll_ms,
                      "quick": a.quick,
                      "qemu_args": "-accel kvm -nodefaults -nographic -machine pc (default cpu "
                                   "model) -chardev file -serial chardev -monitor none -qmp unix",
                      "measure": "ready_s: from just before spawning the VMM to the console line "
                                 "'kmig-guest ready'; memory of the VMM process read at that "
                                 "moment (KiB)"},
           "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    print()
    print("boot to 'kmig-guest ready', %s guest, %d vCPU, workload=idle, median of %d "
          "(nproc %d, load %s at start)" % (a.memory, a.cpus, a.runs, info["nproc"],
                                            " ".join("%.2f" % x for x in info["loadavg_start"])))
    print()
    print("| VMM | firmware | ready (s) | min–max (s) | VmRSS (MiB) | Pss (MiB) | ready / kmig | RSS / kmig | Pss / kmig |")
    print("|---|---|---|---|---|---|---|---|---|")

    def f(x, fmt):
        return fmt % x if x is not None else "–"
    for v in variants:
        s = summary[v]
        print("| %s | %s | %s | %s–%s | %s | %s | %s | %s | %s |" % (
            v, s["firmware"], f(s["median_ready_s"], "%.3f"), f(s["min_ready_s"], "%.3f"),
            f(s["max_ready_s"], "%.3f"),
            f(s["median_rss_kib"] and s["median_rss_kib"] / 1024.0, "%.1f"),
            f(s["median_pss_kib"] and s["median_pss_kib"] / 1024.0, "%.1f"),
            f(s["ratio_ready_s_vs_kmig"], "%.1f×"), f(s["ratio_rss_kib_vs_kmig"], "%.1f×"),
            f(s["ratio_pss_kib_vs_kmig"], "%.1f×")))
    print("\nJSON: %s" % a.out)
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
