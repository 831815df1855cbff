#!/usr/bin/env python3
"""TLS benchmark: migration throughput in plain TCP and with TLS 1.3 (PSK
and X.509), kmig and QEMU 7.2 side by side in one run.

The guest fills its memory once (`workload=fill-free mb=N`: every page
non-zero, then idle), so each migration carries the same ~N MiB of real
pages over tcp:127.0.0.1 with no bandwidth limit (kmig max-bandwidth 0,
QEMU 100 GB/s), no dirtying and no compression: what limits it is the
channel, i.e. encryption.  Configurations run interleaved, --reps times
each; recorded from the final query-migrate: total-time, ram.transferred
and the throughput they give (MB/s = 10^6 bytes/s), plus the medians.
Both VMMs use the same credential directories (tests/lib/make-certs.sh).

Writes bench/results/tls.json and bench/results/tls.md.  Never asserts.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mb  # noqa: E402  (the migration benchmark's helpers)
kt = mb.kt

# name: (vmm, credentials kind or None, multifd channels or 0)
CONFIGS = {
    "kmig-plain": ("kmig", None, 0),
    "kmig-psk": ("kmig", "psk", 0),
    "kmig-x509": ("kmig", "x509", 0),
    "kmig-x509-multifd4": ("kmig", "x509", 4),
    "qemu-plain": ("qemu", None, 0),
    "qemu-psk": ("qemu", "psk", 0),
    "qemu-x509": ("qemu", "x509", 0),
    "qemu-x509-multifd4": ("qemu", "x509", 4),
}


def creds_args(vmm, kind, keys, endpoint):
    if not kind:
        return []
    obj = "tls-creds-%s,id=tls0,dir=%s/%s" % (kind, keys, kind)
    if vmm == "qemu":
        obj += ",endpoint=" + endpoint
    return ["-object" if vmm == "qemu" else "--object", obj]


def one(env, name, rep, args, d):
    vmm, kind, channels = CONFIGS[name]
    port = mb.free_port()
    cmdline = "workload=fill-free mb=%d report_ms=1000 tsc_khz=%d" % (args.mb, env["tsc_khz"])
    tag = "%s-r%d" % (name, rep)    # fresh console files: an old "fill-free done" never counts
    src_args = mb.vm_args(env, vmm, 0, cmdline, args.memory, 1, d, tag + "-src")
    dst_args = mb.vm_args(env, vmm, 0, cmdline, args.memory, 1, d, tag + "-dst",
                          incoming="defer")
    src = mb.Proc(d, tag + "-src", src_args + creds_args(vmm, kind, env["keys"], "client"))
    dst = mb.Proc(d, tag + "-dst", dst_args + creds_args(vmm, kind, env["keys"], "server"))
    row = {"config": name, "vmm": vmm, "tls": kind, "multifd": channels}
    try:
        if not src.console.wait(r"fill-free done", timeout=120):
            row["error"] = "guest did not fill its memory: " + src.output()[-300:]
            return row
        qs, qd = src.qmp(), dst.qmp()
        params = {"max-bandwidth": 0 if vmm == "kmig" else mb.QEMU_UNLIMITED,
                  "downtime-limit": 300}
        caps = [{"capability": "multifd", "state": bool(channels)}]
        if channels:
            params["multifd-channels"] = channels
        for q in (qs, qd):
            q.cmd("migrate-set-capabilities", capabilities=caps)
            q.cmd("migrate-set-parameters", **dict(params, **({"tls-creds": "tls0"} if kind else {})))
        qd.cmd("migrate-incoming", uri="tcp:127.0.0.1:%d" % port)
        time.sleep(0.3)
        qs.cmd("migrate", uri="tcp:127.0.0.1:%d" % port)
        r = kt.wait_migration(qs, timeout=args.cap)
        ram = r.get("ram", {})
        row.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), transferred=ram.get("transferred"),
                   error=r.get("error-desc"))
        if r.get("status") == "completed" and r.get("total-time"):
            row["mb_per_s"] = round(ram["transferred"] / r["total-time"] / 1000.0, 1)
    finally:
        src.kill()
        dst.kill()
    return row


def table(rows, reps, names):
    lines = ["| config | runs ok | median MB/s | median total ms | MiB sent | vs plain |",
             "|---|---|---|---|---|---|"]
    med = {}
    for name in names:
        ok = [r for r in rows if r["config"] == name and r.get("mb_per_s")]
        if ok:
            med[name] = statistics.median(r["mb_per_s"] for r in ok)
    for name in names:
        ok = [r for r in rows if r["config"] == name and r.get("mb_per_s")]
        if not ok:
            lines.append("| %s | 0/%d | - | - | - | - |" % (name, reps))
            continue
        plain = med.get(CONFIGS[name][0] + "-plain")
        lines.append("| %s | %d/%d | %.0f | %.0f | %.0f | %s |" % (
            name, len(ok), reps, med[name], statistics.median(r["total_ms"] for r in ok),
            statistics.median(r["transferred"] for r in ok) / (1 << 20),
            "%.2f" % (med[name] / plain) if plain else "-"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--memory", default="1G")
    ap.add_argument("--mb", type=int, default=768, help="MiB the guest fills")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds before a run is cancelled")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated (default all: %s)" % ",".join(CONFIGS))
    ap.add_argument("--tsc-khz", type=int, default=2000000)
    ap.add_argument("--out", default=RESULTS,
                    help="a directory (tls.json and tls.md in it) or a .json path (.md beside)")
    args = ap.parse_args()
    names = args.configs.split(",")
    d = tempfile.mkdtemp(prefix="kmig-tls-bench-")
    try:
        kmig, guest, bins = mb.snapshot_binaries(d)
        keys = os.path.join(d, "keys")
        subprocess.run([os.path.join(ROOT, "tests", "lib", "make-certs.sh"), keys], check=True)
        env = {"kmig": kmig, "guest": guest, "tsc_khz": args.tsc_khz, "keys": keys}
        info = mb.host_info()
        info.update(bins)
        rows = []
        for rep in range(args.reps):
            for name in names:
                row = one(env, name, rep, args, d)
                row["rep"] = rep
                rows.append(row)
                print("# %s rep %d: %s" % (name, rep, {k: row.get(k) for k in (
                    "status", "mb_per_s", "total_ms", "error")}), flush=True)
        info["loadavg_end"] = mb.loadavg()
        out = {"host": info, "args": vars(args), "runs": rows}
        jpath = args.out if args.out.endswith(".json") else os.path.join(args.out, "tls.json")
        os.makedirs(os.path.dirname(os.path.abspath(jpath)), exist_ok=True)
        with open(jpath, "w") as f:
            json.dump(out, f, indent=1)
        md = table(rows, args.reps, names)
        head = "TLS benchmark at %s, %s, kvm modules %s, %d MiB filled, %d runs each\n\n" % (
            info["git_head"], info["time"], ",".join(info["kvm_modules"]), args.mb, args.reps)
        with open(os.path.splitext(jpath)[0] + ".md", "w") as f:
            f.write(head + md + "\n")
        print(head + md)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
