#!/usr/bin/env python3
"""Live migration benchmark: kmig vs QEMU 7.2 on the same test guest, same run.

For every case (workload x bandwidth x configuration) a fresh source and
destination VMM are started on this host, the source's guest is given time to
settle, and a migration over tcp:127.0.0.1 is driven through QMP (the same
client code for both VMMs).  Recorded from query-migrate's final answer:
status, total-time, downtime, setup-time, ram.transferred (bytes sent) and
more; a migration still running after --cap seconds is cancelled and
recorded as "did not converge" with the bytes sent so far.  From the
source guest's `stress` lines: the worst max_ms_per_gib during the migration
and the seconds spent below half the pre-migration pace.

Writes bench/results/migrate.json and bench/results/migrate.md (the table,
also printed).  Never asserts.
"""
import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import kmigtest as kt  # noqa: E402  (QMP client and console follower)

QBOOT = "/usr/share/qemu/qboot.rom"
MIB = 1 << 20
QEMU_UNLIMITED = 100 * 1000 * 1000 * 1000     # 100 GB/s: QEMU has no "0 = unlimited"
REPORT_MS = 50                                # stress report period in the guest (ms)
SETTLE_LINES = 2500 // REPORT_MS              # reports before migrating: 2.5 s

# name: (vmm, dirty ring entries, auto-converge policy or None)
CONFIGS = {
    "kmig-bitmap": ("kmig", 0, None),
    "kmig-ring4096": ("kmig", 4096, None),
    "qemu-bitmap": ("qemu", 0, None),
    "qemu-ring4096": ("qemu", 4096, None),
    "kmig-bitmap+ac-computed": ("kmig", 0, "computed"),
    "kmig-bitmap+ac-step": ("kmig", 0, "step"),
    "qemu-bitmap+ac": ("qemu", 0, "qemu"),
    "kmig-ring4096+ac-computed": ("kmig", 4096, "computed"),
    "kmig-ring4096+ac-step": ("kmig", 4096, "step"),
    "qemu-ring4096+ac": ("qemu", 4096, "qemu"),
}
# (name, workload, stress MiB, guest memory)
WORKLOADS = {
    "idle-2G": ("idle", 0, "2G"),
    "stress128M-2G": ("stress", 128, "2G"),
    "stress512M-2G": ("stress", 512, "2G"),
}
BANDWIDTHS = {"unlimited": 0, "125MB/s": 125000000}

FULL = {
    "workloads": ["idle-2G", "stress128M-2G", "stress512M-2G"],
    "bandwidths": ["unlimited", "125MB/s"],
    "configs": ["kmig-bitmap", "kmig-ring4096", "qemu-bitmap", "qemu-ring4096",
                "kmig-bitmap+ac-computed", "kmig-bitmap+ac-step", "qemu-bitmap+ac",
                "kmig-ring4096+ac-computed", "qemu-ring4096+ac"],
}
QUICK = {
    "cases": [("idle-2G", "unlimited", c) for c in
              ("kmig-bitmap", "kmig-ring4096", "qemu-bitmap", "qemu-ring4096")] +
             [("stress128M-2G", "unlimited", c) for c in ("kmig-bitmap", "qemu-bitmap")] +
             [("stress128M-2G", "125MB/s", c) for c in
              ("kmig-bitmap+ac-computed", "qemu-bitmap+ac")],
}


# ------------------------------------------------------------ host, binaries

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def host_info():
    mhz = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                          text=True).stdout.splitlines()
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    return {"nproc": os.cpu_count(), "loadavg_start": loadavg(), "cpu_mhz": mhz,
            "kernel": platform.release(), "qemu_version": qemu[0] if qemu else None,
            "kvm_modules": sorted(m for m in os.listdir("/sys/module") if m.startswith("kvm")),
            "git_head": head, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def snapshot_binaries(d):
    """Copies kmig and the guest ELF so a concurrent rebuild cannot change them mid-run."""
    src_kmig = os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build"), "kmig")
    src_guest = os.path.join(ROOT, "build", "guest", "kmig-guest.elf")
    kmig, guest = os.path.join(d, "kmig"), os.path.join(d, "kmig-guest.elf")
    shutil.copy2(src_kmig, kmig)
    shutil.copy2(src_guest, guest)
    return kmig, guest, {"kmig": src_kmig, "kmig_sha256": sha256(kmig),
                         "guest": src_guest, "guest_sha256": sha256(guest)}


def bench_env(tmp, tsc_khz=0):
    """A benchmark's set-up in tmp: the binaries snapshotted, the host's
    facts (whether emulated too) and the guest's TSC rate (tsc_khz, else
    calibrated).  Returns (env, info, bins)."""
    kmig, guest, bins = snapshot_binaries(tmp)
    env = {"kmig": kmig, "guest": guest, "tmp": tmp}
    info = host_info()
    info["emulated"] = bool(os.environ.get("KMIG_TEST_EMULATED"))
    env["tsc_khz"] = tsc_khz or calibrate_tsc(env, tmp) or 2000000
    return env, info, bins


# ------------------------------------------------------------ VMs

class Proc:
    """A VMM process with its console (a file) and VMM output (a file)."""

    def __init__(self, d, name, args):
        self.name = name
        self.console = kt.Console(os.path.join(d, name + ".log"))
        self.qmp_path = os.path.join(d, name + ".qmp")
        self.out_path = os.path.join(d, name + ".out")
        self.out = open(self.out_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.q = None
        self.seen = []          # (host monotonic time first seen, line)
        self._nseen = 0

    def qmp(self, timeout=30.0):
        if self.q is None:
            self.q = kt.QMP(self.qmp_path, timeout=timeout)
        return self.q

    def poll_lines(self):
        """Reads new console lines, stamping each with the host time it was first seen."""
        self.console.poll()
        now = time.monotonic()
        while self._nseen < len(self.console.lines):
            self.seen.append((now, self.console.lines[self._nseen]))
            self._nseen += 1

    def output(self):
        self.out.flush()
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.q:
            try:
                self.q.close()
            except OSError:
                pass
        self.out.close()


def vm_args(env, vmm, ring, cmdline, memory, cpus, d, name, incoming=None):
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    if vmm == "kmig":
        args = [env["kmig"], "run", "--kernel", env["guest"], "--cmdline", cmdline,
                "--memory", memory, "--cpus", str(cpus), "--console", "file:" + console,
                "--qmp", "unix:" + qmp]
        # always explicit: 0 is the bitmap whatever kmig's default backend
        args += ["--dirty-ring", str(ring)]
        if incoming:
            args += ["--incoming", incoming]
        return args
    accel = "kvm" + (",dirty-ring-size=%d" % ring if ring else "")
    fw = ["-bios", QBOOT] if os.path.exists(QBOOT) else []
    args = ["qemu-system-x86_64", "-accel", accel, "-nodefaults", "-nographic",
            "-machine", "pc", "-m", memory, "-smp", str(cpus)] + fw + [
            "-kernel", env["guest"], "-append", cmdline,
            "-chardev", "file,id=con,path=" + console, "-serial", "chardev:con",
            "-monitor", "none", "-qmp", "unix:%s,server=on,wait=off" % qmp]
    if incoming:
        args += ["-incoming", incoming]
    return args


PAGE_STATS = ("pages_4k", "pages_2m", "pages_1g")


def kvm_pages(vmm, q):
    """{pages_4k: n, ...} from the source VMM, or {} if it has none."""
    try:
        if vmm == "kmig":
            vm = q.cmd("x-query-kvm-stats").get("vm", {})
            return {k: vm[k] for k in PAGE_STATS if k in vm}
        out = {}
        for prov in q.cmd("query-stats", target="vm") or []:
            for st in prov.get("stats", []):
                if st.get("name") in PAGE_STATS:
                    out[st["name"]] = st.get("value")
        return out
    except (KeyError, AttributeError, TypeError, RuntimeError):
        return {}


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def wait_dst_ready(dst, vmm, timeout=30.0):
    deadline = time.monotonic() + timeout
    if vmm == "kmig":
        while time.monotonic() < deadline and dst.alive():
            if "incoming migration: listening on" in dst.output():
                return True
            time.sleep(0.05)
        return False
    try:
        q = dst.qmp(timeout=timeout)
        while time.monotonic() < deadline:
            if q.cmd("query-status").get("status") == "inmigrate":
                return True
            time.sleep(0.05)
    except (OSError, EOFError, RuntimeError):
        pass
    return False


def calibrate_tsc(env, d):
    """Boots kmig once without tsc_khz= and reads the guest's `kmig-guest tsc_khz=` line."""
    p = Proc(d, "calib", vm_args(env, "kmig", 0, "workload=idle", "256M", 1, d, "calib"))
    try:
        m = p.console.wait(r"^kmig-guest tsc_khz=(\d+)", 30, proc=p.proc)
        return int(m.group(1)) if m else None
    finally:
        p.kill()


# ------------------------------------------------------------ guest lines

STRESS_RX = re.compile(r"^stress cpu=(\d+) t_ms=(\d+) ms_per_gib=([\d.]+) max_ms_per_gib=([\d.]+)"
                       r"(?: pages=(\d+))?")
TMS_RX = re.compile(r"t_ms=(\d+)")
SHARE_RX = re.compile(r"^kmig-guest share cpu=(\d+) base=0x[0-9a-f]+ pages=(\d+)")
PAGES_PER_GIB = 1 << 18


def share_pages(seen):
    """Each vCPU's stress area in pages, from the guest's share lines."""
    out = {}
    for _, line in seen:
        m = SHARE_RX.match(line)
        if m:
            out[int(m.group(1))] = out.get(int(m.group(1)), 0) + int(m.group(2))
    return out


def stress_lines(seen):
    """The stress reports, each marked `warm` when it measures the guest
    at its own pace: the vCPU's report before it had its whole area written
    once and a GiB more, so no GiB it counts holds a first write to a page
    (a fault into host memory, seconds per GiB when the host has given that
    memory back).  Without share lines or page counts: every report but
    each vCPU's first."""
    areas = share_pages(seen)
    out, last = [], {}
    for host_t, line in seen:
        m = STRESS_RX.match(line)
        if m:
            cpu, pages = int(m.group(1)), int(m.group(5)) if m.group(5) else None
            prev = last.get(cpu)
            if cpu in areas and pages is not None:
                warm = prev is not None and prev >= areas[cpu] + PAGES_PER_GIB
            else:
                warm = cpu in last
            last[cpu] = pages if pages is not None else -1
            out.append({"host": host_t, "cpu": cpu, "t_ms": int(m.group(2)),
                        "ms_per_gib": float(m.group(3)), "max_ms_per_gib": float(m.group(4)),
                        "pages": pages, "warm": warm})
    return out


def warm_reports(seen, cpus):
    """How many warm reports (stress_lines) each of cpus vCPUs has given."""
    lines = stress_lines(seen)
    return [sum(1 for l in lines if l["cpu"] == c and l["warm"]) for c in range(cpus)]


def guest_lost(lines, g0, t_start, t_end):
    """The time the guest lost while migrating, from its own work count:
    for each vCPU, the host seconds between its first report after t_start
    and its last before t_end, less the time its page writes in between
    would have taken at its pre-migration rate (the median of its pages per
    guest second between warm reports before guest time g0).  Every cause counts alike: throttle, dirty limit, pauses,
    pages not yet there after a post-copy switch, a starved vCPU.  Host
    times, because QEMU restores the guest TSC as it was at the pause and
    kmig advances it.  Returns {cpu: seconds} (vCPUs without a pages count
    or pre-migration rate left out) and their sum, or None."""
    per = {}
    for c in sorted(set(l["cpu"] for l in lines)):
        lc = [l for l in lines if l["cpu"] == c and l["pages"] is not None]
        before = [l for l in lc if l["warm"] and l["t_ms"] <= g0]
        win = [l for l in lc if t_start <= l["host"] <= t_end]
        rates = [(b["pages"] - a["pages"]) * 1000.0 / (b["t_ms"] - a["t_ms"])
                 for a, b in zip(before, before[1:]) if b["t_ms"] > a["t_ms"]]
        if not rates or len(win) < 2:
            continue
        rate = statistics.median(rates)
        if rate <= 0:
            continue
        work_s = (win[-1]["pages"] - win[0]["pages"]) / rate
        per[str(c)] = round((win[-1]["host"] - win[0]["host"]) - work_s, 3)
    if not per:
        return None
    return {"per_cpu_s": per, "sum_s": round(sum(per.values()), 3)}


def guest_offset(seen):
    """Host monotonic time (s) of the guest's t_ms=0: every line was printed
    before we saw it, so the smallest (seen - t_ms) is the closest estimate."""
    best = None
    for host_t, line in seen:
        m = TMS_RX.search(line)
        if m:
            o = host_t - int(m.group(1)) / 1000.0
            best = o if best is None else min(best, o)
    return best


def slowdown(seen, t_start, t_end):
    """Guest pace from the source's stress lines: baseline before t_start,
    worst and time below half pace while migrating (host times t_start..t_end)."""
    lines = stress_lines(seen)
    off = guest_offset(seen)
    if not lines or off is None:
        return None
    g0, g1 = (t_start - off) * 1000.0, (t_end - off) * 1000.0
    before = [l for l in lines if l["warm"] and l["t_ms"] <= g0]
    during = [l for l in lines if l["t_ms"] > g0 and l["t_ms"] - REPORT_MS < g1]
    if not before:
        return {"note": "no pre-migration stress lines"}
    lost = guest_lost(lines, g0, t_start, t_end)
    base = statistics.median(l["ms_per_gib"] for l in before)
    slow_s = sum(REPORT_MS / 1000.0 for l in during if l["ms_per_gib"] > 2 * base)
    # longest silence of cpu 0 between two reports that overlaps the window:
    # a stopped or starved vCPU prints nothing, which the pace numbers miss
    t0 = [l["t_ms"] for l in lines if l["cpu"] == 0]
    gap = max((b - a for a, b in zip(t0, t0[1:]) if b > g0 and a < g1), default=None)
    return {"baseline_ms_per_gib": base,
            "baseline_max_ms_per_gib": max(l["max_ms_per_gib"] for l in before),
            "worst_max_ms_per_gib": max((l["max_ms_per_gib"] for l in during), default=None),
            "worst_ms_per_gib": max((l["ms_per_gib"] for l in during), default=None),
            "s_below_half_pace": slow_s, "lines_during": len(during),
            "guest_lost_s": lost and lost["sum_s"], "guest_lost_per_cpu_s": lost and lost["per_cpu_s"],
            "max_report_gap_ms": gap,
            "window_guest_ms": [round(g0), round(g1)],
            "reports": [[l["cpu"], l["t_ms"], l["ms_per_gib"], l["max_ms_per_gib"]]
                        for l in lines]}


def switchover_gap(src_seen, dst_seen, prefix="stress cpu=0 "):
    """The switchover as seen from outside the guest: host milliseconds from
    the source console's last line starting with prefix to the destination
    console's first, each stamped when the poller first saw it (every
    POLL_LINES_S while migrating).  Host time, not the guest's clock: QEMU
    restores the guest TSC as it was at the pause, kmig advances it by the
    pause, so a gap in guest time would hide QEMU's downtime and not kmig's.
    The guest's pause is at most this and at least this less one report
    period (whichever VMM, as the guest reports on a TSC schedule)."""
    src = [t for t, l in src_seen if l.startswith(prefix)]
    dst = [t for t, l in dst_seen if l.startswith(prefix)]
    if not src or not dst or dst[0] < src[-1]:
        return None
    return round((dst[0] - src[-1]) * 1000.0, 1)


POLL_LINES_S = 0.005


def poll_consoles(procs, seconds):
    """Sleeps for seconds while reading the procs' consoles every POLL_LINES_S,
    so each line's host time stamp is within a few ms of when it was written."""
    end = time.monotonic() + seconds
    while True:
        for p in procs:
            p.poll_lines()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(POLL_LINES_S, left))


# ------------------------------------------------------------ one migration


def cancel_at_cap(q, res):
    """A migration still running at the cap: cancelled, and what the
    source says after it, into res."""
    try:
        q.cmd("migrate_cancel")
        fin = kt.wait_migration(q, timeout=15)
        res["after_cancel_status"] = fin.get("status")
        res["after_cancel_ram_transferred"] = fin.get("ram", {}).get("transferred")
        res["source_status_after_cancel"] = q.cmd("query-status").get("status")
    except (OSError, EOFError, RuntimeError) as e:
        res["cancel_error"] = repr(e)


def final_result(last):
    """The fields of a run taken from the source's last query-migrate."""
    ram = last.get("ram", {})
    return {"converged": last.get("status") == "completed", "status": last.get("status"),
            "total_time_ms": last.get("total-time"), "downtime_ms": last.get("downtime"),
            "setup_time_ms": last.get("setup-time"), "sent_bytes": ram.get("transferred"),
            "normal_pages": ram.get("normal"), "zero_pages": ram.get("duplicate"),
            "dirty_sync_count": ram.get("dirty-sync-count"), "mbps": ram.get("mbps"),
            "final_throttle_pct": last.get("cpu-throttle-percentage"),
            "error_desc": last.get("error-desc"), "query_final": last}

def one_case(env, d, wl_name, bw_name, cfg_name, rep, a):
    workload, mb, memory = WORKLOADS[wl_name]
    vmm, ring, ac = CONFIGS[cfg_name]
    bw = BANDWIDTHS[bw_name]
    cmdline = "workload=%s cpus=%d" % (workload, a.cpus)
    if workload == "stress":
        cmdline += " mb=%d report_ms=%d" % (mb, REPORT_MS)
    if env["tsc_khz"]:
        cmdline += " tsc_khz=%d" % env["tsc_khz"]
    tag = re.sub(r"[^A-Za-z0-9]+", "-", "%s-%s-%s-%d" % (wl_name, bw_name, cfg_name, rep))
    sub = os.path.join(d, tag)
    os.mkdir(sub)
    port = free_port()
    uri = "tcp:127.0.0.1:%d" % port
    res = {"workload": wl_name, "bandwidth": bw_name, "config": cfg_name, "rep": rep,
           "vmm": vmm, "dirty_ring": ring, "auto_converge": ac, "cpus": a.cpus,
           "memory": memory, "guest_cmdline": cmdline, "loadavg": loadavg()}
    src = Proc(sub, "src", vm_args(env, vmm, ring, cmdline, memory, a.cpus, sub, "src"))
    dst = Proc(sub, "dst", vm_args(env, vmm, ring, cmdline, memory, a.cpus, sub, "dst",
                                   incoming=uri))
    procs = [src, dst]
    try:
        # source settled: idle -> ready + a heartbeat; stress -> a few
        # warm reports from every vCPU (its first write to every page done)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and src.alive():
            src.poll_lines()
            if workload == "idle" and any(l.startswith("heartbeat") for _, l in src.seen):
                break
            if workload != "idle" and min(warm_reports(src.seen, a.cpus)) >= a.settle_lines:
                break
            time.sleep(0.05)
        else:
            res.update(status="error", error="source guest did not settle",
                       console_tail=src.console.text()[-500:], output=src.output()[-500:])
            return res
        if not wait_dst_ready(dst, vmm):
            res.update(status="error", error="destination not listening",
                       output=dst.output()[-500:])
            return res
        q = src.qmp()
        if vmm == "kmig":
            params = {"max-bandwidth": bw, "downtime-limit": a.downtime}
            if ac:
                params["x-cpu-throttle-policy"] = ac
        else:
            params = {"max-bandwidth": bw or QEMU_UNLIMITED, "downtime-limit": a.downtime}
        q.cmd("migrate-set-parameters", **params)
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": "auto-converge", "state": ac is not None}])
        res["params"] = params
        t_start = time.monotonic()
        q.cmd("migrate", uri=uri)
        last, max_thr, samples = None, 0, 0
        while True:
            src.poll_lines()
            r = q.cmd("query-migrate")
            samples += 1
            max_thr = max(max_thr, r.get("cpu-throttle-percentage", 0) or 0)
            if r.get("status") in kt.MIG_FINAL:
                last = r
                break
            last = r
            if time.monotonic() - t_start > a.cap:
                break
            poll_consoles((src, dst), a.poll)
        t_end = time.monotonic()
        res["wall_s"] = t_end - t_start
        res["max_throttle_pct"] = max_thr
        if last.get("status") not in kt.MIG_FINAL:
            # did not converge within the cap: cancel, keep the bytes sent so far
            res["converged"] = False
            res["status"] = "did not converge"
            res["sent_bytes"] = last.get("ram", {}).get("transferred")
            res["dirty_sync_count"] = last.get("ram", {}).get("dirty-sync-count")
            res["query_at_cap"] = last
            cancel_at_cap(q, res)
        else:
            res.update(final_result(last))
        # the source's last lines, then the guest pace
        poll_consoles((src, dst), 0.3)
        if workload == "stress":
            res["guest"] = slowdown(src.seen, t_start, t_end)
        if res["status"] == "completed":
            # does the guest go on at the destination?
            deadline = time.monotonic() + 5
            res["dst_resumed"] = False
            while time.monotonic() < deadline:
                poll_consoles((src, dst), POLL_LINES_S)
                if any(re.match(r"^(stress|heartbeat) ", l) for _, l in dst.seen):
                    res["dst_resumed"] = True
                    break
            if workload == "stress":
                res["guest_switchover_gap_ms"] = switchover_gap(src.seen, dst.seen)
        return res
    except (OSError, EOFError, RuntimeError) as e:
        res.update(status="error", error=repr(e), src_out=src.output()[-500:],
                   dst_out=dst.output()[-500:])
        return res
    finally:
        for p in procs:
            p.kill()
        if not a.keep:
            shutil.rmtree(sub, ignore_errors=True)


# ------------------------------------------------------------ summary, table

def save_results(a, name, info, bins, runs, summary, table_text, **extra):
    """The end of a benchmark run: load average at the end, the JSON at
    a.out (info, binaries, params = the command line's options, summary,
    runs, any extra keys) and the table on stdout."""
    info["loadavg_end"] = loadavg()
    doc = {"benchmark": name, "info": info, "binaries": bins,
           "params": {k: v for k, v in vars(a).items() if k != "out"}}
    doc.update(extra)
    doc.update(summary=summary, runs=runs)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(table_text)
    print("wrote %s" % a.out)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs):
    rows, order = {}, []
    for r in runs:
        k = (r["workload"], r["bandwidth"], r["config"])
        if k not in rows:
            rows[k] = []
            order.append(k)
        rows[k].append(r)
    out = []
    for k in order:
        rs = rows[k]
        conv = [r for r in rs if r.get("status") == "completed"]
        s = {"workload": k[0], "bandwidth": k[1], "config": k[2], "runs": len(rs),
             "completed": len(conv), "statuses": [r.get("status") for r in rs],
             "vmm": rs[0]["vmm"], "dirty_ring": rs[0]["dirty_ring"],
             "auto_converge": rs[0]["auto_converge"], "cpus": rs[0]["cpus"]}
        use = conv if conv else rs
        for f in ("total_time_ms", "downtime_ms", "setup_time_ms", "sent_bytes",
                  "dirty_sync_count", "max_throttle_pct", "wall_s", "guest_switchover_gap_ms"):
            s["median_" + f] = med(r.get(f) for r in use)
        g = [r.get("guest") or {} for r in use]
        s["worst_max_ms_per_gib"] = max((x["worst_max_ms_per_gib"] for x in g
                                         if x.get("worst_max_ms_per_gib") is not None),
                                        default=None)
        s["median_s_below_half_pace"] = med(x.get("s_below_half_pace") for x in g)
        s["median_guest_lost_s"] = med(x.get("guest_lost_s") for x in g)
        s["max_report_gap_ms"] = max((x["max_report_gap_ms"] for x in g
                                      if x.get("max_report_gap_ms") is not None), default=None)
        s["median_baseline_ms_per_gib"] = med(x.get("baseline_ms_per_gib") for x in g)
        out.append(s)
    # side by side: ratios to kmig-bitmap (auto-converge off) in the same workload and bandwidth
    base = {(s["workload"], s["bandwidth"]): s for s in out if s["config"] == "kmig-bitmap"}
    for s in out:
        b = base.get((s["workload"], s["bandwidth"]))
        for f in ("total_time_ms", "sent_bytes"):
            x = s["median_" + f]
            y = b and b["completed"] and b["median_" + f]
            s["ratio_%s_vs_kmig_bitmap" % f] = (x / y) if (s["completed"] and x is not None
                                                           and y) else None
    return out


def fmt(x, f, none="–"):
    return none if x is None else f % x


def table(summary, info, a):
    lines = ["Live migration, %d vCPU guest, downtime-limit %d ms, cap %d s (nproc %d, load %s "
             "at start, %s at end; the host was shared with other processes)" % (
                 a.cpus, a.downtime, a.cap, info["nproc"],
                 " ".join("%.2f" % x for x in info["loadavg_start"]),
                 " ".join("%.2f" % x for x in info.get("loadavg_end", []))),
             "",
             "| workload | bandwidth | config | status | total (s) | downtime (ms) "
             "| guest gap (ms) | setup (ms) "
             "| sent (MiB) | syncs | max throttle % | worst max ms/GiB (base) | s below ½ pace "
             "| longest report gap (ms) | total / kmig-bitmap | sent / kmig-bitmap | runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if s["completed"] == s["runs"]:
            status = "completed"
        elif s["completed"]:
            status = "completed %d/%d" % (s["completed"], s["runs"])
        elif all(x == "did not converge" for x in s["statuses"]):
            status = "did not converge (cancelled at %d s)" % a.cap
        else:
            status = "/".join(sorted(set(str(x) for x in s["statuses"])))
        done = s["completed"] > 0
        guest = "–"
        if s["worst_max_ms_per_gib"] is not None:
            guest = "%.0f (%s)" % (s["worst_max_ms_per_gib"],
                                   fmt(s["median_baseline_ms_per_gib"], "%.0f"))
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |" % (
            s["workload"], s["bandwidth"], s["config"], status,
            fmt(s["median_total_time_ms"] / 1000.0 if done and s["median_total_time_ms"] is not None
                else (s["median_wall_s"] if not done else None), "%.2f" if done else "≥%.0f"),
            fmt(s["median_downtime_ms"] if done else None, "%d"),
            fmt(s["median_guest_switchover_gap_ms"] if done else None, "%d"),
            fmt(s["median_setup_time_ms"] if done else None, "%d"),
            fmt(s["median_sent_bytes"] / MIB if s["median_sent_bytes"] is not None else None,
                "%.0f" if done else "≥%.0f"),
            fmt(s["median_dirty_sync_count"], "%d"),
            fmt(s["median_max_throttle_pct"], "%d"),
            guest, fmt(s["median_s_below_half_pace"], "%.1f"), fmt(s["max_report_gap_ms"], "%d"),
            fmt(s["ratio_total_time_ms_vs_kmig_bitmap"], "%.2f×"),
            fmt(s["ratio_sent_bytes_vs_kmig_bitmap"], "%.2f×"), s["runs"]))
    lines += ["",
              "total/downtime/setup: query-migrate's total-time, downtime, setup-time; sent: "
              "ram.transferred; values are medians over the runs.  Guest gap (stress only): "
              "host ms from cpu 0's last report on the source console to its first on the "
              "destination's (consoles read every 5 ms): the pause the guest saw, plus up to "
              "one report period.  "
              "Guest columns (stress "
              "only): worst max_ms_per_gib reported by the source guest while migrating (its "
              "pre-migration median ms/GiB in brackets) and seconds of reports below half the "
              "pre-migration pace; longest gap between two of the source guest's reports (one every %d ms) that overlaps the migration (a stopped or starved vCPU prints nothing).  Unlimited bandwidth is max-bandwidth 0 for kmig and "
              "%d bytes/s for QEMU." % (REPORT_MS, QEMU_UNLIMITED)]
    return "\n".join(lines)


# ------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short subset (a few minutes)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each cheap (idle) case")
    ap.add_argument("--reps-expensive", type=int, default=1, help="runs of each stress case")
    ap.add_argument("--cap", type=float, default=60.0,
                    help="cancel a migration still running after this many seconds")
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--downtime", type=int, default=300, help="downtime-limit, ms")
    ap.add_argument("--workloads", default=",".join(FULL["workloads"]),
                    help="comma list of " + ", ".join(WORKLOADS))
    ap.add_argument("--bandwidths", default=",".join(FULL["bandwidths"]),
                    help="comma list of " + ", ".join(BANDWIDTHS))
    ap.add_argument("--configs", default=",".join(FULL["configs"]),
                    help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--only", default=None, help="regex on 'workload bandwidth config'")
    ap.add_argument("--settle-lines", type=int, default=SETTLE_LINES,
                    help="stress reports to wait for before migrating (report every %d ms)"
                    % REPORT_MS)
    ap.add_argument("--poll", type=float, default=0.2, help="query-migrate interval, s")
    ap.add_argument("--tsc-khz", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the per-case directories")
    ap.add_argument("--out", default=os.path.join(RESULTS, "migrate.json"))
    ap.add_argument("--md", default=None, help="markdown table (default: --out with .md)")
    ap.add_argument("--retable", metavar="JSON", default=None,
                    help="only rebuild the summary and table of an earlier run's JSON")
    a = ap.parse_args()
    md_path = a.md or os.path.splitext(a.out)[0] + ".md"
    if a.retable:
        with open(a.retable) as f:
            old = json.load(f)
        c = old["config"]
        a.quick, a.cpus, a.downtime, a.cap = c["quick"], c["cpus"], c["downtime_limit_ms"], c["cap_s"]
        a.reps, a.reps_expensive, a.settle_lines = c["reps_cheap"], c["reps_expensive"], c["settle_lines"]
        doc = write(a, md_path, old["host"], old["binaries"], {"tsc_khz": c["tsc_khz"]},
                    old["runs"], partial=old.get("partial", False))
        print(doc["table"])
        return

    if a.quick:
        cases = [(w, b, c, 1) for (w, b, c) in QUICK["cases"]]
        a.cap = min(a.cap, 40.0)
    else:
        cases = []
        for w in a.workloads.split(","):
            for b in a.bandwidths.split(","):
                cfgs = [c for c in a.configs.split(",")
                        if not (WORKLOADS[w][0] == "idle" and CONFIGS[c][2])]
                reps = a.reps if WORKLOADS[w][0] == "idle" else a.reps_expensive
                cases += [(w, b, c, reps) for c in cfgs]
    if a.only:
        rx = re.compile(a.only)
        cases = [x for x in cases if rx.search("%s %s %s" % x[:3])]

    info = host_info()
    d = tempfile.mkdtemp(prefix="kmigbench-mig-")
    kmig, guest, bins = snapshot_binaries(d)
    env = {"kmig": kmig, "guest": guest}
    env["tsc_khz"] = a.tsc_khz or calibrate_tsc(env, d)
    print("nproc %d, load %s, tsc_khz %s, %d case(s)" % (
        info["nproc"], " ".join("%.2f" % x for x in info["loadavg_start"]), env["tsc_khz"],
        len(cases)), flush=True)

    runs = []
    # group by (workload, bandwidth); repetitions interleave the configurations
    groups = []
    for w, b, c, reps in cases:
        if not groups or groups[-1][0] != (w, b):
            groups.append(((w, b), []))
        groups[-1][1].append((c, reps))
    doc = None
    for (w, b), cfgs in groups:
        for rep in range(max(r for _, r in cfgs)):
            for c, reps in cfgs:
                if rep >= reps:
                    continue
                t0 = time.monotonic()
                r = one_case(env, d, w, b, c, rep, a)
                runs.append(r)
                g = r.get("guest") or {}
                print("  %-14s %-9s %-26s rep %d: %-16s total %s ms  downtime %s ms  sent %s MiB"
                      "  worst %s ms/GiB  (%.0f s)" % (
                          w, b, c, rep, r.get("status"), r.get("total_time_ms", "–"),
                          r.get("downtime_ms", "–"),
                          "%.0f" % (r["sent_bytes"] / MIB) if r.get("sent_bytes") else "–",
                          g.get("worst_max_ms_per_gib", "–"), time.monotonic() - t0), flush=True)
                if r.get("status") == "error":
                    print("    error: %s" % {k: v for k, v in r.items()
                                             if k in ("error", "output", "src_out", "dst_out",
                                                      "console_tail")}, flush=True)
                doc = write(a, md_path, info, bins, env, runs, partial=True)
    info["loadavg_end"] = loadavg()
    doc = write(a, md_path, info, bins, env, runs, partial=False)
    print()
    print(doc["table"])
    print("\nJSON: %s\nmarkdown: %s" % (a.out, md_path))
    shutil.rmtree(d, ignore_errors=True)


def write(a, md_path, info, bins, env, runs, partial):
    summary = summarize(runs)
    tbl = table(summary, info, a)
    doc = {"benchmark": "migrate", "partial": partial, "host": info, "binaries": bins,
           "config": {"quick": a.quick, "cpus": a.cpus, "downtime_limit_ms": a.downtime,
                      "cap_s": a.cap, "reps_cheap": a.reps, "reps_expensive": a.reps_expensive,
                      "tsc_khz": env["tsc_khz"], "stress_report_ms": REPORT_MS,
                      "settle_lines": a.settle_lines,
                      "qemu_unlimited_bandwidth": QEMU_UNLIMITED,
                      "qemu_args": "-accel kvm[,dirty-ring-size=N] -nodefaults -nographic "
                                   "-machine pc (default cpu model) -bios qboot.rom when "
                                   "installed -monitor none",
                      "kmig_reaper": "adaptive (default)",
                      "configs": {k: {"vmm": v[0], "dirty_ring": v[1], "auto_converge": v[2]}
                                  for k, v in CONFIGS.items()},
                      "workloads": {k: {"workload": v[0], "mb": v[1], "memory": v[2]}
                                    for k, v in WORKLOADS.items()},
                      "bandwidths_bytes_per_s": BANDWIDTHS},
           "summary": summary, "table": tbl, "runs": runs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(md_path, "w") as f:
        f.write(tbl + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(main())
