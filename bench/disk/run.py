#!/usr/bin/env python3
"""A disk migrated with the guest: kmig against QEMU 7.2, same guest, same run.

The test guest (workload=idle, and for the writing workloads its disk
workload disk=1: each block of the first --disk-mb MiB read, checked
against the generation the guest last wrote, rewritten, paced at
disk_rate blocks a second; docs/guest.md) runs on host A of
scripts/two-hosts; the destination waits on host B; the wire between
them is shaped with tbf at --bandwidth, and the same value is the
migration's max-bandwidth for both VMMs, so every byte of every route
(RAM, the disk in the stream, QEMU's NBD connection) crosses the same
wire at the same speed.  The image: --image-mb (4 GiB) of sparse raw
file with its first --written-mb (1 GiB) written by the host from
/dev/urandom before the guest boots (once per benchmark run; each run
starts from a sparse copy of it).

Configurations:
  kmig-shared    shared storage: both sides open the same file (kmig's
                 image hand-over: the destination holds it inactive,
                 takes the write lock at the switch)
  qemu-shared    the same file for both QEMUs (inactive on the incoming side)
  kmig-stream    local storage: the destination has an empty image of the
                 same size, capability x-block-migration (the disk in the
                 migration stream; x-verify with --kmig-verify)
  kmig-stream-cli  the same with one command: `kmig migrate --disk
                 --bandwidth --downtime 300 --json URI` (its defaults: the
                 convergence policy, x-verify off; it polls every 250 ms)
  qemu-block     local storage, QEMU's `migrate -b` (capability `block`,
                 and `zero-blocks`, which sends a block of zeros as a flag
                 instead of its bytes, unless --no-zero-blocks)
  qemu-mirror    local storage, NBD + mirror, as libvirt does it: the
                 destination (started with -S) exports its empty image over
                 NBD on host B's address (nbd-server-start, block-export-add
                 writable), the source mirrors into it (blockdev-add nbd,
                 blockdev-mirror sync=full copy-mode=write-blocking), and once
                 the job is ready migrates RAM; at completion the job is
                 cancelled on the paused source (block-job-cancel), the NBD
                 server stopped and the destination resumed (cont).
Workloads: idle (no disk workload: the guest does not touch the disk) and
write-N (disk=1 at N MiB/s of 4 KiB blocks, each also read and checked).

Per run: status; total time (host clock, from the first migration command
(for qemu-mirror the mirror's start) until the destination runs the guest:
query-migrate's `completed`, for qemu-mirror the `cont`) and QMP's
total-time and downtime; the bytes that crossed the wire (A's wire0
counters, both directions) and QMP's RAM and disk counters; the guest's
disk reports before, during and after the migration (writes a second as
MiB/s, the longest request in a report period, every `disk bad`/`disk BAD`
line: a data-loss finding); the stall at the switchover (host ms from the
source console's last heartbeat to the destination's first, consoles read
every 5 ms); after the switch, the destination's guest goes on for a whole
round of its region (every block checked once more), and for idle local
runs the two images are compared byte for byte (the source stopped, the
destination stopped).

Writes bench/results/disk.json (info, binaries, params, raw runs, summary)
and disk.md.  Timings mean something only on a native /dev/kvm: the script
refuses to run inside scripts/kvm-vm unless --emulated-smoke is given
(one repetition of one small workload, every configuration, nothing
written).  Never asserts.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import blkguest  # noqa: E402
import kmigtest as kt  # noqa: E402
import twohosts  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mig  # noqa: E402  (the migration benchmark's helpers)

MIB = 1 << 20
BS = 4096
REPORT_MS = 100
MIG_PORT = 4500
NBD_PORT = 10809
# name: (vmm, route); the route says the storage: shared, or local
CONFIGS = {
    "kmig-shared": ("kmig", "shared"),
    "qemu-shared": ("qemu", "shared"),
    "kmig-stream": ("kmig", "stream"),
    "kmig-stream-cli": ("kmig", "stream-cli"),
    "qemu-block": ("qemu", "block"),
    "qemu-mirror": ("qemu", "mirror"),
}
WORKLOADS = "idle,write-4,write-16,write-64"
REPORT_RX = re.compile(r"^disk (ok|bad) round=(\d+) blocks=(\d+) writes=(\d+) flushes=\d+ "
                       r"max_lat_us=(\d+) errors=(\d+)")
LOSS_RX = re.compile(r"^(disk BAD|disk error|disk bad|verify BAD|blk error)")


def rate_of(wl):
    """MiB/s the guest writes (0: idle, no disk workload)."""
    return 0 if wl == "idle" else float(wl.split("-", 1)[1])


def cmdline(wl, a):
    c = "workload=idle report_ms=%d" % REPORT_MS
    if rate_of(wl):
        c += " disk=1 disk_mb=%d disk_bs=%d disk_rate=%d" % (
            a.disk_mb, BS, max(1, round(rate_of(wl) * MIB / BS)))
    return c


def drive_args(vmm, img):
    if vmm == "kmig":
        return blkguest.blk_args(img)
    return ["-drive", "file=%s,format=raw,if=none,id=d0,node-name=n0" % img,
            "-device", "virtio-blk-pci,drive=d0,serial=kmig-test"]


def start(env, vmm, d, name, wl, img, netns, a, incoming=None, paused=False):
    args = mig.vm_args(env, vmm, 0, cmdline(wl, a), a.memory, 1, d, name, incoming)
    args += drive_args(vmm, img) + (["-S"] if paused else [])
    return mig.Proc(d, name, kt.in_netns(netns, args))


def wire_bytes(ns):
    """(tx, rx) bytes of ns's wire0 (the link between the two hosts)."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", "wire0"],
                         capture_output=True, text=True)
    try:
        s = json.loads(out.stdout)[0]["stats64"]
        return s["tx"]["bytes"], s["rx"]["bytes"]
    except (ValueError, LookupError):
        return None, None


def base_image(d, a):
    """The image every run starts from: --image-mb sparse, its first
    --written-mb from /dev/urandom (written once, by the host)."""
    path = os.path.join(d, "base.img")
    subprocess.run(["truncate", "-s", "%dM" % a.image_mb, path], check=True)
    subprocess.run(["dd", "if=/dev/urandom", "of=" + path, "bs=1M", "count=%d" % a.written_mb,
                    "conv=notrunc,fsync", "status=none"], check=True)
    return path


def reports(p):
    """The guest's disk reports on p's console: (host time, ok, round, writes,
    max_lat_us, errors since the driver bound)."""
    out = []
    for t, line in p.seen:
        m = REPORT_RX.match(line)
        if m:
            out.append((t, m.group(1) == "ok", int(m.group(2)), int(m.group(4)),
                        int(m.group(5)), int(m.group(6))))
    return out


def disk_window(reps, t_a, t_b):
    """The guest's writes (MiB/s over the window, from its reports' write
    counts) and request latency (the longest of each report period) for
    the reports seen in (t_a, t_b]."""
    w = [r for r in reps if t_a < r[0] <= t_b]
    if not w or t_b <= t_a:
        return None
    lat = [r[4] for r in w]
    return {"reports": len(w), "write_mib_s": round(sum(r[3] for r in w) * BS / MIB /
                                                     (t_b - t_a), 2),
            "max_lat_ms": round(max(lat) / 1000.0, 1),
            "median_max_lat_ms": round(statistics.median(lat) / 1000.0, 2),
            "all_ok": all(r[1] for r in w), "errors": max(r[5] for r in w),
            "rounds": [w[0][2], w[-1][2]]}


def wait_lines(procs, cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mig.poll_consoles(procs, 0.05)
        if cond():
            return True
        if not all(p.alive() for p in procs):
            return False
    return False


def set_caps(q, vmm, route, a):
    if vmm == "kmig":
        caps = {"x-block-migration": route == "stream",
                "x-verify": route == "stream" and a.kmig_verify}
    else:
        caps = {"block": route == "block", "zero-blocks": route == "block" and a.zero_blocks}
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": k, "state": v}
                                                    for k, v in caps.items()])
    q.cmd("migrate-set-parameters", **{"max-bandwidth": a.bandwidth, "downtime-limit": 300})


def mirror_ready(src, dst, h, run, a, t0):
    """qemu-mirror's first phase: the source's disk mirrored into the
    destination's NBD export until the job is ready.  The export is set
    up before t0 (like the destination's start); True when ready."""
    q = src.qmp()
    q.cmd("blockdev-mirror", **{"job-id": "m0", "device": "d0", "target": "t0",
                                "sync": "full", "copy-mode": "write-blocking"})
    while time.monotonic() - t0 < a.cap:
        jobs = q.cmd("query-block-jobs")
        job = jobs[0] if jobs else {}
        if job.get("ready"):
            run["mirror_ready_s"] = round(time.monotonic() - t0, 3)
            run["mirror_bytes"] = job.get("offset")
            return True
        if not jobs:
            run["error"] = "the mirror job ended before it was ready: %r" % q.events[-5:]
            return False
        mig.poll_consoles((src, dst), 0.1)
    run["error"] = "mirror not ready after %g s" % a.cap
    q.cmd("block-job-cancel", device="m0", force=True)
    return False


def mirror_export(src, dst, h):
    dst.qmp().cmd("nbd-server-start", addr={"type": "inet", "data": {
        "host": h["KMIG_NET_B"], "port": str(NBD_PORT)}})
    dst.qmp().cmd("block-export-add", type="nbd", id="e0", writable=True,
                  **{"node-name": "n0"})
    src.qmp().cmd("blockdev-add", driver="nbd", export="n0", server={
        "type": "inet", "host": h["KMIG_NET_B"], "port": str(NBD_PORT)},
        **{"node-name": "t0"})


def mirror_finish(src, dst, a):
    """After the RAM migration completed: the job cancelled on the paused
    source (a ready mirror in write-blocking mode holds everything the
    guest wrote), the NBD server stopped, the destination resumed."""
    q, dq = src.qmp(), dst.qmp()
    q.cmd("block-job-cancel", device="m0")
    deadline = time.monotonic() + a.cap
    while q.cmd("query-block-jobs") and time.monotonic() < deadline:
        mig.poll_consoles((src, dst), 0.01)
    dq.cmd("nbd-server-stop")
    dq.cmd("cont")


def migrate_cli(env, src, dst, h, uri, run, a):
    """kmig-stream-cli: `kmig migrate --disk` from host A, as a user would."""
    args = [env["kmig"], "migrate", "--qmp",
            "unix:" + src.qmp_path, "--disk", "--bandwidth", str(a.bandwidth // 1000000),
            "--downtime", "300", "--json", uri]
    t0 = time.monotonic()
    run["wire_start"] = wire_bytes(h["a"])
    p = subprocess.Popen(kt.in_netns(h["a"], args), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    while p.poll() is None and time.monotonic() - t0 < a.cap:
        mig.poll_consoles((src, dst), 0.05)
    done = time.monotonic() if p.poll() is not None else None
    if done is None:
        p.kill()
        src.qmp().cmd("migrate_cancel")
        run["error"] = "not completed after %g s (cancelled)" % a.cap
    out, err = p.communicate()
    run["cli_rc"], run["cli_stderr"] = p.returncode, err[-400:]
    try:
        r = json.loads(out)
    except ValueError:
        r = {}
    return t0, done, r


def migrate(env, src, dst, vmm, route, h, uri, run, a):
    """Runs the migration; returns (t0, t_done or None, final query-migrate)."""
    if route == "stream-cli":
        return migrate_cli(env, src, dst, h, uri, run, a)
    q = src.qmp()
    set_caps(q, vmm, route, a)
    if route == "mirror":
        mirror_export(src, dst, h)
    t0 = time.monotonic()
    run["wire_start"] = wire_bytes(h["a"])
    if route == "mirror" and not mirror_ready(src, dst, h, run, a, t0):
        return t0, None, {}
    q.cmd("migrate", uri=uri)
    r, done, disk = {}, None, None
    while time.monotonic() - t0 < a.cap:
        r = q.cmd("query-migrate")
        disk = r.get("disk", disk)
        if r.get("status") in kt.MIG_FINAL:
            done = time.monotonic()
            break
        mig.poll_consoles((src, dst), 0.1)
    if disk and "disk" not in r:
        # QEMU shows `disk` only while the block migration is active: its
        # last poll, at most 0.1 s before the end
        r["disk"] = dict(disk, **{"x-bench-last-active-poll": True})
    if done is None:
        q.cmd("migrate_cancel")
        run["error"] = "not completed after %g s (cancelled)" % a.cap
    elif r.get("status") == "completed" and route == "mirror":
        mirror_finish(src, dst, a)
        done = time.monotonic()
    return t0, done, r


def images_equal(a_path, b_path):
    return subprocess.run(["cmp", "-s", a_path, b_path]).returncode == 0


def one_run(env, d, h, wl, cfg, a, base, n):
    vmm, route = CONFIGS[cfg]
    sub = os.path.join(d, "run%d" % n)
    os.mkdir(sub)
    src_img = os.path.join(sub, "src.img")
    subprocess.run(["cp", "--sparse=always", base, src_img], check=True)
    if route == "shared":
        dst_img = src_img
    else:
        dst_img = os.path.join(sub, "dst.img")
        subprocess.run(["truncate", "-s", "%dM" % a.image_mb, dst_img], check=True)
    uri = "tcp:%s:%d" % (h["KMIG_NET_B"], MIG_PORT + n % 100)
    run = {"workload": wl, "config": cfg, "vmm": vmm, "route": route,
           "storage": "shared" if route == "shared" else "local",
           "guest_cmdline": cmdline(wl, a), "loadavg": mig.loadavg()}
    src = start(env, vmm, sub, "src", wl, src_img, h["a"], a)
    dst = None
    try:
        writing = rate_of(wl) > 0
        want = r"^disk ok round=" if writing else r"^heartbeat "
        if not wait_lines((src,), lambda: any(re.match(want, l) for _, l in src.seen),
                          kt.slow(60)):
            run.update(status="error", error="source guest not ready",
                       src_out=src.output()[-500:], console=src.console.text()[-500:])
            return run
        dst = start(env, vmm, sub, "dst", wl, dst_img, h["b"], a, incoming=uri,
                    paused=route == "mirror")
        if not mig.wait_dst_ready(dst, vmm, timeout=kt.slow(30)):
            run.update(status="error", error="destination not ready",
                       dst_out=dst.output()[-500:])
            return run
        t_settle = time.monotonic()
        mig.poll_consoles((src, dst), a.settle)
        t0, done, r = migrate(env, src, dst, vmm, route, h, uri, run, a)
        run["wire_end"] = wire_bytes(h["a"])
        ws, we = run["wire_start"], run["wire_end"]
        if None not in ws + we:
            run["wire_bytes_a_to_b"], run["wire_bytes_b_to_a"] = we[0] - ws[0], we[1] - ws[1]
        run.update(status=r.get("status") if done else (r.get("status") or "error"),
                   total_s=round(done - t0, 3) if done else None,
                   qmp_total_ms=r.get("total-time"), downtime_ms=r.get("downtime"),
                   ram_bytes=r.get("ram", {}).get("transferred"),
                   disk=r.get("disk"), error_desc=r.get("error-desc"))
        t_end = done or time.monotonic()
        # the destination runs the guest: its first heartbeat, then a whole
        # round of the disk region checked there
        if run["status"] == "completed":
            run["dst_resumed"] = wait_lines(
                (src, dst), lambda: any(l.startswith("heartbeat ") for _, l in dst.seen),
                kt.slow(20))
            run["stall_ms"] = mig.switchover_gap(src.seen, dst.seen, prefix="heartbeat ")
            if writing and run["dst_resumed"]:
                r0 = max([x[2] for x in reports(src)] + [0])
                run["dst_checked_round"] = wait_lines(
                    (src, dst), lambda: any(x[2] >= r0 + 2 for x in reports(dst)), a.check_s)
        mig.poll_consoles((src, dst), 0.3)
        sr, dr = reports(src), reports(dst)
        run["guest"] = {"before": disk_window(sr, t_settle, t0),
                        "during": disk_window(sr + dr, t0, t_end),
                        "after": disk_window(dr, t_end, time.monotonic()),
                        "rounds_src": max([x[2] for x in sr] + [0]),
                        "rounds_dst": max([x[2] for x in dr] + [0])}
        loss = [l for p in (src, dst) for _, l in p.seen if LOSS_RX.match(l)]
        run["data_loss_lines"] = loss[:20]
        run["data_loss"] = bool(loss)
        if loss:
            print("DATA LOSS %s %s: %s" % (wl, cfg, " / ".join(loss[:4])), flush=True)
            run["src_out"], run["dst_out"] = src.output()[-600:], dst.output()[-600:]
        if run["status"] == "completed" and route != "shared" and not writing and a.compare:
            dst.qmp().cmd("stop")
            run["images_equal"] = images_equal(src_img, dst_img)
        return run
    except (OSError, EOFError, RuntimeError, subprocess.SubprocessError) as e:
        run.update(status="error", error=repr(e), src_out=src.output()[-600:],
                   dst_out=dst.output()[-600:] if dst else None)
        return run
    finally:
        for p in (src, dst):
            if p:
                p.kill()
        if not a.keep:
            shutil.rmtree(sub, ignore_errors=True)


def stat(rs, f):
    xs = [f(r) for r in rs]
    xs = [x for x in xs if x is not None]
    return [statistics.median(xs), min(xs), max(xs)] if xs else None


def summarize(runs):
    rows = {}                       # in the runs' order
    for r in runs:
        rows.setdefault((r["workload"], r["config"]), []).append(r)
    out = []
    for (wl, cfg), rs in rows.items():
        ok = [r for r in rs if r.get("status") == "completed"]

        def during(k):
            return lambda r: (r.get("guest") or {}).get("during", {}) and \
                r["guest"]["during"].get(k)
        wire = [r.get("wire_bytes_a_to_b") for r in ok]
        out.append({
            "workload": wl, "config": cfg, "storage": rs[0]["storage"], "runs": len(rs),
            "completed": len(ok), "statuses": [r.get("status") for r in rs],
            "total_s": stat(ok, lambda r: r.get("total_s")),
            "downtime_ms": stat(ok, lambda r: r.get("downtime_ms")),
            "stall_ms": stat(ok, lambda r: r.get("stall_ms")),
            "wire_mib": stat(ok, lambda r: r.get("wire_bytes_a_to_b") and
                             r["wire_bytes_a_to_b"] / MIB) if any(wire) else None,
            "write_mib_s_before": stat(rs, lambda r: ((r.get("guest") or {}).get("before") or
                                                      {}).get("write_mib_s")),
            "write_mib_s_during": stat(ok, during("write_mib_s")),
            "max_lat_ms_during": stat(ok, during("max_lat_ms")),
            "data_loss_runs": sum(1 for r in rs if r.get("data_loss")),
            "images_equal": [r["images_equal"] for r in rs if "images_equal" in r],
            "dst_checked_round": [r["dst_checked_round"] for r in rs
                                  if "dst_checked_round" in r]})
    return out


def fmt(s, f="%.3g"):
    return "–" if s is None else ((f + " (" + f + "–" + f + ")") % tuple(s))


def table(summary, info, a):
    lines = ["# A disk migrated with the guest, kmig vs QEMU 7.2", "",
             "commit %s, %s, %s; guest %s RAM, image %d MiB with %d MiB written by the host, "
             "disk workload on %d MiB in %d-byte blocks; max-bandwidth %d MB/s for both and "
             "the wire shaped with tbf at the same rate; %d run(s) a cell; median (min–max)" % (
                 info["git_head"], info["kernel"], info["qemu_version"], a.memory, a.image_mb,
                 a.written_mb, a.disk_mb, BS, a.bandwidth // 1000000, a.reps), "",
             "| workload | config | storage | completed | total s | downtime ms | stall ms | "
             "wire MiB A→B | guest writes MiB/s before | during | longest request ms during |"
             " data loss | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        check = []
        if s["dst_checked_round"]:
            check.append("round %d/%d" % (sum(s["dst_checked_round"]),
                                         len(s["dst_checked_round"])))
        if s["images_equal"]:
            check.append("images equal %d/%d" % (sum(s["images_equal"]), len(s["images_equal"])))
        lines.append("| %s | %s | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            s["workload"], s["config"], s["storage"], s["completed"], s["runs"],
            fmt(s["total_s"]), fmt(s["downtime_ms"]), fmt(s["stall_ms"]), fmt(s["wire_mib"]),
            fmt(s["write_mib_s_before"]), fmt(s["write_mib_s_during"]),
            fmt(s["max_lat_ms_during"]),
            "**%d run(s)**" % s["data_loss_runs"] if s["data_loss_runs"] else "none",
            ", ".join(check) or "–"))
    lines += ["", "total: host seconds from the first migration command (qemu-mirror: the "
              "mirror's start) until the destination runs the guest; downtime: query-migrate's; "
              "stall: host ms from the source's last heartbeat line to the destination's first "
              "(one every %d ms, consoles read every 5 ms); wire: bytes from host A to host B on "
              "the shaped link during the migration; guest writes and longest request: from the "
              "guest's own `disk` reports (writes per report period, max_lat_us); check: the "
              "destination's guest finished a whole round of its region after the switch "
              "(every block checked), and for idle local runs the two images compared byte for "
              "byte." % REPORT_MS]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default=WORKLOADS,
                    help="comma list: idle, write-N (the guest writes N MiB/s)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--bandwidth", type=int, default=125000000,
                    help="bytes/s: max-bandwidth for both VMMs and the wire's tbf rate")
    ap.add_argument("--memory", default="1G", help="guest RAM")
    ap.add_argument("--image-mb", type=int, default=4096)
    ap.add_argument("--written-mb", type=int, default=1024,
                    help="MiB written by the host from /dev/urandom before the guest boots")
    ap.add_argument("--disk-mb", type=int, default=64, help="the guest's disk workload region")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of guest reports before the migration starts")
    ap.add_argument("--check-s", type=float, default=120.0,
                    help="at most this long for the destination's guest to check its "
                    "whole region after the switch")
    ap.add_argument("--cap", type=float, default=300.0, help="seconds before a cancel")
    ap.add_argument("--kmig-verify", action="store_true", help="x-verify on for kmig-stream")
    ap.add_argument("--no-zero-blocks", dest="zero_blocks", action="store_false",
                    help="qemu-block without QEMU's zero-blocks capability (zero blocks sent "
                    "as data)")
    ap.add_argument("--no-compare", dest="compare", action="store_false",
                    help="skip the byte-for-byte image comparison of idle local runs")
    ap.add_argument("--dir", default=None, help="where the images go (default: TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep each run's directory")
    ap.add_argument("--emulated-smoke", action="store_true",
                    help="inside scripts/kvm-vm: one small repetition, nothing written")
    ap.add_argument("--out", default=os.path.join(RESULTS, "disk.json"))
    a = ap.parse_args()
    if kt.emulated() and not a.emulated_smoke:
        sys.exit("disk: timings under emulation mean nothing; run it where /dev/kvm is native "
                 "(or --emulated-smoke to check the script)")
    if a.emulated_smoke:
        a.reps, a.memory, a.image_mb, a.written_mb, a.disk_mb = 1, "128M", 256, 64, 8
        if a.workloads == WORKLOADS:
            a.workloads = "write-1"
        a.check_s = min(a.check_s, 240.0)
        a.cap = max(a.cap, 900.0)
    info = mig.host_info()
    d = tempfile.mkdtemp(prefix="kmig-disk-", dir=a.dir)
    env = {}
    env["kmig"], env["guest"], bins = mig.snapshot_binaries(d)
    base = base_image(d, a)
    runs, n = [], 0
    rate = "%dkbit" % (a.bandwidth * 8 // 1000)
    try:
        with twohosts.topology("dsk", extra=["--rate", rate]) as h:
            for rep in range(a.reps):
                for wl in a.workloads.split(","):
                    for cfg in a.configs.split(","):
                        t = time.monotonic()
                        r = one_run(env, d, h, wl, cfg, a, base, n)
                        n += 1
                        r.update(rep=rep, wall_s=round(time.monotonic() - t, 1))
                        print(json.dumps(r), flush=True)
                        runs.append(r)
    finally:
        if a.keep:
            print("kept %s" % d, flush=True)
        else:
            shutil.rmtree(d, ignore_errors=True)
    summary = summarize(runs)
    text = table(summary, info, a)
    if a.emulated_smoke:
        print(text)
        return
    mig.save_results(a, "disk", info, bins, runs, summary, text, wire_rate=rate)
    with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
