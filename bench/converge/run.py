#!/usr/bin/env python3
"""Convergence benchmark: throttling policies under memory stress, kmig vs QEMU 7.2.

The shape of seed 000's tables on this machine: a 2 GiB guest whose vCPUs
write one byte per 4 KiB page over a stress size from small to most of RAM,
migrated over a 125 MB/s link with a 300 ms downtime limit, for every dirty
tracking (bitmap, ring 4096, ring 65536) and convergence policy (auto-converge
step / computed, dirty-limit), with QEMU 7.2's auto-converge and its
set-vcpu-dirty-limit on the same guest and link in the same run.

Per cell: total migration time, downtime, bytes sent, the highest throttle
seen, and the guest's slowdown from the source's stress lines (worst
max_ms_per_gib, seconds below half the pre-migration pace).  A migration still
running after --cap seconds is cancelled and recorded as "did not converge".

Writes bench/results/converge.json and bench/results/converge.md (also
printed).  Never asserts.
"""
import argparse
import atexit
import contextlib
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

# the migration benchmark's helpers: host info, VMM processes and command
# lines, QMP, TSC calibration, stress line parsing
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mb  # noqa: E402  (the migration benchmark's helpers)
kt = mb.kt

MIB = 1 << 20
REPORT_MS = mb.REPORT_MS
MEMORY = "2G"                # --memory

# name: (vmm, dirty ring entries, policy)
#   step / computed: kmig auto-converge with that x-cpu-throttle-policy
#   dirty-limit:     kmig's dirty-limit migration capability (ring only)
#   ac:              QEMU auto-converge (default throttle parameters)
#   vcpu-limit:      QEMU 7.2 set-vcpu-dirty-limit on the source just before
#                    migrate (7.2 has no dirty-limit migration capability)
CONFIGS = {
    "kmig-bitmap+step": ("kmig", 0, "step"),
    "kmig-bitmap+computed": ("kmig", 0, "computed"),
    "kmig-ring4096+step": ("kmig", 4096, "step"),
    "kmig-ring4096+computed": ("kmig", 4096, "computed"),
    "kmig-ring4096+dirty-limit": ("kmig", 4096, "dirty-limit"),
    "kmig-ring65536+step": ("kmig", 65536, "step"),
    "kmig-ring65536+computed": ("kmig", 65536, "computed"),
    "kmig-ring65536+dirty-limit": ("kmig", 65536, "dirty-limit"),
    "qemu-bitmap+ac": ("qemu", 0, "ac"),
    "qemu-ring4096+ac": ("qemu", 4096, "ac"),
    "qemu-ring4096+vcpu-limit": ("qemu", 4096, "vcpu-limit"),
    # not in the full set (--configs): the seed's other ring size for QEMU
    "qemu-ring65536+ac": ("qemu", 65536, "ac"),
    "qemu-ring65536+vcpu-limit": ("qemu", 65536, "vcpu-limit"),
    # post-copy (bench/postcopy): after the bulk pass, or by itself (hybrid)
    "kmig-ring4096+postcopy": ("kmig", 4096, "postcopy"),
    "kmig-ring4096+hybrid": ("kmig", 4096, "hybrid"),
    "qemu-ring4096+postcopy": ("qemu", 4096, "postcopy"),
    # migrate-start-postcopy as soon as the migration is active: the
    # earliest switch a user of either VMM can ask for
    "kmig-ring4096+postcopy-start": ("kmig", 4096, "postcopy-start"),
    "qemu-ring4096+postcopy-start": ("qemu", 4096, "postcopy-start"),
    # post-copy with the postcopy-preempt capability (QEMU 7.2: off by default): the
    # pages asked for on a channel of their own
    "qemu-ring4096+postcopy-preempt": ("qemu", 4096, "postcopy-preempt"),
    "kmig-ring4096+postcopy-preempt": ("kmig", 4096, "postcopy-preempt"),
    # pre-copy with xbzrle (the same cache on both, --xbzrle-cache), no
    # throttle: what the deltas alone do for a guest that rewrites one byte
    # of each page
    "kmig-ring4096+xbzrle": ("kmig", 4096, "xbzrle"),
    "qemu-ring4096+xbzrle": ("qemu", 4096, "xbzrle"),
    # `kmig migrate` with no policy option, as a user runs it: its default
    # policy (docs/usage.md) chosen by the command from the source's backend
    "kmig-ring4096+default": ("kmig", 4096, "default"),
    "kmig-bitmap+default": ("kmig", 0, "default"),
    "kmig-ring65536+default": ("kmig", 65536, "default"),
}
# seed 000's five ideas (docs/policies.md): all on, all off, each off alone
# (bench/seed000 runs them against QEMU's auto-converge)
SEED_OFF = {  # policy: the ideas it turns off
    "seed-all": (), "seed-none": (1, 2, 3, 4, 5),
    "seed-no1": (1,), "seed-no2": (2,), "seed-no3": (3,), "seed-no4": (4,), "seed-no5": (5,),
}
for _ring, _name in ((0, "bitmap"), (4096, "ring4096"), (65536, "ring65536")):
    for _pol in SEED_OFF:
        CONFIGS["kmig-%s+%s" % (_name, _pol)] = ("kmig", _ring, _pol)
POSTCOPY = ("postcopy", "postcopy-start", "hybrid", "postcopy-preempt")
# run order: QEMU rows spread among kmig rows, so outside load hits both alike
FULL_CONFIGS = ["kmig-bitmap+step", "qemu-bitmap+ac", "kmig-bitmap+computed",
                "kmig-ring4096+step", "qemu-ring4096+ac", "kmig-ring4096+computed",
                "kmig-ring4096+dirty-limit", "qemu-ring4096+vcpu-limit",
                "kmig-ring65536+step", "kmig-ring65536+computed",
                "kmig-ring65536+dirty-limit"]
FULL_SIZES = [256, 512, 1536]
QUICK_SIZES = [512]
QUICK_CONFIGS = ["kmig-ring4096+computed", "qemu-ring4096+ac", "kmig-ring4096+dirty-limit",
                 "qemu-ring4096+vcpu-limit", "kmig-bitmap+computed", "qemu-bitmap+ac"]
POLICY_TEXT = {
    "step": "auto-converge, x-cpu-throttle-policy step (QEMU's law), x-final-round off "
            "(QEMU's switchover): the like-for-like row",
    "computed": "auto-converge, x-cpu-throttle-policy computed, x-final-round on",
    "dirty-limit": "capability dirty-limit (vcpu-dirty-limit, x-vcpu-dirty-limit-period), "
                   "x-final-round on",
    "ac": "auto-converge (QEMU 7.2, default cpu-throttle parameters)",
    "default": "`kmig migrate --bandwidth MB --downtime MS --json URI` with no policy "
               "option: the command's default policy (dirty-limit on the ring, the computed "
               "throttle on the bitmap), the choice read from its x-kmig-migrate",
    "postcopy": "postcopy-ram on both sides, migrate-start-postcopy once the bulk pass is "
                "over (dirty-sync-count 1 in kmig, 2 in QEMU, which counts its setup sync), "
                "max-postcopy-bandwidth = max-bandwidth, no auto-converge",
    "postcopy-start": "postcopy-ram on both sides, migrate-start-postcopy at the first "
                      "poll that finds the migration active (the earliest a user can ask), "
                      "max-postcopy-bandwidth = max-bandwidth, no auto-converge",
    "postcopy-preempt": "as postcopy (migrate-start-postcopy once the bulk pass is over), "
                        "with the postcopy-preempt capability on both sides: the pages "
                        "asked for go on a channel of their own",
    "hybrid": "postcopy-ram on both sides and x-postcopy-auto (x-postcopy-early on, the "
              "default): kmig switches by itself (policies.md \"Hybrid\"), "
              "max-postcopy-bandwidth = max-bandwidth, "
              "auto-converge on (it throttles only if pre-copy goes on)",
    "xbzrle": "capability xbzrle on, xbzrle-cache-size --xbzrle-cache MiB on both, no "
              "auto-converge (kmig: x-final-round on)",
    "vcpu-limit": "set-vcpu-dirty-limit on every vCPU just before migrate (QEMU 7.2 has no "
                  "dirty-limit capability; emulates 8.1's dirty-limit, which sets the same "
                  "limit only after two high rounds)",
}
for _pol, _off in SEED_OFF.items():
    POLICY_TEXT[_pol] = "auto-converge, x-final-round on; seed 000's ideas " + (
        "all on" if not _off else "all off" if len(_off) == 5 else
        "on but %s" % ", ".join(str(i) for i in _off))


def seed_settings(policy):
    """The reaper and QMP parameters of a seed-* policy: 1 x-sync-per-slot, 2
    --reaper fixed, 3 x-kick-throttled, 4 x-sync-dirty-rate, 5 step (else
    computed).  None for other policies."""
    if policy not in SEED_OFF:
        return None
    off = SEED_OFF[policy]
    return {"reaper": "fixed" if 2 in off else "adaptive",
            "params": {"x-cpu-throttle-policy": "step" if 5 in off else "computed",
                       "x-final-round": True, "x-sync-per-slot": 1 in off,
                       "x-kick-throttled": 3 in off, "x-sync-dirty-rate": 4 in off}}
TRACKING = {0: "bitmap", 4096: "ring 4096", 65536: "ring 65536"}


# ------------------------------------------------------------ binaries

def snapshot_binaries(d, build):
    """Copies kmig and the guest ELF so a concurrent rebuild cannot change them mid-run."""
    src_kmig = os.path.join(build, "kmig")
    src_guest = os.path.join(build, "guest", "kmig-guest.elf")
    kmig, guest = os.path.join(d, "kmig"), os.path.join(d, "kmig-guest.elf")
    shutil.copy2(src_kmig, kmig)
    shutil.copy2(src_guest, guest)
    return kmig, guest, {"kmig": src_kmig, "kmig_sha256": mb.sha256(kmig),
                         "guest": src_guest, "guest_sha256": mb.sha256(guest)}


def vm_args(env, vmm, ring, cmdline, cpus, d, name, reaper, incoming=None, memory=MEMORY):
    args = mb.vm_args(env, vmm, ring, cmdline, memory, cpus, d, name, incoming=incoming)
    if vmm == "kmig" and ring:
        args += ["--reaper", reaper]
    return args


def dirty_limit_mbps(a):
    """Per-vCPU quota, MB/s (2^20): --dirty-limit, or a sixth of the link shared by
    the vCPUs (20 MB/s for one vCPU at 125 MB/s): the limited guest then dirties at
    most a third of what the link sends, well under the 50% trigger threshold."""
    if a.dirty_limit:
        return a.dirty_limit
    return max(1, int(round(a.bandwidth / MIB / 6.0 / a.cpus)))


# ------------------------------------------------------------ guest pace

def slowdown(seen, t_start, t_end):
    """Guest pace from the source's stress lines, per vCPU: the baseline is the
    median ms_per_gib of the warm reports before t_start (mb.stress_lines:
    none holds a first write to a page); a report covers the guest time since the previous
    report of the same vCPU, and is "slow" when its ms_per_gib is more than twice
    that vCPU's baseline.  Seconds below half pace: the union over vCPUs of the
    slow intervals, clipped to the migration (host times t_start..t_end)."""
    lines = mb.stress_lines(seen)
    off = mb.guest_offset(seen)
    if not lines or off is None:
        return None
    g0, g1 = (t_start - off) * 1000.0, (t_end - off) * 1000.0
    cpus = sorted(set(l["cpu"] for l in lines))
    base, slow, gaps, during_all, before_all = {}, [], [], [], []
    for c in cpus:
        lc = [l for l in lines if l["cpu"] == c]
        before = [l for l in lc if l["warm"] and l["t_ms"] <= g0]
        before_all += before
        if not before:
            continue
        b = statistics.median(l["ms_per_gib"] for l in before)
        base[c] = b
        for prev, l in zip(lc, lc[1:]):
            lo, hi = prev["t_ms"], l["t_ms"]
            if hi <= g0 or lo >= g1:
                continue
            during_all.append(l)
            gaps.append(hi - lo)
            if l["ms_per_gib"] > 2 * b:
                slow.append((max(lo, g0), min(hi, g1)))
    if not base:
        return {"note": "no pre-migration stress lines"}
    lost = mb.guest_lost(lines, g0, t_start, t_end)
    slow.sort()
    total, cur = 0.0, None
    for lo, hi in slow:
        if cur and lo <= cur[1]:
            cur[1] = max(cur[1], hi)
        else:
            if cur:
                total += cur[1] - cur[0]
            cur = [lo, hi]
    if cur:
        total += cur[1] - cur[0]
    return {"baseline_ms_per_gib": statistics.median(base.values()),
            "baseline_ms_per_gib_per_cpu": {str(c): v for c, v in base.items()},
            "baseline_max_ms_per_gib": max(l["max_ms_per_gib"] for l in before_all),
            "worst_max_ms_per_gib": max((l["max_ms_per_gib"] for l in during_all), default=None),
            "worst_ms_per_gib": max((l["ms_per_gib"] for l in during_all), default=None),
            "s_below_half_pace": total / 1000.0,
            "guest_lost_s": lost and lost["sum_s"],
            "guest_lost_per_cpu_s": lost and lost["per_cpu_s"],
            "lines_during": len(during_all),
            "max_report_gap_ms": max(gaps, default=None),
            "window_guest_ms": [round(g0), round(g1)],
            "reports": [[l["cpu"], l["t_ms"], l["ms_per_gib"], l["max_ms_per_gib"]]
                        for l in lines]}


def lost_from(seen, t_start, t_from, t_end):
    """The guest's lost seconds (bench/migrate's guest_lost) from host time
    t_from to t_end, its pre-migration rate from before t_start."""
    lines = mb.stress_lines(seen)
    off = mb.guest_offset(seen)
    if not lines or off is None:
        return None
    lost = mb.guest_lost(lines, (t_start - off) * 1000.0, t_from, t_end)
    return lost and lost["sum_s"]


# ------------------------------------------------------------ one migration

def in_ns(net, side, args):
    """args run in host A's or B's namespace of scripts/two-hosts (--rtt-ms)."""
    return ["ip", "netns", "exec", net[side]] + args if net else args


def cli_migrate(env, src, uri, a, net):
    """`kmig migrate` with no policy option, started on the source's side."""
    args = [env["kmig"], "migrate", "--qmp", "unix:" + src.qmp_path,
            "--bandwidth", str(a.bandwidth // 1000000), "--downtime", str(a.downtime),
            "--json", uri]
    return subprocess.Popen(in_ns(net, "a", args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_cli_started(q, cli):
    """Until the command has issued `migrate` (or has exited)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cli.poll() is None:
        if q.cmd("query-migrate").get("status") not in (None, "none"):
            return
        time.sleep(0.01)


def cli_result(q, cli, res):
    """The command's exit and its choice (a migration still running at the
    cap is cancelled first, by the caller: the command then ends with it)."""
    try:
        out, err = cli.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        cli.kill()
        out, err = cli.communicate()
    res["cli_rc"], res["cli_stderr"] = cli.returncode, err[-400:]
    try:
        choice = json.loads(out).get("x-kmig-migrate") or {}
    except ValueError:
        choice = {}
    res["cli_choice"] = choice
    if choice.get("policy") == "dirty-limit":
        res["vcpu_dirty_limit_mbps"] = choice.get("vcpu-dirty-limit")
    res["params"] = {k: v for k, v in q.cmd("query-migrate-parameters").items()
                     if k in ("max-bandwidth", "downtime-limit", "vcpu-dirty-limit",
                              "x-cpu-throttle-policy", "x-final-round")}
    res["capabilities"] = {c["capability"]: c["state"]
                           for c in q.cmd("query-migrate-capabilities")
                           if c["capability"] in ("auto-converge", "dirty-limit")}


def one_case(env, d, size, cfg, rep, a):
    vmm, ring, policy = CONFIGS[cfg]
    cmdline = "workload=stress cpus=%d mb=%d report_ms=%d" % (a.cpus, size, REPORT_MS)
    if env["tsc_khz"]:
        cmdline += " tsc_khz=%d" % env["tsc_khz"]
    tag = re.sub(r"[^A-Za-z0-9]+", "-", "s%d-%s-%d" % (size, cfg, rep))
    sub = os.path.join(d, tag)
    os.mkdir(sub)
    net = env.get("net")    # --rtt-ms: source on host A, destination on host B
    uri = "tcp:%s:%d" % (net["KMIG_NET_B"] if net else "127.0.0.1", mb.free_port())
    res = {"stress_mib": size, "config": cfg, "rep": rep, "vmm": vmm, "dirty_ring": ring,
           "tracking": TRACKING.get(ring, "ring %d" % ring), "policy": policy,
           "cpus": a.cpus, "memory": a.memory, "guest_cmdline": cmdline, "loadavg": mb.loadavg()}
    seed = seed_settings(policy)
    reaper = seed["reaper"] if seed else a.reaper
    res = dict(res, reaper=reaper if vmm == "kmig" and ring else None)
    src = mb.Proc(sub, "src", in_ns(net, "a", vm_args(env, vmm, ring, cmdline, a.cpus, sub,
                                                      "src", reaper, memory=a.memory)))
    dst = mb.Proc(sub, "dst", in_ns(net, "b", vm_args(env, vmm, ring, cmdline, a.cpus, sub,
                                                      "dst", reaper, incoming=uri,
                                                      memory=a.memory)))
    try:
        # settled: a.settle_lines warm stress reports from every vCPU (its
        # first write to every page of its area done: a baseline without it)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and src.alive():
            src.poll_lines()
            if min(mb.warm_reports(src.seen, a.cpus)) >= a.settle_lines:
                break
            time.sleep(0.05)
        else:
            res.update(status="error", error="source guest did not settle",
                       console_tail=src.console.text()[-500:], output=src.output()[-500:])
            return res
        if not mb.wait_dst_ready(dst, vmm):
            res.update(status="error", error="destination not listening",
                       output=dst.output()[-500:])
            return res
        q = src.qmp()
        params = {"max-bandwidth": a.bandwidth, "downtime-limit": a.downtime}
        caps = {"auto-converge": policy in ("step", "computed", "ac", "hybrid") or
                seed is not None}
        if policy in POSTCOPY:
            # the same link after the switch: max-postcopy-bandwidth too
            params["max-postcopy-bandwidth"] = a.bandwidth
            caps["postcopy-ram"] = True
            # both destinations measure how long their vCPUs waited for pages
            dcaps = [{"capability": "postcopy-ram", "state": True},
                     {"capability": "postcopy-blocktime", "state": True}]
            if policy == "postcopy-preempt":
                caps["postcopy-preempt"] = True
                dcaps.append({"capability": "postcopy-preempt", "state": True})
            dst.qmp().cmd("migrate-set-capabilities", capabilities=dcaps)
            if policy == "hybrid":
                caps["x-postcopy-auto"] = True
        if policy == "xbzrle":
            caps["xbzrle"] = True
            params["xbzrle-cache-size"] = a.xbzrle_cache * MIB
        quota = dirty_limit_mbps(a) if policy in ("dirty-limit", "vcpu-limit") else None
        if vmm == "kmig":
            caps["dirty-limit"] = policy == "dirty-limit"
            if policy in ("step", "computed"):
                params["x-cpu-throttle-policy"] = policy
            # step is the like-for-like row: QEMU's law and QEMU's switchover
            params["x-final-round"] = (policy != "step" if a.final_round == "policy"
                                       else a.final_round == "on")
            if policy == "dirty-limit":
                params["vcpu-dirty-limit"] = quota
                params["x-vcpu-dirty-limit-period"] = a.dirty_limit_period
            if seed:
                params.update(seed["params"])
                if a.final_round != "policy":
                    params["x-final-round"] = a.final_round == "on"
        cli = None
        if policy == "default":
            # the command sets the link, the limit and its policy itself
            cli = cli_migrate(env, src, uri, a, net)
            t_start = t_mig = time.monotonic()
            wait_cli_started(q, cli)
        else:
            q.cmd("migrate-set-parameters", **params)
            q.cmd("migrate-set-capabilities",
                  capabilities=[{"capability": k, "state": v} for k, v in caps.items()])
            res["params"], res["capabilities"] = params, caps
            res["vcpu_dirty_limit_mbps"] = quota
            t_start = time.monotonic()
            if policy == "vcpu-limit":
                q.cmd("set-vcpu-dirty-limit", **{"dirty-rate": quota})
                res["limit_set_before_migrate_s"] = time.monotonic() - t_start
            t_mig = time.monotonic()
            q.cmd("migrate", uri=uri)
        last, max_thr, samples = None, 0, 0
        max_limit_sleep, limit_rates, timeline = 0, [], []
        pc_asked = False
        while True:
            src.poll_lines()
            r = q.cmd("query-migrate")
            samples += 1
            ram = r.get("ram", {})
            if policy in ("postcopy", "postcopy-preempt") and not pc_asked and \
                    ram.get("dirty-sync-count", 0) >= (
                    1 if vmm == "kmig" else 2):
                q.cmd("migrate-start-postcopy")
                pc_asked = True
                res["postcopy_asked_s"] = round(time.monotonic() - t_mig, 3)
            if policy == "postcopy-start" and not pc_asked and r.get("status") == "active":
                q.cmd("migrate-start-postcopy")
                pc_asked = True
                res["postcopy_asked_s"] = round(time.monotonic() - t_mig, 3)
            if r.get("status") == "postcopy-active" and "postcopy_active_s" not in res:
                res["postcopy_active_s"] = round(time.monotonic() - t_mig, 3)
            # [s since migrate, status, bytes sent, bytes left, dirty pages/s, throttle %]
            timeline.append([round(time.monotonic() - t_mig, 3), r.get("status"),
                             ram.get("transferred"), ram.get("remaining"),
                             ram.get("dirty-pages-rate"), r.get("cpu-throttle-percentage")])
            max_thr = max(max_thr, r.get("cpu-throttle-percentage", 0) or 0)
            max_limit_sleep = max(max_limit_sleep,
                                  r.get("dirty-limit-throttle-time-per-round", 0) or 0)
            if (quota is not None or cli) and r.get("status") not in kt.MIG_FINAL:
                try:
                    lim = q.cmd("query-vcpu-dirty-limit")
                    limit_rates.append([round(time.monotonic() - t_start, 2)] +
                                       [x.get("current-rate") for x in lim])
                except RuntimeError:
                    pass
            last = r
            if r.get("status") in kt.MIG_FINAL or time.monotonic() - t_mig > a.cap:
                break
            if cli and cli.poll() is not None and r.get("status") in (None, "none"):
                break   # the command ended without starting a migration
            mb.poll_consoles((src, dst), a.poll)
        t_end = time.monotonic()
        res["wall_s"] = t_end - t_mig
        capped = last.get("status") not in kt.MIG_FINAL
        if capped:
            mb.cancel_at_cap(q, res)
        if cli:
            cli_result(q, cli, res)
            quota = res.get("vcpu_dirty_limit_mbps")
        res["max_throttle_pct"] = max_thr
        res["polls"] = samples
        res["timeline"] = timeline
        if quota is not None:
            res["max_dirty_limit_sleep_us_per_round"] = max_limit_sleep or None
            res["vcpu_dirty_limit_samples"] = limit_rates
            # from the first measured rate on (0 until the first period closes)
            rates = [x for s in limit_rates for x in s[1:] if x is not None]
            while rates and rates[0] == 0:
                rates.pop(0)
            res["limited_vcpu_rate_mbps"] = statistics.median(rates) if rates else None
            res["limit_active"] = bool(limit_rates and len(limit_rates[-1]) > 1)
        if capped:
            res["converged"] = False
            res["status"] = "did not converge"
            res["sent_bytes"] = last.get("ram", {}).get("transferred")
            res["dirty_sync_count"] = last.get("ram", {}).get("dirty-sync-count")
            res["query_at_cap"] = last
        else:
            res.update(mb.final_result(last))
        mb.poll_consoles((src, dst), 0.3)
        if policy in POSTCOPY:
            # the guest runs at the destination from the switch on: its
            # pace there counts (its lines continue the source's)
            res["guest"] = slowdown(sorted(src.seen + dst.seen), t_start, t_end)
            sw = res.get("postcopy_active_s")
            if sw is not None and res["guest"]:
                res["guest"]["guest_lost_after_switch_s"] = lost_from(
                    sorted(src.seen + dst.seen), t_start, t_mig + sw, t_end)
            try:
                dq = dst.qmp().cmd("query-migrate")
                res["dst_query_final"] = dq
                res["postcopy_dst"] = dq.get("x-postcopy")
                res["postcopy_blocktime_ms"] = dq.get("postcopy-blocktime")
                res["postcopy_vcpu_blocktime_ms"] = dq.get("postcopy-vcpu-blocktime")
            except (OSError, EOFError, RuntimeError) as e:
                res["dst_query_error"] = repr(e)
            res["postcopy_requests"] = last.get("ram", {}).get("postcopy-requests")
            res["postcopy_switch"] = last.get("x-postcopy-switch")  # kmig's source
            res["postcopy_bytes"] = last.get("ram", {}).get("postcopy-bytes")
        else:
            res["guest"] = slowdown(src.seen, t_start, t_end)
        if policy == "xbzrle":
            res["xbzrle_cache"] = last.get("xbzrle-cache")
        if res["status"] == "completed":
            deadline = time.monotonic() + 5
            res["dst_resumed"] = False
            while time.monotonic() < deadline:
                mb.poll_consoles((src, dst), mb.POLL_LINES_S)
                if any(l.startswith("stress ") for _, l in dst.seen):
                    res["dst_resumed"] = True
                    break
            res["guest_switchover_gap_ms"] = mb.switchover_gap(src.seen, dst.seen)
        return res
    except (OSError, EOFError, RuntimeError) as e:
        res.update(status="error", error=repr(e), src_out=src.output()[-500:],
                   dst_out=dst.output()[-500:])
        return res
    finally:
        res["loadavg_end"] = mb.loadavg()
        for p in (src, dst):
            p.kill()
        if not a.keep:
            shutil.rmtree(sub, ignore_errors=True)


# ------------------------------------------------------------ summary, tables

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs, cap):
    rows, order = {}, []
    for r in runs:
        k = (r["stress_mib"], r["config"])
        if k not in rows:
            rows[k] = []
            order.append(k)
        rows[k].append(r)
    out = []
    for k in order:
        rs = rows[k]
        conv = [r for r in rs if r.get("status") == "completed"]
        r0 = rs[0]
        s = {"stress_mib": k[0], "config": k[1], "vmm": r0["vmm"], "tracking": r0["tracking"],
             "dirty_ring": r0["dirty_ring"], "policy": r0["policy"], "reaper": r0.get("reaper"),
             "runs": len(rs), "completed": len(conv), "statuses": [r.get("status") for r in rs],
             "vcpu_dirty_limit_mbps": r0.get("vcpu_dirty_limit_mbps"),
             # the default rows: what `kmig migrate` chose, as it said in each run
             "cli_policies": sorted(set((r.get("cli_choice") or {}).get("policy") or "?"
                                        for r in rs)) if r0["policy"] == "default" else None}
        use = conv if conv else [r for r in rs if r.get("status") != "error"]
        for f in ("total_time_ms", "downtime_ms", "sent_bytes", "dirty_sync_count",
                  "max_throttle_pct", "wall_s", "max_dirty_limit_sleep_us_per_round",
                  "limited_vcpu_rate_mbps", "guest_switchover_gap_ms"):
            s["median_" + f] = med(r.get(f) for r in use)
        # the spread of the completed runs' total time and guest-seen switchover
        for f in ("total_time_ms", "guest_switchover_gap_ms"):
            v = [r[f] for r in conv if r.get(f) is not None]
            s["min_" + f], s["max_" + f] = (min(v), max(v)) if v else (None, None)
        # time: query-migrate's total-time when completed, else at least the cap
        s["time_s"] = (s["median_total_time_ms"] / 1000.0 if conv and
                       s["median_total_time_ms"] is not None else
                       (max(cap, s["median_wall_s"] or 0) if use else None))
        s["time_is_lower_bound"] = not conv
        g = [r.get("guest") or {} for r in use]
        s["worst_max_ms_per_gib"] = max((x["worst_max_ms_per_gib"] for x in g
                                         if x.get("worst_max_ms_per_gib") is not None),
                                        default=None)
        s["median_s_below_half_pace"] = med(x.get("s_below_half_pace") for x in g)
        s["median_guest_lost_s"] = med(x.get("guest_lost_s") for x in g)
        s["median_guest_lost_after_switch_s"] = med(x.get("guest_lost_after_switch_s") for x in g)
        s["max_report_gap_ms"] = max((x["max_report_gap_ms"] for x in g
                                      if x.get("max_report_gap_ms") is not None), default=None)
        s["median_baseline_ms_per_gib"] = med(x.get("baseline_ms_per_gib") for x in g)
        s["dst_resumed"] = all(r.get("dst_resumed") for r in conv) if conv else None
        if r0["policy"] in POSTCOPY:
            pd = [r.get("postcopy_dst") or {} for r in conv]
            s["median_postcopy_active_s"] = med(r.get("postcopy_active_s") for r in conv)
            s["median_postcopy_requests"] = med(r.get("postcopy_requests") for r in conv)
            s["median_postcopy_bytes"] = med(r.get("postcopy_bytes") for r in conv)
            s["median_latency_p50_us"] = med(x.get("latency-p50-us") for x in pd)
            s["median_latency_p99_us"] = med(x.get("latency-p99-us") for x in pd)
            s["median_postcopy_blocktime_ms"] = med(r.get("postcopy_blocktime_ms") for r in conv)
            # QEMU's postcopy-vcpu-blocktime: one figure per vCPU; their sum
            s["median_postcopy_vcpu_blocktime_ms"] = med(
                sum(r["postcopy_vcpu_blocktime_ms"]) for r in conv
                if isinstance(r.get("postcopy_vcpu_blocktime_ms"), list))
        out.append(s)
    return out


def postcopy_table(summary):
    """The post-copy rows (bench/postcopy) beside the best pre-copy row."""
    rows = [s for s in summary if s["policy"] in POSTCOPY or s["config"] ==
            "kmig-ring4096+dirty-limit"]
    if not any(s["policy"] in POSTCOPY for s in rows):
        return []
    lines = ["", "Post-copy beside kmig's best pre-copy (medians):", "",
             "| stress | config | status | total (s) | switch at (s) | downtime (ms) | "
             "s below ½ pace | worst max ms/GiB | requests | request latency p50 / p99 (µs) "
             "| blocktime (ms) | vCPU blocktime (ms) | guest lost: all / after switch (ms) | sent (MiB) "
             "| after switch (MiB) "
             "| runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        lost, after = s.get("median_guest_lost_s"), s.get("median_guest_lost_after_switch_s")
        lines.append("| %d MiB | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s | %s | %s / %s | "
                     "%s | %s | %d |" % (
            s["stress_mib"], s["config"], status_text(s, 0),
            fmt(s["time_s"], "≥%.0f" if s["time_is_lower_bound"] else "%.1f"),
            fmt(s.get("median_postcopy_active_s"), "%.1f"), fmt(s["median_downtime_ms"], "%d"),
            fmt(s["median_s_below_half_pace"], "%.1f"), fmt(s["worst_max_ms_per_gib"], "%.0f"),
            fmt(s.get("median_postcopy_requests"), "%d"),
            fmt(s.get("median_latency_p50_us"), "%d"), fmt(s.get("median_latency_p99_us"), "%d"),
            fmt(s.get("median_postcopy_blocktime_ms"), "%d"),
            fmt(s.get("median_postcopy_vcpu_blocktime_ms"), "%d"),
            fmt(lost and lost * 1000.0, "%d"), fmt(after and after * 1000.0, "%d"),
            fmt(s["median_sent_bytes"] and s["median_sent_bytes"] / MIB, "%.0f"),
            fmt(s.get("median_postcopy_bytes") and s["median_postcopy_bytes"] / MIB, "%.0f"),
            s["runs"]))
    lines += ["", "switch at: seconds from migrate to the first poll in postcopy-active.  "
              "downtime: the source's figure (kmig: from its stop to the destination's "
              "RP_RUNNING; QEMU: its own).  Guest pace from the stress lines of the source "
              "and, after the switch, of the destination (the same report sequence).  "
              "request latency: kmig's destination, from a page request to the page's "
              "placement (histogram buckets, within 19 %).  blocktime: the destination's "
              "postcopy-blocktime (capability postcopy-blocktime, both VMMs; one vCPU: "
              "the time it waited for pages).  guest lost: the guest's own count, summed over "
              "vCPUs: host time from its first report after `migrate` to its last before the "
              "end, less the time its page writes in between take at its pre-migration rate "
              "(post-copy rows: through the switch to the end, on the destination's console; "
              "the pre-copy row: until the source's last report); after switch: the same from the "
              "first poll that saw postcopy-active.  Every wait counts in it, "
              "whoever measures it: the like-for-like figure beside the VMMs' own blocktimes."]
    return lines


def best(rows):
    """The row with the shortest time, completed rows first; ties: less slowdown."""
    rows = [s for s in rows if s["time_s"] is not None]
    if not rows:
        return None
    return min(rows, key=lambda s: (s["time_is_lower_bound"], s["time_s"],
                                    s["median_s_below_half_pace"] or 0))


def headline(summary):
    """Per stress size: kmig's best cell against QEMU's best cell."""
    out = []
    for size in sorted(set(s["stress_mib"] for s in summary)):
        rows = [s for s in summary if s["stress_mib"] == size]
        k = best([s for s in rows if s["vmm"] == "kmig"])
        q = best([s for s in rows if s["vmm"] == "qemu"])
        h = {"stress_mib": size, "kmig_best": k and k["config"], "qemu_best": q and q["config"],
             "cells": len(rows), "cells_converged": sum(1 for s in rows if s["completed"])}
        if k and q:
            h["kmig_time_s"], h["qemu_time_s"] = k["time_s"], q["time_s"]
            h["qemu_time_is_lower_bound"] = q["time_is_lower_bound"]
            h["kmig_time_is_lower_bound"] = k["time_is_lower_bound"]
            # kmig / QEMU: with QEMU cancelled at the cap the true ratio is smaller
            h["ratio_time"] = k["time_s"] / q["time_s"] if q["time_s"] else None
            ks, qs = k["median_s_below_half_pace"], q["median_s_below_half_pace"]
            h["kmig_s_below_half_pace"], h["qemu_s_below_half_pace"] = ks, qs
            h["ratio_s_below_half_pace"] = ks / qs if ks is not None and qs else None
            kw, qw = k["worst_max_ms_per_gib"], q["worst_max_ms_per_gib"]
            h["kmig_worst_max_ms_per_gib"], h["qemu_worst_max_ms_per_gib"] = kw, qw
            h["ratio_worst_max_ms_per_gib"] = kw / qw if kw is not None and qw else None
            h["ratio_sent_bytes"] = (k["median_sent_bytes"] / q["median_sent_bytes"]
                                     if k["median_sent_bytes"] and q["median_sent_bytes"]
                                     else None)
            h["goal_time_le_half"] = (not k["time_is_lower_bound"] and h["ratio_time"] is not None
                                      and h["ratio_time"] <= 0.5)
            h["goal_shorter_slowdown"] = ks is not None and qs is not None and ks < qs
        out.append(h)
    return out


def fmt(x, f, none="–"):
    return none if x is None else f % x


def spread(s, f, div, form):
    """' (min–max)' of a summary row's completed runs, when there are two or more."""
    lo, hi = s.get("min_" + f), s.get("max_" + f)
    if lo is None or s["completed"] < 2:
        return ""
    return " (%s–%s)" % (form % (lo / div), form % (hi / div))


def status_text(s, cap):
    if s["completed"] == s["runs"]:
        return "completed"
    if s["completed"]:
        return "completed %d/%d" % (s["completed"], s["runs"])
    if all(x == "did not converge" for x in s["statuses"]):
        return "**did not converge** (%d s)" % cap
    return "/".join(sorted(set(str(x) for x in s["statuses"])))


def throttle_text(s):
    if s["policy"] == "default":
        chose = "/".join(s["cli_policies"] or ["?"])
        if s["vcpu_dirty_limit_mbps"]:
            return "%s: limit %s MB/s (rate %s)" % (
                chose, fmt(s["vcpu_dirty_limit_mbps"], "%d"),
                fmt(s["median_limited_vcpu_rate_mbps"], "%.0f"))
        return "%s: %s" % (chose, fmt(s["median_max_throttle_pct"], "%d%%"))
    if s["policy"] in ("dirty-limit", "vcpu-limit"):
        t = "limit %s MB/s" % fmt(s["vcpu_dirty_limit_mbps"], "%d")
        if s["median_limited_vcpu_rate_mbps"] is not None:
            t += " (rate %s)" % fmt(s["median_limited_vcpu_rate_mbps"], "%.0f")
        return t
    return fmt(s["median_max_throttle_pct"], "%d%%")


def tables(summary, heads, info, a, cfg):
    lines = ["Convergence under memory stress: %s guest, %d vCPU, max-bandwidth %d B/s, "
             "downtime-limit %d ms, cap %d s, kmig reaper %s (nproc %d; load %s at start, %s at "
             "end; the host was shared with other processes)" % (
                 a.memory, a.cpus, a.bandwidth, a.downtime, a.cap, a.reaper, info["nproc"],
                 " ".join("%.2f" % x for x in info["loadavg_start"]),
                 " ".join("%.2f" % x for x in info.get("loadavg_end", []))),
             ""]
    if getattr(a, "rtt_ms", 0):
        lines[0] += (" Source and destination on two namespaced hosts whose wire adds "
                     "%d ms of round trip (scripts/two-hosts)." % a.rtt_ms)
    # 1. the seed's Test2 shape, with more columns
    lines += ["| stress | tracking | VMM | policy | status | total (s) (min–max) | downtime (ms) "
              "| guest gap (ms) (max) | sent (MiB) "
              "| syncs | max throttle | worst max ms/GiB (base) | s below ½ pace | longest report "
              "gap (ms) | total / QEMU best | runs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    qbest = {h["stress_mib"]: h for h in heads}
    for size in sorted(set(s["stress_mib"] for s in summary)):
        rows = [s for s in summary if s["stress_mib"] == size]
        rows.sort(key=lambda s: (s["vmm"] != "kmig", s["dirty_ring"],
                                 (["default", "step", "computed", "dirty-limit", "ac",
                                   "vcpu-limit",
                                   "postcopy", "postcopy-preempt", "postcopy-start", "hybrid",
                                   "xbzrle"]
                                  + list(SEED_OFF))
                                 .index(s["policy"])))
        qb = next((s for s in rows if s["config"] == qbest[size].get("qemu_best")), None)
        for s in rows:
            lb = s["time_is_lower_bound"]
            guest = "–"
            if s["worst_max_ms_per_gib"] is not None:
                guest = "%.0f (%s)" % (s["worst_max_ms_per_gib"],
                                       fmt(s["median_baseline_ms_per_gib"], "%.0f"))
            ratio = None
            if qb and not lb and qb["time_s"]:
                ratio = ("≤%.2f×" if qb["time_is_lower_bound"] else "%.2f×") % (
                    s["time_s"] / qb["time_s"])
            lines.append("| %d MiB | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                         "| %s | %s | %d |" % (
                             size, s["tracking"], s["vmm"], s["policy"],
                             status_text(s, a.cap),
                             fmt(s["time_s"], "≥%.0f" if lb else "%.1f") + spread(
                                 s, "total_time_ms", 1000.0, "%.1f"),
                             fmt(None if lb else s["median_downtime_ms"], "%d"),
                             fmt(s.get("median_guest_switchover_gap_ms"), "%d") + (
                                 " (%d)" % s["max_guest_switchover_gap_ms"]
                                 if s.get("max_guest_switchover_gap_ms") is not None and
                                 s["completed"] > 1 else ""),
                             fmt(s["median_sent_bytes"] / MIB if s["median_sent_bytes"]
                                 else None, "≥%.0f" if lb else "%.0f"),
                             fmt(s["median_dirty_sync_count"], "%d"), throttle_text(s), guest,
                             fmt(s["median_s_below_half_pace"], "%.1f"),
                             fmt(s["max_report_gap_ms"], "%d"), ratio or "–", s["runs"]))
    # 2. the seed's Test1 shape: migration time by stress size
    sizes = sorted(set(s["stress_mib"] for s in summary))
    cfgs = [c for c in list(CONFIGS) if any(s["config"] == c for s in summary)]
    lines += ["", "Migration time (s) by stress size (≥: cancelled at the cap):", "",
              "| config | " + " | ".join("%d MiB" % x for x in sizes) + " |",
              "|---|" + "---|" * len(sizes)]
    for c in cfgs:
        cells = []
        for size in sizes:
            s = next((s for s in summary if s["stress_mib"] == size and s["config"] == c), None)
            cells.append("–" if s is None or s["time_s"] is None else
                         ("≥%.0f" if s["time_is_lower_bound"] else "%.1f") % s["time_s"])
        lines.append("| %s | %s |" % (c, " | ".join(cells)))
    # 3. headline
    lines += ["", "kmig's best cell vs QEMU's best cell per stress size (best = shortest time, "
              "completed first):", "",
              "| stress | converged | kmig best | QEMU best | time kmig / QEMU (s) | ratio "
              "| s below ½ pace kmig / QEMU | worst max ms/GiB kmig / QEMU | sent kmig / QEMU "
              "| time ≤ ½ | shorter slowdown |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for h in heads:
        if "ratio_time" not in h:
            lines.append("| %d MiB | %d/%d | %s | %s | – | – | – | – | – | – | – |" % (
                h["stress_mib"], h["cells_converged"], h["cells"], h["kmig_best"], h["qemu_best"]))
            continue
        lines.append("| %d MiB | %d/%d | %s | %s | %s / %s | %s | %s / %s | %s / %s | %s | %s "
                     "| %s |" % (
                         h["stress_mib"], h["cells_converged"], h["cells"], h["kmig_best"],
                         h["qemu_best"],
                         ("≥%.0f" if h["kmig_time_is_lower_bound"] else "%.1f") % h["kmig_time_s"],
                         ("≥%.0f" if h["qemu_time_is_lower_bound"] else "%.1f") % h["qemu_time_s"],
                         fmt(h["ratio_time"], ("≤%.2f×" if h["qemu_time_is_lower_bound"]
                                               else "%.2f×")),
                         fmt(h["kmig_s_below_half_pace"], "%.1f"),
                         fmt(h["qemu_s_below_half_pace"], "%.1f"),
                         fmt(h["kmig_worst_max_ms_per_gib"], "%.0f"),
                         fmt(h["qemu_worst_max_ms_per_gib"], "%.0f"),
                         fmt(h["ratio_sent_bytes"], "%.2f×"),
                         "yes" if h["goal_time_le_half"] else "no",
                         "yes" if h["goal_shorter_slowdown"] else "no"))
    # 4. like for like: kmig's step policy (QEMU's law, QEMU's switchover) vs QEMU
    lines += ["", "Like for like: kmig `step` (QEMU's throttle law, x-final-round off) against "
              "QEMU auto-converge on the same tracking (medians; guest gap: see below):", "",
              "| stress | tracking | time kmig / QEMU (s) | ratio | downtime kmig / QEMU (ms) "
              "| guest gap kmig / QEMU (ms) | sent kmig / QEMU (MiB) |",
              "|---|---|---|---|---|---|---|"]
    for size in sizes:
        for kc, qc, tr in (("kmig-bitmap+step", "qemu-bitmap+ac", "bitmap"),
                           ("kmig-ring4096+step", "qemu-ring4096+ac", "ring 4096")):
            k = next((x for x in summary if x["stress_mib"] == size and x["config"] == kc), None)
            q = next((x for x in summary if x["stress_mib"] == size and x["config"] == qc), None)
            if not k or not q:
                continue

            def t(x):
                return fmt(x["time_s"], "≥%.0f" if x["time_is_lower_bound"] else "%.1f")

            def dt(x, f):
                return "–" if x["time_is_lower_bound"] else fmt(x.get(f), "%d")
            ratio = "–"
            if not k["time_is_lower_bound"] and not q["time_is_lower_bound"] and q["time_s"]:
                ratio = "%.2f×" % (k["time_s"] / q["time_s"])
            lines.append("| %d MiB | %s | %s / %s | %s | %s / %s | %s / %s | %s / %s |" % (
                size, tr, t(k), t(q), ratio, dt(k, "median_downtime_ms"),
                dt(q, "median_downtime_ms"), dt(k, "median_guest_switchover_gap_ms"),
                dt(q, "median_guest_switchover_gap_ms"),
                fmt(k["median_sent_bytes"] and k["median_sent_bytes"] / MIB, "%.0f"),
                fmt(q["median_sent_bytes"] and q["median_sent_bytes"] / MIB, "%.0f")))
    lines += ["",
              "total: query-migrate's total-time (each VMM measures itself); downtime: "
              "query-migrate's downtime; sent: ram.transferred; medians over the runs.  A cell "
              "still migrating after %d s was cancelled: its time and bytes are lower bounds "
              "(≥).  max throttle: the highest cpu-throttle-percentage seen while polling "
              "every %.1f s; for the dirty-limit rows the per-vCPU limit and the median vCPU "
              "dirty rate reported by query-vcpu-dirty-limit while migrating.  Guest "
              "columns, from the source guest's stress lines (one per vCPU every %d ms): the "
              "worst max_ms_per_gib while migrating (the pre-migration median ms/GiB in "
              "brackets), the seconds in which some vCPU ran below half its pre-migration pace "
              "(union over vCPUs), and the longest gap between two reports of one vCPU.  "
              "guest gap: host ms from the last stress line of vCPU 0 on the source console "
              "to its first on the destination's (consoles read every 5 ms): the pause the "
              "guest saw is at most this and at least this less one report period; its max "
              "over the runs in brackets.  "
              "QEMU vcpu-limit: QEMU 7.2 has no dirty-limit migration capability, so "
              "`set-vcpu-dirty-limit` (%s MB/s per vCPU) is called on the source just before "
              "`migrate` (its slowdown window starts there); 8.1's capability would apply the "
              "same limit only after two high rounds." % (
                  a.cap, a.poll, cfg.get("stress_report_ms", REPORT_MS),
                  fmt(cfg.get("vcpu_dirty_limit_mbps"), "%d"))]
    lines += postcopy_table(summary)
    return "\n".join(lines)


# ------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="one stress size (512 MiB), 6 rows, cap 60 s")
    ap.add_argument("--sizes", default=",".join(str(x) for x in FULL_SIZES),
                    help="stress sizes, MiB (comma list)")
    ap.add_argument("--configs", default=",".join(FULL_CONFIGS),
                    help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--only", default=None, help="regex on '<size>M <config>', e.g. '512M ring4096'")
    ap.add_argument("--reps", type=int, default=1, help="runs of each cell")
    ap.add_argument("--cap", type=float, default=120.0,
                    help="cancel a migration still running after this many seconds")
    ap.add_argument("--cpus", type=int, default=1)
    ap.add_argument("--memory", default=MEMORY, help="guest RAM (kmig --memory, QEMU -m)")
    ap.add_argument("--bandwidth", type=int, default=125000000, help="max-bandwidth, bytes/s")
    ap.add_argument("--downtime", type=int, default=300, help="downtime-limit, ms")
    ap.add_argument("--dirty-limit", type=int, default=0,
                    help="per-vCPU dirty limit, MB/s (default: bandwidth / 6 / vCPUs)")
    ap.add_argument("--dirty-limit-period", type=int, default=1000,
                    help="kmig x-vcpu-dirty-limit-period, ms")
    ap.add_argument("--reaper", default="adaptive", choices=("adaptive", "fixed"),
                    help="kmig's dirty-ring reaper")
    ap.add_argument("--settle-lines", type=int, default=mb.SETTLE_LINES,
                    help="stress reports per vCPU to wait for before migrating")
    ap.add_argument("--poll", type=float, default=0.2, help="query-migrate interval, s")
    ap.add_argument("--final-round", default="policy", choices=("policy", "on", "off"),
                    help="kmig x-final-round: policy = off for step rows (like-for-like), "
                         "on for the others")
    ap.add_argument("--xbzrle-cache", type=int, default=1024,
                    help="xbzrle rows: xbzrle-cache-size in MiB, a power of two (both VMMs)")
    ap.add_argument("--tsc-khz", type=int, default=0)
    ap.add_argument("--rtt-ms", type=int, default=0,
                    help="run the source on host A and the destination on host B of "
                         "scripts/two-hosts, whose wire adds this round-trip time (a relay: "
                         "no netem here); 0: both on loopback")
    ap.add_argument("--build", default=os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build")),
                    help="directory with kmig and guest/kmig-guest.elf")
    ap.add_argument("--keep", action="store_true", help="keep the per-case directories")
    ap.add_argument("--out", default=os.path.join(RESULTS, "converge.json"))
    ap.add_argument("--md", default=None, help="markdown (default: --out with .md)")
    ap.add_argument("--retable", metavar="JSON", default=None,
                    help="only rebuild the summary and tables of an earlier run's JSON")
    a = ap.parse_args()
    md_path = a.md or os.path.splitext(a.out)[0] + ".md"
    if a.retable:
        with open(a.retable) as f:
            old = json.load(f)
        c = old["config"]
        for k in ("quick", "cpus", "cap", "bandwidth", "downtime", "reaper", "poll", "reps",
                  "settle_lines", "dirty_limit", "dirty_limit_period"):
            setattr(a, k, c["args"][k])
        a.rtt_ms = c.get("rtt_ms", 0)      # the link it ran behind stays on record
        a.memory = c.get("memory", a.memory)
        doc = write(a, md_path, old["host"], old["binaries"], {"tsc_khz": c["tsc_khz"]},
                    old["runs"], partial=old.get("partial", False))
        print(doc["table"])
        return

    if a.quick:
        sizes, cfgs = QUICK_SIZES, QUICK_CONFIGS
        a.cap = min(a.cap, 60.0)
    else:
        sizes = [int(x) for x in a.sizes.split(",")]
        cfgs = a.configs.split(",")
    for c in cfgs:
        if c not in CONFIGS:
            ap.error("unknown config %r" % c)
    cases = [(s, c) for s in sizes for c in cfgs]
    if a.only:
        rx = re.compile(a.only)
        cases = [x for x in cases if rx.search("%dM %s" % x)]

    info = mb.host_info()
    d = tempfile.mkdtemp(prefix="kmigbench-conv-")
    kmig, guest, bins = snapshot_binaries(d, a.build)
    env = {"kmig": kmig, "guest": guest}
    env["tsc_khz"] = a.tsc_khz or mb.calibrate_tsc(env, d)
    if a.rtt_ms:
        # the migration crosses scripts/two-hosts' wire, whose relay adds
        # the round-trip time; torn down when this process exits
        import twohosts
        stack = contextlib.ExitStack()
        atexit.register(stack.close)
        env["net"] = stack.enter_context(twohosts.topology(extra=["--rtt-ms", str(a.rtt_ms)]))
    print("nproc %d, load %s, tsc_khz %s, vcpu dirty limit %d MB/s, %d case(s) x %d rep(s)" % (
        info["nproc"], " ".join("%.2f" % x for x in info["loadavg_start"]), env["tsc_khz"],
        dirty_limit_mbps(a), len(cases), a.reps), flush=True)

    runs = []
    for size in sorted(set(s for s, _ in cases), key=sizes.index):
        for rep in range(a.reps):
            for s, c in cases:
                if s != size:
                    continue
                t0 = time.monotonic()
                r = one_case(env, d, s, c, rep, a)
                runs.append(r)
                g = r.get("guest") or {}
                print("  %5d MiB %-27s rep %d: %-16s total %s ms  downtime %s ms  sent %s MiB  "
                      "thr %s%%  worst %s ms/GiB  slow %s s  load %.2f  (%.0f s)" % (
                          s, c, rep, r.get("status"), r.get("total_time_ms", "–"),
                          r.get("downtime_ms", "–"),
                          "%.0f" % (r["sent_bytes"] / MIB) if r.get("sent_bytes") else "–",
                          r.get("max_throttle_pct", "–"), g.get("worst_max_ms_per_gib", "–"),
                          fmt(g.get("s_below_half_pace"), "%.1f"), r["loadavg"][0],
                          time.monotonic() - t0), flush=True)
                if r.get("status") == "error":
                    print("    error: %s" % {k: v for k, v in r.items()
                                             if k in ("error", "output", "src_out", "dst_out",
                                                      "console_tail")}, flush=True)
                write(a, md_path, info, bins, env, runs, partial=True)
    info["loadavg_end"] = mb.loadavg()
    doc = write(a, md_path, info, bins, env, runs, partial=False)
    print()
    print(doc["table"])
    print("\nJSON: %s\nmarkdown: %s" % (a.out, md_path))
    shutil.rmtree(d, ignore_errors=True)


def write(a, md_path, info, bins, env, runs, partial):
    summary = summarize(runs, a.cap)
    heads = headline(summary)
    cfg = {"quick": a.quick, "cpus": a.cpus, "memory": a.memory,
           "max_bandwidth_bytes_per_s": a.bandwidth, "downtime_limit_ms": a.downtime,
           "cap_s": a.cap, "reps": a.reps, "tsc_khz": env["tsc_khz"],
           "stress_report_ms": REPORT_MS, "settle_lines": a.settle_lines, "poll_s": a.poll,
           "kmig_reaper": a.reaper, "vcpu_dirty_limit_mbps": dirty_limit_mbps(a),
           "x_vcpu_dirty_limit_period_ms": a.dirty_limit_period,
           "rtt_ms": getattr(a, "rtt_ms", 0),
           "qemu_args": "-accel kvm[,dirty-ring-size=N] -nodefaults -nographic -machine pc "
                        "(default cpu model) -bios qboot.rom when installed -monitor none",
           "configs": {k: {"vmm": v[0], "dirty_ring": v[1], "policy": v[2],
                           "policy_text": POLICY_TEXT[v[2]]} for k, v in CONFIGS.items()},
           "args": {"quick": a.quick, "cpus": a.cpus, "cap": a.cap, "bandwidth": a.bandwidth,
                    "downtime": a.downtime, "reaper": a.reaper, "poll": a.poll, "reps": a.reps,
                    "settle_lines": a.settle_lines, "dirty_limit": a.dirty_limit,
                    "dirty_limit_period": a.dirty_limit_period}}
    tbl = tables(summary, heads, info, a, cfg)
    doc = {"benchmark": "converge", "partial": partial, "host": info, "binaries": bins,
           "config": cfg, "headline": heads, "summary": summary, "table": tbl, "runs": runs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(md_path, "w") as f:
        f.write(tbl + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(main())
