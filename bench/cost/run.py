#!/usr/bin/env python3
"""What a migration costs its host: CPU time per GiB on each side, and the
throughput of compression and multifd, kmig and QEMU 7.2 in one run.

The guest fills --mb MiB once (`workload=fill-free`), then idles: either a
pattern a compressor shrinks many times over (data `pattern`) or words no
compressor shrinks (data `random`, `fill_random=1`).  Each configuration
migrates it over tcp:127.0.0.1 with no bandwidth limit (kmig max-bandwidth
0, QEMU 100 GB/s); the configurations run interleaved, --reps rounds.

  kmig-plain, qemu-plain            one stream, no compression
  kmig-mf4, qemu-mf4                multifd, 4 channels, no compression
  kmig-zstd                         one stream, zstd (kmig compresses
                                    without multifd too; QEMU 7.2 does not)
  kmig-zstd-mfN, qemu-zstd-mfN      multifd, N = 1, 2, 4 channels, zstd at
                                    level 1 on both (QEMU's default level)
  kmig-zlib-mf2, qemu-zlib-mf2      multifd, 2 channels, zlib at level 1
  kmig-lz4-mfN                      multifd with lz4 (QEMU 7.2 has none)

With multifd both VMMs get the same parameters (QEMU's names:
multifd-compression, multifd-zstd-level, multifd-zlib-level); kmig's
own x-compression sets kmig-zstd and the lz4 rows.

Per run, from the final query-migrate: total time, ram.transferred (as
the VMM counts it), ram.normal-bytes (guest data sent); the bytes that
crossed the loopback interface meanwhile (its rx_bytes: counted the same
way for both VMMs, TCP/IP headers and acknowledgements included, so the
host must be otherwise quiet: QEMU 7.2's ram.transferred does not show
its multifd compression); and from /proc, the CPU time
(user + system) each VMM process used between `migrate` and completion,
with and without its vCPU threads (an idle guest's vCPUs cost little, but
they are the guest's, not the migration's).  Reported: guest MB/s
(normal-bytes / total time), the compression ratio (normal-bytes /
loopback bytes), and CPU seconds per GiB of guest data, source and
destination.  CPU times come from /proc/PID/stat in clock ticks (10 ms):
with --mb 1024 a run is long enough for that to be a few per cent.

The destination starts with its RAM mapped (kmig --mem-prealloc, QEMU
-mem-prealloc; --dst-prealloc off leaves it to the migration): on these
hosts the first touch of memory the kernel reported free to the
hypervisor beneath costs 2-3 s of CPU per GiB, and which memory a run
gets is chance, so without it both VMMs' runs were bimodal.

Writes bench/results/cost.json and .md.  Needs a native /dev/kvm; under
scripts/kvm-vm the figures are not performance (--emulated-smoke runs one
round of four configurations and writes nothing).  Never asserts.
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
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mb  # noqa: E402  (the migration benchmark's helpers)
kt = mb.kt

GIB = 1 << 30
TICK = os.sysconf("SC_CLK_TCK")
VCPU_THREAD = re.compile(r"^(vcpu\d+|CPU \d+/KVM)$")   # kmig's and QEMU's names

# name: (vmm, multifd channels, compression)
CONFIGS = {"kmig-plain": ("kmig", 0, "none"), "qemu-plain": ("qemu", 0, "none"),
           "kmig-mf4": ("kmig", 4, "none"), "qemu-mf4": ("qemu", 4, "none"),
           "kmig-zstd": ("kmig", 0, "zstd")}
for _n in (1, 2, 4):
    CONFIGS["kmig-zstd-mf%d" % _n] = ("kmig", _n, "zstd")
    CONFIGS["qemu-zstd-mf%d" % _n] = ("qemu", _n, "zstd")
    CONFIGS["kmig-lz4-mf%d" % _n] = ("kmig", _n, "lz4")
CONFIGS["kmig-zlib-mf2"] = ("kmig", 2, "zlib")
CONFIGS["qemu-zlib-mf2"] = ("qemu", 2, "zlib")
DATA = ("pattern", "random")


def proc_cpu(pid):
    """(process CPU seconds, its vCPU threads' CPU seconds), user + system;
    the process total includes threads that have exited."""
    def ticks(path):
        with open(path) as f:
            s = f.read()
        fields = s[s.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / TICK, s[s.index("(") + 1:s.rindex(")")]
    total, _ = ticks("/proc/%d/stat" % pid)
    vcpus = 0.0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            t, name = ticks("/proc/%d/task/%s/stat" % (pid, tid))
        except OSError:
            continue    # gone meanwhile
        if VCPU_THREAD.match(name):
            vcpus += t
    return total, vcpus


def lo_bytes():
    """Bytes through the loopback interface so far (each packet counted
    once, headers and the return path's acknowledgements included)."""
    with open("/sys/class/net/lo/statistics/rx_bytes") as f:
        return int(f.read())


def migration_params(vmm, channels, comp):
    caps = [{"capability": "multifd", "state": bool(channels)}]
    params = {"max-bandwidth": 0 if vmm == "kmig" else mb.QEMU_UNLIMITED, "downtime-limit": 300}
    if channels:
        params["multifd-channels"] = channels
    if channels and comp != "lz4":
        params["multifd-compression"] = comp         # QEMU's names, on both VMMs
        if comp != "none":
            params["multifd-%s-level" % comp] = 1
        if vmm == "kmig":
            params["x-compression"] = "none"
    elif vmm == "kmig":
        params["x-compression"] = comp               # one stream, or lz4 (kmig's own)
    return caps, params


def one(env, name, data, rnd, a, d):
    vmm, channels, comp = CONFIGS[name]
    port = mb.free_port()
    cmdline = "workload=fill-free mb=%d report_ms=1000 tsc_khz=%d%s" % (
        a.mb, env["tsc_khz"], " fill_random=1" if data == "random" else "")
    tag = "%s-%s-r%d" % (name, data, rnd)
    src = mb.Proc(d, tag + "-src", mb.vm_args(env, vmm, 0, cmdline, a.memory, 1, d, tag + "-src"))
    dargs = mb.vm_args(env, vmm, 0, cmdline, a.memory, 1, d, tag + "-dst", incoming="defer")
    if a.dst_prealloc:
        # the destination's RAM mapped before the migration, by both VMMs
        # alike: on this host the first touch of memory it reported free
        # costs 2-3 s of CPU per GiB (README, "Cost"), which otherwise
        # lands in the timed window at random
        dargs.append("--mem-prealloc" if vmm == "kmig" else "-mem-prealloc")
    dst = mb.Proc(d, tag + "-dst", dargs)
    row = {"config": name, "data": data, "rep": rnd, "vmm": vmm, "multifd": channels,
           "compression": comp, "dst_prealloc": a.dst_prealloc, "loadavg": mb.loadavg()}
    try:
        if not src.console.wait(r"fill-free done", timeout=kt.slow(120)):
            row["error"] = "guest did not fill its memory: " + src.output()[-300:]
            return row
        qs, qd = src.qmp(), dst.qmp()
        caps, params = migration_params(vmm, channels, comp)
        for q in (qs, qd):
            q.cmd("migrate-set-capabilities", capabilities=caps)
            q.cmd("migrate-set-parameters", **params)
        qd.cmd("migrate-incoming", uri="tcp:127.0.0.1:%d" % port)
        time.sleep(0.3)
        c0 = {"src": proc_cpu(src.proc.pid), "dst": proc_cpu(dst.proc.pid)}
        rx0 = lo_bytes()
        qs.cmd("migrate", uri="tcp:127.0.0.1:%d" % port)
        r = kt.wait_migration(qs, timeout=a.cap, interval=0.05)
        c1 = {"src": proc_cpu(src.proc.pid), "dst": proc_cpu(dst.proc.pid)}
        row["wire_bytes"] = lo_bytes() - rx0
        ram = r.get("ram", {})
        row.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), transferred=ram.get("transferred"),
                   normal_bytes=ram.get("normal-bytes"), error=r.get("error-desc"))
        for side in ("src", "dst"):
            row[side + "_cpu_s"] = round(c1[side][0] - c0[side][0], 3)
            row[side + "_vcpu_s"] = round(c1[side][1] - c0[side][1], 3)
        if r.get("status") == "completed" and r.get("total-time") and row["normal_bytes"]:
            g = row["normal_bytes"] / GIB
            row["guest_mb_per_s"] = round(row["normal_bytes"] / r["total-time"] / 1000.0, 1)
            row["ratio"] = round(row["normal_bytes"] / max(1, row["wire_bytes"]), 2)
            for side in ("src", "dst"):
                row[side + "_cpu_s_per_gib"] = round(
                    (row[side + "_cpu_s"] - row[side + "_vcpu_s"]) / g, 3)
    finally:
        src.kill()
        dst.kill()
    return row


def summarize(rows, names):
    out = {}
    for data in DATA:
        for name in names:
            ok = [r for r in rows if r["config"] == name and r["data"] == data
                  and r.get("guest_mb_per_s")]
            n = len([r for r in rows if r["config"] == name and r["data"] == data])
            if not n:
                continue
            s = {"runs": n, "ok": len(ok)}
            for k in ("guest_mb_per_s", "ratio", "src_cpu_s_per_gib", "dst_cpu_s_per_gib",
                      "total_ms"):
                v = [r[k] for r in ok if r.get(k) is not None]
                if v:
                    s[k] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
            out["%s %s" % (data, name)] = s
    return out


def table(summary, info, a):
    lines = ["Migration cost at %s (%s), kvm modules %s, guest %s filled %d MiB, %d round(s), "
             "destination RAM %s, medians (min-max)" % (
                 (info.get("git_head") or "?")[:7], info.get("time"),
                 ",".join(info.get("kvm_modules") or []), a.memory, a.mb, a.reps,
                 "preallocated" if a.dst_prealloc else "touched during the migration"), "",
             "| data | config | runs ok | guest MB/s | ratio | src CPU s/GiB | dst CPU s/GiB |",
             "|---|---|---|---|---|---|---|"]

    def f(s, k, fmt):
        v = s.get(k)
        return "–" if not v else (fmt % v["median"]) + (" (" + fmt % v["min"] + "–" +
                                                         fmt % v["max"] + ")")
    for key, s in summary.items():
        data, name = key.split(" ", 1)
        lines.append("| %s | %s | %d/%d | %s | %s | %s | %s |" % (
            data, name, s["ok"], s["runs"], f(s, "guest_mb_per_s", "%.0f"), f(s, "ratio", "%.2f"),
            f(s, "src_cpu_s_per_gib", "%.2f"), f(s, "dst_cpu_s_per_gib", "%.2f")))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--memory", default="2G")
    ap.add_argument("--mb", type=int, default=1024, help="MiB the guest fills")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds before a run gives up")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--data", default=",".join(DATA))
    ap.add_argument("--tsc-khz", type=int, default=0)
    ap.add_argument("--dst-prealloc", default="on", choices=("on", "off"),
                    help="destination started with its RAM mapped (kmig --mem-prealloc, "
                         "QEMU -mem-prealloc; default on)")
    ap.add_argument("--emulated-smoke", action="store_true",
                    help="inside scripts/kvm-vm: one round of kmig's and QEMU's zstd and zlib "
                         "at 2 channels, nothing written")
    ap.add_argument("--out", default=os.path.join(RESULTS, "cost.json"))
    a = ap.parse_args()
    if kt.emulated() and not a.emulated_smoke:
        print("cost: timings under emulation are not performance; --emulated-smoke tries the "
              "benchmark without writing a result", file=sys.stderr)
        return 2
    a.dst_prealloc = a.dst_prealloc == "on"
    names = a.configs.split(",")
    datas = a.data.split(",")
    if a.emulated_smoke:
        names = ["kmig-zstd-mf2", "qemu-zstd-mf2", "kmig-zlib-mf2", "qemu-zlib-mf2"]
        a.reps, a.mb = 1, min(a.mb, 128)
    for n in names:
        if n not in CONFIGS:
            ap.error("unknown config %r" % n)
    for x in datas:
        if x not in DATA:
            ap.error("unknown data %r" % x)
    info = mb.host_info()
    d = tempfile.mkdtemp(prefix="kmigbench-cost-")
    try:
        kmig, guest, bins = mb.snapshot_binaries(d)
        env = {"kmig": kmig, "guest": guest}
        env["tsc_khz"] = a.tsc_khz or mb.calibrate_tsc(env, d)
        rows = []
        for rnd in range(a.reps):
            for data in datas:
                for name in names:
                    row = one(env, name, data, rnd, a, d)
                    rows.append(row)
                    print("# %s %s round %d: %s" % (data, name, rnd, {k: row.get(k) for k in (
                        "status", "guest_mb_per_s", "ratio", "src_cpu_s_per_gib",
                        "dst_cpu_s_per_gib", "error")}), flush=True)
        info["loadavg_end"] = mb.loadavg()
        summary = summarize(rows, names)
        md = table(summary, info, a)
        print(md)
        if a.emulated_smoke:
            bad = [r for r in rows if r.get("status") != "completed"]
            return 1 if bad else 0
        doc = {"benchmark": "cost", "partial": False, "host": info, "binaries": bins,
               "config": {"args": {k: v for k, v in vars(a).items() if k != "out"},
                          "tsc_khz": env["tsc_khz"], "clock_ticks_per_s": TICK,
                          "configs": {k: dict(zip(("vmm", "multifd", "compression"), v))
                                      for k, v in CONFIGS.items()}},
               "summary": summary, "runs": rows}
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
            f.write(md + "\n")
        print("wrote %s" % a.out)
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
